"""Truncated Quantile Critics (TQC) for continuous actions: SAC with distributional critics whose most optimistic
quantiles are dropped from the target.

Kuznetsov et al. 2020, "Controlling Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile
Critics" (https://arxiv.org/abs/2005.04269; the authors' code, github.com/SamsungLabs/tqc_pytorch, and sb3-contrib's
TQC read beside it): N critics each predict M quantiles of the return Z(s, a); the target pools the N * M quantiles
of the target critics at (s', a' ~ pi), sorts them and drops the k * N largest (k per critic), then each critic's
quantiles regress on every kept target atom with the quantile Huber loss; the policy maximises the mean of all
quantiles of all critics plus entropy, with alpha tuned towards -|A|. The authors' settings: 5 critics of 3 x 512
units, 25 quantiles, k = 2 (Hopper 5, HalfCheetah 0), lr 3e-4 everywhere, one critic, policy and alpha step per
environment step. Ours differ in: a truncation bootstraps from the true final observation (their done cut it), 5,000
random steps first (SAC's default here; theirs 256), the critics as one stacked module.

Action space: a bounded 1-D Box; environments as sac_continuous_action.py (MuJoCo, dm_control, Pendulum ...).

    uv run python cleanrl/tqc_continuous_action.py --env-id Hopper-v5 --top-quantiles-to-drop-per-net 5

benchmark/tqc.sh runs it beside sac_continuous_action.py on Hopper-v5 (300k steps, 3 seeds).
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
    """target smoothing coefficient (Polyak averaging, after every critic step)"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    learning_starts: int = 5000
    """timestep to start learning (uniformly random actions until then)"""
    learning_rate: float = 3e-4
    """the learning rate of the critics', the policy's and alpha's optimizers (the authors' one rate)"""
    n_critics: int = 5
    """N, the number of quantile critics"""
    n_quantiles: int = 25
    """M, the quantiles each critic predicts"""
    top_quantiles_to_drop_per_net: int = 2
    """k: the target drops the k * N largest of the N * M pooled quantiles (the authors: Hopper 5, HalfCheetah 0)"""
    critic_hidden: int = 512
    """the width of the critics' three hidden layers"""
    actor_hidden: int = 256
    """the width of the policy's two hidden layers"""
    alpha: float = 0.2
    """entropy regularization coefficient, fixed without --autotune (with it, alpha starts at 1 and is learned)"""
    autotune: bool = True
    """automatic tuning of the entropy coefficient towards a target entropy of -|A|"""
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
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "learning_rate", "n_critics")
    positive += ("n_quantiles", "critic_hidden", "actor_hidden", "eval_episodes")
    check_positive(**{name: getattr(args, name) for name in positive})
    for name in ("checkpoint_every", "torch_threads", "learning_starts", "alpha", "top_quantiles_to_drop_per_net"):
        if not getattr(args, name) >= 0:
            fail(f"--{name.replace('_', '-')} must be 0 or positive, got {getattr(args, name)}")
    if args.top_quantiles_to_drop_per_net >= args.n_quantiles:
        fail(
            f"--top-quantiles-to-drop-per-net {args.top_quantiles_to_drop_per_net} leaves no target quantile of "
            f"--n-quantiles {args.n_quantiles}; drop fewer"
        )
    if args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
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
        fail(f"tqc_continuous_action.py handles Box actions but {args.env_id} has {action_space}; use cleanrl/dqn.py")
    low, high = action_space.low, action_space.high
    if len(action_space.shape) != 1 or not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        fail(f"tqc_continuous_action.py needs 1-D Box actions in finite bounds; {args.env_id} has {action_space}")
    boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(f"tqc_continuous_action.py needs Box (or Dict of Box) observations; {args.env_id} has {observation_space}")
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


def truncated_quantile_target(
    next_quantiles: torch.Tensor, drop: int, rewards, terminations, next_log_prob, alpha, gamma: float
) -> torch.Tensor:
    """The target atoms [batch, N * M - drop]: the target critics' quantiles at (s', a') [N, batch, M] pooled per
    sample, sorted, the `drop` largest removed; then r + gamma * (z - alpha * log pi(a'|s')), the bootstrap dropped
    where the episode terminated (a truncated transition keeps it: its s' is the true final observation)."""
    pooled = next_quantiles.permute(1, 0, 2).flatten(1)  # [batch, N * M]
    kept = pooled.sort(dim=1).values[:, : pooled.shape[1] - drop]
    soft = kept - alpha * next_log_prob.unsqueeze(1)
    return rewards.unsqueeze(1) + gamma * (1.0 - terminations).unsqueeze(1) * soft


def quantile_huber_loss(quantiles: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The quantile Huber loss (kappa 1) of each critic's M quantiles [N, batch, M] against every target atom
    [batch, K], averaged over critics, samples, quantiles and atoms, as the authors average it: quantile i, at
    fraction tau_i = (i + 1/2) / M, weighs an atom above it by tau_i and one below by 1 - tau_i."""
    delta = targets[None, :, None, :] - quantiles[..., None]  # [N, batch, M, K]
    huber = torch.where(delta.abs() > 1.0, delta.abs() - 0.5, 0.5 * delta**2)
    m = quantiles.shape[-1]
    tau = (torch.arange(m, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / m
    return ((tau[:, None] - (delta < 0).to(delta.dtype)).abs() * huber).mean()


class QuantileCritics(nn.Module):
    """N critics Z_n(s, a), each a ReLU MLP of three `hidden` layers with M outputs (the quantiles), their parameters
    stacked along a leading critic dimension and evaluated by one batched product per layer (baddbmm). Each critic is
    initialised as nn.Linear initialises its own layers."""

    def __init__(self, obs_dim: int, act_dim: int, n_critics: int, n_quantiles: int, hidden: int):
        super().__init__()
        widths = [obs_dim + act_dim, hidden, hidden, hidden, n_quantiles]
        layers = [[nn.Linear(a, b) for _ in range(n_critics)] for a, b in zip(widths, widths[1:])]
        # x W + b on rows: weights [critic, in, out], biases [critic, 1, out].
        self.weights = nn.ParameterList(torch.stack([layer.weight.detach().T for layer in group]) for group in layers)
        self.biases = nn.ParameterList(torch.stack([layer.bias.detach()[None] for layer in group]) for group in layers)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The quantiles of every critic, [N, batch, M], in increasing order of their fraction (not sorted values)."""
        x = torch.cat([obs, actions], dim=-1).expand(len(self.weights[0]), -1, -1)  # the same input for each critic
        for k, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(bias, x, weight)
            x = x.relu_() if k < len(self.weights) - 1 else x
        return x


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy: a ReLU MLP of two `hidden` layers giving the mean and log std of u,
    then a = tanh(u) * action_scale + action_bias, within the environment's bounds."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, hidden: int):
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


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script; the episodic returns of its deterministic policy (the mean action)."""
    model = load_model(model_path, __file__)
    register_env_family(model["env_id"], model["args"].get("env_options"))  # the environment options it trained on
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    space, hidden = envs.single_action_space, model["args"]["actor_hidden"]
    actor = Actor(model["obs_dim"], space.low, space.high, hidden).to(device)
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

    actor = Actor(obs_dim, action_space.low, action_space.high, args.actor_hidden).to(device)
    qf = QuantileCritics(obs_dim, act_dim, args.n_critics, args.n_quantiles, args.critic_hidden).to(device)
    qf_target = copy.deepcopy(qf)
    drop = args.top_quantiles_to_drop_per_net * args.n_critics  # of the N * M pooled target quantiles
    # Automatic entropy tuning: alpha = exp(log_alpha), trained so that the policy's entropy approaches -|A|; alpha is
    # a device tensor updated in place (no host read per step).
    target_entropy = -float(act_dim)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)
    q_optimizer = torch.optim.Adam(qf.parameters(), lr=args.learning_rate, fused=True)
    # One Adam for the policy and log_alpha (the same learning rate): the two losses touch disjoint parameters, so one
    # backward and one step of their sum do exactly what the authors' two separate steps do.
    actor_params = [*actor.parameters(), log_alpha] if args.autotune else list(actor.parameters())
    actor_optimizer = torch.optim.Adam(actor_params, lr=args.learning_rate, fused=True)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, act_dim, device)
    # What a checkpoint holds besides log_alpha, the environments and the step (training_state below).
    stateful = dict(actor=actor, qf=qf, qf_target=qf_target, replay_buffer=rb)
    stateful.update(q_optimizer=q_optimizer, actor_optimizer=actor_optimizer)

    def update_critics(batch: Transitions, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of all critics towards the truncated target (a' ~ pi(.|s') from the N(0, I) `noise`);
        the quantile Huber loss and the critics' mean Q-value (the mean of all their quantiles)."""
        with torch.no_grad():
            next_actions, next_log_prob = actor.sample(batch.next_obs, noise)
            target = truncated_quantile_target(
                qf_target(batch.next_obs, next_actions),
                drop,
                batch.rewards,
                batch.terminations,
                next_log_prob,
                alpha,
                args.gamma,
            )
        quantiles = qf(batch.obs, batch.actions)
        qf_loss = quantile_huber_loss(quantiles, target)
        q_optimizer.zero_grad()
        qf_loss.backward()
        q_optimizer.step()
        return qf_loss.detach(), quantiles.detach().mean()

    def update_actor(obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of the policy (the critics frozen by the caller) up the mean of every critic's
        quantiles plus entropy, and with --autotune of alpha, on the same log-probabilities; the two losses."""
        actions, log_prob = actor.sample(obs, noise)
        actor_loss = (alpha * log_prob - qf(obs, actions).mean(dim=(0, 2))).mean()
        alpha_loss = (-log_alpha * (log_prob.detach() + target_entropy)).mean()  # the authors': log alpha's gradient
        actor_optimizer.zero_grad()
        (actor_loss + alpha_loss if args.autotune else actor_loss).backward()
        actor_optimizer.step()
        if args.autotune:
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

    qf_loss = q_value = actor_loss = alpha_loss = None  # the latest gradient step's, read back when logged
    run.begin(training_state)
    while global_step < args.total_timesteps:
        # 1. Act: uniformly random actions (torch's RNG, on the device) until learning_starts, then samples of the
        # policy. One host-to-device copy of the observations, one copy back of the actions.
        if global_step < args.learning_starts:
            actions = random_actions(args.num_envs, actor.action_scale, actor.action_bias)
        else:
            with torch.no_grad():
                obs = torch.from_numpy(obs_np).to(device)
                actions, _ = actor.sample(obs, torch.randn((args.num_envs, act_dim), device=device))
        actions = actions.cpu().numpy()
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        next_obs_np = next_obs_np.reshape(args.num_envs, obs_dim)
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # 2. Learn, as the authors do once per environment step t > learning_starts (num_envs of them per vector
        # step): a critic step, the targets' Polyak update, then a policy and alpha step on the same minibatch.
        for t in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            batch = rb.sample(args.batch_size)
            qf_loss, q_value = update_critics(batch, torch.randn_like(batch.actions))
            with torch.no_grad():
                torch._foreach_lerp_(list(qf_target.parameters()), list(qf.parameters()), args.tau)
            qf.requires_grad_(False)  # the policy's loss backpropagates through the critics, not into them
            actor_loss, alpha_loss = update_actor(batch.obs, torch.randn_like(batch.actions))
            qf.requires_grad_(True)

        # 3. Log every LOG_EVERY steps (one device-to-host read), checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            scalars = {}
            if qf_loss is not None:
                scalars = {"losses/qf_loss": qf_loss, "losses/qf_values": q_value, "losses/alpha": alpha}
                scalars["losses/actor_loss"] = actor_loss
                if args.autotune:
                    scalars["losses/alpha_loss"] = alpha_loss
            run.log(global_step, scalars)
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, actor=actor.state_dict(), qf=qf.state_dict(), obs_dim=obs_dim, act_dim=act_dim)
