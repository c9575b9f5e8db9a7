"""Short episodes for the CPU simulators' adapters, imported first in a script's process
(`probe_script(..., preload=["probe_short_episodes"], env=script_env(PROBE_MAX_EPISODE_STEPS="20"))`): envpool's and
gymnasium's MuJoCo tasks made by cleanrl_utils/envs/ get that time limit instead of their 1000 steps, so that a few
dozen steps of a probed run hold truncations as well as terminations."""

from __future__ import annotations

import functools
import os

from cleanrl_utils.envs.envpool_mujoco_env import EnvPoolMuJoCoVecEnv
from cleanrl_utils.envs.gymnasium_vec_env import GymnasiumVecEnv

LIMIT = int(os.environ["PROBE_MAX_EPISODE_STEPS"])

for _cls in (EnvPoolMuJoCoVecEnv, GymnasiumVecEnv):

    def _short(init):
        @functools.wraps(init)
        def made_short(self, *args, **kwargs):
            init(self, *args, **{**kwargs, "max_episode_steps": LIMIT})

        return made_short

    _cls.__init__ = _short(_cls.__init__)
