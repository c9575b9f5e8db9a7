"""Multi-Agent PPO (MAPPO) and independent PPO (IPPO) for cooperative multi-agent tasks.

Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"
(https://arxiv.org/abs/2103.01955): one actor and one critic shared by all agents, each fed the agent's
one-hot id; the centralised critic sees the global state (every agent's observation, `global_state`).
`--independent`: the critic sees only the agent's own observation, IPPO (de Witt et al. 2020,
https://arxiv.org/abs/2011.09533). Kept from MAPPO: value normalisation (ValueNorm), GAE per agent,
clipped surrogate and value loss, entropy bonus, gradient clipping, learning-rate annealing. Where ours differs
from MAPPO's code: ValueNorm is updated once per rollout (MAPPO: with every minibatch's returns), the value loss is
squared (MAPPO's default: Huber) and advantages are normalised per minibatch (CleanRL's; MAPPO: over the rollout).

Actions: continuous (default; a Gaussian policy, the sample clipped to the bounds for the simulator) or
discrete (`--no-continuous-actions`), one action space for all agents. Environments: VMAS scenarios
(`vmas/navigation`, torch-batched on the training device) and mpe2 tasks (`mpe/simple_spread_v3`).
Neither simulator can be saved: `--resume` continues with freshly reset environments.

    uv run python cleanrl/mappo.py --env-id vmas/navigation
    uv run python cleanrl/mappo.py --env-id vmas/balance --independent --exp-name ippo

Expect the team return (sum over agents) on vmas/navigation to go from about -3 (random) to ~13 and on
vmas/balance from about -28 to ~69 within 300k steps (benchmark/results/mappo.md).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import tyro

from cleanrl_utils.checkpoint import load_model
from cleanrl_utils.envs.multiagent import check_env_id, make_env
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
    """if toggled, use a GPU when one is present (the CPU otherwise); VMAS simulates there too"""
    track: bool = False
    """if toggled, mirror the run to Weights & Biases (offline when there is no network or API key)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """not supported (VMAS renders through pyglet, which needs a display); must stay off"""
    save_model: bool = False
    """if toggled, save the model at the end and evaluate the reloaded copy"""
    checkpoint_every: int = 0
    """write a checkpoint every this many environment steps (0: only on SIGTERM/SIGINT)"""
    resume: str | None = None
    """path of a checkpoint to continue from (run the original command with this flag added)"""
    env_id: str = "vmas/navigation"
    """the task: vmas/<scenario> or mpe/<task> (cleanrl_utils.envs.multiagent.KNOWN_ENV_IDS)"""
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
    ent_coef: float | None = None
    """coefficient of the entropy (None: 0.01 for discrete actions (Yu et al. 2022), 0.0 for continuous)"""
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
    [..., n_agents * obs_dim]. For MPE this is exactly mpe2's state(); VMAS has no state of its own."""
    return obs.flatten(start_dim=-2)


def validate(args: Args) -> None:
    """Check the arguments and the task before any work; fail in one line. Fills in the runtime fields."""
    check_env_id(args.env_id)
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
            "--checkpoint-every and --torch-threads must be 0 or positive, "
            f"got {args.checkpoint_every} and {args.torch_threads}"
        )
    if not 0 < args.gamma <= 1 or not 0 <= args.gae_lambda <= 1 or not 0 < args.value_norm_beta < 1:
        fail(
            f"--gamma must be in (0, 1], --gae-lambda in [0, 1] and --value-norm-beta in (0, 1), "
            f"got {args.gamma}, {args.gae_lambda} and {args.value_norm_beta}"
        )
    if args.capture_video:
        fail(
            f"--capture-video is not supported by {os.path.basename(__file__)}: VMAS renders through pyglet (a display)"
        )
    rollout = args.num_envs * args.num_steps
    if rollout % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the rollout of {rollout} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps}), whose agents are split with it"
        )
    args.num_iterations = args.total_timesteps // rollout
    if args.num_iterations == 0:
        fail(f"--total-timesteps {args.total_timesteps} is less than one rollout of {rollout} steps")
    probe = make_env(args.env_id, 1, torch.device("cpu"), args.seed, args.continuous_actions, args.max_episode_steps)
    check_action_spaces(probe, args.env_id)
    probe.close()
    args.critic = "independent" if args.independent else "centralised"
    if args.ent_coef is None:
        args.ent_coef = 0.0 if args.continuous_actions else 0.01
    args.batch_size = rollout * probe.n_agents
    args.minibatch_size = args.batch_size // args.num_minibatches


def check_action_spaces(envs, env_id: str) -> None:
    """One policy is shared by all agents, so they need one action space (with the same bounds)."""
    if not envs.same_action_space:
        fail(
            f"{env_id}: the agents have different action spaces ({', '.join(map(str, envs.action_spaces))}); "
            f"{os.path.basename(__file__)} shares one policy across agents and needs one action space"
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
    advantages = torch.zeros_like(rewards)
    last_advantage = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last_advantage = deltas[t] + gamma * gae_lambda * episode_continues[t] * last_advantage
        advantages[t] = last_advantage
    return advantages


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
        fail(
            f"--capture-video is not supported by {os.path.basename(__file__)}: VMAS renders through pyglet (a display)"
        )
    model = load_model(model_path, __file__)
    args = model["args"]
    envs = make_env(model["env_id"], eval_episodes, device, seed, args["continuous_actions"], args["max_episode_steps"])
    agent = make_agent(envs, args, device)
    agent.load_state_dict(model["agent"])
    returns = torch.full((eval_episodes,), torch.nan, device=device)
    obs = envs.reset()
    with torch.no_grad():
        for _ in range(envs.max_episode_steps):  # every world ends a first episode within the time limit
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
    run = Run(args, __file__)  # seeds, picks the device, checks --resume, makes the run directory
    device = run.device
    envs = make_env(args.env_id, args.num_envs, device, args.seed, args.continuous_actions, args.max_episode_steps)
    n_agents, obs_dim = envs.n_agents, envs.obs_dim

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

    global_step, iteration = 0, 0
    if run.checkpoint:
        agent.load_state_dict(run.checkpoint["agent"])
        optimizer.load_state_dict(run.checkpoint["optimizer"])
        value_norm.load_state_dict(run.checkpoint["value_norm"])
        global_step = run.checkpoint["global_step"]
        iteration = global_step // (args.num_envs * args.num_steps)
        print(f"resuming at step {global_step} with freshly reset environments (VMAS and mpe2 state cannot be saved)")
    next_obs = envs.reset()

    def training_state() -> dict:
        """What a checkpoint holds; resuming reads back each of these."""
        return dict(
            agent=agent.state_dict(),
            optimizer=optimizer.state_dict(),
            value_norm=value_norm.state_dict(),
            global_step=global_step,
        )

    run.begin(training_state)
    while iteration < args.num_iterations:
        iteration += 1
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate

        # 1. Collect a rollout; everything stays on the device.
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                action, logprobs[step] = agent.sample(next_obs)
                actions[step] = action
                if envs.continuous:  # the environment gets the clipped action, the policy keeps the sample
                    action = torch.clamp(action, envs.action_low, envs.action_high)
                next_obs, rewards[step], terminated, truncated, final_obs[step], _ = envs.step(action)
                terminations[step] = terminated.float()
                truncations[step] = truncated.float()

            # 2. Advantages: values of the whole rollout in batched passes, in the targets' units. A
            # truncated episode is bootstrapped with the value of its true final observation.
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

        # 3. Update the policy and value network on shuffled (step, environment, agent) samples.
        clipped = torch.zeros((), device=device)
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
                    clipped += ((ratio - 1.0).abs() > args.clip_coef).float().mean()

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
                    v_delta = torch.clamp(newvalue - b_old_values[mb_inds], -args.clip_coef, args.clip_coef)
                    v_loss_clipped = (b_old_values[mb_inds] + v_delta - b_targets[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_targets[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        # 4. Log every --log-every iterations (one host read for the episodes, one for the losses)
        # and checkpoint when due.
        if iteration % args.log_every == 0 or iteration == args.num_iterations:
            scalars = {}
            if (episodes := envs.read_episodes()) is not None:  # the means over the episodes since the last log
                run.log_episodes(global_step, returns=[episodes.team_return], lengths=[episodes.length])
                scalars = episodes.agent_scalars()
            var_y = returns.var()
            explained_var = torch.where(var_y == 0, torch.nan, 1 - (returns - values).var() / var_y)
            run.log(
                global_step,
                {
                    **scalars,
                    "losses/value_loss": v_loss,
                    "losses/policy_loss": pg_loss,
                    "losses/entropy": entropy_loss,
                    "losses/old_approx_kl": old_approx_kl,
                    "losses/approx_kl": approx_kl,
                    "losses/clipfrac": clipped / (args.update_epochs * args.num_minibatches),
                    "losses/explained_variance": explained_var,
                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                },
            )
        run.end_iteration(global_step)

    envs.close()
    run.finish(
        global_step,
        evaluate,
        agent=agent.state_dict(),
        value_norm=value_norm.state_dict(),
        n_agents=n_agents,
        obs_dim=obs_dim,
    )
