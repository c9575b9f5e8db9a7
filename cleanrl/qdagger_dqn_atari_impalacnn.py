"""QDagger: reincarnating a DQN student with an IMPALA CNN from a dqn_atari.py teacher, Atari and MinAtar.

Agarwal et al. 2022, "Reincarnating Reinforcement Learning: Reusing Prior Computation to Accelerate Progress"
(https://arxiv.org/abs/2206.01626): the student minimises the TD loss plus lambda times the distillation loss, the KL
divergence from the teacher's softmax(Q_T / temperature) to the student's softmax(Q / temperature). Three phases, one
step counter: the teacher acts epsilon-greedily (epsilon start-e -> end-e over --teacher-steps) and fills a replay
buffer; the student learns offline from it for --offline-steps gradient steps (lambda = 1); then the student acts and
learns online from its own replay for --total-timesteps env steps, lambda = 1 - G_student / G_teacher (last 10 games
against the teacher's evaluation), clipped to [0, 1]. The teacher is a model saved by dqn_atari.py with --save-model
for the same env: a file, a run directory or hf://USER/NAME (cleanrl_utils.hub).

Where ours differs from CleanRL's file: the distillation loss is the batch mean of the per-state KL (CleanRL sums
over the batch); the online epsilon schedule and --learning-starts count online steps only (CleanRL's counter includes
the offline steps: its student starts at epsilon ~0.5 and learns online at once); lambda is clipped at 1 as well as 0
and defined for teachers scoring <= 0 (|G_teacher| in the denominator); the teacher's network is written out here.
Resume: like dqn_atari.py (MinAtar exact on the CPU, Atari with fresh games), in each of the three phases.

    uv run python cleanrl/qdagger_dqn_atari_impalacnn.py --env-id MinAtar/Breakout-v1 \\
        --teacher-model runs/MinAtar-Breakout-v1__dqn_atari__1__.../dqn_atari.cleanrl_model

Results on MinAtar Breakout against dqn_atari.py from scratch: benchmark/results/qdagger_dqn_atari_impalacnn.md.
"""

import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import load_model, read_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
from cleanrl_utils.errors import available_memory, check_fits, check_positive, fail
from cleanrl_utils.hub import resolve_model_path
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
    """write a checkpoint every this many steps of the run (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """the student's online environment steps (after the teacher's steps and the offline phase)"""

    # Algorithm specific arguments
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size, of the teacher's replay and then of the student's (transitions)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy; below 1: Polyak averaging)"""
    target_network_frequency: int = 1000
    """the gradient steps offline, the env steps online, between target network updates"""
    batch_size: int = 32
    """the batch size of sample from the replay memory"""
    start_e: float = 1
    """the starting epsilon for exploration (of the teacher filling its replay, and of the student online)"""
    end_e: float = 0.01
    """the ending epsilon for exploration (also the teacher's epsilon when it is evaluated)"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes the student from start-e to go end-e"""
    learning_starts: int = 80000
    """the online step at which the student starts learning from its own replay"""
    train_frequency: int = 4
    """the frequency of online training (one gradient step every this many timesteps)"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""

    # QDagger specific arguments
    teacher_model: str | None = None
    """the teacher: a model saved by dqn_atari.py for --env-id (a .cleanrl_model file, its run directory, or
    hf://USER/NAME)"""
    teacher_eval_episodes: int = 10
    """the number of games the teacher is evaluated for (its score G_teacher in the distillation weight)"""
    teacher_steps: int = 500000
    """the environment steps the teacher acts for to fill its replay buffer"""
    offline_steps: int = 500000
    """the gradient steps of the student on the teacher's replay buffer"""
    temperature: float = 1.0
    """the temperature of the softmax over Q-values in the distillation loss"""


# Losses, epsilon and SPS are read back from the device and logged every this many steps.
LOG_EVERY = 1000
# Stacked frames per observation: the Atari frames come in stacks of 4; a MinAtar grid is one frame.
ATARI_STACK = 4
# The distillation weight compares the mean of the student's last this many games with the teacher's score.
STUDENT_GAMES = 10
# The script whose saved models can teach.
TEACHER_SCRIPT = "dqn_atari"


def validate(args: Args) -> dict:
    """Check the arguments, the environment and the teacher before any work; fail in one line. Returns the teacher."""
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
        teacher_eval_episodes=args.teacher_eval_episodes,
        teacher_steps=args.teacher_steps,
        temperature=args.temperature,
    )
    if args.checkpoint_every < 0 or args.offline_steps < 0:
        fail(
            f"--checkpoint-every and --offline-steps must be 0 or positive, "
            f"got {args.checkpoint_every} and {args.offline_steps}"
        )
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} must be in [0, --total-timesteps {args.total_timesteps})")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(f"epsilon must decay: need 0 <= --end-e <= --start-e <= 1, got {args.end_e} and {args.start_e}")
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    # Sampling needs a stack of frames behind a row and its next row: ATARI_STACK + 1 rows per environment.
    minimum = args.num_envs * (ATARI_STACK + 1)
    if args.buffer_size < minimum:
        fail(f"--buffer-size {args.buffer_size} must hold at least {ATARI_STACK + 1} steps of --num-envs")
    if args.learning_starts < minimum:
        fail(f"--learning-starts must be at least {minimum} ({ATARI_STACK + 1} steps per env)")
    if args.teacher_steps < minimum or args.teacher_steps % args.num_envs:
        fail(f"--teacher-steps must be a multiple of --num-envs and at least {minimum}, got {args.teacher_steps}")
    check_env_id(args.env_id, "cleanrl/dqn.py")
    probe = make_envs(args.env_id, 1)
    obs_shape = probe.single_observation_space.shape
    probe.close()
    teacher = load_teacher(args.teacher_model, args.env_id)
    if tuple(teacher["obs_shape"]) != tuple(obs_shape):
        fail(
            f"--teacher-model: the teacher sees observations of shape {teacher['obs_shape']}, {args.env_id} {obs_shape}"
        )
    check_fits(replay_nbytes(args, obs_shape), "cpu", "replay buffer", "--buffer-size")
    return teacher


def load_teacher(spec: str | None, env_id: str) -> dict:
    """The saved dqn_atari.py model that `spec` names (a file, a run directory, hf://USER/NAME); fails in one line for
    anything else or for a model of another environment."""
    if not spec:
        fail(
            "--teacher-model is required: a model saved by dqn_atari.py --save-model (its file or run directory), or hf://USER/NAME"
        )
    model = read_model(resolve_model_path(spec))
    if model["script"] != TEACHER_SCRIPT:
        fail(
            f"--teacher-model {spec}: saved by {model['script']}.py; the teacher must be a model saved by dqn_atari.py"
        )
    if model["env_id"] != env_id:
        fail(f"--teacher-model {spec}: a teacher for {model['env_id']}, not {env_id}; add --env-id {model['env_id']}")
    return model


def replay_nbytes(args: Args, obs_shape: tuple) -> int:
    """Bytes of one replay buffer (the teacher's is freed before the student's is made): built on the "meta" device it
    has the real one's shapes and dtypes, no memory."""
    meta = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), torch.device("meta"))
    return sum(t.nbytes for t in vars(meta).values() if isinstance(t, torch.Tensor))


def stack_of(obs_shape: tuple) -> int:
    """Frames per observation: 84x84 Atari observations are stacks of 4 frames; a MinAtar grid is one."""
    return ATARI_STACK if obs_shape[-1] >= 84 else 1


class TeacherQNetwork(nn.Module):
    """dqn_atari.py's QNetwork, layer for layer (its saved state dict loads here): the Nature CNN on 84x84 frames, the
    MinAtar paper's network on 10x10 grids. Takes uint8 observations."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float):
        super().__init__()
        channels, height, width = obs_shape
        self.scale = 1.0 / obs_high
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
        return self.network(x.float() * self.scale)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    """A 3x3 convolution, a 3x3 max-pool of stride 2 (halving height and width), two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.res_block0 = ResidualBlock(out_channels)
        self.res_block1 = ResidualBlock(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv(x), kernel_size=3, stride=2, padding=1)
        return self.res_block1(self.res_block0(x))


class QNetwork(nn.Module):
    """The student: the IMPALA CNN (Espeholt et al. 2018; channels 16, 32, 32, then 256 units) and a linear Q head,
    PyTorch's default initialisation (as CleanRL's). Takes uint8 observations."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float):
        super().__init__()
        c, h, w = obs_shape
        self.scale = 1.0 / obs_high  # pixels 0..255 -> [0, 1]; MinAtar's cells are 0/1 already
        layers = []
        for out_channels in (16, 32, 32):
            layers.append(ConvSequence(c, out_channels))
            c, h, w = out_channels, (h + 1) // 2, (w + 1) // 2
        layers += [nn.Flatten(), nn.ReLU(), nn.Linear(c * h * w, 256), nn.ReLU(), nn.Linear(256, n_actions)]
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.float() * self.scale)


class FrameReplayBuffer:
    """The last `buffer_size // num_envs` steps of each environment, every frame stored once as uint8 (as in
    dqn_atari.py).

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


def distillation_loss(student_q: torch.Tensor, teacher_q: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over the batch of KL(pi_teacher || pi_student), pi = softmax(Q / temperature) over the actions."""
    teacher_log_pi = F.log_softmax(teacher_q / temperature, dim=-1)
    student_log_pi = F.log_softmax(student_q / temperature, dim=-1)
    return (teacher_log_pi.exp() * (teacher_log_pi - student_log_pi)).sum(dim=-1).mean()


def distillation_weight(student_returns, teacher_score: float, games: int = STUDENT_GAMES) -> float:
    """lambda: 1 until the student has played `games` games, then 1 - G_student / G_teacher clipped to [0, 1], G_student
    the mean of its last `games` game scores; |G_teacher| as the denominator, so that for a teacher scoring below zero
    lambda still falls from 1 to 0 as the student's score rises to the teacher's."""
    if len(student_returns) < games:
        return 1.0
    student_score = float(np.mean(list(student_returns)[-games:]))
    return min(max((teacher_score - student_score) / max(abs(teacher_score), 1e-8), 0.0), 1.0)


def select_actions(q_network: nn.Module, obs: torch.Tensor, epsilon: float, n_actions: int) -> np.ndarray:
    """Epsilon-greedy actions for a batch of observations, drawn with torch's RNG on obs.device."""
    explore = torch.rand(len(obs), device=obs.device) < epsilon
    random_actions = torch.randint(n_actions, (len(obs),), device=obs.device)
    with torch.no_grad():
        greedy_actions = q_network(obs).argmax(dim=1)
    return torch.where(explore, random_actions, greedy_actions).cpu().numpy()


def play(q_network: nn.Module, env_id: str, episodes: int, epsilon: float, device, seed: int, **env_kwargs) -> list:
    """The game scores of `episodes` games of `q_network`'s epsilon-greedy policy."""
    envs = make_envs(env_id, 1, **env_kwargs)
    n_actions = int(envs.single_action_space.n)
    obs, _ = envs.reset(seed=seed)
    game_scores = []
    while len(game_scores) < episodes:
        actions = select_actions(q_network, torch.as_tensor(obs, device=device), epsilon, n_actions)
        obs, _, _, _, infos = envs.step(actions)
        if "episode" in infos:
            game_scores += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return game_scores[:episodes]


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
    epsilon: float = 0.05,
) -> list[float]:
    """Reload a student saved by this script and return the game scores of its epsilon-greedy policy."""
    model = load_model(model_path, __file__)
    q_network = QNetwork(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    q_network.load_state_dict(model["q_network"])
    return play(
        q_network,
        model["env_id"],
        eval_episodes,
        epsilon,
        device,
        seed,
        capture_video=capture_video,
        video_dir=video_dir,
    )


if __name__ == "__main__":
    args = tyro.cli(Args)
    teacher_model = validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_shape = envs.single_observation_space.shape
    obs_high = float(envs.single_observation_space.high.max())
    n_actions = int(envs.single_action_space.n)
    # The run's steps: the teacher's env steps, then the offline gradient steps, then the student's env steps.
    teacher_end = args.teacher_steps
    offline_end = teacher_end + args.offline_steps
    if run.progress is not None:
        run.progress.total_steps = offline_end + args.total_timesteps

    teacher = TeacherQNetwork(obs_shape, n_actions, obs_high).to(device)
    teacher.load_state_dict(teacher_model["q_network"])
    teacher.requires_grad_(False)
    q_network = QNetwork(obs_shape, n_actions, obs_high).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    target_network = QNetwork(obs_shape, n_actions, obs_high).to(device)
    target_network.load_state_dict(q_network.state_dict())
    fits_on_device = available_memory(device) > 1.25 * replay_nbytes(args, obs_shape)
    storage = device if fits_on_device else torch.device("cpu")
    teacher_rb = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), storage)
    rb = None  # the student's replay, made when the online phase starts (the teacher's is freed then)
    student_returns = deque(maxlen=STUDENT_GAMES)  # the student's last game scores, for the distillation weight

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        global_step = run.checkpoint["global_step"]
        teacher_score = run.checkpoint["teacher_score"]
        q_network.load_state_dict(run.checkpoint["q_network"])
        target_network.load_state_dict(run.checkpoint["target_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        if run.checkpoint["teacher_replay_buffer"] is not None:
            teacher_rb.load_state_dict(run.checkpoint["teacher_replay_buffer"])
        if run.checkpoint["replay_buffer"] is not None:  # resumed in the online phase
            teacher_rb = None
            rb = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), storage)
            rb.load_state_dict(run.checkpoint["replay_buffer"])
            student_returns.extend(run.checkpoint["student_returns"])
        if global_step < teacher_end or rb is not None:  # the envs' games matter in these phases
            envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
            if run.checkpoint["envs"] is None:
                (rb or teacher_rb).new_games()
            else:
                resets = run.checkpoint["resets"]
    else:
        # The teacher's score G_teacher, in whole games at the epsilon the student ends its exploration with.
        teacher_scores = play(teacher, args.env_id, args.teacher_eval_episodes, args.end_e, device, args.seed + 2000)
        teacher_score = float(np.mean(teacher_scores))
        run.writer.add_scalar("charts/teacher/avg_episodic_return", teacher_score, 0)
        print(f"teacher: {teacher_score:.2f} +- {np.std(teacher_scores):.2f} over {len(teacher_scores)} games")
    obs = torch.from_numpy(obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        envs_matter = global_step < teacher_end or rb is not None
        return dict(
            q_network=q_network.state_dict(),
            target_network=target_network.state_dict(),
            optimizer=optimizer.state_dict(),
            teacher_replay_buffer=teacher_rb.state_dict() if teacher_rb is not None else None,
            replay_buffer=rb.state_dict() if rb is not None else None,
            student_returns=list(student_returns),
            teacher_score=teacher_score,
            envs=snapshot_envs(envs, obs_np) if envs_matter else None,
            resets=resets,
            global_step=global_step,
        )

    def gradient_step(replay: FrameReplayBuffer, weight: float) -> dict:
        """One step on TD loss + weight * distillation loss from a minibatch of `replay`; the losses, on the device."""
        obs_b, next_obs_b, actions_b, rewards_b, terminations_b = (t.to(device) for t in replay.sample(args.batch_size))
        with torch.no_grad():
            target = td_target(rewards_b, target_network(next_obs_b).amax(dim=1), terminations_b, args.gamma)
            teacher_q = teacher(obs_b)
        student_q = q_network(obs_b)
        q_values = student_q.gather(1, actions_b.unsqueeze(1)).squeeze(1)
        td_loss = F.mse_loss(q_values, target)
        distill_loss = distillation_loss(student_q, teacher_q, args.temperature)
        loss = td_loss + weight * distill_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"losses/loss": loss, "losses/td_loss": td_loss, "losses/distill_loss": distill_loss,
                "losses/q_values": q_values.mean()}  # fmt: skip

    def update_target() -> None:
        """A copy with tau = 1, Polyak averaging below."""
        with torch.no_grad():
            for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                target_param.lerp_(param, args.tau)

    run.begin(training_state)
    losses = {}  # of the latest gradient step, read back only when logged

    # Phase 1: the teacher acts (epsilon from start-e to end-e over --teacher-steps) and fills its replay buffer.
    while global_step < teacher_end:
        epsilon = linear_schedule(args.start_e, args.end_e, args.teacher_steps, global_step)
        actions = select_actions(teacher, obs, epsilon, n_actions)
        obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        teacher_rb.add(obs.to(storage), actions, np.sign(rewards), terminations | infos["life_loss"], resets)
        resets = terminations | truncations
        obs = torch.from_numpy(obs_np).to(device)
        if "episode" in infos:
            for game_score in infos["episode"]["r"][infos["_episode"]].tolist():
                run.writer.add_scalar("charts/teacher/episodic_return", game_score, global_step)
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            run.log(global_step, {"charts/epsilon": epsilon})
        run.end_iteration(global_step)

    # Phase 2: the student learns offline from the teacher's replay, distilling with weight 1.
    while global_step < offline_end:
        offline_step = global_step - teacher_end
        losses = gradient_step(teacher_rb, 1.0)
        if offline_step % args.target_network_frequency == 0:
            update_target()
        previous_step, global_step = global_step, global_step + 1
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            run.log(global_step, losses | {"charts/distill_coeff": 1.0})
        run.end_iteration(global_step)

    # Phase 3: the student acts and learns online from its own replay; the distillation weight falls as it catches up.
    if rb is None:
        teacher_rb = None
        rb = FrameReplayBuffer(args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), storage)
        obs_np, _ = envs.reset(seed=args.seed + 1)
        resets = np.zeros(args.num_envs, dtype=bool)
        obs = torch.from_numpy(obs_np).to(device)
    losses = {}
    while global_step < offline_end + args.total_timesteps:
        online_step = global_step - offline_end
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, online_step
        )
        actions = select_actions(q_network, obs, epsilon, n_actions)
        obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs.to(storage), actions, np.sign(rewards), terminations | infos["life_loss"], resets)
        resets = terminations | truncations
        obs = torch.from_numpy(obs_np).to(device)
        run.log_episodes(global_step, infos)
        if "episode" in infos:
            student_returns.extend(infos["episode"]["r"][infos["_episode"]].tolist())

        # Learn: a gradient step every `train_frequency` online steps, once `learning_starts` of them have passed.
        previous_online, online_step = online_step, global_step - offline_end
        if online_step > args.learning_starts:
            distill_coeff = distillation_weight(student_returns, teacher_score)
            for _ in range(online_step // args.train_frequency - previous_online // args.train_frequency):
                losses = gradient_step(rb, distill_coeff)
            if online_step // args.target_network_frequency > previous_online // args.target_network_frequency:
                update_target()

        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            charts = {"charts/epsilon": epsilon, "charts/learning_rate": optimizer.param_groups[0]["lr"]}
            charts["charts/distill_coeff"] = distillation_weight(student_returns, teacher_score)
            run.log(global_step, losses | charts)
        run.end_iteration(global_step)

    envs.close()
    model = dict(q_network=q_network.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
