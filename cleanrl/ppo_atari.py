"""Proximal Policy Optimization (PPO) from pixels: Atari and MinAtar.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347), with the Atari
details of Huang et al. 2022, "The 37 Implementation Details of PPO": the Nature CNN shared by actor and critic, 8
environments x 128 steps, clip 0.1, learning-rate annealing, GAE, rewards clipped to their sign and a lost life ending
the training episode, while charts/episodic_return is the whole game's raw score. CleanRL's settings.

Action space: Discrete. Environments: Atari through ale-py's C++ vector env (BreakoutNoFrameskip-v4, ALE/Breakout-v5)
and MinAtar (MinAtar/Breakout-v1 ...), which gets the MinAtar paper's small network. Autoreset is NEXT_STEP: the step
after a game ends (its action ignored) is dropped from the batch, and the observation it acted on, the true final one,
bootstraps a truncated game. MinAtar games are saved with checkpoints (exact resume on the CPU); ALE's cannot be, so a
resumed Atari run starts fresh games.

    uv run python cleanrl/ppo_atari.py --env-id BreakoutNoFrameskip-v4 --total-timesteps 10000000 --capture-video

Expect Breakout ~415 after 10M steps (CleanRL's figure); MinAtar results in benchmark/results/ppo_atari.md.
"""

import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
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
    """if toggled, record videos of the agent (first environment) into the run directory"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
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
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""
    compile: bool = False
    """if toggled, compile the policy step, GAE and the update with torch.compile (slower to start)"""
    cudagraphs: bool = False
    """if toggled, also capture them in CUDA graphs (torch.compile's reduce-overhead mode; implies --compile; CUDA)"""
    amp: bool = False
    """if toggled, run the networks in bf16 autocast (parameters and storage stay float32)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    if args.cudagraphs:
        if not (args.cuda and torch.cuda.is_available()):
            fail("--cudagraphs needs a CUDA GPU and none is in use; drop it (--compile works on the CPU)")
        args.compile = True  # the graphs are captured by torch.compile
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate")
    check_positive(**{name: getattr(args, name) for name in positive + ("eval_episodes", "torch_threads")})
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
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
    check_env_id(args.env_id, "cleanrl/ppo.py")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor and critic heads on one torso: the Nature CNN on 84x84 frames (Mnih et al. 2015); on MinAtar's 10x10 grids
    the MinAtar paper's network (Young & Tian 2019): one 3x3 convolution of 16 channels, then 128 units. Takes uint8
    observations. The heads' outputs are cast to float32 (a no-op without --amp): under bf16 autocast the log-softmax,
    the values stored and the losses are then float32 all the same."""

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

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network(obs.float() * self.scale)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).float().squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, its log-probability and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden).float(), dim=-1)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.critic(hidden).float().squeeze(-1)

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Log-probabilities of `actions`, the policy's entropy and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden).float(), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        log_prob = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return log_prob, entropy, self.critic(hidden).float().squeeze(-1)


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps on the device: uint8 observations, actions, their log-probabilities
    and values; rewards, episode ends and autoreset flags are staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.values = torch.zeros((num_steps, num_envs), device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)  # training episode ends: no bootstrap
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


def make_optimizer(agent: Agent, args: Args, device: torch.device) -> torch.optim.Adam:
    """Adam. With --compile its learning rate is a device tensor that annealing writes into, so the compiled step (and
    its CUDA graph) is never rebuilt, and on a GPU its step is capturable (the step count stays on the device too)."""
    if not args.compile:
        return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    lr = torch.tensor(args.learning_rate, device=device)
    return torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")


def update_minibatch(agent: Agent, optimizer: torch.optim.Optimizer, mb: Batch, args: Args) -> dict[str, torch.Tensor]:
    """One gradient step of the clipped PPO loss on the minibatch `mb`. Returns its losses and statistics, detached.
    --compile compiles this function as it is (two graphs: up to the backward pass, and the clipping and step)."""
    with torch.autocast(mb.obs.device.type, dtype=torch.bfloat16, enabled=args.amp):  # --amp: the forward in bf16
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


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the game scores of its (sampled) policy."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    agent.load_state_dict(model["agent"])
    obs, _ = envs.reset(seed=seed)
    game_scores = []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            actions, _, _ = agent.act(torch.as_tensor(obs, device=device))
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
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_shape = envs.single_observation_space.shape
    obs_high = float(envs.single_observation_space.high.max())
    n_actions = int(envs.single_action_space.n)

    agent = Agent(obs_shape, n_actions, obs_high).to(device)
    optimizer = make_optimizer(agent, args, device)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        if args.compile:  # the saved learning rate was read onto the CPU: the compiled step reads it on the device
            optimizer.param_groups[0]["lr"] = torch.as_tensor(optimizer.param_groups[0]["lr"], device=device)
        envs, next_obs_np = restore_envs(envs, run.checkpoint["envs"], next_obs_np)
        if run.checkpoint["envs"] is not None:
            resets = run.checkpoint["resets"]
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = torch.from_numpy(next_obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, next_obs_np),
            resets=resets,
            global_step=global_step,
        )

    # The policy step, GAE and the update: with --compile, these same functions compiled (and with --cudagraphs
    # captured in CUDA graphs, replayed with one launch each).
    policy, gae, update = agent.act, compute_gae, update_minibatch
    if args.compile:
        mode = "reduce-overhead" if args.cudagraphs else None
        policy, gae, update = (torch.compile(fn, mode=mode) for fn in (policy, gae, update))
    # --amp: the networks' forward passes in bf16 autocast, which needs no loss scaling (its exponent range is
    # float32's); parameters, optimiser state, the rollout and GAE stay float32.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            lr_now = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
            if args.compile:  # written into the device tensor: nothing recompiles
                optimizer.param_groups[0]["lr"].fill_(lr_now)
            else:
                optimizer.param_groups[0]["lr"] = lr_now

        # 1. Collect a rollout: one host-to-device copy of the observations and one device-to-host
        # copy of the actions per step; rewards and episode ends are moved once per rollout.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                with autocast:
                    action, storage.logprobs[step], storage.values[step] = policy(next_obs)
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.from_numpy(next_obs_np).to(device)
                # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's).
                storage.rewards[step] = np.sign(reward)
                storage.terminations[step] = terminated | infos["life_loss"]
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                resets = terminated | truncated  # NEXT_STEP autoreset: these envs' next step starts a new game
                run.log_episodes(global_step, infos)

            # 2. Advantages. Under NEXT_STEP autoreset the observation after a game's last step is its true final
            # one (the autoreset step acts on it), so values[t + 1] bootstraps a truncation as it should.
            rewards, terminated, truncated, reset_steps = storage.on_device()
            with autocast:
                next_value = agent.get_value(next_obs)
            next_values = torch.cat([storage.values[1:], next_value.unsqueeze(0)])
            values = storage.values
            # A copy: with --cudagraphs the graph's output memory is reused by the next graph that runs.
            advantages = gae(rewards, values, next_values, terminated, truncated, args.gamma, args.gae_lambda).clone()
            returns = advantages + values

            b_obs = storage.obs.reshape((-1,) + tuple(obs_shape))
            b_actions, b_logprobs = storage.actions.reshape(-1), storage.logprobs.reshape(-1)
            batch = Batch(b_obs, b_actions, b_logprobs, advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))
            # The autoreset steps are not transitions (their action was ignored): they leave the batch.
            transitions = torch.nonzero(~reset_steps.reshape(-1)).squeeze(1)

        # 3. Update the policy and value network
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = transitions[torch.randperm(len(transitions), device=device)]
            for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                stats = update(agent, optimizer, batch.take(mb_inds), args)
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
    model = dict(agent=agent.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
