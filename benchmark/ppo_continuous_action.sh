#!/usr/bin/env bash
# ppo_continuous_action.py on MuJoCo v5: Hopper-v5 and HalfCheetah-v5, 1M steps, seed 1 each,
# CleanRL's defaults (1 env x 2048 steps, 10 epochs x 32 minibatches, lr 3e-4 annealed).
# One run at a time (2-core CPU machine). Results: benchmark/results/ppo_continuous_action.md
# and .csv (the table) and benchmark/results/ppo_continuous_action.png (the curves).
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL=egl
for env_id in Hopper-v5 HalfCheetah-v5; do
    for seed in 1; do
        uv run --extra mujoco python cleanrl/ppo_continuous_action.py --env-id "$env_id" --seed "$seed" --total-timesteps 1000000
    done
done
runs=(runs/Hopper-v5__ppo_continuous_action__* runs/HalfCheetah-v5__ppo_continuous_action__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/ppo_continuous_action
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_continuous_action.png
