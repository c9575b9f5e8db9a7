#!/usr/bin/env bash
# impala_atari.py on a GPU node (its GPU acceptance check): ACTORS CPU actors (default 14, on a 16-core node: the
# learner and Ray's own processes keep the other two) feeding the GPU learner on BreakoutNoFrameskip-v4, the script's
# defaults otherwise (8 games an actor, unroll 20, 4 rollouts = 32 unrolls an update), for SECONDS_PER_RUN of wall
# time (default 180), then SIGTERM (the script checkpoints and exits 0). Reports the learner's updates/s, the env SPS
# (all actors together, counted by the learner as rollouts arrive), the policy lag and the fraction of the learner's
# time spent waiting for rollouts (near 0: the actors keep up; near 1: the learner starves), each the last logged
# value, into $RESULTS/impala_gpu.md. Ray must be installed (the `distributed` extra; it is not in the node's image).
#   PYTHON=python3 PYTHONPATH=$PWD/benchmark/gpu/site:$PWD bash benchmark/impala_gpu.sh
# TINY=1: the CPU, MinAtar, 2 actors and a run that ends by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-180}
RESULTS=${RESULTS:-benchmark/results}
ACTORS=${ACTORS:-14}
mkdir -p "$RESULTS"
env_id=BreakoutNoFrameskip-v4 flags=(--num-actors "$ACTORS")
if [[ ${TINY:-0} == 1 ]]; then
    env_id=MinAtar/Breakout-v1
    flags=(--no-cuda --num-actors 2 --local-num-envs 2 --num-steps 16 --rollouts-per-update 1 --total-timesteps 2048)
else
    $PYTHON -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
fi
$PYTHON -c "import ray; print('ray', ray.__version__)"
# timeout exits 124 after its SIGTERM; the script itself exits 0 having written its checkpoint.
timeout --signal=TERM --kill-after=60 "$SECONDS_PER_RUN" $PYTHON cleanrl/impala_atari.py --env-id "$env_id" \
    --exp-name impala_gpu --seed 1 "${flags[@]}" > "$RESULTS/impala_gpu.log" 2>&1 || true
tail -n 3 "$RESULTS/impala_gpu.log"
run=$(ls -td runs/"${env_id//\//-}"__impala_gpu__1__* | head -1)
$PYTHON - "$run" "$RESULTS/impala_gpu.md" "$SECONDS_PER_RUN" "${flags[*]}" <<'PY'
import sys
from pathlib import Path

import torch
from cleanrl_utils.results import RunError, load_events, machine_description, read_scalar

run, out, seconds, flags = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
events = load_events(run)


def last(key: str) -> float:
    return float(read_scalar(run, key, events)[2][-1])


steps = int(read_scalar(run, "charts/SPS", events)[0][-1])
try:
    returns = read_scalar(run, "charts/episodic_return", events)[2][-100:]
    score = f"{returns.mean():.1f} ({len(returns)} games)"
except RunError:  # no game ended yet
    score = "none"
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
row = (
    f"| {run.name.split('__')[0]} | {flags} | {last('perf/learner_updates_per_second'):.1f} | {last('charts/SPS'):,.0f} "
    f"| {last('charts/policy_lag'):.1f} | {last('perf/learner_wait_fraction'):.2f} | {steps:,} | {score} |"
)
print(row)
out.write_text(
    "# impala_atari.py: CPU actors feeding a GPU learner\n\n"
    f"Machine: {machine_description()}; GPU: {gpu}. Command: benchmark/impala_gpu.sh ({seconds} s of wall time, "
    "then SIGTERM).\n\n"
    "| environment | flags | learner updates/s | env SPS | policy lag | learner waiting | steps | score (last 100) |\n"
    "|---|---|---|---|---|---|---|---|\n" + row + "\n\n"
    "Each the last logged value: updates/s and SPS since the first rollouts arrived (actor start-up not counted), the "
    "policy lag in learner updates (the learner's version minus the rollout's, mean of the update's rollouts), the "
    "fraction of the learner's time spent waiting for rollouts. The score is the whole-game return.\n"
)
PY
