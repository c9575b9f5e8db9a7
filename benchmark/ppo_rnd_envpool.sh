#!/usr/bin/env bash
# ppo_rnd_envpool.py on envpool's MontezumaRevenge-v5 at CleanRL's settings (the script's defaults: 128 envs x 128
# steps, gamma 0.999 / int-gamma 0.99, ext/int coef 2/1, entropy 0.001, lr 1e-4, update proportion 0.25, sticky
# actions 0.25), seeds 1-3. CleanRL's own runs are 2B steps; BUDGET (default 50M) sets the length here, a GPU run.
# Results: benchmark/results/ppo_rnd_envpool.md and ppo_rnd_envpool.png.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-50000000}
uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids MontezumaRevenge-v5 \
    --command "uv run --extra envpool python cleanrl/ppo_rnd_envpool.py --total-timesteps $BUDGET" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output benchmark/results/ppo_rnd_envpool
uv run --extra envpool python -m cleanrl_utils.plot runs/MontezumaRevenge-v5__ppo_rnd_envpool__* \
    --output benchmark/results/ppo_rnd_envpool.png
