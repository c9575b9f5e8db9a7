"""dqn.py: its own loop run under observation (replay rows against the env's stream, every update's loss against the
DQN target from the sampled rows and the copied networks, target-network copies, epsilon; the same run is the smoke
run; every update's gradient against a float64 reference loss's, none reaching the target network), TD target and
replay buffer against the definitions, bad input, checkpoints and resume, learning."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import dqn
import numpy as np
import pytest
import torch
import torch.nn.functional as F
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
from update_reference import assert_gradients_match, assert_no_gradient, gradients, leaves

SMALL = [
    "--num-envs",
    "2",
    "--buffer-size",
    "500",
    "--batch-size",
    "32",
    "--train-frequency",
    "2",
    "--target-network-frequency",
    "50",
]
TINY = [*SMALL, "--learning-starts", "100"]
DQN_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
]


def test_a_renamed_copy_evaluates_and_resumes_its_own_files_and_dqn_refuses_them(tmp_path):
    copy = tmp_path / "my_dqn.py"
    shutil.copy(ROOT / "cleanrl" / "dqn.py", copy)
    flags = [*TINY, "--total-timesteps", "400", "--checkpoint-every", "200", "--save-model", "--eval-episodes", "1"]

    def run_copy(*extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(copy), *flags, *extra]
        return subprocess.run(command, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)

    result = run_copy()
    assert result.returncode == 0, result.stderr
    assert "evaluation over 1 episodes" in result.stdout  # its evaluate() reloaded the model it saved
    (run_dir,) = run_dirs(tmp_path)
    assert torch.load(run_dir / "my_dqn.cleanrl_model", weights_only=False)["script"] == "my_dqn"
    checkpoint = str(run_dir / "checkpoint.pt")
    resumed = run_copy("--resume", checkpoint)
    assert resumed.returncode == 0 and "evaluation over 1 episodes" in resumed.stdout, resumed.stderr
    assert run_dirs(tmp_path) == [run_dir]
    refused = run_script("dqn.py", *flags, "--resume", checkpoint, cwd=tmp_path)
    assert refused.returncode == 2 and "written by my_dqn.py, not dqn.py" in refused.stderr, refused.stderr


# --- the loop's own wiring -----------------------------------------------------------------------------------------
# dqn.py runs unchanged under tests/probe.py on ProbeWalk-v0 (tests/probe_envs.py: 8-step episodes that terminate or
# are truncated, varied rewards, distinct observations): what its loop stored and computed is compared with the env's
# stream and with the DQN target recomputed from the sampled rows and the copied networks. The same run is the smoke
# run (TensorBoard keys, the saved model's evaluation).

LOOP_FLAGS = ["--env-id", "ProbeWalk-v0", "--num-envs", "2", "--buffer-size", "360", "--batch-size", "16"]
LOOP_FLAGS += ["--learning-starts", "100", "--train-frequency", "4", "--target-network-frequency", "40"]
LOOP_FLAGS += ["--total-timesteps", "400", "--exploration-fraction", "0.5", "--end-e", "0.2", "--gamma", "0.9"]
LOOP_FLAGS += ["--learning-rate", "1e-3", "--save-model", "--eval-episodes", "2", "--exp-name", "mine"]
STEP_NAMES = ["obs_np", "actions", "next_obs_np", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs", "next_obs", "actions", "rewards", "terminations", "q_network", "target_network"]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    names = dict(watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=["q_network", "target_network"], final=["rb"])
    return probe_script("dqn.py", LOOP_FLAGS, cwd, **names, preload=["probe_envs"]), cwd


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(loop):
    trace, cwd = loop
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, DQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    # Any --exp-name names the files; the model still says which script saved it.
    assert torch.load(run_dir / "mine.cleanrl_model", weights_only=False)["script"] == "dqn"
    assert (run_dir / "args.json").is_file()
    assert "400/400 steps" in trace.stdout  # the progress display's final line


def stream(trace) -> list[dict]:
    """One dict per loop iteration (taken as the step is stored): the observation acted on, the actions, epsilon and
    what the env returned, with `true_next`: the next observation, the true final one where an episode ended."""
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    assert [entry["step"] for entry in steps] == list(range(2, 401, 2))
    for step in steps:
        step["true_next"] = step["next_obs_np"].copy()
        for env in np.flatnonzero(step["infos"].get("_final_obs", [])):
            step["true_next"][env] = step["infos"]["final_obs"][env]
    return steps


def transition(step: dict, env: int) -> tuple:
    """(obs, action, reward, terminated, true next obs) of one env's step, as a replay row holds them (float32)."""
    reward = float(np.float32(step["rewards"][env]))
    action, terminated = float(step["actions"][env]), float(step["terminations"][env])
    return (step["obs_np"][env].tobytes(), action, reward, terminated, step["true_next"][env].tobytes())


def test_the_replay_buffer_holds_each_step_with_its_true_next_observation_and_terminations_only(loop):
    trace, _ = loop
    steps, rb = stream(trace), trace.final["rb"]
    assert (rb["size"], rb["pos"]) == (360, 400 % 360)  # 200 steps of 2 envs: 400 rows, wrapped around
    obs_dim = 3
    ends = {"terminated": 0, "truncated": 0}
    for t, step in enumerate(steps[-180:], start=len(steps) - 180):  # the last 180 steps fill the 360 rows
        for env in range(2):
            row = rb["data"][(2 * t + env) % 360]
            obs, next_obs, (action, reward, terminated) = row[:obs_dim], row[obs_dim : 2 * obs_dim], row[2 * obs_dim :]
            assert obs.numpy().tobytes() == step["obs_np"][env].astype(np.float32).tobytes()
            # The true next observation, never the reset one where the episode ended; the termination flag only.
            assert next_obs.numpy().tobytes() == step["true_next"][env].tobytes(), f"step {t}, env {env}"
            assert (action.item(), terminated.item()) == (step["actions"][env], float(step["terminations"][env]))
            assert reward.item() == pytest.approx(step["rewards"][env], rel=1e-6)
            ends["terminated"] += int(step["terminations"][env])
            ends["truncated"] += int(step["truncations"][env] and not step["terminations"][env])
    assert min(ends.values()) >= 3, ends


def mlp_q(params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Q-values from a QNetwork's weights (two hidden ReLU layers of 120 and 84 units)."""
    h = F.relu(F.linear(obs, params["fc1.weight"], params["fc1.bias"]))
    h = F.relu(F.linear(h, params["fc2.weight"], params["fc2.bias"]))
    return F.linear(h, params["fc3.weight"], params["fc3.bias"])


def test_each_update_samples_recent_transitions_and_regresses_on_the_target_networks_max(loop):
    trace, _ = loop
    steps = stream(trace)
    updates = trace.backward
    assert [u["step"] for u in updates] == list(range(104, 401, 4))  # one gradient step per 4 env steps after 100
    terminal = truncated_next = 0
    for update in updates:
        t, where = update["step"] // 2, f"update at step {update['step']}"  # t: steps stored; the buffer holds 180
        recent = {transition(step, env) for step in steps[max(0, t - 180) : t] for env in range(2)}
        batch = zip(update["obs"], update["actions"], update["rewards"], update["terminations"], update["next_obs"])
        for obs, action, reward, terminated, next_obs in batch:
            key = (obs.numpy().tobytes(), action.item(), reward.item(), terminated.item(), next_obs.numpy().tobytes())
            assert key in recent, f"{where}: a sampled row is not a transition in the buffer"
            truncated_next += next_obs[1].item() == 1.0 and not terminated  # ProbeWalk's 8th step: a truncation
        # The loss in float64: Q(s, a) of the online weights against r + gamma max_a' Q_target(s', a'), the target
        # network's (a constant: the gradient reaches the online network only).
        online = leaves(update["q_network"])
        with torch.no_grad():
            next_max = mlp_q(leaves(update["target_network"]), update["next_obs"].double()).max(dim=1).values
            target = update["rewards"].double() + 0.9 * next_max * (1 - update["terminations"].double())
        q_taken = mlp_q(online, update["obs"].double())[torch.arange(16), update["actions"]]
        expected = ((q_taken - target) ** 2).mean()
        assert_gradients_match(update["grads"]["q_network"], gradients(expected, online), where)
        assert_no_gradient(update["grads"]["target_network"], where)
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        terminal += int(update["terminations"].sum())
    assert terminal > 0 and truncated_next > 0, "sampled rows should hold terminations and truncations"


def test_the_target_network_is_the_online_network_copied_every_target_network_frequency_steps(loop):
    trace, _ = loop
    updates = trace.backward
    initial = updates[0]["q_network"]
    copy_steps = [c for c in range(40, 401, 40) if c > 100]
    for k, update in enumerate(updates):
        # Copied at the end of the iteration whose step reached a multiple of 40 after learning started (after that
        # iteration's gradient step): the online weights that the next update found.
        copies = [c for c in copy_steps if c < update["step"]]
        expected = next(u for u in updates if u["step"] > copies[-1])["q_network"] if copies else initial
        for name, tensor in update["target_network"].items():
            assert torch.equal(tensor, expected[name]), f"update {k} at step {update['step']}: {name}"
    assert not torch.equal(updates[-1]["target_network"]["fc3.weight"], initial["fc3.weight"])


def test_epsilon_decays_linearly_over_the_exploration_fraction(loop):
    trace, _ = loop
    duration = 0.5 * 400
    steps = stream(trace)
    for step in steps:
        acted_at = step["step"] - 2  # epsilon is computed before the step is counted
        assert step["epsilon"] == pytest.approx(max(1 + (0.2 - 1) * acted_at / duration, 0.2))
    assert steps[-1]["epsilon"] == pytest.approx(0.2)


# --- the maths -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_td_target_cuts_the_bootstrap_only_at_terminations(dtype):
    gamma = 0.9
    rewards = [1.0, 0.5, -1.0, 2.0]
    next_q_max = [3.0, 4.0, 5.0, -6.0]
    # 0: terminated; 1: truncated by a time limit (stored as not terminated); 2: mid-episode;
    # 3: terminated with a negative next value (must not leak into the target either).
    terminations = [1.0, 0.0, 0.0, 1.0]
    expected = [r if done else r + gamma * q for r, q, done in zip(rewards, next_q_max, terminations)]
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    got = dqn.td_target(t(rewards), t(next_q_max), t(terminations), gamma)
    assert got.dtype == dtype
    assert got.tolist() == pytest.approx(expected)
    assert got[0].item() == 1.0 and got[1].item() == pytest.approx(0.5 + 0.9 * 4.0)


def test_linear_schedule_decays_then_holds():
    assert dqn.linear_schedule(1.0, 0.05, 1000, 0) == 1.0
    assert dqn.linear_schedule(1.0, 0.05, 1000, 500) == pytest.approx(0.525)
    assert dqn.linear_schedule(1.0, 0.05, 1000, 1000) == pytest.approx(0.05)
    assert dqn.linear_schedule(1.0, 0.05, 1000, 10**6) == 0.05


def test_select_actions_is_greedy_at_zero_and_uniform_at_one():
    torch.manual_seed(0)
    q_network = dqn.QNetwork(4, 3)
    with torch.no_grad():
        q_network.fc3.weight.zero_()
        q_network.fc3.bias.copy_(torch.tensor([0.0, 1.0, -1.0]))  # action 1 is greedy everywhere
    obs = torch.randn(3000, 4)
    assert (dqn.select_actions(q_network, obs, 0.0, 3) == 1).all()
    counts = np.bincount(dqn.select_actions(q_network, obs, 1.0, 3), minlength=3) / 3000
    np.testing.assert_allclose(counts, [1 / 3] * 3, atol=0.04)
    greedy = (dqn.select_actions(q_network, obs, 0.3, 3) == 1).mean()
    assert greedy == pytest.approx(0.7 + 0.3 / 3, abs=0.04)


# --- the replay buffer -----------------------------------------------------------------------


def test_buffer_wraps_around_and_samples_what_it_holds():
    rb = dqn.ReplayBuffer(5, 2, 1, torch.device("cpu"))
    for step in range(4):  # 8 transitions into 5 slots: the oldest 3 are overwritten
        obs = np.array([[2 * step], [2 * step + 1]], dtype=np.float32)
        rb.add(obs, obs + 100, np.array([0, 1]), np.array([1.0, 2.0]), np.array([False, True]), {})
    assert rb.size == 5 and rb.pos == 3
    assert rb.obs[:, 0].tolist() == [5, 6, 7, 3, 4]  # slots 0-2 hold the last step and a half
    assert rb.actions.tolist() == [1, 0, 1, 1, 0] and rb.terminations.tolist() == [1, 0, 1, 1, 0]
    obs, next_obs, actions, rewards, terminations = rb.sample(64)
    assert obs.shape == (64, 1) and actions.dtype == torch.long
    assert set(obs[:, 0].tolist()) <= {3, 4, 5, 6, 7}
    assert torch.equal(next_obs, obs + 100)
    assert torch.equal(actions, (obs[:, 0] % 2).long()) and torch.equal(terminations, (obs[:, 0] % 2))
    assert torch.equal(rewards, 1.0 + obs[:, 0] % 2)
    state = rb.state_dict()
    restored = dqn.ReplayBuffer(5, 2, 1, torch.device("cpu"))
    restored.load_state_dict(state)
    assert torch.equal(restored.data, rb.data) and (restored.pos, restored.size) == (3, 5)
    assert torch.equal(restored.next_obs, rb.obs + 100)  # the named views see the restored data


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "Pendulum-v1"], ["Discrete", "ddpg_continuous_action.py", "sac_continuous_action.py"]),
        (["--buffer-size", "64", "--batch-size", "128"], ["--batch-size 128 is larger than --buffer-size 64"]),
        (["--total-timesteps", "0"], ["--total-timesteps must be positive"]),
        # the default --learning-starts 10000: nothing would be learned
        (["--total-timesteps", "5000"], ["--learning-starts 10000 must be in [0, --total-timesteps 5000)"]),
        (["--start-e", "0.1", "--end-e", "0.5"], ["--end-e", "--start-e"]),
        # 10**12 transitions of 11 float32s: 44,000 GB, refused before allocating (and before the run directory).
        (
            ["--buffer-size", "1000000000000"],
            ["--buffer-size: the replay buffer needs 44000.0 GB", "lower --buffer-size"],
        ),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("dqn.py", *flags, cwd=workdir), workdir, *fragments)


def test_resume_rejects_a_ppo_checkpoint(workdir):
    from cleanrl_utils.checkpoint import CHECKPOINT_FORMAT

    path = workdir / "ppo.pt"
    args = {"exp_name": "ppo", "env_id": "CartPole-v1"}
    torch.save({"format": CHECKPOINT_FORMAT, "script": "ppo", "env_id": "CartPole-v1", "args": args}, path)
    assert_bad_input(run_script("dqn.py", "--resume", str(path), cwd=workdir), workdir, "written by ppo.py, not dqn.py")


def test_non_finite_loss_writes_a_checkpoint_then_fails_naming_loss_and_step(workdir):
    result = run_script("dqn.py", *TINY, "--total-timesteps", "2000", "--learning-rate", "1e30", cwd=workdir)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert re.search(
        r"losses/(td_loss|q_values) is (nan|inf|-inf) at step \d+; checkpoint written to ", result.stderr
    ), result.stderr
    (run_dir,) = run_dirs(workdir)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert f"at step {checkpoint['global_step']};" in result.stderr


# --- checkpoints, resume and determinism -----------------------------------------------------


def episodic_returns(run_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(run_dir)["charts/episodic_return"]


def model_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "dqn.cleanrl_model", weights_only=False)["q_network"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


RESUME_FLAGS = [
    *SMALL,
    "--learning-starts",
    "500",
    "--total-timesteps",
    "3000",
    "--checkpoint-every",
    "1000",
    "--save-model",
    "--eval-episodes",
    "1",
]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """An uninterrupted run with RESUME_FLAGS, shared by the resume and determinism tests."""
    workdir = tmp_path_factory.mktemp("straight")
    result = run_script("dqn.py", *RESUME_FLAGS, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    return run_dir


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(workdir, straight_run):
    run_dir = kill_at_first_checkpoint("dqn.py", RESUME_FLAGS, workdir)
    assert not (run_dir / "dqn.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 3000 and checkpoint["replay_buffer"]["size"] == 500

    resumed = run_script("dqn.py", *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    assert "next_log" not in checkpoint and "losses" not in checkpoint  # no logging state in checkpoints
    # Whole curves, exactly: every log after the resume follows a post-resume gradient step (one per vector step).
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in ("charts/episodic_return", "losses/td_loss", "losses/q_values", "charts/epsilon"):
        assert resumed_scalars[key] == straight_scalars[key], key
    assert_same_weights(model_weights(run_dir), model_weights(straight_run))


def test_same_seed_gives_identical_curves(workdir, straight_run):
    result = run_script("dqn.py", *RESUME_FLAGS, cwd=workdir)
    assert result.returncode == 0, result.stderr
    curves = []
    for run_dir in (straight_run, run_dirs(workdir)[0]):
        scalars = read_scalars(run_dir)
        curves.append({k: scalars[k] for k in ("charts/episodic_return", "losses/td_loss", "losses/q_values")})
    assert curves[0] == curves[1]
    assert_same_weights(model_weights(straight_run), model_weights(run_dirs(workdir)[0]))


def test_sigterm_writes_checkpoint_and_exits_zero(workdir):
    out, run_dir = sigterm_while_training("dqn.py", [*TINY, "--total-timesteps", "10000000"], workdir)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 10_000_000
    assert checkpoint["replay_buffer"]["size"] == min(checkpoint["global_step"], 500)
