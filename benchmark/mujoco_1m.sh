#!/usr/bin/env bash
# CleanRL's MuJoCo table at its budget, 1M steps, seeds 1-3, on MuJoCo v5 (CleanRL's published figures are v4:
# ../shared/BENCHMARKS.md; benchmark/results/mujoco_1m.md sets them side by side). A campaign across sessions: every
# part resumes where it stopped (the runner continues a stopped run from its checkpoint, skips finished ones and
# archives each finished or stopped run to benchmark/runs/, which is committed), so the next session continues it with
# the same command.
#
#   bash benchmark/mujoco_1m.sh ppo            # ppo_continuous_action on Hopper, HalfCheetah, Walker2d, Ant, Humanoid
#   bash benchmark/mujoco_1m.sh offpolicy      # sac and td3 on HalfCheetah: seed 1 of each, then seeds 2 and 3
#   bash benchmark/mujoco_1m.sh hopper_offpolicy   # the same on Hopper-v5, if the campaign has the time
#   bash benchmark/mujoco_1m.sh table          # benchmark/results/mujoco_1m.md/.csv and the curves
#
# Parts run in the order given (default: ppo offpolicy table). WORKERS (default 1) runs that many jobs at once; each
# run takes one torch thread, so WORKERS=2 fills this 2-core machine. --checkpoint-every: PPO 20k steps (~30 s),
# SAC/TD3 10k steps (~5 min at their speed here), so a session's end costs little.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL=egl
PY="uv run --extra mujoco python"
bench() {  # bench ENV_IDS SEEDS START_SEED COMMAND
    $PY -m cleanrl_utils.benchmark --env-ids $1 --num-seeds "$2" --start-seed "$3" --command "$4" \
        --workers "${WORKERS:-1}" --archive benchmark/runs
}
ppo="$PY cleanrl/ppo_continuous_action.py --total-timesteps 1000000 --torch-threads 1 --checkpoint-every 20000"
sac="$PY cleanrl/sac_continuous_action.py --total-timesteps 1000000 --torch-threads 1 --checkpoint-every 10000"
td3="$PY cleanrl/td3_continuous_action.py --total-timesteps 1000000 --torch-threads 1 --checkpoint-every 10000"
ppo_envs="Hopper-v5 HalfCheetah-v5 Walker2d-v5 Ant-v5 Humanoid-v5"
offpolicy() {  # one seed of each script first, so a partial table already compares them
    bench "$1" 1 1 "$sac"
    bench "$1" 1 1 "$td3"
    bench "$1" 2 2 "$sac"
    bench "$1" 2 2 "$td3"
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(ppo offpolicy table)
for part in "${parts[@]}"; do
    case "$part" in
    ppo) bench "$ppo_envs" 3 1 "$ppo" ;;
    offpolicy) offpolicy HalfCheetah-v5 ;;
    hopper_offpolicy) offpolicy Hopper-v5 ;;
    table) $PY benchmark/mujoco_1m_table.py ;;
    *) echo "unknown part: $part (ppo, offpolicy, hopper_offpolicy, table)" >&2; exit 2 ;;
    esac
done
