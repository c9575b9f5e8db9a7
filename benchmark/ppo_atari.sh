#!/usr/bin/env bash
# ppo_atari.py on MinAtar Breakout and SpaceInvaders, 1M steps (CleanRL's Atari settings otherwise: 8 envs x 128
# steps, 4 minibatches x 4 epochs, clip 0.1), seeds 1-3, one run at a time (2-core CPU machine).
# Results: benchmark/results/ppo_atari.md and ppo_atari.png, beside benchmark/results/minatar_random.md.
set -euo pipefail
cd "$(dirname "$0")/.."
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/ppo_atari.py --total-timesteps 1000000" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output benchmark/results/ppo_atari
runs=(runs/MinAtar-Breakout-v1__ppo_atari__* runs/MinAtar-SpaceInvaders-v1__ppo_atari__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_atari.png
