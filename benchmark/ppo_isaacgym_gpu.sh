#!/usr/bin/env bash
# ppo_isaacgym.py on one NVIDIA GPU with MuJoCo Warp, sized to one device call (benchmark/gpu/README.md). Called by
# benchmark/gpu/run_all.sh; alone on a node:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/ppo_isaacgym_gpu.sh
#  1. Raw simulator SPS: Ant at RAW_SIZES worlds (4096 8192), uniform random actions, RAW_STEPS steps after 20 of
#     warm-up (the first size also compiles the kernels: a cold ~/.cache/warp).
#  2. Training: Ant, 4096 environments x 16 steps (the script's defaults), seed SEED, stopped after
#     SECONDS_OF_TRAINING (240) s of training (--time-limit-seconds; start-up and compilation not counted, as in
#     CleanRL's "train time"). Recorded: SPS, the episodic return against wall time and steps (the mean over the
#     episodes that ended in each logging interval), the contact-buffer counters the script logs, and the GPU's peak
#     memory in use (nvidia-smi, sampled every 200 ms: Warp's allocations are not torch's).
# Results: $RESULTS/ppo_isaacgym_gpu.md (RESULTS=benchmark/results) and the run folder, beside CleanRL's Isaac Gym
# Ant (RTX A6000, 240 s). TINY=1: 8 worlds on the CPU for a few seconds (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
out=$RESULTS/ppo_isaacgym_gpu.md
seconds=${SECONDS_OF_TRAINING:-240}
raw_steps=${RAW_STEPS:-500}
raw_sizes=${RAW_SIZES:-4096 8192}
seed=${SEED:-1}
device=cuda envs=4096 flags=()
if [[ ${TINY:-0} == 1 ]]; then
    device=cpu envs=8 seconds=${SECONDS_OF_TRAINING:-2} raw_steps=${RAW_STEPS:-3} raw_sizes=${RAW_SIZES:-8}
    flags=(--no-cuda --num-steps 16 --num-minibatches 2 --update-epochs 1 --log-every 1)
fi
exp_name=ppo_isaacgym_gpu
memory_log=$RESULTS/ppo_isaacgym_gpu_memory.csv
if [[ $device == cuda ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -lms 200 >"$memory_log" &
    sampler=$!
    trap 'kill $sampler 2>/dev/null || true' EXIT
else
    : >"$memory_log"
fi

$PYTHON - "$device" "$raw_steps" $raw_sizes <<'PY' | tee "$RESULTS/ppo_isaacgym_gpu_raw.txt"
import sys, time
import torch
from cleanrl_utils.envs.mujoco_warp_env import MuJoCoWarpVecEnv
device, steps, sizes = torch.device(sys.argv[1]), int(sys.argv[2]), [int(n) for n in sys.argv[3:]]
sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
for envs in sizes:
    env = MuJoCoWarpVecEnv("Ant", envs, device, seed=1)
    actions = lambda: 2 * torch.rand(envs, env.act_dim, device=device) - 1
    for _ in range(min(20, steps)):
        env.step(actions())
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        env.step(actions())
    sync()
    print(f"raw simulator SPS at {envs} worlds: {steps * envs / (time.perf_counter() - start):.0f}", flush=True)
    del env
PY

$PYTHON cleanrl/ppo_isaacgym.py --env-id Ant --simulator mujoco-warp --num-envs "$envs" --exp-name "$exp_name" \
    --total-timesteps 1000000000 --time-limit-seconds "$seconds" --seed "$seed" "${flags[@]}"
[[ -n ${sampler:-} ]] && kill "$sampler" 2>/dev/null || true

$PYTHON - "$out" "$seconds" "$envs" "$RESULTS/ppo_isaacgym_gpu_raw.txt" "$exp_name" "$seed" "$memory_log" <<'PY'
import sys
from pathlib import Path
from cleanrl_utils.results import RunError, load_events, machine_description, read_scalar
out, seconds, envs, raw, exp_name, seed, memory_log = sys.argv[1:]
run_dir = sorted(Path("runs").glob(f"Ant__{exp_name}__{seed}__*"), key=lambda p: p.stat().st_mtime)[-1]
events = load_events(run_dir)
steps, times, sps = read_scalar(run_dir, "charts/SPS", events)
raw_rows = [line.split(" worlds: ") for line in Path(raw).read_text().splitlines() if " worlds: " in line]
raw_text = ", ".join(f"{int(n.split()[-1]):,} worlds: {int(v):,}" for n, v in raw_rows)
memory = [line.split(",") for line in Path(memory_log).read_text().splitlines() if line.strip()]
peak = f"{max(int(m[0]) for m in memory):,} MiB of {int(memory[0][1]):,} MiB" if memory else "not measured (no GPU)"
counters = [t for t in events.Tags()["scalars"] if t.endswith("_buffer_use")]  # peak share of each buffer used
counter_text = "; ".join(f"{t}: peak {read_scalar(run_dir, t, events)[2].max():.2f}" for t in counters) or "none logged"
try:
    r_steps, r_times, returns = read_scalar(run_dir, "charts/episodic_return", events)
    start = times[0] - (steps[0] / sps[0] if sps[0] > 0 else 0)
    curve = "\n".join(
        f"| {t - start:.0f} | {s:,} | {r:.1f} |" for s, t, r in zip(r_steps, r_times, returns)
    )
    last, best = f"{returns[-1]:.1f}", f"{max(returns):.1f}"
except RunError:  # no episode ended (a tiny run)
    curve, last, best = "| - | - | no episode ended |", "no episode ended", "-"
Path(out).write_text(
    f"# ppo_isaacgym.py on a GPU (MuJoCo Warp, Ant-v5 task, {int(envs):,} environments)\n\n"
    f"Machine: {machine_description()}. Commands: benchmark/ppo_isaacgym_gpu.sh (seed {seed}). Run: {run_dir.name}.\n\n"
    "| task | simulator | training time | steps | SPS | raw simulator SPS | peak GPU memory | return (last log) "
    "| best logged return | CleanRL Isaac Gym Ant (RTX A6000, 240 s) |\n"
    "|---|---|---|---|---|---|---|---|---|---|\n"
    f"| Ant | MuJoCo Warp (gymnasium Ant-v5 task) | {seconds} s | {steps[-1]:,} | {sps[-1]:,.0f} | {raw_text} | "
    f"{peak} | {last} | {best} | 3953.30 +- 667.09 (Isaac Gym's Ant task, 3 seeds) |\n\n"
    f"MuJoCo Warp's contact and constraint buffers, the peak share used between log lines (1.00: full; the run "
    f"stops in one line if they overflow): {counter_text}.\n\n"
    "One seed per run. The returns are not directly comparable: Isaac Gym's Ant task has its own reward "
    "(progress towards a target, heading and up bonuses ...), this is gymnasium's Ant-v5 reward. Published gymnasium "
    "Ant PPO returns come from 1M-step runs with one vectorised CPU env, not from 240 s: CleanRL-trained Ant-v4 models "
    "on the Hugging Face hub evaluate at 2683.96 +- 889.12 and 3491.84 +- 643.67 "
    "(sdpkjc/Ant-v4-ppo_fix_continuous_action-seed5, -seed2). "
    "The return is the mean over the episodes that ended within a logging interval (10 iterations).\n\n"
    "| training seconds (approx.) | steps | episodic return |\n|---|---|---|\n" + curve + "\n"
)
print(Path(out).read_text())
PY
