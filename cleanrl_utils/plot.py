"""Learning curves from run directories, as a PNG.

    python -m cleanrl_utils.plot runs/ --output curves.png
    python -m cleanrl_utils.plot runs/CartPole-v1__ppo__* runs/CartPole-v1__dqn__* \\
        --band iqm --smoothing 0.6 --output benchmark/results/cartpole.png

Each argument is a run directory or a folder (such as runs/) with run directories below it.
Runs are grouped by environment and by experiment name (exp_name, i.e. the script) as written
in their args.json. The figure has one row per environment and two panels: the metric
(--metric, default charts/episodic_return) against environment steps, and against the wall time
the run had been running (a resumed run's wait between stop and resume left out, as in the
results table). Each panel has one line per experiment, aggregated across seeds:

- every seed's curve is smoothed (--smoothing W: TensorBoard's debiased exponential moving
  average with weight W in [0, 1), 0 = none), then linearly interpolated onto a common grid of
  --num-points steps (or seconds) spanning the range that all seeds cover (the union of their
  ranges where they do not overlap, each curve held flat beyond its ends);
- `--band std` (default): the line is the mean across seeds, the band mean +- std (ddof 0);
- `--band iqm`: the line is the interquartile mean across seeds (the mean of the middle 50%,
  cutting floor(n/4) runs at each end: scipy.stats.trim_mean(x, 0.25), as rliable computes it; with
  fewer than 4 seeds that is the plain mean), the band its 95% percentile-bootstrap confidence
  interval (scipy.stats.bootstrap: --bootstrap-samples resamples of the seeds, seeded by
  --bootstrap-seed, so the figure is reproducible).

A path with no TensorBoard events, or a metric that no run has, stops with one line naming it
(and the metrics the runs do have).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cleanrl_utils.errors import fail
from cleanrl_utils.results import (
    RunError,
    find_run_dirs,
    iqm,
    load_events,
    process_spans,
    read_scalar,
    run_info,
    seconds_running,
)


@dataclass
class Curve:
    env_id: str
    exp_name: str
    seed: int
    steps: np.ndarray
    seconds: np.ndarray  # wall time the run had been running (a resume's wait left out)
    values: np.ndarray


# ---------------------------------------------------------------------------- the numbers


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: an exponential moving average, debiased for its zero start."""
    if weight <= 0:
        return np.asarray(values, dtype=np.float64)
    out = np.empty(len(values))
    last = 0.0
    for i, value in enumerate(values):
        last = last * weight + (1 - weight) * value
        out[i] = last / (1 - weight ** (i + 1))
    return out


def common_grid(xs: list[np.ndarray], num_points: int) -> np.ndarray:
    """num_points evenly spaced points over the range that every curve covers."""
    low, high = max(x[0] for x in xs), min(x[-1] for x in xs)
    if low > high:  # curves that do not overlap: span them all (each is held flat beyond its ends)
        low, high = min(x[0] for x in xs), max(x[-1] for x in xs)
    if low == high:  # a single point (every seed logged once, at the same step)
        return np.array([float(low)])
    return np.linspace(low, high, num_points)


def interpolate(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """y(x) at the grid points, linearly; several values at one x (episodes that ended in the
    same step) are averaged first."""
    unique, inverse = np.unique(x, return_inverse=True)
    means = np.bincount(inverse, weights=y) / np.bincount(inverse)
    return np.interp(grid, unique, means)


def mean_std(values: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population, ddof 0) standard deviation across runs."""
    return np.mean(values, axis=axis), np.std(values, axis=axis)


def bootstrap_ci(
    values: np.ndarray, statistic=iqm, samples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile-bootstrap confidence interval of `statistic` across runs (axis 0 of values, shape [runs] or
    [runs, points]), by scipy.stats.bootstrap: the runs are resampled with replacement `samples` times, each resample
    serving every point of a curve. At each point that is the distribution of rliable's stratified bootstrap for one
    environment (its strata are the environments)."""
    from scipy.stats import bootstrap  # imported here, as in results.iqm: scipy.stats costs ~0.8 s of CPU to import

    values = np.asarray(values, dtype=np.float64)
    if len(values) == 1:  # every resample of one run is that run (scipy refuses a single observation)
        return values[0].copy(), values[0].copy()
    result = bootstrap(
        (values,),
        statistic,
        n_resamples=samples,
        confidence_level=confidence,
        method="percentile",
        axis=0,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return result.confidence_interval.low, result.confidence_interval.high


def aggregate_curves(
    curves: list[Curve],
    x: str,
    band: str,
    smoothing: float,
    num_points: int,
    bootstrap_samples: int = 2000,
    bootstrap_seed: int = 0,
):
    """(grid, line, band low, band high) of the seeds' curves against x ("steps" or "seconds")."""
    xs = [getattr(c, x).astype(np.float64) for c in curves]
    ys = [smooth(c.values, smoothing) for c in curves]
    grid = common_grid(xs, num_points)
    stacked = np.stack([interpolate(xi, yi, grid) for xi, yi in zip(xs, ys)])
    if band == "iqm":
        low, high = bootstrap_ci(stacked, iqm, bootstrap_samples, seed=bootstrap_seed)
        return grid, iqm(stacked), low, high
    mean, std = mean_std(stacked)
    return grid, mean, mean - std, mean + std


# ---------------------------------------------------------------------------- reading and drawing


def load_curves(paths: list[Path], metric: str) -> list[Curve]:
    """The metric's series of every run found under `paths`; fails in one line when a path has
    no events or no run has the metric (runs that lack it while others have it are skipped)."""
    try:
        run_dirs = find_run_dirs(paths)
        curves, missing = [], []
        for run_dir in run_dirs:
            info = run_info(run_dir)
            acc = load_events(run_dir)
            try:
                steps, wall, values = read_scalar(run_dir, metric, acc)
            except RunError as error:
                missing.append(error)
                continue
            # Time spent running: a resumed run's wait between its stop and its resume is left out, as in the
            # results table; the first process's start-up before its first scalar is counted.
            spans = process_spans(run_dir)
            startup = max(spans[0][0] - acc.FirstEventTimestamp(), 0.0)
            seconds = startup + seconds_running(spans, wall)
            curves.append(Curve(info["env_id"], info["exp_name"], int(info["seed"]), steps, seconds, values))
    except RunError as error:
        fail(str(error))
    if not curves:
        fail(f"no run has the metric {metric!r}: {missing[0]}")
    for error in missing:
        print(f"warning: {error}; run left out", file=sys.stderr)
    return curves


def time_unit(seconds: float) -> tuple[str, float]:
    if seconds < 120:
        return "s", 1.0
    return ("min", 60.0) if seconds < 7200 else ("h", 3600.0)


def make_figure(
    curves: list[Curve],
    metric: str = "charts/episodic_return",
    band: str = "std",
    smoothing: float = 0.0,
    num_points: int = 200,
    bootstrap_samples: int = 2000,
    bootstrap_seed: int = 0,
):
    """A matplotlib figure: a row per environment, panels against steps and wall time, a line
    per experiment with its band across seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_ids = sorted({c.env_id for c in curves})
    exp_names = sorted({c.exp_name for c in curves})
    colors = {name: f"C{i % 10}" for i, name in enumerate(exp_names)}
    fig, axes = plt.subplots(len(env_ids), 2, figsize=(12, 3.6 * len(env_ids)), squeeze=False)
    unit, scale = time_unit(max(c.seconds[-1] for c in curves))
    for row, env_id in zip(axes, env_ids):
        for exp_name in exp_names:
            group = sorted((c for c in curves if c.env_id == env_id and c.exp_name == exp_name), key=lambda c: c.seed)
            if not group:
                continue
            label = f"{exp_name} ({len(group)} seed{'s' if len(group) > 1 else ''})"
            for ax, x, x_scale in ((row[0], "steps", 1.0), (row[1], "seconds", scale)):
                grid, line, low, high = aggregate_curves(
                    group, x, band, smoothing, num_points, bootstrap_samples, bootstrap_seed
                )
                ax.plot(
                    grid / x_scale, line, color=colors[exp_name], label=label, marker="o" if len(grid) == 1 else None
                )
                ax.fill_between(grid / x_scale, low, high, color=colors[exp_name], alpha=0.2, linewidth=0)
        row[0].set_xlabel("environment steps")
        row[1].set_xlabel(f"wall time ({unit})")
        for ax in row:
            ax.set_title(env_id)
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
        row[0].legend(loc="best", fontsize="small")
    summary = (
        "line: interquartile mean across seeds, band: 95% bootstrap CI"
        if band == "iqm"
        else "line: mean across seeds, band: +- std"
    )
    fig.suptitle(f"{summary}" + (f"; smoothing {smoothing}" if smoothing > 0 else ""), fontsize="medium")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.plot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", nargs="+", type=Path, help="run directories, or folders (runs/) with run directories below"
    )
    parser.add_argument("--output", type=Path, default=Path("curves.png"), help="the PNG to write (default curves.png)")
    parser.add_argument("--metric", default="charts/episodic_return", help="the TensorBoard scalar to plot")
    parser.add_argument(
        "--band", choices=["std", "iqm"], default="std", help="std: mean +- std; iqm: IQM with a bootstrap CI"
    )
    parser.add_argument(
        "--smoothing", type=float, default=0.0, help="exponential moving average weight in [0, 1) (default 0: none)"
    )
    parser.add_argument(
        "--num-points", type=int, default=200, help="points of the common grid seeds are interpolated onto"
    )
    parser.add_argument("--bootstrap-samples", type=int, default=2000, help="bootstrap resamples for --band iqm")
    parser.add_argument(
        "--bootstrap-seed", type=int, default=0, help="seed of the bootstrap (the figure is reproducible)"
    )
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(argv)
    if not 0 <= args.smoothing < 1:
        fail(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if args.num_points < 2 or args.bootstrap_samples < 1:
        fail("--num-points must be at least 2 and --bootstrap-samples positive")
    if args.output.suffix.lower() != ".png":
        fail(f"--output {args.output}: give a .png path")

    curves = load_curves(args.paths, args.metric)
    fig = make_figure(
        curves, args.metric, args.band, args.smoothing, args.num_points, args.bootstrap_samples, args.bootstrap_seed
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=args.dpi)
    envs = sorted({c.env_id for c in curves})
    exps = sorted({c.exp_name for c in curves})
    print(
        f"wrote {args.output}: {len(curves)} runs, {len(envs)} environment(s) ({', '.join(envs)}), "
        f"experiments {', '.join(exps)}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
