"""PPO with parameter sharing for PettingZoo's multi-agent Atari games (self-play).

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347), with the Atari
details of ppo_atari.py (Nature CNN, clip 0.1, GAE, rewards clipped to their sign, learning-rate annealing). Every agent
of every game is played by one network (parameter sharing, Terry et al. 2020, https://arxiv.org/abs/2005.13625); its
observation carries one constant plane per agent, full on its own (SuperSuit's agent_indicator_v0): which player it is.
Both agents' transitions are learnt from: in a two-player game such as pong_v3 the policy plays against itself.

Action space: Discrete. Environments: PettingZoo's two-player Atari games (pong_v3, boxing_v2, tennis_v3 ...; ROMs from
ale-py) through cleanrl_utils/envs/pettingzoo_atari.py: 84x84 grayscale, frame skip 4 with max-pool, 4 stacked frames,
NEXT_STEP autoreset (the step after a game ends is dropped from the batch). --num-envs counts agent slots (games x 2).
charts/episodic_return is each agent's whole-game raw score (also per agent, charts/episodic_return/first_0 ...); in a
zero-sum game the two cancel, so progress shows in the episode length and in eval/episodic_return: the saved policy as
first_0 against a uniformly random second_0. Checkpoints hold the emulators' full state: resume is exact on the CPU.

    uv run --all-extras python cleanrl/ppo_pettingzoo_ma_atari.py --env-id pong_v3 --total-timesteps 20000000

Differences from CleanRL's file: ALE's grayscale (not the blue channel); no SuperSuit vec env (its same-step autoreset
loses a truncated game's final observation, its episode statistics are of clipped rewards), truncation bootstrapped,
the step after a game's end dropped.
Results (against a random opponent) in benchmark/results/ppo_pettingzoo_ma_atari.md.
"""

import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model
from cleanrl_utils.envs.pettingzoo_atari import N_AGENTS, PettingZooAtariEnvs, check_env_id
from cleanrl_utils.errors import check_positive, fail
from cleanrl_utils.run import Run


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use a GPU when one is present (the CPU otherwise)"""
    torch_threads: int = 1
    """CPU threads for torch"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported (no video of PettingZoo's Atari games here); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "pong_v3"
    """the PettingZoo Atari game (cleanrl_utils.envs.pettingzoo_atari.KNOWN_ENV_IDS)"""
    total_timesteps: int = 20000000
    """total timesteps of the experiment (agent transitions: each game step counts once per agent)"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 16
    """the number of agent slots stepped in parallel: games x agents (a multiple of 2)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
    max_cycles: int = 100000
    """PettingZoo's time limit in emulator frames (4 per step): a game still on there is truncated"""
    eval_episodes: int = 10
    """the number of games the saved model plays (as first_0, against a uniformly random opponent)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    if args.capture_video:
        fail("--capture-video is not supported for PettingZoo's Atari games; drop it")
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate")
    check_positive(
        **{name: getattr(args, name) for name in positive + ("eval_episodes", "torch_threads", "max_cycles")}
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    if args.num_envs % N_AGENTS != 0:
        fail(f"--num-envs {args.num_envs} must be a multiple of {N_AGENTS} (games x agents: one slot per agent)")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch of {args.batch_size} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps})"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {args.batch_size} steps")
    check_env_id(args.env_id)


def add_agent_indicators(frames: torch.Tensor, n_agents: int) -> torch.Tensor:
    """[num_games * n_agents, C, H, W] uint8 frames (slot g * n_agents + i is agent i of game g) -> [.., C + n_agents,
    H, W]: after the frames, one plane per agent, 255 all over agent i's own plane and 0 in the others. Scaled with
    the frames, it reaches the network as 1, as SuperSuit 3.4's agent_indicator_v0 (CleanRL's pin) writes it."""
    slots, _, height, width = frames.shape
    agent = torch.arange(slots, device=frames.device) % n_agents
    planes = 255 * nn.functional.one_hot(agent, n_agents).to(frames.dtype)
    return torch.cat([frames, planes[:, :, None, None].expand(-1, -1, height, width)], dim=1)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor and critic heads on the Nature CNN (Mnih et al. 2015), shared by all agents. Takes uint8 observations,
    `n_frames` stacked frames and the agent-indicator planes, every channel scaled to [0, 1]."""

    def __init__(self, n_frames: int, n_agents: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(n_frames + n_agents, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(3136, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network(obs.float() / 255.0)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, its log-probability and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden), dim=-1)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.critic(hidden).squeeze(-1)

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Log-probabilities of `actions`, the policy's entropy and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        log_prob = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return log_prob, entropy, self.critic(hidden).squeeze(-1)


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` agent slots on the device: uint8 observations (with the indicator
    planes), actions, their log-probabilities and values; rewards, episode ends and autoreset flags are staged on the
    host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.values = torch.zeros((num_steps, num_envs), device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.resets = np.zeros((num_steps, num_envs), dtype=bool)  # autoreset steps: not transitions
        self.device = device

    def on_device(self) -> tuple[torch.Tensor, ...]:
        arrays = (self.rewards, self.terminations, self.truncations, self.resets)
        return tuple(torch.as_tensor(a, device=self.device) for a in arrays)


def compute_gae(rewards, values, next_values, terminations, truncations, gamma, gae_lambda) -> torch.Tensor:
    """Generalized advantage estimates for a [num_steps, num_envs] rollout.

    next_values[t] is the value of the observation that followed step t: the true final
    observation where an episode ended at t. A termination zeroes that bootstrap; a truncation
    keeps it. Either one stops the advantage from flowing back across the episode boundary.
    """
    bootstrap = 1.0 - terminations
    episode_continues = 1.0 - torch.maximum(terminations, truncations)
    deltas = rewards + gamma * next_values * bootstrap - values
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last_advantage = deltas[t] + gamma * gae_lambda * episode_continues[t] * last_advantage
        advantages[t] = last_advantage
    return advantages


class Batch(NamedTuple):
    """A rollout flattened to [batch_size, ...], one named tensor per field."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor

    def take(self, rows: torch.Tensor | slice) -> "Batch":
        return Batch(*(field[rows] for field in self))


def update_minibatch(agent: Agent, optimizer: torch.optim.Optimizer, mb: Batch, args: Args) -> dict[str, torch.Tensor]:
    """One gradient step of the clipped PPO loss on the minibatch `mb`. Returns its losses and statistics, detached."""
    newlogprob, entropy, newvalue = agent.evaluate_actions(mb.obs, mb.actions)
    logratio = newlogprob - mb.logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    mb_advantages = mb.advantages
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb.returns) ** 2
        v_delta = torch.clamp(newvalue - mb.values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (mb.values + v_delta - mb.returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb.returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return dict(
        value_loss=v_loss.detach(),
        policy_loss=pg_loss.detach(),
        entropy=entropy_loss.detach(),
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )


def log_agent_episodes(run: Run, step: int, infos: dict, agents: list[str]) -> None:
    """charts/episodic_return/<agent> and charts/episodic_length/<agent> of the games that ended at this step."""
    if "episode" not in infos:
        return
    for slot in np.flatnonzero(infos["_episode"]):
        name = agents[slot % len(agents)]
        run.writer.add_scalar(f"charts/episodic_return/{name}", infos["episode"]["r"][slot], step)
        run.writer.add_scalar(f"charts/episodic_length/{name}", infos["episode"]["l"][slot], step)


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script; `eval_episodes` games (one each, in parallel) of its sampled policy as the
    first agent against uniformly random other agents. Returns the first agent's whole-game raw scores."""
    model = load_model(model_path, __file__)
    envs = PettingZooAtariEnvs(model["env_id"], eval_episodes, seed, model["args"]["max_cycles"])
    agent = Agent(envs.obs_shape[0], envs.n_agents, envs.n_actions).to(device)
    agent.load_state_dict(model["agent"])
    rng = np.random.default_rng(seed)
    frames = envs.reset()
    scores = np.full(eval_episodes, np.nan)
    first_agent = np.arange(envs.num_envs) % envs.n_agents == 0
    with torch.no_grad():
        while np.isnan(scores).any():
            obs = add_agent_indicators(torch.from_numpy(frames).to(device), envs.n_agents)
            actions = np.where(
                first_agent, agent.act(obs)[0].cpu().numpy(), rng.integers(envs.n_actions, size=len(obs))
            )
            frames, _, _, _, infos = envs.step(actions)
            if "episode" in infos:
                ended = infos["_episode"][first_agent] & np.isnan(scores)
                scores[ended] = infos["episode"]["r"][first_agent][ended]
    envs.close()
    return scores.tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = PettingZooAtariEnvs(args.env_id, args.num_envs // N_AGENTS, args.seed, args.max_cycles)
    n_agents, n_actions = envs.n_agents, envs.n_actions
    obs_shape = (envs.obs_shape[0] + n_agents,) + envs.obs_shape[1:]

    agent = Agent(envs.obs_shape[0], n_agents, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    next_frames = envs.reset()
    resets = np.zeros(args.num_envs, dtype=bool)  # slots whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        next_frames = envs.load_state_dict(run.checkpoint["envs"])
        resets = run.checkpoint["resets"]
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = add_agent_indicators(torch.from_numpy(next_frames).to(device), n_agents)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=envs.state_dict(),
            resets=resets,
            global_step=global_step,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout: every agent of every game acts with the same network. One host-to-device copy of
        # the frames and one device-to-host copy of the actions per step; rewards and ends move once per rollout.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                action, storage.logprobs[step], storage.values[step] = agent.act(next_obs)
                storage.actions[step] = action
                next_frames, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = add_agent_indicators(torch.from_numpy(next_frames).to(device), n_agents)
                storage.rewards[step] = np.sign(reward)  # learning sees rewards clipped to their sign
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                resets = terminated | truncated  # NEXT_STEP autoreset: these slots' next step starts a new game
                run.log_episodes(global_step, infos)
                log_agent_episodes(run, global_step, infos, envs.agents)

            # 2. Advantages, per slot (each agent its own return). Under NEXT_STEP autoreset the observation after a
            # game's last step is its true final one, so values[t + 1] bootstraps a truncation as it should.
            rewards, terminated, truncated, reset_steps = storage.on_device()
            next_values = torch.cat([storage.values[1:], agent.get_value(next_obs).unsqueeze(0)])
            values = storage.values
            advantages = compute_gae(rewards, values, next_values, terminated, truncated, args.gamma, args.gae_lambda)
            returns = advantages + values

            b_obs = storage.obs.reshape((-1,) + tuple(obs_shape))
            b_actions, b_logprobs = storage.actions.reshape(-1), storage.logprobs.reshape(-1)
            batch = Batch(b_obs, b_actions, b_logprobs, advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))
            # The autoreset steps are not transitions (their action was ignored): they leave the batch.
            transitions = torch.nonzero(~reset_steps.reshape(-1)).squeeze(1)

        # 3. Update the shared policy and value network on both agents' transitions
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = transitions[torch.randperm(len(transitions), device=device)]
            for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                stats = update_minibatch(agent, optimizer, batch.take(mb_inds), args)
                clipped += stats["clipfrac"]

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        y_true, y_pred = batch.returns[transitions], batch.values[transitions]
        var_y = y_true.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var() / var_y)
        run.log(
            global_step,
            {
                "losses/value_loss": stats["value_loss"],
                "losses/policy_loss": stats["policy_loss"],
                "losses/entropy": stats["entropy"],
                "losses/old_approx_kl": stats["old_approx_kl"],
                "losses/approx_kl": stats["approx_kl"],
                "losses/clipfrac": clipped / (args.num_minibatches * (epoch + 1)),
                "losses/explained_variance": explained_var,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, agent=agent.state_dict(), n_agents=n_agents, n_actions=n_actions)
