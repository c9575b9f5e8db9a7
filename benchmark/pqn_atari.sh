#!/usr/bin/env bash
# pqn_atari.py on MinAtar Breakout and SpaceInvaders, 1M steps, seeds 1-3, one run at a time (2-core CPU machine).
# The Atari defaults (128 envs x 32 steps, 2 epochs of 32 minibatches, lambda 0.65, epsilon decay over 10% of the
# steps) with purejaxql's MinAtar changes (pqn_minatar.yaml): learning rate 5e-4 and a final epsilon of 0.05.
# Results: benchmark/results/pqn_atari.md and pqn_atari.png, beside benchmark/results/minatar_random.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--total-timesteps 1000000 --learning-rate 5e-4 --end-e 0.05"
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/pqn_atari.py $MINATAR" --num-seeds 3 --workers "${WORKERS:-1}" \
    --output benchmark/results/pqn_atari
runs=(runs/MinAtar-Breakout-v1__pqn_atari__* runs/MinAtar-SpaceInvaders-v1__pqn_atari__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/pqn_atari.png
