#!/usr/bin/env bash
# GPU measurement of issue 51: fast_sac_isaacgym.py on MuJoCo Warp's Ant and Humanoid (TASKS), each run SECONDS_PER_RUN
# (75) s of training (--time-limit-seconds; start-up and kernel compilation not counted), seed 1, NUM_ENVS (1024)
# worlds with its defaults (the authors' FastSAC: batches of 8,192, eight critic and two policy updates a step), beside
# fast_td3_isaacgym.py's runs of the same tasks: benchmark/fast_td3_gpu.sh (run_all.sh's item fast_td3, just before this
# one, on the same card) leaves them in runs/, and the table takes those it finds. Recorded: the episodic return against
# wall time and steps, SPS, with cleanrl_utils.results into $RESULTS/fast_sac_gpu.md (the run folders come back for the
# curves: `uv run python -m cleanrl_utils.plot runs/*__fast_sac_gpu__* runs/*__fast_td3_gpu__*`).
# Called by benchmark/gpu/run_all.sh with the node's python3 and the kit on PYTHONPATH; alone:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/fast_sac_gpu.sh
# TINY=1: the CPU, Hopper, tiny sizes and runs that end by themselves (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-benchmark/results}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-75}
tasks=${TASKS:-Ant Humanoid}
mkdir -p "$RESULTS"
flags=(--num-envs "${NUM_ENVS:-1024}" --total-timesteps 1000000000 --time-limit-seconds "$SECONDS_PER_RUN")
if [[ ${TINY:-0} == 1 ]]; then
    tasks=${TASKS:-Hopper}
    flags=(--no-cuda --num-envs 4 --batch-size 32 --buffer-size 64 --learning-starts 16 --total-timesteps 64
        --critic-hidden 64 --actor-hidden 32 --num-updates 2 --policy-frequency 2 --log-every 8)
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
runs=()
for task in $tasks; do
    $PYTHON cleanrl/fast_sac_isaacgym.py --simulator mujoco-warp --env-id "$task" --seed 1 --exp-name fast_sac_gpu \
        "${flags[@]}" >"$RESULTS/fast_sac_gpu_$task.log" 2>&1
    tail -n 2 "$RESULTS/fast_sac_gpu_$task.log"
    runs+=(runs/"${task}"__fast_sac_gpu__1__*)
    for beside in runs/"${task}"__fast_td3_gpu__1__*; do # fast_td3's, where its item ran on this node
        [[ -d $beside ]] && runs+=("$beside")
    done
done
$PYTHON -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output "$RESULTS/fast_sac_gpu" ||
    [[ ${TINY:-0} == 1 ]] # a tiny run may end before its first episode does: no return to report
