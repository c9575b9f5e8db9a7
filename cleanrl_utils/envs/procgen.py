"""Procgen games (Cobbe et al. 2020, https://arxiv.org/abs/1912.01588) as one vector env, through envpool's C++
implementation: `StarpilotEasy-v0`, `BigfishEasy-v0`, `BossfightHard-v0` ... (16 games, easy or hard distribution).

Observations are uint8 [num_envs, 3, 64, 64] (RGB, channels first); actions are Discrete(15). Autoreset is NEXT_STEP,
as envpool does it: the step after an episode ends ignores its action and returns the first observation of a new
level with reward 0. Rewards are raw; `infos["episode"]` holds whole-episode returns and lengths the way gymnasium's
RecordEpisodeStatistics reports them. `num_levels` / `start_level` choose the level set (0 levels: unlimited, as in
the paper's training on the full distribution); the distribution mode (easy or hard) comes from the id.

envpool's simulators cannot be saved: a resumed run starts fresh episodes. envpool seeds its environments when they
are made (`seed`), not at reset. Needs envpool (the `envpool` extra) and the system Qt 5 runtime.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from cleanrl_utils.envs.atari import RecordGameVideos
from cleanrl_utils.errors import fail, nearest_ids

GAMES = (
    "bigfish bossfight caveflyer chaser climber coinrun dodgeball fruitbot heist jumper leaper maze miner ninja "
    "plunder starpilot"
).split()
PROCGEN_IDS = [f"{game.capitalize()}{mode}-v0" for game in GAMES for mode in ("Easy", "Hard")]
VIDEO_SCALE = 4  # 64x64 frames drawn 256x256


def check_env_id(env_id: str) -> None:
    """Fail in one line unless `env_id` is a Procgen id; an Atari or MinAtar id names cleanrl/ppo_atari.py, an unknown
    id the nearest Procgen ids."""
    if env_id in PROCGEN_IDS:
        return
    from cleanrl_utils.envs.atari import is_minatar, register_envs

    register_envs()
    if is_minatar(env_id) or (env_id in gym.registry and str(gym.spec(env_id).entry_point).startswith("ale_py")):
        fail(f"{env_id} is an Atari game, not a Procgen one; use cleanrl/ppo_atari.py")
    if env_id in gym.registry:
        fail(f"{env_id} is not a Procgen game (StarpilotEasy-v0 ...); for flat observations use cleanrl/ppo.py")
    near = nearest_ids(env_id, PROCGEN_IDS)
    hint = f"; did you mean {', '.join(near)}?" if near else " (Procgen: StarpilotEasy-v0, BigfishEasy-v0 ...)"
    fail(f"unknown environment id {env_id!r}{hint}")


class RecordProcgenVideos(RecordGameVideos):
    """The first environment's episodes as mp4 files (capped cubic schedule), drawn from its RGB observations."""

    def __init__(self, env: gym.vector.VectorEnv, video_dir: Path):
        super().__init__(env, video_dir, minatar=False)

    def to_rgb(self, observation: np.ndarray) -> np.ndarray:
        return observation.transpose(1, 2, 0).repeat(VIDEO_SCALE, axis=0).repeat(VIDEO_SCALE, axis=1)


def make_envs(
    env_id: str,
    num_envs: int,
    seed: int,
    capture_video: bool = False,
    video_dir: Path | None = None,
    num_levels: int = 0,
    start_level: int = 0,
    num_threads: int = 0,
) -> gym.vector.VectorEnv:
    """`num_envs` copies of the Procgen game `env_id` (checked with `check_env_id` first), seeded with `seed`, as
    described above. `num_threads`: envpool's worker threads (0: one per core)."""
    import envpool

    check_env_id(env_id)
    envs = envpool.make(
        env_id,
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_levels=num_levels,
        start_level=start_level,
        num_threads=num_threads,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    if capture_video:
        envs = RecordProcgenVideos(envs, video_dir)
    return envs
