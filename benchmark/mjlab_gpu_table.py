"""The table of benchmark/mjlab_gpu.sh: each trainer's run on an mjlab task, read from its TensorBoard events, side by
side: the environment steps it reached, its training time and steps per second, its mean episodic return at the end
(the mean of its last --last values), and mjlab's velocity-tracking reward term at the end (the per-episode sum per
second of the time limit that mjlab logs, Episode_Reward/track_linear_velocity).

    python benchmark/mjlab_gpu_table.py --run ppo_isaacgym=runs/Mjlab-...__ppo_isaacgym_mjlab_gpu__1__... \\
        --run rsl_rl=/tmp/rsl_rl/go1_velocity/2026-... --output benchmark/results/mjlab_gpu

Our scripts log against environment steps (charts/episodic_return, mjlab/Episode_Reward/...); rsl_rl logs against
iterations (Train/mean_reward, Episode_Reward/...), each num_envs x num_steps_per_env steps (its params/agent.yaml and
env.yaml).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TRACKING = "Episode_Reward/track_linear_velocity"


def scalars(run_dir: Path) -> dict[str, list]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


def row(label: str, run_dir: Path, last: int) -> list[str]:
    found = scalars(run_dir)
    agent_yaml = run_dir / "params" / "agent.yaml"
    if agent_yaml.is_file():  # rsl_rl: iterations of num_envs x num_steps_per_env steps (each value's first line)
        steps_per_env = re.search(r"^\s*num_steps_per_env: (\d+)$", agent_yaml.read_text(), re.M)
        num_envs = re.search(r"^\s*num_envs: (\d+)$", (run_dir / "params" / "env.yaml").read_text(), re.M)
        per_iteration = int(steps_per_env.group(1)) * int(num_envs.group(1))
        returns, tracking = found.get("Train/mean_reward", []), found.get(TRACKING, [])
        steps = (max(e.step for e in found["Perf/total_fps"]) + 1) * per_iteration
        # training time: each iteration's collection and learning (start-up out, as our SPS leaves it out)
        wall = sum(e.value for tag in ("Perf/collection_time", "Perf/learning_time") for e in found[tag])
    else:  # ours: against environment steps, with the SPS the script logs (training time)
        returns, tracking = found.get("charts/episodic_return", []), found.get("mjlab/" + TRACKING, [])
        steps, sps = max((e.step, e.value) for e in found["charts/SPS"])
        wall = steps / sps
    end_return = f"{np.mean([e.value for e in returns[-last:]]):.3f}" if returns else "-"
    end_tracking = f"{np.mean([e.value for e in tracking[-last:]]):.3f}" if tracking else "-"
    return [label, f"{steps:,}", f"{wall:.0f}", f"{steps / wall:,.0f}" if wall > 0 else "-", end_return, end_tracking]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR (a TensorBoard log folder)")
    parser.add_argument("--last", type=int, default=5, help="values averaged at the end (default 5)")
    parser.add_argument("--title", default="", help="a line above the table")
    parser.add_argument("--output", type=Path, help="write PATH.md (appended to when it exists)")
    args = parser.parse_args()
    rows = []
    for spec in args.run:
        label, _, path = spec.partition("=")
        if not path or not Path(path).is_dir():
            print(f"error: --run {spec}: give LABEL=RUN_DIR, a folder of TensorBoard events", file=sys.stderr)
            raise SystemExit(2)
        rows.append(row(label, Path(path), args.last))
    header = ["trainer", "env steps", "training s", "SPS", "return at the end", "track_linear_velocity at the end"]
    lines = [args.title, ""] if args.title else []
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        path = args.output.with_suffix(".md")
        existing = path.read_text() if path.exists() else ""
        path.write_text(existing + ("\n" if existing else "") + text)


if __name__ == "__main__":
    main()
