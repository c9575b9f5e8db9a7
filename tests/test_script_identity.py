"""A script's identity is its file: every script in cleanrl/, copied under a new name or run with another
--exp-name, saves, evaluates and resumes its own models and checkpoints; a file saved by another script is
refused in one line naming that script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, assert_bad_input, run_python, script_env

MULTIAGENT_REPLAY = ["--buffer-size", "500", "--batch-size", "16", "--learning-starts", "40", "--num-envs", "4"]
VMAS_SHORT = ["--env-id", "vmas/navigation", "--max-episode-steps", "10"]
PPO_TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
OFF_POLICY_TINY = ["--buffer-size", "500", "--batch-size", "16", "--learning-starts", "100"]
PIXEL_REPLAY_TINY = ["--buffer-size", "500", "--batch-size", "8", "--learning-starts", "100", "--num-envs", "2"]

# cleanrl_utils.evaluate (a subprocess of its own) runs on the models of one script per family.
ONE_PER_FAMILY = ["ppo.py", "dqn_atari.py", "sac_continuous_action.py", "mappo.py"]

# Tiny runs of every script: (flags, total timesteps, --checkpoint-every for a checkpoint before the end).
RUNS = {
    "ppo.py": (["--env-id", "CartPole-v1", *PPO_TINY], 192, 100),
    "ppo_action_mask.py": (["--env-id", "Taxi-v4", *PPO_TINY], 192, 100),
    "dqn.py": (["--env-id", "CartPole-v1", *OFF_POLICY_TINY], 300, 200),
    "c51.py": (["--env-id", "CartPole-v1", *OFF_POLICY_TINY, "--n-atoms", "11"], 300, 200),
    "d3qn.py": (["--env-id", "CartPole-v1", *OFF_POLICY_TINY], 300, 200),
    "pqn.py": (["--env-id", "CartPole-v1", *PPO_TINY], 192, 100),
    "dqn_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PIXEL_REPLAY_TINY], 300, 200),
    "c51_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PIXEL_REPLAY_TINY], 300, 200),
    "rainbow_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PIXEL_REPLAY_TINY], 300, 200),
    "qrdqn_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PIXEL_REPLAY_TINY, "--n-quantiles", "11"], 300, 200),
    "ppo_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PPO_TINY], 192, 100),
    "ppo_atari_lstm.py": (["--env-id", "MinAtar/Breakout-v1", *PPO_TINY], 192, 100),
    "ppo_atari_multigpu.py": (  # one rank: run without torchrun
        ["--env-id", "MinAtar/Breakout-v1", "--local-num-envs", "2", *PPO_TINY[2:]],
        192,
        100,
    ),
    "impala_atari.py": (  # one actor on a Ray cluster of this machine
        ["--env-id", "MinAtar/Breakout-v1", "--num-actors", "1", "--local-num-envs", "2", "--num-steps", "16"]
        + ["--rollouts-per-update", "1"],
        128,
        96,
    ),
    "ppo_atari_envpool.py": (["--env-id", "Breakout-v5", *PPO_TINY], 192, 100),
    "ppo_procgen.py": (["--env-id", "StarpilotEasy-v0", *PPO_TINY], 192, 100),
    "ppg_procgen.py": (
        ["--env-id", "StarpilotEasy-v0", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
        + ["--n-iteration", "2", "--e-auxiliary", "1", "--num-aux-rollouts", "2"],
        192,
        100,
    ),
    "ppo_rnd_envpool.py": (
        ["--env-id", "Breakout-v5", *PPO_TINY, "--num-iterations-obs-norm-init", "1"],  # short games to evaluate
        192,
        100,
    ),
    "sac_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PIXEL_REPLAY_TINY], 300, 200),
    "pqn_atari.py": (["--env-id", "MinAtar/Breakout-v1", *PPO_TINY], 192, 100),
    "pqn_atari_envpool_lstm.py": (["--env-id", "MinAtar/Breakout-v1", *PPO_TINY], 192, 100),
    "ppo_continuous_action.py": (["--env-id", "Pendulum-v1", *PPO_TINY], 192, 100),
    "ppo_continuous_action_hterm.py": (["--env-id", "Pendulum-v1", *PPO_TINY], 192, 100),
    "rpo_continuous_action.py": (["--env-id", "Pendulum-v1", *PPO_TINY], 192, 100),
    "sac_continuous_action.py": (["--env-id", "Pendulum-v1", *OFF_POLICY_TINY], 300, 200),
    "td3_continuous_action.py": (["--env-id", "Pendulum-v1", *OFF_POLICY_TINY], 300, 200),
    "ddpg_continuous_action.py": (["--env-id", "Pendulum-v1", *OFF_POLICY_TINY], 300, 200),
    "redq_continuous_action.py": (["--env-id", "Pendulum-v1", *OFF_POLICY_TINY, "--utd-ratio", "2"], 300, 200),
    "crossq_continuous_action.py": (
        ["--env-id", "Pendulum-v1", *OFF_POLICY_TINY, "--critic-hidden", "32", "--actor-hidden", "16"],
        300,
        200,
    ),
    "simbav2_continuous_action.py": (
        ["--env-id", "Pendulum-v1", *OFF_POLICY_TINY, "--critic-hidden-dim", "16", "--actor-hidden-dim", "8"],
        300,
        200,
    ),
    "ppo_continuous_action_lstm.py": (["--env-id", "Pendulum-v1", *PPO_TINY, "--lstm-size", "8"], 192, 100),
    "tqc_continuous_action.py": (
        ["--env-id", "Pendulum-v1", *OFF_POLICY_TINY, "--critic-hidden", "32", "--actor-hidden", "16"],
        300,
        200,
    ),
    "ppo_isaacgym.py": (
        [
            "--env-id",
            "Hopper",
            "--num-envs",
            "8",
            "--num-steps",
            "8",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--log-every",
            "1",
        ],
        192,
        100,
    ),
    "fast_sac_isaacgym.py": (
        ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "200"]
        + ["--batch-size", "16", "--learning-starts", "100", "--critic-hidden", "32", "--actor-hidden", "16"]
        + ["--num-updates", "2", "--policy-frequency", "2"],
        300,
        200,
    ),
    "fast_td3_isaacgym.py": (
        ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "200"]
        + ["--batch-size", "16", "--learning-starts", "100", "--critic-hidden", "32", "--actor-hidden", "16"],
        300,
        200,
    ),
    "ppo_pettingzoo_ma_atari.py": (["--env-id", "pong_v3", *PPO_TINY, "--max-cycles", "160"], 192, 100),
    "ppo_trxl.py": (
        ["--env-id", "ProofofMemory-v0", *PPO_TINY, "--trxl-num-layers", "1", "--trxl-dim", "8"]
        + ["--trxl-num-heads", "1", "--trxl-memory-length", "4"],
        192,
        100,
    ),
    "qdagger_dqn_atari_impalacnn.py": (  # TEACHER: an untrained dqn_atari.py model (the teacher_model fixture)
        ["--env-id", "MinAtar/Breakout-v1", "--teacher-model", "TEACHER", *PIXEL_REPLAY_TINY]
        + ["--teacher-steps", "100", "--offline-steps", "50", "--teacher-eval-episodes", "2"],
        300,
        250,
    ),
    "mappo.py": (
        [
            *VMAS_SHORT,
            "--num-envs",
            "4",
            "--num-steps",
            "10",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "1",
            "--hidden-size",
            "16",
        ],
        120,
        80,
    ),
    "qmix.py": ([*VMAS_SHORT, "--no-continuous-actions", *MULTIAGENT_REPLAY, "--hidden-dim", "16"], 120, 80),
    "vdn.py": ([*VMAS_SHORT, "--no-continuous-actions", *MULTIAGENT_REPLAY, "--hidden-dim", "16"], 120, 80),
    "maddpg.py": ([*VMAS_SHORT, *MULTIAGENT_REPLAY, "--hidden-dim", "16"], 120, 80),
    "matd3.py": ([*VMAS_SHORT, *MULTIAGENT_REPLAY, "--hidden-dim", "16"], 120, 80),
}


def test_every_script_is_covered():
    assert sorted(RUNS) == sorted(p.name for p in (ROOT / "cleanrl").glob("*.py"))


def run(script: Path, *flags: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_python(script, *flags, cwd=cwd, timeout=timeout)


def evaluate(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.evaluate", str(path), "--episodes", "1"],
        cwd=cwd,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def only_run_dir(cwd: Path) -> Path:
    (run_dir,) = sorted((cwd / "runs").iterdir())
    return run_dir


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="session")
def teacher_model(tmp_path_factory) -> Path:
    """A model saved as dqn_atari.py saves one (untrained: the identity checks need a teacher, not a good one)."""
    sys.path.insert(0, str(ROOT / "cleanrl"))
    try:
        import dqn_atari
    finally:
        sys.path.pop(0)
    from cleanrl_utils.checkpoint import save_model

    path = tmp_path_factory.mktemp("teacher") / "dqn_atari.cleanrl_model"
    q_network = dqn_atari.QNetwork((4, 10, 10), 3, 1.0)
    args = dqn_atari.Args(env_id="MinAtar/Breakout-v1")
    model = dict(q_network=q_network.state_dict(), obs_shape=(4, 10, 10), n_actions=3, obs_high=1.0)
    save_model(path, args, ROOT / "cleanrl" / "dqn_atari.py", **model)
    return path


def tiny_flags(name: str, request: pytest.FixtureRequest) -> tuple[list[str], int, int]:
    flags, total, every = RUNS[name]
    if "TEACHER" in flags:
        flags = [str(request.getfixturevalue("teacher_model")) if f == "TEACHER" else f for f in flags]
    return [*flags, "--total-timesteps", str(total), "--eval-episodes", "1"], total, every


@pytest.mark.parametrize("name", sorted(RUNS))
def test_copied_script_saves_evaluates_and_resumes_its_own_files(name, tmp_path, request):
    copy = tmp_path / "scripts" / f"my_{name}"
    copy.parent.mkdir()
    shutil.copy(ROOT / "cleanrl" / name, copy)
    flags, total, every = tiny_flags(name, request)
    ok(run(copy, *flags, "--save-model", "--checkpoint-every", str(every), cwd=tmp_path))
    run_dir = only_run_dir(tmp_path)
    model = run_dir / f"my_{Path(name).stem}.cleanrl_model"
    assert model.is_file(), sorted(p.name for p in run_dir.iterdir())
    checkpoint = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert checkpoint["script"] == f"my_{Path(name).stem}" and checkpoint["global_step"] < total

    resumed = ok(
        run(
            copy,
            *flags,
            "--save-model",
            "--checkpoint-every",
            str(every),
            "--resume",
            str(run_dir / "checkpoint.pt"),
            cwd=tmp_path,
        )
    )
    assert "model saved to" in resumed.stdout
    # The copy's evaluate() reloaded the model it saved (load_model refuses a model saved by another script) ...
    assert "evaluation over 1 episodes" in resumed.stdout, resumed.stdout[-3000:]
    assert only_run_dir(tmp_path) == run_dir  # the resumed run continued the same directory
    if name in ONE_PER_FAMILY:  # ... and cleanrl_utils.evaluate, shared by all scripts, finds the copy's file
        assert f"my_{Path(name).stem}.py on" in ok(evaluate(run_dir, cwd=tmp_path)).stdout

    # The original script refuses the copy's checkpoint and its model, in one line naming the copy.
    (tmp_path / "other").mkdir()
    refused = run(ROOT / "cleanrl" / name, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "other")
    assert_bad_input(refused, tmp_path / "other", f"written by my_{Path(name).stem}.py, not {Path(name).stem}.py")


# The run folder, the model's file name and the algorithm recorded in it come from cleanrl_utils/run.py, shared by all
# scripts (each script's own save/evaluate path is run above, under a copy's name): one script per family suffices.
@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_any_exp_name_saves_and_evaluates(name, tmp_path, request):
    flags, _, _ = tiny_flags(name, request)
    ok(run(ROOT / "cleanrl" / name, *flags, "--exp-name", "other", "--save-model", cwd=tmp_path))
    run_dir = only_run_dir(tmp_path)
    assert "__other__" in run_dir.name
    result = ok(evaluate(run_dir / "other.cleanrl_model", cwd=tmp_path))
    assert f"{Path(name).stem}.py on" in result.stdout and "over 1 episodes" in result.stdout


def test_another_algorithms_files_fail_in_one_line(tmp_path, request):
    """A ppo checkpoint given to dqn.py --resume, and a ppo model given to dqn's and sac's evaluate()."""
    flags, _, every = tiny_flags("ppo.py", request)
    ok(run(ROOT / "cleanrl" / "ppo.py", *flags, "--save-model", "--checkpoint-every", str(every), cwd=tmp_path))
    run_dir = only_run_dir(tmp_path)
    (tmp_path / "dqn").mkdir()
    dqn_flags, _, _ = tiny_flags("dqn.py", request)
    refused = run(
        ROOT / "cleanrl" / "dqn.py", *dqn_flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "dqn"
    )
    assert_bad_input(refused, tmp_path / "dqn", "written by ppo.py, not dqn.py")
    for other in ("dqn", "sac_continuous_action"):
        code = (
            f"import sys; sys.path.insert(0, {str(ROOT / 'cleanrl')!r}); import {other}; "
            f"{other}.evaluate({str(run_dir / 'ppo.cleanrl_model')!r}, 1, 'cpu')"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], env=script_env(), capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"error: model {run_dir / 'ppo.cleanrl_model'} was saved by ppo.py, not {other}.py"
        ]
    # and a checkpoint is not a model
    result = evaluate(run_dir / "checkpoint.pt", cwd=tmp_path)
    assert result.returncode == 2 and "a training checkpoint, not a saved model" in result.stderr
