"""MuJoCo Warp as a batched simulator: gymnasium's v5 MuJoCo tasks (Ant, Humanoid, Hopper, HalfCheetah, Walker2d),
thousands of worlds stepped together on one device, with the observations, rewards, terminations, resets and time
limit of gymnasium written as torch operations on the simulator's arrays (viewed without copies). Used by
cleanrl/ppo_isaacgym.py; tests/test_ppo_isaacgym.py checks each task against gymnasium's, step by step.

    envs = MuJoCoWarpVecEnv("Ant", num_envs=4096, device=torch.device("cuda"), seed=1)
    obs = envs.reset()                                     # [num_envs, obs_dim] on the device
    obs, reward, terminated, truncated, info = envs.step(actions)   # info["final_obs"]: before the autoreset
    use = envs.check_buffers()   # at the logging interval: stops the run in one line if contacts were dropped

MuJoCo Warp's contact and constraint buffers have a fixed size (make_data's nconmax and njmax, mujoco_warp/_src/io.py):
contacts, and the broadphase's candidate pairs, share one pool of nconmax x num_envs slots across all worlds (one
world may take more than nconmax); each world has njmax constraint rows. What does not fit is dropped, and the physics
goes on, wrong. The simulator marks it in a sticky per-world bitmask (Data.overflow, set in forward.py's _next_time
every step); check_buffers() reads that mask and the peak counts recorded on the device after every MuJoCo step. With
RK4 (all but HalfCheetah) a MuJoCo step collides four times; its counts, and the simulator's mask, are its last
stage's, a state within one timestep of the next step's first.
"""

import functools
import math
import os
import sys
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from cleanrl_utils.errors import fail


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
    nconmax: int  # contact slots per world (pooled across worlds) and constraint rows per world: the defaults
    njmax: int  # of ppo_isaacgym.py's --nconmax and --njmax


WARP_TASKS = {
    "Ant": WarpTask("ant.xml", 5, 1.0, 0.5, 1.0, 0.1, True, 32, 128),
    "Humanoid": WarpTask("humanoid.xml", 5, 1.25, 0.1, 5.0, 1e-2, False, 64, 256),
    "Hopper": WarpTask("hopper.xml", 4, 1.0, 1e-3, 1.0, 5e-3, False, 16, 64),
    "HalfCheetah": WarpTask("half_cheetah.xml", 5, 1.0, 0.1, 0.0, 0.1, True, 32, 128),
    "Walker2d": WarpTask("walker2d_v5.xml", 4, 1.0, 1e-3, 1.0, 5e-3, False, 16, 64),
}
MAX_EPISODE_STEPS = 1000  # gymnasium's TimeLimit for all five tasks


@functools.lru_cache(maxsize=None)
def _peak_kernel():
    """A Warp kernel (one thread per world) that raises `peaks` to the counts of the MuJoCo step just taken:
    [contacts in all worlds, broadphase candidate pairs in all worlds, constraint rows of the fullest world].
    The simulator's counters keep counting past the buffers, so these are what was needed, not what was kept."""
    import warp as wp

    @wp.kernel
    def record_peaks(
        nacon: wp.array(dtype=wp.int32),
        ncollision: wp.array(dtype=wp.int32),
        nefc: wp.array(dtype=wp.int32),
        peaks: wp.array(dtype=wp.int32),
    ):
        world = wp.tid()
        wp.atomic_max(peaks, 2, nefc[world])
        if world == 0:
            wp.atomic_max(peaks, 0, nacon[0])
            wp.atomic_max(peaks, 1, ncollision[0])

    return record_peaks


def init_without_cuda_warning(wp) -> None:
    """wp.init() for a run on the CPU: on a machine without a CUDA driver, Warp's C library writes "Could not find or
    load the NVIDIA CUDA driver" to stderr, which the script's device line has already said; it is not shown."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            wp.init()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


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

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: torch.device,
        seed: int,
        nconmax: Optional[int] = None,
        njmax: Optional[int] = None,
    ):
        """nconmax, njmax: the contact slots and constraint rows per world (None: the task's in WARP_TASKS)."""
        import gymnasium
        import mujoco
        import warp as wp

        wp.config.log_level = wp.LOG_WARNING  # no banner, no line per kernel module loaded: warnings only
        if device.type == "cpu":
            init_without_cuda_warning(wp)
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
        self.nconmax = task.nconmax if nconmax is None else nconmax
        self.njmax = task.njmax if njmax is None else njmax
        with wp.ScopedDevice(self.wp_device):
            self.model = mjw.put_model(mjm)
            self.data = mjw.make_data(mjm, nworld=num_envs, nconmax=self.nconmax, njmax=self.njmax)
            # Peak [contacts, broadphase pairs, constraint rows per world] since the last check_buffers(), raised
            # after every MuJoCo step on the device. Logging state, not checkpointed.
            self.peaks_wp = wp.zeros(3, dtype=wp.int32)
        # check_buffers() reports these overflows in one line, so the simulator's own printf (one line per world
        # and MuJoCo step, on stdout) is turned off for them.
        full = mjw.OverflowType
        contacts_full, rows_full = int(full.BROADPHASE | full.NARROWPHASE), int(full.NEFC)
        self.model.opt.warn_overflow = int(self.model.opt.warn_overflow) & ~(contacts_full | rows_full)
        self.overflow_bits = torch.tensor([contacts_full, rows_full], dtype=torch.int32, device=device)
        self.overflow = wp.to_torch(self.data.overflow)  # the simulator's sticky per-world OverflowType bitmask
        self.peaks = wp.to_torch(self.peaks_wp)
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
        data = self.data
        for _ in range(self.task.frame_skip):
            self.mjw.step(self.model, data)
            inputs = [data.nacon, data.ncollision, data.nefc, self.peaks_wp]
            self.wp.launch(_peak_kernel(), dim=self.num_envs, inputs=inputs)
        self.mjw.rne_postconstraint(self.model, data)

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

    def check_buffers(self) -> Dict[str, float]:
        """Stop the run in one line (exit 2) if the simulator ran out of contact slots or constraint rows since it
        was made, naming the flag to raise; otherwise return the peak use since the last call, as fractions of the
        buffers, for the log. One device-to-host read: call it at the logging interval, not every step."""
        full = (self.overflow[:, None] & self.overflow_bits).ne(0).any(0)
        contacts_full, rows_full, contacts, pairs, rows = torch.cat([full, self.peaks]).tolist()
        self.peaks.zero_()
        slots, capacity = max(contacts, pairs), self.nconmax * self.num_envs
        what, advice = [], []
        if contacts_full:
            what.append(
                f"contact slots (the {self.num_envs} worlds needed {slots} at once; {capacity} allocated, "
                f"{self.nconmax} per world, pooled)"
            )
            advice.append(f"--nconmax (now {self.nconmax}; this peak needs {math.ceil(slots / self.num_envs)})")
        if rows_full:
            what.append(f"constraint rows (a world needed {rows}; {self.njmax} allocated per world)")
            advice.append(f"--njmax (now {self.njmax}; this peak needs {rows})")
        if what:
            fail(
                f"MuJoCo Warp ran out of {' and of '.join(what)}, and dropped what did not fit (the physics went "
                f"wrong): raise {' and '.join(advice)}"
            )
        return {"charts/contact_buffer_use": slots / capacity, "charts/constraint_buffer_use": rows / self.njmax}

    def state_dict(self, on_device: bool = False) -> dict:
        """Everything the next steps depend on, as CPU tensors (on_device: copies on the simulator's device, made
        without a host sync, for a snapshot that may be restored with load_state_dict)."""
        state = {name: getattr(self, name).clone() for name in self.STATE}
        if not on_device:
            state = {name: value.cpu() for name, value in state.items()}
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
