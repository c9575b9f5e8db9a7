"""Proximal Policy Optimization (PPO) for continuous actions.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347),
with the continuous-control details of Huang et al. 2022, "The 37 Implementation Details of PPO":
a Gaussian policy whose mean is a 64x64 tanh MLP and whose log standard deviation is a
state-independent parameter, a separate 64x64 tanh value network, GAE, clipped surrogate, value
clipping, advantage normalisation, learning-rate annealing, global gradient clipping,
observations normalised by running statistics and clipped to [-10, 10], rewards divided by the
running standard deviation of the discounted return and clipped to [-10, 10]. Actions are
clipped to the environment's bounds when stepping; the unclipped sample is what is stored and
scored by the policy.

Action space: a one-dimensional Box. Observations: a Box, or a Dict of Boxes (flattened).
Environments: gymnasium MuJoCo v5 (Hopper-v5, HalfCheetah-v5, Walker2d-v5, Ant-v5,
Humanoid-v5 ...), dm_control through shimmy (dm_control/cheetah-run-v0 ...), Pendulum-v1.

    uv run python cleanrl/ppo_continuous_action.py --env-id Hopper-v5

Expect about CleanRL's published MuJoCo v4 figures after 1M steps (Hopper ~2,400,
HalfCheetah ~1,400, Walker2d ~2,300; 3 seeds); what this script measured is in
benchmark/results/ppo_continuous_action.md (commands in benchmark/ppo_continuous_action.sh).

Normalisation. One set of statistics is shared by all environments and lives on the training
device: a RunningMeanStd of the observations, updated with every observation the policy acts on
(the policy sees the freshest statistics, as with gymnasium's NormalizeObservation), and a
RunningMeanStd of the discounted return, updated once per rollout with all its returns before
the rollout's rewards are scaled. Both are part of the model: they go into checkpoints and into
the saved model, and evaluation uses the saved observation statistics frozen.

Environments reset in the same step an episode ends (gymnasium's SAME_STEP autoreset); a
time-limit truncation is bootstrapped with the value of the true final observation, and only
a termination cuts the return. MuJoCo and classic-control simulators are saved into
checkpoints (MuJoCo through its integration state), so a resumed run on the CPU continues
exactly as the uninterrupted one would. dm_control environments cannot be saved: a resumed
dm_control run continues with freshly reset environments (and says so).
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
    torch_threads: int = 1
    """CPU threads for torch; small MLPs run fastest on one (thread hand-offs cost more than they save)"""
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
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
    clip_obs: float = 10.0
    """normalised observations are clipped to [-clip_obs, clip_obs]"""
    clip_reward: float = 10.0
    """scaled rewards are clipped to [-clip_reward, clip_reward]"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


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
        num_steps=args.num_steps,
        num_minibatches=args.num_minibatches,
        update_epochs=args.update_epochs,
        learning_rate=args.learning_rate,
        clip_obs=args.clip_obs,
        clip_reward=args.clip_reward,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch of {args.batch_size} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps})"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {args.batch_size} steps")
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
        fail(
            f"ppo_continuous_action.py handles Box (continuous) actions but {args.env_id} has {action_space}; use cleanrl/ppo.py"
        )
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        fail(f"ppo_continuous_action.py needs a one-dimensional Box action space but {args.env_id} has {action_space}")
    boxes = observation_space.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(
            f"ppo_continuous_action.py needs Box (or Dict of Box) observations but {args.env_id} has {observation_space}"
        )


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        if not isinstance(env.observation_space, gym.spaces.Box) or len(env.observation_space.shape) != 1:
            env = gym.wrappers.FlattenObservation(env)  # dm_control's Dict observations
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    register_env_family(env_id)
    # SAME_STEP: an env that ends an episode resets at once and returns the true final
    # observation in infos["final_obs"]. copy=False skips a deepcopy; we copy obs to torch anyway.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def action_bounds(envs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The action space's bounds as float32 device tensors. Actions are clipped to them on the way
    to the environment; the policy's unclipped sample is what the rollout stores and the update scores."""
    space = envs.single_action_space
    return (
        torch.as_tensor(space.low, dtype=torch.float32, device=device),
        torch.as_tensor(space.high, dtype=torch.float32, device=device),
    )


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches, on the training device, in float64.

    update(batch) merges the statistics of a batch [N, *shape] into the running ones with the
    parallel-variance formula (Chan, Golub and LeVeque 1979), so they equal the mean and the
    (population) variance of all batches concatenated. As in gymnasium, the count starts at
    `epsilon` with mean 0 and variance 1. The count is an exact host-side number that goes into
    the state dict with the tensors.
    """

    def __init__(self, shape: tuple[int, ...] | int = (), epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.count = epsilon

    def update(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        batch_var, batch_mean = torch.var_mean(batch, dim=0, correction=0)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean.add_(delta, alpha=n / total)
        # var = (var * count + batch_var * n + delta^2 * count * n / total) / total, in place
        self.var.mul_(self.count / total).add_(batch_var, alpha=n / total).addcmul_(
            delta, delta, value=self.count * n / total**2
        )
        self.count = total

    def normalize(self, x: torch.Tensor, clip: float) -> torch.Tensor:
        """(x - mean) / std, clipped to [-clip, clip], as float32; leaves the statistics as they are."""
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp_(-clip, clip).float()

    def get_extra_state(self) -> dict:
        return {"count": self.count}

    def set_extra_state(self, state: dict) -> None:
        self.count = state["count"]


class RewardScaler(nn.Module):
    """Divides rewards by the running standard deviation of the discounted return, then clips.

    The discounted return G_t = r_t + gamma * G_{t-1} is tracked per environment and restarts
    after an episode ends (termination or truncation); one RunningMeanStd of G is shared by all
    environments. It runs once per rollout on the device: the rollout's returns enter the
    statistics, then all its rewards are divided by the updated standard deviation.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float):
        super().__init__()
        self.return_rms = RunningMeanStd(())
        # The part of each environment's return that carries into its next step: gamma * G of
        # the ongoing episode, 0 right after an episode ended.
        self.register_buffer("carry", torch.zeros(num_envs))
        self.gamma, self.clip = gamma, clip

    def forward(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """Scaled rewards for a [num_steps, num_envs] rollout; `dones` marks the steps that end an episode."""
        carries = self.gamma * (1.0 - dones)
        returns = [rewards[0] + self.carry]
        # One fused op per step (G_t = r_t + carries_{t-1} * G_{t-1}); the steps are stacked once.
        for reward, carry in zip(rewards[1:].unbind(0), carries[:-1].unbind(0)):
            returns.append(torch.addcmul(reward, carry, returns[-1]))
        self.carry.copy_(carries[-1] * returns[-1])
        self.return_rms.update(torch.stack(returns).reshape(-1))
        scaled = rewards / torch.sqrt(self.return_rms.var + 1e-8)
        return scaled.clamp_(-self.clip, self.clip).to(rewards.dtype)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """A Gaussian policy N(mean(obs), exp(logstd)^2), its log standard deviation a parameter that
    does not depend on the state, and a separate value network; both 64x64 tanh MLPs."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic_fc1 = layer_init(nn.Linear(obs_dim, 64))
        self.critic_fc2 = layer_init(nn.Linear(64, 64))
        self.critic_out = layer_init(nn.Linear(64, 1), std=1.0)
        self.actor_fc1 = layer_init(nn.Linear(obs_dim, 64))
        self.actor_fc2 = layer_init(nn.Linear(64, 64))
        self.actor_mean = layer_init(nn.Linear(64, act_dim), std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(act_dim))
        self.log_normaliser = 0.5 * act_dim * math.log(2 * math.pi)

    # Functional calls on the layers' parameters: the same maths as nn.Sequential, without a
    # module call per layer, which costs more than the matrix products at this size.
    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shaped [..., 1]."""
        x = torch.tanh(F.linear(obs, self.critic_fc1.weight, self.critic_fc1.bias))
        x = torch.tanh(F.linear(x, self.critic_fc2.weight, self.critic_fc2.bias))
        return F.linear(x, self.critic_out.weight, self.critic_out.bias)

    def action_mean(self, obs: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(F.linear(obs, self.actor_fc1.weight, self.actor_fc1.bias))
        x = torch.tanh(F.linear(x, self.actor_fc2.weight, self.actor_fc2.bias))
        return F.linear(x, self.actor_mean.weight, self.actor_mean.bias)

    def sample_action(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """mean(obs) + std * noise, with standard normal `noise` drawn by the caller (a whole
        rollout's at once). Only the action is needed while stepping; log-probabilities and
        values of the whole rollout are computed afterwards in one batched pass."""
        return torch.addcmul(self.action_mean(obs), self.actor_logstd.exp(), noise)

    def log_prob_and_value(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(actions | obs) summed over the action dimensions, and V(obs); both [..., 1].
        One pass through each network serves the policy and the value loss."""
        z = (actions - self.action_mean(obs)) * torch.exp(-self.actor_logstd)
        log_prob = -0.5 * z.square().sum(-1, keepdim=True) - (self.actor_logstd.sum() + self.log_normaliser)
        return log_prob, self.get_value(obs)

    def entropy(self) -> torch.Tensor:
        """The policy's entropy, the same in every state: sum(logstd) + d/2 * log(2 pi e)."""
        return self.actor_logstd.sum() + self.log_normaliser + 0.5 * self.actor_logstd.numel()


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` transitions.

    Observations (normalised, as the policy saw them) and actions (the unclipped samples) live
    on the training device, since the policy needs them each step. Rewards and episode ends come
    from the CPU simulator and are staged in host arrays, then copied to the device once per
    rollout rather than once per step.
    """

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.actions = torch.zeros((num_steps, num_envs, act_dim), device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        # The true final observation (normalised when it arrived) of an episode truncated at
        # step t; zeros elsewhere. Written only at truncations, which are rare.
        self.final_obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.device = device

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> torch.Tensor:
    """Generalized advantage estimates for a [num_steps, num_envs] rollout.

    next_values[t] is the value of the observation that followed step t: the true final
    observation where an episode ended at t. A termination zeroes that bootstrap; a truncation
    keeps it. Either one stops the advantage from flowing back across the episode boundary.
    """
    bootstrap = 1.0 - terminations
    episode_continues = 1.0 - torch.maximum(terminations, truncations)
    deltas = rewards + gamma * next_values * bootstrap - values
    decays = gamma * gae_lambda * episode_continues
    # A_t = delta_t + decay_t * A_{t+1}: one fused op per step, collected and stacked once.
    advantages = [deltas[-1]]
    for delta, decay in zip(reversed(deltas[:-1].unbind(0)), reversed(decays[:-1].unbind(0))):
        advantages.append(torch.addcmul(delta, decay, advantages[-1]))
    return torch.stack(advantages[::-1])


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
    deterministic: bool = True,
) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its policy (the
    mean action; deterministic=False samples), on observations normalised with the saved
    statistics, which stay frozen."""
    model = load_model(model_path, "ppo_continuous_action")
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_dim"], model["act_dim"]).to(device)
    agent.load_state_dict(model["agent"])
    obs_rms = RunningMeanStd(model["obs_dim"]).to(device)
    obs_rms.load_state_dict(model["obs_rms"])
    clip_obs = model["args"]["clip_obs"]
    action_low, action_high = action_bounds(envs, device)
    obs_np, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            obs = obs_rms.normalize(torch.as_tensor(obs_np, device=device), clip_obs)
            if deterministic:
                actions = agent.action_mean(obs)
            else:
                actions = agent.sample_action(obs, torch.randn((1, model["act_dim"]), device=device))
            obs_np, _, _, _, infos = envs.step(actions.clamp(action_low, action_high).cpu().numpy())
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
    act_dim = int(np.prod(envs.single_action_space.shape))
    action_low, action_high = action_bounds(envs, device)

    agent = Agent(obs_dim, act_dim).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    params = list(agent.parameters())
    obs_rms = RunningMeanStd(obs_dim).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.clip_reward).to(device)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_dim, act_dim, device)

    global_step, start_iteration = 0, 1
    next_obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    next_obs = None
    if checkpoint:
        agent.load_state_dict(checkpoint["agent"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        obs_rms.load_state_dict(checkpoint["obs_rms"])
        reward_scaler.load_state_dict(checkpoint["reward_scaler"])
        envs = restore_envs(envs, checkpoint["envs"])
        if checkpoint["envs"] is None:
            print(
                "the environments could not be saved with the checkpoint (dm_control, video recording): resuming with fresh ones"
            )
            reward_scaler.carry.zero_()  # the fresh environments start new episodes
        else:
            next_obs = torch.as_tensor(checkpoint["next_obs"], device=device)
        restore_rng_state(checkpoint["rng"])
        global_step, start_iteration = checkpoint["global_step"], checkpoint["iteration"] + 1
    if next_obs is None:
        raw_obs = torch.as_tensor(next_obs_np, device=device).view(args.num_envs, obs_dim)
        obs_rms.update(raw_obs)
        next_obs = obs_rms.normalize(raw_obs, args.clip_obs)

    def write_checkpoint(iteration: int) -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            iteration=iteration,
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict(),
            reward_scaler=reward_scaler.state_dict(),
            envs=snapshot_envs(envs),
            next_obs=next_obs.cpu().numpy(),
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    start_time, start_step = time.time(), global_step
    columns = [obs_dim, act_dim, 1, 1, 1, 1]  # obs | action | log-prob | advantage | return | value
    advantage_column = obs_dim + act_dim + 1

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # Rollout: one host-to-device copy of the observations and one device-to-host copy of
        # the actions per step; everything else is staged and moved once per rollout.
        with torch.no_grad():
            noise = torch.randn((args.num_steps, args.num_envs, act_dim), device=device)
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                action = agent.sample_action(next_obs, noise[step])
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(
                    action.clamp(action_low, action_high).cpu().numpy()
                )
                raw_obs = torch.as_tensor(next_obs_np, device=device).view(args.num_envs, obs_dim)
                obs_rms.update(raw_obs)
                next_obs = obs_rms.normalize(raw_obs, args.clip_obs)
                storage.rewards[step] = reward
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                # Bootstrapping needs the true final observation only where the time limit cut an episode.
                bootstrap_final = truncated & ~terminated
                if bootstrap_final.any():
                    final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap_final]), device=device)
                    storage.final_obs[step, torch.as_tensor(bootstrap_final, device=device)] = obs_rms.normalize(
                        final_obs.view(-1, obs_dim), args.clip_obs
                    )
                if "episode" in infos:
                    finished = infos["_episode"]
                    for episodic_return, episodic_length in zip(
                        infos["episode"]["r"][finished], infos["episode"]["l"][finished]
                    ):
                        writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                        writer.add_scalar("charts/episodic_length", episodic_length, global_step)
                    progress.add_returns(infos["episode"]["r"][finished])

            # Rewards scaled, then values and log-probabilities of the whole rollout in batched passes.
            terminations = storage.to_device(storage.terminations)
            truncations = storage.to_device(storage.truncations)
            rewards = reward_scaler(storage.to_device(storage.rewards), torch.maximum(terminations, truncations))
            logprobs, values = agent.log_prob_and_value(storage.obs, storage.actions)
            logprobs, values = logprobs.squeeze(-1), values.squeeze(-1)
            next_values = torch.cat([values[1:], agent.get_value(next_obs).view(1, args.num_envs)])
            if storage.truncations.any():
                final_values = agent.get_value(storage.final_obs).squeeze(-1)
                next_values = torch.where(truncations * (1 - terminations) > 0, final_values, next_values)
                storage.final_obs.zero_()
            advantages = compute_gae(
                rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            returns = advantages + values
            # The whole batch in one tensor, so a minibatch is a slice of one shuffled copy.
            b_data = torch.cat(
                [
                    storage.obs.view(args.batch_size, obs_dim),
                    storage.actions.view(args.batch_size, act_dim),
                    logprobs.view(-1, 1),
                    advantages.view(-1, 1),
                    returns.view(-1, 1),
                    values.view(-1, 1),
                ],
                dim=1,
            )
            b_returns, b_values = returns.view(-1), values.view(-1)

        # Optimise the policy and value network
        ratios = []  # detached, for the clip fraction at logging time
        for epoch in range(args.update_epochs):
            # One gather per epoch: the shuffled batch, cut into contiguous minibatches.
            b_shuffled = b_data[torch.randperm(args.batch_size, device=device)]
            if args.norm_adv:
                # Each minibatch's advantages normalised by its own mean and std, all minibatches in one go.
                mb_advantages = b_shuffled[:, advantage_column].view(args.num_minibatches, args.minibatch_size)
                adv_std, adv_mean = torch.std_mean(mb_advantages, dim=1, keepdim=True)
                b_shuffled[:, advantage_column] = ((mb_advantages - adv_mean) / (adv_std + 1e-8)).view(-1)
            for minibatch in b_shuffled.split(args.minibatch_size):
                mb_obs, mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values = minibatch.split(columns, dim=1)
                newlogprob, newvalue = agent.log_prob_and_value(mb_obs, mb_actions)
                logratio = newlogprob - mb_logprobs
                ratio = logratio.exp()
                ratios.append(ratio.detach())

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - mb_returns) ** 2
                    v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (v_clipped - mb_returns) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()

                loss = pg_loss + v_loss * args.vf_coef
                if args.ent_coef != 0:  # the entropy does not depend on the state: no per-sample term
                    loss = loss - args.ent_coef * agent.entropy()

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()

            # The KL estimates of the epoch's last minibatch (http://joschu.net/blog/kl-approx.html).
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # Logging: one device-to-host read per iteration.
        with torch.no_grad():
            var_y = b_returns.var()
            explained_var = torch.where(var_y == 0, torch.nan, 1 - (b_returns - b_values).var() / var_y)
            stats = torch.stack(
                [
                    v_loss,
                    pg_loss,
                    agent.entropy(),
                    old_approx_kl,
                    approx_kl,
                    ((torch.cat(ratios) - 1.0).abs() > args.clip_coef).float().mean(),
                    explained_var,
                ]
            ).tolist()
        for name, value in zip(
            ["value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "explained_variance"],
            stats,
        ):
            writer.add_scalar(f"losses/{name}", value, global_step)
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
        progress.update(global_step)

        for name, value in zip(["value_loss", "policy_loss", "entropy"], stats):
            if not np.isfinite(value):
                path = write_checkpoint(iteration)
                fail(
                    f"losses/{name} is {value} at step {global_step} (iteration {iteration}); checkpoint written to {path}"
                )
        if stop or (next_checkpoint is not None and global_step >= next_checkpoint):
            path = write_checkpoint(iteration)
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
            agent=agent.state_dict(),
            obs_rms=obs_rms.state_dict(),
            return_rms=reward_scaler.return_rms.state_dict(),
            obs_dim=obs_dim,
            act_dim=act_dim,
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
