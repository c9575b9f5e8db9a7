"""Soft Actor-Critic for discrete actions (SAC-discrete) from pixels: Atari and MinAtar.

Christodoulou 2019, "Soft Actor-Critic for Discrete Action Settings" (https://arxiv.org/abs/1910.07207): a categorical
policy and two soft Q-networks that output a value per action, so the critic target, the policy loss and the
temperature loss take the full expectation over actions instead of a sampled one; alpha is tuned towards a target
entropy of 0.89 times the maximum, log |A|. The actor and each critic have their own encoder (SAC+AE, Yarats et al.
2019: the actor's gradients spoil a shared one). CleanRL's hyperparameters; rewards clipped to their sign and a lost
life ending the training episode, while charts/episodic_return is the whole game's raw score.

Action space: Discrete. Environments: Atari through ale-py's C++ vector env (BreakoutNoFrameskip-v4, ALE/Breakout-v5)
with the Nature CNN, and MinAtar (MinAtar/Breakout-v1 ...) with the MinAtar paper's small network. Frames are stored
once, as uint8. Checkpoints hold the replay buffer; MinAtar games are saved with them (a resumed run on the CPU
continues exactly); ALE's vector env cannot be saved, so a resumed Atari run starts fresh games. The saved actor is
evaluated by sampling its policy, as it acts in training.

    uv run python cleanrl/sac_atari.py --env-id BreakoutNoFrameskip-v4

Expect Breakout ~340 after 5M steps (CleanRL's training returns); MinAtar results in benchmark/results/sac_atari.md.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
from cleanrl_utils.errors import available_memory, check_fits, check_positive, fail
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
    total_timesteps: int = 5000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions, over all environments)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target networks' update rate (1: hard copy; below 1: Polyak averaging)"""
    batch_size: int = 64
    """the batch size of sample from the replay memory"""
    learning_starts: int = 20000
    """timestep to start learning (uniformly random actions until then)"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 3e-4
    """the learning rate of the Q network optimizer (and of alpha's with --autotune)"""
    update_frequency: int = 4
    """one gradient step of the critics, the actor and alpha every this many timesteps"""
    target_network_frequency: int = 8000
    """the timesteps it takes to update the target networks"""
    alpha: float = 0.2
    """entropy regularization coefficient, fixed without --autotune (with it, alpha starts at 1 and is learned)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient towards --target-entropy-scale times the maximum entropy"""
    target_entropy_scale: float = 0.89
    """the target entropy as a fraction of the maximum entropy log(|A|) (the paper: 0.98)"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for (actions sampled from the policy)"""


# Losses, alpha and SPS are read back from the device and logged every this many steps.
LOG_EVERY = 1000
# Stacked frames per observation: the Atari frames come in stacks of 4; a MinAtar grid is one frame.
ATARI_STACK = 4


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        update_frequency=args.update_frequency,
        target_network_frequency=args.target_network_frequency,
        policy_lr=args.policy_lr,
        q_lr=args.q_lr,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} must be in [0, --total-timesteps {args.total_timesteps})")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not args.alpha >= 0:
        fail(f"--alpha must be 0 or positive, got {args.alpha}")
    if not 0 < args.target_entropy_scale <= 1:
        fail(
            f"--target-entropy-scale must be in (0, 1] (a fraction of the maximum entropy), "
            f"got {args.target_entropy_scale}"
        )
    # Sampling needs a stack of frames behind a row and its next row: ATARI_STACK + 1 rows per environment.
    if args.buffer_size < args.num_envs * (ATARI_STACK + 1):
        fail(f"--buffer-size {args.buffer_size} must hold at least {ATARI_STACK + 1} steps of --num-envs")
    if args.learning_starts < args.num_envs * (ATARI_STACK + 1):
        fail(
            f"--learning-starts must be at least {args.num_envs * (ATARI_STACK + 1)} ({ATARI_STACK + 1} steps per env)"
        )
    check_env_id(args.env_id, "cleanrl/dqn.py or cleanrl/ppo.py")
    probe = make_envs(args.env_id, 1)
    obs_shape = probe.single_observation_space.shape
    probe.close()
    check_fits(replay_nbytes(args, obs_shape), "cpu", "replay buffer", "--buffer-size")


def replay_nbytes(args: Args, obs_shape: tuple) -> int:
    """Bytes of the replay buffer: a buffer on the "meta" device has the real one's shapes and dtypes, no memory."""
    meta = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), torch.device("meta"))
    return sum(t.nbytes for t in vars(meta).values() if isinstance(t, torch.Tensor))


def stack_of(obs_shape: tuple) -> int:
    """Frames per observation: 84x84 Atari observations are stacks of 4 frames; a MinAtar grid is one."""
    return ATARI_STACK if obs_shape[-1] >= 84 else 1


class PixelNetwork(nn.Module):
    """One output per action from uint8 observations: the Nature CNN on 84x84 frames (Mnih et al. 2015); on MinAtar's
    10x10 grids the MinAtar paper's network (Young & Tian 2019): one 3x3 convolution of 16 channels, then 128 units.
    The actor's outputs are logits, the critics' soft Q-values. He (Kaiming normal) weights and zero biases, as
    CleanRL's sac_atari."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float):
        super().__init__()
        channels, height, width = obs_shape
        self.scale = 1.0 / obs_high  # pixels 0..255 -> [0, 1]; MinAtar's cells are 0/1 already
        if height >= 84:
            self.network = nn.Sequential(
                nn.Conv2d(channels, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(3136, 512),
                nn.ReLU(),
                nn.Linear(512, n_actions),
            )
        else:
            self.network = nn.Sequential(
                nn.Conv2d(channels, 16, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
                nn.Linear(16 * (height - 2) * (width - 2), 128),
                nn.ReLU(),
                nn.Linear(128, n_actions),
            )
        for layer in self.network:
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(layer.weight)
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.float() * self.scale)


class FrameReplayBuffer:
    """The last `buffer_size // num_envs` steps of each environment, every frame stored once as uint8.

    Row t of env e holds the newest frame of the observation acted on, the action, the clipped reward and whether the
    training episode terminated. The observation is rebuilt from the `stack` frames up to row t, with zeros before a
    game's first frame (as the env pads), and the next observation from those up to row t+1: under NEXT_STEP autoreset
    the row after a game's end holds its true final observation. That row's own step reset the env, its action ignored:
    it is not a transition and is never sampled."""

    def __init__(self, buffer_size: int, num_envs: int, obs_shape: tuple, stack: int, device: torch.device):
        channels, height, width = obs_shape
        self.steps, self.num_envs, self.stack = buffer_size // num_envs, num_envs, stack
        rows = (self.steps, num_envs)
        self.frames = torch.zeros(rows + (channels // stack, height, width), dtype=torch.uint8, device=device)
        self.actions = torch.zeros(rows, dtype=torch.long, device=device)
        self.rewards = torch.zeros(rows, device=device)
        self.terminations = torch.zeros(rows, device=device)
        self.first = torch.zeros(rows, dtype=torch.bool, device=device)  # the row's observation starts a game
        self.valid = torch.zeros(rows, dtype=torch.bool, device=device)  # the row's step is a transition
        self.starts_game = torch.ones(num_envs, dtype=torch.bool, device=device)  # ... the next row added
        self.staging = torch.zeros((4, num_envs))  # actions, rewards, terminations, resets: one host-to-device copy
        self.pos, self.size = 0, 0

    def add(self, obs: torch.Tensor, actions, rewards, terminations, resets) -> None:
        """One step of every env: `obs` [num_envs, C, H, W] uint8 on the buffer's device, the rest numpy [num_envs];
        `resets` marks envs whose step was an autoreset (their previous step ended a game)."""
        for row, values in zip(self.staging.numpy(), (actions, rewards, terminations, resets)):
            row[:] = values
        actions, rewards, terminations, resets = self.staging.to(self.frames.device)
        resets = resets.bool()
        self.frames[self.pos] = obs[:, -self.frames.shape[2] :]
        self.actions[self.pos], self.rewards[self.pos], self.terminations[self.pos] = actions, rewards, terminations
        self.first[self.pos], self.valid[self.pos] = self.starts_game, ~resets
        self.starts_game = resets  # an autoreset step returns the first observation of the next game
        self.pos = (self.pos + 1) % self.steps
        self.size = min(self.size + 1, self.steps)

    def new_games(self) -> None:
        """The envs were reset outside the stream (a resume with fresh games): the last row has no next observation."""
        self.valid[(self.pos - 1) % self.steps] = False
        self.starts_game[:] = True

    def stacked(self, rows: torch.Tensor, envs: torch.Tensor) -> torch.Tensor:
        """Observations [n, C, H, W] at `rows` of `envs`: the newest frame and the `stack - 1` before it, zeros where
        those belong to an earlier game."""
        frames, same_game = [], torch.ones_like(rows, dtype=torch.bool)
        for back in range(self.stack):
            row = (rows - back) % self.steps
            frames.append(self.frames[row, envs] * same_game.view(-1, 1, 1, 1))
            same_game = same_game & ~self.first[row, envs]
        return torch.cat(frames[::-1], dim=1)

    def sample(self, batch_size: int, candidates: int = 8) -> tuple[torch.Tensor, ...]:
        """A uniform minibatch of transitions (with replacement): obs, next_obs, actions, rewards, terminations.

        Each draw takes the first real transition of `candidates` uniform ones (reset rows are rare), and if all fall
        on reset rows the transition before the last one (a game's end); rows too old for a full stack and the newest
        row (no next observation yet) are never drawn."""
        # Age 1 is the newest row with a next row; the oldest `stack - 1` rows lack the frames behind them.
        ages = torch.randint(1, self.size - self.stack + 1, (batch_size, candidates), device=self.frames.device)
        envs = torch.randint(self.num_envs, (batch_size, candidates), device=self.frames.device)
        rows = (self.pos - 1 - ages) % self.steps
        pick = self.valid[rows, envs].float().argmax(dim=1, keepdim=True)  # the first valid, else the first
        rows, envs = rows.gather(1, pick).squeeze(1), envs.gather(1, pick).squeeze(1)
        rows = torch.where(self.valid[rows, envs], rows, (rows - 1) % self.steps)
        obs, next_obs = self.stacked(rows, envs), self.stacked((rows + 1) % self.steps, envs)
        return obs, next_obs, self.actions[rows, envs], self.rewards[rows, envs], self.terminations[rows, envs]

    def state_dict(self) -> dict:
        fields = ("frames", "actions", "rewards", "terminations", "first", "valid")
        state = {name: getattr(self, name)[: self.size].cpu() for name in fields}
        return state | {"starts_game": self.starts_game.cpu(), "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        for name in ("frames", "actions", "rewards", "terminations", "first", "valid"):
            getattr(self, name)[: state["size"]] = state[name]
        self.starts_game[:] = state["starts_game"]
        self.pos, self.size = state["pos"], state["size"]


def policy(actor: PixelNetwork, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's probabilities pi(.|s) and log-probabilities log pi(.|s) [batch, |A|], from the actor's logits."""
    log_probs = F.log_softmax(actor(obs), dim=1)
    return log_probs.exp(), log_probs


def sample_actions(actor: PixelNetwork, obs: torch.Tensor, generator: torch.Generator | None = None) -> np.ndarray:
    """Actions drawn from the policy for a batch of observations, with `generator` (default: torch's RNG)."""
    with torch.no_grad():
        probs, _ = policy(actor, obs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1).cpu().numpy()


def target_entropy(n_actions: int, scale: float) -> float:
    """The entropy alpha is tuned towards: `scale` times the maximum entropy, -scale * log(1 / |A|)."""
    return -scale * math.log(1.0 / n_actions)


def soft_q_target(rewards, terminations, next_probs, next_log_probs, next_q_min, alpha, gamma: float) -> torch.Tensor:
    """r + gamma * sum_a' pi(a'|s') (min_i Q_target_i(s', a') - alpha log pi(a'|s')): the soft value of s' as the full
    expectation over next actions, no sampled a'; the bootstrap dropped where the training episode terminated."""
    next_value = (next_probs * (next_q_min - alpha * next_log_probs)).sum(dim=1)
    return rewards + gamma * (1.0 - terminations) * next_value


def policy_loss(probs, log_probs, q_min, alpha) -> torch.Tensor:
    """E_s[sum_a pi(a|s) (alpha log pi(a|s) - min_i Q_i(s, a))]: the expectation over actions replaces the
    reparameterised sample of continuous SAC. `q_min` is a constant here (computed without gradients). CleanRL's
    `.mean()` over the [batch, actions] grid is this divided by |A|; Adam's steps barely notice the scale."""
    return (probs * (alpha * log_probs - q_min)).sum(dim=1).mean()


def temperature_loss(log_alpha, probs, log_probs, entropy_target: float) -> torch.Tensor:
    """E_s[-alpha sum_a pi(a|s) (log pi(a|s) + entropy_target)] = E_s[alpha (H(pi(.|s)) - entropy_target)], alpha =
    exp(log_alpha) as in CleanRL: its gradient lowers alpha while the policy's entropy is above the target, and raises
    it below. The policy's probabilities are constants here (CleanRL's mean over actions: this divided by |A|)."""
    probs, log_probs = probs.detach(), log_probs.detach()
    return (-log_alpha.exp() * (probs * (log_probs + entropy_target)).sum(dim=1)).mean()


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the game scores of its stochastic policy: actions sampled as in
    training (what SAC learns is the distribution; CleanRL samples too), not its most likely action."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    actor = PixelNetwork(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    actor.load_state_dict(model["actor"])
    obs, _ = envs.reset(seed=seed)
    generator = torch.Generator(device).manual_seed(seed)  # its own: evaluating leaves torch's RNG alone
    game_scores = []
    while len(game_scores) < eval_episodes:
        obs, _, _, _, infos = envs.step(sample_actions(actor, torch.as_tensor(obs, device=device), generator))
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

    # Three networks, each with its own encoder; the two critics get hard-copied targets.
    actor = PixelNetwork(obs_shape, n_actions, obs_high).to(device)
    qf1 = PixelNetwork(obs_shape, n_actions, obs_high).to(device)
    qf2 = PixelNetwork(obs_shape, n_actions, obs_high).to(device)
    qf1_target = PixelNetwork(obs_shape, n_actions, obs_high).to(device)
    qf2_target = PixelNetwork(obs_shape, n_actions, obs_high).to(device)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    # Adam's eps=1e-4: CleanRL's choice, for numerical stability. fused=True: one kernel for all parameters; a MinAtar
    # update (batch 64, CPU) 10.7 -> 10.1 ms, medians of 12 interleaved repeats.
    q_optimizer = torch.optim.Adam([*qf1.parameters(), *qf2.parameters()], lr=args.q_lr, eps=1e-4, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, eps=1e-4, fused=True)
    # Automatic entropy tuning: alpha = exp(log_alpha), a device tensor updated in place (no host read per step).
    entropy_target = target_entropy(n_actions, args.target_entropy_scale)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr, eps=1e-4, fused=True)
    # On the training device when it fits there (checked with some room to spare), else in host memory.
    fits_on_device = available_memory(device) > 1.25 * replay_nbytes(args, obs_shape)
    storage = device if fits_on_device else torch.device("cpu")
    rb = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), storage)
    # What a checkpoint holds besides log_alpha, the environments and the counters (training_state below).
    stateful = dict(actor=actor, qf1=qf1, qf2=qf2, qf1_target=qf1_target, qf2_target=qf2_target, replay_buffer=rb)
    stateful.update(q_optimizer=q_optimizer, actor_optimizer=actor_optimizer, alpha_optimizer=alpha_optimizer)

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        for key, stored in stateful.items():
            stored.load_state_dict(run.checkpoint[key])
        with torch.no_grad():
            log_alpha.copy_(run.checkpoint["log_alpha"])
            alpha.copy_(log_alpha.exp() if args.autotune else torch.tensor(args.alpha))
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        if run.checkpoint["envs"] is None:
            rb.new_games()
        else:
            resets = run.checkpoint["resets"]
        global_step = run.checkpoint["global_step"]
    obs = torch.from_numpy(obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            **{key: stored.state_dict() for key, stored in stateful.items()},
            log_alpha=log_alpha.detach().cpu(),
            envs=snapshot_envs(envs, obs_np),
            resets=resets,
            global_step=global_step,
        )

    run.begin(training_state)
    losses = {}  # of the latest gradient step, read back only when logged (none yet after a resume)
    while global_step < args.total_timesteps:
        # 1. Act: uniformly random actions until learning_starts, then samples of the policy (torch's RNG). One
        # host-to-device copy of the observations, one device-to-host copy of the actions.
        if global_step < args.learning_starts:
            actions = torch.randint(n_actions, (args.num_envs,), device=device).cpu().numpy()
        else:
            actions = sample_actions(actor, obs)
        obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's choices).
        rb.add(obs.to(storage), actions, np.sign(rewards), terminations | infos["life_loss"], resets)
        resets = terminations | truncations  # NEXT_STEP autoreset: these envs' next step starts a new game
        obs = torch.from_numpy(obs_np).to(device)
        run.log_episodes(global_step, infos)

        # 2. Learn: every `update_frequency` env steps one step of the critics, then of the actor (against the updated
        # critics), then of alpha (several per step if num_envs is larger).
        if global_step > args.learning_starts:
            for _ in range(global_step // args.update_frequency - previous_step // args.update_frequency):
                obs_b, next_obs_b, actions_b, rewards_b, terminations_b = (
                    t.to(device) for t in rb.sample(args.batch_size)
                )
                with torch.no_grad():
                    next_probs, next_log_probs = policy(actor, next_obs_b)
                    next_q_min = torch.min(qf1_target(next_obs_b), qf2_target(next_obs_b))
                    target = soft_q_target(
                        rewards_b, terminations_b, next_probs, next_log_probs, next_q_min, alpha, args.gamma
                    )
                qf1_values = qf1(obs_b).gather(1, actions_b.unsqueeze(1)).squeeze(1)
                qf2_values = qf2(obs_b).gather(1, actions_b.unsqueeze(1)).squeeze(1)
                qf1_loss, qf2_loss = F.mse_loss(qf1_values, target), F.mse_loss(qf2_values, target)
                q_optimizer.zero_grad()
                (qf1_loss + qf2_loss).backward()
                q_optimizer.step()

                probs, log_probs = policy(actor, obs_b)
                with torch.no_grad():
                    q_min = torch.min(qf1(obs_b), qf2(obs_b))
                actor_loss = policy_loss(probs, log_probs, q_min, alpha)
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()

                with torch.no_grad():
                    losses = {"losses/qf1_values": qf1_values.mean(), "losses/qf2_values": qf2_values.mean()}
                    losses |= {"losses/qf1_loss": qf1_loss, "losses/qf2_loss": qf2_loss}
                    losses |= {"losses/qf_loss": (qf1_loss + qf2_loss) / 2, "losses/actor_loss": actor_loss}
                    losses["losses/entropy"] = -(probs * log_probs).sum(dim=1).mean()  # the policy's, vs the target
                if args.autotune:
                    alpha_loss = temperature_loss(log_alpha, probs, log_probs, entropy_target)
                    alpha_optimizer.zero_grad()
                    alpha_loss.backward()
                    alpha_optimizer.step()
                    alpha.copy_(log_alpha.detach().exp())
                    losses["losses/alpha_loss"] = alpha_loss.detach()

            # Update the target networks: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for net, target_net in ((qf1, qf1_target), (qf2, qf2_target)):
                        torch._foreach_lerp_(list(target_net.parameters()), list(net.parameters()), args.tau)

        # 3. Log (one device-to-host read every LOG_EVERY steps) and checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            run.log(global_step, (losses | {"losses/alpha": alpha}) if losses else {})
        run.end_iteration(global_step)

    envs.close()
    model = dict(actor=actor.state_dict(), qf1=qf1.state_dict(), qf2=qf2.state_dict())
    run.finish(global_step, evaluate, **model, obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
