"""Hyperparameter tuning of any script with Optuna.

Each trial runs the script once per seed and environment, as a subprocess, with the flags the
trial suggests; reads the metric (default charts/episodic_return) back from the run's
TensorBoard events and averages its last `metric_last_n_average_window` values; normalises it
per environment with target_scores {env_id: [min, max]} to (score - min) / (max - min) (None:
use the raw score); and aggregates the normalised scores over environments and seeds
("average", "median", "max" or "min") into the trial's value. After every run the aggregate so
far is reported to Optuna and the trial stops early when the pruner says so.

Python:

    import optuna
    from cleanrl_utils.tuner import Tuner

    tuner = Tuner(
        script="cleanrl/ppo.py",
        metric="charts/episodic_return",
        metric_last_n_average_window=50,
        direction="maximize",
        aggregation_type="average",
        target_scores={"CartPole-v1": [0, 500], "Acrobot-v1": [-500, 0]},
        params_fn=lambda trial: {
            "learning-rate": trial.suggest_float("learning-rate", 0.0003, 0.003, log=True),
            "num-minibatches": trial.suggest_categorical("num-minibatches", [1, 2, 4]),
            "update-epochs": trial.suggest_categorical("update-epochs", [1, 2, 4, 8]),
            "total-timesteps": 100000,
            "num-envs": 16,
        },
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5),
        sampler=optuna.samplers.TPESampler(),
        storage="sqlite:///cleanrl_hpopt.db",
        study_name="ppo_classic_control",
    )
    study = tuner.tune(num_trials=100, num_seeds=3)

Command line (the same study):

    python -m cleanrl_utils.tuner --script cleanrl/ppo.py \\
        --target-scores CartPole-v1=0,500 Acrobot-v1=-500,0 \\
        --param learning-rate=loguniform:0.0003,0.003 --param num-minibatches=categorical:1,2,4 \\
        --param update-epochs=categorical:1,2,4,8 --fixed="--total-timesteps 100000 --num-envs 16" \\
        --num-trials 100 --num-seeds 3 --storage sqlite:///cleanrl_hpopt.db --study-name ppo_classic_control

--param NAME=KIND:ARGS with KIND uniform:LOW,HIGH | loguniform:LOW,HIGH | int:LOW,HIGH |
categorical:A,B,C. A params_fn value True becomes --NAME, False --no-NAME (tyro's boolean
flags), anything else --NAME=VALUE; every flag reaches the script, in order, before --env-id
and --seed (seeds count from 1); extra_flags (--fixed) follow them in every run.

Several processes, on one machine or many, work on one study when they share its storage URL
and study name: the study is created by the first and loaded by the others (load_if_exists).
SQLite (sqlite:///file.db) serves processes on one machine; across machines use a database
server, e.g. postgresql://user:password@host/db (pip install psycopg2-binary). --num-trials is
the size of the study, all processes together: each runs trials until the study holds that many
(complete, pruned, failed, or running in another process). A trial's runs live in
WORKDIR/STUDY/trial_N/runs/ (WORKDIR defaults to runs/tuner); its script output in the .log
files beside them. Optuna's own log is kept to warnings; the tuner prints one line per run and
per trial.

A script that exits with an error fails that trial (the study goes on); a metric the runs do
not write stops the study with one line naming the metrics they do write.

Killed and started again with the same command, the tuner continues its study on the storage:
finished trials are kept, and a trial that was running when its tuner process died (the process
is named in the trial's "worker" attribute; it must have run on this machine) is marked failed
and queued again with the same parameters (its retry's "retry_of" attribute names it), and so
is the trial running when the tuner is stopped with Ctrl-C (exit code 130, one line). The
killed trial counts neither towards --num-trials nor its retry's number, so the study ends with
as many trials as asked. A trial left running by a process on another machine that died is not
failed (it cannot be told from a slow one): fail it by hand (study.tell(number, state=FAIL)).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cleanrl_utils.errors import fail
from cleanrl_utils.results import RunError, existing_run_dirs, new_run_dirs, read_scalar

AGGREGATIONS = {"average": np.mean, "median": np.median, "max": np.max, "min": np.min}


class ScriptFailed(RuntimeError):
    """One run of the script failed: its trial fails, the study goes on."""


class StudyError(RuntimeError):
    """A problem every trial would have (an unknown metric): the study stops."""


def to_flags(params: dict) -> list[str]:
    """Command-line flags for the params, in order: True -> --name, False -> --no-name,
    otherwise --name=value. Names may be written with underscores or a leading --."""
    flags = []
    for key, value in params.items():
        name = key.lstrip("-").replace("_", "-")
        if value is True:
            flags.append(f"--{name}")
        elif value is False:
            flags.append(f"--no-{name}")
        else:
            flags.append(f"--{name}={value}")
    return flags


def normalize(score: float, target: list[float] | None) -> float:
    if target is None:
        return score
    low, high = target
    return (score - low) / (high - low)


def process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), which tells it from a later process given the
    same pid; None where there is no such process or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def this_worker() -> str:
    """The tuner process, as stored in its trials' "worker" attribute: host, pid and start time."""
    return f"{socket.gethostname()} {os.getpid()} {process_start(os.getpid())}"


def worker_gone(worker: str) -> bool:
    """Whether the tuner process named `worker` (this_worker()) has died: False when it ran on another machine."""
    host, pid, start = worker.rsplit(" ", 2)
    if host != socket.gethostname():
        return False
    if start != "None":
        return process_start(int(pid)) != start
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def counted(trials: list) -> list:
    """The trials that count towards the study's size: all but those waiting in the queue, interrupted ones that were
    queued again, and surplus ones (asked by two processes at once when the study was one trial short)."""
    from optuna.trial import TrialState

    retried = {trial.user_attrs.get("retry_of") for trial in trials}
    return [
        trial
        for trial in trials
        if trial.state != TrialState.WAITING and trial.number not in retried and not trial.user_attrs.get("surplus")
    ]


def open_storage(storage: str | None):
    """The study storage: None keeps the study in memory; SQLite waits for the other processes'
    locks instead of failing at once."""
    import optuna

    if storage is None or not storage.startswith("sqlite"):
        return storage
    return optuna.storages.RDBStorage(storage, engine_kwargs={"connect_args": {"timeout": 120}})


class Tuner:
    def __init__(
        self,
        script: str | os.PathLike,
        target_scores: dict[str, list[float] | None],
        params_fn: Callable,
        metric: str = "charts/episodic_return",
        metric_last_n_average_window: int = 50,
        direction: str = "maximize",
        aggregation_type: str = "average",
        sampler=None,
        pruner=None,
        storage: str | None = "sqlite:///cleanrl_hpopt.db",
        study_name: str = "",
        workdir: str | os.PathLike = "runs/tuner",
        python: str = sys.executable,
        start_seed: int = 1,
        extra_flags: list[str] = (),
    ) -> None:
        self.script = Path(script).resolve()
        if not self.script.is_file():
            fail(f"script {script}: no such file")
        if not target_scores:
            fail("target_scores must name at least one environment ({env_id: [min, max] or None})")
        for env_id, target in target_scores.items():
            if target is not None and (len(target) != 2 or not target[1] != target[0]):
                fail(f"target_scores[{env_id!r}] must be [min, max] with min != max, got {target}")
        if aggregation_type not in AGGREGATIONS:
            fail(f"aggregation_type must be one of {', '.join(AGGREGATIONS)}, got {aggregation_type!r}")
        if direction not in ("maximize", "minimize"):
            fail(f"direction must be maximize or minimize, got {direction!r}")
        if metric_last_n_average_window <= 0:
            fail(f"metric_last_n_average_window must be positive, got {metric_last_n_average_window}")
        self.target_scores = dict(target_scores)
        self.params_fn = params_fn
        self.metric = metric
        self.metric_last_n_average_window = metric_last_n_average_window
        self.direction = direction
        self.aggregation_type = aggregation_type
        self.aggregate = AGGREGATIONS[aggregation_type]
        self.sampler = sampler
        self.pruner = pruner
        self.storage = storage
        self.study_name = study_name or f"tuner_{int(time.time())}"
        self.workdir = Path(workdir).resolve()
        self.python = python
        self.start_seed = start_seed
        self.extra_flags = list(extra_flags)

    def run_script(self, flags: list[str], env_id: str, seed: int, trial_dir: Path) -> float:
        """Run the script once in trial_dir and return the average of the metric's last values."""
        runs_root = trial_dir / "runs"
        trial_dir.mkdir(parents=True, exist_ok=True)
        before = existing_run_dirs(runs_root)
        command = [self.python, str(self.script), *flags, *self.extra_flags, "--env-id", env_id, "--seed", str(seed)]
        log = trial_dir / f"{env_id.replace('/', '-')}__seed{seed}.log"
        with open(log, "w") as out:
            out.write(shlex.join(command) + "\n")
            out.flush()
            returncode = subprocess.run(command, cwd=trial_dir, stdout=out, stderr=subprocess.STDOUT).returncode
        if returncode != 0:
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            raise ScriptFailed(
                f"{self.script.name} exited with code {returncode} on {env_id} seed {seed}: "
                f"{lines[-1] if len(lines) > 1 else 'no output'} (log: {log})"
            )
        made = new_run_dirs(runs_root, before, env_id, seed)
        if not made:
            raise ScriptFailed(f"{self.script.name} made no run directory in {runs_root} (log: {log})")
        try:
            _, _, values = read_scalar(made[-1], self.metric)
        except RunError as error:
            raise StudyError(f"unknown metric {self.metric!r}: {error}") from None
        return float(np.mean(values[-self.metric_last_n_average_window :]))

    def objective(self, trial, num_seeds: int) -> float:
        flags = to_flags(self.params_fn(trial))
        trial_dir = self.workdir / self.study_name / f"trial_{trial.number}"
        normalized = []
        for seed in range(self.start_seed, self.start_seed + num_seeds):
            for env_id, target in self.target_scores.items():
                score = self.run_script(flags, env_id, seed, trial_dir)
                normalized.append(normalize(score, target))
                trial.set_user_attr(f"{env_id}/seed{seed}", score)
                print(
                    f"trial {trial.number} {env_id} seed {seed}: {self.metric} {score:.4g} "
                    f"(normalised {normalized[-1]:.4g})",
                    flush=True,
                )
                trial.report(float(self.aggregate(normalized)), step=len(normalized) - 1)
                if trial.should_prune():
                    import optuna

                    raise optuna.TrialPruned()
        return float(self.aggregate(normalized))

    def create_study(self):
        """Create the study, or load it when another process made it (load_if_exists). Processes
        starting together race to create the storage's tables and the study: retry a few times."""
        import optuna

        racing = {"IntegrityError", "OperationalError", "DuplicatedStudyError"}
        for attempt in range(12):
            try:
                return optuna.create_study(
                    study_name=self.study_name,
                    storage=open_storage(self.storage),
                    load_if_exists=True,
                    direction=self.direction,
                    sampler=self.sampler,
                    pruner=self.pruner,
                )
            except Exception as error:
                if type(error).__name__ not in racing or attempt == 11:
                    reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
                    fail(
                        f"storage {self.storage!r}: cannot open study {self.study_name!r} "
                        f"({type(error).__name__}: {reason})"
                    )
                time.sleep(0.1 * (attempt + 1))

    def retry_interrupted_trials(self, study) -> None:
        """Fail the trials whose tuner process on this machine died while they ran, and queue each again with its
        parameters."""
        from optuna.trial import TrialState

        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = trial.user_attrs.get("worker")
            if worker is None or not worker_gone(worker):
                continue
            try:
                study.tell(trial.number, state=TrialState.FAIL)
            except (RuntimeError, ValueError):  # another process, restarted at the same time, failed it first
                continue
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            print(
                f"trial {trial.number} was interrupted (its tuner process {worker.split()[1]} died): "
                "marked failed, queued again with the same parameters",
                flush=True,
            )

    def tune(self, num_trials: int, num_seeds: int):
        """Run trials until the study holds num_trials (see counted(); other processes may share the study, and a
        study continued after a kill already holds some), and return the study."""
        import optuna
        from optuna.trial import TrialState

        if num_trials <= 0 or num_seeds <= 0:
            fail(f"num_trials and num_seeds must be positive, got {num_trials} and {num_seeds}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = self.create_study()
        worker = this_worker()
        held = len(counted(study.get_trials(deepcopy=False)))
        if held:
            print(f"study {self.study_name!r} holds {held} of its {num_trials} trials", flush=True)
        while True:
            self.retry_interrupted_trials(study)
            if len(counted(study.get_trials(deepcopy=False))) >= num_trials:
                break
            trial = study.ask()
            trial.set_user_attr("worker", worker)
            earlier = [t for t in counted(study.get_trials(deepcopy=False)) if t.number < trial.number]
            if len(earlier) >= num_trials:  # another process asked for the last trial at the same moment
                trial.set_user_attr("surplus", True)
                study.tell(trial, state=TrialState.FAIL)
                break
            try:
                value = self.objective(trial, num_seeds)
            except optuna.TrialPruned:
                study.tell(trial, state=TrialState.PRUNED)
                print(f"trial {trial.number} pruned", flush=True)
                continue
            except ScriptFailed as error:
                study.tell(trial, state=TrialState.FAIL)
                print(f"warning: trial {trial.number} failed: {error}", file=sys.stderr, flush=True)
                continue
            except StudyError as error:
                study.tell(trial, state=TrialState.FAIL)
                fail(str(error))
            except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C: the next start runs it again
                study.tell(trial, state=TrialState.FAIL)
                study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
                if isinstance(stop, KeyboardInterrupt):
                    print(
                        f"\ninterrupted: trial {trial.number} is queued again; run the same command to continue the "
                        "study",
                        file=sys.stderr,
                        flush=True,
                    )
                    raise SystemExit(130) from None
                raise
            except BaseException:
                study.tell(trial, state=TrialState.FAIL)
                raise
            if not math.isfinite(value):
                study.tell(trial, state=TrialState.FAIL)
                print(f"warning: trial {trial.number} failed: its value is {value}", file=sys.stderr, flush=True)
                continue
            study.tell(trial, value)
            print(f"trial {trial.number} finished: {value:.4g} with {trial.params}", flush=True)
        finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
        if finished:
            print(
                f"best so far in study {self.study_name!r}: trial {study.best_trial.number}, "
                f"value {study.best_value:.4g}, params {study.best_params}",
                flush=True,
            )
        return study


# ---------------------------------------------------------------------------- command line


def parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None}.get(text, text)


def parse_param(spec: str) -> tuple[str, Callable]:
    """NAME=KIND:ARGS -> (name, function(trial) -> suggested value)."""
    try:
        name, rest = spec.split("=", 1)
        kind, values = rest.split(":", 1)
        items = values.split(",")
        if kind in ("uniform", "loguniform"):
            low, high = map(float, items)
            return name, lambda trial: trial.suggest_float(name, low, high, log=kind == "loguniform")
        if kind == "int":
            low, high = map(int, items)
            return name, lambda trial: trial.suggest_int(name, low, high)
        if kind == "categorical":
            choices = [parse_value(item) for item in items]
            return name, lambda trial: trial.suggest_categorical(name, choices)
    except ValueError:
        pass
    fail(
        f"--param {spec!r}: write NAME=uniform:LOW,HIGH, NAME=loguniform:LOW,HIGH, NAME=int:LOW,HIGH "
        "or NAME=categorical:A,B,..."
    )


def parse_target(spec: str) -> tuple[str, list[float] | None]:
    """ENV_ID=MIN,MAX, or ENV_ID alone for no normalisation."""
    if "=" not in spec:
        return spec, None
    env_id, bounds = spec.split("=", 1)
    try:
        low, high = map(float, bounds.split(","))
    except ValueError:
        fail(f"--target-scores {spec!r}: write ENV_ID=MIN,MAX (or ENV_ID alone)")
    return env_id, [low, high]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.tuner", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--script", required=True, help="the script to tune, e.g. cleanrl/ppo.py")
    parser.add_argument(
        "--target-scores",
        nargs="+",
        required=True,
        metavar="ENV_ID=MIN,MAX",
        help="environments, each with the scores that normalise to 0 and 1 (ENV_ID alone: raw scores)",
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=KIND:ARGS", help="a searched flag (repeat)"
    )
    parser.add_argument(
        "--fixed",
        default="",
        help='flags passed to every run, written --fixed="--total-timesteps 100000 --num-envs 16"',
    )
    parser.add_argument("--metric", default="charts/episodic_return")
    parser.add_argument("--last-n", type=int, default=50, help="average the metric's last N values (default 50)")
    parser.add_argument("--direction", choices=["maximize", "minimize"], default="maximize")
    parser.add_argument("--aggregation", choices=list(AGGREGATIONS), default="average")
    parser.add_argument(
        "--num-trials",
        type=int,
        default=100,
        help="trials the study holds when done, all processes together and earlier starts included (default 100)",
    )
    parser.add_argument("--num-seeds", type=int, default=1, help="seeds per environment in each trial (default 1)")
    parser.add_argument(
        "--storage", default="sqlite:///cleanrl_hpopt.db", help="Optuna storage URL (sqlite:///..., postgresql://...)"
    )
    parser.add_argument("--study-name", required=True)
    parser.add_argument("--sampler", choices=["tpe", "random"], default="tpe")
    parser.add_argument("--sampler-seed", type=int, default=None)
    parser.add_argument(
        "--pruner", choices=["median", "none"], default="median", help="median: MedianPruner(n_startup_trials=5)"
    )
    parser.add_argument(
        "--workdir", default="runs/tuner", help="trials run in WORKDIR/STUDY/trial_N (default runs/tuner)"
    )
    args = parser.parse_args(argv)

    import optuna

    params = [parse_param(spec) for spec in args.param]
    try:
        fixed = shlex.split(args.fixed)
    except ValueError as error:
        fail(f"--fixed {args.fixed!r} cannot be parsed: {error}")
    target_scores = dict(parse_target(spec) for spec in args.target_scores)

    def params_fn(trial) -> dict:
        return {name: suggest(trial) for name, suggest in params}

    tuner = Tuner(
        script=args.script,
        target_scores=target_scores,
        params_fn=params_fn,
        metric=args.metric,
        metric_last_n_average_window=args.last_n,
        direction=args.direction,
        aggregation_type=args.aggregation,
        sampler=optuna.samplers.TPESampler(seed=args.sampler_seed)
        if args.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=args.sampler_seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5)
        if args.pruner == "median"
        else optuna.pruners.NopPruner(),
        storage=args.storage,
        study_name=args.study_name,
        workdir=args.workdir,
        extra_flags=fixed,
    )
    tuner.tune(args.num_trials, args.num_seeds)


if __name__ == "__main__":
    main(sys.argv[1:])
