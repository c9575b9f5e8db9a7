"""Isaac Gym (isaacgymenvs's vector tasks) behind the batched interface of MuJoCoWarpVecEnv
(cleanrl_utils/envs/mujoco_warp_env.py), for cleanrl/ppo_isaacgym.py. Isaac Gym runs on Python 3.8 only: this module
keeps to 3.8's syntax (tests/test_ppo_isaacgym.py runs it there against tests/isaacgym_double.py). Isaac Gym must be
imported before torch; the script that uses this module does so first."""

import importlib.util
from typing import Dict, List

import numpy as np
import torch

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


def isaacgym_tasks() -> List[str]:
    """The task names isaacgymenvs registers."""
    import isaacgym  # noqa: F401
    from isaacgymenvs.tasks import isaacgym_task_map

    return sorted(isaacgym_task_map)


class IsaacGymVecEnv:
    """isaacgymenvs's vector task behind the same interface as MuJoCoWarpVecEnv.

    The task returns a dict of observations ("obs"), rewards, a reset buffer (1 where an episode
    ended, by termination or time-out) and extras["time_outs"]. Its observations at the end of an
    episode are the final ones (the task resets those environments during the next step), so they
    are also the bootstrap observations. That next step acts on the final observation and returns
    the new episode's first: no transition of either episode; info["reset_step"] marks it, for a
    replay buffer to leave out. Episode returns and lengths are tracked here as tensors.
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
        self.resetting = torch.zeros(num_envs, dtype=torch.bool, device=device)  # ended: reset during the next step

    def reset(self) -> torch.Tensor:
        self.episode_return.zero_()
        self.episode_length.zero_()
        self.resetting.zero_()
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
        info["reset_step"], self.resetting = self.resetting, done
        self.episode_return.masked_fill_(done, 0.0)
        self.episode_length.masked_fill_(done, 0)
        return obs, reward, terminated, truncated, info

    def check_buffers(self) -> Dict[str, float]:
        """Isaac Gym sizes its own contact buffers: nothing to check or log (see MuJoCoWarpVecEnv.check_buffers)."""
        return {}

    def state_dict(self, on_device: bool = False) -> None:
        return None  # Isaac Gym's simulator state cannot be saved

    def close(self) -> None:
        close = getattr(self.envs, "close", None)
        if close is not None:
            close()
