"""The experiment tools resume (issue 18): the benchmark runner and the tuner, SIGKILLed mid-way together with the
runs they started (as a crash or a preempted machine does) and started again with the same command, skip what
finished and redo only what did not.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from conftest import ROOT, read_scalars, script_env
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from cleanrl_utils.results import unpack

ECHO = ROOT / "tests" / "flag_echo.py"
TINY_PPO = (
    "--total-timesteps 1024 --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --checkpoint-every 512"
)


def start(argv: list[str], cwd: Path, output: Path) -> subprocess.Popen:
    """Start a tool in a session of its own, so that it can be killed with every process it started."""
    with open(output, "w") as out:
        return subprocess.Popen(
            argv, cwd=cwd, env=script_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def kill_when(process: subprocess.Popen, condition, what: str, timeout: float = 180) -> None:
    """SIGKILL the process and everything it started as soon as `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"it ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.002)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def seed_runs(runs: Path, seed: int) -> list[Path]:
    return sorted(runs.glob(f"CartPole-v1__ppo__{seed}__*"))


def args_written(run_dir: Path) -> bool:
    """Whether the run's args.json is there and whole (it is written in place: a kill the moment it appears can leave
    it empty, and the runner then cannot tell whose run it was; CI at 700bd08 caught that moment)."""
    try:
        return isinstance(json.loads((run_dir / "args.json").read_text()), dict)
    except (OSError, ValueError):
        return False


def test_a_killed_benchmark_started_again_skips_finished_runs_and_continues_the_others(tmp_path):
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'cleanrl' / 'ppo.py'))} {TINY_PPO}"
    argv = [sys.executable, "-m", "cleanrl_utils.benchmark", "--env-ids", "CartPole-v1", "--command", command]
    argv += ["--num-seeds", "3", "--output", "results/ppo"]
    runs = tmp_path / "runs"
    outputs = [tmp_path / f"output{i}.txt" for i in range(3)]

    # 1. Killed once seed 1 finished and seed 2 started, before its first checkpoint.
    first = start(argv, tmp_path, outputs[0])
    kill_when(
        first,
        lambda: (
            any((d / "finished.json").exists() for d in seed_runs(runs, 1))
            and any(args_written(d) for d in seed_runs(runs, 2))
        ),
        "seed 2's run",
    )
    (finished,) = seed_runs(runs, 1)
    (unfinished,) = seed_runs(runs, 2)
    assert not (unfinished / "checkpoint.pt").exists(), "killed too late: seed 2 already had a checkpoint"
    marker_time = (finished / "finished.json").stat().st_mtime_ns

    # 2. Started again: seed 1 skipped, seed 2's run (no checkpoint) moved aside and redone; killed after a checkpoint.
    second = start(argv, tmp_path, outputs[1])
    kill_when(second, lambda: any((d / "checkpoint.pt").exists() for d in seed_runs(runs, 2)), "a checkpoint of seed 2")
    log = outputs[1].read_text()
    assert f"[CartPole-v1 seed 1] finished before in {Path('runs') / finished.name}: skipped" in log, log
    assert f"moved the unfinished run {Path('runs') / unfinished.name} aside" in log, log
    assert (tmp_path / "runs_incomplete" / unfinished.name / "args.json").exists()
    (checkpointed,) = seed_runs(runs, 2)
    assert checkpointed != unfinished and not (checkpointed / "finished.json").exists()

    # 3. Started again: seed 1 skipped, seed 2 continued from its checkpoint, seed 3 run; all finish.
    third = subprocess.run(argv, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr
    assert "[CartPole-v1 seed 1] finished before" in third.stdout
    assert f"--seed 2 --resume {Path('runs') / checkpointed.name / 'checkpoint.pt'}" in third.stdout
    assert [d.name for d in seed_runs(runs, 2)] == [checkpointed.name] and len(list(checkpointed.glob("events.*"))) == 2
    assert (finished / "finished.json").stat().st_mtime_ns == marker_time and len(list(finished.glob("events.*"))) == 1
    assert all(len(seed_runs(runs, seed)) == 1 for seed in (1, 2, 3)) and len(list(runs.iterdir())) == 3
    for seed in (1, 2, 3):
        (run_dir,) = seed_runs(runs, seed)
        assert json.loads((run_dir / "finished.json").read_text())["global_step"] == 1024
        assert max(step for step, _ in read_scalars(run_dir)["charts/episodic_return"]) <= 1024
    row = next(line for line in (tmp_path / "results" / "ppo.md").read_text().splitlines() if "CartPole-v1" in line)
    assert "| ppo.py | CartPole-v1 | 1024 | 1 2 3 |" in row, row
    # Each seed's command ran once from the start (seed 2 twice: its first run was killed before any checkpoint).
    started = "".join(path.read_text() for path in outputs[:2]) + third.stdout
    assert [started.count(f"--seed {seed}\n") for seed in (1, 2, 3)] == [1, 2, 1], started

    # 4. Once more: nothing left to do.
    fourth = subprocess.run(argv, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert fourth.returncode == 0 and fourth.stdout.count("skipped") == 3, fourth.stdout + fourth.stderr


def test_an_archived_benchmark_goes_on_where_it_stopped_on_a_machine_that_kept_nothing(tmp_path):
    # Session 1 runs seed 1 with --archive; session 2 starts from the repository alone (no runs/): seed 1 comes back
    # from the archive and is skipped, seed 2 runs and is archived, and the table holds both.
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'cleanrl' / 'ppo.py'))} {TINY_PPO}"
    argv = [sys.executable, "-m", "cleanrl_utils.benchmark", "--env-ids", "CartPole-v1", "--command", command]
    argv += ["--archive", "benchmark/runs", "--output", "results/ppo"]
    first = subprocess.run([*argv, "--num-seeds", "1"], cwd=tmp_path, env=script_env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    (archived,) = (tmp_path / "benchmark" / "runs").iterdir()
    with tarfile.open(archived) as tar:  # no checkpoint in the archive
        assert "archived to" in first.stdout and not [name for name in tar.getnames() if name.endswith(".pt")]
    shutil.rmtree(tmp_path / "runs")
    second = subprocess.run([*argv, "--num-seeds", "2"], cwd=tmp_path, env=script_env(), capture_output=True, text=True)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert f"restored the archived run {archived.name.removesuffix('.tar.xz')}" in second.stdout
    assert "[CartPole-v1 seed 1] finished before" in second.stdout and second.stdout.count("--seed 1\n") == 0
    assert len(list((tmp_path / "benchmark" / "runs").iterdir())) == 2
    assert "| ppo.py | CartPole-v1 | 1024 | 1 2 |" in (tmp_path / "results" / "ppo.md").read_text()


def test_a_run_stopped_with_its_archived_benchmark_goes_on_from_its_checkpoint_on_a_machine_that_kept_nothing(
    tmp_path,
):
    # Session 1 is stopped (SIGTERM to the runner's group) in the middle of seed 1: the run writes its checkpoint on
    # the way out and the runner archives it with that checkpoint. Session 2 starts from the repository alone (no
    # runs/): the run comes back, continues from the archived checkpoint rather than from step 0, finishes, and its
    # archived copy then holds finished.json and no checkpoint.
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'cleanrl' / 'ppo.py'))} {TINY_PPO}"
    argv = [sys.executable, "-m", "cleanrl_utils.benchmark", "--env-ids", "CartPole-v1", "--command", command]
    argv += ["--num-seeds", "1", "--archive", "benchmark/runs", "--output", "results/ppo"]
    runs = tmp_path / "runs"
    output = tmp_path / "session1.txt"
    first = start(argv, tmp_path, output)
    deadline = time.monotonic() + 180
    while not any((d / "checkpoint.pt").exists() for d in seed_runs(runs, 1)):
        assert first.poll() is None and time.monotonic() < deadline, output.read_text()
        time.sleep(0.002)
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(timeout=120) == 128 + signal.SIGTERM, output.read_text()
    log = output.read_text()
    (run_dir,) = seed_runs(runs, 1)
    assert not (run_dir / "finished.json").exists(), "stopped too late: the run had finished"
    packed = Path("benchmark/runs") / f"{run_dir.name}.tar.xz"
    assert f"[CartPole-v1 seed 1] unfinished: archived with its checkpoint to {packed}" in log
    copy = unpack(tmp_path / packed, tmp_path / "unpacked")
    assert (copy / "checkpoint.pt").read_bytes() == (run_dir / "checkpoint.pt").read_bytes()
    assert max(step for series in read_scalars(run_dir).values() for step, _ in series) < 1024

    shutil.rmtree(runs)
    second = subprocess.run(argv, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert f"restored the archived run {run_dir.name}" in second.stdout
    assert f"--seed 1 --resume {Path('runs') / run_dir.name / 'checkpoint.pt'}" in second.stdout
    old_events, new_events = sorted((runs / run_dir.name).glob("events.*"), key=lambda path: path.stat().st_mtime)
    resumed_steps = [event.step for event in EventFileLoader(str(new_events)).Load() if event.HasField("summary")]
    assert min(resumed_steps) >= 512 and max(resumed_steps) <= 1024  # from the checkpoint on, not from step 0
    copy = unpack(tmp_path / packed, tmp_path / "unpacked again")
    assert (copy / "finished.json").is_file() and not (copy / "checkpoint.pt").exists()
    assert json.loads((copy / "finished.json").read_text())["global_step"] == 1024
    assert "| ppo.py | CartPole-v1 | 1024 | 1 |" in (tmp_path / "results" / "ppo.md").read_text()


def test_benchmark_tells_a_run_of_another_command_from_its_own(tmp_path):
    from cleanrl_utils import benchmark

    run_dir = tmp_path / "CartPole-v1__ppo__1__1700000000"
    run_dir.mkdir()
    args = {"exp_name": "ppo", "env_id": "CartPole-v1", "seed": 1, "total_timesteps": 1024, "learning_rate": 0.00025}
    (run_dir / "args.json").write_text(json.dumps({**args, "anneal_lr": False, "cuda": True, "resume": None}))
    (job,) = benchmark.make_jobs("uv run python cleanrl/ppo.py --total-timesteps 1024", ["CartPole-v1"], [1])
    assert benchmark.made_by(run_dir, job)
    same = "python cleanrl/ppo.py --total-timesteps=1024 --learning-rate 2.5e-4 --no-anneal-lr --cuda"
    assert benchmark.made_by(run_dir, benchmark.make_jobs(same, ["CartPole-v1"], [1])[0])
    # Bookkeeping flags change nothing learned: the run was made without them and is still this command's run.
    kept = "python cleanrl/ppo.py --total-timesteps 1024 --checkpoint-every 512 --track --wandb-project-name x"
    assert benchmark.made_by(run_dir, benchmark.make_jobs(kept, ["CartPole-v1"], [1])[0])
    for other in ("--total-timesteps 2048", "--anneal-lr", "--num-envs 8", "--exp-name ppo2"):
        job = benchmark.make_jobs(f"python cleanrl/ppo.py {other}", ["CartPole-v1"], [1])[0]
        assert not benchmark.made_by(run_dir, job), other
    assert not benchmark.made_by(run_dir, benchmark.make_jobs("python cleanrl/ppo.py", ["CartPole-v1"], [2])[0])
    assert not benchmark.made_by(run_dir, benchmark.make_jobs("python cleanrl/dqn.py", ["CartPole-v1"], [1])[0])


def test_benchmark_keeps_its_own_run_when_another_benchmark_shares_runs_and_seed(tmp_path):
    """Two benchmarks at once into one runs/ (crossq and sac, seed 3): each job archives and tabulates its own run."""
    from cleanrl_utils import benchmark

    def make_run(exp_name, unix_time):
        run_dir = tmp_path / f"Hopper-v5__{exp_name}__3__{unix_time}"
        run_dir.mkdir()
        (run_dir / "args.json").write_text(json.dumps({"exp_name": exp_name, "env_id": "Hopper-v5", "seed": 3}))
        return run_dir

    crossq = make_run("crossq_w512_100k", 1796625822)
    sac = make_run("sac_100k", 1796628010)  # started later, by the other benchmark, while crossq's job ran
    command = "python cleanrl/crossq_continuous_action.py --exp-name crossq_w512_100k"
    (job,) = benchmark.make_jobs(command, ["Hopper-v5"], [3])
    job.seconds = 6000.0
    assert benchmark.made_run_dir(job, tmp_path, set(), 1796625821.5) == crossq
    (job,) = benchmark.make_jobs("python cleanrl/sac_continuous_action.py --exp-name sac_100k", ["Hopper-v5"], [3])
    job.seconds = 1100.0
    assert benchmark.made_run_dir(job, tmp_path, set(), 1796628009.8) == sac


def test_a_killed_tuner_started_again_continues_its_study(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    argv = [sys.executable, "-m", "cleanrl_utils.tuner", "--script", str(ECHO), "--target-scores", "CartPole-v1=0,2"]
    argv += ["--param", "x=uniform:0,1", "--fixed=--sleep 1", "--num-trials", "4", "--storage", storage]
    argv += ["--study-name", "resumed", "--workdir", "tuning", "--sampler", "random", "--sampler-seed", "0"]
    argv += ["--pruner", "none"]
    trials = tmp_path / "tuning" / "resumed"

    # Killed while trial 1's run is going (trial 0 finished).
    first = start(argv, tmp_path, tmp_path / "output0.txt")
    kill_when(first, lambda: list((trials / "trial_1").glob("*.log")), "trial 1's run")
    study = optuna.load_study(study_name="resumed", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "RUNNING"]
    interrupted_params = study.trials[1].params
    trial_0_log = next((trials / "trial_0").glob("*.log"))
    log_time = trial_0_log.stat().st_mtime_ns

    again = subprocess.run(argv, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "holds 2 of its 4 trials" in again.stdout and "trial 1 was interrupted" in again.stdout, again.stdout
    study = optuna.load_study(study_name="resumed", storage=storage)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE"], states
    assert study.trials[2].params == interrupted_params and study.trials[2].user_attrs["retry_of"] == 1
    assert trial_0_log.stat().st_mtime_ns == log_time and len(list((trials / "trial_0" / "runs").iterdir())) == 1
    assert sorted(p.name for p in trials.iterdir()) == [f"trial_{n}" for n in range(5)]

    # Once more: the study holds its 4 trials; nothing is run.
    done = subprocess.run(argv, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "holds 4 of its 4 trials" in done.stdout, done.stdout + done.stderr
    assert len(optuna.load_study(study_name="resumed", storage=storage).trials) == 5


def test_ctrl_c_on_the_tuner_queues_its_trial_again_in_one_line(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    argv = [sys.executable, "-m", "cleanrl_utils.tuner", "--script", str(ECHO), "--target-scores", "CartPole-v1"]
    argv += ["--param", "x=uniform:0,1", "--fixed=--sleep 2", "--num-trials", "2", "--storage", storage]
    argv += ["--study-name", "stopped", "--workdir", "tuning"]
    process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # Ctrl-C as in a terminal: SIGINT at its default even when pytest itself was started in the background by
        # a non-interactive shell (which starts it with SIGINT ignored, so no KeyboardInterrupt would ever come)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "tuning" / "stopped" / "trial_0").glob("*.log")):
        assert process.poll() is None and time.monotonic() < deadline, "trial 0 did not start"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the tuner and its run
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, out + err
    assert err.strip().splitlines() == [
        "interrupted: trial 0 is queued again; run the same command to continue the study"
    ]
    trials = optuna.load_study(study_name="stopped", storage=storage).trials
    assert [(t.state.name, t.user_attrs.get("retry_of")) for t in trials] == [("FAIL", None), ("WAITING", 0)]
    assert trials[1].system_attrs["fixed_params"] == trials[0].params  # what the retry will suggest


def test_a_benchmark_stopped_with_sigterm_lets_its_run_checkpoint_and_leaves_the_table_alone(tmp_path):
    # SIGTERM to the runner's process group (kill -TERM -- -PGID): the runner must outlive its run, reading its
    # output, or the run's next print into the closed pipe would end it before its checkpoint.
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'cleanrl' / 'ppo.py'))} --total-timesteps 500000"
    argv = [sys.executable, "-m", "cleanrl_utils.benchmark", "--env-ids", "CartPole-v1", "--command", command]
    argv += ["--num-seeds", "2", "--output", "results/ppo"]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ppo.md").write_text("the table of an earlier, whole benchmark\n")
    runs = tmp_path / "runs"
    process = start(argv, tmp_path, tmp_path / "output.txt")
    deadline = time.monotonic() + 120
    while not any(d.glob("events.out.tfevents.*") for d in seed_runs(runs, 1)):
        assert process.poll() is None and time.monotonic() < deadline, "seed 1's run did not start"
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM
    log = (tmp_path / "output.txt").read_text()
    (run,) = seed_runs(runs, 1)
    assert (run / "checkpoint.pt").is_file() and not (run / "finished.json").exists(), log
    assert "SIGTERM: checkpoint written to" in log and "SIGTERM: no further job starts" in log, log
    assert "[CartPole-v1 seed 1] ended by SIGTERM after" in log, log  # the shell around it, not a failure
    assert not seed_runs(runs, 2), log  # seed 2 never started
    assert log.strip().splitlines()[-1] == (
        "stopped by SIGTERM, no table made (--output is left as it was); unfinished: CartPole-v1 seed 1, "
        "CartPole-v1 seed 2. The same command continues from here."
    )
    assert (tmp_path / "results" / "ppo.md").read_text() == "the table of an earlier, whole benchmark\n"
