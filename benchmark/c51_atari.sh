#!/usr/bin/env bash
# c51_atari.py on MinAtar Breakout and SpaceInvaders, 1M steps, seeds 1-3, one run at a time (2-core CPU
# machine). MinAtar settings (Young & Tian 2019) where they differ from the Atari defaults, as in dqn_atari.sh: a 100k
# buffer, learning from 5k steps, epsilon 1 -> 0.01 over the first 100k steps, the target network copied every 1000
# steps; the rest is CleanRL's c51_atari (51 atoms on [-10, 10], learning rate 2.5e-4, Adam eps 0.01 / 32).
# Results: benchmark/results/c51_atari.md and c51_atari.png, beside benchmark/results/minatar_random.md.
# Checkpointed every 50k steps, and each finished run archived to benchmark/runs (commit it): stopped, the same
# command again (also on a fresh machine) skips the finished seeds and continues the others
# from their checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--total-timesteps 1000000 --buffer-size 100000 --learning-starts 5000 --exploration-fraction 0.1 --target-network-frequency 1000 --checkpoint-every 50000"
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/c51_atari.py $MINATAR" --num-seeds 3 --workers "${WORKERS:-1}" \
    --archive benchmark/runs --output benchmark/results/c51_atari
runs=(runs/MinAtar-Breakout-v1__c51_atari__* runs/MinAtar-SpaceInvaders-v1__c51_atari__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/c51_atari.png
