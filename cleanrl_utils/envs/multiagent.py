"""VMAS and MPE (mpe2) tasks as batched tensors for the multi-agent scripts.

    envs = make_env("vmas/navigation", num_envs, device, seed, continuous_actions=True, max_episode_steps=None)
    obs = envs.reset()                                   # [num_envs, n_agents, obs_dim]
    next_obs, rewards, terminated, truncated, final_obs, info = envs.step(actions)
    episodes = envs.read_episodes()                      # the episodes that ended since the last read, or None

Layout, the same for both families: observations [num_envs, n_agents, obs_dim] (agents in the
simulator's order, smaller observations zero-padded to the largest), rewards [num_envs, n_agents],
terminated and truncated [num_envs] (an episode ends for all agents of a world at once; truncation
is the time limit). step() resets finished worlds in the same step (gymnasium's SAME_STEP autoreset)
and returns their true last observation in `final_obs` (elsewhere final_obs is next_obs), for
bootstrapping truncated episodes. `info` holds, per world, "done" [num_envs], "episode_return"
[num_envs, n_agents] and "episode_length" [num_envs] (meaningful where done). The adapters also add
up the finished episodes, as RecordEpisodeStatistics does, on the device: `read_episodes()` reads
them back with one host read and starts a new tally.

What the critic sees (a global state) is an algorithmic choice and stays in each script. The
simulators' state cannot be saved, so a resumed run starts from freshly reset environments.
vmas and mpe2 are imported when an environment is made, so --help and bad-input checks stay fast.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

import numpy as np
import torch

from cleanrl_utils.errors import fail

# Scenarios the scripts accept. VMAS: every scenario the package ships. MPE: the cooperative mpe2
# tasks whose agents share one observation size and one action space (parameter sharing needs that).
VMAS_SCENARIOS = (
    "balance",
    "ball_passage",
    "ball_trajectory",
    "buzz_wire",
    "discovery",
    "dispersion",
    "dropout",
    "flocking",
    "football",
    "give_way",
    "joint_passage",
    "joint_passage_size",
    "multi_give_way",
    "navigation",
    "passage",
    "reverse_transport",
    "road_traffic",
    "sampling",
    "transport",
    "wheel",
    "wind_flocking",
)
MPE_SCENARIOS = ("simple_spread_v3", "simple_reference_v3")
KNOWN_ENV_IDS = [f"vmas/{name}" for name in VMAS_SCENARIOS] + [f"mpe/{name}" for name in MPE_SCENARIOS]
# The episode time limit when --max-episode-steps is None: VMAS 100 steps (as in BenchMARL), MPE 25
# (as in the MPE papers).
DEFAULT_MAX_EPISODE_STEPS = {"vmas": 100, "mpe": 25}


def check_env_id(env_id: str) -> None:
    """Fail in one line, naming the nearest known ids, unless env_id is a known scenario."""
    if env_id in KNOWN_ENV_IDS:
        return
    near = difflib.get_close_matches(env_id, KNOWN_ENV_IDS, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    fail(f"unknown --env-id {env_id!r}; {hint}known: {', '.join(KNOWN_ENV_IDS)}")


def same_action_space(spaces: list) -> bool:
    """Whether all agents' action spaces are one: same type, shape, number of actions and bounds."""
    first = spaces[0]
    return all(
        type(space) is type(first)
        and getattr(space, "shape", None) == getattr(first, "shape", None)
        and getattr(space, "n", None) == getattr(first, "n", None)
        and np.array_equal(getattr(space, "low", None), getattr(first, "low", None))
        and np.array_equal(getattr(space, "high", None), getattr(first, "high", None))
        for space in spaces
    )


@dataclass
class Episodes:
    """The episodes that ended since the last read: their number and their means."""

    count: int
    agent_returns: list[float]  # the mean episode return of each agent, in agent order
    length: float  # the mean episode length

    @property
    def team_return(self) -> float:
        """The mean team return: the sum over agents of their returns."""
        return sum(self.agent_returns)

    def agent_scalars(self) -> dict[str, float]:
        """charts/episodic_return_agent{i} and charts/episodic_return_mean_agent (the mean over
        agents of their returns, BenchMARL's convention)."""
        scalars = {f"charts/episodic_return_agent{i}": value for i, value in enumerate(self.agent_returns)}
        scalars["charts/episodic_return_mean_agent"] = self.team_return / len(self.agent_returns)
        return scalars


class EpisodeTally:
    """Sums of the finished episodes on the device: [count, length sum, each agent's return sum]."""

    def __init__(self, n_agents: int, device: torch.device):
        self.sums = torch.zeros(2 + n_agents, dtype=torch.float64, device=device)

    def add(self, done: torch.Tensor, episode_returns: torch.Tensor, episode_lengths: torch.Tensor) -> None:
        done = done.double()
        count_and_length = torch.stack([done.sum(), (episode_lengths * done).sum()])
        self.sums += torch.cat([count_and_length, (episode_returns.double() * done.unsqueeze(1)).sum(0)])

    def read(self) -> Episodes | None:
        count, length_sum, *return_sums = self.sums.tolist()  # the one host read
        self.sums.zero_()
        if count == 0:
            return None
        return Episodes(int(count), [value / count for value in return_sums], length_sum / count)


class MultiAgentVecEnv:
    """What both adapters share: the action description and the episode tally."""

    def _describe_actions(self, action_spaces: list, continuous_actions: bool, device: torch.device) -> None:
        self.continuous = continuous_actions
        self.action_spaces = action_spaces
        self.same_action_space = same_action_space(action_spaces)
        first = action_spaces[0]
        if continuous_actions:
            self.act_dim = first.shape[0]
            self.action_low = torch.as_tensor(first.low, dtype=torch.float32, device=device)
            self.action_high = torch.as_tensor(first.high, dtype=torch.float32, device=device)
        else:
            self.num_actions = int(first.n)

    def read_episodes(self) -> Episodes | None:
        """The episodes that ended since the last read (one host read), or None when none did."""
        return self.tally.read()


class VMASVecEnv(MultiAgentVecEnv):
    """A VMAS scenario as batched tensors on the training device.

    VMAS resets one world per call (`reset_at(index)`), so a step with finished worlds reads their
    indices back to the host once; everything else stays on the device.
    """

    def __init__(
        self,
        scenario: str,
        num_envs: int,
        device: torch.device,
        seed: int,
        continuous_actions: bool,
        max_episode_steps: int,
    ):
        import vmas

        self.env = vmas.make_env(
            scenario,
            num_envs=num_envs,
            device=device,
            continuous_actions=continuous_actions,
            seed=seed,
            max_steps=max_episode_steps,
            terminated_truncated=True,
        )
        self.num_envs, self.n_agents, self.device = num_envs, self.env.n_agents, device
        self.max_episode_steps = max_episode_steps
        self.obs_dims = [space.shape[0] for space in self.env.observation_space]
        self.obs_dim = max(self.obs_dims)
        self._describe_actions(list(self.env.action_space), continuous_actions, device)
        self.episode_returns = torch.zeros(num_envs, self.n_agents, device=device)
        self.episode_lengths = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.tally = EpisodeTally(self.n_agents, device)

    def _stack(self, obs_list: list[torch.Tensor]) -> torch.Tensor:
        obs = torch.zeros(self.num_envs, self.n_agents, self.obs_dim, device=self.device)
        for agent, agent_obs in enumerate(obs_list):  # a loop over agents, not over environments
            obs[:, agent, : agent_obs.shape[-1]] = agent_obs
        return obs

    def reset(self) -> torch.Tensor:
        self.episode_returns.zero_()
        self.episode_lengths.zero_()
        return self._stack(self.env.reset())

    def step(self, actions: torch.Tensor):
        """actions: [num_envs, n_agents, act_dim] floats (continuous) or [num_envs, n_agents] integers."""
        obs_list, reward_list, terminated, truncated, _ = self.env.step(list(actions.unbind(1)))
        next_obs, rewards = self._stack(obs_list), torch.stack(reward_list, dim=1)
        self.episode_returns += rewards
        self.episode_lengths += 1
        done = terminated | truncated
        info = {
            "done": done,
            "episode_return": self.episode_returns.clone(),
            "episode_length": self.episode_lengths.clone(),
        }
        self.tally.add(done, self.episode_returns, self.episode_lengths)
        final_obs = next_obs.clone()
        if done.all():  # worlds started together hit the time limit together: one batched reset
            next_obs = self._stack(self.env.reset())
        elif done.any():
            for index in done.nonzero().flatten().tolist():
                self.env.reset_at(index, return_observations=False)
            observations = self.env.get_from_scenario(
                get_observations=True, get_rewards=False, get_infos=False, get_dones=False
            )[0]
            next_obs = self._stack(observations)
        self.episode_returns *= (~done).unsqueeze(1)
        self.episode_lengths *= ~done
        return next_obs, rewards, terminated, truncated, final_obs, info

    def close(self):
        pass


class MPEVecEnv(MultiAgentVecEnv):
    """num_envs copies of an mpe2 task (PettingZoo parallel API) with the same tensor layout as VMASVecEnv.

    MPE runs on numpy in the host process; the copies are stepped in turn and the stacked observations
    cross to the device once per step. Agents keep PettingZoo's `possible_agents` order everywhere
    (observations, actions, rewards), which is also the order of mpe2's `state()` (the concatenated
    observations). Copy i is seeded with seed + i at the first reset; later resets continue its RNG.
    """

    def __init__(
        self,
        name: str,
        num_envs: int,
        device: torch.device,
        seed: int,
        continuous_actions: bool,
        max_episode_steps: int,
    ):
        module = importlib.import_module(f"mpe2.{name}")
        self.envs = [
            module.parallel_env(max_cycles=max_episode_steps, continuous_actions=continuous_actions)
            for _ in range(num_envs)
        ]
        self.agents = list(self.envs[0].possible_agents)
        self.num_envs, self.n_agents, self.device, self.seed = num_envs, len(self.agents), device, seed
        self.max_episode_steps = max_episode_steps
        self.obs_dims = [self.envs[0].observation_space(agent).shape[0] for agent in self.agents]
        self.obs_dim = max(self.obs_dims)
        self._describe_actions([self.envs[0].action_space(agent) for agent in self.agents], continuous_actions, device)
        self.obs = np.zeros((num_envs, self.n_agents, self.obs_dim), dtype=np.float32)
        self.episode_returns = np.zeros((num_envs, self.n_agents), dtype=np.float32)
        self.episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self.tally = EpisodeTally(self.n_agents, torch.device("cpu"))  # the episodes end on the host

    def _write_obs(self, out: np.ndarray, env_index: int, obs: dict):
        for agent, name in enumerate(self.agents):
            out[env_index, agent, : self.obs_dims[agent]] = obs[name]

    def reset(self) -> torch.Tensor:
        for index, env in enumerate(self.envs):
            obs, _ = env.reset(seed=self.seed + index)
            self._write_obs(self.obs, index, obs)
        self.episode_returns[:] = 0
        self.episode_lengths[:] = 0
        return torch.as_tensor(self.obs, device=self.device)

    def step(self, actions: torch.Tensor):
        actions = actions.cpu().numpy()  # the one device-to-host copy of the step
        rewards = np.zeros((self.num_envs, self.n_agents), dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        final_obs = np.zeros_like(self.obs)
        for index, env in enumerate(self.envs):
            obs, reward, term, trunc, _ = env.step(
                {name: actions[index, agent] for agent, name in enumerate(self.agents)}
            )
            self._write_obs(final_obs, index, obs)
            rewards[index] = [reward[name] for name in self.agents]
            terminated[index] = any(term[name] for name in self.agents)
            truncated[index] = any(trunc[name] for name in self.agents) and not terminated[index]
            if terminated[index] or truncated[index]:
                obs, _ = env.reset()
            self._write_obs(self.obs, index, obs)
        self.episode_returns += rewards
        self.episode_lengths += 1
        done = terminated | truncated
        self.tally.add(*map(torch.from_numpy, (done, self.episode_returns, self.episode_lengths)))

        def to_device(array: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(array, device=self.device)

        info = {
            "done": to_device(done),
            "episode_return": to_device(self.episode_returns.copy()),
            "episode_length": to_device(self.episode_lengths.copy()),
        }
        self.episode_returns[done] = 0
        self.episode_lengths[done] = 0
        return (
            to_device(self.obs.copy()),
            to_device(rewards),
            to_device(terminated),
            to_device(truncated),
            to_device(final_obs),
            info,
        )

    def close(self):
        for env in self.envs:
            env.close()


def make_env(
    env_id: str, num_envs: int, device: torch.device, seed: int, continuous_actions: bool, max_episode_steps: int | None
) -> VMASVecEnv | MPEVecEnv:
    """env_id is "vmas/<scenario>" or "mpe/<task>" (check it first with check_env_id);
    max_episode_steps None takes the family's usual horizon (DEFAULT_MAX_EPISODE_STEPS)."""
    family, name = env_id.split("/", 1)
    adapter = VMASVecEnv if family == "vmas" else MPEVecEnv
    return adapter(
        name, num_envs, device, seed, continuous_actions, max_episode_steps or DEFAULT_MAX_EPISODE_STEPS[family]
    )
