#!/usr/bin/env bash
# GPU measurement of issue 35: fast_td3_isaacgym.py beside ppo_isaacgym.py on MuJoCo Warp's Ant and Humanoid (TASKS),
# each run SECONDS_PER_RUN (75) s of training (--time-limit-seconds; start-up and kernel compilation not counted),
# seed 1: FastTD3 at NUM_ENVS (1024) worlds with its defaults (the authors': batches of 32,768, 3-step returns, two
# critic updates a step), PPO at its defaults (4096 worlds x 16 steps). Recorded: the episodic return against wall
# time and steps, SPS, with cleanrl_utils.results into $RESULTS/fast_td3_gpu.md (the run folders come back for the
# curves: `uv run python -m cleanrl_utils.plot runs/*__fast_td3_gpu__* runs/*__ppo_beside_fast_td3_gpu__*`).
# Called by benchmark/gpu/run_all.sh with the node's python3 and the kit on PYTHONPATH; alone:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/fast_td3_gpu.sh
# TINY=1: the CPU, Hopper, tiny sizes and runs that end by themselves (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RESULTS=${RESULTS:-benchmark/results}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-75}
tasks=${TASKS:-Ant Humanoid}
mkdir -p "$RESULTS"
fast_flags=(--num-envs "${NUM_ENVS:-1024}" --total-timesteps 1000000000 --time-limit-seconds "$SECONDS_PER_RUN")
ppo_flags=(--total-timesteps 1000000000 --time-limit-seconds "$SECONDS_PER_RUN")
if [[ ${TINY:-0} == 1 ]]; then
    tasks=${TASKS:-Hopper}
    fast_flags=(--no-cuda --num-envs 4 --batch-size 32 --buffer-size 64 --learning-starts 16 --total-timesteps 64
        --critic-hidden 64 --actor-hidden 32 --log-every 8)
    ppo_flags=(--no-cuda --num-envs 4 --num-steps 8 --num-minibatches 2 --update-epochs 1 --total-timesteps 64
        --log-every 1)
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
runs=()
for task in $tasks; do
    $PYTHON cleanrl/fast_td3_isaacgym.py --simulator mujoco-warp --env-id "$task" --seed 1 --exp-name fast_td3_gpu \
        "${fast_flags[@]}" >"$RESULTS/fast_td3_gpu_$task.log" 2>&1
    tail -n 2 "$RESULTS/fast_td3_gpu_$task.log"
    $PYTHON cleanrl/ppo_isaacgym.py --simulator mujoco-warp --env-id "$task" --seed 1 \
        --exp-name ppo_beside_fast_td3_gpu "${ppo_flags[@]}" >"$RESULTS/ppo_beside_fast_td3_gpu_$task.log" 2>&1
    tail -n 2 "$RESULTS/ppo_beside_fast_td3_gpu_$task.log"
    runs+=(runs/"${task}"__fast_td3_gpu__1__* runs/"${task}"__ppo_beside_fast_td3_gpu__1__*)
done
$PYTHON -m cleanrl_utils.results "${runs[@]}" --last-episodes 10 --output "$RESULTS/fast_td3_gpu" ||
    [[ ${TINY:-0} == 1 ]] # a tiny run may end before its first episode does: no return to report
