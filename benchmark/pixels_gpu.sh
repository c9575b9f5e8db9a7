#!/usr/bin/env bash
# GPU measurement for issue 12: dqn_atari.py and pqn_atari.py on BreakoutNoFrameskip-v4 at CleanRL's settings
# (the scripts' defaults), each for SECONDS of wall time (default 240), then stopped with SIGTERM (the scripts
# checkpoint and exit 0). Reports SPS and the game score reached (mean of the last 100 games, or as many as there
# were) with cleanrl_utils.results into $RESULTS/pixels_gpu.md, beside CleanRL's 10M-step returns
# (../shared/BENCHMARKS.md: dqn_atari Breakout 366.93 +- 39.89).
#
# On a GPU node without a package index, run it with the node's own python and the project's wheels installed
# into a folder (see benchmark/gpu/ once it exists):  PYTHON=python3 PYTHONPATH=/path/to/site bash benchmark/pixels_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-"uv run python"}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-240}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
$PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
for script in dqn_atari pqn_atari; do
    # timeout exits 124 after its SIGTERM; the script itself exits 0 having written its checkpoint.
    timeout --signal=TERM --kill-after=120 "$SECONDS_PER_RUN" \
        $PYTHON "cleanrl/$script.py" --env-id BreakoutNoFrameskip-v4 --seed 1 > "$RESULTS/${script}_gpu.log" 2>&1 || true
    tail -n 3 "$RESULTS/${script}_gpu.log"
done
$PYTHON -m cleanrl_utils.results runs/BreakoutNoFrameskip-v4__dqn_atari__1__* runs/BreakoutNoFrameskip-v4__pqn_atari__1__* \
    --output "$RESULTS/pixels_gpu"
