"""Uniform random policy on an Atari, MinAtar, envpool Atari or Procgen game, logged like a training run, so that
the pixel scripts' benchmark tables show the baseline measured the same way as the agents (whole-game raw scores,
charts/episodic_return, scored by `python -m cleanrl_utils.results` on the last 100 games).

    uv run python benchmark/random_policy_pixels.py --env-id MinAtar/Breakout-v1 --seed 1 --total-timesteps 1000000
    uv run --extra envpool python benchmark/random_policy_pixels.py --env-id StarpilotEasy-v0 --num-envs 64

The game is built by the make_envs of cleanrl_utils/envs/atari.py, envpool_atari.py (envpool ids such as
Breakout-v5) or procgen.py, as the pixel scripts build it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cleanrl_utils.envs import envpool_atari, procgen  # noqa: E402
from cleanrl_utils.envs.atari import check_env_id, make_envs  # noqa: E402
from cleanrl_utils.envs.procgen import PROCGEN_IDS  # noqa: E402
from cleanrl_utils.errors import check_positive  # noqa: E402
from cleanrl_utils.run import Run  # noqa: E402


@dataclass
class Args:
    env_id: str = "MinAtar/Breakout-v1"
    """the game: an Atari id (BreakoutNoFrameskip-v4, ALE/Breakout-v5), a MinAtar id, an envpool Atari id
    (Breakout-v5) or a Procgen id (StarpilotEasy-v0)"""
    seed: int = 1
    """seed of the games and of the random actions"""
    total_timesteps: int = 1_000_000
    """environment steps to run (one step of all num_envs games counts num_envs)"""
    num_envs: int = 8
    """parallel games"""
    exp_name: str = "random_policy"
    """the run's name in result tables"""
    track: bool = False
    """mirror to Weights & Biases (as the scripts' --track)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    save_model: bool = False
    """there is no model to save (Run's end-of-run step reads this)"""


if __name__ == "__main__":
    args = tyro.cli(Args)
    check_positive(total_timesteps=args.total_timesteps, num_envs=args.num_envs)
    if args.env_id in PROCGEN_IDS:
        run = Run(args, __file__)  # seeds python, numpy and torch; makes the run directory
        envs = procgen.make_envs(args.env_id, args.num_envs, args.seed)
        envs.reset()
    else:
        envpool_id = args.env_id.endswith("-v5") and not args.env_id.startswith(("ALE/", "MinAtar/"))
        if envpool_id:
            envpool_atari.check_env_id(args.env_id, "use its ALE/ id", "cleanrl/dqn.py")
        else:
            check_env_id(args.env_id, "cleanrl/dqn.py")
        run = Run(args, __file__)
        envs = (envpool_atari.make_envs if envpool_id else make_envs)(args.env_id, args.num_envs)
        envs.reset(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    global_step = 0
    while global_step < args.total_timesteps:
        _, _, _, _, infos = envs.step(rng.integers(envs.single_action_space.n, size=args.num_envs))
        global_step += args.num_envs
        run.log_episodes(global_step, infos)
        if global_step % 10_000 < args.num_envs:
            run.log(global_step, {})
    envs.close()
    run.finish(global_step)
    print(f"{args.env_id}: random policy logged to {run.dir}")
