#!/usr/bin/env bash
# mjlab's robots on a GPU: ppo_isaacgym.py and fast_td3_isaacgym.py (--simulator mjlab) beside mjlab's own training
# (rsl_rl's PPO through `python -m mjlab.scripts.train`, its task's own settings) on Unitree Go1 and G1 flat velocity
# tracking (TASKS), NUM_ENVS (4096) worlds each, SECONDS_PER_RUN (300) of wall clock each (ours: --time-limit-seconds,
# training only; rsl_rl: stopped by SIGINT, start-up included), seed 1. Ours: ppo_isaacgym at its defaults with
# 24-step rollouts (rsl_rl's num_steps_per_env for these tasks); fast_td3 at the authors' Isaac Lab settings (n-step 8,
# 4 updates a step, 251 atoms, their G1 presets; the support is the script's mjlab default). Recorded: the steps each
# reached, SPS, the episodic return and mjlab's velocity-tracking reward term at the end, one table per task into
# $RESULTS/mjlab_gpu.md (benchmark/mjlab_gpu_table.py), the run folders for the curves.
# Needs mjlab's environment (projects/mjlab: mujoco 3.11); on a machine with uv and a GPU:
#   uv run --project projects/mjlab bash benchmark/mjlab_gpu.sh
# The offline GPU kit (benchmark/gpu/) does not carry mjlab yet: see benchmark/gpu/README.md.
# TINY=1: the CPU, Cartpole, 16 envs and a few iterations of each trainer (tests/test_mjlab_gpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
RESULTS=${RESULTS:-benchmark/results}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-300}
NUM_ENVS=${NUM_ENVS:-4096}
tasks=${TASKS:-Mjlab-Velocity-Flat-Unitree-Go1 Mjlab-Velocity-Flat-Unitree-G1}
mkdir -p "$RESULTS"
ours=(--num-envs "$NUM_ENVS" --total-timesteps 100000000000 --time-limit-seconds "$SECONDS_PER_RUN" --seed 1)
ppo=(--num-steps 24)
td3=(--n-steps 8 --num-updates 4 --num-atoms 251)
rsl=(--env.scene.num-envs "$NUM_ENVS" --agent.max-iterations 1000000 --agent.logger tensorboard --agent.seed 1)
if [[ ${TINY:-0} == 1 ]]; then
    tasks=${TASKS:-Mjlab-Cartpole-Balance}
    NUM_ENVS=16 SECONDS_PER_RUN=0
    ours=(--num-envs 16 --total-timesteps 768 --seed 1 --no-cuda)
    td3=(--n-steps 3 --num-updates 1 --num-atoms 11 --batch-size 64 --buffer-size 64 --learning-starts 256
        --critic-hidden 32 --actor-hidden 16 --log-every 128)
    rsl=(--env.scene.num-envs 16 --agent.max-iterations 2 --agent.logger tensorboard --agent.seed 1 --gpu-ids None)
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
device=$($PYTHON -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'the CPU')")
rsl_logs=$(mktemp -d "${TMPDIR:-/tmp}/mjlab_gpu_rsl_rl.XXXX")
for task in $tasks; do
    log="$RESULTS/mjlab_gpu_${task}"
    $PYTHON cleanrl/ppo_isaacgym.py --simulator mjlab --env-id "$task" --exp-name ppo_isaacgym_mjlab_gpu \
        "${ours[@]}" "${ppo[@]}" >"$log.ppo_isaacgym.log" 2>&1
    $PYTHON cleanrl/fast_td3_isaacgym.py --simulator mjlab --env-id "$task" --exp-name fast_td3_mjlab_gpu \
        "${ours[@]}" "${td3[@]}" >"$log.fast_td3.log" 2>&1
    # rsl_rl has no wall-clock limit: SIGINT after the same seconds (its events are flushed every 10 s)
    status=0
    if [[ ${TINY:-0} == 1 ]]; then
        $PYTHON -m mjlab.scripts.train "$task" "${rsl[@]}" --log-root "$rsl_logs/$task" >"$log.rsl_rl.log" 2>&1
    else
        timeout --signal=INT --kill-after=60 "$SECONDS_PER_RUN" $PYTHON -m mjlab.scripts.train "$task" "${rsl[@]}" \
            --log-root "$rsl_logs/$task" >"$log.rsl_rl.log" 2>&1 || status=$?
        ((status == 0 || status == 124)) || { tail -n 20 "$log.rsl_rl.log" && exit "$status"; }
    fi
    ppo_run=$(ls -td runs/"$task"__ppo_isaacgym_mjlab_gpu__1__* | head -1)
    td3_run=$(ls -td runs/"$task"__fast_td3_mjlab_gpu__1__* | head -1)
    rsl_run=$(ls -td "$rsl_logs/$task"/*/* | head -1)
    mkdir -p "runs/${task}__rsl_rl_mjlab_gpu__1" && cp -r "$rsl_run"/. "runs/${task}__rsl_rl_mjlab_gpu__1/"
    $PYTHON benchmark/mjlab_gpu_table.py --title "### $task, $NUM_ENVS worlds, $SECONDS_PER_RUN s each, on $device" \
        --run "ppo_isaacgym=$ppo_run" --run "fast_td3_isaacgym=$td3_run" \
        --run "rsl_rl (mjlab.scripts.train)=runs/${task}__rsl_rl_mjlab_gpu__1" --output "$RESULTS/mjlab_gpu"
done
rm -rf "$rsl_logs"
