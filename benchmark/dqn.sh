#!/usr/bin/env bash
# dqn.py on CartPole-v1, 500k steps, seeds 1-3, one run at a time (2-core CPU machine).
# Results: benchmark/results/dqn.md (made by the last command).
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/dqn.py --env-id CartPole-v1 --seed "$seed" --total-timesteps 500000
done
uv run python -m cleanrl_utils.results runs/CartPole-v1__dqn__* --output benchmark/results/dqn
