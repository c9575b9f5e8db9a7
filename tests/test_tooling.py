"""The experiment tooling: benchmark runner, plots, tuner, evaluation entry point, bad input.

Training runs are tiny and run one at a time (the CI machine has two cores). The real ppo.py
runs of the benchmark test are shared, through a module fixture, by the plot and evaluate tests.
tests/flag_echo.py is a test double of a training script that records the argv it received and
writes charts/episodic_return = --x + seed, so the tuner and pool tests do not depend on training.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_bad_input, read_scalars, run_dirs, run_script, script_env
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils import benchmark, evaluate, plot, results, tuner

ECHO = ROOT / "tests" / "flag_echo.py"
PY = shlex.quote(sys.executable)
TINY_PPO = "--total-timesteps 1024 --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1"
PPO_TINY_PARAMS = {"total-timesteps": 1024, "num-envs": 2, "num-steps": 64, "num-minibatches": 2}


def run_module(module: str, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def call_main(main, argv: list[str], capsys) -> subprocess.CompletedProcess:
    """Run a tool's main() in this process (no interpreter start-up) and report it like a subprocess."""
    try:
        main(argv)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code if isinstance(exit_info.code, int) else 1
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


def fake_run(
    root: Path, env_id: str, exp_name: str, seed: int, points: list[tuple[int, float]], tag="charts/episodic_return"
) -> Path:
    run_dir = root / f"{env_id}__{exp_name}__{seed}__{1_700_000_000 + seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"env_id": env_id, "exp_name": exp_name, "seed": seed}))
    writer = SummaryWriter(str(run_dir))
    for i, (step, value) in enumerate(points):
        writer.add_scalar(tag, value, step, walltime=1000.0 + i)
    writer.close()
    return run_dir


# ---------------------------------------------------------------------------- benchmark


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    """The benchmark runner end to end: 2 environments x 2 seeds of ppo.py, one at a time. The
    runner itself runs in this process (torch is already imported); the four runs are subprocesses."""
    cwd = tmp_path_factory.mktemp("benchmark")
    command = f"{PY} {shlex.quote(str(ROOT / 'cleanrl' / 'ppo.py'))} {TINY_PPO} --save-model --eval-episodes 1"
    argv = [
        "--env-ids",
        "CartPole-v1",
        "Acrobot-v1",
        "--command",
        command,
        "--num-seeds",
        "2",
        "--workers",
        "1",
        "--output",
        "results/ppo",
    ]
    out, err, code = io.StringIO(), io.StringIO(), 0
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            benchmark.main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    finally:
        os.chdir(previous)
    return cwd, subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def test_benchmark_runs_every_env_and_seed_and_tabulates_them(ppo_runs):
    cwd, result = ppo_runs
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    runs = run_dirs(cwd)
    made = sorted(
        (json.loads((d / "args.json").read_text())["env_id"], json.loads((d / "args.json").read_text())["seed"])
        for d in runs
    )
    assert made == [("Acrobot-v1", 1), ("Acrobot-v1", 2), ("CartPole-v1", 1), ("CartPole-v1", 2)]  # 4 runs
    # The table holds one row per script x environment, each aggregating its 2 seeds.
    with open(cwd / "results" / "ppo.csv") as f:
        rows = {row["environment"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["Acrobot-v1", "CartPole-v1"]
    for env_id, row in rows.items():
        assert (row["script"], row["seeds"], row["steps"]) == ("ppo.py", "1 2", "1024")
        # By hand: each run's mean of its last 100 episodic returns, then mean +- std across the seeds.
        scores = [
            np.mean([v for _, v in read_scalars(d)["charts/episodic_return"]][-100:])
            for d in runs
            if d.name.startswith(env_id + "__")
        ]
        assert row["return"] == f"{np.mean(scores):.2f} +- {np.std(scores):.2f}"
    assert "| ppo.py | CartPole-v1 | 1024 | 1 2 |" in (cwd / "results" / "ppo.md").read_text()
    assert "4 runs, 2 rows" in result.stdout


def test_benchmark_workers_0_only_prints_the_commands(tmp_path):
    result = run_module(
        "cleanrl_utils.benchmark",
        "--env-ids",
        "CartPole-v1",
        "Acrobot-v1",
        "--command",
        "uv run python cleanrl/ppo.py --total-timesteps 5000",
        "--num-seeds",
        "2",
        "--workers",
        "0",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"uv run python cleanrl/ppo.py --total-timesteps 5000 --env-id {env_id} --seed {seed}"
        for env_id in ("CartPole-v1", "Acrobot-v1")
        for seed in (1, 2)
    ]
    assert run_dirs(tmp_path) == []


def test_benchmark_pool_runs_commands_at_once_and_reports_failures(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    command = f"{PY} {shlex.quote(str(ECHO))} --x 5 --sleep 1"
    result = call_main(
        benchmark.main,
        ["--env-ids", "CartPole-v1", "--command", command, "--num-seeds", "2", "--workers", "2", "--output", "table"],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    spans = [json.loads((d / "args.json").read_text()) for d in run_dirs(tmp_path)]
    assert len(spans) == 2
    assert max(s["started"] for s in spans) < min(s["finished"] for s in spans), "the two workers did not overlap"
    # flag_echo's return is x + seed: 6 and 7, so 6.50 +- 0.50 across the two seeds.
    assert "| flag_echo.py | CartPole-v1 | 30 | 1 2 | 6.50 +- 0.50 |" in (tmp_path / "table.md").read_text()

    result = call_main(
        benchmark.main,
        ["--env-ids", "Acrobot-v1", "--command", f"{PY} {shlex.quote(str(ECHO))} --fail", "--num-seeds", "1"],
        capsys,
    )
    assert result.returncode == 1
    assert "FAILED (Acrobot-v1 seed 1, exit code 3)" in result.stderr and "asked to fail" in result.stderr


SLURM_TEMPLATE = """#!/bin/bash
#SBATCH --job-name={{job_name}}
#SBATCH --array={{array}}
#SBATCH --output=slurm/%x-%A_%a.out
#SBATCH --gpus-per-task=1
cd {{workdir}}
{{commands}}
"""


def test_slurm_template_renders_a_job_array(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(benchmark.shutil, "which", lambda name: None)  # as on a machine without SLURM
    (tmp_path / "template").write_text(SLURM_TEMPLATE)
    result = call_main(
        benchmark.main,
        [
            "--env-ids",
            "CartPole-v1",
            "Acrobot-v1",
            "--command",
            "echo cleanrl/ppo.py --lr 'a b'",
            "--num-seeds",
            "2",
            "--slurm-template",
            "template",
            "--slurm-script",
            "job.sbatch",
        ],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --array=0-3\n" in script and "#SBATCH --job-name=ppo\n" in script
    commands = [
        f"echo cleanrl/ppo.py --lr 'a b' --env-id {env_id} --seed {seed}"
        for env_id in ("CartPole-v1", "Acrobot-v1")
        for seed in (1, 2)
    ]
    for command in commands:
        assert shlex.quote(command) in script
    assert subprocess.run(["bash", "-n", "job.sbatch"], capture_output=True).returncode == 0
    # Array task 2 runs the third command, and only it.
    task = subprocess.run(
        ["bash", "job.sbatch"], env={**script_env(), "SLURM_ARRAY_TASK_ID": "2"}, capture_output=True, text=True
    )
    assert task.stdout == "cleanrl/ppo.py --lr a b --env-id Acrobot-v1 --seed 1\n", task.stderr
    assert "sbatch job.sbatch" in result.stdout and "cleanrl_utils.results runs/CartPole-v1__ppo__*" in result.stdout
    assert run_dirs(tmp_path) == []


# ---------------------------------------------------------------------------- plot


def test_plot_aggregates_match_hand_computed_numbers():
    mean, std = plot.mean_std(np.array([[1.0, 2.0], [3.0, 6.0]]))
    assert mean.tolist() == [2.0, 4.0] and std.tolist() == [1.0, 2.0]  # population std (ddof 0)
    assert plot.iqm(np.array([1.0, 2.0, 3.0, 100.0])) == 2.5  # drop 1 and 100, average 2 and 3
    assert plot.iqm(np.arange(1.0, 9.0)) == 4.5  # n=8: drop 2 at each end, mean of 3, 4, 5, 6
    assert plot.iqm(np.array([3.0, 1.0, 2.0])) == 2.0  # n=3: floor(3/4) = 0 dropped, the plain mean
    assert plot.iqm(np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, 0.0]])).tolist() == [2.5, 15.0]

    # Two runs [0, 10]: the resamples are (0,0), (0,10), (10,0), (10,10), so the IQM (= mean for
    # n=2) takes 0, 5, 5, 10 with probabilities 1/4, 1/2, 1/4: the 95% interval is exactly [0, 10].
    low, high = plot.bootstrap_ci(np.array([0.0, 10.0]), samples=2000, seed=0)
    assert (low, high) == (0.0, 10.0)

    # Five runs: enumerate all 5^5 equally likely resamples for the exact bootstrap distribution.
    values = np.array([0.0, 1.0, 2.0, 4.0, 8.0])
    assert plot.iqm(values) == pytest.approx(7 / 3)
    exact = [plot.iqm(values[list(idx)]) for idx in itertools.product(range(5), repeat=5)]
    low, high = plot.bootstrap_ci(values, samples=20000, seed=0)
    assert np.percentile(exact, 1.5) <= low <= np.percentile(exact, 3.5)
    assert np.percentile(exact, 96.5) <= high <= np.percentile(exact, 98.5)
    assert low < 7 / 3 < high and values.min() <= low and high <= values.max()
    assert (low, high) == (pytest.approx(1 / 3), pytest.approx(20 / 3))
    assert plot.bootstrap_ci(values, samples=500, seed=3) == plot.bootstrap_ci(values, samples=500, seed=3)
    # A curve: one resample of the runs serves every point, so the interval at each point is the one of that point's
    # values alone (same seed), and a point at twice the values gets exactly twice the interval.
    curve_low, curve_high = plot.bootstrap_ci(np.stack([values, 2 * values], axis=1), samples=20000, seed=0)
    assert curve_low.tolist() == [low, 2 * low] and curve_high.tolist() == [high, 2 * high]
    one_low, one_high = plot.bootstrap_ci(np.array([[1.0, 2.0]]))  # one run: every resample is that run
    assert one_low.tolist() == one_high.tolist() == [1.0, 2.0]

    # TensorBoard's debiased EMA: [0, 2] with weight 0.5 -> 0, (0.5 * 2) / (1 - 0.25) = 4/3.
    assert plot.smooth(np.array([0.0, 2.0]), 0.5) == pytest.approx([0.0, 4 / 3])
    # Interpolation onto the grid that every seed covers; two values at one step are averaged.
    grid = plot.common_grid([np.array([0.0, 100.0]), np.array([10.0, 90.0])], 5)
    assert grid.tolist() == [10.0, 30.0, 50.0, 70.0, 90.0]
    assert plot.interpolate(
        np.array([0, 10, 10, 20]), np.array([0.0, 2.0, 4.0, 6.0]), np.array([5.0, 15.0])
    ).tolist() == [1.5, 4.5]


def test_results_adds_the_interquartile_mean_of_the_seeds_from_four_seeds_on(tmp_path, capsys):
    # Five seeds scoring 1, 2, 3, 4 and 100: the IQM drops one at each end (mean of 2, 3, 4 = 3).
    five = [
        fake_run(tmp_path, "CartPole-v1", "dqn", seed, [(10, score)]) for seed, score in enumerate([1, 2, 3, 4, 100])
    ]
    three = [fake_run(tmp_path, "Acrobot-v1", "dqn", seed, [(10, -float(seed))]) for seed in (1, 2, 3)]
    result = call_main(results.main, [*map(str, five + three), "--output", str(tmp_path / "table")], capsys)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "table.csv") as f:
        rows = {row["environment"]: row for row in csv.DictReader(f)}
    assert rows["CartPole-v1"]["return IQM"] == "3.00" and rows["CartPole-v1"]["return"] == "22.00 +- 39.01"
    assert rows["Acrobot-v1"]["return IQM"] == ""  # three seeds: no IQM
    assert "Return IQM: the interquartile mean" in (tmp_path / "table.md").read_text()


def test_results_scores_an_environment_on_its_last_n_episodes(tmp_path, capsys):
    # Pendulum: 20 episodes, the first 15 of the warm-up; CartPole keeps the default window of 100.
    pendulum = [
        fake_run(
            tmp_path,
            "Pendulum-v1",
            "sac",
            seed,
            [(200 * i, -1200.0 if i < 15 else -150.0 - seed) for i in range(1, 21)],
        )
        for seed in (1, 2)
    ]
    cartpole = fake_run(tmp_path, "CartPole-v1", "sac", 1, [(i, float(i)) for i in range(1, 151)])
    result = call_main(
        results.main,
        [*map(str, pendulum), str(cartpole), "--last-episodes", "Pendulum-v1=5", "--output", str(tmp_path / "table")],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "table.csv") as f:
        rows = {row["environment"]: row for row in csv.DictReader(f)}
    assert rows["Pendulum-v1"]["return"] == "-151.50 +- 0.50" and rows["Pendulum-v1"]["scored episodes"] == "last 5"
    assert rows["CartPole-v1"]["return"] == f"{np.mean(range(51, 151)):.2f} +- 0.00"  # episodes 51-150
    assert rows["CartPole-v1"]["scored episodes"] == "last 100"
    bad = call_main(
        results.main, [str(cartpole), "--last-episodes", "Pendulum-v1=none", "--output", str(tmp_path / "t")], capsys
    )
    assert (
        bad.returncode == 2
        and bad.stderr.strip()
        == "error: --last-episodes takes a positive count or ENV_ID=COUNT, got 'Pendulum-v1=none'"
    )


def test_run_directories_are_found_below_a_parent_but_not_inside_a_run(tmp_path):
    a = fake_run(tmp_path / "runs", "CartPole-v1", "ppo", 1, [(10, 1.0)])
    b = fake_run(tmp_path / "runs" / "tuner" / "trial_0" / "runs", "CartPole-v1", "ppo", 2, [(10, 1.0)])
    copy = a / "wandb" / "offline-run-1" / "files"  # W&B keeps a copy of the events in the run directory
    copy.mkdir(parents=True)
    shutil.copy(next(a.glob("events.out.tfevents.*")), copy)
    assert plot.find_run_dirs([tmp_path / "runs"]) == [a, b]
    assert plot.find_run_dirs([a, tmp_path / "runs"]) == [a, b]


def test_plot_writes_png_of_real_runs_with_several_algorithms(ppo_runs, tmp_path, capsys):
    cwd, _ = ppo_runs
    # A second "algorithm" on CartPole beside the real ppo runs, to share the figure.
    for seed in (1, 2):
        fake_run(cwd / "other_runs", "CartPole-v1", "baseline", seed, [(0, 10.0), (512, 20.0 + seed), (1024, 30.0)])
    result = run_module(
        "cleanrl_utils.plot",
        "runs",
        "other_runs",
        "--band",
        "iqm",
        "--smoothing",
        "0.3",
        "--output",
        str(tmp_path / "curves.png"),
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    image = __import__("matplotlib.image", fromlist=["imread"]).imread(tmp_path / "curves.png")
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert "6 runs, 2 environment(s)" in result.stdout

    curves = plot.load_curves([cwd / "runs", cwd / "other_runs"], "charts/episodic_return")
    fig = plot.make_figure(curves, band="std")
    (acrobot_steps, acrobot_time), (cartpole_steps, cartpole_time) = np.array(fig.axes).reshape(2, 2)
    assert acrobot_steps.get_title() == "Acrobot-v1" and cartpole_steps.get_xlabel() == "environment steps"
    assert [line.get_label() for line in cartpole_steps.get_lines()] == ["baseline (2 seeds)", "ppo (2 seeds)"]
    assert [line.get_label() for line in acrobot_time.get_lines()] == ["ppo (2 seeds)"]
    assert cartpole_time.get_xlabel().startswith("wall time")
    # The baseline line is the mean of its two seeds on the common grid: at step 512, 21.5.
    x, y = cartpole_steps.get_lines()[0].get_data()
    assert y[np.argmin(abs(x - 512))] == pytest.approx(21.5, abs=0.1)


def test_wall_time_of_a_resumed_run_leaves_out_the_wait_between_its_processes(tmp_path):
    """Stopped at step 200 (t = 1100 s), resumed an hour later from its checkpoint at step 100: the plot's wall-time
    axis and the table's wall time both count 100 s + 30 s of running, not the hour."""
    from cleanrl_utils import plot, results

    run_dir = tmp_path / "Hopper-v5__crossq__1__1700000000"
    run_dir.mkdir()
    (run_dir / "args.json").write_text(json.dumps({"env_id": "Hopper-v5", "exp_name": "crossq", "seed": 1}))
    writer = SummaryWriter(str(run_dir), filename_suffix=".first")  # scalars 50 s apart
    for step, value, t in [(0, 1.0, 1000.0), (100, 2.0, 1050.0), (200, 3.0, 1100.0)]:
        writer.add_scalar("charts/episodic_return", value, step, walltime=t)
    writer.close()
    writer = SummaryWriter(str(run_dir), filename_suffix=".second", purge_step=101)  # as cleanrl_utils.run resumes
    for step, value, t in [(150, 2.5, 4700.0), (300, 4.0, 4730.0)]:
        writer.add_scalar("charts/episodic_return", value, step, walltime=t)
    writer.close()

    assert results.training_seconds(run_dir) == pytest.approx(130.0)
    (curve,) = plot.load_curves([run_dir], "charts/episodic_return")
    assert list(curve.steps) == [0, 100, 150, 300]  # the first process's step 200 superseded by the resume
    assert curve.seconds == pytest.approx([0.0, 50.0, 100.0, 130.0])


# ---------------------------------------------------------------------------- tuner


def test_tuner_passes_every_suggested_flag_the_first_included(tmp_path):
    assert tuner.to_flags({"learning_rate": 0.1, "--anneal-lr": False, "cuda": True, "x": -1}) == [
        "--learning-rate=0.1",
        "--no-anneal-lr",
        "--cuda",
        "--x=-1",
    ]
    study = tuner.Tuner(
        script=ECHO,
        target_scores={"CartPole-v1": [1.0, 2.0]},
        storage=None,
        study_name="flags",
        workdir=tmp_path,
        params_fn=lambda trial: {"x": trial.suggest_float("x", 0, 1), "y": trial.suggest_int("y", 1, 3)},
    ).tune(num_trials=1, num_seeds=1)
    (trial,) = study.trials
    (run_dir,) = run_dirs(tmp_path / "flags" / "trial_0")
    argv = json.loads((run_dir / "argv.json").read_text())
    assert argv == [f"--x={trial.params['x']}", f"--y={trial.params['y']}", "--env-id", "CartPole-v1", "--seed", "1"]
    # The double's return is x + seed = x + 1; normalised with [1, 2] the trial's value is x itself.
    assert trial.value == pytest.approx(trial.params["x"], abs=1e-6)


def test_tuner_study_of_ppo_completes(tmp_path):
    study = tuner.Tuner(
        script=ROOT / "cleanrl" / "ppo.py",
        target_scores={"CartPole-v1": [0, 500]},
        params_fn=lambda trial: {
            "learning-rate": trial.suggest_float("learning-rate", 1e-4, 1e-2, log=True),
            "update-epochs": trial.suggest_categorical("update-epochs", [1, 2]),
            **PPO_TINY_PARAMS,
        },
        metric_last_n_average_window=20,
        storage=f"sqlite:///{tmp_path / 'ppo.db'}",
        study_name="ppo",
        workdir=tmp_path,
        sampler=__import__("optuna").samplers.RandomSampler(seed=0),
        pruner=__import__("optuna").pruners.NopPruner(),
    ).tune(num_trials=3, num_seeds=1)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    for trial in study.trials:
        (run_dir,) = run_dirs(tmp_path / "ppo" / f"trial_{trial.number}")
        args = json.loads((run_dir / "args.json").read_text())
        assert (
            args["learning_rate"] == trial.params["learning-rate"]
            and args["update_epochs"] == trial.params["update-epochs"]
        )
        returns = [v for _, v in read_scalars(run_dir)["charts/episodic_return"]][-20:]
        assert trial.value == pytest.approx(np.mean(returns) / 500)


def test_tuner_prunes_on_intermediate_scores(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path / 'prune.db'}"
    # Made beforehand with two queued trials; the tuner loads it (load_if_exists).
    queued = optuna.create_study(study_name="prune", storage=storage, direction="maximize")
    queued.enqueue_trial({"x": 0.1})
    queued.enqueue_trial({"x": 0.9})
    study = tuner.Tuner(
        script=ECHO,
        target_scores={"CartPole-v1": None, "Acrobot-v1": None},
        storage=storage,
        study_name="prune",
        workdir=tmp_path,
        params_fn=lambda trial: {"x": trial.suggest_float("x", 0, 1)},
        pruner=optuna.pruners.ThresholdPruner(lower=1.5),
    ).tune(num_trials=2, num_seeds=1)
    low, high = study.trials
    # Returns are x + seed: 1.1 after the first environment is below 1.5, so that trial stops there.
    assert low.state.name == "PRUNED" and list(low.intermediate_values) == [0]
    assert high.state.name == "COMPLETE" and list(high.intermediate_values) == [0, 1]
    assert high.value == pytest.approx(1.9, abs=1e-6)
    assert len(list((tmp_path / "prune" / "trial_0").glob("*.log"))) == 1


def test_two_tuner_processes_share_one_sqlite_study(tmp_path):
    command = [
        sys.executable,
        "-m",
        "cleanrl_utils.tuner",
        "--script",
        str(ECHO),
        "--target-scores",
        "CartPole-v1=0,2",
        "--param",
        "x=uniform:0,1",
        "--num-trials",
        "6",
        "--pruner",
        "none",
        "--storage",
        f"sqlite:///{tmp_path / 'shared.db'}",
        "--study-name",
        "shared",
        "--workdir",
        str(tmp_path / "tuning"),
    ]
    processes = [
        subprocess.Popen(
            command, cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err
        assert out.count("finished:") >= 1, out
    import optuna

    study = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    trials = [(t.number, t.state.name, t.user_attrs) for t in study.trials]
    assert sum(out.count("finished:") for out, _ in outputs) == 6, (outputs, trials)  # --num-trials: the study's size
    complete = [t.number for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == 6, [(t.number, t.state.name) for t in study.trials]
    # One more, not run, where both processes asked for the last trial at the same moment.
    assert all(t.user_attrs.get("surplus") for t in study.trials if t.number not in complete)
    assert sorted(p.name for p in (tmp_path / "tuning" / "shared").iterdir()) == [f"trial_{n}" for n in complete]


# ---------------------------------------------------------------------------- evaluate


def test_evaluate_reloads_a_ppo_model_and_captures_video(ppo_runs, tmp_path, capsys, monkeypatch):
    cwd, _ = ppo_runs
    run_dir = next(d for d in run_dirs(cwd) if d.name.startswith("CartPole-v1__ppo__1__"))
    result = call_main(evaluate.main, [str(run_dir), "--episodes", "3", "--seed", "4", "--no-cuda"], capsys)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first.startswith("ppo.py on CartPole-v1: episodic returns ")
    returns = [float(r) for r in first.split("returns ")[1].split(", ")]
    assert len(returns) == 3 and all(r > 0 for r in returns)
    assert second == f"mean {np.mean(returns):.2f} +- std {np.std(returns):.2f} over 3 episodes"

    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    model = run_dir / "ppo.cleanrl_model"
    result = call_main(
        evaluate.main,
        [str(model), "--episodes", "1", "--capture-video", "--video-dir", str(tmp_path / "videos")],
        capsys,
    )
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "videos").glob("*.mp4")), "no video in the given folder"
    result = call_main(evaluate.main, [str(run_dir), "--episodes", "1", "--capture-video"], capsys)
    assert result.returncode == 0, result.stderr
    assert list((run_dir / "videos" / "evaluate").glob("*.mp4")), "no video under the run directory"


@pytest.mark.skipif(not (ROOT / "cleanrl" / "dqn.py").exists(), reason="cleanrl/dqn.py does not exist yet")
def test_evaluate_reloads_a_dqn_model(workdir, capsys):
    result = run_script(
        "dqn.py",
        "--total-timesteps",
        "300",
        "--learning-starts",
        "100",
        "--buffer-size",
        "500",
        "--batch-size",
        "16",
        "--save-model",
        "--eval-episodes",
        "1",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    result = call_main(evaluate.main, [str(run_dir), "--episodes", "2", "--no-cuda"], capsys)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("dqn.py on CartPole-v1: episodic returns ") and "over 2 episodes" in result.stdout


# ---------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_without_traceback(tmp_path, capsys, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    inputs = tmp_path / "inputs"
    empty = inputs / "empty"
    empty.mkdir(parents=True)
    run_dir = fake_run(inputs, "CartPole-v1", "ppo", 1, [(10, 1.0), (20, 2.0)])
    (inputs / "text.cleanrl_model").write_text("not a model")
    checkpoint_file = inputs / "checkpoint.pt"
    torch.save({"format": "cleanrl-checkpoint-v2", "script": "ppo"}, checkpoint_file)
    unknown_script = inputs / "mystery.cleanrl_model"
    torch.save({"format": "cleanrl-model-v2", "script": "mystery", "env_id": "CartPole-v1"}, unknown_script)

    # The entry points themselves, in subprocesses.
    assert_bad_input(run_module("cleanrl_utils.plot", str(empty), cwd=cwd), cwd, "no TensorBoard events")
    assert_bad_input(
        run_module("cleanrl_utils.evaluate", str(inputs / "text.cleanrl_model"), cwd=cwd),
        cwd,
        "not a cleanrl saved model",
    )

    cases = [
        (
            plot.main,
            [str(run_dir), "--metric", "charts/nope"],
            ["no run has the metric 'charts/nope'", "known: charts/episodic_return"],
        ),
        (plot.main, [str(inputs / "missing")], ["no such directory"]),
        (evaluate.main, [str(run_dir)], ["no *.cleanrl_model file"]),
        (evaluate.main, [str(checkpoint_file)], ["a training checkpoint, not a saved model"]),
        (evaluate.main, [str(unknown_script)], ["saved by mystery.py", "no ", "cleanrl/mystery.py"]),
        (evaluate.main, [str(unknown_script), "--episodes", "0"], ["--episodes must be positive"]),
        (
            benchmark.main,
            ["--env-ids", "CartPole-v1", "--command", "python x.py", "--slurm-template", str(inputs / "none")],
            ["no such file"],
        ),
        (
            benchmark.main,
            ["--env-ids", "CartPole-v1", "--command", "python x.py", "--num-seeds", "0"],
            ["--num-seeds must be positive"],
        ),
    ]
    (inputs / "template").write_text("#SBATCH --array={{array}}\n{{commands}}\n{{partition}}\n")
    cases.append(
        (
            benchmark.main,
            ["--env-ids", "CartPole-v1", "--command", "python x.py", "--slurm-template", str(inputs / "template")],
            ["unknown placeholder {{partition}}"],
        )
    )
    cases.append(
        (
            tuner.main,
            ["--script", str(inputs / "nope.py"), "--target-scores", "CartPole-v1", "--study-name", "s"],
            ["no such file"],
        )
    )
    cases.append(
        (
            tuner.main,
            ["--script", str(ECHO), "--target-scores", "CartPole-v1", "--study-name", "s", "--param", "x=normal:0"],
            ["--param 'x=normal:0'"],
        )
    )
    monkeypatch.chdir(cwd)
    for main, argv, fragments in cases:
        assert_bad_input(call_main(main, argv, capsys), cwd, *fragments)


def test_tuner_unknown_metric_stops_the_study_in_one_line(tmp_path, capsys):
    study_tuner = tuner.Tuner(
        script=ECHO,
        target_scores={"CartPole-v1": None},
        params_fn=lambda trial: {"x": trial.suggest_float("x", 0, 1)},
        metric="charts/nope",
        storage=f"sqlite:///{tmp_path / 'm.db'}",
        study_name="m",
        workdir=tmp_path / "tuning",
    )
    result = call_main(lambda argv: study_tuner.tune(num_trials=3, num_seeds=1), [], capsys)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "unknown metric 'charts/nope'" in lines[0] and "known: charts/episodic_return" in lines[0]
    import optuna

    study = optuna.load_study(study_name="m", storage=f"sqlite:///{tmp_path / 'm.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL"]  # stopped after the first trial, marked failed


# ---------------------------------------------------------------------------- time split


def test_time_split_attributes_main_thread_samples_to_the_parts_of_the_loop(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("time_split", ROOT / "benchmark" / "time_split.py")
    time_split = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(time_split)
    script = tmp_path / "toy.py"
    script.write_text(
        "def act(x):\n"  # 1
        "    return x\n"  # 2
        "for iteration in range(3):\n"  # 3
        "    for step in range(args.num_steps):\n"  # 4
        "        action = act(obs)\n"  # 5
        "        obs = envs.step(action)\n"  # 6
        "        run.log_episodes(step, obs)\n"  # 7
        "    advantages = gae()\n"  # 8
        "    for epoch in range(args.update_epochs):\n"  # 9
        "        loss.backward()\n"  # 10
        "    run.log(step, {})\n"  # 11
    )
    profile = "\n".join(
        [
            "thread (1): MainThread;<module> (toy.py:6);step (vector_env.py:80) 7",  # inside envs.step
            "thread (1): MainThread;<module> (toy.py:5);act (toy.py:2) 3",  # the outer script line decides
            "thread (1): MainThread;<module> (toy.py:7) 1",
            "thread (1): MainThread;<module> (toy.py:8) 2",
            "thread (1): MainThread;<module> (toy.py:10);backward (torch/_tensor.py:600) 20",
            "thread (1): MainThread;<module> (importlib.py:1) 4",  # no script frame: start-up
            "thread (2): Thread-1 (writer);run (threading.py:982) 500",  # other threads do not count
        ]
    )
    counts = time_split.split(profile, script)
    assert counts == {
        "environment step": 7,
        "rollout: inference and storage": 3,
        "logging, set-up and evaluation": 5,
        "advantages and batch": 2,
        "update": 20,
    }
    assert "| update | 0.4 | 54.1% |" in time_split.table(counts, rate=50)
