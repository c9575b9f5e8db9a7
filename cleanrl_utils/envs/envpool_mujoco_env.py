"""envpool's C++ MuJoCo tasks (Weng et al. 2022; gymnasium's v5 Ant, Humanoid, Hopper ... written in C++ and stepped by
envpool's thread pool) behind the batched interface of MuJoCoWarpVecEnv: torch tensors on the training device in and
out, SAME_STEP autoreset, and info["final_obs"], ["done"], ["episode_return"], ["episode_length"] as tensors. A script
written for thousands of simulated worlds (ppo_isaacgym.py, fast_td3_isaacgym.py) runs them on a CPU this way.

    envs = EnvPoolMuJoCoVecEnv("Ant", num_envs=4096, device=torch.device("cpu"), seed=1, num_threads=2)
    obs = envs.reset()                                              # [num_envs, obs_dim], float32
    obs, reward, terminated, truncated, info = envs.step(actions)   # obs starts the next episode where one ended

envpool resets an ended environment on the step AFTER its end (that step ignores its action and returns the next
episode's first observation, reward 0). Here the ended environments are reset within the step instead, with envpool's
own partial reset (`reset(env_ids)`, which draws the same reset noise as its automatic one): the returned observation
starts the next episode, info["final_obs"] holds the true final one, so a truncation bootstraps from it, and no step is
spent on the reset. The whole pool is stepped at once (a synchronous pool: batch_size = num_envs) on `num_threads` of
envpool's threads; one host-to-device copy of the step's results and one device-to-host copy of the actions per step.
envpool cannot save a simulator's state: state_dict() returns None, and a resumed run starts fresh episodes.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

# The task names the scripts take, onto envpool's ids: gymnasium's v5 MuJoCo tasks.
ENVPOOL_TASKS = {
    name: f"{name}-v5"
    for name in (
        "Ant",
        "Humanoid",
        "Hopper",
        "HalfCheetah",
        "Walker2d",
        "HumanoidStandup",
        "InvertedDoublePendulum",
        "InvertedPendulum",
        "Pusher",
        "Reacher",
        "Swimmer",
    )
}


class EnvPoolMuJoCoVecEnv:
    """`num_envs` copies of an envpool MuJoCo task (a name of ENVPOOL_TASKS), seeded seed, seed + 1, ... as envpool
    seeds its environments. max_episode_steps: envpool's time limit (None: the task's, 1000)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: torch.device,
        seed: int,
        num_threads: int = 0,
        max_episode_steps: Optional[int] = None,
    ):
        import envpool

        limit = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        self.envs = envpool.make_gymnasium(
            ENVPOOL_TASKS[env_id], num_envs=num_envs, seed=seed, num_threads=num_threads, **limit
        )
        space = self.envs.single_action_space
        self.env_id, self.num_envs, self.device, self.seed = env_id, num_envs, device, seed
        self.obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.act_dim = int(space.shape[0])
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32, device=device)
        self.action_high = torch.as_tensor(space.high, dtype=torch.float32, device=device)
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int32, device=device)

    def reset(self) -> torch.Tensor:
        obs, info = self.envs.reset()
        in_order = np.empty((self.num_envs, self.obs_dim), dtype=np.float32)
        in_order[info["env_id"]] = obs
        self.episode_return.zero_()
        self.episode_length.zero_()
        return torch.from_numpy(in_order).to(self.device)

    def step(self, actions: torch.Tensor):
        actions = torch.maximum(torch.minimum(actions, self.action_high), self.action_low)
        obs, reward, terminated, truncated, info = self.envs.step(actions.cpu().numpy())
        # One float32 array of the step's results, rows in env order: [next obs | final obs | reward | terminated |
        # truncated], copied to the device at once.
        d = self.obs_dim
        results = np.empty((self.num_envs, 2 * d + 3), dtype=np.float32)
        rows = info["env_id"]
        results[rows, :d] = obs
        results[rows, d : 2 * d] = obs
        results[rows, 2 * d] = reward
        results[rows, 2 * d + 1] = terminated
        results[rows, 2 * d + 2] = truncated
        ended = np.flatnonzero(terminated | truncated)
        if ended.size:  # reset them now (SAME_STEP): their next observation starts the next episode
            reset_obs, reset_info = self.envs.reset(rows[ended].astype(np.int32))
            results[reset_info["env_id"], :d] = reset_obs
        results = torch.from_numpy(results).to(self.device)
        obs, final_obs = results[:, :d], results[:, d : 2 * d]
        reward = results[:, 2 * d]
        terminated, truncated = results[:, 2 * d + 1].bool(), results[:, 2 * d + 2].bool()
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        episode_return, episode_length = self.episode_return.clone(), self.episode_length.clone()
        info = dict(final_obs=final_obs, done=done, episode_return=episode_return, episode_length=episode_length)
        self.episode_return.masked_fill_(done, 0.0)
        self.episode_length.masked_fill_(done, 0)
        return obs, reward, terminated, truncated, info

    def check_buffers(self) -> Dict[str, float]:
        """envpool's simulators size their own buffers: nothing to check or log (see MuJoCoWarpVecEnv)."""
        return {}

    def state_dict(self, on_device: bool = False) -> None:
        """envpool cannot save its simulators' state: None (a resumed run starts fresh episodes)."""
        return None

    def load_state_dict(self, state: dict) -> None:
        raise TypeError("envpool's simulator state cannot be restored (state_dict() is None)")

    def close(self) -> None:
        self.envs.close()
