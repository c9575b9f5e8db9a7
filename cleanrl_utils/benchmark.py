"""Run one script on several environments and seeds, then tabulate what those runs reached.

    python -m cleanrl_utils.benchmark --env-ids CartPole-v1 Acrobot-v1 \\
        --command "uv run python cleanrl/ppo.py --total-timesteps 500000" \\
        --num-seeds 3 --workers 2 --output benchmark/results/ppo

Every environment x seed becomes one command: the --command string (extra flags go inside it)
followed by `--env-id ENV --seed SEED`, seeds counting from --start-seed (1). The commands run
in the current directory, --workers at a time (default 1), each line of their output prefixed
with its environment and seed. `--workers 0` only prints the commands.

Afterwards the runs these commands created are found in runs/ (the directories that appeared
while the benchmark ran, matched to each command by the env_id and seed in their args.json)
and aggregated with cleanrl_utils.results into one row per script x environment: training
steps, the seeds, the return (mean of the last 100 episodic returns of each run, then mean +-
std across seeds), wall time and SPS. The Markdown table is printed and, with --output PATH,
written to PATH.md and PATH.csv. A command that fails is reported with the end of its output;
the table is made from the others and the exit code is 1.

Killed and started again with the same command, the runner goes on where it stopped. A job's
runs are the folders in --runs-dir whose args.json holds the job's env_id, seed, experiment name
and the value of every flag in its command. A job one of whose runs finished (finished.json,
written as a run's last act, or by the runner when a script that does not write one exits 0)
is skipped; else the newest of its runs that holds a checkpoint is
continued with `--resume RUNS_DIR/RUN/checkpoint.pt` (a --checkpoint-every run loses at most
that many steps), and its runs without one are moved aside to RUNS_DIR_incomplete/ and the job
is run from the start. A job that exits 0 without finishing (stopped by SIGTERM/SIGINT after
writing its checkpoint) counts as not done, to be continued by the next start. --rerun runs
every command anew instead. A crash or a preemption ends the runner with its runs; a runner
killed alone (kill -9 PID) leaves its runs going: stop them (kill -- -PGID) before starting it
again, or a run would be continued while it still writes. Stopped with its runs by SIGTERM or SIGINT (kill -TERM --
-PGID, Ctrl-C), it starts no further job and reads the running ones' output until they have written their
checkpoints and exited (dying at once would close the pipe their output goes to), then exits with 128 + the signal's
number and leaves --output as it was; a SIGTERM to the runner alone lets the running jobs end and starts no more.

A benchmark longer than a session on machines that keep nothing between sessions takes `--archive benchmark/runs`:
each job's run is packed there, thinned, as one <run>.tar.xz (cleanrl_utils.archive), as soon as it finishes, for the
repository; the next session's runner first unpacks the archived runs into --runs-dir, so it skips their jobs and
tabulates all seeds.
A runner stopped by SIGTERM/SIGINT archives the runs it stopped too, with the checkpoints they wrote on the way out,
and the next session's runner continues them from there: a single run longer than a session spans several.

On a SLURM cluster, give a job template instead of running locally:

    python -m cleanrl_utils.benchmark --env-ids CartPole-v1 Acrobot-v1 \\
        --command "uv run python cleanrl/ppo.py" --num-seeds 3 --slurm-template ppo.sbatch.template

writes slurm/<job name>.sbatch, a job array with one task per command, and submits it with
sbatch where sbatch exists (otherwise it prints the script's path and the sbatch command). The
template is a batch script with these placeholders:

    #!/bin/bash
    #SBATCH --job-name={{job_name}}
    #SBATCH --array={{array}}
    #SBATCH --output=slurm/%x-%A_%a.out
    #SBATCH --gpus-per-task=1
    #SBATCH --time=04:00:00
    cd {{workdir}}
    {{commands}}

{{array}} becomes 0-(N-1) for N commands (append %K in the template to run at most K at once),
{{commands}} the list of commands and the line that runs the array task's one, {{num_tasks}}
is N, {{workdir}} the current directory and {{job_name}} the --job-name (by default the script's
stem). Once the jobs have finished, the printed cleanrl_utils.results command makes the table.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cleanrl_utils.errors import fail
from cleanrl_utils.results import (
    FINISHED_NAME,
    RunError,
    aggregate,
    existing_run_dirs,
    machine_description,
    markdown_table,
    new_run_dirs,
    read_summary,
    write_tables,
)

PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
REQUIRED_PLACEHOLDERS = ("array", "commands")


@dataclass
class Job:
    env_id: str
    seed: int
    command: str
    returncode: int | None = None
    seconds: float = 0.0
    run_dir: Path | None = None
    skipped: bool = False  # it finished in an earlier start of the runner
    output_tail: deque = field(default_factory=lambda: deque(maxlen=20))

    @property
    def label(self) -> str:
        return f"{self.env_id} seed {self.seed}"


def make_jobs(command: str, env_ids: list[str], seeds: list[int]) -> list[Job]:
    """One job per environment x seed: the command with `--env-id ENV --seed SEED` appended."""
    return [
        Job(env_id, seed, f"{command} --env-id {shlex.quote(env_id)} --seed {seed}")
        for env_id in env_ids
        for seed in seeds
    ]


def script_stem(command: str) -> str | None:
    """The experiment name the command will use: its --exp-name, else the stem of its .py file."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word.startswith("--exp-name="):
            return word.split("=", 1)[1]
        if word == "--exp-name" and i + 1 < len(words):
            return words[i + 1]
    return next((Path(word).stem for word in words if word.endswith(".py")), None)


# ---------------------------------------------------------------------------- resuming


def command_flags(command: str) -> dict[str, list[str]]:
    """The flags a command gives its script (the words after its last .py word, else all): {name: values}; a bare
    flag (--cuda) has no values, --name=value and --name v1 v2 have theirs."""
    words = shlex.split(command)
    scripts = [i for i, word in enumerate(words) if word.endswith(".py")]
    flags, name = {}, None
    for word in words[scripts[-1] + 1 :] if scripts else words:
        if word.startswith("--"):
            name, equals, value = word[2:].partition("=")
            flags[name] = [value] if equals else []
            name = None if equals else name
        elif name is not None:
            flags[name].append(word)
    return flags


def same_value(stored, values: list[str]) -> bool:
    """Whether an args.json value is what the command line's words for it give."""
    if isinstance(stored, list):
        return len(stored) == len(values) and all(same_value(item, [value]) for item, value in zip(stored, values))
    if not values:
        return stored is True
    if len(values) != 1:
        return False
    if isinstance(stored, bool):
        return values[0].lower() == str(stored).lower()
    if isinstance(stored, (int, float)):
        try:
            return float(values[0]) == float(stored)
        except ValueError:
            return False
    return values[0] == str(stored)


# Flags that change how a run is kept and mirrored, never what it learns: a run made without --checkpoint-every is
# still a run of the same command with it (the flag can be added to a long benchmark while its first runs are going).
BOOKKEEPING_FLAGS = {"checkpoint_every", "track", "wandb_project_name", "wandb_entity"}


def made_by(run_dir: Path, job: Job) -> bool:
    """Whether `run_dir` is a run of `job`'s command: its args.json holds every flag value of the command but the
    bookkeeping ones (its experiment name, when the command does not set one, is the script's stem)."""
    try:
        args = json.loads((run_dir / "args.json").read_text())
    except (OSError, ValueError):
        return False
    flags = command_flags(job.command)
    if "exp-name" not in flags and args.get("exp_name") != script_stem(job.command):
        return False
    for name, values in flags.items():
        key = name.replace("-", "_")
        if key in BOOKKEEPING_FLAGS:
            continue
        if key in args:
            if not same_value(args[key], values):
                return False
        elif not (key.startswith("no_") and not values and args.get(key[3:], None) is False):
            return False
    return True


def unix_time(run_dir: Path) -> int:
    suffix = run_dir.name.rsplit("__", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0


def prepare_resume(job: Job, runs_root: Path) -> None:
    """Before a job runs: mark it skipped when one of its runs finished, else make it continue the newest of its runs
    that holds a checkpoint, and move its other unfinished runs aside (RUNS_DIR_incomplete/)."""
    from cleanrl_utils.checkpoint import CHECKPOINT_NAME  # imports torch: here, not for --help or --workers 0

    runs = sorted((d for d in existing_run_dirs(runs_root) if made_by(d, job)), key=lambda d: (unix_time(d), d.name))
    finished = [d for d in runs if (d / FINISHED_NAME).is_file()]
    if finished:
        job.run_dir, job.skipped, job.returncode = finished[-1], True, 0
        print(f"[{job.label}] finished before in {job.run_dir}: skipped", flush=True)
        return
    checkpointed = [d for d in runs if (d / CHECKPOINT_NAME).is_file()]
    job.run_dir = checkpointed[-1] if checkpointed else None
    aside = runs_root.parent / f"{runs_root.name}_incomplete"
    for run_dir in runs:
        if run_dir != job.run_dir:
            aside.mkdir(parents=True, exist_ok=True)
            shutil.move(str(run_dir), str(aside / run_dir.name))
            print(f"[{job.label}] moved the unfinished run {run_dir} aside to {aside}", flush=True)
    if job.run_dir is not None:
        job.command += f" --resume {shlex.quote(str(job.run_dir / CHECKPOINT_NAME))}"


# ---------------------------------------------------------------------------- running locally


def run_job(job: Job, lock: threading.Lock, prefix: bool) -> Job:
    start = time.time()
    with lock:
        print(f"[{job.label}] {job.command}", flush=True)
    process = subprocess.Popen(
        job.command,
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        errors="replace",
    )
    for line in process.stdout:
        job.output_tail.append(line.rstrip("\n"))
        with lock:
            print(f"[{job.label}] {line}" if prefix else line, end="", flush=True)
    job.returncode = process.wait()
    job.seconds = time.time() - start
    with lock:
        if job.returncode < 0:  # the shell around the command was ended by a signal (as its command may have been)
            status = f"ended by {signal.Signals(-job.returncode).name}"
        else:
            status = "done" if job.returncode == 0 else f"FAILED with exit code {job.returncode}"
        print(f"[{job.label}] {status} after {job.seconds:.0f} s", flush=True)
    return job


def restore_archived(archive_dir: Path, runs_root: Path) -> None:
    """Unpack the runs archived in `archive_dir` (cleanrl_utils.archive) that `runs_root` lacks into it: on a machine
    that kept nothing, their jobs are then found finished and skipped, or continued from their checkpoints."""
    from cleanrl_utils.archive import archived_runs
    from cleanrl_utils.results import run_name, unpack

    for archived in archived_runs(archive_dir):
        if not (runs_root / run_name(archived)).exists():
            unpack(archived, runs_root)
            print(f"restored the archived run {run_name(archived)} into {runs_root}", flush=True)


def finished(job: Job) -> bool:
    return job.run_dir is not None and (job.run_dir / FINISHED_NAME).is_file()


def archive_job(job: Job, archive_dir: Path, stopped: bool = False) -> None:
    """A thinned copy of a finished job's run in `archive_dir`, unless one is there; when the runner was `stopped`,
    also of an unfinished run with its checkpoint, for the next session to continue."""
    from cleanrl_utils.archive import KEEP, archive_run, archived_finished
    from cleanrl_utils.checkpoint import CHECKPOINT_NAME
    from cleanrl_utils.results import ARCHIVE_SUFFIX

    if finished(job):
        if not archived_finished(archive_dir / f"{job.run_dir.name}{ARCHIVE_SUFFIX}"):
            print(f"[{job.label}] archived to {archive_run(job.run_dir, archive_dir, KEEP)}", flush=True)
    elif stopped and job.run_dir is not None and (job.run_dir / CHECKPOINT_NAME).is_file():
        target = archive_run(job.run_dir, archive_dir, KEEP)
        print(f"[{job.label}] unfinished: archived with its checkpoint to {target}", flush=True)


class StopRequest:
    """SIGTERM or SIGINT to the runner, from then on: a flag that keeps further jobs from starting. The running ones
    are not signalled again: a signal to the process group or a terminal's Ctrl-C has reached them already (a second
    SIGINT would stop them before their checkpoint)."""

    def __init__(self):
        self.received = None
        self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handle(self, signum, frame) -> None:
        if self.received is None:
            name = signal.Signals(signum).name
            print(f"{name}: no further job starts; waiting for the running ones to exit", flush=True)
        self.received = signum

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def run_jobs(
    jobs: list[Job], workers: int, runs_root: Path, resume: bool = True, archive_dir: Path | None = None
) -> int | None:
    """Run the jobs, `workers` at a time, and attach to each the run directory it created or continued. With
    `resume`, jobs that finished in an earlier start are skipped and unfinished ones continued (prepare_resume).
    With `archive_dir`, the runs archived there come back first, and each job's run is archived once it finished.
    Returns the number of the signal that stopped the runner (StopRequest), None when every job ran."""
    if archive_dir is not None and resume:
        restore_archived(archive_dir, runs_root)
    for job in jobs if resume else ():
        prepare_resume(job, runs_root)
        if archive_dir is not None and job.skipped:
            archive_job(job, archive_dir)
    before = existing_run_dirs(runs_root)
    lock = threading.Lock()
    starts: dict[int, float] = {}
    todo = [index for index, job in enumerate(jobs) if not job.skipped]

    stop = StopRequest()

    def run(index: int) -> Job:
        if stop.received is not None:
            return jobs[index]  # not started: the next start of the runner runs it
        starts[index] = time.time()
        job = run_job(jobs[index], lock, prefix=workers > 1)
        if job.run_dir is None:
            job.run_dir = made_run_dir(job, runs_root, before, starts[index])
        mark_finished(job)
        if archive_dir is not None:  # now, not after the last job: a session may end before that
            with lock:
                archive_job(job, archive_dir, stopped=stop.received is not None)
        return job

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(run, todo))
    finally:
        stop.restore()
    return stop.received


def mark_finished(job: Job) -> None:
    """Write finished.json into the run directory of a job that exited 0 without writing one itself: a script that
    does not use cleanrl_utils.run. A run with a checkpoint but without finished.json was stopped by a signal."""
    from cleanrl_utils.checkpoint import CHECKPOINT_NAME

    run_dir = job.run_dir
    if (
        job.returncode != 0
        or run_dir is None
        or (run_dir / FINISHED_NAME).exists()
        or (run_dir / CHECKPOINT_NAME).exists()
    ):
        return
    (run_dir / FINISHED_NAME).write_text(json.dumps({"finished": time.time(), "written_by": "benchmark"}) + "\n")


def made_run_dir(job: Job, runs_root: Path, before: set[Path], start: float) -> Path | None:
    """The run directory a job's command made: a new one in runs_root with its env_id and seed, of its command."""
    candidates = new_run_dirs(runs_root, before, job.env_id, job.seed)
    # Another benchmark may be running the same environment and seed into the same runs/: keep this command's runs.
    candidates = [d for d in candidates if made_by(d, job)] or candidates
    # Run names end in the unix time they were made: keep those made while this job ran.
    first, last = int(start) - 1, int(start + job.seconds) + 1
    timed = [d for d in candidates if first <= unix_time(d) <= last]
    candidates = timed or candidates
    if len(candidates) > 1:
        print(
            f"warning: {job.label}: several new run directories ({', '.join(d.name for d in candidates)}); "
            "using the last",
            file=sys.stderr,
        )
    return candidates[-1] if candidates else None


def tabulate(jobs: list[Job], output: Path | None) -> bool:
    """Aggregate the jobs' runs into the results table; False when some run could not be used."""
    summaries, complete = [], True
    for job in jobs:
        if job.returncode == 0 and job.run_dir is not None and not (job.run_dir / FINISHED_NAME).is_file():
            print(
                f"warning: {job.label}: stopped before its end (SIGTERM or SIGINT: {job.run_dir} has a checkpoint but "
                f"no {FINISHED_NAME}); run the same benchmark command again to continue it",
                file=sys.stderr,
            )
            complete = False
        if job.run_dir is None:
            if job.returncode == 0:
                print(f"warning: {job.label}: the command made no run directory in runs/", file=sys.stderr)
            complete = False
            continue
        try:
            summaries.append(read_summary(job.run_dir))
        except RunError as error:
            print(f"warning: {error}; left out of the table", file=sys.stderr)
            complete = False
    if not summaries:
        print("no finished runs to tabulate", file=sys.stderr)
        return False
    rows = aggregate(summaries)
    table = markdown_table(rows, machine_description())
    print(f"\n{len(summaries)} runs, {len(rows)} rows (one per script x environment):\n")
    print(table)
    if output is not None:
        write_tables(rows, output, machine_description())
        print(f"written to {output.with_suffix('.md')} and {output.with_suffix('.csv')}")
    return complete


# ---------------------------------------------------------------------------- SLURM


def render_slurm(template: str, commands: list[str], job_name: str, workdir: Path) -> str:
    """Fill a job-array template: one array task per command (see the module docstring)."""
    lines = ["commands=("] + [f"    {shlex.quote(command)}" for command in commands] + [")"]
    lines.append('eval "${commands[$SLURM_ARRAY_TASK_ID]}"')
    values = {
        "array": f"0-{len(commands) - 1}",
        "commands": "\n".join(lines),
        "num_tasks": str(len(commands)),
        "job_name": job_name,
        "workdir": shlex.quote(str(workdir)),
    }
    used = set(PLACEHOLDER.findall(template))
    unknown = sorted(used - set(values))
    if unknown:
        fail(
            f"--slurm-template: unknown placeholder {{{{{unknown[0]}}}}}; known: "
            + ", ".join(f"{{{{{name}}}}}" for name in values)
        )
    missing = [name for name in REQUIRED_PLACEHOLDERS if name not in used]
    if missing:
        fail(
            f"--slurm-template: the template needs a {{{{{missing[0]}}}}} placeholder "
            "(see python -m cleanrl_utils.benchmark --help)"
        )
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def submit_slurm(args, jobs: list[Job]) -> None:
    template_path: Path = args.slurm_template
    if not template_path.is_file():
        fail(f"--slurm-template {template_path}: no such file")
    job_name = args.job_name or script_stem(args.command) or "cleanrl"
    script = render_slurm(template_path.read_text(), [job.command for job in jobs], job_name, Path.cwd())
    path: Path = args.slurm_script or Path("slurm") / f"{job_name}.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    print(f"wrote {path}: a job array of {len(jobs)} tasks")
    if shutil.which("sbatch"):
        submitted = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
        print((submitted.stdout + submitted.stderr).strip())
        if submitted.returncode != 0:
            raise SystemExit(1)
    else:
        print(f"sbatch is not on this machine; submit it on the cluster with: sbatch {path}")
    pattern = " ".join(
        f"{args.runs_dir}/{env_id.replace('/', '-')}__{script_stem(args.command) or '*'}__*" for env_id in args.env_ids
    )
    output = args.output or "benchmark/results/" + (script_stem(args.command) or "results")
    print(
        f"when the jobs have finished, make the table with: python -m cleanrl_utils.results {pattern} --output {output}"
    )


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.benchmark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--env-ids", nargs="+", required=True, help="environment ids to run the command on")
    parser.add_argument(
        "--command",
        required=True,
        help='the command to run, e.g. "uv run python cleanrl/ppo.py --total-timesteps 500000"',
    )
    parser.add_argument("--num-seeds", type=int, default=3, help="seeds per environment (default 3)")
    parser.add_argument("--start-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument(
        "--workers", type=int, default=1, help="commands run at once (default 1); 0 only prints the commands"
    )
    parser.add_argument("--output", type=Path, default=None, help="write the results table to OUTPUT.md and OUTPUT.csv")
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=Path("runs"),
        help="where the commands write their run directories (default runs)",
    )
    parser.add_argument(
        "--slurm-template",
        type=Path,
        default=None,
        help="write and submit a SLURM job array from this template instead of running locally",
    )
    parser.add_argument(
        "--slurm-script", type=Path, default=None, help="where to write the job script (default slurm/JOB_NAME.sbatch)"
    )
    parser.add_argument("--job-name", default=None, help="the SLURM job name (default: the script's stem)")
    parser.add_argument(
        "--archive",
        type=Path,
        default=None,
        help="pack each finished run, thinned (cleanrl_utils.archive), into this folder as it ends (stopped by a "
        "signal: the runs it stopped too, with their checkpoints), and restore the runs archived there into --runs-dir "
        "first (a benchmark longer than a session on machines that keep nothing)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="run every command anew, also those whose runs in --runs-dir finished (default: skip them, continue "
        "the unfinished ones)",
    )
    args = parser.parse_args(argv)

    if args.num_seeds <= 0:
        fail(f"--num-seeds must be positive, got {args.num_seeds}")
    if args.workers < 0:
        fail(f"--workers must be 0 (print the commands) or positive, got {args.workers}")
    try:
        if not shlex.split(args.command):
            fail("--command is empty")
    except ValueError as error:
        fail(f"--command {args.command!r} cannot be parsed: {error}")
    seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
    jobs = make_jobs(args.command, args.env_ids, seeds)

    if args.slurm_template is not None:
        submit_slurm(args, jobs)
        return
    if args.workers == 0:
        for job in jobs:
            print(job.command)
        return
    stopped_by = run_jobs(jobs, args.workers, args.runs_dir, resume=not args.rerun, archive_dir=args.archive)
    if stopped_by is not None:
        unfinished = ", ".join(job.label for job in jobs if not job.skipped and not finished(job)) or "none"
        print(
            f"stopped by {signal.Signals(stopped_by).name}, no table made (--output is left as it was); unfinished: "
            f"{unfinished}. The same command continues from here.",
            file=sys.stderr,
        )
        raise SystemExit(128 + stopped_by)
    failed = [job for job in jobs if job.returncode != 0]
    for job in failed:
        tail = "\n    ".join(job.output_tail)
        print(f"FAILED ({job.label}, exit code {job.returncode}): {job.command}\n    {tail}", file=sys.stderr)
    complete = tabulate(jobs, args.output)
    if failed or not complete:
        raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
