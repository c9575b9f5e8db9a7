"""impala_atari.py: V-trace against the paper's definition written out over Python floats, with terminations and
truncations inside the rollout and rho/c clipping active; V-trace on on-policy data equals the n-step bootstrapped
returns; a rollout's behaviour log-probabilities are those of the weights version it names (a real Ray actor); a
2-actor run on a local Ray cluster that trains and logs episodic returns and the policy lag; bad input, before Ray
(the environment id check is ppo_atari's, tested there).

One Ray cluster (2 CPUs, no dashboard) serves the whole module: the run joins it with --ray-address."""

from __future__ import annotations

import math
import os

import impala_atari
import pytest
import ray
import torch
from conftest import ROOT, assert_bad_input, assert_finite_keys, read_scalars, run_dirs, run_script

MINATAR = ["--env-id", "MinAtar/Breakout-v1", "--torch-threads", "1"]
TINY = [*MINATAR, "--num-actors", "2", "--local-num-envs", "2", "--num-steps", "16", "--rollouts-per-update", "1"]
OBS_SHAPE, N_ACTIONS = (4, 10, 10), 3  # MinAtar/Breakout-v1


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for the module; its workers import the scripts (cleanrl/) and cleanrl_utils."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "cleanrl"), str(ROOT), saved or ""])
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield context.address_info["gcs_address"]
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = saved


def reference_vtrace(mu, pi, rewards, values, next_values, terminations, truncations, gamma, rho_bar, c_bar):
    """The paper's definition (eq. 1), one sum per step, over lists [T][N] of floats:
    v_s = V(x_s) + sum_{t=s}^{e} gamma^(t-s) (prod_{i=s}^{t-1} c_i) rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),
    where e is the step that ends the episode (or the rollout's last step), V(x_{t+1}) = next_values[t] is 0 after a
    termination and the true final observation's value after a truncation. Advantage: rho_s (r_s + gamma v_{s+1} -
    V(x_s)), with v_{s+1} the bootstrap value at the episode's or the rollout's end."""
    T, N = len(rewards), len(rewards[0])
    vs = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for s in range(T):
            total, trace = values[s][n], 1.0
            for t in range(s, T):
                ratio = math.exp(pi[t][n] - mu[t][n])
                bootstrap = 0.0 if terminations[t][n] else next_values[t][n]
                total += (
                    gamma ** (t - s) * trace * min(rho_bar, ratio) * (rewards[t][n] + gamma * bootstrap - values[t][n])
                )
                if terminations[t][n] or truncations[t][n]:
                    break
                trace *= min(c_bar, ratio)
            vs[s][n] = total
    advantages = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for s in range(T):
            ended = terminations[s][n] or truncations[s][n]
            next_v = next_values[s][n] if ended or s == T - 1 else vs[s + 1][n]
            next_v = 0.0 if terminations[s][n] else next_v
            rho = min(rho_bar, math.exp(pi[s][n] - mu[s][n]))
            advantages[s][n] = rho * (rewards[s][n] + gamma * next_v - values[s][n])
    return vs, advantages


def rollout_data(T=8, N=4, seed=0):
    """A [T, N] rollout: env 0 terminates at 2 and is truncated at 5, env 1 is truncated at the last step, env 2
    terminates at the last step, env 3 runs through. Where an episode ends, next_values is the final observation's
    value (not the next row's); elsewhere it is the next row's value."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    next_values = torch.cat([values[1:], torch.randn(1, N, generator=g, dtype=torch.float64)])
    terminations, truncations = torch.zeros(T, N, dtype=torch.float64), torch.zeros(T, N, dtype=torch.float64)
    terminations[2, 0] = truncations[5, 0] = truncations[T - 1, 1] = terminations[T - 1, 2] = 1.0
    ends = (terminations + truncations) > 0
    next_values[ends] = torch.randn(int(ends.sum()), generator=g, dtype=torch.float64)
    return rewards, values, next_values, terminations, truncations


def as_lists(*tensors):
    return [t.tolist() for t in tensors]


def test_vtrace_matches_the_papers_definition_with_episode_ends_and_clipping():
    rewards, values, next_values, terminations, truncations = rollout_data()
    g = torch.Generator().manual_seed(1)
    mu = torch.log_softmax(torch.randn(8, 4, 3, generator=g, dtype=torch.float64), -1)[..., 0]
    pi = mu + 0.8 * torch.randn(8, 4, generator=g, dtype=torch.float64)  # ratios from ~0.1 to ~10
    gamma, rho_bar, c_bar = 0.9, 1.0, 0.7
    ratios = torch.exp(pi - mu)
    assert (ratios > rho_bar).any() and (ratios < c_bar).any() and ((ratios > c_bar) & (ratios < rho_bar)).any()
    vs, advantages = impala_atari.vtrace(
        mu, pi, rewards, values, next_values, terminations, truncations, gamma, rho_bar, c_bar
    )
    ref_vs, ref_adv = reference_vtrace(
        *as_lists(mu, pi, rewards, values, next_values, terminations, truncations), gamma, rho_bar, c_bar
    )
    torch.testing.assert_close(vs, torch.tensor(ref_vs, dtype=torch.float64))
    torch.testing.assert_close(advantages, torch.tensor(ref_adv, dtype=torch.float64))
    # the clipping matters: without it the targets differ
    unclipped, _ = impala_atari.vtrace(mu, pi, rewards, values, next_values, terminations, truncations, gamma, 1e9, 1e9)
    assert not torch.allclose(unclipped, vs)


def n_step_returns(rewards, next_values, terminations, truncations, gamma):
    """sum_k gamma^k r_{s+k} + gamma^n V(bootstrap), to the episode's or the rollout's end, over lists of floats."""
    T, N = len(rewards), len(rewards[0])
    returns = [[0.0] * N for _ in range(T)]
    for n in range(N):
        for s in range(T):
            total = 0.0
            for t in range(s, T):
                total += gamma ** (t - s) * rewards[t][n]
                if terminations[t][n]:
                    break
                if truncations[t][n] or t == T - 1:
                    total += gamma ** (t - s + 1) * next_values[t][n]
                    break
            returns[s][n] = total
    return returns


def test_vtrace_on_policy_equals_n_step_returns():
    rewards, values, next_values, terminations, truncations = rollout_data(seed=2)
    logprobs = torch.log(torch.full((8, 4), 1 / 3, dtype=torch.float64))
    gamma = 0.97
    vs, advantages = impala_atari.vtrace(
        logprobs, logprobs, rewards, values, next_values, terminations, truncations, gamma
    )
    expected = torch.tensor(n_step_returns(*as_lists(rewards, next_values, terminations, truncations), gamma))
    torch.testing.assert_close(vs, expected.double())
    # the advantage is the one-step TD error towards the next step's target: r_s + gamma v_{s+1} - V(x_s)
    next_vs = torch.cat([vs[1:], next_values[-1:]])
    ended = (terminations + truncations) > 0
    next_vs = torch.where(ended, next_values, next_vs) * (1 - terminations)
    torch.testing.assert_close(advantages, rewards + gamma * next_vs - values)


def perturbed_agent(seed: int) -> impala_atari.Agent:
    torch.manual_seed(seed)
    agent = impala_atari.Agent(OBS_SHAPE, N_ACTIONS, 1.0)
    with torch.no_grad():
        for parameter in agent.parameters():
            parameter.add_(torch.randn_like(parameter))  # far from the near-uniform initial policy
    return agent


def test_a_rollouts_behaviour_logprobs_come_from_the_weights_it_names(cluster):
    """An actor given version 0's weights, then version 1's (twice): every rollout's log-probabilities are those of
    the weights of the version it names, recomputed here from its observations and actions, not the other's."""
    args = impala_atari.Args(env_id="MinAtar/Breakout-v1", local_num_envs=2, num_steps=8)
    agents = {0: perturbed_agent(0), 1: perturbed_agent(1)}
    stored = {version: ray.put(agent.state_dict()) for version, agent in agents.items()}
    actor = impala_atari.Actor.remote(0, args, None)
    try:
        rollouts = [ray.get(actor.rollout.remote(version, stored[version])) for version in (0, 1, 1)]
    finally:
        ray.kill(actor)  # its CPU is the run's
    assert [rollout["version"] for rollout in rollouts] == [0, 1, 1]
    for rollout in rollouts:
        obs = torch.tensor(rollout["obs"][:-1]).flatten(0, 1)  # copies: Ray's arrays are read-only
        actions = torch.tensor(rollout["actions"]).reshape(-1, 1)
        behaviour = torch.tensor(rollout["logprobs"]).reshape(-1)
        with torch.no_grad():
            own = agents[rollout["version"]](obs)[0].gather(-1, actions).squeeze(-1)
            other = agents[1 - rollout["version"]](obs)[0].gather(-1, actions).squeeze(-1)
        torch.testing.assert_close(behaviour, own, atol=1e-4, rtol=1e-4)  # float32, other batch sizes
        assert (behaviour - other).abs().max() > 1e-2


def test_two_actors_on_a_local_cluster_train_and_log(cluster, tmp_path):
    flags = [*TINY, "--total-timesteps", "1024", "--save-model", "--eval-episodes", "1", "--ray-address", cluster]
    result = run_script("impala_atari.py", *flags, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    keys = ["charts/episodic_return", "charts/episodic_length", "charts/policy_lag", "charts/SPS"]
    keys += ["losses/value_loss", "losses/policy_loss", "losses/entropy", "perf/learner_updates_per_second"]
    assert_finite_keys(scalars, keys + ["eval/episodic_return"])
    assert [step for step, _ in scalars["losses/value_loss"]] == [32 * i for i in range(1, 33)]  # 32 updates
    lags = [lag for _, lag in scalars["charts/policy_lag"]]
    # two actors, one rollout an update, each actor's next rollout starts before the update: after the first update
    # (version 0's rollouts), lags of 1 and more (how much more depends on how the OS schedules the actors)
    assert lags[0] == 0 and min(lags[1:]) >= 1, lags
    model = torch.load(run_dir / "impala_atari.cleanrl_model", weights_only=False)
    torch.manual_seed(1)
    initial = impala_atari.Agent(OBS_SHAPE, N_ACTIONS, 1.0).state_dict()
    assert not torch.equal(model["agent"]["actor.weight"], initial["actor.weight"])  # it trained


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rollouts-per-update", "3"], "--rollouts-per-update 3 is more than --num-actors 2"),
        (["--resume", "runs/missing/checkpoint.pt"], "no such file"),
    ],
)
def test_bad_input_fails_in_one_line_before_ray_starts(flags, message, tmp_path):
    result = run_script("impala_atari.py", *TINY, "--total-timesteps", "1024", *flags, cwd=tmp_path, timeout=120)
    assert_bad_input(result, tmp_path, message)
    assert result.returncode == 2
