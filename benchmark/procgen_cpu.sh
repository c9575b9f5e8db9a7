#!/usr/bin/env bash
# ppo_procgen.py and ppg_procgen.py on StarpilotEasy-v0 at a budget a 2-core CPU can run: 196,608 steps (12 iterations
# of CleanRL's 64 envs x 256 steps; IMPALA CNN, lr 5e-4, gamma 0.999), seeds 1-3, beside a uniformly random policy on
# the same 64 envs. PPG's auxiliary phase runs every --n-iteration 4 iterations here (CleanRL: 32, which this budget
# would never reach). CleanRL's 25M-step runs are benchmark/ppo_procgen.sh and ppg_procgen.sh (a GPU).
# The committed ppo results were run with the learning rate annealed to 0 (ppo_procgen.py's default then; CleanRL's
# default, and the script's now, is a constant rate): the ppo command passes --anneal-lr, the flag they were run with.
# The committed ppg results were made before ppg_procgen.py took PPG's normed initialisation and stopped clipping
# gradients (see benchmark/results/procgen_cpu.md); no flag brings that code back: the ppg part runs the current one.
# Each part can run on its own (the three runs of one script take hours on 2 cores):
#     bash benchmark/procgen_cpu.sh random|ppo|ppg|table [first seed, default 1] [last seed, default 3]
# Results: benchmark/results/procgen_cpu.md and procgen_cpu.png.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=196608
# glibc's malloc hands every block over 32 MB (and, past its adaptive threshold, smaller ones) back to the kernel when
# freed, so each of the IMPALA CNN's large activations is page-faulted in afresh: half of a run's CPU time went to the
# kernel. Kept in the process instead, the CNN's forward + backward on 512 frames takes 1.7 s instead of 2.7 s (one
# thread), and a 2-iteration ppo_procgen probe (64 envs x 64 steps) 49 s of CPU instead of 58 s, 1.5 s of it in the
# kernel instead of 10 s (side by side, twice each, 2026-12-03). The cost is memory: a whole ppo_procgen run peaked at
# 5.95 GB instead of 4.6. Environment variables only: nothing a run computes changes.
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=100000000000 MALLOC_TOP_PAD_=1073741824
# A checkpoint every iteration (16,384 steps), and each finished run archived to benchmark/runs (commit it): stopped,
# the same command again (also on a fresh machine) skips the finished seeds and
# continues the others from their checkpoints. A ppg_procgen seed takes longer than a session here (its auxiliary
# phases: ~3 h of one core): at a session's end archive its newest checkpoint with
#     uv run python -m cleanrl_utils.archive runs/StarpilotEasy-v0__ppg_procgen__* --to benchmark/runs --unfinished
# (or stop the runner with kill -TERM -- -PGID, which archives the checkpoint its run writes on the way out) and
# commit it; the next session's command continues the run from there.
KEEP="--checkpoint-every 16384"
part="$1"
first="${2:-1}"
seeds=$(( ${3:-3} - first + 1 ))
run() {
    uv run --extra envpool python -m cleanrl_utils.benchmark --env-ids StarpilotEasy-v0 --command "$1" \
        --num-seeds "$seeds" --start-seed "$first" --workers 1 --archive benchmark/runs \
        --output "/tmp/procgen_cpu_$part"
}
case "$part" in
    random) run "uv run --extra envpool python benchmark/random_policy_pixels.py --num-envs 64 --total-timesteps $STEPS" ;;
    ppo) run "uv run --extra envpool python cleanrl/ppo_procgen.py --total-timesteps $STEPS --anneal-lr $KEEP" ;;
    ppg) run "uv run --extra envpool python cleanrl/ppg_procgen.py --total-timesteps $STEPS --n-iteration 4 $KEEP" ;;
    table)
        # The archived copies: every finished run, also those of earlier machines (runs/ has only this one's); an
        # archived run still going (archived with its checkpoint, no finished.json) is no result yet.
        shopt -s nullglob
        runs=()
        for run in benchmark/runs/StarpilotEasy-v0__{ppo_procgen,ppg_procgen,random_policy}__*.tar.xz; do
            if tar -tJf "$run" | grep -q '/finished.json$'; then runs+=("$run"); else echo "not finished, left out: $run" >&2; fi
        done
        uv run --extra envpool python -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/procgen_cpu
        uv run --extra envpool python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/procgen_cpu.png
        ;;
    *) echo "usage: bash benchmark/procgen_cpu.sh random|ppo|ppg|table [first seed] [last seed]" >&2; exit 2 ;;
esac
