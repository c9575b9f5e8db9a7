#!/usr/bin/env bash
# ddpg_continuous_action.py: Pendulum-v1 20k steps, seeds 1-3, one run at a time (2-core CPU
# machine). Results: benchmark/results/ddpg.md and ddpg.png.
#
# --learning-starts 1000: CleanRL's default of 25000 random steps is more than the whole
# 20k-step run, so nothing would be learned (the script refuses such a run). Everything else
# is CleanRL's defaults.
# --torch-threads 1: these runs shared the 2-core machine with another single-threaded benchmark;
# drop it on a machine of your own (the default uses one thread per core).
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/ddpg_continuous_action.py --env-id Pendulum-v1 --seed "$seed" --total-timesteps 20000 --torch-threads 1 --learning-starts 1000
done
runs=(runs/Pendulum-v1__ddpg_continuous_action__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --last-episodes Pendulum-v1=10 --output benchmark/results/ddpg
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ddpg.png
