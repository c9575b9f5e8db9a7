"""VDN: value-decomposition networks for cooperative multi-agent deep RL.

Sunehag et al. 2018, "Value-Decomposition Networks For Cooperative Multi-Agent Learning"
(https://arxiv.org/abs/1706.05296). Each agent acts epsilon-greedily on its own Q-values (one Q-network
shared by all agents, fed [own observation, one-hot agent id]: an MLP, not a recurrent network, as MPE
and VMAS observations need no memory); the team's Q_tot is the sum of the agents' chosen Q-values,
trained by double-Q TD on the team reward (the sum of the agents' rewards). Adam at 5e-4 (EPyMARL's MPE
setting), gradient norm 10, target network as in dqn.py. This file is qmix.py with the sum in place of
QMIX's mixing network (the two repeat each other by design, so each reads alone).

Action space: Discrete, the same for every agent. Environments: VMAS scenarios (`vmas/<scenario>`,
torch-batched on the training device) and mpe2 tasks (`mpe/<task>`). Neither simulator can be saved:
`--resume` continues with freshly reset environments (networks, optimiser and replay buffer are kept).

    uv run python cleanrl/vdn.py --env-id mpe/simple_spread_v3

On mpe/simple_spread_v3 the team return goes from about -80 (a uniform random policy) to about -64
within 40k steps with benchmark/vdn.sh's settings (benchmark/results/vdn.md).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

from cleanrl_utils.checkpoint import load_model
from cleanrl_utils.envs.multiagent import check_env_id, make_env
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
    """The global state, the mixer's input (VDN's sum ignores it; kept so that the loop reads as in qmix.py):
    every agent's observation concatenated in agent order, [..., n_agents * obs_dim]."""
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


def transition_fields(n_agents: int, obs_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """What the replay buffer stores per transition: each field's shape and dtype. The global state is
    global_state(obs), so it is not stored; next_obs is the true final observation where an episode ended."""
    return {
        "obs": ((n_agents, obs_dim), torch.float32),
        "actions": ((n_agents,), torch.long),
        "rewards": ((), torch.float32),  # the team reward
        "next_obs": ((n_agents, obs_dim), torch.float32),
        "terminated": ((), torch.float32),
    }


def replay_buffer_bytes(buffer_size: int, n_agents: int, obs_dim: int) -> int:
    fields = transition_fields(n_agents, obs_dim).values()
    return sum(buffer_size * torch.Size(shape).numel() * dtype.itemsize for shape, dtype in fields)


class ReplayBuffer:
    """The last `buffer_size` transitions of single worlds, circular, as named tensors on the training
    device. A step of all worlds is one indexed write per field; a minibatch is one gather per field."""

    def __init__(self, buffer_size: int, num_envs: int, n_agents: int, obs_dim: int, device: torch.device):
        self.buffer_size = buffer_size
        self.fields = {
            name: torch.zeros((buffer_size, *shape), dtype=dtype, device=device)
            for name, (shape, dtype) in transition_fields(n_agents, obs_dim).items()
        }
        self.offsets = torch.arange(num_envs, device=device)
        self.pos, self.size = 0, 0

    def add(self, **transition: torch.Tensor) -> None:
        """One transition per world: obs, actions, rewards, next_obs, terminated."""
        rows = (self.pos + self.offsets) % self.buffer_size
        for name, field in self.fields.items():
            field[rows] = transition[name].to(field.dtype)
        self.pos = (self.pos + len(self.offsets)) % self.buffer_size
        self.size = min(self.size + len(self.offsets), self.buffer_size)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """A uniform minibatch (with replacement), by field name."""
        rows = torch.randint(self.size, (batch_size,), device=self.offsets.device)
        return {name: field[rows] for name, field in self.fields.items()}

    def state_dict(self) -> dict:
        return {"pos": self.pos, "size": self.size, **{name: f[: self.size].cpu() for name, f in self.fields.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        for name, field in self.fields.items():
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

NO_VIDEO = "--capture-video is not supported: VMAS and MPE render through a display stack this script does not set up"


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
    check_env_id(args.env_id)
    if args.continuous_actions:
        fail(
            f"{os.path.basename(__file__)} needs discrete actions; "
            "for continuous actions use maddpg.py, matd3.py or mappo.py"
        )
    if args.capture_video:
        fail(NO_VIDEO)
    if args.max_episode_steps is not None and args.max_episode_steps <= 0:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    if args.torch_threads < 0:
        fail(f"--torch-threads must be 0 (one per core) or positive, got {args.torch_threads}")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(
            f"--learning-starts must be in [0, --total-timesteps {args.total_timesteps}), "
            f"got {args.learning_starts}: nothing would be learned"
        )
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    if not 0 <= args.end_e <= args.start_e <= 1:
        fail(
            "epsilon must decay within [0, 1]: need 0 <= --end-e <= --start-e <= 1, "
            f"got --start-e {args.start_e} --end-e {args.end_e}"
        )
    if not 0 < args.exploration_fraction <= 1:
        fail(f"--exploration-fraction must be in (0, 1], got {args.exploration_fraction}")
    if args.batch_size > args.buffer_size:
        fail(
            f"--batch-size {args.batch_size} is larger than --buffer-size {args.buffer_size}; "
            "raise the buffer or lower the batch"
        )
    if args.num_envs > args.buffer_size:
        fail(
            f"--num-envs {args.num_envs} is larger than --buffer-size {args.buffer_size}: "
            "one step would overwrite itself"
        )
    probe = make_env(args.env_id, 1, torch.device("cpu"), args.seed, False, args.max_episode_steps)
    check_envs(probe)
    probe.close()
    nbytes = replay_buffer_bytes(args.buffer_size, probe.n_agents, probe.obs_dim)
    check_fits(nbytes, "cuda" if args.cuda and torch.cuda.is_available() else "cpu", "replay buffer", "--buffer-size")


def check_envs(envs) -> None:
    if not envs.same_action_space:
        fail(
            f"{os.path.basename(__file__)} shares one Q-network across agents, "
            "but the agents of this scenario have different action spaces"
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
    model = load_model(model_path, __file__)
    if capture_video:
        fail(NO_VIDEO)
    envs = make_env(model["env_id"], eval_episodes, device, seed, False, model["args"]["max_episode_steps"])
    q_network = QNetwork(model["obs_dim"], model["n_agents"], model["num_actions"], model["args"]["hidden_dim"])
    q_network.to(device).load_state_dict(model["q_network"])
    returns = torch.full((eval_episodes,), torch.nan, device=device)
    obs = envs.reset()
    for _ in range(envs.max_episode_steps):  # every world ends a first episode within the time limit
        obs, _, _, _, _, info = envs.step(select_actions(q_network, obs, 0.0, model["num_actions"]))
        first = info["done"] & returns.isnan()
        returns = torch.where(first, info["episode_return"].sum(1), returns)
    envs.close()
    return returns.tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    # A resumed run starts fresh environments (their state cannot be saved) on a seed of its own.
    global_step = run.checkpoint["global_step"] if run.checkpoint else 0
    envs = make_env(args.env_id, args.num_envs, device, args.seed + global_step, False, args.max_episode_steps)
    n_agents, obs_dim, num_actions = envs.n_agents, envs.obs_dim, envs.num_actions

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

    modules = dict(q_network=q_network, mixer=mixer, target_q_network=target_q_network, target_mixer=target_mixer)
    if run.checkpoint:
        for name, module in [*modules.items(), ("optimizer", optimizer), ("replay_buffer", rb)]:
            module.load_state_dict(run.checkpoint[name])
        print(f"resuming at step {global_step} with freshly reset environments (VMAS and mpe2 state cannot be saved)")
    next_obs = envs.reset()

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            **{name: module.state_dict() for name, module in modules.items()},
            optimizer=optimizer.state_dict(),
            replay_buffer=rb.state_dict(),
            global_step=global_step,
        )

    run.begin(training_state)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    log_steps = args.log_every * args.num_envs
    latest_losses = {}  # of the latest gradient step, logged when due (none yet after a start or a resume)
    while global_step < args.total_timesteps:
        # Act: epsilon-greedy per agent; everything stays on the device (MPE copies to the host inside step()).
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        obs = next_obs
        actions = select_actions(q_network, obs, epsilon, num_actions)
        next_obs, rewards, terminated, _, final_obs, _ = envs.step(actions)
        previous_step, global_step = global_step, global_step + args.num_envs
        rb.add(obs=obs, actions=actions, rewards=rewards.sum(1), next_obs=final_obs, terminated=terminated)

        # Learn: one gradient step every `train_frequency` environment steps, after `learning_starts` steps.
        if global_step > args.learning_starts:
            for _ in range(global_step // args.train_frequency - previous_step // args.train_frequency):
                batch = rb.sample(args.batch_size)
                with torch.no_grad():
                    target = double_q_target(
                        batch["rewards"],
                        batch["terminated"],
                        q_network(batch["next_obs"]),
                        target_q_network(batch["next_obs"]),
                        global_state(batch["next_obs"]),
                        target_mixer,
                        args.gamma,
                    )
                chosen_q = q_network(batch["obs"]).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
                q_tot = mixer(chosen_q, global_state(batch["obs"]))
                loss = F.mse_loss(q_tot, target)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()
                latest_losses = {"losses/td_loss": loss.detach(), "losses/q_values": q_tot.detach().mean()}

            # Update the target networks: a copy with tau = 1, Polyak averaging below.
            if global_step // args.target_network_frequency > previous_step // args.target_network_frequency:
                with torch.no_grad():
                    for target_param, param in zip(target_params, params):
                        target_param.lerp_(param, args.tau)

        # Log every --log-every steps of all worlds (and at the end), checkpoint when due.
        if global_step // log_steps > previous_step // log_steps or global_step >= args.total_timesteps:
            scalars = {"charts/epsilon": epsilon, "charts/learning_rate": optimizer.param_groups[0]["lr"]}
            if (episodes := envs.read_episodes()) is not None:  # the means over the episodes since the last log
                run.log_episodes(global_step, returns=[episodes.team_return], lengths=[episodes.length])
                scalars |= episodes.agent_scalars()
            run.log(global_step, {**scalars, **latest_losses})
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        q_network=q_network.state_dict(),
        mixer=mixer.state_dict(),
        n_agents=n_agents,
        obs_dim=obs_dim,
        num_actions=num_actions,
    )
