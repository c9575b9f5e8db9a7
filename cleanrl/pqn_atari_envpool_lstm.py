"""Parallelised Q-Network (PQN) with an LSTM, from single frames: envpool's Atari and MinAtar.

Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (https://arxiv.org/abs/2407.04811), recurrent as
CleanRL's pqn_atari_envpool_lstm.py: Q-learning with no replay buffer and no target network, a LayerNorm torso per frame
(ONE frame, not a stack), an LSTM (-> 128; Hochreiter & Schmidhuber 1997) carrying the memory, then the Q head. The
targets are Q(lambda) returns over the rollout from max Q computed while acting; the update replays whole environment
sequences from the rollout's first LSTM state (a minibatch is a set of envs). CleanRL's defaults: 8 envs x 128 steps,
4 minibatches x 4 epochs, RAdam lr 2.5e-4 annealed, gradient norm 0.5, epsilon 1 -> 0.01 over 10% of the steps.

Action space: Discrete. Environments: Atari through envpool (Breakout-v5 ...: the Nature CNN, 512 -> LSTM; see
cleanrl_utils/envs/envpool_atari.py) and MinAtar (MinAtar/Breakout-v1 ...: the MinAtar paper's small network, 128 ->
LSTM). Learning sees sign-clipped rewards and a lost life ends its episode; charts/episodic_return is the whole game's
score. Where ours differs from CleanRL's, and why: the LSTM state is zeroed where a training episode starts (after a
lost life, and at a new game's first observation) and the autoreset step after a game's end acts on the old game's
final observation in the old game's memory, so its max Q bootstraps a time-limit cut while the step itself, no
transition, is masked out of the loss (CleanRL's treats every done alike and fits the reset step); a truncation
bootstraps and a termination does not (CleanRL's cuts both). MinAtar games are saved with checkpoints (exact resume on
the CPU); envpool's cannot be, so a resumed Atari run starts fresh games with a zero state.

    uv run python cleanrl/pqn_atari_envpool_lstm.py --env-id Breakout-v5 --total-timesteps 10000000

Expect MinAtar Breakout ~14.9 and SpaceInvaders ~65 after 1M steps (pqn_atari: ~10.4 and ~76.9; 3 seeds each):
benchmark/results/pqn_atari_envpool_lstm.md.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs import atari, envpool_atari
from cleanrl_utils.errors import check_fits, check_positive, fail
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
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari id, or a MinAtar one)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per rollout (the length of a replayed sequence)"""
    anneal_lr: bool = True
    """toggle learning rate annealing (linearly to 0 over the run)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) returns (0: one-step targets; 1: Monte-Carlo returns)"""
    num_minibatches: int = 4
    """the number of mini-batches (each holds num_envs / num_minibatches whole environment sequences)"""
    update_epochs: int = 4
    """the K epochs to update the Q-network"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    """One frame per observation (the LSTM is the agent's memory): MinAtar ids through cleanrl_utils/envs/atari.py,
    every other id through envpool. Both give uint8 [num_envs, C, H, W], NEXT_STEP autoreset and `life_loss`."""
    if atari.is_minatar(env_id):
        return atari.make_envs(env_id, num_envs, capture_video, video_dir, stack_num=1)
    return envpool_atari.make_envs(env_id, num_envs, capture_video, video_dir, stack_num=1)


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
    if atari.is_minatar(args.env_id):
        atari.check_env_id(args.env_id, "cleanrl/pqn.py")
        obs_shape = (10, 10, 10)  # at most 10 channels of 10 x 10: a bound is enough for the size check
    else:
        envpool_atari.check_env_id(args.env_id, "this script runs envpool ids and MinAtar/... ones", "cleanrl/pqn.py")
        obs_shape = (1, 84, 84)
    device = "cuda" if args.cuda and torch.cuda.is_available() else "cpu"
    check_fits(RolloutStorage.nbytes(args.num_steps, args.num_envs, obs_shape), device, "rollout", "--num-steps")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights and constant biases, as CleanRL initialises every layer."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """A LayerNorm torso per frame, an LSTM over time, then the Q head. The torso is the Nature CNN on 84x84 frames
    (Mnih et al. 2015, 512 units); on MinAtar's 10x10 grids the MinAtar paper's network (Young & Tian 2019): one 3x3
    convolution of 16 channels, then 128 units. LayerNorm after every hidden layer of the torso (CleanRL's; the LSTM
    output is not normalised) is what lets PQN bootstrap without a target network. Takes uint8 observations laid out
    [time, env, C, H, W]."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float, lstm_size: int = 128):
        super().__init__()
        channels, height, width = obs_shape
        self.scale = 1.0 / obs_high  # pixels 0..255 -> [0, 1]; MinAtar's cells are 0/1 already
        if height >= 84:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
                nn.LayerNorm([32, 20, 20]),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.LayerNorm([64, 9, 9]),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.LayerNorm([64, 7, 7]),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(3136, 512)),
                nn.LayerNorm(512),
                nn.ReLU(),
            )
            hidden = 512
        else:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 16, 3, stride=1)),
                nn.LayerNorm([16, height - 2, width - 2]),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(16 * (height - 2) * (width - 2), 128)),
                nn.LayerNorm(128),
                nn.ReLU(),
            )
            hidden = 128
        self.lstm = nn.LSTM(hidden, lstm_size)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.q_func = layer_init(nn.Linear(lstm_size, n_actions))

    def initial_state(self, num_envs: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM's (hidden, cell) state before any observation: zeros, [1, num_envs, lstm_size] each."""
        zeros = torch.zeros((1, num_envs, self.lstm.hidden_size), device=device)
        return zeros, zeros.clone()

    def recur(self, features: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Step the LSTM over features [T, B, F] from `state`, zeroing an env's state before each step whose
        observation starts a training episode (starts [T, B], bool). Returns the outputs [T, B, H] and the state
        after the last step."""
        # One LSTM call per run of steps with no episode start after its first step (ppo_atari_lstm.py measured it
        # 4.4x faster than one call per step on MinAtar), the state of the envs that start zeroed before it.
        cuts = (torch.nonzero(starts[1:].any(dim=1)).flatten() + 1).tolist()  # steps where some env starts
        outputs = []
        for begin, end in zip([0] + cuts, cuts + [len(features)]):
            keep = (~starts[begin]).float().view(1, -1, 1)
            output, state = self.lstm(features[begin:end], (state[0] * keep, state[1] * keep))
            outputs.append(output)
        return torch.cat(outputs), state

    def forward(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Q-values [T, B, n_actions] of observation sequences [T, B, C, H, W], and the state after them."""
        num_steps, num_envs = starts.shape
        features = self.network(obs.flatten(0, 1).float() * self.scale).reshape(num_steps, num_envs, -1)
        hidden, state = self.recur(features, state, starts)
        return self.q_func(hidden), state

    def step(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """One step of every env (obs [B, C, H, W], starts [B]): Q-values [B, n_actions] and the next state."""
        q_values, state = self(obs.unsqueeze(0), state, starts.unsqueeze(0))
        return q_values[0], state


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps. On the device: uint8 observations, the episode starts that zero
    the LSTM state, actions, max_a Q(obs) as computed while acting, and the LSTM state the rollout began with;
    rewards, episode ends and autoreset flags are staged on the host and moved once per rollout.

    Under NEXT_STEP autoreset the step after a game's end (`resets`) ignores its action and returns the next game's
    first observation; the observation it acted on is the ended game's true final observation."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, *obs_shape), dtype=torch.uint8, device=device)
        self.starts = torch.zeros((num_steps, num_envs), dtype=torch.bool, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.max_q = torch.zeros((num_steps, num_envs), device=device)  # max_a Q(obs[t]) in the rollout's memory
        self.initial_state: tuple[torch.Tensor, torch.Tensor] | None = None
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)  # clipped to their sign
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)  # game over or a life lost
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)  # the game hit its time limit
        self.resets = np.zeros((num_steps, num_envs), dtype=np.float32)  # an autoreset step: not a transition
        self.device = device

    @staticmethod
    def nbytes(num_steps: int, num_envs: int, obs_shape: tuple) -> int:
        """Bytes on the device: uint8 observations, a start flag, int64 actions and float32 max Q per step."""
        return num_steps * num_envs * (int(np.prod(obs_shape)) + 1 + 8 + 4)

    def flags(self) -> tuple[torch.Tensor, ...]:
        """rewards, terminations, truncations and resets on the device."""
        staged = (self.rewards, self.terminations, self.truncations, self.resets)
        return tuple(torch.as_tensor(a, device=self.device) for a in staged)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    return max(start_e + (end_e - start_e) * t / duration, end_e)


def epsilon_greedy(q_values: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Per row, a uniform action with probability epsilon, else the greedy one; torch's RNG on q_values.device."""
    explore = torch.rand(len(q_values), device=q_values.device) < epsilon
    random_actions = torch.randint(q_values.shape[1], (len(q_values),), device=q_values.device)
    return torch.where(explore, random_actions, q_values.argmax(dim=1))


def q_lambda_returns(rewards, next_max_q, terminations, truncations, resets, gamma, q_lambda) -> torch.Tensor:
    """Q(lambda) returns for a [num_steps, num_envs] rollout under NEXT_STEP autoreset, computed backwards:

        G_t = r_t + gamma * (1 - terminated_t) * [(1 - lambda) * next_max_q[t] + lambda * G_{t+1}]

    next_max_q[t] is max_a Q of the observation that followed step t, in the memory the rollout had there: where a
    game ended at t, the game's true final observation. A termination (game over or a lost life) zeroes the
    bootstrap; a truncation keeps it. Either one stops the recursion, and so does the end of the rollout: there G_t
    bootstraps from next_max_q[t] alone. A reset step (resets[t]) ignored its action: it is no transition, its return
    is 0 and the loss masks it.
    """
    bootstrap = 1.0 - terminations
    episode_continues = 1.0 - torch.maximum(terminations, truncations)
    returns = torch.zeros_like(rewards)
    next_return = next_max_q[-1]
    for t in reversed(range(rewards.shape[0])):
        mixed = next_max_q[t] + q_lambda * episode_continues[t] * (next_return - next_max_q[t])
        next_return = (rewards[t] + gamma * bootstrap[t] * mixed) * (1.0 - resets[t])
        returns[t] = next_return
    return returns


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of `values` where `mask` is 1 (0 when there are none): reset steps are no transitions."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
    epsilon: float = 0.05,
) -> list[float]:
    """Reload a model saved by this script and return the game scores of its epsilon-greedy policy."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    q_network = QNetwork(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    q_network.load_state_dict(model["q_network"])
    obs, _ = envs.reset(seed=seed)
    state, starts, resets = q_network.initial_state(1, device), np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
    game_scores = []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            obs_t, starts_t = torch.as_tensor(obs, device=device), torch.as_tensor(starts, device=device)
            q_values, state = q_network.step(obs_t, state, starts_t)
            obs, _, terminated, truncated, infos = envs.step(epsilon_greedy(q_values, epsilon).cpu().numpy())
            starts, resets = resets, terminated | truncated  # a new episode starts after its autoreset step
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
    obs_high = float(envs.single_observation_space.high.max())
    n_actions = int(envs.single_action_space.n)

    q_network = QNetwork(obs_shape, n_actions, obs_high).to(device)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=args.learning_rate)  # the paper's and CleanRL's
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    obs_np, _ = envs.reset(seed=args.seed)
    lstm_state = q_network.initial_state(args.num_envs, device)  # carried from one rollout into the next
    starts = np.ones(args.num_envs, dtype=bool)  # the next observation starts a training episode: zero the state
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        q_network.load_state_dict(run.checkpoint["q_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        if run.checkpoint["envs"] is not None:  # the same games go on, with the same memory of them
            resets, starts = run.checkpoint["resets"], run.checkpoint["starts"]
            lstm_state = tuple(s.to(device) for s in run.checkpoint["lstm_state"])
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    obs = torch.from_numpy(obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds (written between rollouts, so lstm_state is the next rollout's first state);
        resuming reads back each of these."""
        return dict(
            q_network=q_network.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, obs_np),
            resets=resets,
            starts=starts,
            lstm_state=lstm_state,
            global_step=global_step,
        )

    run.begin(training_state)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout epsilon-greedily: one host-to-device copy of the observations (and of the episode-start
        # flags, a byte per env, which the LSTM needs at once) and one device-to-host copy of the actions per step.
        with torch.no_grad():
            storage.initial_state = lstm_state  # the update replays every sequence from here
            next_starts = torch.from_numpy(starts).to(device)
            for step in range(args.num_steps):
                epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
                global_step += args.num_envs
                storage.obs[step] = obs
                storage.starts[step] = next_starts
                q_values, lstm_state = q_network.step(obs, lstm_state, next_starts)
                storage.max_q[step] = q_values.amax(dim=1)  # the bootstrap value of the step before
                action = epsilon_greedy(q_values, epsilon)
                storage.actions[step] = action
                obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's).
                storage.rewards[step] = np.sign(reward)
                storage.terminations[step] = terminated | infos["life_loss"]
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                # A training episode (a game, or a life: with episodic lives a lost life is a termination) starts
                # after its autoreset step, which acts on the ended one's final observation: zero the state there.
                starts, resets = resets, terminated | truncated  # NEXT_STEP autoreset: these envs' next step is one
                obs = torch.from_numpy(obs_np).to(device)
                next_starts = torch.from_numpy(starts).to(device)
                run.log_episodes(global_step, infos)

            # 2. Q(lambda) returns, bootstrapped from max Q of each following observation in the rollout's memory:
            # those of the rollout were computed while acting (the network has not changed since), the one after it
            # here, one more step of the memory (lstm_state itself goes on into the next rollout unchanged).
            after_q, _ = q_network.step(obs, lstm_state, next_starts)
            next_max_q = torch.cat([storage.max_q[1:], after_q.amax(dim=1).unsqueeze(0)])
            rewards, terminations, truncations, autoresets = storage.flags()
            returns = q_lambda_returns(
                rewards, next_max_q, terminations, truncations, autoresets, args.gamma, args.q_lambda
            )
            # The autoreset steps are no transitions (their action was ignored). They stay in the replayed sequences,
            # which the LSTM must see whole, and are masked out of the loss.
            is_transition = 1.0 - autoresets

        # 3. Regress Q(s_t, a_t) on the returns, over minibatches of whole env sequences replayed from the rollout's
        # first state.
        envs_per_minibatch = args.num_envs // args.num_minibatches
        for epoch in range(args.update_epochs):
            for mb_envs in torch.randperm(args.num_envs, device=device).split(envs_per_minibatch):
                mb_state = tuple(s[:, mb_envs] for s in storage.initial_state)
                q_values, _ = q_network(storage.obs[:, mb_envs], mb_state, storage.starts[:, mb_envs])
                q_taken = q_values.gather(2, storage.actions[:, mb_envs].unsqueeze(2)).squeeze(2)
                mb_is_transition = is_transition[:, mb_envs]
                # The mean squared error, as CleanRL's F.mse_loss (no factor 1/2: --max-grad-norm means the same).
                loss = masked_mean((q_taken - returns[:, mb_envs]) ** 2, mb_is_transition)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()

        # 4. Log (one device-to-host read per iteration) and checkpoint when due.
        run.log(
            global_step,
            {
                "losses/td_loss": loss,
                "losses/q_values": masked_mean(q_taken.detach(), mb_is_transition),
                "charts/epsilon": epsilon,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    model = dict(q_network=q_network.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
