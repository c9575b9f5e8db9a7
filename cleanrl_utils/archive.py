"""Keep the logs behind a results table in the repository, small enough to commit.

    python -m cleanrl_utils.archive runs/MinAtar-Breakout-v1__c51_atari__* --to benchmark/runs

packs each finished run directory's args.json and finished.json, and its TensorBoard events thinned to what the
results tables and plots read (the episodic returns, perf/ and eval/ scalars, the --keep tags, and the first and last
scalar event of each events file and the one at the largest step, so the wall time and the step count of the table
are the same read from the copy), into one file, benchmark/runs/<run name>.tar.xz. The kept events are written byte
for byte, in files of the same names; checkpoints, models and videos stay behind. A run that has not finished is
refused: it is not a result yet. xz packs the kept events about 5x smaller; cleanrl_utils.results and
cleanrl_utils.plot read these files as they read run directories.

    python -m cleanrl_utils.archive runs/StarpilotEasy-v0__ppg_procgen__1__* --to benchmark/runs --unfinished

also takes runs that have not finished but hold a checkpoint, with their newest checkpoint.pt (also while the run is
still going: checkpoints are replaced atomically): a run longer than a session goes on from there on a machine that
kept nothing. Archived again once it has finished, its copy loses the checkpoint.

`python -m cleanrl_utils.benchmark --archive benchmark/runs` archives each run as it finishes (and, stopped by
SIGTERM/SIGINT, the checkpoints of the runs it stopped) and, when started again on a machine without those runs,
copies the archive back into runs/ first, so their jobs count as finished or continue from their checkpoints.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from cleanrl_utils.checkpoint import CHECKPOINT_NAME
from cleanrl_utils.errors import fail
from cleanrl_utils.results import ARCHIVE_SUFFIX, EVENTS_GLOB, FINISHED_NAME, RunError, find_run_dirs, run_name

KEEP = ("charts/episodic_return", "charts/policy_lag", "perf/*", "eval/*", "hyperparameters/*")


def thin_events(source: Path, target: Path, keep: tuple[str, ...]) -> tuple[int, int]:
    """Copy the events of `source` that `keep` matches (fnmatch patterns of tags), every event that is not a summary
    (the file version, session logs) and the first, last and largest-step summary events, to `target`. Returns the
    numbers of events read and written."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    records = list(RawEventFileLoader(str(source)).Load())
    events = [Event.FromString(record) for record in records]
    summaries = [i for i, event in enumerate(events) if event.HasField("summary")]
    ends = {summaries[0], summaries[-1], max(summaries, key=lambda i: events[i].step)} if summaries else set()
    written = 0
    with open(target, "wb") as f:
        writer = RecordWriter(f)
        for i, (record, event) in enumerate(zip(records, events)):
            tags = [value.tag for value in event.summary.value]
            if not event.HasField("summary") or i in ends or any(fnmatch.fnmatch(t, p) for t in tags for p in keep):
                writer.write(record)
                written += 1
        writer.flush()
    return len(records), written


def check_archivable(run_dir: Path, unfinished: bool = False) -> None:
    """A finished run; with `unfinished`, also one that holds a checkpoint to continue from."""
    if not (run_dir / "args.json").is_file():
        raise RunError(f"{run_dir}: not a run directory (no args.json)")
    if (run_dir / FINISHED_NAME).is_file():
        return
    if not unfinished:
        raise RunError(f"{run_dir}: not finished (no {FINISHED_NAME}); archive runs once they have ended")
    if not (run_dir / CHECKPOINT_NAME).is_file():
        raise RunError(f"{run_dir}: neither finished nor checkpointed: nothing to continue from")


def archive_run(run_dir: Path, to: Path, keep: tuple[str, ...]) -> Path:
    """The thinned copy of one run, packed as `to`/<its name>.tar.xz; an older one there is replaced. A finished run's
    checkpoint stays behind; an unfinished run's comes along (check_archivable), for another machine to continue it."""
    to.mkdir(parents=True, exist_ok=True)
    done = (run_dir / FINISHED_NAME).is_file()
    with tempfile.TemporaryDirectory(prefix="cleanrl-archiving-") as scratch:
        copy = Path(scratch) / run_dir.name
        copy.mkdir()
        for name in ("args.json", FINISHED_NAME) if done else ("args.json", CHECKPOINT_NAME):
            shutil.copy2(run_dir / name, copy / name)
        for events in sorted(run_dir.glob(EVENTS_GLOB)):
            thin_events(events, copy / events.name, keep)
            shutil.copystat(events, copy / events.name)
        # xz -1 where a checkpoint (tens of MB of replay) comes along: seconds, where -6 takes a minute at a
        # session's end; the events alone pack 7% smaller at -6.
        return pack(copy, to / f"{run_dir.name}{ARCHIVE_SUFFIX}", preset=6 if done else 1)


def pack(run_dir: Path, archive: Path, preset: int = 6) -> Path:
    """`run_dir` as a tar.xz holding its folder and files, written through a temporary file (a pack cut short never
    passes for an archive). No owners, whole-second times, the folder's the newest file's: the same run packs to the
    same bytes."""
    partial = archive.with_name(f".{archive.name}.partial")
    files = sorted(run_dir.iterdir())
    with tarfile.open(partial, "w:xz", preset=preset) as tar:
        for path in [run_dir, *files]:
            info = tar.gettarinfo(path, arcname=path.relative_to(run_dir.parent).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = int(max(p.stat().st_mtime for p in files) if path == run_dir else info.mtime)
            if path.is_file():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    os.replace(partial, archive)
    return archive


def archived_runs(folder: Path) -> list[Path]:
    """The packed runs in `folder` (not below it)."""
    return sorted(folder.glob(f"*{ARCHIVE_SUFFIX}")) if folder.is_dir() else []


def archived_finished(archive: Path) -> bool:
    """Whether `archive` holds a finished run (its finished.json)."""
    if not archive.is_file():
        return False
    with tarfile.open(archive) as tar:
        return f"{run_name(archive)}/{FINISHED_NAME}" in tar.getnames()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="finished run directories, or folders with them below")
    parser.add_argument(
        "--unfinished",
        action="store_true",
        help="also archive runs that have not finished but hold a checkpoint, with it, to continue elsewhere",
    )
    parser.add_argument("--to", type=Path, required=True, help="the folder the thinned copies go in")
    parser.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="TAG",
        help=f"one more tag to keep, an fnmatch pattern (kept: {KEEP})",
    )
    args = parser.parse_args(argv)
    keep = KEEP + tuple(args.keep)
    try:
        run_dirs = find_run_dirs(args.run_dirs)
        for run_dir in run_dirs:  # all checked before anything is written
            check_archivable(run_dir, args.unfinished)
        for run_dir in run_dirs:
            target = archive_run(run_dir, args.to, keep)
            size = target.stat().st_size / 1e6
            state = "" if (run_dir / FINISHED_NAME).is_file() else ", unfinished: with its checkpoint"
            print(f"{run_dir} -> {target} ({size:.2f} MB{state})")
    except RunError as error:
        fail(str(error))


if __name__ == "__main__":
    main(sys.argv[1:])
