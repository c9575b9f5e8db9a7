"""Exact resume for every environment family the scripts accept (issue 18).

Environment level: a vector env made as the scripts make it is snapshot in the middle of an episode and right after
an episode ended (the SAME_STEP autoreset just happened), put back into freshly made (and differently seeded) envs,
and stepped on with the same actions: observations, rewards, terminations, truncations, final observations and
episode statistics must equal the uninterrupted env's exactly for STEPS_AFTER steps.
Script level: SIGKILL after the first checkpoint, then --resume, ends with the uninterrupted run's episodic returns
and final weights (Ant-v5 with PPO and SAC, a dm_control task, PointChasing-v0). Classic control's and MuJoCo
Warp's script-level resume tests live in test_ppo.py, test_dqn.py ... and test_ppo_isaacgym.py.
"""

from __future__ import annotations

import copy
import pickle
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    assert_bad_input,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    script_env,
)

from cleanrl_utils.checkpoint import restore_envs, snapshot_envs

STEPS_AFTER = 1000
MUJOCO_TASKS = [
    "Ant-v5",
    "Humanoid-v5",
    "HumanoidStandup-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
    "Swimmer-v5",
    "Reacher-v5",
    "Pusher-v5",
    "InvertedPendulum-v5",
    "InvertedDoublePendulum-v5",
]
# cheetah: no model change; reacher, finger and swimmer: targets (geom, site and light positions, sizes) set in the
# model at each reset; hopper: touch sensors.
DM_CONTROL_TASKS = [
    "dm_control/cheetah-run-v0",
    "dm_control/reacher-hard-v0",
    "dm_control/finger-turn_hard-v0",
    "dm_control/swimmer-swimmer6-v0",
    "dm_control/hopper-hop-v0",
]


def transition(outputs) -> tuple:
    """What a step returned, copied (the scripts' vector envs return buffers that the next step overwrites), as
    NumPy, with the infos reduced to what the scripts read: final observations and episode statistics."""
    obs, reward, terminated, truncated, infos = outputs
    final = {}
    if "final_obs" in infos:
        ended = np.asarray(infos["_final_obs"])
        final["final_obs"] = [np.asarray(o).copy() for o in np.asarray(infos["final_obs"], dtype=object)[ended]]
    if "episode" in infos:
        ended = np.asarray(infos["_episode"])
        final["episode"] = [np.asarray(infos["episode"][k])[ended].copy() for k in ("r", "l")]
    arrays = [
        np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x).copy() for x in (obs, reward, terminated, truncated)
    ]
    return (*arrays, final)


def assert_same(a: tuple, b: tuple, where: str) -> None:
    for name, x, y in zip(("obs", "reward", "terminated", "truncated"), a[:4], b[:4]):
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{where}: {name} differs ({x} vs {y})"
    assert a[4].keys() == b[4].keys(), where
    for key in a[4]:
        assert all(np.array_equal(x, y) for x, y in zip(a[4][key], b[4][key], strict=True)), f"{where}: {key}"


def check_exact_resume(make, actions: np.ndarray, mid_step: int, seed: int = 1) -> None:
    """Step `make()` with `actions`, snapshot after step `mid_step` (no episode ended there) and after the first
    later step in which an episode ended; restore each snapshot into a fresh `make()` and check STEPS_AFTER more
    steps."""
    reference = make()
    reference.reset(seed=seed)
    history, snapshots = [], {}
    t = 0
    while not snapshots or t < max(snapshots) + STEPS_AFTER:
        step = transition(reference.step(actions[t]))
        history.append(step)
        t += 1
        ended = bool(np.any(step[2] | step[3]))
        if (t >= mid_step and not ended and not snapshots) or (ended and len(snapshots) == 1):
            snapshots[t] = (snapshot_envs(reference, step[0]), step[0])
        assert t < len(actions), "no episode ended: choose a task or actions that end one"
    reference.close()
    for t, (snapshot, next_obs) in snapshots.items():
        assert snapshot is not None
        fresh = make()
        fresh.reset(seed=seed + 1)  # the restored state, not the seed, decides what follows
        restored, restored_obs = restore_envs(fresh, snapshot)
        assert np.array_equal(np.asarray(restored_obs), next_obs)
        ends = 0
        for k in range(t, t + STEPS_AFTER):
            step = transition(restored.step(actions[k]))
            assert_same(step, history[k], f"snapshot after step {t}, step {k + 1}")
            ends += int(np.sum(step[2] | step[3]))
        if t == min(snapshots):
            assert ends >= 1, "the comparison from the middle of an episode must cross an episode boundary"
        restored.close()


def uniform_actions(space: gym.spaces.Box, n: int, seed: int = 0) -> np.ndarray:
    low, high = np.maximum(space.low, -1.0), np.minimum(space.high, 1.0)
    return np.random.default_rng(seed).uniform(low, high, (n, *space.shape)).astype(space.dtype)


# --- environment level -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", MUJOCO_TASKS)
def test_gymnasium_mujoco_resumes_exactly(env_id):
    from ppo_continuous_action import make_envs

    make = lambda: make_envs(env_id, 2)  # noqa: E731
    probe = make()
    actions = uniform_actions(probe.action_space, 3 * STEPS_AFTER)
    probe.close()
    check_exact_resume(make, actions, mid_step=150)


@pytest.mark.parametrize("env_id", DM_CONTROL_TASKS)
def test_dm_control_resumes_exactly(env_id):
    from ppo_continuous_action import make_envs

    make = lambda: make_envs(env_id, 2)  # noqa: E731
    probe = make()
    actions = uniform_actions(probe.action_space, 3 * STEPS_AFTER)
    probe.close()
    check_exact_resume(make, actions, mid_step=150)


def test_snapshot_saves_the_simulator_state_not_the_simulator():
    """A snapshot holds the integration state (and what a task reads before stepping), never a pickled MjData
    (0.2-0.8 MB each, 12 MB in dm_control with its textures)."""
    from ppo_continuous_action import make_envs

    for env_id, limit in (("Ant-v5", 15_000), ("dm_control/cheetah-run-v0", 60_000)):
        envs = make_envs(env_id, 1)
        obs, _ = envs.reset(seed=0)
        assert len(pickle.dumps(snapshot_envs(envs, obs))) < limit, env_id
        envs.close()


def test_dm_control_composer_tasks_are_not_saved():
    """Composer tasks (manipulation, locomotion) recompile their physics from the MJCF scene at each reset."""
    from ppo_continuous_action import make_envs

    envs = make_envs("dm_control/reach_site_features-v0", 1)
    obs, _ = envs.reset(seed=0)
    assert snapshot_envs(envs, obs) is None
    envs.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_classic_control_discrete_resumes_exactly(env_id):
    from ppo import make_envs

    make = lambda: make_envs(env_id, 2)  # noqa: E731
    actions = np.random.default_rng(0).integers(0, make().single_action_space.n, (3 * STEPS_AFTER, 2))
    check_exact_resume(make, actions, mid_step=10)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "MountainCarContinuous-v0"])
def test_classic_control_continuous_resumes_exactly(env_id):
    from ppo_continuous_action import make_envs

    make = lambda: make_envs(env_id, 2)  # noqa: E731
    check_exact_resume(make, uniform_actions(make().action_space, 3 * STEPS_AFTER), mid_step=50)


def test_point_chasing_resumes_exactly():
    from ppo_continuous_action import make_envs

    make = lambda: make_envs("PointChasing-v0", 2)  # noqa: E731
    check_exact_resume(make, uniform_actions(make().action_space, 4 * STEPS_AFTER), mid_step=150)


def test_batched_point_chasing_resumes_exactly():
    import cleanrl_utils.envs.point_chasing  # noqa: F401  (registers the id)

    make = lambda: gym.make_vec("PointChasing-v0", num_envs=16, vectorization_mode="vector_entry_point")  # noqa: E731
    actions = uniform_actions(make().action_space, 4 * STEPS_AFTER)
    check_exact_resume(make, torch.as_tensor(actions), mid_step=150)


def warp_transition(outputs) -> tuple:
    obs, reward, terminated, truncated, info = outputs
    done = info["done"]
    ended = [info["final_obs"][done], info["episode_return"][done], info["episode_length"][done]]
    return tuple(x.clone() for x in (obs, reward, terminated, truncated, *ended))


# MuJoCo Warp steps about 8 times a second on a CPU: STEPS_AFTER steps would take minutes.
WARP_STEPS_AFTER = 20


def test_mujoco_warp_resumes_exactly_on_the_cpu():
    """ppo_isaacgym.py's MuJoCo Warp Ant (16 worlds) through its own state_dict, what its checkpoints hold."""
    from ppo_isaacgym import MuJoCoWarpVecEnv

    cpu, num_envs, steps_after = torch.device("cpu"), 16, WARP_STEPS_AFTER
    reference = MuJoCoWarpVecEnv("Ant", num_envs, cpu, seed=1)
    actions = 2 * torch.rand((200, num_envs, reference.act_dim), generator=torch.Generator().manual_seed(0)) - 1
    history, snapshots = [], {}
    t = 0
    while len(snapshots) < 2 or t < max(snapshots) + steps_after:
        history.append(warp_transition(reference.step(actions[t])))
        t += 1
        ended = bool((history[-1][2] | history[-1][3]).any())
        if (t >= 5 and not ended and not snapshots) or (ended and len(snapshots) == 1):
            snapshots[t] = copy.deepcopy(reference.state_dict())
    for t, state in snapshots.items():
        restored = MuJoCoWarpVecEnv("Ant", num_envs, cpu, seed=2)
        restored.load_state_dict(state)
        ends = 0
        for k in range(t, t + steps_after):
            step = warp_transition(restored.step(actions[k]))
            for x, y in zip(step, history[k], strict=True):
                assert x.dtype == y.dtype and torch.equal(x, y), f"snapshot after step {t}, step {k + 1}"
            ends += int((step[2] | step[3]).sum())
        assert ends >= 1


# --- script level: SIGKILL after the first checkpoint, then --resume --------------------------------------------------

# Each run ends on a checkpoint (--total-timesteps a multiple of --checkpoint-every): the last one holds the final
# weights. Episodes: Ant's last ~100 steps here, dm_control's and PointChasing's (untrained) 1000 and 1024, so an
# episode spans the checkpoint and ends after the resume in every case.
PPO_SMALL = ["--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "2", "--torch-threads", "1"]
SAC_SMALL = ["--learning-starts", "100", "--batch-size", "32", "--buffer-size", "1000", "--torch-threads", "1"]
SCRIPT_RUNS = {  # script, flags, --total-timesteps, --checkpoint-every
    "ppo-ant": ("ppo_continuous_action.py", ["--env-id", "Ant-v5", "--seed", "1", *PPO_SMALL], 512, 256),
    "sac-ant": ("sac_continuous_action.py", ["--env-id", "Ant-v5", "--seed", "3", *SAC_SMALL], 400, 200),
    "ppo-dm_control": (
        "ppo_continuous_action.py",
        ["--env-id", "dm_control/reacher-hard-v0", "--seed", "2", *PPO_SMALL, "--num-steps", "256"],
        1024,
        512,
    ),
    "ppo-point_chasing": ("ppo_continuous_action.py", ["--env-id", "PointChasing-v0", *PPO_SMALL], 1280, 640),
}


def assert_same_state(a, b, where: str = "checkpoint") -> None:
    """Exact equality of nested dicts, lists, tensors, arrays and numbers."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("case", SCRIPT_RUNS)
def test_sigkill_then_resume_matches_the_uninterrupted_run(case, tmp_path):
    script, flags, total, every = SCRIPT_RUNS[case]
    flags = [*flags, "--total-timesteps", str(total), "--checkpoint-every", str(every)]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(script, *flags, cwd=straight)
    assert result.returncode == 0, result.stderr
    (straight_dir,) = run_dirs(straight)

    run_dir = kill_at_first_checkpoint(script, flags, interrupted)
    killed_at = torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"]
    assert killed_at < total
    resumed = run_script(script, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert "could not be saved" not in resumed.stdout

    scalars, reference = read_scalars(run_dir), read_scalars(straight_dir)
    assert scalars["charts/episodic_return"] == reference["charts/episodic_return"]
    # One environment: an episode's last step is its global step; the first to end after the kill began before it.
    step, length = next((step, length) for step, length in reference["charts/episodic_length"] if step > killed_at)
    assert step - length < killed_at, "an episode must span the checkpoint"
    final, straight_final = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (run_dir, straight_dir))
    assert final["global_step"] == straight_final["global_step"] == total
    for checkpoint in (final, straight_final):  # the env pickle holds wall-clock episode start times
        checkpoint["envs"] = {key: checkpoint["envs"][key] for key in ("simulators", "next_obs")}
        del checkpoint["args"]  # --resume differs
    assert_same_state(final, straight_final)


# --- faults: an old checkpoint format, a second SIGTERM -------------------------------------------------------------


def test_a_checkpoint_in_an_older_format_is_refused_in_one_line(workdir):
    old = workdir / "old.pt"
    torch.save({"format": "cleanrl-checkpoint-v1", "script": "ppo", "env_id": "CartPole-v1", "args": {}}, old)
    result = run_script("ppo.py", "--resume", str(old), cwd=workdir)
    assert_bad_input(result, workdir, "format cleanrl-checkpoint-v1, older than this version's", "start a new run")


def test_environments_saved_in_the_older_snapshot_layout_are_refused_in_one_line(capsys):
    """Checkpoints written before the MuJoCo state held the lagging arrays: their MuJoCo envs would resume inexactly."""
    from ppo_continuous_action import make_envs

    old_snapshot = {"pickle": b"", "mujoco": [None], "next_obs": None}
    with pytest.raises(SystemExit) as exit_info:
        restore_envs(make_envs("Hopper-v5", 1), old_snapshot)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "saved in an older format" in lines[0], lines


# Run as `python -c SLOW_SAVE script flags...`: the script, with torch.save writing half of each checkpoint, touching
# $WRITING_MARKER and pausing a second before the other half, so that a signal can be sent in the middle of a write.
SLOW_SAVE = """
import io, os, runpy, sys, time
from pathlib import Path
import torch

save = torch.save


def slow_save(obj, f, *args, **kwargs):
    buffer = io.BytesIO()
    save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    Path(os.environ["WRITING_MARKER"]).touch()
    time.sleep(1.0)
    f.write(data[len(data) // 2 :])


torch.save = slow_save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
CARTPOLE_FLAGS = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]


def test_a_second_sigterm_during_the_checkpoint_write_changes_nothing(tmp_path):
    flags = [*CARTPOLE_FLAGS, "--total-timesteps", "2048"]
    straight, interrupted, marker = tmp_path / "straight", tmp_path / "interrupted", tmp_path / "writing"
    straight.mkdir(), interrupted.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, str(ROOT / "cleanrl" / "ppo.py"), *flags],
        cwd=interrupted,
        env=script_env(WRITING_MARKER=str(marker)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line = proc.stdout.readline()
    assert "steps (" in first_line, first_line + proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marker.exists(), "the checkpoint write did not start"
    proc.send_signal(signal.SIGTERM)  # half of the checkpoint is written
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("SIGTERM: checkpoint written") == 1, out
    (run_dir,) = run_dirs(interrupted)
    assert sorted(p.name for p in run_dir.glob("*checkpoint*")) == ["checkpoint.pt"]  # no temporary file left
    assert 0 < torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] < 2048

    resumed = run_script("ppo.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_script("ppo.py", *flags, cwd=straight).returncode == 0
    returns, reference = (read_scalars(d)["charts/episodic_return"] for d in (run_dir, *run_dirs(straight)))
    assert returns == reference and len(reference) > 20
