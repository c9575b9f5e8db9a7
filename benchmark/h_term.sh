#!/usr/bin/env bash
# The H-term study: ppo_continuous_action.py on Hopper-v5 and Walker2d-v5, 300k steps, seeds 1-5, without the term and
# with it at ElegantRL's weight (--h-term-lambda 0.125, run name ppo_h_term). The table gives mean +- std across seeds
# and the IQM of the seeds' scores for both; the plot overlays the two. Parts can run apart (hours on 2 cores):
#     bash benchmark/h_term.sh plain|h_term|table
# Results: benchmark/results/h_term.md and h_term.png.
set -euo pipefail
cd "$(dirname "$0")/.."
run() {
    uv run --extra mujoco python -m cleanrl_utils.benchmark --env-ids Hopper-v5 Walker2d-v5 --num-seeds 5 \
        --command "uv run --extra mujoco python cleanrl/ppo_continuous_action.py --total-timesteps 300000 $1" \
        --workers "${WORKERS:-1}" --output "/tmp/h_term_$2"
}
case "$1" in
    plain) run "--exp-name ppo_plain" plain ;;
    h_term) run "--exp-name ppo_h_term --h-term-lambda 0.125" h_term ;;
    table)
        runs=(runs/Hopper-v5__ppo_plain__* runs/Walker2d-v5__ppo_plain__* runs/Hopper-v5__ppo_h_term__*
            runs/Walker2d-v5__ppo_h_term__*)
        uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/h_term
        uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/h_term.png
        ;;
    *) echo "usage: bash benchmark/h_term.sh plain|h_term|table" >&2; exit 2 ;;
esac
