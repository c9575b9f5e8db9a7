#!/usr/bin/env bash
# rpo_continuous_action.py (--rpo-alpha 0.5, the paper's and CleanRL's default) beside ppo_continuous_action.py at the
# same steps and settings (CleanRL's: 1 env x 2048 steps, 10 epochs x 32 minibatches, lr 3e-4 annealed), seeds 1-3,
# 300k steps (what fits two CPU cores; CleanRL's RPO runs are 8M):
#   Hopper-v5: rpo here; plain PPO is the H-term study's ppo_plain arm (benchmark/h_term.sh: the same script, flags and
#     steps), archived in benchmark/runs, seeds 1-3.
#   dm_control/cartpole-swingup-v0: rpo and plain PPO (run name ppo_plain) here.
# A uniform random policy on each (benchmark/random_policy_box.py, 100k steps, seeds 1-3), scored the same way.
# Finished runs are archived to benchmark/runs (commit them). Results: benchmark/results/rpo_continuous_action.md and .png.
#     bash benchmark/rpo_continuous_action.sh [runs|table]
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL=egl
DMC=dm_control/cartpole-swingup-v0
bench() {  # $1 env ids, $2 script, $3 extra flags
    uv run --extra mujoco python -m cleanrl_utils.benchmark --env-ids $1 --num-seeds 3 --workers "${WORKERS:-2}" \
        --command "uv run --extra mujoco python cleanrl/$2 --total-timesteps 300000 --checkpoint-every 100000 $3" \
        --archive benchmark/runs --output "/tmp/rpo_bench_${2%.py}"
}
if [ "${1:-runs}" = runs ]; then
    bench "Hopper-v5 $DMC" rpo_continuous_action.py ""
    bench "$DMC" ppo_continuous_action.py "--exp-name ppo_plain"
    for env_id in Hopper-v5 "$DMC"; do
        for seed in 1 2 3; do
            uv run --extra mujoco python benchmark/random_policy_box.py --env-id "$env_id" --seed "$seed" \
                --total-timesteps 100000
        done
        uv run python -m cleanrl_utils.archive runs/"${env_id//\//-}"__random_policy__* --to benchmark/runs
    done
fi
# The table and the curves read the archived copies (seeds 1-3 of the H-term study's plain PPO on Hopper).
runs=(benchmark/runs/Hopper-v5__rpo_continuous_action__* benchmark/runs/dm_control-cartpole-swingup-v0__*__[123]__*)
runs+=(benchmark/runs/Hopper-v5__ppo_plain__[123]__* benchmark/runs/Hopper-v5__random_policy__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/rpo_continuous_action
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/rpo_continuous_action.png
