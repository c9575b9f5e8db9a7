#!/usr/bin/env bash
# SPS of mappo.py on vmas/navigation (4 agents) on the CPU at 1024 and 4096 environments, beside the
# raw simulator: training = the charts/SPS mappo.py logs after 4 iterations of 25-step rollouts with
# the default update (10 epochs x 8 minibatches; start-up of the loop included, imports not); raw =
# VMASVecEnv.step (cleanrl_utils.envs.multiagent) with uniform random actions, 50 steps after
# 5 warm-up steps. SPS counts environment steps (one step of all worlds = num_envs), not agent steps.
# Threads: torch's default (one per core); THREADS=1 to measure one core. Run it on an idle machine.
# Results: benchmark/results/mappo_sps.md (OUT=... to write elsewhere). GPU: benchmark/mappo_gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-0}
out=${OUT:-benchmark/results/mappo_sps.md}
rows=()
for envs in ${SIZES:-1024 4096}; do
    uv run python cleanrl/mappo.py --env-id vmas/navigation --exp-name mappo_sps --num-envs "$envs" --num-steps 25 \
        --total-timesteps $((envs * 25 * 4)) --torch-threads "$threads" > /dev/null
    run=$(ls -td runs/vmas-navigation__mappo_sps__* | head -1)
    rows+=("$(uv run python - "$run" "$envs" "$threads" <<'PY'
import sys, time
from pathlib import Path
import torch
sys.path.insert(0, "cleanrl")
import mappo
from cleanrl_utils.results import read_scalar

run, envs, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if threads:
    torch.set_num_threads(threads)
_, _, values = read_scalar(run, "charts/SPS")
env = mappo.make_env("vmas/navigation", envs, torch.device("cpu"), 1, True, None)
env.reset()
random_actions = lambda: env.action_low + (env.action_high - env.action_low) * torch.rand(envs, env.n_agents, env.act_dim)
for _ in range(5):
    env.step(random_actions())
start = time.perf_counter()
for _ in range(50):
    env.step(random_actions())
raw = 50 * envs / (time.perf_counter() - start)
print(f"| {envs} | {values[-1]:,.0f} | {raw:,.0f} | {values[-1] / raw:.2f} |")
PY
)")
    echo "${rows[-1]}"
    rm -rf "$run"
done
uv run python - "$out" "$threads" "${rows[@]}" <<'PY'
import sys
from pathlib import Path
from cleanrl_utils.results import machine_description
out, threads, rows = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
out.write_text(
    "# mappo.py SPS on the CPU (vmas/navigation, 4 agents)\n\n"
    f"Machine: {machine_description()}; torch threads: {threads or 'one per core'}. Command: benchmark/mappo_sps.sh.\n\n"
    "| envs | training SPS | raw simulator SPS | training / raw |\n|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
    "Training SPS: the last charts/SPS of a 4-iteration run (25-step rollouts, the default update of 10 epochs x 8 "
    "minibatches over steps x envs x agents samples). Raw simulator SPS: the script's VMASVecEnv.step with uniform "
    "random actions, 50 steps after 5 warm-up steps. Environment steps per second (one step of all worlds counts "
    "num_envs).\n")
print(out.read_text())
PY
