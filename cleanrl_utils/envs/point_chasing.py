"""PointChasing-v0: ElegantRL's point-chasing task (elegantrl/envs/PointChasingEnv.py) as a gymnasium environment,
single (NumPy) and torch-batched, both registered on import of this module.

    env = gym.make("PointChasing-v0")                      # PointChasingEnv: NumPy float32, one copy
    envs = gym.make_vec("PointChasing-v0", num_envs=4096, vectorization_mode="vector_entry_point", device="cuda")

The agent's point (p1, v1) chases a target point (p0, v0) in `dim` dimensions (default 2). One step, with the action
a in R^dim (the Box bounds [-1, 1] are the policy's range; any a is accepted and scaled, never clipped) and the
target's drift u ~ U[0, 1)^dim drawn afresh each step:

    n = max(|a|, 1)                    # |.| the Euclidean norm; a / n lies in the unit ball
    v1 <- 0.75 v1 + a / n,   p1 <- p1 + 0.01 v1          # the agent first,
    v0 <- 0.50 v0 + u,       p0 <- p0 + 0.01 v0          # then the target, which drifts towards +1 in every axis
    reward = |p0 - p1| (before) - |p0 - p1| (after) - 0.02 n       # distance closed minus the action cost
    terminated = |p0 - p1| (after) < dim;   truncated = (step count == 1024) and not terminated

The start: p0 ~ N(0, 1)^dim, p1 ~ N(-8, 1)^dim, v0 = v1 = 0. The observation is [p0, v0, p1, v1] (4 dim floats,
target first). As in ElegantRL the action cost 0.02 max(|a|, 1) is at least 0.02 per step: within the unit ball it is a
time penalty, beyond it a push on the norm. The sensible choices where ElegantRL is ambiguous or broken: float32
throughout (its single env is float64); its vectorised env keeps the old episode's last distance after a reset, so the
first reward of every new episode is wrong by a whole start distance: here the distance is always computed from the
current positions; its vectorised env resets in a Python loop, merges terminations and truncations into one float and
returns no final observation: here the reset is one batched torch.where, the two flags are separate, and the true
final observation is returned. Solved means reaching the target before the 1024-step cut: from about 11.3 apart the
agent closes about 0.026 per step at full speed, so a good policy ends in about 350 steps with a return of about +2;
a random policy drifts apart and gets about -35 (benchmark/point_chasing.sh).

PointChasingVecEnv (the vector_entry_point) holds every copy's state as [num_envs, 4, dim] tensors on `device`,
steps all copies with the same few batched torch ops, and draws starts and drifts from one torch.Generator (seeded by
reset(seed=...); copy i of a batch is not a single env seeded alike). It takes actions as a tensor or array
[num_envs, dim] and returns torch tensors on its device: obs [num_envs, 4 dim] float32, rewards float32, terminations
and truncations bool. It autoresets in the same step (gymnasium's SAME_STEP): an ended copy returns its fresh start in
obs, its true last observation in infos["final_obs"] and True in infos["_final_obs"]. Unlike gymnasium's object array,
final_obs is always there, a [num_envs, 4 dim] tensor equal to obs where no episode ended (no host read to ask which
did). infos["episode"] {"r", "l"} with infos["_episode"] are the return and length of the episodes that just ended, as
RecordEpisodeStatistics gives them, kept on the device. Neither env is wrapped in a TimeLimit: the 1024-step cut is
the environment's own (`max_steps`).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

ENV_ID = "PointChasing-v0"
MAX_STEPS = 1024  # 2**10, as ElegantRL
START_DISTANCE = 8.0  # the agent starts about 8 behind the target in every axis
AGENT_DECAY, TARGET_DECAY, DT, ACTION_COST = 0.75, 0.5, 0.01, 0.02


def start_state(noise):
    """[..., 4, dim] start states (rows p0, v0, p1, v1) from standard normal `noise` [..., 2, dim]: NumPy or torch."""
    xp = torch if isinstance(noise, torch.Tensor) else np
    target, agent = noise[..., 0, :], noise[..., 1, :] - START_DISTANCE
    return xp.stack([target, xp.zeros_like(target), agent, xp.zeros_like(agent)], -2)


def chase_step(state, action, drift):
    """ElegantRL's equations for a batch: state [..., 4, dim], action and drift [..., dim] -> (next state, reward,
    distance after). One function for NumPy arrays and torch tensors, so that both envs compute the same floats."""
    xp = torch if isinstance(state, torch.Tensor) else np
    target, target_velocity, agent, agent_velocity = (state[..., row, :] for row in range(4))
    distance = xp.sqrt(((target - agent) ** 2).sum(-1))
    norm = xp.clip(xp.sqrt((action**2).sum(-1)), 1.0, None)
    agent_velocity = AGENT_DECAY * agent_velocity + action / norm[..., None]
    agent = agent + DT * agent_velocity
    target_velocity = TARGET_DECAY * target_velocity + drift
    target = target + DT * target_velocity
    next_distance = xp.sqrt(((target - agent) ** 2).sum(-1))
    reward = distance - next_distance - ACTION_COST * norm
    return xp.stack([target, target_velocity, agent, agent_velocity], -2), reward, next_distance


def spaces(dim: int) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    observation = gym.spaces.Box(-np.inf, np.inf, (4 * dim,), np.float32)
    return observation, gym.spaces.Box(-1.0, 1.0, (dim,), np.float32)


class PointChasingEnv(gym.Env):
    """One copy, NumPy float32. reset(options={"state": [4 dim] array}) starts from a given [p0, v0, p1, v1]."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, dim: int = 2, max_steps: int = MAX_STEPS, render_mode: str | None = None):
        self.dim, self.max_steps, self.reach, self.render_mode = dim, max_steps, float(dim), render_mode
        self.observation_space, self.action_space = spaces(dim)
        self.state, self.steps = np.zeros((4, dim), np.float32), 0

    def _start_noise(self) -> np.ndarray:
        return self.np_random.standard_normal((2, self.dim), dtype=np.float32)

    def _drift(self) -> np.ndarray:
        return self.np_random.random(self.dim, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "state" in options:
            self.state = np.asarray(options["state"], np.float32).reshape(4, self.dim).copy()
        else:
            self.state = start_state(self._start_noise())
        self.steps = 0
        return self.state.reshape(-1).copy(), {}

    def step(self, action):
        action = np.asarray(action, np.float32).reshape(self.dim)
        state, reward, distance = chase_step(self.state[None], action[None], self._drift()[None])
        self.state, self.steps = state[0], self.steps + 1
        terminated = bool(distance[0] < self.reach)
        truncated = self.steps >= self.max_steps and not terminated
        return self.state.reshape(-1).copy(), float(reward[0]), terminated, truncated, {}

    def render(self, size: int = 128) -> np.ndarray | None:
        """A top view of the first two axes: 24 units wide around the midpoint; the target red with its reach
        circle, the agent blue."""
        if self.render_mode != "rgb_array":
            return None
        target, agent = self.state[0, :2], self.state[2, :2]
        pixels = (np.arange(size) + 0.5) * 24.0 / size - 12.0
        x, y = np.meshgrid(pixels, -pixels)  # image rows run down, y up
        frame = np.full((size, size, 3), 255, np.uint8)
        to_target = np.hypot(x + (agent[0] - target[0]) / 2, y + (agent[1] - target[1]) / 2)
        to_agent = np.hypot(x - (agent[0] - target[0]) / 2, y - (agent[1] - target[1]) / 2)
        frame[np.abs(to_target - self.reach) < 0.1] = (255, 180, 180)
        frame[to_target < 0.4] = (220, 30, 30)
        frame[to_agent < 0.4] = (30, 60, 220)
        return frame


class PointChasingVecEnv(VectorEnv):
    """num_envs copies as tensors on `device`, SAME_STEP autoreset (see the module docstring for what it returns).
    reset(options={"state": [num_envs, 4 dim]}) starts every copy from a given [p0, v0, p1, v1]."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 1, dim: int = 2, max_steps: int = MAX_STEPS, device: str | torch.device = "cpu"):
        self.num_envs, self.dim, self.max_steps, self.reach = num_envs, dim, max_steps, float(dim)
        self.device = torch.device(device)
        self.single_observation_space, self.single_action_space = spaces(dim)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.generator = torch.Generator(self.device)
        self.generator.seed()  # unseeded until reset(seed=...), as gymnasium's envs
        self.state = torch.zeros(num_envs, 4, dim, device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.returns = torch.zeros(num_envs, device=self.device)

    def _start_noise(self) -> torch.Tensor:
        return torch.randn(self.num_envs, 2, self.dim, generator=self.generator, device=self.device)

    def _drift(self) -> torch.Tensor:
        return torch.rand(self.num_envs, self.dim, generator=self.generator, device=self.device)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.generator.manual_seed(seed)
        if options and "state" in options:
            state = torch.as_tensor(options["state"], dtype=torch.float32, device=self.device)
            self.state = state.reshape(self.num_envs, 4, self.dim).clone()
        else:
            self.state = start_state(self._start_noise())
        self.steps.zero_()
        self.returns.zero_()
        return self.state.reshape(self.num_envs, -1), {}

    def step(self, actions):
        actions = torch.as_tensor(actions, dtype=torch.float32, device=self.device).reshape(self.num_envs, self.dim)
        state, rewards, distance = chase_step(self.state, actions, self._drift())
        steps, returns = self.steps + 1, self.returns + rewards
        terminations = distance < self.reach
        truncations = (steps >= self.max_steps) & ~terminations
        done = terminations | truncations
        # Every copy draws a start each step and the ended ones keep it: one batched op, no host read of `done`.
        self.state = torch.where(done[:, None, None], start_state(self._start_noise()), state)
        self.steps, self.returns = steps.masked_fill(done, 0), returns.masked_fill(done, 0.0)
        infos = {
            "final_obs": state.reshape(self.num_envs, -1),
            "_final_obs": done,
            "episode": {"r": returns, "l": steps},
            "_episode": done,
        }
        return self.state.reshape(self.num_envs, -1), rewards, terminations, truncations, infos


if ENV_ID not in gym.registry:
    gym.register(
        ENV_ID,
        entry_point="cleanrl_utils.envs.point_chasing:PointChasingEnv",
        vector_entry_point="cleanrl_utils.envs.point_chasing:PointChasingVecEnv",
    )
