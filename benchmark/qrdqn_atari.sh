#!/usr/bin/env bash
# qrdqn_atari.py on MinAtar Breakout and SpaceInvaders, 1M steps, seeds 1-3 (2-core CPU machine). The MinAtar settings
# of dqn_atari.sh and c51_atari.sh, so the three sit side by side: a 100k buffer, learning from 5k steps, epsilon
# 1 -> 0.01 over the first 100k steps, the target network copied every 1000 steps, learning rate 2.5e-4 (the MinAtar
# paper's, which dqn_atari and c51_atari ran at; the QR-DQN paper's 5e-5 is for 50M-frame Atari runs), and 51
# quantiles, the 51 outputs per action of c51_atari beside it (the script's default is the paper's 200: its 200 x 200
# pairs per sample run at ~160 SPS on one core here, 51 at ~500, so 200 does not fit a session's 1M-step x 6 runs);
# the rest is the script's defaults (kappa 1, Adam eps 0.01 / 32).
# Results: benchmark/results/qrdqn_atari.md and qrdqn_atari.png, beside benchmark/results/dqn_atari.md,
# c51_atari.md and minatar_random.md. Checkpointed every 50k steps, and each finished run archived to benchmark/runs
# (commit it): stopped, the same command again skips the finished seeds and continues the others from their
# checkpoints. WORKERS=2 runs two at once.
set -euo pipefail
cd "$(dirname "$0")/.."
MINATAR="--total-timesteps 1000000 --buffer-size 100000 --learning-starts 5000 --exploration-fraction 0.1 --target-network-frequency 1000 --learning-rate 2.5e-4 --n-quantiles 51 --checkpoint-every 50000"
uv run --extra atari python -m cleanrl_utils.benchmark --env-ids MinAtar/Breakout-v1 MinAtar/SpaceInvaders-v1 \
    --command "uv run --extra atari python cleanrl/qrdqn_atari.py $MINATAR" --num-seeds 3 --workers "${WORKERS:-1}" \
    --archive benchmark/runs --output benchmark/results/qrdqn_atari
runs=(runs/MinAtar-Breakout-v1__qrdqn_atari__* runs/MinAtar-SpaceInvaders-v1__qrdqn_atari__*)
uv run --extra atari python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/qrdqn_atari.png
