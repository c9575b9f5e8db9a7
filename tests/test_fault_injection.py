"""Fault injection (issue 18): SIGKILL a real training run at many moments, many of them inside a checkpoint write,
resume each from what is on disk, and check that every resume starts and ends identical to the uninterrupted run
(episodic returns and the final checkpoint: weights, optimiser, buffers, counters).

The runs are tiny (CartPole, a checkpoint every iteration) and start from a "zygote": one helper process that imports
torch and the library once and forks a child per run, which runs the script with runpy (a run then costs tenths of a
second instead of the seconds of an interpreter start). Inside the child only, torch.save writes each checkpoint in
CHUNKS pieces with a pause after each, and os.replace pauses before and after the rename, so that a kill can be timed
into every phase of save_atomic: the temporary file half written, written but not renamed, renamed but the folder not
yet synced. The child logs each phase to an append-only file that the test follows; a kill's place is read back from
that log, not assumed. The library itself is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, read_scalars, run_script, script_env

# Run as `python -c ZYGOTE`: reads one JSON job a line on stdin, forks, and answers the child's pid, then its exit
# code, one line each.
ZYGOTE = r"""
import io, json, os, runpy, sys, time, traceback

import torch

torch.set_num_threads(1)
import gymnasium, numpy, tyro  # noqa: F401  (imported once here, shared by every forked run)
from torch.utils.tensorboard import SummaryWriter  # noqa: F401
import cleanrl_utils.checkpoint, cleanrl_utils.run  # noqa: F401

torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # its first use imports torch._dynamo: seconds


def slow_writes(log_path, chunks, pause):
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def mark(event):
        os.write(log, f"{event} {time.monotonic():.6f}\n".encode())

    save, replace = torch.save, os.replace

    def slow_save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        mark("write")
        for i in range(chunks):
            f.write(data[i * len(data) // chunks : (i + 1) * len(data) // chunks])
            f.flush()
            time.sleep(pause)
        mark("written")
        time.sleep(pause)  # then save_atomic fsyncs and renames

    def slow_replace(src, dst, *args, **kwargs):
        if not str(dst).endswith("checkpoint.pt"):
            return replace(src, dst, *args, **kwargs)
        mark("rename")
        time.sleep(pause)
        replace(src, dst, *args, **kwargs)
        mark("renamed")
        time.sleep(pause)

    torch.save, os.replace = slow_save, slow_replace


def child(job):
    os.chdir(job["cwd"])
    out = os.open(job["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1), os.dup2(out, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    if job.get("log"):
        slow_writes(job["log"], job["chunks"], job["pause"])
    sys.argv = job["argv"]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code if isinstance(exit_info.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)


print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(job)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""

CHUNKS, PAUSE = 4, 0.008  # a checkpoint write takes CHUNKS * PAUSE seconds, the rename 3 * PAUSE more
RUNS = {
    # script, flags, total steps, checkpoint every (every iteration)
    "ppo": (
        "ppo.py",
        ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"],
        512,
        64,
    ),
    "dqn": (
        "dqn.py",
        ["--buffer-size", "1000", "--batch-size", "32", "--learning-starts", "200", "--train-frequency", "2"],
        600,
        75,
    ),
}
KILL_POINTS = 26  # per script: 52 in all
PHASES = ("write", "written", "rename", "renamed")  # the events save_atomic's phases start with, in order


class Zygote:
    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            cwd=ROOT,
            env=script_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout.readline().strip() == "ready"

    def start(self, cwd: Path, script: str, flags: list[str], log: Path | None) -> int:
        job = {"cwd": str(cwd), "output": str(cwd / "output.txt"), "argv": [str(ROOT / "cleanrl" / script), *flags]}
        if log is not None:
            job.update(log=str(log), chunks=CHUNKS, pause=PAUSE)
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def wait(self) -> int:
        return int(self.process.stdout.readline())

    def run(self, cwd: Path, script: str, flags: list[str], log: Path | None = None) -> int:
        self.start(cwd, script, flags, log)
        return self.wait()

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


def events(log: Path) -> list[tuple[str, float]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [(name, float(t)) for name, t in (line.split() for line in lines)]


def wait_for(log: Path, count: int, name: str, timeout: float = 60) -> float:
    """Poll the child's log until its `count`-th `name` event; return that event's time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        times = [t for event, t in events(log) if event == name]
        if len(times) >= count:
            return times[count - 1]
        time.sleep(0.0005)
    raise AssertionError(f"no {count}th {name} event in {timeout} s: {events(log)[-5:]}")


def landing(log: Path, killed_at: float) -> str:
    """Where the kill landed, from the child's log: inside which phase of which checkpoint write, or between writes."""
    before = [(name, t) for name, t in events(log) if t <= killed_at]
    writes = sum(name == "write" for name, _ in before)
    if not before:
        return "before the first checkpoint"
    last = before[-1][0]
    where = {
        "write": "torn temporary file",
        "written": "written, not renamed",
        "rename": "in the rename",
        "renamed": "renamed, folder not synced",
    }
    return f"write {writes}: {where[last]}" if last != "renamed" or killed_at - before[-1][1] < PAUSE else "training"


def final_state(run_dir: Path) -> dict:
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    checkpoint["envs"] = {key: checkpoint["envs"][key] for key in ("simulators", "next_obs")}  # no wall-clock times
    del checkpoint["args"]  # --resume differs
    return checkpoint


def same_state(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if hasattr(a, "shape"):  # numpy
        return (a == b).all()
    return a == b


@pytest.mark.parametrize("name", RUNS)
def test_sigkill_at_many_moments_then_resume_reproduces_the_uninterrupted_run(name, tmp_path):
    script, flags, total, every = RUNS[name]
    flags = [*flags, "--total-timesteps", str(total), "--checkpoint-every", str(every)]
    writes = total // every
    rng = random.Random(18)
    zygote = Zygote()
    try:
        straight = tmp_path / "straight"
        straight.mkdir()
        started = time.monotonic()
        assert zygote.run(straight, script, flags, log=straight / "log") == 0, (straight / "output.txt").read_text()
        duration = time.monotonic() - started
        (straight_dir,) = (straight / "runs").iterdir()
        reference_returns = read_scalars(straight_dir)["charts/episodic_return"]
        reference_state = final_state(straight_dir)
        assert len(events(straight / "log")) == 4 * writes and len(reference_returns) > 10

        tried, recovered, places, stale_tmp, failures = 0, 0, {}, 0, []
        for point in range(2 * KILL_POINTS):
            if tried == KILL_POINTS:
                break
            cwd = tmp_path / f"kill{point}"
            cwd.mkdir()
            log = cwd / "log"
            pid = zygote.start(cwd, script, flags, log)
            if point % 3 == 0:  # a random moment after the first checkpoint
                wait_for(log, 1, "renamed")
                time.sleep(rng.uniform(0, duration * (writes - 1) / writes))
            else:  # inside a checkpoint write: its given phase, after a random part of it
                phase = PHASES[point % 4]
                wait_for(log, rng.randrange(2, writes + 1), phase)
                time.sleep(rng.uniform(0, CHUNKS * PAUSE if phase == "write" else PAUSE))
            killed_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):  # it may have ended: the zygote reaps it
                os.kill(pid, signal.SIGKILL)
            code = zygote.wait()
            if code == 0:  # it ended before the kill: not a kill point
                continue
            assert code == -signal.SIGKILL, (cwd / "output.txt").read_text()
            tried += 1
            place = landing(log, killed_at)
            places[place.split(":")[-1].strip()] = places.get(place.split(":")[-1].strip(), 0) + 1

            (run_dir,) = (cwd / "runs").iterdir()
            leftovers = list(run_dir.glob(".checkpoint.pt.*.tmp"))
            stale_tmp += bool(leftovers)
            resume = ["--resume", str(run_dir / "checkpoint.pt")]
            if zygote.run(cwd, script, [*flags, *resume]) != 0:
                failures.append(f"kill {point} ({place}): the resume failed: {(cwd / 'output.txt').read_text()[-500:]}")
                continue
            returns = read_scalars(run_dir)["charts/episodic_return"]
            if returns != reference_returns:
                failures.append(f"kill {point} ({place}): other episodic returns after the resume")
            elif not same_state(final_state(run_dir), reference_state):
                failures.append(f"kill {point} ({place}): other final weights or state after the resume")
            elif list(run_dir.glob(".checkpoint.pt.*.tmp")):
                failures.append(f"kill {point} ({place}): the stale temporary file was left after the resume")
            else:
                recovered += 1
    finally:
        zygote.close()
    summary = (
        f"fault injection, {script}: {tried} SIGKILL points tried, {recovered} recovered exactly; where they landed: "
        + ", ".join(f"{count} {place}" for place, count in sorted(places.items()))
        + f"; {stale_tmp} left a stale temporary file"
    )
    print(summary)
    assert not failures and tried >= KILL_POINTS - 2, summary + "\n" + "\n".join(failures)
    inside = sum(count for place, count in places.items() if place not in ("training", "before the first checkpoint"))
    assert inside >= tried // 3 and stale_tmp > 0, summary  # most land inside: the floor only guards the timing


# --- a full disk ------------------------------------------------------------------------------------------------------

# Run as `python -c DISK_FULL script flags...`: the script, with the disk filling up during its third checkpoint
# write: that file's writes fail with ENOSPC after FULL_AFTER bytes, from the raw file under the buffered one, as the
# kernel's write does.
DISK_FULL = r"""
import errno, io, os, runpy, sys

import cleanrl_utils.checkpoint as checkpoint

FULL_AFTER, opened = 4096, []


class FillingDisk(io.FileIO):
    room = FULL_AFTER

    def write(self, data):
        if len(data) > FillingDisk.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        FillingDisk.room -= len(data)
        return super().write(data)


def open_on_a_filling_disk(path, mode="r", *args, **kwargs):
    opened.append(path)
    if len(opened) == 3:
        return io.BufferedWriter(FillingDisk(path, "wb"))
    return open(path, mode, *args, **kwargs)


checkpoint.open = open_on_a_filling_disk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
SMALL_PPO = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]


def assert_stopped_on_a_full_disk(result: subprocess.CompletedProcess, run_dir: Path, step: int) -> None:
    """Exit code 1, one line naming the full disk and the file, the previous checkpoint whole, no temporary file."""
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("error: the disk is full (No space left on device) writing "), lines[0]
    assert str(run_dir.name) in lines[0] and "--resume" in lines[0], lines[0]
    assert sorted(p.name for p in run_dir.iterdir() if "checkpoint" in p.name) == ["checkpoint.pt"]
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == step


def test_a_full_disk_stops_the_run_in_one_line_with_the_previous_checkpoint_whole(tmp_path):
    flags = [*SMALL_PPO, "--total-timesteps", "512", "--checkpoint-every", "64"]
    result = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(ROOT / "cleanrl" / "ppo.py"), *flags],
        cwd=tmp_path,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert_stopped_on_a_full_disk(result, run_dir, step=128)  # the third write failed: the second is on disk
    resumed = run_script("ppo.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 512


def test_a_really_full_filesystem_stops_the_run_in_one_line(tmp_path):
    """The same on a 300 kB tmpfs, where mounting one is allowed (root, outside a locked-down container)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: " + mounted.stderr.decode().strip())
    try:
        flags = [*SMALL_PPO, "--total-timesteps", "4096", "--checkpoint-every", "64"]
        result = run_script("ppo.py", *flags, cwd=disk)
        (run_dir,) = (disk / "runs").iterdir()
        step = torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"]
        assert 0 < step < 4096
        assert_stopped_on_a_full_disk(result, run_dir, step)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
