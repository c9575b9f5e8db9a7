"""Phasic Policy Gradient (PPG) on Procgen, with IMPALA CNNs.

Cobbe et al. 2020, "Phasic Policy Gradient" (https://arxiv.org/abs/2009.04416). Policy and value are separate IMPALA
CNNs (16, 32, 32 channels, residual blocks, 256 units) with the normed initialisation of the paper's code
(openai/phasic-policy-gradient): every layer's weights rescaled to a fixed norm per output unit, zero biases. The
policy phase is PPO (Schulman et al. 2017) for --n-iteration iterations (--e-policy epochs on the policy, --v-value on
the value network); then the auxiliary phase (--e-auxiliary epochs over whole rollouts of the last --n-iteration
iterations) distils the value targets into an auxiliary value head on the policy network while a KL term
(--beta-clone) holds the policy to what it was before the phase, and trains the value network further. CleanRL's
settings: 64 envs x 256 steps, 8 minibatches, lr 5e-4, gamma 0.999, advantages normalised over the whole batch,
rewards scaled by the running std of the discounted return (saved with checkpoints and the model), while
charts/episodic_return is the raw episode score. Gradients are not clipped, as in the paper's code (CleanRL clips its
one network's at 0.5; --max-grad-norm 0.5 clips both networks' together). Where this follows CleanRL rather than the
paper's code: the value loss is clipped (--clip-vloss), and one Adam optimiser serves both phases (the paper's code
gives the auxiliary phase an Adam of its own).

Action space: Discrete(15). Environments: envpool's Procgen games (StarpilotEasy-v0, BigfishEasy-v0 ...). Autoreset is
NEXT_STEP: autoreset steps leave every batch and the auxiliary losses; the true final observation bootstraps a
truncation. envpool cannot be saved: a resumed run starts fresh episodes (seeded with seed + global_step). Nor is the
auxiliary buffer saved (6.4 GB at the defaults): the first auxiliary phase after a resume distils only the rollouts
collected since the resume, and the phases keep their schedule (every --n-iteration iterations of the whole run).

    uv run --extra envpool python cleanrl/ppg_procgen.py --env-id StarpilotEasy-v0 --total-timesteps 25000000

Expect StarpilotEasy ~35 after 25M steps (CleanRL: 34.82 +- 13.77); results in benchmark/results/ppg_procgen.md.
"""

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model
from cleanrl_utils.envs.procgen import check_env_id, make_envs
from cleanrl_utils.errors import available_memory, check_fits, check_positive, fail
from cleanrl_utils.run import Run

OBS_SHAPE, N_ACTIONS = (3, 64, 64), 15  # Procgen's observations and actions


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
    """toggle learning rate annealing"""
    gamma: float = 0.999
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    adv_norm_fullbatch: bool = True
    """normalise advantages over the whole batch (PPG's code); off: per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float | None = None
    """clip the norm of both networks' gradients together to this (None: no clipping, as in the PPG paper's code)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""
    amp: bool = False
    """if toggled, run the networks in bf16 autocast (parameters and storage stay float32)"""

    # PPG specific arguments
    n_iteration: int = 32
    """N_pi: policy-phase iterations between auxiliary phases"""
    e_policy: int = 1
    """E_pi: epochs of the policy per policy-phase iteration"""
    v_value: int = 1
    """E_V: epochs of the value network per policy-phase iteration"""
    e_auxiliary: int = 6
    """E_aux: epochs over the auxiliary buffer per auxiliary phase"""
    beta_clone: float = 1.0
    """the weight of the KL (behaviour cloning) term of the auxiliary phase"""
    num_aux_rollouts: int = 4
    """whole env rollouts per auxiliary minibatch"""
    n_aux_grad_accum: int = 1
    """auxiliary minibatches whose gradients are accumulated per step (less memory, same update)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""
    aux_batch_rollouts: int = 0
    """env rollouts held by the auxiliary buffer: num_envs x n_iteration (computed in runtime)"""


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "learning_rate", "n_iteration")
    positive += ("e_auxiliary", "num_aux_rollouts", "n_aux_grad_accum", "eval_episodes", "torch_threads")
    check_positive(**{name: getattr(args, name) for name in positive})
    if min(args.checkpoint_every, args.num_levels, args.start_level, args.e_policy, args.v_value, args.beta_clone) < 0:
        fail(
            "--checkpoint-every, --num-levels, --start-level, --e-policy, --v-value, --beta-clone must not be negative"
        )
    if args.max_grad_norm is not None:
        check_positive(max_grad_norm=args.max_grad_norm)
    if args.e_policy + args.v_value == 0:
        fail("--e-policy and --v-value are both 0: the policy phase would learn nothing")
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
    args.aux_batch_rollouts = args.num_envs * args.n_iteration
    if args.num_aux_rollouts > args.aux_batch_rollouts:
        fail(f"--num-aux-rollouts {args.num_aux_rollouts} exceeds the {args.aux_batch_rollouts} rollouts of a phase")
    check_env_id(args.env_id)
    check_fits(aux_nbytes(args), "cpu", "auxiliary buffer", "--n-iteration")


def normed_init(layer: nn.Module, scale: float) -> nn.Module:
    """The PPG code's NormedLinear / NormedConv2d: PyTorch's default weights rescaled so that each output unit's weight
    vector has norm `scale`; biases zero."""
    with torch.no_grad():
        fan_in_dims = tuple(range(1, layer.weight.dim()))
        layer.weight.mul_(scale / torch.linalg.vector_norm(layer.weight, dim=fan_in_dims, keepdim=True))
        layer.bias.zero_()
    return layer


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions around ReLUs, added to the input; each convolution's weight norm is sqrt(scale)."""

    def __init__(self, channels: int, scale: float):
        super().__init__()
        self.conv0 = normed_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), np.sqrt(scale))
        self.conv1 = normed_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), np.sqrt(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    """A 3x3 convolution (weight norm 1), a 3x3 max-pool of stride 2 (halving height and width), two residual blocks
    that share the sequence's `scale` (scale / sqrt(2) each)."""

    def __init__(self, in_channels: int, out_channels: int, scale: float):
        super().__init__()
        self.conv = normed_init(nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1), 1.0)
        self.res_block0 = ResidualBlock(out_channels, scale / np.sqrt(2))
        self.res_block1 = ResidualBlock(out_channels, scale / np.sqrt(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(self.conv(x), kernel_size=3, stride=2, padding=1)
        return self.res_block1(self.res_block0(x))


def impala_cnn(obs_shape: tuple, channels: tuple = (16, 32, 32), hidden: int = 256) -> nn.Sequential:
    """The IMPALA CNN (Espeholt et al. 2018) initialised as the PPG code's ImpalaCNN: each conv sequence's residual
    blocks share a scale of 1 / sqrt(number of sequences), the dense layer's weight norm is 1.4."""
    c, h, w = obs_shape
    layers = []
    for out_channels in channels:
        layers.append(ConvSequence(c, out_channels, scale=1 / np.sqrt(len(channels))))
        c, h, w = out_channels, (h + 1) // 2, (w + 1) // 2
    dense = normed_init(nn.Linear(c * h * w, hidden), 1.4)
    return nn.Sequential(*layers, nn.Flatten(), nn.ReLU(), dense, nn.ReLU())


def pixels(obs: torch.Tensor) -> torch.Tensor:
    """uint8 frames [N, C, H, W] as floats in [0, 1], stored channels-last."""
    # Channels-last (NHWC) pixels make every convolution and pooling after them run in that layout: on one CPU
    # thread the IMPALA CNN's forward + backward on 512 frames takes 2.5 s instead of 4.3 s and a 64-frame
    # forward 72 ms instead of 154 ms (side by side, 2026-12-03; a GPU: not measured); the values agree to 5e-8.
    return (obs.float() / 255.0).contiguous(memory_format=torch.channels_last)


class PolicyNetwork(nn.Module):
    """The policy on its own IMPALA CNN, with the auxiliary value head that the auxiliary phase trains; takes uint8
    observations. The heads' outputs are cast to float32 (a no-op without --amp): under bf16 autocast the log-softmax
    and the losses are then float32 all the same."""

    def __init__(self, obs_shape: tuple, n_actions: int):
        super().__init__()
        self.network = impala_cnn(obs_shape)
        self.actor = normed_init(nn.Linear(256, n_actions), 0.1)
        self.aux_critic = normed_init(nn.Linear(256, 1), 0.1)

    def log_probs(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.actor(self.network(pixels(obs))).float(), dim=-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action and its log-probability."""
        log_probs = self.log_probs(obs)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of `actions` and the policy's entropy."""
        log_probs = self.log_probs(obs)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy

    def log_probs_and_aux_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.network(pixels(obs))
        return torch.log_softmax(self.actor(hidden).float(), dim=-1), self.aux_critic(hidden).float().squeeze(-1)


class ValueNetwork(nn.Module):
    """The value function on an IMPALA CNN of its own; takes uint8 observations, returns float32 values (cast back
    under --amp's bf16 autocast)."""

    def __init__(self, obs_shape: tuple):
        super().__init__()
        self.network = impala_cnn(obs_shape)
        self.critic = normed_init(nn.Linear(256, 1), 0.1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.network(pixels(obs))).float().squeeze(-1)


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


class AuxBuffer:
    """The rollouts of one policy phase, whole env rollouts side by side: [num_steps, num_envs x n_iteration] uint8
    observations, value targets and transition flags (False on autoreset steps), on the training device where they fit
    (else on the host)."""

    def __init__(self, num_steps: int, rollouts: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, rollouts) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.returns = torch.zeros((num_steps, rollouts), device=device)
        self.valid = torch.zeros((num_steps, rollouts), dtype=torch.bool, device=device)
        self.size = 0  # rollouts held

    def add(self, obs: torch.Tensor, returns: torch.Tensor, valid: torch.Tensor) -> None:
        columns = slice(self.size, self.size + obs.shape[1])
        self.obs[:, columns], self.returns[:, columns], self.valid[:, columns] = obs, returns, valid
        self.size += obs.shape[1]


def aux_nbytes(args: Args) -> int:
    """Bytes of the auxiliary buffer: built on the "meta" device it has the real one's shapes and dtypes, no memory."""
    meta = AuxBuffer(args.num_steps, args.aux_batch_rollouts, OBS_SHAPE, torch.device("meta"))
    return sum(t.nbytes for t in vars(meta).values() if isinstance(t, torch.Tensor))


def auxiliary_phase(
    policy: PolicyNetwork,
    value_net: ValueNetwork,
    optimizer: torch.optim.Optimizer,
    obs: torch.Tensor,
    returns: torch.Tensor,
    valid: torch.Tensor,
    epochs: int,
    num_aux_rollouts: int,
    beta_clone: float,
    max_grad_norm: float | None,
    n_aux_grad_accum: int = 1,
    amp: bool = False,
) -> dict[str, torch.Tensor]:
    """PPG's auxiliary phase over whole rollouts `obs` [T, R, C, H, W] with value targets `returns` [T, R]; only the
    steps where `valid` is True count. Per minibatch of `num_aux_rollouts` rollouts: the auxiliary value head's squared
    error + beta_clone * KL(policy before the phase || policy now) on the policy network, and the value network's
    squared error; both networks' gradients clipped together to `max_grad_norm` when it is given; `amp`: the forward
    passes in bf16 autocast. Returns the last minibatch's losses."""
    device = next(policy.parameters()).device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)
    num_steps, rollouts = returns.shape
    with torch.no_grad(), autocast:  # the policy before the phase, which the KL term holds on to
        old_log_probs = torch.cat(
            [
                policy.log_probs(obs[:, cols].to(device).flatten(0, 1)).view(num_steps, len(cols), -1)
                for cols in torch.split(torch.arange(rollouts), num_aux_rollouts)
            ],
            dim=1,
        )
    optimizer.zero_grad()
    for _ in range(epochs):
        minibatches = torch.split(torch.randperm(rollouts), num_aux_rollouts)
        for i, cols in enumerate(minibatches):
            mb_valid = valid[:, cols].to(device).flatten(0, 1)
            mb_obs = obs[:, cols].to(device).flatten(0, 1)[mb_valid]
            mb_returns = returns[:, cols].to(device).flatten(0, 1)[mb_valid]
            mb_old = old_log_probs[:, cols.to(device)].flatten(0, 1)[mb_valid]
            with autocast:
                log_probs, aux_values = policy.log_probs_and_aux_value(mb_obs)
                values = value_net(mb_obs)
            kl_loss = (mb_old.exp() * (mb_old - log_probs)).sum(-1).mean()
            aux_value_loss = 0.5 * ((aux_values - mb_returns) ** 2).mean()
            real_value_loss = 0.5 * ((values - mb_returns) ** 2).mean()
            loss = aux_value_loss + beta_clone * kl_loss + real_value_loss
            (loss / n_aux_grad_accum).backward()
            if (i + 1) % n_aux_grad_accum == 0 or i + 1 == len(minibatches):
                if max_grad_norm is not None:
                    nn.utils.clip_grad_norm_([*policy.parameters(), *value_net.parameters()], max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
    return {
        "losses/aux/kl_loss": kl_loss,
        "losses/aux/aux_value_loss": aux_value_loss,
        "losses/aux/real_value_loss": real_value_loss,
    }


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the scores of its (sampled) policy: the first episode of each
    of `eval_episodes` environments (waiting for every one, so long episodes count as much as short ones)."""
    model = load_model(model_path, __file__)
    levels = dict(num_levels=model["args"]["num_levels"], start_level=model["args"]["start_level"])
    envs = make_envs(model["env_id"], eval_episodes, seed, capture_video, video_dir, **levels)
    policy = PolicyNetwork(model["obs_shape"], model["n_actions"]).to(device)
    policy.load_state_dict(model["policy"])
    obs, _ = envs.reset()
    scores = np.full(eval_episodes, np.nan)
    with torch.no_grad():
        while np.isnan(scores).any():
            actions, _ = policy.act(torch.as_tensor(obs, device=device))
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

    policy = PolicyNetwork(obs_shape, n_actions).to(device)
    value_net = ValueNetwork(obs_shape).to(device)
    optimizer = torch.optim.Adam([*policy.parameters(), *value_net.parameters()], lr=args.learning_rate, eps=1e-8)
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_shape, device)
    aux_device = device if available_memory(device) > 1.25 * aux_nbytes(args) else torch.device("cpu")
    aux_buffer = AuxBuffer(args.num_steps, args.aux_batch_rollouts, obs_shape, aux_device)
    # --amp: the networks' forward passes in bf16 autocast, which needs no loss scaling (its exponent range is
    # float32's); parameters, optimiser state, the rollout, GAE and the auxiliary buffer stay float32.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    iteration = global_step // args.batch_size
    next_obs_np, _ = envs.reset()
    resets = np.zeros(args.num_envs, dtype=bool)  # envs whose next step is an autoreset (their episode just ended)
    if run.checkpoint:
        policy.load_state_dict(run.checkpoint["policy"])
        value_net.load_state_dict(run.checkpoint["value_net"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        reward_scaler.load_state_dict(run.checkpoint["reward_scaler"])
        print(
            "envpool's environments and the auxiliary buffer are not saved with a checkpoint: resuming with fresh "
            "episodes; the next auxiliary phase distils the rollouts collected from here",
            flush=True,
        )
    next_obs = torch.from_numpy(next_obs_np).to(device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            policy=policy.state_dict(),
            value_net=value_net.state_dict(),
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
                    action, storage.logprobs[step] = policy.act(next_obs)
                    storage.values[step] = value_net(next_obs)
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
                next_value = value_net(next_obs)
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
            if args.adv_norm_fullbatch:
                real = b_advantages[transitions]
                b_advantages = (b_advantages - real.mean()) / (real.std() + 1e-8)

        # 3. Policy phase: PPO's clipped objective on the policy network, the value loss on the value network
        clipped, updates = torch.zeros((), device=device), 0
        pg_loss = entropy_loss = v_loss = old_approx_kl = approx_kl = torch.full((), torch.nan, device=device)
        for epoch in range(max(args.e_policy, args.v_value)):
            b_inds = transitions[torch.randperm(len(transitions), device=device)]
            for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                loss = torch.zeros((), device=device)
                if epoch < args.e_policy:
                    with autocast:
                        newlogprob, entropy = policy.evaluate_actions(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipped += ((ratio - 1.0).abs() > args.clip_coef).float().mean()
                        updates += 1
                    mb_advantages = b_advantages[mb_inds]
                    if not args.adv_norm_fullbatch:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                    entropy_loss = entropy.mean()
                    loss = loss + pg_loss - args.ent_coef * entropy_loss
                if epoch < args.v_value:
                    with autocast:
                        newvalue = value_net(b_obs[mb_inds])
                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_delta = torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef)
                        v_loss_clipped = (b_values[mb_inds] + v_delta - b_returns[mb_inds]) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
                    loss = loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                if args.max_grad_norm is not None:
                    nn.utils.clip_grad_norm_([*policy.parameters(), *value_net.parameters()], args.max_grad_norm)
                optimizer.step()

        # 4. Keep the rollout for the auxiliary phase; every --n-iteration iterations, run it
        aux_buffer.add(storage.obs, returns, ~reset_steps)
        aux_losses = {}
        if iteration % args.n_iteration == 0 and aux_buffer.size > 0:
            held = slice(0, aux_buffer.size)
            aux_losses = auxiliary_phase(
                policy, value_net, optimizer,
                aux_buffer.obs[:, held], aux_buffer.returns[:, held], aux_buffer.valid[:, held],
                args.e_auxiliary, args.num_aux_rollouts, args.beta_clone, args.max_grad_norm, args.n_aux_grad_accum,
                args.amp,
            )  # fmt: skip
            aux_buffer.size = 0

        # 5. Log (one device-to-host read per iteration) and checkpoint when due
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
                "losses/clipfrac": clipped / max(updates, 1),
                "losses/explained_variance": explained_var,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                **aux_losses,
            },
        )
        run.end_iteration(global_step)

    envs.close()
    model = dict(
        policy=policy.state_dict(),
        value_net=value_net.state_dict(),
        reward_scaler=reward_scaler.state_dict(),
        obs_shape=obs_shape,
        n_actions=n_actions,
    )
    run.finish(global_step, evaluate, **model)
