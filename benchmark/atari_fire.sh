#!/usr/bin/env bash
# What FIRE after a lost life changes on BreakoutNoFrameskip-v4 (cleanrl_utils/envs/atari.py: a lost life ends a
# training episode and the next step presses FIRE, as CleanRL does). "before" is the commit before the change, checked
# out as a worktree and put first on PYTHONPATH (its cleanrl_utils; the scripts have no flag for the old semantics);
# "off" is make_envs(episodic_life=False) on the new code, which plays as "before" did.
# Parts (both by default, or name them): fixed (a policy that never fires: game length and score, seeds 1-5), sps
# (acting only, 8 envs, random actions, before/after interleaved).
# Results: benchmark/results/atari_fire.md (the reading), atari_fire.csv (fixed policies), atari_fire_sps.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE_COMMIT=${BEFORE_COMMIT:-615b178}
before=${BEFORE_DIR:-/tmp/atari_fire_before}
[ -d "$before" ] || git worktree add --detach "$before" "$BEFORE_COMMIT"
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(fixed sps)
py="uv run --all-extras python"
for part in "${parts[@]}"; do
    case $part in
    fixed)
        out=benchmark/results/atari_fire.csv
        echo "env_id,semantics,policy,seed,steps,frames,score,lives_lost,ended_by" > $out
        for policy in noop right; do
            for pool in "" --envpool; do
                for off in "" --off; do
                    # shellcheck disable=SC2086
                    $py benchmark/atari_fire.py fixed --policy $policy --seeds 1 2 3 4 5 $off $pool | tail -n +2 >> $out
                done
            done
            PYTHONPATH=$before $py benchmark/atari_fire.py fixed --policy $policy --seeds 1 2 3 4 5 | tail -n +2 >> $out
        done
        ;;
    sps)
        out=benchmark/results/atari_fire_sps.csv
        echo "semantics,env_id,env_steps_per_s,cpu_s_per_1000_env_steps" > $out
        for i in 1 2; do
            PYTHONPATH=$before $py benchmark/atari_fire.py sps --repeats 2 --steps 1500 | sed 's/^/before,/' >> $out
            $py benchmark/atari_fire.py sps --repeats 2 --steps 1500 | sed 's/^/after,/' >> $out
            PYTHONPATH=$before $py benchmark/atari_fire.py sps --repeats 1 --steps 1500 --envpool --env-id Breakout-v5 |
                sed 's/^/before,/' >> $out
            $py benchmark/atari_fire.py sps --repeats 1 --steps 1500 --envpool --env-id Breakout-v5 | sed 's/^/after,/' >> $out
        done
        ;;
    *) echo "unknown part $part (fixed, sps)" >&2 && exit 2 ;;
    esac
done
