#!/usr/bin/env bash
# matd3.py on vmas/navigation (4 agents, continuous actions, 100-step episodes), seeds 1-3,
# 192k environment steps each: 128 worlds, 4 critic steps (batch 256 transitions x 4 agents) per
# vector step after 12.8k random steps, the actor and the targets every second critic step
# (--policy-frequency 2, the default), 128-wide networks, learning rates 1e-3, gamma 0.95 (the
# navigation reward is dense distance shaping); everything else the script's defaults. Many worlds
# with several gradient steps per vector step: VMAS steps 128 worlds for about the cost of 32 on a
# CPU, so the budget goes to the updates.
# Beside it, a uniform random policy through the same environment adapter (cleanrl_utils.envs.multiagent) and the same logging
# (benchmark/random_policy.py, named random_matd3 in the table), seeds 1-3, as many steps.
# One run at a time, --torch-threads 1 (the runs shared the 2-core machine with other benchmarks;
# drop it on a machine of your own). Measured while tuning (seed 1, nice'd on the shared machine):
# 192k steps took 142 s of CPU (the wall clock, 652 s, was mostly waiting for other, un-nice'd jobs);
# the team return passed 10 by 77k steps and held ~14-16 from 97k on (15.2 over the last 10 logs);
# random policy -2.6 (last 10 logs of a 96k-step run).
# Results: benchmark/results/matd3.md, .csv and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
for seed in 1 2 3; do
    uv run python cleanrl/matd3.py --env-id vmas/navigation --seed "$seed" --total-timesteps 192000 --num-envs 128 \
        --gradient-steps 4 --learning-starts 12800 --hidden-dim 128 --actor-learning-rate 1e-3 --critic-learning-rate 1e-3 \
        --gamma 0.95 --torch-threads 1
    uv run python benchmark/random_policy.py --env-id vmas/navigation --seed "$seed" --total-timesteps 192000 --num-envs 128 \
        --script cleanrl/matd3.py --exp-name random_matd3
done
runs=(runs/vmas-navigation__matd3__* runs/vmas-navigation__random_matd3__*)
# One logged return per --log-every 10 vector steps in which episodes ended (the mean over them): score the last 10.
uv run python -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output benchmark/results/matd3
echo "Rows: random_matd3.py is benchmark/random_policy.py --exp-name random_matd3 (uniform random continuous actions through the same environment adapter (cleanrl_utils.envs.multiagent), 128 worlds, scored the same way). Tuned flags (the script defaults are BenchMARL/TD3-like): 128 worlds, 4 gradient steps per vector step, 128-wide networks, learning rates 1e-3, gamma 0.95." >> benchmark/results/matd3.md
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/matd3.png
