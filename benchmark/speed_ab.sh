#!/usr/bin/env bash
# Whole-process speed before and after a change, interleaved so that both see the same machine load:
#   bash benchmark/speed_ab.sh BEFORE_REV [repeats] [name ...]
# BEFORE_REV is checked out as a git worktree in a temporary folder; each repeat runs every name there
# ("before") and here ("after"), one after another, through benchmark/speed.sh (rows go to
# benchmark/results/speed_log.md). The settings of the script pattern change's A/B (speed.md): ppo CartPole-v1
# 100k; sac and td3 Pendulum-v1 10k with 5k random steps; ppo_continuous_action Hopper-v5 50k.
set -euo pipefail
cd "$(dirname "$0")/.."
before_rev=$1
repeats=${2:-2}
names=("${@:3}")
[ ${#names[@]} -gt 0 ] || names=(ppo sac td3 ppo_continuous_action)
worktree=$(mktemp -d)/before
git worktree add --detach "$worktree" "$before_rev" >/dev/null
trap 'git worktree remove --force "$worktree"' EXIT
for repeat in $(seq "$repeats"); do
    for name in "${names[@]}"; do
        OFF_POLICY_STEPS=10000 SCRIPTS_ROOT="$worktree" bash benchmark/speed.sh "before ($before_rev), repeat $repeat" "$name"
        OFF_POLICY_STEPS=10000 bash benchmark/speed.sh "after ($(git rev-parse --short HEAD)), repeat $repeat" "$name"
    done
done
