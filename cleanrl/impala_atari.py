"""IMPALA from pixels (Atari, MinAtar): many CPU actors feeding one learner through Ray, with V-trace.

Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner Architectures"
(https://arxiv.org/abs/1802.01561). Ray actors, each with its own vector env and a CPU copy of the policy, send
rollouts of --num-steps steps (uint8 observations, actions, behaviour log-probabilities, clipped rewards, life-loss
terminations, truncations, whole-game scores) through Ray's object store; the learner (a GPU when present) trains on
--rollouts-per-update of them with V-trace targets (rho-bar = c-bar = 1) and publishes its weights once per update.
An actor takes the newest weights when it starts a rollout, so rollouts are a few updates old: charts/policy_lag.
A rollout holds one observation more than steps; under NEXT_STEP autoreset the observation after an episode's end (a
game over, a time-limit cut or, as in CleanRL, a lost life: cleanrl_utils/envs/atari.py) is its true final one, so the
learner's value of it bootstraps a truncation. The paper's Atari settings: RMSProp, unroll 20, batch 32 unrolls,
entropy 0.01, gradient norm 40, losses summed over the batch.

Action space: Discrete; ppo_atari.py's environments. Asynchronous, so not reproducible run to run; --resume
restores the learner and the actors start fresh games. Every machine of a cluster needs `uv sync --extra distributed`.

    uv run python cleanrl/impala_atari.py --env-id BreakoutNoFrameskip-v4 --num-actors 14   # one machine
    uv run ray start --head                    # a cluster: this on one machine,
    uv run ray start --address HEAD_IP:6379    # this on each of the others, then the run on any of them:
    uv run python cleanrl/impala_atari.py --env-id BreakoutNoFrameskip-v4 --num-actors 64 --ray-address auto

Returns: benchmark/impala_atari.sh (MinAtar, 1-4 actors beside ppo_atari); learner updates/s: benchmark/impala_gpu.sh.
"""

import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import StopSignal, load_model
from cleanrl_utils.envs.atari import check_env_id, make_envs
from cleanrl_utils.errors import EXIT_RUN_STOPPED, check_positive, fail
from cleanrl_utils.run import Run

# Under `uv run`, Ray would copy this folder and build a uv environment for every worker process (tens of seconds
# each, on top of the start of the worker); off, the workers run the driver's interpreter (on a cluster: every
# machine's own checkout). Read when ray is imported.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
import ray  # noqa: E402


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, train the learner on a GPU when one is present (the CPU otherwise); actors always use the CPU"""
    torch_threads: int = 1
    """CPU threads for torch, in the learner and in each actor"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """if toggled, record videos of the agent (the first actor's first environment) into the run directory"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment, all actors together"""

    # Algorithm specific arguments
    ray_address: str | None = None
    """the Ray cluster to join ("auto": the one `ray start` made on this machine); None starts one on this machine"""
    num_actors: int = 8
    """the number of actor processes (one CPU each)"""
    local_num_envs: int = 8
    """the number of game environments of each actor"""
    num_steps: int = 20
    """the unroll length: steps per environment in one rollout"""
    rollouts_per_update: int = 4
    """the number of rollouts (from different actors) in one learner update"""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """the learner's optimiser: RMSProp (the paper's: decay 0.99, momentum 0, --eps) or Adam (--eps)"""
    learning_rate: float = 6e-4
    """the learning rate of the optimizer"""
    eps: float = 0.01
    """the optimiser's epsilon (torch's RMSprop adds it outside the square root, as TorchBeast's IMPALA does)"""
    anneal_lr: bool = True
    """toggle learning rate annealing (linearly to 0, as in the paper)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    rho_bar: float = 1.0
    """V-trace's truncation of the importance weights in the temporal differences (and the policy gradient)"""
    c_bar: float = 1.0
    """V-trace's truncation of the importance weights in the traces"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function (the paper's baseline cost)"""
    max_grad_norm: float = 40.0
    """the maximum norm for the gradient clipping"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""

    # to be filled in runtime
    num_envs: int = 0
    """the number of environments of all actors together (computed in runtime)"""
    rollout_size: int = 0
    """the environment steps of one rollout (computed in runtime)"""
    batch_size: int = 0
    """the environment steps of one update (computed in runtime)"""
    num_updates: int = 0
    """the number of learner updates (computed in runtime)"""


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work (and before Ray starts); fail in one line."""
    positive = ("total_timesteps", "num_actors", "local_num_envs", "num_steps", "rollouts_per_update")
    positive += ("learning_rate", "eps", "rho_bar", "c_bar", "max_grad_norm", "eval_episodes", "torch_threads")
    check_positive(**{name: getattr(args, name) for name in positive})
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
    if args.rollouts_per_update > args.num_actors:
        fail(
            f"--rollouts-per-update {args.rollouts_per_update} is more than --num-actors {args.num_actors}: each "
            "actor has one rollout in flight, so an update can take at most one rollout of each"
        )
    args.num_envs = args.num_actors * args.local_num_envs
    args.rollout_size = args.local_num_envs * args.num_steps
    args.batch_size = args.rollout_size * args.rollouts_per_update
    args.num_updates = args.total_timesteps // args.batch_size
    if args.num_updates == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one update's batch of {args.batch_size} steps")
    check_env_id(args.env_id, "cleanrl/ppo.py")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor and critic heads on one torso: the Nature CNN on 84x84 frames (Mnih et al. 2015; the paper's "shallow"
    network is of this kind); on MinAtar's 10x10 grids the MinAtar paper's network (Young & Tian 2019): one 3x3
    convolution of 16 channels, then 128 units. Takes uint8 observations."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float):
        super().__init__()
        channels, height, width = obs_shape
        self.scale = 1.0 / obs_high  # pixels 0..255 -> [0, 1]; MinAtar's cells are 0/1 already
        if height >= 84:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(3136, 512)),
                nn.ReLU(),
            )
            hidden = 512
        else:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 16, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(16 * (height - 2) * (width - 2), 128)),
                nn.ReLU(),
            )
            hidden = 128
        self.actor = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(hidden, 1), std=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-probabilities of every action, and the value."""
        hidden = self.network(obs.float() * self.scale)
        return torch.log_softmax(self.actor(hidden), dim=-1), self.critic(hidden).squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action and its log-probability."""
        log_probs, _ = self(obs)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)


@ray.remote(num_cpus=1)
class Actor:
    """One actor process: `local_num_envs` games (seeds first_seed + index x local_num_envs + i, none shared) and a
    CPU copy of the policy; first_seed is --seed plus the step the run starts at (a resumed run plays new games).
    Each `rollout` call first loads the newest weights it is given, then plays `num_steps` steps
    with them. Its games carry on from one rollout to the next."""

    def __init__(self, index: int, args: Args, video_dir: str | None, first_seed: int):
        torch.set_num_threads(args.torch_threads)
        torch.manual_seed(first_seed + 1 + index)  # each actor samples its own actions
        self.args = args
        self.envs = make_envs(args.env_id, args.local_num_envs, video_dir is not None, video_dir, num_threads=1)
        space = self.envs.single_observation_space
        self.agent = Agent(space.shape, int(self.envs.single_action_space.n), float(space.high.max()))
        self.version = -1  # no weights loaded yet
        # One int seeds the envs with consecutive values (ale-py's vector env takes no list): disjoint across actors
        self.obs, _ = self.envs.reset(seed=first_seed + index * args.local_num_envs)
        self.resets = np.zeros(args.local_num_envs, dtype=bool)  # envs whose next step is an autoreset

    def rollout(self, version: int, weights: dict) -> dict:
        """`num_steps` steps of every game with the weights of learner update `version` (Ray reads `weights` from
        its object store). Returns numpy arrays [num_steps, ...]
        plus `obs` with one more row, the observation after the last step (the learner bootstraps from its value),
        the `version` that acted, and the whole games that ended as (step in the rollout, score, length)."""
        if version != self.version:
            self.agent.load_state_dict(weights)
            self.version = version
        n, envs = self.args.num_steps, self.args.local_num_envs
        obs = np.zeros((n + 1, *self.obs.shape), dtype=np.uint8)
        actions = np.zeros((n, envs), dtype=np.int64)
        logprobs = np.zeros((n, envs), dtype=np.float32)
        rewards, terminations, truncations = (np.zeros((n, envs), dtype=np.float32) for _ in range(3))
        resets = np.zeros((n, envs), dtype=bool)
        games = []
        with torch.no_grad():
            for step in range(n):
                obs[step] = self.obs
                action, logprob = self.agent.act(torch.from_numpy(self.obs))
                actions[step], logprobs[step] = action.numpy(), logprob.numpy()
                self.obs, reward, terminated, truncated, infos = self.envs.step(actions[step])
                # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's).
                rewards[step] = np.sign(reward)
                terminations[step] = terminated | infos["life_loss"]
                truncations[step] = truncated
                resets[step] = self.resets
                self.resets = terminated | truncated  # NEXT_STEP autoreset: the next step starts a game or a life
                if "episode" in infos:
                    ended = infos["_episode"]
                    scores, lengths = infos["episode"]["r"][ended].tolist(), infos["episode"]["l"][ended].tolist()
                    games += [(step, score, length) for score, length in zip(scores, lengths)]
        obs[n] = self.obs
        return dict(
            obs=obs,
            actions=actions,
            logprobs=logprobs,
            rewards=rewards,
            terminations=terminations,
            truncations=truncations,
            resets=resets,
            version=version,
            games=games,
        )

    def close(self) -> None:
        self.envs.close()  # writes the last video, if one is being recorded


BATCH_FIELDS = ("obs", "actions", "logprobs", "rewards", "terminations", "truncations", "resets")


def stack_rollouts(rollouts: list[dict], device: torch.device) -> dict[str, torch.Tensor]:
    """The learner's batch: the rollouts' arrays side by side, [num_steps (obs: + 1), rollouts x local_num_envs, ...],
    on the training device, with one host-to-device copy per field."""
    return {k: torch.from_numpy(np.concatenate([r[k] for r in rollouts], axis=1)).to(device) for k in BATCH_FIELDS}


def vtrace(
    behaviour_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets v_s and policy-gradient advantages for a [num_steps, num_envs] rollout (the paper's eq. 1 and
    section 4.2), computed backwards: v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1})), with
    delta_s = rho_s (r_s + gamma V(x_{s+1}) - V(x_s)), rho_s = min(rho_bar, pi/mu), c_s = min(c_bar, pi/mu).

    next_values[t] is the value of the observation that followed step t: the true final observation where an episode
    ended at t (under NEXT_STEP autoreset it is the observation the ignored autoreset step acts on, obs[t + 1] of the
    rollout, or the rollout's extra last observation). A termination zeroes that bootstrap; a truncation keeps it.
    Either one cuts the trace, so nothing flows back across the episode's end. The advantage of step s is
    rho_s (r_s + gamma v_{s+1} - V(x_s)), where v_{s+1} is next_values[s] at an episode's end or the rollout's end.
    """
    rhos = torch.exp(target_logprobs - behaviour_logprobs)
    clipped_rhos, cs = rhos.clamp(max=rho_bar), rhos.clamp(max=c_bar)
    discounts = gamma * (1.0 - terminations)
    continues = 1.0 - torch.maximum(terminations, truncations)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    vs_minus_values = torch.zeros_like(values)
    correction = torch.zeros_like(values[0])
    for t in reversed(range(values.shape[0])):
        correction = deltas[t] + gamma * continues[t] * cs[t] * correction
        vs_minus_values[t] = correction
    vs = vs_minus_values + values
    # v_{s+1}: the next step's target inside an episode, the bootstrap value at its end and after the last step
    next_vs = torch.cat([vs[1:], next_values[-1:]])
    next_vs = torch.where(continues > 0, next_vs, next_values)
    advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return vs, advantages


def make_optimizer(agent: Agent, args: Args) -> torch.optim.Optimizer:
    if args.optimizer == "rmsprop":
        return torch.optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=0.99, eps=args.eps, momentum=0)
    return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.eps)


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the game scores of its (sampled) policy (one process, no Ray)."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    agent.load_state_dict(model["agent"])
    obs, _ = envs.reset(seed=seed)
    game_scores = []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            actions, _ = agent.act(torch.as_tensor(obs, device=device))
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
            if "episode" in infos:
                game_scores += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return game_scores[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    if args.ray_address is None:  # a cluster of this machine alone; actors beyond its cores share them
        ray.init(
            num_cpus=max(os.cpu_count() or 1, args.num_actors), include_dashboard=False, logging_level=logging.WARNING
        )
    else:
        try:
            ray.init(address=args.ray_address, logging_level=logging.WARNING)
        except ConnectionError as error:  # no cluster there: nothing was done, so no run directory stays behind
            run.close()
            if run.checkpoint is None:
                shutil.rmtree(run.dir)
            fail(
                f"--ray-address {args.ray_address}: {error} (start one with `ray start --head`)", code=EXIT_RUN_STOPPED
            )
    run.stop = StopSignal()  # ray.init replaced the SIGTERM handler: SIGTERM checkpoints and stops the run again
    probe = make_envs(args.env_id, 1)
    obs_shape = probe.single_observation_space.shape
    obs_high = float(probe.single_observation_space.high.max())
    n_actions = int(probe.single_action_space.n)
    probe.close()

    agent = Agent(obs_shape, n_actions, obs_high).to(device)
    optimizer = make_optimizer(agent, args)
    global_step, update = 0, 0
    if run.checkpoint:  # the learner continues; the actors start fresh games
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        global_step, update = run.checkpoint["global_step"], run.checkpoint["update"]

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(agent=agent.state_dict(), optimizer=optimizer.state_dict(), global_step=global_step, update=update)

    def publish() -> ray.ObjectRef:
        """The learner's weights, put into the object store once; every actor's next rollout reads that one copy."""
        return ray.put({name: tensor.cpu() for name, tensor in agent.state_dict().items()})

    video_dir = str(run.dir / "videos") if args.capture_video else None
    first_seed = args.seed + run.start_step
    actors = [Actor.remote(i, args, video_dir if i == 0 else None, first_seed) for i in range(args.num_actors)]
    weights = publish()
    in_flight = {actor.rollout.remote(update, weights): actor for actor in actors}  # one rollout per actor
    ray.wait(list(in_flight), num_returns=len(in_flight))  # every actor is up: SPS does not count their start
    run.begin(training_state)
    start_update, waited = update, 0.0
    while update < args.num_updates:
        # 1. Take the first rollouts to arrive, and start those actors' next rollouts with the newest weights at once
        wait_start = time.perf_counter()
        ready, _ = ray.wait(list(in_flight), num_returns=args.rollouts_per_update)
        rollouts = ray.get(ready)
        waited += time.perf_counter() - wait_start
        for ref in ready:
            actor = in_flight.pop(ref)
            in_flight[actor.rollout.remote(update, weights)] = actor
        for rollout in rollouts:
            for step, score, length in rollout["games"]:
                run.log_episodes(global_step + (step + 1) * args.local_num_envs, returns=[score], lengths=[length])
            global_step += args.rollout_size

        # 2. One batch on the device, the rollouts side by side
        batch = stack_rollouts(rollouts, device)
        obs, actions, resets = batch["obs"], batch["actions"], batch["resets"]
        policy_lag = np.mean([update - r["version"] for r in rollouts])

        # 3. V-trace targets from the learner's current policy and values, and the update (losses summed, as the paper)
        log_probs, values_all = agent(obs.flatten(0, 1))
        log_probs = log_probs.view(*obs.shape[:2], -1)[:-1]
        values_all = values_all.view(obs.shape[:2])
        values, next_values = values_all[:-1], values_all[1:]
        target_logprobs = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            vs, advantages = vtrace(
                batch["logprobs"],
                target_logprobs,
                batch["rewards"],
                values,
                next_values,
                batch["terminations"],
                batch["truncations"],
                args.gamma,
                args.rho_bar,
                args.c_bar,
            )
        transitions = (~resets).float()  # autoreset steps (their action was ignored) are not transitions
        pg_loss = -(advantages * target_logprobs * transitions).sum()
        v_loss = 0.5 * ((vs - values) ** 2 * transitions).sum()
        entropy = (-(log_probs.exp() * log_probs).sum(-1) * transitions).sum()
        loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - update / args.num_updates) * args.learning_rate
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        optimizer.step()
        update += 1
        weights = publish()

        # 4. Log (per transition, so that runs of other batch sizes compare) and checkpoint when due
        count = transitions.sum()
        elapsed = max(time.time() - run.start_time, 1e-9)
        run.log(
            global_step,
            {
                "losses/value_loss": v_loss.detach() / count,
                "losses/policy_loss": pg_loss.detach() / count,
                "losses/entropy": entropy.detach() / count,
                "charts/policy_lag": policy_lag,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "perf/learner_updates_per_second": (update - start_update) / elapsed,
                "perf/learner_wait_fraction": waited / elapsed,
            },
        )
        run.end_iteration(global_step)

    ray.get([actor.close.remote() for actor in actors])
    ray.shutdown()
    model = dict(agent=agent.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
