"""Tiny deterministic environments for the tests that run a script's own loop (tests/probe.py), registered with
gymnasium when this module is imported: `probe_script(..., preload=["probe_envs"])` imports it in the script's process.

ProbeWalk-v0 ends its episodes often and both ways, so that a few hundred steps hold many terminations and many
time-limit truncations; its rewards vary from step to step and every observation is distinct (the reset observation
that follows an episode's end is never equal to the true final one).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class ProbeWalk(gym.Env):
    """A walk on the integers from 0. Action 0 steps left, 1 stays, 2 steps right; reaching -3 or +3 terminates, and
    the registered time limit truncates after 8 steps (both at once where the 8th step reaches +-3). Observation:
    [position, steps taken / 8, a uniform draw in [-1, 1] from the env's seeded generator]. Reward: position / 2 plus
    a normal draw / 10."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.steps = 0, 0
        return self.observation(), {}

    def step(self, action):
        self.position += int(action) - 1
        self.steps += 1
        reward = self.position / 2 + self.np_random.normal() / 10
        return self.observation(), reward, abs(self.position) >= 3, False, {}

    def observation(self) -> np.ndarray:
        return np.array([self.position, self.steps / 8, self.np_random.uniform(-1, 1)], dtype=np.float32)


def probe_walk_ends(final_obs: np.ndarray) -> tuple[bool, bool]:
    """(terminated, truncated) of a ProbeWalk-v0 episode that ended in `final_obs`, read from its position and step
    count: for tests that see the true final observation of a step but not its flags."""
    return bool(abs(final_obs[0]) >= 3), bool(final_obs[1] >= 1)


if "ProbeWalk-v0" not in gym.registry:
    gym.register("ProbeWalk-v0", entry_point=ProbeWalk, max_episode_steps=8)
