#!/usr/bin/env bash
# sac_continuous_action.py, one run at a time (2-core CPU machine), standard hyperparameters:
# Pendulum-v1 20k steps seeds 1-3, Hopper-v5 200k steps seed 1.
# Pendulum-v1 is scored on its last 10 episodes (the last 2,000 steps): a quarter of its 100
# episodes are the random warm-up. Results: benchmark/results/sac.md and .csv, curves in benchmark/results/sac.png (made by the last two commands).
# --torch-threads 1: these runs shared the 2-core machine with another single-threaded benchmark;
# drop it on a machine of your own (the default uses one thread per core).
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/sac_continuous_action.py --env-id Pendulum-v1 --seed "$seed" --total-timesteps 20000 --torch-threads 1
done
uv run --extra mujoco python cleanrl/sac_continuous_action.py --env-id Hopper-v5 --seed 1 --total-timesteps 200000 --torch-threads 1
uv run python -m cleanrl_utils.results runs/Pendulum-v1__sac_continuous_action__* runs/Hopper-v5__sac_continuous_action__* \
    --last-episodes Pendulum-v1=10 --output benchmark/results/sac
uv run python -m cleanrl_utils.plot runs/Pendulum-v1__sac_continuous_action__* runs/Hopper-v5__sac_continuous_action__* \
    --output benchmark/results/sac.png
