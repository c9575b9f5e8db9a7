"""Twin Delayed Deep Deterministic policy gradient (TD3) for continuous actions.

Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"
(https://arxiv.org/abs/1802.09477): DDPG with three changes. Two critics are trained and the
smaller of their target values forms the TD target (clipped double Q-learning); the target
action is smoothed with clipped Gaussian noise (target policy smoothing); the actor and the
target networks are updated only every `policy_frequency` critic updates (delayed updates).

Action space: Box with finite bounds (any bounds, also asymmetric ones: the actor's tanh output
is scaled to them). Observations: a Box, or a Dict of Boxes (dm_control), flattened.
Environments: vectorised gymnasium environments: MuJoCo (Hopper-v5, HalfCheetah-v5,
Walker2d-v5, Ant-v5 ...), dm_control through shimmy (dm_control/cheetah-run-v0 ...),
Pendulum-v1.

    uv run python cleanrl/td3_continuous_action.py --env-id HalfCheetah-v5
    uv run python cleanrl/td3_continuous_action.py --env-id Pendulum-v1 --total-timesteps 20000 --learning-starts 1000

Expect, after 1M steps, about 9.6k on HalfCheetah, 3.1k on Hopper and 4k on Walker2d (CleanRL's
MuJoCo v4 results); Pendulum-v1 reaches about -150 (random play: about -1200) within 10k steps
with --learning-starts 1000.

One gradient step per environment step (num_envs of them per vector step), so the ratio of
updates to data does not depend on --num-envs. Environments reset in the same step an episode
ends (gymnasium's SAME_STEP autoreset); the replay buffer stores the true final observation of
an ended episode as its next observation, and its termination (not its truncation) as the done
flag, so a time-limit truncation is bootstrapped and only a termination cuts the target.
Checkpoints hold the replay buffer, the networks, their targets, the optimisers and the
environments: classic-control simulators are pickled and MuJoCo simulators saved with their
exact state, so a resumed run on the CPU continues exactly as the uninterrupted one would.
dm_control simulators cannot be saved: a resumed dm_control run starts fresh episodes.
"""

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import (
    CHECKPOINT_NAME,
    StopSignal,
    load_checkpoint,
    load_model,
    restore_envs,
    restore_rng_state,
    save_checkpoint,
    save_model,
    snapshot_envs,
)
from cleanrl_utils.errors import check_env_id, check_positive, fail
from cleanrl_utils.progress import Progress
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
    """CPU threads for torch; 0 = one per core (torch's default): the 256x256 updates at batch 256
    are bound by matrix products, which split well across cores"""
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
    """if toggled, compile the losses with torch.compile (changes float rounding; the gain is on a GPU, small on a CPU)"""


# Losses, Q-values and SPS are read back from the device and logged every this many steps.
LOG_EVERY = 100


def register_env_family(env_id: str) -> None:
    """dm_control ids exist once shimmy is imported; import it (about a second) only when asked for."""
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
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        policy_frequency=args.policy_frequency,
        learning_rate=args.learning_rate,
        eval_episodes=args.eval_episodes,
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if args.torch_threads < 0:
        fail(f"--torch-threads must be 0 (one per core) or positive, got {args.torch_threads}")
    if args.learning_starts < 0:
        fail(f"--learning-starts must be 0 or positive, got {args.learning_starts}")
    if args.learning_starts >= args.total_timesteps:
        fail(
            f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}: "
            f"nothing would be learned; lower --learning-starts"
        )
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    for flag, value in (
        ("--policy-noise", args.policy_noise),
        ("--exploration-noise", args.exploration_noise),
        ("--noise-clip", args.noise_clip),
    ):
        if not value >= 0:
            fail(f"{flag} must be 0 or positive, got {value}")
    if args.batch_size > args.buffer_size:
        fail(
            f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; raise the buffer or lower the batch"
        )
    if args.num_envs > args.buffer_size:
        fail(
            f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: one step would overwrite itself"
        )
    register_env_family(args.env_id)
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
    observation_spaces = (
        observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    )
    if not all(isinstance(space, gym.spaces.Box) for space in observation_spaces):
        fail(
            f"td3_continuous_action.py needs Box observations (or a Dict of them) but {args.env_id} has {observation_space}"
        )


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        # dm_control observes a Dict of arrays: the networks take them as one flat vector.
        if isinstance(env.observation_space, gym.spaces.Dict) or len(env.observation_space.shape) > 1:
            env = gym.wrappers.FlattenObservation(env)
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    register_env_family(env_id)
    # SAME_STEP: an env that ends an episode resets at once and returns the true final
    # observation in infos["final_obs"]. copy=False skips a deepcopy: the returned observation
    # array is overwritten by the next step, so the loop keeps its own copy.
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
        # Functional calls on the layers' parameters: the same maths as nn.Sequential, without
        # a module call per layer, which costs more than the matrix products at small batches.
        x = F.relu(F.linear(obs, self.fc1.weight, self.fc1.bias))
        x = F.relu(F.linear(x, self.fc2.weight, self.fc2.bias))
        return scale_action(
            torch.tanh(F.linear(x, self.fc_mu.weight, self.fc_mu.bias)), self.action_scale, self.action_bias
        )


class TwinCritic(nn.Module):
    """The two Q-networks Q1(s, a) and Q2(s, a): independent 256x256 ReLU MLPs, kept as stacked
    weights (a leading dimension of 2 on every weight and bias) so that one batched matrix
    product per hidden layer (torch.baddbmm) evaluates both. Each is initialised as an
    nn.Linear stack would be, so this is the same model as two separate networks; Adam, being
    elementwise, trains them alike."""

    def __init__(self, obs_dim: int, action_dim: int, num_critics: int = 2):
        super().__init__()
        critics = [
            (nn.Linear(obs_dim + action_dim, 256), nn.Linear(256, 256), nn.Linear(256, 1)) for _ in range(num_critics)
        ]
        fc1, fc2, fc3 = zip(*critics)

        def stack(tensors: list[torch.Tensor]) -> nn.Parameter:
            return nn.Parameter(torch.stack([tensor.detach() for tensor in tensors]))

        self.w1, self.b1 = (
            stack([fc.weight.T for fc in fc1]),
            stack([fc.bias[None] for fc in fc1]),
        )  # [n, in, 256], [n, 1, 256]
        self.w2, self.b2 = (
            stack([fc.weight.T for fc in fc2]),
            stack([fc.bias[None] for fc in fc2]),
        )  # [n, 256, 256], [n, 1, 256]
        self.w3, self.b3 = stack([fc.weight for fc in fc3]), stack([fc.bias for fc in fc3])  # [n, 1, 256], [n, 1]

    def forward(
        self, obs: torch.Tensor, actions: torch.Tensor, num_critics: int | None = None, frozen: bool = False
    ) -> torch.Tensor:
        """Q-values [num_critics, batch] of the first `num_critics` critics (all by default).

        frozen: use detached weights, so that a backward pass computes gradients for the
        actions only (the actor's loss) and skips the critics' weight gradients."""
        w1, b1, w2, b2, w3, b3 = self.w1, self.b1, self.w2, self.b2, self.w3, self.b3
        if num_critics is not None:
            w1, b1, w2, b2, w3, b3 = (p[:num_critics] for p in (w1, b1, w2, b2, w3, b3))
        if frozen:
            w1, b1, w2, b2, w3, b3 = (p.detach() for p in (w1, b1, w2, b2, w3, b3))
        x = torch.cat([obs, actions], dim=-1).expand(len(w1), -1, -1)
        x = torch.baddbmm(b1, x, w1).relu_()
        x = torch.baddbmm(b2, x, w2).relu_()
        # One output unit: a product and a sum, cheaper on a CPU than a batched one-column matmul.
        return (x * w3).sum(dim=-1) + b3


class ReplayBuffer:
    """The last `buffer_size` transitions, circular, in one tensor on the training device.

    Each row is one transition: obs | next_obs | action | reward | termination. A step of all
    environments is assembled in a host staging array and written with one host-to-device copy;
    a minibatch is one gather.
    """

    def __init__(self, buffer_size: int, num_envs: int, obs_dim: int, action_dim: int, device: torch.device):
        self.buffer_size, self.obs_dim, self.action_dim = buffer_size, obs_dim, action_dim
        self.data = torch.zeros((buffer_size, 2 * obs_dim + action_dim + 2), device=device)
        self.staging = np.zeros((num_envs, 2 * obs_dim + action_dim + 2), dtype=np.float32)
        self.staging_tensor = torch.from_numpy(self.staging)  # shares the staging memory
        self.pos, self.size = 0, 0

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        infos: dict,
    ) -> None:
        """Store one step of every environment, as returned by a SAME_STEP vector env."""
        d, a, n = self.obs_dim, self.action_dim, len(obs)
        rows = self.staging
        rows[:, :d] = obs
        rows[:, d : 2 * d] = next_obs
        if "final_obs" in infos:
            # Where an episode ended, next_obs already holds the first observation of the next
            # episode; the transition leads to the true final one (bootstrapped if truncated).
            ended = infos["_final_obs"]
            rows[ended, d : 2 * d] = np.stack(infos["final_obs"][ended])
        rows[:, 2 * d : 2 * d + a] = actions
        rows[:, 2 * d + a] = rewards
        rows[:, 2 * d + a + 1] = terminations
        end = self.pos + n
        if end <= self.buffer_size:
            self.data[self.pos : end].copy_(self.staging_tensor)
        else:  # wrap around
            split = self.buffer_size - self.pos
            self.data[self.pos :].copy_(self.staging_tensor[:split])
            self.data[: n - split].copy_(self.staging_tensor[split:])
        self.pos = end % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A uniform minibatch (with replacement): obs, actions, next_obs, rewards, terminations."""
        indices = torch.randint(self.size, (batch_size,), device=self.data.device)
        batch = torch.index_select(self.data, 0, indices)
        d, a = self.obs_dim, self.action_dim
        return (
            batch[:, :d],
            batch[:, 2 * d : 2 * d + a],
            batch[:, d : 2 * d],
            batch[:, 2 * d + a],
            batch[:, 2 * d + a + 1],
        )

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


def smooth_target_actions(
    target_actions: torch.Tensor,
    action_scale: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    policy_noise: float,
    noise_clip: float,
) -> torch.Tensor:
    """Target policy smoothing: noise N(0, policy_noise^2) clipped to +-noise_clip, both in units
    of the action half-range (so scaled by action_scale), added to the target actor's actions,
    and the result clipped to [low, high]."""
    noise = (torch.randn_like(target_actions) * policy_noise).clamp(-noise_clip, noise_clip) * action_scale
    return torch.clamp(target_actions + noise, low, high)


def td_target(rewards: torch.Tensor, next_q: torch.Tensor, terminations: torch.Tensor, gamma: float) -> torch.Tensor:
    """r + gamma * Q_target(s', a'), with the bootstrap dropped where the episode terminated.

    A truncated transition keeps its bootstrap: its s' is the true final observation.
    """
    return rewards + gamma * next_q * (1.0 - terminations)


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its deterministic actor (no noise)."""
    model = load_model(model_path, "td3_continuous_action")
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
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None
    stop = StopSignal()  # from here on, SIGTERM/SIGINT lead to a checkpoint and a clean exit

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    run = Run(
        args,
        run_dir=Path(args.resume).parent if checkpoint else None,
        purge_step=checkpoint["global_step"] + 1 if checkpoint else None,
        wandb_id=checkpoint["wandb_id"] if checkpoint else None,
    )
    writer = run.writer
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    action_dim = int(np.prod(envs.single_action_space.shape))
    low = torch.tensor(envs.single_action_space.low, dtype=torch.float32, device=device)
    high = torch.tensor(envs.single_action_space.high, dtype=torch.float32, device=device)

    actor = Actor(obs_dim, low, high).to(device)
    critic = TwinCritic(obs_dim, action_dim).to(device)
    target_actor = Actor(obs_dim, low, high).to(device)
    target_critic = TwinCritic(obs_dim, action_dim).to(device)
    target_actor.load_state_dict(actor.state_dict())
    target_critic.load_state_dict(critic.state_dict())
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=args.learning_rate, fused=True)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, action_dim, device)
    # Everything a checkpoint holds besides counters, random generators and environments.
    stateful = {
        "actor": actor,
        "critic": critic,
        "target_actor": target_actor,
        "target_critic": target_critic,
        "actor_optimizer": actor_optimizer,
        "critic_optimizer": critic_optimizer,
        "replay_buffer": rb,
    }
    # Parameter lists for the Polyak averaging: one fused lerp over all of them.
    online_params = [*actor.parameters(), *critic.parameters()]
    target_params = [*target_actor.parameters(), *target_critic.parameters()]

    def critic_losses(obs, actions, next_obs, rewards, terminations) -> tuple[torch.Tensor, torch.Tensor]:
        """Each critic's mean squared TD error [2] and its Q-values [2, batch], towards the
        clipped double-Q target of the smoothed target action."""
        with torch.no_grad():
            next_actions = smooth_target_actions(
                target_actor(next_obs), actor.action_scale, low, high, args.policy_noise, args.noise_clip
            )
            next_q = target_critic(next_obs, next_actions).amin(dim=0)
            target = td_target(rewards, next_q, terminations, args.gamma)
        q_values = critic(obs, actions)
        return ((q_values - target) ** 2).mean(dim=1), q_values

    def actor_loss(obs) -> torch.Tensor:
        """-Q1(s, actor(s)): the actor climbs the first critic, whose weights stay fixed here."""
        return -critic(obs, actor(obs), num_critics=1, frozen=True).mean()

    if args.compile:
        critic_losses, actor_loss = torch.compile(critic_losses), torch.compile(actor_loss)

    # `latest` holds the latest losses and Q-values (device tensors), read back only when logged.
    global_step, next_log, latest = 0, LOG_EVERY, {}
    obs_np, _ = envs.reset(seed=args.seed)
    if checkpoint:
        for key, module in stateful.items():
            module.load_state_dict(checkpoint[key])
        envs = restore_envs(envs, checkpoint["envs"])
        if checkpoint["envs"] is None:
            print(
                "the environments could not be saved with the checkpoint (dm_control, video recording?): resuming with fresh ones"
            )
            obs_np, _ = envs.reset(seed=args.seed + checkpoint["global_step"])
        else:
            obs_np = checkpoint["next_obs"]
        restore_rng_state(checkpoint["rng"])
        global_step, next_log = checkpoint["global_step"], checkpoint["next_log"]
        latest = {key: value.to(device) for key, value in checkpoint["latest"].items()}
    obs_np = obs_np.astype(np.float32)

    def write_checkpoint() -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            next_log=next_log,
            **{key: module.state_dict() for key, module in stateful.items()},
            envs=snapshot_envs(envs),
            next_obs=obs_np,
            latest={key: value.cpu() for key, value in latest.items()},
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    start_time, start_step = time.time(), global_step

    while global_step < args.total_timesteps:
        # Act: one host-to-device copy of the observations, one device-to-host copy of the actions.
        if global_step < args.learning_starts:
            actions = random_actions(args.num_envs, low, high)
        else:
            with torch.no_grad():
                obs = torch.from_numpy(obs_np).to(device)
                actions = add_exploration_noise(actor(obs), actor.action_scale, low, high, args.exploration_noise)
        actions_np = actions.cpu().numpy()
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions_np)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs_np, next_obs_np, actions_np, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        if "episode" in infos:
            finished = infos["_episode"]
            for episodic_return, episodic_length in zip(
                infos["episode"]["r"][finished], infos["episode"]["l"][finished]
            ):
                writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                writer.add_scalar("charts/episodic_length", episodic_length, global_step)
            progress.add_returns(infos["episode"]["r"][finished])

        # Learn: one gradient step per environment step after `learning_starts`, numbered by that
        # step; the actor and the targets follow every `policy_frequency` steps (delayed).
        for update in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            batch = rb.sample(args.batch_size)
            qf_losses, q_values = critic_losses(*batch)
            critic_optimizer.zero_grad()
            qf_losses.sum().backward()
            critic_optimizer.step()
            latest["qf_losses"], latest["q_values"] = qf_losses.detach(), q_values.detach()
            if update % args.policy_frequency == 0:
                loss = actor_loss(batch[0])
                actor_optimizer.zero_grad()
                loss.backward()
                actor_optimizer.step()
                latest["actor_loss"] = loss.detach()
                with torch.no_grad():
                    torch._foreach_lerp_(target_params, online_params, args.tau)

        # Logging: one device-to-host read every LOG_EVERY steps.
        if global_step >= next_log:
            next_log = (global_step // LOG_EVERY + 1) * LOG_EVERY
            if latest:
                stats = {
                    "qf1_loss": latest["qf_losses"][0],
                    "qf2_loss": latest["qf_losses"][1],
                    "qf1_values": latest["q_values"][0].mean(),
                    "qf2_values": latest["q_values"][1].mean(),
                }
                if "actor_loss" in latest:
                    stats["actor_loss"] = latest["actor_loss"]
                stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))
                stats["qf_loss"] = (stats["qf1_loss"] + stats["qf2_loss"]) / 2.0
                for name, value in stats.items():
                    writer.add_scalar(f"losses/{name}", value, global_step)
                for name, value in stats.items():
                    if not np.isfinite(value):
                        path = write_checkpoint()
                        fail(f"losses/{name} is {value} at step {global_step}; checkpoint written to {path}")
            writer.add_scalar("charts/learning_rate", args.learning_rate, global_step)
            writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
            progress.update(global_step)

        if stop or (next_checkpoint is not None and global_step >= next_checkpoint):
            path = write_checkpoint()
            if next_checkpoint is not None:
                next_checkpoint = (global_step // args.checkpoint_every + 1) * args.checkpoint_every
            if stop:
                print(f"\n{stop.received}: checkpoint written to {path}; continue with --resume {path}", flush=True)
                envs.close()
                run.close()
                raise SystemExit(0)

    progress.close(global_step)
    envs.close()

    if args.save_model:
        model_path = run.dir / f"{args.exp_name}.cleanrl_model"
        save_model(
            model_path,
            args,
            actor=actor.state_dict(),
            critic=critic.state_dict(),
            obs_dim=obs_dim,
            action_dim=action_dim,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(
            model_path,
            args.eval_episodes,
            device,
            seed=args.seed + 1_000,
            capture_video=args.capture_video,
            video_dir=run.dir / "videos" / "eval",
        )
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"evaluation over {len(episodic_returns)} episodes: {np.mean(episodic_returns):.1f} +- {np.std(episodic_returns):.1f}"
        )

    run.close()
