"""Score runs at a common step S (pqn_atari_envpool_lstm's stopped runs beside pqn_atari's 1M runs): the mean of each
run's last 100 episodic returns logged at steps <= S, then mean +- std across seeds; also write copies of the runs'
episodic returns truncated at S into OUT_DIR, for the plot.

    uv run --all-extras python benchmark/pqn_atari_envpool_lstm_compare.py 237568 /tmp/trunc \\
        "MinAtar-Breakout-v1__pqn_atari_envpool_lstm__*" "MinAtar-Breakout-v1__pqn_atari__*"
    uv run --all-extras python benchmark/pqn_atari_envpool_lstm_compare.py 249856 /tmp/trunc \
        "MinAtar-SpaceInvaders-v1__pqn_atari_envpool_lstm__*" "MinAtar-SpaceInvaders-v1__pqn_atari__*"
    uv run --all-extras python -m cleanrl_utils.plot /tmp/trunc --output benchmark/results/pqn_atari_envpool_lstm.png
"""

import shutil
import sys
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

step_limit, out_dir, groups = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
for group in groups:
    scores, sps = [], []
    for run_dir in sorted(Path("runs").glob(group)):
        events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        events.Reload()
        returns = [e for e in events.Scalars("charts/episodic_return") if e.step <= step_limit]
        scores.append(np.mean([e.value for e in returns[-100:]]))
        sps.append([e for e in events.Scalars("charts/SPS") if e.step <= step_limit][-1].value)
        last = max(e.step for e in events.Scalars("losses/td_loss"))
        print(f"  {run_dir.name}: last step {last}, score at {step_limit} {scores[-1]:.2f}, SPS {sps[-1]:.0f}")
        copy = out_dir / run_dir.name
        copy.mkdir(parents=True, exist_ok=True)
        shutil.copy(run_dir / "args.json", copy)
        writer = SummaryWriter(str(copy))
        for e in returns:
            writer.add_scalar("charts/episodic_return", e.value, e.step, walltime=e.wall_time)
        writer.close()
    per_seed = ", ".join(f"{x:.2f}" for x in scores)
    print(f"{group}: {len(scores)} seeds, {np.mean(scores):.2f} +- {np.std(scores):.2f} at step {step_limit}; ")
    print(f"  per seed {per_seed}; SPS {np.mean(sps):.0f}")
