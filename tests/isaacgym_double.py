"""A TEST DOUBLE of isaacgymenvs, for running ppo_isaacgym.py's Isaac Gym path on the CPU.

This is not Isaac Gym and simulates no robot. It implements the part of isaacgymenvs's interface
that cleanrl/ppo_isaacgym.py uses, with the same conventions as isaacgymenvs's VecTask:

- `make(seed, task, num_envs, sim_device, rl_device, ...)` returns the vector task;
  `tasks.isaacgym_task_map` names the tasks (here one: "Cartpole").
- `reset()` returns a dict of observations {"obs": tensor [num_envs, obs_dim]} on rl_device.
- `step(actions)` clamps the actions to [-clip_actions, clip_actions], advances every
  environment, and returns (obs dict, rewards, reset_buf, extras). As in isaacgymenvs's tasks,
  the environments flagged in reset_buf are reset at the start of the NEXT step's post-physics
  update, so the observation returned with reset_buf = 1 is the episode's final one.
  reset_buf is 1 on termination and on time-out; extras["time_outs"] marks the time-outs
  (progress_buf >= max_episode_length - 1).
- `observation_space`, `action_space` (gym-style Boxes), `num_envs`, `num_obs`, `num_actions`.
- `close()`; the double then refuses to step or reset (one simulation per process: a script that
  evaluates in its training environments must do so before closing them).

The dynamics are a cart on a rail pushed by the action, as simple tensor arithmetic: the
episode terminates when the cart leaves [-2, 2] and times out after `max_episode_length` steps.

The tests put two stand-in packages on PYTHONPATH, `isaacgym` (empty) and `isaacgymenvs`
(re-exporting this module), so the script finds "Isaac Gym" installed; see test_ppo_isaacgym.py.
"""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import torch


class IsaacGymVecTaskDouble:
    """Test double of an isaacgymenvs VecTask: a batched cart on a rail, in torch tensors."""

    def __init__(self, num_envs: int, device: str, seed: int, max_episode_length: int = 20):
        self.num_envs, self.device = num_envs, torch.device(device)
        self.num_obs, self.num_actions = 4, 1
        self.max_episode_length = max_episode_length
        self.clip_actions = 1.0
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.num_obs,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.num_actions,), np.float32)
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.state = torch.zeros((num_envs, 2), device=self.device)  # position, velocity
        self.obs_buf = torch.zeros((num_envs, self.num_obs), device=self.device)
        self.rew_buf = torch.zeros(num_envs, device=self.device)
        self.reset_buf = torch.ones(num_envs, dtype=torch.long, device=self.device)
        self.timeout_buf = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.progress_buf = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.extras: dict = {}
        self.closed = False

    def reset_idx(self, env_ids: torch.Tensor) -> None:
        noise = 0.1 * (2 * torch.rand((len(env_ids), 2), generator=self.generator, device=self.device) - 1)
        self.state[env_ids] = noise
        self.progress_buf[env_ids] = 0
        self.reset_buf[env_ids] = 0

    def compute_observations(self) -> None:
        position, velocity = self.state.unbind(1)
        self.obs_buf[:] = torch.stack([position, velocity, position.square(), torch.sin(3 * position)], dim=1)

    def reset(self) -> dict:
        assert not self.closed, "reset() after close()"
        self.reset_idx(torch.arange(self.num_envs, device=self.device))
        self.compute_observations()
        return {"obs": self.obs_buf.clone()}

    def step(self, actions: torch.Tensor):
        assert not self.closed, "step() after close(): the simulation is gone"
        actions = torch.clamp(actions, -self.clip_actions, self.clip_actions)
        # "physics"
        self.state[:, 1] += 0.1 * actions[:, 0]
        self.state[:, 0] += 0.1 * self.state[:, 1]
        # post-physics step, in isaacgymenvs's order
        self.progress_buf += 1
        env_ids = self.reset_buf.nonzero(as_tuple=False).squeeze(-1)
        if len(env_ids) > 0:
            self.reset_idx(env_ids)
        self.compute_observations()
        position = self.state[:, 0]
        self.rew_buf[:] = 1.0 - position.abs()
        terminated = position.abs() > 2.0
        self.reset_buf[:] = torch.where(terminated | (self.progress_buf >= self.max_episode_length - 1), 1, 0)
        self.timeout_buf[:] = torch.where(self.progress_buf >= self.max_episode_length - 1, 1, 0)
        self.extras["time_outs"] = self.timeout_buf.clone()
        return {"obs": self.obs_buf.clone()}, self.rew_buf.clone(), self.reset_buf.clone(), self.extras

    def close(self) -> None:
        self.closed = True


isaacgym_task_map = {"Cartpole": IsaacGymVecTaskDouble}
tasks = types.SimpleNamespace(isaacgym_task_map=isaacgym_task_map)


def make(
    seed: int,
    task: str,
    num_envs: int,
    sim_device: str,
    rl_device: str,
    graphics_device_id: int = -1,
    headless: bool = False,
    multi_gpu: bool = False,
    virtual_screen_capture: bool = False,
    force_render: bool = True,
    cfg=None,
):
    """isaacgymenvs.make's signature; returns the test double of the task."""
    assert sim_device == rl_device, "the double keeps simulation and learning on one device"
    return isaacgym_task_map[task](num_envs, rl_device, seed)


SHIMS = {
    "isaacgym/__init__.py": '"""Stand-in for NVIDIA\'s isaacgym package, tests only (tests/isaacgym_double.py)."""\n',
    "isaacgymenvs/__init__.py": '"""Stand-in for isaacgymenvs, for tests only: tests/isaacgym_double.py."""\n'
    "from isaacgym_double import make  # noqa: F401\n",
    "isaacgymenvs/tasks/__init__.py": "from isaacgym_double import isaacgym_task_map  # noqa: F401\n",
}


def write_shims(root) -> None:
    """Write the stand-in `isaacgym` and `isaacgymenvs` packages under `root` (put it and tests/
    on PYTHONPATH)."""
    from pathlib import Path

    for relative, text in SHIMS.items():
        path = Path(root) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
