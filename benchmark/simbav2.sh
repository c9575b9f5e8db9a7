#!/usr/bin/env bash
# simbav2_continuous_action.py beside sac_continuous_action.py on Hopper-v5 at 300k steps, seeds 1-3 (a campaign across
# sessions: stopped, the same command continues each run from its checkpoint; finished runs are archived to
# benchmark/runs, which is committed).
#
#   simbav2 SimbaV2 at the authors' MuJoCo settings (the script's defaults: UTD 1, gamma 0.995 from the time limit)
#   sac     SAC at its defaults, the same steps (exp name sac_300k; the same jobs as benchmark/tqc.sh's, shared)
#   random  a uniform random policy, 20k steps (benchmark/random_policy_box.py, exp name random_20k; shared too)
#   table   benchmark/results/simbav2.md/.csv and .png (the last 100 episodes of each run)
#
# --torch-threads 1: two runs can share this 2-core machine (WORKERS=2). SimbaV2's critics are ~100x SAC's in
# compute per update: on this CPU a run is ~1 step/s (days for 300k steps); on a GPU it is the authors' setting.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL=egl
PY="uv run --extra mujoco python"
bench() {
    $PY -m cleanrl_utils.benchmark --env-ids Hopper-v5 --command "$1" --num-seeds 3 --workers "${WORKERS:-1}" \
        --archive benchmark/runs
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(random simbav2 sac table)
for part in "${parts[@]}"; do
    case "$part" in
    simbav2)
        bench "$PY cleanrl/simbav2_continuous_action.py --total-timesteps 300000 --torch-threads 1 --checkpoint-every 5000" ;;
    random)
        bench "$PY benchmark/random_policy_box.py --exp-name random_20k --total-timesteps 20000" ;;
    sac)
        bench "$PY cleanrl/sac_continuous_action.py --exp-name sac_300k --total-timesteps 300000 --torch-threads 1 --checkpoint-every 5000" ;;
    table)
        runs=(runs/Hopper-v5__simbav2_continuous_action__* runs/Hopper-v5__sac_300k__* runs/Hopper-v5__random_20k__*)
        $PY -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/simbav2
        $PY -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/simbav2.png ;;
    *) echo "unknown part: $part (random, simbav2, sac, table)" >&2; exit 2 ;;
    esac
done
