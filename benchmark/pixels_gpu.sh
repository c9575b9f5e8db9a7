#!/usr/bin/env bash
# GPU measurements of the pixel scripts at CleanRL's settings (the scripts' defaults), each for SECONDS_PER_RUN of
# wall time (default 120), then stopped with SIGTERM (the scripts checkpoint and exit 0): dqn_atari.py and
# pqn_atari.py on BreakoutNoFrameskip-v4, ppo_atari_envpool.py on Breakout-v5 and ppo_procgen.py on
# StarpilotEasy-v0. Reports SPS and the score reached (mean of the last 100 episodes, or as many as there
# were) with cleanrl_utils.results into $RESULTS/pixels_gpu.md, beside CleanRL's figures (../shared/BENCHMARKS.md:
# dqn_atari Breakout 366.93 +- 39.89 at 10M; envpool PPO ~1,000 SPS, LeanRL's eager PPO Atari 1,022 SPS).
# Called by benchmark/gpu/run_all.sh with the node's python3 and the kit on PYTHONPATH; alone:
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/pixels_gpu.sh
# TINY=1: the CPU, tiny sizes and runs that end by themselves (tests/test_gpu_kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-120}
RESULTS=${RESULTS:-benchmark/results}
mkdir -p "$RESULTS"
declare -A tiny=(
    [dqn_atari]="--num-envs 2 --buffer-size 400 --learning-starts 64 --batch-size 4 --total-timesteps 96"
    [pqn_atari]="--num-envs 4 --num-steps 16 --num-minibatches 2 --update-epochs 1 --total-timesteps 128"
    [ppo_atari_envpool]="--num-envs 2 --num-steps 32 --num-minibatches 2 --update-epochs 1 --total-timesteps 128"
    [ppo_procgen]="--num-envs 2 --num-steps 32 --num-minibatches 2 --update-epochs 1 --total-timesteps 128"
)
if [[ ${TINY:-0} != 1 ]]; then
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
for job in "dqn_atari BreakoutNoFrameskip-v4" "pqn_atari BreakoutNoFrameskip-v4" "ppo_atari_envpool Breakout-v5" \
    "ppo_procgen StarpilotEasy-v0"; do
    set -- $job
    flags=()
    [[ ${TINY:-0} == 1 ]] && read -ra flags <<< "--no-cuda ${tiny[$1]}"
    # timeout exits 124 after its SIGTERM; the script itself exits 0 having written its checkpoint.
    timeout --signal=TERM --kill-after=60 "$SECONDS_PER_RUN" \
        $PYTHON "cleanrl/$1.py" --env-id "$2" --seed 1 "${flags[@]}" > "$RESULTS/${1}_gpu.log" 2>&1 || true
    tail -n 3 "$RESULTS/${1}_gpu.log"
done
$PYTHON -m cleanrl_utils.results runs/BreakoutNoFrameskip-v4__dqn_atari__1__* runs/BreakoutNoFrameskip-v4__pqn_atari__1__* \
    runs/Breakout-v5__ppo_atari_envpool__1__* runs/StarpilotEasy-v0__ppo_procgen__1__* --output "$RESULTS/pixels_gpu" ||
    [[ ${TINY:-0} == 1 ]] # a tiny run may end before its first episode does: no return to report
