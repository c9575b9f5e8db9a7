"""Soft Actor-Critic (SAC) for continuous actions, with automatic entropy tuning.

Haarnoja et al. 2018, "Soft Actor-Critic: Off-Policy Maximum Entropy Deep Reinforcement
Learning with a Stochastic Actor" (https://arxiv.org/abs/1801.01290) and "Soft Actor-Critic
Algorithms and Applications" (https://arxiv.org/abs/1812.05905): twin Q-networks with Polyak-
averaged targets, a tanh-squashed Gaussian policy trained to maximise min(Q1, Q2) plus entropy,
and an entropy coefficient alpha tuned towards a target entropy of -|A|. As in CleanRL, the
policy is updated every `policy_frequency` steps, `policy_frequency` times in a row. One
difference: the alpha loss uses the log-probabilities drawn for the policy's step (as SB3 and
Spinning Up do) where CleanRL draws new ones after that step.

Action space: a bounded 1-D Box (any bounds, also asymmetric: the squashed action is scaled
and shifted into them). Observations: a flat Box, or a Dict of Boxes (flattened). Environments:
vectorised gymnasium environments: MuJoCo (Hopper-v5, HalfCheetah-v5, Walker2d-v5, Ant-v5,
Humanoid-v5 ...), dm_control through shimmy (dm_control/cheetah-run-v0 ...), Pendulum-v1.

    uv run python cleanrl/sac_continuous_action.py --env-id Hopper-v5
    uv run python cleanrl/sac_continuous_action.py --env-id Pendulum-v1 --total-timesteps 20000

Expect Pendulum-v1 to climb from about -1200 (random play) to about -150 within 3-4k gradient
steps (by step 5k with --learning-starts 1000; seeds 1 and 2 checked). For reference, CleanRL's
SAC reaches 2310 +- 343 on Hopper, 9635 +- 1424 on HalfCheetah and 3591 +- 911 on Walker2d
(MuJoCo v4, 1M steps); our own numbers are in benchmark/results/sac.md.

One gradient step per environment step (num_envs of them per vector step), so the ratio of
updates to data does not depend on --num-envs. Environments reset in the same step an episode
ends (gymnasium's SAME_STEP autoreset); the replay buffer stores the true final observation of
an ended episode as its next observation, and its termination (not its truncation) as the done
flag, so a time-limit truncation is bootstrapped and only a termination cuts the target.
Checkpoints hold the replay buffer, the networks and their targets, the optimisers, log_alpha
and the environments: classic-control simulators are pickled and MuJoCo ones saved with
mj_getState, so a resumed run on the CPU continues exactly as the uninterrupted one would.
dm_control environments cannot be saved (gymnasium's FlattenObservation holds a lambda, which
does not pickle), nor can environments that record video: those runs resume with everything
else restored and freshly reset environments.

Speed: the update dominates, so the two critics are held as stacked weights and evaluated as
one batched matrix product per layer, the actor's loss backpropagates into the actions only
(not into the critics' weights), one draw of the policy serves both the actor and the alpha
loss (one backward, one optimizer step), Adam is fused, the target update is one foreach lerp,
alpha stays a device tensor, and nothing is read back to the host except every LOG_EVERY steps
for logging. --compile compiles the two loss functions with torch.compile; that is for GPUs: on
this 2-core CPU compiling took about a minute and the compiled step was slower than eager.
"""

import math
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
    """if toggled, compile the losses with torch.compile (changes float rounding and the policy's
    random draws; meant for GPUs: on a CPU compiling takes a minute or more and gains nothing)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for (deterministic mean action)"""


# Losses, alpha and SPS are read back from the device and logged every this many steps.
LOG_EVERY = 100
# Bounds of the policy's log standard deviation (the network's output is squashed into them).
LOG_STD_MAX = 2
LOG_STD_MIN = -5


def register_env_family(env_id: str) -> None:
    """dm_control ids are registered with gymnasium by importing shimmy (only when asked for:
    the import takes time and sets up rendering)."""
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
        policy_lr=args.policy_lr,
        q_lr=args.q_lr,
        policy_frequency=args.policy_frequency,
        target_network_frequency=args.target_network_frequency,
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
            f"the agent would never learn"
        )
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not args.alpha >= 0:
        fail(f"--alpha must be 0 or positive, got {args.alpha}")
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
    except gym.error.DependencyNotInstalled as error:
        fail(f"{args.env_id} cannot be made ({error}); for MuJoCo install the mujoco extra (uv sync --extra mujoco)")
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Box):
        fail(
            f"sac_continuous_action.py handles Box actions but {args.env_id} has {action_space}; "
            f"use cleanrl/dqn.py (or cleanrl/ppo.py) for Discrete actions"
        )
    if len(action_space.shape) != 1:
        fail(f"sac_continuous_action.py needs 1-D Box actions but {args.env_id} has shape {action_space.shape}")
    if not (
        np.all(np.isfinite(action_space.low))
        and np.all(np.isfinite(action_space.high))
        and np.all(action_space.low < action_space.high)
    ):
        fail(
            f"sac_continuous_action.py squashes actions into finite bounds low < high, "
            f"but {args.env_id} has {action_space}"
        )
    boxes = observation_space.spaces.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(
            f"sac_continuous_action.py needs Box (or Dict of Box) observations but {args.env_id} has {observation_space}"
        )


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
    # SAME_STEP: an env that ends an episode resets at once and returns the true final
    # observation in infos["final_obs"]. copy=False skips a deepcopy: the returned observation
    # array is overwritten by the next step, so the loop keeps its own copy.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


# --- actions: the squashed Gaussian and the Box bounds -----------------------------------------


def action_scale_and_bias(low: np.ndarray, high: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The affine map from [-1, 1] onto [low, high]: scale = (high - low) / 2, bias = (high + low) / 2."""
    low, high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
    return (high - low) / 2.0, (high + low) / 2.0


def to_env_action(squashed: torch.Tensor, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """A squashed action in [-1, 1] -> the environment's bounds."""
    return squashed * action_scale + action_bias


def from_env_action(action: torch.Tensor, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """An action within the environment's bounds -> [-1, 1] (the inverse of to_env_action)."""
    return (action - action_bias) / action_scale


def random_actions(num_envs: int, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """Uniformly random actions within the bounds (the warm-up before learning_starts), drawn
    with torch's RNG on the device of action_scale."""
    uniform = torch.rand((num_envs, len(action_scale)), device=action_scale.device) * 2.0 - 1.0
    return to_env_action(uniform, action_scale, action_bias)


def squashed_gaussian_log_prob(
    u: torch.Tensor, noise: torch.Tensor, log_std: torch.Tensor, action_scale: torch.Tensor
) -> torch.Tensor:
    """log density of the action a = tanh(u) * action_scale + action_bias, where
    u = mean + exp(log_std) * noise and noise ~ N(0, I), summed over action dimensions.

    Change of variables: log pi(a) = log N(u; mean, std) - sum log |da/du|, with
    log N(u; mean, std) = -noise^2 / 2 - log_std - log(2 pi) / 2 and
    log |da/du| = log action_scale + log(1 - tanh(u)^2). The last term is computed in the
    numerically stable form 2 * (log 2 - u - softplus(-2u)): no epsilon, and exact where tanh(u)
    rounds to +-1.
    """
    normal_log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_abs_det = torch.log(action_scale) + 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (normal_log_prob - log_abs_det).sum(-1)


def soft_q_target(
    rewards: torch.Tensor,
    terminations: torch.Tensor,
    next_q_min: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """r + gamma * (min_i Q_target_i(s', a') - alpha * log pi(a'|s')) with a' ~ pi(.|s'), the
    bootstrap dropped where the episode terminated. A truncated transition keeps its bootstrap:
    its s' is the true final observation."""
    return rewards + gamma * (1.0 - terminations) * (next_q_min - alpha * next_log_prob)


# --- networks ------------------------------------------------------------------------------------


class TwinQNetwork(nn.Module):
    """Q1 and Q2, two 256x256 ReLU MLPs on (observation, action), held as stacked weights.

    weights[l][i] and biases[l][i] are layer l of critic i (out x in, like nn.Linear's weight).
    Both critics run as one batched matrix product per layer (torch.baddbmm): half the calls of
    two separate networks, and one fused Adam / lerp over 6 tensors instead of 12. Activations
    are columns, [critic, features, batch], so that a layer is h' = W h + b and every weight
    gradient comes out in the weight's own layout (no transposed copy per backward). Each critic
    is initialised like nn.Linear (uniform in +-1/sqrt(fan_in)), independently.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, num_critics: int = 2):
        super().__init__()
        sizes = [obs_dim + act_dim, hidden, hidden, 1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(num_critics, fan_out, fan_in).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(num_critics, fan_out, 1).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """Q-values of each critic, shape [num_critics, batch]. frozen: gradients flow to the
        inputs only, not to the critics' weights (the actor's loss needs dQ/da alone)."""
        h = torch.cat([obs, actions], dim=-1).T  # [features, batch]
        h = h.unsqueeze(0).expand(len(self.weights[0]), *h.shape)  # the same input for every critic
        for layer, (w, b) in enumerate(zip(self.weights, self.biases)):
            if frozen:
                w, b = w.detach(), b.detach()
            h = torch.baddbmm(b, w, h)  # b + W h, per critic
            if layer < len(self.weights) - 1:
                h = torch.relu_(h)
        return h.squeeze(1)


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy: a 256x256 ReLU MLP giving the mean and log std of u,
    then a = tanh(u) * action_scale + action_bias, within the environment's bounds."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, hidden: int = 256):
        super().__init__()
        act_dim = len(action_low)
        self.fc1 = nn.Linear(obs_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc_mean = nn.Linear(hidden, act_dim)
        self.fc_logstd = nn.Linear(hidden, act_dim)
        action_scale, action_bias = action_scale_and_bias(action_low, action_high)
        self.register_buffer("action_scale", action_scale)
        self.register_buffer("action_bias", action_bias)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Functional calls on the layers' parameters: the same maths as nn.Sequential, without a
        # module call per layer; ReLU in place (linear's backward does not need its output).
        x = torch.relu_(F.linear(obs, self.fc1.weight, self.fc1.bias))
        x = torch.relu_(F.linear(x, self.fc2.weight, self.fc2.bias))
        mean = F.linear(x, self.fc_mean.weight, self.fc_mean.bias)
        log_std = torch.tanh(F.linear(x, self.fc_logstd.weight, self.fc_logstd.bias))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)  # from (-1, 1) into the bounds
        return mean, log_std

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action (differentiable in the parameters) and its log-probability."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        action = to_env_action(torch.tanh(u), self.action_scale, self.action_bias)
        return action, squashed_gaussian_log_prob(u, noise, log_std, self.action_scale)

    def mean_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action used for evaluation: tanh of the mean, within the bounds."""
        mean, _ = self(obs)
        return to_env_action(torch.tanh(mean), self.action_scale, self.action_bias)


class ReplayBuffer:
    """The last `buffer_size` transitions, circular, in one tensor on the training device.

    Each row is one transition: obs | next_obs | action | reward | termination. A step of all
    environments is assembled in a host staging array and written with one host-to-device copy;
    a minibatch is one gather.
    """

    def __init__(self, buffer_size: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device):
        self.buffer_size, self.obs_dim, self.act_dim = buffer_size, obs_dim, act_dim
        self.data = torch.zeros((buffer_size, 2 * obs_dim + act_dim + 2), device=device)
        self.staging = np.zeros((num_envs, 2 * obs_dim + act_dim + 2), dtype=np.float32)
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
        d, a, n = self.obs_dim, self.act_dim, len(obs)
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
        """A uniform minibatch (with replacement): obs, next_obs, actions, rewards, terminations."""
        indices = torch.randint(self.size, (batch_size,), device=self.data.device)
        batch = torch.index_select(self.data, 0, indices)
        d, a = self.obs_dim, self.act_dim
        return (
            batch[:, :d],
            batch[:, d : 2 * d],
            batch[:, 2 * d : 2 * d + a],
            batch[:, 2 * d + a],
            batch[:, 2 * d + a + 1],
        )

    def state_dict(self) -> dict:
        return {"data": self.data[: self.size].cpu(), "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.data[: self.size].copy_(state["data"])


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its deterministic
    policy (the squashed mean action)."""
    model = load_model(model_path, "sac_continuous_action")
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
    action_space = envs.single_action_space
    act_dim = int(action_space.shape[0])

    actor = Actor(obs_dim, action_space.low, action_space.high).to(device)
    qf = TwinQNetwork(obs_dim, act_dim).to(device)
    qf_target = TwinQNetwork(obs_dim, act_dim).to(device)
    qf_target.load_state_dict(qf.state_dict())
    target_params, online_params = list(qf_target.parameters()), list(qf.parameters())

    # Automatic entropy tuning: alpha = exp(log_alpha), trained so that the policy's entropy
    # approaches -|A|. alpha is a device tensor updated in place: no host read per step.
    target_entropy = -float(act_dim)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    alpha = log_alpha.detach().exp() if args.autotune else torch.tensor(args.alpha, device=device)
    q_optimizer = torch.optim.Adam(qf.parameters(), lr=args.q_lr, fused=True)
    # One Adam for the policy and log_alpha, each with its own learning rate: the actor loss and
    # the alpha loss touch disjoint parameters, so one backward and one step of their sum do
    # exactly what two separate steps would, in one pass.
    actor_groups = [{"params": list(actor.parameters()), "lr": args.policy_lr}]
    if args.autotune:
        actor_groups.append({"params": [log_alpha], "lr": args.q_lr})
    actor_optimizer = torch.optim.Adam(actor_groups, fused=True)

    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, act_dim, device)

    def critic_losses(obs, next_obs, actions, rewards, terminations):
        """The MSE of each critic towards the soft Q target, and each critic's mean Q-value."""
        with torch.no_grad():
            next_actions, next_log_prob = actor.sample(next_obs)
            next_q_min = qf_target(next_obs, next_actions).amin(0)
            target = soft_q_target(rewards, terminations, next_q_min, next_log_prob, alpha, args.gamma)
        q_values = qf(obs, actions)  # [2, batch]
        return ((q_values - target) ** 2).mean(1), q_values.detach().mean(1)

    def actor_losses(obs):
        """The policy loss, and the alpha loss (with --autotune) on the same log-probabilities."""
        actions, log_prob = actor.sample(obs)
        min_q = qf(obs, actions, frozen=True).amin(0)
        actor_loss = (alpha * log_prob - min_q).mean()
        alpha_loss = (-log_alpha.exp() * (log_prob.detach() + target_entropy)).mean()
        return actor_loss, alpha_loss

    if args.compile:
        critic_losses, actor_losses = torch.compile(critic_losses), torch.compile(actor_losses)

    # `critic_stats` / `actor_stats` hold the latest gradient step's device tensors, read back
    # only when logged.
    global_step, next_log, critic_stats, actor_stats = 0, LOG_EVERY, None, None
    obs_np, _ = envs.reset(seed=args.seed)
    if checkpoint:
        actor.load_state_dict(checkpoint["actor"])
        qf.load_state_dict(checkpoint["qf"])
        qf_target.load_state_dict(checkpoint["qf_target"])
        q_optimizer.load_state_dict(checkpoint["q_optimizer"])
        actor_optimizer.load_state_dict(checkpoint["actor_optimizer"])
        with torch.no_grad():
            log_alpha.copy_(checkpoint["log_alpha"])
            alpha.copy_(log_alpha.exp() if args.autotune else torch.tensor(args.alpha))
        rb.load_state_dict(checkpoint["replay_buffer"])
        envs = restore_envs(envs, checkpoint["envs"])
        if checkpoint["envs"] is None:
            print(
                "the environments could not be saved with the checkpoint (video recording?): resuming with fresh ones"
            )
        else:
            obs_np = checkpoint["next_obs"]
        restore_rng_state(checkpoint["rng"])
        global_step, next_log = checkpoint["global_step"], checkpoint["next_log"]
        critic_stats, actor_stats = (
            None if s is None else tuple(t.to(device) for t in s)
            for s in (checkpoint["critic_stats"], checkpoint["actor_stats"])
        )
    obs_np = obs_np.astype(np.float32).reshape(args.num_envs, obs_dim)

    def write_checkpoint() -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            next_log=next_log,
            actor=actor.state_dict(),
            qf=qf.state_dict(),
            qf_target=qf_target.state_dict(),
            q_optimizer=q_optimizer.state_dict(),
            actor_optimizer=actor_optimizer.state_dict(),
            log_alpha=log_alpha.detach().cpu(),
            replay_buffer=rb.state_dict(),
            envs=snapshot_envs(envs),
            next_obs=obs_np,
            critic_stats=None if critic_stats is None else tuple(t.cpu() for t in critic_stats),
            actor_stats=None if actor_stats is None else tuple(t.cpu() for t in actor_stats),
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    start_time, start_step = time.time(), global_step

    while global_step < args.total_timesteps:
        # Act: uniformly random actions (drawn with torch's RNG on the device) until
        # learning_starts, then samples of the policy. One host-to-device copy of the
        # observations, one device-to-host copy of the actions.
        if global_step < args.learning_starts:
            actions = random_actions(args.num_envs, actor.action_scale, actor.action_bias)
        else:
            with torch.no_grad():
                actions, _ = actor.sample(torch.from_numpy(obs_np).to(device))
        actions = actions.cpu().numpy()
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        next_obs_np = next_obs_np.reshape(args.num_envs, obs_dim)
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        if "episode" in infos:
            finished = infos["_episode"]
            for episodic_return, episodic_length in zip(
                infos["episode"]["r"][finished], infos["episode"]["l"][finished]
            ):
                writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                writer.add_scalar("charts/episodic_length", episodic_length, global_step)
            progress.add_returns(infos["episode"]["r"][finished])

        # Learn: one gradient step of the critics per environment step t > learning_starts
        # (num_envs of them per vector step); every policy_frequency-th, policy_frequency steps
        # of the policy; every target_network_frequency-th, a Polyak update of the targets.
        for t in range(max(previous_step, args.learning_starts) + 1, global_step + 1):
            batch = rb.sample(args.batch_size)
            qf_losses, q_values = critic_losses(*batch)
            q_optimizer.zero_grad()
            qf_losses.sum().backward()
            q_optimizer.step()
            critic_stats = (q_values, qf_losses.detach())
            if t % args.policy_frequency == 0:
                for _ in range(args.policy_frequency):
                    actor_loss, alpha_loss = actor_losses(batch[0])
                    actor_optimizer.zero_grad()
                    # The two losses touch disjoint parameters: one backward serves both.
                    (actor_loss + alpha_loss if args.autotune else actor_loss).backward()
                    actor_optimizer.step()
                    if args.autotune:
                        alpha.copy_(log_alpha.detach().exp())
                    actor_stats = (actor_loss.detach(), alpha_loss.detach())
            if t % args.target_network_frequency == 0:
                with torch.no_grad():
                    torch._foreach_lerp_(target_params, online_params, args.tau)

        # Logging: one device-to-host read every LOG_EVERY steps.
        if global_step >= next_log:
            next_log = (global_step // LOG_EVERY + 1) * LOG_EVERY
            stats = {}
            if critic_stats is not None:
                names = ["losses/qf1_values", "losses/qf2_values", "losses/qf1_loss", "losses/qf2_loss", "losses/alpha"]
                stats.update(zip(names, torch.cat([*critic_stats, alpha.view(1)]).tolist()))
                stats["losses/qf_loss"] = (stats["losses/qf1_loss"] + stats["losses/qf2_loss"]) / 2.0
            if actor_stats is not None:
                names = ["losses/actor_loss", "losses/alpha_loss"] if args.autotune else ["losses/actor_loss"]
                stats.update(zip(names, torch.stack(actor_stats).tolist()))
            for name, value in stats.items():
                writer.add_scalar(name, value, global_step)
            for name, value in stats.items():
                if not np.isfinite(value):
                    path = write_checkpoint()
                    fail(f"{name} is {value} at step {global_step}; checkpoint written to {path}")
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
        save_model(model_path, args, actor=actor.state_dict(), qf=qf.state_dict(), obs_dim=obs_dim, act_dim=act_dim)
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
