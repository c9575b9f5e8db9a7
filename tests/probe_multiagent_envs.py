"""A tiny multi-agent environment for the tests that run a multi-agent script's own loop (tests/probe.py):
`probe_script(..., preload=["probe_multiagent_envs"])` imports this module in the script's process, where it adds
the id "probe/walk" to cleanrl_utils.envs.multiagent (KNOWN_ENV_IDS and make_env, which the scripts import after it);
every other id still goes to VMAS and mpe2 unchanged. Tests build the same environment with `make_walk` to replay what
the script's loop was given.

VMAS and MPE rarely end an episode by termination under a random policy (MPE never does), so a few hundred of their
steps hold no terminations; this walk ends its episodes often and both ways, all in torch on the CPU.
"""

from __future__ import annotations

import torch
from gymnasium.spaces import Box, Discrete

import cleanrl_utils.envs.multiagent as multiagent

ENV_ID = "probe/walk"
N_AGENTS, OBS_DIM, ACT_DIM, NUM_ACTIONS = 3, 4, 2, 3
MAX_EPISODE_STEPS = 6


class MultiWalk(multiagent.MultiAgentVecEnv):
    """Three agents walk on a line from 0, num_envs worlds at once, with the adapters' interface (see
    cleanrl_utils/envs/multiagent.py). Agent i moves by its action: discrete 0, 1, 2 step -1, 0, +1; continuous
    [-1, 1]^2 moves by the first dimension (the second only changes the reward). A world terminates at each step with
    probability 0.2, whatever the agents do (so that a greedy policy still sees truncations), and is truncated after
    max_episode_steps steps (both at once where the last step also terminates, as VMAS reports them). Agent i
    observes [its position, the team's position (the sum of the agents'), steps taken / max_episode_steps, a cue: a
    uniform draw in [-1, 1]]: the agents' observations differ, and a reset observation never equals the true final
    one. Agent i's reward: its move times the cue it observed before it (the best action depends on the
    observation), - |own position| / 4 (- |second action dimension| / 4 when continuous) + a normal draw / 10. Random
    draws come from the environment's own generator seeded with `seed`: the same seed and actions give the same
    transitions."""

    def __init__(self, num_envs: int, device: torch.device, seed: int, continuous: bool, max_episode_steps: int):
        self.num_envs, self.n_agents, self.obs_dim, self.device = num_envs, N_AGENTS, OBS_DIM, device
        self.obs_dims = [OBS_DIM] * N_AGENTS
        self.max_episode_steps = max_episode_steps
        space = Box(-1.0, 1.0, (ACT_DIM,)) if continuous else Discrete(NUM_ACTIONS)
        self._describe_actions([space] * N_AGENTS, continuous, device)
        self.generator = torch.Generator().manual_seed(seed)
        self.positions = torch.zeros(num_envs, N_AGENTS)
        self.steps = torch.zeros(num_envs)
        self.episode_returns = torch.zeros(num_envs, N_AGENTS)
        self.episode_lengths = torch.zeros(num_envs, dtype=torch.long)
        self.tally = multiagent.EpisodeTally(N_AGENTS, torch.device("cpu"))

    def _observe(self) -> torch.Tensor:
        self.cues = torch.rand(self.num_envs, N_AGENTS, generator=self.generator) * 2 - 1
        team = self.positions.sum(1, keepdim=True).expand(-1, N_AGENTS)
        steps = (self.steps / self.max_episode_steps).unsqueeze(1).expand(-1, N_AGENTS)
        return torch.stack([self.positions, team, steps, self.cues], dim=-1)

    def reset(self) -> torch.Tensor:
        self.positions.zero_()
        self.steps.zero_()
        self.episode_returns.zero_()
        self.episode_lengths.zero_()
        return self._observe().to(self.device)

    def step(self, actions: torch.Tensor):
        actions = actions.cpu()
        if self.continuous:
            moves, effort = actions[..., 0].float(), actions[..., 1].float().abs() / 4
        else:
            moves, effort = actions.float() - 1, torch.zeros(self.num_envs, N_AGENTS)
        self.positions += moves
        self.steps += 1
        noise = torch.randn(self.num_envs, N_AGENTS, generator=self.generator) / 10
        rewards = moves * self.cues - self.positions.abs() / 4 - effort + noise
        terminated = torch.rand(self.num_envs, generator=self.generator) < 0.2
        truncated = self.steps >= self.max_episode_steps
        final_obs = self._observe()
        done = terminated | truncated
        final_cues = self.cues
        self.episode_returns += rewards
        self.episode_lengths += 1
        self.tally.add(done, self.episode_returns, self.episode_lengths)
        info = {
            "done": done,
            "episode_return": self.episode_returns.clone(),
            "episode_length": self.episode_lengths.clone(),
        }
        self.positions[done] = 0
        self.steps[done] = 0
        self.episode_returns[done] = 0
        self.episode_lengths[done] = 0
        next_obs = torch.where(done[:, None, None], self._observe(), final_obs)
        self.cues = torch.where(done[:, None], self.cues, final_cues)  # the cues of the observation returned
        to = lambda x: x.to(self.device)  # noqa: E731
        return (
            to(next_obs),
            to(rewards),
            to(terminated),
            to(truncated),
            to(final_obs),
            {k: to(v) for k, v in info.items()},
        )

    def close(self):
        pass


def make_walk(num_envs: int, device: torch.device, seed: int, continuous: bool, max_episode_steps: int | None = None):
    return MultiWalk(num_envs, device, seed, continuous, max_episode_steps or MAX_EPISODE_STEPS)


_make_env = multiagent.make_env


def make_env(env_id, num_envs, device, seed, continuous_actions, max_episode_steps):
    if env_id == ENV_ID:
        return make_walk(num_envs, device, seed, continuous_actions, max_episode_steps)
    return _make_env(env_id, num_envs, device, seed, continuous_actions, max_episode_steps)


if ENV_ID not in multiagent.KNOWN_ENV_IDS:
    multiagent.KNOWN_ENV_IDS.append(ENV_ID)
    multiagent.make_env = make_env
