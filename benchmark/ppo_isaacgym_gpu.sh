#!/usr/bin/env bash
# ppo_isaacgym.py on one NVIDIA GPU with MuJoCo Warp: the issue's item 4, as one script that fits a
# short device session (kernel compilation on a cold ~/.cache/warp, RAW_STEPS of raw simulator timing,
# SECONDS_OF_TRAINING of training). Called by benchmark/gpu/run_all.sh; alone on a node:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/ppo_isaacgym_gpu.sh
#  1. Raw simulator SPS: Ant, 4096 worlds, uniform random actions (this also compiles the kernels).
#  2. Training: Ant, 4096 environments x 16 steps (the script's defaults), stopped after 240 s of
#     wall-clock training (--time-limit-seconds 240; start-up and compilation not counted, as in
#     CleanRL's "train time"). Recorded: SPS and the episodic return reached (the mean over the
#     episodes that ended in the last logging interval, and the best such mean).
# Results: $RESULTS/ppo_isaacgym_gpu.md (RESULTS=benchmark/results), beside CleanRL's Isaac Gym Ant
# (RTX A6000, 240 s). TINY=1: 8 worlds on the CPU for a few seconds (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
out=$RESULTS/ppo_isaacgym_gpu.md
seconds=${SECONDS_OF_TRAINING:-240}
raw_steps=${RAW_STEPS:-500}
device=cuda envs=4096 flags=()
if [[ ${TINY:-0} == 1 ]]; then
    device=cpu envs=8 seconds=${SECONDS_OF_TRAINING:-2} raw_steps=${RAW_STEPS:-3}
    flags=(--no-cuda --num-steps 16 --num-minibatches 2 --update-epochs 1 --log-every 1)
fi
exp_name=ppo_isaacgym_gpu

$PYTHON - "$device" "$envs" "$raw_steps" <<'PY' | tee "$RESULTS/ppo_isaacgym_gpu_raw.txt"
import sys, time
import torch
sys.path.insert(0, "cleanrl")
import ppo_isaacgym as pig
device, envs, steps = torch.device(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
env = pig.MuJoCoWarpVecEnv("Ant", envs, device, seed=1)
actions = lambda: 2 * torch.rand(envs, env.act_dim, device=device) - 1
for _ in range(min(20, steps)):
    env.step(actions())
sync()
start = time.perf_counter()
for _ in range(steps):
    env.step(actions())
sync()
print(f"raw simulator SPS {steps * envs / (time.perf_counter() - start):.0f}")
PY

$PYTHON cleanrl/ppo_isaacgym.py --env-id Ant --simulator mujoco-warp --num-envs "$envs" --exp-name "$exp_name" \
    --total-timesteps 1000000000 --time-limit-seconds "$seconds" --seed 1 "${flags[@]}"

$PYTHON - "$out" "$seconds" "$envs" "$RESULTS/ppo_isaacgym_gpu_raw.txt" "$exp_name" <<'PY'
import sys
from pathlib import Path
from cleanrl_utils.results import RunError, machine_description, read_scalar
out, seconds, envs, raw, exp_name = sys.argv[1:]
run_dir = sorted(Path("runs").glob(f"Ant__{exp_name}__1__*"), key=lambda p: p.stat().st_mtime)[-1]
steps, _, sps = read_scalar(run_dir, "charts/SPS")
try:
    _, _, returns = read_scalar(run_dir, "charts/episodic_return")
    last, best = f"{returns[-1]:.1f}", f"{max(returns):.1f}"
except RunError:  # no episode ended (a tiny run)
    last = best = "no episode ended"
raw = Path(raw).read_text().split()[-1]
Path(out).write_text(
    f"# ppo_isaacgym.py on a GPU (MuJoCo Warp, Ant-v5 task, {int(envs):,} environments)\n\n"
    f"Machine: {machine_description()}. Commands: benchmark/ppo_isaacgym_gpu.sh. Run: {run_dir.name}.\n\n"
    "| task | simulator | training time | steps | SPS | raw simulator SPS | return (last log) | best logged return | CleanRL Isaac Gym Ant (RTX A6000, 240 s) |\n"
    "|---|---|---|---|---|---|---|---|---|\n"
    f"| Ant | MuJoCo Warp (gymnasium Ant-v5 task) | {seconds} s | {steps[-1]:,} | {sps[-1]:,.0f} | {int(raw):,} | "
    f"{last} | {best} | 3953.30 +- 667.09 (Isaac Gym's Ant task, 3 seeds) |\n\n"
    "One seed. The returns are not directly comparable: Isaac Gym's Ant task has its own reward "
    "(progress towards a target, heading and up bonuses ...), this is gymnasium's Ant-v5 reward. "
    "The return is the mean over the episodes that ended within a logging interval (10 iterations).\n")
print(Path(out).read_text())
PY
