"""CrossQ: SAC with batch renormalisation in the critics and the policy, and no target networks.

Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample Efficiency and
Simplicity" (ICLR 2024, https://arxiv.org/abs/1902.05605; the authors' code, github.com/adityab/CrossQ, is what this
follows): the critics see (s, a) and (s', a') concatenated in one training-mode forward pass, so that batch
(re)normalisation computes its statistics over both and Q(s', a') is in the same distribution as Q(s, a); the target
r + gamma * (min_i Q_i(s', a') - alpha log pi(a'|s')) is that pass's second half, held constant, and no target network
is kept. Wide critics (2048 x 2048), Adam with beta1 0.5, learning rate 1e-3, one critic step per environment step
and a policy step every 3rd. Batch renormalisation (Ioffe 2017, `BatchRenorm`) behaves as batch normalisation for its
first 100k training steps, while the running statistics settle.

Action space: a bounded 1-D Box; the environments of sac_continuous_action.py (MuJoCo, dm_control, Pendulum-v1 ...).
A truncation bootstraps from the true final observation; only a termination cuts the target. Resuming on the CPU is
exact.

    uv run python cleanrl/crossq_continuous_action.py --env-id Hopper-v5

Where ours differs from the authors' code: the renormalised activation is the paper's (x - mean) / std * r + d, where
their code folds r and d into a modified mean and variance (the same up to where epsilon enters). The wide critics
are meant for a GPU: their cost on a CPU and where the benchmark runs, benchmark/results/crossq_continuous_action.md.
"""

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
    """CPU threads for torch; 0 = one per core (torch's default): the wide critics are bound by matrix products"""
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
    """the number of parallel game environments (one critic step per environment step either way)"""
    buffer_size: int = 1000000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    batch_size: int = 256
    """the batch size of sample from the replay memory (the critics see twice as many rows: (s, a) and (s', a'))"""
    learning_starts: int = 5000
    """timestep to start learning (uniformly random actions until then)"""
    policy_lr: float = 1e-3
    """the learning rate of the policy network optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the critics' optimizer"""
    alpha_lr: float = 1e-3
    """the learning rate of the entropy coefficient's optimizer (plain Adam, beta1 0.9, as in the authors' code)"""
    adam_beta1: float = 0.5
    """Adam's beta1 for the policy and the critics (the paper's 0.5)"""
    policy_frequency: int = 3
    """one policy (and alpha) step every this many critic steps"""
    critic_hidden: int = 2048
    """the width of the critics' two hidden layers"""
    actor_hidden: int = 256
    """the width of the policy's two hidden layers"""
    bn_momentum: float = 0.99
    """the running statistics keep this share at each training step (new = 0.99 old + 0.01 batch)"""
    renorm_warmup_steps: int = 100000
    """training steps of each normalisation layer with plain batch statistics before renormalisation starts"""
    alpha: float = 0.2
    """entropy regularization coefficient, fixed without --autotune (with it, alpha starts at 1 and is learned)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient towards a target entropy of -|A|"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for (deterministic mean action)"""


LOG_EVERY = 100  # losses, alpha and SPS are read back from the device and logged every this many steps
LOG_STD_MIN, LOG_STD_MAX = -20, 2  # the policy's log standard deviation is clipped to these (the authors' code)
RENORM_EPS, RENORM_R_MAX, RENORM_D_MAX = 1e-3, 3.0, 5.0  # batch renormalisation's epsilon and clips (the authors')


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
    positive = ("total_timesteps", "num_envs", "buffer_size", "policy_lr", "q_lr", "alpha_lr", "policy_frequency")
    check_positive(
        **{name: getattr(args, name) for name in positive + ("critic_hidden", "actor_hidden", "eval_episodes")}
    )
    for name in ("checkpoint_every", "torch_threads", "learning_starts", "alpha", "renorm_warmup_steps"):
        if not getattr(args, name) >= 0:
            fail(f"--{name.replace('_', '-')} must be 0 or positive, got {getattr(args, name)}")
    if args.batch_size < 2:
        fail(f"--batch-size must be at least 2 (batch statistics need two rows), got {args.batch_size}")
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}")
    if not 0 < args.gamma <= 1:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0 <= args.bn_momentum < 1 or not 0 <= args.adam_beta1 < 1:
        fail(f"--bn-momentum and --adam-beta1 must be in [0, 1), got {args.bn_momentum} and {args.adam_beta1}")
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
    script = "crossq_continuous_action.py"
    if not isinstance(action_space, gym.spaces.Box):
        fail(f"{script} handles Box actions but {args.env_id} has {action_space}; use cleanrl/dqn.py")
    low, high = action_space.low, action_space.high
    if len(action_space.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        fail(f"{script} needs 1-D Box actions in finite bounds; {args.env_id} has {action_space}")
    boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(f"{script} needs Box (or Dict of Box) observations; {args.env_id} has {observation_space}")
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


class BatchRenorm(nn.Module):
    """Batch renormalisation (Ioffe 2017, https://arxiv.org/abs/1702.03275) over the feature dimension of [batch,
    features] inputs, as CrossQ uses it.

    Training mode: the batch's mean and (biased) variance, std = sqrt(var + eps), and the running std likewise;
    x_hat = (x - mean) / std * r + d with r = std / running_std clipped to [1 / r_max, r_max] and d = (mean -
    running_mean) / running_std clipped to [-d_max, d_max], both held constant in the gradient, so that the output
    matches what evaluation with the running statistics gives. For the first `warmup_steps` training steps r = 1 and
    d = 0: plain batch normalisation. Each training step moves the running mean and variance towards the batch's by
    1 - momentum. Evaluation mode: (x - running_mean) / sqrt(running_var + eps). Then a learned scale and shift."""

    def __init__(self, num_features: int, momentum: float, warmup_steps: int):
        super().__init__()
        self.momentum, self.warmup_steps = momentum, warmup_steps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # training steps taken, on the device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        running_std = (self.running_var + RENORM_EPS).sqrt()
        if not self.training:
            return (x - self.running_mean) / running_std * self.weight + self.bias
        mean, var = x.mean(0), x.var(0, correction=0)
        std = (var + RENORM_EPS).sqrt()
        with torch.no_grad():
            warmed_up = self.steps >= self.warmup_steps  # a device bool: no host read per step
            r = torch.where(warmed_up, (std / running_std).clamp(1 / RENORM_R_MAX, RENORM_R_MAX), 1.0)
            d = torch.where(
                warmed_up, ((mean - self.running_mean) / running_std).clamp(-RENORM_D_MAX, RENORM_D_MAX), 0.0
            )
            self.running_mean.lerp_(mean, 1 - self.momentum)
            self.running_var.lerp_(var, 1 - self.momentum)
            self.steps += 1
        return ((x - mean) / std * r + d) * self.weight + self.bias


def renormalised_relu_layers(in_dim: int, hidden: int, momentum: float, warmup_steps: int) -> list[nn.Module]:
    """The authors' layout for both networks: batch renormalisation of the input, then two ReLU layers of `hidden`
    units, each followed by batch renormalisation."""
    layers = [BatchRenorm(in_dim, momentum, warmup_steps)]
    for width_in, width_out in ((in_dim, hidden), (hidden, hidden)):
        layers += [nn.Linear(width_in, width_out), nn.ReLU(), BatchRenorm(width_out, momentum, warmup_steps)]
    return layers


def critic_network(in_dim: int, hidden: int, momentum: float, warmup_steps: int) -> nn.Sequential:
    """Q(s, a), one critic: the renormalised ReLU layers on (s, a), then one output unit."""
    return nn.Sequential(*renormalised_relu_layers(in_dim, hidden, momentum, warmup_steps), nn.Linear(hidden, 1))


class TwinCritic(nn.Module):
    """Q1 and Q2, each with its own weights and normalisation statistics."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, momentum: float, warmup_steps: int):
        super().__init__()
        in_dim = obs_dim + act_dim
        self.critics = nn.ModuleList([critic_network(in_dim, hidden, momentum, warmup_steps) for _ in range(2)])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[2, batch]: each critic's Q-values."""
        x = torch.cat([obs, actions], dim=-1)
        return torch.stack([critic(x).squeeze(-1) for critic in self.critics])


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy: batch renormalisation of the observation, then two ReLU layers each followed by
    batch renormalisation (the authors' "brn_actor"), giving the mean and log std of u; a = tanh(u) * action_scale +
    action_bias, within the environment's bounds."""

    def __init__(self, obs_dim: int, action_low, action_high, hidden: int, momentum: float, warmup_steps: int):
        super().__init__()
        self.trunk = nn.Sequential(*renormalised_relu_layers(obs_dim, hidden, momentum, warmup_steps))
        self.fc_mean = nn.Linear(hidden, len(action_low))
        self.fc_logstd = nn.Linear(hidden, len(action_low))
        action_scale, action_bias = action_scale_and_bias(action_low, action_high)
        self.register_buffer("action_scale", action_scale)
        self.register_buffer("action_bias", action_bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs)
        return self.fc_mean(x), self.fc_logstd(x).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action (differentiable in the parameters) at the N(0, I) draws `noise` [batch, action],
        and its log-probability."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * noise
        action = to_env_action(torch.tanh(u), self.action_scale, self.action_bias)
        return action, squashed_gaussian_log_prob(u, noise, log_std, self.action_scale)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action used for evaluation: tanh of the mean, within the bounds."""
        mean, _ = self(obs)
        return to_env_action(torch.tanh(mean), self.action_scale, self.action_bias)


def soft_q_target(rewards, terminations, next_q_min, next_log_prob, alpha, gamma: float) -> torch.Tensor:
    """r + gamma * (min_i Q_i(s', a') - alpha * log pi(a'|s')) with a' ~ pi(.|s'), the bootstrap dropped where the
    episode terminated. A truncated transition keeps its bootstrap: its s' is the true final observation."""
    return rewards + gamma * (1.0 - terminations) * (next_q_min - alpha * next_log_prob)


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


def build_networks(args_like: dict, obs_dim: int, act_dim: int, action_space) -> tuple[Actor, TwinCritic]:
    """The policy and the twin critic for the hyperparameters `args_like` (Args' fields as a dict)."""
    normalisation = (args_like["bn_momentum"], args_like["renorm_warmup_steps"])
    actor = Actor(obs_dim, action_space.low, action_space.high, args_like["actor_hidden"], *normalisation)
    return actor, TwinCritic(obs_dim, act_dim, args_like["critic_hidden"], *normalisation)


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script; the episodic returns of its deterministic policy (the mean action, the
    normalisation in evaluation mode)."""
    model = load_model(model_path, __file__)
    register_env_family(model["env_id"], model["args"].get("env_options"))  # the environment options it trained on
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    actor, _ = build_networks(model["args"], model["obs_dim"], model["act_dim"], envs.single_action_space)
    actor.load_state_dict(model["actor"])
    actor.to(device).eval()
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

    actor, qf = (network.to(device) for network in build_networks(vars(args), obs_dim, act_dim, action_space))
    actor.eval()  # the policy acts with its running statistics; it trains only inside update_actor
    # Automatic entropy tuning: alpha = exp(log_alpha), trained so that the policy's entropy approaches -|A|; alpha is
    # a device tensor updated in place (no host read per step).
    target_entropy = -float(act_dim)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)
    betas = (args.adam_beta1, 0.999)
    q_optimizer = torch.optim.Adam(qf.parameters(), lr=args.q_lr, betas=betas, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, betas=betas, fused=True)
    alpha_optimizer = torch.optim.Adam([log_alpha], lr=args.alpha_lr)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, act_dim, device)
    # What a checkpoint holds besides log_alpha, the environments and the step (training_state below).
    stateful = dict(actor=actor, qf=qf, replay_buffer=rb, q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)
    stateful.update(alpha_optimizer=alpha_optimizer)

    def update_critics(batch: Transitions, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of both critics (a' ~ pi(.|s') from the N(0, I) `noise`, the policy in evaluation mode);
        the MSE of each critic [2] and each critic's mean Q-value [2]."""
        with torch.no_grad():
            next_actions, next_log_prob = actor.sample(batch.next_obs, noise)
        # CrossQ's joint forward: (s, a) and (s', a') in one training-mode pass, normalised by the statistics of both.
        qf.train()
        joint_q = qf(torch.cat([batch.obs, batch.next_obs]), torch.cat([batch.actions, next_actions]))
        q_values, next_q = joint_q.chunk(2, dim=1)
        with torch.no_grad():  # the target is held constant: no target network, no gradient through Q(s', a')
            target = soft_q_target(batch.rewards, batch.terminations, next_q.amin(0), next_log_prob, alpha, args.gamma)
        qf_losses = ((q_values - target) ** 2).mean(1)
        q_optimizer.zero_grad()
        (0.5 * qf_losses.sum()).backward()  # the authors' loss: half the squared error, summed over the critics
        q_optimizer.step()
        return qf_losses.detach(), q_values.detach().mean(1)

    def update_actor(obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of the policy (in training mode, the critics frozen and in evaluation mode) and, with
        --autotune, of alpha on the same log-probabilities; the policy loss and the alpha loss."""
        actor.train()
        qf.eval()
        qf.requires_grad_(False)  # the policy's loss backpropagates through the critics, not into them
        actions, log_prob = actor.sample(obs, noise)
        actor_loss = (alpha * log_prob - qf(obs, actions).amin(0)).mean()
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        qf.requires_grad_(True)
        actor.eval()
        alpha_loss = (-log_alpha.exp() * (log_prob.detach() + target_entropy)).mean()
        if args.autotune:
            alpha_optimizer.zero_grad()
            alpha_loss.backward()
            alpha_optimizer.step()
            alpha.copy_(log_alpha.detach().exp())
        return actor_loss.detach(), alpha_loss.detach()

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
        # 1. Act: uniformly random actions (torch's RNG, on the device) until learning_starts, then samples of the
        # policy with its running statistics. One host-to-device copy of the observations, one copy back.
        if global_step < args.learning_starts:
            actions = random_actions(args.num_envs, actor.action_scale, actor.action_bias)
        else:
            with torch.no_grad():
                obs = torch.from_numpy(obs_np).to(device)
                acting_noise = torch.randn((args.num_envs, act_dim), device=device)
                actions, _ = actor.sample(obs, acting_noise)
        actions = actions.cpu().numpy()
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        next_obs_np = next_obs_np.reshape(args.num_envs, obs_dim)
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # 2. Learn: one critic step per environment step t > learning_starts (num_envs of them per vector step); every
        # policy_frequency-th of them, one step of the policy and alpha on the same minibatch.
        for t in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            batch = rb.sample(args.batch_size)
            qf_losses, q_values = update_critics(batch, torch.randn_like(batch.actions))
            if (t - args.learning_starts) % args.policy_frequency == 0:
                actor_loss, alpha_loss = update_actor(batch.obs, torch.randn_like(batch.actions))

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
