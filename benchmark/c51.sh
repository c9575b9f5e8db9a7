#!/usr/bin/env bash
# c51.py on CartPole-v1, 500k steps, seeds 1-3, one run at a time (2-core CPU machine), CleanRL's
# defaults (101 atoms on [-100, 100]). Results: benchmark/results/c51.md and c51.png.
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/c51.py --env-id CartPole-v1 --seed "$seed" --total-timesteps 500000
done
runs=(runs/CartPole-v1__c51__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/c51
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/c51.png
