"""gymnasium's CPU vector envs behind the batched interface of MuJoCoWarpVecEnv: torch tensors on the training device,
and info["final_obs"], ["done"], ["episode_return"], ["episode_length"] as tensors. A script written for thousands of
simulated worlds (fast_td3_isaacgym.py) runs gymnasium's tasks (Hopper-v5, Pendulum-v1 ...) through it with a
handful of environments. One host-to-device copy of the step's results and one device-to-host copy of the actions per
step; the state (simulators, wrappers, episode statistics) saves with the checkpoint as gymnasium's own vector envs do.

    envs = GymnasiumVecEnv("Hopper-v5", num_envs=16, device=torch.device("cpu"), seed=1)
    obs = envs.reset()                                              # [num_envs, obs_dim], seeded once
    obs, reward, terminated, truncated, info = envs.step(actions)   # SAME_STEP autoreset: obs starts the next episode
"""

from __future__ import annotations

from typing import Dict, Optional

import gymnasium as gym
import numpy as np
import torch

from cleanrl_utils.checkpoint import restore_envs, snapshot_envs


class GymnasiumVecEnv:
    def __init__(
        self, env_id: str, num_envs: int, device: torch.device, seed: int, max_episode_steps: Optional[int] = None
    ):
        """max_episode_steps: the time limit (None: the id's registered one)."""
        # SAME_STEP: an episode that ends is reset within the step; its true final observation is in infos.
        self.envs = gym.vector.SyncVectorEnv(
            [
                lambda: gym.make(env_id, disable_env_checker=True, max_episode_steps=max_episode_steps)
                for _ in range(num_envs)
            ],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        space = self.envs.single_action_space
        self.env_id, self.num_envs, self.device, self.seed = env_id, num_envs, device, seed
        self.obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.act_dim = int(space.shape[0])
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(space.high, dtype=torch.float32, device=device)
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int32, device=device)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array, dtype=np.float32), device=self.device)

    def reset(self) -> torch.Tensor:
        obs, _ = self.envs.reset(seed=self.seed)
        self.episode_return.zero_()
        self.episode_length.zero_()
        return self._tensor(obs).view(self.num_envs, self.obs_dim)

    def step(self, actions: torch.Tensor):
        actions = torch.maximum(torch.minimum(actions, self.action_high), self.action_low)
        obs, reward, terminated, truncated, infos = self.envs.step(actions.cpu().numpy())
        final_obs = np.array(obs, dtype=np.float32)
        if "final_obs" in infos:
            ended = infos["_final_obs"]
            final_obs[ended] = np.stack(infos["final_obs"][ended])
        obs, final_obs = (self._tensor(o).view(self.num_envs, self.obs_dim) for o in (obs, final_obs))
        reward = self._tensor(reward)
        terminated = torch.as_tensor(terminated, device=self.device)
        truncated = torch.as_tensor(truncated, device=self.device)
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        episode_return, episode_length = self.episode_return.clone(), self.episode_length.clone()
        info = dict(final_obs=final_obs, done=done, episode_return=episode_return, episode_length=episode_length)
        self.episode_return.masked_fill_(done, 0.0)
        self.episode_length.masked_fill_(done, 0)
        return obs, reward, terminated, truncated, info

    def check_buffers(self) -> Dict[str, float]:
        """gymnasium's simulators size their own buffers: nothing to check or log (see MuJoCoWarpVecEnv)."""
        return {}

    def state_dict(self, on_device: bool = False) -> Optional[dict]:
        """The vector env's state (cleanrl_utils.checkpoint.snapshot_envs) and the episode statistics; None where the
        environments cannot be saved."""
        snapshot = snapshot_envs(self.envs)
        if snapshot is None:
            return None
        statistics = (self.episode_return.clone(), self.episode_length.clone())
        if not on_device:
            statistics = tuple(value.cpu() for value in statistics)
        return {"envs": snapshot, "episode_return": statistics[0], "episode_length": statistics[1]}

    def load_state_dict(self, state: dict) -> None:
        self.envs, _ = restore_envs(self.envs, state["envs"])
        self.episode_return.copy_(state["episode_return"])
        self.episode_length.copy_(state["episode_length"])

    def close(self) -> None:
        self.envs.close()
