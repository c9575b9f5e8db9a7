"""Deep Q-Network (DQN) for discrete actions.

Mnih et al. 2015, "Human-level control through deep reinforcement learning"
(https://www.nature.com/articles/nature14236): a Q-network trained on minibatches drawn from a replay buffer,
towards targets from a periodically updated target network, acting epsilon-greedily with a linearly decaying epsilon.

Action space: Discrete. Observations: a flat Box. Environments: vectorised gymnasium (classic control: CartPole-v1,
Acrobot-v1, MountainCar-v0 ...). The replay buffer stores the true final observation of an ended episode, so a
time-limit truncation is bootstrapped and only a termination cuts the target. Checkpoints hold the replay buffer and
the pickled simulators: a resumed run on the CPU continues exactly as the uninterrupted one would.

    uv run python cleanrl/dqn.py --env-id CartPole-v1

Expect CartPole-v1 to reach ~480 within 500k steps (482.85 +- 9.73 over 3 seeds, benchmark/results/dqn.md).
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
from cleanrl_utils.errors import check_env_id, check_fits, check_positive, fail
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
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy; below 1: Polyak averaging)"""
    target_network_frequency: int = 500
    """the timesteps it takes to update the target network"""
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
    compile: bool = False
    """if toggled, compile the acting step and the update with torch.compile (meant for GPUs; changes float rounding)"""
    cudagraphs: bool = False
    """if toggled, also replay them as CUDA graphs (torch.compile's mode "reduce-overhead"; implies --compile; CUDA)"""


# Losses are read back from the device, and they, epsilon and SPS logged, every this many steps.
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
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} must be in [0, --total-timesteps {args.total_timesteps})")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(f"epsilon must decay: need 0 <= --end-e <= --start-e <= 1, got {args.end_e} and {args.start_e}")
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; lower it")
    if args.num_envs > args.buffer_size:
        fail(f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}; lower it")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs a CUDA GPU and none is in use; drop it (--compile works on the CPU)")
    check_env_id(args.env_id)
    probe = gym.make(args.env_id)
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"dqn.py handles Discrete actions but {args.env_id} has {action_space}; "
            f"use cleanrl/ddpg_continuous_action.py or cleanrl/sac_continuous_action.py"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        fail(f"dqn.py needs Box observations but {args.env_id} has {observation_space}")
    # A buffer on the "meta" device has the shapes and dtypes of the real one, and no memory.
    meta = ReplayBuffer(args.buffer_size, args.num_envs, int(np.prod(observation_space.shape)), torch.device("meta"))
    nbytes = meta.data.nbytes
    check_fits(nbytes, "cuda" if args.cuda and torch.cuda.is_available() else "cpu", "replay buffer", "--buffer-size")


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
    # SAME_STEP: an env that ends an episode resets at once, its true final observation in infos["final_obs"].
    # copy=False skips a deepcopy: the next step overwrites the returned observations, so the loop copies them.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, n_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # nn.Sequential's maths called functionally: ~4% more SPS on CartPole, CPU (measured side by side).
        x = F.relu(F.linear(x, self.fc1.weight, self.fc1.bias))
        x = F.relu(F.linear(x, self.fc2.weight, self.fc2.bias))
        return F.linear(x, self.fc3.weight, self.fc3.bias)


class ReplayBuffer:
    """The last `buffer_size` transitions, circular: obs, next_obs, actions, rewards and terminations are named views
    of one float32 tensor on the training device, a row per transition, so that a step is one copy and a minibatch one
    gather (five separate tensors cost ~7% of the SPS on CartPole, CPU). Actions are exact below 2**24."""

    def __init__(self, buffer_size: int, num_envs: int, obs_dim: int, device: torch.device):
        self.widths = [obs_dim, obs_dim, 1, 1, 1]  # obs, next_obs, actions, rewards, terminations
        self.data = torch.zeros((buffer_size, sum(self.widths)), device=device)
        self.obs, self.next_obs, self.actions, self.rewards, self.terminations = self.fields(self.data)
        self.staging = torch.zeros((num_envs, sum(self.widths)))  # one step of every environment, on the host
        self.staged = [field.numpy() for field in self.fields(self.staging)]  # numpy writes: ~10x cheaper than torch's
        self.buffer_size, self.pos, self.size = buffer_size, 0, 0

    def fields(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views of `rows` per field: obs, next_obs [n, obs_dim]; actions, rewards, terminations [n]."""
        obs, next_obs, actions, rewards, terminations = rows.split(self.widths, dim=1)
        return obs, next_obs, actions[:, 0], rewards[:, 0], terminations[:, 0]

    def add(self, obs, next_obs, actions, rewards, terminations, infos: dict) -> None:
        """Store one step of every environment (numpy arrays, as a SAME_STEP vector env returns them)."""
        if "final_obs" in infos:
            # Where an episode ended, the transition leads to its true final observation, not the reset one.
            ended = infos["_final_obs"]
            next_obs = next_obs.copy()
            next_obs[ended] = np.stack(infos["final_obs"][ended])
        for staged, values in zip(self.staged, (obs, next_obs, actions, rewards, terminations)):
            staged[:] = values
        end = self.pos + len(obs)
        slots = slice(self.pos, end) if end <= self.buffer_size else torch.arange(self.pos, end) % self.buffer_size
        self.data[slots] = self.staging.to(self.data.device)
        self.pos = end % self.buffer_size
        self.size = min(self.size + len(obs), self.buffer_size)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """A uniform minibatch (with replacement): obs, next_obs, actions, rewards, terminations."""
        indices = torch.randint(self.size, (batch_size,), device=self.data.device)
        obs, next_obs, actions, rewards, terminations = self.fields(self.data[indices])
        return obs, next_obs, actions.long(), rewards, terminations

    def state_dict(self) -> dict:
        return {"data": self.data[: self.size].cpu(), "pos": self.pos, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        self.data[: self.size] = state["data"]


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


def td_target(rewards: torch.Tensor, next_max: torch.Tensor, terminations: torch.Tensor, gamma: float) -> torch.Tensor:
    """r + gamma * next_max, next_max = max_a' Q_target(s', a'); no bootstrap where the episode terminated."""
    return rewards + gamma * next_max * (1.0 - terminations)


def select_actions(q_network: QNetwork, obs: torch.Tensor, epsilon: float, n_actions: int) -> np.ndarray:
    """Epsilon-greedy actions for a batch of observations, drawn with torch's RNG on obs.device."""
    if obs.device.type != "cpu":
        # On a GPU all stays on the device until the one copy of the actions: reading the draws would stall it.
        explore = torch.rand(len(obs), device=obs.device) < epsilon
        random_actions = torch.randint(n_actions, (len(obs),), device=obs.device)
        with torch.no_grad():
            greedy_actions = q_network(obs).argmax(dim=1)
        return torch.where(explore, random_actions, greedy_actions).cpu().numpy()
    # On the CPU: decide in numpy, and skip the network when every env explores (~10 us a step faster than torch).
    explore = torch.rand(len(obs)).numpy() < epsilon
    random_actions = torch.randint(n_actions, (len(obs),)).numpy()
    if explore.all():
        return random_actions
    with torch.no_grad():
        greedy_actions = q_network(obs).argmax(dim=1).numpy()
    return np.where(explore, random_actions, greedy_actions)


def make_optimizer(params, lr: float, device: torch.device, compiled: bool) -> torch.optim.Adam:
    """Adam, fused on the default path. Compiled (fused Adam cannot be traced): the foreach form, whose step
    torch.compile turns into a few fused kernels; on CUDA with the learning rate as a device tensor and the step
    counts on the device (capturable), so that a compiled or CUDA-graphed step reads no host value."""
    if not compiled:
        return torch.optim.Adam(params, lr=lr, fused=True)
    if device.type == "cuda":
        return torch.optim.Adam(params, lr=torch.tensor(lr, device=device), foreach=True, capturable=True)
    return torch.optim.Adam(params, lr=lr, foreach=True)  # CPU: capturable and a tensor lr are CUDA-only


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
    while len(episodic_returns) < eval_episodes:
        actions = select_actions(q_network, torch.as_tensor(obs, device=device).float(), epsilon, model["n_actions"])
        obs, _, _, _, infos = envs.step(actions)
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
    compiled = args.compile or args.cudagraphs
    optimizer = make_optimizer(q_network.parameters(), args.learning_rate, device, compiled)
    target_network = QNetwork(obs_dim, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_dim, device)

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    if run.checkpoint:
        q_network.load_state_dict(run.checkpoint["q_network"])
        target_network.load_state_dict(run.checkpoint["target_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        rb.load_state_dict(run.checkpoint["replay_buffer"])
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        global_step = run.checkpoint["global_step"]
    obs_np = obs_np.astype(np.float32)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            q_network=q_network.state_dict(),
            target_network=target_network.state_dict(),
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            envs=snapshot_envs(envs, obs_np),
            global_step=global_step,
        )

    def update(obs, next_obs, actions, rewards, terminations) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step on a minibatch towards the target network's TD targets; the loss and the mean Q-value."""
        with torch.no_grad():
            target_max = target_network(next_obs).amax(dim=1)
            target = td_target(rewards, target_max, terminations, args.gamma)
        q_values = q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(q_values, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach(), q_values.detach().mean()

    acting_network = q_network
    if compiled:
        # The random draws (minibatch indices, epsilon-greedy) stay outside, so they are the default path's draws.
        mode = "reduce-overhead" if args.cudagraphs else None  # CUDA graphs through PyTorch's graph trees
        update, acting_network = torch.compile(update, mode=mode), torch.compile(q_network, mode=mode)

    run.begin(training_state)
    losses = {}  # of the latest gradient step, read back only when logged (none yet after a resume)
    while global_step < args.total_timesteps:
        # Act: one host-to-device copy of the observations, one device-to-host copy of the actions.
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        actions = select_actions(acting_network, torch.from_numpy(obs_np).to(device), epsilon, n_actions)
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # Learn: a gradient step every `train_frequency` env steps (several per step if num_envs is larger).
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                loss, q_mean = update(*rb.sample(args.batch_size))
                # Copies: a CUDA graph's outputs are overwritten by its next replay (two tiny copies otherwise).
                losses = {"losses/td_loss": loss.clone(), "losses/q_values": q_mean.clone()}

            # Update the target network: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.lerp_(param, args.tau)

        # Log (one device-to-host read every LOG_EVERY steps) and checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            charts = {"charts/epsilon": epsilon, "charts/learning_rate": optimizer.param_groups[0]["lr"]}
            run.log(global_step, losses | charts)
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, q_network=q_network.state_dict(), obs_dim=obs_dim, n_actions=n_actions)
