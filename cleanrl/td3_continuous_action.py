"""Twin Delayed Deep Deterministic policy gradient (TD3) for continuous actions.

Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"
(https://arxiv.org/abs/1802.09477): DDPG with three changes. Two critics are trained and the smaller
of their target values forms the TD target (clipped double Q-learning); the target action is smoothed
with clipped Gaussian noise (target policy smoothing); the actor and the targets are updated only
every `policy_frequency` critic updates (delayed updates).

Action space: a 1-D Box with finite bounds. Observations: a Box or a Dict of Boxes (flattened).
Environments: vectorised gymnasium: MuJoCo (Hopper-v5, HalfCheetah-v5 ...), dm_control via shimmy,
Pendulum-v1. One gradient step per environment step; a truncation bootstraps from the true final
observation, only a termination cuts the target. Resuming on the CPU is exact (PyBullet, dm_control composer and video
runs get fresh environments).

    uv run python cleanrl/td3_continuous_action.py --env-id Pendulum-v1 --total-timesteps 20000 --learning-starts 1000

Expect Pendulum-v1 about -180 after 20k steps (random play: about -1200); Hopper-v5 reached 536 after
200k steps with one seed, below CleanRL's ~3.1k after 1M (benchmark/results/td3.md).
"""

import copy
import itertools
import os
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
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
    learning_rate: float = 3e-4
    """the learning rate of the optimizers (actor and critics)"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient (Polyak averaging of the target networks)"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    policy_noise: float = 0.2
    """the standard deviation of the target policy smoothing noise (in units of the action half-range)"""
    exploration_noise: float = 0.1
    """the standard deviation of the exploration noise (in units of the action half-range)"""
    learning_starts: int = 25000
    """timestep to start learning (uniformly random actions until then)"""
    policy_frequency: int = 2
    """the frequency of training the actor and updating the targets (delayed), in critic updates"""
    noise_clip: float = 0.5
    """the target policy smoothing noise is clipped to +-this (in units of the action half-range)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""
    compile: bool = False
    """if toggled, compile the acting step and the updates with torch.compile (meant for GPUs; changes rounding)"""
    cudagraphs: bool = False
    """if toggled, also replay them as CUDA graphs (torch.compile's mode "reduce-overhead"; implies --compile; CUDA)"""


LOG_EVERY = 100  # losses, Q-values and SPS are read back from the device and logged every this many steps


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
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency", "learning_rate")
    check_positive(**{name: getattr(args, name) for name in positive + ("eval_episodes",)})
    nonnegative = ("checkpoint_every", "torch_threads", "learning_starts", "policy_noise", "exploration_noise")
    for name in nonnegative + ("noise_clip",):
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
    except Exception as error:  # a simulator package that is not installed, a broken install
        reason = str(error).strip().splitlines()
        fail(f"cannot make {args.env_id}: {type(error).__name__}{': ' + reason[0] if reason else ''}")
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if isinstance(action_space, gym.spaces.Discrete):
        fail(f"td3_continuous_action.py handles Box actions but {args.env_id} has {action_space}; use cleanrl/dqn.py")
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        fail(f"td3_continuous_action.py needs a one-dimensional Box action space but {args.env_id} has {action_space}")
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        fail(f"td3_continuous_action.py scales actions to finite bounds but {args.env_id} has {action_space}")
    boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(f"td3_continuous_action.py needs Box (or Dict of Box) observations; {args.env_id} has {observation_space}")
    obs_dim, action_dim = gym.spaces.flatdim(observation_space), action_space.shape[0]
    nbytes = args.buffer_size * sum(ReplayBuffer.field_widths(obs_dim, action_dim)) * 4  # float32 rows
    check_fits(nbytes, "cuda" if args.cuda and torch.cuda.is_available() else "cpu", "replay buffer", "--buffer-size")


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
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
    register_env_family(env_id)
    # SAME_STEP: an env that ends an episode resets at once and returns the true final observation in
    # infos["final_obs"]. copy=False skips a deepcopy: the step overwrites it, so the loop keeps a copy.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def scale_action(squashed: torch.Tensor, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """Map a tanh output in [-1, 1] to the Box [low, high]: scale = (high - low) / 2, bias = (high + low) / 2."""
    return squashed * action_scale + action_bias


class Actor(nn.Module):
    """The deterministic policy: a 256x256 ReLU MLP, tanh output scaled to the action bounds."""

    def __init__(self, obs_dim: int, action_low: torch.Tensor, action_high: torch.Tensor):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, len(action_low))
        # Buffers, not parameters: saved with the model, never trained or averaged into the target.
        self.register_buffer("action_scale", (action_high - action_low) / 2.0)
        self.register_buffer("action_bias", (action_high + action_low) / 2.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.fc1(obs).relu_()  # in place: one allocation fewer
        x = self.fc2(x).relu_()
        return scale_action(torch.tanh(self.fc_mu(x)), self.action_scale, self.action_bias)


def q_network(obs_dim: int, action_dim: int, hidden: int = 256) -> nn.Sequential:
    """Q(s, a), one critic: a 256x256 ReLU MLP on the concatenated observation and action."""
    layers = [nn.Linear(obs_dim + action_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


class TwinQNetwork(nn.Module):
    """Q1 and Q2: two independently initialised q_networks whose parameters are stacked along a leading critic
    dimension (torch.func.stack_module_state), evaluated by one batched product per layer (baddbmm). Per TD3
    update (CPU, batch 256) two separate networks measured 8% slower and, in SAC, torch.vmap(functional_call)
    over the stacked parameters 24% slower (benchmark/results/td3.md)."""

    def __init__(self, obs_dim: int, action_dim: int, num_critics: int = 2):
        super().__init__()
        stacked, _ = torch.func.stack_module_state([q_network(obs_dim, action_dim) for _ in range(num_critics)])
        weights, biases = ([stacked[f"{i}.{kind}"].detach() for i in (0, 2, 4)] for kind in ("weight", "bias"))
        # x W + b on rows: w1, w2 [critic, in, out], b1, b2 [critic, 1, out]; the output unit w3 [critic, 1, 256].
        self.w1, self.w2 = (nn.Parameter(w.mT.contiguous()) for w in weights[:2])
        self.b1, self.b2 = (nn.Parameter(b.unsqueeze(1)) for b in biases[:2])
        self.w3, self.b3 = nn.Parameter(weights[2]), nn.Parameter(biases[2])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, num_critics: int | None = None) -> torch.Tensor:
        """Q-values [num_critics, batch] of the first `num_critics` critics (all by default)."""
        w1, b1, w2, b2, w3, b3 = self.w1, self.b1, self.w2, self.b2, self.w3, self.b3
        if num_critics is not None:
            w1, b1, w2, b2, w3, b3 = (p[:num_critics] for p in (w1, b1, w2, b2, w3, b3))
        x = torch.cat([obs, actions], dim=-1).expand(len(w1), -1, -1)  # the same input for each critic
        x = torch.baddbmm(b1, x, w1).relu_()  # b + x W, per critic
        x = torch.baddbmm(b2, x, w2).relu_()
        return (x * w3).sum(-1) + b3  # the output unit: cheaper than a one-column product


Transitions = namedtuple("Transitions", "obs next_obs actions rewards terminations")  # one field of the buffer each


class ReplayBuffer:
    """The last `buffer_size` transitions, circular, on the training device. The fields are named column
    blocks of one float32 tensor [buffer_size, row]: a step of all environments is assembled in a host
    staging array and written with one host-to-device copy, and a minibatch is one gather."""

    def __init__(self, buffer_size: int, num_envs: int, obs_dim: int, action_dim: int, device: torch.device):
        self.buffer_size, self.widths = buffer_size, self.field_widths(obs_dim, action_dim)
        self.data = torch.zeros((buffer_size, sum(self.widths)), device=device)
        self.staging = np.zeros((num_envs, sum(self.widths)), dtype=np.float32)
        self.step = self.fields(self.staging)  # named views of the staging rows
        self.pos, self.size = 0, 0

    @staticmethod
    def field_widths(obs_dim: int, action_dim: int) -> Transitions:
        return Transitions(obs=obs_dim, next_obs=obs_dim, actions=action_dim, rewards=1, terminations=1)

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


def random_actions(num_envs: int, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Uniformly random actions within [low, high], drawn with torch's RNG on low.device."""
    return low + (high - low) * torch.rand((num_envs, len(low)), device=low.device)


def add_exploration_noise(
    actions: torch.Tensor, action_scale: torch.Tensor, low: torch.Tensor, high: torch.Tensor, noise_std: float
) -> torch.Tensor:
    """actions + N(0, (noise_std * action_scale)^2) per dimension, clipped to [low, high]."""
    return torch.clamp(actions + torch.randn_like(actions) * (noise_std * action_scale), low, high)


def smooth_target_actions(target_actions, action_scale, low, high, standard_normal, policy_noise, noise_clip):
    """Target policy smoothing: noise N(0, policy_noise^2) (policy_noise * standard_normal, draws of N(0, 1) shaped
    like the actions) clipped to +-noise_clip, both in units of the action half-range (so scaled by action_scale),
    added to the target actor's actions, the sum clipped to [low, high]."""
    noise = (standard_normal * policy_noise).clamp(-noise_clip, noise_clip) * action_scale
    return torch.clamp(target_actions + noise, low, high)


def td_target(rewards: torch.Tensor, next_q: torch.Tensor, terminations: torch.Tensor, gamma: float) -> torch.Tensor:
    """r + gamma * Q_target(s', a'), the bootstrap dropped where the episode terminated. A truncated transition
    keeps its bootstrap: its s' is the true final observation."""
    return rewards + gamma * next_q * (1.0 - terminations)


def make_optimizer(params, lr: float, device: torch.device, compiled: bool) -> torch.optim.Adam:
    """Adam, fused on the default path. Compiled (fused Adam cannot be traced): the foreach form, whose step
    torch.compile turns into a few fused kernels; on CUDA with the learning rate as a device tensor and the step
    counts on the device (capturable), so that a compiled or CUDA-graphed step reads no host value."""
    if not compiled:
        return torch.optim.Adam(params, lr=lr, fused=True)
    if device.type == "cuda":
        return torch.optim.Adam(params, lr=torch.tensor(lr, device=device), foreach=True, capturable=True)
    return torch.optim.Adam(params, lr=lr, foreach=True)  # CPU: capturable and a tensor lr are CUDA-only


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script; the episodic returns of its deterministic actor (no noise)."""
    model = load_model(model_path, __file__)
    register_env_family(model["env_id"], model["args"].get("env_options"))  # the environment options it trained on
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    zeros = torch.zeros(model["action_dim"])
    actor = Actor(model["obs_dim"], zeros, zeros).to(device)
    actor.load_state_dict(model["actor"])  # the action scale and bias come with the weights
    obs, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            actions = actor(torch.tensor(obs, dtype=torch.float32, device=device))
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
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    action_dim = int(np.prod(envs.single_action_space.shape))
    low = torch.tensor(envs.single_action_space.low, dtype=torch.float32, device=device)
    high = torch.tensor(envs.single_action_space.high, dtype=torch.float32, device=device)

    actor = Actor(obs_dim, low, high).to(device)
    critic = TwinQNetwork(obs_dim, action_dim).to(device)
    target_actor, target_critic = copy.deepcopy(actor), copy.deepcopy(critic)
    compiled = args.compile or args.cudagraphs
    actor_optimizer = make_optimizer(actor.parameters(), args.learning_rate, device, compiled)
    critic_optimizer = make_optimizer(critic.parameters(), args.learning_rate, device, compiled)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, action_dim, device)
    # What a checkpoint holds besides the environments and the step (training_state below).
    stateful = dict(actor=actor, critic=critic, target_actor=target_actor, target_critic=target_critic)
    stateful.update(actor_optimizer=actor_optimizer, critic_optimizer=critic_optimizer, replay_buffer=rb)
    # The Polyak averaging of both targets (update_actor_and_targets below).
    online_params = [*actor.parameters(), *critic.parameters()]
    target_params = [*target_actor.parameters(), *target_critic.parameters()]

    def update_critics(batch: Transitions, standard_normal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step of both critics towards the clipped double-Q target of the smoothed target action
        (`standard_normal`: the smoothing noise's N(0, 1) draws); each critic's mean squared TD error [2] and its
        mean Q-value [2]."""
        with torch.no_grad():
            next_actions = target_actor(batch.next_obs)
            next_actions = smooth_target_actions(
                next_actions, actor.action_scale, low, high, standard_normal, args.policy_noise, args.noise_clip
            )
            next_q = target_critic(batch.next_obs, next_actions).amin(dim=0)
            target = td_target(batch.rewards, next_q, batch.terminations, args.gamma)
        q_values = critic(batch.obs, batch.actions)
        qf_losses = ((q_values - target) ** 2).mean(dim=1)
        critic_optimizer.zero_grad()
        qf_losses.sum().backward()
        critic_optimizer.step()
        return qf_losses.detach(), q_values.detach().mean(dim=1)

    def update_actor_and_targets(obs: torch.Tensor) -> torch.Tensor:
        """One gradient step of the actor up the first critic, -Q1(s, actor(s)) (the critic frozen by the caller),
        then the Polyak averaging of both targets; the actor's loss."""
        loss = -critic(obs, actor(obs), num_critics=1).mean()
        actor_optimizer.zero_grad()
        loss.backward()
        actor_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_params, online_params, args.tau)  # one fused lerp over all their parameters
        return loss.detach()

    acting_actor = actor
    if compiled:
        # The random draws (minibatch indices, smoothing and exploration noise) stay outside, so they are the default
        # path's draws.
        mode = "reduce-overhead" if args.cudagraphs else None  # CUDA graphs through PyTorch's graph trees
        update_critics = torch.compile(update_critics, mode=mode)
        update_actor_and_targets = torch.compile(update_actor_and_targets, mode=mode)
        acting_actor = torch.compile(actor, mode=mode)

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    if run.checkpoint:
        for key, stored in stateful.items():
            stored.load_state_dict(run.checkpoint[key])
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        global_step = run.checkpoint["global_step"]
    obs_np = obs_np.astype(np.float32)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            **{key: stored.state_dict() for key, stored in stateful.items()},
            envs=snapshot_envs(envs, obs_np),
            global_step=global_step,
        )

    qf_losses = q_values = loss = None  # the latest gradient step's, read back when logged
    run.begin(training_state)
    while global_step < args.total_timesteps:
        # 1. Act: one host-to-device copy of the observations, one device-to-host copy of the actions.
        if global_step < args.learning_starts:
            actions = random_actions(args.num_envs, low, high)
        else:
            with torch.no_grad():
                obs = torch.from_numpy(obs_np).to(device)
                actions = acting_actor(obs)
                actions = add_exploration_noise(actions, actor.action_scale, low, high, args.exploration_noise)
        actions_np = actions.cpu().numpy()
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions_np)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs_np, next_obs_np, actions_np, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # 2. Learn: one gradient step per environment step after `learning_starts`, numbered by that
        # step; the actor and the targets follow every `policy_frequency` steps (delayed).
        for update in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            batch = rb.sample(args.batch_size)
            # Copies: a CUDA graph's outputs are overwritten by its next replay (tiny copies otherwise).
            qf_losses, q_values = (out.clone() for out in update_critics(batch, torch.randn_like(batch.actions)))
            if update % args.policy_frequency == 0:
                critic.requires_grad_(False)  # the actor's loss backpropagates through the critic, not into it
                loss = update_actor_and_targets(batch.obs).clone()
                critic.requires_grad_(True)

        # 3. Log every LOG_EVERY steps (one device-to-host read), checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            scalars = {"charts/learning_rate": args.learning_rate}
            if qf_losses is not None:
                q1, q2 = q_values
                scalars.update({"losses/qf1_values": q1, "losses/qf2_values": q2, "losses/qf_loss": qf_losses.mean()})
                scalars.update({"losses/qf1_loss": qf_losses[0], "losses/qf2_loss": qf_losses[1]})
            if loss is not None:
                scalars["losses/actor_loss"] = loss
            run.log(global_step, scalars)
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        actor=actor.state_dict(),
        critic=critic.state_dict(),
        obs_dim=obs_dim,
        action_dim=action_dim,
    )
