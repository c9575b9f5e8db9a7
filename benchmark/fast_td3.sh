#!/usr/bin/env bash
# fast_td3_isaacgym.py on Hopper-v5 through gymnasium's CPU vector env (16 environments), beside
# td3_continuous_action.py (one environment), seeds 1-3, at equal environment steps and at equal wall time
# (2-core CPU machine, no GPU). Parts, in order (all by default): td3, fast_steps, fast_wall, table.
#
#   td3         td3_continuous_action.py, 100k steps, CleanRL's defaults but 5k random steps (not 25k of 100k).
#   fast_steps  fast_td3_isaacgym.py, the same 100k steps: 16 environments, batches of 256 drawn evenly from them,
#               two critic updates per step of all 16 (one per 8 transitions, where TD3 makes one per transition),
#               the same 5k random steps, a critic support of [-100, 400] (Hopper's discounted returns), the rest
#               the script's defaults (the authors': 3-step returns, 101 atoms, AdamW, noise scales 0.001-0.4).
#   fast_wall   fast_td3_isaacgym.py as fast_steps, stopped by --time-limit-seconds at the mean wall time of the
#               td3 runs: what each reaches in the same time on the same machine.
#   table       benchmark/results/fast_td3.md/.csv and fast_td3.png (return against steps and against wall time).
#
# All with --torch-threads 1: two runs share the machine's two cores (WORKERS=2). Scored on the last 10 entries of
# charts/episodic_return: td3 logs every episode, fast_td3 the mean of the episodes that ended in each 100 steps.
# Finished runs are archived to benchmark/runs (commit them); stopped, the same command continues.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="uv run --extra mujoco python"
FAST="--simulator gymnasium --num-envs 16 --batch-size 256 --buffer-size 20000 --learning-starts 5000 --v-min -100 --v-max 400 --torch-threads 1 --log-every 100"
bench() {  # one part's 3 seeds; the table part tabulates them all together
    $PY -m cleanrl_utils.benchmark --env-ids Hopper-v5 --command "$1" --num-seeds 3 --workers "${WORKERS:-1}" \
        --archive benchmark/runs
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(td3 fast_steps fast_wall table)
for part in "${parts[@]}"; do
    case "$part" in
    td3)
        bench "$PY cleanrl/td3_continuous_action.py --exp-name td3_ls5000 --total-timesteps 100000 --learning-starts 5000 --torch-threads 1 --checkpoint-every 25000" ;;
    fast_steps)
        bench "$PY cleanrl/fast_td3_isaacgym.py --exp-name fast_td3_100k --total-timesteps 100000 $FAST" ;;
    fast_wall)
        seconds=$($PY -c "import glob, numpy as np; from pathlib import Path; from cleanrl_utils.results import training_seconds; print(round(np.mean([training_seconds(Path(p)) for p in glob.glob('runs/Hopper-v5__td3_ls5000__*')])))")
        echo "fast_wall: --time-limit-seconds $seconds (the td3 runs' mean wall time)"
        bench "$PY cleanrl/fast_td3_isaacgym.py --exp-name fast_td3_wall --total-timesteps 10000000 --time-limit-seconds $seconds $FAST" ;;
    table)
        runs=(runs/Hopper-v5__td3_ls5000__* runs/Hopper-v5__fast_td3_100k__* runs/Hopper-v5__fast_td3_wall__*)
        $PY -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output benchmark/results/fast_td3
        $PY -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/fast_td3.png ;;
    *) echo "unknown part: $part (td3, fast_steps, fast_wall, table)" >&2; exit 2 ;;
    esac
done
