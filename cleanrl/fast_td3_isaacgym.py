"""FastTD3: TD3 for thousands of simulated worlds, with everything on the device.

Seo et al. 2025, "FastTD3: Simple, Fast, and Capable Reinforcement Learning for Humanoid Control"
(https://arxiv.org/abs/2505.22642; the authors' code, github.com/younggyoseo/FastTD3): TD3 fed by many parallel
environments, batches of 32,768, a C51-style distributional twin critic (clipped double Q: each sample learns the
projected distribution of the critic whose mean is lower), n-step returns, a device replay buffer of the last
`buffer_size` steps of each environment, exploration noise scales drawn per environment from [std_min, std_max] and
redrawn when its episode ends, running observation normalisation, AdamW, two critic updates and one policy update per
step, no target policy (target actions are the policy's own plus clipped noise), `--amp` (bf16) and `--compile`.

Action space: a one-dimensional Box (the policy's [-1, 1] mapped onto the bounds). `--simulator` (cleanrl_utils/envs/):
MuJoCo Warp (Ant, Humanoid, Hopper, HalfCheetah, Walker2d; default unless Isaac Gym is importable), Isaac Gym,
envpool's C++ MuJoCo or gymnasium (the same names onto v5 ids, Ant -> Ant-v5), or mjlab's robots (projects/mjlab; the
critics on the task's privileged "critic" observations, as the authors train Isaac Lab's). Checkpoints hold the
replay buffer and the simulator's state (Isaac Gym, envpool and mjlab: fresh episodes on resume, said so).

    uv run python cleanrl/fast_td3_isaacgym.py --env-id Humanoid
    uv run python cleanrl/fast_td3_isaacgym.py --simulator envpool --env-id Ant --num-envs 16 \\
        --batch-size 4096 --buffer-size 20000 --learning-starts 5000

The critics' support is the task's per-step reward range over 1 - gamma (mjlab: the authors' Isaac Lab preset), and
the log line reports n-step targets beyond it. Unlike the authors' code: while the buffer fills, a window may start at
any stored step, cut at the newest; only the observations acted on update the running statistics (the exact
parallel-variance merge); Isaac Gym's step after an episode's end is stored but kept out of the critics' loss.
"""

import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Literal, Optional, Union

import numpy as np

# Isaac Gym refuses to load once torch is imported: when it is installed, it goes first.
if importlib.util.find_spec("isaacgym") is not None:
    import isaacgym  # noqa: F401

import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model
from cleanrl_utils.envs.envpool_mujoco_env import ENVPOOL_TASKS, EnvPoolMuJoCoVecEnv
from cleanrl_utils.envs.gymnasium_vec_env import GymnasiumVecEnv
from cleanrl_utils.envs.isaacgym_env import ISAACGYM_INSTALL, IsaacGymVecEnv, isaacgym_available, isaacgym_tasks
from cleanrl_utils.envs.mjlab_env import MjlabVecEnv, task_problem
from cleanrl_utils.envs.mujoco_warp_env import WARP_TASKS, MuJoCoWarpVecEnv
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
    """if toggled, use a GPU when one is present (the CPU otherwise); the simulator runs there too"""
    torch_threads: int = 0
    """CPU threads for torch; 0 = one per core (torch's default): the updates are bound by matrix products"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: Optional[str] = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported by this script (the batched simulators do not render here); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: Optional[str] = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "Humanoid"
    """the task: MuJoCo Warp's (Ant, Humanoid, Hopper, HalfCheetah, Walker2d), Isaac Gym's, envpool's (those and
    HumanoidStandup, InvertedDoublePendulum, InvertedPendulum, Pusher, Reacher, Swimmer, onto v5 ids: Ant -> Ant-v5),
    or for gymnasium those names (onto v5 ids) or a gymnasium id"""
    total_timesteps: int = 100000000
    """total timesteps of the experiment (over all environments)"""

    # Algorithm specific arguments
    simulator: Literal["auto", "isaacgym", "mujoco-warp", "envpool", "gymnasium", "mjlab"] = "auto"
    """the simulator: auto takes Isaac Gym when it is importable, MuJoCo Warp otherwise; envpool (C++ MuJoCo, the
    fastest on a CPU) and gymnasium (SyncVectorEnv) run on the CPU; mjlab its robot tasks (run with
    `uv run --project projects/mjlab`)"""
    envpool_threads: int = 0
    """envpool: its worker threads (0: envpool's choice, one per core)"""
    nconmax: Optional[int] = None
    """MuJoCo Warp and mjlab: contact slots per world, pooled across worlds (None: the task's default)"""
    njmax: Optional[int] = None
    """MuJoCo Warp and mjlab: constraint rows per world (None: the task's default)"""
    num_envs: int = 1024
    """the number of parallel environments"""
    buffer_size: int = 10240
    """the replay buffer's steps per environment (it holds num_envs times as many transitions)"""
    batch_size: int = 32768
    """transitions per update, drawn evenly from the environments (batch_size // num_envs from each)"""
    learning_starts: int = 10240
    """environment steps (over all environments) of exploration before learning"""
    n_steps: int = 3
    """the n of the n-step returns (the authors' setting for their locomotion tasks)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.1
    """the target critic's Polyak averaging coefficient, after every critic update"""
    num_updates: int = 2
    """critic updates per environment step (of all environments)"""
    policy_frequency: int = 2
    """one policy update every this many critic updates"""
    critic_learning_rate: float = 3e-4
    """the learning rate of the critics' optimizer (AdamW)"""
    actor_learning_rate: float = 3e-4
    """the learning rate of the policy's optimizer (AdamW)"""
    weight_decay: float = 0.1
    """AdamW's weight decay, for both"""
    num_atoms: int = 101
    """the atoms of each critic's return distribution"""
    v_min: Optional[float] = None
    """the lowest return the critics' support can represent (None: the task's, from REWARD_RANGES)"""
    v_max: Optional[float] = None
    """the highest return the critics' support can represent (None: the task's, from REWARD_RANGES)"""
    critic_hidden: int = 1024
    """the width of the critics' first layer (then halved twice)"""
    actor_hidden: int = 512
    """the width of the policy's first layer (then halved twice)"""
    init_scale: float = 0.01
    """the standard deviation of the policy's output layer at initialisation"""
    std_min: float = 0.001
    """the smallest exploration noise scale an environment draws"""
    std_max: float = 0.4
    """the largest exploration noise scale an environment draws"""
    policy_noise: float = 0.001
    """the standard deviation of the target policy smoothing noise"""
    noise_clip: float = 0.5
    """the clip of the target policy smoothing noise"""
    use_cdq: bool = True
    """clipped double Q: both critics learn the target of the one with the lower mean; the policy climbs the min"""
    max_grad_norm: float = 0.0
    """the maximum norm for the gradient clipping (0: none, the authors' default)"""
    amp: bool = False
    """if toggled, run the networks in bf16 autocast (the authors' GPU setting; parameters and storage stay float32)"""
    compile: bool = False
    """if toggled, compile the updates and the policy step with torch.compile (meant for GPUs)"""
    log_every: Optional[int] = None
    """read losses and episode statistics back to the host every this many steps of all environments (a host sync;
    None: every 100 steps of each environment, num_envs x 100: 102,400 with 1024 environments, 1,600 with 16)"""
    time_limit_seconds: float = 0.0
    """stop training after this many seconds of wall-clock time (0: no limit); for comparisons at equal wall time"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for (deterministic policy)"""


# --- the simulators ---------------------------------------------------------------------------------

# Per-step rewards a run reaches on each task, low and high: the critics' support is this range over 1 - gamma (the
# bound of a discounted return), so that it covers the task's returns as the authors' per-suite presets do theirs.
# MuJoCo (MuJoCo Warp's tasks and gymnasium's v5 ids): the alive bonus plus the forward velocity, e.g. Humanoid 5 +
# 1.25 v, and returns of good policies over 1,000 steps (HalfCheetah ~12k, Humanoid ~8k). Isaac Gym's Ant and Humanoid
# (isaacgymenvs): progress toward the target plus alive and heading terms, returns up to ~10k over 1,000 steps.
REWARD_RANGES = {
    "mujoco": {"Ant": (-2.0, 8.0), "Humanoid": (-1.0, 12.0), "Hopper": (-1.0, 5.0), "HalfCheetah": (-2.0, 15.0)}
    | {"Walker2d": (-1.0, 8.0)},
    "isaacgym": {"Ant": (-2.0, 10.0), "Humanoid": (-2.0, 10.0)},
}
DEFAULT_SUPPORT = (-250.0, 250.0)  # the authors' default (their HumanoidBench setting), for tasks not listed above
# mjlab's tasks (Isaac Lab's, on MuJoCo Warp) scale each reward term by the step's duration: the authors' Isaac Lab
# preset (IsaacLabArgs), whatever gamma.
MJLAB_SUPPORT = (-10.0, 10.0)


def task_support(simulator: str, env_id: str, gamma: float) -> tuple:
    """The critics' support (v_min, v_max) for a task: its REWARD_RANGES entry over 1 - gamma (gymnasium's MuJoCo ids
    by their name, Hopper-v5 as Hopper), MJLAB_SUPPORT for mjlab's tasks, else DEFAULT_SUPPORT."""
    if simulator == "mjlab":
        return MJLAB_SUPPORT
    family, name = ("isaacgym", env_id) if simulator == "isaacgym" else ("mujoco", env_id.split("-v")[0])
    if name not in REWARD_RANGES[family]:
        return DEFAULT_SUPPORT
    low, high = REWARD_RANGES[family][name]
    return low / (1 - gamma), high / (1 - gamma)


def resolve_simulator(simulator: str) -> str:
    if simulator == "auto":
        return "isaacgym" if isaacgym_available() else "mujoco-warp"
    return simulator


def gymnasium_id(env_id: str) -> str:
    """gymnasium's id for a task name (Ant -> Ant-v5); a gymnasium id as it is."""
    return ENVPOOL_TASKS.get(env_id, env_id)


def make_envs(
    simulator: str,
    env_id: str,
    num_envs: int,
    device: torch.device,
    seed: int,
    args: dict,
    random_episode_starts: bool = False,
):
    """random_episode_starts (mjlab; training, not evaluation): the first episodes start at random points of the time
    limit, as the authors start Isaac Lab's (and rsl_rl mjlab's), so that the time-outs of thousands of envs spread
    out."""
    if simulator == "isaacgym":
        return IsaacGymVecEnv(env_id, num_envs, device, seed)
    if simulator == "envpool":
        return EnvPoolMuJoCoVecEnv(env_id, num_envs, device, seed, num_threads=args.get("envpool_threads", 0))
    if simulator == "gymnasium":
        return GymnasiumVecEnv(gymnasium_id(env_id), num_envs, device, seed)
    if simulator == "mjlab":
        nconmax, njmax = args.get("nconmax"), args.get("njmax")
        return MjlabVecEnv(env_id, num_envs, device, seed, None, random_episode_starts, nconmax, njmax)
    return MuJoCoWarpVecEnv(env_id, num_envs, device, seed, nconmax=args.get("nconmax"), njmax=args.get("njmax"))


def replay_nbytes(args: Args, obs_dim: int, act_dim: int, critic_obs_dim: Optional[int] = None) -> int:
    """Bytes of the replay buffer: observations and true next observations (and the critics' own, where the task has
    them), actions, rewards (float32) and three bool flags (counted as 4 bytes each: a bound from above)."""
    return args.num_envs * args.buffer_size * (2 * obs_dim + 2 * (critic_obs_dim or 0) + act_dim + 4) * 4


def action_bounds(envs) -> tuple:
    """The bounds the policy's [-1, 1] maps onto: the task's; where it has none (mjlab's joint-offset actions), [-1, 1]
    itself, as the authors' Isaac Lab runs (action_bounds 1.0)."""
    low, high = envs.action_low, envs.action_high
    return torch.where(low.isinf(), -1.0, low), torch.where(high.isinf(), 1.0, high)


def validate(args: Args) -> str:
    """Check the arguments and the simulator before any work; fail in one line. Returns the simulator that will run."""
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "n_steps", "num_updates", "num_atoms")
    check_positive(**{name: getattr(args, name) for name in positive})
    if args.log_every is None:  # every 100 steps of each environment
        args.log_every = 100 * args.num_envs
    check_positive(policy_frequency=args.policy_frequency, log_every=args.log_every, eval_episodes=args.eval_episodes)
    check_positive(critic_hidden=args.critic_hidden, actor_hidden=args.actor_hidden)
    non_negative = ("checkpoint_every", "learning_starts", "torch_threads", "max_grad_norm", "weight_decay")
    non_negative += ("envpool_threads",)
    for name in non_negative + ("time_limit_seconds",):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be 0 or positive, got {getattr(args, name)}")
    if args.capture_video:
        fail("--capture-video is not supported by fast_td3_isaacgym.py; record videos with td3_continuous_action.py")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    simulator = resolve_simulator(args.simulator)
    if args.v_min is None or args.v_max is None:  # the task's support, where not given
        if args.gamma == 1:
            fail("--gamma 1 puts no bound on the returns: give the critics' support with --v-min and --v-max")
        v_min, v_max = task_support(simulator, args.env_id, args.gamma)
        args.v_min = v_min if args.v_min is None else args.v_min
        args.v_max = v_max if args.v_max is None else args.v_max
    if not args.v_min < args.v_max or args.num_atoms < 2:
        support = f"--v-min {args.v_min}, --v-max {args.v_max}, --num-atoms {args.num_atoms}"
        fail(f"the support needs --v-min < --v-max and at least 2 atoms, got {support}")
    if not 0 <= args.std_min <= args.std_max:
        fail(f"exploration noise scales need 0 <= --std-min <= --std-max, got {args.std_min} and {args.std_max}")
    if args.batch_size < args.num_envs:
        fail(f"--batch-size {args.batch_size} is below --num-envs {args.num_envs}: each update draws from every env")
    if args.n_steps > args.buffer_size:
        fail(f"--n-steps {args.n_steps} is longer than the --buffer-size {args.buffer_size} steps kept per env")
    if simulator == "isaacgym" and not isaacgym_available():
        fail(ISAACGYM_INSTALL)
    if simulator == "mujoco-warp" and importlib.util.find_spec("mujoco_warp") is None:
        fail("--simulator mujoco-warp needs the mujoco-warp package (Python >= 3.11): uv sync")
    if simulator == "envpool" and importlib.util.find_spec("envpool") is None:
        fail("--simulator envpool needs the envpool package (Python >= 3.11): uv sync --extra envpool")
    if simulator == "mjlab":  # mjlab missing, an unknown task, a Tracking task without its motion file ...
        problem = task_problem(args.env_id, "fast_td3_isaacgym.py")
        if problem:
            fail(problem)
        return simulator  # the buffer's size is checked once the task is built and its sizes are known
    if simulator == "gymnasium":
        import gymnasium as gym

        check_env_id(gymnasium_id(args.env_id))
        probe = gym.make(gymnasium_id(args.env_id))
        action_space, observation_space = probe.action_space, probe.observation_space
        probe.close()
        box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
        if not box or not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            fail(f"fast_td3_isaacgym.py needs 1-D Box actions in finite bounds; {args.env_id} has {action_space}")
        if not isinstance(observation_space, gym.spaces.Box):
            fail(f"fast_td3_isaacgym.py needs Box observations; {args.env_id} has {observation_space}")
        obs_dim, act_dim = int(np.prod(observation_space.shape)), int(action_space.shape[0])
    else:
        tasks = {"mujoco-warp": list(WARP_TASKS), "envpool": list(ENVPOOL_TASKS)}.get(simulator) or isaacgym_tasks()
        if args.env_id not in tasks:
            known = ", ".join(tasks)
            name = args.env_id.split("-v")[0]
            hint = f"--env-id {name}; " if name in tasks else ""
            fail(f"unknown task {args.env_id!r} for {simulator}; known tasks: {known} ({hint}or --simulator gymnasium)")
        obs_dim, act_dim = 400, 30  # the largest of the tasks (Humanoid's 348 observations, 17 actions), for the check
    device = "cuda" if args.cuda and torch.cuda.is_available() else "cpu"
    check_fits(replay_nbytes(args, obs_dim, act_dim), device, "replay buffer", "--buffer-size")
    return simulator


# --- the agent ---------------------------------------------------------------------------------------


class ObservationNormalizer(nn.Module):
    """Running mean and variance of the observations acted on (float64, merged batch by batch with the parallel-variance
    formula); normalise as (x - mean) / (std + 0.01), as the authors' EmpiricalNormalization does."""

    def __init__(self, obs_dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def update(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        batch_var, batch_mean = torch.var_mean(batch.double(), dim=0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        # The first batch replaces the initial statistics (count 0): its weight is n / n = 1.
        self.var.mul_(self.count / total).add_(batch_var * n / total + delta.square() * self.count * n / total.square())
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / (self.var.sqrt() + 0.01)).float()


def relu_layers(in_dim: int, hidden: int) -> List[nn.Module]:
    """The authors' trunk for both networks: ReLU layers of hidden, hidden / 2 and hidden / 4 units."""
    widths = [in_dim, hidden, hidden // 2, hidden // 4]
    return [module for a, b in zip(widths, widths[1:]) for module in (nn.Linear(a, b), nn.ReLU())]


def distributional_q_network(in_dim: int, hidden: int, num_atoms: int) -> nn.Sequential:
    """Logits of Q(s, a)'s distribution over the atoms: the ReLU trunk, then one unit per atom."""
    return nn.Sequential(*relu_layers(in_dim, hidden), nn.Linear(hidden // 4, num_atoms))


class Critic(nn.Module):
    """Two distributional critics over the same support; forward gives both critics' logits [2, batch, atoms]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, num_atoms: int, v_min: float, v_max: float):
        super().__init__()
        self.qnets = nn.ModuleList([distributional_q_network(obs_dim + act_dim, hidden, num_atoms) for _ in range(2)])
        self.register_buffer("support", torch.linspace(v_min, v_max, num_atoms))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], dim=-1)
        return torch.stack([qnet(x) for qnet in self.qnets])

    def q_values(self, logits: torch.Tensor) -> torch.Tensor:
        """The distributions' means, from logits [..., atoms]."""
        return (torch.softmax(logits.float(), dim=-1) * self.support).sum(-1)


class Actor(nn.Module):
    """A deterministic policy in [-1, 1]: ReLU layers of hidden, hidden / 2 and hidden / 4 units, then tanh; the output
    layer drawn from N(0, init_scale^2) with zero bias, so the first actions are near 0."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, init_scale: float):
        super().__init__()
        self.net = nn.Sequential(*relu_layers(obs_dim, hidden))
        self.fc_mu = nn.Linear(hidden // 4, act_dim)
        nn.init.normal_(self.fc_mu.weight, 0.0, init_scale)
        nn.init.zeros_(self.fc_mu.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc_mu(self.net(obs)))


class ReplayBuffer:
    """The last `buffer_size` steps of every environment, as device tensors [num_envs, buffer_size, ...]: the
    observation acted on, the action in [-1, 1], the reward, whether the step terminated or truncated its episode, the
    true next observation (the final one where the episode ended), and whether the step was a simulator's reset step
    (Isaac Gym resets an ended episode during the next step, which acts on the final observation and lands on the new
    episode: no transition of either); with critic_obs_dim, the critics' own observations at both ends too (mjlab's
    "critic" group). Written one column (all environments) per step; sampled evenly per environment."""

    FIELDS = ("obs", "actions", "rewards", "terminations", "truncations", "next_obs", "reset_steps")
    CRITIC_FIELDS = ("critic_obs", "next_critic_obs")

    def __init__(
        self,
        num_envs: int,
        buffer_size: int,
        obs_dim: int,
        act_dim: int,
        device: torch.device,
        critic_obs_dim: Optional[int] = None,
    ):
        rows = (num_envs, buffer_size)
        self.obs = torch.zeros(rows + (obs_dim,), device=device)
        self.actions = torch.zeros(rows + (act_dim,), device=device)
        self.rewards = torch.zeros(rows, device=device)
        self.terminations = torch.zeros(rows, dtype=torch.bool, device=device)
        self.truncations = torch.zeros(rows, dtype=torch.bool, device=device)
        self.next_obs = torch.zeros(rows + (obs_dim,), device=device)
        self.reset_steps = torch.zeros(rows, dtype=torch.bool, device=device)
        self.fields = self.FIELDS
        if critic_obs_dim is not None:
            self.critic_obs = torch.zeros(rows + (critic_obs_dim,), device=device)
            self.next_critic_obs = torch.zeros(rows + (critic_obs_dim,), device=device)
            self.fields = self.FIELDS + self.CRITIC_FIELDS
        self.num_envs, self.buffer_size, self.pos, self.size = num_envs, buffer_size, 0, 0

    def add(self, obs, actions, rewards, terminations, truncations, next_obs, reset_steps, *critic_obs) -> None:
        """critic_obs: the critics' own observation and true next observation, for a buffer that keeps them."""
        values = (obs, actions, rewards, terminations, truncations, next_obs, reset_steps, *critic_obs)
        for name, value in zip(self.fields, values):
            getattr(self, name)[:, self.pos] = value
        self.pos = (self.pos + 1) % self.buffer_size
        self.size = min(self.size + 1, self.buffer_size)

    def sample(self, per_env: int, n_steps: int, gamma: float):
        """`per_env` n-step transitions drawn uniformly from each environment's stored steps (n_step_window)."""
        starts = torch.randint(self.size, (self.num_envs, per_env), device=self.rewards.device)
        return self.n_step_window(starts, n_steps, gamma)

    def n_step_window(self, starts: torch.Tensor, n_steps: int, gamma: float):
        """The n-step transitions starting at the columns `starts` [num_envs, k] of each environment, flattened to
        [num_envs * k]: (obs, actions, n-step discounted rewards, the bootstrap's discount, next_obs, a weight: 0 for a
        window that starts at a reset step, which learns nothing, 1 otherwise, and the critics' obs and next_obs: their
        own where the buffer keeps them, else obs and next_obs). A window of up to `n_steps`
        steps stops at the first step that ends its episode (a termination or a truncation) and at the
        newest step stored; it bootstraps from the true next observation of its last step with discount
        gamma^length, unless that step terminated (discount 0)."""
        device = self.rewards.device
        envs = torch.arange(self.num_envs, device=device).view(-1, 1)
        newest = (self.pos - 1) % self.buffer_size
        steps_to_newest = (newest - starts) % self.buffer_size  # 0 at the newest step
        offsets = torch.arange(n_steps, device=device)
        rows = (starts.unsqueeze(-1) + offsets) % self.buffer_size  # [envs, k, n]
        window_envs = envs.unsqueeze(-1)
        ends = self.terminations[window_envs, rows] | self.truncations[window_envs, rows]
        ends = ends | (offsets == steps_to_newest.unsqueeze(-1))
        ends[..., -1] = True  # a window is n steps long at most
        last = ends.float().argmax(-1)  # the first step that ends the window
        inside = offsets <= last.unsqueeze(-1)
        n_step_rewards = (self.rewards[window_envs, rows] * gamma**offsets * inside).sum(-1)
        last_rows = rows.gather(-1, last.unsqueeze(-1)).squeeze(-1)
        terminated = self.terminations[envs, last_rows]
        discounts = torch.where(terminated, 0.0, gamma ** (last + 1).float())
        out = (
            self.obs[envs, starts],
            self.actions[envs, starts],
            n_step_rewards,
            discounts,
            self.next_obs[envs, last_rows],
            (~self.reset_steps[envs, starts]).float(),
        )
        if self.fields == self.FIELDS:  # the critics see what the policy sees
            out = out + (out[0], out[4])
        else:
            out = out + (self.critic_obs[envs, starts], self.next_critic_obs[envs, last_rows])
        return tuple(x.flatten(0, 1) for x in out)

    def state_dict(self) -> dict:
        """The columns written so far (all of them once the buffer is full) and the write position, on the CPU."""
        state = {name: getattr(self, name)[:, : self.size].cpu() for name in self.fields}
        return {**state, "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        for name in self.fields:
            getattr(self, name)[:, : self.size] = state[name]


def project_distribution(
    next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """Project the distribution of rewards + discounts * z onto `support` [atoms] (evenly spaced): `next_probs`
    [batch, atoms], `rewards` and `discounts` [batch] (discount gamma^n, 0 where the window terminated). Each shifted
    atom is clamped into the support and its mass split between the two nearest atoms in proportion to closeness."""
    n_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = (rewards.unsqueeze(1) + discounts.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = ((tz - v_min) / delta_z).clamp(0, n_atoms - 1)
    lower, upper = b.floor(), b.ceil()
    # Where b is an atom exactly, lower == upper and both weights below would be 0: the lower atom takes the mass.
    lower_weight = (upper - b) + (lower == upper).to(b.dtype)
    projected = torch.zeros_like(next_probs)
    projected.scatter_add_(1, lower.long(), next_probs * lower_weight)
    projected.scatter_add_(1, upper.long(), next_probs * (b - lower))
    return projected


def to_env_actions(actions: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Actions in [-1, 1] onto the task's bounds [low, high]."""
    return low + (actions + 1.0) * 0.5 * (high - low)


def first_episode_returns(model: dict, envs, eval_episodes: int, device: torch.device) -> List[float]:
    """The return of the first episode of each of the first `eval_episodes` environments under the deterministic
    policy, on observations normalised with the saved statistics (frozen). The environments are reset first."""
    trained = model["args"]
    actor = Actor(model["obs_dim"], model["act_dim"], trained["actor_hidden"], trained["init_scale"]).to(device)
    actor.load_state_dict(model["actor"])
    normalizer = ObservationNormalizer(model["obs_dim"]).to(device)
    normalizer.load_state_dict(model["obs_normalizer"])
    count = min(eval_episodes, envs.num_envs)
    returns = torch.full((count,), math.nan, device=device)
    obs, (low, high) = envs.reset(), action_bounds(envs)
    with torch.no_grad():
        for step in range(1, 100_000):
            obs, _, _, _, info = envs.step(to_env_actions(actor(normalizer(obs)), low, high))
            first = info["done"][:count] & returns.isnan()
            returns = torch.where(first, info["episode_return"][:count], returns)
            if step % 100 == 0 and not returns.isnan().any():  # one host read every 100 steps
                break
    return returns[~returns.isnan()].tolist()


def evaluate(
    model_path: Union[str, Path],
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Optional[Path] = None,
) -> List[float]:
    """Reload a model saved by this script and return the returns of the first episode of `eval_episodes`
    environments, simulated together (see first_episode_returns)."""
    if capture_video:
        fail("fast_td3_isaacgym.py cannot record videos; evaluate without --capture-video")
    model = load_model(model_path, __file__)
    envs = make_envs(model["simulator"], model["env_id"], eval_episodes, device, seed, model["args"])
    returns = first_episode_returns(model, envs, eval_episodes, device)
    envs.check_buffers()  # the returns are wrong if contacts were dropped
    envs.close()
    return returns


if __name__ == "__main__":
    args = tyro.cli(Args)
    simulator = validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_envs(simulator, args.env_id, args.num_envs, device, args.seed, vars(args), random_episode_starts=True)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    # mjlab's tasks give the critics observations of their own (privileged state): an asymmetric actor-critic, as the
    # authors train on Isaac Lab's tasks. Elsewhere the critics see what the policy sees.
    critic_obs_dim = getattr(envs, "critic_obs_dim", None)
    if simulator == "mjlab":  # the sizes are known now, before the buffer is allocated
        check_fits(replay_nbytes(args, obs_dim, act_dim, critic_obs_dim), device, "replay buffer", "--buffer-size")
    action_low, action_high = action_bounds(envs)
    print(f"simulator: {simulator}, task {args.env_id}, {args.num_envs} environments, device {device}", flush=True)

    critic_in = obs_dim if critic_obs_dim is None else critic_obs_dim
    actor = Actor(obs_dim, act_dim, args.actor_hidden, args.init_scale).to(device)
    qnet = Critic(critic_in, act_dim, args.critic_hidden, args.num_atoms, args.v_min, args.v_max).to(device)
    qnet_target = Critic(critic_in, act_dim, args.critic_hidden, args.num_atoms, args.v_min, args.v_max).to(device)
    qnet_target.load_state_dict(qnet.state_dict())
    q_optimizer = torch.optim.AdamW(qnet.parameters(), lr=args.critic_learning_rate, weight_decay=args.weight_decay)
    actor_optimizer = torch.optim.AdamW(actor.parameters(), lr=args.actor_learning_rate, weight_decay=args.weight_decay)
    obs_normalizer = ObservationNormalizer(obs_dim).to(device)
    critic_obs_normalizer = None if critic_obs_dim is None else ObservationNormalizer(critic_obs_dim).to(device)
    rb = ReplayBuffer(args.num_envs, args.buffer_size, obs_dim, act_dim, device, critic_obs_dim)
    per_env = args.batch_size // args.num_envs
    # bf16 autocast needs no loss scaling (its exponent range is float32's).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    def clip_gradients(parameters) -> None:
        if args.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(parameters, args.max_grad_norm)

    def update_critic(
        critic_obs, actions, rewards, discounts, next_obs, next_critic_obs, weights, smoothing_noise
    ) -> tuple:
        """One AdamW step of both critics towards the projected n-step target, averaged over the windows of weight 1;
        their cross-entropies [2], and the fractions of targets above and below the support [2]. The critics see their
        own observations (critic_obs, next_critic_obs), the policy its own (next_obs)."""
        with torch.no_grad(), autocast:
            # No target policy: the policy's own next actions, smoothed by clipped noise (TD3's regulariser).
            next_actions = (actor(next_obs) + smoothing_noise.clamp(-args.noise_clip, args.noise_clip)).clamp(-1, 1)
            next_probs = torch.softmax(qnet_target(next_critic_obs, next_actions).float(), dim=-1)  # [2, batch, atoms]
            targets = torch.stack(
                [project_distribution(p, rewards, discounts, qnet_target.support) for p in next_probs]
            )
            next_q = (next_probs * qnet_target.support).sum(-1)  # [2, batch]
            if args.use_cdq:  # both critics learn the projected distribution of the one whose mean is lower
                targets = torch.where((next_q[0] < next_q[1]).view(1, -1, 1), targets[0], targets[1])
                next_q = next_q.amin(0)
            # The targets' means before projection: beyond the support the projection clamps them (reported).
            target_q = rewards + discounts * next_q
            beyond = torch.stack([(target_q > args.v_max).float().mean(), (target_q < args.v_min).float().mean()])
        with autocast:
            log_probs = torch.log_softmax(qnet(critic_obs, actions).float(), dim=-1)
        qf_losses = (-(targets * log_probs).sum(-1) * weights).sum(-1) / weights.sum().clamp(min=1.0)
        q_optimizer.zero_grad()
        qf_losses.sum().backward()
        clip_gradients(qnet.parameters())
        q_optimizer.step()
        return qf_losses.detach(), beyond

    def update_actor(obs, critic_obs) -> torch.Tensor:
        """One AdamW step of the policy up the critics' mean Q (the lower of the two with clipped double Q)."""
        with autocast:
            q = qnet.q_values(qnet(critic_obs, actor(obs)))
        q = q.amin(0) if args.use_cdq else q.mean(0)
        actor_loss = -q.mean()
        actor_optimizer.zero_grad()
        actor_loss.backward()
        clip_gradients(actor.parameters())
        actor_optimizer.step()
        return actor_loss.detach()

    def policy_step(obs: torch.Tensor, noise_scales: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), autocast:
            return (actor(obs).float() + noise * noise_scales).clamp(-1, 1)

    if args.compile:
        update_critic, update_actor, policy_step = (
            torch.compile(f) for f in (update_critic, update_actor, policy_step)
        )

    def draw_noise_scales() -> torch.Tensor:
        return torch.rand(args.num_envs, 1, device=device) * (args.std_max - args.std_min) + args.std_min

    global_step, critic_updates = 0, 0
    raw_obs = envs.reset()
    noise_scales = draw_noise_scales()
    if run.checkpoint:
        for name, module in dict(
            actor=actor, qnet=qnet, qnet_target=qnet_target, obs_normalizer=obs_normalizer
        ).items():
            module.load_state_dict(run.checkpoint[name])
        if critic_obs_normalizer is not None:
            critic_obs_normalizer.load_state_dict(run.checkpoint["critic_obs_normalizer"])
        q_optimizer.load_state_dict(run.checkpoint["q_optimizer"])
        actor_optimizer.load_state_dict(run.checkpoint["actor_optimizer"])
        rb.load_state_dict(run.checkpoint["replay_buffer"])
        noise_scales = run.checkpoint["noise_scales"].to(device)
        if run.checkpoint["envs"] is None:
            print(
                "the simulator's state is not in the checkpoint: resuming with freshly reset environments", flush=True
            )
        else:
            envs.load_state_dict(run.checkpoint["envs"])
            raw_obs = run.checkpoint["raw_obs"].to(device)
        global_step, critic_updates = run.checkpoint["global_step"], run.checkpoint["critic_updates"]
    # The critics' own observations come from the reset or step just made (mjlab's state is never saved).
    raw_critic_obs = None if critic_obs_dim is None else envs.critic_obs

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        saved_envs = envs.state_dict()  # None for Isaac Gym
        return dict(
            actor=actor.state_dict(),
            qnet=qnet.state_dict(),
            qnet_target=qnet_target.state_dict(),
            obs_normalizer=obs_normalizer.state_dict(),
            critic_obs_normalizer=None if critic_obs_normalizer is None else critic_obs_normalizer.state_dict(),
            q_optimizer=q_optimizer.state_dict(),
            actor_optimizer=actor_optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            noise_scales=noise_scales.cpu(),
            envs=saved_envs,
            raw_obs=None if saved_envs is None else raw_obs.cpu(),
            global_step=global_step,
            critic_updates=critic_updates,
        )

    # Episodes finished since the last log line (count, sum of returns, sum of lengths), and the critic updates' targets
    # beyond the support (sums of the fractions above and below, count of updates), summed on the device.
    episode_stats = torch.zeros(3, dtype=torch.float64, device=device)
    support_stats = torch.zeros(3, device=device)
    no_reset_steps = torch.zeros(args.num_envs, dtype=torch.bool, device=device)  # what the other simulators report
    mjlab_logs: List[Dict[str, torch.Tensor]] = []  # mjlab's episode statistics since the last log line
    qf_losses = actor_loss = None  # the latest updates', read back when logged
    run.begin(training_state)
    while global_step < args.total_timesteps:
        # 1. Act: the observations enter the running statistics, the policy acts on them normalised, with each
        # environment's own noise scale; everything stays on the device.
        obs_normalizer.update(raw_obs)
        if critic_obs_normalizer is not None:
            critic_obs_normalizer.update(raw_critic_obs)
        noise = torch.randn(args.num_envs, act_dim, device=device)
        actions = policy_step(obs_normalizer(raw_obs), noise_scales, noise)
        next_raw_obs, rewards, terminations, truncations, info = envs.step(
            to_env_actions(actions, action_low, action_high)
        )
        rb.add(
            raw_obs,
            actions,
            rewards,
            terminations,
            truncations,
            info["final_obs"],
            info.get("reset_step", no_reset_steps),
            raw_critic_obs,
            info.get("final_critic_obs"),
        )
        if info.get("log"):
            mjlab_logs.append(info["log"])
        done = info["done"]
        noise_scales = torch.where(done.view(-1, 1), draw_noise_scales(), noise_scales)  # a new episode, a new scale
        raw_obs = next_raw_obs
        raw_critic_obs = None if critic_obs_dim is None else envs.critic_obs
        previous_step, global_step = global_step, global_step + args.num_envs
        ended = done.double()
        episode_stats += torch.stack(
            [ended.sum(), (info["episode_return"] * ended).sum(), (info["episode_length"] * ended).sum()]
        )

        # 2. Learn: num_updates critic updates per step, a policy update after every policy_frequency-th; the target
        # critics follow each critic update by Polyak averaging. Replayed observations normalised with the
        # statistics of the moment (not updated by them).
        if global_step > args.learning_starts:
            for _ in range(args.num_updates):
                obs_b, actions_b, rewards_b, discounts_b, next_obs_b, weights_b, critic_obs_b, next_critic_obs_b = (
                    rb.sample(per_env, args.n_steps, args.gamma)
                )
                obs_b, next_obs_b = obs_normalizer(obs_b), obs_normalizer(next_obs_b)
                if critic_obs_normalizer is None:
                    critic_obs_b, next_critic_obs_b = obs_b, next_obs_b
                else:
                    critic_obs_b = critic_obs_normalizer(critic_obs_b)
                    next_critic_obs_b = critic_obs_normalizer(next_critic_obs_b)
                smoothing_noise = torch.randn_like(actions_b) * args.policy_noise
                qf_losses, beyond = update_critic(
                    critic_obs_b,
                    actions_b,
                    rewards_b,
                    discounts_b,
                    next_obs_b,
                    next_critic_obs_b,
                    weights_b,
                    smoothing_noise,
                )
                support_stats += torch.cat([beyond, beyond.new_ones(1)])
                critic_updates += 1
                if critic_updates % args.policy_frequency == 0:
                    actor_loss = update_actor(obs_b, critic_obs_b)
                with torch.no_grad():
                    torch._foreach_lerp_(list(qnet_target.parameters()), list(qnet.parameters()), args.tau)

        # 3. Log every --log-every steps (one device-to-host read; MuJoCo Warp's buffer check), checkpoint when due.
        out_of_time = args.time_limit_seconds > 0 and time.time() - run.start_time >= args.time_limit_seconds
        ended = global_step >= args.total_timesteps or out_of_time
        if global_step // args.log_every > previous_step // args.log_every or ended:
            finished, return_sum, length_sum = episode_stats.tolist()
            episode_stats.zero_()
            if finished > 0:  # the mean over the episodes that ended since the last log line
                run.log_episodes(global_step, returns=[return_sum / finished], lengths=[length_sum / finished])
            scalars = envs.check_buffers()
            if qf_losses is not None:
                scalars.update({"losses/qf1_loss": qf_losses[0], "losses/qf2_loss": qf_losses[1]})
                above, below, updates = support_stats
                scalars.update(
                    {"losses/targets_above_support": above / updates, "losses/targets_below_support": below / updates}
                )
                support_stats.zero_()
            if actor_loss is not None:
                scalars["losses/actor_loss"] = actor_loss
            # mjlab's own episode statistics (reward terms, termination causes, metrics), averaged over its logs
            for key in sorted({key for log in mjlab_logs for key in log}):
                logged = [
                    torch.as_tensor(log[key], dtype=torch.float32, device=device) for log in mjlab_logs if key in log
                ]
                scalars[f"mjlab/{key}"] = torch.stack(logged).mean()
            mjlab_logs.clear()
            logged = run.log(global_step, scalars)
            above, below = (
                logged.get("losses/targets_above_support", 0.0),
                logged.get("losses/targets_below_support", 0.0),
            )
            if above > 0 or below > 0:  # the projection clamped them: the critics cannot represent these returns
                print(
                    f"step {global_step}: {above:.1%} of the critics' targets lie above the support's top "
                    f"{args.v_max:g} and {below:.1%} below its bottom {args.v_min:g}, clamped to it: widen "
                    "--v-min/--v-max",
                    flush=True,
                )
        run.end_iteration(global_step)
        if out_of_time:
            print(f"--time-limit-seconds {args.time_limit_seconds:g} reached at step {global_step}", flush=True)
            break

    def evaluate_in_training_envs(model_path: Path, eval_episodes: int, device: torch.device, **_) -> List[float]:
        """Isaac Gym runs one simulation per process: the reloaded model plays in the training environments."""
        return first_episode_returns(load_model(model_path, __file__), envs, eval_episodes, device)

    run.finish(
        global_step,
        evaluate_in_training_envs if simulator == "isaacgym" else evaluate,
        actor=actor.state_dict(),
        obs_normalizer=obs_normalizer.state_dict(),
        obs_dim=obs_dim,
        act_dim=act_dim,
        simulator=simulator,
    )
    envs.close()
