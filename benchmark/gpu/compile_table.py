"""SPS of ppo, dqn, sac, td3 and ppo_continuous_action: eager, --compile, and --compile --cudagraphs, each run for a
fixed window of wall time (stopped with SIGTERM: the scripts checkpoint and exit 0), beside LeanRL's figures
(/work/shared/BENCHMARKS.md: one H100, HalfCheetah-v4; ours is HalfCheetah-v5). Called by benchmark/gpu/run_all.sh.

    python3 benchmark/gpu/compile_table.py                  # on the GPU node (the kit on PYTHONPATH)
    python3 benchmark/gpu/compile_table.py --tiny           # a CPU: ppo in the three modes at tiny sizes

SPS is the steady rate: steps between the second charts/SPS point past the warm-up (random steps, the first
iteration with its compilation) and the last point, over their wall-clock times; start-up and compilation are not in
it. A row that fails (a flag the script lacks, --cudagraphs on a CPU) says why in its cell and the table goes on.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from cleanrl_utils.results import RunError, machine_description, read_scalar  # noqa: E402

# script, env id, flags beside the script's defaults, steps not measured (warm-up), LeanRL's SPS (eager, compile,
# compile + CUDA graphs) or None. ppo_atari.py joins with Breakout (LeanRL 1022 / 3841 / 6809) when it lands.
ROWS = [
    ("ppo", "CartPole-v1", [], 0, None),
    ("dqn", "CartPole-v1", ["--learning-starts", "1000"], 1000, None),
    ("sac_continuous_action", "HalfCheetah-v5", ["--learning-starts", "1000"], 1000, (127, 255, 725)),
    ("td3_continuous_action", "HalfCheetah-v5", ["--learning-starts", "1000"], 1000, (272, 272, 936)),
    ("ppo_continuous_action", "HalfCheetah-v5", [], 0, (652, 908, 1774)),
]
MODES = [("eager", []), ("compile", ["--compile"]), ("compile + CUDA graphs", ["--compile", "--cudagraphs"])]
TINY = ["--no-cuda", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]


def steady_sps(run_dir: Path, warmup: int) -> tuple[float, int]:
    steps, walls, _ = read_scalar(run_dir, "charts/SPS")
    keep = steps > warmup
    steps, walls = steps[keep][1:], walls[keep][1:]  # the first point past the warm-up holds the compilation
    if len(steps) < 2 or walls[-1] <= walls[0]:
        raise RunError(f"{len(steps)} SPS points past the warm-up")
    return (steps[-1] - steps[0]) / (walls[-1] - walls[0]), int(steps[-1])


def reason(log: Path, error: RunError) -> str:
    """The line of a failed run's log that says why (one with 'error' in it, else the last), else the error."""
    lines = [line.strip(" │╭╮╰╯─|") for line in log.read_text().splitlines()[1:]]
    lines = [line for line in lines if any(c.isalnum() for c in line)]
    said = [i for i, line in enumerate(lines) if "error" in line.lower() or "unrecognized" in line.lower()]
    if not lines:
        return str(error)
    i = said[-1] if said else len(lines) - 1
    return " ".join(lines[i : i + 2] if len(lines[i]) < 40 else lines[i : i + 1])[:120]  # tyro: the options follow


def run_row(
    python: str, script: str, env_id: str, flags: list[str], window: float, log: Path, env: dict
) -> Path | None:
    exp_name = f"{script}_{log.stem.split('__')[-1]}"
    before = set(Path("runs").glob(f"{env_id.replace('/', '-')}__{exp_name}__*"))
    command = [python, f"cleanrl/{script}.py", "--env-id", env_id, "--seed", "1", "--exp-name", exp_name, *flags]
    with log.open("w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            proc.wait(timeout=window)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the script checkpoints, closes its writer and exits 0
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    new = sorted(set(Path("runs").glob(f"{env_id.replace('/', '-')}__{exp_name}__*")) - before)
    return new[-1] if new else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, ppo only, tiny sizes (the test suite's check)")
    parser.add_argument("--eager-seconds", type=float, default=8.0, help="window of an eager run, start-up included")
    parser.add_argument("--compiled-seconds", type=float, default=11.0, help="window of a compiled run")
    parser.add_argument("--results", type=Path, default=Path(os.environ.get("RESULTS", ROOT / "benchmark/results")))
    args = parser.parse_args()
    os.chdir(ROOT)
    python = os.environ.get("PYTHON", sys.executable)
    rows = ROWS if not args.tiny else [("ppo", "CartPole-v1", [*TINY, "--total-timesteps", "256"], 0, None)]
    # Tiny: the runs end by themselves; torch.compile is left out (TORCHDYNAMO_DISABLE) since inductor on a CPU
    # takes minutes, and the compiled update's equivalence has its own tests: this checks the table's plumbing.
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1"} if args.tiny else dict(os.environ)
    if args.tiny:
        args.eager_seconds = args.compiled_seconds = 600.0
    logs = args.results / "compile_gpu_logs"
    logs.mkdir(parents=True, exist_ok=True)
    lines, failed = [], 0
    cuda = subprocess.run([python, "-c", "import torch; assert torch.cuda.is_available()"], env=env).returncode == 0
    for script, env_id, flags, warmup, leanrl in rows:
        cells = []
        for mode, mode_flags in MODES:
            window = args.eager_seconds if not mode_flags else args.compiled_seconds
            tag = mode.replace(" + CUDA graphs", "_cudagraphs")
            log = logs / f"{script}__{tag}.log"
            start = time.perf_counter()
            run_dir = run_row(python, script, env_id, [*flags, *mode_flags], window, log, env)
            try:
                if run_dir is None:
                    raise RunError("no run directory")
                sps, steps = steady_sps(run_dir, warmup)
                cells.append(f"{sps:,.0f} ({steps:,} steps)")
            except RunError as error:
                # Without a GPU in use the scripts refuse --cudagraphs in one line: expected, not a failure.
                no_gpu = "--no-cuda" in flags or not cuda
                refused = "--cudagraphs" in mode_flags and no_gpu and "needs a CUDA GPU" in reason(log, error)
                failed += not refused
                cells.append(f"{'refused' if refused else 'failed'}: {reason(log, error)}")
            print(f"{script} {env_id} {mode}: {cells[-1]} [{time.perf_counter() - start:.0f} s]", flush=True)
        reference = " / ".join(f"{v:,}" for v in leanrl) if leanrl else "-"
        lines.append(f"| {script} | {env_id} | {' | '.join(cells)} | {reference} |")
    table = [
        "# Eager vs --compile vs --compile --cudagraphs (SPS)",
        "",
        f"Machine: {machine_description()}. Command: `python3 benchmark/gpu/compile_table.py"
        f"{' --tiny' if args.tiny else ''}`; windows of {args.eager_seconds:g} s (eager) and "
        f"{args.compiled_seconds:g} s (compiled), start-up included; one seed.",
        "",
        "| script | env | eager | compile | compile + CUDA graphs | LeanRL (H100): eager / compile / + CUDA graphs |",
        "|---|---|---|---|---|---|",
        *lines,
        "",
        "SPS: the steady rate between the second logged point past the warm-up and the last one (environment steps "
        "over wall-clock seconds), so start-up and compilation are left out; the steps column is the last logged "
        "step. LeanRL's figures are from its README (HalfCheetah-v4, environments on the CPU), not measured here.",
        "",
    ]
    out = args.results / ("compile_gpu.md" if not args.tiny else "compile_tiny.md")
    out.write_text("\n".join(table))
    print("\n".join(table))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
