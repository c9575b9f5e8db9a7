"""Proximal Policy Optimization (PPO) with thousands of environments simulated together on one device.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347), in the massively
parallel setting of Makoviychuk et al. 2021, "Isaac Gym" (https://arxiv.org/abs/2108.10470), and Rudin et al. 2021:
4096 envs x 16 steps, 2 minibatches, 4 epochs, learning rate 0.0026, value coefficient 2, gradient norm 1, a Gaussian
policy and a value network of 256x256 tanh MLPs, observations normalised by running statistics (saved with the
model), rewards times --reward-scaler. Observations, actions, rewards and episode statistics never leave the device;
scalars are read back every --log-every iterations. Truncations are bootstrapped with the true final observation.

Action space: a one-dimensional Box. `--simulator` (cleanrl_utils/envs/; auto: Isaac Gym when importable, else
MuJoCo Warp): MuJoCo Warp (Ant, Humanoid, Hopper, HalfCheetah, Walker2d with gymnasium's v5 dynamics and rewards; CPU
too, slowly), envpool's C++ v5 tasks and gymnasium's vector envs (the same names, Ant -> Ant-v5: the CPU paths, GPU
defaults unchanged), Isaac Gym through isaacgymenvs, or mjlab's tasks (own uv project, projects/mjlab; as rsl_rl trains
them, the value network sees the task's privileged "critic" observations, the policy its "actor" ones, each set
normalised by its own statistics). MuJoCo Warp's and gymnasium's states are checkpointed (resume is exact on the CPU);
Isaac Gym's, envpool's and mjlab's are not: a resumed run says so and continues with freshly reset environments.

    uv run python cleanrl/ppo_isaacgym.py --env-id Ant
    uv run python cleanrl/ppo_isaacgym.py --env-id Ant --simulator envpool   # on a CPU
    uv run --project projects/mjlab python cleanrl/ppo_isaacgym.py --simulator mjlab --env-id Mjlab-Cartpole-Balance

Expect Isaac Gym Ant ~3,950 after 240 s on a GPU (CleanRL's figure); CPU runs: benchmark/results/ppo_isaacgym_cpu.md.
"""

import copy
import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

# Not X | None, list[...]: Isaac Gym runs on Python 3.8.
from typing import Dict, List, Literal, NamedTuple, Optional, Tuple, Union

import numpy as np

# Isaac Gym refuses to load once torch is imported: when it is installed, it goes first.
if importlib.util.find_spec("isaacgym") is not None:
    import isaacgym  # noqa: F401

import torch
import torch.nn as nn
import tyro
from torch.distributions import Normal

from cleanrl_utils.checkpoint import load_model, restore_rng_state, rng_state
from cleanrl_utils.envs.envpool_mujoco_env import ENVPOOL_TASKS, EnvPoolMuJoCoVecEnv
from cleanrl_utils.envs.gymnasium_vec_env import GymnasiumVecEnv
from cleanrl_utils.envs.isaacgym_env import (
    ISAACGYM_INSTALL,
    ISAACGYM_TASKS,
    IsaacGymVecEnv,
    isaacgym_available,
    isaacgym_tasks,
)
from cleanrl_utils.envs.mjlab_env import MjlabVecEnv, task_problem
from cleanrl_utils.envs.mujoco_warp_env import WARP_TASKS, MuJoCoWarpVecEnv
from cleanrl_utils.errors import check_positive, fail
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
    torch_threads: int = 1
    """CPU threads for torch (on the CPU, Warp's kernels run on one thread anyway)"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: Optional[str] = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported by this script (Isaac Gym renders through its own viewer); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: Optional[str] = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "Ant"
    """the task: Isaac Gym's task names (MuJoCo Warp: Ant, Humanoid, Hopper, HalfCheetah, Walker2d; envpool and
    gymnasium: those and HumanoidStandup, InvertedDoublePendulum, InvertedPendulum, Pusher, Reacher, Swimmer, each
    name onto its v5 id: Ant -> Ant-v5)"""
    total_timesteps: int = 30000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    simulator: Literal["auto", "isaacgym", "mujoco-warp", "envpool", "gymnasium", "mjlab"] = "auto"
    """the simulator: auto takes Isaac Gym when it is importable, MuJoCo Warp otherwise; envpool (C++ MuJoCo, the
    fastest on a CPU) and gymnasium (SyncVectorEnv) run the MuJoCo tasks on the CPU; mjlab its robot tasks (run with
    `uv run --project projects/mjlab`)"""
    envpool_threads: int = 0
    """envpool: its worker threads (0: envpool's choice, one per core)"""
    nconmax: Optional[int] = None
    """MuJoCo Warp and mjlab: contact slots per world, pooled across worlds (None: the task's default)"""
    njmax: Optional[int] = None
    """MuJoCo Warp and mjlab: constraint rows per world (None: the task's default)"""
    learning_rate: float = 0.0026
    """the learning rate of the optimizer"""
    num_envs: int = 4096
    """the number of parallel environments (simulated together on the device)"""
    num_steps: int = 16
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = False
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 2
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = False
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 2.0
    """coefficient of the value function"""
    max_grad_norm: float = 1.0
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold (None: no early stop)"""
    norm_obs: bool = True
    """toggles observation normalisation by running statistics (see the docstring)"""
    clip_obs: float = 10.0
    """normalised observations are clipped to [-clip_obs, clip_obs]"""
    reward_scaler: float = 1.0
    """rewards are multiplied by this constant (CleanRL's Isaac Gym PPO)"""
    log_every: int = 10
    """read losses and episode statistics back to the host every this many iterations"""
    time_limit_seconds: float = 0.0
    """stop training after this many seconds of wall-clock time (0: no limit); for benchmarks"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""
    compile: bool = False
    """if toggled, compile the policy step, GAE and the update with torch.compile (slower to start)"""
    cudagraphs: bool = False
    """if toggled, also capture them in CUDA graphs (torch.compile's reduce-overhead mode; implies --compile; CUDA)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


# --- the simulators ---------------------------------------------------------------------------------


def resolve_simulator(simulator: str) -> str:
    if simulator == "auto":
        return "isaacgym" if isaacgym_available() else "mujoco-warp"
    return simulator


def known_tasks(simulator: str) -> List[str]:
    if simulator in ("envpool", "gymnasium"):  # gymnasium's v5 ids by their names (ENVPOOL_TASKS maps them)
        return list(ENVPOOL_TASKS)
    return list(WARP_TASKS) if simulator == "mujoco-warp" else isaacgym_tasks()


SIMULATOR_NAMES = {"isaacgym": "Isaac Gym (isaacgymenvs)", "mujoco-warp": "MuJoCo Warp"}
SIMULATOR_NAMES.update(
    envpool="envpool (C++ MuJoCo)", gymnasium="gymnasium (SyncVectorEnv)", mjlab="mjlab (MuJoCo Warp)"
)


def make_envs(
    simulator: str,
    env_id: str,
    num_envs: int,
    device: torch.device,
    seed: int,
    nconmax: Optional[int] = None,
    njmax: Optional[int] = None,
    envpool_threads: int = 0,
    random_episode_starts: bool = False,
):
    """random_episode_starts (mjlab; training, not evaluation): the first episodes start at random points of the time
    limit, as rsl_rl's runner starts mjlab's training, so that the time-outs of thousands of envs spread out."""
    if simulator == "isaacgym":
        return IsaacGymVecEnv(env_id, num_envs, device, seed)
    if simulator == "envpool":
        return EnvPoolMuJoCoVecEnv(env_id, num_envs, device, seed, num_threads=envpool_threads)
    if simulator == "gymnasium":
        return GymnasiumVecEnv(ENVPOOL_TASKS[env_id], num_envs, device, seed)
    if simulator == "mjlab":
        return MjlabVecEnv(env_id, num_envs, device, seed, None, random_episode_starts, nconmax, njmax)
    return MuJoCoWarpVecEnv(env_id, num_envs, device, seed, nconmax=nconmax, njmax=njmax)


def validate(args: Args) -> str:
    """Check the arguments and the simulator before any work; fail in one line. Returns the
    simulator that will run."""
    if (args.compile or args.cudagraphs) and not hasattr(torch, "compile"):
        fail(f"--compile and --cudagraphs need torch >= 2.0 (this is {torch.__version__}): drop them")
    if args.cudagraphs:
        if not (args.cuda and torch.cuda.is_available()):
            fail("--cudagraphs needs a CUDA GPU and none is in use; drop it (--compile works on the CPU)")
        args.compile = True  # the graphs are captured by torch.compile
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        num_minibatches=args.num_minibatches,
        update_epochs=args.update_epochs,
        learning_rate=args.learning_rate,
        clip_obs=args.clip_obs,
        log_every=args.log_every,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
    )
    if args.checkpoint_every < 0 or args.time_limit_seconds < 0 or args.envpool_threads < 0:
        fail(
            "--checkpoint-every, --time-limit-seconds and --envpool-threads must be 0 (off, or envpool's choice) or "
            f"positive, got {args.checkpoint_every}, {args.time_limit_seconds} and {args.envpool_threads}"
        )
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    if args.capture_video:
        fail("--capture-video is not supported by ppo_isaacgym.py; record videos with cleanrl/ppo_continuous_action.py")
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
    simulator = resolve_simulator(args.simulator)
    if simulator == "isaacgym" and not isaacgym_available():
        fail(ISAACGYM_INSTALL)
    if simulator == "mujoco-warp" and importlib.util.find_spec("mujoco_warp") is None:
        fail("--simulator mujoco-warp needs the mujoco-warp package (Python >= 3.11): uv sync")
    if simulator == "envpool" and importlib.util.find_spec("envpool") is None:
        fail("--simulator envpool needs the envpool package (Python >= 3.11): uv sync --extra envpool")
    buffers = {name: getattr(args, name) for name in ("nconmax", "njmax") if getattr(args, name) is not None}
    check_positive(**buffers)
    if buffers and simulator not in ("mujoco-warp", "mjlab"):
        fail(f"--nconmax and --njmax size MuJoCo Warp's buffers; {simulator} sizes its own: drop them")
    if simulator == "mjlab":  # mjlab missing, an unknown task, a Tracking task without its motion file ...
        problem = task_problem(args.env_id, "ppo_isaacgym.py")
        if problem is not None:
            fail(problem)
        return simulator
    tasks = known_tasks(simulator)
    if args.env_id not in tasks:
        hint = (
            " (an Isaac Gym task: install Isaac Gym, see the README)"
            if simulator == "mujoco-warp" and args.env_id in ISAACGYM_TASKS
            else ""
        )
        name = args.env_id.split("-v")[0]  # not str.removesuffix: Isaac Gym runs on Python 3.8
        if simulator in ("envpool", "gymnasium") and name in tasks:
            hint = f" (this script takes task names: --env-id {name})"
        fail(f"unknown task {args.env_id!r} for {simulator}{hint}; known tasks: {', '.join(tasks)}")
    return simulator


# --- the agent ---------------------------------------------------------------------------------------


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches, on the training device, in float64: the mean and
    (population) variance of all batches concatenated, merged batch by batch with the parallel-variance formula
    (Chan, Golub and LeVeque 1979). As in gymnasium, the count starts at `epsilon` with mean 0 and variance 1.
    The count is a tensor too: updating never syncs with the host."""

    def __init__(self, shape: Union[Tuple[int, ...], int] = (), epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))

    def update(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        batch_var, batch_mean = torch.var_mean(batch.double(), dim=0, unbiased=False)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean.add_(delta * n / total)
        self.var.mul_(self.count / total).add_(batch_var * n / total).add_(
            delta.square() * self.count * n / total.square()
        )
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor, clip: float) -> torch.Tensor:
        """(x - mean) / std, clipped to [-clip, clip], as float32; leaves the statistics as they are."""
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp_(-clip, clip).float()


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, out_std: float) -> nn.Sequential:
    """256x256 tanh MLP, orthogonally initialised; the output layer with gain `out_std`."""
    hidden = [layer_init(nn.Linear(in_dim, 256)), nn.Tanh(), layer_init(nn.Linear(256, 256)), nn.Tanh()]
    return nn.Sequential(*hidden, layer_init(nn.Linear(256, out_dim), std=out_std))


class Agent(nn.Module):
    """A Gaussian policy N(mean(obs), exp(logstd)^2) with a state-independent log standard
    deviation, and a separate value network; both 256x256 tanh MLPs (CleanRL's Isaac Gym PPO). critic_obs_dim: the
    value network's own observations (mjlab's "critic" group), where the simulator has them; else it sees obs."""

    def __init__(self, obs_dim: int, act_dim: int, critic_obs_dim: Optional[int] = None):
        super().__init__()
        self.critic = mlp(obs_dim if critic_obs_dim is None else critic_obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(act_dim))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def sample_action(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.actor_mean(obs)
        return mean + self.actor_logstd.exp() * torch.randn_like(mean)

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(actions | obs), summed over the action dimensions (as ppo_continuous_action.py writes it)."""
        z = (actions - self.actor_mean(obs)) / self.actor_logstd.exp()
        return (-0.5 * z.square() - self.actor_logstd - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        """The policy's entropy, the same in every state since the standard deviation does not depend on it."""
        return Normal(0.0, self.actor_logstd.exp(), validate_args=False).entropy().sum()


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
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last_advantage = deltas[t] + gamma * gae_lambda * episode_continues[t] * last_advantage
        advantages[t] = last_advantage
    return advantages


class Batch(NamedTuple):
    """A rollout flattened to [batch_size, ...], one named tensor per field."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    value_obs: Optional[torch.Tensor] = None  # the value network's own observations (mjlab's critic group); None: obs

    def take(self, rows: Union[torch.Tensor, slice]) -> "Batch":
        return Batch(*(None if field is None else field[rows] for field in self))


def make_optimizer(agent: Agent, args: Args, device: torch.device) -> torch.optim.Adam:
    """Adam. With --compile its learning rate is a device tensor that annealing writes into, so the compiled step (and
    its CUDA graph) is never rebuilt, and on a GPU its step is capturable (the step count stays on the device too)."""
    if not args.compile:
        return torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    lr = torch.tensor(args.learning_rate, device=device)
    return torch.optim.Adam(agent.parameters(), lr=lr, eps=1e-5, capturable=device.type == "cuda")


def update_minibatch(agent: Agent, optimizer: torch.optim.Optimizer, mb: Batch, args: Args) -> Dict[str, torch.Tensor]:
    """One gradient step of the clipped PPO loss on the minibatch `mb`. Returns its losses and statistics, detached.
    --compile compiles this function as it is (two graphs: up to the backward pass, and the clipping and step)."""
    newlogprob = agent.log_prob(mb.obs, mb.actions)
    newvalue = agent.get_value(mb.obs if mb.value_obs is None else mb.value_obs)
    logratio = newlogprob - mb.logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    mb_advantages = mb.advantages
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb.returns) ** 2
        v_delta = torch.clamp(newvalue - mb.values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (mb.values + v_delta - mb.returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb.returns) ** 2).mean()

    loss = pg_loss - args.ent_coef * agent.entropy() + v_loss * args.vf_coef

    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return dict(
        value_loss=v_loss.detach(),
        policy_loss=pg_loss.detach(),
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )


def first_episode_returns(model: dict, envs, eval_episodes: int, device: torch.device) -> List[float]:
    """The return of the first episode of each of the first `eval_episodes` environments under the model's mean
    action, on observations normalised with the saved statistics (frozen). The environments are reset first."""
    agent = Agent(model["obs_dim"], model["act_dim"], model.get("critic_obs_dim")).to(device)
    agent.load_state_dict(model["agent"])
    obs_rms = RunningMeanStd(model["obs_dim"]).to(device)
    obs_rms.load_state_dict(model["obs_rms"])
    args = model["args"]
    count = min(eval_episodes, envs.num_envs)
    returns = torch.full((count,), math.nan, device=device)
    obs = envs.reset()
    with torch.no_grad():
        for step in range(1, 100_000):
            obs, _, _, _, info = envs.step(
                agent.actor_mean(obs_rms.normalize(obs, args["clip_obs"]) if args["norm_obs"] else obs)
            )
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
        fail("ppo_isaacgym.py cannot record videos (neither simulator renders here); evaluate without --capture-video")
    model = load_model(model_path, __file__)
    trained = model["args"]  # the simulator's buffers as in training (.get: models saved before these flags)
    envs = make_envs(
        model["simulator"],
        model["env_id"],
        eval_episodes,
        device,
        seed,
        trained.get("nconmax"),
        trained.get("njmax"),
        trained.get("envpool_threads", 0),
    )
    returns = first_episode_returns(model, envs, eval_episodes, device)
    envs.check_buffers()  # the returns are wrong if contacts were dropped
    envs.close()
    return returns


if __name__ == "__main__":
    args = tyro.cli(Args)
    simulator = validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    simulator_name = SIMULATOR_NAMES[simulator]
    print(f"simulator: {simulator_name}, task {args.env_id}, {args.num_envs} environments", flush=True)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}", flush=True)
    elif simulator in ("envpool", "gymnasium", "mjlab"):
        print(f"device: CPU ({'no CUDA GPU found' if args.cuda else '--no-cuda'})", flush=True)
    else:  # MuJoCo Warp on 2 CPU cores: 180-470 steps/s (benchmark/results/ppo_isaacgym_cpu.md)
        seconds = args.batch_size / 400
        print(
            f"device: CPU ({'no CUDA GPU found' if args.cuda else '--no-cuda'}). MuJoCo Warp steps a few hundred "
            f"worlds per second on a CPU, so one iteration of {args.num_envs} x {args.num_steps} steps takes about "
            + (f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s")
            + " here; for a quick try: --num-envs 64 --total-timesteps 20000; faster on a CPU: --simulator envpool",
            flush=True,
        )
    envs = make_envs(
        simulator,
        args.env_id,
        args.num_envs,
        device,
        args.seed,
        args.nconmax,
        args.njmax,
        args.envpool_threads,
        random_episode_starts=True,
    )
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    # mjlab's tasks give the value network observations of its own (privileged state): an asymmetric actor-critic.
    critic_obs_dim = getattr(envs, "critic_obs_dim", None)

    agent = Agent(obs_dim, act_dim, critic_obs_dim).to(device)
    optimizer = make_optimizer(agent, args, device)
    obs_rms = RunningMeanStd(obs_dim).to(device)
    critic_rms = None if critic_obs_dim is None else RunningMeanStd(critic_obs_dim).to(device)

    def normalize(raw: torch.Tensor, update: bool = True, rms: Optional[RunningMeanStd] = None) -> torch.Tensor:
        """What the policy sees (the value network, with rms=critic_rms): with --norm-obs, observations enter the
        running statistics, then are normalised."""
        rms = obs_rms if rms is None else rms
        if not args.norm_obs:
            return raw
        if update:
            rms.update(raw)
        return rms.normalize(raw, args.clip_obs)

    # Rollout storage, allocated once on the device.
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    final_obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    # The value network's inputs: the same tensors as obs and final_obs unless the task has critic observations.
    value_obs, final_value_obs = obs, final_obs
    if critic_obs_dim is not None:
        value_obs = torch.zeros((args.num_steps, args.num_envs, critic_obs_dim), device=device)
        final_value_obs = torch.zeros((args.num_steps, args.num_envs, critic_obs_dim), device=device)
    mjlab_logs: List[Dict[str, torch.Tensor]] = []  # mjlab's episode statistics since the last log line
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    terminations = torch.zeros((args.num_steps, args.num_envs), device=device)
    truncations = torch.zeros((args.num_steps, args.num_envs), device=device)
    # Episodes finished since the last log line (count, sum of returns, sum of lengths), summed on the device. It
    # is logging state, not checkpointed: after a resume, the first log line averages the episodes since the resume.
    episode_stats = torch.zeros(3, dtype=torch.float64, device=device)

    global_step, iteration = 0, 0
    first_obs, next_obs = envs.reset(), None
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        if args.compile:  # the saved learning rate was read onto the CPU: the compiled step reads it on the device
            optimizer.param_groups[0]["lr"] = torch.as_tensor(optimizer.param_groups[0]["lr"], device=device)
        obs_rms.load_state_dict(run.checkpoint["obs_rms"])
        if critic_rms is not None:
            critic_rms.load_state_dict(run.checkpoint["critic_rms"])
        if run.checkpoint["envs"] is None:  # Isaac Gym, envpool, mjlab
            print(
                f"{simulator_name.split(' (')[0]}'s state is not in the checkpoint: resuming with freshly reset "
                "environments",
                flush=True,
            )
        else:
            envs.load_state_dict(run.checkpoint["envs"])
            next_obs = run.checkpoint["next_obs"].to(device)
        global_step, iteration = run.checkpoint["global_step"], run.checkpoint["iteration"]
    next_obs = normalize(first_obs) if next_obs is None else next_obs
    # mjlab's states are never saved: its critic observations always come from the reset or step just made.
    next_value_obs = next_obs if critic_rms is None else normalize(envs.critic_obs, rms=critic_rms)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        saved_envs = envs.state_dict()  # None for Isaac Gym and envpool
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict(),
            critic_rms=None if critic_rms is None else critic_rms.state_dict(),
            envs=saved_envs,
            next_obs=None if saved_envs is None else next_obs.cpu(),
            global_step=global_step,
            iteration=iteration,
        )

    # The policy step, GAE and the update: with --compile, these same functions compiled (and with --cudagraphs
    # captured in CUDA graphs, replayed with one launch each).
    policy, gae, update = agent.sample_action, compute_gae, update_minibatch
    if args.compile:
        mode = "reduce-overhead" if args.cudagraphs else None
        policy, gae, update = (torch.compile(fn, mode=mode) for fn in (policy, gae, update))

    def iteration_start_state() -> dict:
        """training_state() copied where it lives (no host sync), with the random number generators: taken as each
        iteration starts, so that SIGTERM/SIGINT in the middle of one (minutes long on a CPU) is answered at once.
        Its cost, measured at Ant's sizes with 4096 worlds: 1.3 ms of host time per iteration."""
        return dict(
            agent={k: v.clone() for k, v in agent.state_dict().items()},
            optimizer=copy.deepcopy(optimizer.state_dict()),
            obs_rms={k: v.clone() for k, v in obs_rms.state_dict().items()},
            critic_rms=None if critic_rms is None else {k: v.clone() for k, v in critic_rms.state_dict().items()},
            envs=envs.state_dict(on_device=True),
            next_obs=next_obs.clone(),
            global_step=global_step,
            iteration=iteration,
            rng=rng_state(),
        )

    def stop_midway(start: dict, where: str) -> None:
        """SIGTERM/SIGINT arrived during an iteration (`where`: in its rollout or its update): go back to the state it
        started from, checkpoint that (a resumed run does the whole iteration again, exactly) and exit
        (run.end_iteration)."""
        global next_obs, global_step, iteration
        print(f"\n{run.stop.received} during iteration {iteration}'s {where}: back to where it began", flush=True)
        agent.load_state_dict(start["agent"])
        optimizer.load_state_dict(start["optimizer"])
        obs_rms.load_state_dict(start["obs_rms"])
        if critic_rms is not None:
            critic_rms.load_state_dict(start["critic_rms"])
        if start["envs"] is not None:
            envs.load_state_dict(start["envs"])
        next_obs, global_step, iteration = start["next_obs"], start["global_step"], start["iteration"]
        restore_rng_state(start["rng"])
        run.end_iteration(global_step)

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration_start = iteration_start_state()
        iteration += 1
        if args.anneal_lr:
            lr_now = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
            if args.compile:  # written into the device tensor: nothing recompiles
                optimizer.param_groups[0]["lr"].fill_(lr_now)
            else:
                optimizer.param_groups[0]["lr"] = lr_now

        # 1. Collect a rollout: everything stays on the device.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                if critic_rms is not None:
                    value_obs[step] = next_value_obs
                action = policy(next_obs)
                actions[step] = action
                raw_obs, reward, terminated, truncated, info = envs.step(action)
                next_obs = normalize(raw_obs)
                final_obs[step] = normalize(info["final_obs"], update=False)
                if critic_rms is not None:
                    next_value_obs = normalize(envs.critic_obs, rms=critic_rms)
                    final_value_obs[step] = normalize(info["final_critic_obs"], update=False, rms=critic_rms)
                else:
                    next_value_obs = next_obs
                if "log" in info and info["log"]:
                    mjlab_logs.append(info["log"])
                rewards[step] = reward * args.reward_scaler
                terminations[step] = terminated.float()
                truncations[step] = truncated.float()
                done = info["done"].double()
                episode_stats += torch.stack(
                    [done.sum(), (info["episode_return"] * done).sum(), (info["episode_length"] * done).sum()]
                )
                run.progress.update(global_step)  # the console line, redrawn during long rollouts (no host read)
                if run.stop:
                    stop_midway(iteration_start, f"rollout, at step {global_step:,}")

            # 2. Advantages: values of the whole rollout in batched passes; a truncated episode is bootstrapped
            # with the value of its true final observation.
            values = agent.get_value(value_obs)
            next_values = torch.cat([values[1:], agent.get_value(next_value_obs)[None]])
            next_values = torch.where(truncations > 0, agent.get_value(final_value_obs), next_values)
            # A copy: with --cudagraphs the graph's output memory is reused by the next graph that runs.
            advantages = gae(rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda)
            advantages = advantages.clone()
            returns = advantages + values

            b_obs = obs.reshape(-1, obs_dim)
            b_actions = actions.reshape(-1, act_dim)
            b_logprobs = agent.log_prob(b_obs, b_actions)
            b_value_obs = None if critic_rms is None else value_obs.reshape(-1, critic_obs_dim)
            batch = Batch(
                b_obs,
                b_actions,
                b_logprobs,
                advantages.reshape(-1),
                returns.reshape(-1),
                values.reshape(-1),
                b_value_obs,
            )

        # 3. Update the policy and value network
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for first in range(0, args.batch_size, args.minibatch_size):
                stats = update(agent, optimizer, batch.take(b_inds[first : first + args.minibatch_size]), args)
                clipped += stats["clipfrac"]
                if run.stop:
                    stop_midway(iteration_start, "update")

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        # 4. Log every --log-every iterations and at the end (2 host reads, 3 with MuJoCo Warp), checkpoint when due
        out_of_time = args.time_limit_seconds > 0 and time.time() - run.start_time >= args.time_limit_seconds
        if iteration % args.log_every == 0 or iteration == args.num_iterations or out_of_time or run.stop:
            finished, return_sum, length_sum = episode_stats.tolist()
            episode_stats.zero_()
            if finished > 0:  # the mean over the episodes that ended since the last log line
                run.log_episodes(global_step, returns=[return_sum / finished], lengths=[length_sum / finished])
            var_y = batch.returns.var()
            unexplained = (batch.returns - batch.values).var() / var_y
            explained_var = torch.where(var_y == 0, torch.full_like(var_y, math.nan), 1 - unexplained)
            # MuJoCo Warp drops the contacts that do not fit its buffers: stop in one line if it had to.
            buffer_use = envs.check_buffers()
            # mjlab's own episode statistics (reward terms, termination causes, metrics), averaged over its logs
            for key in sorted({key for log in mjlab_logs for key in log}):
                logged = [
                    torch.as_tensor(log[key], dtype=torch.float32, device=device) for log in mjlab_logs if key in log
                ]
                buffer_use[f"mjlab/{key}"] = torch.stack(logged).mean()
            mjlab_logs.clear()
            run.log(
                global_step,
                {
                    "losses/value_loss": stats["value_loss"],
                    "losses/policy_loss": stats["policy_loss"],
                    "losses/entropy": agent.entropy(),
                    "losses/old_approx_kl": stats["old_approx_kl"],
                    "losses/approx_kl": stats["approx_kl"],
                    "losses/clipfrac": clipped / (args.num_minibatches * (epoch + 1)),
                    "losses/explained_variance": explained_var,
                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                    **buffer_use,
                },
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
        agent=agent.state_dict(),
        obs_rms=obs_rms.state_dict(),
        obs_dim=obs_dim,
        act_dim=act_dim,
        critic_obs_dim=critic_obs_dim,
        simulator=simulator,
    )
    envs.close()
