#!/usr/bin/env bash
# ppo_continuous_action.py on PyBullet's HopperBulletEnv-v0 (the pybullet extra), 300k steps at the script's defaults
# (CleanRL's MuJoCo settings: 1 env x 2048 steps, 32 minibatches x 10 epochs, lr 3e-4 annealed), seeds 1-3, one run
# at a time on the 2-core CPU machine. The curve starts from the untrained policy's returns.
# Results: benchmark/results/pybullet.md and pybullet.png.
set -euo pipefail
cd "$(dirname "$0")/.."
uv run --extra pybullet python -m cleanrl_utils.benchmark --env-ids HopperBulletEnv-v0 \
    --command "uv run --extra pybullet python cleanrl/ppo_continuous_action.py --total-timesteps 300000" \
    --num-seeds 3 --workers "${WORKERS:-1}" --output benchmark/results/pybullet
uv run --extra pybullet python -m cleanrl_utils.plot runs/HopperBulletEnv-v0__ppo_continuous_action__* \
    --output benchmark/results/pybullet.png
