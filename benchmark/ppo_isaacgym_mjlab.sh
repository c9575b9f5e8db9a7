#!/usr/bin/env bash
# ppo_isaacgym.py --simulator mjlab on the CPU: mjlab's tasks through cleanrl_utils/envs/mjlab_env.py, in
# projects/mjlab's environment (mjlab pins its own MuJoCo). A campaign across sessions like benchmark/mujoco_1m.sh: the
# runner continues a stopped run from its checkpoint, skips finished ones and archives each finished or stopped run to
# benchmark/runs/ (committed), so the next session continues with the same command. One process at a time.
#
#   bash benchmark/ppo_isaacgym_mjlab.sh sps       # steps/s of the raw simulator and of training (minutes)
#   bash benchmark/ppo_isaacgym_mjlab.sh cartpole  # Cartpole balance and swing-up, seeds 1-3, 3M steps each (~2.5 h)
#   bash benchmark/ppo_isaacgym_mjlab.sh go1       # Go1 flat velocity tracking, seed 1, an hour of training
#   bash benchmark/ppo_isaacgym_mjlab.sh table     # steps to the solved return and the curves, from the runs
#   SMOKE=1 bash benchmark/ppo_isaacgym_mjlab.sh sps cartpole go1 table   # the same commands, tiny, into /tmp
#
# sps: MjlabVecEnv's raw steps/s (uniform random actions in [-1, 1], 20 steps after 3 warm-up steps) and the training
# SPS the script logs over 4 iterations, Cartpole balance and Go1 at two sizes each, beside envpool 1.2.7's C++ ports of
# the same tasks (Python >= 3.12 only: a throwaway environment in /tmp, one envpool thread) and its port of MuJoCo
# Playground's Go1 joystick task, into benchmark/results/ppo_isaacgym_mjlab_sps.md. cartpole: 256 envs x 32 steps (mjlab's rollout length for Cartpole),
# the script's other defaults. mjlab scales rewards by the step's dt (0.05 s), so a 1000-step episode returns at most
# 50 (dm_control's 1000 x 0.05); solved: 40 (dm_control's 800 of 1000, x 0.05) for both. go1: 256 envs x 24 steps
# for an hour: whether its tracking reward (mjlab/Episode_Reward/track_linear_velocity) rises at this budget. The first
# step compiles MuJoCo Warp's kernels (a minute or two on a cold ~/.cache/warp). Parts run in the order given
# (default: sps cartpole go1 table).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=  # keep the bytecode of mjlab's environment (CI sets the variable)
root=$PWD
PY="uv run --project $root/projects/mjlab python"
OUT=benchmark/results
ARCHIVE=benchmark/runs
sps_sizes="Mjlab-Cartpole-Balance:256 Mjlab-Cartpole-Balance:1024 Mjlab-Velocity-Flat-Unitree-Go1:64"
sps_sizes+=" Mjlab-Velocity-Flat-Unitree-Go1:256"
seeds=3 cartpole_envs=256 cartpole_steps=3000000 go1_seconds=3600 go1_envs=256
if [ "${SMOKE:-0}" = 1 ]; then  # a check of the commands: short runs, results and archives under /tmp
    sps_sizes="Mjlab-Cartpole-Balance:16"
    seeds=1 cartpole_envs=16 cartpole_steps=4096 go1_seconds=20 go1_envs=8
    OUT=/tmp/ppo_isaacgym_mjlab_smoke ARCHIVE=/tmp/ppo_isaacgym_mjlab_smoke/archive
    mkdir -p "$ARCHIVE"
fi
bench() {  # bench ENV_IDS SEEDS OUTPUT COMMAND
    $PY -m cleanrl_utils.benchmark --env-ids $1 --num-seeds "$2" --start-seed 1 --command "$4" --workers 1 \
        --archive "$ARCHIVE" --output "$3"
}
# --checkpoint-every: ~5 min of training (Cartpole ~2k SPS, Go1 ~70 SPS here)
cartpole="$PY cleanrl/ppo_isaacgym.py --simulator mjlab --num-envs $cartpole_envs --num-steps 32"
cartpole+=" --total-timesteps $cartpole_steps --checkpoint-every 606208 --no-cuda"
go1="$PY cleanrl/ppo_isaacgym.py --simulator mjlab --num-envs $go1_envs --num-steps 24 --total-timesteps 1000000000"
go1+=" --time-limit-seconds $go1_seconds --checkpoint-every 24576 --no-cuda"

envpool_raw() {  # envpool_raw PYTHON TASK ENVS: envpool's raw steps/s, as MjlabVecEnv's is measured below
    "$1" - "$2" "$3" <<'PY' 2>/dev/null | tail -1
import sys, time, numpy as np, envpool
task, n = sys.argv[1], int(sys.argv[2])
env = envpool.make_gymnasium(task, num_envs=n, num_threads=1, seed=1)
env.reset()
actions = lambda: np.random.uniform(-1, 1, (n,) + env.action_space.shape).astype(np.float32)
for _ in range(3):
    env.step(actions())
start = time.time()
for _ in range(20):
    env.step(actions())
print(round(20 * n / (time.time() - start)))
PY
}

sps() {
    local out="$OUT/ppo_isaacgym_mjlab_sps.md" spec task envs raw training dir ported
    # envpool 1.2.7 (its mjlab and Playground ports) installs on Python >= 3.12 only: a throwaway environment
    local envpool_python=/tmp/cleanrl_envpool_1.2.7/bin/python
    if [ ! -x "$envpool_python" ]; then  # a Python 3.12 that runs: on PATH, else pyenv's (its shim may point elsewhere)
        local py312=""
        for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
            "$candidate" -c pass 2>/dev/null && py312=$candidate && break
        done
        [ -n "$py312" ] && uv venv -q --python "$py312" /tmp/cleanrl_envpool_1.2.7 &&
            uv pip install -q --python "$envpool_python" envpool==1.2.7 || envpool_python=""
    fi
    {
        echo "# ppo_isaacgym.py --simulator mjlab: steps/s on this machine's CPU"
        echo
        echo "\`bash benchmark/ppo_isaacgym_mjlab.sh sps\` on $(date -u +%Y-%m-%d), $(nproc) cores"
        echo "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), one torch thread, load average"
        echo "$(cut -d' ' -f1 /proc/loadavg) at the start (other jobs may share the cores). Raw: MjlabVecEnv stepping"
        echo "uniform random actions (20 steps after 3 warm-up steps); training: the SPS ppo_isaacgym.py logs over 4"
        echo "iterations of 16 steps; envpool 1.2.7: its C++ port of the task (Python 3.12, one thread), stepped alike."
        echo
        echo "| task | envs | raw simulator steps/s | training SPS | envpool 1.2.7's port, raw steps/s |"
        echo "|---|---|---|---|---|"
    } > "$out"
    for spec in $sps_sizes; do
        task=${spec%%:*} envs=${spec##*:}
        raw=$($PY - "$task" "$envs" <<'PY' 2>/dev/null | tail -1
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
        (cd "$dir" && $PY "$root/cleanrl/ppo_isaacgym.py" --simulator mjlab --env-id "$task" --num-envs "$envs" \
            --num-steps 16 --total-timesteps $((envs * 16 * 4)) --torch-threads 1 --no-cuda >/dev/null 2>&1)
        training=$($PY - "$dir" <<'PY' 2>/dev/null | tail -1
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(glob.glob(sys.argv[1] + "/runs/*")[0]); acc.Reload()
print(round(acc.Scalars("charts/SPS")[-1].value))
PY
        )
        ported=$([ -n "$envpool_python" ] && envpool_raw "$envpool_python" "$task" "$envs" || echo "-")
        echo "| $task | $envs | $raw | $training | $ported |" | tee -a "$out"
        rm -rf "$dir"
    done
    # MuJoCo Playground's Go1 joystick task (its own model, rewards and commands: another task), envpool only
    if [ -n "$envpool_python" ] && [ "${SMOKE:-0}" != 1 ]; then
        ported=$(envpool_raw "$envpool_python" Go1JoystickFlatTerrain-v1 256)
        echo "| Go1JoystickFlatTerrain-v1 (MuJoCo Playground's) | 256 | - | - | $ported |" | tee -a "$out"
    fi
}

campaign_runs() {  # campaign_runs ENV_PREFIX ARG VALUE: the ppo_isaacgym runs in runs/ of those tasks with ARG = VALUE
    $PY - "$@" <<'PY'
import json, sys
from pathlib import Path
prefix, arg, value = sys.argv[1:]
for args_file in sorted(Path("runs").glob(f"{prefix}*__ppo_isaacgym__*/args.json")):
    args = json.loads(args_file.read_text())
    if args.get("simulator") == "mjlab" and float(args.get(arg) or 0) == float(value):
        print(args_file.parent)
PY
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(sps cartpole go1 table)
for part in "${parts[@]}"; do
    case "$part" in
    sps) sps ;;
    cartpole)
        bench "Mjlab-Cartpole-Balance Mjlab-Cartpole-Swingup" "$seeds" "$OUT/ppo_isaacgym_mjlab_cartpole" "$cartpole"
        ;;
    go1) bench Mjlab-Velocity-Flat-Unitree-Go1 1 "$OUT/ppo_isaacgym_mjlab_go1" "$go1" ;;
    table)  # this campaign's runs only (not a smoke's nor another command's): matched by their arguments
        mapfile -t cartpole_runs < <(campaign_runs "Mjlab-Cartpole-" total_timesteps "$cartpole_steps")
        mapfile -t go1_runs < <(campaign_runs Mjlab-Velocity-Flat-Unitree-Go1 time_limit_seconds "$go1_seconds")
        if [ ${#cartpole_runs[@]} -gt 0 ]; then
            $PY benchmark/steps_to_threshold.py "${cartpole_runs[@]}" --threshold 40 --window 10 \
                --output "$OUT/ppo_isaacgym_mjlab_cartpole_solved"
            $PY -m cleanrl_utils.plot "${cartpole_runs[@]}" --output "$OUT/ppo_isaacgym_mjlab_cartpole.png"
        fi
        if [ ${#go1_runs[@]} -gt 0 ]; then
            $PY -m cleanrl_utils.plot "${go1_runs[@]}" --output "$OUT/ppo_isaacgym_mjlab_go1.png"
        fi
        ;;
    *) echo "unknown part: $part (sps, cartpole, go1, table)" >&2; exit 2 ;;
    esac
done
