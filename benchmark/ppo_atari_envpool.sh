#!/usr/bin/env bash
# ppo_atari_envpool.py on envpool's Breakout-v5 and Pong-v5 at CleanRL's settings (the script's defaults: 8 envs x
# 128 steps, 4 minibatches x 4 epochs, clip 0.1, no sticky actions), 10M steps, seeds 1-3. Atari's Nature CNN needs
# a GPU for this length (envpool has no MinAtar, so there is no CPU-sized variant); CleanRL reports Breakout ~400.
# Results: benchmark/results/ppo_atari_envpool.md and ppo_atari_envpool.png.
set -euo pipefail
cd "$(dirname "$0")/.."
uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids Breakout-v5 Pong-v5 \
    --command "uv run --extra envpool python cleanrl/ppo_atari_envpool.py --total-timesteps 10000000" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output benchmark/results/ppo_atari_envpool
runs=(runs/Breakout-v5__ppo_atari_envpool__* runs/Pong-v5__ppo_atari_envpool__*)
uv run --extra envpool python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_atari_envpool.png
