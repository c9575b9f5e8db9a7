"""Proximal Policy Optimization (PPO) with LSTM memory for continuous actions, on partially observed control.

Schulman et al. 2017 (https://arxiv.org/abs/1707.06347): ppo_continuous_action.py's policy and value networks (64x64
tanh MLPs, state-independent log std, observation and reward normalisation, GAE with truncations bootstrapped), each
reading its own LSTM (Hochreiter & Schmidhuber 1997) over the normalised observations. The state is zeroed where an
episode starts; the update replays whole env sequences from the rollout's first state, as ppo_atari_lstm.py does.
--hide-velocities (default) keeps only positions, the "-P" tasks of Ni et al. 2022 ("Recurrent Model-Free RL Can Be a
Strong Baseline for Many POMDPs"), so velocities must be inferred from a history.

Beside sb3-contrib's RecurrentPPO: separate actor and critic LSTMs, its default (the value loss does not shape the
policy's memory); whole rollouts replayed where it cuts and pads sequences at episode starts; LSTMs 64 wide (its 256).

Action space: a one-dimensional Box. Environments: Pendulum-v1, Hopper-v5, HalfCheetah-v5, Walker2d-v5 with velocities
hidden; with --no-hide-velocities any gymnasium Box task.

    uv run python cleanrl/ppo_continuous_action_lstm.py --env-id Pendulum-v1

Expect Pendulum-v1 without its angular velocity at -260 +- 33 after 300k steps (3 seeds), where
ppo_continuous_action.py on the same observations stays at -1,098 (benchmark/results/ppo_continuous_action_lstm.md).
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
    """CPU threads for torch; small networks run fastest on one"""
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
    env_id: str = "Pendulum-v1"
    """the id of the environment"""
    total_timesteps: int = 300000
    """total timesteps of the experiment"""
    hide_velocities: bool = True
    """if toggled, the agent observes positions only (the POMDP); --no-hide-velocities: the full observation"""

    # Algorithm specific arguments
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout (the length of a replayed sequence)"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.9
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each holds num_envs / num_minibatches whole environment sequences)"""
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
    lstm_size: int = 64
    """the hidden size of each of the two LSTMs (actor's and critic's)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


# The position entries of each task's observation, from gymnasium's documented layouts (the "Observation Space"
# tables of gymnasium/envs/classic_control/pendulum.py and gymnasium/envs/mujoco/{hopper,half_cheetah,walker2d}_v5.py;
# MuJoCo v5 by default leaves the x-coordinate out: qpos[1:], then qvel). Everything else is a velocity.
POSITIONS = {
    "Pendulum-v1": [0, 1],  # cos(theta), sin(theta); 2: angular velocity
    "Hopper-v5": list(range(5)),  # z, torso angle, thigh, leg, foot angles; 5-10: qvel
    "HalfCheetah-v5": list(range(8)),  # z, tip angle, 6 joint angles; 8-16: qvel
    "Walker2d-v5": list(range(8)),  # z, torso angle, 6 joint angles; 8-16: qvel
}


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate")
    positive += ("clip_obs", "clip_reward", "lstm_size", "eval_episodes", "torch_threads")
    check_positive(**{name: getattr(args, name) for name in positive})
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    if args.num_envs % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide --num-envs {args.num_envs}: "
            "a minibatch holds whole environment sequences"
        )
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch of {args.batch_size} steps")
    check_env_id(args.env_id)
    if args.hide_velocities and args.env_id not in POSITIONS:
        fail(
            f"--hide-velocities knows the observation layouts of {', '.join(POSITIONS)}, not {args.env_id}; "
            "add --no-hide-velocities to train on its full observation"
        )
    try:
        probe = gym.make(args.env_id)
    except Exception as error:  # a simulator package that is not installed, a broken install
        reason = str(error).strip().splitlines()
        fail(f"cannot make {args.env_id}: {type(error).__name__}{': ' + reason[0] if reason else ''}")
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        fail(
            f"ppo_continuous_action_lstm.py needs a one-dimensional Box action space but {args.env_id} has "
            f"{action_space}; for discrete actions with memory use cleanrl/ppo_atari_lstm.py"
        )
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        fail(f"ppo_continuous_action_lstm.py needs a flat Box observation but {args.env_id} has {observation_space}")


class HideVelocities(gym.ObservationWrapper):
    """The observation's position entries only (`positions`: their indices): a POMDP whose velocities the agent
    must infer from the history of positions."""

    def __init__(self, env: gym.Env, positions: list[int]):
        super().__init__(env)
        self.positions = np.asarray(positions)
        space = env.observation_space
        low, high = space.low[self.positions], space.high[self.positions]
        self.observation_space = gym.spaces.Box(low, high, dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.positions]


def make_env(env_id: str, idx: int, hide_velocities: bool, capture_video: bool, video_dir: Path | None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        if hide_velocities:
            env = HideVelocities(env, POSITIONS[env_id])
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, hide_velocities: bool, capture_video=False, video_dir: Path | None = None):
    # SAME_STEP: an env that ends an episode resets at once and returns the true final observation in
    # infos["final_obs"]; the observation it returns is the next episode's first.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, hide_velocities, capture_video, video_dir) for i in range(num_envs)],
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
    """Running mean and variance of a stream of batches, on the training device, in float64 (Chan, Golub and LeVeque
    1979's parallel merge), the count starting at `epsilon` with mean 0 and variance 1 as in gymnasium."""

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
    then clips; G restarts after an episode ends. Once per rollout: its returns enter the statistics, then its
    rewards are scaled by them."""

    def __init__(self, num_envs: int, gamma: float, clip: float):
        super().__init__()
        self.return_rms = RunningMeanStd(())
        self.register_buffer("carry", torch.zeros(num_envs))  # gamma * G of each env's ongoing episode
        self.gamma, self.clip = gamma, clip

    def forward(self, rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        carries = self.gamma * (1.0 - dones)
        returns = [rewards[0] + self.carry]
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


def lstm_layer(in_dim: int, hidden: int) -> nn.LSTM:
    """An LSTM with orthogonal weights and zero biases (CleanRL's ppo_atari_lstm.py)."""
    lstm = nn.LSTM(in_dim, hidden)
    for name, param in lstm.named_parameters():
        if "bias" in name:
            nn.init.constant_(param, 0)
        else:
            nn.init.orthogonal_(param, 1.0)
    return lstm


def recur(lstm: nn.LSTM, inputs: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    """Step `lstm` over inputs [T, B, F] from state (h, c) [1, B, H], zeroing an env's state before each step whose
    observation starts an episode (starts [T, B], bool). Returns the outputs [T, B, H] and the state after the last
    step. One LSTM call per run of steps with no episode start after its first (ppo_atari_lstm.py's way)."""
    # Steps where some env starts (a host read: skipped for the rollout's single steps, which have none after the first)
    cuts = (torch.nonzero(starts[1:].any(dim=1)).flatten() + 1).tolist() if len(inputs) > 1 else []
    outputs = []
    for begin, end in zip([0] + cuts, cuts + [len(inputs)]):
        keep = (~starts[begin]).to(inputs.dtype).view(1, -1, 1)
        output, state = lstm(inputs[begin:end], (state[0] * keep, state[1] * keep))
        outputs.append(output)
    return torch.cat(outputs), state


class Agent(nn.Module):
    """A Gaussian policy N(mean, exp(logstd)^2) whose mean is a 64x64 tanh MLP on the actor LSTM's output, its log
    standard deviation a state-independent parameter; the value is a 64x64 tanh MLP on the critic LSTM's output. Both
    LSTMs read the normalised observation. The memory of a batch of envs is one tensor [4, B, lstm_size]: the actor's
    (h, c), then the critic's (h, c)."""

    def __init__(self, obs_dim: int, act_dim: int, lstm_size: int):
        super().__init__()
        self.actor_lstm = lstm_layer(obs_dim, lstm_size)
        self.critic_lstm = lstm_layer(obs_dim, lstm_size)
        self.actor_mean = mlp(lstm_size, act_dim, out_std=0.01)
        self.critic = mlp(lstm_size, 1, out_std=1.0)
        self.actor_logstd = nn.Parameter(torch.zeros(act_dim))

    def initial_memory(self, num_envs: int, device) -> torch.Tensor:
        return torch.zeros((4, num_envs, self.actor_lstm.hidden_size), device=device)

    def unroll(self, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Observation sequences [T, B, obs_dim] from `memory`: the policy's means [T, B, act_dim], the values [T, B]
        and the memory after the last step."""
        actor_out, (actor_h, actor_c) = recur(self.actor_lstm, obs, (memory[0:1], memory[1:2]), starts)
        critic_out, (critic_h, critic_c) = recur(self.critic_lstm, obs, (memory[2:3], memory[3:4]), starts)
        memory = torch.cat([actor_h, actor_c, critic_h, critic_c])
        return self.actor_mean(actor_out), self.critic(critic_out).squeeze(-1), memory

    def log_prob(self, mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log N(actions; mean, std^2), summed over the action dimensions."""
        z = (actions - mean) / self.actor_logstd.exp()
        return (-0.5 * z.square() - self.actor_logstd - 0.5 * math.log(2 * math.pi)).sum(-1)

    def act(self, obs, memory, starts, noise) -> tuple[torch.Tensor, ...]:
        """One step of every env (obs [B, obs_dim], starts [B]): the action mean + std * noise (noise drawn by the
        caller), its log-probability, the value and the memory after this observation."""
        mean, value, memory = self.unroll(obs.unsqueeze(0), memory, starts.unsqueeze(0))
        action = mean[0] + self.actor_logstd.exp() * noise
        return action, self.log_prob(mean[0], action), value[0], memory

    def get_value(self, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        return self.unroll(obs.unsqueeze(0), memory, starts.unsqueeze(0))[1][0]

    def entropy(self) -> torch.Tensor:
        """The policy's entropy, the same in every state since the standard deviation does not depend on it."""
        return Normal(0.0, self.actor_logstd.exp(), validate_args=False).entropy().sum()


class Sequences(NamedTuple):
    """A rollout as whole env sequences, env on dim 1 of every field: [num_steps, envs, ...], and the memory each
    env's sequence began with [4, envs, lstm_size]."""

    obs: torch.Tensor
    starts: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor
    initial_memory: torch.Tensor

    def take(self, envs: torch.Tensor) -> "Sequences":
        return Sequences(*(field[:, envs] for field in self))


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps on the device: the normalised observations, the episode starts
    that zero the memory, the unclipped actions, their log-probabilities and values, the value of the true final
    observation where the time limit cut an episode, and the memory the rollout began with. Rewards and episode ends
    come from the CPU simulator, staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, act_dim: int, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.starts = torch.zeros((num_steps, num_envs), dtype=torch.bool, device=device)
        self.actions = torch.zeros((num_steps, num_envs, act_dim), device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.values = torch.zeros((num_steps, num_envs), device=device)
        self.final_values = torch.zeros((num_steps, num_envs), device=device)
        self.initial_memory: torch.Tensor | None = None
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.device = device

    def to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)


def compute_gae(rewards, values, next_values, terminations, truncations, gamma, gae_lambda) -> torch.Tensor:
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


def update_minibatch(agent: Agent, optimizer: torch.optim.Optimizer, mb: Sequences, args: Args) -> dict:
    """One gradient step of the clipped PPO loss on the minibatch `mb` of whole env sequences, replayed from the
    memory they began with. Returns its losses, log-ratios, ratios and the count of ratios outside the clip range."""
    mean, newvalue, _ = agent.unroll(mb.obs, mb.initial_memory, mb.starts)
    newlogprob = agent.log_prob(mean, mb.actions)
    logratio = newlogprob - mb.logprobs
    ratio = logratio.exp()

    advantages = mb.advantages
    if args.norm_adv:
        std, mean_advantage = torch.std_mean(advantages)
        advantages = (advantages - mean_advantage) / (std + 1e-8)

    # Policy loss
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
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

    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    ratio, logratio = ratio.detach(), logratio.detach()
    clipped = ((ratio - 1.0).abs() > args.clip_coef).sum()
    return dict(
        policy_loss=pg_loss.detach(), value_loss=v_loss.detach(), logratio=logratio, ratio=ratio, clipped=clipped
    )


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its mean action, on the observations
    it trained on (velocities hidden or not), normalised with the saved statistics, which stay frozen."""
    model = load_model(model_path, __file__)
    hide_velocities, clip_obs = model["args"]["hide_velocities"], model["args"]["clip_obs"]
    envs = make_envs(model["env_id"], 1, hide_velocities, capture_video, video_dir)
    agent = Agent(model["obs_dim"], model["act_dim"], model["lstm_size"]).to(device)
    agent.load_state_dict(model["agent"])
    obs_rms = RunningMeanStd(model["obs_dim"]).to(device)
    obs_rms.load_state_dict(model["obs_rms"])
    action_low, action_high = action_bounds(envs, device)
    obs_np, _ = envs.reset(seed=seed)
    memory, starts = agent.initial_memory(1, device), torch.ones(1, dtype=torch.bool, device=device)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            obs = obs_rms.normalize(torch.as_tensor(obs_np, device=device), clip_obs)
            mean, _, memory = agent.unroll(obs.unsqueeze(0), memory, starts.unsqueeze(0))
            obs_np, _, terminated, truncated, infos = envs.step(mean[0].clamp(action_low, action_high).cpu().numpy())
            starts = torch.as_tensor(terminated | truncated, device=device)
            if "episode" in infos:
                episodic_returns += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return episodic_returns[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_envs(args.env_id, args.num_envs, args.hide_velocities, args.capture_video, run.dir / "videos")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    action_low, action_high = action_bounds(envs, device)

    agent = Agent(obs_dim, act_dim, args.lstm_size).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    obs_rms = RunningMeanStd(obs_dim).to(device)
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.clip_reward).to(device)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_dim, act_dim, device)

    def observe(obs_np: np.ndarray) -> torch.Tensor:
        """What the policy sees: the observations enter the running statistics, then are normalised by them."""
        raw = torch.as_tensor(obs_np, device=device).view(args.num_envs, obs_dim)
        obs_rms.update(raw)
        return obs_rms.normalize(raw, args.clip_obs)

    global_step, iteration = 0, 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    next_obs = None
    memory = agent.initial_memory(args.num_envs, device)  # carried from one rollout into the next
    next_starts = torch.ones(args.num_envs, dtype=torch.bool, device=device)  # next obs starts an episode
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        obs_rms.load_state_dict(run.checkpoint["obs_rms"])
        reward_scaler.load_state_dict(run.checkpoint["reward_scaler"])
        envs, next_obs = restore_envs(envs, run.checkpoint["envs"])
        if next_obs is None:  # the environments were not saved: the fresh ones start new episodes, with no memory
            reward_scaler.carry.zero_()
        else:  # the same episodes go on, with the same memory of them
            memory, next_starts = run.checkpoint["memory"].to(device), run.checkpoint["next_starts"].to(device)
        global_step, iteration = run.checkpoint["global_step"], run.checkpoint["iteration"]
    next_obs = observe(next_obs_np) if next_obs is None else next_obs.to(device)

    def training_state() -> dict:
        """What a checkpoint holds (written between rollouts: `memory` is the next rollout's first state); resuming
        reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            obs_rms=obs_rms.state_dict(),
            reward_scaler=reward_scaler.state_dict(),
            envs=snapshot_envs(envs, next_obs),
            memory=memory,
            next_starts=next_starts,
            global_step=global_step,
            iteration=iteration,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout: one host-to-device copy of the observations (and of the episode-start flags, which
        # the LSTM needs at once) and one device-to-host copy of the actions per step.
        with torch.no_grad():
            storage.initial_memory = memory  # the update replays every sequence from here
            noise = torch.randn((args.num_steps, args.num_envs, act_dim), device=device)
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                storage.starts[step] = next_starts
                action, storage.logprobs[step], storage.values[step], memory = agent.act(
                    next_obs, memory, next_starts, noise[step]
                )
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(
                    action.clamp(action_low, action_high).cpu().numpy()
                )
                next_obs = observe(next_obs_np)
                storage.rewards[step] = reward
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                # A time-limit cut bootstraps from the value of the true final observation, seen by the critic with
                # the memory of the episode it ends (not zeroed: it is that episode's last observation).
                bootstrap_final = truncated & ~terminated
                if bootstrap_final.any():
                    cut = torch.as_tensor(np.flatnonzero(bootstrap_final), device=device)
                    final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap_final]), device=device)
                    final_obs = obs_rms.normalize(final_obs.view(-1, obs_dim), args.clip_obs)
                    no_start = torch.zeros(len(cut), dtype=torch.bool, device=device)
                    storage.final_values[step, cut] = agent.get_value(final_obs, memory[:, cut], no_start)
                # SAME_STEP autoreset: after an episode's end the observation returned is the next one's first.
                next_starts = torch.as_tensor(terminated | truncated, device=device)
                run.log_episodes(global_step, infos)

            # 2. Advantages: rewards scaled, the rollout bootstrapped from the value of the observation after it.
            terminations = storage.to_device(storage.terminations)
            truncations = storage.to_device(storage.truncations)
            rewards = reward_scaler(storage.to_device(storage.rewards), torch.maximum(terminations, truncations))
            bootstrap = agent.get_value(next_obs, memory, next_starts)
            next_values = torch.cat([storage.values[1:], bootstrap.unsqueeze(0)])
            next_values = torch.where(truncations * (1 - terminations) > 0, storage.final_values, next_values)
            values = storage.values
            advantages = compute_gae(
                rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            returns = advantages + values
            sequences = Sequences(
                storage.obs,
                storage.starts,
                storage.actions,
                storage.logprobs,
                advantages,
                returns,
                values,
                storage.initial_memory,
            )

        # 3. Update the policy and value network on minibatches of whole environment sequences
        envs_per_minibatch = args.num_envs // args.num_minibatches
        clipped = torch.zeros((), dtype=torch.long, device=device)  # ratios outside the clip range, for clipfrac
        for epoch in range(args.update_epochs):
            for mb_envs in torch.randperm(args.num_envs, device=device).split(envs_per_minibatch):
                mb = sequences.take(mb_envs)
                stats = update_minibatch(agent, optimizer, mb, args)
                clipped += stats["clipped"]

            # The KL estimates (http://joschu.net/blog/kl-approx.html) of the epoch's last minibatch. The early stop
            # reads them on the host: one sync per epoch, only when asked for.
            with torch.no_grad():
                old_approx_kl = (-stats["logratio"]).mean()
                approx_kl = ((stats["ratio"] - 1) - stats["logratio"]).mean()
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        var_y = returns.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (returns - values).var() / var_y)
        run.log(
            global_step,
            {
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
        lstm_size=args.lstm_size,
    )
