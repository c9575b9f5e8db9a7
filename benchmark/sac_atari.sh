#!/usr/bin/env bash
# sac_atari.py on MinAtar Breakout and SpaceInvaders, 1M steps, seeds 1-3, one run at a time (2-core CPU
# machine). MinAtar settings where they differ from CleanRL's Atari defaults, as for dqn_atari.sh: a 100k buffer
# and learning from 5k steps; the rest (batch 64, an update every 4 steps, targets copied every 8000 steps,
# learning rates 3e-4, autotuned alpha towards 0.89 of the maximum entropy) as CleanRL.
# Results: benchmark/results/sac_atari.md and sac_atari.png, beside benchmark/results/minatar_random.md.
# Checkpointed every 50k steps, and each finished run archived to benchmark/runs (commit it): stopped, the same
# command again (also on a fresh machine) skips the finished seeds and continues the others
# from their checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--total-timesteps 1000000 --buffer-size 100000 --learning-starts 5000 --checkpoint-every 50000"
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/sac_atari.py $MINATAR" --num-seeds 3 --workers "${WORKERS:-1}" \
    --archive benchmark/runs --output benchmark/results/sac_atari
runs=(runs/MinAtar-Breakout-v1__sac_atari__* runs/MinAtar-SpaceInvaders-v1__sac_atari__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/sac_atari.png
