#!/usr/bin/env bash
# ppo.py on classic control, 500k steps, seeds 1-3, one run at a time (2-core CPU machine).
# Results: benchmark/results/ppo.md (made by the last command).
set -euo pipefail
cd "$(dirname "$0")/.."
for env_id in CartPole-v1 Acrobot-v1; do
    for seed in 1 2 3; do
        uv run python cleanrl/ppo.py --env-id "$env_id" --seed "$seed" --total-timesteps 500000
    done
done
uv run python -m cleanrl_utils.results runs/CartPole-v1__ppo__* runs/Acrobot-v1__ppo__* --output benchmark/results/ppo
