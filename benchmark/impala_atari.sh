#!/usr/bin/env bash
# impala_atari.py on MinAtar/Breakout-v1 with 1, 2 and 4 Ray actors at the same learner batch (each update: one
# rollout of 32 games x 20 steps, the paper's 32 unrolls), 1M steps, seeds 1-3, beside ppo_atari.py's runs at the same
# budget (benchmark/ppo_atari.sh). More actors: more env SPS, and rollouts older by more updates (charts/policy_lag).
# Run it alone on the machine (the actors are processes); checkpointed: the same command again continues (the actors
# start fresh games on a resume).
# Results: benchmark/results/impala_atari.md and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
script="cleanrl/impala_atari.py --total-timesteps 1000000 --local-num-envs 32 --rollouts-per-update 1 \
--checkpoint-every 200000"
for actors in 1 2 4; do
    uv run --extra distributed python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 --num-seeds 3 \
        --workers 1 --command "uv run --extra distributed python $script --num-actors $actors \
--exp-name impala_${actors}actor" --output "/tmp/impala_${actors}actor"
done
runs=(runs/MinAtar-Breakout-v1__impala_1actor__* runs/MinAtar-Breakout-v1__impala_2actor__*
    runs/MinAtar-Breakout-v1__impala_4actor__* runs/MinAtar-Breakout-v1__ppo_atari__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/impala_atari --mean charts/policy_lag
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/impala_atari.png
