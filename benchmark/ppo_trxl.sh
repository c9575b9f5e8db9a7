#!/usr/bin/env bash
# ppo_trxl.py on ProofofMemory-v0 (cleanrl_utils/envs/proof_of_memory.py): CleanRL's ProofofMemory-v0 settings
# (docs/rl-algorithms/ppo-trxl.md: 16 envs x 128 steps, 8 minibatches x 4 epochs, 4 layers, 1 head, width 64, memory
# 16, no positional encoding, vf 0.1, grad norm 0.5, lr 3e-4, entropy 1e-3, clip 0.2) at 65,536 steps (CleanRL's
# 25,000 rounded up to whole rollouts, then more), seeds 1-3, beside the same agent with --trxl-memory-length 0 (it
# attends to nothing: the same network, memoryless) and a uniform random policy. One run at a time (2-core CPU).
# Then MortarMayhem-Grid-v0 at a budget a 2-core CPU allows (see benchmark/results/ppo_trxl.md: CleanRL trains it for
# 100M steps on a GPU; the default network runs at ~9 SPS here), a smaller network, 1 seed, with and without memory.
# Results: benchmark/results/ppo_trxl.md, ppo_trxl_*.md/.csv and ppo_trxl_pom.png, ppo_trxl_mortar.png.
set -euo pipefail
cd "$(dirname "$0")/.."
POM="--num-envs 16 --num-steps 128 --num-minibatches 8 --update-epochs 4 --trxl-num-layers 4 --trxl-num-heads 1"
POM="$POM --trxl-dim 64 --trxl-positional-encoding none --vf-coef 0.1 --max-grad-norm 0.5 --init-lr 3e-4"
POM="$POM --init-ent-coef 0.001 --clip-coef 0.2 --total-timesteps ${POM_STEPS:-65536}"
BENCH="uv run --all-extras python -m cleanrl_utils.benchmark --num-seeds 3 --workers ${WORKERS:-1}"
$BENCH --env-ids ProofofMemory-v0 --output benchmark/results/ppo_trxl_pom \
    --command "uv run --all-extras python cleanrl/ppo_trxl.py $POM --trxl-memory-length 16"
$BENCH --env-ids ProofofMemory-v0 --output benchmark/results/ppo_trxl_pom_no_memory \
    --command "uv run --all-extras python cleanrl/ppo_trxl.py $POM --trxl-memory-length 0 --exp-name ppo_trxl_no_memory"
$BENCH --env-ids ProofofMemory-v0 --output benchmark/results/ppo_trxl_pom_random \
    --command "uv run --all-extras python benchmark/random_policy_memory.py --total-timesteps ${POM_STEPS:-65536}"
runs=(runs/ProofofMemory-v0__ppo_trxl__* runs/ProofofMemory-v0__ppo_trxl_no_memory__*)
uv run --all-extras python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_trxl_pom.png

[ "${POM_ONLY:-0}" = 1 ] && exit 0
MORTAR="--num-envs 8 --num-steps 128 --num-minibatches 4 --update-epochs 3 --trxl-num-layers 2 --trxl-num-heads 2"
MORTAR="$MORTAR --trxl-dim 64 --total-timesteps ${MORTAR_STEPS:-131072}"
BENCH1="uv run --all-extras python -m cleanrl_utils.benchmark --num-seeds 1 --workers ${WORKERS:-1}"
$BENCH1 --env-ids MortarMayhem-Grid-v0 --output benchmark/results/ppo_trxl_mortar \
    --command "uv run --all-extras python cleanrl/ppo_trxl.py $MORTAR --trxl-memory-length 64"
$BENCH1 --env-ids MortarMayhem-Grid-v0 --output benchmark/results/ppo_trxl_mortar_no_memory \
    --command "uv run --all-extras python cleanrl/ppo_trxl.py $MORTAR --trxl-memory-length 0 --exp-name ppo_trxl_no_memory"
$BENCH1 --env-ids MortarMayhem-Grid-v0 --output benchmark/results/ppo_trxl_mortar_random \
    --command "uv run --all-extras python benchmark/random_policy_memory.py --num-envs 8 --total-timesteps 65536"
runs=(runs/MortarMayhem-Grid-v0__ppo_trxl__* runs/MortarMayhem-Grid-v0__ppo_trxl_no_memory__*)
uv run --all-extras python -m cleanrl_utils.plot "${runs[@]}" --output benchmark/results/ppo_trxl_mortar.png
