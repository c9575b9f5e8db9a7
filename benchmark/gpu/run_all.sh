#!/usr/bin/env bash
# Every GPU measurement of the project, item by item, run with the node's own python3 and the kit's packages
# (benchmark/gpu/install.py into benchmark/gpu/site): no uv, no package index. benchmark/gpu/call.sh runs, in each
# device call of the runbook (benchmark/gpu/README.md), the items whose packages that call completes (ONLY=...).
#   bash benchmark/gpu/run_all.sh           # on the GPU node; results in $RESULTS (benchmark/results)
#   bash benchmark/gpu/run_all.sh --tiny    # a CPU, every item at tiny sizes (tests/test_gpu_kit.py runs this)
# Items, in order of priority, with the seconds planned for each on an H200 (the windows are environment knobs):
#   ppo_isaacgym   300  Ant, 4096 MuJoCo Warp worlds, 240 s of training (SECONDS_OF_TRAINING), beside CleanRL's
#                       Isaac Gym Ant; raw simulator SPS first (it compiles the kernels: a cold cache costs more)
#   compile_table  150  ppo, dqn, sac, td3, ppo_continuous_action: eager / --compile / --compile --cudagraphs,
#                       8 s / 11 s / 11 s windows (EAGER_SECONDS, COMPILED_SECONDS), beside LeanRL's
#   mappo           30  vmas/navigation at 4096, 16384 and 32768 worlds (MAPPO_SIZES)
#   stock_trading   12  StockTrading-v0's raw SPS at 4096 and 65536 portfolios
#   elegant         47  PointChasing-v0's raw SPS; REDQ, SAC and CrossQ on Hopper-v5 for 12 s each (ELEGANT_SECONDS)
#   pixels          45  dqn_atari, pqn_atari, ppo_atari_envpool, ppo_procgen for 10 s each (PIXELS_SECONDS)
#   impala          75  14 Ray CPU actors feeding the GPU learner on Breakout, 60 s (IMPALA_SECONDS); runs only if
#                       the items above left the time (alone: bash benchmark/impala_gpu.sh, 180 s)
#   fast_td3       360  fast_td3_isaacgym beside ppo_isaacgym on Ant and Humanoid, 75 s of training each
#                       (FAST_TD3_SECONDS): a lease of its own once the items above are committed (SKIP them)
#   fast_sac       180  fast_sac_isaacgym on Ant and Humanoid, 75 s of training each (FAST_SAC_SECONDS), tabled beside
#                       the fast_td3 item's runs of the same lease (same card)
#   amp            240  ppo_atari, ppo_atari_envpool, dqn_atari, ppo_procgen, ppg_procgen without and with --amp (bf16
#                       autocast): short fixed step budgets, each run capped at 20-30 s (AMP_SECONDS: one cap for all)
#   simbav2        260  simbav2_continuous_action and sac_continuous_action on Hopper-v5, 120 s each (SIMBAV2_SECONDS):
#                       the SPS that sizes SimbaV2's 300k-step benchmark, which the CPUs cannot run
# An item that would end past DEADLINE (570 s after the start) is skipped and says so; one that fails is reported
# and the next one runs. ONLY="mappo pixels" runs just the items named (to rerun one that failed; the tests run each
# tiny item as a test of its own). The summary (also $RESULTS/gpu_run_all.md) lists each item's status and time.
set -uo pipefail
cd "$(dirname "$0")/../.."
tiny=0
case "${1:-}" in
--tiny) tiny=1 ;;
"") ;;
*) echo "error: run_all.sh takes no argument but --tiny, got $1" >&2 && exit 2 ;;
esac
items="ppo_isaacgym compile_table mappo stock_trading elegant pixels impala fast_td3 fast_sac amp simbav2"
for name in ${ONLY:-}; do
    [[ " $items " == *" $name "* ]] || { echo "error: ONLY names $name; the items are: $items" >&2 && exit 2; }
done
export PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD/${SITE:-benchmark/gpu/site}:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export RESULTS=${RESULTS:-benchmark/results}
export MUJOCO_GL=${MUJOCO_GL:-egl} PYTHONUNBUFFERED=1 TINY=$tiny
deadline=${DEADLINE:-$((tiny ? 3000 : 570))}
mkdir -p "$RESULTS"
summary=()
failures=0

item() { # item NAME PLANNED_SECONDS COMMAND...: runs COMMAND unless it would pass the deadline
    local name=$1 planned=$2 started=$SECONDS status
    shift 2
    [[ -z ${ONLY:-} || " $ONLY " == *" $name "* ]] || return 0
    local left=$((deadline - SECONDS))
    if ((tiny == 0 && planned > left)); then
        summary+=("| $name | skipped: $planned s planned, $left s left of $deadline | 0 |")
        return
    fi
    echo "=== $name (planned $planned s, $left s left)"
    timeout --signal=TERM --kill-after=30 "$((left > 0 ? left : 1))" "$@"
    status=$?
    ((status == 0)) || failures=$((failures + 1))
    summary+=("| $name | $([[ $status == 0 ]] && echo ok || echo "failed (exit $status)") | $((SECONDS - started)) |")
}

if ((tiny)); then
    export SECONDS_OF_TRAINING=2 SIZES=8 SECONDS_PER_RUN=600
    item ppo_isaacgym 0 bash benchmark/ppo_isaacgym_gpu.sh
    item compile_table 0 "$PYTHON" benchmark/gpu/compile_table.py --tiny
    item mappo 0 bash benchmark/mappo_gpu.sh
    item stock_trading 0 "$PYTHON" benchmark/stock_trading_sps.py --device cpu --sizes 4 --sync-sizes 1 --seconds 0.2 \
        --output "$RESULTS/stock_trading_sps_gpu.md"
    item elegant 0 bash benchmark/elegant_gpu.sh
    item pixels 0 bash benchmark/pixels_gpu.sh
    item impala 0 env TINY=1 bash benchmark/impala_gpu.sh
    item fast_td3 0 bash benchmark/fast_td3_gpu.sh
    item fast_sac 0 bash benchmark/fast_sac_gpu.sh
    item amp 0 "$PYTHON" benchmark/gpu/amp_table.py --tiny
    item simbav2 0 bash benchmark/simbav2_gpu.sh
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" ||
        exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    item ppo_isaacgym 300 env RAW_STEPS=200 bash benchmark/ppo_isaacgym_gpu.sh
    item compile_table 150 "$PYTHON" benchmark/gpu/compile_table.py --eager-seconds "${EAGER_SECONDS:-8}" \
        --compiled-seconds "${COMPILED_SECONDS:-11}"
    item mappo 30 env SIZES="${MAPPO_SIZES:-4096 16384 32768}" bash benchmark/mappo_gpu.sh
    item stock_trading 12 "$PYTHON" benchmark/stock_trading_sps.py --device cuda --sizes 4096 --large --sync-sizes 1 \
        --seconds 2 --output "$RESULTS/stock_trading_sps_gpu.md"
    item elegant 47 env SECONDS_PER_RUN="${ELEGANT_SECONDS:-12}" SPS_SECONDS=1 bash benchmark/elegant_gpu.sh
    item pixels 45 env SECONDS_PER_RUN="${PIXELS_SECONDS:-10}" bash benchmark/pixels_gpu.sh
    item impala 75 env SECONDS_PER_RUN="${IMPALA_SECONDS:-60}" bash benchmark/impala_gpu.sh
    item fast_td3 360 env SECONDS_PER_RUN="${FAST_TD3_SECONDS:-75}" bash benchmark/fast_td3_gpu.sh
    item fast_sac 180 env SECONDS_PER_RUN="${FAST_SAC_SECONDS:-75}" bash benchmark/fast_sac_gpu.sh
    item amp 240 "$PYTHON" benchmark/gpu/amp_table.py ${AMP_SECONDS:+--seconds "$AMP_SECONDS"}
    item simbav2 260 env SECONDS_PER_RUN="${SIMBAV2_SECONDS:-120}" bash benchmark/simbav2_gpu.sh
fi

{
    echo "# benchmark/gpu/run_all.sh$([[ $tiny == 1 ]] && echo ' --tiny')"
    echo
    echo "Finished in $SECONDS s (deadline $deadline s). Results of each item: the files named in its section above."
    echo
    echo "| item | status | seconds |"
    echo "|---|---|---|"
    printf '%s\n' "${summary[@]}"
} | tee "$RESULTS/gpu_run_all.md"
exit $((failures > 0))
