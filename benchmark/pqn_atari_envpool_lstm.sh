#!/usr/bin/env bash
# pqn_atari_envpool_lstm.py on MinAtar Breakout and SpaceInvaders, 1M steps, seeds 1-3, one run at a time (2-core CPU
# machine), with pqn_atari.sh's settings so that the two stand side by side: 128 envs x 32 steps, 2 epochs of 32
# minibatches (here 4 whole env sequences each), lambda 0.65, gradient norm 10, and purejaxql's MinAtar changes
# (learning rate 5e-4, final epsilon 0.05). Results: benchmark/results/pqn_atari_envpool_lstm.md and .png, beside
# benchmark/results/pqn_atari.md and benchmark/results/minatar_random.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--total-timesteps 1000000 --num-envs 128 --num-steps 32 --num-minibatches 32 --update-epochs 2"
MINATAR="$MINATAR --max-grad-norm 10 --learning-rate 5e-4 --end-e 0.05"
# STOP_AFTER_S: each seed of the same 1M-step run stopped by SIGTERM after that many seconds (it writes a checkpoint:
# `--resume` continues it to 1M); what ran first on 2026-12-05, scored at the step all seeds reached
# (benchmark/pqn_atari_envpool_lstm_compare.py). The 1M benchmark below ran later that day.
if [ -n "${STOP_AFTER_S:-}" ]; then
    for seed in 1 2 3; do
        timeout -s TERM "$STOP_AFTER_S" uv run --all-extras python cleanrl/pqn_atari_envpool_lstm.py $MINATAR \
            --checkpoint-every 1000000 --env-id "MinAtar/${GAME:-Breakout}-v1" --seed "$seed" || [ $? = 124 ]
    done
    exit 0
fi
# One benchmark per game, so that each table stands on its own (Breakout first; SpaceInvaders if time allows).
for game in ${GAMES:-Breakout SpaceInvaders}; do
    suffix=$([ "$game" = Breakout ] && echo "" || echo "_$(echo "$game" | tr '[:upper:]' '[:lower:]')")
    uv run --all-extras python -m cleanrl_utils.benchmark --env-ids "MinAtar/$game-v1" \
        --command "uv run --all-extras python cleanrl/pqn_atari_envpool_lstm.py $MINATAR" --num-seeds 3 \
        --workers "${WORKERS:-1}" --output "benchmark/results/pqn_atari_envpool_lstm$suffix" --archive benchmark/runs
done
runs=(benchmark/runs/MinAtar-*__pqn_atari_envpool_lstm__*)
uv run --all-extras python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/pqn_atari_envpool_lstm.png
