#!/usr/bin/env bash
# ppo_atari_envpool.py on envpool's Breakout-v5 at a budget a 2-core CPU can run: 400k steps (1.6M frames) at
# CleanRL's settings otherwise (8 envs x 128 steps, 4 minibatches x 4 epochs, clip 0.1, no sticky actions), seeds 1-3,
# beside a uniformly random policy on the same envs (8 games, 400k steps, seeds 1-3). The full 10M-step run is
# benchmark/ppo_atari_envpool.sh (a GPU). Results: benchmark/results/ppo_atari_envpool_cpu.md and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-400000}"
uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids Breakout-v5 \
    --command "uv run --extra envpool python benchmark/random_policy_pixels.py --total-timesteps $STEPS" \
    --num-seeds 3 --workers 1 --output /tmp/ppo_atari_envpool_cpu_random
uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids Breakout-v5 \
    --command "uv run --extra envpool python cleanrl/ppo_atari_envpool.py --total-timesteps $STEPS" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output /tmp/ppo_atari_envpool_cpu_agent
runs=(runs/Breakout-v5__ppo_atari_envpool__* runs/Breakout-v5__random_policy__*)
uv run --extra envpool python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/ppo_atari_envpool_cpu
uv run --extra envpool python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_atari_envpool_cpu.png
