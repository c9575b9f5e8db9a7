#!/usr/bin/env bash
# ppo_atari_lstm.py on MinAtar Breakout and SpaceInvaders, 1M steps (CleanRL's settings otherwise: 8 envs x 128
# steps, 4 minibatches of 2 whole environment sequences x 4 epochs, clip 0.1), seeds 1-3, one run at a time (2-core
# CPU machine). Results: benchmark/results/ppo_atari_lstm.md and ppo_atari_lstm.png, beside ppo_atari.md (frames
# stacked, no LSTM) and minatar_random.md.
set -euo pipefail
cd "$(dirname "$0")/.."
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/ppo_atari_lstm.py --total-timesteps 1000000" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output benchmark/results/ppo_atari_lstm
runs=(runs/MinAtar-Breakout-v1__ppo_atari_lstm__* runs/MinAtar-SpaceInvaders-v1__ppo_atari_lstm__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_atari_lstm.png
