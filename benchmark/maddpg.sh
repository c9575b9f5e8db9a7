#!/usr/bin/env bash
# maddpg.py on vmas/navigation (4 agents, continuous actions, 100-step episodes), seeds 1-3,
# 192k environment steps each: 128 worlds, 4 gradient steps (batch 256 transitions x 4 agents) per
# vector step after 12.8k random steps, 128-wide networks, learning rates 1e-3, gamma 0.95 (the
# navigation reward is dense distance shaping); everything else the script's defaults. Many worlds
# with several gradient steps per vector step: VMAS steps 128 worlds for about the cost of 32 on a
# CPU, so the budget goes to the updates.
# Beside it, a uniform random policy through the same environment adapter (cleanrl_utils.envs.multiagent) and the same logging
# (benchmark/random_policy.py, named random_maddpg in the table), seeds 1-3, as many steps.
# One run at a time, --torch-threads 1 (the runs shared the 2-core machine with other benchmarks;
# drop it on a machine of your own). Measured while tuning (seed 1, nice'd on the shared machine):
# 256k steps took 185 s wall (173 s CPU, ~1500 SPS); the team return passed 12 by 75k steps and held
# ~16 from 130k on (16.0 over the last 10 logs); random policy -2.6 (last 10 logs of a 96k-step run).
# Results: benchmark/results/maddpg.md, .csv and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/maddpg.py --env-id vmas/navigation --seed "$seed" --total-timesteps 192000 --num-envs 128 \
        --gradient-steps 4 --learning-starts 12800 --hidden-dim 128 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 \
        --gamma 0.95 --torch-threads 1
    uv run python benchmark/random_policy.py --env-id vmas/navigation --seed "$seed" --total-timesteps 192000 --num-envs 128 \
        --script cleanrl/maddpg.py --exp-name random_maddpg
done
runs=(runs/vmas-navigation__maddpg__* runs/vmas-navigation__random_maddpg__*)
# One logged return per --log-every 10 vector steps in which episodes ended (the mean over them): score the last 10.
uv run python -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output benchmark/results/maddpg
echo "Rows: random_maddpg.py is benchmark/random_policy.py --exp-name random_maddpg (uniform random continuous actions through the same environment adapter (cleanrl_utils.envs.multiagent), 128 worlds, scored the same way). Tuned flags (the script defaults are BenchMARL/TD3-like): 128 worlds, 4 gradient steps per vector step, 128-wide networks, learning rates 1e-3, gamma 0.95." >> benchmark/results/maddpg.md
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/maddpg.png
