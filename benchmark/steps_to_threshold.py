"""How many environment steps each run needs until its recent episodic return reaches a threshold.

    uv run python benchmark/steps_to_threshold.py runs/Pendulum-v1__redq_continuous_action__* \\
        runs/Pendulum-v1__sac_ls1000__* --threshold -200 --window 10 --output benchmark/results/redq_steps

Per run: the first step at which the mean of the last `--window` episodic returns (charts/episodic_return,
read with cleanrl_utils.results) is >= `--threshold`, counting only once `--window` episodes have ended; a run
that never gets there is "not reached". Per experiment (exp_name) and environment: each seed's step, and the mean
+- std (ddof 0) over the seeds that reached it, with how many did. The Markdown table is printed and, with
--output PATH, written to PATH.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from anywhere: cleanrl_utils is at the repository root

from cleanrl_utils.errors import fail  # noqa: E402
from cleanrl_utils.results import RunError, find_run_dirs, read_scalar, run_info  # noqa: E402


def first_step_reaching(steps: np.ndarray, returns: np.ndarray, threshold: float, window: int) -> int | None:
    """The step of the first episode after which the mean of the last `window` returns is >= threshold
    (None if none is); episodes are in the order they ended."""
    if len(returns) < window:
        return None
    means = np.convolve(returns, np.ones(window) / window, mode="valid")  # means[k]: episodes k .. k + window - 1
    reached = np.flatnonzero(means >= threshold)
    return int(steps[reached[0] + window - 1]) if len(reached) else None


def table(run_dirs: list[Path], threshold: float, window: int) -> str:
    groups: dict[tuple[str, str], list[tuple[int, int | None]]] = {}
    for run_dir in run_dirs:
        info = run_info(run_dir)
        steps, _, returns = read_scalar(run_dir, "charts/episodic_return")
        order = np.argsort(steps, kind="stable")
        reached = first_step_reaching(steps[order], returns[order], threshold, window)
        groups.setdefault((info["exp_name"], info["env_id"]), []).append((int(info["seed"]), reached))
    lines = [
        f"| script | environment | seeds | steps to mean of last {window} returns >= {threshold:g} | per seed |",
        "|---|---|---|---|---|",
    ]
    for (exp_name, env_id), runs in sorted(groups.items()):
        runs.sort()
        found = np.array([step for _, step in runs if step is not None], dtype=np.float64)
        summary = f"{found.mean():,.0f} +- {found.std():,.0f}" if len(found) else "-"
        summary += f" ({len(found)} of {len(runs)} reached)"
        per_seed = ", ".join(f"{seed}: {'not reached' if step is None else f'{step:,}'}" for seed, step in runs)
        seeds = " ".join(str(seed) for seed, _ in runs)
        lines.append(f"| {exp_name}.py | {env_id} | {seeds} | {summary} | {per_seed} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories, or folders with runs below them")
    parser.add_argument("--threshold", type=float, required=True, help="the return to reach")
    parser.add_argument("--window", type=int, default=10, help="episodes in the moving mean (default 10)")
    parser.add_argument("--output", type=Path, default=None, help="also write the table to OUTPUT.md")
    args = parser.parse_args(argv)
    if args.window <= 0:
        fail(f"--window must be positive, got {args.window}")
    try:
        text = table(find_run_dirs(args.run_dirs), args.threshold, args.window)
    except RunError as error:
        fail(str(error))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
