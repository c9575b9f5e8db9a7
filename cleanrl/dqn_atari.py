"""Deep Q-Network (DQN) from pixels: Atari and MinAtar.

Mnih et al. 2015, "Human-level control through deep reinforcement learning"
(https://www.nature.com/articles/nature14236): the Nature CNN on 4 stacked 84x84 frames, a replay buffer, targets from
a periodically copied target network, epsilon-greedy acting; rewards clipped to their sign and a lost life ending the
training episode, while charts/episodic_return is the whole game's raw score. CleanRL's hyperparameters.

Action space: Discrete. Environments: Atari through ale-py's C++ vector env (BreakoutNoFrameskip-v4: no sticky
actions; ALE/Breakout-v5: sticky 0.25) and MinAtar (MinAtar/Breakout-v1 ...), which gets the MinAtar paper's small
network. Each frame is stored once, as uint8 (a 1M-step Atari buffer takes 7.07 GB), on the training device when it
fits there. Checkpoints hold the replay buffer; MinAtar games are saved with them, so a resumed run on the CPU continues
exactly; ALE's vector env cannot be saved, so a resumed Atari run starts fresh games.

    uv run python cleanrl/dqn_atari.py --env-id BreakoutNoFrameskip-v4
    uv run python cleanrl/dqn_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 1000000 --buffer-size 100000 \\
        --learning-starts 5000 --exploration-fraction 0.1 --learning-rate 2.5e-4

Expect Breakout ~360 after 10M steps (CleanRL's figure); MinAtar results in benchmark/results/dqn_atari.md.
"""

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
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions, over all environments)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy; below 1: Polyak averaging)"""
    target_network_frequency: int = 1000
    """the timesteps it takes to update the target network"""
    batch_size: int = 32
    """the batch size of sample from the replay memory"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 80000
    """timestep to start learning"""
    train_frequency: int = 4
    """the frequency of training (one gradient step every this many timesteps)"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""
    amp: bool = False
    """if toggled, run the networks in bf16 autocast (parameters and storage stay float32)"""


# Losses, epsilon and SPS are read back from the device and logged every this many steps.
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
        train_frequency=args.train_frequency,
        target_network_frequency=args.target_network_frequency,
        learning_rate=args.learning_rate,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} must be in [0, --total-timesteps {args.total_timesteps})")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(f"epsilon must decay: need 0 <= --end-e <= --start-e <= 1, got {args.end_e} and {args.start_e}")
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    # Sampling needs a stack of frames behind a row and its next row: ATARI_STACK + 1 rows per environment.
    if args.buffer_size < args.num_envs * (ATARI_STACK + 1):
        fail(f"--buffer-size {args.buffer_size} must hold at least {ATARI_STACK + 1} steps of --num-envs")
    if args.learning_starts < args.num_envs * (ATARI_STACK + 1):
        fail(
            f"--learning-starts must be at least {args.num_envs * (ATARI_STACK + 1)} ({ATARI_STACK + 1} steps per env)"
        )
    check_env_id(args.env_id, "cleanrl/dqn.py")
    probe = make_envs(args.env_id, 1)
    obs_shape = probe.single_observation_space.shape
    probe.close()
    check_fits(replay_nbytes(args, obs_shape), "cpu", "replay buffer", "--buffer-size")


def replay_nbytes(args: Args, obs_shape: tuple) -> int:
    """Bytes of the replay buffer: built on the "meta" device it has the real one's shapes and dtypes, no memory."""
    meta = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), torch.device("meta"))
    return sum(t.nbytes for t in vars(meta).values() if isinstance(t, torch.Tensor))


def stack_of(obs_shape: tuple) -> int:
    """Frames per observation: 84x84 Atari observations are stacks of 4 frames; a MinAtar grid is one."""
    return ATARI_STACK if obs_shape[-1] >= 84 else 1


class QNetwork(nn.Module):
    """The Nature CNN on 84x84 frames (Mnih et al. 2015); on MinAtar's 10x10 grids the MinAtar paper's network (Young
    & Tian 2019): one 3x3 convolution of 16 channels, then 128 units. Takes uint8 observations. The Q-values are cast
    to float32 (a no-op without --amp): under bf16 autocast the targets and the loss are then float32 all the same."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.float() * self.scale).float()


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


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


def td_target(rewards: torch.Tensor, next_max: torch.Tensor, terminations: torch.Tensor, gamma: float) -> torch.Tensor:
    """r + gamma * next_max, next_max = max_a' Q_target(s', a'); no bootstrap where the episode terminated."""
    return rewards + gamma * next_max * (1.0 - terminations)


def select_actions(q_network: QNetwork, obs: torch.Tensor, epsilon: float, n_actions: int) -> np.ndarray:
    """Epsilon-greedy actions for a batch of observations, drawn with torch's RNG on obs.device."""
    explore = torch.rand(len(obs), device=obs.device) < epsilon
    random_actions = torch.randint(n_actions, (len(obs),), device=obs.device)
    with torch.no_grad():
        greedy_actions = q_network(obs).argmax(dim=1)
    return torch.where(explore, random_actions, greedy_actions).cpu().numpy()


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
    epsilon: float = 0.05,
) -> list[float]:
    """Reload a model saved by this script and return the game scores of its epsilon-greedy policy."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    q_network = QNetwork(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    q_network.load_state_dict(model["q_network"])
    obs, _ = envs.reset(seed=seed)
    game_scores = []
    while len(game_scores) < eval_episodes:
        actions = select_actions(q_network, torch.as_tensor(obs, device=device), epsilon, model["n_actions"])
        obs, _, _, _, infos = envs.step(actions)
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

    q_network = QNetwork(obs_shape, n_actions, obs_high).to(device)
    # fused=True: one kernel for all parameters; a MinAtar update 1.86 -> 1.61 ms on the CPU (measured side by side).
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    target_network = QNetwork(obs_shape, n_actions, obs_high).to(device)
    target_network.load_state_dict(q_network.state_dict())
    # On the training device when it fits there (checked with some room to spare), else in host memory.
    fits_on_device = available_memory(device) > 1.25 * replay_nbytes(args, obs_shape)
    storage = device if fits_on_device else torch.device("cpu")
    rb = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), storage)
    # --amp: the networks' forward passes in bf16 autocast, which needs no loss scaling (its exponent range is
    # float32's); parameters, optimiser state and the replay buffer stay float32 (frames uint8).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        q_network.load_state_dict(run.checkpoint["q_network"])
        target_network.load_state_dict(run.checkpoint["target_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        rb.load_state_dict(run.checkpoint["replay_buffer"])
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
            q_network=q_network.state_dict(),
            target_network=target_network.state_dict(),
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            envs=snapshot_envs(envs, obs_np),
            resets=resets,
            global_step=global_step,
        )

    run.begin(training_state)
    losses = {}  # of the latest gradient step, read back only when logged (none yet after a resume)
    while global_step < args.total_timesteps:
        # Act: one host-to-device copy of the observations, one device-to-host copy of the actions.
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        with autocast:
            actions = select_actions(q_network, obs, epsilon, n_actions)
        obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's choices).
        rb.add(obs.to(storage), actions, np.sign(rewards), terminations | infos["life_loss"], resets)
        resets = terminations | truncations  # NEXT_STEP autoreset: these envs' next step starts a new game
        obs = torch.from_numpy(obs_np).to(device)
        run.log_episodes(global_step, infos)

        # Learn: a gradient step every `train_frequency` env steps (several per step if num_envs is larger).
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                obs_b, next_obs_b, actions_b, rewards_b, terminations_b = (
                    t.to(device) for t in rb.sample(args.batch_size)
                )
                with torch.no_grad(), autocast:
                    target_max = target_network(next_obs_b).amax(dim=1)
                    target = td_target(rewards_b, target_max, terminations_b, args.gamma)
                with autocast:
                    q_values = q_network(obs_b).gather(1, actions_b.unsqueeze(1)).squeeze(1)
                loss = F.mse_loss(q_values, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses = {"losses/td_loss": loss, "losses/q_values": q_values.mean()}

            # Update the target network: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.lerp_(param, args.tau)

        # Log (one device-to-host read every LOG_EVERY steps) and checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            charts = {"charts/epsilon": epsilon, "charts/learning_rate": optimizer.param_groups[0]["lr"]}
            run.log(global_step, losses | charts)
        run.end_iteration(global_step)

    envs.close()
    model = dict(q_network=q_network.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
