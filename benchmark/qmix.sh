#!/usr/bin/env bash
# qmix.py: QMIX on mpe/simple_spread_v3 (3 agents, 25-step episodes), discrete actions (the default),
# seeds 1-3, 40k environment steps each (16 worlds, a gradient step of 256 transitions per vector step
# after 2k random-ish steps, epsilon 1 -> 0.05 over the first 10k steps; everything else the script's
# defaults), and a uniform random policy through the same environment adapter (cleanrl_utils.envs.multiagent), logged the same way.
# One run at a time, --torch-threads 1 (the runs shared the 2-core machine with other benchmarks; drop
# it on a machine of your own). mpe2 steps its copies in Python (~570 env-steps/s at 16 worlds on a
# loaded core here), so a run takes ~3 min of wall time.
# Results: benchmark/results/qmix.md, .csv and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
env=mpe/simple_spread_v3
for seed in 1 2 3; do
    uv run python cleanrl/qmix.py --env-id "$env" --seed "$seed" --total-timesteps 40000 --num-envs 16 \
        --learning-starts 2000 --train-frequency 16 --exploration-fraction 0.25 --torch-threads 1
    # The random baseline is shared with vdn.sh (the same environment adapter): made once per seed.
    if ! compgen -G "runs/mpe-simple_spread_v3__random_policy__${seed}__*" > /dev/null; then
        uv run python benchmark/random_policy.py --script cleanrl/qmix.py --no-continuous-actions --env-id "$env" \
            --seed "$seed" --total-timesteps 40000 --num-envs 16 --log-every 100
    fi
done
runs=(runs/mpe-simple_spread_v3__qmix__* runs/mpe-simple_spread_v3__random_policy__*)
# One logged return per 100 vector steps (1,600 env steps, 64 episodes): score the last 5 (the last 8k steps).
uv run python -m cleanrl_utils.results "${runs[@]}" --last-episodes 5 --output benchmark/results/qmix
echo "Rows: random_policy.py is benchmark/random_policy.py (uniform random discrete actions through the same environment adapter (cleanrl_utils.envs.multiagent), 16 copies, scored the same way)." >> benchmark/results/qmix.md
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/qmix.png
