#!/usr/bin/env bash
# ppo_isaacgym.py --simulator mjlab on the CPU (issue 49, item 3): mjlab's tasks through cleanrl_utils/envs/mjlab_env.py,
# in projects/mjlab's environment (mjlab pins its own MuJoCo). Results: benchmark/results/ppo_isaacgym_cpu_simulators.md,
# section "mjlab". One process at a time (2-core machine).
#  1. Steps/s: the raw simulator (MjlabVecEnv, uniform random actions in [-1, 1], 20 steps after 3 warm-up steps) and
#     training (the SPS the script logs at its end, 4 iterations) for Cartpole balance and Go1 flat velocity tracking.
#  2. Cartpole balance and swing-up, 3 seeds each, to their solved return. mjlab scales rewards by the step's dt
#     (0.05 s), so a 1000-step episode returns at most 50 (dm_control's 1000 x 0.05); "solved" here: 40 for balance,
#     (dm_control's 800 of 1000, x 0.05), the same for swing-up. 256 envs x 32 steps (mjlab's rollout length for
#     Cartpole), the script's other defaults.
#  3. Go1 flat velocity tracking, seed 1, 256 envs for an hour of wall clock: whether its tracking reward
#     (TensorBoard mjlab/Episode_Reward/track_linear_velocity) rises at this budget.
# The first step compiles MuJoCo Warp's kernels (a minute or two on a cold ~/.cache/warp). A 2-minute smoke of the whole
# file: SMOKE=1 bash benchmark/ppo_isaacgym_mjlab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=  # keep the bytecode of mjlab's environment (CI sets the variable)
mj="uv run --project $PWD/projects/mjlab"
root=$PWD
smoke=${SMOKE:-0}
if [ "$smoke" = 1 ]; then
    sps_sizes="Mjlab-Cartpole-Balance:16"; seeds="1"; cartpole_envs=16; cartpole_steps=4096; go1_seconds=20; go1_envs=8; out=/tmp/mjlab_sps.md
else
    sps_sizes="Mjlab-Cartpole-Balance:256 Mjlab-Cartpole-Balance:1024 Mjlab-Velocity-Flat-Unitree-Go1:64 Mjlab-Velocity-Flat-Unitree-Go1:256"
    seeds="1 2 3"; cartpole_envs=256; cartpole_steps=3000000; go1_seconds=3600; go1_envs=256
    out=/tmp/mjlab_sps.md  # copied into the results file's mjlab section by hand
fi

# 1. steps/s
echo "| task | envs | raw simulator steps/s | training SPS |" > "$out"
echo "|---|---|---|---|" >> "$out"
for spec in $sps_sizes; do
    task=${spec%%:*}; envs=${spec##*:}
    raw=$($mj python - "$task" "$envs" <<'PY' 2>/dev/null | tail -1
import sys, time, torch
from cleanrl_utils.envs.mjlab_env import MjlabVecEnv
task, n = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
env = MjlabVecEnv(task, n, torch.device("cpu"), seed=1)
env.reset()
actions = lambda: 2 * torch.rand(n, env.act_dim) - 1
for _ in range(3):
    env.step(actions())
start = time.time()
for _ in range(20):
    env.step(actions())
print(round(20 * n / (time.time() - start)))
PY
)
    dir=$(mktemp -d)
    (cd "$dir" && $mj python "$root/cleanrl/ppo_isaacgym.py" --simulator mjlab --env-id "$task" \
        --num-envs "$envs" --num-steps 16 --total-timesteps $((envs * 16 * 4)) --no-cuda >/dev/null 2>&1)
    training=$($mj python - "$dir" <<'PY' 2>/dev/null | tail -1
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(glob.glob(sys.argv[1] + "/runs/*")[0]); acc.Reload()
print(round(acc.Scalars("charts/SPS")[-1].value))
PY
)
    echo "| $task | $envs | $raw | $training |" | tee -a "$out"
    rm -rf "$dir"
done

# 2. Cartpole balance and swing-up, 3 seeds each
for task in Mjlab-Cartpole-Balance Mjlab-Cartpole-Swingup; do
    for seed in $seeds; do
        $mj python cleanrl/ppo_isaacgym.py --simulator mjlab --env-id "$task" --seed "$seed" --num-envs "$cartpole_envs" \
            --num-steps 32 --total-timesteps "$cartpole_steps" --no-cuda
    done
done

# 3. Go1 flat velocity tracking, an hour
$mj python cleanrl/ppo_isaacgym.py --simulator mjlab --env-id Mjlab-Velocity-Flat-Unitree-Go1 --seed 1 \
    --num-envs "$go1_envs" --num-steps 24 --total-timesteps 1000000000 --time-limit-seconds "$go1_seconds" --no-cuda
echo "steps/s table: $out"
