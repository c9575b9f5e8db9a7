"""cleanrl_utils: atomic checkpoint files, the progress line, env-id suggestions, result tables."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils import archive, checkpoint, errors, progress, results


def test_save_atomic_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic({"step": 1}, path)

    def crash(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save_atomic({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # the torn temporary file is removed
    checkpoint.save_atomic({"step": 3}, path)
    assert torch.load(path, weights_only=False) == {"step": 3}


def test_save_atomic_writes_a_mostly_empty_buffer_view_without_its_empty_rows(tmp_path):
    """torch.save writes a view's whole storage: 100 filled rows of a 100k-row buffer would take 4 MB."""
    buffer = torch.arange(100_000 * 10, dtype=torch.float32).view(100_000, 10)
    model = torch.nn.Linear(3, 2)
    state = {"buffer": {"data": buffer[:100], "pos": 100}, "model": model.state_dict(), "rows": [buffer[:5], 7]}
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_atomic(state, path)
    assert path.stat().st_size < 20_000
    loaded = torch.load(path, weights_only=False)
    torch.testing.assert_close(loaded["buffer"]["data"], buffer[:100], rtol=0, atol=0)
    torch.testing.assert_close(loaded["rows"][0], buffer[:5], rtol=0, atol=0)
    assert loaded["buffer"]["pos"] == 100 and loaded["rows"][1] == 7
    assert loaded["model"]._metadata == model.state_dict()._metadata  # the state_dict's version metadata kept
    assert state["buffer"]["data"].data_ptr() == buffer.data_ptr()  # the caller's objects are not changed
    half_full = buffer[:60_000]  # past half full: written as it is (a copy would cost more memory than it saves)
    assert checkpoint.without_spare_storage(half_full) is half_full


@dataclass
class FakeArgs:
    exp_name: str = "ppo"
    env_id: str = "CartPole-v1"
    seed: int = 1
    learning_rate: float = 0.1
    resume: str | None = None


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    checkpoint.save_checkpoint(tmp_path / "c.pt", FakeArgs(), "ppo", global_step=5)
    expected = torch.rand(3)
    torch.manual_seed(123)
    loaded = checkpoint.load_checkpoint(tmp_path / "c.pt", FakeArgs(), "ppo")
    checkpoint.restore_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3), expected)
    assert loaded["global_step"] == 5


def test_load_checkpoint_refuses_other_arguments(tmp_path, capsys):
    checkpoint.save_checkpoint(tmp_path / "c.pt", FakeArgs(), "ppo")
    with pytest.raises(SystemExit) as exit_info:
        checkpoint.load_checkpoint(tmp_path / "c.pt", FakeArgs(learning_rate=0.2), "ppo")
    assert exit_info.value.code == errors.EXIT_BAD_INPUT
    assert "--learning-rate is 0.2 but the checkpointed run used 0.1" in capsys.readouterr().err
    # Operational flags such as --resume may differ.
    checkpoint.load_checkpoint(tmp_path / "c.pt", FakeArgs(resume="somewhere"), "ppo")


def test_identity_is_the_script_file_not_the_exp_name(tmp_path, capsys):
    # Saved by dqn.py under --exp-name ppo: still dqn's, and refused by ppo.py.
    checkpoint.save_model(tmp_path / "m.cleanrl_model", FakeArgs(exp_name="ppo"), "/somewhere/dqn.py", weights={})
    assert checkpoint.load_model(tmp_path / "m.cleanrl_model", "/elsewhere/dqn.py")["script"] == "dqn"
    with pytest.raises(SystemExit):
        checkpoint.load_model(tmp_path / "m.cleanrl_model", "/somewhere/ppo.py")
    assert "saved by dqn.py, not ppo.py" in capsys.readouterr().err
    checkpoint.save_checkpoint(tmp_path / "c.pt", FakeArgs(exp_name="ppo"), "dqn")
    with pytest.raises(SystemExit):
        checkpoint.load_checkpoint(tmp_path / "c.pt", FakeArgs(exp_name="ppo"), "ppo")
    assert "written by dqn.py, not ppo.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a model is not a checkpoint
        checkpoint.load_checkpoint(tmp_path / "m.cleanrl_model", FakeArgs(), "dqn")
    assert "a saved model, not a checkpoint" in capsys.readouterr().err


@dataclass
class RunArgs:
    exp_name: str = "fake"
    env_id: str = "CartPole-v1"
    seed: int = 1
    torch_deterministic: bool = True
    cuda: bool = False
    track: bool = False
    save_model: bool = False
    checkpoint_every: int = 100
    resume: str | None = None
    total_timesteps: int = 1000


def test_run_logs_with_one_read_checkpoints_on_schedule_and_stops_on_a_nan_loss(tmp_path, monkeypatch, capsys):
    from cleanrl_utils.run import Run

    run = Run(RunArgs(), tmp_path / "fake.py", run_dir=tmp_path / "run")
    state = {"step": 0}
    run.begin(lambda: {"global_step": state["step"], "weights": torch.ones(2) * state["step"]})
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or original(t))
    values = run.log(10, {"losses/a_loss": torch.tensor(1.5), "losses/b": torch.tensor([2.0]), "charts/c": 3})
    monkeypatch.undo()
    assert values == {"losses/a_loss": 1.5, "losses/b": 2.0, "charts/c": 3.0} and reads == [torch.Size([2])]
    for state["step"] in (50, 99):
        run.end_iteration(state["step"])
    assert not (run.dir / "checkpoint.pt").exists()
    state["step"] = 130
    run.end_iteration(130)  # crossed 100: written; the next one is due at 200
    assert torch.load(run.dir / "checkpoint.pt", weights_only=False)["global_step"] == 130
    state["step"] = 190
    run.end_iteration(190)
    assert torch.load(run.dir / "checkpoint.pt", weights_only=False)["global_step"] == 130
    run.log(192, {"losses/explained_variance": float("nan"), "losses/entropy": torch.tensor(float("inf"))})
    state["step"] = 195
    with pytest.raises(SystemExit) as exit_info:
        run.log(195, {"losses/td_loss": torch.tensor(float("nan")), "losses/explained_variance": float("nan")})
    assert exit_info.value.code == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "losses/td_loss is nan at step 195; checkpoint written to" in err[0]
    saved = torch.load(run.dir / "checkpoint.pt", weights_only=False)
    assert (
        saved["script"] == "fake" and saved["global_step"] == 195 and torch.equal(saved["weights"], torch.ones(2) * 195)
    )
    run.close()


def test_a_run_that_writes_nothing_still_gathers_its_state_and_stops_when_told(tmp_path, monkeypatch, capsys):
    """Run(writes=False), a distributed run's ranks other than 0: no directory, no events, no checkpoint; but
    training_state() is called whenever a checkpoint is due (state gathered from every rank), a non-finite loss
    stops it, and end_iteration(stop=True) (a stop agreed with the other ranks) exits 0."""
    from cleanrl_utils.run import Run

    monkeypatch.chdir(tmp_path)
    run = Run(RunArgs(), tmp_path / "fake.py", writes=False)
    calls = []
    run.begin(lambda: calls.append(run.next_checkpoint) or {"global_step": 0})
    assert run.log(10, {"losses/a_loss": torch.tensor(1.5)}) == {"losses/a_loss": 1.5}
    run.log_episodes(10, returns=[1.0], lengths=[3])
    run.end_iteration(99)
    run.end_iteration(130)  # due: called, nothing written
    assert calls == [100]
    with pytest.raises(SystemExit) as exit_info:
        run.end_iteration(150, stop=True)
    assert exit_info.value.code == 0 and calls == [100, 200]
    with pytest.raises(SystemExit) as exit_info:
        run.log(195, {"losses/td_loss": torch.tensor(float("nan"))})
    assert exit_info.value.code == errors.EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip().splitlines() == ["error: losses/td_loss is nan at step 195"]
    run.finish(200)
    assert list(tmp_path.iterdir()) == []


def test_check_fits_refuses_what_the_device_cannot_hold(capsys):
    errors.check_fits(1_000_000, "cpu", "replay buffer", "--buffer-size")
    with pytest.raises(SystemExit):
        errors.check_fits(10**15, "cpu", "replay buffer", "--buffer-size")
    err = capsys.readouterr().err
    assert "--buffer-size: the replay buffer needs 1000000.0 GB but cpu has" in err and "lower --buffer-size" in err


def test_check_env_id_suggests_near_ids(capsys):
    errors.check_env_id("CartPole-v1")
    with pytest.raises(SystemExit):
        errors.check_env_id("cartpole-v1")
    assert "did you mean CartPole-v1" in capsys.readouterr().err


class Clock:
    """Stands in for the time module inside cleanrl_utils.progress: perf_counter() is `now`, set by the test."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_progress_line_shows_steps_sps_return_and_time_left(monkeypatch):
    monkeypatch.setattr(progress, "time", clock := Clock())
    stream = io.StringIO()  # not a tty: a log file
    bar = progress.Progress(1000, label="CartPole-v1 ppo", stream=stream)
    clock.now += 2.0
    bar.add_returns([10.0, 20.0])
    bar.update(500)
    line = stream.getvalue()
    assert line == "CartPole-v1 ppo | 500/1,000 steps (50%) | 250 SPS | return 15.0 (last 2) | 00:02 left\n"
    clock.now += 29.0
    bar.update(600)  # within the print interval (30 s): nothing new
    assert stream.getvalue() == line
    clock.now += 1.0
    bar.update(640)  # the interval has passed: a new plain line, never a carriage return
    bar.close(1010)  # the last batch of steps may pass the total
    lines = stream.getvalue().split("\n")
    assert "\r" not in stream.getvalue() and lines[-1] == "" and len(lines) == 4
    assert lines[1] == "CartPole-v1 ppo | 640/1,000 steps (64%) | 20 SPS | return 15.0 (last 2) | 00:18 left"
    assert lines[2] == "CartPole-v1 ppo | 1,010/1,000 steps (100%) | 32 SPS | return 15.0 (last 2) | 00:00 left"


def test_progress_goes_on_into_dev_null_when_its_reader_is_gone():
    # A run whose output pipe closed (`| head`, a runner killed alone) must reach its end or its checkpoint.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as stream:
        bar = progress.Progress(1000, stream=stream)
        bar.update(10)  # BrokenPipeError inside: caught
        assert os.readlink(f"/proc/self/fd/{write_end}") == os.devnull
        bar.close(1000)  # and from then on, quietly into /dev/null


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_redraws_in_place_on_a_terminal_and_counts_sps_from_the_resumed_step(monkeypatch):
    monkeypatch.setattr(progress, "time", clock := Clock())
    stream = Terminal()
    bar = progress.Progress(10_000, start_step=4_000, stream=stream)
    clock.now += 10.0
    bar.update(5_000)  # 1,000 steps in 10 s since the resume: 100 SPS; the 5,000 left take 50 s
    first = stream.getvalue()
    assert first == "\r5,000/10,000 steps (50%) | 100 SPS | return - (last 0) | 00:50 left"
    clock.now += 0.4
    bar.update(5_100)  # within the terminal's interval (0.5 s): nothing new
    assert stream.getvalue() == first
    clock.now += 0.1
    bar.add_returns([3.0])
    bar.update(6_100)
    bar.close(6_100)
    redraws = stream.getvalue()[len(first) :].split("\r")
    assert redraws[0] == "" and len(redraws) == 3  # two more redraws of the one line, then its end
    assert redraws[1] == "6,100/10,000 steps (61%) | 200 SPS | return 3.0 (last 1) | 00:19 left"
    assert redraws[2] == redraws[1] + "\n" and "\n" not in first + redraws[1]


def test_importing_run_leaves_out_the_results_tools_heavy_imports():
    # Every script imports cleanrl_utils.run (which imports cleanrl_utils.results for FINISHED_NAME): scipy.stats
    # (~0.8 s of CPU, for the IQM and its bootstrap), pandas and rliable must not come with it.
    code = "import json, sys, cleanrl_utils.run; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = set(json.loads(result.stdout))
    assert "cleanrl_utils" in imported and imported.isdisjoint({"scipy", "pandas", "rliable"})


def make_run(root: Path, env_id: str, seed: int, returns: list[float], exp_name: str = "ppo") -> Path:
    run_dir = root / f"{env_id}__{exp_name}__{seed}__0"
    run_dir.mkdir(parents=True)
    (run_dir / "args.json").write_text(json.dumps({"env_id": env_id, "exp_name": exp_name, "seed": seed}))
    writer = SummaryWriter(str(run_dir))
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, (i + 1) * 10, walltime=100.0 + i)
    writer.close()
    return run_dir


def resumed_writer(run_dir: Path, purge_step: int) -> SummaryWriter:
    """The events writer of a run resumed at `purge_step`, as a new process opens it: TensorBoard reads a directory's
    events files in name order, and a name holds the second it was made and a per-process counter, so a file made in
    the same second as the first one by the same process (counter 9 -> 10) could sort first and escape the purge."""
    time.sleep(1.01 - time.time() % 1)
    return SummaryWriter(str(run_dir), purge_step=purge_step)


def test_results_table_matches_hand_computed_numbers(tmp_path):
    # Seed 1: 150 episodes, the last 100 are all 2.0 -> score 2.0; seed 2: 4.0.
    a = make_run(tmp_path, "CartPole-v1", 1, [0.0] * 50 + [2.0] * 100)
    b = make_run(tmp_path, "CartPole-v1", 2, [4.0] * 150)
    rows = results.aggregate([results.summarize_run(a), results.summarize_run(b)])
    assert rows == [
        {
            "script": "ppo.py",
            "environment": "CartPole-v1",
            "steps": 1500,
            "seeds": "1 2",
            "return": "3.00 +- 1.00",
            "scored episodes": "last 100",
            "wall time (s)": "149",
            "SPS": "10",
        }
    ]
    results.write_tables(rows, tmp_path / "out" / "ppo", "test machine")
    assert "| ppo.py | CartPole-v1 | 1500 | 1 2 | 3.00 +- 1.00 |" in (tmp_path / "out" / "ppo.md").read_text()
    assert (tmp_path / "out" / "ppo.csv").read_text().splitlines()[0].startswith("script,environment")


def test_results_leave_the_pause_of_a_resumed_run_out_of_its_wall_time(tmp_path):
    # A run of 100 steps a second, stopped at step 500 and resumed from its checkpoint at step 400 an hour later:
    # two events files (two processes); its wall time is the sum of their spans, 49 + 59 s, not the ~3,700 s
    # from its first event to its last.
    run_dir = make_run(tmp_path, "CartPole-v1", 1, [1.0] * 50)  # steps 10 .. 500, wall times 100 .. 149
    resumed = resumed_writer(run_dir, purge_step=400)
    for i, step in enumerate(range(410, 1010, 10)):  # steps 410 .. 1000, wall times 3700 .. 3759
        resumed.add_scalar("charts/episodic_return", 3.0, step, walltime=3700.0 + i)
    resumed.close()
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2
    assert results.training_seconds(run_dir) == pytest.approx(108.0)
    (row,) = results.aggregate([results.summarize_run(run_dir)])
    assert row["steps"] == 1000 and row["wall time (s)"] == "108" and row["SPS"] == "9"


def test_archive_keeps_what_the_tables_read_and_drops_the_rest(tmp_path, capsys):
    # A resumed run (two events files) that also logged episode lengths and losses: its archived copy holds only the
    # returns, perf/ and the end events, and gives the same table row (score, steps, wall time, peak memory).
    run_dir = make_run(tmp_path / "runs", "CartPole-v1", 1, [float(i) for i in range(150)])  # steps 10 .. 1500
    writer = resumed_writer(run_dir, purge_step=1200)
    for i, step in enumerate(range(1200, 2001, 10)):
        writer.add_scalar("charts/episodic_return", 7.0, step, walltime=500.0 + i)
        writer.add_scalar("charts/episodic_length", 30.0, step, walltime=500.0 + i)
        writer.add_scalar("losses/td_loss", 0.5, step, walltime=500.0 + i)
    writer.add_scalar("perf/peak_memory_gb", 1.5, 2000, walltime=581.0)
    writer.add_scalar("losses/td_loss", 0.25, 2010, walltime=590.0)  # the largest step and the last event
    writer.close()
    with pytest.raises(SystemExit):  # not finished yet
        archive.main([str(run_dir), "--to", str(tmp_path / "kept")])
    assert "not finished" in capsys.readouterr().err and not (tmp_path / "kept").exists()
    (run_dir / results.FINISHED_NAME).write_text("{}")
    (run_dir / "checkpoint.pt").write_text("large")
    archive.main([str(tmp_path / "runs"), "--to", str(tmp_path / "kept")])
    (packed,) = (tmp_path / "kept").iterdir()  # one file per run, nothing left beside it
    assert packed.name == f"{run_dir.name}.tar.xz" and archive.archived_finished(packed)
    (copy,) = results.find_run_dirs([tmp_path / "kept"])  # the tools read a packed run as a run directory
    assert copy.name == run_dir.name and results.find_run_dirs([packed]) == [copy]
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in run_dir.iterdir() if p.suffix != ".pt")
    original, kept = results.read_summary(run_dir), results.read_summary(copy)
    assert kept == original and (kept.steps, kept.peak_memory_gb) == (2010, 1.5)
    assert kept.wall_time == pytest.approx(149.0 + 90.0)
    scalars = results.load_events(copy).Tags()["scalars"]
    assert sorted(scalars) == ["charts/episodic_return", "losses/td_loss", "perf/peak_memory_gb"]
    assert len(results.read_scalar(copy, "losses/td_loss")[0]) == 1  # only the last event of the file
    assert len(results.read_scalar(copy, "charts/episodic_return")[0]) == 119 + 81  # 1200-1500 purged
    archive.main([str(run_dir), "--to", str(tmp_path / "again")])  # the same run packs to the same bytes
    assert (tmp_path / "again" / packed.name).read_bytes() == packed.read_bytes()


def test_archive_takes_an_unfinished_run_with_its_checkpoint_only_when_asked(tmp_path, capsys):
    # A run longer than a session: archived unfinished with --unfinished (its checkpoint along, byte for byte, so that
    # another machine continues it), refused without it; one with no checkpoint is refused either way. Archived again
    # once finished, the copy drops the checkpoint and gains finished.json.
    run_dir = make_run(tmp_path / "runs", "StarpilotEasy-v0", 1, [1.0] * 20, exp_name="ppg_procgen")
    bare = make_run(tmp_path / "runs", "StarpilotEasy-v0", 2, [1.0] * 20, exp_name="ppg_procgen")
    kept = tmp_path / "kept"
    with pytest.raises(SystemExit):
        archive.main([str(run_dir), "--to", str(kept), "--unfinished"])
    assert "nothing to continue from" in capsys.readouterr().err and not kept.exists()
    (run_dir / "checkpoint.pt").write_bytes(bytes(range(256)) * 64)
    with pytest.raises(SystemExit):
        archive.main([str(run_dir), "--to", str(kept)])
    assert "not finished" in capsys.readouterr().err and not kept.exists()
    with pytest.raises(SystemExit):  # every run is checked before anything is written
        archive.main([str(run_dir), str(bare), "--to", str(kept), "--unfinished"])
    assert not kept.exists()

    archive.main([str(run_dir), "--to", str(kept), "--unfinished"])
    assert "unfinished: with its checkpoint" in capsys.readouterr().out
    packed = kept / f"{run_dir.name}.tar.xz"
    assert not archive.archived_finished(packed)
    copy = results.unpack(packed, tmp_path / "restored")
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in run_dir.iterdir())
    assert (copy / "checkpoint.pt").read_bytes() == (run_dir / "checkpoint.pt").read_bytes()
    assert not (copy / results.FINISHED_NAME).exists()
    assert results.read_summary(copy) == results.read_summary(run_dir)

    (run_dir / results.FINISHED_NAME).write_text("{}")
    archive.main([str(run_dir), "--to", str(kept)])
    assert [p.name for p in kept.iterdir()] == [packed.name] and archive.archived_finished(packed)
    copy = results.unpack(packed, tmp_path / "restored again")
    assert not (copy / "checkpoint.pt").exists() and (copy / results.FINISHED_NAME).is_file()
    assert len(list(copy.glob("events.out.tfevents.*"))) == 1


def test_results_report_the_largest_peak_memory_of_the_seeds(tmp_path):
    a = make_run(tmp_path, "MinAtar/Breakout-v1", 1, [1.0] * 10, exp_name="dqn_atari")
    b = make_run(tmp_path, "MinAtar/Breakout-v1", 2, [3.0] * 10, exp_name="dqn_atari")
    for run_dir, peaks in ((a, [0.5, 0.75]), (b, [0.6, 1.25])):
        writer = SummaryWriter(str(run_dir))
        for step, peak in enumerate(peaks):
            writer.add_scalar("perf/peak_memory_gb", peak, step * 10)
        writer.close()
    old = make_run(tmp_path, "CartPole-v1", 1, [2.0] * 10)  # logged before the column existed
    rows = results.aggregate([results.summarize_run(run) for run in (a, b, old)])
    assert [row.get("peak memory (GB)") for row in rows] == ["1.25", None]
    results.write_tables(rows, tmp_path / "out" / "mixed", "test machine")
    assert "| 1.25 |" in (tmp_path / "out" / "mixed.md").read_text()


def test_run_logs_its_peak_memory(tmp_path):
    from conftest import read_scalars

    from cleanrl_utils.run import Run

    run = Run(RunArgs(), tmp_path / "fake.py", run_dir=tmp_path / "run")
    run.begin(lambda: {"global_step": 0})
    run.log(10, {"losses/td_loss": torch.tensor(1.0)})
    run.close()
    peak = read_scalars(tmp_path / "run")["perf/peak_memory_gb"]
    # A process that imported torch holds some hundreds of MB; the host has 24 GB.
    assert len(peak) == 1 and 0.05 < peak[0][1] < 24


def test_results_mean_column_averages_a_scalar_over_each_run_then_the_seeds(tmp_path, capsys):
    for seed, lags in ((1, [0.0, 1.0, 2.0]), (2, [2.0, 2.0, 2.0])):  # run means 1 and 2
        writer = SummaryWriter(str(make_run(tmp_path / "runs", "MinAtar/Breakout-v1", seed, [1.0] * 5, "impala")))
        for step, lag in enumerate(lags):
            writer.add_scalar("charts/policy_lag", lag, step * 10)
        writer.close()
    make_run(tmp_path / "runs", "MinAtar/Breakout-v1", 1, [2.0] * 5, "ppo_atari")  # logs no policy lag
    results.main([str(tmp_path / "runs"), "--output", str(tmp_path / "out"), "--mean", "charts/policy_lag"])
    assert "| mean charts/policy_lag |" in capsys.readouterr().out
    impala, ppo = (tmp_path / "out.csv").read_text().splitlines()[1:]
    assert impala.startswith("impala.py") and impala.endswith(",1.50") and ppo.endswith(",")
    with pytest.raises(SystemExit):  # a tag no run logged: a typo, one line
        results.main([str(tmp_path / "runs"), "--output", str(tmp_path / "out"), "--mean", "charts/nothing"])
    assert "--mean charts/nothing: none of the 3 runs logged that scalar" in capsys.readouterr().err


def test_results_main_takes_a_runs_folder(tmp_path, monkeypatch):
    # `python -m cleanrl_utils.results runs` finds the run directories below the folder.
    make_run(tmp_path / "runs", "CartPole-v1", 1, [2.0] * 100)
    make_run(tmp_path / "runs", "CartPole-v1", 2, [4.0] * 100)
    results.main([str(tmp_path / "runs"), "--output", str(tmp_path / "out" / "ppo")])
    assert "| ppo.py | CartPole-v1 | 1000 | 1 2 | 3.00 +- 1.00 |" in (tmp_path / "out" / "ppo.md").read_text()


def test_results_rejects_a_directory_without_events(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        results.summarize_run(tmp_path / "empty")
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("env_id, action_shape", [("CartPole-v1", None), ("Hopper-v5", (3,))])
def test_env_snapshot_continues_exactly_across_resets(env_id, action_shape):
    import gymnasium as gym
    import numpy as np

    def make_vec():
        fns = [lambda: gym.make(env_id, disable_env_checker=True)] * 2
        return gym.wrappers.vector.RecordEpisodeStatistics(
            gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        )

    rng = np.random.default_rng(0)
    sample = (
        (lambda: rng.integers(0, 2, 2)) if action_shape is None else (lambda: rng.uniform(-1, 1, (2, *action_shape)))
    )
    original = make_vec()
    original.reset(seed=3)
    for _ in range(120):
        original.step(sample())
    restored, _ = checkpoint.restore_envs(make_vec(), checkpoint.snapshot_envs(original))
    episodes = 0
    for step in range(1500):
        action = sample()
        a, b = original.step(action), restored.step(action)
        for x, y in zip(a[:4], b[:4]):
            assert np.array_equal(x, y), step
        episodes += int(np.sum(a[2] | a[3]))
    assert episodes >= 5  # the comparison crossed several resets
    assert list(original.return_queue) == list(restored.return_queue)


def test_evaluate_imports_a_script_with_postponed_annotations(tmp_path):
    # dataclasses resolve string annotations through sys.modules, so the imported script must be registered there.
    from cleanrl_utils.checkpoint import load_script

    script = tmp_path / "postponed.py"
    script.write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass Args:\n"
        "    episodes: int = 3\n\n\ndef evaluate(model_path, eval_episodes, device, seed=0, capture_video=False, "
        "video_dir=None):\n    return [float(Args().episodes)]\n"
    )
    module = load_script({"script": "postponed", "script_path": str(script)})
    assert module.evaluate(None, 1, "cpu") == [3.0]


def test_a_damaged_packed_run_is_refused_in_one_line(tmp_path, capsys):
    damaged = tmp_path / "CartPole-v1__ppo__1__1700000000.tar.xz"
    damaged.write_bytes(b"cut short")
    with pytest.raises(SystemExit) as exit_info:
        results.main([str(damaged), "--output", str(tmp_path / "table")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and "not a packed run" in lines[0], lines


def test_cleanrl_utils_modules_depend_on_each_other_one_way():
    """No two modules of cleanrl_utils import each other, directly or around a longer cycle, counting the imports
    inside functions too (a lazy import is still a dependency: archive <-> results and evaluate <-> hub were)."""
    import ast

    root = Path(__file__).resolve().parents[1]
    package = root / "cleanrl_utils"
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for path in package.rglob("*.py")
    }
    imports = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        imports[name] = sorted(found & set(modules) - {name, "cleanrl_utils"})

    def cycle_from(start, node, seen):
        for nxt in imports[node]:
            if nxt == start:
                return [*seen, nxt]
            if nxt not in seen:
                found = cycle_from(start, nxt, [*seen, nxt])
                if found:
                    return found
        return None

    cycles = [cycle for name in modules if (cycle := cycle_from(name, name, [name]))]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)
