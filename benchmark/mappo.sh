#!/usr/bin/env bash
# mappo.py: MAPPO (centralised critic) and IPPO (--independent, run under --exp-name ippo so that the
# results table and the plot tell them apart) on vmas/navigation (4 agents) and vmas/balance
# (3 agents), continuous actions (the default), seeds 1-3, 300k environment steps each
# (256 worlds x 50-step rollouts, 10 epochs of 8 minibatches; everything else the script's defaults).
# One run at a time, --torch-threads 1 (the runs shared the 2-core machine with other benchmarks;
# drop it on a machine of your own). A run took ~3-4 min of wall time on a loaded core here.
# Each seed also runs a uniform random policy through the same environment adapter (cleanrl_utils.envs.multiagent) (benchmark/random_policy.py),
# scored the same way (team return of 100-step episodes).
# Results: benchmark/results/mappo.md, .csv and .png.
set -euo pipefail
cd "$(dirname "$0")/.."
for env in vmas/navigation vmas/balance; do
    for seed in 1 2 3; do
        uv run python cleanrl/mappo.py --env-id "$env" --seed "$seed" --total-timesteps 300000 --torch-threads 1
        uv run python cleanrl/mappo.py --env-id "$env" --seed "$seed" --total-timesteps 300000 --torch-threads 1 --independent --exp-name ippo
        # the uniform random baseline through the same environment adapter (cleanrl_utils.envs.multiagent), logged the same way
        # (256 worlds, one logged return per 50 vector steps = 12,800 env steps, as MAPPO's iterations)
        uv run python benchmark/random_policy.py --script cleanrl/mappo.py --env-id "$env" --seed "$seed" \
            --total-timesteps 300000 --num-envs 256 --log-every 50
    done
done
runs=(runs/vmas-{navigation,balance}__{mappo,ippo,random_policy}__*)
# One logged return per 12,800-step iteration (the mean over the episodes that ended in it): score the last 5 (64k steps).
uv run python -m cleanrl_utils.results "${runs[@]}" --last-episodes 5 --output benchmark/results/mappo
echo "Rows: ippo.py is \`mappo.py --independent --exp-name ippo\` (IPPO); random_policy.py is benchmark/random_policy.py (uniform random actions, same environment adapter, 256 worlds). Budget: 300k environment steps (the curves are still rising on vmas/balance)." >> benchmark/results/mappo.md
uv run python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/mappo.png
