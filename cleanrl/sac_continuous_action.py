"""Soft Actor-Critic (SAC) for continuous actions, with automatic entropy tuning.

Haarnoja et al. 2018 (https://arxiv.org/abs/1801.01290, https://arxiv.org/abs/1812.05905): twin
Q-networks with Polyak-averaged targets, a tanh-squashed Gaussian policy that maximises min(Q1, Q2)
plus entropy, and an entropy coefficient alpha tuned towards a target entropy of -|A|. As in CleanRL
the policy takes `policy_frequency` steps every `policy_frequency` critic steps; the alpha loss
reuses the policy step's log-probabilities (as SB3 does).

Action space: a bounded 1-D Box. Observations: a Box or a Dict of Boxes (flattened). Environments:
vectorised gymnasium: MuJoCo (Hopper-v5 ...), dm_control via shimmy, Pendulum-v1. One gradient step
per environment step; a truncation bootstraps from the true final observation, only a termination
cuts the target. Resuming on the CPU is exact (PyBullet, dm_control composer and video runs get fresh environments).

    uv run python cleanrl/sac_continuous_action.py --env-id Hopper-v5

Expect Pendulum-v1 about -170 after 20k steps (random play: about -1200) and Hopper-v5 about 1900
after 200k steps (benchmark/results/sac.md).
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
    """the number of parallel game environments (one gradient step per environment step either way)"""
    buffer_size: int = 1000000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient (Polyak averaging)"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = 5000
    """timestep to start learning (uniformly random actions until then)"""
    policy_lr: float = 3e-4
    """the learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q network optimizer (and of alpha's with --autotune)"""
    policy_frequency: int = 2
    """every this many critic steps the policy takes this many steps (delayed, then caught up)"""
    target_network_frequency: int = 1
    """the frequency of updates for the target networks (in gradient steps)"""
    alpha: float = 0.2
    """entropy regularization coefficient, fixed without --autotune (with it, alpha starts at 1 and is learned)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient towards a target entropy of -|A|"""
    compile: bool = False
    """if toggled, compile the acting step and the updates with torch.compile (meant for GPUs; changes rounding)"""
    cudagraphs: bool = False
    """if toggled, also replay them as CUDA graphs (torch.compile's mode "reduce-overhead"; implies --compile; CUDA)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for (deterministic mean action)"""


LOG_EVERY = 100  # losses, alpha and SPS are read back from the device and logged every this many steps
LOG_STD_MIN, LOG_STD_MAX = -5, 2  # bounds of the policy's log standard deviation (its output is squashed into them)


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
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_lr", "q_lr", "policy_frequency")
    check_positive(**{name: getattr(args, name) for name in positive + ("target_network_frequency", "eval_episodes")})
    for name in ("checkpoint_every", "torch_threads", "learning_starts", "alpha"):
        if not getattr(args, name) >= 0:
            fail(f"--{name.replace('_', '-')} must be 0 or positive, got {getattr(args, name)}")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; lower the batch")
    if args.num_envs > args.buffer_size:
        fail(f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: a step overwrites itself")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA GPU and none is in use; drop it (--compile works on the CPU)")
    register_env_family(args.env_id, args.env_options)
    check_env_id(args.env_id)
    try:
        probe = gym.make(args.env_id)
    except gym.error.DependencyNotInstalled as error:
        fail(f"{args.env_id} cannot be made ({error}); for MuJoCo install the mujoco extra (uv sync --extra mujoco)")
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Box):
        fail(f"sac_continuous_action.py handles Box actions but {args.env_id} has {action_space}; use cleanrl/dqn.py")
    low, high = action_space.low, action_space.high
    if len(action_space.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        fail(f"sac_continuous_action.py needs 1-D Box actions in finite bounds; {args.env_id} has {action_space}")
    boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(f"sac_continuous_action.py needs Box (or Dict of Box) observations; {args.env_id} has {observation_space}")
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


def action_scale_and_bias(low: np.ndarray, high: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The affine map from [-1, 1] onto [low, high]: scale = (high - low) / 2, bias = (high + low) / 2."""
    low, high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
    return (high - low) / 2.0, (high + low) / 2.0


def to_env_action(squashed: torch.Tensor, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """A squashed action in [-1, 1] -> the environment's bounds."""
    return squashed * action_scale + action_bias


def random_actions(num_envs: int, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """Uniformly random actions within the bounds (the warm-up), drawn with torch's RNG on action_scale's device."""
    uniform = torch.rand((num_envs, len(action_scale)), device=action_scale.device) * 2.0 - 1.0
    return to_env_action(uniform, action_scale, action_bias)


def squashed_gaussian_log_prob(
    u: torch.Tensor, noise: torch.Tensor, log_std: torch.Tensor, action_scale: torch.Tensor
) -> torch.Tensor:
    """log density of the action a = tanh(u) * action_scale + action_bias, where u = mean + exp(log_std) * noise
    and noise ~ N(0, I), summed over action dimensions. Change of variables: log pi(a) = log N(u; mean, std)
    - sum log |da/du|, with log N(u; mean, std) = -noise^2 / 2 - log_std - log(2 pi) / 2 and log |da/du| =
    log action_scale + log(1 - tanh(u)^2), the last term in the stable form 2 * (log 2 - u - softplus(-2u)):
    no epsilon, and exact where tanh(u) rounds to +-1."""
    normal_log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_abs_det = torch.log(action_scale) + 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (normal_log_prob - log_abs_det).sum(-1)


def soft_q_target(rewards, terminations, next_q_min, next_log_prob, alpha, gamma: float) -> torch.Tensor:
    """r + gamma * (min_i Q_target_i(s', a') - alpha * log pi(a'|s')) with a' ~ pi(.|s'), the
    bootstrap dropped where the episode terminated. A truncated transition keeps its bootstrap:
    its s' is the true final observation."""
    return rewards + gamma * (1.0 - terminations) * (next_q_min - alpha * next_log_prob)


def q_network(obs_dim: int, act_dim: int, hidden: int = 256) -> nn.Sequential:
    """Q(s, a), one critic: a 256x256 ReLU MLP on the concatenated observation and action."""
    layers = [nn.Linear(obs_dim + act_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


class TwinQNetwork(nn.Module):
    """Q1 and Q2: two independently initialised q_networks whose parameters are stacked along a leading critic
    dimension (torch.func.stack_module_state), evaluated by one batched product per layer (baddbmm). Per update
    (CPU, batch 256) vs the hand-laid column weights this replaced: 2% faster; two separate networks 5% slower;
    torch.vmap(functional_call) over the stacked parameters 24% slower (benchmark/results/sac.md)."""

    def __init__(self, obs_dim: int, act_dim: int, num_critics: int = 2):
        super().__init__()
        stacked, _ = torch.func.stack_module_state([q_network(obs_dim, act_dim) for _ in range(num_critics)])
        weights, biases = ([stacked[f"{i}.{kind}"].detach() for i in (0, 2, 4)] for kind in ("weight", "bias"))
        # x W + b on rows: w1, w2 [critic, in, out], b1, b2 [critic, 1, out]; the output unit w3 [critic, 1, 256].
        self.w1, self.w2 = (nn.Parameter(w.mT.contiguous()) for w in weights[:2])
        self.b1, self.b2 = (nn.Parameter(b.unsqueeze(1)) for b in biases[:2])
        self.w3, self.b3 = nn.Parameter(weights[2]), nn.Parameter(biases[2])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], dim=-1).expand(len(self.w1), -1, -1)  # the same input for each critic
        x = torch.baddbmm(self.b1, x, self.w1).relu_()  # b + x W, per critic
        x = torch.baddbmm(self.b2, x, self.w2).relu_()
        return (x * self.w3).sum(-1) + self.b3  # [critic, batch]; cheaper than a one-column product


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy: a 256x256 ReLU MLP giving the mean and log std of u,
    then a = tanh(u) * action_scale + action_bias, within the environment's bounds."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, hidden: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc_mean = nn.Linear(hidden, len(action_low))
        self.fc_logstd = nn.Linear(hidden, len(action_low))
        action_scale, action_bias = action_scale_and_bias(action_low, action_high)
        self.register_buffer("action_scale", action_scale)
        self.register_buffer("action_bias", action_bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc1(obs).relu_()  # in place: one allocation fewer
        x = self.fc2(x).relu_()
        mean = self.fc_mean(x)
        log_std = torch.tanh(self.fc_logstd(x))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # from (-1, 1) into the bounds
        return mean, log_std

    def sample(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action (differentiable in the parameters) and its log-probability; `noise`: the N(0, I)
        draws [batch, action], drawn here if not given (the compiled functions take them as inputs)."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean) if noise is None else noise
        u = mean + log_std.exp() * noise
        action = to_env_action(torch.tanh(u), self.action_scale, self.action_bias)
        return action, squashed_gaussian_log_prob(u, noise, log_std, self.action_scale)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action used for evaluation: tanh of the mean, within the bounds."""
        mean, _ = self(obs)
        return to_env_action(torch.tanh(mean), self.action_scale, self.action_bias)


Transitions = namedtuple("Transitions", "obs next_obs actions rewards terminations")  # one field of the buffer each


class ReplayBuffer:
    """The last `buffer_size` transitions, circular, on the training device. The fields are named column
    blocks of one float32 tensor [buffer_size, row]: a step of all environments is assembled in a host
    staging array and written with one host-to-device copy, and a minibatch is one gather."""

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


def make_optimizer(groups: list[dict], device: torch.device, compiled: bool) -> torch.optim.Adam:
    """Adam over parameter groups ({"params": ..., "lr": float}), fused on the default path. Compiled (fused Adam
    cannot be traced): the foreach form, whose step torch.compile turns into a few fused kernels; on CUDA with the
    learning rates as device tensors and the step counts on the device (capturable), so that a compiled or
    CUDA-graphed step reads no host value."""
    if not compiled:
        return torch.optim.Adam(groups, fused=True)
    if device.type == "cuda":
        groups = [{**group, "lr": torch.tensor(group["lr"], device=device)} for group in groups]
        return torch.optim.Adam(groups, foreach=True, capturable=True)
    return torch.optim.Adam(groups, foreach=True)  # CPU: capturable and a tensor lr are CUDA-only


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script; the episodic returns of its deterministic policy (the mean action)."""
    model = load_model(model_path, __file__)
    register_env_family(model["env_id"], model["args"].get("env_options"))  # the environment options it trained on
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    actor = Actor(model["obs_dim"], envs.single_action_space.low, envs.single_action_space.high).to(device)
    actor.load_state_dict(model["actor"])
    obs, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            actions = actor.mean_action(torch.tensor(obs, dtype=torch.float32, device=device))
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

    actor = Actor(obs_dim, action_space.low, action_space.high).to(device)
    qf = TwinQNetwork(obs_dim, act_dim).to(device)
    qf_target = copy.deepcopy(qf)
    # Automatic entropy tuning: alpha = exp(log_alpha), trained so that the policy's entropy approaches
    # -|A|; alpha is a device tensor updated in place (no host read per step).
    target_entropy = -float(act_dim)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)
    compiled = args.compile or args.cudagraphs
    q_optimizer = make_optimizer([{"params": list(qf.parameters()), "lr": args.q_lr}], device, compiled)
    # One Adam for the policy and log_alpha, each with its own learning rate: the two losses touch disjoint
    # parameters, so one backward and one step of their sum do exactly what two separate steps would.
    actor_groups = [{"params": list(actor.parameters()), "lr": args.policy_lr}]
    if args.autotune:
        actor_groups.append({"params": [log_alpha], "lr": args.q_lr})
    actor_optimizer = make_optimizer(actor_groups, device, compiled)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, act_dim, device)
    # What a checkpoint holds besides log_alpha, the environments and the step (training_state below).
    stateful = dict(actor=actor, qf=qf, qf_target=qf_target, replay_buffer=rb)
    stateful.update(q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

    def update_critics(batch: Transitions, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of both critics towards the soft Q target (a' ~ pi(.|s') from the N(0, I) `noise`);
        the MSE of each critic [2] and each critic's mean Q-value [2]."""
        with torch.no_grad():
            next_actions, next_log_prob = actor.sample(batch.next_obs, noise)
            next_q_min = qf_target(batch.next_obs, next_actions).amin(0)
            target = soft_q_target(batch.rewards, batch.terminations, next_q_min, next_log_prob, alpha, args.gamma)
        q_values = qf(batch.obs, batch.actions)
        qf_losses = ((q_values - target) ** 2).mean(1)
        q_optimizer.zero_grad()
        qf_losses.sum().backward()
        q_optimizer.step()
        return qf_losses.detach(), q_values.detach().mean(1)

    def update_actor(obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of the policy (the critics frozen by the caller) and, with --autotune, of alpha, on the
        same log-probabilities; the policy loss and the alpha loss."""
        actions, log_prob = actor.sample(obs, noise)
        actor_loss = (alpha * log_prob - qf(obs, actions).amin(0)).mean()
        alpha_loss = (-log_alpha.exp() * (log_prob.detach() + target_entropy)).mean()
        actor_optimizer.zero_grad()
        (actor_loss + alpha_loss if args.autotune else actor_loss).backward()
        actor_optimizer.step()
        if args.autotune:
            alpha.copy_(log_alpha.detach().exp())
        return actor_loss.detach(), alpha_loss.detach()

    sample_actions = actor.sample
    if compiled:
        # The random draws (minibatch indices, the policy's noise) stay outside, so they are the default path's draws.
        mode = "reduce-overhead" if args.cudagraphs else None  # CUDA graphs through PyTorch's graph trees
        update_critics = torch.compile(update_critics, mode=mode)
        update_actor = torch.compile(update_actor, mode=mode)
        sample_actions = torch.compile(actor.sample, mode=mode)

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    if run.checkpoint:
        for key, stored in stateful.items():
            stored.load_state_dict(run.checkpoint[key])
        with torch.no_grad():
            log_alpha.copy_(run.checkpoint["log_alpha"])
            alpha.copy_(log_alpha.exp() if args.autotune else torch.tensor(args.alpha))
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        global_step = run.checkpoint["global_step"]
    obs_np = obs_np.astype(np.float32).reshape(args.num_envs, obs_dim)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            **{key: stored.state_dict() for key, stored in stateful.items()},
            log_alpha=log_alpha.detach().cpu(),
            envs=snapshot_envs(envs, obs_np),
            global_step=global_step,
        )

    qf_losses = q_values = actor_loss = alpha_loss = None  # the latest gradient step's, read back when logged
    run.begin(training_state)
    while global_step < args.total_timesteps:
        # 1. Act: uniformly random actions (torch's RNG, on the device) until learning_starts, then
        # samples of the policy. One host-to-device copy of the observations, one copy back of the actions.
        if global_step < args.learning_starts:
            actions = random_actions(args.num_envs, actor.action_scale, actor.action_bias)
        else:
            with torch.no_grad():
                obs = torch.from_numpy(obs_np).to(device)
                actions, _ = sample_actions(obs, torch.randn((args.num_envs, act_dim), device=device))
        actions = actions.cpu().numpy()
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        next_obs_np = next_obs_np.reshape(args.num_envs, obs_dim)
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # 2. Learn: one critic step per environment step t > learning_starts (num_envs of them per
        # vector step); every policy_frequency-th, policy_frequency steps of the policy; every
        # target_network_frequency-th, a Polyak update of the targets.
        for t in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            batch = rb.sample(args.batch_size)
            # Copies: a CUDA graph's outputs are overwritten by its next replay (tiny copies otherwise).
            qf_losses, q_values = (out.clone() for out in update_critics(batch, torch.randn_like(batch.actions)))
            if t % args.policy_frequency == 0:
                qf.requires_grad_(False)  # the policy's loss backpropagates through the critics, not into them
                for _ in range(args.policy_frequency):
                    noise = torch.randn_like(batch.actions)
                    actor_loss, alpha_loss = (out.clone() for out in update_actor(batch.obs, noise))
                qf.requires_grad_(True)
            if t % args.target_network_frequency == 0:
                with torch.no_grad():
                    torch._foreach_lerp_(list(qf_target.parameters()), list(qf.parameters()), args.tau)

        # 3. Log every LOG_EVERY steps (one device-to-host read), checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            scalars = {}
            if qf_losses is not None:
                scalars = {"losses/qf1_values": q_values[0], "losses/qf2_values": q_values[1], "losses/alpha": alpha}
                scalars.update({"losses/qf1_loss": qf_losses[0], "losses/qf2_loss": qf_losses[1]})
                scalars["losses/qf_loss"] = qf_losses.mean()
            if actor_loss is not None:
                scalars["losses/actor_loss"] = actor_loss
                if args.autotune:
                    scalars["losses/alpha_loss"] = alpha_loss
            run.log(global_step, scalars)
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, actor=actor.state_dict(), qf=qf.state_dict(), obs_dim=obs_dim, act_dim=act_dim)
