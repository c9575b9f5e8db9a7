"""Proximal Policy Optimization (PPO) on Procgen, with the IMPALA CNN.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (https://arxiv.org/abs/1707.06347), on the Procgen
benchmark of Cobbe et al. 2020 (https://arxiv.org/abs/1912.01588) with the IMPALA CNN of Espeholt et al. 2018 (three
conv sequences of 16, 32, 32 channels, each a 3x3 conv, a max-pool and two residual blocks, then 256 units) shared by
actor and critic. CleanRL's settings: 64 envs x 256 steps, 8 minibatches x 3 epochs, a constant lr 5e-4 (as in
CleanRL and the Procgen paper; --anneal-lr decays it linearly to 0), gamma 0.999, GAE 0.95, clip 0.2; rewards scaled
by the running std of the discounted return and clipped to [-10, 10] (gym 0.2x's NormalizeReward, as CleanRL; its
statistics are saved with checkpoints and the model), while charts/episodic_return is the raw episode score.

Action space: Discrete(15). Environments: envpool's Procgen games (StarpilotEasy-v0, BigfishEasy-v0, BossfightHard-v0
...), full level distribution by default (--num-levels 0). Autoreset is NEXT_STEP: the step after an episode ends (its
action ignored) is dropped from the batch, and the observation it acted on, the true final one, bootstraps a
truncation. envpool's simulators cannot be saved: a resumed run starts fresh episodes (environments seeded with
seed + global_step), with the networks, optimiser and reward statistics as checkpointed.

    uv run --extra envpool python cleanrl/ppo_procgen.py --env-id StarpilotEasy-v0 --total-timesteps 25000000

Expect StarpilotEasy ~31 after 25M steps (CleanRL: 30.99 +- 1.96); results in benchmark/results/ppo_procgen.md.
"""

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model
from cleanrl_utils.envs.procgen import check_env_id, make_envs
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
    env_id: str = "StarpilotEasy-v0"
    """the id of the environment (a Procgen game: StarpilotEasy-v0, BigfishHard-v0 ...)"""
    total_timesteps: int = 25000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    num_levels: int = 0
    """the number of Procgen levels to train on (0: unlimited)"""
    start_level: int = 0
    """the seed of the first Procgen level"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 64
    """the number of parallel game environments"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = False
    """toggle learning rate annealing (linear to 0) for policy and value networks"""
    gamma: float = 0.999
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    update_epochs: int = 3
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
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
    """the number of episodes to evaluate the saved model for"""
    amp: bool = False
    """if toggled, run the networks in bf16 autocast (parameters and storage stay float32)"""

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
    if args.checkpoint_every < 0 or args.num_levels < 0 or args.start_level < 0:
        fail("--checkpoint-every, --num-levels and --start-level must be 0 or positive")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
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


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    """A 3x3 convolution, a 3x3 max-pool of stride 2 (halving height and width), two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.res_block0 = ResidualBlock(out_channels)
        self.res_block1 = ResidualBlock(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(self.conv(x), kernel_size=3, stride=2, padding=1)
        return self.res_block1(self.res_block0(x))


def impala_cnn(obs_shape: tuple, channels: tuple = (16, 32, 32), hidden: int = 256) -> nn.Sequential:
    """The IMPALA CNN (Espeholt et al. 2018) as Procgen's baselines use it: PyTorch's default initialisation."""
    c, h, w = obs_shape
    layers = []
    for out_channels in channels:
        layers.append(ConvSequence(c, out_channels))
        c, h, w = out_channels, (h + 1) // 2, (w + 1) // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.ReLU(), nn.Linear(c * h * w, hidden), nn.ReLU())


class Agent(nn.Module):
    """Actor and critic heads on one IMPALA CNN; takes uint8 observations. The heads' outputs are cast to float32 (a
    no-op without --amp): under bf16 autocast the log-softmax, the values stored and the losses are then float32 all
    the same."""

    def __init__(self, obs_shape: tuple, n_actions: int):
        super().__init__()
        self.network = impala_cnn(obs_shape)
        self.actor = layer_init(nn.Linear(256, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        # Channels-last (NHWC) pixels make every convolution and pooling after them run in that layout: on one CPU
        # thread the IMPALA CNN's forward + backward on 512 frames takes 2.5 s instead of 4.3 s and a 64-frame
        # forward 72 ms instead of 154 ms (side by side, 2026-12-03; a GPU: not measured); the values agree to 5e-8.
        return self.network((obs.float() / 255.0).contiguous(memory_format=torch.channels_last))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).float().squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, its log-probability and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden).float(), dim=-1)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.critic(hidden).float().squeeze(-1)

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Log-probabilities of `actions`, the policy's entropy and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden).float(), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        log_prob = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return log_prob, entropy, self.critic(hidden).float().squeeze(-1)


class RewardScaler:
    """gym 0.2x's NormalizeReward (CleanRL's) for a batch of envs: rewards divided by the running standard deviation
    of each env's discounted return (zeroed after any episode end), then clipped to [-10, 10]. The autoreset steps
    (reward 0, not transitions) leave the statistics alone. Its statistics are part of the model."""

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8):
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self.returns = np.zeros(num_envs)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, rewards: np.ndarray, ended: np.ndarray, transitions: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + rewards
        if transitions.any():
            self.update(self.returns[transitions])
        self.returns[ended] = 0.0
        return np.clip(rewards / np.sqrt(self.var + self.epsilon), -self.clip, self.clip).astype(np.float32)

    def update(self, x: np.ndarray) -> None:
        """Merge a batch into the running mean and variance (Chan et al.'s parallel algorithm)."""
        batch_mean, batch_var, batch_count = x.mean(), x.var(), len(x)
        delta, total = batch_mean - self.mean, self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean, self.var, self.count = self.mean + delta * batch_count / total, m2 / total, total

    def state_dict(self) -> dict:
        return dict(mean=self.mean, var=self.var, count=self.count)

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps on the device: uint8 observations, actions, their log-probabilities
    and values; rewards, episode ends and autoreset flags are staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.values = torch.zeros((num_steps, num_envs), device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
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


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the scores of its (sampled) policy: the first episode of each
    of `eval_episodes` environments (waiting for every one, so long episodes count as much as short ones)."""
    model = load_model(model_path, __file__)
    levels = dict(num_levels=model["args"]["num_levels"], start_level=model["args"]["start_level"])
    envs = make_envs(model["env_id"], eval_episodes, seed, capture_video, video_dir, **levels)
    agent = Agent(model["obs_shape"], model["n_actions"]).to(device)
    agent.load_state_dict(model["agent"])
    obs, _ = envs.reset()
    scores = np.full(eval_episodes, np.nan)
    with torch.no_grad():
        while np.isnan(scores).any():
            actions, _, _ = agent.act(torch.as_tensor(obs, device=device))
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
            if "episode" in infos:
                first = infos["_episode"] & np.isnan(scores)
                scores[first] = infos["episode"]["r"][first]
    envs.close()
    return scores.tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    global_step = run.checkpoint["global_step"] if run.checkpoint else 0
    # envpool seeds its envs when it makes them; a resumed run's fresh episodes get a seed of their own.
    envs = make_envs(
        args.env_id, args.num_envs, args.seed + global_step, args.capture_video, run.dir / "videos",
        num_levels=args.num_levels, start_level=args.start_level,
    )  # fmt: skip
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    agent = Agent(obs_shape, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)
    # --amp: the networks' forward passes in bf16 autocast, which needs no loss scaling (its exponent range is
    # float32's); parameters, optimiser state, the rollout and GAE stay float32.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    iteration = global_step // args.batch_size
    next_obs_np, _ = envs.reset()
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their episode just ended)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        reward_scaler.load_state_dict(run.checkpoint["reward_scaler"])
        print("envpool's environments cannot be saved with a checkpoint: resuming with fresh episodes", flush=True)
    next_obs = torch.from_numpy(next_obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            reward_scaler=reward_scaler.state_dict(),
            global_step=global_step,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout: one host-to-device copy of the observations and one device-to-host
        # copy of the actions per step; rewards and episode ends are moved once per rollout.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                with autocast:
                    action, storage.logprobs[step], storage.values[step] = agent.act(next_obs)
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.from_numpy(next_obs_np).to(device)
                storage.rewards[step] = reward_scaler(reward, terminated | truncated, ~resets)
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                resets = terminated | truncated  # NEXT_STEP autoreset: these envs' next step starts a new episode
                run.log_episodes(global_step, infos)

            # 2. Advantages. Under NEXT_STEP autoreset the observation after an episode's last step is its true final
            # one (the autoreset step acts on it), so values[t + 1] bootstraps a truncation as it should.
            rewards, terminations, truncations, reset_steps = storage.on_device()
            with autocast:
                next_value = agent.get_value(next_obs)
            next_values = torch.cat([storage.values[1:], next_value.unsqueeze(0)])
            values = storage.values
            advantages = compute_gae(
                rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            returns = advantages + values

            b_obs = storage.obs.reshape((-1,) + tuple(obs_shape))
            b_actions = storage.actions.reshape(-1)
            b_logprobs = storage.logprobs.reshape(-1)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)
            # The autoreset steps are not transitions (their action was ignored): they leave the batch.
            transitions = torch.nonzero(~reset_steps.reshape(-1)).squeeze(1)

        # 3. Update the policy and value network
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = transitions[torch.randperm(len(transitions), device=device)]
            for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                with autocast:
                    newlogprob, entropy, newvalue = agent.evaluate_actions(b_obs[mb_inds], b_actions[mb_inds])
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

                # Value loss
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_delta = torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (b_values[mb_inds] + v_delta - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        y_true, y_pred = b_returns[transitions], b_values[transitions]
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
    model = dict(
        agent=agent.state_dict(), reward_scaler=reward_scaler.state_dict(), obs_shape=obs_shape, n_actions=n_actions
    )
    run.finish(global_step, evaluate, **model)
