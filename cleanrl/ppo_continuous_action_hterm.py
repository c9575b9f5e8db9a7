"""PPO for continuous actions with ElegantRL's H-term (Hamiltonian term).

cleanrl/ppo_continuous_action.py (Schulman et al. 2017 with the details of Huang et al. 2022: Gaussian policy, GAE,
clipped surrogate and value loss, observation and reward normalisation, truncations bootstrapped), plus the term of
ElegantRL (its tutorial "How to learn stably: H-term"; code: AgentPPOHterm, AgentBase.get_obj_h_term): the loss gets
H = -lambda * mean_i[ pi(a_i | s_i) * R_norm_i ] over a sample i of transitions from a buffer of whole past episodes
(the best ones kept), which raises the density of actions that led to high returns. EpisodeMemory defines it exactly.
Where it differs from ElegantRL's PPO (one Adam for actor and critic, CleanRL's minibatch epochs, gymnasium's
truncations) it is because the rest is CleanRL's PPO; the term itself follows ElegantRL's code.

pi(a|s) is a density, not a probability: the product of the per-dimension Gaussian densities. At unit std it is at
most (2 pi)^(-d/2) for d action dimensions (0.063 for Hopper's 3, 0.004 for Walker2d's 6), so the term starts near
zero; it grows like std^-d as the policy's std shrinks, so late in training it can dominate and its gradient is steep.

Action space: a one-dimensional Box. Environments: as ppo_continuous_action.py (MuJoCo v5, dm_control, Pendulum-v1).

    uv run python cleanrl/ppo_continuous_action_hterm.py --env-id Hopper-v5

With and without the term at 300k steps, 5 seeds each: benchmark/results/h_term.md.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Normal

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.errors import check_env_id, check_positive, fail
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
    torch_threads: int = 1
    """CPU threads for torch; small MLPs run fastest on one (thread hand-offs cost more than they save)"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """if toggled, record videos of the agent (first environment) into the run directory"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "Hopper-v5"
    """the id of the environment"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment"""
    env_options: str = "{}"
    """StockTrading-v0's options as a JSON object, e.g. '{"tickers": ["AAPL", "MSFT"], "test_start": "2021-01-01"}'"""

    # Algorithm specific arguments
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
    clip_obs: float = 10.0
    """normalised observations are clipped to [-clip_obs, clip_obs]"""
    clip_reward: float = 10.0
    """scaled rewards are clipped to [-clip_reward, clip_reward]"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""
    h_term_lambda: float = 0.125
    """weight of the H-term in the loss (ElegantRL's 2^-3; 0 leaves plain PPO)"""
    h_term_drop_rate: float = 0.125
    """the share of stored episodes, lowest returns first, dropped before each rollout's are added (ElegantRL: 2^-3)"""
    h_term_sample_rate: float = 0.0625
    """the share of stored transitions drawn for the H-term at each minibatch (ElegantRL: 2^-4)"""
    h_term_min_transitions: int = 2048
    """the H-term starts once this many transitions of whole episodes are stored (ElegantRL: 2^11)"""
    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def register_env_family(env_id: str, env_options: str | None = None) -> None:
    """dm_control ids exist once shimmy is imported (about a second), PointChasing-v0 once
    cleanrl_utils.envs.point_chasing is, the PyBullet ids once pybullet_envs_gymnasium is, StockTrading-v0 once
    cleanrl_utils.envs.stock_trading is: import them only when asked for. `env_options` (--env-options, JSON)
    become StockTrading's registered keyword arguments; None keeps those registered."""
    if env_id.startswith("PointChasing"):
        import cleanrl_utils.envs.point_chasing  # noqa: F401  (registers PointChasing-v0 with gymnasium)
    if env_id.startswith("StockTrading"):
        import cleanrl_utils.envs.stock_trading as stock_trading  # registers StockTrading-v0 with gymnasium

        stock_trading.configure(env_id, env_options)  # checks the options (one line and exit 2 if bad)
    elif env_options not in (None, "{}"):
        fail(f"--env-options is for the StockTrading ids; {env_id} takes none")
    if env_id.endswith("BulletEnv-v0"):
        try:
            import pybullet_envs_gymnasium  # noqa: F401
        except ImportError:
            fail(f"{env_id} needs pybullet: install the pybullet extra (uv sync --extra pybullet; Python <= 3.11)")
    if env_id.startswith("dm_control/"):
        # With MUJOCO_GL=egl, importing dm_control loads Mesa's libLLVM; torch loading triton's
        # own LLVM after that (the fused optimiser imports torch._dynamo) segfaults. Load torch's first.
        import torch._dynamo  # noqa: F401

        try:
            import shimmy  # noqa: F401
        except ImportError:
            fail(f"{env_id} needs dm_control and shimmy: install the mujoco extra (uv sync --extra mujoco)")


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        num_minibatches=args.num_minibatches,
        update_epochs=args.update_epochs,
        learning_rate=args.learning_rate,
        clip_obs=args.clip_obs,
        clip_reward=args.clip_reward,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
        h_term_min_transitions=args.h_term_min_transitions,
    )
    if args.h_term_lambda < 0 or not 0 <= args.h_term_drop_rate < 1 or not 0 < args.h_term_sample_rate <= 1:
        fail(
            f"--h-term-lambda must be >= 0, --h-term-drop-rate in [0, 1) and --h-term-sample-rate in (0, 1], got "
            f"{args.h_term_lambda}, {args.h_term_drop_rate} and {args.h_term_sample_rate}"
        )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    args.batch_size = args.num_envs * args.num_steps
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch of {args.batch_size} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps})"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {args.batch_size} steps")
    register_env_family(args.env_id, args.env_options)
    check_env_id(args.env_id)
    try:
        probe = gym.make(args.env_id)
    except Exception as error:  # a simulator package that is not installed, a broken install
        reason = str(error).strip().splitlines()
        fail(f"cannot make {args.env_id}: {type(error).__name__}{': ' + reason[0] if reason else ''}")
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"ppo_continuous_action_hterm.py handles Box (continuous) actions but {args.env_id} has {action_space}; "
            "use cleanrl/ppo.py"
        )
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        fail(
            f"ppo_continuous_action_hterm.py needs a one-dimensional Box action space but {args.env_id} "
            f"has {action_space}"
        )
    boxes = observation_space.values() if isinstance(observation_space, gym.spaces.Dict) else [observation_space]
    if not all(isinstance(space, gym.spaces.Box) for space in boxes):
        fail(
            f"ppo_continuous_action_hterm.py needs Box (or Dict of Box) observations but {args.env_id} "
            f"has {observation_space}"
        )


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        if not isinstance(env.observation_space, gym.spaces.Box) or len(env.observation_space.shape) != 1:
            env = gym.wrappers.FlattenObservation(env)  # dm_control's Dict observations
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    register_env_family(env_id)
    # SAME_STEP: an env that ends an episode resets at once and returns the true final
    # observation in infos["final_obs"]. copy=False skips a deepcopy; we copy obs to torch anyway.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def action_bounds(envs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The action space's bounds as float32 device tensors. Actions are clipped to them on the way
    to the environment; the policy's unclipped sample is what the rollout stores and the update scores."""
    space = envs.single_action_space
    return tuple(torch.as_tensor(bound, dtype=torch.float32, device=device) for bound in (space.low, space.high))


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches, on the training device, in float64: the mean and
    (population) variance of all batches concatenated, merged batch by batch with the parallel-variance formula
    (Chan, Golub and LeVeque 1979). As in gymnasium, the count starts at `epsilon` with mean 0 and variance 1.
    The count is an exact host-side number, saved in the state dict with the tensors."""

    def __init__(self, shape: tuple[int, ...] | int = (), epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.count = epsilon

    def update(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        batch_var, batch_mean = torch.var_mean(batch, dim=0, correction=0)
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean.add_(delta, alpha=n / total)
        # var = (var * count + batch_var * n + delta^2 * count * n / total) / total, in place
        self.var.mul_(self.count / total).add_(batch_var, alpha=n / total).addcmul_(
            delta, delta, value=self.count * n / total**2
        )
        self.count = total

    def normalize(self, x: torch.Tensor, clip: float) -> torch.Tensor:
        """(x - mean) / std, clipped to [-clip, clip], as float32; leaves the statistics as they are."""
        return ((x - self.mean) / torch.sqrt(self.var + 1e-8)).clamp_(-clip, clip).float()

    def get_extra_state(self) -> dict:
        return {"count": self.count}

    def set_extra_state(self, state: dict) -> None:
        self.count = state["count"]


class RewardScaler(nn.Module):
    """Divides rewards by the running standard deviation of the discounted return G_t = r_t + gamma * G_{t-1},
    then clips. G restarts after an episode ends; one RunningMeanStd of G is shared by all environments. Once per
    rollout, on the device: the rollout's returns enter the statistics, then its rewards are scaled by them."""

    def __init__(self, num_envs: int, gamma: float, clip: float):
        super().__init__()
        self.return_rms = RunningMeanStd(())
        # The part of each environment's return that carries into its next step: gamma * G of
        # the ongoing episode, 0 right after an episode ended.
        self.register_buffer("carry", torch.zeros(num_envs))
        self.gamma, self.clip = gamma, clip

    def forward(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """Scaled rewards for a [num_steps, num_envs] rollout; `dones` marks the steps that end an episode."""
        carries = self.gamma * (1.0 - dones)
        returns = [rewards[0] + self.carry]
        # One fused op per step (G_t = r_t + carries_{t-1} * G_{t-1}); the steps are stacked once.
        for reward, carry in zip(rewards[1:].unbind(0), carries[:-1].unbind(0)):
            returns.append(torch.addcmul(reward, carry, returns[-1]))
        self.carry.copy_(carries[-1] * returns[-1])
        self.return_rms.update(torch.stack(returns).reshape(-1))
        scaled = rewards / torch.sqrt(self.return_rms.var + 1e-8)
        return scaled.clamp_(-self.clip, self.clip).to(rewards.dtype)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, out_dim: int, out_std: float) -> nn.Sequential:
    """64x64 tanh MLP, orthogonally initialised; the output layer with gain `out_std`."""
    hidden = [layer_init(nn.Linear(in_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()]
    return nn.Sequential(*hidden, layer_init(nn.Linear(64, out_dim), std=out_std))


class Agent(nn.Module):
    """A Gaussian policy N(mean(obs), exp(logstd)^2), its log standard deviation a parameter that
    does not depend on the state, and a separate value network; both 64x64 tanh MLPs."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(act_dim))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def sample_action(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """mean(obs) + std * noise, for standard normal `noise` drawn by the caller. Written out:
        Normal(mean, std).sample() costs ~25 us more per step, ~7% of a Hopper rollout step (measured)."""
        return self.actor_mean(obs) + self.actor_logstd.exp() * noise

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(actions | obs), summed over the action dimensions."""
        # Written out: 5% faster per update than Normal(mean, std).log_prob(actions).sum(-1) (measured).
        z = (actions - self.actor_mean(obs)) / self.actor_logstd.exp()
        return (-0.5 * z.square() - self.actor_logstd - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        """The policy's entropy, the same in every state since the standard deviation does not depend on it."""
        return Normal(0.0, self.actor_logstd.exp(), validate_args=False).entropy().sum()


class Batch(NamedTuple):
    """A rollout flattened to [batch_size, ...], one named tensor per field."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor

    def take(self, rows: torch.Tensor | slice) -> "Batch":
        return Batch(*(field[rows] for field in self))


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` transitions. Observations (normalised, as the policy saw them) and
    actions (the unclipped samples) live on the training device; rewards and episode ends come from the CPU
    simulator and are staged in host arrays, copied to the device once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.actions = torch.zeros((num_steps, num_envs, act_dim), device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        # The true final observation (normalised when it arrived) of an episode truncated at step t (zeros elsewhere).
        self.final_obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.device = device

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)


class EpisodeMemory:
    """The H-term's buffer of whole past episodes (ElegantRL's h_term_buffer), on the training device: per transition
    the observation (normalised, as the policy saw it), the action and the discounted reward-to-go G of the raw
    rewards within its episode. Episodes are assembled across rollouts (an episode's first steps may come from an
    earlier one); an episode still running at the end of a rollout waits for the next. Before each rollout's finished
    episodes are added, the lowest-return share `drop_rate` of those stored is dropped (the return: the sum of the
    raw rewards), so the buffer keeps the best episodes seen.

    R_norm = (G - G_min) / (G_max - G_min), the minimum and maximum over every transition in the buffer (ElegantRL's
    h_term_r_min_max): an episode of return 0.5 weighs less than one of 50. The term, added to the loss at every
    minibatch once --h-term-min-transitions are stored (ElegantRL: 2^11):
        H = -lambda * mean_i[ pi(a_i | s_i) * R_norm_i ]
    pi the joint action density (the product over action dimensions), i drawn uniformly with replacement, int(size *
    --h-term-sample-rate + 1) of them. ElegantRL's single-step form; its K-step variant is not used."""

    def __init__(self, num_envs: int, gamma: float, drop_rate: float):
        self.gamma, self.drop_rate = gamma, drop_rate
        self.episodes = []  # (obs, actions, reward-to-go, episodic return) of each stored episode
        self.unfinished = [None] * num_envs  # each env's episode so far: (obs, actions, raw rewards)
        self.obs = self.actions = self.r_norm = None

    @property
    def size(self) -> int:
        return 0 if self.r_norm is None else self.r_norm.shape[0]

    def finish_episode(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray) -> tuple:
        reward_to_go = np.zeros(len(rewards), dtype=np.float64)
        future = 0.0
        for t in reversed(range(len(rewards))):
            future = reward_to_go[t] = rewards[t] + self.gamma * future
        return obs, actions, torch.as_tensor(reward_to_go, device=obs.device), float(rewards.sum())

    def add_rollout(self, obs: torch.Tensor, actions: torch.Tensor, rewards: np.ndarray, dones: np.ndarray) -> None:
        """A [num_steps, num_envs] rollout: raw rewards and episode ends (terminations or truncations) on the host."""
        # ElegantRL's order: drop the worst of the episodes stored so far, then add the new ones.
        self.episodes.sort(key=lambda episode: episode[3])
        del self.episodes[: int(len(self.episodes) * self.drop_rate)]
        for env in range(rewards.shape[1]):
            start = 0
            for end in [*np.flatnonzero(dones[:, env]) + 1, None]:
                # Copies: the rollout storage is overwritten by the next rollout.
                piece = (obs[start:end, env].clone(), actions[start:end, env].clone(), rewards[start:end, env].copy())
                if self.unfinished[env] is not None:
                    piece = tuple(
                        torch.cat([a, b]) if isinstance(a, torch.Tensor) else np.concatenate([a, b])
                        for a, b in zip(self.unfinished[env], piece)
                    )
                if end is None:
                    self.unfinished[env] = piece if len(piece[2]) else None
                else:
                    self.episodes.append(self.finish_episode(*piece))
                    self.unfinished[env] = None
                    start = end
        self.concatenate()

    def concatenate(self) -> None:
        """The stored episodes as [size, ...] tensors for sampling, G min-max normalised over all of them."""
        if self.episodes:
            self.obs, self.actions, reward_to_go = (torch.cat(field) for field in list(zip(*self.episodes))[:3])
            low, high = reward_to_go.min(), reward_to_go.max()
            span = torch.where(high > low, high - low, 1.0)  # all equal: every R_norm is 0
            self.r_norm = ((reward_to_go - low) / span).float()

    def h_term(self, agent: "Agent", sample_rate: float, h_lambda: float) -> torch.Tensor:
        """-lambda * mean[pi(a|s) * R_norm] over a uniform sample of the stored transitions."""
        rows = torch.randint(self.size, (int(self.size * sample_rate + 1),), device=self.r_norm.device)
        density = agent.log_prob(self.obs[rows], self.actions[rows]).exp()  # the joint density of the action
        return -h_lambda * (density * self.r_norm[rows]).mean()

    def state_dict(self) -> dict:
        return {"episodes": self.episodes, "unfinished": self.unfinished}

    def load_state_dict(self, state: dict) -> None:
        self.episodes, self.unfinished = state["episodes"], state["unfinished"]
        self.concatenate()


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> torch.Tensor:
    """Generalized advantage estimates for a [num_steps, num_envs] rollout.

    next_values[t] is the value of the observation that followed step t: the true final
    observation where an episode ended at t. A termination zeroes that bootstrap; a truncation
    keeps it. Either one stops the advantage from flowing back across the episode boundary.
    """
    bootstrap = 1.0 - terminations
    episode_continues = 1.0 - torch.maximum(terminations, truncations)
    deltas = rewards + gamma * next_values * bootstrap - values
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last_advantage = deltas[t] + gamma * gae_lambda * episode_continues[t] * last_advantage
        advantages[t] = last_advantage
    return advantages


def update_minibatch(
    agent: Agent, optimizer: torch.optim.Optimizer, mb: Batch, args: Args, memory: EpisodeMemory | None = None
) -> dict[str, torch.Tensor]:
    """One gradient step of the clipped PPO loss on the minibatch `mb` (with the H-term drawn from `memory` when one
    is given). Returns its losses, log-ratios and ratios, and the count of ratios outside the clip range, detached."""
    newlogprob = agent.log_prob(mb.obs, mb.actions)
    newvalue = agent.get_value(mb.obs)
    logratio = newlogprob - mb.logprobs
    ratio = logratio.exp()

    # Policy loss
    pg_loss1 = -mb.advantages * ratio
    pg_loss2 = -mb.advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb.returns) ** 2
        v_delta = torch.clamp(newvalue - mb.values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (mb.values + v_delta - mb.returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb.returns) ** 2).mean()

    loss = pg_loss + v_loss * args.vf_coef
    if args.ent_coef != 0:  # one state-independent term, not one per sample
        loss = loss - args.ent_coef * agent.entropy()
    stats = {}
    if memory is not None:  # ElegantRL's H-term: raise the density of actions that led to high returns
        h_term = memory.h_term(agent, args.h_term_sample_rate, args.h_term_lambda)
        loss = loss + h_term
        stats["h_term"] = h_term.detach()

    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    ratio, logratio = ratio.detach(), logratio.detach()
    clipped = ((ratio - 1.0).abs() > args.clip_coef).sum()
    return dict(
        stats, policy_loss=pg_loss.detach(), value_loss=v_loss.detach(), logratio=logratio, ratio=ratio, clipped=clipped
    )


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its mean action, on
    observations normalised with the saved statistics, which stay frozen."""
    model = load_model(model_path, __file__)
    register_env_family(model["env_id"], model["args"].get("env_options"))  # the environment options it trained on
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_dim"], model["act_dim"]).to(device)
    agent.load_state_dict(model["agent"])
    obs_rms = RunningMeanStd(model["obs_dim"]).to(device)
    obs_rms.load_state_dict(model["obs_rms"])
    action_low, action_high = action_bounds(envs, device)
    obs_np, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            obs = obs_rms.normalize(torch.as_tensor(obs_np, device=device), model["args"]["clip_obs"])
            actions = agent.actor_mean(obs).clamp(action_low, action_high)
            obs_np, _, _, _, infos = envs.step(actions.cpu().numpy())
            if "episode" in infos:
                episodic_returns += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return episodic_returns[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    action_low, action_high = action_bounds(envs, device)

    agent = Agent(obs_dim, act_dim).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    obs_rms = RunningMeanStd(obs_dim).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.clip_reward).to(device)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_dim, act_dim, device)
    memory = EpisodeMemory(args.num_envs, args.gamma, args.h_term_drop_rate) if args.h_term_lambda > 0 else None

    def observe(obs_np: np.ndarray) -> torch.Tensor:
        """What the policy sees: the observations enter the running statistics, then are normalised by them."""
        raw = torch.as_tensor(obs_np, device=device).view(args.num_envs, obs_dim)
        obs_rms.update(raw)
        return obs_rms.normalize(raw, args.clip_obs)

    global_step, iteration = 0, 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    next_obs = None
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        obs_rms.load_state_dict(run.checkpoint["obs_rms"])
        reward_scaler.load_state_dict(run.checkpoint["reward_scaler"])
        envs, next_obs = restore_envs(envs, run.checkpoint["envs"])
        if memory is not None:
            memory.load_state_dict(run.checkpoint["h_term_memory"])
        if next_obs is None:  # the environments were not saved: the fresh ones start new episodes
            reward_scaler.carry.zero_()
            if memory is not None:
                memory.unfinished = [None] * args.num_envs
        global_step, iteration = run.checkpoint["global_step"], run.checkpoint["iteration"]
    next_obs = observe(next_obs_np) if next_obs is None else next_obs.to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict(),
            reward_scaler=reward_scaler.state_dict(),
            envs=snapshot_envs(envs, next_obs),
            global_step=global_step,
            iteration=iteration,
            h_term_memory=None if memory is None else memory.state_dict(),
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout: one host-to-device copy of the observations and one device-to-host
        # copy of the actions per step; rewards and episode ends are moved once per rollout.
        with torch.no_grad():
            # The rollout's noise in one draw: 2% faster per step than a draw per step (measured).
            noise = torch.randn((args.num_steps, args.num_envs, act_dim), device=device)
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                action = agent.sample_action(next_obs, noise[step])
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(
                    action.clamp(action_low, action_high).cpu().numpy()
                )
                next_obs = observe(next_obs_np)
                storage.rewards[step] = reward
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                # Bootstrapping needs the true final observation only where the time limit cut an episode.
                bootstrap_final = truncated & ~terminated
                if bootstrap_final.any():
                    final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap_final]), device=device)
                    storage.final_obs[step, torch.as_tensor(bootstrap_final, device=device)] = obs_rms.normalize(
                        final_obs.view(-1, obs_dim), args.clip_obs
                    )
                run.log_episodes(global_step, infos)

            # 2. Advantages: rewards scaled, then values and log-probabilities of the whole rollout in batched passes.
            terminations = storage.to_device(storage.terminations)
            truncations = storage.to_device(storage.truncations)
            rewards = reward_scaler(storage.to_device(storage.rewards), torch.maximum(terminations, truncations))
            values = agent.get_value(torch.cat([storage.obs, next_obs.unsqueeze(0)]))
            next_values = values[1:]
            if storage.truncations.any():
                final_values = agent.get_value(storage.final_obs)
                next_values = torch.where(truncations * (1 - terminations) > 0, final_values, next_values)
                storage.final_obs.zero_()
            values = values[:-1]
            advantages = compute_gae(
                rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            returns = advantages + values

            b_obs, b_actions = storage.obs.reshape(-1, obs_dim), storage.actions.reshape(-1, act_dim)
            b_logprobs = agent.log_prob(b_obs, b_actions)
            batch = Batch(b_obs, b_actions, b_logprobs, advantages.view(-1), returns.view(-1), values.view(-1))
            if memory is not None:
                memory.add_rollout(
                    storage.obs, storage.actions, storage.rewards, np.maximum(storage.terminations, storage.truncations)
                )
            h_term_on = memory is not None and memory.size >= args.h_term_min_transitions

        # 3. Update the policy and value network
        clipped = torch.zeros((), dtype=torch.long, device=device)  # ratios outside the clip range, for clipfrac
        for epoch in range(args.update_epochs):
            # One gather per field and epoch, minibatches are slices of it, and the advantages of every minibatch
            # normalised by the minibatch's mean and std in one op: 4% faster than indexing per minibatch (measured).
            shuffled = batch.take(torch.randperm(args.batch_size, device=device))
            if args.norm_adv:
                by_minibatch = shuffled.advantages.view(args.num_minibatches, args.minibatch_size)
                std, mean = torch.std_mean(by_minibatch, dim=1, keepdim=True)
                shuffled = shuffled._replace(advantages=((by_minibatch - mean) / (std + 1e-8)).view(-1))
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = shuffled.take(slice(start, start + args.minibatch_size))
                stats = update_minibatch(agent, optimizer, mb, args, memory if h_term_on else None)
                clipped += stats["clipped"]

            # The KL estimates (http://joschu.net/blog/kl-approx.html) of the epoch's last minibatch, once per
            # epoch rather than per minibatch: 3.5% faster (measured). The early stop reads them on the host.
            with torch.no_grad():
                old_approx_kl = (-stats["logratio"]).mean()
                approx_kl = ((stats["ratio"] - 1) - stats["logratio"]).mean()
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        var_y = batch.returns.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (batch.returns - batch.values).var() / var_y)
        h_term_scalars = (
            {"losses/h_term": stats["h_term"], "charts/h_term_transitions": memory.size} if h_term_on else {}
        )
        run.log(
            global_step,
            {
                **h_term_scalars,
                "losses/value_loss": stats["value_loss"],
                "losses/policy_loss": stats["policy_loss"],
                "losses/entropy": agent.entropy(),
                "losses/old_approx_kl": old_approx_kl,
                "losses/approx_kl": approx_kl,
                "losses/clipfrac": clipped / (args.batch_size * (epoch + 1)),
                "losses/explained_variance": explained_var,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        agent=agent.state_dict(),
        obs_rms=obs_rms.state_dict(),
        return_rms=reward_scaler.return_rms.state_dict(),
        obs_dim=obs_dim,
        act_dim=act_dim,
    )
