#!/usr/bin/env bash
# Speed of whole runs, start-up included, on a quiet machine (nothing else running).
# For each command: process wall time and peak memory (GNU time), the SPS the script logs
# (charts/SPS: steps / seconds since the training loop's set-up), and steps / process wall time.
# Usage: bash benchmark/speed.sh [label]   -> appends rows to benchmark/results/speed_log.md
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
uv sync --all-extras --quiet
label=${1:-}
out=benchmark/results/speed_log.md  # raw rows; benchmark/results/speed.md is the curated table
[ -f "$out" ] || printf '| command | steps | wall time (s) | SPS, whole process | SPS, logged by the script | peak memory (MB) | note |\n|---|---|---|---|---|---|---|\n' > "$out"

measure() {
    local steps=$1; shift
    local tmp; tmp=$(mktemp -d)
    # Run in a scratch folder so runs/ of the benchmark tables is not touched.
    ( cd "$tmp" && /usr/bin/time -f "%e %M" -o "$tmp/time" "$root/.venv/bin/python" "$root/$1" "${@:2}" \
        --total-timesteps "$steps" > "$tmp/log" 2>&1 )
    read -r wall rss < "$tmp/time"
    local logged; logged=$("$root/.venv/bin/python" - "$tmp" <<'PY'
import sys, glob
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(glob.glob(sys.argv[1] + "/runs/*")[0]); acc.Reload()
print(f"{acc.Scalars('charts/SPS')[-1].value:,.0f}")
PY
)
    printf '| `%s` | %s | %.1f | %s | %s | %.0f | %s |\n' "$*" "$steps" "$wall" \
        "$(awk -v s="$steps" -v w="$wall" 'BEGIN { printf "%\047.0f", s / w }')" "$logged" "$(awk -v r="$rss" 'BEGIN { print r / 1024 }')" "$label" | tee -a "$out"
    rm -rf "$tmp"
}

measure 100000 cleanrl/ppo.py --env-id CartPole-v1
measure 100000 cleanrl/dqn.py --env-id CartPole-v1
