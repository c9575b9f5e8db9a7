#!/usr/bin/env bash
# PointChasing-v0 (cleanrl_utils/envs/point_chasing.py, ElegantRL's point-chasing task in 2-D) with the continuous
# scripts at their standard hyperparameters, seeds 1-3, one run at a time (2-core CPU machine):
# sac_continuous_action.py 100k steps, ppo_continuous_action.py 1M steps.
# Solved: the agent reaches the target before the 1024-step cut in most episodes. A reached episode scores
# about +2 (the start distance of about 11.3 less the reach of 2, minus 0.02 a step for about 370 steps: heading
# straight at the target at full speed scores 2.1 in 374 steps); one cut at 1024 steps scores about -35 (a random
# or still policy: the target drifts away). So a mean return above 0 means most episodes reach the target; about
# +2 is the best there is.
# Checkpointed: killed, the same command again skips finished seeds and continues the others.
# Results: benchmark/results/point_chasing.md and .csv (the table), point_chasing.png (the curves).
# Raw environment speed is a separate measurement: benchmark/point_chasing_sps.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# --torch-threads 1: one core per run on a shared 2-core machine (SAC with the default of both cores ran at 5 SPS
# here beside other jobs, with one thread at 60-70 SPS); drop it on a machine of your own.
runner="uv run python -m cleanrl_utils.benchmark --env-ids PointChasing-v0 --num-seeds 3"
$runner --command "uv run python cleanrl/sac_continuous_action.py --total-timesteps 100000 --torch-threads 1 \
--checkpoint-every 10000" --output benchmark/results/point_chasing_sac
$runner --command "uv run python cleanrl/ppo_continuous_action.py --total-timesteps 1000000 --torch-threads 1 \
--checkpoint-every 100000" --output benchmark/results/point_chasing_ppo
runs=(runs/PointChasing-v0__sac_continuous_action__* runs/PointChasing-v0__ppo_continuous_action__*)
uv run python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/point_chasing
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/point_chasing.png
