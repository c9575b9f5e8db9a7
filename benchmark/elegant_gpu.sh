#!/usr/bin/env bash
# GPU measurements of what came from ElegantRL's list: PointChasing-v0's raw SPS at 1, 64, 4096 and 65536 copies of
# the batched env on the GPU, then REDQ, SAC and CrossQ on Hopper-v5 for SECONDS_PER_RUN of wall time each
# (default 180), stopped with SIGTERM (the scripts checkpoint and exit 0): the steps each reached and the return, with
# cleanrl_utils.results into $RESULTS/redq_gpu.md (REDQ makes 20 updates of 10 critics per step, SAC 1 of 2, CrossQ 1
# of 2 critics 2048 wide on a joint batch of 512: 0.78 s per step on one CPU core here).
# Called by benchmark/gpu/run_all.sh with the node's python3 and the kit on PYTHONPATH; alone:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/elegant_gpu.sh
# TINY=1: the CPU, tiny sizes and runs that end by themselves (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-180}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
sps_flags=(--device cuda --large --seconds "${SPS_SECONDS:-5}") flags=()
if [[ ${TINY:-0} == 1 ]]; then
    sps_flags=(--device cpu --sizes 4 --sync-sizes 1 --seconds 0.2)
    flags=(--no-cuda --batch-size 32 --buffer-size 1000 --learning-starts 100 --total-timesteps 110)
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
$PYTHON benchmark/point_chasing_sps.py "${sps_flags[@]}" --output "$RESULTS/point_chasing_sps_gpu.md"
for script in redq_continuous_action sac_continuous_action crossq_continuous_action; do
    # timeout exits 124 after its SIGTERM; the script itself exits 0 having written its checkpoint.
    timeout --signal=TERM --kill-after=60 "$SECONDS_PER_RUN" \
        $PYTHON "cleanrl/$script.py" --env-id Hopper-v5 --seed 1 --exp-name "${script}_gpu" "${flags[@]}" \
        $([[ ${TINY:-0} == 1 && $script == redq_continuous_action ]] && echo --utd-ratio 2) \
        > "$RESULTS/${script}_gpu.log" 2>&1 || true
    tail -n 3 "$RESULTS/${script}_gpu.log"
done
$PYTHON -m cleanrl_utils.results runs/Hopper-v5__redq_continuous_action_gpu__1__* \
    runs/Hopper-v5__sac_continuous_action_gpu__1__* runs/Hopper-v5__crossq_continuous_action_gpu__1__* \
    --last-episodes 10 --output "$RESULTS/redq_gpu" ||
    [[ ${TINY:-0} == 1 ]] # a tiny run may end before its first episode does: no return to report
