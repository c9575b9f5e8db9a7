#!/usr/bin/env bash
# ppo_isaacgym.py on one NVIDIA GPU with MuJoCo Warp: the issue's item 4, as one script that fits a
# short device session (about 8 minutes: kernel compilation on a cold ~/.cache/warp, 30 s of raw
# simulator timing, 240 s of training).
#  1. Raw simulator SPS: Ant, 4096 worlds, uniform random actions (this also compiles the kernels).
#  2. Training: Ant, 4096 environments x 16 steps (the script's defaults), stopped after 240 s of
#     wall-clock training (--time-limit-seconds 240; start-up and compilation not counted, as in
#     CleanRL's "train time"). Recorded: SPS and the episodic return reached (the mean over the
#     episodes that ended in the last logging interval, and the best such mean).
# Results: benchmark/results/ppo_isaacgym_gpu.md, beside CleanRL's Isaac Gym Ant (RTX A6000, 240 s).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmark/results
out=benchmark/results/ppo_isaacgym_gpu.md
seconds=${SECONDS_OF_TRAINING:-240}

uv run python - <<'PY' | tee /tmp/ppo_isaacgym_gpu_raw.txt
import sys, time
import torch
sys.path.insert(0, "cleanrl")
import ppo_isaacgym as pig
env = pig.MuJoCoWarpVecEnv("Ant", 4096, torch.device("cuda"), seed=1)
actions = lambda: 2 * torch.rand(4096, env.act_dim, device="cuda") - 1
for _ in range(20):
    env.step(actions())
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(500):
    env.step(actions())
torch.cuda.synchronize()
print(f"raw simulator SPS {500 * 4096 / (time.perf_counter() - start):.0f}")
PY

uv run python cleanrl/ppo_isaacgym.py --env-id Ant --simulator mujoco-warp --num-envs 4096 \
    --total-timesteps 1000000000 --time-limit-seconds "$seconds" --seed 1

uv run python - "$out" "$seconds" <<'PY'
import subprocess, sys
from pathlib import Path
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run_dir = sorted(Path("runs").glob("Ant__ppo_isaacgym__1__*"), key=lambda p: p.stat().st_mtime)[-1]
acc = EventAccumulator(str(run_dir)); acc.Reload()
returns = [e.value for e in acc.Scalars("charts/episodic_return")]
sps = acc.Scalars("charts/SPS")[-1]
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
raw = Path("/tmp/ppo_isaacgym_gpu_raw.txt").read_text().split()[-1]
Path(sys.argv[1]).write_text(
    "# ppo_isaacgym.py on a GPU (MuJoCo Warp, Ant-v5 task, 4096 environments)\n\n"
    f"Machine: {gpu}. Commands: benchmark/ppo_isaacgym_gpu.sh. Run: {run_dir.name}.\n\n"
    "| task | simulator | training time | steps | SPS | raw simulator SPS | return (last log) | best logged return | CleanRL Isaac Gym Ant (RTX A6000, 240 s) |\n"
    "|---|---|---|---|---|---|---|---|---|\n"
    f"| Ant | MuJoCo Warp (gymnasium Ant-v5 task) | {sys.argv[2]} s | {sps.step:,} | {sps.value:,.0f} | {int(raw):,} | "
    f"{returns[-1]:.1f} | {max(returns):.1f} | 3953.30 +- 667.09 (Isaac Gym's Ant task, 3 seeds) |\n\n"
    "One seed. The returns are not directly comparable: Isaac Gym's Ant task has its own reward "
    "(progress towards a target, heading and up bonuses ...), this is gymnasium's Ant-v5 reward. "
    "The return is the mean over the episodes that ended within a logging interval (10 iterations).\n")
print(Path(sys.argv[1]).read_text())
PY
