"""D3QN: dueling double DQN with prioritized replay and n-step returns, for discrete actions.

DQN (Mnih et al. 2015) with four changes, three of them flags: double Q-learning targets (van Hasselt et al. 2016,
https://arxiv.org/abs/1509.06461: the online network picks the bootstrap action, the target network values it), a
dueling head Q = V + A - mean_a A (Wang et al. 2016, https://arxiv.org/abs/1511.06581; `--no-dueling`), prioritized
replay (Schaul et al. 2016, https://arxiv.org/abs/1511.05952: proportional, a sum tree on the training device, alpha
0.6, beta 0.4 annealed to 1, new transitions at the largest priority so far; `--no-prioritized` replays uniformly) and
n-step returns (`--n-step 3`). `--no-dueling --no-prioritized --n-step 1` is plain Double DQN. Epsilon-greedy
exploration and every other setting as CleanRL's dqn.py.

Action space: Discrete. Observations: a flat Box. Environments: vectorised gymnasium (classic control: CartPole-v1,
Acrobot-v1 ...). The buffer stores the true final observation of an ended episode: an n-step window stops at an
episode's end, bootstrapping after a time-limit truncation, not after a termination. Checkpoints hold the buffer, its
priorities and the pickled simulators: a resumed run on the CPU continues exactly as the uninterrupted one would.

    uv run python cleanrl/d3qn.py --env-id CartPole-v1

Expect CartPole-v1 486.49 +- 6.06 and Acrobot-v1 -92.15 +- 1.94 after 500k steps (3 seeds; beside Double DQN and
dqn.py: benchmark/results/d3qn.md, made by benchmark/d3qn.sh).
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
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
    """the replay memory buffer size (transitions, over all environments)"""
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
    dueling: bool = True
    """if toggled, the Q-network has dueling value and advantage heads"""
    prioritized: bool = True
    """if toggled, replay in proportion to priority (|TD error| + eps)^alpha; else uniformly"""
    n_step: int = 3
    """the number of steps of the multi-step return (1: one-step targets)"""
    prioritized_replay_alpha: float = 0.6
    """the priority exponent alpha (0: uniform replay)"""
    prioritized_replay_beta: float = 0.4
    """the importance-sampling exponent beta at the start, annealed linearly to 1 over the run"""
    prioritized_replay_eps: float = 1e-6
    """added to every |TD error|, so that no transition's chance of being replayed falls to 0"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""


# Losses, epsilon, beta and SPS are read back from the device and logged every this many steps.
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
        n_step=args.n_step,
        prioritized_replay_eps=args.prioritized_replay_eps,
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
    if args.prioritized_replay_alpha < 0:
        fail(f"--prioritized-replay-alpha must not be negative, got {args.prioritized_replay_alpha}")
    if not 0 <= args.prioritized_replay_beta <= 1:
        fail(f"--prioritized-replay-beta must be in [0, 1], got {args.prioritized_replay_beta}")
    if args.batch_size > args.buffer_size:
        fail(f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; lower it")
    # A sampled row needs its n-step window ahead of it, in the buffer and written before learning starts.
    if args.buffer_size < args.num_envs * (args.n_step + 1):
        fail(
            f"--buffer-size {args.buffer_size} must hold at least {args.n_step + 1} steps of --num-envs (--n-step + 1)"
        )
    if args.learning_starts < args.num_envs * args.n_step:
        fail(f"--learning-starts must be at least {args.num_envs * args.n_step} (--n-step steps of every env)")
    check_env_id(args.env_id)
    probe = gym.make(args.env_id)
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"d3qn.py handles Discrete actions but {args.env_id} has {action_space}; "
            f"use cleanrl/ddpg_continuous_action.py or cleanrl/sac_continuous_action.py"
        )
    if not isinstance(observation_space, gym.spaces.Box):
        fail(f"d3qn.py needs Box observations but {args.env_id} has {observation_space}")
    # A buffer on the "meta" device has the shapes and dtypes of the real one, and no memory.
    obs_dim = int(np.prod(observation_space.shape))
    meta = ReplayBuffer(
        args.buffer_size, args.num_envs, obs_dim, args.n_step, args.gamma, 1.0, args.prioritized, "meta"
    )
    nbytes = meta.data.nbytes + (meta.tree.nodes.nbytes if meta.tree is not None else 0)
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


def dueling(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Q = V + A - mean_a A (Wang et al. 2016): value [batch, 1], advantage [batch, n_actions]. Subtracting the mean
    makes V and A identifiable (V is the mean of Q over the actions) and keeps the advantages' scale in check."""
    return value + advantage - advantage.mean(dim=1, keepdim=True)


class QNetwork(nn.Module):
    """dqn.py's MLP (120 and 84 hidden units); its last layer is a value head and an advantage head when dueling."""

    def __init__(self, obs_dim: int, n_actions: int, dueling: bool):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU())
        self.advantage = nn.Linear(84, n_actions)  # without the dueling head: the Q-values themselves
        self.value = nn.Linear(84, 1) if dueling else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.torso(x)
        if self.value is None:
            return self.advantage(h)
        return dueling(self.value(h), self.advantage(h))


class SumTree:
    """Priorities of `capacity` leaves and the sum of every subtree, in one float64 tensor on `device`: node 1 is the
    root, node i has the children 2i and 2i + 1, leaf j is node `leaves + j` (leaves padded to a power of two with
    zeros). Every parent is recomputed from its two children, so rounding never accumulates."""

    def __init__(self, capacity: int, device: torch.device | str):
        self.depth = max(1, math.ceil(math.log2(capacity)))
        self.leaves = 2**self.depth
        self.nodes = torch.zeros(2 * self.leaves, dtype=torch.float64, device=device)

    def total(self) -> torch.Tensor:
        return self.nodes[1]

    def update(self, leaves: torch.Tensor, values: torch.Tensor) -> None:
        """Set the priorities of `leaves` (distinct, or repeated with equal values), then their ancestors, one level
        of the tree at a time for all of them at once."""
        nodes = leaves + self.leaves
        self.nodes[nodes] = values.to(torch.float64)
        children = self.nodes.view(-1, 2)  # row i: the children 2i and 2i + 1 of node i
        for _ in range(self.depth):
            nodes = nodes // 2
            self.nodes[nodes] = children[nodes].sum(dim=1)

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """The leaves where the running sum of the priorities passes `mass` [n] (float64, in [0, total)): one
        descent from the root for all of them at once."""
        nodes = torch.ones_like(mass, dtype=torch.long)
        children = self.nodes.view(-1, 2)
        for _ in range(self.depth):
            left, right = children[nodes].unbind(dim=1)
            # Right when the mass lies past the left subtree, never into a subtree of mass 0 (rounding could ask it).
            go_right = (mass >= left) & (right > 0)
            mass = torch.where(go_right, mass - left, mass)
            nodes = 2 * nodes + go_right
        return nodes - self.leaves

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`batch_size` leaves drawn in proportion to their priorities, stratified (one draw uniform in each of
        `batch_size` equal slices of the total, as Schaul et al. do), with their probabilities."""
        device = self.nodes.device
        strata = torch.arange(batch_size, device=device) + torch.rand(batch_size, dtype=torch.float64, device=device)
        leaves = self.find(strata * (self.total() / batch_size))
        return leaves, self.nodes[leaves + self.leaves] / self.total()


def importance_weights(probs: torch.Tensor, n: int, beta: float) -> torch.Tensor:
    """w_i = (N P(i))^-beta over the largest w in the batch (Schaul et al. 2016), N the transitions to draw from."""
    weights = (n * probs) ** -beta
    return (weights / weights.max()).float()


def n_step_returns(
    rewards: torch.Tensor, terminations: torch.Tensor, truncations: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of windows [batch, n] of the rows t .. t+n-1 of one env (bool terminations and truncations).

    The window ends early at the first row that ends its episode, so it never crosses into the next one: k rows,
    G = sum_{i<k} gamma^i r_{t+i}, then the bootstrap from the next observation of row t+k-1 (the true final one, where
    the episode ended) weighted by gamma^k, or by 0 if that row terminated. Returns (G, k, discount)."""
    n = rewards.shape[1]
    ended = terminations | truncations
    # Row i is in the window when none of the rows before it ended the episode.
    inside = torch.cat([torch.ones_like(ended[:, :1]), ~ended[:, :-1]], dim=1).float().cumprod(dim=1)
    powers = gamma ** torch.arange(n, device=rewards.device)
    returns = (inside * powers * rewards).sum(dim=1)
    lengths = inside.sum(dim=1).long()
    terminated = terminations.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
    discounts = torch.where(terminated, 0.0, gamma**lengths)
    return returns, lengths, discounts


class ReplayBuffer:
    """The last `buffer_size // num_envs` steps of each env, a row per step: obs, next_obs (the true final observation
    where the episode ended), action, reward, termination and truncation, as named views of one float32 tensor on the
    training device (a step is one copy). A row is sampled with its n-step window, the rows after it of the same env.

    Prioritized: leaf t * num_envs + e of the sum tree holds priority^alpha of row t of env e. A row gets the largest
    priority seen so far once its window is complete (row t + n - 1 written; set before the next draw); until then, as
    while being written, 0. Uniform: every row whose window is complete is equally likely.
    Actions are exact below 2**24."""

    def __init__(
        self,
        buffer_size: int,
        num_envs: int,
        obs_dim: int,
        n_step: int,
        gamma: float,
        alpha: float,
        prioritized: bool,
        device: torch.device | str,
    ):
        self.steps, self.num_envs = buffer_size // num_envs, num_envs
        self.n_step, self.gamma, self.alpha = n_step, gamma, alpha
        self.widths = [obs_dim, obs_dim, 1, 1, 1, 1]  # obs, next_obs, actions, rewards, terminations, truncations
        self.data = torch.zeros((self.steps, num_envs, sum(self.widths)), device=device)
        self.obs, self.next_obs, self.actions, self.rewards, *ends = self.fields(self.data)
        self.terminations, self.truncations = ends
        self.staging = torch.zeros((num_envs, sum(self.widths)))  # one step of every environment, on the host
        self.staged = [field.numpy() for field in self.fields(self.staging)]  # numpy writes: ~10x cheaper than torch's
        self.tree = SumTree(self.steps * num_envs, device) if prioritized else None
        self.max_priority = torch.ones((), dtype=torch.float64, device=device)
        self.env_index = torch.arange(num_envs, device=device)
        self.window = torch.arange(n_step, device=device)
        self.pos, self.size = 0, 0
        self.new_rows = 0  # rows written since the tree last gave new rows their priorities

    def fields(self, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Views of `rows` per field: obs, next_obs [..., obs_dim]; actions, rewards, terminations, truncations."""
        obs, next_obs, *scalars = rows.split(self.widths, dim=-1)
        return obs, next_obs, *(field[..., 0] for field in scalars)

    def add(self, obs, next_obs, actions, rewards, terminations, truncations, infos: dict) -> None:
        """Store one step of every environment (numpy arrays, as a SAME_STEP vector env returns them)."""
        if "final_obs" in infos:
            # Where an episode ended, the transition leads to its true final observation, not the reset one.
            ended = infos["_final_obs"]
            next_obs = next_obs.copy()
            next_obs[ended] = np.stack(infos["final_obs"][ended])
        for staged, values in zip(self.staged, (obs, next_obs, actions, rewards, terminations, truncations)):
            staged[:] = values
        self.data[self.pos] = self.staging.to(self.data.device)
        self.pos = (self.pos + 1) % self.steps
        self.size = min(self.size + 1, self.steps)
        self.new_rows += 1

    def prioritize_new_rows(self) -> None:
        """Priorities for the rows written since the last call and the n - 1 before them, in one tree update: the
        largest so far where the window is complete, 0 for the newest n - 1 rows. Called before the tree is read, not
        at every add: ~8x less time per env step with the default 10000 rows (CPU, measured side by side), and the
        same result, as the largest priority only changes in a gradient step."""
        if self.tree is None or self.new_rows == 0:
            return
        ages = torch.arange(min(self.new_rows + self.n_step - 1, self.size), device=self.data.device)  # 0: newest
        rows = (self.pos - 1 - ages) % self.steps
        values = torch.where(ages >= self.n_step - 1, self.max_priority**self.alpha, 0.0)
        self.tree.update(self.leaves(rows).flatten(), values.repeat_interleave(self.num_envs))
        self.new_rows = 0

    def leaves(self, rows: torch.Tensor) -> torch.Tensor:
        """The sum tree's leaves of every env at `rows` [k]: [k, num_envs]."""
        return rows.unsqueeze(1) * self.num_envs + self.env_index

    def sample(self, batch_size: int, beta: float) -> tuple[torch.Tensor, ...]:
        """A minibatch (with replacement): the transitions of `transitions()`, the leaves drawn (to update their
        priorities) and their importance weights (all 1 when uniform)."""
        complete = (self.size - self.n_step + 1) * self.num_envs  # leaves whose window is complete
        if self.tree is None:
            # Uniform over the complete rows: counted from the oldest, all but the newest n - 1 of each env.
            oldest = (self.pos - self.size) % self.steps
            drawn = torch.randint(complete, (batch_size,), device=self.data.device)
            leaves = (oldest * self.num_envs + drawn) % (self.steps * self.num_envs)
            weights = torch.ones(batch_size, device=self.data.device)
        else:
            self.prioritize_new_rows()
            leaves, probs = self.tree.sample(batch_size)
            weights = importance_weights(probs, complete, beta)
        return *self.transitions(leaves), leaves, weights

    def transitions(self, leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The n-step transitions at `leaves`: obs, the bootstrap observations, actions, returns and discounts."""
        rows, envs = leaves // self.num_envs, leaves % self.num_envs
        window, window_envs = (rows.unsqueeze(1) + self.window) % self.steps, envs.unsqueeze(1)
        returns, lengths, discounts = n_step_returns(
            self.rewards[window, window_envs],
            self.terminations[window, window_envs].bool(),
            self.truncations[window, window_envs].bool(),
            self.gamma,
        )
        last = (rows + lengths - 1) % self.steps  # the window's last row: its next_obs is the bootstrap observation
        return self.obs[rows, envs], self.next_obs[last, envs], self.actions[rows, envs].long(), returns, discounts

    def update_priorities(self, leaves: torch.Tensor, priorities: torch.Tensor) -> None:
        """Priorities (|TD error| + eps) of the leaves just learned from; nothing to do when uniform."""
        if self.tree is None:
            return
        self.tree.update(leaves, priorities.double() ** self.alpha)
        self.max_priority = torch.maximum(self.max_priority, priorities.max().double())

    def state_dict(self) -> dict:
        return {
            "data": self.data[: self.size].cpu(),
            "priorities": self.tree.nodes.cpu() if self.tree is not None else None,
            "max_priority": self.max_priority.cpu(),
            "pos": self.pos,
            "size": self.size,
            "new_rows": self.new_rows,
        }

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size, self.new_rows = state["pos"], state["size"], state["new_rows"]
        self.data[: self.size] = state["data"]
        if self.tree is not None:
            self.tree.nodes[:] = state["priorities"]
        self.max_priority.copy_(state["max_priority"])


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


def beta_schedule(beta0: float, total_timesteps: int, t: int) -> float:
    """The importance-sampling exponent at step t: from beta0 up to 1 at the end of the run."""
    return min(1.0, beta0 + (1.0 - beta0) * t / total_timesteps)


def double_q_target(
    returns: torch.Tensor, discounts: torch.Tensor, online_next_q: torch.Tensor, target_next_q: torch.Tensor
) -> torch.Tensor:
    """G + discount * Q_target(s', argmax_a Q_online(s', a)): the online network picks the bootstrap action, the target
    network values it (van Hasselt et al. 2016). Q-values [batch, n_actions]; discount = gamma^k, 0 if terminated."""
    next_actions = online_next_q.argmax(dim=1, keepdim=True)
    return returns + discounts * target_next_q.gather(1, next_actions).squeeze(1)


def select_actions(q_network: QNetwork, obs: torch.Tensor, epsilon: float, n_actions: int) -> np.ndarray:
    """Epsilon-greedy actions for a batch of observations, drawn with torch's RNG on obs.device."""
    if obs.device.type != "cpu":
        # On a GPU all stays on the device until the one copy of the actions: reading the draws would stall it.
        explore = torch.rand(len(obs), device=obs.device) < epsilon
        random_actions = torch.randint(n_actions, (len(obs),), device=obs.device)
        with torch.no_grad():
            greedy_actions = q_network(obs).argmax(dim=1)
        return torch.where(explore, random_actions, greedy_actions).cpu().numpy()
    # On the CPU: decide in numpy, and skip the network when every env explores.
    explore = torch.rand(len(obs)).numpy() < epsilon
    random_actions = torch.randint(n_actions, (len(obs),)).numpy()
    if explore.all():
        return random_actions
    with torch.no_grad():
        greedy_actions = q_network(obs).argmax(dim=1).numpy()
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
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    q_network = QNetwork(model["obs_dim"], model["n_actions"], model["dueling"]).to(device)
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

    q_network = QNetwork(obs_dim, n_actions, args.dueling).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    target_network = QNetwork(obs_dim, n_actions, args.dueling).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(
        args.buffer_size,
        args.num_envs,
        obs_dim,
        args.n_step,
        args.gamma,
        args.prioritized_replay_alpha,
        args.prioritized,
        device,
    )

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

    run.begin(training_state)
    losses = {}  # of the latest gradient step, read back only when logged (none yet after a resume)
    while global_step < args.total_timesteps:
        # Act: one host-to-device copy of the observations, one device-to-host copy of the actions.
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        actions = select_actions(q_network, torch.from_numpy(obs_np).to(device), epsilon, n_actions)
        next_obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs_np, next_obs_np, actions, rewards, terminations, truncations, infos)
        obs_np = next_obs_np.astype(np.float32)  # a copy: the env overwrites next_obs_np in place
        run.log_episodes(global_step, infos)

        # Learn: a gradient step every `train_frequency` env steps (several per step if num_envs is larger).
        beta = beta_schedule(args.prioritized_replay_beta, args.total_timesteps, global_step)
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                obs_b, next_obs_b, actions_b, returns_b, discounts_b, leaves, weights = rb.sample(args.batch_size, beta)
                with torch.no_grad():
                    target = double_q_target(returns_b, discounts_b, q_network(next_obs_b), target_network(next_obs_b))
                q_values = q_network(obs_b).gather(1, actions_b.unsqueeze(1)).squeeze(1)
                td_errors = q_values - target
                # Importance weights undo the bias of prioritized sampling (all 1 when uniform: plain MSE).
                loss = (weights * td_errors**2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                rb.update_priorities(leaves, td_errors.detach().abs() + args.prioritized_replay_eps)
                losses = {"losses/td_loss": loss.detach(), "losses/q_values": q_values.detach().mean()}

            # Update the target network: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.lerp_(param, args.tau)

        # Log (one device-to-host read every LOG_EVERY steps) and checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            charts = {
                "charts/epsilon": epsilon,
                "charts/beta": beta,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            }
            run.log(global_step, losses | charts)
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        q_network=q_network.state_dict(),
        obs_dim=obs_dim,
        n_actions=n_actions,
        dueling=args.dueling,
    )
