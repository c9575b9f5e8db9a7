#!/usr/bin/env bash
# SPS of mappo.py on vmas/navigation on the CPU at 1024 and 4096 environments: 4 iterations of
# 25-step rollouts each (the charts/SPS the script logs at the last iteration counts start-up of the
# training loop, not imports), with the default update (10 epochs x 8 minibatches). SPS counts
# environment steps (one step of all worlds = num_envs steps), not agent steps.
# Threads: torch's default (one per core); THREADS=1 to measure a single core.
# Prints one line per size; the run directories go to runs/ (delete them afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-0}
for envs in ${SIZES:-1024 4096}; do
    uv run python cleanrl/mappo.py --env-id vmas/navigation --exp-name mappo_sps --num-envs "$envs" --num-steps 25 \
        --total-timesteps $((envs * 25 * 4)) --torch-threads "$threads" > /dev/null
    run=$(ls -td runs/vmas-navigation__mappo_sps__* | head -1)
    uv run python - "$run" "$envs" <<'PY'
import sys
from cleanrl_utils.results import read_scalar
from pathlib import Path
steps, _, values = read_scalar(Path(sys.argv[1]), "charts/SPS")
print(f"mappo.py vmas/navigation {sys.argv[2]} envs: {values[-1]:,.0f} SPS (training, {steps[-1]:,} steps)")
PY
done
