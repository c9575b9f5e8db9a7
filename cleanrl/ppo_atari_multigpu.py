"""PPO from pixels (Atari, MinAtar), data-parallel over processes and machines with torch.distributed.

ppo_atari.py's algorithm and settings under torchrun: one rank per GPU (NCCL), or per CPU process (gloo). Each rank
steps its own `--local-num-envs` games (seeds seed + rank x local_num_envs + i: none shared), starts from rank 0's
parameters and averages every minibatch's gradients over all ranks before clipping, so all ranks hold the same
parameters. Advantages are normalised over the whole minibatch of all ranks; --target-kl reads the approx KL averaged
over ranks, and a SIGTERM to any rank stops all of them at the same iteration, after a checkpoint. Rank 0 alone logs
(every rank's games) and writes checkpoints (each rank's games and RNGs) and the model; every rank reads --resume's
file (a shared filesystem across machines), with the same number of ranks. The global RANK decides; LOCAL_RANK only
picks the GPU. Without torchrun, `python cleanrl/ppo_atari_multigpu.py` is a run of one rank.

    uv run torchrun --standalone --nproc-per-node 8 cleanrl/ppo_atari_multigpu.py --env-id BreakoutNoFrameskip-v4
    # several machines: this on each of them, HOST one of them (reachable from all)
    RDZV="--rdzv-backend c10d --rdzv-endpoint $HOST:29400 --rdzv-id run1"
    uv run torchrun --nnodes 2 --nproc-per-node 8 $RDZV cleanrl/ppo_atari_multigpu.py --env-id BreakoutNoFrameskip-v4

Expect ppo_atari.py's returns at the same total steps (Breakout ~415 after 10M, CleanRL's figure).
"""

import atexit
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, restore_rng_state, rng_state, snapshot_envs
from cleanrl_utils.envs.atari import check_env_id, make_envs
from cleanrl_utils.errors import check_positive, fail
from cleanrl_utils.run import Run, seed_everything


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use one GPU per rank when GPUs are present (the CPU and gloo otherwise)"""
    torch_threads: int = 1
    """CPU threads for torch, per rank"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """if toggled, record videos of the agent (rank 0's first environment) into the run directory"""
    save_model: bool = False
    """if toggled, save the model at the end (rank 0) and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps of all ranks together (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment (Atari or MinAtar)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiment, all ranks together"""

    # Algorithm specific arguments
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    local_num_envs: int = 8
    """the number of parallel game environments of each rank"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each rank's share of a minibatch is 1 / world size of it)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization (over the whole minibatch, all ranks)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping (of the gradient averaged over ranks)"""
    target_kl: float | None = None
    """the target KL divergence threshold, for the approx KL averaged over ranks (None: no early stop)"""
    eval_episodes: int = 10
    """the number of games to evaluate the saved model for"""

    # to be filled in runtime
    world_size: int = 0
    """the number of ranks (computed in runtime: torchrun's WORLD_SIZE, 1 without torchrun)"""
    num_envs: int = 0
    """the number of environments of all ranks together (computed in runtime)"""
    local_batch_size: int = 0
    """the batch size of each rank (computed in runtime)"""
    batch_size: int = 0
    """the batch size of all ranks together (computed in runtime)"""
    local_minibatch_size: int = 0
    """each rank's share of a mini-batch (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size of all ranks together (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def validate(args: Args, world_size: int, local_world_size: int) -> None:
    """Check the arguments, the environment and the GPUs before any work; fail in one line."""
    positive = ("total_timesteps", "local_num_envs", "num_steps", "num_minibatches", "update_epochs", "learning_rate")
    check_positive(**{name: getattr(args, name) for name in positive + ("eval_episodes", "torch_threads")})
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    args.world_size = world_size
    args.num_envs = args.local_num_envs * world_size
    args.local_batch_size = args.local_num_envs * args.num_steps
    if args.local_batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide each rank's batch of {args.local_batch_size} "
            f"(--local-num-envs {args.local_num_envs} x --num-steps {args.num_steps})"
        )
    args.batch_size = args.local_batch_size * world_size
    args.local_minibatch_size = args.local_batch_size // args.num_minibatches
    args.minibatch_size = args.local_minibatch_size * world_size
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations == 0:
        fail(
            f"--total-timesteps {args.total_timesteps} is less than one batch of {args.batch_size} steps "
            f"({world_size} ranks x {args.local_batch_size})"
        )
    gpus = torch.cuda.device_count() if args.cuda and torch.cuda.is_available() else 0
    if gpus and local_world_size > gpus:
        fail(
            f"--cuda: {local_world_size} ranks on this machine but {gpus} GPUs; start torchrun with "
            f"--nproc-per-node {gpus}, or add --no-cuda to train on the CPU with gloo"
        )
    check_env_id(args.env_id, "cleanrl/ppo.py")


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Actor and critic heads on one torso: the Nature CNN on 84x84 frames (Mnih et al. 2015); on MinAtar's 10x10 grids
    the MinAtar paper's network (Young & Tian 2019): one 3x3 convolution of 16 channels, then 128 units. Takes uint8
    observations."""

    def __init__(self, obs_shape: tuple, n_actions: int, obs_high: float):
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
        self.actor = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(hidden, 1), std=1.0)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.network(obs.float() * self.scale)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, its log-probability and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden), dim=-1)
        # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
        action = torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.critic(hidden).squeeze(-1)

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Log-probabilities of `actions`, the policy's entropy and the value, from one pass of the torso."""
        hidden = self.features(obs)
        log_probs = torch.log_softmax(self.actor(hidden), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        log_prob = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return log_prob, entropy, self.critic(hidden).squeeze(-1)


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` steps on the device: uint8 observations, actions, their log-probabilities
    and values; rewards, episode ends and autoreset flags are staged on the host and moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs) + tuple(obs_shape), dtype=torch.uint8, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_steps, num_envs), device=device)
        self.values = torch.zeros((num_steps, num_envs), device=device)
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


class Batch(NamedTuple):
    """A rollout flattened to [batch_size, ...], one named tensor per field."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor

    def take(self, rows: torch.Tensor | slice) -> "Batch":
        return Batch(*(field[rows] for field in self))


def average_gradients(agent: Agent) -> None:
    """Replace every gradient by its mean over the ranks: one all-reduce of one flat buffer."""
    grads = [p.grad for p in agent.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for grad, mean in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        grad.copy_(mean.view_as(grad))


def global_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and (unbiased) standard deviation of the elements of `x` on all ranks together: one all-reduce of
    their count, sum and sum of squares (in float64, so that the variance loses nothing to cancellation)."""
    x64 = x.double()
    moments = torch.stack([x64.new_tensor(x.numel()), x64.sum(), x64.square().sum()])
    dist.all_reduce(moments)
    count, total, squares = moments
    mean = total / count
    var = (squares - count * mean * mean) / (count - 1)
    return mean.to(x.dtype), var.clamp_min(0).sqrt().to(x.dtype)


def kl_says_stop(approx_kl: torch.Tensor, target_kl: float) -> bool:
    """The early stop, decided on the approx KL averaged over the ranks, so that all of them stop in this epoch or
    none does (a rank stopping alone would leave the others waiting in their next all-reduce): one all-reduce and one
    host read per epoch, only when --target-kl is set."""
    mean_kl = approx_kl.clone()
    dist.all_reduce(mean_kl)
    return mean_kl.item() / dist.get_world_size() > target_kl


def update_minibatch(agent: Agent, optimizer: torch.optim.Optimizer, mb: Batch, args: Args) -> dict[str, torch.Tensor]:
    """One gradient step of the clipped PPO loss on this rank's share `mb` of the minibatch, with the gradient
    averaged over all ranks before it is clipped. Returns this rank's losses and statistics, detached."""
    newlogprob, entropy, newvalue = agent.evaluate_actions(mb.obs, mb.actions)
    logratio = newlogprob - mb.logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    mb_advantages = mb.advantages
    if args.norm_adv:  # with the statistics of the whole minibatch, all ranks: as one process with all the envs
        mean, std = global_mean_std(mb_advantages)
        mb_advantages = (mb_advantages - mean) / (std + 1e-8)

    # Policy loss
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb.returns) ** 2
        v_delta = torch.clamp(newvalue - mb.values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (mb.values + v_delta - mb.returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb.returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

    optimizer.zero_grad()
    loss.backward()
    average_gradients(agent)  # before clipping: every rank clips the same mean gradient, and steps the same way
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return dict(
        value_loss=v_loss.detach(),
        policy_loss=pg_loss.detach(),
        entropy=entropy_loss.detach(),
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the game scores of its (sampled) policy (one process)."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_shape"], model["n_actions"], model["obs_high"]).to(device)
    agent.load_state_dict(model["agent"])
    obs, _ = envs.reset(seed=seed)
    game_scores = []
    with torch.no_grad():
        while len(game_scores) < eval_episodes:
            actions, _, _ = agent.act(torch.as_tensor(obs, device=device))
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
            if "episode" in infos:
                game_scores += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return game_scores[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    # torchrun sets these (without it, this is a run of one rank). The global RANK decides everything a rank does;
    # LOCAL_RANK, its rank on this machine, only picks its GPU.
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world_size = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    validate(args, world_size, local_world_size)
    use_cuda = args.cuda and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)  # run.device ("cuda") is then this rank's GPU
    backend = "nccl" if use_cuda else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)  # torchrun's rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    # Left at every exit, the SystemExit after a SIGTERM's checkpoint too: a gloo group still alive when the
    # interpreter exits can abort the process ("terminate called without an active exception").
    atexit.register(dist.destroy_process_group)
    run = Run(args, __file__, writes=rank == 0)  # seeds, picks the device, checks --resume; rank 0: the run directory
    seed_everything(args.seed + rank, args.torch_deterministic)  # each rank draws its own actions and minibatches
    device = run.device
    video_dir = run.dir / "videos" if rank == 0 else None
    envs = make_envs(args.env_id, args.local_num_envs, args.capture_video and rank == 0, video_dir)
    obs_shape = envs.single_observation_space.shape
    obs_high = float(envs.single_observation_space.high.max())
    n_actions = int(envs.single_action_space.n)

    agent = Agent(obs_shape, n_actions, obs_high).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    storage = RolloutStorage(args.num_steps, args.local_num_envs, obs_shape, device)

    global_step, iteration = 0, 0
    # game i of this rank gets seed + rank x local_num_envs + i (both vector envs seed consecutive values from an
    # int; ale-py's takes no list): no two games of the run alike
    next_obs_np, _ = envs.reset(seed=args.seed + rank * args.local_num_envs)
    resets = np.zeros(args.local_num_envs, dtype=bool)  # envs whose next step is an autoreset (their game just ended)
    if run.checkpoint:  # every rank reads rank 0's checkpoint: the networks, and its own games
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        own = run.checkpoint["ranks"][rank]
        envs, next_obs_np = restore_envs(envs, own["envs"], next_obs_np)
        if own["envs"] is not None:
            resets = own["resets"]
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = torch.from_numpy(next_obs_np).to(device)
    for tensor in agent.state_dict().values():
        dist.broadcast(tensor, src=0)  # all ranks start from rank 0's parameters

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these. Every rank calls it (it is a collective):
        rank 0 gathers each rank's games, autoreset flags and random generators into `ranks`."""
        own = dict(envs=snapshot_envs(envs, next_obs_np), resets=resets, rng=rng_state())
        ranks = [None] * world_size if rank == 0 else None
        dist.gather_object(own, ranks, dst=0)
        return dict(agent=agent.state_dict(), optimizer=optimizer.state_dict(), ranks=ranks, global_step=global_step)

    run.begin(training_state)
    if run.checkpoint:
        restore_rng_state(run.checkpoint["ranks"][rank]["rng"])  # run.begin restored rank 0's
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout on this rank: one host-to-device copy of the observations and one device-to-host
        # copy of the actions per step; rewards and episode ends are moved once per rollout.
        games = []  # (global step, game score, length) of the games this rank finished in this rollout
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs  # the steps of all ranks
                storage.obs[step] = next_obs
                action, storage.logprobs[step], storage.values[step] = agent.act(next_obs)
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.from_numpy(next_obs_np).to(device)
                # Learning sees rewards clipped to their sign, and a lost life ends its episode (the DQN paper's).
                storage.rewards[step] = np.sign(reward)
                storage.terminations[step] = terminated | infos["life_loss"]
                storage.truncations[step] = truncated
                storage.resets[step] = resets
                resets = terminated | truncated  # NEXT_STEP autoreset: these envs' next step starts a new game
                if "episode" in infos:
                    ended = infos["_episode"]
                    scores, lengths = infos["episode"]["r"][ended].tolist(), infos["episode"]["l"][ended].tolist()
                    games += [(global_step, score, length) for score, length in zip(scores, lengths)]

            # 2. Advantages. Under NEXT_STEP autoreset the observation after a game's last step is its true final
            # one (the autoreset step acts on it), so values[t + 1] bootstraps a truncation as it should.
            rewards, terminated, truncated, reset_steps = storage.on_device()
            next_values = torch.cat([storage.values[1:], agent.get_value(next_obs).unsqueeze(0)])
            values = storage.values
            advantages = compute_gae(rewards, values, next_values, terminated, truncated, args.gamma, args.gae_lambda)
            returns = advantages + values

            b_obs = storage.obs.reshape((-1,) + tuple(obs_shape))
            b_actions, b_logprobs = storage.actions.reshape(-1), storage.logprobs.reshape(-1)
            batch = Batch(b_obs, b_actions, b_logprobs, advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))
            # The autoreset steps are not transitions (their action was ignored): they leave the batch.
            transitions = torch.nonzero(~reset_steps.reshape(-1)).squeeze(1)

        # 3. Update the policy and value network: every rank takes its share of each minibatch, in step with the others
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = transitions[torch.randperm(len(transitions), device=device)]
            for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                stats = update_minibatch(agent, optimizer, batch.take(mb_inds), args)
                clipped += stats["clipfrac"]

            if args.target_kl is not None and kl_says_stop(stats["approx_kl"], args.target_kl):
                break

        # 4. Agree, in one all-reduce per iteration, on the statistics logged (their means over the ranks) and on
        # whether any rank received SIGTERM/SIGINT, so that all of them checkpoint and stop at the same step. Rank 0
        # gathers every rank's finished games and logs them; then a checkpoint when due.
        y_true, y_pred = batch.returns[transitions], batch.values[transitions]
        var_y = y_true.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (y_true - y_pred).var() / var_y)
        logged = {f"losses/{name}": stats[name] for name in ("value_loss", "policy_loss", "entropy", "old_approx_kl")}
        logged["losses/approx_kl"] = stats["approx_kl"]
        logged["losses/clipfrac"] = clipped / (args.num_minibatches * (epoch + 1))
        logged["losses/explained_variance"] = explained_var
        signalled = torch.tensor(float(bool(run.stop)), device=device)
        means = torch.stack([*logged.values(), signalled])
        dist.all_reduce(means)
        means /= world_size
        stop = means[-1].item() > 0
        all_games = [None] * world_size if rank == 0 else None
        dist.gather_object(games, all_games, dst=0)
        for step, score, length in sorted(sum(all_games or [], [])):
            run.log_episodes(step, returns=[score], lengths=[length])
        run.log(global_step, {**dict(zip(logged, means)), "charts/learning_rate": optimizer.param_groups[0]["lr"]})
        run.end_iteration(global_step, stop=stop)

    envs.close()
    model = dict(agent=agent.state_dict(), obs_shape=obs_shape, n_actions=n_actions, obs_high=obs_high)
    run.finish(global_step, evaluate, **model)
