#!/usr/bin/env bash
# SPS of mappo.py on vmas/navigation on a GPU (VMAS simulates on the GPU; rollout, storage and update
# stay there): 1024 ... 32768 environments, 4 iterations of 25-step rollouts each, default update
# (10 epochs x 8 minibatches of steps x envs x agents samples). Prints one line per size.
# For a session with a GPU; on the CPU use benchmark/mappo_sps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
for envs in ${SIZES:-1024 4096 16384 32768}; do
    uv run python cleanrl/mappo.py --env-id vmas/navigation --exp-name mappo_gpu --num-envs "$envs" --num-steps 25 \
        --total-timesteps $((envs * 25 * 4)) > /dev/null
    run=$(ls -td runs/vmas-navigation__mappo_gpu__* | head -1)
    uv run python - "$run" "$envs" <<'PY'
import sys
from pathlib import Path

import torch

from cleanrl_utils.results import read_scalar

steps, _, values = read_scalar(Path(sys.argv[1]), "charts/SPS")
device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (no GPU found)"
print(f"mappo.py vmas/navigation {sys.argv[2]} envs on {device}: {values[-1]:,.0f} SPS (training, {steps[-1]:,} steps)")
PY
done
