"""qdagger_dqn_atari_impalacnn.py: the distillation loss and weight against plain references, the script's own loop
under tests/probe.py (teacher phase, offline and online updates: each one's loss and gradient against a float64 TD +
weighted KL reference with the target and the teacher's policy held constant, no gradient into the target network
or the teacher, the teacher unchanged) with a dqn_atari.py teacher pulled from a prepared offline Hugging Face cache,
--save-model + evaluation, SIGKILL + resume in the offline and in the online phase, bad input."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import qdagger_dqn_atari_impalacnn as qdagger
import torch
import tyro
from conftest import ROOT, assert_bad_input, assert_finite_keys, read_scalars, run_dirs, run_script, script_env
from update_reference import assert_gradients_match, assert_unchanged, gradients

SCRIPT = "qdagger_dqn_atari_impalacnn.py"
REPO_ID = "alice/dqn_atari-MinAtar-Breakout-v1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TEACHER_STEPS, OFFLINE_STEPS, ONLINE_STEPS = 400, 100, 500  # logged once, at step 1000
OFFLINE_END = TEACHER_STEPS + OFFLINE_STEPS
FLAGS = [
    *("--env-id", "MinAtar/Breakout-v1", "--teacher-model", f"hf://{REPO_ID}", "--teacher-eval-episodes", "10"),
    *("--teacher-steps", str(TEACHER_STEPS), "--offline-steps", str(OFFLINE_STEPS)),
    *("--total-timesteps", str(ONLINE_STEPS), "--buffer-size", "1000", "--learning-starts", "100"),
    *("--batch-size", "8", "--target-network-frequency", "50", "--exploration-fraction", "0.2", "--gamma", "0.9"),
    *("--temperature", "2.0", "--checkpoint-every", "450", "--save-model", "--eval-episodes", "2"),
]
KEYS = ["charts/episodic_return", "charts/epsilon", "charts/distill_coeff", "charts/teacher/avg_episodic_return"]
KEYS += ["losses/loss", "losses/td_loss", "losses/distill_loss", "losses/q_values", "eval/episodic_return"]


# ---------------------------------------------------------------------------- the math, against plain references


def kl_reference(student_q: list[list[float]], teacher_q: list[list[float]], temperature: float) -> float:
    """Mean over states of sum_a p(a) log(p(a) / q(a)), p and q softmaxes of the Q-values / temperature."""

    def softmax(values):
        exps = [math.exp(v / temperature) for v in values]
        return [e / sum(exps) for e in exps]

    total = 0.0
    for s, t in zip(student_q, teacher_q):
        p, q = softmax(t), softmax(s)
        total += sum(p_a * math.log(p_a / q_a) for p_a, q_a in zip(p, q))
    return total / len(student_q)


def test_distillation_loss_on_a_hand_computed_case():
    # softmax(1, 2, 3) = (0.0900, 0.2447, 0.6652) against uniform: log 3 - entropy = 1.0986 - 0.8324 = 0.2662.
    loss = qdagger.distillation_loss(torch.zeros(1, 3), torch.tensor([[1.0, 2.0, 3.0]]), 1.0)
    assert loss.item() == pytest.approx(0.2662, abs=1e-4)
    assert qdagger.distillation_loss(torch.tensor([[5.0, 1.0]]), torch.tensor([[5.0, 1.0]]), 0.5).item() == 0


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
def test_distillation_loss_matches_the_plain_reference(temperature):
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(6, 4, generator=generator) * 3, torch.randn(6, 4, generator=generator) * 3
    loss = qdagger.distillation_loss(student, teacher, temperature)
    assert loss.item() == pytest.approx(kl_reference(student.tolist(), teacher.tolist(), temperature), rel=1e-5)
    # Its gradient reaches the student only: the teacher is a fixed target.
    student.requires_grad_(True)
    qdagger.distillation_loss(student, teacher, temperature).backward()
    assert student.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "returns, teacher_score, weight",
    [
        ([8.0] * 9, 10.0, 1.0),  # fewer than 10 games: 1
        ([100.0, 100.0] + [5.0] * 10, 10.0, 0.5),  # the last 10 games only: 1 - 5 / 10
        ([2.0, 4.0] * 5, 12.0, 0.75),  # 1 - 3 / 12
        ([12.0] * 10, 10.0, 0.0),  # better than the teacher: 0, never negative
        ([-3.0] * 10, 10.0, 1.0),  # negative returns: at most 1
        ([-30.0] * 10, -20.0, 0.5),  # a teacher below zero: (G_T - G_S) / |G_T|
        ([-10.0] * 10, -20.0, 0.0),
    ],
)
def test_distillation_weight_on_hand_computed_cases(returns, teacher_score, weight):
    assert qdagger.distillation_weight(returns, teacher_score) == pytest.approx(weight)


# ---------------------------------------------------------------------------- the teacher, the cache, the runs


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory) -> Path:
    """A tiny dqn_atari.py run's saved model: the teacher of every test here."""
    cwd = tmp_path_factory.mktemp("teacher")
    flags = ["--env-id", "MinAtar/Breakout-v1", "--buffer-size", "400", "--learning-starts", "100"]
    flags += ["--batch-size", "8", "--total-timesteps", "300", "--save-model", "--eval-episodes", "1"]
    result = run_script("dqn_atari.py", *flags, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return run_dirs(cwd)[0] / "dqn_atari.cleanrl_model"


@pytest.fixture(scope="module")
def hf_env(teacher_file, tmp_path_factory) -> dict:
    """The environment of a process that finds the teacher as hf://REPO_ID in a Hugging Face cache laid out as
    snapshot_download leaves it, offline."""
    hf_home = tmp_path_factory.mktemp("hf")
    repo = hf_home / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / teacher_file.name).write_bytes(teacher_file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return script_env(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_HUB_CACHE=None, HF_TOKEN=None)


STEP_NAMES = ["obs", "obs_np", "actions", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "rewards_b", "terminations_b", "weight"]
BATCH_NAMES += ["q_network", "target_network"]


@pytest.fixture(scope="module")
def straight(hf_env, tmp_path_factory):
    """The whole run, uninterrupted, under the probe: what its loop saw and computed, and its run directory."""
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("straight")
    grads = ["q_network", "target_network", "teacher"]
    trace = probe_script(
        SCRIPT, FLAGS, cwd, watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=grads, final=["teacher"], env=hf_env
    )
    return trace, run_dirs(cwd)[0]


def test_smoke_logs_the_keys_and_evaluates_the_saved_student(straight):
    trace, run_dir = straight
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS)
    assert len(scalars["eval/episodic_return"]) == 2
    model = torch.load(run_dir / f"{SCRIPT[:-3]}.cleanrl_model", weights_only=False)
    assert model["script"] == SCRIPT[:-3]
    assert all(step > OFFLINE_END for step, _ in scalars["charts/episodic_return"]), "only the student's games"


def phase_steps(trace, start: int, end: int) -> list[dict]:
    return [entry for entry in trace.steps if start < entry["step"] <= end and "actions" in entry]


def transitions(steps: list[dict]) -> set:
    """(obs, action, clipped reward, termination, next obs) of every real transition of a stream of loop steps."""
    seen, resets = set(), np.zeros(1, dtype=bool)
    for step in steps:
        for env in np.flatnonzero(~resets):
            obs, next_obs = step["obs"][env].numpy().tobytes(), step["obs_np"][env].tobytes()
            reward, ended = float(np.sign(step["rewards"][env])), bool(step["terminations"][env])
            seen.add((obs, int(step["actions"][env]), reward, ended, next_obs))
        resets = step["terminations"] | step["truncations"]
    return seen


def teacher_score(run_dir: Path) -> float:
    return read_scalars(run_dir)["charts/teacher/avg_episodic_return"][0][1]


@pytest.fixture
def one_thread():
    """The networks here are tiny: torch's thread pool only adds waiting (a 10x10 convolution 18 ms instead of 0.1 on a
    busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_each_update_is_td_plus_weighted_distillation_from_the_right_replay(straight, teacher_file, one_thread):
    trace, run_dir = straight
    teacher_stream = transitions(phase_steps(trace, 0, TEACHER_STEPS))
    online = phase_steps(trace, OFFLINE_END, OFFLINE_END + ONLINE_STEPS)
    student_stream = transitions(online)
    score = teacher_score(run_dir)
    assert score > 0, "the teacher should score, for the weight to fall between 0 and 1"
    shape = online[0]["obs"].shape[1:]
    # float64 copies (MinAtar's cells are 0/1: the layers run on the float64 observations, scale 1).
    q_network, target_network = (qdagger.QNetwork(shape, 3, 1.0).double() for _ in range(2))
    teacher = qdagger.TeacherQNetwork(shape, 3, 1.0)  # the file's: the loss must distil exactly this teacher
    saved_teacher = torch.load(teacher_file, weights_only=False)["q_network"]
    teacher.load_state_dict(saved_teacher)
    teacher.double()
    updates = trace.backward
    offline = [u for u in updates if u["step"] <= OFFLINE_END]
    assert len(offline) == OFFLINE_STEPS
    assert len(updates) - len(offline) == (ONLINE_STEPS - 100) // 4
    weights = []
    for update in updates:
        in_offline, where = update["step"] <= OFFLINE_END, f"update at step {update['step']}"
        stream = teacher_stream if in_offline else student_stream
        for i in range(8):
            key = (update["obs_b"][i].numpy().tobytes(), int(update["actions_b"][i]), float(update["rewards_b"][i]))
            key += (bool(update["terminations_b"][i]), update["next_obs_b"][i].numpy().tobytes())
            assert key in stream, f"{where} sampled a row of the other replay"
        # The weight: 1 offline; online from the student's games that ended so far.
        returns = [
            r
            for step in online
            if step["step"] <= update["step"] and "episode" in step["infos"]
            for r in step["infos"]["episode"]["r"][step["infos"]["_episode"]]
        ]
        expected = 1.0 if in_offline or len(returns) < 10 else max(1 - np.mean(returns[-10:]) / score, 0.0)
        expected = min(expected, 1.0)
        assert update["weight"] == pytest.approx(expected, abs=1e-6)
        weights.append(update["weight"])
        # The loss: the TD error against the target network's max (a constant) plus the weighted KL from the
        # teacher's softmax(Q_T / 2) (a constant) to the student's, both means over the batch.
        q_network.load_state_dict(update["q_network"])
        target_network.load_state_dict(update["target_network"])
        obs, next_obs = update["obs_b"].double(), update["next_obs_b"].double()
        student_q = q_network.network(obs)
        q_taken = student_q[torch.arange(8), update["actions_b"]]
        with torch.no_grad():
            next_max = target_network.network(next_obs).max(dim=1).values
            target = update["rewards_b"].double() + 0.9 * next_max * (1 - update["terminations_b"].double())
            teacher_q = teacher.network(obs)
            teacher_log_pi = torch.log_softmax(teacher_q / 2.0, dim=1)
        td = ((q_taken - target) ** 2).mean()
        kl = (teacher_log_pi.exp() * (teacher_log_pi - torch.log_softmax(student_q / 2.0, dim=1))).sum(1).mean()
        assert kl.item() == pytest.approx(kl_reference(student_q.tolist(), teacher_q.tolist(), 2.0), rel=1e-9)
        loss = td + expected * kl
        reference = gradients(loss, dict(q_network.named_parameters()))
        assert_gradients_match(update["grads"]["q_network"], reference, where)
        assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
        # Neither the target network nor the teacher gets a gradient (the teacher is never trained).
        for fixed in ("target_network", "teacher"):
            assert all(grad is None for grad in update["grads"][fixed].values()), f"{where}: {fixed} has a gradient"
    # The teacher at the end of the run is the file's, bitwise: it never moved.
    assert_unchanged(saved_teacher, trace.final["teacher"], "the teacher at the end of the run")
    assert any(0 < w < 1 for w in weights), f"the weight should decay somewhere: {sorted(set(weights))}"


def test_the_teacher_fills_its_replay_acting_greedily_on_its_own_q_values(straight, teacher_file, one_thread):
    trace, _ = straight
    steps = phase_steps(trace, 0, TEACHER_STEPS)
    assert len(steps) == TEACHER_STEPS
    saved = torch.load(teacher_file, weights_only=False)
    teacher = qdagger.TeacherQNetwork(saved["obs_shape"], saved["n_actions"], saved["obs_high"])
    teacher.load_state_dict(saved["q_network"])
    greedy_taken = 0
    for step in steps:
        acted_at = step["step"] - 1
        assert step["epsilon"] == pytest.approx(max(1 + (0.01 - 1) * acted_at / TEACHER_STEPS, 0.01))
        with torch.no_grad():
            greedy_taken += int(teacher(step["obs"]).argmax(dim=1).item() == step["actions"][0])
    # Epsilon falls from 1 to 0.01: about half of the actions are random, 1/3 of those greedy by chance.
    assert greedy_taken > 0.6 * TEACHER_STEPS


# ---------------------------------------------------------------------------- SIGKILL + resume, in both phases


def start(flags: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "cleanrl" / SCRIPT), *flags], cwd=cwd, env=env, stdout=subprocess.DEVNULL
    )


def kill_at_checkpoint(proc: subprocess.Popen, checkpoint: Path, step: int) -> None:
    """SIGKILL `proc` as soon as `checkpoint` holds global step `step` (written atomically: whole or absent)."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if checkpoint.exists() and torch.load(checkpoint, weights_only=False)["global_step"] >= step:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert torch.load(checkpoint, weights_only=False)["global_step"] == step


def test_sigkill_in_the_offline_then_the_online_phase_resumes_to_the_uninterrupted_run(straight, hf_env, tmp_path):
    _, straight_dir = straight
    killed = start(FLAGS, tmp_path, hf_env)
    while not run_dirs(tmp_path):
        time.sleep(0.01)
    checkpoint = run_dirs(tmp_path)[0] / "checkpoint.pt"
    kill_at_checkpoint(killed, checkpoint, 450)  # offline: the teacher's replay, no student replay yet
    state = torch.load(checkpoint, weights_only=False)
    assert state["teacher_replay_buffer"] is not None and state["replay_buffer"] is None
    resumed = start([*FLAGS, "--resume", str(checkpoint)], tmp_path, hf_env)
    kill_at_checkpoint(resumed, checkpoint, 900)  # online: the student's replay, the teacher's freed
    state = torch.load(checkpoint, weights_only=False)
    assert state["teacher_replay_buffer"] is None and state["replay_buffer"] is not None
    assert state["envs"] is not None and len(state["student_returns"]) > 0
    result = run_script(SCRIPT, *FLAGS, "--resume", str(checkpoint), cwd=tmp_path, env=hf_env)
    assert result.returncode == 0, result.stderr
    resumed_scalars, straight_scalars = read_scalars(run_dirs(tmp_path)[0]), read_scalars(straight_dir)
    for key in ("charts/episodic_return", "charts/distill_coeff", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    for key in ("losses/loss", "losses/distill_loss"):  # logged after a gradient step since the last resume
        assert [e for e in resumed_scalars[key] if e[0] > 900] == [e for e in straight_scalars[key] if e[0] > 900]


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def validate_fails(capsys):
    """Run the script's validate() on `flags` and return the one line it printed to stderr before exiting with 2
    (validate runs before the run directory is made; the subprocess case below checks that none is left)."""

    def check(*flags: str) -> str:
        args = tyro.cli(qdagger.Args, args=list(flags))
        with pytest.raises(SystemExit) as exit_info:
            qdagger.validate(args)
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    return check


def test_bad_input_fails_in_one_line(teacher_file, straight, validate_fails):
    _, straight_dir = straight
    student = straight_dir / f"{SCRIPT[:-3]}.cleanrl_model"
    tiny = ["--env-id", "MinAtar/Breakout-v1", "--teacher-steps", "400", "--total-timesteps", "500"]
    tiny += ["--learning-starts", "100", "--buffer-size", "1000"]
    assert "--teacher-model is required" in validate_fails(*tiny)
    line = validate_fails(*tiny, "--teacher-model", str(student))
    assert f"saved by {SCRIPT}" in line and "dqn_atari.py" in line
    assert "a training checkpoint" in validate_fails(*tiny, "--teacher-model", str(straight_dir / "checkpoint.pt"))
    line = validate_fails(*tiny, "--teacher-model", str(teacher_file), "--env-id", "MinAtar/SpaceInvaders-v1")
    assert "MinAtar/Breakout-v1" in line and "MinAtar/SpaceInvaders-v1" in line
    assert "--teacher-steps" in validate_fails(*tiny, "--teacher-model", str(teacher_file), "--teacher-steps", "2")
    assert "--temperature" in validate_fails(*tiny, "--teacher-model", str(teacher_file), "--temperature", "0")


def test_a_teacher_missing_from_the_offline_cache_fails_in_one_line_with_no_run_dir(tmp_path):
    env = script_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_HUB_CACHE=None, HF_TOKEN=None)
    flags = ["--env-id", "MinAtar/Breakout-v1", "--teacher-model", "hf://alice/missing-teacher"]
    result = run_script(SCRIPT, *flags, "--buffer-size", "1000", cwd=tmp_path, env=env)
    assert_bad_input(result, tmp_path, "hf://alice/missing-teacher", "HF_HUB_OFFLINE=1")
