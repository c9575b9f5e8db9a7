#!/usr/bin/env bash
# ppo_continuous_action_lstm.py on Pendulum-v1 with its angular velocity hidden (the agent sees cos and sin of the
# angle only: a POMDP), beside the memoryless ppo_continuous_action.py on the same observations and a uniform random
# policy, 300k steps, seeds 1-3, one run at a time.
#   lstm        the script's defaults (8 envs x 256 steps, 4 minibatches of 2 env sequences x 10 epochs, lr 1e-3
#               annealed, gamma 0.9, two 64-unit LSTMs before ppo_continuous_action.py's 64x64 tanh networks)
#   memoryless  ppo_continuous_action.py, unchanged, run by benchmark/ppo_continuous_action_pomdp.py on
#               PendulumNoVel-v1 (Pendulum-v1 through the LSTM script's HideVelocities wrapper), with the same
#               settings (its minibatches: 4 of 512 shuffled steps)
#   random      benchmark/random_policy_box.py on Pendulum-v1 (a random policy does not read the observation)
#   table       benchmark/results/ppo_continuous_action_lstm.md (the table; the text below it is written by hand) and
#               .png from the archived runs
# Killed, the same command continues: finished runs are skipped, the others resume from their last checkpoint.
#     bash benchmark/ppo_continuous_action_lstm.sh [lstm] [memoryless] [random] [table]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="uv run python"
STEPS=300000
SAME=(--num-envs 8 --num-steps 256 --num-minibatches 4 --update-epochs 10 --learning-rate 1e-3 --gamma 0.9)
bench() {  # $1 env id, $2 command
    $PY -m cleanrl_utils.benchmark --env-ids "$1" --command "$2" --num-seeds 3 --workers "${WORKERS:-1}" \
        --archive benchmark/runs --output "/tmp/ppo_continuous_action_lstm_bench"
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(lstm memoryless random table)
for part in "${parts[@]}"; do
    case "$part" in
    lstm) bench Pendulum-v1 "$PY cleanrl/ppo_continuous_action_lstm.py --total-timesteps $STEPS --checkpoint-every 100000" ;;
    memoryless)
        bench PendulumNoVel-v1 \
            "$PY benchmark/ppo_continuous_action_pomdp.py ${SAME[*]} --total-timesteps $STEPS --checkpoint-every 100000" ;;
    random) bench Pendulum-v1 "$PY benchmark/random_policy_box.py --total-timesteps $STEPS" ;;
    table)
        runs=(benchmark/runs/Pendulum-v1__ppo_continuous_action_lstm__[123]__*)
        runs+=(benchmark/runs/PendulumNoVel-v1__ppo_continuous_action__[123]__*)
        runs+=(benchmark/runs/Pendulum-v1__random_policy__[123]__*)
        $PY -m cleanrl_utils.results "${runs[@]}" --output benchmark/results/ppo_continuous_action_lstm
        # The curves on one panel: the memoryless runs' copies labelled Pendulum-v1, the task the LSTM runs saw
        # (Pendulum-v1 through the same HideVelocities wrapper); the table above keeps their own id.
        labelled=$(mktemp -d)
        for archive in benchmark/runs/PendulumNoVel-v1__ppo_continuous_action__[123]__*.tar.xz; do
            tar -xJf "$archive" -C "$labelled"
        done
        sed -i 's/"env_id": "PendulumNoVel-v1"/"env_id": "Pendulum-v1"/' "$labelled"/*/args.json
        curves=(benchmark/runs/Pendulum-v1__ppo_continuous_action_lstm__[123]__* "$labelled"/*)
        curves+=(benchmark/runs/Pendulum-v1__random_policy__[123]__*)
        $PY -m cleanrl_utils.plot "${curves[@]}" --smoothing 0.6 --output benchmark/results/ppo_continuous_action_lstm.png
        rm -r "$labelled" ;;
    *) echo "unknown part: $part (lstm, memoryless, random, table)" >&2; exit 2 ;;
    esac
done
