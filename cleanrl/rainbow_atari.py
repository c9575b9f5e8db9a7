"""Rainbow from pixels: Atari and MinAtar.

Hessel et al. 2018, "Rainbow: Combining Improvements in Deep Reinforcement Learning" (https://arxiv.org/abs/1710.02298):
DQN with double Q-learning (the online network picks the next action, the target network values it), prioritized
replay (Schaul et al. 2016: a sum tree beside the replay's storage, alpha 0.5, beta 0.4 -> 1), dueling value/advantage
streams (Wang et al. 2016), 3-step returns, a distributional C51 head (Bellemare et al. 2017: 51 atoms on [-10, 10],
cross-entropy loss, priorities = that cross-entropy) and factorised Gaussian noisy layers (Fortunato et al. 2018)
that explore in place of epsilon-greedy. Learning sees rewards clipped to their sign and a lost life ending the
training episode; charts/episodic_return is the whole game's raw score. CleanRL's hyperparameters.

Action space: Discrete. Environments: Atari through ale-py's vector env (BreakoutNoFrameskip-v4, ALE/Breakout-v5 ...)
and MinAtar (MinAtar/Breakout-v1 ...), which gets the MinAtar paper's small network. Each frame is stored once, as
uint8. Checkpoints hold the replay buffer and its priorities; MinAtar games are saved with them, so a resumed run on
the CPU continues exactly; ALE's vector env cannot be saved, so a resumed Atari run starts fresh games.

    uv run --extra atari python cleanrl/rainbow_atari.py --env-id BreakoutNoFrameskip-v4
    uv run --extra atari python cleanrl/rainbow_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 1000000 \\
        --buffer-size 100000 --learning-starts 5000 --target-network-frequency 1000 --learning-rate 1e-4

MinAtar results (1M steps, 3 seeds) in benchmark/results/rainbow_atari.md.
"""

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
from cleanrl_utils.errors import available_memory, check_fits, check_positive, fail
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
    """CPU threads for torch"""
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
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 6.25e-5
    """the learning rate of the optimizer"""
    adam_eps: float = 1.5e-4
    """the epsilon of Adam"""
    num_envs: int = 1
    """the number of parallel game environments"""
    buffer_size: int = 1000000
    """the replay memory buffer size (transitions, over all environments)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy; below 1: Polyak averaging)"""
    target_network_frequency: int = 8000
    """the timesteps it takes to update the target network"""
    batch_size: int = 32
    """the batch size of sample from the replay memory"""
    learning_starts: int = 80000
    """timestep to start learning"""
    train_frequency: int = 4
    """the frequency of training (one gradient step every this many timesteps)"""
    n_step: int = 3
    """the number of steps of the multi-step return"""
    prioritized_replay_alpha: float = 0.5
    """the priority exponent alpha (0: uniform replay)"""
    prioritized_replay_beta: float = 0.4
    """the importance-sampling exponent beta at the start, annealed linearly to 1 over the run"""
    prioritized_replay_eps: float = 1e-6
    """added to every priority, so that no transition's chance of being replayed falls to 0"""
    n_atoms: int = 51
    """the number of atoms of the return distribution's support"""
    v_min: float = -10
    """the lowest return the support can represent"""
    v_max: float = 10
    """the highest return the support can represent"""
    noisy_sigma: float = 0.5
    """sigma0 of the noisy layers: their noise scales start at sigma0 / sqrt(inputs)"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""


# Losses, beta and SPS are read back from the device and logged every this many steps.
LOG_EVERY = 1000
# Stacked frames per observation: the Atari frames come in stacks of 4; a MinAtar grid is one frame.
ATARI_STACK = 4


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
        adam_eps=args.adam_eps,
        n_step=args.n_step,
        noisy_sigma=args.noisy_sigma,
        eval_episodes=args.eval_episodes,
        torch_threads=args.torch_threads,
    )
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} must be in [0, --total-timesteps {args.total_timesteps})")
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if args.n_atoms < 2:
        fail(f"--n-atoms must be at least 2 (the support needs two ends), got {args.n_atoms}")
    if not args.v_min < args.v_max:
        fail(f"--v-min must be below --v-max, got --v-min {args.v_min} --v-max {args.v_max}")
    if args.prioritized_replay_alpha < 0 or args.prioritized_replay_eps < 0:
        fail("--prioritized-replay-alpha and --prioritized-replay-eps must not be negative")
    if not 0 <= args.prioritized_replay_beta <= 1:
        fail(f"--prioritized-replay-beta must be in [0, 1], got {args.prioritized_replay_beta}")
    # A sampled row needs the frames of its stack behind it and its n-step window ahead of it in the buffer.
    rows = ATARI_STACK + args.n_step
    if args.buffer_size < args.num_envs * rows:
        fail(f"--buffer-size {args.buffer_size} must hold at least {rows} steps of --num-envs (stack + --n-step)")
    if args.learning_starts < args.num_envs * rows:
        fail(f"--learning-starts must be at least {args.num_envs * rows} ({rows} steps per env: stack + --n-step)")
    check_env_id(args.env_id, "cleanrl/c51.py")
    probe = make_envs(args.env_id, 1)
    obs_shape = probe.single_observation_space.shape
    probe.close()
    check_fits(replay_nbytes(args, obs_shape), "cpu", "replay buffer", "--buffer-size")


def replay_nbytes(args: Args, obs_shape: tuple) -> int:
    """Bytes of the replay buffer and its sum tree: on the "meta" device they have the shapes and dtypes, no memory."""
    meta = PrioritizedFrameReplay(
        args.buffer_size, args.num_envs, obs_shape, stack_of(obs_shape), args.n_step, args.gamma, 1.0, "meta"
    )
    tensors = list(vars(meta).values()) + list(vars(meta.tree).values())
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def stack_of(obs_shape: tuple) -> int:
    """Frames per observation: 84x84 Atari observations are stacks of 4 frames; a MinAtar grid is one."""
    return ATARI_STACK if obs_shape[-1] >= 84 else 1


def scaled_noise(size: int, device: torch.device) -> torch.Tensor:
    """f(x) = sign(x) sqrt(|x|) of `size` standard normal draws: the factors of factorised Gaussian noise."""
    x = torch.randn(size, device=device)
    return x.sign() * x.abs().sqrt()


class NoisyLinear(nn.Module):
    """y = (mu_w + sigma_w * eps_w) x + mu_b + sigma_b * eps_b with factorised Gaussian noise (Fortunato et al.
    2018): eps_w = f(eps_out) f(eps_in)^T and eps_b = f(eps_out), drawn afresh by reset_noise(). Initialised as the
    paper's factorised case: mu ~ U[-1/sqrt(p), 1/sqrt(p)] and sigma = sigma0 / sqrt(p), p the number of inputs."""

    def __init__(self, in_features: int, out_features: int, sigma0: float):
        super().__init__()
        bound = 1 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma0 * bound))
        # The noise is not part of the model: it is drawn before every use and never saved.
        self.register_buffer("eps_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("eps_out", torch.zeros(out_features), persistent=False)

    def reset_noise(self) -> None:
        self.eps_in = scaled_noise(len(self.eps_in), self.eps_in.device)
        self.eps_out = scaled_noise(len(self.eps_out), self.eps_out.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (sigma_w * eps_out eps_in^T) x = eps_out * (sigma_w (eps_in * x)): the noisy weight matrix is never built.
        # Acting on Atari 33 -> 2.7 ms per step on the CPU (measured side by side); a gradient step costs the same.
        noise = F.linear(x * self.eps_in, self.weight_sigma, self.bias_sigma) * self.eps_out
        return F.linear(x, self.weight_mu, self.bias_mu) + noise


def dueling(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Per-atom logits V + A - mean_a A (Wang et al. 2016): value [batch, 1, n_atoms], advantage [batch, n_actions,
    n_atoms]. Subtracting the mean makes V and A identifiable and keeps the advantages' scale in check."""
    return value + advantage - advantage.mean(dim=1, keepdim=True)


class RainbowNetwork(nn.Module):
    """The Nature CNN's convolutions on 84x84 frames (Mnih et al. 2015), or on MinAtar's 10x10 grids the MinAtar
    paper's (one 3x3 convolution of 16 channels), then noisy dueling streams (512 or 128 hidden units each) giving a
    categorical distribution over `support` for every action. Takes uint8 observations."""

    def __init__(
        self, obs_shape: tuple, n_actions: int, obs_high: float, n_atoms: int, v_min: float, v_max: float, sigma0: float
    ):
        super().__init__()
        channels, height, width = obs_shape
        self.scale = 1.0 / obs_high  # pixels 0..255 -> [0, 1]; MinAtar's cells are 0/1 already
        self.n_actions, self.n_atoms = n_actions, n_atoms
        self.register_buffer("support", torch.linspace(v_min, v_max, n_atoms))
        if height >= 84:
            self.torso = nn.Sequential(
                nn.Conv2d(channels, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            features, hidden = 3136, 512
        else:
            self.torso = nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
            features, hidden = 16 * (height - 2) * (width - 2), 128
        self.value = nn.Sequential(
            NoisyLinear(features, hidden, sigma0), nn.ReLU(), NoisyLinear(hidden, n_atoms, sigma0)
        )
        self.advantage = nn.Sequential(
            NoisyLinear(features, hidden, sigma0), nn.ReLU(), NoisyLinear(hidden, n_actions * n_atoms, sigma0)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the atoms, [batch, n_actions, n_atoms]."""
        h = self.torso(x.float() * self.scale)
        value = self.value(h).view(-1, 1, self.n_atoms)
        advantage = self.advantage(h).view(-1, self.n_actions, self.n_atoms)
        return F.log_softmax(dueling(value, advantage), dim=2)

    def q_values(self, x: torch.Tensor) -> torch.Tensor:
        """The means of the distributions, [batch, n_actions]."""
        return (self(x).exp() * self.support).sum(dim=2)

    def reset_noise(self) -> None:
        for module in self.modules():
            if isinstance(module, NoisyLinear):
                module.reset_noise()


class SumTree:
    """Priorities of `capacity` leaves and the sum of every subtree, in one float64 tensor on `device`: node 1 is the
    root, node i has the children 2i and 2i + 1, leaf j is node `leaves + j` (leaves padded to a power of two with
    zeros). Every parent is recomputed from its two children, so rounding never accumulates, and float64 keeps the root
    over 1M leaves within ~1e-15 of the exact sum, relatively."""

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


def importance_weights(probs: torch.Tensor, beta: float) -> torch.Tensor:
    """w_i = (N P(i))^-beta normalised by the largest in the batch (Schaul et al. 2016); N cancels in the ratio."""
    weights = probs**-beta
    return (weights / weights.max()).float()


class PrioritizedFrameReplay:
    """The last `buffer_size // num_envs` steps of each environment, every frame stored once as uint8, sampled in
    proportion to priority^alpha, with n-step returns.

    Row t of env e holds the newest frame of the observation acted on, the action, the clipped reward and whether the
    training episode terminated. The observation is rebuilt from the `stack` frames up to row t, with zeros before a
    game's first frame (as the env pads). Under NEXT_STEP autoreset the row after a game's end holds its true final
    observation; that row's own step reset the env, its action ignored: it is no transition (`valid` False).
    Leaf t * num_envs + e of the sum tree holds the priority of row t of env e. A row gets one when its n-step window
    is complete (row t + n written): the largest priority seen so far, or 0 for an autoreset row. A row being written
    and the stack - 1 rows after it (whose frame history it overwrites) get 0, so that they are never sampled."""

    def __init__(
        self,
        buffer_size: int,
        num_envs: int,
        obs_shape: tuple,
        stack: int,
        n_step: int,
        gamma: float,
        alpha: float,
        device: torch.device | str,
    ):
        channels, height, width = obs_shape
        self.steps, self.num_envs, self.stack = buffer_size // num_envs, num_envs, stack
        self.n_step, self.gamma, self.alpha = n_step, gamma, alpha
        rows = (self.steps, num_envs)
        self.frames = torch.zeros(rows + (channels // stack, height, width), dtype=torch.uint8, device=device)
        self.actions = torch.zeros(rows, dtype=torch.long, device=device)
        self.rewards = torch.zeros(rows, device=device)
        self.terminations = torch.zeros(rows, dtype=torch.bool, device=device)
        self.first = torch.zeros(rows, dtype=torch.bool, device=device)  # the row's observation starts a game
        self.valid = torch.zeros(rows, dtype=torch.bool, device=device)  # the row's step is a transition
        self.starts_game = torch.ones(num_envs, dtype=torch.bool, device=device)  # ... the next row added
        self.staging = torch.zeros((4, num_envs))  # actions, rewards, terminations, resets: one host-to-device copy
        self.tree = SumTree(self.steps * num_envs, device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=device)
        self.env_index = torch.arange(num_envs, device=device)
        # Rows whose priority a write sets, relative to it: itself, the stack - 1 after it, and the one n before it.
        self.priority_rows = torch.tensor([*range(stack), -n_step], device=device)
        self.window = torch.arange(n_step, device=device)
        self.pos, self.size = 0, 0

    def leaves(self, rows: torch.Tensor) -> torch.Tensor:
        """The sum tree's leaves of every env at `rows` [k]: [k, num_envs]."""
        return rows.unsqueeze(1) * self.num_envs + self.env_index

    def add(self, obs: torch.Tensor, actions, rewards, terminations, resets) -> None:
        """One step of every env: `obs` [num_envs, C, H, W] uint8 on the buffer's device, the rest numpy [num_envs];
        `resets` marks envs whose step was an autoreset (their previous step ended a game)."""
        for row, values in zip(self.staging.numpy(), (actions, rewards, terminations, resets)):
            row[:] = values
        actions, rewards, terminations, resets = self.staging.to(self.frames.device)
        resets = resets.bool()
        self.frames[self.pos] = obs[:, -self.frames.shape[2] :]
        self.actions[self.pos], self.rewards[self.pos], self.terminations[self.pos] = actions, rewards, terminations
        self.first[self.pos], self.valid[self.pos] = self.starts_game, ~resets
        self.starts_game = resets  # an autoreset step returns the first observation of the next game
        # Priority 0 for this row and the stack - 1 after it; the row n back, its window now complete, the largest
        # (validate() keeps the buffer longer than stack + n rows, so these rows are distinct).
        rows = (self.pos + self.priority_rows) % self.steps
        values = torch.zeros((self.stack + 1, self.num_envs), dtype=torch.float64, device=self.frames.device)
        complete = (self.pos - self.n_step) % self.steps
        values[-1] = self.valid[complete] * self.max_priority**self.alpha  # unwritten rows are not valid either
        self.tree.update(self.leaves(rows).flatten(), values.flatten())
        self.pos = (self.pos + 1) % self.steps
        self.size = min(self.size + 1, self.steps)

    def new_games(self) -> None:
        """The envs were reset outside the stream (a resume with fresh games): the last row has no next observation,
        so the n-step windows reaching it bootstrap there, and it is never sampled itself."""
        self.valid[(self.pos - 1) % self.steps] = False
        self.starts_game[:] = True

    def stacked(self, rows: torch.Tensor, envs: torch.Tensor) -> torch.Tensor:
        """Observations [n, C, H, W] at `rows` of `envs`: the newest frame and the `stack - 1` before it, zeros where
        those belong to an earlier game."""
        frames, same_game = [], torch.ones_like(rows, dtype=torch.bool)
        for back in range(self.stack):
            row = (rows - back) % self.steps
            frames.append(self.frames[row, envs] * same_game.view(-1, 1, 1, 1))
            same_game = same_game & ~self.first[row, envs]
        return torch.cat(frames[::-1], dim=1)

    def sample(self, batch_size: int, beta: float) -> tuple[torch.Tensor, ...]:
        """A prioritized minibatch (with replacement): the transitions of `transitions()`, the leaves drawn (to update
        their priorities) and their importance weights."""
        leaves, probs = self.tree.sample(batch_size)
        return *self.transitions(leaves), leaves, importance_weights(probs, beta)

    def transitions(self, leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The n-step transitions at `leaves`: obs, next_obs (the bootstrap observations), actions, returns and
        bootstrap discounts."""
        rows, envs = leaves // self.num_envs, leaves % self.num_envs
        window, window_envs = (rows.unsqueeze(1) + self.window) % self.steps, envs.unsqueeze(1)
        returns, offsets, discounts = n_step_returns(
            self.rewards[window, window_envs],
            self.terminations[window, window_envs],
            self.valid[window, window_envs],
            self.gamma,
        )
        obs, next_obs = self.stacked(rows, envs), self.stacked((rows + offsets) % self.steps, envs)
        return obs, next_obs, self.actions[rows, envs], returns, discounts

    def update_priorities(self, leaves: torch.Tensor, priorities: torch.Tensor) -> None:
        self.tree.update(leaves, priorities.double() ** self.alpha)
        self.max_priority = torch.maximum(self.max_priority, priorities.max().double())

    def state_dict(self) -> dict:
        fields = ("frames", "actions", "rewards", "terminations", "first", "valid")
        state = {name: getattr(self, name)[: self.size].cpu() for name in fields}
        return state | {
            "priorities": self.tree.nodes.cpu(),
            "max_priority": self.max_priority.cpu(),
            "starts_game": self.starts_game.cpu(),
            "pos": self.pos,
            "size": self.size,
        }

    def load_state_dict(self, state: dict) -> None:
        for name in ("frames", "actions", "rewards", "terminations", "first", "valid"):
            getattr(self, name)[: state["size"]] = state[name]
        self.tree.nodes[:] = state["priorities"]
        self.max_priority.copy_(state["max_priority"])
        self.starts_game[:] = state["starts_game"]
        self.pos, self.size = state["pos"], state["size"]


def n_step_returns(
    rewards: torch.Tensor, terminations: torch.Tensor, valid: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of windows [batch, n] of the rows t .. t+n-1 after a sampled row t: G = sum_i gamma^i r_{t+i},
    cut after a termination (no bootstrap); before adding a row t+i (i >= 1) that is no transition, stopped with the
    bootstrap from row t+i with gamma^i (it holds the true final observation of a game cut by truncation, or of the
    steps before a resume with fresh games); else bootstrapped from row t+n with gamma^n.

    Returns (G, k, discount): the bootstrap row is t + k, its value weighted by discount = gamma^k, 0 if terminated."""
    batch, n = rewards.shape
    returns = torch.zeros(batch, device=rewards.device)
    offsets = torch.full((batch,), n, device=rewards.device)
    walking = torch.ones(batch, dtype=torch.bool, device=rewards.device)
    terminated = torch.zeros_like(walking)
    for i in range(n):
        if i > 0:
            offsets = torch.where(walking & ~valid[:, i], i, offsets)
            walking = walking & valid[:, i]
        returns = returns + walking * gamma**i * rewards[:, i]
        terminated = terminated | (walking & terminations[:, i])
        walking = walking & ~terminations[:, i]
    discounts = torch.where(terminated, 0.0, gamma ** offsets.double()).float()
    return returns, offsets, discounts


def project_distribution(
    next_probs: torch.Tensor, returns: torch.Tensor, discounts: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """Project the distribution of G + discount * z onto `support`, [batch, n_atoms] (Bellemare et al. 2017).

    `next_probs` [batch, n_atoms] holds the probabilities of the atoms `support` [n_atoms] (evenly spaced) at the
    bootstrap observation; `returns` and `discounts` (gamma^k, 0 after a termination) are [batch]. Each shifted atom
    is clamped to [v_min, v_max] and its mass split between the two nearest atoms in proportion to closeness."""
    n_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = returns.unsqueeze(1) + discounts.unsqueeze(1) * support.unsqueeze(0)
    # Fractional atom index of every shifted atom, clamped so rounding cannot push it off the ends.
    b = ((tz.clamp(v_min, v_max) - v_min) / delta_z).clamp(0, n_atoms - 1)
    lower, upper = b.floor(), b.ceil()
    # Where b is an atom exactly, lower == upper and both weights below would be 0: the lower atom takes the mass.
    lower_weight = (upper - b) + (lower == upper).to(b.dtype)
    upper_weight = b - lower
    projected = torch.zeros_like(next_probs)
    projected.scatter_add_(1, lower.long(), next_probs * lower_weight)
    projected.scatter_add_(1, upper.long(), next_probs * upper_weight)
    return projected


def beta_schedule(beta0: float, total_timesteps: int, t: int) -> float:
    """The importance-sampling exponent at step t: from beta0 up to 1 at the end of the run."""
    return min(1.0, beta0 + (1.0 - beta0) * t / total_timesteps)


def select_actions(q_network: RainbowNetwork, obs: torch.Tensor) -> np.ndarray:
    """Greedy actions of the noisy network with its noise drawn afresh: the noise is the exploration."""
    q_network.reset_noise()
    with torch.no_grad():
        return q_network.q_values(obs).argmax(dim=1).cpu().numpy()


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the game scores of its policy, noise drawn at every step as in
    training (the noise-free network can stall Breakout after a lost life, never pressing FIRE)."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    q_network = RainbowNetwork(**model["network"]).to(device)
    q_network.load_state_dict(model["q_network"])
    obs, _ = envs.reset(seed=seed)
    game_scores = []
    while len(game_scores) < eval_episodes:
        obs, _, _, _, infos = envs.step(select_actions(q_network, torch.as_tensor(obs, device=device)))
        if "episode" in infos:
            game_scores += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return game_scores[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_shape = envs.single_observation_space.shape
    network = dict(
        obs_shape=obs_shape,
        n_actions=int(envs.single_action_space.n),
        obs_high=float(envs.single_observation_space.high.max()),
        n_atoms=args.n_atoms,
        v_min=args.v_min,
        v_max=args.v_max,
        sigma0=args.noisy_sigma,
    )

    q_network = RainbowNetwork(**network).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True)
    target_network = RainbowNetwork(**network).to(device)
    target_network.load_state_dict(q_network.state_dict())
    # On the training device when it fits there (checked with some room to spare), else in host memory.
    fits_on_device = available_memory(device) > 1.25 * replay_nbytes(args, obs_shape)
    storage = device if fits_on_device else torch.device("cpu")
    rb = PrioritizedFrameReplay(
        args.buffer_size,
        args.num_envs,
        obs_shape,
        stack_of(obs_shape),
        args.n_step,
        args.gamma,
        args.prioritized_replay_alpha,
        storage,
    )

    global_step = 0
    obs_np, _ = envs.reset(seed=args.seed)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        q_network.load_state_dict(run.checkpoint["q_network"])
        target_network.load_state_dict(run.checkpoint["target_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        rb.load_state_dict(run.checkpoint["replay_buffer"])
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        if run.checkpoint["envs"] is None:
            rb.new_games()
        else:
            resets = run.checkpoint["resets"]
        global_step = run.checkpoint["global_step"]
    obs = torch.from_numpy(obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            q_network=q_network.state_dict(),
            target_network=target_network.state_dict(),
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            envs=snapshot_envs(envs, obs_np),
            resets=resets,
            global_step=global_step,
        )

    run.begin(training_state)
    batch_index = torch.arange(args.batch_size, device=device)
    losses = {}  # of the latest gradient step, read back only when logged (none yet after a resume)
    while global_step < args.total_timesteps:
        # Act: the noisy network's greedy actions (no epsilon); one copy of the observations and of the actions.
        actions = select_actions(q_network, obs)
        obs_np, rewards, terminations, truncations, infos = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's choices).
        rb.add(obs.to(storage), actions, np.sign(rewards), terminations | infos["life_loss"], resets)
        resets = terminations | truncations  # NEXT_STEP autoreset: these envs' next step starts a new game
        obs = torch.from_numpy(obs_np).to(device)
        run.log_episodes(global_step, infos)

        # Learn: a gradient step every `train_frequency` env steps (several per step if num_envs is larger).
        beta = beta_schedule(args.prioritized_replay_beta, args.total_timesteps, global_step)
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                obs_b, next_obs_b, actions_b, returns_b, discounts_b, leaves, weights = rb.sample(args.batch_size, beta)
                obs_b, next_obs_b, actions_b, returns_b, discounts_b, weights = (
                    t.to(device) for t in (obs_b, next_obs_b, actions_b, returns_b, discounts_b, weights)
                )
                q_network.reset_noise()  # fresh noise for every update, the online pass and the target's
                target_network.reset_noise()
                with torch.no_grad():
                    # Double Q: the online network picks the bootstrap action, the target network its distribution.
                    next_actions = q_network.q_values(next_obs_b).argmax(dim=1)
                    next_probs = target_network(next_obs_b)[batch_index, next_actions].exp()
                    target = project_distribution(next_probs, returns_b, discounts_b, q_network.support)
                log_probs = q_network(obs_b)[batch_index, actions_b]
                cross_entropy = -(target * log_probs).sum(dim=1)
                loss = (weights * cross_entropy).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                rb.update_priorities(leaves, (cross_entropy.detach() + args.prioritized_replay_eps).to(storage))
                q_taken = (log_probs.detach().exp() * q_network.support).sum(dim=1)
                losses = {"losses/loss": loss.detach(), "losses/q_values": q_taken.mean()}

            # Update the target network: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.lerp_(param, args.tau)

        # Log (one device-to-host read every LOG_EVERY steps) and checkpoint when due.
        if global_step // LOG_EVERY > previous_step // LOG_EVERY:
            charts = {"charts/beta": beta, "charts/learning_rate": optimizer.param_groups[0]["lr"]}
            run.log(global_step, losses | charts)
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, q_network=q_network.state_dict(), network=network)
