"""COMPARISON BASELINE ONLY -- not an algorithm script of this project (use cleanrl/dqn.py to train).

The straightforward eager DQN that cleanrl/dqn.py's speed is measured against (benchmark/results/speed.md): CleanRL's
dqn.py (https://github.com/vwxyzjn/cleanrl/blob/master/cleanrl/dqn.py) at the same hyperparameters, written plainly as
CleanRL writes it: per-step Python epsilon-greedy, a numpy replay buffer (what stable-baselines3's ReplayBuffer does),
nn.Sequential, default torch.optim.Adam (torch threads as in the script), TensorBoard scalars with .item(). Ported
only as far as gymnasium 1.x needs (same-step autoreset, the vector RecordEpisodeStatistics). No bookkeeping beyond
TensorBoard.

    python benchmark/eager_baselines/dqn_eager.py --env-id CartPole-v1 --total-timesteps 50000
"""

import random
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    seed: int = 1
    torch_threads: int = 1
    """CPU threads for torch, as cleanrl/dqn.py's default: this compares code, not thread counts"""
    env_id: str = "CartPole-v1"
    total_timesteps: int = 500000
    learning_rate: float = 2.5e-4
    buffer_size: int = 10000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 500
    batch_size: int = 128
    start_e: float = 1
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    learning_starts: int = 10000
    train_frequency: int = 10


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions)
        )

    def forward(self, x):
        return self.network(x)


class ReplayBuffer:
    """Numpy arrays, uniform sampling, minibatches converted to tensors (stable-baselines3's ReplayBuffer)."""

    def __init__(self, size, obs_dim):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros((size, 1), np.int64)
        self.rewards = np.zeros((size, 1), np.float32)
        self.dones = np.zeros((size, 1), np.float32)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, next_obs, action, reward, done):
        self.obs[self.pos], self.next_obs[self.pos] = obs, next_obs
        self.actions[self.pos], self.rewards[self.pos], self.dones[self.pos] = action, reward, done
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch_size):
        idx = np.random.randint(0, self.size if self.full else self.pos, size=batch_size)
        fields = (self.obs, self.next_obs, self.actions, self.rewards, self.dones)
        return [torch.as_tensor(field[idx]) for field in fields]


def linear_schedule(start_e, end_e, duration, t):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


if __name__ == "__main__":
    args = tyro.cli(Args)
    run_name = f"{args.env_id}__dqn_eager__{args.seed}__{int(time.time())}"
    writer = SummaryWriter(f"runs/{run_name}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env_id)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    envs.single_action_space.seed(args.seed)
    obs_dim, n_actions = envs.single_observation_space.shape[0], envs.single_action_space.n

    q_network = QNetwork(obs_dim, n_actions)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(obs_dim, n_actions)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, obs_dim)
    start_time = time.time()

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample()])
        else:
            q_values = q_network(torch.Tensor(obs))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        if "episode" in infos:
            for r, length in zip(infos["episode"]["r"][infos["_episode"]], infos["episode"]["l"][infos["_episode"]]):
                writer.add_scalar("charts/episodic_return", r, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
        real_next_obs = next_obs.copy()
        if "final_obs" in infos:
            real_next_obs[0] = infos["final_obs"][0] if infos["_final_obs"][0] else real_next_obs[0]
        rb.add(obs[0], real_next_obs[0], actions[0], rewards[0], terminations[0])
        obs = next_obs

        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data_obs, data_next_obs, data_actions, data_rewards, data_dones = rb.sample(args.batch_size)
                with torch.no_grad():
                    target_max, _ = target_network(data_next_obs).max(dim=1)
                    td_target = data_rewards.flatten() + args.gamma * target_max * (1 - data_dones.flatten())
                old_val = q_network(data_obs).gather(1, data_actions).squeeze()
                loss = F.mse_loss(td_target, old_val)
                if global_step % 100 == 0:
                    writer.add_scalar("losses/td_loss", loss, global_step)
                    writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                    writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if global_step % args.target_network_frequency == 0:
                for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.data.copy_(args.tau * param.data + (1.0 - args.tau) * target_param.data)

    envs.close()
    writer.close()
