#!/usr/bin/env bash
# Where data parallelism pays on two CPU cores: ppo_atari_multigpu.py's SPS with 1 and 2 gloo ranks (one torch thread
# each) at the same global batch (1 x 8 against 2 x 4 games, 8 x 128 steps an update), on MinAtar's small network
# (benchmark/ppo_atari_multigpu.sh, 1M steps) and here on Atari's Nature CNN (BreakoutNoFrameskip-v4, 84x84 frames),
# 30 updates (30,720 steps), seed 1: an SPS measurement, not a learning one. Run it alone on the machine.
# Results: benchmark/results/ppo_atari_multigpu_sps.md.
set -euo pipefail
cd "$(dirname "$0")/.."
script="cleanrl/ppo_atari_multigpu.py --total-timesteps 30720 --torch-threads 1"
for ranks in 1 2; do
    uv run --extra atari python -m cleanrl_utils.benchmark --env-ids BreakoutNoFrameskip-v4 --num-seeds 1 --workers 1 \
        --command "uv run --extra atari torchrun --standalone --nproc-per-node $ranks $script \
--local-num-envs $((8 / ranks)) --exp-name ppo_multigpu_sps_${ranks}rank" --output "/tmp/ppo_multigpu_sps_${ranks}rank"
done
uv run python -m cleanrl_utils.results runs/BreakoutNoFrameskip-v4__ppo_multigpu_sps_* \
    --output benchmark/results/ppo_atari_multigpu_sps
