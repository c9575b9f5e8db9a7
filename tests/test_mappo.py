"""mappo.py: value normalisation and per-agent GAE against plain references, the actor's and critics'
inputs; the script's own loop run under tests/probe.py, MAPPO (discrete) and IPPO (continuous): stored
rows, log-probabilities, the critic's input, values, GAE, ValueNorm, targets and every minibatch's loss and
gradients; smoke runs on VMAS and MPE, bad input, checkpoints with SIGKILL / SIGTERM and resume (with fresh
environments), and --save-model evaluation."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import mappo
import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    script_env,
    sigterm_while_training,
)
from update_reference import assert_gradients_match, gradients, leaves

SCRIPT = "mappo.py"
TINY = ["--num-envs", "4", "--num-steps", "10", "--num-minibatches", "2", "--update-epochs", "2", "--hidden-size", "16"]
LOSS_KEYS = [
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]
EPISODE_KEYS = ["charts/episodic_return", "charts/episodic_length"]
MEAN_AGENT = "charts/episodic_return_mean_agent"


def load(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# --- value normalisation ----------------------------------------------------------------------------


def test_value_norm_round_trips_and_follows_a_known_stream():
    rng = np.random.default_rng(0)
    beta = 0.9
    norm = mappo.ValueNorm(beta)
    batches = [rng.normal(5.0 * i, 1.0 + i, size=(3, 4, 2)) for i in range(6)]
    # Reference: debiased exponential moving averages of each batch's mean and mean square.
    weights = np.array([beta ** (len(batches) - 1 - i) * (1 - beta) for i in range(len(batches))])
    for batch in batches:
        norm.update(torch.tensor(batch, dtype=torch.float32))
    means = np.array([b.mean() for b in batches], dtype=np.float64)
    squares = np.array([np.square(b).mean() for b in batches], dtype=np.float64)
    want_mean = (weights * means).sum() / weights.sum()
    want_var = (weights * squares).sum() / weights.sum() - want_mean**2
    mean, var = norm.mean_var()
    assert mean.item() == pytest.approx(want_mean, rel=1e-5)
    assert var.item() == pytest.approx(want_var, rel=1e-4)
    x = torch.tensor(rng.normal(20.0, 10.0, size=(7, 3)), dtype=torch.float32)
    y = norm.normalize(x)
    assert y.dtype == torch.float32
    np.testing.assert_allclose(y.numpy(), (x.double().numpy() - want_mean) / np.sqrt(want_var), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x, rtol=1e-6, atol=1e-5)
    # With MAPPO's beta (0.99999) a few updates weigh the batches equally: the plain mean and variance.
    slow = mappo.ValueNorm()
    for batch in batches:
        slow.update(torch.tensor(batch))
    mean, var = slow.mean_var()
    assert mean.item() == pytest.approx(means.mean(), rel=1e-4)
    assert var.item() == pytest.approx(squares.mean() - means.mean() ** 2, rel=1e-3)
    # The statistics are buffers: they travel in state_dict (checkpoints, saved model).
    restored = mappo.ValueNorm()
    restored.load_state_dict(slow.state_dict())
    assert torch.equal(restored.normalize(x), slow.normalize(x))


def test_value_norm_before_any_update_is_finite():
    norm = mappo.ValueNorm()
    x = torch.tensor([1.0, -2.0])
    assert torch.isfinite(norm.normalize(x)).all()
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x)


# --- GAE per agent ------------------------------------------------------------------------------


def reference_gae(rewards, values, next_values, terminations, truncations, gamma, lam):
    """Plain per-environment, per-agent Python loop over time, written from the definition."""
    num_steps, num_envs, n_agents = rewards.shape
    advantages = np.zeros_like(rewards)
    for env in range(num_envs):
        for agent in range(n_agents):
            running = 0.0
            for t in reversed(range(num_steps)):
                term, trunc = terminations[t][env], truncations[t][env]
                bootstrap = 0.0 if term else gamma * next_values[t][env][agent]
                delta = rewards[t][env][agent] + bootstrap - values[t][env][agent]
                running = delta if (term or trunc) else delta + gamma * lam * running
                advantages[t][env][agent] = running
    return advantages


def test_gae_per_agent_matches_python_loop_with_terminations_and_truncations():
    rng = np.random.default_rng(0)
    rewards, values, next_values = (rng.normal(size=(9, 3, 2)) for _ in range(3))
    terminations, truncations = np.zeros((9, 3)), np.zeros((9, 3))
    terminations[3, 0] = truncations[5, 1] = terminations[-1, 2] = truncations[-1, 0] = 1
    expected = reference_gae(rewards, values, next_values, terminations, truncations, 0.99, 0.95)
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    got = mappo.compute_gae(t(rewards), t(values), t(next_values), t(terminations), t(truncations), 0.99, 0.95)
    assert got.shape == (9, 3, 2)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)
    # The truncated step keeps its bootstrap, the terminated one loses it.
    assert got[5, 1, 0].item() == pytest.approx(
        rewards[5, 1, 0] + 0.99 * next_values[5, 1, 0] - values[5, 1, 0], rel=1e-5
    )
    assert got[3, 0, 1].item() == pytest.approx(rewards[3, 0, 1] - values[3, 0, 1], rel=1e-5)


# --- the shared networks' inputs ----------------------------------------------------------------------


@pytest.mark.parametrize("independent", [False, True])
def test_actor_and_critic_inputs_in_agent_order(independent):
    n_agents, obs_dim = 3, 2
    agent = mappo.Agent(obs_dim, n_agents, 5, continuous=False, independent=independent, hidden=8)
    obs = torch.arange(2 * n_agents * obs_dim, dtype=torch.float32).reshape(2, n_agents, obs_dim)  # [envs, agents, obs]
    actor_in, critic_in = agent.actor_input(obs), agent.critic_input(obs)
    eye = torch.eye(n_agents)
    for env in range(2):
        for i in range(n_agents):
            assert torch.equal(actor_in[env, i], torch.cat([obs[env, i], eye[i]]))
            own = obs[env, i] if independent else torch.cat([obs[env, j] for j in range(n_agents)])
            assert torch.equal(critic_in[env, i], torch.cat([own, eye[i]]))
    assert agent.critic[0].in_features == critic_in.shape[-1]


def test_mpe_global_state_is_mpe2_state():
    envs = mappo.make_env("mpe/simple_spread_v3", 2, torch.device("cpu"), 0, False, None)
    obs = envs.reset()
    for _ in range(3):
        obs, *_ = envs.step(torch.randint(0, envs.num_actions, (2, envs.n_agents)))
    for index in range(2):
        np.testing.assert_allclose(mappo.global_state(obs)[index].numpy(), envs.envs[index].state(), rtol=1e-6)


# --- the loop's own wiring ----------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on probe/walk (tests/probe_multiagent_envs.py: three agents whose
# worlds terminate and truncate every few steps); at every loss's backward() the probe copies the rollout storage,
# the batches, the minibatch's indices, the agent, the value normaliser and the optimiser. The tests replay the
# environment with the stored actions, and recompute values, GAE, value-normalisation statistics, targets and every
# minibatch's loss with plain code of their own, and each backward()'s gradients (the probe's grads) as that loss's in
# float64, with the rollout's advantages, targets, values and log-probabilities held constant. Two runs: discrete
# actions with the centralised critic (MAPPO, Yu et al.'s entropy coefficient 0.01), and continuous actions with
# --independent (IPPO, under its own --exp-name, with --save-model, and a 1e-4 entropy coefficient: its default is 0).
# --vf-coef 0.5, so that a value coefficient left out or misplaced shows.
WIRING = ["--env-id", "probe/walk", "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "2"]
WIRING += ["--update-epochs", "2", "--hidden-size", "16", "--total-timesteps", "96", "--gamma", "0.9"]
WIRING += ["--gae-lambda", "0.8", "--value-norm-beta", "0.9", "--vf-coef", "0.5"]
WIRING_RUNS = {
    "mappo": ["--no-continuous-actions"],
    "ippo": ["--independent", "--exp-name", "ippo", "--save-model", "--eval-episodes", "2", "--ent-coef", "1e-4"],
}
ENT_COEF, VF_COEF = {"mappo": 0.01, "ippo": 1e-4}, 0.5
# Measured: float32 against the float64 reference, the worst error is 1.6e-5 (the critic's last bias at iteration 2's
# first minibatch: its gradient, -7.4e-4, is the mean of residuals of mean magnitude 0.81, so rounding dominates; every
# other tensor 3e-6 or less). The entropy's sign flipped moves the MAPPO run's actor by 1.0e-4 (near-uniform policies:
# the entropy's gradient is small) and the IPPO run's actor_logstd by 1.3e-3. Between them, with room either way:
GRAD_RTOL = 4e-5
AT_BACKWARD = ["obs", "actions", "logprobs", "rewards", "terminations", "truncations", "final_obs", "next_obs"]
AT_BACKWARD += ["b_critic_in", "b_targets", "b_advantages", "b_old_values", "mb_inds", "agent", "value_norm"]
AT_BACKWARD += ["optimizer", "iteration"]
GAMMA, LAM, BETA, CLIP, ENVS, STEPS, N_AGENTS = 0.9, 0.8, 0.9, 0.2, 4, 8, 3


@pytest.fixture(scope="module", params=list(WIRING_RUNS))
def wiring(request, tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp(request.param)
    flags = WIRING + WIRING_RUNS[request.param]
    trace = probe_script(
        SCRIPT, flags, cwd, at_backward=AT_BACKWARD, grads=["agent"], preload=["probe_multiagent_envs"]
    )
    iterations = {}
    for update in trace.backward:
        iterations.setdefault(update["iteration"], []).append(update)
    continuous, independent = request.param == "ippo", request.param == "ippo"
    return SimpleNamespace(
        trace=trace,
        cwd=cwd,
        iterations=iterations,
        continuous=continuous,
        independent=independent,
        ent_coef=ENT_COEF[request.param],
    )


def plain_mlp(weights: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """Linear, tanh, linear, tanh, linear, from a state dict's `prefix`.0/.2/.4 weights."""
    for layer in (0, 2, 4):
        x = x @ weights[f"{prefix}.{layer}.weight"].T + weights[f"{prefix}.{layer}.bias"]
        x = torch.tanh(x) if layer < 4 else x
    return x


def one_hot_ids(obs: torch.Tensor) -> torch.Tensor:
    return torch.eye(obs.shape[-2], dtype=obs.dtype).expand(*obs.shape[:-1], obs.shape[-2])


def plain_critic(weights: dict, obs: torch.Tensor, independent: bool) -> torch.Tensor:
    """V of every agent, [..., n_agents], from the state: all agents' observations in agent order (MAPPO) or the
    agent's own (IPPO), then the agent's one-hot id."""
    seen = obs if independent else obs.flatten(-2).unsqueeze(-2).expand(*obs.shape[:-1], obs.shape[-2] * obs.shape[-1])
    return plain_mlp(weights, "critic", torch.cat([seen, one_hot_ids(obs)], -1)).squeeze(-1)


def plain_policy(weights: dict, obs: torch.Tensor, actions: torch.Tensor, continuous: bool):
    """(log-probability, entropy) of each agent's action under the shared actor fed [own observation, id]."""
    out = plain_mlp(weights, "actor", torch.cat([obs, one_hot_ids(obs)], -1))
    if continuous:
        log_std = weights["actor_logstd"].expand_as(out)
        log_prob = -((actions - out) ** 2) / (2 * torch.exp(2 * log_std)) - log_std - 0.5 * np.log(2 * np.pi)
        return log_prob.sum(-1), (0.5 + 0.5 * np.log(2 * np.pi) + log_std).sum(-1)
    log_p = torch.log_softmax(out, -1)
    return log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def norm_stats(state: dict | None) -> tuple[float, float]:
    """ValueNorm's (mean, std) from its buffers, written out: debiased averages, variance at least 1e-2."""
    if state is None:
        return 0.0, 0.1
    debias = max(state["debiasing_term"].item(), 1e-5)
    mean, mean_sq = state["running_mean"].item() / debias, state["running_mean_sq"].item() / debias
    return mean, np.sqrt(max(mean_sq - mean**2, 1e-2))


def test_the_loop_stores_what_the_environment_returned_for_the_actions_it_sampled(wiring):
    from probe_multiagent_envs import make_walk

    iterations = [updates[0] for _, updates in sorted(wiring.iterations.items())]
    assert len(iterations) == 3 and all(len(updates) == 4 for updates in wiring.iterations.values())
    envs = make_walk(ENVS, torch.device("cpu"), 1, wiring.continuous)  # the script's seed
    expected_obs = envs.reset()
    ended = {"terminations": 0, "truncations": 0, "both": 0}
    clipped = 0
    for rollout in iterations:
        for t in range(STEPS):
            assert torch.equal(rollout["obs"][t], expected_obs), f"obs at step {t}"
            actions = rollout["actions"][t]
            if wiring.continuous:  # the policy's sample is stored; the environment gets it clipped to the bounds
                clipped += int((actions.abs() > 1).sum())
                actions = actions.clamp(-1, 1)
            expected_obs, rewards, terminated, truncated, final_obs, _ = envs.step(actions)
            assert torch.equal(rollout["rewards"][t], rewards)
            assert rollout["terminations"][t].tolist() == terminated.float().tolist()
            assert rollout["truncations"][t].tolist() == truncated.float().tolist()
            assert torch.equal(rollout["final_obs"][t], final_obs)
            ended["terminations"] += int(terminated.sum())
            ended["truncations"] += int(truncated.sum())
            ended["both"] += int((terminated & truncated).sum())
        assert torch.equal(rollout["next_obs"], expected_obs)
    assert ended["terminations"] >= 5 and ended["truncations"] >= 5, ended
    assert not wiring.continuous or clipped > 20


def test_values_gae_value_normalisation_and_targets_match_a_plain_computation(wiring):
    previous_norm = None
    for k, (iteration, updates) in enumerate(sorted(wiring.iterations.items())):
        rollout = updates[0]  # the weights before this iteration's first optimiser step: those that collected it
        weights = rollout["agent"]
        # The stored log-probabilities are the acting policy's, of the stored (unclipped) actions.
        log_prob, _ = plain_policy(weights, rollout["obs"], rollout["actions"], wiring.continuous)
        torch.testing.assert_close(rollout["logprobs"], log_prob, rtol=1e-5, atol=1e-5)
        # The critic sees the global state (MAPPO) or the agent's own observation (IPPO), with the agent's id.
        obs = rollout["obs"]
        seen = obs if wiring.independent else obs.flatten(-2).unsqueeze(-2).expand(STEPS, ENVS, N_AGENTS, -1)
        assert torch.equal(rollout["b_critic_in"], torch.cat([seen, one_hot_ids(obs)], -1).reshape(96, -1))
        # Values in return units: the critic's normalised outputs de-normalised with the statistics from before
        # this rollout; each step bootstrapped from the value of its true next observation (final_obs).
        mean, std = norm_stats(previous_norm)
        with torch.no_grad():
            raw = plain_critic(weights, obs, wiring.independent).double()
            next_values = (plain_critic(weights, rollout["final_obs"], wiring.independent) * std + mean).double()
        values = raw * std + mean
        rewards, term, trunc = (rollout[name].double() for name in ("rewards", "terminations", "truncations"))
        advantages = torch.zeros_like(values)
        for env in range(ENVS):
            for agent in range(N_AGENTS):
                running = 0.0
                for t in reversed(range(STEPS)):
                    bootstrap = 0.0 if term[t, env] else GAMMA * next_values[t, env, agent]
                    delta = rewards[t, env, agent] + bootstrap - values[t, env, agent]
                    running = delta if term[t, env] or trunc[t, env] else delta + GAMMA * LAM * running
                    advantages[t, env, agent] = running
        np.testing.assert_allclose(rollout["b_advantages"].numpy(), advantages.flatten().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(rollout["b_old_values"].numpy(), raw.flatten().numpy(), rtol=1e-5, atol=1e-6)
        # The statistics take in this rollout's returns (an EMA of batch means, debiased), and the critic's
        # targets are the returns normalised with the updated statistics.
        returns = advantages + values
        old = previous_norm or {key: torch.zeros((), dtype=torch.float64) for key in rollout["value_norm"]}
        want = {
            "running_mean": BETA * old["running_mean"] + (1 - BETA) * returns.mean(),
            "running_mean_sq": BETA * old["running_mean_sq"] + (1 - BETA) * returns.square().mean(),
            "debiasing_term": BETA * old["debiasing_term"] + (1 - BETA),
        }
        for key, value in want.items():
            assert rollout["value_norm"][key].item() == pytest.approx(value.item(), rel=1e-5), key
        mean, std = norm_stats(rollout["value_norm"])
        np.testing.assert_allclose(
            rollout["b_targets"].numpy(), ((returns - mean) / std).flatten().numpy(), rtol=1e-4, atol=1e-5
        )
        assert k == 0 or abs(mean) > 0.1, "the statistics should be away from (0, 1) for this test to mean anything"
        # Learning-rate annealing: from 3e-4 at the first iteration down by 1/3 per iteration.
        assert rollout["optimizer"]["param_groups"][0]["lr"] == pytest.approx(3e-4 * (1 - (iteration - 1) / 3))
        previous_norm = rollout["value_norm"]


def test_every_gradient_step_is_the_gradient_of_the_clipped_ppo_loss_of_its_minibatch(wiring):
    for iteration, updates in wiring.iterations.items():
        first = updates[0]
        obs = first["obs"].reshape(96, -1).double()
        actions = first["actions"].reshape(96, *first["actions"].shape[3:])
        actions = actions.double() if wiring.continuous else actions
        # Flattened in (step, env, agent) order: sample (t * envs + e) * agents + i is agent i of world e at step t.
        agents = torch.arange(96) % N_AGENTS
        # The rollout's constants: behaviour log-probabilities, GAE advantages, the critic's old outputs and the
        # normalised return targets (computed before the update, without gradient).
        behaviour, advantages = first["logprobs"].reshape(-1).double(), first["b_advantages"].double()
        old_values, targets = first["b_old_values"].double(), first["b_targets"].double()
        covered = []
        for k, update in enumerate(updates):
            mb, where = update["mb_inds"], f"iteration {iteration}, minibatch {k}"
            covered.append(mb)
            # The agents' observations stacked as [B, 1, obs] with each sample's own id appended by hand.
            actor_in = torch.cat([obs[mb], torch.eye(N_AGENTS, dtype=torch.float64)[agents[mb]]], -1)
            weights = leaves(update["agent"], only=lambda name: name != "agent_ids")
            out = plain_mlp(weights, "actor", actor_in)
            if wiring.continuous:
                log_std = weights["actor_logstd"].expand_as(out)
                dist_log_prob = -((actions[mb] - out) ** 2) / (2 * torch.exp(2 * log_std)) - log_std
                new_log_prob = (dist_log_prob - 0.5 * np.log(2 * np.pi)).sum(-1)
                entropy = (0.5 + 0.5 * np.log(2 * np.pi) + log_std).sum(-1)
            else:
                log_p = torch.log_softmax(out, -1)
                new_log_prob = log_p[torch.arange(len(mb)), actions[mb]]
                entropy = -(log_p.exp() * log_p).sum(-1)
            new_value = plain_mlp(weights, "critic", first["b_critic_in"][mb].double()).squeeze(-1)
            ratio = torch.exp(new_log_prob - behaviour[mb])
            adv = advantages[mb]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
            old_value, target = old_values[mb], targets[mb]
            clipped_value = old_value + (new_value - old_value).clamp(-CLIP, CLIP)
            v_loss = 0.5 * torch.max((new_value - target) ** 2, (clipped_value - target) ** 2).mean()
            loss = pg_loss - wiring.ent_coef * entropy.mean() + VF_COEF * v_loss
            assert_gradients_match(update["grads"]["agent"], gradients(loss, weights), where, GRAD_RTOL)
            assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-4, abs=1e-6), where
        for epoch in range(2):  # each epoch's minibatches split one permutation of the batch
            assert sorted(torch.cat(covered[2 * epoch : 2 * epoch + 2]).tolist()) == list(range(96))


def test_the_probe_runs_log_every_loss_and_the_ippo_run_saves_under_its_own_name(wiring):
    (run_dir,) = run_dirs(wiring.cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, LOSS_KEYS + EPISODE_KEYS + [f"charts/episodic_return_agent{i}" for i in range(3)])
    assert [step for step, _ in scalars["losses/value_loss"]] == [32, 64, 96]
    args = load_args(run_dir)
    if wiring.independent:
        # benchmark/mappo.sh runs IPPO as --exp-name ippo: its run, model and evaluation carry that name,
        # while the model still names mappo.py as the script that saved it.
        assert "__ippo__" in run_dir.name and args["critic"] == "independent" and args["ent_coef"] == 1e-4
        model = load(run_dir / "ippo.cleanrl_model")
        assert model["script"] == "mappo" and model["exp_name"] == "ippo"
        assert len(scalars["eval/episodic_return"]) == 2
    else:
        assert args["critic"] == "centralised" and args["continuous_actions"] is False and args["ent_coef"] == 0.01


# --- smoke runs -----------------------------------------------------------------------------------


def smoke(workdir, *flags: str) -> tuple:
    result = run_script(SCRIPT, *TINY, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = run_dirs(workdir)
    return result, run_dir, read_scalars(run_dir)


def test_smoke_vmas_navigation_continuous_with_save_model_and_evaluation(workdir):
    # 12-step episodes: 80 steps per env finish several, and the evaluation plays 3 of them.
    result, run_dir, scalars = smoke(
        workdir,
        "--env-id",
        "vmas/navigation",
        "--total-timesteps",
        "160",
        "--max-episode-steps",
        "12",
        "--save-model",
        "--eval-episodes",
        "3",
    )
    agents = [f"charts/episodic_return_agent{i}" for i in range(4)]  # navigation has 4 agents
    assert_finite_keys(scalars, LOSS_KEYS + EPISODE_KEYS + agents + [MEAN_AGENT, "eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 4 and len(scalars["eval/episodic_return"]) == 3
    team = scalars["charts/episodic_return"]
    per_agent = [scalars[key] for key in agents]
    for index, (step, value) in enumerate(team):  # the team return is the sum of the agents' returns
        assert value == pytest.approx(sum(series[index][1] for series in per_agent), rel=1e-4, abs=1e-4)
        assert scalars[MEAN_AGENT][index] == (step, pytest.approx(value / 4, rel=1e-4, abs=1e-4))
    assert all(length == 12 for _, length in scalars["charts/episodic_length"])
    model = load(run_dir / "mappo.cleanrl_model")
    assert model["script"] == "mappo" and model["args"]["critic"] == "centralised"
    assert model["args"]["batch_size"] == 4 * 10 * 4 and model["args"]["ent_coef"] == 0.0  # continuous actions
    assert set(model["value_norm"]) == {"running_mean", "running_mean_sq", "debiasing_term"}
    assert model["value_norm"]["debiasing_term"] > 0  # updated: the statistics are saved
    evaluated = subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.evaluate", str(run_dir), "--episodes", "2"],
        cwd=ROOT,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "mappo.py on vmas/navigation" in evaluated.stdout and "over 2 episodes" in evaluated.stdout


def test_smoke_mpe_simple_spread_discrete(workdir):
    _, _, scalars = smoke(
        workdir, "--env-id", "mpe/simple_spread_v3", "--no-continuous-actions", "--total-timesteps", "120"
    )
    assert_finite_keys(scalars, LOSS_KEYS + EPISODE_KEYS + [f"charts/episodic_return_agent{i}" for i in range(3)])
    assert all(length == 25 for _, length in scalars["charts/episodic_length"])  # MPE's default horizon


def load_args(run_dir) -> dict:
    import json

    return json.loads((run_dir / "args.json").read_text())


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (
            ["--env-id", "vmas/navigaton"],
            ["unknown --env-id 'vmas/navigaton'", "did you mean vmas/navigation", "known: vmas/balance"],
        ),
        (["--env-id", "mpe/simple_tag_v3"], ["unknown --env-id 'mpe/simple_tag_v3'", "mpe/simple_spread_v3"]),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "2"], ["does not divide the rollout of 15"]),
        (["--num-envs", "0"], ["--num-envs must be positive"]),
        (["--max-episode-steps", "0"], ["--max-episode-steps must be positive"]),
        (["--total-timesteps", "100"], ["less than one rollout"]),
        (["--gae-lambda", "2"], ["--gae-lambda in [0, 1]"]),
        (["--capture-video"], ["--capture-video is not supported by mappo.py"]),
    ],
)
def test_validate_rejects_bad_arguments_in_one_line(capsys, flags, fragments):
    import tyro

    args = tyro.cli(mappo.Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        mappo.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "flags, ent_coef",
    [([], 0.0), (["--no-continuous-actions"], 0.01), (["--no-continuous-actions", "--ent-coef", "0.003"], 0.003)],
)
def test_entropy_coefficient_defaults_to_yu_et_al_for_discrete_actions(flags, ent_coef):
    import tyro

    args = tyro.cli(mappo.Args, args=["--env-id", "mpe/simple_spread_v3", "--total-timesteps", "25600", *flags])
    mappo.validate(args)
    assert args.ent_coef == ent_coef and args.batch_size == 256 * 50 * 3 and args.num_iterations == 2


def test_bad_input_exits_before_any_work(workdir):
    assert_bad_input(
        run_script(SCRIPT, "--env-id", "vmas/foo", cwd=workdir),
        workdir,
        "unknown --env-id 'vmas/foo'",
        "vmas/navigation",
    )
    assert_bad_input(run_script(SCRIPT, "--capture-video", cwd=workdir), workdir, "renders through pyglet")


def test_heterogeneous_action_spaces_are_refused(capsys):
    # No scenario accepted here has such agents (all 21 VMAS scenarios and both mpe2 tasks were checked),
    # so the check gets environments described by hand: other sizes, other bounds, the same spaces.
    from types import SimpleNamespace

    from gymnasium.spaces import Box, Discrete

    from cleanrl_utils.envs.multiagent import same_action_space

    def envs(*spaces):
        return SimpleNamespace(action_spaces=list(spaces), same_action_space=same_action_space(list(spaces)))

    for spaces in [(Discrete(3), Discrete(5)), (Box(-1, 1, (2,)), Box(-2, 2, (2,))), (Box(-1, 1, (2,)), Discrete(2))]:
        with pytest.raises(SystemExit):
            mappo.check_action_spaces(envs(*spaces), "vmas/x")
        err = capsys.readouterr().err
        assert "different action spaces" in err and len(err.strip().splitlines()) == 1
    mappo.check_action_spaces(envs(Box(-1, 1, (2,)), Box(-1, 1, (2,))), "vmas/x")
    mappo.check_action_spaces(envs(Discrete(5), Discrete(5)), "vmas/x")


# --- checkpoints, SIGTERM and resume -------------------------------------------------------------------

CKPT_FLAGS = [
    *TINY,
    "--env-id",
    "vmas/navigation",
    "--max-episode-steps",
    "12",
    "--total-timesteps",
    "400",
    "--checkpoint-every",
    "40",
]


def test_killed_run_resumes_from_its_checkpoint_with_fresh_environments(workdir):
    run_dir = kill_at_first_checkpoint(SCRIPT, CKPT_FLAGS, workdir)
    first = load(run_dir / "checkpoint.pt")
    assert first["global_step"] < 400
    assert {"agent", "optimizer", "value_norm", "rng"} <= set(first)
    resumed = run_script(SCRIPT, *CKPT_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset environments" in resumed.stdout
    assert run_dirs(workdir) == [run_dir]
    final = load(run_dir / "checkpoint.pt")
    assert final["global_step"] == 400
    assert final["value_norm"]["debiasing_term"] > first["value_norm"]["debiasing_term"]
    steps = [step for step, _ in read_scalars(run_dir)["losses/value_loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == 400  # one curve, no duplicated steps


def test_sigterm_writes_a_checkpoint_and_resume_finishes(workdir):
    flags = [
        *TINY,
        "--env-id",
        "vmas/balance",
        "--no-continuous-actions",
        "--total-timesteps",
        "1000",
        "--eval-episodes",
        "2",
    ]
    _, run_dir = sigterm_while_training(SCRIPT, flags, workdir, settle=0.2)
    checkpoint = load(run_dir / "checkpoint.pt")
    assert 0 < checkpoint["global_step"] < 1000, "SIGTERM came after the end: raise --total-timesteps"
    # A resume with other arguments is refused; with the original ones it continues to the end.
    other = run_script(SCRIPT, *flags, "--gamma", "0.9", "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert other.returncode == 2 and "--gamma is 0.9" in other.stderr
    resumed = run_script(SCRIPT, *flags, "--save-model", "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir]
    scalars = read_scalars(run_dir)
    assert scalars["losses/value_loss"][-1][0] == 1000 and len(scalars["eval/episodic_return"]) == 2


def test_same_seed_gives_the_same_run(tmp_path):
    flags = [
        *TINY,
        "--env-id",
        "vmas/balance",
        "--no-continuous-actions",
        "--total-timesteps",
        "80",
        "--checkpoint-every",
        "80",
    ]
    weights = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        result = run_script(SCRIPT, *flags, cwd=tmp_path / name)
        assert result.returncode == 0, result.stderr
        (run_dir,) = run_dirs(tmp_path / name)
        weights.append(load(run_dir / "checkpoint.pt")["agent"])
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
