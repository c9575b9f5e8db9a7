#!/usr/bin/env bash
# ppo_pettingzoo_ma_atari.py on pong_v3 (self-play, parameter sharing; CleanRL's settings: 16 agent slots = 8 games,
# 128 steps, 4 minibatches, 4 epochs), ${STEPS} agent transitions (163,840 by default: what fits a short CPU slot on
# the 2-core machine, about 1% of CleanRL's 20M), seeds 1..${SEEDS}, one run at a time. Each run's saved policy plays
# 20 games as first_0 against a uniformly random second_0 (eval/episodic_return); a uniformly random policy is measured
# the same way (benchmark/random_policy_pettingzoo_ma_atari.py, same evaluation seeds).
# Results: benchmark/results/ppo_pettingzoo_ma_atari.md and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-163840}
uv run --all-extras python -m cleanrl_utils.benchmark --env-ids pong_v3 \
    --command "uv run --all-extras python cleanrl/ppo_pettingzoo_ma_atari.py --total-timesteps $STEPS --save-model --eval-episodes 20 --checkpoint-every 20480" \
    --num-seeds "${SEEDS:-3}" --workers 1 --output benchmark/results/ppo_pettingzoo_ma_atari
for seed in 1 2 3; do
    uv run --all-extras python benchmark/random_policy_pettingzoo_ma_atari.py --env-id pong_v3 --seed "$seed" \
        --total-timesteps 40960 --eval-episodes 20
done
uv run python -m cleanrl_utils.results runs/pong_v3__ppo_pettingzoo_ma_atari__* runs/pong_v3__random_policy__* \
    --mean eval/episodic_return --output benchmark/results/ppo_pettingzoo_ma_atari
uv run python -m cleanrl_utils.plot runs/pong_v3__ppo_pettingzoo_ma_atari__* runs/pong_v3__random_policy__* \
    --metric charts/episodic_length --output benchmark/results/ppo_pettingzoo_ma_atari.png
