"""PPO with invalid action masking: the policy never samples an action the environment marks invalid.

Huang & Ontanon 2022, "A Closer Look at Invalid Action Masking in Policy Gradient Algorithms"
(https://arxiv.org/abs/2006.14171), as sb3-contrib's MaskablePPO does it (read beside it): at every step the
environment says which actions are valid (`infos["action_mask"]`); the logits of the others are set to the dtype's
minimum before sampling, so their probability is exactly 0, and the log-probabilities and the entropy are those of the
distribution over the valid actions. The masks are stored with the rollout, so the update recomputes each step's
distribution under the mask it was sampled with. Everything else is ppo.py (the 37 details, GAE, clipping ...).
`--no-mask-actions` runs the same script unmasked, the baseline it is measured against.

Action space: Discrete. Observations: a flat Box, or a Discrete state given one-hot (Taxi-v4). Environments:
gymnasium ones whose info carries `action_mask` (Taxi-v4: moves into walls and pick-ups or drop-offs in the wrong
place are invalid; an invalid move wastes a step at -1, a wrong pick-up or drop-off costs -10).

    uv run python cleanrl/ppo_action_mask.py --env-id Taxi-v4

benchmark/ppo_action_mask.sh runs it beside --no-mask-actions on Taxi-v4 (benchmark/results/ppo_action_mask.md).
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model, restore_envs, snapshot_envs
from cleanrl_utils.errors import check_env_id, check_positive, fail
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
    env_id: str = "Taxi-v4"
    """the id of the environment (its info must carry `action_mask`)"""
    total_timesteps: int = 500000
    """total timesteps of the experiment"""

    # Algorithm specific arguments
    mask_actions: bool = True
    """if toggled, sample only the actions the environment marks valid (off: plain PPO on the same task)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function (OpenAI baselines' code; not in the paper)"""
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
    probe = gym.make(args.env_id)
    action_space, observation_space = probe.action_space, probe.observation_space
    _, info = probe.reset(seed=0)
    probe.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(f"ppo_action_mask.py handles Discrete actions, {args.env_id} has {action_space}")
    if not isinstance(observation_space, (gym.spaces.Box, gym.spaces.Discrete)):
        fail(f"ppo_action_mask.py needs Box or Discrete observations but {args.env_id} has {observation_space}")
    if args.mask_actions and np.shape(info.get("action_mask")) != (action_space.n,):
        fail(
            f"{args.env_id} gives no action_mask of {action_space.n} entries in its info, so there is nothing to "
            "mask: use cleanrl/ppo.py (or --no-mask-actions)"
        )


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: Path | None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", disable_env_checker=True)
            env = gym.wrappers.RecordVideo(env, str(video_dir))
        else:
            env = gym.make(env_id, disable_env_checker=True)
        if isinstance(env.observation_space, gym.spaces.Discrete) or len(env.observation_space.shape) > 1:
            env = gym.wrappers.FlattenObservation(env)  # a Discrete state becomes its one-hot vector
        return env

    return thunk


def make_envs(env_id: str, num_envs: int, capture_video: bool = False, video_dir: Path | None = None):
    # SAME_STEP: an env that ends an episode resets at once and returns the true final
    # observation in infos["final_obs"]. copy=False skips a deepcopy; we copy obs to torch anyway.
    envs = gym.vector.SyncVectorEnv(
        [make_env(env_id, i, capture_video, video_dir) for i in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def masked_logits(self, obs: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """The policy's logits with those of invalid actions (masks False) at the dtype's minimum: after the softmax
        their probability is exactly 0, and the rest is the distribution over the valid actions."""
        logits = self.actor(obs)
        return logits.masked_fill(~masks, torch.finfo(logits.dtype).min)

    def sample_action(self, obs: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        # Only the action is needed while stepping; log-probabilities and values follow in one batched pass.
        # Gumbel-max trick: argmax(logits + Gumbel noise) is a sample of Categorical(logits); a masked logit plus
        # any noise stays at the dtype's minimum, below every valid one.
        logits = self.masked_logits(obs, masks)
        gumbel = -torch.log(-torch.log(torch.rand_like(logits)))
        return torch.argmax(logits + gumbel, dim=-1)

    def log_prob_and_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a|s) and the entropy, both of the masked distribution: invalid actions add no p log p (their
        probability is 0; 0 times the dtype's minimum would be -0, so they are left out explicitly)."""
        log_probs = torch.log_softmax(self.masked_logits(obs, masks), dim=-1)
        entropy = -torch.where(masks, log_probs.exp() * log_probs, 0.0).sum(-1)
        return log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy


class Batch(NamedTuple):
    """A rollout flattened to [batch_size, ...], one named tensor per field."""

    obs: torch.Tensor
    masks: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    values: torch.Tensor

    def take(self, rows: torch.Tensor | slice) -> "Batch":
        return Batch(*(field[rows] for field in self))


class RolloutStorage:
    """One rollout of `num_steps` x `num_envs` transitions. Observations, the action masks they came with and the
    actions live on the device (the policy needs them each step); rewards and episode ends are staged on the host and
    moved once per rollout."""

    def __init__(self, num_steps: int, num_envs: int, obs_dim: int, n_actions: int, device: torch.device):
        self.obs = torch.zeros((num_steps, num_envs, obs_dim), device=device)
        self.masks = torch.ones((num_steps, num_envs, n_actions), dtype=torch.bool, device=device)
        self.actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
        self.rewards = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.terminations = np.zeros((num_steps, num_envs), dtype=np.float32)
        self.truncations = np.zeros((num_steps, num_envs), dtype=np.float32)
        # The true final observation of an episode truncated at step t (zeros elsewhere).
        self.final_obs = np.zeros((num_steps, num_envs, obs_dim), dtype=np.float32)
        self.device = device

    def rewards_and_ends(self) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.as_tensor(a, device=self.device) for a in (self.rewards, self.terminations, self.truncations)
        )


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


def action_masks(infos: dict, num_envs: int, n_actions: int, mask_actions: bool, device) -> torch.Tensor:
    """[num_envs, n_actions] bool, True where an action is valid for the observation just returned (the reset one
    after an episode's end: a SAME_STEP env's top-level info is the reset's); all True with --no-mask-actions."""
    if not mask_actions:
        return torch.ones((num_envs, n_actions), dtype=torch.bool, device=device)
    return torch.as_tensor(np.asarray(infos["action_mask"], dtype=bool), device=device)


def update_minibatch(agent: Agent, optimizer: torch.optim.Optimizer, mb: Batch, args: Args) -> dict[str, torch.Tensor]:
    """One gradient step of the clipped PPO loss on the minibatch `mb`, each step's distribution under its own mask.
    Returns its losses and statistics, detached."""
    newlogprob, entropy = agent.log_prob_and_entropy(mb.obs, mb.actions, mb.masks)
    newvalue = agent.get_value(mb.obs)
    logratio = newlogprob - mb.logprobs
    ratio = logratio.exp()

    with torch.no_grad():
        # calculate approx_kl http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    mb_advantages = mb.advantages
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

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
    """Reload a model saved by this script and return the episodic returns of the policy."""
    model = load_model(model_path, __file__)
    envs = make_envs(model["env_id"], 1, capture_video, video_dir)
    agent = Agent(model["obs_dim"], model["n_actions"]).to(device)
    agent.load_state_dict(model["agent"])
    mask_actions = model["args"]["mask_actions"]
    obs, infos = envs.reset(seed=seed)
    episodic_returns = []
    with torch.no_grad():
        while len(episodic_returns) < eval_episodes:
            masks = action_masks(infos, 1, model["n_actions"], mask_actions, device)
            actions = agent.sample_action(torch.tensor(obs, dtype=torch.float32, device=device), masks)
            obs, _, _, _, infos = envs.step(actions.cpu().numpy())
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

    agent = Agent(obs_dim, n_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    storage = RolloutStorage(args.num_steps, args.num_envs, obs_dim, n_actions, device)

    global_step, iteration = 0, 0
    next_obs_np, infos = envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        envs, next_obs_np = restore_envs(envs, run.checkpoint["envs"], next_obs_np)
        infos = {"action_mask": run.checkpoint["action_mask"]}  # the masks of the observations resumed from
        global_step = run.checkpoint["global_step"]
        iteration = global_step // args.batch_size
    next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device).view(args.num_envs, obs_dim)
    next_masks = action_masks(infos, args.num_envs, n_actions, args.mask_actions, device)

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            envs=snapshot_envs(envs, next_obs_np),
            action_mask=next_masks.cpu().numpy(),
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
                storage.masks[step] = next_masks
                action = agent.sample_action(next_obs, next_masks)
                storage.actions[step] = action
                next_obs_np, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                next_obs = torch.tensor(next_obs_np, dtype=torch.float32, device=device).view(args.num_envs, obs_dim)
                next_masks = action_masks(infos, args.num_envs, n_actions, args.mask_actions, device)
                storage.rewards[step] = reward
                storage.terminations[step] = terminated
                storage.truncations[step] = truncated
                # Bootstrapping needs the true final observation only where the time limit cut an episode.
                bootstrap_final = truncated & ~terminated
                if bootstrap_final.any():
                    final_obs = np.stack(infos["final_obs"][bootstrap_final])
                    storage.final_obs[step, bootstrap_final] = final_obs.reshape(-1, obs_dim)
                run.log_episodes(global_step, infos)

            # 2. Advantages: values and log-probabilities of the whole rollout in batched passes.
            rewards, terminated, truncated = storage.rewards_and_ends()
            values = agent.get_value(torch.cat([storage.obs, next_obs.unsqueeze(0)]))
            next_values = values[1:]
            if storage.truncations.any():
                final_values = agent.get_value(torch.as_tensor(storage.final_obs, device=device))
                next_values = torch.where(truncated * (1 - terminated) > 0, final_values, next_values)
                storage.final_obs.fill(0.0)
            values = values[:-1]
            advantages = compute_gae(rewards, values, next_values, terminated, truncated, args.gamma, args.gae_lambda)
            returns = advantages + values

            b_obs, b_masks = storage.obs.reshape(-1, obs_dim), storage.masks.reshape(-1, n_actions)
            b_actions = storage.actions.reshape(-1)
            b_logprobs, _ = agent.log_prob_and_entropy(b_obs, b_actions, b_masks)
            batch = Batch(
                b_obs, b_masks, b_actions, b_logprobs, advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
            )

        # 3. Update the policy and value network
        clipped = torch.zeros((), device=device)
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                stats = update_minibatch(
                    agent, optimizer, batch.take(b_inds[start : start + args.minibatch_size]), args
                )
                clipped += stats["clipfrac"]

            # The early stop reads the KL on the host: one sync per epoch, only when asked for.
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        # 4. Log (one device-to-host read per iteration) and checkpoint when due
        var_y = batch.returns.var()
        explained_var = torch.where(var_y == 0, torch.nan, 1 - (batch.returns - batch.values).var() / var_y)
        run.log(
            global_step,
            {
                "losses/value_loss": stats["value_loss"],
                "losses/policy_loss": stats["policy_loss"],
                "losses/entropy": stats["entropy"],
                "losses/old_approx_kl": stats["old_approx_kl"],
                "losses/approx_kl": stats["approx_kl"],
                "losses/clipfrac": clipped / (args.num_minibatches * (epoch + 1)),
                "losses/explained_variance": explained_var,
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
            },
        )
        run.end_iteration(global_step)

    envs.close()
    run.finish(global_step, evaluate, agent=agent.state_dict(), obs_dim=obs_dim, n_actions=n_actions)
