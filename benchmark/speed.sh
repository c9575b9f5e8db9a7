#!/usr/bin/env bash
# Speed of whole runs, start-up included, on a quiet machine (nothing else running).
# For each command: process wall time and peak memory (GNU time), the SPS the script logs
# (charts/SPS: steps / seconds since the training loop's set-up), and steps / process wall time.
# Usage: bash benchmark/speed.sh [label [name ...]]   -> appends rows to benchmark/results/speed_log.md
#   names: ppo dqn sac td3 ddpg ppo_continuous_action (default: all of them, one after another), ppo_atari (MinAtar
#   Breakout, 98 updates)
# SCRIPTS_ROOT=DIR runs DIR's cleanrl/ and cleanrl_utils/ instead (a `git worktree` of an older commit, for a
# before/after comparison: see benchmark/speed_ab.sh); OFF_POLICY_STEPS sets the SAC/TD3/DDPG length (default 15000).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
uv sync --all-extras --quiet
label=${1:-}
scripts_root=${SCRIPTS_ROOT:-$root}
off_policy_steps=${OFF_POLICY_STEPS:-15000}
out=benchmark/results/speed_log.md  # raw rows; benchmark/results/speed.md is the curated table
[ -f "$out" ] || printf '| command | steps | wall time (s) | SPS, whole process | SPS, logged by the script | peak memory (MB) | note |\n|---|---|---|---|---|---|---|\n' > "$out"

measure() {
    local steps=$1; shift
    local tmp; tmp=$(mktemp -d)
    # Run in a scratch folder so runs/ of the benchmark tables is not touched.
    ( cd "$tmp" && PYTHONPATH="$scripts_root" /usr/bin/time -f "%e %M" -o "$tmp/time" "$root/.venv/bin/python" \
        "$scripts_root/$1" "${@:2}" \
        --total-timesteps "$steps" > "$tmp/log" 2>&1 )
    read -r wall rss < "$tmp/time"
    local logged; logged=$("$root/.venv/bin/python" - "$tmp" <<'PY'
import sys, glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(glob.glob(sys.argv[1] + "/runs/*")[0]); acc.Reload()
print(f"{acc.Scalars('charts/SPS')[-1].value:,.0f}")
PY
)
    printf '| `%s` | %s | %.1f | %s | %s | %.0f | %s |\n' "$*" "$steps" "$wall" \
        "$(awk -v s="$steps" -v w="$wall" 'BEGIN { printf "%\047.0f", s / w }')" "$logged" "$(awk -v r="$rss" 'BEGIN { print r / 1024 }')" "$label" | tee -a "$out"
    rm -rf "$tmp"
}

# The settings of the speed targets: discrete scripts 100k steps on CartPole-v1; SAC / TD3 / DDPG 15k steps
# on Pendulum-v1 with 5000 random steps first (SAC's default; TD3's and DDPG's default of 25000
# exceeds the run); PPO continuous 50k steps on Hopper-v5. Everything else at the defaults.
names=("${@:2}")
[ ${#names[@]} -gt 0 ] || names=(ppo dqn sac td3 ddpg ppo_continuous_action)
for name in "${names[@]}"; do
    case $name in
        ppo | dqn) measure 100000 "cleanrl/$name.py" --env-id CartPole-v1 ;;
        sac | td3 | ddpg) measure "$off_policy_steps" "cleanrl/${name}_continuous_action.py" --env-id Pendulum-v1 --learning-starts 5000 ;;
        ppo_continuous_action) MUJOCO_GL=egl measure 50000 cleanrl/ppo_continuous_action.py --env-id Hopper-v5 ;;
        ppo_atari) measure 100352 cleanrl/ppo_atari.py --env-id MinAtar/Breakout-v1 ;;
        *) echo "unknown name: $name" >&2; exit 2 ;;
    esac
done
