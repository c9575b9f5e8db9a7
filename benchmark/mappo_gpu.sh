#!/usr/bin/env bash
# SPS of mappo.py on vmas/navigation on a GPU (VMAS simulates on the GPU; rollout, storage and update
# stay there): SIZES environments (default 4096 16384 32768), 4 iterations of 25-step rollouts each,
# default update (10 epochs x 8 minibatches of steps x envs x agents samples). One line per size, into
# $RESULTS/mappo_gpu.md. Called by benchmark/gpu/run_all.sh (PYTHON=python3, the kit on PYTHONPATH);
# on the CPU use benchmark/mappo_sps.sh. TINY=1: 8 worlds on the CPU, one iteration (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
sizes=${SIZES:-4096 16384 32768} iterations=4 flags=()
if [[ ${TINY:-0} == 1 ]]; then
    sizes=${SIZES:-8} iterations=1 flags=(--no-cuda --num-minibatches 2 --update-epochs 1 --hidden-size 16)
fi
rows=()
for envs in $sizes; do
    $PYTHON cleanrl/mappo.py --env-id vmas/navigation --exp-name mappo_gpu --num-envs "$envs" --num-steps 25 \
        --total-timesteps $((envs * 25 * iterations)) "${flags[@]}" > /dev/null
    run=$(ls -td runs/vmas-navigation__mappo_gpu__* | head -1)
    rows+=("$($PYTHON - "$run" "$envs" <<'PY'
import sys
from pathlib import Path
from cleanrl_utils.results import read_scalar
steps, _, values = read_scalar(Path(sys.argv[1]), "charts/SPS")
print(f"| {int(sys.argv[2]):,} | {values[-1]:,.0f} | {steps[-1]:,} |")
PY
)")
    echo "${rows[-1]}"
done
$PYTHON - "$RESULTS/mappo_gpu.md" "${rows[@]}" <<'PY'
import sys
from pathlib import Path
from cleanrl_utils.results import machine_description
out, rows = Path(sys.argv[1]), sys.argv[2:]
out.write_text(
    "# mappo.py SPS on a GPU (vmas/navigation, 4 agents)\n\n"
    f"Machine: {machine_description()}. Command: benchmark/mappo_gpu.sh.\n\n"
    "| worlds | training SPS | steps |\n|---|---|---|\n" + "\n".join(rows) + "\n\n"
    "Training SPS: the last charts/SPS of a 4-iteration run (25-step rollouts, the default update of 10 epochs x 8 "
    "minibatches), start-up of the loop included, imports not; one step of all worlds counts num_envs.\n")
print(out.read_text())
PY
