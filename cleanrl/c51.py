"""Categorical DQN (C51) for discrete actions.

Bellemare et al. 2017, "A Distributional Perspective on Reinforcement Learning"
(https://arxiv.org/abs/1707.06887): instead of one Q-value per action, the network outputs a
categorical distribution of the return over a fixed support of `n_atoms` atoms evenly spaced
on [v_min, v_max]; Q(s, a) is the mean of that distribution. The target is the distribution
of r + gamma * z at the target network's greedy next action, projected back onto the support
(`project_distribution`), and the loss is the cross-entropy between the projected target and
the predicted distribution of the action taken. Replay, target network and epsilon-greedy
exploration are as in DQN.

Action space: Discrete. Observations: a flat Box. Environments: vectorised gymnasium
environments (classic control: CartPole-v1, Acrobot-v1, MountainCar-v0 ...).

    uv run python cleanrl/c51.py --env-id CartPole-v1

Expect CartPole-v1 to reach ~500 within 500k steps (CleanRL reports 481.20 +- 20.53 over 3
seeds with these defaults).

Environments reset in the same step an episode ends (gymnasium's SAME_STEP autoreset); the
replay buffer stores the true final observation of an ended episode as its next observation,
and its termination (not its truncation) as the done flag, so a time-limit truncation is
bootstrapped and only a termination cuts the target. Classic-control simulators are pickled
into checkpoints together with the replay buffer, so a resumed run on the CPU continues exactly
as the uninterrupted one would.
"""

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
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
    restore_envs,
    restore_rng_state,
    save_checkpoint,
    save_model,
    snapshot_envs,
)
from cleanrl_utils.errors import check_env_id, check_positive, fail
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
    num_envs: int = 1
    """the number of parallel game environments"""
    n_atoms: int = 101
    """the number of atoms of the return distribution's support"""
    v_min: float = -100
    """the lowest return the support can represent"""
    v_max: float = 100
    """the highest return the support can represent"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    target_network_frequency: int = 500
    """the timesteps it takes to update the target network (a hard copy)"""
    batch_size: int = 128
    """the batch size of sample from the replay memory"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 10000
    """timestep to start learning"""
    train_frequency: int = 10
    """the frequency of training (one gradient step every this many timesteps)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""


# Losses, epsilon and SPS are read back from the device and logged every this many steps.
LOG_EVERY = 100


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        train_frequency=args.train_frequency,
        target_network_frequency=args.target_network_frequency,
        learning_rate=args.learning_rate,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if args.learning_starts < 0:
        fail(f"--learning-starts must be 0 or positive, got {args.learning_starts}")
    if not 0 < args.gamma <= 1:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
    if args.n_atoms < 2:
        fail(f"--n-atoms must be at least 2 (the support needs two ends), got {args.n_atoms}")
    if not args.v_min < args.v_max:
        fail(f"--v-min must be below --v-max, got --v-min {args.v_min} --v-max {args.v_max}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(
            f"epsilon must decay within [0, 1]: need 0 <= --end-e <= --start-e <= 1, got --start-e {args.start_e} --end-e {args.end_e}"
        )
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if args.batch_size > args.buffer_size:
        fail(
            f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; raise the buffer or lower the batch"
        )
    if args.num_envs > args.buffer_size:
        fail(
            f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: one step would overwrite itself"
        )
    check_env_id(args.env_id)
    probe = gym.make(args.env_id)
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"c51.py handles Discrete actions but {args.env_id} has {action_space}; use "
            f"cleanrl/sac_continuous_action.py, cleanrl/td3_continuous_action.py or cleanrl/ddpg_continuous_action.py"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        fail(f"c51.py needs Box observations but {args.env_id} has {observation_space}")


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
    # observation in infos["final_obs"]. copy=False skips a deepcopy: the returned observation
    # array is overwritten by the next step, so the loop keeps its own copy.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


class QNetwork(nn.Module):
    """Logits of a categorical return distribution over `support` for every action."""

    def __init__(self, obs_dim: int, n_actions: int, n_atoms: int, v_min: float, v_max: float):
        super().__init__()
        self.n_actions, self.n_atoms = n_actions, n_atoms
        self.register_buffer("support", torch.linspace(v_min, v_max, n_atoms))
        self.fc1 = nn.Linear(obs_dim, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, n_actions * n_atoms)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, [batch, n_actions, n_atoms]."""
        # The same maths as nn.Sequential, called functionally: a module call per layer costs
        # about as much as the layer itself when acting on one observation.
        x = F.relu(F.linear(x, self.fc1.weight, self.fc1.bias))
        x = F.relu(F.linear(x, self.fc2.weight, self.fc2.bias))
        return F.linear(x, self.fc3.weight, self.fc3.bias).view(-1, self.n_actions, self.n_atoms)

    def q_values(self, x: torch.Tensor) -> torch.Tensor:
        """The means of the distributions, [batch, n_actions]."""
        return (torch.softmax(self(x), dim=2) * self.support).sum(dim=2)


class ReplayBuffer:
    """The last `buffer_size` transitions, circular, in one tensor on the training device.

    Each row is one transition: obs | next_obs | action | reward | termination. A step of all
    environments is assembled in a host staging array and written with one host-to-device copy;
    a minibatch is one gather. Actions are stored as floats (exact below 2**24 actions).
    """

    def __init__(self, buffer_size: int, num_envs: int, obs_dim: int, device: torch.device):
        self.buffer_size, self.obs_dim = buffer_size, obs_dim
        self.data = torch.zeros((buffer_size, 2 * obs_dim + 3), device=device)
        self.staging = np.zeros((num_envs, 2 * obs_dim + 3), dtype=np.float32)
        self.staging_tensor = torch.from_numpy(self.staging)  # shares the staging memory
        self.pos, self.size = 0, 0

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        infos: dict,
    ) -> None:
        """Store one step of every environment, as returned by a SAME_STEP vector env."""
        d, n = self.obs_dim, len(obs)
        rows = self.staging
        rows[:, :d] = obs
        rows[:, d : 2 * d] = next_obs
        if "final_obs" in infos:
            # Where an episode ended, next_obs already holds the first observation of the next
            # episode; the transition leads to the true final one (bootstrapped if truncated).
            ended = infos["_final_obs"]
            rows[ended, d : 2 * d] = np.stack(infos["final_obs"][ended])
        rows[:, 2 * d] = actions
        rows[:, 2 * d + 1] = rewards
        rows[:, 2 * d + 2] = terminations
        end = self.pos + n
        if end <= self.buffer_size:
            self.data[self.pos : end].copy_(self.staging_tensor)
        else:  # wrap around
            split = self.buffer_size - self.pos
            self.data[self.pos :].copy_(self.staging_tensor[:split])
            self.data[: n - split].copy_(self.staging_tensor[split:])
        self.pos = end % self.buffer_size
        self.size = min(self.size + n, self.buffer_size)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """A uniform minibatch (with replacement): obs, next_obs, actions, rewards, terminations."""
        indices = torch.randint(self.size, (batch_size,), device=self.data.device)
        batch = torch.index_select(self.data, 0, indices)
        d = self.obs_dim
        return batch[:, :d], batch[:, d : 2 * d], batch[:, 2 * d].long(), batch[:, 2 * d + 1], batch[:, 2 * d + 2]

    def state_dict(self) -> dict:
        return {"data": self.data[: self.size].cpu(), "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.data[: self.size].copy_(state["data"])


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def project_distribution(
    next_probs: torch.Tensor, rewards: torch.Tensor, terminations: torch.Tensor, support: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Project the distribution of r + gamma * (1 - termination) * z onto `support`, [batch, n_atoms].

    `next_probs` [batch, n_atoms] holds the probabilities of the atoms `support` [n_atoms]
    (evenly spaced); `rewards` and `terminations` are [batch]. Each shifted atom is clamped to
    [v_min, v_max] and its mass split between the two nearest atoms in proportion to closeness.
    A terminated transition drops the bootstrap: all its mass lands around r. A truncated one
    keeps it: its next distribution is that of the true final observation.
    """
    n_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = rewards.unsqueeze(1) + gamma * (1.0 - terminations).unsqueeze(1) * support.unsqueeze(0)
    # Fractional atom index of every shifted atom, clamped so rounding cannot push it off the ends.
    b = ((tz.clamp(v_min, v_max) - v_min) / delta_z).clamp(0, n_atoms - 1)
    lower, upper = b.floor(), b.ceil()
    # Where b is an atom exactly, lower == upper and both weights below would be 0: give the
    # lower atom the whole mass instead.
    lower_weight = (upper - b) + (lower == upper).to(b.dtype)
    upper_weight = b - lower
    projected = torch.zeros_like(next_probs)
    projected.scatter_add_(1, lower.long(), next_probs * lower_weight)
    projected.scatter_add_(1, upper.long(), next_probs * upper_weight)
    return projected


def select_actions(q_network: QNetwork, obs: torch.Tensor, epsilon: float, n_actions: int) -> np.ndarray:
    """Epsilon-greedy actions for a batch of observations, drawn with torch's RNG on obs.device."""
    if obs.device.type != "cpu":
        # On a GPU everything stays on the device until the one copy of the actions: reading
        # the exploration draws first would stall it.
        explore = torch.rand(len(obs), device=obs.device) < epsilon
        random_actions = torch.randint(n_actions, (len(obs),), device=obs.device)
        with torch.no_grad():
            greedy_actions = q_network.q_values(obs).argmax(dim=1)
        return torch.where(explore, random_actions, greedy_actions).cpu().numpy()
    # On the CPU the draws are read for free: decide on the host, and skip the network when
    # every environment explores (most steps early in training).
    explore = torch.rand(len(obs)).numpy() < epsilon
    random_actions = torch.randint(n_actions, (len(obs),)).numpy()
    if explore.all():
        return random_actions
    with torch.no_grad():
        greedy_actions = q_network.q_values(obs).argmax(dim=1).numpy()
    return np.where(explore, random_actions, greedy_actions)


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
    model = load_model(model_path, "c51")
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    model_args = model["args"]
    q_network = QNetwork(
        model["obs_dim"], model["n_actions"], model_args["n_atoms"], model_args["v_min"], model_args["v_max"]
    ).to(device)
    q_network.load_state_dict(model["q_network"])
    obs, _ = envs.reset(seed=seed)
    episodic_returns = []
    while len(episodic_returns) < eval_episodes:
        actions = select_actions(
            q_network, torch.tensor(obs, dtype=torch.float32, device=device), epsilon, model["n_actions"]
        )
        obs, _, _, _, infos = envs.step(actions)
        if "episode" in infos:
            episodic_returns += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return episodic_returns[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    run = Run(
        args,
        run_dir=Path(args.resume).parent if checkpoint else None,
        purge_step=checkpoint["global_step"] + 1 if checkpoint else None,
        wandb_id=checkpoint["wandb_id"] if checkpoint else None,
    )
    writer = run.writer
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)

    q_network = QNetwork(obs_dim, n_actions, args.n_atoms, args.v_min, args.v_max).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=0.01 / args.batch_size, fused=True)
    target_network = QNetwork(obs_dim, n_actions, args.n_atoms, args.v_min, args.v_max).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, device)

    # `losses` holds the cross-entropy loss and the Q-values of the latest gradient step, read back only when logged.
    global_step, next_log, losses = 0, LOG_EVERY, None
    obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    if checkpoint:
        q_network.load_state_dict(checkpoint["q_network"])
        target_network.load_state_dict(checkpoint["target_network"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        rb.load_state_dict(checkpoint["replay_buffer"])
        envs = restore_envs(envs, checkpoint["envs"])
        if checkpoint["envs"] is None:
            print(
                "the environments could not be saved with the checkpoint (video recording?): resuming with fresh ones"
            )
        else:
            obs_np = checkpoint["next_obs"]
        restore_rng_state(checkpoint["rng"])
        global_step, next_log = checkpoint["global_step"], checkpoint["next_log"]
        losses = None if checkpoint["losses"] is None else tuple(t.to(device) for t in checkpoint["losses"])
    obs_np = obs_np.astype(np.float32)

    def write_checkpoint() -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            next_log=next_log,
            q_network=q_network.state_dict(),
            target_network=target_network.state_dict(),
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            envs=snapshot_envs(envs),
            next_obs=obs_np,
            losses=None if losses is None else tuple(t.detach().cpu() for t in losses),
            wandb_id=run.wandb_id,
        )
        return path

    stop = StopSignal()
    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    exploration_steps = args.exploration_fraction * args.total_timesteps
    start_time, start_step = time.time(), global_step

    while global_step < args.total_timesteps:
        # Act: one host-to-device copy of the observations, one device-to-host copy of the actions.
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        actions = select_actions(q_network, torch.from_numpy(obs_np).to(device), epsilon, n_actions)
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        if "episode" in infos:
            finished = infos["_episode"]
            for episodic_return, episodic_length in zip(
                infos["episode"]["r"][finished], infos["episode"]["l"][finished]
            ):
                writer.add_scalar("charts/episodic_return", episodic_return, global_step)
                writer.add_scalar("charts/episodic_length", episodic_length, global_step)
            progress.add_returns(infos["episode"]["r"][finished])

        # Learn: one gradient step every `train_frequency` environment steps (several per
        # vector step when num_envs > train_frequency), after `learning_starts` steps.
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                obs_b, next_obs_b, actions_b, rewards_b, terminations_b = rb.sample(args.batch_size)
                with torch.no_grad():
                    # The target network's distribution at its own greedy next action.
                    next_probs = torch.softmax(target_network(next_obs_b), dim=2)
                    next_actions = (next_probs * target_network.support).sum(dim=2).argmax(dim=1)
                    next_probs = next_probs[torch.arange(args.batch_size, device=device), next_actions]
                    target = project_distribution(
                        next_probs, rewards_b, terminations_b, target_network.support, args.gamma
                    )
                logits = q_network(obs_b)[torch.arange(args.batch_size, device=device), actions_b]
                log_probs = torch.log_softmax(logits, dim=1)
                loss = -(target * log_probs).sum(dim=1).mean()
                q_values = (log_probs.detach().exp() * q_network.support).sum(dim=1)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses = (loss, q_values)

            # Update the target network: a hard copy.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                target_network.load_state_dict(q_network.state_dict())

        # Logging: one device-to-host read every LOG_EVERY steps.
        if global_step >= next_log:
            next_log = (global_step // LOG_EVERY + 1) * LOG_EVERY
            if losses is not None:
                stats = torch.stack([losses[0].detach(), losses[1].detach().mean()]).tolist()
                for name, value in zip(["losses/loss", "losses/q_values"], stats):
                    writer.add_scalar(name, value, global_step)
                    if not np.isfinite(value):
                        path = write_checkpoint()
                        fail(f"{name} is {value} at step {global_step}; checkpoint written to {path}")
            writer.add_scalar("charts/epsilon", epsilon, global_step)
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
            progress.update(global_step)

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
        save_model(model_path, args, q_network=q_network.state_dict(), obs_dim=obs_dim, n_actions=n_actions)
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(
            model_path,
            args.eval_episodes,
            device,
            seed=args.seed + 1_000,
            capture_video=args.capture_video,
            video_dir=run.dir / "videos" / "eval",
        )
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"evaluation over {len(episodic_returns)} episodes: {np.mean(episodic_returns):.1f} +- {np.std(episodic_returns):.1f}"
        )

    run.close()
