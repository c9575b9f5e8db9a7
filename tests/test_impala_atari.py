"""impala_atari.py: V-trace against the paper's definition written out over Python floats, with terminations and
truncations inside the rollout and rho/c clipping active; V-trace on on-policy data equals the n-step bootstrapped
returns; a real Ray actor on an ALE game (seeded with one int: ale-py takes no list) whose rollouts are replayed here
row by row and whose log-probabilities are those of the weights version each names; the learner's own loop under
tests/probe.py on Breakout with 2 actors (behaviour log-probabilities by version, every loss and its gradient against a
plain V-trace loss from the learner's weights, and the run's TensorBoard keys, learning-rate schedule, policy lag and
saved model); bad input, before Ray (the environment id check is ppo_atari's, tested there).

One Ray cluster (2 CPUs, no dashboard) serves the whole module: the run joins it with --ray-address."""

from __future__ import annotations

import math
import os

import impala_atari
import numpy as np
import pytest
import ray
import torch
from conftest import ROOT, assert_bad_input, assert_finite_keys, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients

from cleanrl_utils.envs.atari import make_envs

MINATAR = ["--env-id", "MinAtar/Breakout-v1", "--torch-threads", "1"]
TINY = [*MINATAR, "--num-actors", "2", "--local-num-envs", "2", "--num-steps", "16", "--rollouts-per-update", "1"]
OBS_SHAPE, N_ACTIONS = (4, 10, 10), 3  # MinAtar/Breakout-v1
ATARI_SHAPE = (4, 84, 84)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for the module; its workers import the scripts (cleanrl/) and cleanrl_utils."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "cleanrl"), str(ROOT), saved or ""])
    for attempt in range(3):  # Ray waits a fixed 30 s for its raylet: a busy CI machine can take longer
        try:
            context = ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
            break
        except Exception as error:
            if "timed out during startup" not in str(error) or attempt == 2:
                raise
            ray.shutdown()
    yield context.address_info["gcs_address"]
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One CPU thread, as the script runs (--torch-threads 1): a busy machine's thread pool slows small ops."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def perturbed_agent(seed: int, obs_shape=OBS_SHAPE, n_actions=N_ACTIONS, obs_high=1.0, scale=1.0):
    torch.manual_seed(seed)
    agent = impala_atari.Agent(obs_shape, n_actions, obs_high)
    with torch.no_grad():
        for parameter in agent.parameters():
            parameter.add_(scale * torch.randn_like(parameter))  # far from the near-uniform initial policy
    return agent


def test_an_actors_rollouts_hold_what_its_games_returned_and_the_logprobs_of_the_version_they_name(cluster):
    """A real actor on an ALE game given version 0's weights, then version 1's (twice). Its games are replayed here
    from the same seeds (the first seed and the actor's index pick them) and the actions it sent: every row is what
    the env returned (observations, rewards clipped to their sign, a game over or a lost life as a termination,
    truncations, the autoreset steps, the finished games), and every behaviour log-probability is that of the weights
    of the version its rollout names, not the other's. Asterix: points of 50 from the first steps and lives lost
    within ~150."""
    args = impala_atari.Args(env_id="AsterixNoFrameskip-v4", seed=3, local_num_envs=2, num_steps=64)
    agents = {version: perturbed_agent(version, ATARI_SHAPE, 9, 255.0, scale=0.05) for version in (0, 1)}
    stored = {version: ray.put(agent.state_dict()) for version, agent in agents.items()}
    first_seed = args.seed + 1000  # as a run resumed at step 1000 seeds its actors: new games, not the first run's
    actor = impala_atari.Actor.remote(1, args, None, first_seed)
    try:
        rollouts = [ray.get(actor.rollout.remote(version, stored[version])) for version in (0, 1, 1)]
    finally:
        ray.kill(actor)  # its CPU is the run's
    assert [rollout["version"] for rollout in rollouts] == [0, 1, 1]

    envs = make_envs("AsterixNoFrameskip-v4", 2)
    obs, _ = envs.reset(seed=first_seed + 1 * 2)  # actor 1 of local_num_envs 2: seeds 1005 and 1006
    ended = np.zeros(2, dtype=bool)
    lives_lost = big_rewards = 0
    for rollout in rollouts:
        assert np.array_equal(rollout["obs"][0], obs), "a rollout continues the actor's games"
        games = []
        for t in range(64):
            obs, reward, terminated, truncated, infos = envs.step(rollout["actions"][t])
            assert np.array_equal(rollout["obs"][t + 1], obs), t
            assert rollout["rewards"][t].tolist() == np.sign(reward).tolist(), t
            assert rollout["terminations"][t].tolist() == (terminated | infos["life_loss"]).tolist(), t
            assert rollout["truncations"][t].tolist() == truncated.tolist(), t
            assert rollout["resets"][t].tolist() == ended.tolist(), t  # the step after an episode's end
            if "episode" in infos:
                done = infos["_episode"]
                games += [(t, r, n) for r, n in zip(infos["episode"]["r"][done], infos["episode"]["l"][done])]
            ended = terminated | truncated
            lives_lost += int(infos["life_loss"].sum())
            big_rewards += int((reward > 1).sum())
        assert rollout["games"] == games
    envs.close()
    assert lives_lost >= 2 and big_rewards >= 2, "the replay should have seen lost lives and rewards to clip"

    for rollout in rollouts:
        obs = torch.tensor(rollout["obs"][:-1]).flatten(0, 1)  # copies: Ray's arrays are read-only
        actions = torch.tensor(rollout["actions"]).reshape(-1, 1)
        behaviour = torch.tensor(rollout["logprobs"]).reshape(-1)
        with torch.no_grad():
            own = agents[rollout["version"]](obs)[0].gather(-1, actions).squeeze(-1)
            other = agents[1 - rollout["version"]](obs)[0].gather(-1, actions).squeeze(-1)
        torch.testing.assert_close(behaviour, own, atol=1e-4, rtol=1e-4)  # float32, other batch sizes
        assert (behaviour - other).abs().max() > 1e-2


# The learner's own loop: the script runs unchanged under tests/probe.py on Breakout (the default game, lives and
# FIRE) with 2 actors, and at every backward() the probe copies the rollouts the update took and the learner's
# weights. From those alone the tests recompute the behaviour log-probabilities (the weights of the version each
# rollout names: the learner's at that update's backward), and each loss from a plain V-trace (reference_vtrace above)
# over the learner's own log-probabilities and values, and its gradient, in float64, with the V-trace targets and
# advantages held constant. The learner runs in the script's main process and thread (the actors are Ray processes),
# so the probe sees its backward() and reads the agent's gradients. The same run is the smoke test: TensorBoard keys,
# the learning rate schedule, the policy lag, the saved model and its evaluation.
LEARNER_FLAGS = ["--env-id", "BreakoutNoFrameskip-v4", "--torch-threads", "1", "--num-actors", "2"]
LEARNER_FLAGS += ["--local-num-envs", "2", "--num-steps", "50", "--rollouts-per-update", "2"]
LEARNER_FLAGS += ["--total-timesteps", "800"]
LEARNER_FLAGS += ["--learning-rate", "0.003", "--gamma", "0.9", "--save-model", "--eval-episodes", "1"]
NUM_UPDATES, LEARNING_RATE, GAMMA = 4, 0.003, 0.9


@pytest.fixture(scope="module")
def learner_run(cluster, tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("learner")
    flags = [*LEARNER_FLAGS, "--ray-address", cluster]
    trace = probe_script(
        "impala_atari.py", flags, cwd, at_backward=["rollouts", "agent", "update"], grads=["agent"], timeout=600
    )
    (run_dir,) = run_dirs(cwd)
    return trace, run_dir


def learner_agent(state_dict) -> impala_atari.Agent:
    agent = impala_atari.Agent(ATARI_SHAPE, 4, 255.0)
    agent.load_state_dict(state_dict)
    return agent


def test_each_rollout_was_played_with_the_weights_of_the_version_it_names(learner_run):
    trace, _ = learner_run
    updates = trace.backward
    assert [update["update"] for update in updates] == list(range(NUM_UPDATES))
    # the weights of version v are the learner's after v updates: those it computes update v's loss with
    weights = [learner_agent(update["agent"]) for update in updates]
    lags = []
    for update in updates:
        for rollout in update["rollouts"]:
            version = rollout["version"]
            obs = torch.tensor(rollout["obs"][:-1]).flatten(0, 1)
            actions = torch.tensor(rollout["actions"]).reshape(-1, 1)
            with torch.no_grad():
                expected = weights[version](obs)[0].gather(-1, actions).squeeze(-1)
            torch.testing.assert_close(torch.tensor(rollout["logprobs"]).reshape(-1), expected, atol=1e-4, rtol=1e-4)
            lags.append(update["update"] - version)
    assert max(lags) >= 1, "some rollouts should be older than the policy that learns from them"


def test_each_gradient_step_is_the_gradient_of_the_v_trace_loss_of_its_batch_under_the_learners_weights(learner_run):
    trace, _ = learner_run
    cut_at_life_loss = off_policy = 0
    for update in trace.backward:
        rollouts = update["rollouts"]
        batch = {key: np.concatenate([r[key] for r in rollouts], axis=1) for key in impala_atari.BATCH_FIELDS}
        obs = torch.tensor(batch["obs"])  # [T + 1, B, 4, 84, 84]
        T, B = batch["actions"].shape
        # The learner's network in float64 (its forward casts frames to float32, so its layers are called here).
        agent = learner_agent(update["agent"]).double()
        hidden = agent.network(obs.flatten(0, 1).double() / 255.0)
        log_probs, values = torch.log_softmax(agent.actor(hidden), -1), agent.critic(hidden).squeeze(-1)
        log_probs, values = log_probs.view(T + 1, B, -1), values.view(T + 1, B)
        target = log_probs[:-1].gather(-1, torch.tensor(batch["actions"]).unsqueeze(-1)).squeeze(-1)
        mu = torch.tensor(batch["logprobs"]).double()
        assert set(np.unique(batch["rewards"])) <= {-1.0, 0.0, 1.0}
        # V-trace targets and policy-gradient advantages are constants (Python floats): no gradient through the
        # importance weights or the values they are computed from.
        vs, advantages = reference_vtrace(
            *as_lists(mu, target.detach(), torch.tensor(batch["rewards"]), values[:-1].detach(), values[1:].detach()),
            *as_lists(torch.tensor(batch["terminations"]), torch.tensor(batch["truncations"])),
            GAMMA,
            1.0,
            1.0,
        )
        vs, advantages = torch.tensor(vs, dtype=torch.float64), torch.tensor(advantages, dtype=torch.float64)
        transitions = torch.tensor(~batch["resets"]).double()  # an autoreset step is not a transition
        entropy = -(log_probs.exp() * log_probs).sum(-1)[:-1]
        expected = (
            -(advantages * target * transitions).sum()
            + 0.5 * 0.5 * ((vs - values[:-1]) ** 2 * transitions).sum()
            - 0.01 * (entropy * transitions).sum()
        )
        where = f"update {update['update']}"
        assert_gradients_match(update["grads"]["agent"], gradients(expected, dict(agent.named_parameters())), where)
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-4), where
        cut_at_life_loss += int(batch["terminations"].sum())
        off_policy += int((target.detach() - mu).abs().max() > 0.05)
    assert cut_at_life_loss >= 2, "lost lives should end some training episodes inside the batches"
    assert off_policy >= 2, "the importance weights should matter in some updates"


def test_the_run_logs_its_keys_anneals_the_learning_rate_and_saves_a_trained_model(learner_run):
    trace, run_dir = learner_run
    scalars = read_scalars(run_dir)
    keys = ["charts/episodic_return", "charts/episodic_length", "charts/policy_lag", "charts/SPS"]
    keys += ["losses/value_loss", "losses/policy_loss", "losses/entropy", "perf/learner_updates_per_second"]
    assert_finite_keys(scalars, keys + ["eval/episodic_return"])
    assert [step for step, _ in scalars["losses/value_loss"]] == [200 * i for i in range(1, NUM_UPDATES + 1)]
    # the rate the update used, (1 - update / num_updates) x the initial one, logged after it
    rates = [rate for _, rate in scalars["charts/learning_rate"]]
    assert rates == pytest.approx([(1 - k / NUM_UPDATES) * LEARNING_RATE for k in range(NUM_UPDATES)], rel=1e-6)
    lags = [lag for _, lag in scalars["charts/policy_lag"]]
    expected = [np.mean([u["update"] - r["version"] for r in u["rollouts"]]) for u in trace.backward]
    assert lags == pytest.approx(expected) and lags[0] == 0 and min(lags[1:]) >= 1, lags
    model = torch.load(run_dir / "impala_atari.cleanrl_model", weights_only=False)
    last = trace.backward[-1]["agent"]
    assert not torch.equal(model["agent"]["actor.weight"], last["actor.weight"])  # the last update was applied


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
