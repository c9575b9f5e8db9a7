#!/usr/bin/env bash
# d3qn.py (dueling, prioritized replay alpha 0.6 / beta 0.4 -> 1, 3-step double-Q targets) on CartPole-v1 and
# Acrobot-v1, 500k steps, seeds 1-3, beside plain Double DQN (d3qn.py --no-dueling --no-prioritized --n-step 1,
# named double_dqn so that its rows and curves are its own) and dqn.py at the same budget; CleanRL's dqn.py settings
# for all three. One run at a time (WORKERS=2 for two at once). Results: benchmark/results/d3qn.md (the three side by
# side) and one plot per environment comparing them, d3qn_CartPole-v1.png and d3qn_Acrobot-v1.png.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="--total-timesteps 500000"
marker=$(mktemp)  # the run directories made after it are this benchmark's (runs/ may hold older dqn runs)
trap 'rm -f "$marker"' EXIT
for command in \
    "uv run python cleanrl/d3qn.py $STEPS" \
    "uv run python cleanrl/d3qn.py $STEPS --no-dueling --no-prioritized --n-step 1 --exp-name double_dqn" \
    "uv run python cleanrl/dqn.py $STEPS"; do
    uv run python -m cleanrl_utils.benchmark --env-ids CartPole-v1 Acrobot-v1 --command "$command" --num-seeds 3 \
        --workers "${WORKERS:-1}"
done
all_runs=()
for env_id in CartPole-v1 Acrobot-v1; do
    mapfile -t runs < <(find runs -maxdepth 1 -newer "$marker" \
        \( -name "${env_id}__d3qn__*" -o -name "${env_id}__double_dqn__*" -o -name "${env_id}__dqn__*" \) | sort)
    uv run python -m cleanrl_utils.plot "${runs[@]}" --output "benchmark/results/d3qn_${env_id}.png"
    all_runs+=("${runs[@]}")
done
uv run python -m cleanrl_utils.results "${all_runs[@]}" --output benchmark/results/d3qn
