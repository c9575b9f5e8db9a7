"""SimbaV2 for continuous actions: SAC whose networks keep every weight matrix and every hidden feature on the unit
hypersphere, with a distributional (categorical) critic trained on normalised rewards.

Lee et al. 2025, "Hyperspherical Normalization for Scalable Deep Reinforcement Learning" (https://arxiv.org/abs/
2502.15280; the authors' JAX code, github.com/dojeon-ai/SimbaV2, read beside it). The input, with a constant c_shift
appended, is projected onto the sphere, embedded, and passed through residual blocks that move along the sphere by a
learned linear interpolation (LERP) towards an MLP's output; the weights W of every such layer are projected back
onto the sphere after every optimiser step, and learned scalers carry the scale that normalisation removes. The
critic predicts a 101-bin categorical distribution on [-5, 5] of the return of rewards divided by the running
scale of the discounted return; two critics, the target from the one whose mean is smaller. The authors' MuJoCo
settings are the defaults: actor 1 block of 128, critic 2 blocks of 512, Adam with its rate decaying linearly from
1e-4 to 5e-5, one update per environment step, temperature from 0.01 towards an entropy of -|A|/2, gamma from the
episode length (0.995 for 1000 steps). Ours differs in: the observation and reward statistics take each step's
observation and reward at that step (the authors' wrappers one step later); the critics are one stacked module (their
nn.vmap); the bin projection clamps its index (their one-hot drops mass that rounding puts past the last bin).

Action space: a bounded 1-D Box; environments as sac_continuous_action.py (MuJoCo, dm_control, Pendulum ...).

    uv run python cleanrl/simbav2_continuous_action.py --env-id Hopper-v5

benchmark/simbav2.sh runs it beside sac_continuous_action.py on Hopper-v5 (300k steps, 3 seeds).
"""

import copy
import itertools
import math
import os
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.errors import check_env_id, check_fits, check_positive, fail
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
    torch_threads: int = 0
    """CPU threads for torch; 0 = one per core (torch's default): the updates are bound by matrix products"""
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
    env_id: str = "Hopper-v5"
    """the id of the environment"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment"""
    env_options: str = "{}"
    """StockTrading-v0's options as a JSON object, e.g. '{"tickers": ["AAPL", "MSFT"], "test_start": "2021-01-01"}'"""

    # Algorithm specific arguments
    num_envs: int = 1
    """the number of parallel game environments (--utd-ratio gradient steps per environment step either way)"""
    buffer_size: int = 1000000
    """the replay memory buffer size"""
    gamma: float | None = None
    """the discount factor; unset: the authors' rule from the time limit T, clip(1 - 5 / T, 0.95, 0.995)"""
    tau: float = 0.005
    """target smoothing coefficient (Polyak averaging, after every critic step)"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = 5000
    """timestep to start learning (uniformly random actions until then)"""
    utd_ratio: int = 1
    """update-to-data ratio: gradient steps (actor, temperature, critics) per environment step"""
    learning_rate_init: float = 1e-4
    """Adam's learning rate at the first update (actor, temperature and critics alike)"""
    learning_rate_end: float = 5e-5
    """Adam's learning rate after utd_ratio * total_timesteps updates (linear decay, as the authors schedule it)"""
    actor_num_blocks: int = 1
    """the actor's residual (LERP) blocks"""
    actor_hidden_dim: int = 128
    """the width of the actor's hyperspherical features"""
    critic_num_blocks: int = 2
    """each critic's residual (LERP) blocks"""
    critic_hidden_dim: int = 512
    """the width of each critic's hyperspherical features"""
    c_shift: float = 3.0
    """the constant appended to the input before it is projected onto the sphere (keeps its norm)"""
    num_bins: int = 101
    """the atoms of the categorical critic, evenly spaced on [-g_max, g_max]"""
    g_max: float = 5.0
    """the support's bound; the reward scale keeps the largest discounted return seen within it"""
    use_cdq: bool = True
    """two critics, the target from the one of smaller mean, the actor on their minimum (the authors: on for MuJoCo)"""
    temperature_init: float = 0.01
    """the entropy temperature's initial value"""
    target_entropy_coef: float = -0.5
    """the temperature is tuned towards an entropy of this times the action dimension"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for (deterministic mean action)"""


LOG_EVERY = 100  # losses, temperature and SPS are read back from the device and logged every this many steps
LOG_STD_MIN, LOG_STD_MAX = -10.0, 2.0  # the authors' bounds of the policy's log standard deviation
EXPANSION = 4  # a block's MLP is hidden_dim -> 4 hidden_dim -> hidden_dim
EPS = 1e-8  # the smallest norm divided by, and the ReLU's offset that keeps a block's output off the zero vector


def register_env_family(env_id: str, env_options: str | None = None) -> None:
    """dm_control ids exist once shimmy is imported (about a second), PointChasing-v0 once
    cleanrl_utils.envs.point_chasing is, the PyBullet ids once pybullet_envs_gymnasium is, StockTrading-v0 once
    cleanrl_utils.envs.stock_trading is: import them only when asked for. `env_options` (--env-options, JSON)
    become StockTrading's registered keyword arguments; None keeps those registered."""
    if env_id.startswith("PointChasing"):
        import cleanrl_utils.envs.point_chasing  # noqa: F401  (registers PointChasing-v0 with gymnasium)
    if env_id.startswith("StockTrading"):
        import cleanrl_utils.envs.stock_trading as stock_trading  # registers StockTrading-v0 with gymnasium

        stock_trading.configure(env_id, env_options)  # checks the options (one line and exit 2 if bad)
    elif env_options not in (None, "{}"):
        fail(f"--env-options is for the StockTrading ids; {env_id} takes none")
    if env_id.endswith("BulletEnv-v0"):
        try:
            import pybullet_envs_gymnasium  # noqa: F401
        except ImportError:
            fail(f"{env_id} needs pybullet: install the pybullet extra (uv sync --extra pybullet; Python <= 3.11)")
    if env_id.startswith("dm_control/"):
        # With MUJOCO_GL=egl, importing dm_control loads Mesa's libLLVM; torch loading triton's
        # own LLVM after that (the fused optimiser imports torch._dynamo) segfaults. Load torch's first.
        import torch._dynamo  # noqa: F401

        try:
            import shimmy  # noqa: F401
        except ImportError:
            fail(f"{env_id} needs dm_control and shimmy: install the mujoco extra (uv sync --extra mujoco)")


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "utd_ratio", "learning_rate_init")
    positive += ("actor_num_blocks", "actor_hidden_dim", "critic_num_blocks", "critic_hidden_dim", "g_max")
    positive += ("temperature_init", "eval_episodes")
    check_positive(**{name: getattr(args, name) for name in positive})
    for name in ("checkpoint_every", "torch_threads", "learning_starts", "learning_rate_end"):
        if not getattr(args, name) >= 0:
            fail(f"--{name.replace('_', '-')} must be 0 or positive, got {getattr(args, name)}")
    if args.num_bins < 2:
        fail(f"--num-bins must be at least 2 (a support needs two atoms), got {args.num_bins}")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}")
    if (args.gamma is not None and not 0 < args.gamma <= 1) or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; lower the batch")
    if args.num_envs > args.buffer_size:
        fail(f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: a step overwrites itself")
    register_env_family(args.env_id, args.env_options)
    check_env_id(args.env_id)
    try:
        probe = gym.make(args.env_id)
    except gym.error.DependencyNotInstalled as error:
        fail(f"{args.env_id} cannot be made ({error}); for MuJoCo install the mujoco extra (uv sync --extra mujoco)")
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Box):
        fail(
            f"simbav2_continuous_action.py handles Box actions but {args.env_id} has {action_space}; use cleanrl/dqn.py"
        )
    low, high = action_space.low, action_space.high
    if len(action_space.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        fail(f"simbav2_continuous_action.py needs 1-D Box actions in finite bounds; {args.env_id} has {action_space}")
    boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(
            f"simbav2_continuous_action.py needs Box (or Dict of Box) observations; {args.env_id} has "
            f"{observation_space}"
        )
    obs_dim, act_dim = gym.spaces.flatdim(observation_space), action_space.shape[0]
    nbytes = args.buffer_size * sum(ReplayBuffer.field_widths(obs_dim, act_dim)) * 4  # float32 rows
    check_fits(nbytes, "cuda" if args.cuda and torch.cuda.is_available() else "cpu", "replay buffer", "--buffer-size")


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        register_env_family(env_id)
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        if isinstance(env.observation_space, gym.spaces.Dict) or len(env.observation_space.shape) > 1:
            env = gym.wrappers.FlattenObservation(env)  # dm_control's Dict of named arrays -> one vector
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    # SAME_STEP: an env that ends an episode resets at once and returns the true final observation in
    # infos["final_obs"]. copy=False skips a deepcopy: the step overwrites it, so the loop keeps a copy.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def discount_from_time_limit(max_episode_steps: int | None) -> float:
    """The authors' discount (TD-MPC2's heuristic): with an effective horizon of T / 5 steps, gamma = 1 - 5 / T,
    clipped to [0.95, 0.995]; 0.995 without a time limit."""
    if not max_episode_steps:
        return 0.995
    horizon = max_episode_steps / 5
    return max(min((horizon - 1) / horizon, 0.995), 0.95)


def to_env_action(unit_action, low, high):
    """An action in [-1, 1] (what the policy samples, the buffer stores and the critics see, as the authors' rescaled
    environments give it) -> the environment's bounds."""
    return low + (unit_action + 1.0) * (high - low) / 2.0


# --- hyperspherical normalisation --------------------------------------------------------------------------------


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x / ||x|| along `dim`: the projection onto the unit sphere (a zero vector stays zero)."""
    return x / x.norm(dim=dim, keepdim=True).clamp_min(EPS)


class HyperLinear(nn.Module):
    """x W for a stack of `ensemble` networks, no bias: W [ensemble, in, out] whose every column (the weights into
    one output unit) lies on the unit sphere, so that x W of a unit x is a vector of cosines. Initialised
    orthogonally, then normalised; project_onto_sphere puts W back on the sphere after every optimiser step."""

    def __init__(self, in_dim: int, out_dim: int, ensemble: int):
        super().__init__()
        weight = torch.empty(ensemble, out_dim, in_dim)
        for matrix in weight:
            nn.init.orthogonal_(matrix)
        self.weight = nn.Parameter(l2_normalize(weight.transpose(1, 2).contiguous(), dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.weight)  # [ensemble, batch, in] -> [ensemble, batch, out]


@torch.no_grad()
def project_onto_sphere(network: nn.Module) -> None:
    """After an optimiser step: every HyperLinear's columns back onto the unit sphere (the weight projection)."""
    for layer in network.modules():
        if isinstance(layer, HyperLinear):
            layer.weight.copy_(l2_normalize(layer.weight, dim=1))


class Scaler(nn.Module):
    """A learned per-unit scale s * x. The parameter is stored at `scale` and multiplied by init / scale in the
    forward pass (the authors' reparameterisation): it starts as `init` but Adam moves it as a parameter of size
    `scale`, which sets its effective learning rate."""

    def __init__(self, dim: int, init: float, scale: float, ensemble: int):
        super().__init__()
        self.scaler = nn.Parameter(torch.full((ensemble, 1, dim), float(scale)))
        self.forward_scale = init / scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaler * self.forward_scale * x


class LerpBlock(nn.Module):
    """A residual block on the sphere: h = normalise(W2 (ReLU(s * W1 x) + eps)), then x moves towards h by the learned
    per-unit step alpha (x + alpha (h - x), linear interpolation) and is projected back onto the sphere."""

    def __init__(self, hidden: int, scaler_init, scaler_scale, alpha_init, alpha_scale, ensemble: int):
        super().__init__()
        wide = hidden * EXPANSION
        self.up = HyperLinear(hidden, wide, ensemble)
        self.up_scaler = Scaler(wide, scaler_init / math.sqrt(EXPANSION), scaler_scale / math.sqrt(EXPANSION), ensemble)
        self.down = HyperLinear(wide, hidden, ensemble)
        self.alpha = Scaler(hidden, alpha_init, alpha_scale, ensemble)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = l2_normalize(self.down(F.relu(self.up_scaler(self.up(x))) + EPS))
        return l2_normalize(x + self.alpha(h - x))


class HyperEncoder(nn.Module):
    """The shared trunk of actor and critics: the input with c_shift appended, projected onto the sphere (its norm
    survives as the angle to the c_shift axis), embedded (W, scaler, normalise), then `num_blocks` LerpBlocks. The
    authors' scales: scalers start at sqrt(2 / hidden); alpha starts at 1 / (num_blocks + 1), scale 1 / sqrt(hidden)."""

    def __init__(self, in_dim: int, hidden: int, num_blocks: int, c_shift: float, ensemble: int):
        super().__init__()
        scaler = math.sqrt(2.0 / hidden)
        alpha_init, alpha_scale = 1.0 / (num_blocks + 1), 1.0 / math.sqrt(hidden)
        self.c_shift = c_shift
        self.embed = HyperLinear(in_dim + 1, hidden, ensemble)
        self.embed_scaler = Scaler(hidden, scaler, scaler, ensemble)
        self.blocks = nn.Sequential(
            *(LerpBlock(hidden, scaler, scaler, alpha_init, alpha_scale, ensemble) for _ in range(num_blocks))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[ensemble, batch, in_dim] -> unit features [ensemble, batch, hidden]."""
        x = l2_normalize(torch.cat([x, torch.full_like(x[..., :1], self.c_shift)], dim=-1))
        return self.blocks(l2_normalize(self.embed_scaler(self.embed(x))))


class HyperHead(nn.Module):
    """An output head on unit features: W2 (s * W1 z) + b, no non-linearity between (the authors' predictor)."""

    def __init__(self, hidden: int, out_dim: int, ensemble: int):
        super().__init__()
        self.w1 = HyperLinear(hidden, hidden, ensemble)
        self.scaler = Scaler(hidden, 1.0, 1.0, ensemble)
        self.w2 = HyperLinear(hidden, out_dim, ensemble)
        self.bias = nn.Parameter(torch.zeros(ensemble, 1, out_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.w2(self.scaler(self.w1(z))) + self.bias


class Critics(nn.Module):
    """`n` categorical critics, stacked: the log-probabilities [n, batch, num_bins] of Q(s, a) over the fixed
    atoms `bins` (num_bins from -g_max to g_max)."""

    def __init__(self, obs_dim: int, act_dim: int, n: int, hidden: int, num_blocks: int, c_shift, num_bins, g_max):
        super().__init__()
        self.encoder = HyperEncoder(obs_dim + act_dim, hidden, num_blocks, c_shift, n)
        self.head = HyperHead(hidden, num_bins, n)
        self.register_buffer("bins", torch.linspace(-g_max, g_max, num_bins))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], dim=-1).expand(len(self.head.bias), -1, -1)  # the same input for each critic
        return F.log_softmax(self.head(self.encoder(x)), dim=-1)

    def expected_q(self, log_probs: torch.Tensor) -> torch.Tensor:
        """The mean of each distribution [n, batch]: sum over atoms of p * atom."""
        return (log_probs.exp() * self.bins).sum(-1)


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy on [-1, 1]: the encoder, then a mean head and a log-std head; the log std is
    tanh of its head mapped onto [LOG_STD_MIN, LOG_STD_MAX]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, num_blocks: int, c_shift: float):
        super().__init__()
        self.encoder = HyperEncoder(obs_dim, hidden, num_blocks, c_shift, 1)
        self.mean_head = HyperHead(hidden, act_dim, 1)
        self.log_std_head = HyperHead(hidden, act_dim, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(obs[None])
        log_std = torch.tanh(self.log_std_head(z)[0])
        return self.mean_head(z)[0], LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action in [-1, 1] from the N(0, I) draws `noise` [batch, action] and its log-probability:
        log N(u; mean, std) - sum log(1 - tanh(u)^2), the last in the stable form 2 (log 2 - u - softplus(-2u))."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * noise
        normal_log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        log_abs_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        return torch.tanh(u), (normal_log_prob - log_abs_det).sum(-1)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self(obs)[0])


# --- normalisation of observations and rewards -------------------------------------------------------------------


class RunningMeanStd(nn.Module):
    """Running mean and (population) variance of a stream of batches, on the device in float64, merged batch by
    batch with the parallel-variance formula (Chan, Golub and LeVeque 1979); as the authors' (gymnasium's), the
    count starts at 1e-4 with mean 0 and variance 1. The count is an exact host number in the state dict."""

    def __init__(self, shape: tuple[int, ...] | int = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.count = 1e-4

    def update(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        batch_var, batch_mean = torch.var_mean(batch.double(), dim=0, correction=0)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean.add_(delta, alpha=n / total)
        self.var.mul_(self.count / total).add_(batch_var, alpha=n / total).addcmul_(
            delta, delta, value=self.count * n / total**2
        )
        self.count = total

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / sqrt(var + 1e-8), float32, unclipped (the authors' observation normaliser)."""
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).float()

    def get_extra_state(self) -> dict:
        return {"count": self.count}

    def set_extra_state(self, state: dict) -> None:
        self.count = state["count"]


class RewardScaler(nn.Module):
    """The authors' reward normalisation: rewards are divided by max(std(G), G_max / g_max), where G is each
    environment's running discounted return G_t = gamma (1 - done_t) G_{t-1} + r_t (done_t of the same step, as the
    authors and gymnasium's NormalizeReward write it), std(G) its running standard deviation over all environments
    and steps, G_max the largest |G| seen. The second bound keeps every normalised return inside the critic's
    support [-g_max, g_max]."""

    def __init__(self, num_envs: int, gamma: float, g_max: float):
        super().__init__()
        self.return_rms = RunningMeanStd(())
        self.register_buffer("discounted_return", torch.zeros(num_envs, dtype=torch.float64))
        self.register_buffer("max_abs_return", torch.zeros((), dtype=torch.float64))
        self.gamma, self.g_max = gamma, g_max

    def update(self, rewards: torch.Tensor, dones: torch.Tensor) -> None:
        """One environment step's rewards and episode ends [num_envs]."""
        self.discounted_return.mul_(self.gamma * (1.0 - dones)).add_(rewards)
        self.return_rms.update(self.discounted_return)
        torch.maximum(self.max_abs_return, self.discounted_return.abs().max(), out=self.max_abs_return)

    def denominator(self) -> torch.Tensor:
        return torch.maximum(torch.sqrt(self.return_rms.var + 1e-8), self.max_abs_return / self.g_max)


# --- the categorical critic's target -----------------------------------------------------------------------------


def categorical_projection(probs: torch.Tensor, atoms: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Project a distribution with mass `probs` [batch, K] at `atoms` [batch, K] onto the evenly spaced `bins` [K]:
    each atom, clipped into [bins[0], bins[-1]], splits its mass between its two neighbouring bins in proportion to
    its distance to the other one (all of it to one bin when it falls on that bin)."""
    v_min, v_max, k = bins[0], bins[-1], len(bins)
    position = ((atoms.clamp(v_min, v_max) - v_min) / ((v_max - v_min) / (k - 1))).clamp(0, k - 1)
    lower, upper = position.floor(), position.ceil()
    lower_mass = probs * (upper - position + (lower == upper).to(probs.dtype))
    upper_mass = probs * (position - lower)
    projected = torch.zeros_like(probs)
    projected.scatter_add_(1, lower.long(), lower_mass)
    return projected.scatter_add_(1, upper.long(), upper_mass)


def soft_atoms(bins, rewards, terminations, next_log_prob, temperature, gamma: float) -> torch.Tensor:
    """The target atoms [batch, K]: r + gamma * (1 - terminated) * (z - temperature * log pi(a'|s')) for each bin z
    (a truncated transition bootstraps: its s' is the true final observation)."""
    soft = bins[None, :] - (temperature * next_log_prob)[:, None]
    return rewards[:, None] + gamma * (1.0 - terminations)[:, None] * soft


def learning_rate(update: int, init: float, end: float, decay_updates: int) -> float:
    """The authors' schedule: linear from `init` at update 0 to `end` at `decay_updates`, constant after."""
    return init + (end - init) * min(update / decay_updates, 1.0)


Transitions = namedtuple("Transitions", "obs next_obs actions rewards terminations")  # one field of the buffer each


class ReplayBuffer:
    """The last `buffer_size` transitions, circular, on the training device, as the environments gave them (raw
    observations and rewards: the normalisers apply their current statistics at sampling, as the authors' do). The
    fields are named column blocks of one float32 tensor [buffer_size, row]: a step of all environments is assembled
    in a host staging array and written with one host-to-device copy, and a minibatch is one gather."""

    def __init__(self, buffer_size: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device):
        self.buffer_size, self.widths = buffer_size, self.field_widths(obs_dim, act_dim)
        self.data = torch.zeros((buffer_size, sum(self.widths)), device=device)
        self.staging = np.zeros((num_envs, sum(self.widths)), dtype=np.float32)
        self.step = self.fields(self.staging)  # named views of the staging rows
        self.pos, self.size = 0, 0

    @staticmethod
    def field_widths(obs_dim: int, act_dim: int) -> Transitions:
        return Transitions(obs=obs_dim, next_obs=obs_dim, actions=act_dim, rewards=1, terminations=1)

    def fields(self, rows):
        """Named views of the columns of `rows` (a tensor or an array of buffer rows)."""
        bounds = [0, *itertools.accumulate(self.widths)]
        obs, next_obs, actions, rewards, terminations = (rows[:, a:b] for a, b in zip(bounds, bounds[1:]))
        return Transitions(obs, next_obs, actions, rewards[:, 0], terminations[:, 0])

    def add(self, obs, next_obs, actions, rewards, terminations, infos: dict) -> None:
        """Store one step of every environment, as returned by a SAME_STEP vector env."""
        for field, value in zip(self.step, (obs, next_obs, actions, rewards, terminations)):
            field[:] = value
        if "final_obs" in infos:
            # Where an episode ended, next_obs already holds the first observation of the next
            # episode; the transition leads to the true final one (bootstrapped if truncated).
            ended = infos["_final_obs"]
            self.step.next_obs[ended] = np.stack(infos["final_obs"][ended])
        n, staged = len(obs), torch.from_numpy(self.staging)
        first = min(n, self.buffer_size - self.pos)  # the rows before the end; the others wrap around to the start
        self.data[self.pos : self.pos + first].copy_(staged[:first])
        self.data[: n - first].copy_(staged[first:])
        self.pos = (self.pos + n) % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size: int) -> Transitions:
        """A uniform minibatch, with replacement."""
        indices = torch.randint(self.size, (batch_size,), device=self.data.device)
        return self.fields(torch.index_select(self.data, 0, indices))

    def state_dict(self) -> dict:
        return {"data": self.data[: self.size].cpu(), "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.data[: self.size].copy_(state["data"])


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script; the episodic returns of its deterministic policy (tanh of the mean) on
    observations normalised by the saved statistics (frozen)."""
    model = load_model(model_path, __file__)
    register_env_family(model["env_id"], model["args"].get("env_options"))  # the environment options it trained on
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    saved = model["args"]
    actor = Actor(
        model["obs_dim"], model["act_dim"], saved["actor_hidden_dim"], saved["actor_num_blocks"], saved["c_shift"]
    )
    actor.load_state_dict(model["actor"])
    obs_rms = RunningMeanStd(model["obs_dim"])
    obs_rms.load_state_dict(model["obs_rms"])
    actor, obs_rms = actor.to(device), obs_rms.to(device)
    space = envs.single_action_space
    low, high = (torch.as_tensor(bound, dtype=torch.float32, device=device) for bound in (space.low, space.high))
    obs, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            normalized = obs_rms.normalize(torch.tensor(obs, dtype=torch.float32, device=device).reshape(1, -1))
            actions = to_env_action(actor.mean_action(normalized), low, high)
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
            if "episode" in infos:
                episodic_returns += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return episodic_returns[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    action_space = envs.single_action_space
    obs_dim, act_dim = int(np.prod(envs.single_observation_space.shape)), int(action_space.shape[0])
    gamma = args.gamma if args.gamma is not None else discount_from_time_limit(gym.spec(args.env_id).max_episode_steps)

    actor = Actor(obs_dim, act_dim, args.actor_hidden_dim, args.actor_num_blocks, args.c_shift).to(device)
    n_critics = 2 if args.use_cdq else 1
    qf = Critics(
        obs_dim,
        act_dim,
        n_critics,
        args.critic_hidden_dim,
        args.critic_num_blocks,
        args.c_shift,
        args.num_bins,
        args.g_max,
    ).to(device)
    qf_target = copy.deepcopy(qf)
    obs_rms = RunningMeanStd(obs_dim).to(device)
    reward_scaler = RewardScaler(args.num_envs, gamma, args.g_max).to(device)
    # The temperature = exp(log_temperature), tuned towards an entropy of -|A| / 2; a device tensor updated in place.
    target_entropy = args.target_entropy_coef * act_dim
    log_temperature = torch.tensor(math.log(args.temperature_init), device=device, requires_grad=True)
    temperature = log_temperature.detach().exp()
    # Adam as the authors' optax.adam (betas 0.9, 0.999, eps 1e-8, no weight decay); its rate set before every step.
    q_optimizer = torch.optim.Adam(qf.parameters(), lr=args.learning_rate_init)
    # One Adam for the policy and log_temperature (the same schedule): the two losses touch disjoint parameters, so
    # one backward and one step of their sum do exactly what the authors' two separate steps do.
    actor_optimizer = torch.optim.Adam([*actor.parameters(), log_temperature], lr=args.learning_rate_init)
    decay_updates = args.utd_ratio * args.total_timesteps  # the authors' decay length: all the run's updates
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, act_dim, device)
    # What a checkpoint holds besides log_temperature, the environments and the step (training_state below).
    stateful = dict(actor=actor, qf=qf, qf_target=qf_target, obs_rms=obs_rms, reward_scaler=reward_scaler)
    stateful.update(replay_buffer=rb, q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

    def normalized(raw: Transitions) -> Transitions:
        """A minibatch as the networks learn from it: observations by the current observation statistics, rewards
        divided by the current reward scale."""
        scaled_rewards = (raw.rewards / reward_scaler.denominator()).float()
        return raw._replace(
            obs=obs_rms.normalize(raw.obs), next_obs=obs_rms.normalize(raw.next_obs), rewards=scaled_rewards
        )

    def update_actor(obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One gradient step of the policy (the critics frozen by the caller) up min_i Q_i(s, a) - T log pi(a|s), and
        of the temperature T on the same log-probabilities: the authors' T * (entropy - target entropy), T's
        gradient T * (entropy - target). The actor's weights go back onto the sphere. The two losses, the entropy."""
        actions, log_prob = actor.sample(obs, noise)
        q = qf.expected_q(qf(obs, actions)).amin(0)
        actor_loss = (temperature * log_prob - q).mean()
        entropy = -log_prob.detach().mean()
        temperature_loss = log_temperature.exp() * (entropy - target_entropy)
        actor_optimizer.zero_grad()
        (actor_loss + temperature_loss).backward()
        actor_optimizer.step()
        project_onto_sphere(actor)
        temperature.copy_(log_temperature.detach().exp())
        return actor_loss.detach(), temperature_loss.detach(), entropy

    def update_critics(batch: Transitions, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of the critics: each one's cross-entropy against the target distribution (the target
        critic of smaller mean at (s', a' ~ pi) from the N(0, I) `noise`, its atoms shifted to the soft Bellman
        target and projected onto the bins), summed over critics. The weights go back onto the sphere. The loss and
        the critics' mean Q-value."""
        with torch.no_grad():  # the target distribution is held constant
            next_actions, next_log_prob = actor.sample(batch.next_obs, noise)
            next_log_probs = qf_target(batch.next_obs, next_actions)  # [n, batch, bins]
            smaller = qf_target.expected_q(next_log_probs).argmin(0)  # [batch]: the critic of the smaller mean
            next_probs = next_log_probs.exp().gather(0, smaller[None, :, None].expand(1, -1, args.num_bins))[0]
            atoms = soft_atoms(qf.bins, batch.rewards, batch.terminations, next_log_prob, temperature, gamma)
            target_probs = categorical_projection(next_probs, atoms, qf.bins)
        log_probs = qf(batch.obs, batch.actions)
        qf_loss = -(target_probs * log_probs).sum(-1).mean(-1).sum()
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        project_onto_sphere(qf)
        return qf_loss.detach(), qf.expected_q(log_probs.detach()).mean()

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    if run.checkpoint:
        for key, stored in stateful.items():
            stored.load_state_dict(run.checkpoint[key])
        with torch.no_grad():
            log_temperature.copy_(run.checkpoint["log_temperature"])
            temperature.copy_(log_temperature.exp())
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        global_step = run.checkpoint["global_step"]
    obs_np = obs_np.astype(np.float32).reshape(args.num_envs, obs_dim)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            **{key: stored.state_dict() for key, stored in stateful.items()},
            log_temperature=log_temperature.detach().cpu(),
            envs=snapshot_envs(envs, obs_np),
            global_step=global_step,
        )

    qf_loss = q_value = actor_loss = temperature_loss = entropy = lr = None  # the latest update's, read when logged
    run.begin(training_state)
    while global_step < args.total_timesteps:
        # 1. Act: the observation enters its running statistics (as the authors', also during the random warm-up),
        # then uniformly random actions (torch's RNG) until learning_starts, samples of the policy after. One
        # host-to-device copy of the observations, one copy back of the actions.
        obs = torch.from_numpy(obs_np).to(device)
        obs_rms.update(obs)
        if global_step < args.learning_starts:
            actions = torch.rand((args.num_envs, act_dim), device=device) * 2.0 - 1.0
        else:
            with torch.no_grad():
                actions, _ = actor.sample(obs_rms.normalize(obs), torch.randn((args.num_envs, act_dim), device=device))
        actions = actions.cpu().numpy()
        env_actions = to_env_action(actions, action_space.low, action_space.high)
        next_obs_np, rewards, terminations, truncations, infos = envs.step(env_actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        next_obs_np = next_obs_np.reshape(args.num_envs, obs_dim)
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        ends = np.stack([rewards, terminations | truncations]).astype(np.float64)
        reward_scaler.update(*torch.from_numpy(ends).to(device))  # the return statistics: this step's reward
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # 2. Learn, utd_ratio updates per environment step t > learning_starts (num_envs steps per vector step), each
        # on one minibatch as the authors order it: the policy and temperature, then the critics (their target from
        # the updated policy and temperature), then the targets' Polyak update.
        for t in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            for repeat in range(args.utd_ratio):
                update = (t - args.learning_starts - 1) * args.utd_ratio + repeat
                lr = learning_rate(update, args.learning_rate_init, args.learning_rate_end, decay_updates)
                for group in (*q_optimizer.param_groups, *actor_optimizer.param_groups):
                    group["lr"] = lr
                raw_batch = rb.sample(args.batch_size)
                batch = normalized(raw_batch)
                qf.requires_grad_(False)  # the policy's loss backpropagates through the critics, not into them
                actor_loss, temperature_loss, entropy = update_actor(batch.obs, torch.randn_like(batch.actions))
                qf.requires_grad_(True)
                qf_loss, q_value = update_critics(batch, torch.randn_like(batch.actions))
                with torch.no_grad():
                    torch._foreach_lerp_(list(qf_target.parameters()), list(qf.parameters()), args.tau)

        # 3. Log every LOG_EVERY steps (one device-to-host read), checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            scalars = {"charts/reward_scale": reward_scaler.denominator()}
            if qf_loss is not None:
                scalars |= {"losses/qf_loss": qf_loss, "losses/qf_values": q_value, "losses/actor_loss": actor_loss}
                scalars |= {"losses/alpha": temperature, "losses/alpha_loss": temperature_loss}
                scalars |= {"losses/entropy": entropy, "charts/learning_rate": lr}
            run.log(global_step, scalars)
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        actor=actor.state_dict(),
        obs_rms=obs_rms.state_dict(),
        qf=qf.state_dict(),
        obs_dim=obs_dim,
        act_dim=act_dim,
    )
