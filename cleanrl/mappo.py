"""Multi-Agent PPO (MAPPO) and independent PPO (IPPO) for cooperative multi-agent tasks.

Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"
(https://arxiv.org/abs/2103.01955): PPO whose actor and critic are each one network shared by all
agents, fed the agent's one-hot id beside its input. The actor sees [own observation, agent id];
the centralised critic sees [global state, agent id], the global state being every agent's
observation concatenated in agent order (`global_state`). With `--independent` the critic sees
only [own observation, agent id]: independent PPO (IPPO, de Witt et al. 2020,
https://arxiv.org/abs/2011.09533), still with shared parameters. The first progress line and the
hyperparameters (`critic`) say which.

MAPPO details kept here: value normalisation (ValueNorm: a debiased exponential moving average of
the mean and mean square of the value targets; the critic predicts normalised values, which are
denormalised for GAE, and the targets are normalised for the loss), GAE per agent (rewards and
values are [steps, envs, agents]), clipped surrogate, optional clipped value loss, entropy bonus,
global gradient clipping, learning-rate annealing, several epochs over shuffled minibatches of
(step, environment, agent) samples, advantages normalised per minibatch.

Actions: continuous (default, `--continuous-actions`, VMAS practice: a Gaussian policy with a
state-independent log standard deviation; the sampled action is clipped to the bounds for the
environment, the unclipped sample is what is scored by the policy) or discrete
(`--no-continuous-actions`, a categorical policy). Every agent needs the same action space.

Environments: VMAS scenarios (`--env-id vmas/navigation`, torch-batched, simulated on the
training device) and MPE through mpe2 (`--env-id mpe/simple_spread_v3`, num_envs copies on the
host). Rollouts, storage, advantages and episode statistics stay on the device: no `.item()` or
`.cpu()` in the rollout or the update except the VMAS reset of finished worlds and MPE's host
copy (both in the environment section); scalars are read back every `--log-every` iterations.
A time-limit truncation is bootstrapped with the critic's value of the true final observation;
only a termination cuts the return.

    uv run python cleanrl/mappo.py --env-id vmas/navigation
    uv run python cleanrl/mappo.py --env-id vmas/balance --independent --exp-name ippo
    uv run python cleanrl/mappo.py --env-id mpe/simple_spread_v3 --no-continuous-actions --num-envs 32

What to expect (one seed, measured on this project's loaded 2-core CPU with --torch-threads 1;
3 seeds in benchmark/results/mappo.md, commands in benchmark/mappo.sh): the team return (the sum of
the agents' returns) on vmas/navigation goes from about -3 (a uniform random policy) to ~15 within
300k environment steps, and on vmas/balance from about -30 (random) to ~+10 within 150k steps.

Resume: neither VMAS nor mpe2 can save its simulator state here, so `--resume` restores networks,
optimiser, value normalisation, counters, episode statistics and random generators, and continues
with freshly reset environments (and says so).
"""

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
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
    """not supported by this script (VMAS renders through pyglet, which needs a display); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "vmas/navigation"
    """the task: vmas/<scenario> or mpe/<task> (see KNOWN_ENV_IDS)"""
    total_timesteps: int = 2_000_000
    """total environment steps (one step of all num_envs worlds counts num_envs)"""
    num_envs: int = 256
    """the number of parallel environments (VMAS: worlds simulated together; MPE: copies)"""
    continuous_actions: bool = True
    """the action type the simulator is built with (True: Gaussian policy, False: categorical)"""
    max_episode_steps: int | None = None
    """the episode time limit (None: VMAS 100 steps, MPE 25)"""
    torch_threads: int = 0
    """CPU threads for torch (0: torch's default, one per core)"""

    # Algorithm specific arguments
    independent: bool = False
    """if toggled, IPPO: the critic sees only the agent's own observation (and id), not the global state"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_steps: int = 50
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches (of steps x envs x agents samples)"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function (in normalised units)"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 1.0
    """coefficient of the value function"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping (MAPPO's default)"""
    hidden_size: int = 64
    """width of the two tanh hidden layers of the actor and of the critic"""
    value_norm: bool = True
    """toggles value normalisation (ValueNorm, as in the MAPPO paper)"""
    value_norm_beta: float = 0.99999
    """ValueNorm's EMA decay per update (MAPPO's default; debiased, so early updates count fully)"""
    log_every: int = 1
    """read losses and episode statistics back to the host every this many iterations"""
    eval_episodes: int = 10
    """the number of episodes to evaluate the saved model for"""

    # to be filled in runtime
    critic: str = ""
    """the critic's input: "centralised" (global state) or "independent" (own observation) (computed in runtime)"""
    batch_size: int = 0
    """the samples per rollout, num_envs x num_steps x agents (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def global_state(obs: torch.Tensor) -> torch.Tensor:
    """The centralised critic's input: every agent's observation concatenated in agent order,
    [num_envs, n_agents * obs_dim]. For MPE this is exactly mpe2's state(); VMAS has no state of its own."""
    return obs.flatten(start_dim=-2)


def validate(args: Args) -> None:
    """Check the arguments before any work; fail in one line."""
    message = check_env_id(args.env_id)
    if message:
        fail(message)
    check_positive(
        total_timesteps=args.total_timesteps,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        num_minibatches=args.num_minibatches,
        update_epochs=args.update_epochs,
        learning_rate=args.learning_rate,
        hidden_size=args.hidden_size,
        log_every=args.log_every,
        eval_episodes=args.eval_episodes,
    )
    if args.max_episode_steps is not None:
        check_positive(max_episode_steps=args.max_episode_steps)
    if args.checkpoint_every < 0 or args.torch_threads < 0:
        fail(
            f"--checkpoint-every and --torch-threads must be 0 or positive, got {args.checkpoint_every} and {args.torch_threads}"
        )
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1 or not 0 < args.value_norm_beta < 1:
        fail(
            f"--gamma must be in (0, 1], --gae-lambda in [0, 1] and --value-norm-beta in (0, 1), "
            f"got {args.gamma}, {args.gae_lambda} and {args.value_norm_beta}"
        )
    if args.capture_video:
        fail("--capture-video is not supported by mappo.py: VMAS renders through pyglet, which needs a display")
    rollout = args.num_envs * args.num_steps
    if rollout % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the rollout of {rollout} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps}), whose agents are split with it"
        )
    args.num_iterations = args.total_timesteps // rollout
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout of {rollout} steps")
    args.critic = "independent" if args.independent else "centralised"


def check_action_spaces(envs, env_id: str) -> None:
    """One policy is shared by all agents, so they need one action space (with the same bounds); fail in one line otherwise."""
    first = envs.action_spaces[0]
    same_bounds = all(
        np.array_equal(getattr(space, "low", None), getattr(first, "low", None))
        and np.array_equal(getattr(space, "high", None), getattr(first, "high", None))
        for space in envs.action_spaces
    )
    if not envs.same_action_space or not same_bounds:
        fail(
            f"{env_id}: the agents have different action spaces ({', '.join(map(str, envs.action_spaces))}); "
            "mappo.py shares one policy across agents and needs one action space"
        )


# --- the agent ---------------------------------------------------------------------------------------


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden: int, out_dim: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, hidden)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden, hidden)),
        nn.Tanh(),
        layer_init(nn.Linear(hidden, out_dim), std=out_std),
    )


class Agent(nn.Module):
    """One actor and one critic shared by all agents; each gets the agent's one-hot id.

    Actor input: [own observation, id]. Critic input: [global_state(obs), id] (centralised,
    MAPPO) or [own observation, id] (independent, IPPO). The critic predicts normalised values
    when value normalisation is on. Continuous actions: N(mean(x), exp(logstd)^2) with a
    state-independent logstd; discrete: Categorical(logits(x)).
    """

    def __init__(self, obs_dim: int, n_agents: int, action_dim: int, continuous: bool, independent: bool, hidden: int):
        super().__init__()
        self.continuous, self.independent, self.n_agents = continuous, independent, n_agents
        self.register_buffer("agent_ids", torch.eye(n_agents))
        critic_obs_dim = obs_dim if independent else n_agents * obs_dim
        self.actor = mlp(obs_dim + n_agents, hidden, action_dim, out_std=0.01)
        self.critic = mlp(critic_obs_dim + n_agents, hidden, 1, out_std=1.0)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(action_dim))

    def _with_ids(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n_agents, d] -> [..., n_agents, d + n_agents]: agent i's row gets one_hot(i)."""
        return torch.cat([x, self.agent_ids.expand(*x.shape[:-1], self.n_agents)], dim=-1)

    def actor_input(self, obs: torch.Tensor) -> torch.Tensor:
        return self._with_ids(obs)

    def critic_input(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., n_agents, obs_dim] -> the critic's input [..., n_agents, critic_dim]."""
        if self.independent:
            return self._with_ids(obs)
        state = global_state(obs).unsqueeze(-2).expand(*obs.shape[:-1], obs.shape[-2] * obs.shape[-1])
        return self._with_ids(state)

    def value(self, critic_in: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_in).squeeze(-1)

    def distribution(self, actor_in: torch.Tensor):
        out = self.actor(actor_in)
        if self.continuous:
            return torch.distributions.Normal(out, self.actor_logstd.exp().expand_as(out))
        return torch.distributions.Categorical(logits=out)

    def log_prob_entropy(self, actor_in: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(actor_in)
        if self.continuous:
            return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
        return dist.log_prob(actions), dist.entropy()

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log-probability) for obs [..., n_agents, obs_dim]; the action is unclipped."""
        dist = self.distribution(self.actor_input(obs))
        action = dist.sample()
        log_prob = dist.log_prob(action)
        return action, log_prob.sum(-1) if self.continuous else log_prob

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action (continuous) or the most likely one (discrete), for evaluation."""
        out = self.actor(self.actor_input(obs))
        return out if self.continuous else out.argmax(-1)


class ValueNorm(nn.Module):
    """Running normalisation of the value targets (MAPPO's ValueNorm), on the device in float64.

    update(x) folds the batch's mean and mean square into exponential moving averages with decay
    `beta`; the debiasing term (1 - beta^k after k updates) corrects their start at zero, as in
    Adam, so the statistics are exact weighted averages of the batches seen. Variance is clamped
    at 1e-2 from below. normalize(x) = (x - mean) / std, denormalize(y) = y * std + mean.
    """

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5):
        super().__init__()
        self.beta, self.epsilon = beta, epsilon
        self.register_buffer("running_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("running_mean_sq", torch.zeros((), dtype=torch.float64))
        self.register_buffer("debiasing_term", torch.zeros((), dtype=torch.float64))

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().double()
        self.running_mean.mul_(self.beta).add_(x.mean() * (1.0 - self.beta))
        self.running_mean_sq.mul_(self.beta).add_(x.square().mean() * (1.0 - self.beta))
        self.debiasing_term.mul_(self.beta).add_(1.0 - self.beta)

    def mean_var(self) -> tuple[torch.Tensor, torch.Tensor]:
        debias = self.debiasing_term.clamp(min=self.epsilon)
        mean, mean_sq = self.running_mean / debias, self.running_mean_sq / debias
        return mean, (mean_sq - mean.square()).clamp(min=1e-2)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return ((x.double() - mean) / var.sqrt()).to(x.dtype)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean_var()
        return (x.double() * var.sqrt() + mean).to(x.dtype)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> torch.Tensor:
    """Generalized advantage estimates per agent for a rollout.

    rewards, values, next_values: [num_steps, num_envs, n_agents]; terminations, truncations:
    [num_steps, num_envs] (a world ends for all its agents at once). next_values[t] is the value of
    the observation that followed step t: the true final observation where an episode ended at t.
    A termination zeroes that bootstrap; a truncation keeps it. Either one stops the advantage
    from flowing back across the episode boundary.
    """
    terminations, truncations = terminations.unsqueeze(-1), truncations.unsqueeze(-1)
    bootstrap = 1.0 - terminations
    episode_continues = 1.0 - torch.maximum(terminations, truncations)
    deltas = rewards + gamma * next_values * bootstrap - values
    decays = (gamma * gae_lambda * episode_continues).expand_as(deltas)
    advantages = [deltas[-1]]
    for delta, decay in zip(reversed(deltas[:-1].unbind(0)), reversed(decays[:-1].unbind(0))):
        advantages.append(torch.addcmul(delta, decay, advantages[-1]))
    return torch.stack(advantages[::-1])


def make_agent(envs, args: Args | dict, device: torch.device) -> Agent:
    get = args.get if isinstance(args, dict) else lambda key: getattr(args, key)
    action_dim = envs.act_dim if envs.continuous else envs.num_actions
    return Agent(envs.obs_dim, envs.n_agents, action_dim, envs.continuous, get("independent"), get("hidden_size")).to(
        device
    )


def evaluate(
    model_path: str | Path,
    eval_episodes: int,
    device: torch.device,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
) -> list[float]:
    """Reload a model saved by this script and return the team returns (sum over agents) of the
    first episode of `eval_episodes` fresh environments, under the greedy policy (mean action,
    clipped to the bounds; or the most likely action)."""
    if capture_video:
        fail("--capture-video is not supported by mappo.py: VMAS renders through pyglet, which needs a display")
    model = load_model(model_path, "mappo")
    args = model["args"]
    envs = make_env(model["env_id"], eval_episodes, device, seed, args["continuous_actions"], args["max_episode_steps"])
    agent = make_agent(envs, args, device)
    agent.load_state_dict(model["agent"])
    returns = torch.full((eval_episodes,), torch.nan, device=device)
    obs = envs.reset()
    with torch.no_grad():
        while returns.isnan().any():  # one host read per step: fine for an evaluation
            action = agent.greedy(obs)
            if envs.continuous:
                action = torch.clamp(action, envs.action_low, envs.action_high)
            obs, _, _, _, _, info = envs.step(action)
            first = info["done"] & returns.isnan()
            returns = torch.where(first, info["episode_return"].sum(1), returns)
    envs.close()
    return returns.tolist()


if __name__ == "__main__":
    args = tyro.cli(Args)
    validate(args)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = make_env(args.env_id, args.num_envs, device, args.seed, args.continuous_actions, args.max_episode_steps)
    check_action_spaces(envs, args.env_id)
    n_agents, obs_dim = envs.n_agents, envs.obs_dim
    args.batch_size = args.num_envs * args.num_steps * n_agents
    args.minibatch_size = args.batch_size // args.num_minibatches
    checkpoint = load_checkpoint(args.resume, args) if args.resume else None
    stop = StopSignal()  # from here on, SIGTERM/SIGINT lead to a checkpoint and a clean exit
    run = Run(
        args,
        run_dir=Path(args.resume).parent if checkpoint else None,
        purge_step=checkpoint["global_step"] + 1 if checkpoint else None,
        wandb_id=checkpoint["wandb_id"] if checkpoint else None,
    )
    writer = run.writer

    agent = make_agent(envs, args, device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    value_norm = ValueNorm(args.value_norm_beta).to(device)
    normalize = value_norm.normalize if args.value_norm else (lambda x: x)
    denormalize = value_norm.denormalize if args.value_norm else (lambda x: x)

    # Rollout storage, allocated once on the device: [num_steps, num_envs, n_agents, ...].
    shape = (args.num_steps, args.num_envs, n_agents)
    obs = torch.zeros(shape + (obs_dim,), device=device)
    final_obs = torch.zeros(shape + (obs_dim,), device=device)
    if envs.continuous:
        actions = torch.zeros(shape + (envs.act_dim,), device=device)
    else:
        actions = torch.zeros(shape, dtype=torch.long, device=device)
    logprobs = torch.zeros(shape, device=device)
    rewards = torch.zeros(shape, device=device)
    terminations = torch.zeros(shape[:2], device=device)
    truncations = torch.zeros(shape[:2], device=device)
    # Finished episodes since the last log line: count, sum of team returns, sum of lengths, sums of per-agent returns.
    episode_stats = torch.zeros(3 + n_agents, dtype=torch.float64, device=device)

    global_step, start_iteration = 0, 1
    if checkpoint:
        agent.load_state_dict(checkpoint["agent"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        value_norm.load_state_dict(checkpoint["value_norm"])
        episode_stats.copy_(checkpoint["episode_stats"])
        restore_rng_state(checkpoint["rng"])
        global_step, start_iteration = checkpoint["global_step"], checkpoint["iteration"] + 1
        print(
            f"resuming at step {global_step}: {args.env_id} cannot be saved with the checkpoint, continuing with freshly reset environments",
            flush=True,
        )
    next_obs = envs.reset()

    def write_checkpoint(iteration: int) -> Path:
        path = run.dir / CHECKPOINT_NAME
        writer.flush()  # the curve up to this step is on disk before the checkpoint that resumes it
        save_checkpoint(
            path,
            args,
            global_step=global_step,
            iteration=iteration,
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            value_norm=value_norm.state_dict(),
            episode_stats=episode_stats.cpu(),
            wandb_id=run.wandb_id,
        )
        return path

    progress = Progress(
        args.total_timesteps, start_step=global_step, label=f"{args.env_id} {args.exp_name} ({args.critic} critic)"
    )
    progress.update(global_step)
    next_checkpoint = (
        (global_step // args.checkpoint_every + 1) * args.checkpoint_every if args.checkpoint_every else None
    )
    start_time, start_step = time.time(), global_step

    for iteration in range(start_iteration, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # Rollout: everything stays on the device.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                action, logprobs[step] = agent.sample(next_obs)
                actions[step] = action
                if envs.continuous:  # the environment gets the clipped action, the policy keeps the sample
                    action = torch.clamp(action, envs.action_low, envs.action_high)
                next_obs, reward, terminated, truncated, final_obs[step], info = envs.step(action)
                rewards[step] = reward
                terminations[step] = terminated.float()
                truncations[step] = truncated.float()
                done = info["done"].double()
                episode_return = info["episode_return"].double() * done.unsqueeze(1)
                episode_stats += torch.cat(
                    [
                        torch.stack([done.sum(), episode_return.sum(), (info["episode_length"] * done).sum()]),
                        episode_return.sum(0),
                    ]
                )

            # Values of the whole rollout in batched passes, in the targets' units. A truncated
            # episode is bootstrapped with the value of its true final observation.
            critic_in = agent.critic_input(obs)
            old_values = agent.value(critic_in)  # what the critic predicts (normalised units)
            values = denormalize(old_values)
            next_values = torch.cat([values[1:], denormalize(agent.value(agent.critic_input(next_obs)))[None]])
            final_values = denormalize(agent.value(agent.critic_input(final_obs)))
            next_values = torch.where(truncations.unsqueeze(-1) > 0, final_values, next_values)
            advantages = compute_gae(
                rewards, values, next_values, terminations, truncations, args.gamma, args.gae_lambda
            )
            returns = advantages + values
            if args.value_norm:
                value_norm.update(returns)
            targets = normalize(returns)
            b_actor_in = agent.actor_input(obs).reshape(args.batch_size, -1)
            b_critic_in = critic_in.reshape(args.batch_size, -1)
            b_actions = actions.reshape(args.batch_size, *actions.shape[3:])
            b_logprobs, b_advantages = logprobs.reshape(-1), advantages.reshape(-1)
            b_targets, b_old_values = targets.reshape(-1), old_values.reshape(-1)

        # Optimise the policy and value network on (step, environment, agent) samples.
        clipfracs = []
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                newlogprob, entropy = agent.log_prob_entropy(b_actor_in[mb_inds], b_actions[mb_inds])
                newvalue = agent.value(b_critic_in[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean())

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss, in normalised units
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_targets[mb_inds]) ** 2
                    v_clipped = b_old_values[mb_inds] + torch.clamp(
                        newvalue - b_old_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_targets[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_targets[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        # Logging: one device-to-host read every --log-every iterations (and at the end).
        last = iteration == args.num_iterations or bool(stop)
        if iteration % args.log_every == 0 or last:
            with torch.no_grad():
                var_y = returns.var()
                explained_var = torch.where(var_y == 0, torch.nan, 1 - (returns - values).var() / var_y)
                stats = torch.stack(
                    [
                        v_loss,
                        pg_loss,
                        entropy_loss,
                        old_approx_kl,
                        approx_kl,
                        torch.stack(clipfracs).mean(),
                        explained_var,
                    ]
                ).tolist()
                finished, team_sum, length_sum, *agent_sums = episode_stats.tolist()
                episode_stats.zero_()
            for name, value in zip(
                [
                    "value_loss",
                    "policy_loss",
                    "entropy",
                    "old_approx_kl",
                    "approx_kl",
                    "clipfrac",
                    "explained_variance",
                ],
                stats,
            ):
                writer.add_scalar(f"losses/{name}", value, global_step)
            if finished > 0:  # the mean over the episodes that ended since the last log line
                writer.add_scalar("charts/episodic_return", team_sum / finished, global_step)
                for agent_index, agent_sum in enumerate(agent_sums):
                    writer.add_scalar(f"charts/episodic_return_agent{agent_index}", agent_sum / finished, global_step)
                writer.add_scalar("charts/episodic_length", length_sum / finished, global_step)
                progress.add_returns([team_sum / finished])
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/SPS", int((global_step - start_step) / (time.time() - start_time)), global_step)
            progress.update(global_step)
            for name, value in zip(["value_loss", "policy_loss", "entropy"], stats):
                if not np.isfinite(value):
                    path = write_checkpoint(iteration)
                    fail(
                        f"losses/{name} is {value} at step {global_step} (iteration {iteration}); checkpoint written to {path}"
                    )

        if stop or (next_checkpoint is not None and global_step >= next_checkpoint):
            path = write_checkpoint(iteration)
            if next_checkpoint is not None:
                next_checkpoint = (global_step // args.checkpoint_every + 1) * args.checkpoint_every
            if stop:
                print(f"\n{stop.received}: checkpoint written to {path}; continue with --resume {path}", flush=True)
                envs.close()
                run.close()
                raise SystemExit(0)

    progress.close(global_step)

    if args.save_model:
        model_path = run.dir / f"{args.exp_name}.cleanrl_model"
        save_model(
            model_path,
            args,
            agent=agent.state_dict(),
            value_norm=value_norm.state_dict(),
            n_agents=n_agents,
            obs_dim=obs_dim,
        )
        print(f"model saved to {model_path}")
        episodic_returns = evaluate(model_path, args.eval_episodes, device, seed=args.seed + 1_000)
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"evaluation over {len(episodic_returns)} episodes: {np.mean(episodic_returns):.2f} +- {np.std(episodic_returns):.2f}"
        )

    envs.close()
    run.close()
