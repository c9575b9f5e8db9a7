#!/usr/bin/env bash
# ppo_atari_multigpu.py on MinAtar/Breakout-v1 with 1 and 2 ranks (gloo, CPU processes, one torch thread each) at the
# same global batch: 1 rank x 8 games against 2 ranks x 4 games, 8 x 128 steps per update either way (CleanRL's Atari
# settings otherwise), 1M steps, seeds 1-3, beside ppo_atari.py's runs at the same budget (benchmark/ppo_atari.sh).
# The same algorithm on the same batch: the returns should agree; the SPS column gives the gain of the second rank.
# Run it alone on the machine (the 2-rank runs use both cores); checkpointed: the same command again continues.
# Results: benchmark/results/ppo_atari_multigpu.md and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
script="cleanrl/ppo_atari_multigpu.py --total-timesteps 1000000 --torch-threads 1 --checkpoint-every 200000"
for ranks in 1 2; do
    uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 --num-seeds 3 --workers 1 \
        --command "uv run --extra atari torchrun --standalone --nproc-per-node $ranks $script \
--local-num-envs $((8 / ranks)) --exp-name ppo_multigpu_${ranks}rank" --output "/tmp/ppo_multigpu_${ranks}rank"
done
runs=(runs/MinAtar-Breakout-v1__ppo_multigpu_1rank__* runs/MinAtar-Breakout-v1__ppo_multigpu_2rank__*
    runs/MinAtar-Breakout-v1__ppo_atari__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/ppo_atari_multigpu
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_atari_multigpu.png
