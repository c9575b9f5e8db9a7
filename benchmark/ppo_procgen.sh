#!/usr/bin/env bash
# ppo_procgen.py on Procgen StarpilotEasy, BigfishEasy and BossfightEasy, 25M steps (CleanRL's settings: 64 envs x 256
# steps, 8 minibatches x 3 epochs, IMPALA CNN, lr 5e-4 constant, gamma 0.999), seeds 1-3, one run at a time on a GPU.
# Results: benchmark/results/ppo_procgen.md and ppo_procgen.png.
set -euo pipefail
cd "$(dirname "$0")/.."
uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids StarpilotEasy-v0 BigfishEasy-v0 BossfightEasy-v0 \
    --command "uv run --extra envpool python cleanrl/ppo_procgen.py --total-timesteps 25000000" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output benchmark/results/ppo_procgen
runs=(runs/StarpilotEasy-v0__ppo_procgen__* runs/BigfishEasy-v0__ppo_procgen__* runs/BossfightEasy-v0__ppo_procgen__*)
uv run --extra envpool python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_procgen.png
