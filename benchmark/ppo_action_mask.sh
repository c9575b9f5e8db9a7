#!/usr/bin/env bash
# ppo_action_mask.py on Taxi-v4, 500k steps, seeds 1-3, with the environment's action masks and without them
# (--no-mask-actions, exp name ppo_no_mask: plain PPO on the same task). Taxi-v4: 200-step episodes, +20 for a
# delivery, -1 a step, -10 for a wrong pick-up or drop-off; an optimal policy scores ~8 (about 13 steps a delivery).
# Parts (all by default, in order): masked, unmasked, table. WORKERS=2 runs two seeds at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="uv run python"
bench() {
    $PY -m cleanrl_utils.benchmark --env-ids Taxi-v4 --command "$1" --num-seeds 3 --workers "${WORKERS:-1}" \
        --archive benchmark/runs
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(masked unmasked table)
for part in "${parts[@]}"; do
    case "$part" in
    masked) bench "$PY cleanrl/ppo_action_mask.py --total-timesteps 500000 --checkpoint-every 100000" ;;
    unmasked)
        bench "$PY cleanrl/ppo_action_mask.py --exp-name ppo_no_mask --no-mask-actions --total-timesteps 500000 --checkpoint-every 100000" ;;
    table)
        runs=(runs/Taxi-v4__ppo_action_mask__* runs/Taxi-v4__ppo_no_mask__*)
        $PY -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/ppo_action_mask
        $PY -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_action_mask.png ;;
    *) echo "unknown part: $part (masked, unmasked, table)" >&2; exit 2 ;;
    esac
done
