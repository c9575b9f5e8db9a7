"""pqn_atari_envpool_lstm.py: the LSTM state zeroed exactly at episode starts (against a loop that resets by hand),
Q(lambda) returns against test_pqn_atari.py's plain loop, bad input, SIGKILL + resume on MinAtar; the script's own loop
under tests/probe.py on MinAtar and on envpool's Breakout (lives, FIRE steps): the stored rollout and its episode
starts vs what the envs returned, max Q of every step by a plain one-step-at-a-time recurrence that zeroes the state by
hand, the state carried from rollout to rollout, the Q(lambda) returns, and every minibatch's loss and its gradient
(float64, the returns held constant) by a plain replay of its env sequences from the rollout's first state. Smoke with
--save-model + evaluation on both families."""

from __future__ import annotations

import numpy as np
import pqn_atari_envpool_lstm as script
import pytest
import torch
import tyro
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from test_pqn_atari import LAST_ANSWER, PQN_KEYS, STEP_NAMES, autoreset_rollout, reference_returns, rollouts
from update_reference import assert_gradients_match, gradients

SCRIPT = "pqn_atari_envpool_lstm.py"
MODEL = "pqn_atari_envpool_lstm.cleanrl_model"
GAMMA, Q_LAMBDA = 0.9, 0.65
MINATAR_RUN = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"]
MINATAR_RUN += ["--update-epochs", "2", "--total-timesteps", "1536", "--checkpoint-every", "512", "--save-model"]
MINATAR_RUN += ["--eval-episodes", "2", "--gamma", str(GAMMA), "--learning-rate", "1e-3"]
BREAKOUT_RUN = ["--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "64", "--end-e", "1"]
BREAKOUT_RUN += ["--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "384", "--gamma", str(GAMMA)]
BREAKOUT_RUN += ["--save-model", "--eval-episodes", "1"]
AT_BACKWARD = ["storage", "obs", "next_starts", "q_network", "returns", "mb_envs", "lstm_state", *LAST_ANSWER]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One CPU thread, as the script runs (--torch-threads 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the maths -------------------------------------------------------------------------------


def test_lstm_state_is_zeroed_exactly_at_episode_starts():
    torch.manual_seed(0)
    q_network = script.QNetwork((4, 10, 10), 3, 1.0).double()
    num_steps, num_envs = 12, 4
    features = torch.randn(num_steps, num_envs, 128, dtype=torch.float64)
    starts = torch.zeros(num_steps, num_envs, dtype=torch.bool)
    starts[0, 0] = starts[3, 1] = starts[4, 1] = starts[5, 0] = starts[11, 2] = True  # env 3 never starts
    state = tuple(torch.randn(1, num_envs, 128, dtype=torch.float64) for _ in range(2))  # mid-episode memory
    outputs, (h_last, c_last) = q_network.recur(features, state, starts)
    for env in range(num_envs):  # by hand: one env, one step at a time, zeros where an episode starts
        h, c = state[0][:, env : env + 1], state[1][:, env : env + 1]
        for t in range(num_steps):
            if starts[t, env]:
                h, c = torch.zeros_like(h), torch.zeros_like(c)
            output, (h, c) = q_network.lstm(features[t, env].view(1, 1, -1), (h, c))
            assert torch.allclose(outputs[t, env], output.view(-1), atol=1e-12), (t, env)
        assert torch.allclose(h_last[0, env], h.view(-1), atol=1e-12) and torch.allclose(c_last[0, env], c.view(-1))
    unreset, _ = q_network.recur(features, state, torch.zeros_like(starts))  # the resets matter
    assert not torch.allclose(unreset[0, 0], outputs[0, 0]) and not torch.allclose(unreset[11, 2], outputs[11, 2])
    assert torch.allclose(unreset[:, 3], outputs[:, 3], atol=1e-12)


@pytest.mark.parametrize("q_lambda", [0.0, 0.65, 1.0])
def test_q_lambda_returns_match_a_python_loop_across_game_ends_lives_and_autoresets(q_lambda):
    rollout = autoreset_rollout()
    names = ("rewards", "next_max_q", "terminations", "truncations", "resets")
    got = script.q_lambda_returns(*(torch.tensor(rollout[n]) for n in names), 0.9, q_lambda)
    expected = reference_returns(*(rollout[n].tolist() for n in names), 0.9, q_lambda)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape, hidden", [((1, 84, 84), 512), ((4, 10, 10), 128), ((6, 10, 10), 128)])
def test_network_picks_its_torso_from_the_observation_shape(shape, hidden):
    q_network = script.QNetwork(shape, 5, 255.0 if shape[-1] == 84 else 1.0)
    assert q_network.lstm.input_size == hidden and q_network.q_func.in_features == 128
    assert any(isinstance(m, torch.nn.LayerNorm) for m in q_network.network)
    obs = torch.randint(0, 2, (3, *shape), dtype=torch.uint8)
    q_values, state = q_network.step(obs, q_network.initial_state(3, "cpu"), torch.ones(3, dtype=torch.bool))
    assert q_values.shape == (3, 5) and state[0].shape == state[1].shape == (1, 3, 128)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["cleanrl/pqn.py"]),
        (["--env-id", "BreakoutNoFrameskip-v4"], ["ale-py id", "Breakout-v5"]),
        (["--env-id", "Breakot-v5"], ["Breakout-v5"]),
        (["--env-id", "MinAtar/Brekout-v1"], ["MinAtar/Breakout-v1"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide --num-envs 8"]),
        (["--num-envs", "0"], ["--num-envs must be positive"]),
        (["--total-timesteps", "100"], ["less than one batch of 1024"]),
        (["--q-lambda", "1.5"], ["--q-lambda in [0, 1]"]),
        (["--end-e", "0.5", "--start-e", "0.1"], ["epsilon"]),
        (["--num-steps", "100000000", "--total-timesteps", "100000000000"], ["--num-steps", "GB"]),
    ],
)
def test_validate_refuses_bad_arguments_in_one_line(flags, fragments, capsys):
    args = tyro.cli(script.Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        script.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_input_fails_in_one_line_with_no_run_dir(workdir):
    result = run_script(SCRIPT, "--resume", "missing/checkpoint.pt", cwd=workdir)
    assert_bad_input(result, workdir, "missing/checkpoint.pt")


# --- runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minatar_run(tmp_path_factory):
    """One uninterrupted MinAtar run under tests/probe.py (which only observes): the smoke run, the loop tests' data
    and the resume test's reference."""
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("minatar")
    trace = probe_script(SCRIPT, MINATAR_RUN, cwd, watch=STEP_NAMES, at_backward=AT_BACKWARD, grads=["q_network"])
    (run_dir,) = run_dirs(cwd)
    return trace, run_dir


@pytest.fixture(scope="module")
def breakout_run(tmp_path_factory):
    """envpool's Breakout acting at random (lost lives, FIRE steps), one frame per observation."""
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("breakout")
    trace = probe_script(SCRIPT, BREAKOUT_RUN, cwd, watch=STEP_NAMES, at_backward=AT_BACKWARD, grads=["q_network"])
    (run_dir,) = run_dirs(cwd)
    return trace, run_dir


def test_minatar_smoke_logs_whole_games_and_evaluates_the_saved_model(minatar_run):
    trace, run_dir = minatar_run
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/td_loss"]) == 12 and len(scalars["eval/episodic_return"]) == 2
    model = torch.load(run_dir / MODEL, weights_only=False)
    assert model["script"] == "pqn_atari_envpool_lstm" and model["obs_shape"] == (4, 10, 10)
    assert "1,536/1,536 steps" in trace.stdout


def test_envpool_smoke_sees_one_frame_and_evaluates_the_saved_model(breakout_run):
    trace, run_dir = breakout_run
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, ["losses/td_loss", "losses/q_values", "charts/SPS", "eval/episodic_return"])
    assert torch.load(run_dir / MODEL, weights_only=False)["obs_shape"] == (1, 84, 84)
    assert "evaluation over 1 episodes" in trace.stdout


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(minatar_run, workdir):
    _, straight_dir = minatar_run
    run_dir = kill_at_first_checkpoint(SCRIPT, MINATAR_RUN, workdir)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 512 and checkpoint["envs"] is not None
    h, c = checkpoint["lstm_state"]  # the next rollout's first state: the games' memory goes on after the resume
    assert h.shape == c.shape == (1, 4, 128) and h.abs().sum() > 0
    resumed = run_script(SCRIPT, *MINATAR_RUN, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_dir)
    for key in ("charts/episodic_return", "losses/td_loss", "losses/q_values", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    resumed_weights = torch.load(run_dir / MODEL, weights_only=False)["q_network"]
    straight_weights = torch.load(straight_dir / MODEL, weights_only=False)["q_network"]
    for key in straight_weights:
        assert torch.equal(resumed_weights[key], straight_weights[key]), key


# --- the loop's own wiring -------------------------------------------------------------------
# test_pqn_atari.rollouts() rebuilds, per iteration, what the loop acted on and what the envs answered. Here the
# episode starts are derived from that stream alone, and a plain recurrence (one step at a time, the state zeroed by
# hand before each start) recomputes every max Q, the carried state, the returns and every minibatch's loss.


def starts_seen(found: list[dict]) -> np.ndarray:
    """[iterations * num_steps + 1, num_envs]: which observations start a training episode, from the stream: the run's
    first, and the one after each autoreset step (a new game's, or after a lost life, which the episodic-life envs
    report as a termination, a new life's first). The autoreset step acts on the ended episode's final observation."""
    ended = np.concatenate([r["terminated"] | r["truncated"] for r in found])
    starts = np.zeros((len(ended) + 1, ended.shape[1]), dtype=bool)
    starts[0] = True
    starts[2:] |= ended[:-1]
    return starts


def plain_q(q_network, obs: torch.Tensor, starts: np.ndarray, state: tuple):
    """Q-values [T, B, A] over obs [T, B, ...] one LSTM step at a time from `state`, zeroing an env's (h, c) before
    each observation that starts an episode, and the state after the last step; in the network's dtype."""
    dtype = q_network.q_func.weight.dtype
    features = q_network.network(obs.flatten(0, 1).to(dtype) * q_network.scale).view(*obs.shape[:2], -1)
    h, c = (s.to(dtype) for s in state)
    q_values = []
    for t in range(len(obs)):
        keep = torch.as_tensor(~np.asarray(starts[t])).to(dtype).view(1, -1, 1)
        output, (h, c) = q_network.lstm(features[t].unsqueeze(0), (h * keep, c * keep))
        q_values.append(q_network.q_func(output[0]))
    return torch.stack(q_values), (h, c)


def network_from(state_dict: dict, obs_shape: tuple, n_actions: int) -> script.QNetwork:
    q_network = script.QNetwork(obs_shape, n_actions, 255.0 if obs_shape[-1] == 84 else 1.0)
    q_network.load_state_dict(state_dict)
    return q_network


def check_loop(trace, num_envs: int, num_steps: int, epochs: int, minibatches: int, rtol: float) -> dict:
    """Every check of the loop's wiring against the plain references (`rtol`: of the gradients, see the callers);
    returns counts that say the run was telling."""
    found = rollouts(trace, num_envs, num_steps)
    starts = starts_seen(found)
    obs_shape, n_actions = tuple(found[0]["obs"].shape[2:]), None
    updates = {}
    for update in trace.backward:
        updates.setdefault(update["step"], []).append(update)
    counts = dict(starts_inside=int(starts[1:-1].sum()), lives=0, masked=0)
    state = None
    for i, rollout in enumerate(found):
        first, rows = rollout["update"], slice(i * num_steps, (i + 1) * num_steps)
        storage = first["storage"]
        n_actions = n_actions or first["q_network"]["q_func.weight"].shape[0]
        q_network = network_from(first["q_network"], obs_shape, n_actions)  # the network that collected the rollout
        # What the rollout stored, against the stream.
        assert torch.equal(storage["obs"], rollout["obs"])
        assert storage["actions"].tolist() == rollout["action"].tolist()
        np.testing.assert_array_equal(storage["rewards"], np.sign(rollout["reward"]))
        np.testing.assert_array_equal(storage["terminations"], rollout["terminated"] | rollout["life_loss"])
        np.testing.assert_array_equal(storage["truncations"], rollout["truncated"])
        np.testing.assert_array_equal(storage["resets"], rollout["resets"])
        assert storage["starts"].tolist() == starts[rows].tolist()
        # The state each rollout begins with: zeros, then the plain recurrence's state after the previous rollout.
        state = state or tuple(torch.zeros(1, num_envs, 128) for _ in range(2))
        for begun, expected in zip(storage["initial_state"], state):
            assert torch.allclose(begun, expected, atol=1e-5)
        with torch.no_grad():
            q_values, state = plain_q(q_network, rollout["obs"], starts[rows], state)
            assert torch.allclose(storage["max_q"], q_values.amax(-1), atol=1e-5)
            for after, expected in zip(first["lstm_state"], state):
                assert torch.allclose(after, expected, atol=1e-5)
            # The bootstrap after the rollout: one more step of the memory, on the observation that follows.
            assert first["next_starts"].tolist() == starts[rows.stop].tolist()
            after_q, _ = plain_q(q_network, first["obs"][None], starts[rows.stop][None], state)
        next_max_q = torch.cat([q_values.amax(-1)[1:], after_q.amax(-1)]).double().numpy()
        terminations = rollout["terminated"] | rollout["life_loss"]
        flags = [np.sign(rollout["reward"]), next_max_q, terminations, rollout["truncated"], rollout["resets"]]
        expected = np.array(reference_returns(*(np.asarray(f, dtype=float).tolist() for f in flags), GAMMA, Q_LAMBDA))
        np.testing.assert_allclose(first["returns"].numpy(), expected, rtol=1e-5, atol=1e-5)
        # Each minibatch: whole env sequences replayed from the rollout's first state by the network of that step.
        iteration = updates[rollout["step"]]
        assert len(iteration) == epochs * minibatches
        for epoch in range(epochs):
            taken = torch.cat([u["mb_envs"] for u in iteration[epoch * minibatches : (epoch + 1) * minibatches]])
            assert sorted(taken.tolist()) == list(range(num_envs)), "an epoch takes every env's sequence once"
        for update in iteration:
            envs = update["mb_envs"].numpy()
            model = network_from(update["q_network"], obs_shape, n_actions).double()
            begun = tuple(s[:, envs] for s in storage["initial_state"])
            replayed, _ = plain_q(model, rollout["obs"][:, envs], starts[rows][:, envs], begun)
            taken = replayed.gather(2, torch.as_tensor(rollout["action"][:, envs]).unsqueeze(2)).squeeze(2)
            kept = torch.as_tensor(~rollout["resets"][:, envs].astype(bool))
            # The returns are constants; the loss and its gradient in float64.
            loss = ((taken - torch.as_tensor(expected[:, envs])) ** 2)[kept].mean()
            where = f"update at step {rollout['step']}, envs {envs.tolist()}"
            reference = gradients(loss, dict(model.named_parameters()))
            assert_gradients_match(update["grads"]["q_network"], reference, where, rtol=rtol)
            assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-4)
            counts["masked"] += int((~kept).sum())
        counts["lives"] += int(rollout["life_loss"].sum())
    return counts


def test_minatar_loop_zeroes_the_state_at_episode_starts_and_replays_from_the_rollouts_first_state(minatar_run):
    # rtol 1e-4: the LSTM over 32 steps in float32 puts the gradients up to 1.6e-5 off float64's (a plain float32
    # replay is as far off), too close to the default 2e-5.
    counts = check_loop(minatar_run[0], num_envs=4, num_steps=32, epochs=2, minibatches=2, rtol=1e-4)
    assert counts["starts_inside"] >= 5 and counts["masked"] >= 5, counts


def test_envpool_breakout_loop_zeroes_the_state_after_lost_lives_and_games(breakout_run):
    # rtol 1e-2: LayerNorm over a convolution of a nearly uniform Breakout frame amplifies float32 rounding: one
    # minibatch's first convolution bias comes out 1.7e-3 off float64's (a plain float32 replay too), the rest <= 2e-5.
    counts = check_loop(breakout_run[0], num_envs=2, num_steps=64, epochs=1, minibatches=2, rtol=1e-2)
    assert counts["lives"] >= 2 and counts["starts_inside"] >= 2, counts


def test_epsilon_and_the_learning_rate_follow_their_schedules(minatar_run):
    trace, run_dir = minatar_run
    for rollout in rollouts(trace, 4, 32):
        for t, epsilon in enumerate(rollout["epsilon"]):
            acted_at = rollout["step"] - (32 - t) * 4  # epsilon is computed before the step is counted
            assert epsilon == pytest.approx(max(1 + (0.01 - 1) * acted_at / (0.1 * 1536), 0.01))
    learning_rates = [value for _, value in read_scalars(run_dir)["charts/learning_rate"]]
    assert learning_rates == pytest.approx([1e-3 * (1 - i / 12) for i in range(12)])
