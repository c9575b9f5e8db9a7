"""cleanrl/ppo_continuous_action.py, unchanged, on the hidden-velocity tasks of cleanrl/ppo_continuous_action_lstm.py:
the memoryless baseline of benchmark/ppo_continuous_action_lstm.sh.

    uv run python benchmark/ppo_continuous_action_pomdp.py --env-id PendulumNoVel-v1 --total-timesteps 300000

Registers one gymnasium id per task that the LSTM script can hide velocities of, named as the RL Zoo names them
(PendulumNoVel-v1, HopperNoVel-v5, HalfCheetahNoVel-v5, Walker2dNoVel-v5): the task made by gym.make, wrapped in
ppo_continuous_action_lstm.py's HideVelocities with its POSITIONS. Then runs ppo_continuous_action.py as its command
would (its own file, its own exp name, checkpoints, --resume and --save-model), with the arguments given here.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import gymnasium as gym

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "cleanrl" / "ppo_continuous_action.py"


def hidden_velocity_env(base_id: str, **kwargs) -> gym.Env:
    """`base_id` with only the position entries of its observation."""
    from ppo_continuous_action_lstm import POSITIONS, HideVelocities

    return HideVelocities(gym.make(base_id, **kwargs), POSITIONS[base_id])


def register_hidden_velocity_ids() -> list[str]:
    from ppo_continuous_action_lstm import POSITIONS

    # By this module's importable name, so that checkpoints pickle the envs' entry point (exact resume).
    from ppo_continuous_action_pomdp import hidden_velocity_env as entry_point

    ids = []
    for base_id in POSITIONS:
        name, version = base_id.rsplit("-v", 1)
        env_id = f"{name}NoVel-v{version}"
        # No time limit of its own: gym.make(base_id) applies the task's.
        gym.register(env_id, entry_point=entry_point, kwargs={"base_id": base_id})
        ids.append(env_id)
    return ids


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT / "cleanrl"), str(ROOT / "benchmark")]
    register_hidden_velocity_ids()
    sys.argv = [str(SCRIPT), *sys.argv[1:]]
    runpy.run_path(str(SCRIPT), run_name="__main__")
