"""Multi-Agent Twin Delayed DDPG (MATD3) for cooperative tasks with continuous actions.

Ackermann et al. 2019, "Reducing Overestimation Bias in Multi-Agent Domains Using Double Centralized
Critics" (https://arxiv.org/abs/1910.01465): MADDPG (Lowe et al. 2017) with TD3's three changes. Each
agent has two centralised critics Q1_i, Q2_i(s, a_1 ... a_n), trained on its own reward towards the
smaller of their target values (clipped double Q) at a noise-smoothed target action; its actor climbs
Q1_i (own action from the actor, the others' from the replay buffer) and, with the Polyak-averaged
targets, is updated only every --policy-frequency critic steps. One actor and one pair of critics serve
all agents (parameter sharing, BenchMARL's default for homogeneous agents), told apart by a one-hot id.

Action space: Box, the same for every agent (for discrete actions: qmix.py, vdn.py or mappo.py).
Environments: VMAS scenarios (`vmas/<scenario>`, simulated on the training device) and mpe2 tasks
(`mpe/<task>`). A time-limit truncation is bootstrapped from the true final observation. Neither
simulator can be saved: --resume continues with freshly reset environments.

    uv run python cleanrl/matd3.py --env-id vmas/navigation

With benchmark/matd3.sh's settings vmas/navigation reaches a team return of about 15.6 within 192k
steps, against about -3 for a random policy (benchmark/results/matd3.md).
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
    torch_threads: int = 0
    """CPU threads for torch (0: torch's default, one per core)"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported (VMAS and MPE render through a display stack this script does not set up); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy (no exploration noise)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "vmas/navigation"
    """the scenario: vmas/<scenario> or mpe/<task>"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment (one step of all num_envs worlds counts num_envs)"""
    num_envs: int = 64
    """the number of parallel worlds"""
    continuous_actions: bool = True
    """the action type the simulator is built with; MATD3 needs continuous actions"""
    max_episode_steps: int | None = None
    """the episode time limit (None: VMAS 100, MPE 25)"""

    # Algorithm specific arguments. Lowe et al. (MADDPG) use lr 1e-2, gamma 0.95, tau 0.01, batch 1024, gradient
    # norm 0.5 and 64-wide networks on MPE; where a default differs, its docstring says why.
    actor_learning_rate: float = 3e-4
    """the learning rate of the actor's optimizer (DDPG/TD3 practice at width 256; the paper's 1e-2 is for width 64)"""
    critic_learning_rate: float = 1e-3
    """the learning rate of the critic's optimizer (as TD3 at width 256; the paper's 1e-2 is for width 64)"""
    hidden_dim: int = 256
    """width of the two hidden layers of the actor and the critic (256 as BenchMARL and TD3; the paper 64)"""
    buffer_size: int = 1000000
    """the replay memory buffer size, in transitions (one world's step, all agents)"""
    gamma: float = 0.99
    """the discount factor gamma (BenchMARL's 0.99 for VMAS's 100-step episodes; the paper's 0.95 for MPE's 25)"""
    tau: float = 0.005
    """target smoothing coefficient (0.005 as BenchMARL and TD3; the paper 0.01)"""
    batch_size: int = 256
    """transitions (each with all agents) per gradient step (256 as TD3, steps every vector step; the paper 1024)"""
    gradient_steps: int = 1
    """critic gradient steps after each vector step of num_envs transitions"""
    max_grad_norm: float = 0.0
    """clip each network's gradient to this global norm (0: no clipping, as TD3; the paper 0.5, BenchMARL 5)"""
    exploration_noise: float = 0.1
    """the standard deviation of the exploration noise (in units of the action half-range)"""
    learning_starts: int = 10000
    """timestep to start learning (uniformly random actions until then)"""
    policy_frequency: int = 2
    """the frequency of training the actor and updating the targets (delayed), in critic updates"""
    policy_noise: float = 0.2
    """the standard deviation of the target policy smoothing noise (in units of the action half-range)"""
    noise_clip: float = 0.5
    """the target policy smoothing noise is clipped to +-this (in units of the action half-range)"""
    log_every: int = 10
    """read losses and episode statistics back to the host every this many vector steps"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""


def global_state(obs: torch.Tensor) -> torch.Tensor:
    """What the centralised critic sees of the world: every agent's observation concatenated in agent
    order, [..., n_agents * obs_dim]. For MPE this is exactly mpe2's state(); VMAS has no state of its own."""
    return obs.flatten(start_dim=-2)


# --- networks -----------------------------------------------------------------------------------


def with_agent_id(x: torch.Tensor) -> torch.Tensor:
    """[..., n_agents, features] -> [..., n_agents, features + n_agents]: the one-hot agent id appended."""
    n_agents = x.shape[-2]
    ids = torch.eye(n_agents, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], n_agents)
    return torch.cat([x, ids], dim=-1)


def critic_input(obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The centralised critics' input, one row per agent i:
    [global_state(obs) (agent 0's obs, agent 1's obs, ...), agent 0's action, agent 1's action, ..., one-hot i].

    obs [B, n_agents, obs_dim]; actions [B, n_agents, act_dim] (one joint action seen by every critic)
    or [B, n_agents, n_agents, act_dim] (row i: the joint action critic i sees, as in the actor's update).
    Returns [B, n_agents, n_agents * (obs_dim + act_dim) + n_agents]."""
    batch, n_agents, _ = obs.shape
    if actions.dim() == 3:
        actions = actions.unsqueeze(1).expand(batch, n_agents, n_agents, actions.shape[-1])
    state = global_state(obs).unsqueeze(1).expand(batch, n_agents, -1)
    return with_agent_id(torch.cat([state, actions.flatten(start_dim=-2)], dim=-1))


def replace_own_action(buffer_actions: torch.Tensor, policy_actions: torch.Tensor) -> torch.Tensor:
    """[B, n_agents, n_agents, act_dim]: row i is the buffer's joint action with agent i's action
    replaced by the policy's. Gradients reach the policy's action of agent i only through row i."""
    n_agents = buffer_actions.shape[1]
    own = torch.eye(n_agents, dtype=torch.bool, device=buffer_actions.device)[None, :, :, None]
    return torch.where(own, policy_actions.unsqueeze(1), buffer_actions.unsqueeze(1))


class Actor(nn.Module):
    """The deterministic policy shared by all agents: a ReLU MLP on [own observation, one-hot id],
    tanh output scaled to the action bounds [low, high]."""

    def __init__(
        self, obs_dim: int, n_agents: int, action_low: torch.Tensor, action_high: torch.Tensor, hidden_dim: int = 256
    ):
        super().__init__()
        self.fc1 = nn.Linear(obs_dim + n_agents, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc_mu = nn.Linear(hidden_dim, len(action_low))
        # Buffers, not parameters: saved with the model, never trained or averaged into the target.
        self.register_buffer("action_scale", (action_high - action_low) / 2.0)
        self.register_buffer("action_bias", (action_high + action_low) / 2.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., n_agents, obs_dim] -> actions [..., n_agents, act_dim]."""
        x = F.relu(self.fc1(with_agent_id(obs)))
        x = F.relu(self.fc2(x))
        return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias


class QNetwork(nn.Module):
    """A centralised critic shared by all agents (Q1 and Q2 are two of them, initialised independently):
    a ReLU MLP on critic_input(obs, actions) -> Q_i."""

    def __init__(self, obs_dim: int, act_dim: int, n_agents: int, hidden_dim: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(n_agents * (obs_dim + act_dim) + n_agents, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """Q-values [B, n_agents] (see critic_input for the shapes).

        frozen: use detached weights, so that the actor's loss sends gradients to the actions only
        (a whole update measured 7-9% faster than one whose backward also fills the critic's gradients)."""
        layers = [(fc.weight, fc.bias) for fc in (self.fc1, self.fc2, self.fc3)]
        if frozen:
            layers = [(weight.detach(), bias.detach()) for weight, bias in layers]
        (w1, b1), (w2, b2), (w3, b3) = layers
        x = F.relu(F.linear(critic_input(obs, actions), w1, b1))
        x = F.relu(F.linear(x, w2, b2))
        return F.linear(x, w3, b3).squeeze(-1)


# --- storage ------------------------------------------------------------------------------------


def transition_fields(n_agents: int, obs_dim: int, act_dim: int) -> dict[str, tuple[int, ...]]:
    """What the replay buffer stores per transition (float32 each): its name and shape. next_obs is the
    true final observation where an episode ended; terminations excludes truncations (they bootstrap)."""
    return {
        "obs": (n_agents, obs_dim),
        "actions": (n_agents, act_dim),
        "rewards": (n_agents,),
        "terminations": (),
        "next_obs": (n_agents, obs_dim),
    }


def replay_buffer_bytes(buffer_size: int, n_agents: int, obs_dim: int, act_dim: int) -> int:
    shapes = transition_fields(n_agents, obs_dim, act_dim).values()
    return sum(buffer_size * torch.Size(shape).numel() * torch.float32.itemsize for shape in shapes)


class ReplayBuffer:
    """The last `buffer_size` transitions (one world's step, all agents), circular, as named tensors on
    the training device. A step of all worlds is one indexed write per field; a minibatch one gather."""

    def __init__(self, buffer_size: int, n_agents: int, obs_dim: int, act_dim: int, device: torch.device):
        self.buffer_size, self.pos, self.size = buffer_size, 0, 0
        self.fields = {
            name: torch.zeros((buffer_size, *shape), device=device)
            for name, shape in transition_fields(n_agents, obs_dim, act_dim).items()
        }
        self.device = device

    def add(self, **transition: torch.Tensor) -> None:
        """One transition per world, by field name."""
        num_envs = len(transition["obs"])
        rows = (self.pos + torch.arange(num_envs, device=self.device)) % self.buffer_size
        for name, field in self.fields.items():
            field[rows] = transition[name].to(field.dtype)
        self.pos = (self.pos + num_envs) % self.buffer_size
        self.size = min(self.size + num_envs, self.buffer_size)

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """A uniform minibatch (with replacement), by field name."""
        rows = torch.randint(self.size, (batch_size,), device=self.device)
        return {name: field[rows] for name, field in self.fields.items()}

    def state_dict(self) -> dict:
        return {"pos": self.pos, "size": self.size, **{name: f[: self.size].cpu() for name, f in self.fields.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.pos, self.size = state["pos"], state["size"]
        for name, field in self.fields.items():
            field[: self.size].copy_(state[name])


# --- the maths ----------------------------------------------------------------------------------


def random_actions(shape: tuple[int, ...], low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Uniformly random actions [*shape, act_dim] within [low, high], drawn with torch's RNG on low.device."""
    return low + (high - low) * torch.rand((*shape, len(low)), device=low.device)


def add_exploration_noise(
    actions: torch.Tensor, action_scale: torch.Tensor, low: torch.Tensor, high: torch.Tensor, noise_std: float
) -> torch.Tensor:
    """actions + N(0, (noise_std * action_scale)^2) per dimension, clipped to [low, high]."""
    return torch.clamp(actions + torch.randn_like(actions) * (noise_std * action_scale), low, high)


def smooth_target_actions(
    target_actions: torch.Tensor,
    action_scale: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    policy_noise: float,
    noise_clip: float,
) -> torch.Tensor:
    """Target policy smoothing: noise N(0, policy_noise^2) clipped to +-noise_clip, both in units
    of the action half-range (so scaled by action_scale), added to the target actor's actions,
    and the result clipped to [low, high]."""
    noise = (torch.randn_like(target_actions) * policy_noise).clamp(-noise_clip, noise_clip) * action_scale
    return torch.clamp(target_actions + noise, low, high)


def td_target(rewards: torch.Tensor, next_q: torch.Tensor, terminations: torch.Tensor, gamma: float) -> torch.Tensor:
    """r_i + gamma * next_q_i per agent, [B, n_agents], where next_q = min(Q1_i_target, Q2_i_target)(s', a'),
    with the bootstrap dropped where the world terminated (terminations [B]). A truncated transition keeps
    its bootstrap: its s' is the true final observation."""
    return rewards + gamma * next_q * (1.0 - terminations).unsqueeze(-1)


# --- validation and evaluation ------------------------------------------------------------------

NO_VIDEO = "--capture-video is not supported: VMAS and MPE render through a display stack this script does not set up"


def validate(args: Args) -> None:
    """Check the arguments, the environment and the replay buffer's size before any work; fail in one line."""
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        gradient_steps=args.gradient_steps,
        policy_frequency=args.policy_frequency,
        hidden_dim=args.hidden_dim,
        actor_learning_rate=args.actor_learning_rate,
        critic_learning_rate=args.critic_learning_rate,
        log_every=args.log_every,
        eval_episodes=args.eval_episodes,
    )
    check_env_id(args.env_id)
    if not args.continuous_actions:
        fail(
            f"{os.path.basename(__file__)} needs continuous actions; "
            "for discrete actions use qmix.py, vdn.py or mappo.py"
        )
    if args.capture_video:
        fail(NO_VIDEO)
    if args.max_episode_steps is not None and args.max_episode_steps <= 0:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (off) or positive, got {args.checkpoint_every}")
    if args.torch_threads < 0:
        fail(f"--torch-threads must be 0 (one per core) or positive, got {args.torch_threads}")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(
            f"--learning-starts must be in [0, --total-timesteps {args.total_timesteps}), "
            f"got {args.learning_starts}: nothing would be learned"
        )
    if not 0 < args.gamma <= 1 or not 0 < args.tau <= 1:
        fail(f"--gamma and --tau must be in (0, 1], got {args.gamma} and {args.tau}")
    for flag, value in (
        ("--exploration-noise", args.exploration_noise),
        ("--policy-noise", args.policy_noise),
        ("--noise-clip", args.noise_clip),
        ("--max-grad-norm", args.max_grad_norm),
    ):
        if not value >= 0:
            fail(f"{flag} must be 0 or positive, got {value}")
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
    probe = make_env(args.env_id, 1, torch.device("cpu"), args.seed, True, args.max_episode_steps)
    probe.close()
    check_action_spaces(probe)
    nbytes = replay_buffer_bytes(args.buffer_size, probe.n_agents, probe.obs_dim, probe.act_dim)
    check_fits(nbytes, "cuda" if args.cuda and torch.cuda.is_available() else "cpu", "replay buffer", "--buffer-size")


def check_action_spaces(envs) -> None:
    """Parameter sharing needs one action space (type, shape and bounds) for all agents."""
    if not envs.same_action_space:
        fail(
            f"{os.path.basename(__file__)} shares one actor across agents, but the agents of this scenario "
            f"have different action spaces: {', '.join(str(space) for space in envs.action_spaces)}"
        )


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the team returns (sum over agents) of the first
    episode of `eval_episodes` worlds under its deterministic actor (no noise)."""
    model = load_model(model_path, __file__)
    if capture_video:
        fail(NO_VIDEO)
    envs = make_env(model["env_id"], eval_episodes, device, seed, True, model["args"]["max_episode_steps"])
    zeros = torch.zeros(model["act_dim"])  # the action scale and bias come with the weights
    actor = Actor(model["obs_dim"], model["n_agents"], zeros, zeros, model["args"]["hidden_dim"])
    actor.to(device).load_state_dict(model["actor"])
    returns = torch.full((eval_episodes,), torch.nan, device=device)
    obs = envs.reset()
    with torch.no_grad():
        for _ in range(envs.max_episode_steps):  # every world ends a first episode within the time limit
            obs, _, _, _, _, info = envs.step(actor(obs))
            first = info["done"] & returns.isnan()
            returns = torch.where(first, info["episode_return"].sum(dim=1), returns)
    envs.close()
    return returns.tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    # A resumed run starts fresh environments (their state cannot be saved) on a seed of its own.
    global_step = run.checkpoint["global_step"] if run.checkpoint else 0
    envs = make_env(args.env_id, args.num_envs, device, args.seed + global_step, True, args.max_episode_steps)
    n_agents, obs_dim, act_dim = envs.n_agents, envs.obs_dim, envs.act_dim
    low, high = envs.action_low, envs.action_high
    torch.manual_seed(args.seed)  # VMAS seeds torch's global RNG itself

    actor = Actor(obs_dim, n_agents, low, high, args.hidden_dim).to(device)
    # Q1 and Q2 as two plain modules: stacked (torch.func.stack_module_state + vmap(functional_call)) they made
    # the update 8-19% slower on a CPU, hand-laid into batched matmuls 0-3% faster (benchmark/results/matd3.md).
    qf1 = QNetwork(obs_dim, act_dim, n_agents, args.hidden_dim).to(device)
    qf2 = QNetwork(obs_dim, act_dim, n_agents, args.hidden_dim).to(device)
    target_actor = Actor(obs_dim, n_agents, low, high, args.hidden_dim).to(device)
    qf1_target = QNetwork(obs_dim, act_dim, n_agents, args.hidden_dim).to(device)
    qf2_target = QNetwork(obs_dim, act_dim, n_agents, args.hidden_dim).to(device)
    target_actor.load_state_dict(actor.state_dict())
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    critic_params = [*qf1.parameters(), *qf2.parameters()]
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.actor_learning_rate)
    critic_optimizer = torch.optim.Adam(critic_params, lr=args.critic_learning_rate)
    rb = ReplayBuffer(args.buffer_size, n_agents, obs_dim, act_dim, device)
    online_params = [*actor.parameters(), *critic_params]
    target_params = [*target_actor.parameters(), *qf1_target.parameters(), *qf2_target.parameters()]

    stateful = dict(
        actor=actor,
        qf1=qf1,
        qf2=qf2,
        target_actor=target_actor,
        qf1_target=qf1_target,
        qf2_target=qf2_target,
        actor_optimizer=actor_optimizer,
        critic_optimizer=critic_optimizer,
        replay_buffer=rb,
    )
    updates = 0  # critic steps, which the actor's delay counts
    if run.checkpoint:
        for name, module in stateful.items():
            module.load_state_dict(run.checkpoint[name])
        updates = run.checkpoint["updates"]
        print(f"resuming at step {global_step} with freshly reset environments (VMAS and mpe2 state cannot be saved)")
    next_obs = envs.reset()

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            **{name: module.state_dict() for name, module in stateful.items()}, global_step=global_step, updates=updates
        )

    run.begin(training_state)
    log_steps = args.log_every * args.num_envs
    latest_losses = {}  # of the latest gradient step, logged when due (none yet after a start or a resume)
    while global_step < args.total_timesteps:
        # Act: everything on the device (MPE copies the actions to the host inside its step).
        obs = next_obs
        if global_step < args.learning_starts:
            actions = random_actions((args.num_envs, n_agents), low, high)
        else:
            with torch.no_grad():
                actions = add_exploration_noise(actor(obs), actor.action_scale, low, high, args.exploration_noise)
        next_obs, rewards, terminated, _, final_obs, _ = envs.step(actions)
        rb.add(obs=obs, actions=actions, rewards=rewards, terminations=terminated, next_obs=final_obs)
        previous_step, global_step = global_step, global_step + args.num_envs

        # Learn: --gradient-steps critic steps per vector step, once learning has started; the actor and
        # the targets follow every --policy-frequency critic steps (delayed), counted across vector steps.
        if global_step >= args.learning_starts:
            for _ in range(args.gradient_steps):
                batch = rb.sample(args.batch_size)
                with torch.no_grad():
                    next_actions = smooth_target_actions(
                        target_actor(batch["next_obs"]),
                        actor.action_scale,
                        low,
                        high,
                        args.policy_noise,
                        args.noise_clip,
                    )
                    next_q = torch.min(
                        qf1_target(batch["next_obs"], next_actions), qf2_target(batch["next_obs"], next_actions)
                    )
                    target = td_target(batch["rewards"], next_q, batch["terminations"], args.gamma)
                qf1_values = qf1(batch["obs"], batch["actions"])
                qf2_values = qf2(batch["obs"], batch["actions"])
                qf1_loss = F.mse_loss(qf1_values, target)  # over the batch and the agents
                qf2_loss = F.mse_loss(qf2_values, target)
                critic_optimizer.zero_grad()
                (qf1_loss + qf2_loss).backward()
                if args.max_grad_norm > 0:
                    nn.utils.clip_grad_norm_(critic_params, args.max_grad_norm)
                critic_optimizer.step()
                updates += 1
                latest_losses |= {
                    "losses/qf1_loss": qf1_loss.detach(),
                    "losses/qf2_loss": qf2_loss.detach(),
                    "losses/qf_loss": (qf1_loss + qf2_loss).detach() / 2.0,
                    "losses/qf1_values": qf1_values.detach().mean(),
                    "losses/qf2_values": qf2_values.detach().mean(),
                }

                if updates % args.policy_frequency == 0:
                    # -Q1_i(s, a_1 .. actor(o_i) .. a_n), averaged over the agents i and the batch.
                    joint_actions = replace_own_action(batch["actions"], actor(batch["obs"]))
                    actor_loss = -qf1(batch["obs"], joint_actions, frozen=True).mean()
                    actor_optimizer.zero_grad()
                    actor_loss.backward()
                    if args.max_grad_norm > 0:
                        nn.utils.clip_grad_norm_(actor.parameters(), args.max_grad_norm)
                    actor_optimizer.step()
                    latest_losses["losses/actor_loss"] = actor_loss.detach()
                    with torch.no_grad():
                        for target_param, param in zip(target_params, online_params):
                            target_param.lerp_(param, args.tau)

        # Log every --log-every vector steps (and at the end), checkpoint when due.
        if global_step // log_steps > previous_step // log_steps or global_step >= args.total_timesteps:
            scalars = {"charts/learning_rate": args.actor_learning_rate}
            if (episodes := envs.read_episodes()) is not None:  # the means over the episodes since the last log
                run.log_episodes(global_step, returns=[episodes.team_return], lengths=[episodes.length])
                scalars |= episodes.agent_scalars()
            run.log(global_step, {**scalars, **latest_losses})
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        actor=actor.state_dict(),
        qf1=qf1.state_dict(),
        qf2=qf2.state_dict(),
        n_agents=n_agents,
        obs_dim=obs_dim,
        act_dim=act_dim,
    )
