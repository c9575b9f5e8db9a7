"""Parallelised Q-Network (PQN) for discrete actions.

Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (https://arxiv.org/abs/2407.04811): Q-learning
without a replay buffer or a target network. Many vectorised environments collect a short rollout epsilon-greedily
(linearly decaying epsilon); LayerNorm in the Q-network keeps the bootstrapped regression stable; the targets are
Q(lambda) returns computed backwards over the rollout, and the network fits them over a few epochs of minibatches.

Action space: Discrete. Observations: a flat Box. Environments: vectorised gymnasium (classic control: CartPole-v1,
Acrobot-v1, MountainCar-v0 ...). Only a termination cuts the bootstrap; a time-limit truncation bootstraps with the
max Q of the true final observation and stops the lambda-recursion there. Network: CleanRL's pqn.py sizes
(Linear-LayerNorm-ReLU of 120 then 84 units); loss: the mean squared error against the returns, as CleanRL's (so
--max-grad-norm clips the same gradient); optimiser: RAdam with gradient clipping. Checkpoints hold the pickled
simulators: a resumed run on the CPU continues exactly as the uninterrupted one would.

    uv run python cleanrl/pqn.py --env-id CartPole-v1

Expect CartPole-v1 to reach ~500 within 500k steps (500.00 +- 0.00 over 3 seeds, benchmark/results/pqn.md).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

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
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing (linearly to 0 over the run)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) returns (0: one-step targets; 1: Monte-Carlo returns)"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the Q-network"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate")
    check_positive(**{name: getattr(args, name) for name in positive + ("max_grad_norm", "eval_episodes")})
    check_positive(torch_threads=args.torch_threads)
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.q_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --q-lambda in [0, 1], got {args.gamma} and {args.q_lambda}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(f"epsilon must decay: need 0 <= --end-e <= --start-e <= 1, got {args.end_e} and {args.start_e}")
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
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
    check_env_id(args.env_id)
    probe = gym.make(args.env_id)
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"pqn.py handles Discrete actions but {args.env_id} has {action_space}; "
            f"use cleanrl/sac_continuous_action.py or cleanrl/ppo_continuous_action.py"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        fail(f"pqn.py needs Box observations but {args.env_id} has {observation_space}")


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        if len(env.observation_space.shape) > 1:
            env = gym.wrappers.FlattenObservation(env)
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    # SAME_STEP: an env that ends an episode resets at once and returns the true final
    # observation in infos["final_obs"]. copy=False skips a deepcopy; we copy obs to torch anyway.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


class QNetwork(nn.Module):
    """LayerNorm after each hidden layer: what lets PQN bootstrap from its own, moving, Q-values (paper, section 4)."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120),
            nn.LayerNorm(120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.LayerNorm(84),
            nn.ReLU(),
            nn.Linear(84, n_actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` transitions. Observations and actions live on the device (the
    network needs them each step); rewards and episode ends are staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        # The true final observation of an episode truncated at step t (zeros elsewhere).
        self.final_obs = np.zeros((num_steps, num_envs, obs_dim), dtype=np.float32)
        self.device = device

    def rewards_and_ends(self) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.as_tensor(a, device=self.device) for a in (self.rewards, self.terminations, self.truncations)
        )


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


def select_actions(q_network: QNetwork, obs: torch.Tensor, epsilon: float, n_actions: int) -> torch.Tensor:
    """Epsilon-greedy actions for a batch of observations, drawn with torch's RNG on obs.device."""
    explore = torch.rand(len(obs), device=obs.device) < epsilon
    random_actions = torch.randint(n_actions, (len(obs),), device=obs.device)
    return torch.where(explore, random_actions, q_network(obs).argmax(dim=1))


def q_lambda_returns(rewards, next_max_q, terminations, truncations, gamma, q_lambda) -> torch.Tensor:
    """Q(lambda) returns for a [num_steps, num_envs] rollout, computed backwards:

        G_t = r_t + gamma * (1 - terminated_t) * [(1 - lambda) * next_max_q[t] + lambda * G_{t+1}]

    next_max_q[t] is max_a Q of the observation that followed step t: the true final observation where an
    episode ended at t. A termination zeroes the bootstrap; a truncation keeps it. Either one stops the recursion
    (G_{t+1} belongs to the next episode), and so does the end of the rollout: there G_t bootstraps from
    next_max_q[t] alone.
    """
    bootstrap = 1.0 - terminations
    episode_continues = 1.0 - torch.maximum(terminations, truncations)
    returns = torch.zeros_like(rewards)
    next_return = next_max_q[-1]
    for t in reversed(range(rewards.shape[0])):
        mixed = next_max_q[t] + q_lambda * episode_continues[t] * (next_return - next_max_q[t])
        next_return = rewards[t] + gamma * bootstrap[t] * mixed
        returns[t] = next_return
    return returns


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
    epsilon: float = 0.05,
) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its epsilon-greedy policy."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    q_network = QNetwork(model["obs_dim"], model["n_actions"]).to(device)
    q_network.load_state_dict(model["q_network"])
    obs, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            obs_t = torch.tensor(obs, dtype=torch.float32, device=device)
            actions = select_actions(q_network, obs_t, epsilon, model["n_actions"])
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
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
    n_actions = int(envs.single_action_space.n)

    q_network = QNetwork(obs_dim, n_actions).to(device)
    # RAdam, as the paper and CleanRL's pqn.py use (Adam did worse here: benchmark/results/pqn.md).
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=args.learning_rate)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_dim, device)

    global_step, iteration = 0, 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    if run.checkpoint:
        q_network.load_state_dict(run.checkpoint["q_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, next_obs_np = restore_envs(envs, run.checkpoint["envs"], next_obs_np)
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device).view(args.num_envs, obs_dim)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            q_network=q_network.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, next_obs_np),
            global_step=global_step,
        )

    run.begin(training_state)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout epsilon-greedily: one host-to-device copy of the observations and one
        # device-to-host copy of the actions per step; rewards and episode ends are moved once per rollout.
        with torch.no_grad():
            for step in range(args.num_steps):
                epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
                global_step += args.num_envs
                storage.obs[step] = next_obs
                action = select_actions(q_network, next_obs, epsilon, n_actions)
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device).view(args.num_envs, obs_dim)
                storage.rewards[step] = reward
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                # Bootstrapping needs the true final observation only where the time limit cut an episode.
                bootstrap_final = truncated & ~terminated
                if bootstrap_final.any():
                    final_obs = np.stack(infos["final_obs"][bootstrap_final])
                    storage.final_obs[step, bootstrap_final] = final_obs.reshape(-1, obs_dim)
                run.log_episodes(global_step, infos)

            # 2. Q(lambda) returns: max Q of every following observation in one batched pass.
            rewards, terminated, truncated = storage.rewards_and_ends()
            next_max_q = q_network(torch.cat([storage.obs[1:], next_obs.unsqueeze(0)])).amax(dim=-1)
            if storage.truncations.any():
                final_max_q = q_network(torch.as_tensor(storage.final_obs, device=device)).amax(dim=-1)
                next_max_q = torch.where(truncated * (1 - terminated) > 0, final_max_q, next_max_q)
                storage.final_obs.fill(0.0)
            returns = q_lambda_returns(rewards, next_max_q, terminated, truncated, args.gamma, args.q_lambda)

            b_obs = storage.obs.reshape(-1, obs_dim)
            b_actions = storage.actions.reshape(-1)
            b_returns = returns.reshape(-1)

        # 3. Regress Q(s_t, a_t) on the returns over a few epochs of minibatches.
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                q_values = q_network(b_obs[mb_inds]).gather(1, b_actions[mb_inds].unsqueeze(1)).squeeze(1)
                # The mean squared error, as CleanRL's F.mse_loss (no factor 1/2: --max-grad-norm means the same).
                loss = F.mse_loss(q_values, b_returns[mb_inds])
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        run.log(
            global_step,
            {
                "losses/td_loss": loss,
                "losses/q_values": q_values.mean(),
                "charts/epsilon": epsilon,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, q_network=q_network.state_dict(), obs_dim=obs_dim, n_actions=n_actions)
