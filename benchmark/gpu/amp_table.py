"""SPS of the pixel scripts without and with --amp (bf16 autocast): ppo_atari and dqn_atari on Breakout (ALE),
ppo_atari_envpool on Breakout-v5, ppo_procgen and ppg_procgen on StarpilotEasy-v0, each at its default sizes for a
short fixed budget of steps, a window of wall time capping each run (stopped there with SIGTERM: the scripts
checkpoint and exit 0). Called by benchmark/gpu/run_all.sh (item amp).

    python3 benchmark/gpu/amp_table.py            # on the GPU node (the kit on PYTHONPATH)
    python3 benchmark/gpu/amp_table.py --tiny     # a CPU: ppo_atari on MinAtar in both modes at tiny sizes

SPS is compile_table.py's steady rate (start-up and the first logged point past the warm-up left out); the peak GPU
memory is torch's peak allocation (perf/peak_gpu_memory_gb). A row that fails says why in its cell and the table goes
on.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_table import reason, run_row, steady_sps  # noqa: E402

from cleanrl_utils.results import RunError, machine_description, read_scalar  # noqa: E402

# script, env id, the step budget (and what a short run needs beside the defaults), steps not measured (warm-up), the
# window of wall time in seconds (start-up included). The PPO budgets are 8 (Atari: 8 x 128 steps) and 3 (Procgen:
# 64 x 256) iterations; ppg_procgen's are policy-phase iterations (its auxiliary phase comes every 32).
ROWS = [
    ("ppo_atari", "BreakoutNoFrameskip-v4", ["--total-timesteps", "8192"], 0, 20),
    ("ppo_atari_envpool", "Breakout-v5", ["--total-timesteps", "8192"], 0, 20),
    ("dqn_atari", "BreakoutNoFrameskip-v4", ["--total-timesteps", "6000", "--learning-starts", "1000"], 1000, 20),
    ("ppo_procgen", "StarpilotEasy-v0", ["--total-timesteps", "49152"], 0, 30),
    ("ppg_procgen", "StarpilotEasy-v0", ["--total-timesteps", "49152"], 0, 30),
]
MODES = [("float32", []), ("amp", ["--amp"])]
TINY = ["--no-cuda", "--num-envs", "4", "--num-steps", "32", "--total-timesteps", "512"]


def peak_gpu_memory(run_dir: Path) -> str:
    try:
        return f"{read_scalar(run_dir, 'perf/peak_gpu_memory_gb')[2][-1]:.2f}"
    except RunError:
        return "-"  # not on a GPU


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, ppo_atari on MinAtar only, tiny sizes (the tests)")
    parser.add_argument("--seconds", type=float, default=None, help="one window for every run (default: each row's)")
    parser.add_argument("--results", type=Path, default=Path(os.environ.get("RESULTS", ROOT / "benchmark/results")))
    args = parser.parse_args()
    os.chdir(ROOT)
    python = os.environ.get("PYTHON", sys.executable)
    rows = ROWS if not args.tiny else [("ppo_atari", "MinAtar/Breakout-v1", TINY, 0, 600)]
    logs = args.results / "amp_gpu_logs"
    logs.mkdir(parents=True, exist_ok=True)
    lines, failed = [], 0
    for script, env_id, flags, warmup, window in rows:
        window = args.seconds or window
        cells, rates, memory = [], [], []
        for mode, mode_flags in MODES:
            log = logs / f"{script}__{mode}.log"
            start = time.perf_counter()
            run_dir = run_row(python, script, env_id, [*flags, *mode_flags], window, log, dict(os.environ))
            try:
                if run_dir is None:
                    raise RunError("no run directory")
                sps, steps = steady_sps(run_dir, warmup)
                cells.append(f"{sps:,.0f} ({steps:,} steps)")
                rates.append(sps)
                memory.append(peak_gpu_memory(run_dir))
            except RunError as error:
                failed += 1
                cells.append(f"failed: {reason(log, error)}")
                memory.append("-")
            print(f"{script} {env_id} {mode}: {cells[-1]} [{time.perf_counter() - start:.0f} s]", flush=True)
        speedup = f"{rates[1] / rates[0]:.2f}x" if len(rates) == 2 else "-"
        budget = " ".join(flags[flags.index("--total-timesteps") :][:2])
        lines.append(f"| {script} | {env_id} | `{budget}` | {' | '.join(cells)} | {speedup} | {' / '.join(memory)} |")
    table = [
        "# float32 vs --amp (bf16 autocast): SPS",
        "",
        f"Machine: {machine_description()}. Command: `python3 benchmark/gpu/amp_table.py"
        f"{' --tiny' if args.tiny else ''}`; each run capped at "
        f"{'its row window' if args.seconds is None else f'{args.seconds:g} s'} of wall time (start-up included, "
        f"benchmark/gpu/amp_table.py's ROWS); {'tiny sizes' if args.tiny else 'default sizes'}; seed 1.",
        "",
        "| script | env | budget | float32 SPS | --amp SPS | --amp / float32 | peak GPU memory (GB): float32 / --amp |",
        "|---|---|---|---|---|---|---|",
        *lines,
        "",
        "SPS: the steady rate between the second logged point past the warm-up and the last one (environment steps "
        "over wall-clock seconds), so start-up and the first iteration are left out; the steps column is the last "
        "logged step (below the budget where the window stopped the run).",
        "",
    ]
    out = args.results / ("amp_gpu.md" if not args.tiny else "amp_tiny.md")
    out.write_text("\n".join(table))
    print("\n".join(table))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
