"""mjlab's tasks (Isaac Lab's task API on MuJoCo Warp: Unitree Go1 and G1 velocity tracking, Cartpole ...) behind
the batched interface of MuJoCoWarpVecEnv: torch tensors on the device, SAME_STEP resets with the true final
observations in info; for `--simulator mjlab` of cleanrl/ppo_isaacgym.py. mjlab pins mujoco and mujoco-warp ~=3.11,
so it runs in its own uv project: `uv run --project projects/mjlab python cleanrl/ppo_isaacgym.py --simulator mjlab`.

    envs = MjlabVecEnv("Mjlab-Velocity-Flat-Unitree-Go1", num_envs=4096, device=torch.device("cuda"), seed=1)
    obs = envs.reset()          # the policy's observations (rsl_rl's "actor" groups), [num_envs, obs_dim]
    envs.critic_obs             # the value function's ("critic" groups, privileged state), [num_envs, critic_obs_dim]
    obs, reward, terminated, truncated, info = envs.step(actions)
    # info["final_obs"], info["final_critic_obs"]: before the reset; info["log"]: mjlab's episode statistics

Beside mjlab's own training (rsl_rl on RslRlVecEnvWrapper): the env runs with `auto_reset=False` and step() resets the
ended envs after reading their final observations (a time-out's bootstrap needs them); their commands take one more
update first, so timer-resampled commands may draw random numbers in another order (Cartpole matches auto-reset
exactly). Observation groups and action clipping follow the task's rsl_rl config (`obs_groups`, `clip_actions`: None
for every task of mjlab 1.6.0); `random_episode_starts=True` is rsl_rl's init_at_random_ep_len. state_dict() is None:
mjlab's state (managers' buffers and timers, MuJoCo Warp's data) has no save API: a resumed run starts fresh episodes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import warnings
from typing import Dict, List, Optional

import torch

from cleanrl_utils.errors import nearest_ids


def mjlab_tasks() -> List[str]:
    """mjlab's registered task ids (importing mjlab registers them)."""
    os.environ.setdefault("MJLAB_WARP_QUIET", "1")  # no line per Warp kernel compiled
    with warnings.catch_warnings():  # torch's FutureWarning on torch.jit.script in a module mjlab imports
        warnings.simplefilter("ignore", FutureWarning)
        import mjlab.tasks  # noqa: F401
    from mjlab.tasks.registry import list_tasks

    return list_tasks()


def task_problem(env_id: str, script: str) -> Optional[str]:
    """The one line to fail with when `env_id` cannot run here (mjlab missing, an unknown task, a Tracking task without
    its motion file, a camera task), else None. Cheap next to building the env: it reads configs only."""
    if importlib.util.find_spec("mjlab") is None:
        return (
            f"--simulator mjlab needs mjlab, which pins its own MuJoCo (mujoco and mujoco-warp 3.11): run "
            f"`uv run --project projects/mjlab python cleanrl/{script} --simulator mjlab ...` (it builds the "
            f"environment of projects/mjlab/pyproject.toml)"
        )
    tasks = mjlab_tasks()
    if env_id not in tasks:
        near = nearest_ids(env_id, tasks)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        usable = [task for task in tasks if "Tracking" not in task]
        return f"unknown mjlab task {env_id!r}{hint}; mjlab's tasks: {', '.join(usable)}"
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(env_id)
    motion = cfg.commands.get("motion")
    if motion is not None and hasattr(motion, "motion_file") and not os.path.exists(motion.motion_file or ""):
        return (
            f"{env_id} tracks a motion clip that mjlab does not ship (its motion command's motion_file, made with "
            f"mjlab's csv_to_npz.py from a motion-capture file); choose a Velocity or Cartpole task"
        )
    cameras = [type(sensor).__name__ for sensor in cfg.scene.sensors or () if "Camera" in type(sensor).__name__]
    if cameras:
        return f"{env_id} observes camera images ({cameras[0]}), which an MLP does not take: choose a state task"
    return None


class MjlabVecEnv:
    """`num_envs` copies of an mjlab task, simulated together by MuJoCo Warp on `device`, with SAME_STEP resets."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        device: torch.device,
        seed: int,
        max_episode_steps: Optional[int] = None,
        random_episode_starts: bool = False,
        nconmax: Optional[int] = None,
        njmax: Optional[int] = None,
    ):
        """max_episode_steps: the time limit in steps (None: the task's episode_length_s). random_episode_starts: the
        first episodes start at uniform random points of the time limit, as rsl_rl's runner starts mjlab's training.
        nconmax, njmax: MuJoCo Warp's contact slots and constraint rows per world (None: the task's)."""
        os.environ.setdefault("MJLAB_WARP_QUIET", "1")
        import warp as wp

        wp.config.log_level = wp.LOG_WARNING  # no banner, no line per kernel module loaded: warnings only
        if device.type == "cpu":
            from cleanrl_utils.envs.mujoco_warp_env import init_without_cuda_warning

            init_without_cuda_warning(wp)
        mjlab_tasks()  # imports mjlab, which registers its tasks
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.tasks.registry import load_env_cfg, load_rl_cfg

        wp.config.log_level = wp.LOG_WARNING  # again: importing mjlab sets Warp's verbosity
        cfg, rl_cfg = load_env_cfg(env_id), load_rl_cfg(env_id)
        cfg.scene.num_envs = num_envs
        cfg.seed = seed  # mjlab seeds Python's, NumPy's, torch's and Warp's global generators with it
        cfg.auto_reset = False  # step() returns the true final observations; this class resets the ended envs
        if nconmax is not None:
            cfg.sim.nconmax = nconmax
        if njmax is not None:
            cfg.sim.njmax = njmax
        step_dt = cfg.sim.mujoco.timestep * cfg.decimation
        if max_episode_steps is not None:  # mjlab's limit is ceil(episode_length_s / step_dt) steps
            cfg.episode_length_s = (max_episode_steps - 0.5) * step_dt
        mjlab_device = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        with contextlib.redirect_stdout(io.StringIO()):  # mjlab prints its managers' tables on construction
            self.env = ManagerBasedRlEnv(cfg, device=mjlab_device)
        self.env_id, self.num_envs, self.device, self.seed = env_id, num_envs, device, seed
        self.max_episode_steps = self.env.max_episode_length
        # A time limit that is part of the task (finite horizon) ends the return; rsl_rl then does not bootstrap it.
        self.finite_horizon = cfg.is_finite_horizon
        self.random_episode_starts = random_episode_starts
        # rsl_rl's observation sets: the policy's ("actor") and the value function's ("critic") groups, concatenated.
        groups = getattr(rl_cfg, "obs_groups", {"actor": ("actor",), "critic": ("critic",)})
        self.actor_groups = tuple(groups["actor"])
        self.critic_groups = tuple(groups.get("critic", ())) or None
        self.clip_actions = rl_cfg.clip_actions
        self.act_dim = self.env.action_manager.total_action_dim
        bound = math.inf if self.clip_actions is None else float(self.clip_actions)
        self.action_low = torch.full((self.act_dim,), -bound, device=device)
        self.action_high = torch.full((self.act_dim,), bound, device=device)
        self.episode_return = torch.zeros(num_envs, device=device)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int32, device=device)
        self.critic_obs: Optional[torch.Tensor] = None  # set by reset() and step()
        # The sizes without a reset here (a reset draws from mjlab's generators): the first is the caller's.
        group_dim = self.env.observation_manager.group_obs_dim
        self.obs_dim = sum(group_dim[group][0] for group in self.actor_groups)
        self.critic_obs_dim = None if self.critic_groups is None else sum(group_dim[g][0] for g in self.critic_groups)

    def _split(self, obs: Dict[str, torch.Tensor]):
        """The policy's and the value function's observations from mjlab's observation groups."""
        actor = torch.cat([obs[group] for group in self.actor_groups], dim=1).to(self.device)
        if self.critic_groups is None:
            return actor, None
        return actor, torch.cat([obs[group] for group in self.critic_groups], dim=1).to(self.device)

    def reset(self) -> torch.Tensor:
        obs, _ = self.env.reset()
        if self.random_episode_starts:  # as rsl_rl's OnPolicyRunner.learn(init_at_random_ep_len=True)
            buffer = self.env.episode_length_buf
            buffer.copy_(torch.randint_like(buffer, high=int(self.max_episode_steps)))
        self.episode_return.zero_()
        self.episode_length.zero_()
        actor, self.critic_obs = self._split(obs)
        return actor

    def step(self, actions: torch.Tensor):
        if self.clip_actions is not None:  # as mjlab's RslRlVecEnvWrapper
            actions = actions.clamp(-self.clip_actions, self.clip_actions)
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        final_obs, final_critic_obs = self._split(obs)
        # mjlab reuses these buffers at its next step: copies, on the training device
        reward, terminated, truncated = (x.to(self.device, copy=True) for x in (reward, terminated, truncated))
        if self.finite_horizon:
            terminated, truncated = terminated | truncated, torch.zeros_like(truncated)
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        episode_return, episode_length = self.episode_return.clone(), self.episode_length.clone()
        info = dict(final_obs=final_obs, done=done, episode_return=episode_return, episode_length=episode_length)
        info["final_critic_obs"], info["log"] = final_critic_obs, {}
        next_obs, self.critic_obs = final_obs, final_critic_obs
        ended = done.nonzero().squeeze(-1)
        if len(ended):  # mjlab's own step syncs with the host at this point too (reset_buf.nonzero())
            reset_obs, extras = self.env.reset(env_ids=ended.to(self.env.device))
            # The reset computed every env's observations, drawing fresh observation noise for all; only the reset
            # envs' rows are theirs, the others keep this step's (what mjlab's auto-reset returns).
            reset_actor, reset_critic = self._split(reset_obs)
            rows = done[:, None]
            next_obs = torch.where(rows, reset_actor, final_obs)
            if reset_critic is not None:
                self.critic_obs = torch.where(rows, reset_critic, final_critic_obs)
            # mjlab's episode statistics of the envs just reset: each reward term's episode sum per second of the
            # time limit ("Episode_Reward/..."), the count per termination term, metrics and curricula.
            info["log"] = dict(extras["log"])
            self.episode_return.masked_fill_(done, 0.0)
            self.episode_length.masked_fill_(done, 0)
        return next_obs, reward, terminated, truncated, info

    def check_buffers(self) -> Dict[str, float]:
        """Stop the run in one line (exit 2) if MuJoCo Warp dropped contacts or constraint rows since the env was made
        (its sticky per-world overflow mask, which mjlab also prints); one device-to-host read: call it at the logging
        interval."""
        import warp as wp
        from mujoco_warp._src.types import OverflowType as kinds  # not exported by mujoco_warp 3.11

        from cleanrl_utils.errors import fail

        bits = torch.tensor([int(kinds.BROADPHASE | kinds.NARROWPHASE), int(kinds.NEFC)], dtype=torch.int32)
        overflow = wp.to_torch(self.env.sim.wp_data.overflow).to(torch.int32)
        contacts_full, rows_full = (overflow[:, None] & bits.to(overflow.device)).ne(0).any(0).tolist()
        what = ["contact slots (raise --nconmax)"] * contacts_full + ["constraint rows (raise --njmax)"] * rows_full
        if what:
            fail(f"MuJoCo Warp ran out of {' and of '.join(what)} in {self.env_id}, and dropped what did not fit")
        return {}

    def state_dict(self, on_device: bool = False) -> None:
        """None: mjlab's state cannot be saved (see the module docstring); a resumed run starts fresh episodes."""
        return None

    def close(self) -> None:
        self.env.close()
