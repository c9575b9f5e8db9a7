"""VDN: value-decomposition networks for cooperative multi-agent deep RL.

Sunehag et al. 2018, "Value-Decomposition Networks For Cooperative Multi-Agent Learning"
(https://arxiv.org/abs/1706.05296). Every agent acts greedily (epsilon-greedy while training) on its
own Q-values; the team's Q_tot is the sum of the agents' chosen Q-values, trained by TD on the team
reward. This file is qmix.py with the sum in place of QMIX's mixing network (the two repeat each
other by design, so each reads alone).

- One Q-network shared by all agents, input [own observation, one-hot agent id]. It is a plain MLP,
  not a recurrent network: MPE and VMAS observations hold the agent's own position and velocity and
  the relative positions of the landmarks and other agents, full enough that no memory is needed.
- Team reward: the sum over agents of their per-agent rewards (the same sum that is logged as the
  team return, charts/episodic_return).
- Double-Q targets: y = r + gamma * (1 - terminated) * sum_i Q_target_i(o'_i, argmax_a Q_i(o'_i, a)),
  the argmax taken by the online per-agent Q-network, evaluated by the target Q-network. A time-limit
  truncation is bootstrapped: the buffer stores the true final observation of an ended episode.
- Adam (learning rate 5e-4, as in EPyMARL's MPE configurations); gradients clipped to norm 10 (as in
  QMIX); the target network follows dqn.py (`--tau 1`: a hard copy every `--target-network-frequency`
  steps; below 1: Polyak averaging).

Action space: Discrete, the same for every agent (`--continuous-actions` is refused: use maddpg.py,
matd3.py or mappo.py). Environments: VMAS scenarios (`vmas/<scenario>`, torch-batched on the training
device) and MPE tasks through mpe2 (`mpe/<task>`, PettingZoo parallel API, copies stepped on the host).

    uv run python cleanrl/vdn.py --env-id mpe/simple_spread_v3

On mpe/simple_spread_v3 (3 agents, 25-step episodes) a uniform random policy's team return is about
-80 (-79 +- 22 over 640 episodes); with benchmark/vdn.sh's settings (40k steps, 16 worlds, about 3-4
minutes on a loaded core) seed 1 reached -65 (the mean of the last 5 logged returns, 8k steps); the
3-seed numbers are in benchmark/results/vdn.md.

Checkpoints hold the networks, the optimiser, the replay buffer, the RNGs and the counters. Neither
VMAS nor mpe2 state can be serialised here, so `--resume` continues with freshly reset environments
(the episodes that were running are lost; everything learned is kept).
"""

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import (
    CHECKPOINT_NAME,
    StopSignal,
    load_checkpoint,
    load_model,
    restore_rng_state,
    save_checkpoint,
    save_model,
)
from cleanrl_utils.envs.multiagent import check_env_id, make_env
from cleanrl_utils.errors import check_positive, fail
from cleanrl_utils.progress import Progress
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
    """if toggled, use a GPU when one is present (the CPU otherwise); VMAS simulates there too"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported (VMAS and MPE render through a display stack this script does not set up); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy (greedy)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "mpe/simple_spread_v3"
    """the scenario: vmas/<scenario> or mpe/<task>"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment (one step of all num_envs worlds counts num_envs)"""
    num_envs: int = 8
    """the number of parallel worlds"""
    continuous_actions: bool = False
    """the action type the simulator is built with; VDN needs discrete actions"""
    max_episode_steps: int | None = None
    """the episode time limit (None: VMAS 100, MPE 25)"""
    torch_threads: int = 0
    """CPU threads for torch (0: torch's default, one per core)"""

    # Algorithm specific arguments
    learning_rate: float = 5e-4
    """the learning rate of the Adam optimizer"""
    buffer_size: int = 100000
    """the replay memory buffer size (transitions of one world)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 1.0
    """the target network update rate (1: hard copy; below 1: Polyak averaging)"""
    target_network_frequency: int = 2000
    """the timesteps it takes to update the target networks"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.05
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.1
    """the fraction of `total-timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 5000
    """timestep to start learning"""
    train_frequency: int = 8
    """the frequency of training (one gradient step every this many timesteps)"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    hidden_dim: int = 64
    """the width of the two hidden layers of the per-agent Q-network"""
    log_every: int = 100
    """read losses and episode statistics back to the host every this many iterations (steps of all worlds)"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""


def global_state(obs: torch.Tensor) -> torch.Tensor:
    """The centralised critic's input: every agent's observation concatenated in agent order,
    [num_envs, n_agents * obs_dim]. For MPE this is exactly mpe2's state(); VMAS has no state of its own."""
    return obs.flatten(start_dim=-2)


# --- networks -------------------------------------------------------------------------------------


class QNetwork(nn.Module):
    """The per-agent Q-network shared by all agents: [own observation, one-hot agent id] -> Q(o, .)."""

    def __init__(self, obs_dim: int, n_agents: int, num_actions: int, hidden_dim: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim + n_agents, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, num_actions),
        )
        self.register_buffer("agent_ids", torch.eye(n_agents), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., n_agents, obs_dim] -> Q-values [..., n_agents, num_actions]."""
        ids = self.agent_ids.expand(*obs.shape[:-1], self.agent_ids.shape[0])
        return self.network(torch.cat([obs, ids], dim=-1))


class VDNMixer(nn.Module):
    """VDN's mixing: Q_tot = sum over agents of the chosen Q-values (no parameters, the state is unused).
    A module with QMIX's mixer interface, so the training loop reads the same in qmix.py and vdn.py."""

    def forward(self, agent_qs: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        """agent_qs [..., n_agents] (the chosen actions' Q-values) -> Q_tot [...]."""
        return agent_qs.sum(-1)


# --- storage ----------------------------------------------------------------------------------------


class ReplayBuffer:
    """The last `buffer_size` transitions of single worlds, circular, as tensors on the training device.

    A transition: the agents' observations, their actions, the team reward, the termination flag and
    the true next observations (the final ones where an episode ended). A step of all worlds is one
    indexed write; a minibatch is one gather per field. The global state is global_state(obs).
    """

    def __init__(self, buffer_size: int, num_envs: int, n_agents: int, obs_dim: int, device: torch.device):
        self.buffer_size = buffer_size
        self.obs = torch.zeros((buffer_size, n_agents, obs_dim), device=device)
        self.next_obs = torch.zeros((buffer_size, n_agents, obs_dim), device=device)
        self.actions = torch.zeros((buffer_size, n_agents), dtype=torch.long, device=device)
        self.rewards = torch.zeros(buffer_size, device=device)
        self.terminated = torch.zeros(buffer_size, device=device)
        self.offsets = torch.arange(num_envs, device=device)
        self.pos, self.size = 0, 0

    def fields(self) -> dict[str, torch.Tensor]:
        return {
            "obs": self.obs,
            "next_obs": self.next_obs,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminated": self.terminated,
        }

    def add(
        self,
        obs: torch.Tensor,
        next_obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
    ) -> None:
        rows = (self.pos + self.offsets) % self.buffer_size
        for field, value in zip(self.fields().values(), (obs, next_obs, actions, rewards, terminated)):
            field[rows] = value.to(field.dtype)
        self.pos = (self.pos + len(self.offsets)) % self.buffer_size
        self.size = min(self.size + len(self.offsets), self.buffer_size)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """A uniform minibatch (with replacement): obs, actions, rewards, next_obs, terminated."""
        rows = torch.randint(self.size, (batch_size,), device=self.obs.device)
        return self.obs[rows], self.actions[rows], self.rewards[rows], self.next_obs[rows], self.terminated[rows]

    def state_dict(self) -> dict:
        return {
            "pos": self.pos,
            "size": self.size,
            **{name: field[: self.size].cpu() for name, field in self.fields().items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        for name, field in self.fields().items():
            field[: self.size].copy_(state[name])


# --- the math -----------------------------------------------------------------------------------------


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e over `duration` steps, then constant."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def select_actions(q_network: QNetwork, obs: torch.Tensor, epsilon: float, num_actions: int) -> torch.Tensor:
    """Epsilon-greedy actions [num_envs, n_agents]: each agent of each world explores on its own draw."""
    explore = torch.rand(obs.shape[:-1], device=obs.device) < epsilon
    random_actions = torch.randint(num_actions, obs.shape[:-1], device=obs.device)
    with torch.no_grad():
        greedy_actions = q_network(obs).argmax(dim=-1)
    return torch.where(explore, random_actions, greedy_actions)


def double_q_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
    next_state: torch.Tensor,
    target_mixer: nn.Module,
    gamma: float,
) -> torch.Tensor:
    """y = r + gamma * (1 - terminated) * Q_tot_target(s', a*), a*_i = argmax_a Q_online_i(o'_i, a).

    next_q_online and next_q_target are [batch, n_agents, num_actions] per-agent Q-values of the next
    observations; the online network picks each agent's action, the target network values it, the
    target mixer (VDN: their sum; the state is unused) mixes them. A truncated transition keeps its bootstrap
    (its next observation is the true final one); only a termination drops it.
    """
    next_actions = next_q_online.argmax(dim=-1, keepdim=True)
    next_chosen = next_q_target.gather(-1, next_actions).squeeze(-1)
    return rewards + gamma * (1.0 - terminated) * target_mixer(next_chosen, next_state)


# --- validation and evaluation --------------------------------------------------------------------------


def validate(args: Args) -> None:
    """Check the arguments before any work; fail in one line."""
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        train_frequency=args.train_frequency,
        target_network_frequency=args.target_network_frequency,
        learning_rate=args.learning_rate,
        max_grad_norm=args.max_grad_norm,
        hidden_dim=args.hidden_dim,
        log_every=args.log_every,
        eval_episodes=args.eval_episodes,
    )
    message = check_env_id(args.env_id)
    if message:
        fail(message)
    if args.continuous_actions:
        fail(f"{args.exp_name}.py needs discrete actions; for continuous actions use maddpg.py, matd3.py or mappo.py")
    if args.capture_video:
        fail(
            "--capture-video is not supported: VMAS and MPE render through a display stack this script does not set up"
        )
    if args.max_episode_steps is not None and args.max_episode_steps <= 0:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    if args.torch_threads < 0:
        fail(f"--torch-threads must be 0 (one per core) or positive, got {args.torch_threads}")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(
            f"--learning-starts must be in [0, --total-timesteps {args.total_timesteps}), got {args.learning_starts}: nothing would be learned"
        )
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(
            f"epsilon must decay within [0, 1]: need 0 <= --end-e <= --start-e <= 1, got --start-e {args.start_e} --end-e {args.end_e}"
        )
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if args.batch_size > args.buffer_size:
        fail(
            f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; raise the buffer or lower the batch"
        )
    if args.num_envs > args.buffer_size:
        fail(
            f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: one step would overwrite itself"
        )


def check_envs(envs, exp_name: str) -> None:
    if not envs.same_action_space:
        fail(
            f"{exp_name}.py shares one Q-network across agents, but the agents of this scenario have different action spaces"
        )


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the team returns of the first episode of
    `eval_episodes` worlds under the greedy policy."""
    model = load_model(model_path, "vdn")
    if capture_video:
        fail(
            "--capture-video is not supported: VMAS and MPE render through a display stack this script does not set up"
        )
    args = model["args"]
    envs = make_env(model["env_id"], eval_episodes, device, seed, False, args["max_episode_steps"])
    q_network = QNetwork(model["obs_dim"], model["n_agents"], model["num_actions"], args["hidden_dim"]).to(device)
    q_network.load_state_dict(model["q_network"])
    returns = torch.full((eval_episodes,), torch.nan, device=device)
    obs = envs.reset()
    # Every episode ends within the time limit: that many steps finish a first episode in every world.
    for _ in range(args["max_episode_steps"] or (100 if model["env_id"].startswith("vmas/") else 25)):
        obs, _, _, _, _, info = envs.step(select_actions(q_network, obs, 0.0, model["num_actions"]))
        first = info["done"] & returns.isnan()
        returns = torch.where(first, info["episode_return"].sum(1), returns)
    envs.close()
    return returns.tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # A resumed run starts fresh environments (their state cannot be saved) on a seed of its own.
    global_step = checkpoint["global_step"] if checkpoint else 0
    envs = make_env(
        args.env_id, args.num_envs, device, args.seed + global_step, args.continuous_actions, args.max_episode_steps
    )
    check_envs(envs, args.exp_name)
    n_agents, obs_dim, num_actions = envs.n_agents, envs.obs_dim, envs.num_actions
    stop = StopSignal()  # from here on, SIGTERM/SIGINT lead to a checkpoint and a clean exit

    run = Run(
        args,
        run_dir=Path(args.resume).parent if checkpoint else None,
        purge_step=global_step + 1 if checkpoint else None,
        wandb_id=checkpoint["wandb_id"] if checkpoint else None,
    )
    writer = run.writer

    q_network = QNetwork(obs_dim, n_agents, num_actions, args.hidden_dim).to(device)
    mixer = VDNMixer().to(device)
    target_q_network = QNetwork(obs_dim, n_agents, num_actions, args.hidden_dim).to(device)
    target_mixer = VDNMixer().to(device)
    target_q_network.load_state_dict(q_network.state_dict())
    target_mixer.load_state_dict(mixer.state_dict())
    params = list(q_network.parameters()) + list(mixer.parameters())
    target_params = list(target_q_network.parameters()) + list(target_mixer.parameters())
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, fused=True)
    rb = ReplayBuffer(args.buffer_size, args.num_envs, n_agents, obs_dim, device)
    # Finished episodes since the last log line: count, sum of team returns, sum of lengths, per-agent return sums.
    episode_stats = torch.zeros(3 + n_agents, dtype=torch.float64, device=device)
    # The td loss and the mean chosen Q_tot of the latest gradient step, read back only when logged.
    losses = None

    if checkpoint:
        for name, module in [
            ("q_network", q_network),
            ("mixer", mixer),
            ("target_q_network", target_q_network),
            ("target_mixer", target_mixer),
            ("optimizer", optimizer),
            ("replay_buffer", rb),
        ]:
            module.load_state_dict(checkpoint[name])
        episode_stats.copy_(checkpoint["episode_stats"])
        losses = None if checkpoint["losses"] is None else tuple(t.to(device) for t in checkpoint["losses"])
        restore_rng_state(checkpoint["rng"])
        print(
            f"resuming at step {global_step} with freshly reset environments (VMAS and mpe2 state cannot be saved)",
            flush=True,
        )
    next_obs = envs.reset()

    def write_checkpoint() -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            q_network=q_network.state_dict(),
            mixer=mixer.state_dict(),
            target_q_network=target_q_network.state_dict(),
            target_mixer=target_mixer.state_dict(),
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            episode_stats=episode_stats.cpu(),
            losses=None if losses is None else tuple(t.detach().cpu() for t in losses),
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name}")
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    exploration_steps = args.exploration_fraction * args.total_timesteps
    start_time, start_step, iteration = time.time(), global_step, 0

    while global_step < args.total_timesteps:
        iteration += 1
        # Act: epsilon-greedy per agent; everything stays on the device (MPE copies to the host inside step()).
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        obs = next_obs
        actions = select_actions(q_network, obs, epsilon, num_actions)
        next_obs, rewards, terminated, truncated, final_obs, info = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs, final_obs, actions, rewards.sum(1), terminated)
        done = info["done"].double()
        team_returns = info["episode_return"].double()
        episode_stats += torch.cat(
            [
                torch.stack([done.sum(), (team_returns.sum(1) * done).sum(), (info["episode_length"] * done).sum()]),
                (team_returns * done.unsqueeze(1)).sum(0),
            ]
        )

        # Learn: one gradient step every `train_frequency` environment steps, after `learning_starts` steps.
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                obs_b, actions_b, rewards_b, next_obs_b, terminated_b = rb.sample(args.batch_size)
                with torch.no_grad():
                    target = double_q_target(
                        rewards_b,
                        terminated_b,
                        q_network(next_obs_b),
                        target_q_network(next_obs_b),
                        global_state(next_obs_b),
                        target_mixer,
                        args.gamma,
                    )
                chosen_q = q_network(obs_b).gather(-1, actions_b.unsqueeze(-1)).squeeze(-1)
                q_tot = mixer(chosen_q, global_state(obs_b))
                loss = F.mse_loss(q_tot, target)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()
                losses = (loss.detach(), q_tot.detach().mean())

            # Update the target networks: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for target_param, param in zip(target_params, params):
                        target_param.lerp_(param, args.tau)

        # Logging: one device-to-host read every --log-every iterations (and at the end).
        last = global_step >= args.total_timesteps or bool(stop)
        if iteration % args.log_every == 0 or last:
            stats = episode_stats.tolist()
            episode_stats.zero_()
            finished = stats[0]
            if finished > 0:  # the mean over the episodes that ended since the last log line
                writer.add_scalar("charts/episodic_return", stats[1] / finished, global_step)
                writer.add_scalar("charts/episodic_length", stats[2] / finished, global_step)
                for agent in range(n_agents):
                    writer.add_scalar(f"charts/episodic_return_agent{agent}", stats[3 + agent] / finished, global_step)
                progress.add_returns([stats[1] / finished])
            if losses is not None:
                for name, value in zip(["losses/td_loss", "losses/q_values"], torch.stack(losses).tolist()):
                    writer.add_scalar(name, value, global_step)
                    if not np.isfinite(value):
                        path = write_checkpoint()
                        fail(f"{name} is {value} at step {global_step}; checkpoint written to {path}")
            writer.add_scalar("charts/epsilon", epsilon, global_step)
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
            progress.update(global_step)

        if stop or (next_checkpoint is not None and global_step >= next_checkpoint):
            path = write_checkpoint()
            if next_checkpoint is not None:
                next_checkpoint = (global_step // args.checkpoint_every + 1) * args.checkpoint_every
            if stop:
                print(f"\n{stop.received}: checkpoint written to {path}; continue with --resume {path}", flush=True)
                envs.close()
                run.close()
                raise SystemExit(0)

    progress.close(global_step)
    envs.close()

    if args.save_model:
        model_path = run.dir / f"{args.exp_name}.cleanrl_model"
        save_model(
            model_path,
            args,
            q_network=q_network.state_dict(),
            mixer=mixer.state_dict(),
            n_agents=n_agents,
            obs_dim=obs_dim,
            num_actions=num_actions,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(model_path, args.eval_episodes, device, seed=args.seed + 1_000)
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"evaluation over {len(episodic_returns)} episodes: {np.mean(episodic_returns):.1f} +- {np.std(episodic_returns):.1f}"
        )

    run.close()
