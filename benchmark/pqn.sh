#!/usr/bin/env bash
# pqn.py on CartPole-v1, 500k steps, seeds 1-3, one run at a time (2-core CPU machine), CleanRL's
# pqn.py classic-control defaults. Results: benchmark/results/pqn.md and pqn.png.
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/pqn.py --env-id CartPole-v1 --seed "$seed" --total-timesteps 500000
done
runs=(runs/CartPole-v1__pqn__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/pqn
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/pqn.png
