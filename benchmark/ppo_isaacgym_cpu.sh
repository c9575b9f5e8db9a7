#!/usr/bin/env bash
# ppo_isaacgym.py on the CPU with MuJoCo Warp (no GPU): the issue's item 3.
#  1. Ant with 256 environments for 200k steps must complete (seed 1).
#  2. SPS at 64, 256 and 1024 environments: training (ppo_isaacgym.py, 6 iterations of 16 steps,
#     the SPS the script logs at the end) beside the raw simulator (MuJoCoWarpVecEnv stepped with
#     uniform random actions for 32 steps after 2 warm-up steps); their ratio is the training overhead.
# One process at a time (2-core machine). The first MuJoCo Warp step compiles kernels (a minute or
# two on a cold ~/.cache/warp). Results: benchmark/results/ppo_isaacgym_cpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmark/results/ppo_isaacgym_cpu.md
mkdir -p benchmark/results

start=$(date +%s)
uv run python cleanrl/ppo_isaacgym.py --env-id Ant --num-envs 256 --total-timesteps 200000 --seed 1
echo "Ant, 256 envs, 200k steps: $(( $(date +%s) - start )) s wall clock" | tee /tmp/ppo_isaacgym_cpu_200k.txt

uv run python - "$out" <<'PY'
import subprocess, sys, time
from pathlib import Path

import torch

sys.path.insert(0, "cleanrl")
import ppo_isaacgym as pig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

def raw_sps(num_envs: int, steps: int = 32) -> float:
    env = pig.MuJoCoWarpVecEnv("Ant", num_envs, torch.device("cpu"), seed=1)
    actions = lambda: 2 * torch.rand(num_envs, env.act_dim) - 1
    for _ in range(2):
        env.step(actions())
    start = time.perf_counter()
    for _ in range(steps):
        env.step(actions())
    return steps * num_envs / (time.perf_counter() - start)

def training_sps(num_envs: int, iterations: int = 6) -> float:
    before = set(Path("runs").glob("Ant__ppo_isaacgym__*")) if Path("runs").exists() else set()
    subprocess.run([sys.executable, "cleanrl/ppo_isaacgym.py", "--env-id", "Ant", "--num-envs", str(num_envs),
                    "--total-timesteps", str(num_envs * 16 * iterations), "--log-every", "1"], check=True)
    (run_dir,) = set(Path("runs").glob("Ant__ppo_isaacgym__*")) - before
    acc = EventAccumulator(str(run_dir)); acc.Reload()
    return acc.Scalars("charts/SPS")[-1].value

rows = ["| envs | training SPS | raw simulator SPS | training / raw |", "|---|---|---|---|"]
for num_envs in (64, 256, 1024):
    train, raw = training_sps(num_envs), raw_sps(num_envs)
    rows.append(f"| {num_envs} | {train:,.0f} | {raw:,.0f} | {train / raw:.2f} |")
    print(rows[-1], flush=True)
finished = Path("/tmp/ppo_isaacgym_cpu_200k.txt").read_text().strip()
Path(sys.argv[1]).write_text(
    "# ppo_isaacgym.py on the CPU (MuJoCo Warp, Ant)\n\n"
    f"Machine: {subprocess.run(['uname', '-srm'], capture_output=True, text=True).stdout.strip()}, "
    f"{__import__('os').cpu_count()} CPU cores, no GPU. Commands: benchmark/ppo_isaacgym_cpu.sh.\n\n"
    f"{finished}.\n\n" + "\n".join(rows) + "\n\n"
    "Training SPS: the last charts/SPS of a 6-iteration run (16 steps per iteration, PPO defaults otherwise), "
    "simulator start-up excluded. Raw simulator SPS: MuJoCoWarpVecEnv.step with uniform random actions, "
    "32 steps after 2 warm-up steps, observations and rewards included.\n")
print(Path(sys.argv[1]).read_text())
PY
