"""Multi-Agent Deep Deterministic policy gradient (MADDPG) for cooperative tasks with continuous actions.

Lowe et al. 2017, "Multi-Agent Actor-Critic for Mixed Cooperative-Competitive Environments"
(https://arxiv.org/abs/1706.02275): DDPG with decentralised actors and centralised critics. Each
agent acts on its own observation; its critic Q_i(s, a_1 ... a_n) sees every agent's observation and
every agent's action and is trained on that agent's own reward. The actor of agent i climbs Q_i with
its own action replaced by the actor's output and the other agents' actions taken from the replay
buffer. Target networks track the online ones by Polyak averaging (tau).

Parameter sharing, as in BenchMARL's default for the homogeneous agents of VMAS and MPE: one actor
network serves all agents and one critic network serves all critics Q_i, each taking the one-hot
agent id in its input, so agents still act and are valued differently.
- actor:  [own observation, one-hot id] -> deterministic tanh output scaled to the env's bounds
  (VMAS: [-u_range, u_range]; MPE continuous: [0, 1]); Gaussian exploration noise during training.
- critic: critic_input(obs, actions) = [global_state(obs) (all observations, agent order),
  all actions concatenated in agent order, one-hot id] -> Q_i, one value per agent.

Action space: continuous (Box) only; for discrete actions use qmix.py, vdn.py or mappo.py.
Environments: VMAS scenarios (`vmas/<scenario>`, torch-batched, state on the training device) and the
cooperative MPE tasks of mpe2 (`mpe/simple_spread_v3`, `mpe/simple_reference_v3`, PettingZoo parallel
API, num_envs copies stepped on the host).

    uv run python cleanrl/maddpg.py --env-id vmas/navigation
    uv run python cleanrl/maddpg.py --env-id mpe/simple_spread_v3 --num-envs 16

Expect, with the settings of benchmark/maddpg.sh (128 worlds, 4 gradient steps per vector step, 192k
steps, 128-wide networks, learning rates 1e-3, gamma 0.95; about three minutes on one CPU core), a
team return of about 16 on vmas/navigation over the last episodes (seed 1; a uniformly random policy
scores about -3); results in benchmark/results/maddpg.

Updates: every vector step (num_envs transitions of whole worlds) is followed by --gradient-steps
gradient steps on minibatches of --batch-size transitions (each with all agents), once the replay
buffer holds --learning-starts steps (uniformly random actions until then). The buffer stores the
true next observation of a finished episode and its termination (not its truncation), so a
time-limit truncation is bootstrapped and only a termination cuts the target.
Checkpoints hold the networks, their targets, the optimisers, the replay buffer, the episode
statistics, counters and random generators. Neither VMAS nor mpe2 state can be serialised here, so
--resume continues with freshly reset environments (episodes in progress at the checkpoint are lost).
"""

import difflib
import importlib
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import (
    CHECKPOINT_NAME,
    StopSignal,
    load_checkpoint,
    load_model,
    restore_rng_state,
    save_checkpoint,
    save_model,
)
from cleanrl_utils.errors import check_positive, fail
from cleanrl_utils.progress import Progress
from cleanrl_utils.run import Run


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use a GPU when one is present (the CPU otherwise)"""
    torch_threads: int = 0
    """CPU threads for torch; 0 = one per core (torch's default)"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported: VMAS renders through pyglet, which needs a display stack"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "vmas/navigation"
    """the scenario: vmas/<scenario> or mpe/<task>"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment (one step of all num_envs worlds counts num_envs)"""
    num_envs: int = 64
    """the number of parallel worlds"""
    continuous_actions: bool = True
    """the action type the simulator is built with (this script needs continuous actions)"""
    max_episode_steps: int | None = None
    """episode length limit (None: VMAS 100, MPE 25)"""

    # Algorithm specific arguments
    actor_learning_rate: float = 3e-4
    """the learning rate of the actor's optimizer"""
    critic_learning_rate: float = 1e-3
    """the learning rate of the critic's optimizer"""
    hidden_dim: int = 256
    """width of the two hidden layers of the actor and the critic"""
    buffer_size: int = 1000000
    """the replay memory buffer size, in transitions (one world's step, all agents)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient (Polyak averaging of the target networks)"""
    batch_size: int = 256
    """the number of transitions (each with all agents) per gradient step"""
    gradient_steps: int = 1
    """gradient steps after each vector step of num_envs transitions"""
    exploration_noise: float = 0.1
    """the standard deviation of the exploration noise (in units of the action half-range)"""
    learning_starts: int = 10000
    """timestep to start learning (uniformly random actions until then)"""
    log_every: int = 10
    """read losses and episode statistics back to the host every this many vector steps"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""


# --- environments: the shared multi-agent section (VMAS and MPE as batched tensors) --------------

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


def check_env_id(env_id: str) -> str | None:
    """None when env_id names a known scenario, else a one-line message listing the nearest known ids."""
    if env_id in KNOWN_ENV_IDS:
        return None
    near = difflib.get_close_matches(env_id, KNOWN_ENV_IDS, n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    return f"unknown --env-id {env_id!r}; {hint}known: {', '.join(KNOWN_ENV_IDS)}"


class VMASVecEnv:
    """A VMAS scenario as batched tensors on the training device.

    Layout shared with MPEVecEnv: observations [num_envs, n_agents, obs_dim] (agents in VMAS's order,
    smaller observations zero-padded to the largest), rewards [num_envs, n_agents], terminated and
    truncated [num_envs] (VMAS ends an episode for all agents of a world at once; truncation is the
    --max-episode-steps time limit). step() auto-resets finished worlds and returns the true last
    observation of a finished episode in `final_obs`, for bootstrapping truncated episodes.
    VMAS resets one world per call (`reset_at(index)`), so a step with finished worlds reads their indices
    back to the host once; everything else stays on the device.
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
        self.obs_dims = [space.shape[0] for space in self.env.observation_space]
        self.obs_dim = max(self.obs_dims)
        self.continuous = continuous_actions
        self.action_spaces = list(self.env.action_space)
        first = self.action_spaces[0]
        self.same_action_space = all(
            type(space) is type(first)
            and getattr(space, "shape", None) == first.shape
            and getattr(space, "n", None) == getattr(first, "n", None)
            for space in self.action_spaces
        )
        if continuous_actions:
            self.act_dim = first.shape[0]
            self.action_low = torch.as_tensor(first.low, dtype=torch.float32, device=device)
            self.action_high = torch.as_tensor(first.high, dtype=torch.float32, device=device)
        else:
            self.num_actions = int(first.n)
        self.episode_returns = torch.zeros(num_envs, self.n_agents, device=device)
        self.episode_lengths = torch.zeros(num_envs, dtype=torch.long, device=device)

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
            "episode_return": self.episode_returns.clone(),
            "episode_length": self.episode_lengths.clone(),
            "done": done,
        }
        final_obs = next_obs.clone()
        if done.all():  # worlds started together hit the time limit together: one batched reset
            next_obs = self._stack(self.env.reset())
        elif done.any():
            for index in done.nonzero().flatten().tolist():
                self.env.reset_at(index, return_observations=False)
            next_obs = self._stack(
                self.env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)[
                    0
                ]
            )
        self.episode_returns *= (~done).unsqueeze(1)
        self.episode_lengths *= ~done
        return next_obs, rewards, terminated, truncated, final_obs, info

    def close(self):
        pass


class MPEVecEnv:
    """num_envs copies of an mpe2 task (PettingZoo parallel API) with the same tensor layout as VMASVecEnv.

    MPE runs on numpy in the host process; the copies are stepped in turn and the stacked observations
    cross to the device once per step. Agents keep PettingZoo's `possible_agents` order everywhere
    (observations, actions, rewards), which is also the order of mpe2's `state()` (the concatenated
    observations). A copy whose episode ends is reset in the same step; its last observation goes to
    `final_obs`.
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
        self.obs_dims = [self.envs[0].observation_space(agent).shape[0] for agent in self.agents]
        self.obs_dim = max(self.obs_dims)
        self.continuous = continuous_actions
        self.action_spaces = [self.envs[0].action_space(agent) for agent in self.agents]
        first = self.action_spaces[0]
        self.same_action_space = all(space == first for space in self.action_spaces)
        if continuous_actions:
            self.act_dim = first.shape[0]
            self.action_low = torch.as_tensor(first.low, dtype=torch.float32, device=device)
            self.action_high = torch.as_tensor(first.high, dtype=torch.float32, device=device)
        else:
            self.num_actions = int(first.n)
        self.obs = np.zeros((num_envs, self.n_agents, self.obs_dim), dtype=np.float32)
        self.episode_returns = np.zeros((num_envs, self.n_agents), dtype=np.float32)
        self.episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self.resets = 0

    def _write_obs(self, out: np.ndarray, env_index: int, obs: dict):
        for agent, name in enumerate(self.agents):
            out[env_index, agent, : self.obs_dims[agent]] = obs[name]

    def reset(self) -> torch.Tensor:
        for index, env in enumerate(self.envs):
            obs, _ = env.reset(seed=self.seed + index)  # copy i starts from seed + i; later resets continue its RNG
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
        info = {
            "episode_return": torch.as_tensor(self.episode_returns.copy(), device=self.device),
            "episode_length": torch.as_tensor(self.episode_lengths.copy(), device=self.device),
            "done": torch.as_tensor(done, device=self.device),
        }
        self.episode_returns[done] = 0
        self.episode_lengths[done] = 0
        to_device = lambda array: torch.as_tensor(array, device=self.device)
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
):
    """env_id is "vmas/<scenario>" or "mpe/<task>"; max_episode_steps None takes the family's usual horizon
    (VMAS 100 steps, as in BenchMARL; MPE 25, as in the MPE papers)."""
    family, name = env_id.split("/", 1)
    if family == "vmas":
        return VMASVecEnv(name, num_envs, device, seed, continuous_actions, max_episode_steps or 100)
    return MPEVecEnv(name, num_envs, device, seed, continuous_actions, max_episode_steps or 25)


def global_state(obs: torch.Tensor) -> torch.Tensor:
    """The centralised critic's input: every agent's observation concatenated in agent order,
    [num_envs, n_agents * obs_dim]. For MPE this is exactly mpe2's state(); VMAS has no state of its own."""
    return obs.flatten(start_dim=-2)


# --- validation ---------------------------------------------------------------------------------


def validate(args: Args) -> None:
    """Check the arguments before any work; fail in one line."""
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        gradient_steps=args.gradient_steps,
        hidden_dim=args.hidden_dim,
        actor_learning_rate=args.actor_learning_rate,
        critic_learning_rate=args.critic_learning_rate,
        log_every=args.log_every,
        eval_episodes=args.eval_episodes,
    )
    if args.max_episode_steps is not None:
        check_positive(max_episode_steps=args.max_episode_steps)
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if args.torch_threads < 0:
        fail(f"--torch-threads must be 0 (one per core) or positive, got {args.torch_threads}")
    if args.learning_starts < 0:
        fail(f"--learning-starts must be 0 or positive, got {args.learning_starts}")
    if args.learning_starts >= args.total_timesteps:
        fail(
            f"--learning-starts {args.learning_starts} is not below --total-timesteps {args.total_timesteps}: "
            f"nothing would be learned; lower --learning-starts"
        )
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not args.exploration_noise >= 0:
        fail(f"--exploration-noise must be 0 or positive, got {args.exploration_noise}")
    if args.batch_size > args.buffer_size:
        fail(
            f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; raise the buffer or lower the batch"
        )
    if args.num_envs > args.buffer_size:
        fail(
            f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: one step would overwrite itself"
        )
    if args.capture_video:
        fail(
            f"--capture-video is not supported by {args.exp_name}.py: VMAS renders through pyglet, which needs a display stack"
        )
    message = check_env_id(args.env_id)
    if message:
        fail(message)
    if not args.continuous_actions:
        fail(f"{args.exp_name}.py needs continuous actions; for discrete actions use qmix.py, vdn.py or mappo.py")


def check_action_spaces(envs, script: str) -> None:
    """Parameter sharing needs one action space for all agents; fail in one line otherwise."""
    same_bounds = all(
        np.array_equal(space.low, envs.action_spaces[0].low) and np.array_equal(space.high, envs.action_spaces[0].high)
        for space in envs.action_spaces
    )
    if not envs.same_action_space or not same_bounds:
        fail(
            f"{script} shares one actor across agents, but the agents of this scenario have different action spaces: "
            f"{', '.join(str(space) for space in envs.action_spaces)}"
        )


def build_envs(args: Args, device: torch.device, seed: int, num_envs: int):
    """make_env, with a simulator that fails to start turned into one line."""
    try:
        return make_env(args.env_id, num_envs, device, seed, args.continuous_actions, args.max_episode_steps)
    except Exception as error:  # a simulator package that is not installed, a scenario that rejects its options
        reason = str(error).strip().splitlines()
        fail(f"cannot make {args.env_id}: {type(error).__name__}{': ' + reason[0] if reason else ''}")


# --- networks -----------------------------------------------------------------------------------


def with_agent_id(x: torch.Tensor) -> torch.Tensor:
    """[..., n_agents, features] -> [..., n_agents, features + n_agents]: the one-hot agent id appended."""
    n_agents = x.shape[-2]
    ids = torch.eye(n_agents, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n_agents)
    return torch.cat([x, ids], dim=-1)


def critic_input(obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The centralised critics' input, one row per agent i:
    [global_state(obs) (agent 0's obs, agent 1's obs, ...), agent 0's action, agent 1's action, ..., one-hot i].

    obs [B, n_agents, obs_dim]; actions [B, n_agents, act_dim] (one joint action seen by every critic)
    or [B, n_agents, n_agents, act_dim] (row i: the joint action critic i sees, as in the actor's update).
    Returns [B, n_agents, n_agents * (obs_dim + act_dim) + n_agents]."""
    batch, n_agents, _ = obs.shape
    if actions.dim() == 3:
        actions = actions.unsqueeze(1).expand(batch, n_agents, n_agents, actions.shape[-1])
    state = global_state(obs).unsqueeze(1).expand(batch, n_agents, -1)
    return with_agent_id(torch.cat([state, actions.flatten(start_dim=-2)], dim=-1))


def replace_own_action(buffer_actions: torch.Tensor, policy_actions: torch.Tensor) -> torch.Tensor:
    """[B, n_agents, n_agents, act_dim]: row i is the buffer's joint action with agent i's action
    replaced by the policy's. Gradients reach the policy's action of agent i only through row i."""
    n_agents = buffer_actions.shape[1]
    own = torch.eye(n_agents, dtype=torch.bool, device=buffer_actions.device)[None, :, :, None]
    return torch.where(own, policy_actions.unsqueeze(1), buffer_actions.unsqueeze(1))


def scale_action(squashed: torch.Tensor, action_scale: torch.Tensor, action_bias: torch.Tensor) -> torch.Tensor:
    """Map a tanh output in [-1, 1] to the Box [low, high]: scale = (high - low) / 2, bias = (high + low) / 2."""
    return squashed * action_scale + action_bias


class Actor(nn.Module):
    """The deterministic policy shared by all agents: a ReLU MLP on [own observation, one-hot id],
    tanh output scaled to the action bounds."""

    def __init__(
        self, obs_dim: int, n_agents: int, action_low: torch.Tensor, action_high: torch.Tensor, hidden_dim: int = 256
    ):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + n_agents, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc_mu = nn.Linear(hidden_dim, len(action_low))
        # Buffers, not parameters: saved with the model, never trained or averaged into the target.
        self.register_buffer("action_scale", (action_high - action_low) / 2.0)
        self.register_buffer("action_bias", (action_high + action_low) / 2.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., n_agents, obs_dim] -> actions [..., n_agents, act_dim]."""
        x = F.relu(self.fc1(with_agent_id(obs)))
        x = F.relu(self.fc2(x))
        return scale_action(torch.tanh(self.fc_mu(x)), self.action_scale, self.action_bias)


class QNetwork(nn.Module):
    """The centralised critic shared by all agents: a ReLU MLP on critic_input(obs, actions) -> Q_i."""

    def __init__(self, obs_dim: int, act_dim: int, n_agents: int, hidden_dim: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(n_agents * (obs_dim + act_dim) + n_agents, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """Q-values [B, n_agents] (see critic_input for the shapes).

        frozen: use detached weights, so that a backward pass computes gradients for the
        actions only (the actor's loss) and skips the critic's weight gradients."""
        layers = [(fc.weight, fc.bias) for fc in (self.fc1, self.fc2, self.fc3)]
        if frozen:
            layers = [(weight.detach(), bias.detach()) for weight, bias in layers]
        (w1, b1), (w2, b2), (w3, b3) = layers
        x = F.linear(critic_input(obs, actions), w1, b1).relu_()
        x = F.linear(x, w2, b2).relu_()
        return F.linear(x, w3, b3).squeeze(-1)


# --- storage ------------------------------------------------------------------------------------


class ReplayBuffer:
    """The last `buffer_size` transitions (one world's step, all agents), circular, as tensors on the
    training device: obs, actions, per-agent rewards, termination, true next observation."""

    def __init__(self, buffer_size: int, n_agents: int, obs_dim: int, act_dim: int, device: torch.device):
        self.buffer_size, self.pos, self.size = buffer_size, 0, 0
        self.obs = torch.zeros((buffer_size, n_agents, obs_dim), device=device)
        self.actions = torch.zeros((buffer_size, n_agents, act_dim), device=device)
        self.rewards = torch.zeros((buffer_size, n_agents), device=device)
        self.terminations = torch.zeros(buffer_size, device=device)
        self.next_obs = torch.zeros((buffer_size, n_agents, obs_dim), device=device)

    def fields(self) -> dict[str, torch.Tensor]:
        return {
            "obs": self.obs,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminations": self.terminations,
            "next_obs": self.next_obs,
        }

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        terminations: torch.Tensor,
        next_obs: torch.Tensor,
    ) -> None:
        """Store one step of every world; next_obs is the true next observation (final_obs)."""
        indices = (self.pos + torch.arange(len(obs), device=obs.device)) % self.buffer_size
        for storage, value in zip(self.fields().values(), (obs, actions, rewards, terminations.float(), next_obs)):
            storage.index_copy_(0, indices, value)
        self.pos = (self.pos + len(obs)) % self.buffer_size
        self.size = min(self.size + len(obs), self.buffer_size)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """A uniform minibatch (with replacement): obs, actions, rewards, terminations, next_obs."""
        indices = torch.randint(self.size, (batch_size,), device=self.obs.device)
        return tuple(storage[indices] for storage in self.fields().values())

    def state_dict(self) -> dict:
        return {
            "pos": self.pos,
            "size": self.size,
            **{name: value[: self.size].cpu() for name, value in self.fields().items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        for name, value in self.fields().items():
            value[: self.size].copy_(state[name])


# --- the maths ----------------------------------------------------------------------------------


def random_actions(shape: tuple[int, ...], low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Uniformly random actions [*shape, act_dim] within [low, high], drawn with torch's RNG on low.device."""
    return low + (high - low) * torch.rand((*shape, len(low)), device=low.device)


def add_exploration_noise(
    actions: torch.Tensor, action_scale: torch.Tensor, low: torch.Tensor, high: torch.Tensor, noise_std: float
) -> torch.Tensor:
    """actions + N(0, (noise_std * action_scale)^2) per dimension, clipped to [low, high]."""
    return torch.clamp(actions + torch.randn_like(actions) * (noise_std * action_scale), low, high)


def td_target(rewards: torch.Tensor, next_q: torch.Tensor, terminations: torch.Tensor, gamma: float) -> torch.Tensor:
    """r_i + gamma * Q_i_target(s', a') per agent, [B, n_agents], with the bootstrap dropped where the
    world terminated (terminations [B]). A truncated transition keeps its bootstrap: its s' is the
    true final observation."""
    return rewards + gamma * next_q * (1.0 - terminations).unsqueeze(-1)


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the team returns (sum over agents) of the first
    episode of `eval_episodes` worlds under its deterministic actor (no noise)."""
    model = load_model(model_path, EXP_NAME)
    if capture_video:
        fail(
            f"--capture-video is not supported by {EXP_NAME}.py: VMAS renders through pyglet, which needs a display stack"
        )
    saved = model["args"]
    envs = make_env(model["env_id"], eval_episodes, device, seed, True, saved["max_episode_steps"])
    zeros = torch.zeros(model["act_dim"])
    actor = Actor(model["obs_dim"], model["n_agents"], zeros, zeros, saved["hidden_dim"]).to(device)
    actor.load_state_dict(model["actor"])  # the action scale and bias come with the weights
    returns = torch.full((eval_episodes,), torch.nan, device=device)
    obs = envs.reset()
    with torch.no_grad():
        for step in range(1, 100_000):
            obs, _, _, _, _, info = envs.step(actor(obs))
            first = info["done"] & returns.isnan()
            returns = torch.where(first, info["episode_return"].sum(dim=1), returns)
            if step % 25 == 0 and not returns.isnan().any():  # one host read every 25 steps
                break
    envs.close()
    return returns[~returns.isnan()].tolist()


EXP_NAME = os.path.basename(__file__)[: -len(".py")]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None
    stop = StopSignal()  # from here on, SIGTERM/SIGINT lead to a checkpoint and a clean exit

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # A resumed run gets fresh worlds (the simulators cannot be saved), seeded apart from the first ones.
    envs = build_envs(args, device, args.seed + (checkpoint["global_step"] if checkpoint else 0), args.num_envs)
    check_action_spaces(envs, f"{args.exp_name}.py")
    n_agents, obs_dim, act_dim = envs.n_agents, envs.obs_dim, envs.act_dim
    low, high = envs.action_low, envs.action_high
    torch.manual_seed(args.seed)  # VMAS seeds torch's global RNG itself

    run = Run(
        args,
        run_dir=Path(args.resume).parent if checkpoint else None,
        purge_step=checkpoint["global_step"] + 1 if checkpoint else None,
        wandb_id=checkpoint["wandb_id"] if checkpoint else None,
    )
    writer = run.writer

    actor = Actor(obs_dim, n_agents, low, high, args.hidden_dim).to(device)
    critic = QNetwork(obs_dim, act_dim, n_agents, args.hidden_dim).to(device)
    target_actor = Actor(obs_dim, n_agents, low, high, args.hidden_dim).to(device)
    target_critic = QNetwork(obs_dim, act_dim, n_agents, args.hidden_dim).to(device)
    target_actor.load_state_dict(actor.state_dict())
    target_critic.load_state_dict(critic.state_dict())
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.actor_learning_rate)
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=args.critic_learning_rate)
    rb = ReplayBuffer(args.buffer_size, n_agents, obs_dim, act_dim, device)
    # Finished episodes since the last log: count, sum of lengths, sum of team returns, per-agent sums.
    episode_stats = torch.zeros(3 + n_agents, dtype=torch.float64, device=device)
    # Everything a checkpoint holds besides counters, random generators and the statistics.
    stateful = {
        "actor": actor,
        "critic": critic,
        "target_actor": target_actor,
        "target_critic": target_critic,
        "actor_optimizer": actor_optimizer,
        "critic_optimizer": critic_optimizer,
        "replay_buffer": rb,
    }
    online_params = [*actor.parameters(), *critic.parameters()]
    target_params = [*target_actor.parameters(), *target_critic.parameters()]

    def critic_loss(obs, actions, rewards, terminations, next_obs) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean squared TD error over the batch and the agents, and the Q-values [B, n_agents]."""
        with torch.no_grad():
            next_q = target_critic(next_obs, target_actor(next_obs))
            target = td_target(rewards, next_q, terminations, args.gamma)
        q_values = critic(obs, actions)
        return F.mse_loss(q_values, target), q_values

    def actor_loss(obs, actions) -> torch.Tensor:
        """-Q_i(s, a_1 .. actor(o_i) .. a_n), averaged over agents i and the batch: each agent's
        action from the actor, the others' from the buffer; the critic's weights stay fixed here."""
        return -critic(obs, replace_own_action(actions, actor(obs)), frozen=True).mean()

    # `latest` holds the latest losses and Q-values (device tensors), read back only when logged.
    global_step, vector_step, updates, latest = 0, 0, 0, {}
    next_obs = envs.reset()
    if checkpoint:
        for key, module in stateful.items():
            module.load_state_dict(checkpoint[key])
        print("the VMAS / MPE simulators cannot be saved with the checkpoint: resuming with freshly reset environments")
        episode_stats.copy_(checkpoint["episode_stats"])
        restore_rng_state(checkpoint["rng"])
        global_step, vector_step, updates = checkpoint["global_step"], checkpoint["vector_step"], checkpoint["updates"]
        latest = {key: value.to(device) for key, value in checkpoint["latest"].items()}

    def write_checkpoint() -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            vector_step=vector_step,
            updates=updates,
            **{key: module.state_dict() for key, module in stateful.items()},
            episode_stats=episode_stats.cpu(),
            latest={key: value.cpu() for key, value in latest.items()},
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    start_time, start_step = time.time(), global_step

    while global_step < args.total_timesteps:
        # Act: everything on the device (MPE copies the actions to the host inside its step).
        obs = next_obs
        if global_step < args.learning_starts:
            actions = random_actions((args.num_envs, n_agents), low, high)
        else:
            with torch.no_grad():
                actions = add_exploration_noise(actor(obs), actor.action_scale, low, high, args.exploration_noise)
        next_obs, rewards, terminated, truncated, final_obs, info = envs.step(actions)
        rb.add(obs, actions, rewards, terminated, final_obs)
        global_step, vector_step = global_step + args.num_envs, vector_step + 1
        done = info["done"].double()
        episode_returns = info["episode_return"].double()
        episode_stats += torch.cat(
            [
                torch.stack([done.sum(), (info["episode_length"] * done).sum(), (episode_returns.sum(1) * done).sum()]),
                (episode_returns * done.unsqueeze(1)).sum(0),
            ]
        )

        # Learn: --gradient-steps critic and actor steps per vector step, once learning has started.
        if global_step >= args.learning_starts:
            for _ in range(args.gradient_steps):
                batch = rb.sample(args.batch_size)
                qf_loss, q_values = critic_loss(*batch)
                critic_optimizer.zero_grad()
                qf_loss.backward()
                critic_optimizer.step()
                loss = actor_loss(batch[0], batch[1])
                actor_optimizer.zero_grad()
                loss.backward()
                actor_optimizer.step()
                with torch.no_grad():
                    torch._foreach_lerp_(target_params, online_params, args.tau)
                updates += 1
            latest = {"qf1_loss": qf_loss.detach(), "qf1_values": q_values.detach().mean(), "actor_loss": loss.detach()}

        # Logging: one device-to-host read every --log-every vector steps (and at the end).
        if vector_step % args.log_every == 0 or global_step >= args.total_timesteps:
            stats = dict(zip(latest, torch.stack(list(latest.values())).tolist())) if latest else {}
            for name, value in stats.items():
                writer.add_scalar(f"losses/{name}", value, global_step)
            finished, length_sum, return_sum, *agent_sums = episode_stats.tolist()
            episode_stats.zero_()
            if finished > 0:  # the means over the episodes that ended since the last log
                writer.add_scalar("charts/episodic_return", return_sum / finished, global_step)
                for agent, agent_sum in enumerate(agent_sums):
                    writer.add_scalar(f"charts/episodic_return_agent{agent}", agent_sum / finished, global_step)
                writer.add_scalar("charts/episodic_length", length_sum / finished, global_step)
                progress.add_returns([return_sum / finished])
            writer.add_scalar("charts/learning_rate", args.actor_learning_rate, global_step)
            writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
            progress.update(global_step)
            for name, value in stats.items():
                if not np.isfinite(value):
                    path = write_checkpoint()
                    fail(f"losses/{name} is {value} at step {global_step}; checkpoint written to {path}")

        if stop or (next_checkpoint is not None and global_step >= next_checkpoint):
            path = write_checkpoint()
            if next_checkpoint is not None:
                next_checkpoint = (global_step // args.checkpoint_every + 1) * args.checkpoint_every
            if stop:
                print(f"\n{stop.received}: checkpoint written to {path}; continue with --resume {path}", flush=True)
                envs.close()
                run.close()
                raise SystemExit(0)

    progress.close(global_step)
    envs.close()

    if args.save_model:
        model_path = run.dir / f"{args.exp_name}.cleanrl_model"
        save_model(
            model_path,
            args,
            actor=actor.state_dict(),
            critic=critic.state_dict(),
            n_agents=n_agents,
            obs_dim=obs_dim,
            act_dim=act_dim,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(model_path, args.eval_episodes, device, seed=args.seed + 1_000)
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"evaluation over {len(episodic_returns)} episodes: {np.mean(episodic_returns):.2f} +- {np.std(episodic_returns):.2f}"
        )

    run.close()
