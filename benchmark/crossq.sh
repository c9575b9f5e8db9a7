#!/usr/bin/env bash
# crossq_continuous_action.py on Hopper-v5 beside sac_continuous_action.py and redq_continuous_action.py at the same
# budget, 12k steps (5,000 of them random: each script's default), seeds 1-3: the budget at which redq.sh could run
# REDQ here (benchmark/results/redq.md: REDQ 338.75 and SAC 274.77, seed 1 each; 45 min per REDQ seed).
# Parts (all by default, in order): crossq, sac, table; at 100k steps (REDQ's headline budget): crossq_100k, sac_100k,
# table_100k (measured: ~70 min per CrossQ seed and ~18 per SAC seed on one core, two runs at a time).
#
#   crossq  CrossQ with 512-wide critics (--critic-hidden 512), the paper's settings otherwise (batch renormalisation,
#           no target networks, Adam beta1 0.5, lr 1e-3, a policy update every 3rd critic update). The paper's 2048
#           takes 0.78 s per critic step on one core here (crossq_continuous_action.md), 90 min per seed for the
#           7,000 learning steps; 512 takes 0.10 s. The 2048-wide run is the GPU item `elegant`
#           (benchmark/elegant_gpu.sh).
#   sac     SAC at its defaults, the same 12k steps (exp name sac_12000, as redq.sh names its run).
#   table   benchmark/results/crossq_continuous_action_hopper.md/.csv and .png.
#
# --torch-threads 1: two runs share the machine's 2 cores (WORKERS=2). Scored on the last 10 episodes, as redq.md.
# Finished runs are archived to benchmark/runs (commit them); stopped, the same command continues.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="uv run --extra mujoco python"
bench() {  # one part's 3 seeds; the table part tabulates them together
    $PY -m cleanrl_utils.benchmark --env-ids Hopper-v5 --command "$1" --num-seeds 3 --workers "${WORKERS:-1}" \
        --archive benchmark/runs
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(crossq sac table)
hopper_100k=(runs/Hopper-v5__crossq_w512_100k__* runs/Hopper-v5__sac_100k__*)
for part in "${parts[@]}"; do
    case "$part" in
    crossq)
        bench "$PY cleanrl/crossq_continuous_action.py --exp-name crossq_w512 --critic-hidden 512 --total-timesteps 12000 --torch-threads 1 --checkpoint-every 2000" ;;
    sac)
        bench "$PY cleanrl/sac_continuous_action.py --exp-name sac_12000 --total-timesteps 12000 --torch-threads 1 --checkpoint-every 2000" ;;
    crossq_100k)
        bench "$PY cleanrl/crossq_continuous_action.py --exp-name crossq_w512_100k --critic-hidden 512 --total-timesteps 100000 --torch-threads 1 --checkpoint-every 5000" ;;
    sac_100k)
        bench "$PY cleanrl/sac_continuous_action.py --exp-name sac_100k --total-timesteps 100000 --torch-threads 1 --checkpoint-every 5000" ;;
    table_100k)
        $PY -m cleanrl_utils.results "${hopper_100k[@]}" --last-episodes 10 --output benchmark/results/crossq_continuous_action_hopper_100k
        $PY -m cleanrl_utils.plot "${hopper_100k[@]}" --output benchmark/results/crossq_continuous_action_hopper_100k.png ;;
    table)
        runs=(runs/Hopper-v5__crossq_w512__* runs/Hopper-v5__sac_12000__*)
        $PY -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output benchmark/results/crossq_continuous_action_hopper
        $PY -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/crossq_continuous_action_hopper.png ;;
    *) echo "unknown part: $part (crossq, sac, table, crossq_100k, sac_100k, table_100k)" >&2; exit 2 ;;
    esac
done
