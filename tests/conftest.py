"""Helpers shared by the tests: run a script in a subprocess, read its TensorBoard events."""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
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


# A script under test runs as `python <script> <flags>` would, in a process of its own. Starting an interpreter and
# importing torch takes seconds a process on CI's cores, more than most tiny runs themselves, so the helpers below
# fork each run from a "zygote": one helper process per test worker that has imported torch, numpy, gymnasium, tyro,
# TensorBoard and cleanrl_utils once. The forked child takes the run's environment, working directory, argv,
# sys.path[0] and standard streams as the interpreter would and runs the file as __main__ (runpy; whatever else the
# script imports, it imports itself). It ends as the interpreter ends a script (the exit code of SystemExit or 1 after
# a traceback; non-daemon threads joined, atexit handlers run, streams flushed) but without tearing down torch's
# modules, which takes about a second and that nothing observes. A run whose environment differs from the zygote's
# (beyond PYTEST_CURRENT_TEST) starts a plain interpreter instead: variables such as PYTHONPATH or OMP_NUM_THREADS act
# at start-up. tests/test_fault_injection.py forks its runs the same way.
ZYGOTE = r"""
import atexit, json, os, runpy, sys, threading

import torch

import gymnasium, numpy, tyro  # noqa: F401  (imported once here, shared by every forked run)
from torch.utils.tensorboard import SummaryWriter  # noqa: F401
import cleanrl_utils.checkpoint, cleanrl_utils.run  # noqa: F401

torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # its first use imports torch._dynamo: seconds
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
else:
    sys.exit(0)
# The child: the process `python <script> <args>` would have started, with the modules above already imported.
os.environ.clear()
os.environ.update(job["env"])
os.chdir(job["cwd"])
for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY), (2, job["stderr"], os.O_WRONLY)):
    os.dup2(os.open(path, mode), fd)
sys.stdin = open(0, closefd=False)
sys.argv = job["argv"]
sys.path[0] = os.path.dirname(os.path.realpath(job["argv"][0]))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
    code = 0
except SystemExit as stop:
    code = stop.code or 0 if stop.code is None or isinstance(stop.code, int) else 1
    if code == 1 and not isinstance(stop.code, int):
        print(stop.code, file=sys.stderr)
except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
threading._shutdown()
atexit._run_exitfuncs()
sys.stdout.flush(), sys.stderr.flush()
os._exit(code)
"""
VOLATILE = {"PYTEST_CURRENT_TEST"}  # changes from test to test; set in each child


class Zygote:
    def __init__(self, env: dict):
        self.env = env
        self.busy = False
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        atexit.register(self.process.kill)
        assert self.reply(timeout=300) == "ready", "the zygote did not start"

    def reply(self, timeout: float) -> str | None:
        """The zygote's next line, or None if none came within `timeout` seconds."""
        line = b""
        deadline = time.monotonic() + timeout
        while not line.endswith(b"\n"):
            if not select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            byte = os.read(self.process.stdout.fileno(), 1)
            assert byte, "the zygote died"
            line += byte
        return line.decode().strip()


class Run:
    """A script run as subprocess.Popen runs one (pid, poll, wait, send_signal, kill, returncode), its stdout and stderr
    going to files: `first_line` waits for its first line of stdout, `output` reads both once it has ended."""

    def __init__(self, argv: list[str]):
        self.args, self.returncode = [sys.executable, *argv], None
        self.scratch = tempfile.TemporaryDirectory()
        self.stdout, self.stderr = Path(self.scratch.name) / "stdout", Path(self.scratch.name) / "stderr"
        self.stdout.touch(), self.stderr.touch()

    def first_line(self, timeout: float) -> str:
        """The first line the run wrote to stdout ('' if it ended without one), as readline() on a pipe gives it."""
        deadline = time.monotonic() + timeout
        while b"\n" not in (data := self.stdout.read_bytes()) and self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)
        return universal_newlines(data.split(b"\n")[0] + b"\n" if b"\n" in data else data)

    def output(self) -> tuple[str, str]:
        """Stdout and stderr, once the run has ended (as communicate() returns them)."""
        assert self.returncode is not None
        return universal_newlines(self.stdout.read_bytes()), universal_newlines(self.stderr.read_bytes())

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class PlainRun(Run):
    """A run in an interpreter of its own."""

    def __init__(self, argv: list[str], cwd: Path, env: dict):
        super().__init__(argv)
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.process = subprocess.Popen(
                self.args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )
        self.pid = self.process.pid

    def poll(self) -> int | None:
        self.returncode = self.process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self.process.wait(timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)


class ForkedRun(Run):
    """A run forked from the zygote."""

    def __init__(self, zygote: Zygote, argv: list[str], cwd: Path, env: dict):
        super().__init__(argv)
        self.zygote = zygote
        job = dict(argv=argv, cwd=str(cwd), env=env, stdout=str(self.stdout), stderr=str(self.stderr))
        zygote.busy = True
        try:
            zygote.process.stdin.write((json.dumps(job) + "\n").encode())
            self.pid = int(zygote.reply(timeout=60))
        except BaseException:
            zygote.process.kill()
            raise

    def poll(self) -> int | None:
        return self.wait(timeout=0, check=False)

    def wait(self, timeout: float | None = None, check: bool = True) -> int | None:
        if self.returncode is None:
            try:
                code = self.zygote.reply(1e9 if timeout is None else timeout)
            except BaseException:  # interrupted between replies: the next run starts a fresh zygote
                self.zygote.process.kill()
                raise
            if code is None:
                if check:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                return None
            self.returncode, self.zygote.busy = int(code), False
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


def universal_newlines(data: bytes) -> str:
    """What subprocess.run(text=True) makes of a stream: \r\n and \r read as \n."""
    return data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


_zygote: Zygote | None = None


def same_environment(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in VOLATILE} == {k: v for k, v in b.items() if k not in VOLATILE}


def start_python(path: Path, *args: str, cwd: Path, env: dict | None = None) -> Run:
    """`python <path> <args>` started in `cwd` with `env` (default script_env()): forked from this worker's zygote,
    or in an interpreter of its own for a run with an environment of its own, or while a forked run goes on."""
    global _zygote
    default = script_env()
    env, argv = env or default, [str(path), *args]
    if not same_environment(env, default) or (_zygote is not None and _zygote.busy):
        return PlainRun(argv, cwd, env)
    # A new zygote when this process's environment changed (an import in the tests set a variable, say).
    if _zygote is None or _zygote.process.poll() is not None or not same_environment(_zygote.env, default):
        if _zygote is not None:
            _zygote.process.kill()
            _zygote.process.wait()
        _zygote = Zygote(default)
    return ForkedRun(_zygote, argv, cwd, env)


def run_python(
    path: Path, *args: str, cwd: Path, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """As subprocess.run([python, path, *args], capture_output=True, text=True, ...), forked where it can be."""
    run = start_python(path, *args, cwd=cwd, env=env)
    try:
        run.wait(timeout)
    except subprocess.TimeoutExpired:  # as subprocess.run does: kill the run, then raise with its output
        run.kill()
        run.wait()
        raise subprocess.TimeoutExpired(run.args, timeout, *run.output()) from None
    return subprocess.CompletedProcess(run.args, run.returncode, *run.output())


def run_script(
    script: str, *flags: str, cwd: Path, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run cleanrl/<script> with `flags` in `cwd` (runs/ is written there)."""
    return run_python(ROOT / "cleanrl" / script, *flags, cwd=cwd, timeout=timeout, env=env)


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
    proc = start_python(ROOT / "cleanrl" / script, *flags, cwd=cwd)
    deadline = time.monotonic() + 120
    while not list(cwd.glob("runs/*/checkpoint.pt")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed: " + proc.output()[1][-3000:]
    (run_dir,) = run_dirs(cwd)
    return run_dir


def sigterm_while_training(
    script: str, flags: list[str] | tuple[str, ...], cwd: Path, settle: float = 0.0
) -> tuple[str, Path]:
    """Start cleanrl/<script>, send SIGTERM once its training loop runs (its first progress line,
    then `settle` seconds more), check that it exits 0 announcing the checkpoint it wrote, and
    return its stdout and run directory."""
    proc = start_python(ROOT / "cleanrl" / script, *flags, cwd=cwd)
    first_line = proc.first_line(timeout=120)
    assert "steps (" in first_line, first_line + proc.stderr.read_text()
    time.sleep(settle)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    out, err = proc.output()
    assert proc.returncode == 0, err
    assert "SIGTERM: checkpoint written" in out
    (run_dir,) = run_dirs(cwd)
    assert (run_dir / "checkpoint.pt").is_file()
    return out, run_dir


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
