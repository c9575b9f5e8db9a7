#!/usr/bin/env bash
# rainbow_atari.py on MinAtar Breakout and SpaceInvaders, 1M steps, seeds 1-3, one run at a time (2-core CPU
# machine). MinAtar settings where they differ from the Atari defaults, as in benchmark/dqn_atari.sh: a 100k buffer
# and learning from 5k steps; the target network copied every 1000 steps (not 8000) and a learning rate of 1e-4
# (not 6.25e-5) for the shorter run. Everything else (3-step returns, alpha 0.5, beta 0.4 -> 1, 51 atoms on
# [-10, 10], noisy sigma0 0.5, a gradient step every 4 steps) as the defaults.
# Results: benchmark/results/rainbow_atari.md and rainbow_atari.png, beside benchmark/results/dqn_atari.md.
# Checkpointed every 50k steps, and each finished run archived to benchmark/runs (commit it): stopped, the same
# command again (also on a fresh machine) skips the finished seeds and continues the others
# from their checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--total-timesteps 1000000 --buffer-size 100000 --learning-starts 5000 --target-network-frequency 1000 --learning-rate 1e-4 --checkpoint-every 50000"
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/rainbow_atari.py $MINATAR" --num-seeds 3 --workers "${WORKERS:-1}" \
    --archive benchmark/runs --output benchmark/results/rainbow_atari
runs=(runs/MinAtar-Breakout-v1__rainbow_atari__* runs/MinAtar-SpaceInvaders-v1__rainbow_atari__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/rainbow_atari.png
