#!/usr/bin/env bash
# ppo_isaacgym.py on the CPU with MuJoCo Warp (no GPU): the two CPU checks below.
#  1. Ant with 256 environments for 200k steps must complete (seed 1).
#  2. SPS at 64, 256 and 1024 environments: training (ppo_isaacgym.py, 6 iterations of 16 steps,
#     the SPS the script logs at the end) beside the raw simulator (MuJoCoWarpVecEnv stepped with
#     uniform random actions for 32 steps after 2 warm-up steps); their ratio is the training overhead.
# One process at a time (2-core machine). The first MuJoCo Warp step compiles kernels (a minute or
# two on a cold ~/.cache/warp). Results: benchmark/results/ppo_isaacgym_cpu.md.
# Measured on the 2-core development machine while two other benchmarks ran (load ~3): Ant took
# ~0.6 s per step at 64 envs and ~1.3 s at 256 envs (raw simulator), so expect ~20 min for the
# 200k run and ~40 min for the whole script there; less on an idle machine.
# To try the script quickly: RUN_200K=0 SIZES=64 OUT=/tmp/sps.md bash benchmark/ppo_isaacgym_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmark/results/ppo_isaacgym_cpu.md}
mkdir -p benchmark/results

if [ "${RUN_200K:-1}" = 1 ]; then
    start=$(date +%s)
    uv run python cleanrl/ppo_isaacgym.py --env-id Ant --num-envs 256 --total-timesteps 200000 --seed 1
    echo "Ant, 256 envs, 200k steps: completed in $(( $(date +%s) - start )) s wall clock" | tee /tmp/ppo_isaacgym_cpu_200k.txt
else
    echo "Ant, 256 envs, 200k steps: not run this time (RUN_200K=0)" > /tmp/ppo_isaacgym_cpu_200k.txt
fi

uv run python - "$out" ${SIZES:-64 256 1024} <<'PY'
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
for num_envs in map(int, sys.argv[2:]):
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
