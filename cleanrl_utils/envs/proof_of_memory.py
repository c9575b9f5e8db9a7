"""ProofofMemory-v0: a one-dimensional task that only an agent with memory can solve, registered on import.

The idea of Pleines et al.'s proof-of-memory environment (CleanRL's cleanrl/ppo_trxl/pom_env.py), written anew as a
gymnasium environment seeded through `reset(seed=...)` (CleanRL's draws from numpy's global generator).

The agent stands on a line of cells -1.0, -0.8, ..., 1.0 and moves left (action 0) or right (action 1) by 0.2. Both
ends are goals: one rewards, the other punishes, at random. The observation is [left goal, position, right goal]: the
goals read +1 / -1 during the first two steps, while the agent is frozen (its actions do nothing and earn nothing),
and 0 afterwards. Each move then costs 0.1, except the one that reaches an end, which ends the episode (terminated)
with +1.6 at the rewarding goal and -1.6 at the punishing one. The start is drawn from -0.4 ... 0.4. A TimeLimit cuts
an episode after 16 steps (truncated).

With memory the agent walks straight to the rewarding goal: 3 to 7 moves, an expected return of 1.2. Without, it can
only guess once the goals are hidden: at best about -0.28 (to the nearer end), -1.4 if it never reaches one.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "ProofofMemory-v0"
STEP = 0.2
SHOW_STEPS = 2  # the goals are visible, and the agent frozen, for this many steps
TIME_PENALTY = 0.1
GOAL_REWARD = 1.0 + (int(1.0 / STEP) + 1) * TIME_PENALTY  # 1.6, as CleanRL's
START_CELLS = (-2, -1, 0, 1, 2)  # in units of STEP
MAX_EPISODE_STEPS = 16


class ProofOfMemoryEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(low=-1.0, high=1.0, shape=(3,), dtype=np.float32)
        self._cell, self._goals, self._steps = 0, np.zeros(2, dtype=np.float32), 0

    def _obs(self) -> np.ndarray:
        goals = self._goals if self._steps < SHOW_STEPS else np.zeros(2, dtype=np.float32)
        return np.array([goals[0], self._cell * STEP, goals[1]], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._cell = int(self.np_random.choice(START_CELLS))
        self._goals = np.array([1.0, -1.0] if self.np_random.random() < 0.5 else [-1.0, 1.0], dtype=np.float32)
        self._steps = 0
        return self._obs(), {}

    def step(self, action):
        frozen = self._steps < SHOW_STEPS
        self._steps += 1
        if frozen:
            return self._obs(), 0.0, False, False, {}
        self._cell += 1 if int(action) == 1 else -1
        end = 0 if self._cell == -int(1.0 / STEP) else 1 if self._cell == int(1.0 / STEP) else None
        if end is None:
            return self._obs(), -TIME_PENALTY, False, False, {}
        reward = GOAL_REWARD if self._goals[end] > 0 else -GOAL_REWARD
        return self._obs(), float(reward), True, False, {}

    def render(self):
        """An RGB strip of 11 cells (40 x 40 pixels each): the goals green / red while shown, grey after; the agent
        blue."""
        if self.render_mode != "rgb_array":
            return None
        cells = np.full((11, 3), 230, dtype=np.uint8)
        for index, goal in ((0, self._goals[0]), (10, self._goals[1])):
            shown = self._steps < SHOW_STEPS
            cells[index] = ((0, 200, 0) if goal > 0 else (200, 0, 0)) if shown else (150, 150, 150)
        cells[self._cell + 5] = (0, 0, 255)
        return np.repeat(np.repeat(cells[None], 40, axis=0), 40, axis=1)


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=f"{__name__}:ProofOfMemoryEnv", max_episode_steps=MAX_EPISODE_STEPS)
