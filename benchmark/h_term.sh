#!/usr/bin/env bash
# The H-term study: Hopper-v5 and Walker2d-v5, 300k steps, seeds 1-5, plain PPO (cleanrl/ppo_continuous_action.py,
# run name ppo_plain) beside PPO with ElegantRL's H-term (cleanrl/ppo_continuous_action_hterm.py at ElegantRL's
# settings, lambda 2^-3, run name ppo_hterm). Both at CleanRL's MuJoCo settings; with the same seed the two runs are
# identical until the term starts (2^11 stored transitions), so each seed is a paired comparison. The table gives
# mean +- std across seeds and the IQM; the plot overlays them. The placebo (run name ppo_hterm_placebo) is the
# variant with lambda 1e-9: the same code path and the same random draws as the H-term runs, a term too small to
# matter, so it shows how far runs move apart from the draws alone. Each finished run is archived to benchmark/runs
# (commit it), so a stopped study continues on another machine with the same commands:
#     bash benchmark/h_term.sh plain|hterm|placebo|table
# Results: benchmark/results/h_term.md and h_term.png.
set -euo pipefail
cd "$(dirname "$0")/.."
run() {
    uv run --extra mujoco python -m cleanrl_utils.benchmark --env-ids Hopper-v5 Walker2d-v5 --num-seeds 5 \
        --command "uv run --extra mujoco python cleanrl/$1 --total-timesteps 300000 --checkpoint-every 100000 $2" \
        --workers "${WORKERS:-1}" --archive benchmark/runs --output "/tmp/h_term_$3"
}
case "${1:-}" in
    plain) run ppo_continuous_action.py "--exp-name ppo_plain" plain ;;
    hterm) run ppo_continuous_action_hterm.py "--exp-name ppo_hterm" hterm ;;
    placebo) run ppo_continuous_action_hterm.py "--exp-name ppo_hterm_placebo --h-term-lambda 1e-9" placebo ;;
    table)
        runs=(runs/*-v5__ppo_plain__* runs/*-v5__ppo_hterm__* runs/*-v5__ppo_hterm_placebo__*)
        uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/h_term
        uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/h_term.png
        ;;
    *) echo "usage: bash benchmark/h_term.sh plain|hterm|placebo|table" >&2; exit 2 ;;
esac
