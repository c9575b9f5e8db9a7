#!/usr/bin/env bash
# fast_sac_isaacgym.py on Hopper-v5 through gymnasium's CPU vector env (16 environments), beside fast_td3_isaacgym.py
# (benchmark/fast_td3.sh's fast_steps runs, archived) and a uniform random policy, seeds 1-3, 100k steps each (2-core
# CPU machine, no GPU). Parts, in order (all by default): random, fast_sac, table.
#
#   random    benchmark/random_policy_box.py, 100k steps (exp name random_policy; archived by
#             benchmark/rpo_continuous_action.sh: the runner restores those runs and skips their jobs).
#   fast_sac  fast_sac_isaacgym.py, 100k steps, the sizes of fast_td3.sh's runs (16 environments, batches of 256
#             drawn evenly from them, buffers of 20k steps per environment, 5k steps before learning), the rest the
#             script's defaults, the authors' FastSAC: 8 critic and temperature updates and 2 policy updates per step
#             of all 16 (one critic update per 2 transitions, where fast_td3 makes one per 8), gamma 0.97, 1-step
#             returns, alpha from 0.001 toward an entropy target of 0, the critics' support from the task
#             ([-33.3, 166.7]: Hopper's per-step rewards over 1 - gamma).
#   table     benchmark/results/fast_sac.md/.csv and fast_sac.png, with fast_td3.sh's fast_td3_100k runs.
#
# All with --torch-threads 1: two runs share the machine's two cores (WORKERS=2). Scored on the last 10 entries of
# charts/episodic_return, as fast_td3.md is (fast_sac logs the mean of the episodes that ended in each 100 steps).
# Cost, measured here (2026-12-07, this 2-core machine under a load average of ~5, one torch thread): a 2-minute smoke
# (--time-limit-seconds 120) ran the 5k acting steps at ~1,300 SPS, then learned at 23 SPS (5,440 -> 7,680 steps in
# 96 s; fast_td3's runs, 2 critic updates a step, made 102): 100k steps take ~70 min a seed, the 3 seeds ~3.5 h of one
# core (WORKERS=2: ~1.8 h on two). Not run yet.
# Finished runs are archived to benchmark/runs (commit them); stopped, the same command continues each run from its
# latest checkpoint (--checkpoint-every 10000).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="uv run --extra mujoco python"
FAST="--simulator gymnasium --num-envs 16 --batch-size 256 --buffer-size 20000 --learning-starts 5000 --torch-threads 1 --log-every 100"
bench() {
    $PY -m cleanrl_utils.benchmark --env-ids Hopper-v5 --command "$1" --num-seeds 3 --workers "${WORKERS:-1}" \
        --archive benchmark/runs
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(random fast_sac table)
for part in "${parts[@]}"; do
    case "$part" in
    random)
        bench "$PY benchmark/random_policy_box.py --total-timesteps 100000" ;;
    fast_sac)
        bench "$PY cleanrl/fast_sac_isaacgym.py --exp-name fast_sac_100k --total-timesteps 100000 --checkpoint-every 10000 $FAST" ;;
    table)
        runs=(benchmark/runs/Hopper-v5__{fast_sac_100k,fast_td3_100k,random_policy}__[123]__*.tar.xz)  # the archived runs
        $PY -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output benchmark/results/fast_sac
        $PY -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/fast_sac.png ;;
    *) echo "unknown part: $part (random, fast_sac, table)" >&2; exit 2 ;;
    esac
done
