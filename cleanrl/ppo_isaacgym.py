"""Proximal Policy Optimization (PPO) with thousands of environments simulated on one GPU.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347),
in the massively parallel setting of Makoviychuk et al. 2021, "Isaac Gym: High Performance GPU-Based
Physics Simulation For Robot Learning" (https://arxiv.org/abs/2108.10470) and Rudin et al. 2021:
many environments, short rollouts (4096 envs x 16 steps), 2 minibatches, 4 epochs, a large learning
rate (0.0026, not annealed), value coefficient 2, gradient norm 1, a Gaussian policy and a value
network that are both 256x256 tanh MLPs. Observations, actions, rewards and episode statistics stay
on the device from the simulator to the optimiser: no `.item()`, `.cpu()` or Python loop over
environments in the rollout or the update; scalars are read back for logging every few iterations.

Action space: a one-dimensional Box in [-1, 1]. Two simulators behind one tensor interface:

- MuJoCo Warp (`mujoco-warp`, `warp-lang`, installed with the project): the tasks Ant, Humanoid,
  Hopper, HalfCheetah and Walker2d, built from the MuJoCo models that ship with gymnasium, with
  gymnasium's v5 observations, rewards, terminations, 1000-step truncation and reset noise, as
  torch operations on Warp arrays viewed as torch tensors (no copies). It runs on the CPU too,
  slowly (the first step compiles Warp kernels, cached in ~/.cache/warp). Two model changes are
  needed for MuJoCo Warp: Ant uses an elliptic friction cone (with the pyramidal one MuJoCo Warp
  and MuJoCo pick different friction directions on Ant's steep capsule contacts), Humanoid the
  Newton solver (MuJoCo Warp has no PGS).
- Isaac Gym through isaacgymenvs (Ant, Humanoid, Anymal, BallBalance, Cartpole, AllegroHand,
  ShadowHand ...), when it is importable: NVIDIA's Preview 4 tarball in its own Python 3.8
  environment (see the README).

    uv run python cleanrl/ppo_isaacgym.py --env-id Ant

`--simulator auto` takes Isaac Gym when it is importable and MuJoCo Warp otherwise; the first log
line says which. CleanRL's Isaac Gym Ant reached 3953 +- 667 after 240 s on an RTX A6000; what this
script measured is in benchmark/results/ (commands in benchmark/ppo_isaacgym_*.sh).

Normalisation. CleanRL's ppo_continuous_action_isaacgym.py normalises nothing: Isaac Gym's tasks
return observations already scaled by hand, and rewards are multiplied by a constant
(`--reward-scaler`, 1 by default). The MuJoCo Warp tasks return gymnasium's raw observations
(positions, velocities up to tens, contact forces), so this script normalises observations by
running statistics on the device (`--norm-obs`, on by default, clipped to [-clip_obs, clip_obs]),
as rl_games does for Isaac Gym; the statistics are part of the model (checkpoints, saved model,
evaluation). Rewards are only multiplied by `--reward-scaler`.

Episodes. Both simulators reset an environment inside the step that ends its episode (MuJoCo Warp
with masked tensor writes) and hand back the true final observation; a time-limit truncation is
bootstrapped with the value of that final observation and only a termination cuts the return.
(Isaac Gym's tasks return the final observation and reset at the next step; the adapter passes on
what they return.) Checkpoints hold the MuJoCo Warp state (qpos, qvel, warm start, time, step
counters, episode statistics, the reset RNG), so a resumed run continues the same episodes; on
the CPU it reproduces the uninterrupted run. Isaac Gym's state cannot be saved: a resumed Isaac
Gym run continues with freshly reset environments (and says so).
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import numpy as np

# Isaac Gym refuses to load once torch is imported: when it is installed, it goes first.
if importlib.util.find_spec("isaacgym") is not None:
    import isaacgym  # noqa: F401

import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import (
    CHECKPOINT_NAME,
    StopSignal,
    load_checkpoint,
    load_model,
    restore_rng_state,
    save_checkpoint,
    save_model,
)
from cleanrl_utils.errors import check_positive, fail
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
    """if toggled, use a GPU when one is present (the CPU otherwise); the simulator runs there too"""
    torch_threads: int = 1
    """CPU threads for torch (on the CPU, Warp's kernels run on one thread anyway)"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    # Optional[...] rather than "X | None": tyro evaluates these, and Isaac Gym runs on Python 3.8
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
ISAACGYM_TASKS = [
    "Ant",
    "Anymal",
    "AnymalTerrain",
    "AllegroHand",
    "BallBalance",
    "Cartpole",
    "FrankaCabinet",
    "Humanoid",
    "Ingenuity",
    "Quadcopter",
    "ShadowHand",
    "Trifinger",
]


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

    The simulator's arrays (qpos, qvel, xpos, cfrc_ext ...) are viewed as torch tensors without
    copies (`wp.to_torch`), so observations, rewards and terminations are torch operations on the
    device. step() resets the worlds whose episode ended with masked writes and returns the
    observation after the reset, with the true final observations in info["final_obs"].
    """

    def __init__(self, env_id: str, num_envs: int, device: torch.device, seed: int):
        import gymnasium
        import mujoco
        import warp as wp

        wp.config.quiet = True  # no line per compiled kernel module
        import mujoco_warp as mjw

        self.mjw, self.wp = mjw, wp
        self.task = task = WARP_TASKS[env_id]
        self.env_id, self.num_envs, self.device = env_id, num_envs, device
        mjm = mujoco.MjModel.from_xml_path(
            os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", task.xml)
        )
        if env_id == "Ant":
            mjm.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        if env_id == "Humanoid":
            mjm.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        self.dt = mjm.opt.timestep * task.frame_skip
        self.wp_device = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        with wp.ScopedDevice(self.wp_device):
            self.model = mjw.put_model(mjm)
            self.data = mjw.make_data(mjm, nworld=num_envs, nconmax=task.nconmax, njmax=task.njmax)
        d = self.data
        self.qpos, self.qvel, self.ctrl = wp.to_torch(d.qpos), wp.to_torch(d.qvel), wp.to_torch(d.ctrl)
        self.time, self.qacc_warmstart = wp.to_torch(d.time), wp.to_torch(d.qacc_warmstart)
        self.xpos, self.xipos, self.cfrc_ext = wp.to_torch(d.xpos), wp.to_torch(d.xipos), wp.to_torch(d.cfrc_ext)
        self.cinert, self.cvel, self.qfrc_actuator = (
            wp.to_torch(d.cinert),
            wp.to_torch(d.cvel),
            wp.to_torch(d.qfrc_actuator),
        )
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
            return torch.cat(
                [
                    qpos[:, 2:],
                    qvel,
                    self.cinert[:, 1:].flatten(1),
                    self.cvel[:, 1:].flatten(1),
                    self.qfrc_actuator[:, 6:],
                    self.cfrc_ext[:, 1:].flatten(1),
                ],
                dim=1,
            )
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
            state = torch.cat([qpos[:, 2:], qvel], dim=1)
            return (
                ((state > -100.0) & (state < 100.0)).all(1)
                & (qpos[:, 1] > 0.7)
                & (qpos[:, 2] > -0.2)
                & (qpos[:, 2] < 0.2)
            )
        if self.env_id == "Walker2d":
            return (qpos[:, 1] > 0.8) & (qpos[:, 1] < 2.0) & (qpos[:, 2] > -1.0) & (qpos[:, 2] < 1.0)
        return torch.ones(self.num_envs, dtype=torch.bool, device=self.device)  # HalfCheetah

    def _reset_worlds(self, mask: torch.Tensor) -> None:
        """Set the worlds where `mask` is true to gymnasium's initial state plus reset noise. Noise
        is drawn for every world (one draw, no host sync) and written only where `mask` is set."""
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
        self.qacc_warmstart.masked_fill_(rows, 0.0)
        self.time.masked_fill_(mask, 0.0)
        self.elapsed.masked_fill_(mask, 0)
        self.episode_return.masked_fill_(mask, 0.0)
        self.episode_length.masked_fill_(mask, 0)
        if self.env_id == "Humanoid":  # its observation and centre of mass need the kinematics
            with self.wp.ScopedDevice(self.wp_device):
                self.mjw.forward(self.model, self.data)
        self.position_before.copy_(torch.where(rows, self._position_after_reset(), self.position_before))

    def _position_after_reset(self) -> torch.Tensor:
        # A free joint puts the torso at qpos[:3]: Ant needs no kinematics pass for it.
        return self.qpos[:, :2].clone() if self.env_id == "Ant" else self._position()

    def reset(self) -> torch.Tensor:
        self._reset_worlds(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self._observe_after_reset(torch.ones(self.num_envs, dtype=torch.bool, device=self.device), None)

    def _observe_after_reset(self, mask: torch.Tensor, obs: torch.Tensor | None) -> torch.Tensor:
        """The observation with the reset worlds' rows replaced. gymnasium's reset zeroes the
        contact forces (mj_resetData), so the reset worlds' cfrc_ext rows are zero."""
        fresh = self._observe()
        if self.env_id in ("Ant", "Humanoid"):
            contacts = fresh[:, -self.contact_dims :]
            contacts.copy_(torch.where(mask[:, None], 0.0, contacts))
        return fresh if obs is None else torch.where(mask[:, None], fresh, obs)

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
        info = {
            "final_obs": final_obs,
            "done": done,
            "episode_return": self.episode_return.clone(),
            "episode_length": self.episode_length.clone(),
        }
        self._reset_worlds(done)
        return self._observe_after_reset(done, final_obs), reward, terminated, truncated, info

    def state_dict(self) -> dict:
        """Everything the next steps depend on, as CPU tensors: the simulator state, the step
        counters, the episode statistics and the reset RNG."""
        names = [
            "qpos",
            "qvel",
            "qacc_warmstart",
            "time",
            "ctrl",
            "elapsed",
            "episode_return",
            "episode_length",
            "position_before",
        ]
        state = {name: getattr(self, name).cpu().clone() for name in names}
        state["generator"] = self.generator.get_state()
        return state

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

        self.envs = isaacgymenvs.make(
            seed=seed,
            task=env_id,
            num_envs=num_envs,
            sim_device=str(device),
            rl_device=str(device),
            graphics_device_id=0 if device.type == "cuda" else -1,
            headless=True,
            multi_gpu=False,
            virtual_screen_capture=False,
            force_render=False,
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
        info = {
            "final_obs": obs,
            "done": done,
            "episode_return": self.episode_return.clone(),
            "episode_length": self.episode_length.clone(),
        }
        self.episode_return.masked_fill_(done, 0.0)
        self.episode_length.masked_fill_(done, 0)
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> None:
        return None  # Isaac Gym's simulator state cannot be saved

    def close(self) -> None:
        close = getattr(self.envs, "close", None)
        if close is not None:
            close()


def known_tasks(simulator: str) -> list[str]:
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
            f"--checkpoint-every and --time-limit-seconds must be 0 (off) or positive, got {args.checkpoint_every} and {args.time_limit_seconds}"
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
    """Running mean and variance of a stream of batches, on the training device, in float64.

    update(batch) merges the statistics of a batch [N, *shape] into the running ones with the
    parallel-variance formula (Chan, Golub and LeVeque 1979); the count starts at `epsilon` with
    mean 0 and variance 1, as in gymnasium. The count is a tensor too: updating never syncs.
    """

    def __init__(self, shape: tuple[int, ...] | int = (), epsilon: float = 1e-4):
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


class Agent(nn.Module):
    """A Gaussian policy N(mean(obs), exp(logstd)^2) with a state-independent log standard
    deviation, and a separate value network; both 256x256 tanh MLPs (CleanRL's Isaac Gym PPO)."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 256)),
            nn.Tanh(),
            layer_init(nn.Linear(256, 256)),
            nn.Tanh(),
            layer_init(nn.Linear(256, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 256)),
            nn.Tanh(),
            layer_init(nn.Linear(256, 256)),
            nn.Tanh(),
            layer_init(nn.Linear(256, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(act_dim))
        self.log_normaliser = 0.5 * act_dim * math.log(2 * math.pi)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shaped [...]."""
        return self.critic(obs).squeeze(-1)

    def sample_action(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.actor_mean(obs)
        return torch.addcmul(mean, self.actor_logstd.exp(), torch.randn_like(mean))

    def log_prob_and_value(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(actions | obs) summed over the action dimensions, and V(obs); both [...]."""
        z = (actions - self.actor_mean(obs)) * torch.exp(-self.actor_logstd)
        log_prob = -0.5 * z.square().sum(-1) - (self.actor_logstd.sum() + self.log_normaliser)
        return log_prob, self.get_value(obs)

    def entropy(self) -> torch.Tensor:
        """The policy's entropy, the same in every state: sum(logstd) + d/2 * log(2 pi e)."""
        return self.actor_logstd.sum() + self.log_normaliser + 0.5 * self.actor_logstd.numel()


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
    advantages = [deltas[-1]]
    for delta, decay in zip(reversed(deltas[:-1].unbind(0)), reversed(decays[:-1].unbind(0))):
        advantages.append(torch.addcmul(delta, decay, advantages[-1]))
    return torch.stack(advantages[::-1])


def evaluate(model_path: str | Path, eval_episodes: int, device: torch.device, seed: int = 0, envs=None) -> list[float]:
    """Reload a model saved by this script and return the returns of the first episode of
    `eval_episodes` environments under its mean action, on observations normalised with the saved
    statistics (frozen). MuJoCo Warp makes its own environments; Isaac Gym (one simulation per
    process) passes the training ones, which are reset first."""
    model = load_model(model_path, "ppo_isaacgym")
    if envs is None:
        envs = make_envs(model["simulator"], model["env_id"], eval_episodes, device, seed)
    agent = Agent(model["obs_dim"], model["act_dim"]).to(device)
    agent.load_state_dict(model["agent"])
    obs_rms = RunningMeanStd(model["obs_dim"]).to(device)
    obs_rms.load_state_dict(model["obs_rms"])
    args = model["args"]
    norm = (lambda x: obs_rms.normalize(x, args["clip_obs"])) if args["norm_obs"] else (lambda x: x)
    count = min(eval_episodes, envs.num_envs)
    returns = torch.full((count,), torch.nan, device=device)
    obs = envs.reset()
    with torch.no_grad():
        for step in range(1, 100_000):
            obs, _, _, _, info = envs.step(agent.actor_mean(norm(obs)))
            first = info["done"][:count] & returns.isnan()
            returns = torch.where(first, info["episode_return"][:count], returns)
            if step % 100 == 0 and not returns.isnan().any():  # one host read every 100 steps
                break
    return returns[~returns.isnan()].tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    simulator = validate(args)
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None
    stop = StopSignal()  # from here on, SIGTERM/SIGINT lead to a checkpoint and a clean exit
    print(
        f"simulator: {'Isaac Gym (isaacgymenvs)' if simulator == 'isaacgym' else 'MuJoCo Warp'}, task {args.env_id}, "
        f"{args.num_envs} environments",
        flush=True,
    )

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
    envs = make_envs(simulator, args.env_id, args.num_envs, device, args.seed)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim

    agent = Agent(obs_dim, act_dim).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    obs_rms = RunningMeanStd(obs_dim).to(device)

    def normalize(raw: torch.Tensor, update: bool) -> torch.Tensor:
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
    # Finished episodes since the last log line: count, sum of returns, sum of lengths.
    episode_stats = torch.zeros(3, dtype=torch.float64, device=device)

    global_step, start_iteration = 0, 1
    next_obs = normalize(envs.reset(), update=True)
    if checkpoint:
        agent.load_state_dict(checkpoint["agent"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        obs_rms.load_state_dict(checkpoint["obs_rms"])
        if checkpoint["envs"] is None:
            print("the Isaac Gym environments cannot be saved with the checkpoint: resuming with fresh ones")
        else:
            envs.load_state_dict(checkpoint["envs"])
            next_obs = checkpoint["next_obs"].to(device)
        episode_stats.copy_(checkpoint["episode_stats"])
        restore_rng_state(checkpoint["rng"])
        global_step, start_iteration = checkpoint["global_step"], checkpoint["iteration"] + 1

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
            envs=envs.state_dict(),
            next_obs=next_obs.cpu(),
            episode_stats=episode_stats.cpu(),
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # Rollout: everything stays on the device.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                action = agent.sample_action(next_obs)
                actions[step] = action
                raw_obs, reward, terminated, truncated, info = envs.step(action)
                next_obs = normalize(raw_obs, update=True)
                final_obs[step] = normalize(info["final_obs"], update=False)
                rewards[step] = reward * args.reward_scaler
                terminations[step] = terminated.float()
                truncations[step] = truncated.float()
                done = info["done"].double()
                episode_stats += torch.stack(
                    [done.sum(), (info["episode_return"] * done).sum(), (info["episode_length"] * done).sum()]
                )

            # Values and log-probabilities of the whole rollout in batched passes. A truncated
            # episode is bootstrapped with the value of its true final observation.
            logprobs, values = agent.log_prob_and_value(obs, actions)
            next_values = torch.cat([values[1:], agent.get_value(next_obs)[None]])
            next_values = torch.where(truncations > 0, agent.get_value(final_obs), next_values)
            advantages = compute_gae(
                rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            returns = advantages + values
            b_obs, b_actions = obs.reshape(-1, obs_dim), actions.reshape(-1, act_dim)
            b_logprobs, b_advantages, b_returns, b_values = (
                logprobs.reshape(-1),
                advantages.reshape(-1),
                returns.reshape(-1),
                values.reshape(-1),
            )

        # Optimise the policy and value network
        clipfracs = []
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                newlogprob, newvalue = agent.log_prob_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean())

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                loss = pg_loss - args.ent_coef * agent.entropy() + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # Logging: one device-to-host read every --log-every iterations (and at the end).
        out_of_time = args.time_limit_seconds > 0 and time.time() - start_time >= args.time_limit_seconds
        last = iteration == args.num_iterations or out_of_time or bool(stop)
        if iteration % args.log_every == 0 or last:
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
                        torch.stack(clipfracs).mean(),
                        explained_var,
                    ]
                ).tolist()
                finished, return_sum, length_sum = episode_stats.tolist()
                episode_stats.zero_()
            for name, value in zip(
                [
                    "value_loss",
                    "policy_loss",
                    "entropy",
                    "old_approx_kl",
                    "approx_kl",
                    "clipfrac",
                    "explained_variance",
                ],
                stats,
            ):
                writer.add_scalar(f"losses/{name}", value, global_step)
            if finished > 0:  # the mean over the episodes that ended since the last log line
                writer.add_scalar("charts/episodic_return", return_sum / finished, global_step)
                writer.add_scalar("charts/episodic_length", length_sum / finished, global_step)
                progress.add_returns([return_sum / finished])
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
        if out_of_time:
            print(f"--time-limit-seconds {args.time_limit_seconds:g} reached at step {global_step}", flush=True)
            break

    progress.close(global_step)

    if args.save_model:
        model_path = run.dir / f"{args.exp_name}.cleanrl_model"
        save_model(
            model_path,
            args,
            agent=agent.state_dict(),
            obs_rms=obs_rms.state_dict(),
            obs_dim=obs_dim,
            act_dim=act_dim,
            simulator=simulator,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(
            model_path,
            args.eval_episodes,
            device,
            seed=args.seed + 1_000,
            envs=envs if simulator == "isaacgym" else None,
        )
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"evaluation over {len(episodic_returns)} episodes: {np.mean(episodic_returns):.1f} +- {np.std(episodic_returns):.1f}"
        )

    envs.close()
    run.close()
