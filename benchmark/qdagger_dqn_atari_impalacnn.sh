#!/usr/bin/env bash
# qdagger_dqn_atari_impalacnn.py on MinAtar Breakout, seeds 1-3 at once (WORKERS, default 3, on the 2-core CPU), beside
# dqn_atari.py from scratch at the same environment steps. MinAtar settings of benchmark/dqn_atari.sh where they differ
# from the Atari defaults: a 100k buffer, learning from 5k (online) steps, lr 2.5e-4.
#   1. the teacher: dqn_atari.py, 500k steps, seed 1, epsilon 1 -> 0.01 over the first 100k steps, saved.
#   2. qdagger: the teacher acts for 10k steps (epsilon 1 -> 0.01) into its replay, 4k offline gradient steps, then
#      20k online steps (epsilon 1 -> 0.01 over the first 4k): 30k environment steps in all.
#   3. dqn_atari.py from scratch for 30k steps (epsilon 1 -> 0.01 over the first 4k), 3 seeds.
# (A budget that fit the session's share of a machine that four benchmarks queued for.)
# Results: benchmark/results/qdagger_dqn_atari_impalacnn.md (the teacher, the tables below: _qdagger, _scratch, _steps)
# and .png, beside benchmark/results/minatar_random.md.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--buffer-size 100000 --learning-starts 5000 --learning-rate 2.5e-4"
teacher() { ls runs/MinAtar-Breakout-v1__dqn_atari__1__*/dqn_atari.cleanrl_model 2>/dev/null | head -1; }
if [ -z "$(teacher)" ]; then
    uv run python cleanrl/dqn_atari.py --env-id MinAtar/Breakout-v1 --seed 1 --total-timesteps 500000 $MINATAR \
        --exploration-fraction 0.2 --save-model --checkpoint-every 100000
fi
TEACHER=$(teacher)
uv run python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 \
    --command "uv run python cleanrl/qdagger_dqn_atari_impalacnn.py --teacher-model $TEACHER $MINATAR \
--teacher-steps 10000 --offline-steps 4000 --total-timesteps 20000 --exploration-fraction 0.2 --checkpoint-every 10000" \
    --num-seeds 3 --workers "${WORKERS:-3}" --output benchmark/results/qdagger_dqn_atari_impalacnn_qdagger --archive benchmark/runs
uv run python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 \
    --command "uv run python cleanrl/dqn_atari.py --exp-name dqn_atari_scratch $MINATAR --total-timesteps 30000 \
--exploration-fraction 0.1333" \
    --num-seeds 3 --workers "${WORKERS:-3}" --output benchmark/results/qdagger_dqn_atari_impalacnn_scratch \
    --archive benchmark/runs
uv run python -m cleanrl_utils.archive "$(dirname "$TEACHER")" --to benchmark/runs
# Steps to the teacher's score (8: its saved model's 10-game evaluation, 8.30 on 2026-12-05, rounded down; set THRESHOLD
# for another teacher) and curves. The qdagger runs' steps count the teacher's 10k and the 4k offline gradient steps first.
uv run python benchmark/steps_to_threshold.py runs/MinAtar-Breakout-v1__qdagger_dqn_atari_impalacnn__* \
    runs/MinAtar-Breakout-v1__dqn_atari_scratch__* "$(dirname "$TEACHER")" --threshold "${THRESHOLD:-8}" --window 10 \
    --output benchmark/results/qdagger_dqn_atari_impalacnn_steps
uv run python -m cleanrl_utils.plot runs/MinAtar-Breakout-v1__qdagger_dqn_atari_impalacnn__* \
    runs/MinAtar-Breakout-v1__dqn_atari_scratch__* --output benchmark/results/qdagger_dqn_atari_impalacnn.png
