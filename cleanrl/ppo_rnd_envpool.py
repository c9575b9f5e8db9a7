"""Random Network Distillation (RND) with PPO from pixels on envpool's Atari, for hard-exploration games.

Burda et al. 2018, "Exploration by Random Network Distillation" (https://arxiv.org/abs/1810.12894): a fixed, random
target network and a predictor trained to match it on the newest frame; the prediction error is an intrinsic reward.
The policy has two value heads: extrinsic (sign-clipped game rewards, discount 0.999, a lost life ends the episode)
and intrinsic (discount 0.99, non-episodic: never cut, not at a lost life nor at a game's end). Intrinsic rewards are
divided by a running std of their discounted sum; the predictor sees frames normalised by running statistics
(initialised from random play, clipped to [-5, 5]) and trains on a random 25% of each minibatch. The observation
normaliser is part of the model (saved, used by evaluation); both are restored on resume. CleanRL's settings for
MontezumaRevenge-v5.

Action space: Discrete. Environments: Atari through envpool (MontezumaRevenge-v5 ..., sticky actions 0.25 here), see
cleanrl_utils/envs/envpool_atari.py; the step after a game ends is envpool's autoreset (action ignored) and is dropped
from the batch. charts/episodic_return is the whole game's raw score. envpool cannot be saved: a resumed run starts
fresh games (networks, normalisers, optimiser, counters and curve continue).

    uv run python cleanrl/ppo_rnd_envpool.py --env-id MontezumaRevenge-v5 --total-timesteps 2000000000

Expect MontezumaRevenge in the thousands after 2B steps (CleanRL: 7100, 1 seed); results in
benchmark/results/ppo_rnd_envpool.md.
"""

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.envpool_atari import check_env_id, make_envs
from cleanrl_utils.errors import check_positive, fail
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
    env_id: str = "MontezumaRevenge-v5"
    """the id of the environment (an envpool Atari id)"""
    total_timesteps: int = 2000000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    num_envs: int = 128
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.999
    """the discount factor of the extrinsic return"""
    int_gamma: float = 0.99
    """the discount factor of the (non-episodic) intrinsic return"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the extrinsic value function, as per the paper"""
    ent_coef: float = 0.001
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value functions"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
    repeat_action_probability: float = 0.25
    """sticky actions: the probability that the emulator repeats the previous action"""
    ext_coef: float = 2.0
    """coefficient of the extrinsic advantages"""
    int_coef: float = 1.0
    """coefficient of the intrinsic advantages"""
    update_proportion: float = 0.25
    """the fraction of each minibatch the predictor trains on"""
    num_iterations_obs_norm_init: int = 50
    """rollouts of random play (num_steps each) that initialise the observation normaliser"""
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
    check_positive(**{name: getattr(args, name) for name in positive + ("eval_episodes", "torch_threads")})
    if args.checkpoint_every < 0 or args.num_iterations_obs_norm_init < 0:
        fail("--checkpoint-every and --num-iterations-obs-norm-init must be 0 or positive")
    for name in ("gamma", "int_gamma"):
        if not 0 < getattr(args, name) <= 1:
            fail(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(args, name)}")
    if not 0 <= args.gae_lambda <= 1 or not 0 < args.update_proportion <= 1:
        fail(
            f"--gae-lambda must be in [0, 1] and --update-proportion in (0, 1], "
            f"got {args.gae_lambda} and {args.update_proportion}"
        )
    if not 0 <= args.repeat_action_probability < 1:
        fail(f"--repeat-action-probability must be in [0, 1), got {args.repeat_action_probability}")
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
    check_env_id(args.env_id, "this script runs envpool ids (cleanrl/ppo_atari.py runs ale-py's)", "cleanrl/ppo.py")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The RND paper's policy: the Nature CNN's convolutions, 256 then 448 units; the actor (448 -> actions) and two
    value heads, extrinsic and intrinsic, on the torso plus one more 448-unit residual layer. Takes uint8 frames."""

    def __init__(self, obs_shape: tuple, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(3136, 256)),
            nn.ReLU(),
            layer_init(nn.Linear(256, 448)),
            nn.ReLU(),
        )
        self.extra_layer = nn.Sequential(layer_init(nn.Linear(448, 448), std=0.1), nn.ReLU())
        self.actor = nn.Sequential(
            layer_init(nn.Linear(448, 448), std=0.01), nn.ReLU(), layer_init(nn.Linear(448, n_actions), std=0.01)
        )
        self.critic_ext = layer_init(nn.Linear(448, 1), std=0.01)
        self.critic_int = layer_init(nn.Linear(448, 1), std=0.01)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Action log-probabilities, extrinsic and intrinsic values."""
        hidden = self.network(obs.float() / 255.0)
        features = self.extra_layer(hidden) + hidden
        log_probs = torch.log_softmax(self.actor(hidden), dim=-1)
        return log_probs, self.critic_ext(features).squeeze(-1), self.critic_int(features).squeeze(-1)

    def get_values(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(obs)[1:]

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A sampled action, its log-probability and both values, from one pass."""
        log_probs, value_ext, value_int = self.heads(obs)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), value_ext, value_int

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Log-probabilities of `actions`, the policy's entropy and both values, from one pass."""
        log_probs, value_ext, value_int = self.heads(obs)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy, value_ext, value_int


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches (Chan et al.'s parallel update), started at mean 0, variance
    1 and a count of 1e-4 as in the RND paper's code. Buffers, so they are saved with the model."""

    def __init__(self, shape: tuple = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, batch: torch.Tensor) -> None:
        """Fold in `batch`, whose first dimension indexes samples."""
        batch = batch.double()
        batch_mean, batch_var, batch_count = batch.mean(0), batch.var(0, unbiased=False), batch.shape[0]
        delta, total = batch_mean - self.mean, self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean += delta * batch_count / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class RewardNormalizer(nn.Module):
    """Divides intrinsic rewards by a running std of their discounted sum per environment (the RND paper's reward
    forward filter), a sum that is never cut: the intrinsic return is non-episodic."""

    def __init__(self, num_envs: int, gamma: float):
        super().__init__()
        self.gamma = gamma
        self.register_buffer("discounted_sum", torch.zeros(num_envs, dtype=torch.float64))
        self.rms = RunningMeanStd()

    def forward(self, rewards: torch.Tensor) -> torch.Tensor:
        """`rewards` [num_steps, num_envs] in time order: update the statistics, return the normalised rewards."""
        sums = torch.empty_like(rewards, dtype=torch.float64)
        for t in range(rewards.shape[0]):
            self.discounted_sum.mul_(self.gamma).add_(rewards[t])
            sums[t] = self.discounted_sum
        self.rms.update(sums.reshape(-1))
        return (rewards / self.rms.var.sqrt()).to(rewards.dtype)


class RNDModel(nn.Module):
    """A fixed random target network and a trained predictor on the newest frame, normalised by running statistics and
    clipped to [-5, 5]; the squared prediction error (halved) is the intrinsic reward."""

    def __init__(self, frame_shape: tuple):
        super().__init__()

        def torso() -> list[nn.Module]:
            return [
                layer_init(nn.Conv2d(1, 32, 8, stride=4)),
                nn.LeakyReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.LeakyReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.LeakyReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(3136, 512)),
            ]

        self.predictor = nn.Sequential(
            *torso(), nn.ReLU(), layer_init(nn.Linear(512, 512)), nn.ReLU(), layer_init(nn.Linear(512, 512))
        )
        self.target = nn.Sequential(*torso())
        self.target.requires_grad_(False)
        self.obs_rms = RunningMeanStd(frame_shape)

    def normalize(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 frames [batch, H, W] -> normalised [batch, 1, H, W] float32."""
        normalized = (frames.double() - self.obs_rms.mean) / self.obs_rms.var.sqrt()
        return normalized.clamp(-5, 5).float().unsqueeze(1)

    def prediction_error(self, frames: torch.Tensor) -> torch.Tensor:
        """Per frame: the mean squared error of the predictor against the target."""
        obs = self.normalize(frames)
        return (self.predictor(obs) - self.target(obs)).pow(2).mean(-1)

    def novelty(self, frames: torch.Tensor) -> torch.Tensor:
        """The intrinsic reward of frames: half the summed squared prediction error."""
        obs = self.normalize(frames)
        return (self.predictor(obs) - self.target(obs)).pow(2).sum(-1) / 2


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps on the device: uint8 observations and the newest frame after each
    step (the RND input), actions, log-probabilities, both values and the intrinsic rewards; extrinsic rewards,
    episode ends and autoreset flags are staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.next_frames = torch.zeros((num_steps, num_envs) + tuple(obs_shape[1:]), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.ext_values = torch.zeros((num_steps, num_envs), device=device)
        self.int_values = torch.zeros((num_steps, num_envs), device=device)
        self.int_rewards = torch.zeros((num_steps, num_envs), device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)  # training episode ends: no bootstrap
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.resets = np.zeros((num_steps, num_envs), dtype=bool)  # autoreset steps: not transitions
        self.device = device

    def on_device(self) -> tuple[torch.Tensor, ...]:
        arrays = (self.rewards, self.terminations, self.truncations, self.resets)
        return tuple(torch.as_tensor(a, device=self.device) for a in arrays)


def compute_gae(rewards, values, next_values, terminations, truncations, gamma, gae_lambda) -> torch.Tensor:
    """Generalized advantage estimates for a [num_steps, num_envs] rollout.

    next_values[t] is the value of the observation that followed step t: the true final observation where an episode
    ended at t. A termination zeroes that bootstrap; a truncation keeps it. Either one stops the advantage from flowing
    back across the episode boundary. The intrinsic stream passes zeros for both: it is never cut.
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


def transition_indices(resets: torch.Tensor) -> torch.Tensor:
    """Flat batch indices of a [num_steps, num_envs] rollout's transitions: every step but the autoreset steps."""
    return torch.nonzero(~resets.reshape(-1)).squeeze(1)


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the game scores of its (sampled) policy; prints the mean
    intrinsic reward it still finds (the saved normalisers and predictor)."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir, repeat_action_probability=model["sticky"])
    agent = Agent(model["obs_shape"], model["n_actions"]).to(device)
    agent.load_state_dict(model["agent"])
    rnd_model = RNDModel(model["obs_shape"][1:]).to(device)
    rnd_model.load_state_dict(model["rnd_model"])
    obs, _ = envs.reset(seed=seed)
    game_scores, novelty = [], []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            actions = agent.act(torch.as_tensor(obs, device=device))[0]
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
            novelty.append(rnd_model.novelty(torch.as_tensor(obs[:, -1], device=device)))
            if "episode" in infos:
                game_scores += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    print(f"evaluation: mean intrinsic reward (unnormalised) {torch.cat(novelty).mean().item():.4g}")
    return game_scores[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    videos = run.dir / "videos"
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, videos, 0, args.repeat_action_probability)
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    agent = Agent(obs_shape, n_actions).to(device)
    rnd_model = RNDModel(obs_shape[1:]).to(device)
    reward_normalizer = RewardNormalizer(args.num_envs, args.int_gamma).to(device)
    optimizer = torch.optim.Adam(
        list(agent.parameters()) + list(rnd_model.predictor.parameters()), lr=args.learning_rate, eps=1e-5
    )
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    # A resumed run's games are fresh ones (envpool cannot be saved), seeded apart from the first run's.
    next_obs_np, _ = envs.reset(seed=args.seed + run.start_step)
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        rnd_model.load_state_dict(run.checkpoint["rnd_model"])
        reward_normalizer.load_state_dict(run.checkpoint["reward_normalizer"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, next_obs_np = restore_envs(envs, run.checkpoint["envs"], next_obs_np)  # None: fresh games
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    else:
        # The observation normaliser starts from random play (not counted as training steps); the games are then
        # reset, so that every logged game is the agent's own.
        for _ in range(args.num_iterations_obs_norm_init):
            frames = np.empty((args.num_steps, args.num_envs) + obs_shape[1:], dtype=np.uint8)
            for step in range(args.num_steps):
                frames[step] = envs.step(np.random.randint(0, n_actions, args.num_envs))[0][:, -1]
            rnd_model.obs_rms.update(torch.from_numpy(frames).to(device).reshape((-1,) + obs_shape[1:]))
        if args.num_iterations_obs_norm_init:
            next_obs_np, _ = envs.reset()
    next_obs = torch.from_numpy(next_obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            rnd_model=rnd_model.state_dict(),  # with the observation normaliser
            reward_normalizer=reward_normalizer.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, next_obs_np),  # None: envpool does not pickle
            global_step=global_step,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout; the intrinsic reward of a step is the novelty of the frame it led to.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                action, storage.logprobs[step], storage.ext_values[step], storage.int_values[step] = agent.act(next_obs)
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.from_numpy(next_obs_np).to(device)
                storage.next_frames[step] = next_obs[:, -1]
                storage.int_rewards[step] = rnd_model.novelty(next_obs[:, -1])
                # Extrinsic learning sees rewards clipped to their sign, and a lost life ends its episode.
                storage.rewards[step] = np.sign(reward)
                storage.terminations[step] = terminated | infos["life_loss"]
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                resets = terminated | truncated  # NEXT_STEP autoreset: these envs' next step starts a new game
                run.log_episodes(global_step, infos)

            # 2. Advantages: the extrinsic stream is cut at episode ends, the intrinsic one never (its rewards are
            # normalised first). values[t + 1] after a game's last step is the true final observation's value.
            rewards, terminations, truncations, reset_steps = storage.on_device()
            int_rewards = reward_normalizer(storage.int_rewards)
            next_ext_value, next_int_value = agent.get_values(next_obs)
            next_ext_values = torch.cat([storage.ext_values[1:], next_ext_value.unsqueeze(0)])
            next_int_values = torch.cat([storage.int_values[1:], next_int_value.unsqueeze(0)])
            ext_advantages = compute_gae(
                rewards, storage.ext_values, next_ext_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            never = torch.zeros_like(terminations)
            int_advantages = compute_gae(
                int_rewards, storage.int_values, next_int_values, never, never, args.int_gamma, args.gae_lambda
            )
            rnd_model.obs_rms.update(storage.next_frames.reshape((-1,) + obs_shape[1:]))

            b_obs = storage.obs.reshape((-1,) + tuple(obs_shape))
            b_next_frames = storage.next_frames.reshape((-1,) + tuple(obs_shape[1:]))
            b_actions = storage.actions.reshape(-1)
            b_logprobs = storage.logprobs.reshape(-1)
            b_advantages = (args.ext_coef * ext_advantages + args.int_coef * int_advantages).reshape(-1)
            b_ext_returns = (ext_advantages + storage.ext_values).reshape(-1)
            b_int_returns = (int_advantages + storage.int_values).reshape(-1)
            b_ext_values = storage.ext_values.reshape(-1)
            # The autoreset steps are not transitions (their action was ignored): they leave the batch.
            transitions = transition_indices(reset_steps)

        # 3. Update the policy, both value heads and the predictor
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = transitions[torch.randperm(len(transitions), device=device)]
            for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                newlogprob, entropy, new_ext_value, new_int_value = agent.evaluate_actions(
                    b_obs[mb_inds], b_actions[mb_inds]
                )
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipped += ((ratio - 1.0).abs() > args.clip_coef).float().mean()

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value losses: the extrinsic head clipped as in PPO, the intrinsic one plain
                if args.clip_vloss:
                    ext_loss_unclipped = (new_ext_value - b_ext_returns[mb_inds]) ** 2
                    v_delta = torch.clamp(new_ext_value - b_ext_values[mb_inds], -args.clip_coef, args.clip_coef)
                    ext_loss_clipped = (b_ext_values[mb_inds] + v_delta - b_ext_returns[mb_inds]) ** 2
                    ext_v_loss = 0.5 * torch.max(ext_loss_unclipped, ext_loss_clipped).mean()
                else:
                    ext_v_loss = 0.5 * ((new_ext_value - b_ext_returns[mb_inds]) ** 2).mean()
                int_v_loss = 0.5 * ((new_int_value - b_int_returns[mb_inds]) ** 2).mean()
                v_loss = ext_v_loss + int_v_loss

                # Predictor loss on a random update_proportion of the minibatch (the paper's 25% with 128 envs)
                errors = rnd_model.prediction_error(b_next_frames[mb_inds])
                mask = (torch.rand(len(errors), device=device) < args.update_proportion).float()
                fwd_loss = (errors * mask).sum() / mask.sum().clamp(min=1.0)

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef + fwd_loss

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(
                    list(agent.parameters()) + list(rnd_model.predictor.parameters()), args.max_grad_norm
                )
                optimizer.step()

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        y_true, y_pred = b_ext_returns[transitions], b_ext_values[transitions]
        var_y = y_true.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var() / var_y)
        run.log(
            global_step,
            {
                "losses/value_loss": v_loss,
                "losses/ext_value_loss": ext_v_loss,
                "losses/int_value_loss": int_v_loss,
                "losses/policy_loss": pg_loss,
                "losses/entropy": entropy_loss,
                "losses/fwd_loss": fwd_loss,
                "losses/old_approx_kl": old_approx_kl,
                "losses/approx_kl": approx_kl,
                "losses/clipfrac": clipped / (args.num_minibatches * (epoch + 1)),
                "losses/explained_variance": explained_var,
                "charts/intrinsic_reward": int_rewards.reshape(-1)[transitions].mean(),
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    sticky = args.repeat_action_probability
    model = dict(agent=agent.state_dict(), rnd_model=rnd_model.state_dict(), obs_shape=obs_shape, n_actions=n_actions)
    run.finish(global_step, evaluate, sticky=sticky, **model)
