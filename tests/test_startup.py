"""Start-up: what a training run imports before its first step (benchmark/results/speed.md, "Start-up")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from conftest import ROOT, script_env

# Each is imported only where it is used (--track, plotting, the tuner, the results tables), never by a training run:
# wandb alone costs ~2 s of start-up, matplotlib ~0.8 s, scipy ~0.8 s.
ONLY_WHEN_USED = ("wandb", "matplotlib", "optuna", "scipy", "pandas", "rliable")

PROBE = f"""
import gc, sys
sys.path.insert(0, {str(ROOT / "cleanrl")!r})
import ppo, ppo_continuous_action, dqn, td3_continuous_action, sac_continuous_action  # the scripts' module level
import cleanrl_utils.run as run
loaded = sorted(name for name in {ONLY_WHEN_USED!r} if name in sys.modules)
assert not loaded, f"imported by a training script before any work: {{loaded}}"

run.import_dynamo_with_gc_paused()
assert "torch._dynamo" in sys.modules
assert gc.isenabled(), "the garbage collector stayed paused after the torch._dynamo import"
gc.disable()
run.import_dynamo_with_gc_paused()
assert not gc.isenabled(), "a collector the caller had disabled was switched back on"
"""


def test_training_scripts_import_only_what_training_needs():
    """A fresh interpreter: the five scripts' module level and cleanrl_utils.run import none of the packages that only
    --track, plotting, tuning or the result tables need; the torch._dynamo import leaves the collector as it was."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_second_uv_run_starts_at_once_and_prints_nothing():
    """`uv run` checks the environment and runs: no recompiling of the environment's bytecode (pyproject.toml's
    [tool.uv] has no compile-bytecode; with it, each `uv run` printed "Bytecode compiled 27516 files in 3.57s" and
    took 3-5 s here). The second of two runs, with the extras the suite runs with, adds well under a second to the
    interpreter's own start (measured here: 0.1 s; the bound leaves room for a loaded CI machine)."""
    uv = shutil.which("uv")
    assert uv, "uv is on PATH wherever the suite runs (.ci/run installs it)"
    env = {key: value for key, value in os.environ.items() if not key.startswith("UV_")}
    command = [uv, "run", "--all-extras", "--frozen", "python", "-c", "pass"]
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=300, check=True)
    started = time.perf_counter()
    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    with_uv = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
    plain = time.perf_counter() - started
    assert second.returncode == 0 and second.stdout == "" and second.stderr == "", second.stderr
    assert with_uv - plain < 1.0, f"uv run took {with_uv:.2f} s, the interpreter alone {plain:.2f} s"
