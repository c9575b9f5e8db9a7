"""Runs never share a directory: two runs of the same script, env, exp-name and seed started in the same second each
get a folder of their own, with their own complete events, args and checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import ROOT, read_scalars, script_env

import cleanrl_utils.run as run_module
from cleanrl_utils.checkpoint import CHECKPOINT_NAME

PPO_TINY = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
# Both processes read the same frozen wall clock, so both name their run in the same second, whatever the start-up
# times: the collision is certain, not left to chance. (SPS and event timestamps read it too; nothing here checks them.)
FROZEN_CLOCK = (
    "import runpy, sys, time; time.time = lambda: 1_800_000_000.25; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_two_runs_started_in_the_same_second_get_two_complete_folders(tmp_path):
    flags = [*PPO_TINY, "--update-epochs", "1", "--total-timesteps", "256", "--checkpoint-every", "128", "--seed", "7"]
    argv = [sys.executable, "-c", FROZEN_CLOCK, str(ROOT / "cleanrl" / "ppo.py"), *flags]
    processes = [
        subprocess.Popen(argv, cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0].decode() for p in processes]
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]

    run_dirs = sorted((tmp_path / "runs").iterdir())
    assert [d.name for d in run_dirs] == ["CartPole-v1__ppo__7__1800000000", "CartPole-v1__ppo__7__1800000001"]
    for run_dir in run_dirs:
        assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1, f"{run_dir.name}: events of two runs"
        scalars = read_scalars(run_dir)
        # One run's curve: each logged step once (two writers in one folder would log every step twice).
        steps = [step for step, _ in scalars["losses/value_loss"]]
        assert steps == sorted(set(steps)) and steps[-1] == 256, steps
        assert json.loads((run_dir / "args.json").read_text())["seed"] == 7
        assert (run_dir / CHECKPOINT_NAME).is_file() and (run_dir / "finished.json").is_file()
    # Each run's last line says where it was written (its own folder) and how to see its curves.
    last_lines = sorted(output.strip().splitlines()[-1] for output in outputs)
    assert last_lines == [f"run written to runs/{d.name}; its curves: tensorboard --logdir runs" for d in run_dirs]


def test_claim_run_dir_takes_the_next_free_second(tmp_path, monkeypatch):
    monkeypatch.setattr(run_module, "RUNS_ROOT", tmp_path / "runs")
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.9)

    class Args:
        env_id, exp_name, seed = "ALE/Breakout-v5", "dqn_atari", 1

    claimed = [run_module.claim_run_dir(Args()) for _ in range(3)]
    assert [d.name for d in claimed] == [f"ALE-Breakout-v5__dqn_atari__1__180000000{i}" for i in range(3)]
    assert all(d.is_dir() for d in claimed)
