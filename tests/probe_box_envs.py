"""A tiny environment with continuous actions for the tests that run a script's own loop (tests/probe.py), registered
with gymnasium when this module is imported: `probe_script(..., preload=["probe_box_envs"])` imports it in the
script's process (as tests/probe_envs.py does for discrete actions).

ProbeDrift-v0 ends its episodes often and both ways, so that a hundred steps hold many terminations and many
time-limit truncations; its action bounds are asymmetric and of different widths (a missing action scale or bias
shows); its rewards vary from step to step and every observation is distinct (the reset observation that follows an
episode's end is never equal to the true final one). Pure NumPy: a step costs microseconds.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

LOW, HIGH = np.array([-1.0, 0.0], dtype=np.float32), np.array([2.0, 5.0], dtype=np.float32)


class ProbeDrift(gym.Env):
    """A point in the plane, from the origin, pushed by the action and by a random wind: the action a in [LOW, HIGH]
    (clipped to them), mapped onto u in [-1, 1]^2 ((a - middle) / half-range), moves it by 0.1 u plus 0.3 times a
    normal draw per axis from the env's seeded generator; leaving the square max |x_i| < 1 terminates, and the
    registered time limit truncates after 8 steps. The wind ends half to two thirds of the episodes by
    termination, whatever the policy. Observation: [x_0, x_1, steps taken / 8, a uniform draw in [-1, 1]].
    Reward: x_0 - x_1 / 2 - |u|^2 / 10 plus a normal draw / 10."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Box(LOW, HIGH, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.steps = np.zeros(2), 0
        return self.observation(), {}

    def step(self, action):
        u = (np.clip(np.asarray(action, dtype=np.float64), LOW, HIGH) - (LOW + HIGH) / 2) / ((HIGH - LOW) / 2)
        self.position = self.position + 0.1 * u + 0.3 * self.np_random.normal(size=2)
        self.steps += 1
        reward = self.position[0] - self.position[1] / 2 - (u**2).sum() / 10 + self.np_random.normal() / 10
        return self.observation(), float(reward), bool(np.abs(self.position).max() >= 1.0), False, {}

    def observation(self) -> np.ndarray:
        extra = [self.steps / 8, self.np_random.uniform(-1, 1)]
        return np.array([*self.position, *extra], dtype=np.float32)


if "ProbeDrift-v0" not in gym.registry:
    gym.register("ProbeDrift-v0", entry_point=ProbeDrift, max_episode_steps=8)
