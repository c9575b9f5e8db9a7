#!/usr/bin/env bash
# GPU measurement for simbav2_continuous_action.py, whose Hopper-v5 benchmark beside SAC (300k steps, 3 seeds:
# benchmark/simbav2.sh) cannot run on this project's CPUs (1.9 steps/s on one core: ~44 h a seed; two critics of two
# 512-wide blocks with 2048-wide MLPs, one update per step). SimbaV2 and SAC on Hopper-v5 for SECONDS_PER_RUN of wall
# time each (default 120), seed 1, stopped with SIGTERM (the scripts checkpoint and exit 0): the steps each reached and
# the return, with cleanrl_utils.results into $RESULTS/simbav2_gpu.md, so that a lease measures what the 300k-step
# benchmark needs of a GPU (SPS after learning starts: the log lines).
# Called by benchmark/gpu/run_all.sh with the node's python3 and the kit on PYTHONPATH; alone:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/simbav2_gpu.sh
# TINY=1: the CPU, tiny sizes and runs that end by themselves (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-120}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
flags=()
if [[ ${TINY:-0} == 1 ]]; then
    flags=(--no-cuda --batch-size 32 --buffer-size 1000 --learning-starts 100 --total-timesteps 110)
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
for script in simbav2_continuous_action sac_continuous_action; do
    # timeout exits 124 after its SIGTERM; the script itself exits 0 having written its checkpoint.
    timeout --signal=TERM --kill-after=60 "$SECONDS_PER_RUN" \
        $PYTHON "cleanrl/$script.py" --env-id Hopper-v5 --seed 1 --exp-name "${script}_simbav2_gpu" "${flags[@]}" \
        > "$RESULTS/${script}_simbav2_gpu.log" 2>&1 || true
    tail -n 3 "$RESULTS/${script}_simbav2_gpu.log"
done
$PYTHON -m cleanrl_utils.results runs/Hopper-v5__simbav2_continuous_action_simbav2_gpu__1__* \
    runs/Hopper-v5__sac_continuous_action_simbav2_gpu__1__* --last-episodes 10 --output "$RESULTS/simbav2_gpu" ||
    [[ ${TINY:-0} == 1 ]] # a tiny run may end before its first episode does: no return to report
