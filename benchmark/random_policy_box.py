"""Uniform random policy on the continuous-action scripts' environments (MuJoCo v5, dm_control, Pendulum-v1 ...),
logged like a training run, so that a benchmark table shows the baseline measured the same way
(charts/episodic_return, scored by `python -m cleanrl_utils.results` on the last 100 episodes).

    uv run --extra mujoco python benchmark/random_policy_box.py --env-id Hopper-v5 --total-timesteps 100000

The environments are built by cleanrl/rpo_continuous_action.py's own make_envs (ppo_continuous_action.py's plumbing);
actions are drawn uniformly from the action space's bounds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "cleanrl"))
from rpo_continuous_action import make_envs, register_env_family  # noqa: E402

from cleanrl_utils.errors import check_env_id, check_positive  # noqa: E402
from cleanrl_utils.run import Run  # noqa: E402


@dataclass
class Args:
    env_id: str = "Hopper-v5"
    """the environment, as rpo_continuous_action.py's --env-id"""
    seed: int = 1
    """seed of the environments and of the random actions"""
    total_timesteps: int = 100_000
    """environment steps to run (one step of all num_envs copies counts num_envs)"""
    num_envs: int = 1
    """parallel environments"""
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
    register_env_family(args.env_id)
    check_env_id(args.env_id)
    run = Run(args, __file__)
    envs = make_envs(args.env_id, args.num_envs)
    envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    global_step = 0
    while global_step < args.total_timesteps:
        _, _, _, _, infos = envs.step(envs.action_space.sample())
        global_step += args.num_envs
        run.log_episodes(global_step, infos)
        if global_step % 10_000 < args.num_envs:
            run.log(global_step, {})
    envs.close()
    run.finish(global_step)
    print(f"{args.env_id}: random policy logged to {run.dir}")
