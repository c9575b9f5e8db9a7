"""COMPARISON BASELINE ONLY -- not an algorithm script of this project (use cleanrl/td3_continuous_action.py).

The straightforward eager TD3 that cleanrl/td3_continuous_action.py's speed is measured against
(benchmark/results/speed.md): CleanRL's td3_continuous_action.py
(https://github.com/vwxyzjn/cleanrl/blob/master/cleanrl/td3_continuous_action.py) at the same hyperparameters, written
plainly as CleanRL writes it: two separate critics, a numpy replay buffer (what
stable-baselines3's ReplayBuffer does), default torch.optim.Adam (torch threads as in the script), per-parameter
Polyak loops, TensorBoard scalars with .item(). Ported only as far as gymnasium 1.x needs. No bookkeeping beyond
TensorBoard.

    python benchmark/eager_baselines/td3_eager.py --env-id Pendulum-v1 --total-timesteps 10000 --learning-starts 5000
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
    torch_threads: int = 0
    """CPU threads for torch (0: one per core), as td3_continuous_action.py: this compares code, not thread counts"""
    env_id: str = "Hopper-v5"
    total_timesteps: int = 1000000
    learning_rate: float = 3e-4
    buffer_size: int = 1000000
    gamma: float = 0.99
    tau: float = 0.005
    batch_size: int = 256
    policy_noise: float = 0.2
    exploration_noise: float = 0.1
    learning_starts: int = 25000
    policy_frequency: int = 2
    noise_clip: float = 0.5


class QNetwork(nn.Module):
    def __init__(self, obs_dim, action_dim):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + action_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 1)

    def forward(self, x, a):
        x = torch.cat([x, a], 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Actor(nn.Module):
    def __init__(self, obs_dim, low, high):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc_mu = nn.Linear(256, len(low))
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = torch.tanh(self.fc_mu(x))
        return x * self.action_scale + self.action_bias


class ReplayBuffer:
    """Numpy arrays, uniform sampling, minibatches converted to tensors (stable-baselines3's ReplayBuffer)."""

    def __init__(self, size, obs_dim, action_dim):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros((size, action_dim), np.float32)
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


if __name__ == "__main__":
    args = tyro.cli(Args)
    run_name = f"{args.env_id}__td3_eager__{args.seed}__{int(time.time())}"
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
    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    low, high = envs.single_action_space.low, envs.single_action_space.high

    actor = Actor(obs_dim, low, high)
    qf1, qf2 = QNetwork(obs_dim, action_dim), QNetwork(obs_dim, action_dim)
    qf1_target, qf2_target = QNetwork(obs_dim, action_dim), QNetwork(obs_dim, action_dim)
    target_actor = Actor(obs_dim, low, high)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_optimizer = optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.learning_rate)
    actor_optimizer = optim.Adam(list(actor.parameters()), lr=args.learning_rate)
    rb = ReplayBuffer(args.buffer_size, obs_dim, action_dim)
    start_time = time.time()

    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        if global_step < args.learning_starts:
            actions = np.array([envs.single_action_space.sample()])
        else:
            with torch.no_grad():
                actions = actor(torch.Tensor(obs))
                actions += torch.normal(0, actor.action_scale * args.exploration_noise)
                actions = actions.cpu().numpy().clip(low, high)

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
            data_obs, data_next_obs, data_actions, data_rewards, data_dones = rb.sample(args.batch_size)
            with torch.no_grad():
                clipped_noise = (torch.randn_like(data_actions) * args.policy_noise).clamp(
                    -args.noise_clip, args.noise_clip
                ) * target_actor.action_scale
                next_state_actions = (target_actor(data_next_obs) + clipped_noise).clamp(low[0], high[0])
                qf1_next_target = qf1_target(data_next_obs, next_state_actions)
                qf2_next_target = qf2_target(data_next_obs, next_state_actions)
                min_qf_next_target = torch.min(qf1_next_target, qf2_next_target)
                next_q_value = data_rewards.flatten() + (
                    1 - data_dones.flatten()
                ) * args.gamma * min_qf_next_target.view(-1)
            qf1_a_values = qf1(data_obs, data_actions).view(-1)
            qf2_a_values = qf2(data_obs, data_actions).view(-1)
            qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
            qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
            qf_loss = qf1_loss + qf2_loss
            q_optimizer.zero_grad()
            qf_loss.backward()
            q_optimizer.step()

            if global_step % args.policy_frequency == 0:
                actor_loss = -qf1(data_obs, actor(data_obs)).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward()
                actor_optimizer.step()
                for net, target in ((actor, target_actor), (qf1, qf1_target), (qf2, qf2_target)):
                    for param, target_param in zip(net.parameters(), target.parameters()):
                        target_param.data.copy_(args.tau * param.data + (1 - args.tau) * target_param.data)

            if global_step % 100 == 0:
                writer.add_scalar("losses/qf1_values", qf1_a_values.mean().item(), global_step)
                writer.add_scalar("losses/qf1_loss", qf1_loss.item(), global_step)
                writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)
                writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)

    envs.close()
    writer.close()
