"""Where a training script's time goes: run it under py-spy (a sampling profiler) and attribute every sample of its
main thread to the line of the script that was running, grouped into environment steps, the rest of the rollout
(inference and storage), advantages and batching, the update, and everything else (imports, set-up, logging,
evaluation). Works for the on-policy scripts whose loop has `for step in range(args.num_steps)` and
`for epoch in range(args.update_epochs)` blocks.

    uv run --with py-spy python benchmark/time_split.py cleanrl/ppo_atari.py --env-id BreakoutNoFrameskip-v4 \\
        --total-timesteps 20480

Arguments after the script go to it. The table is printed; `--output PATH` (before the script) also writes it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

CATEGORIES = (
    "environment step",
    "rollout: inference and storage",
    "advantages and batch",
    "update",
    "logging, set-up and evaluation",
)
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.+):(?P<line>\d+)\)$")


def block(lines: list[str], header: str) -> range:
    """The 1-based line numbers of the block that starts with `header` (its indented body included)."""
    start = next((i for i, text in enumerate(lines) if text.strip().startswith(header)), None)
    if start is None:
        sys.exit(f"time_split: no line starting with {header!r} in the script")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    return range(start + 1, end + 1)


def categorise(lines: list[str], line: int, rollout: range, update: range) -> str:
    text = lines[line - 1]
    if "envs.step(" in text:
        return "environment step"
    if "run." in text:  # run.log, run.log_episodes, run.checkpoint: bookkeeping
        return "logging, set-up and evaluation"
    if line in rollout:
        return "rollout: inference and storage"
    if line in update:
        return "update"
    if rollout.stop <= line < update.start:
        return "advantages and batch"
    return "logging, set-up and evaluation"


def split(profile: str, script: Path) -> Counter:
    """Samples per category of the main thread's stacks in py-spy's raw (collapsed stack) output, recorded with
    --threads (each stack starts with its thread) and --idle (a thread waiting for the environment's worker threads
    counts)."""
    lines = script.read_text().splitlines()
    rollout, update = (
        block(lines, "for step in range(args.num_steps)"),
        block(lines, "for epoch in range(args.update_epochs)"),
    )
    counts = Counter()
    for row in profile.splitlines():
        stack, _, samples = row.rpartition(" ")
        if ": MainThread;" not in stack:  # the tensorboard writer and other helper threads wait apart
            continue
        script_lines = [
            int(match["line"])
            for frame in stack.split(";")
            if (match := FRAME.match(frame)) and Path(match["file"]).name == script.name
        ]
        category = (
            categorise(lines, script_lines[0], rollout, update) if script_lines else "logging, set-up and evaluation"
        )
        counts[category] += int(samples)
    return counts


def table(counts: Counter, rate: int) -> str:
    total = sum(counts.values())
    rows = ["| part | seconds | share |", "|---|---|---|"]
    for category in CATEGORIES:
        rows.append(f"| {category} | {counts[category] / rate:.1f} | {100 * counts[category] / max(total, 1):.1f}% |")
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, help="also write the table to this Markdown file")
    parser.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    parser.add_argument("script", type=Path)
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        print("time_split: py-spy is not installed; run it with `uv run --with py-spy python benchmark/time_split.py`")
        sys.exit(2)
    if not args.script.is_file():
        print(f"time_split: no script {args.script}")
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        command = [
            py_spy,
            "record",
            "--format",
            "raw",
            "--threads",
            "--idle",
            "--rate",
            str(args.rate),
            "--output",
            str(raw),
            "--",
        ]
        subprocess.run(command + [sys.executable, str(args.script), *args.script_args], check=True)
        counts = split(raw.read_text(), args.script)
    result = table(counts, args.rate)
    print(result)
    if args.output:
        args.output.write_text(f"`{args.script} {' '.join(args.script_args)}`\n\n{result}\n")
