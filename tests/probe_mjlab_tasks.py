"""A test task for --simulator mjlab, registered with mjlab when imported first in a script's process
(`probe_script(..., preload=["probe_mjlab_tasks"])`): mjlab's Cartpole balance with a 12-step time limit, a
termination (the cart beyond 0.3 m; mjlab's Cartpole ends only at its time limit) and a critic group larger than the
actor's (the raw joint positions added), so that a few dozen steps hold both kinds of episode end and the value
network's input differs from the policy's."""

from __future__ import annotations

import mjlab.tasks  # noqa: F401  (registers mjlab's own tasks first)
import torch
from mjlab.managers.observation_manager import ObservationTermCfg
from mjlab.managers.termination_manager import TerminationTermCfg
from mjlab.tasks.registry import _REGISTRY, load_env_cfg, load_rl_cfg, register_mjlab_task

TASK = "Test-Mjlab-Cartpole-Falls"
LIMIT = 12
CRITIC_EXTRA = 2  # the joint positions


def cart_out(env, limit: float = 0.3) -> torch.Tensor:
    return env.scene["cartpole"].data.joint_pos[:, 0].abs() > limit


def joint_positions(env) -> torch.Tensor:
    return env.scene["cartpole"].data.joint_pos


if TASK not in _REGISTRY:
    cfg = load_env_cfg("Mjlab-Cartpole-Balance")
    cfg.terminations["cart_out"] = TerminationTermCfg(func=cart_out)
    cfg.observations["critic"].terms["joint_positions"] = ObservationTermCfg(func=joint_positions)
    cfg.episode_length_s = (LIMIT - 0.5) * cfg.sim.mujoco.timestep * cfg.decimation
    register_mjlab_task(TASK, cfg, cfg, load_rl_cfg("Mjlab-Cartpole-Balance"))
