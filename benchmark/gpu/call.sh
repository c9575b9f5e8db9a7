#!/usr/bin/env bash
# One device call of the GPU runbook (benchmark/gpu/kit/RUNBOOK.md, built by benchmark/gpu/build_kit.py):
#   bash benchmark/gpu/call.sh N        # on the node, carrying benchmark/gpu/kit/call-NN
# installs the pieces call-NN carries (benchmark/gpu/install.py into benchmark/gpu/site), then runs the run_all.sh
# items the manifest gives this call, and leaves under $OUT: call-NN.log (everything printed),
# call-NN-results.tar.gz (the results and run folders this call wrote: unpack it in the repository root) and
# gpu_run_all.md. SKIP="item ..." leaves out items already measured (the call then installs only). TINY=1 runs the
# items at tiny sizes on a CPU (the rehearsal test, tests/test_gpu_rehearsal.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# == 1 && $1 =~ ^[0-9]+$ ]] || { echo "error: call.sh takes the call's number, got: $*" >&2 && exit 2; }
n=$(printf %02d "$((10#$1))")
folder=benchmark/gpu/kit/call-$n
[[ -f $folder/manifest.json ]] || { echo "error: $folder/manifest.json missing: carry $folder" >&2 && exit 2; }
out=${OUT:?OUT must name the folder whose files come back}
mkdir -p "$out"
log=$out/call-$n.log
started=$(mktemp)
export PYTHON=${PYTHON:-python3} PYTHONUNBUFFERED=1
results=benchmark/gpu/results/call-$n
rm -rf "$results" && mkdir -p "$results"
{
    echo "=== call $n: $(date -u +%FT%TZ), $(nproc) cores, $($PYTHON -c 'import sys; print(sys.version.split()[0])')"
    read_call() { $PYTHON -c "import json; m = json.load(open('$folder/manifest.json'))
print(next(c for c in m['calls'] if c['call'] == $((10#$n)))['$1'])"; }
    items=$(for item in $(read_call items | tr -d "[],'"); do [[ " ${SKIP:-} " == *" $item "* ]] || echo "$item"; done)
    items=$(echo $items) # one line
    timeout_s=$(read_call timeout_s)
    done=$($PYTHON -c "import json; m = json.load(open('$folder/manifest.json'))
print(' '.join(g['name'] for g in m['groups'] if g['parts'][-1]['call'] <= $((10#$n))))")
    $PYTHON benchmark/gpu/install.py "$folder" --target benchmark/gpu/site --require $done || exit 2
    status=0
    if [[ -n $items ]]; then
        # On the GPU, run_all.sh's items end 40 s before the call's timeout_s, so that their results are packed and
        # come back; --tiny (a CPU rehearsal) has no deadline.
        if [[ ${TINY:-0} == 1 ]]; then
            ONLY="$items" RESULTS=$results bash benchmark/gpu/run_all.sh --tiny
        else
            DEADLINE=$((timeout_s - 40 - SECONDS)) ONLY="$items" RESULTS=$results bash benchmark/gpu/run_all.sh
        fi
        status=$?
    fi
    echo "=== call $n done in $SECONDS s (exit $status)"
    exit $status
} 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
runs=$(find runs -mindepth 1 -maxdepth 1 -type d -newer "$started" 2>/dev/null)
tar -czf "$out/call-$n-results.tar.gz" --transform "s|^$results|benchmark/results|" "$results" $runs
[[ -f $results/gpu_run_all.md ]] && cp "$results/gpu_run_all.md" "$out/"
rm -f "$started"
exit "$status"
