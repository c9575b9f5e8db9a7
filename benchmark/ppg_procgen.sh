#!/usr/bin/env bash
# ppg_procgen.py on Procgen StarpilotEasy, BigfishEasy and BossfightEasy, 25M steps (CleanRL's settings: 64 envs x 256
# steps, 8 minibatches, IMPALA CNNs, lr 5e-4, gamma 0.999, aux phase every 32 iterations x 6 epochs; the PPG code's
# normed initialisation and no gradient clipping), seeds 1-3, on a GPU.
# Results: benchmark/results/ppg_procgen.md and ppg_procgen.png.
set -euo pipefail
cd "$(dirname "$0")/.."
uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids StarpilotEasy-v0 BigfishEasy-v0 BossfightEasy-v0 \
    --command "uv run --extra envpool python cleanrl/ppg_procgen.py --total-timesteps 25000000" --num-seeds 3 \
    --workers "${WORKERS:-1}" --output benchmark/results/ppg_procgen
runs=(runs/StarpilotEasy-v0__ppg_procgen__* runs/BigfishEasy-v0__ppg_procgen__* runs/BossfightEasy-v0__ppg_procgen__*)
uv run --extra envpool python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppg_procgen.png
