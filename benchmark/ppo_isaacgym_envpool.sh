#!/usr/bin/env bash
# Learning on a CPU with the headline script: ppo_isaacgym.py through envpool's C++ MuJoCo (the fastest CPU path,
# benchmark/results/ppo_isaacgym_cpu_simulators.md) at the GPU defaults (4096 envs x 16 steps, 2 minibatches, 4
# epochs, lr 0.0026), seeds 1-3 on Ant and Humanoid, one hour of training a seed (--time-limit-seconds 3600); and
# fast_td3_isaacgym.py on Ant through envpool at a CPU-sized batch for the same hour, seeds 1-3, so the two
# algorithms' curves sit side by side against wall time. A campaign across sessions, like benchmark/mujoco_1m.sh: the
# runner continues a stopped run from its checkpoint (every ~5 min of training here), skips finished ones and
# archives each finished or stopped run to benchmark/runs/ (committed), so the next session continues with the same
# command. A resumed run's --time-limit-seconds counts from its resume: an interrupted seed trains up to an hour per
# segment, which the wall-time curves show (cleanrl_utils.plot leaves the wait between stop and resume out).
#
#   bash benchmark/ppo_isaacgym_envpool.sh ppo        # ppo_isaacgym: Ant seeds 1-3, then Humanoid seeds 1-3 (~6 h)
#   bash benchmark/ppo_isaacgym_envpool.sh td3        # fast_td3_isaacgym: Ant seeds 1-3 (~3 h)
#   bash benchmark/ppo_isaacgym_envpool.sh table      # tables and curves in benchmark/results/ppo_isaacgym_envpool*
#   SMOKE=1 bash benchmark/ppo_isaacgym_envpool.sh ppo td3   # the same commands for 60 s each, seed 1, into /tmp
#
# Parts run in the order given (default: ppo td3 table), one job at a time (WORKERS=1). envpool on 1 thread: on this
# shared 2-core machine it stepped faster than on 2 (benchmark/results/ppo_isaacgym_cpu_simulators.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="uv run --all-extras python"
SECONDS_PER_SEED=3600
SEEDS=3
ARCHIVE=benchmark/runs
OUT=benchmark/results
if [ "${SMOKE:-0}" = 1 ]; then  # a check of the commands: short runs (in runs/, told apart by their time limit)
    SECONDS_PER_SEED=60 SEEDS=1 ARCHIVE=/tmp/ppo_isaacgym_envpool_smoke/archive OUT=/tmp/ppo_isaacgym_envpool_smoke
    mkdir -p "$ARCHIVE"
fi
bench() {  # bench ENV_IDS OUTPUT COMMAND
    $PY -m cleanrl_utils.benchmark --env-ids $1 --num-seeds "$SEEDS" --start-seed 1 --command "$3" \
        --workers "${WORKERS:-1}" --archive "$ARCHIVE" --output "$2"
}
# ppo_isaacgym: the GPU defaults; 30M steps is a cap the hour does not reach here (~1.4-1.6k training SPS).
# --checkpoint-every 1,048,576 steps (16 iterations): ~5 min on Ant, ~10 on Humanoid.
ppo="$PY cleanrl/ppo_isaacgym.py --simulator envpool --envpool-threads 1 --total-timesteps 30000000"
ppo+=" --time-limit-seconds $SECONDS_PER_SEED --checkpoint-every 1048576"
# fast_td3_isaacgym: a CPU-sized batch (16 envs, 2,048 transitions per update, networks as the authors'), replay of
# 20,000 steps per env (320k transitions), learning after 5,000 steps, a log line every 1,600 steps (the default:
# 100 steps of each env).
td3="$PY cleanrl/fast_td3_isaacgym.py --simulator envpool --envpool-threads 1 --num-envs 16 --batch-size 2048"
td3+=" --buffer-size 20000 --learning-starts 5000 --total-timesteps 10000000 --time-limit-seconds $SECONDS_PER_SEED"
td3+=" --checkpoint-every 32000"
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(ppo td3 table)
for part in "${parts[@]}"; do
    case "$part" in
    ppo)
        bench Ant "$OUT/ppo_isaacgym_envpool_ant" "$ppo"
        bench Humanoid "$OUT/ppo_isaacgym_envpool_humanoid" "$ppo"
        ;;
    td3) bench Ant "$OUT/fast_td3_isaacgym_envpool_ant" "$td3" ;;
    table)
        # The runner's tables (written by each part) and the curves, against steps and against wall time, of this
        # campaign's runs (envpool, this time limit) only.
        mapfile -t campaign < <($PY - "$SECONDS_PER_SEED" <<'PY'
import json, sys
from pathlib import Path
for args_file in sorted(Path("runs").glob("*__*_isaacgym__*/args.json")):
    args = json.loads(args_file.read_text())
    if args.get("simulator") == "envpool" and args.get("time_limit_seconds") == float(sys.argv[1]):
        print(args_file.parent)
PY
        )
        $PY -m cleanrl_utils.plot "${campaign[@]}" --output "$OUT/ppo_isaacgym_envpool.png"
        ;;
    *) echo "unknown part: $part (ppo, td3, table)" >&2; exit 2 ;;
    esac
done
