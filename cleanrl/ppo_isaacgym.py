"""Proximal Policy Optimization (PPO) with thousands of environments simulated together on one device.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347), in the massively
parallel setting of Makoviychuk et al. 2021, "Isaac Gym" (https://arxiv.org/abs/2108.10470), and Rudin et al. 2021:
4096 envs x 16 steps, 2 minibatches, 4 epochs, learning rate 0.0026, value coefficient 2, gradient norm 1, a Gaussian
policy and a value network of 256x256 tanh MLPs, observations normalised by running statistics (saved with the
model), rewards times --reward-scaler. Observations, actions, rewards and episode statistics never leave the device;
scalars are read back every --log-every iterations. Truncations are bootstrapped with the true final observation.

Action space: a one-dimensional Box. Simulators (`--simulator auto`: Isaac Gym when importable, else MuJoCo Warp):
- MuJoCo Warp (installed with the project; CPU too, slowly): Ant, Humanoid, Hopper, HalfCheetah, Walker2d with
  gymnasium's v5 observations, rewards, terminations, resets and time limit. Checkpoints hold the simulator state,
  so a resumed run continues the same episodes (exactly, on the CPU).
- Isaac Gym through isaacgymenvs (Ant, Humanoid, Anymal, ShadowHand ...; see the README). Its state cannot be
  saved: a resumed Isaac Gym run continues with freshly reset environments, and says so.

    uv run python cleanrl/ppo_isaacgym.py --env-id Ant

Expect Isaac Gym Ant ~3,950 after 240 s on a GPU (CleanRL's figure); CPU runs: benchmark/results/ppo_isaacgym_cpu.md.
"""

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

from cleanrl_utils.checkpoint import load_model
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
    """the task: Isaac Gym's task names (MuJoCo Warp: Ant, Humanoid, Hopper, HalfCheetah, Walker2d)"""
    total_timesteps: int = 30000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    simulator: Literal["auto", "isaacgym", "mujoco-warp"] = "auto"
    """the simulator: auto takes Isaac Gym when it is importable, MuJoCo Warp otherwise"""
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

ISAACGYM_INSTALL = (
    "--simulator isaacgym needs Isaac Gym, which no package registry has: in a Python 3.8 "
    "environment, pip install NVIDIA's Isaac Gym Preview 4 tarball (isaacgym/python) and "
    "isaacgymenvs (github.com/isaac-sim/IsaacGymEnvs); see the README"
)
# Some of isaacgymenvs's tasks, to tell a user without Isaac Gym why a task name is unknown.
ISAACGYM_TASKS = (
    "Ant Anymal AnymalTerrain AllegroHand BallBalance Cartpole FrankaCabinet Humanoid Ingenuity Quadcopter "
    "ShadowHand Trifinger"
).split()


def isaacgym_available() -> bool:
    return importlib.util.find_spec("isaacgym") is not None and importlib.util.find_spec("isaacgymenvs") is not None


def resolve_simulator(simulator: str) -> str:
    if simulator == "auto":
        return "isaacgym" if isaacgym_available() else "mujoco-warp"
    return simulator


@dataclass(frozen=True)
class WarpTask:
    """A gymnasium v5 MuJoCo task: its model file and the constants of its reward and termination."""

    xml: str
    frame_skip: int
    forward_weight: float
    ctrl_cost: float
    healthy_reward: float
    reset_noise: float
    normal_qvel_noise: bool  # qvel noise: scale * N(0, 1) (Ant, HalfCheetah) or U(-scale, scale)
    nconmax: int  # contacts and constraint rows allocated per world
    njmax: int


WARP_TASKS = {
    "Ant": WarpTask("ant.xml", 5, 1.0, 0.5, 1.0, 0.1, True, 32, 128),
    "Humanoid": WarpTask("humanoid.xml", 5, 1.25, 0.1, 5.0, 1e-2, False, 64, 256),
    "Hopper": WarpTask("hopper.xml", 4, 1.0, 1e-3, 1.0, 5e-3, False, 16, 64),
    "HalfCheetah": WarpTask("half_cheetah.xml", 5, 1.0, 0.1, 0.0, 0.1, True, 32, 128),
    "Walker2d": WarpTask("walker2d_v5.xml", 4, 1.0, 1e-3, 1.0, 5e-3, False, 16, 64),
}
MAX_EPISODE_STEPS = 1000  # gymnasium's TimeLimit for all five tasks


class MuJoCoWarpVecEnv:
    """`num_envs` copies of a gymnasium v5 MuJoCo task, simulated together by MuJoCo Warp.

    The simulator's arrays (qpos, qvel, xpos, cfrc_ext ...) are viewed as torch tensors without copies
    (`wp.to_torch`), so observations, rewards and terminations are torch operations on the device. step() resets the
    worlds whose episode ended with masked writes and returns the observation after the reset, with the true final
    observations in info["final_obs"]. Two model changes are needed for MuJoCo Warp: Ant uses an elliptic friction
    cone (with the pyramidal one MuJoCo Warp and MuJoCo pick different friction directions on Ant's steep capsule
    contacts), Humanoid the Newton solver (MuJoCo Warp has no PGS).
    """

    # What the next steps depend on, saved in checkpoints with the reset RNG: the simulator state, the step counters,
    # the episode statistics and the position the next forward reward is measured from.
    STATE = "qpos qvel qacc_warmstart time ctrl elapsed episode_return episode_length position_before".split()

    def __init__(self, env_id: str, num_envs: int, device: torch.device, seed: int):
        import gymnasium
        import mujoco
        import warp as wp

        wp.config.quiet = True  # no line per compiled kernel module
        import mujoco_warp as mjw

        self.mjw, self.wp = mjw, wp
        self.task = task = WARP_TASKS[env_id]
        self.env_id, self.num_envs, self.device = env_id, num_envs, device
        assets = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")
        mjm = mujoco.MjModel.from_xml_path(os.path.join(assets, task.xml))
        if env_id == "Ant":
            mjm.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        if env_id == "Humanoid":
            mjm.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        self.dt = mjm.opt.timestep * task.frame_skip
        self.wp_device = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        with wp.ScopedDevice(self.wp_device):
            self.model = mjw.put_model(mjm)
            self.data = mjw.make_data(mjm, nworld=num_envs, nconmax=task.nconmax, njmax=task.njmax)
        # The simulator's arrays that the task reads and writes, viewed as torch tensors (no copies).
        views = "qpos qvel ctrl time qacc_warmstart xpos xipos cfrc_ext cinert cvel qfrc_actuator"
        for name in views.split():
            setattr(self, name, wp.to_torch(getattr(self.data, name)))
        self.init_qpos = torch.as_tensor(mjm.qpos0, dtype=torch.float32, device=device)
        self.body_mass = torch.as_tensor(mjm.body_mass, dtype=torch.float32, device=device)
        ctrl_range = torch.as_tensor(mjm.actuator_ctrlrange, dtype=torch.float32, device=device)
        self.action_low, self.action_high = ctrl_range[:, 0], ctrl_range[:, 1]
        self.nq, self.nv, self.act_dim = mjm.nq, mjm.nv, mjm.nu
        self.contact_dims = (mjm.nbody - 1) * 6  # cfrc_ext of every body but the world
        self.generator = torch.Generator(device).manual_seed(seed)
        # Episode bookkeeping, all tensors on the device.
        self.elapsed = torch.zeros(num_envs, dtype=torch.int32, device=device)
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int32, device=device)
        # The position the forward velocity is measured from: gymnasium reads it before the step.
        self.position_before = torch.zeros((num_envs, 2 if env_id in ("Ant", "Humanoid") else 1), device=device)
        self.graph = None
        if device.type == "cuda":
            # One stream for torch and Warp: their work is ordered without host synchronisation.
            torch.cuda.set_stream(wp.stream_to_torch(wp.get_stream(self.wp_device)))
            with wp.ScopedDevice(self.wp_device), wp.ScopedCapture() as capture:
                self._simulate()
            self.graph = capture.graph
        self.obs_dim = self.reset().shape[1]

    def _simulate(self) -> None:
        """The physics of one environment step: frame_skip MuJoCo steps, then the contact forces
        (cfrc_ext, which MuJoCo leaves stale after a step; gymnasium computes them the same way)."""
        for _ in range(self.task.frame_skip):
            self.mjw.step(self.model, self.data)
        self.mjw.rne_postconstraint(self.model, self.data)

    def _position(self) -> torch.Tensor:
        """What the forward reward differentiates: the x of the root (Hopper, HalfCheetah, Walker2d),
        the torso's xy (Ant), the xy of the centre of mass (Humanoid), as gymnasium reads them."""
        if self.env_id == "Ant":
            return self.xpos[:, 1, :2].clone()
        if self.env_id == "Humanoid":
            return (self.body_mass[:, None] * self.xipos).sum(1)[:, :2] / self.body_mass.sum()
        return self.qpos[:, :1].clone()

    def _observe(self) -> torch.Tensor:
        qpos, qvel = self.qpos, self.qvel
        if self.env_id == "Ant":
            contact = self.cfrc_ext[:, 1:].clamp(-1.0, 1.0).flatten(1)
            return torch.cat([qpos[:, 2:], qvel, contact], dim=1)
        if self.env_id == "Humanoid":
            bodies = [self.cinert[:, 1:], self.cvel[:, 1:], self.qfrc_actuator[:, 6:], self.cfrc_ext[:, 1:]]
            return torch.cat([qpos[:, 2:], qvel, *(x.flatten(1) for x in bodies)], dim=1)
        if self.env_id == "HalfCheetah":
            return torch.cat([qpos[:, 1:], qvel], dim=1)
        return torch.cat([qpos[:, 1:], qvel.clamp(-10.0, 10.0)], dim=1)  # Hopper, Walker2d

    def _healthy(self) -> torch.Tensor:
        qpos, qvel = self.qpos, self.qvel
        if self.env_id == "Ant":
            finite = torch.isfinite(qpos).all(1) & torch.isfinite(qvel).all(1)
            return finite & (qpos[:, 2] >= 0.2) & (qpos[:, 2] <= 1.0)
        if self.env_id == "Humanoid":
            return (qpos[:, 2] > 1.0) & (qpos[:, 2] < 2.0)
        if self.env_id == "Hopper":
            state_in_range = torch.cat([qpos[:, 2:], qvel], dim=1).abs().lt(100.0).all(1)
            return state_in_range & (qpos[:, 1] > 0.7) & (qpos[:, 2].abs() < 0.2)
        if self.env_id == "Walker2d":
            return (qpos[:, 1] > 0.8) & (qpos[:, 1] < 2.0) & (qpos[:, 2] > -1.0) & (qpos[:, 2] < 1.0)
        return torch.ones(self.num_envs, dtype=torch.bool, device=self.device)  # HalfCheetah

    def _reset_worlds(self, mask: torch.Tensor) -> None:
        """Set the worlds where `mask` is true to gymnasium's initial state plus reset noise, with the actuator
        controls zeroed as gymnasium's reset (mj_resetData) does. Noise is drawn for every world (one draw, no host
        sync) and written only where `mask` is set."""
        scale = self.task.reset_noise
        shape_q, shape_v = (self.num_envs, self.nq), (self.num_envs, self.nv)
        qpos = self.init_qpos + scale * (2 * torch.rand(shape_q, generator=self.generator, device=self.device) - 1)
        if self.task.normal_qvel_noise:
            qvel = scale * torch.randn(shape_v, generator=self.generator, device=self.device)
        else:
            qvel = scale * (2 * torch.rand(shape_v, generator=self.generator, device=self.device) - 1)
        rows = mask[:, None]
        self.qpos.copy_(torch.where(rows, qpos, self.qpos))
        self.qvel.copy_(torch.where(rows, qvel, self.qvel))
        self.ctrl.masked_fill_(rows, 0.0)
        self.qacc_warmstart.masked_fill_(rows, 0.0)
        self.time.masked_fill_(mask, 0.0)
        self.elapsed.masked_fill_(mask, 0)
        self.episode_return.masked_fill_(mask, 0.0)
        self.episode_length.masked_fill_(mask, 0)
        if self.env_id == "Humanoid":  # its observation and centre of mass need the kinematics (and actuator forces)
            with self.wp.ScopedDevice(self.wp_device):
                self.mjw.forward(self.model, self.data)
        # A free joint puts Ant's torso at qpos[:3]: it needs no kinematics pass for it.
        position = self.qpos[:, :2].clone() if self.env_id == "Ant" else self._position()
        self.position_before.copy_(torch.where(rows, position, self.position_before))

    def _observe_after_reset(self, mask: torch.Tensor, obs: Optional[torch.Tensor]) -> torch.Tensor:
        """The observation with the reset worlds' rows replaced. gymnasium's reset zeroes the contact forces
        (mj_resetData), so the reset worlds' cfrc_ext rows are zero."""
        fresh = self._observe()
        if self.env_id in ("Ant", "Humanoid"):
            contacts = fresh[:, -self.contact_dims :]
            contacts.copy_(torch.where(mask[:, None], 0.0, contacts))
        return fresh if obs is None else torch.where(mask[:, None], fresh, obs)

    def reset(self) -> torch.Tensor:
        every_world = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._reset_worlds(every_world)
        return self._observe_after_reset(every_world, None)

    def step(self, actions: torch.Tensor):
        actions = torch.maximum(torch.minimum(actions, self.action_high), self.action_low)
        self.ctrl.copy_(actions)
        if self.graph is not None:
            self.wp.capture_launch(self.graph)
        else:
            with self.wp.ScopedDevice(self.wp_device):
                self._simulate()
        position_after = self._position()
        velocity = (position_after - self.position_before) / self.dt
        self.position_before.copy_(position_after)
        task = self.task
        healthy = self._healthy()
        reward = task.forward_weight * velocity[:, 0] - task.ctrl_cost * actions.square().sum(1)
        if task.healthy_reward:
            reward = reward + task.healthy_reward * healthy
        if self.env_id == "Ant":
            reward = reward - 5e-4 * self.cfrc_ext.clamp(-1.0, 1.0).square().flatten(1).sum(1)
        if self.env_id == "Humanoid":
            reward = reward - (5e-7 * self.cfrc_ext.square().flatten(1).sum(1)).clamp(max=10.0)
        terminated = ~healthy if self.env_id != "HalfCheetah" else torch.zeros_like(healthy)
        self.elapsed += 1
        truncated = self.elapsed >= MAX_EPISODE_STEPS
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        final_obs = self._observe()
        episode_return, episode_length = self.episode_return.clone(), self.episode_length.clone()
        info = dict(final_obs=final_obs, done=done, episode_return=episode_return, episode_length=episode_length)
        self._reset_worlds(done)
        return self._observe_after_reset(done, final_obs), reward, terminated, truncated, info

    def state_dict(self) -> dict:
        """Everything the next steps depend on, as CPU tensors."""
        state = {name: getattr(self, name).cpu().clone() for name in self.STATE}
        return {**state, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            if name == "generator":
                self.generator.set_state(value)
            else:
                getattr(self, name).copy_(value)
        if self.env_id == "Humanoid":  # the kinematics its observation reads
            with self.wp.ScopedDevice(self.wp_device):
                self.mjw.forward(self.model, self.data)

    def close(self) -> None:
        pass


class IsaacGymVecEnv:
    """isaacgymenvs's vector task behind the same interface as MuJoCoWarpVecEnv.

    The task returns a dict of observations ("obs"), rewards, a reset buffer (1 where an episode
    ended, by termination or time-out) and extras["time_outs"]. Its observations at the end of an
    episode are the final ones (the task resets those environments during the next step), so they
    are also the bootstrap observations. Episode returns and lengths are tracked here as tensors.
    """

    def __init__(self, env_id: str, num_envs: int, device: torch.device, seed: int):
        import isaacgymenvs

        graphics_device_id = 0 if device.type == "cuda" else -1
        self.envs = isaacgymenvs.make(
            seed, env_id, num_envs, str(device), str(device), graphics_device_id, headless=True, force_render=False
        )
        self.num_envs, self.device = num_envs, device
        self.obs_dim = int(np.prod(self.envs.observation_space.shape))
        self.act_dim = int(np.prod(self.envs.action_space.shape))
        self.action_low = torch.as_tensor(self.envs.action_space.low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(self.envs.action_space.high, dtype=torch.float32, device=device)
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int32, device=device)

    def reset(self) -> torch.Tensor:
        self.episode_return.zero_()
        self.episode_length.zero_()
        return self.envs.reset()["obs"].view(self.num_envs, self.obs_dim)

    def step(self, actions: torch.Tensor):
        actions = torch.maximum(torch.minimum(actions, self.action_high), self.action_low)
        obs_dict, reward, reset_buf, extras = self.envs.step(actions)
        obs = obs_dict["obs"].view(self.num_envs, self.obs_dim)
        done = reset_buf.bool()
        truncated = extras.get("time_outs", torch.zeros_like(done)).bool() & done
        terminated = done & ~truncated
        self.episode_return += reward
        self.episode_length += 1
        episode_return, episode_length = self.episode_return.clone(), self.episode_length.clone()
        info = dict(final_obs=obs, done=done, episode_return=episode_return, episode_length=episode_length)
        self.episode_return.masked_fill_(done, 0.0)
        self.episode_length.masked_fill_(done, 0)
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> None:
        return None  # Isaac Gym's simulator state cannot be saved

    def close(self) -> None:
        close = getattr(self.envs, "close", None)
        if close is not None:
            close()


def known_tasks(simulator: str) -> List[str]:
    if simulator == "mujoco-warp":
        return list(WARP_TASKS)
    import isaacgym  # noqa: F401
    from isaacgymenvs.tasks import isaacgym_task_map

    return sorted(isaacgym_task_map)


def make_envs(simulator: str, env_id: str, num_envs: int, device: torch.device, seed: int):
    if simulator == "isaacgym":
        return IsaacGymVecEnv(env_id, num_envs, device, seed)
    return MuJoCoWarpVecEnv(env_id, num_envs, device, seed)


def validate(args: Args) -> str:
    """Check the arguments and the simulator before any work; fail in one line. Returns the
    simulator that will run."""
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
    if args.checkpoint_every < 0 or args.time_limit_seconds < 0:
        fail(
            "--checkpoint-every and --time-limit-seconds must be 0 (off) or positive, "
            f"got {args.checkpoint_every} and {args.time_limit_seconds}"
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
    tasks = known_tasks(simulator)
    if args.env_id not in tasks:
        hint = (
            " (an Isaac Gym task: install Isaac Gym, see the README)"
            if simulator == "mujoco-warp" and args.env_id in ISAACGYM_TASKS
            else ""
        )
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
        batch_var, batch_mean = torch.var_mean(batch.double(), dim=0, correction=0)
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
    deviation, and a separate value network; both 256x256 tanh MLPs (CleanRL's Isaac Gym PPO)."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = mlp(obs_dim, 1, out_std=1.0)
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

    def take(self, rows: Union[torch.Tensor, slice]) -> "Batch":
        return Batch(*(field[rows] for field in self))


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
    newvalue = agent.get_value(mb.obs)
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
    agent = Agent(model["obs_dim"], model["act_dim"]).to(device)
    agent.load_state_dict(model["agent"])
    obs_rms = RunningMeanStd(model["obs_dim"]).to(device)
    obs_rms.load_state_dict(model["obs_rms"])
    args = model["args"]
    count = min(eval_episodes, envs.num_envs)
    returns = torch.full((count,), torch.nan, device=device)
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
    envs = make_envs(model["simulator"], model["env_id"], eval_episodes, device, seed)
    returns = first_episode_returns(model, envs, eval_episodes, device)
    envs.close()
    return returns


if __name__ == "__main__":
    args = tyro.cli(Args)
    simulator = validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    simulator_name = "Isaac Gym (isaacgymenvs)" if simulator == "isaacgym" else "MuJoCo Warp"
    print(f"simulator: {simulator_name}, task {args.env_id}, {args.num_envs} environments", flush=True)
    envs = make_envs(simulator, args.env_id, args.num_envs, device, args.seed)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim

    agent = Agent(obs_dim, act_dim).to(device)
    optimizer = make_optimizer(agent, args, device)
    obs_rms = RunningMeanStd(obs_dim).to(device)

    def normalize(raw: torch.Tensor, update: bool = True) -> torch.Tensor:
        """What the policy sees: with --norm-obs, observations enter the running statistics, then are normalised."""
        if not args.norm_obs:
            return raw
        if update:
            obs_rms.update(raw)
        return obs_rms.normalize(raw, args.clip_obs)

    # Rollout storage, allocated once on the device.
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    final_obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
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
        if run.checkpoint["envs"] is None:
            print("Isaac Gym's state is not in the checkpoint: resuming with freshly reset environments", flush=True)
        else:
            envs.load_state_dict(run.checkpoint["envs"])
            next_obs = run.checkpoint["next_obs"].to(device)
        global_step, iteration = run.checkpoint["global_step"], run.checkpoint["iteration"]
    next_obs = normalize(first_obs) if next_obs is None else next_obs

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        saved_envs = envs.state_dict()  # None for Isaac Gym
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict(),
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

    run.begin(training_state)
    while iteration < args.num_iterations:
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
                action = policy(next_obs)
                actions[step] = action
                raw_obs, reward, terminated, truncated, info = envs.step(action)
                next_obs = normalize(raw_obs)
                final_obs[step] = normalize(info["final_obs"], update=False)
                rewards[step] = reward * args.reward_scaler
                terminations[step] = terminated.float()
                truncations[step] = truncated.float()
                done = info["done"].double()
                episode_stats += torch.stack(
                    [done.sum(), (info["episode_return"] * done).sum(), (info["episode_length"] * done).sum()]
                )

            # 2. Advantages: values of the whole rollout in batched passes; a truncated episode is bootstrapped
            # with the value of its true final observation.
            values = agent.get_value(obs)
            next_values = torch.cat([values[1:], agent.get_value(next_obs)[None]])
            next_values = torch.where(truncations > 0, agent.get_value(final_obs), next_values)
            # A copy: with --cudagraphs the graph's output memory is reused by the next graph that runs.
            advantages = gae(rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda)
            advantages = advantages.clone()
            returns = advantages + values

            b_obs = obs.reshape(-1, obs_dim)
            b_actions = actions.reshape(-1, act_dim)
            b_logprobs = agent.log_prob(b_obs, b_actions)
            batch = Batch(b_obs, b_actions, b_logprobs, advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))

        # 3. Update the policy and value network
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                stats = update(agent, optimizer, batch.take(b_inds[start : start + args.minibatch_size]), args)
                clipped += stats["clipfrac"]

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        # 4. Log every --log-every iterations and at the end (two device-to-host reads), checkpoint when due
        out_of_time = args.time_limit_seconds > 0 and time.time() - run.start_time >= args.time_limit_seconds
        if iteration % args.log_every == 0 or iteration == args.num_iterations or out_of_time or run.stop:
            finished, return_sum, length_sum = episode_stats.tolist()
            episode_stats.zero_()
            if finished > 0:  # the mean over the episodes that ended since the last log line
                run.log_episodes(global_step, returns=[return_sum / finished], lengths=[length_sum / finished])
            var_y = batch.returns.var()
            explained_var = torch.where(var_y == 0, torch.nan, 1 - (batch.returns - batch.values).var() / var_y)
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
        evaluate if simulator == "mujoco-warp" else evaluate_in_training_envs,
        agent=agent.state_dict(),
        obs_rms=obs_rms.state_dict(),
        obs_dim=obs_dim,
        act_dim=act_dim,
        simulator=simulator,
    )
    envs.close()
