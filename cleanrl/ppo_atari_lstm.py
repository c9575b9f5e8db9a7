"""Proximal Policy Optimization (PPO) with an LSTM, from single pixel frames: Atari and MinAtar.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347) with a recurrent
policy as in Huang et al. 2022, "The 37 Implementation Details of PPO": the Nature CNN sees ONE 84x84 frame, not a
stack, an LSTM (512 -> 128; Hochreiter & Schmidhuber 1997) carries the memory, and actor and critic read its output.
The update replays whole environment sequences from the rollout's first LSTM state: a minibatch is a set of envs.
CleanRL's settings: 8 envs x 128 steps, clip 0.1, 4 minibatches x 4 epochs, lr 2.5e-4 annealed.

Action space: Discrete. Environments: Atari through ale-py's C++ vector env (BreakoutNoFrameskip-v4, ALE/Breakout-v5)
and MinAtar (MinAtar/Breakout-v1 ...: the MinAtar paper's small network, then an LSTM 128 -> 128). Learning sees sign-
clipped rewards and a lost life ends its episode; charts/episodic_return is the whole game's score. The LSTM state is
zeroed where a training episode starts: after a lost life, and at a new game's first observation. NEXT_STEP autoreset:
the autoreset step acts on the old game's final observation in the old game's memory (its value bootstraps a cut game)
and is masked out of every mean. MinAtar games are saved with checkpoints (exact resume on the CPU); ALE's cannot be,
so a resumed Atari run starts fresh games with a zero state.

    uv run python cleanrl/ppo_atari_lstm.py --env-id BreakoutNoFrameskip-v4 --total-timesteps 10000000

Expect Breakout ~129 after 10M steps (CleanRL's figure); MinAtar results in benchmark/results/ppo_atari_lstm.md.
"""

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
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
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout (the length of a replayed sequence)"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each holds num_envs / num_minibatches whole environment sequences)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
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
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
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
    check_env_id(args.env_id, "cleanrl/ppo.py")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """A torso per frame, an LSTM over time, then actor and critic heads. The torso is the Nature CNN on 84x84 frames
    (Mnih et al. 2015, 512 units); on MinAtar's 10x10 grids the MinAtar paper's network (Young & Tian 2019): one 3x3
    convolution of 16 channels, then 128 units. Takes uint8 observations laid out [time, env, C, H, W]."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float, lstm_size: int = 128):
        super().__init__()
        channels, height, width = obs_shape
        self.scale = 1.0 / obs_high  # pixels 0..255 -> [0, 1]; MinAtar's cells are 0/1 already
        if height >= 84:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(3136, 512)),
                nn.ReLU(),
            )
            hidden = 512
        else:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(channels, 16, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(16 * (height - 2) * (width - 2), 128)),
                nn.ReLU(),
            )
            hidden = 128
        self.lstm = nn.LSTM(hidden, lstm_size)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(lstm_size, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(lstm_size, 1), std=1.0)

    def initial_state(self, num_envs: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM's (hidden, cell) state before any observation: zeros, [1, num_envs, lstm_size] each."""
        zeros = torch.zeros((1, num_envs, self.lstm.hidden_size), device=device)
        return zeros, zeros.clone()

    def recur(self, features: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Step the LSTM over features [T, B, F] from `state`, zeroing an env's state before each step whose
        observation starts a training episode (starts [T, B], bool). Returns the outputs [T, B, H] and the state
        after the last step."""
        # One LSTM call per run of steps with no episode start after its first step, where the state of the envs
        # that start is zeroed: MinAtar Breakout trains at 1,788 SPS so, at 403 with one call per step (CleanRL's).
        cuts = (torch.nonzero(starts[1:].any(dim=1)).flatten() + 1).tolist()  # steps where some env starts
        outputs = []
        for begin, end in zip([0] + cuts, cuts + [len(features)]):
            keep = (~starts[begin]).float().view(1, -1, 1)
            output, state = self.lstm(features[begin:end], (state[0] * keep, state[1] * keep))
            outputs.append(output)
        return torch.cat(outputs), state

    def heads(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Log-probabilities of every action and values for observation sequences [T, B, C, H, W], and the state."""
        num_steps, num_envs = starts.shape
        features = self.network(obs.flatten(0, 1).float() * self.scale).reshape(num_steps, num_envs, -1)
        hidden, state = self.recur(features, state, starts)
        return torch.log_softmax(self.actor(hidden), dim=-1), self.critic(hidden).squeeze(-1), state

    def act(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step of every env (obs [B, C, H, W], starts [B]): a sampled action, its log-probability, the value and
        the LSTM state after this observation."""
        log_probs, value, state = self.heads(obs.unsqueeze(0), state, starts.unsqueeze(0))
        log_probs, value = log_probs[0], value[0]
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), value, state

    def get_value(self, obs: torch.Tensor, state: tuple, starts: torch.Tensor) -> torch.Tensor:
        return self.heads(obs.unsqueeze(0), state, starts.unsqueeze(0))[1][0]

    def evaluate_actions(self, obs, actions, state, starts) -> tuple[torch.Tensor, ...]:
        """Replay sequences [T, B, ...] from `state`: log-probabilities of `actions`, entropies and values, [T, B]."""
        log_probs, value, _ = self.heads(obs, state, starts)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy, value


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps on the device: uint8 observations, the episode starts that zero
    the LSTM state, actions, their log-probabilities and values, and the LSTM state the rollout began with; rewards,
    episode ends and autoreset flags are staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.starts = torch.zeros((num_steps, num_envs), dtype=torch.bool, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.values = torch.zeros((num_steps, num_envs), device=device)
        self.initial_state: tuple[torch.Tensor, torch.Tensor] | None = None
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

    next_values[t] is the value of the observation that followed step t: the true final
    observation where an episode ended at t. A termination zeroes that bootstrap; a truncation
    keeps it. Either one stops the advantage from flowing back across the episode boundary.
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


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of `x` over the entries where `mask` is True (the real transitions)."""
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(advantages - mean) / (std + 1e-8), the mean and the (Bessel-corrected) std taken over the masked entries."""
    mean = masked_mean(advantages, mask)
    variance = torch.where(mask, (advantages - mean) ** 2, 0.0).sum() / (mask.sum() - 1).clamp(min=1)
    return (advantages - mean) / (variance.sqrt() + 1e-8)


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the game scores of its (sampled) policy."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir, stack_num=1)
    agent = Agent(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    agent.load_state_dict(model["agent"])
    obs, _ = envs.reset(seed=seed)
    state, starts, resets = agent.initial_state(1, device), np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
    game_scores = []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            obs_t, starts_t = torch.as_tensor(obs, device=device), torch.as_tensor(starts, device=device)
            actions, _, _, state = agent.act(obs_t, state, starts_t)
            obs, _, terminated, truncated, infos = envs.step(actions.cpu().numpy())
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
    # One frame per observation: the LSTM is the agent's memory (ALE's default stack of 4 would hide that).
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos", stack_num=1)
    obs_shape = envs.single_observation_space.shape
    obs_high = float(envs.single_observation_space.high.max())
    n_actions = int(envs.single_action_space.n)

    agent = Agent(obs_shape, n_actions, obs_high).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    lstm_state = agent.initial_state(args.num_envs, device)  # carried from one rollout into the next
    starts = np.ones(args.num_envs, dtype=bool)  # the next observation starts a training episode: zero the state
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, next_obs_np = restore_envs(envs, run.checkpoint["envs"], next_obs_np)
        if run.checkpoint["envs"] is not None:  # the same games go on, with the same memory of them
            resets, starts = run.checkpoint["resets"], run.checkpoint["starts"]
            lstm_state = tuple(s.to(device) for s in run.checkpoint["lstm_state"])
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = torch.from_numpy(next_obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds (written between rollouts, so lstm_state is the next rollout's first state);
        resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, next_obs_np),
            resets=resets,
            starts=starts,
            lstm_state=lstm_state,
            global_step=global_step,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout: one host-to-device copy of the observations (and of the episode-start flags, a byte
        # per env, which the LSTM needs at once) and one device-to-host copy of the actions per step.
        with torch.no_grad():
            storage.initial_state = lstm_state  # the update replays every sequence from here
            next_starts = torch.from_numpy(starts).to(device)
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                storage.starts[step] = next_starts
                action, storage.logprobs[step], storage.values[step], lstm_state = agent.act(
                    next_obs, lstm_state, next_starts
                )
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.from_numpy(next_obs_np).to(device)
                # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's).
                storage.rewards[step] = np.sign(reward)
                storage.terminations[step] = terminated | infos["life_loss"]
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                # A training episode (a game, or a life: with episodic lives a lost life is a termination) starts
                # after its autoreset step, which acts on the ended one's final observation: zero the state there.
                starts, resets = resets, terminated | truncated  # NEXT_STEP autoreset: these envs' next step is one
                next_starts = torch.from_numpy(starts).to(device)
                run.log_episodes(global_step, infos)

            # 2. Advantages. Under NEXT_STEP autoreset the observation after a game's last step is its true final
            # one (the autoreset step acts on it, in the old game's memory), so values[t + 1] bootstraps a truncation.
            rewards, terminated, truncated, reset_steps = storage.on_device()
            next_values = torch.cat([storage.values[1:], agent.get_value(next_obs, lstm_state, next_starts)[None]])
            values = storage.values
            advantages = compute_gae(rewards, values, next_values, terminated, truncated, args.gamma, args.gae_lambda)
            returns = advantages + values
            # The autoreset steps are not transitions (their action was ignored). They stay in the replayed sequences,
            # which the LSTM must see whole, and are masked out of every mean below.
            transitions = ~reset_steps

        # 3. Update the policy and value network on minibatches of whole environment sequences
        envs_per_minibatch = args.num_envs // args.num_minibatches
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            for mb_envs in torch.randperm(args.num_envs, device=device).split(envs_per_minibatch):
                mb_state = tuple(s[:, mb_envs] for s in storage.initial_state)
                newlogprob, entropy, newvalue = agent.evaluate_actions(
                    storage.obs[:, mb_envs], storage.actions[:, mb_envs], mb_state, storage.starts[:, mb_envs]
                )
                mask = transitions[:, mb_envs]
                logratio = newlogprob - storage.logprobs[:, mb_envs]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = masked_mean(-logratio, mask)
                    approx_kl = masked_mean((ratio - 1) - logratio, mask)
                    clipped += masked_mean(((ratio - 1.0).abs() > args.clip_coef).float(), mask)

                mb_advantages = advantages[:, mb_envs]
                if args.norm_adv:
                    mb_advantages = normalize_advantages(mb_advantages, mask)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = masked_mean(torch.max(pg_loss1, pg_loss2), mask)

                # Value loss
                mb_returns, mb_values = returns[:, mb_envs], values[:, mb_envs]
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - mb_returns) ** 2
                    v_delta = torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (mb_values + v_delta - mb_returns) ** 2
                    v_loss = 0.5 * masked_mean(torch.max(v_loss_unclipped, v_loss_clipped), mask)
                else:
                    v_loss = 0.5 * masked_mean((newvalue - mb_returns) ** 2, mask)

                entropy_loss = masked_mean(entropy, mask)
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        y_true, y_pred = returns[transitions], values[transitions]
        var_y = y_true.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var() / var_y)
        run.log(
            global_step,
            {
                "losses/value_loss": v_loss,
                "losses/policy_loss": pg_loss,
                "losses/entropy": entropy_loss,
                "losses/old_approx_kl": old_approx_kl,
                "losses/approx_kl": approx_kl,
                "losses/clipfrac": clipped / (args.num_minibatches * (epoch + 1)),
                "losses/explained_variance": explained_var,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    model = dict(agent=agent.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
