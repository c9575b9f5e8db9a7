"""Aggregate finished runs into a results table (Markdown and CSV).

    python -m cleanrl_utils.results runs/CartPole-v1__ppo__* runs/Acrobot-v1__ppo__* \
        --output benchmark/results/ppo

Per environment and script: the number of seeds, the score (the mean of the last 100 episodic
returns of each run, then mean +- std across runs), the training steps, the wall time of a run
(first to last TensorBoard event) and its SPS (total steps / wall time). The machine is written
under the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
from dataclasses import dataclass
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

    @property
    def sps(self) -> float:
        return self.steps / self.wall_time if self.wall_time > 0 else float("nan")


def summarize_run(run_dir: Path, last_n: int = 100) -> RunSummary:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args_file = run_dir / "args.json"
    if not args_file.is_file():
        fail(f"{run_dir}: not a run directory (no args.json)")
    args = json.loads(args_file.read_text())
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if "charts/episodic_return" not in acc.Tags()["scalars"]:
        fail(f"{run_dir}: no charts/episodic_return events")
    returns = acc.Scalars("charts/episodic_return")
    every_event = [e for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    wall_time = max(e.wall_time for e in every_event) - min(e.wall_time for e in every_event)
    steps = max(e.step for e in every_event)
    score = float(np.mean([e.value for e in returns[-last_n:]]))
    return RunSummary(args["env_id"], args["exp_name"], args["seed"], steps, score, wall_time)


def machine_description() -> str:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}; Python {platform.python_version()}, torch {torch.__version__}"


def aggregate(summaries: list[RunSummary]) -> list[dict]:
    groups: dict[tuple[str, str], list[RunSummary]] = {}
    for summary in summaries:
        groups.setdefault((summary.exp_name, summary.env_id), []).append(summary)
    rows = []
    for (exp_name, env_id), runs in sorted(groups.items()):
        scores = np.array([r.score for r in runs])
        rows.append({
            "script": f"{exp_name}.py",
            "environment": env_id,
            "steps": int(np.mean([r.steps for r in runs])),
            "seeds": " ".join(str(r.seed) for r in sorted(runs, key=lambda r: r.seed)),
            "return": f"{scores.mean():.2f} +- {scores.std():.2f}",
            "wall time (s)": f"{np.mean([r.wall_time for r in runs]):.0f}",
            "SPS": f"{np.mean([r.sps for r in runs]):,.0f}",
        })
    return rows


def write_tables(rows: list[dict], output: Path, machine: str) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[h]) for h in header) + " |" for row in rows]
    note = ("Return: mean of the last 100 episodic returns of each run, then mean +- std across seeds. "
            "Wall time: first to last TensorBoard event of a run (after start-up). SPS: steps / wall time.")
    output.with_suffix(".md").write_text("\n".join(lines) + f"\n\n{note}\n\nMachine: {machine}\n")
    with open(output.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (runs/...)")
    parser.add_argument("--output", type=Path, required=True, help="output path without suffix (.md and .csv are written)")
    args = parser.parse_args(argv)
    rows = aggregate([summarize_run(run_dir) for run_dir in args.run_dirs])
    write_tables(rows, args.output, machine_description())
    print(args.output.with_suffix(".md").read_text())


if __name__ == "__main__":
    main(sys.argv[1:])
