"""Aggregate finished runs into a results table (Markdown and CSV).

    python -m cleanrl_utils.results runs/CartPole-v1__ppo__* runs/Acrobot-v1__ppo__* \
        --output benchmark/results/ppo

Per environment and script: the number of seeds, the score (the mean of the last 100 episodic
returns of each run, then mean +- std across runs; `--last-episodes Pendulum-v1=10` scores an
environment on fewer, for short runs whose early episodes are the random warm-up), the training steps,
the wall time of a run
(first to last TensorBoard event of each of its processes: a resumed run's pause is left out) and its SPS (total
steps / wall time); with `--mean charts/policy_lag`, a column of that scalar's mean over a run, then over seeds. The
machine is written under the table.

The readers here (finding run directories below a folder, reading one scalar series, telling
which run directories a command created) are shared by the benchmark runner, the plotting
helper and the tuner.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import json
import os
import platform
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cleanrl_utils.errors import fail


@dataclass
class RunSummary:
    env_id: str
    exp_name: str
    seed: int
    steps: int
    score: float
    wall_time: float
    last_n: int = 100  # the score is the mean of this many last episodic returns
    peak_memory_gb: float | None = None  # the host's peak resident memory (perf/peak_memory_gb), where logged
    means: dict[str, float] = field(default_factory=dict)  # tag -> the mean of that scalar over the run (--mean)

    @property
    def sps(self) -> float:
        return self.steps / self.wall_time if self.wall_time > 0 else float("nan")


class RunError(ValueError):
    """A path that is not a usable run directory; the message is one line for the user."""


EVENTS_GLOB = "events.out.tfevents.*"
# Written into its directory as the very last thing a run does (Run.finish): the benchmark runner tells a finished run
# from a killed one by it.
FINISHED_NAME = "finished.json"


# A run packed by cleanrl_utils.archive: <run directory's name>.tar.xz, the directory inside.
ARCHIVE_SUFFIX = ".tar.xz"


def run_name(archive: Path) -> str:
    return archive.name[: -len(ARCHIVE_SUFFIX)]


def unpack(archive: Path, into: Path) -> Path:
    """Unpack a packed run into `into` and return its run directory; it appears whole or not at all."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into, prefix=".unpacking-") as scratch:
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        target = into / run_name(archive)
        os.replace(Path(scratch) / target.name, target)
    return target


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories among `paths`: each path is a run directory (it holds TensorBoard events), a run packed by
    cleanrl_utils.archive (<run>.tar.xz, unpacked for reading into a folder removed at exit), or a folder such as
    runs/ or benchmark/runs with either somewhere below it. Events inside a run directory's own subfolders (W&B's
    copy under wandb/) are not runs of their own."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_file() and path.name.endswith(ARCHIVE_SUFFIX):
            found += [run_dir for run_dir in [unpacked_for_reading(path)] if run_dir not in found]
            continue
        if not path.is_dir():
            raise RunError(f"{path}: no such directory")
        below: list[Path] = []
        for run_dir in sorted({events.parent for events in path.rglob(EVENTS_GLOB)}, key=lambda d: len(d.parts)):
            if not any(outer in run_dir.parents for outer in below):
                below.append(run_dir)
        packed = [unpacked_for_reading(archive) for archive in sorted(path.rglob(f"*{ARCHIVE_SUFFIX}"))]
        if not below and not packed:
            raise RunError(f"{path}: no TensorBoard events in it or below it (not a run directory)")
        found += [run_dir for run_dir in sorted(below) + packed if run_dir not in found]
    return found


_unpacked: dict[Path, Path] = {}


def unpacked_for_reading(archive: Path) -> Path:
    """A packed run, unpacked once per process into a temporary folder that is removed at exit."""
    archive = archive.resolve()
    if archive not in _unpacked:
        folder = Path(tempfile.mkdtemp(prefix="cleanrl-unpacked-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        try:
            _unpacked[archive] = unpack(archive, folder)
        except (tarfile.TarError, OSError, EOFError) as error:  # cut short, damaged, or not a packed run
            raise RunError(f"{archive}: not a packed run ({str(error).splitlines()[0].rstrip(':')})") from None
    return _unpacked[archive]


def run_info(run_dir: Path) -> dict:
    """env_id, exp_name and seed of a run: from its args.json, else from its directory name
    {env_id}__{exp_name}__{seed}__{unix_time}."""
    args_file = run_dir / "args.json"
    if args_file.is_file():
        args = json.loads(args_file.read_text())
        return {"env_id": args["env_id"], "exp_name": args["exp_name"], "seed": args["seed"]}
    parts = run_dir.name.split("__")
    if len(parts) == 4 and parts[2].lstrip("-").isdigit():
        return {"env_id": parts[0], "exp_name": parts[1], "seed": int(parts[2])}
    raise RunError(f"{run_dir}: not a run directory (no args.json, and the name is not env__exp__seed__time)")


def load_events(run_dir: Path):
    """The TensorBoard scalars of a run, with the purge of events a resumed run superseded."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not any(run_dir.glob(EVENTS_GLOB)):
        raise RunError(f"{run_dir}: no TensorBoard events")
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def training_seconds(run_dir: Path) -> float:
    """The wall time a run spent training: first to last scalar event of each of its events files (each process
    writes one, so a resumed run has one per resume), summed. The time between a stop and its resume is left out;
    the steps a resume redoes (from its checkpoint to where the stopped process had got) are counted as time."""
    return sum(last - first for first, last in process_spans(run_dir))


def process_spans(run_dir: Path) -> list[tuple[float, float]]:
    """(first, last) wall time of the scalar events of each of a run's events files (one per process), in order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    spans = []
    for path in sorted(run_dir.glob(EVENTS_GLOB)):
        times = [event.wall_time for event in EventFileLoader(str(path)).Load() if event.HasField("summary")]
        if times:
            spans.append((min(times), max(times)))
    return sorted(spans)


def seconds_running(spans: list[tuple[float, float]], wall: np.ndarray) -> np.ndarray:
    """The seconds a run had been running at each wall time in `wall`, as training_seconds counts them: each
    process's time since its first scalar event plus the whole spans of the processes before it (a resume's wait
    left out)."""
    firsts = np.array([first for first, _ in spans])
    before = np.concatenate([[0.0], np.cumsum([last - first for first, last in spans])])
    process = np.clip(np.searchsorted(firsts, wall, side="right") - 1, 0, len(spans) - 1)
    return before[process] + np.maximum(wall - firsts[process], 0.0)


def read_scalar(run_dir: Path, tag: str, acc=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, wall times, values) of the scalar `tag` of a run; RunError naming the known tags
    when the run has no such scalar."""
    acc = acc if acc is not None else load_events(run_dir)
    tags = acc.Tags()["scalars"]
    if tag not in tags:
        known = ", ".join(sorted(tags)) or "none"
        raise RunError(f"{run_dir}: no scalar {tag!r} in the TensorBoard events (known: {known})")
    events = acc.Scalars(tag)
    return (
        np.array([e.step for e in events], dtype=np.int64),
        np.array([e.wall_time for e in events]),
        np.array([e.value for e in events], dtype=np.float64),
    )


def existing_run_dirs(root: Path) -> set[Path]:
    """The subdirectories of a runs/ folder now (snapshot it before starting commands)."""
    return {path for path in root.iterdir() if path.is_dir()} if root.is_dir() else set()


def new_run_dirs(root: Path, before: set[Path], env_id: str | None = None, seed: int | None = None) -> list[Path]:
    """The run directories in `root` that are not in the snapshot `before`, optionally only those
    of one environment and seed (read from args.json or the directory name), oldest first."""
    found = []
    for path in sorted(existing_run_dirs(root) - before):
        try:
            info = run_info(path)
        except (RunError, ValueError, KeyError):
            continue
        if (env_id is None or info["env_id"] == env_id) and (seed is None or int(info["seed"]) == seed):
            found.append(path)
    return found


def read_summary(run_dir: Path, last_n: int = 100, means: tuple[str, ...] = ()) -> RunSummary:
    """Like summarize_run, but raises RunError instead of exiting."""
    args_file = run_dir / "args.json"
    if not args_file.is_file():
        raise RunError(f"{run_dir}: not a run directory (no args.json)")
    args = json.loads(args_file.read_text())
    acc = load_events(run_dir)
    if "charts/episodic_return" not in acc.Tags()["scalars"]:
        raise RunError(f"{run_dir}: no charts/episodic_return events")
    returns = acc.Scalars("charts/episodic_return")
    steps = max(e.step for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))
    wall_time = training_seconds(run_dir)
    score = float(np.mean([e.value for e in returns[-last_n:]]))
    scalar_tags = acc.Tags()["scalars"]
    memory = acc.Scalars("perf/peak_memory_gb") if "perf/peak_memory_gb" in scalar_tags else []
    peak = max(e.value for e in memory) if memory else None
    tag_means = {tag: float(np.mean([e.value for e in acc.Scalars(tag)])) for tag in means if tag in scalar_tags}
    return RunSummary(args["env_id"], args["exp_name"], args["seed"], steps, score, wall_time, last_n, peak, tag_means)


def summarize_run(run_dir: Path, last_n: int = 100, means: tuple[str, ...] = ()) -> RunSummary:
    """The summary of one run; a run directory without args.json or episodic returns stops the
    program with one line on stderr. A `means` tag the run lacks is left out of its means."""
    try:
        return read_summary(run_dir, last_n, means)
    except RunError as error:
        fail(str(error))


def machine_description() -> str:
    import torch

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}; Python {platform.python_version()}, torch {torch.__version__}"


def iqm(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50%, cutting floor(n/4) values at each end. It is
    scipy.stats.trim_mean(values, 0.25, axis), the function rliable's aggregate_iqm calls (Agarwal et al. 2021)."""
    # imported here, not at the top: run.py imports this module (FINISHED_NAME); scipy.stats costs ~0.8 s of CPU
    from scipy.stats import trim_mean

    return trim_mean(np.asarray(values, dtype=np.float64), 0.25, axis=axis)


def aggregate(summaries: list[RunSummary]) -> list[dict]:
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for summary in summaries:
        groups.setdefault((summary.exp_name, summary.env_id), []).append(summary)
    rows = []
    for (exp_name, env_id), runs in sorted(groups.items()):
        scores = np.array([r.score for r in runs])
        rows.append(
            {
                "script": f"{exp_name}.py",
                "environment": env_id,
                "steps": int(np.mean([r.steps for r in runs])),
                "seeds": " ".join(str(r.seed) for r in sorted(runs, key=lambda r: r.seed)),
                "return": f"{scores.mean():.2f} +- {scores.std():.2f}",
                "scored episodes": f"last {runs[0].last_n}",
                "wall time (s)": f"{np.mean([r.wall_time for r in runs]):.0f}",
                "SPS": f"{np.mean([r.sps for r in runs]):,.0f}",
            }
        )
        if len(runs) >= 4:  # the interquartile mean drops a seed at each end from 4 seeds on
            rows[-1]["return IQM"] = f"{iqm(scores):.2f}"
        peaks = [r.peak_memory_gb for r in runs if r.peak_memory_gb is not None]
        if peaks:
            rows[-1]["peak memory (GB)"] = f"{max(peaks):.2f}"
        for tag in dict.fromkeys(tag for r in runs for tag in r.means):
            rows[-1][f"mean {tag}"] = f"{np.mean([r.means[tag] for r in runs if tag in r.means]):.2f}"
    return rows


def columns(rows: list[dict]) -> list[str]:
    """Every column of `rows` in first-seen order (runs logged before perf/peak_memory_gb existed lack that one)."""
    return list(dict.fromkeys(key for row in rows for key in row))


def markdown_table(rows: list[dict], machine: str) -> str:
    header = columns(rows)
    means = any(h.startswith("mean ") for h in header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row.get(h, "")) for h in header) + " |" for row in rows]
    note = (
        "Return: mean of each run's last episodic returns (as many as the scored-episodes column says), "
        "then mean +- std across seeds. "
        + ("Return IQM: the interquartile mean of the seeds' scores. " if "return IQM" in header else "")
        + "Wall time: first to last TensorBoard event of a run (after start-up; a resumed run: of each of its "
        "processes, summed). SPS: steps / wall time. "
        "Peak memory: the largest peak resident host memory of the seeds' processes."
        + (" Mean TAG: that scalar's mean over each run, then over the seeds that logged it." if means else "")
    )
    return "\n".join(lines) + f"\n\n{note}\n\nMachine: {machine}\n"


def write_tables(rows: list[dict], output: Path, machine: str) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    header = columns(rows)
    output.with_suffix(".md").write_text(markdown_table(rows, machine))
    with open(output.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows(rows)


def parse_last_episodes(values: list[str]) -> dict[str | None, int]:
    """["10", "Pendulum-v1=10"] -> {None: 10, "Pendulum-v1": 10}; the None key is the default."""
    last_n: dict[str | None, int] = {None: 100}
    for value in values:
        env_id, _, count = value.rpartition("=")
        if not count.isdigit() or int(count) == 0:
            fail(f"--last-episodes takes a positive count or ENV_ID=COUNT, got {value!r}")
        last_n[env_id or None] = int(count)
    return last_n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="run directories, or folders (runs/) with run directories below them"
    )
    parser.add_argument(
        "--output", type=Path, required=True, help="output path without suffix (.md and .csv are written)"
    )
    parser.add_argument(
        "--last-episodes",
        action="append",
        default=[],
        metavar="[ENV_ID=]N",
        help="score runs on their last N episodic returns (default 100); ENV_ID=N for one environment only",
    )
    parser.add_argument(
        "--mean", action="append", default=[], metavar="TAG", help="a column of TAG's mean over a run, then over seeds"
    )
    args = parser.parse_args(argv)
    last_n = parse_last_episodes(args.last_episodes)
    try:
        run_dirs = find_run_dirs(args.run_dirs)
    except RunError as error:
        fail(str(error))
    summaries = []
    for run_dir in run_dirs:
        env_id = run_info(run_dir)["env_id"] if (run_dir / "args.json").is_file() else None
        summaries.append(summarize_run(run_dir, last_n.get(env_id, last_n[None]), tuple(args.mean)))
    for tag in args.mean:
        if not any(tag in summary.means for summary in summaries):
            fail(f"--mean {tag}: none of the {len(summaries)} runs logged that scalar")
    rows = aggregate(summaries)
    write_tables(rows, args.output, machine_description())
    print(args.output.with_suffix(".md").read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
