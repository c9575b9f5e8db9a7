"""Parallelised Q-Network (PQN) from pixels: Atari and MinAtar.

Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning" (https://arxiv.org/abs/2407.04811): Q-learning
without a replay buffer or a target network. 128 vectorised games collect 32-step rollouts epsilon-greedily; LayerNorm
after every hidden layer of the Q-network keeps bootstrapping from its own moving Q-values stable; the targets are
Q(lambda) returns computed backwards over the rollout, fitted over 2 epochs of 32 minibatches (the autoreset step after
each game's end is no transition: masked out). Learning sees rewards clipped to their sign and a lost life as a
termination; charts/episodic_return is the whole game's raw score. The paper's Atari settings (purejaxql's
pqn_atari.yaml) with CleanRL's pqn_atari_envpool network, initialisation, loss (the mean squared error, so
--max-grad-norm clips the same gradient), RAdam and annealed learning rate.

Action space: Discrete. Environments: Atari through ale-py's C++ vector env (BreakoutNoFrameskip-v4: no sticky
actions; ALE/Breakout-v5: sticky 0.25), 4 stacked 84x84 frames and the Nature CNN, and MinAtar (MinAtar/Breakout-v1
...), which gets the MinAtar paper's small network. Checkpoints hold the MinAtar games, so a resumed run on the CPU
continues exactly; ALE's vector env cannot be saved, so a resumed Atari run starts fresh games.

    uv run python cleanrl/pqn_atari.py --env-id BreakoutNoFrameskip-v4
    uv run python cleanrl/pqn_atari.py --env-id MinAtar/Breakout-v1 --total-timesteps 1000000 --learning-rate 5e-4 \\
        --end-e 0.05

Expect the MinAtar results in benchmark/results/pqn_atari.md (1M steps, 3 seeds).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
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
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 128
    """the number of parallel game environments"""
    num_steps: int = 32
    """the number of steps to run in each environment per rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing (linearly to 0 over the run)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    q_lambda: float = 0.65
    """the lambda of the Q(lambda) returns (0: one-step targets; 1: Monte-Carlo returns)"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 2
    """the K epochs to update the Q-network"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    start_e: float = 1
    """the starting epsilon for exploration"""
    end_e: float = 0.001
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
    check_env_id(args.env_id, "cleanrl/pqn.py")
    probe = make_envs(args.env_id, 1)
    obs_shape = probe.single_observation_space.shape
    probe.close()
    device = "cuda" if args.cuda and torch.cuda.is_available() else "cpu"
    check_fits(RolloutStorage.nbytes(args.num_steps, args.num_envs, obs_shape), device, "rollout", "--num-steps")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights and constant biases, as CleanRL's pqn_atari_envpool.py initialises every layer."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class QNetwork(nn.Module):
    """The Nature CNN on 84x84 frames (Mnih et al. 2015); on MinAtar's 10x10 grids the MinAtar paper's network (Young
    & Tian 2019): one 3x3 convolution of 16 channels, then 128 units. LayerNorm after every hidden layer (over each
    convolution's whole output, as CleanRL's pqn_atari_envpool.py) is what lets PQN bootstrap without a target network
    (paper, section 4). Takes uint8 observations."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float):
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
                layer_init(nn.Linear(512, n_actions)),
            )
        else:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 16, 3, stride=1)),
                nn.LayerNorm([16, height - 2, width - 2]),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(16 * (height - 2) * (width - 2), 128)),
                nn.LayerNorm(128),
                nn.ReLU(),
                layer_init(nn.Linear(128, n_actions)),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.float() * self.scale)


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps. Observations (uint8), actions and max_a Q(obs) live on the device
    (the network needs them each step); rewards and episode ends are staged on the host and moved once per rollout.

    Under NEXT_STEP autoreset the step after a game's end (`resets`) ignores its action and returns the next game's
    first observation; the observation it acted on is the ended game's true final observation."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, *obs_shape), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.max_q = torch.zeros((num_steps, num_envs), device=device)  # max_a Q(obs[t]), computed while acting
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)  # clipped to their sign
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)  # game over or a life lost
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)  # the game hit its time limit
        self.resets = np.zeros((num_steps, num_envs), dtype=np.float32)  # an autoreset step: not a transition
        self.device = device

    @staticmethod
    def nbytes(num_steps: int, num_envs: int, obs_shape: tuple) -> int:
        """Bytes on the device: uint8 observations, int64 actions and float32 max Q per step."""
        return num_steps * num_envs * (int(np.prod(obs_shape)) + 8 + 4)

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

    next_max_q[t] is max_a Q of the observation that followed step t (obs[t + 1], or the observation after the
    rollout): where a game ended at t, the game's true final observation. A termination (game over or a lost life)
    zeroes the bootstrap; a truncation keeps it. Either one stops the recursion, and so does the end of the rollout:
    there G_t bootstraps from next_max_q[t] alone. A reset step (resets[t]) ignored its action: it is no transition,
    its return is 0 and the loss masks it. The step before it ended its game, by a termination or a truncation, so
    no return of that game reaches into it.
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
    game_scores = []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            actions = epsilon_greedy(q_network(torch.as_tensor(obs, device=device)), epsilon)
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
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
    # RAdam, as the paper and CleanRL's pqn_atari_envpool.py use (Adam did worse on CartPole: benchmark/results/pqn.md).
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=args.learning_rate)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    obs_np, _ = envs.reset(seed=args.seed)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        q_network.load_state_dict(run.checkpoint["q_network"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, obs_np = restore_envs(envs, run.checkpoint["envs"], obs_np)
        if run.checkpoint["envs"] is not None:  # else fresh games: no env is about to autoreset
            resets = run.checkpoint["resets"]
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    obs = torch.from_numpy(obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            q_network=q_network.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, obs_np),
            resets=resets,
            global_step=global_step,
        )

    run.begin(training_state)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout epsilon-greedily: one host-to-device copy of the observations and one device-to-host
        # copy of the actions per step; rewards and episode ends are moved once per rollout.
        with torch.no_grad():
            for step in range(args.num_steps):
                epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
                global_step += args.num_envs
                storage.obs[step] = obs
                q_values = q_network(obs)
                storage.max_q[step] = q_values.amax(dim=1)  # the bootstrap value of the step before
                action = epsilon_greedy(q_values, epsilon)
                storage.actions[step] = action
                obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's).
                storage.rewards[step] = np.sign(reward)
                storage.terminations[step] = terminated | infos["life_loss"]
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                resets = terminated | truncated  # NEXT_STEP autoreset: these envs' next step starts a new game
                obs = torch.from_numpy(obs_np).to(device)
                run.log_episodes(global_step, infos)

            # 2. Q(lambda) returns, bootstrapped from max Q of each following observation: those of the rollout were
            # computed while acting (the network has not changed since), the one after it here.
            next_max_q = torch.cat([storage.max_q[1:], q_network(obs).amax(dim=1).unsqueeze(0)])
            rewards, terminations, truncations, autoresets = storage.flags()
            returns = q_lambda_returns(
                rewards, next_max_q, terminations, truncations, autoresets, args.gamma, args.q_lambda
            )
            b_obs = storage.obs.reshape(-1, *obs_shape)
            b_actions = storage.actions.reshape(-1)
            b_returns = returns.reshape(-1)
            b_is_transition = 1.0 - autoresets.reshape(-1)

        # 3. Regress Q(s_t, a_t) on the returns over a few epochs of minibatches, reset steps masked out.
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                q_values = q_network(b_obs[mb_inds]).gather(1, b_actions[mb_inds].unsqueeze(1)).squeeze(1)
                mb_is_transition = b_is_transition[mb_inds]
                # The mean squared error, as CleanRL's F.mse_loss (no factor 1/2: --max-grad-norm means the same).
                loss = masked_mean((q_values - b_returns[mb_inds]) ** 2, mb_is_transition)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()

        # 4. Log (one device-to-host read per iteration) and checkpoint when due.
        run.log(
            global_step,
            {
                "losses/td_loss": loss,
                "losses/q_values": masked_mean(q_values.detach(), mb_is_transition),
                "charts/epsilon": epsilon,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    model = dict(q_network=q_network.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
