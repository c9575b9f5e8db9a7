"""ppo_atari_envpool.py: its own loop run under tests/probe.py on envpool's Breakout and rebuilt from the envs' stream
(the rollout as learning sees it, GAE and its bootstrap, the autoreset steps left out of the batch, every minibatch's
clipped PPO loss normalised over the minibatch and its gradient (against a float64 reference's), every Adam step,
whole-game scores); envpool's own episodic_life, GAE against a plain loop, bad input, SIGKILL + resume."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import ppo_atari_envpool
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from test_ppo_atari import (
    actions_taken,
    assert_adam_steps,
    float64_minibatch,
    learning_view,
    loop_steps,
    policy_and_value,
    reference_gae,
    reference_loss,
    replay_stream,
)
from update_reference import assert_gradients_match, gradients

pytest.importorskip("envpool")

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
PPO_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
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


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One CPU thread, as the script runs (--torch-threads 1): the tests' own forward and backward passes on a busy
    machine spend far longer spinning in a thread pool than computing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_envpool_episodic_life_only_signals_a_life_loss():
    # What the plumbing's docstring says about envpool's own episodic_life, and why it is off.
    import envpool

    env = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, episodic_life=True, seed=3)
    env.reset()
    rng = np.random.default_rng(0)
    ended, elapsed, lives, game_over, life_ends = False, 0, 5, False, 0
    while not game_over:
        _, reward, terminated, _, info = env.step(rng.integers(0, 4, 1))
        if ended:  # the step after a lost life is an autoreset step of its own, and the game goes on
            assert info["elapsed_step"][0] == elapsed and reward[0] == 0 and info["lives"][0] == lives
        ended, elapsed, lives = bool(terminated[0]), info["elapsed_step"][0], info["lives"][0]
        game_over = bool(info["terminated"][0])
        assert not game_over or lives == 0
        life_ends += ended and not game_over
    env.close()
    assert life_ends == 4


def reference_advantages(stream, gamma, gae_lambda):
    """Per env: each real transition's advantage is the (gamma * lambda)-discounted sum of TD errors up to the end of
    its training episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        if stream[t][4]:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # A life loss at 2, a game over at 5 with its autoreset step 6, a time-limit cut at 9 (its autoreset step 10).
    terminated = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    resets = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.choice([-1.0, 0.0, 1.0], size=13)
    column = lambda x: torch.tensor(np.asarray(x[:12], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_atari_envpool.compute_gae(
        column(rewards),
        column(values),
        torch.tensor(values[1:]).unsqueeze(1),
        column(terminated),
        column(truncated),
        0.9,
        0.8,
    )[:, 0].tolist()
    expected = reference_advantages(list(zip(values, rewards, terminated, truncated, resets)), 0.9, 0.8)
    for t in range(12):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "BreakoutNoFrameskip-v4"], ["ale-py id", "cleanrl/ppo_atari.py", "--env-id Breakout-v5"]),
        (["--env-id", "MinAtar/Breakout-v1"], ["MinAtar id", "cleanrl/ppo_atari.py"]),
        (["--env-id", "BigfishEasy-v0"], ["Procgen", "cleanrl/ppo_procgen.py"]),
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "ppo_continuous_action.py"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--env-id", "Breakou-v5"], ["did you mean Breakout-v5"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
        (["--total-timesteps", "100"], ["less than one batch"]),
        (["--repeat-action-probability", "1.5"], ["--repeat-action-probability"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_atari_envpool.py", *flags, cwd=workdir), workdir, *fragments)


# The loop's own wiring, and the smoke run: the script runs unchanged under tests/probe.py (test_ppo_atari.py's section
# of the same name says how); the tests replay its actions in a fresh envpool seeded as the script seeds it and rebuild
# from that stream what the loop stored and computed. The same run is the reference of the resume test.
NUM_ENVS, NUM_STEPS, ITERATIONS, MINIBATCHES = 2, 32, 6, 2
GAMMA, GAE_LAMBDA, CLIP, LR = 0.95, 0.8, 0.02, 1e-3
FLAGS = [*TINY, "--total-timesteps", str(NUM_ENVS * NUM_STEPS * ITERATIONS), "--checkpoint-every", "128"]
FLAGS += ["--gamma", str(GAMMA), "--gae-lambda", str(GAE_LAMBDA), "--clip-coef", str(CLIP), "--learning-rate", str(LR)]
FLAGS += ["--save-model", "--eval-episodes", "1", "--capture-video"]
UPDATE_NAMES = ["agent", "mb_inds", "iteration", "epoch", "rewards", "terminated", "truncated", "reset_steps"]
UPDATE_NAMES += ["values", "advantages", "returns", "next_obs"]


class EnvpoolLoop(NamedTuple):
    trace: object
    stream: dict
    learning: dict
    run_dir: Path


@pytest.fixture(scope="module")
def envpool_loop(tmp_path_factory) -> EnvpoolLoop:
    from probe import probe_script

    from cleanrl_utils.envs.envpool_atari import make_envs

    cwd = tmp_path_factory.mktemp("loop")
    names = dict(watch=["next_obs", "action"], at_backward=UPDATE_NAMES, grads=["agent"], final=["action", "agent"])
    trace = probe_script("ppo_atari_envpool.py", FLAGS, cwd, **names)
    stream = replay_stream(make_envs("Breakout-v5", NUM_ENVS), 1, actions_taken(trace))
    (run_dir,) = run_dirs(cwd)
    return EnvpoolLoop(trace, stream, learning_view(stream), run_dir)


def agent_from(state: dict) -> ppo_atari_envpool.Agent:
    agent = ppo_atari_envpool.Agent((4, 84, 84), 4)
    agent.load_state_dict(state)
    return agent


def iterations(loop: EnvpoolLoop):
    """Per iteration: its updates (the first one holds the agent that collected the rollout) and its slice of the
    stream."""
    for i in range(ITERATIONS):
        yield loop.trace.backward[i * MINIBATCHES : (i + 1) * MINIBATCHES], slice(i * NUM_STEPS, (i + 1) * NUM_STEPS)


def test_the_loop_acts_on_what_the_seeded_envs_return_and_stores_it_as_learning_sees_it(envpool_loop):
    steps = loop_steps(envpool_loop.trace)
    assert len(steps) == NUM_STEPS * ITERATIONS
    for k, step in enumerate(steps):
        assert torch.equal(step["next_obs"], torch.from_numpy(envpool_loop.stream["obs"][k])), k
    learning = envpool_loop.learning
    assert envpool_loop.stream["life_loss"].sum() >= 4 and learning["resets"].sum() >= 4
    for (first, *_), rows in iterations(envpool_loop):
        assert first["rewards"].tolist() == learning["rewards"][rows].tolist()
        assert first["terminated"].tolist() == learning["terminations"][rows].astype(float).tolist()
        assert first["truncated"].tolist() == learning["truncations"][rows].astype(float).tolist()
        assert first["reset_steps"].tolist() == learning["resets"][rows].tolist()


def test_advantages_are_gae_of_the_rollout_bootstrapped_from_the_observation_after_it(envpool_loop):
    for (first, *_), rows in iterations(envpool_loop):
        obs = torch.from_numpy(envpool_loop.stream["obs"][rows.start : rows.stop + 1])  # and the one after it
        assert torch.equal(first["next_obs"], obs[-1])
        with torch.no_grad():
            _, values = policy_and_value(agent_from(first["agent"]), obs.flatten(0, 1), 255.0)
        values = values.view(NUM_STEPS + 1, NUM_ENVS).double()
        assert torch.allclose(first["values"].double(), values[:-1], atol=1e-5)
        learning = {key: value[rows] for key, value in envpool_loop.learning.items()}
        expected = reference_gae(learning, values[:-1].numpy(), values[-1].numpy(), GAMMA, GAE_LAMBDA)
        transitions = ~learning["resets"]
        assert np.allclose(first["advantages"].numpy()[transitions], expected[transitions], atol=1e-5)
        returns = (expected + values[:-1].numpy())[transitions]
        assert np.allclose(first["returns"].numpy()[transitions], returns, atol=1e-5)


def expected_minibatches(loop: EnvpoolLoop) -> list[dict]:
    """Per update: the rows it should have used, from the stream (observations, actions), the rollout's agent
    (log-probabilities and values) and GAE (advantages, returns: checked against the plain loop above)."""
    actions = actions_taken(loop.trace)
    minibatches = []
    for updates, rows in iterations(loop):
        rollout_agent = agent_from(updates[0]["agent"])
        for update in updates:
            indices = update["mb_inds"]
            t, env = (indices // NUM_ENVS + rows.start).numpy(), (indices % NUM_ENVS).numpy()
            obs = torch.from_numpy(loop.stream["obs"][t, env])
            with torch.no_grad():
                policy, values = policy_and_value(rollout_agent, obs, 255.0)
            taken = torch.from_numpy(actions[t, env])
            flat = lambda x: x.reshape(-1)[indices]  # noqa: E731
            rows_of = dict(obs=obs, actions=taken, logprobs=policy.log_prob(taken), values=values)
            minibatches.append(rows_of | dict(advantages=flat(update["advantages"]), returns=flat(update["returns"])))
    return minibatches


def test_each_update_takes_every_transition_once_with_the_gradient_and_loss_of_the_clipped_ppo_loss(envpool_loop):
    updates = envpool_loop.trace.backward
    assert len(updates) == ITERATIONS * MINIBATCHES
    for iteration, rows in iterations(envpool_loop):
        taken = torch.cat([update["mb_inds"] for update in iteration])  # one epoch
        expected = np.flatnonzero(~envpool_loop.learning["resets"][rows].reshape(-1))
        assert sorted(taken.tolist()) == expected.tolist(), "an epoch takes each transition once, no autoreset step"
    for k, (update, mb) in enumerate(zip(updates, expected_minibatches(envpool_loop))):
        # The gradient the backward() left is the reference loss's, in float64, with the rollout's values,
        # log-probabilities and returns held constant; then the loss's value.
        agent = agent_from(update["agent"]).double()
        expected = reference_loss(agent, float64_minibatch(mb), 255.0, CLIP)
        grads = gradients(expected, dict(agent.named_parameters()))
        assert_gradients_match(update["grads"]["agent"], grads, f"update {k}")
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)


def test_every_gradient_step_is_adam_on_the_clipped_gradient_at_the_annealed_learning_rate(envpool_loop):
    updates = [dict(agent=u["agent"], grads=u["grads"]["agent"]) for u in envpool_loop.trace.backward]
    lrs = [LR * (1 - (k // MINIBATCHES) / ITERATIONS) for k in range(len(updates))]
    assert_adam_steps(updates, envpool_loop.trace.final["agent"], ppo_atari_envpool.Agent((4, 84, 84), 4), lrs)
    logged = read_scalars(envpool_loop.run_dir)["charts/learning_rate"]
    assert [value for _, value in logged] == pytest.approx(lrs[::MINIBATCHES])


def test_smoke_logs_whole_game_scores_and_evaluates_the_saved_model(envpool_loop):
    scalars = read_scalars(envpool_loop.run_dir)
    assert_finite_keys(scalars, [k for k in PPO_KEYS if "episodic" not in k] + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == ITERATIONS
    # Whole games: each logged score is the sum of the raw rewards of its env since that env's last game ended.
    stream, since = envpool_loop.stream, np.zeros(NUM_ENVS, dtype=int)
    expected = []
    for k, env, score in stream["games"]:
        assert score == pytest.approx(stream["rewards"][since[env] : k + 1, env].sum())
        expected.append(((k + 1) * NUM_ENVS, pytest.approx(score)))
        since[env] = k + 1
    assert [(step, value) for step, value in scalars.get("charts/episodic_return", [])] == expected
    assert list((envpool_loop.run_dir / "videos" / "eval").glob("*.mp4"))
    model = torch.load(envpool_loop.run_dir / "ppo_atari_envpool.cleanrl_model", weights_only=False)
    assert model["script"] == "ppo_atari_envpool"


def test_sigkill_then_resume_continues_the_curve_with_fresh_games(envpool_loop, tmp_path):
    run_dir = kill_at_first_checkpoint("ppo_atari_envpool.py", FLAGS, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 128 and checkpoint["envs"] is None
    resumed = run_script("ppo_atari_envpool.py", *FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset" in resumed.stdout
    losses = read_scalars(run_dir)["losses/value_loss"]
    straight_losses = read_scalars(envpool_loop.run_dir)["losses/value_loss"]
    assert [step for step, _ in losses] == [64, 128, 192, 256, 320, 384]  # one curve, no gap, no duplicate
    assert losses[:2] == straight_losses[:2]  # the part before the checkpoint is the original run's
    assert all(np.isfinite(value) for _, value in losses)
