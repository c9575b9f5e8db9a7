"""Helpers shared by the tests: run a script in a subprocess, read its TensorBoard events."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "cleanrl"))  # lets tests import the scripts' functions
# As in impala_atari.py: Ray's `uv run` hook would build a uv environment for every worker (set before ray's import).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# One thread per process: pytest-xdist already runs one test per core, and the scripts under test start their own
# processes. Measured on 2 cores like CI's, 12 identity tests under -n 2: 90 s with default threads, 76 s with 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def script_env(**extra: str | None) -> dict:
    """The environment for a script under test: headless rendering, W&B offline, no API key.
    A None value removes that variable."""
    env = dict(os.environ)
    env.update(SDL_VIDEODRIVER="dummy", MUJOCO_GL="egl", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    env.pop("WANDB_API_KEY", None)
    env.update(extra)
    return {key: value for key, value in env.items() if value is not None}


def run_script(
    script: str, *flags: str, cwd: Path, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run cleanrl/<script> with `flags` in `cwd` (runs/ is written there)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "cleanrl" / script), *flags],
        cwd=cwd,
        env=env or script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_dirs(cwd: Path) -> list[Path]:
    runs = cwd / "runs"
    return sorted(runs.iterdir()) if runs.exists() else []


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a run, as {tag: [(step, value), ...]}, with TensorBoard's purge of
    events that a resumed run superseded."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_finite_keys(scalars: dict, keys: list[str]) -> None:
    missing = [k for k in keys if not scalars.get(k)]
    assert not missing, f"missing TensorBoard keys {missing}; have {sorted(scalars)}"
    for key in keys:
        bad = [v for _, v in scalars[key] if not math.isfinite(v)]
        assert not bad, f"{key} has non-finite values {bad[:5]}"


def assert_bad_input(result: subprocess.CompletedProcess, cwd: Path, *fragments: str) -> None:
    """Exit code non-zero, exactly one line on stderr naming the problem, no traceback, no run dir."""
    assert result.returncode != 0, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert run_dirs(cwd) == [], "a run directory was left behind"


def kill_at_first_checkpoint(script: str, flags: list[str] | tuple[str, ...], cwd: Path) -> Path:
    """Start cleanrl/<script>, SIGKILL it as soon as its first checkpoint exists (no chance to
    clean up: a crash or a preempted machine), and return its run directory."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cleanrl" / script), *flags],
        cwd=cwd,
        env=script_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not list(cwd.glob("runs/*/checkpoint.pt")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    (run_dir,) = run_dirs(cwd)
    return run_dir


def sigterm_while_training(
    script: str, flags: list[str] | tuple[str, ...], cwd: Path, settle: float = 0.0
) -> tuple[str, Path]:
    """Start cleanrl/<script>, send SIGTERM once its training loop runs (its first progress line,
    then `settle` seconds more), check that it exits 0 announcing the checkpoint it wrote, and
    return its stdout and run directory."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cleanrl" / script), *flags],
        cwd=cwd,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line = proc.stdout.readline()
    assert "steps (" in first_line, first_line + proc.stderr.read()
    time.sleep(settle)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "SIGTERM: checkpoint written" in out
    (run_dir,) = run_dirs(cwd)
    assert (run_dir / "checkpoint.pt").is_file()
    return out, run_dir


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
