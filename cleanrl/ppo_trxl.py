"""Proximal Policy Optimization with a Transformer-XL memory (PPO-TrXL).

Pleines et al. 2023, "Memory Gym: Towards Endless Tasks to Benchmark Memory Capabilities of Agents"
(https://arxiv.org/abs/2309.17207), after CleanRL's cleanrl/ppo_trxl/ppo_trxl.py. Each env keeps an episodic memory:
the inputs of every transformer layer at its past steps. A step attends (one query: the current step) over a sliding
window of the last `trxl_memory_length` of them; slots before the episode's start are masked (and zeroed). A sinusoidal
encoding of each slot's step within the episode is added to it. Memories are cached: the update reuses the rollout's
and recomputes only the current step, so a sample is one observation plus its window, and minibatches are drawn over
single steps. --trxl-memory-length 0 attends to nothing: the same network with no memory (the benchmark's baseline).

Action space: Discrete. Environments: ProofofMemory-v0 (cleanrl_utils/envs/proof_of_memory.py), memory-gym's grid tasks
(MortarMayhem-Grid-v0, MysteryPath-Grid-v0, 84x84 RGB) and MiniGrid's Memory (MiniGrid-MemoryS9-v0: a 3x3 view drawn
84x84, cut at 96 steps as CleanRL's). Truncations bootstrap from the true final observation, in its episode's memory.
Where ours differs from CleanRL's: a masked slot's attention weight is exactly 0 and a step with no past attends to
nothing (CleanRL's spreads it evenly over zeros and their positional codes), the window holds the last L steps
(CleanRL's L - 1), attention scales by the head's width and heads have their own projections; no observation
reconstruction loss, no learned positional encoding, no multi-discrete actions. Memory-gym's games do not pickle: a
resumed run on them starts fresh episodes (ProofofMemory-v0 and MiniGrid resume exactly on the CPU).

    uv run --all-extras python cleanrl/ppo_trxl.py --env-id MortarMayhem-Grid-v0

Expect ProofofMemory-v0 ~1.2 within 100k steps (benchmark/ppo_trxl.sh); CleanRL reports MortarMayhem-Grid-v0 0.99.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
    env_id: str = "MortarMayhem-Grid-v0"
    """the id of the environment (ProofofMemory-v0, memory-gym, MiniGrid Memory)"""
    total_timesteps: int = 200000000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    init_lr: float = 2.75e-4
    """the initial learning rate of the optimizer"""
    final_lr: float = 1.0e-5
    """the learning rate after annealing"""
    num_envs: int = 32
    """the number of parallel game environments"""
    num_steps: int = 512
    """the number of steps to run in each environment per policy rollout"""
    anneal_steps: int = 32 * 512 * 10000
    """the environment steps over which the learning rate and the entropy coefficient anneal linearly (0: never)"""
    gamma: float = 0.995
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    update_epochs: int = 3
    """the K epochs to update the policy"""
    norm_adv: bool = False
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    init_ent_coef: float = 1e-4
    """the initial coefficient of the entropy bonus"""
    final_ent_coef: float = 1e-6
    """the coefficient of the entropy bonus after annealing"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.25
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (None: no early stop)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""

    # Transformer-XL specific arguments
    trxl_num_layers: int = 3
    """the number of transformer layers"""
    trxl_num_heads: int = 4
    """the number of attention heads"""
    trxl_dim: int = 384
    """the width of the transformer (its embeddings and every layer's input)"""
    trxl_memory_length: int = 119
    """how many past steps of the current episode a step attends to (0: none, a memoryless agent)"""
    trxl_positional_encoding: Literal["absolute", "none"] = "absolute"
    """the positional encoding added to the memory: sinusoids of each slot's step in the episode, or none"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def register_envs(env_id: str) -> None:
    """Register the families this script runs (imports only the one `env_id` needs: memory-gym pulls in pygame)."""
    import cleanrl_utils.envs.proof_of_memory  # noqa: F401  (registers ProofofMemory-v0)

    if env_id.startswith("MiniGrid"):
        import minigrid  # noqa: F401
    elif env_id not in gym.registry:
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        import memory_gym  # noqa: F401


def validate(args: Args) -> None:
    """Check the arguments and the environment before any work; fail in one line."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "init_lr")
    positive += ("eval_episodes", "torch_threads", "trxl_num_layers", "trxl_num_heads", "trxl_dim")
    check_positive(**{name: getattr(args, name) for name in positive})
    if args.checkpoint_every < 0 or args.anneal_steps < 0 or args.trxl_memory_length < 0:
        fail("--checkpoint-every, --anneal-steps and --trxl-memory-length must be 0 or positive")
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        fail(f"--gamma must be in (0, 1] and --gae-lambda in [0, 1], got {args.gamma} and {args.gae_lambda}")
    if args.trxl_dim % args.trxl_num_heads != 0:
        fail(f"--trxl-num-heads {args.trxl_num_heads} does not divide --trxl-dim {args.trxl_dim}")
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
    register_envs(args.env_id)
    check_env_id(args.env_id)
    probe = make_env(args.env_id, 0, False, None)()
    action_space, observation_space = probe.action_space, probe.observation_space
    probe.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(f"ppo_trxl.py handles Discrete actions, {args.env_id} has {action_space}")
    shape = getattr(observation_space, "shape", None)
    if not isinstance(observation_space, gym.spaces.Box) or not (len(shape) == 1 or shape == (84, 84, 3)):
        fail(f"ppo_trxl.py needs flat or 84x84x3 Box observations, {args.env_id} has {observation_space}")


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        render_mode = "rgb_array" if capture_video and idx == 0 else None
        if env_id.startswith("MiniGrid"):  # CleanRL's view of MiniGrid Memory: 3x3 cells drawn 84x84, cut at 96 steps
            from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper

            env = gym.make(env_id, agent_view_size=3, tile_size=28, render_mode=render_mode, max_steps=96)
            env = ImgObsWrapper(RGBImgPartialObsWrapper(env, tile_size=28))
        else:
            env = gym.make(env_id, render_mode=render_mode, disable_env_checker=True)
        if render_mode is not None:
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    # SAME_STEP: an env that ends an episode resets at once and returns the true final observation in
    # infos["final_obs"]; the memory of the new episode starts empty from the next step on.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def positional_encoding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoids of integer positions [...] -> [..., dim] (Vaswani et al. 2017): sin in the first half, cos in the
    second, at frequencies 10000^(-2i / dim)."""
    inv_freqs = 10000.0 ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.unsqueeze(-1).float() * inv_freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class TransformerLayer(nn.Module):
    """One Transformer-XL block with pre-layer normalisation (Parisotto et al. 2020): the current step's embedding
    attends over the window of memories (the layer's inputs at past steps), then a ReLU projection; both residual."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.norm_query, self.norm_memory, self.norm_out = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.projection = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, dim], memory [B, W, dim], mask [B, W] (True: a past step of this episode) -> [B, dim]."""
        batch, window = memory.shape[:2]
        memory = self.norm_memory(memory)
        query = self.query(self.norm_query(x)).view(batch, self.num_heads, self.head_dim)
        keys = self.key(memory).view(batch, window, self.num_heads, self.head_dim)
        values = self.value(memory).view(batch, window, self.num_heads, self.head_dim)
        scores = torch.einsum("bhd,bwhd->bhw", query, keys) / self.head_dim**0.5
        # A masked slot's weight is exactly 0, and a step with no past attends to nothing (all its weights 0).
        weights = torch.softmax(scores.masked_fill(~mask[:, None], -1e9), dim=-1) * mask[:, None]
        attended = torch.einsum("bhw,bwhd->bhd", weights, values).reshape(batch, -1)
        x = x + self.out(attended)
        return x + self.projection(self.norm_out(x))


class Agent(nn.Module):
    """An encoder (the Nature CNN for 84x84x3 uint8 frames, a linear layer for flat observations), Transformer-XL
    layers over the episodic memory, a ReLU layer, then the actor and critic heads."""

    def __init__(self, obs_shape: tuple, n_actions: int, args: Args):
        super().__init__()
        dim = args.trxl_dim
        if len(obs_shape) == 3:
            self.encoder = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[-1], 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, dim)),
                nn.ReLU(),
            )
        else:
            self.encoder = layer_init(nn.Linear(obs_shape[0], dim))
        self.layers = nn.ModuleList([TransformerLayer(dim, args.trxl_num_heads) for _ in range(args.trxl_num_layers)])
        self.positional = args.trxl_positional_encoding == "absolute"
        self.post = nn.Sequential(layer_init(nn.Linear(dim, dim)), nn.ReLU())
        self.actor = layer_init(nn.Linear(dim, n_actions), std=0.1)
        self.critic = layer_init(nn.Linear(dim, 1), std=1.0)

    def forward(self, obs, window, mask, positions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [B, ...], the memory window [B, W, layers, dim] with its mask and episode steps [B, W] -> action
        log-probabilities [B, n_actions], values [B] and this step's memories (every layer's input) [B, layers, dim]."""
        if obs.dim() == 4:
            x = self.encoder(obs.permute(0, 3, 1, 2).float() / 255.0)
        else:
            x = self.encoder(obs)
        if self.positional:
            window = window + positional_encoding(positions, window.shape[-1]).unsqueeze(2)
        hidden = []
        for i, layer in enumerate(self.layers):
            hidden.append(x.detach())
            x = layer(x, window[:, :, i], mask)
        x = self.post(x)
        return torch.log_softmax(self.actor(x), dim=-1), self.critic(x).squeeze(-1), torch.stack(hidden, 1)


def memory_window(memory: torch.Tensor, episode_step: torch.Tensor, memory_length: int):
    """The window a step attends over. `memory` [N, W, layers, dim] holds each env's last W steps' memories, oldest
    first (W = max(memory_length, 1)); `episode_step` [N] counts the steps already taken in the current episode. Slot
    j holds the step W - j before the current one; it is valid (mask True) when that step is in the current episode
    and within memory_length. Returns the window with invalid slots zeroed, the mask, and each slot's step in the
    episode (0 where invalid)."""
    window_size = memory.shape[1]
    slots = torch.arange(window_size, device=memory.device)
    back = window_size - slots  # how many steps before the current one
    mask = back[None] <= torch.clamp(episode_step, max=memory_length)[:, None]
    positions = torch.clamp(episode_step[:, None] - back[None], min=0)
    return memory * mask[:, :, None, None], mask, positions


def rollout_windows(initial_memory, hidden, episode_steps, env_index, step_index, memory_length):
    """The windows of rollout samples (step_index[k], env_index[k]) rebuilt from the memory the rollout began with
    (initial_memory [N, W, layers, dim]) and the memories it computed (hidden [T, N, layers, dim]): the update's
    windows, equal to those the rollout acted with."""
    window_size = initial_memory.shape[1]
    timeline = torch.cat([initial_memory, hidden.transpose(0, 1)], dim=1)  # [N, W + T, layers, dim]
    slots = step_index[:, None] + torch.arange(window_size, device=hidden.device)[None]
    return memory_window(timeline[env_index[:, None], slots], episode_steps[step_index, env_index], memory_length)


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


def sample(log_probs: torch.Tensor) -> torch.Tensor:
    # Gumbel-max trick: argmax(log_probs + Gumbel noise) is a sample of Categorical(logits).
    return torch.argmax(log_probs - torch.log(-torch.log(torch.rand_like(log_probs))), dim=-1)


class RolloutStorage:
    """One rollout on the device: observations (uint8 frames kept as uint8), each step's episode step (its window's
    mask), actions, log-probabilities, values, the memories each step computed, and the memory the rollout began
    with; rewards and episode ends are staged on the host and moved once per rollout."""

    def __init__(self, args: Args, obs_space, window_size: int, device: torch.device):
        steps, envs, shape = args.num_steps, args.num_envs, obs_space.shape
        obs_dtype = torch.uint8 if obs_space.dtype == np.uint8 else torch.float32
        self.obs = torch.zeros((steps, envs) + shape, dtype=obs_dtype, device=device)
        self.episode_steps = torch.zeros((steps, envs), dtype=torch.long, device=device)
        self.actions = torch.zeros((steps, envs), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((steps, envs), device=device)
        self.values = torch.zeros((steps, envs), device=device)
        self.final_values = torch.zeros((steps, envs), device=device)  # of the true final observation where cut
        self.hidden = torch.zeros((steps, envs, args.trxl_num_layers, args.trxl_dim), device=device)
        self.initial_memory = torch.zeros((envs, window_size, args.trxl_num_layers, args.trxl_dim), device=device)
        self.rewards = np.zeros((steps, envs), dtype=np.float32)
        self.terminations = np.zeros((steps, envs), dtype=np.float32)
        self.truncations = np.zeros((steps, envs), dtype=np.float32)
        self.device = device

    def rewards_and_ends(self) -> tuple[torch.Tensor, ...]:
        arrays = (self.rewards, self.terminations, self.truncations)
        return tuple(torch.as_tensor(a, device=self.device) for a in arrays)


def evaluate(model_path, eval_episodes: int, device, seed=0, capture_video=False, video_dir=None) -> list[float]:
    """Reload a model saved by this script and return the episodic returns of its (sampled) policy."""
    model = load_model(model_path, __file__)
    args = Args(**{k: v for k, v in model["args"].items() if k in Args.__dataclass_fields__})
    register_envs(model["env_id"])
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_shape"], model["n_actions"], args).to(device)
    agent.load_state_dict(model["agent"])
    memory = torch.zeros((1, max(args.trxl_memory_length, 1), args.trxl_num_layers, args.trxl_dim), device=device)
    episode_step = torch.zeros(1, dtype=torch.long, device=device)
    obs, _ = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            window, mask, positions = memory_window(memory, episode_step, args.trxl_memory_length)
            log_probs, _, hidden = agent(torch.as_tensor(obs, device=device), window, mask, positions)
            memory = torch.cat([memory[:, 1:], hidden[:, None]], dim=1)
            obs, _, terminated, truncated, infos = envs.step(sample(log_probs).cpu().numpy())
            episode_step = torch.where(torch.as_tensor(terminated | truncated, device=device), 0, episode_step + 1)
            if "episode" in infos:
                episodic_returns += infos["episode"]["r"][infos["_episode"]].tolist()
    envs.close()
    return episodic_returns[:eval_episodes]


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    window_size = max(args.trxl_memory_length, 1)  # memory length 0: one slot, always masked
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    # The rollout's memories and one minibatch of windows are the largest tensors: refuse before allocating them.
    memory_floats = args.trxl_num_layers * args.trxl_dim * (args.batch_size + args.minibatch_size * window_size)
    check_fits(4 * memory_floats, device, "rollout memory and a minibatch of windows", "--num-steps")
    envs = make_envs(args.env_id, args.num_envs, args.capture_video, run.dir / "videos")
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    agent = Agent(obs_shape, n_actions, args).to(device)
    optimizer = torch.optim.AdamW(agent.parameters(), lr=args.init_lr)  # CleanRL's (weight decay 0.01)
    storage = RolloutStorage(args, envs.single_observation_space, window_size, device)

    global_step, iteration = 0, 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    # Each env's memories of its last window_size steps (oldest first) and the steps taken in its current episode.
    memory = torch.zeros((args.num_envs, window_size, args.trxl_num_layers, args.trxl_dim), device=device)
    episode_step = torch.zeros(args.num_envs, dtype=torch.long, device=device)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, next_obs_np = restore_envs(envs, run.checkpoint["envs"], next_obs_np)
        if run.checkpoint["envs"] is not None:  # the same episodes go on, with their memory
            memory, episode_step = run.checkpoint["memory"].to(device), run.checkpoint["episode_step"].to(device)
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = torch.as_tensor(next_obs_np, dtype=storage.obs.dtype, device=device)

    def training_state() -> dict:
        """What a checkpoint holds (written between rollouts); resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, next_obs_np),
            memory=memory,
            episode_step=episode_step,
            global_step=global_step,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        # Anneal the learning rate and the entropy coefficient linearly over --anneal-steps, then hold them.
        frac = max(1.0 - global_step / args.anneal_steps, 0.0) if args.anneal_steps else 1.0
        optimizer.param_groups[0]["lr"] = args.final_lr + (args.init_lr - args.final_lr) * frac
        ent_coef = args.final_ent_coef + (args.init_ent_coef - args.final_ent_coef) * frac

        # 1. Collect a rollout: one host-to-device copy of the observations (and of the episode ends, which the
        # memory needs at once) and one device-to-host copy of the actions per step.
        with torch.no_grad():
            storage.initial_memory = memory  # the update rebuilds every window from here and storage.hidden
            storage.final_values.zero_()
            for step in range(args.num_steps):
                global_step += args.num_envs
                storage.obs[step] = next_obs
                storage.episode_steps[step] = episode_step
                window, mask, positions = memory_window(memory, episode_step, args.trxl_memory_length)
                log_probs, storage.values[step], hidden = agent(next_obs, window, mask, positions)
                action = sample(log_probs)
                storage.actions[step] = action
                storage.logprobs[step] = log_probs.gather(-1, action[:, None]).squeeze(-1)
                storage.hidden[step] = hidden
                memory = torch.cat([memory[:, 1:], hidden[:, None]], dim=1)

                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.as_tensor(next_obs_np, dtype=storage.obs.dtype, device=device)
                storage.rewards[step] = reward
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                # A cut episode is bootstrapped from its true final observation, seen in that episode's memory.
                cut = truncated & ~terminated
                if cut.any():
                    final_obs = torch.as_tensor(np.stack(infos["final_obs"][cut]), dtype=next_obs.dtype, device=device)
                    rows = torch.as_tensor(cut, device=device)
                    window, mask, positions = memory_window(
                        memory[rows], episode_step[rows] + 1, args.trxl_memory_length
                    )
                    storage.final_values[step, rows] = agent(final_obs, window, mask, positions)[1]
                ended = torch.as_tensor(terminated | truncated, device=device)
                episode_step = torch.where(ended, 0, episode_step + 1)  # a new episode attends to nothing before it
                run.log_episodes(global_step, infos)

            # 2. Advantages: next_values[t] is the value of the observation after step t (its true final one where
            # an episode was cut), the last one from the observation after the rollout, in its memory.
            rewards, terminated, truncated = storage.rewards_and_ends()
            window, mask, positions = memory_window(memory, episode_step, args.trxl_memory_length)
            next_values = torch.cat([storage.values[1:], agent(next_obs, window, mask, positions)[1][None]])
            next_values = torch.where(truncated > 0, storage.final_values, next_values)
            values = storage.values
            advantages = compute_gae(rewards, values, next_values, terminated, truncated, args.gamma, args.gae_lambda)
            returns = advantages + values
            b_logprobs, b_advantages, b_returns = (x.reshape(-1) for x in (storage.logprobs, advantages, returns))
            b_values, b_actions = values.reshape(-1), storage.actions.reshape(-1)
            b_obs = storage.obs.flatten(0, 1)

        # 3. Update the policy and value network on minibatches of single steps, each with its memory window
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                mb_window, mb_mask, mb_positions = rollout_windows(
                    storage.initial_memory,
                    storage.hidden,
                    storage.episode_steps,
                    mb_inds % args.num_envs,
                    mb_inds // args.num_envs,
                    args.trxl_memory_length,
                )
                new_log_probs, newvalue, _ = agent(b_obs[mb_inds], mb_window, mb_mask, mb_positions)
                newlogprob = new_log_probs.gather(-1, b_actions[mb_inds, None]).squeeze(-1)
                entropy = -(new_log_probs.exp() * new_log_probs).sum(-1)
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

                # Value loss: the squared error without PPO's usual 1/2, as the TrXL PPO reference and CleanRL's
                # ppo_trxl weigh it (the shared transformer trains its critic at --vf-coef times this).
                mb_returns, mb_values = b_returns[mb_inds], b_values[mb_inds]
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - mb_returns) ** 2
                    v_delta = torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (mb_values + v_delta - mb_returns) ** 2
                    v_loss = torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = ((newvalue - mb_returns) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and approx_kl.item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        var_y = b_returns.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (b_returns - b_values).var() / var_y)
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
                "charts/entropy_coefficient": ent_coef,
            },
        )
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, agent=agent.state_dict(), obs_shape=obs_shape, n_actions=n_actions)
