"""A short Atari game for the tests that run a pixel script's own loop (tests/probe.py), registered with gymnasium when
this module is imported: `probe_script(..., preload=["probe_atari_envs"])` imports it in the script's process (as
tests/probe_envs.py does for flat observations).

BreakoutShortNoFrameskip-v4 is BreakoutNoFrameskip-v4 (ale-py, no sticky actions) with its games cut at 400 frames
(100 agent steps) instead of 108,000, so that a few hundred steps of a near-random policy hold lost lives, games over
and time-limit truncations. The pixel scripts take it like any ALE id (cleanrl_utils/envs/atari.py reads the cut from
the registered kwargs).
"""

from __future__ import annotations

import gymnasium as gym

SHORT_BREAKOUT = "BreakoutShortNoFrameskip-v4"

if SHORT_BREAKOUT not in gym.registry:
    gym.register(
        SHORT_BREAKOUT,
        entry_point="ale_py.env:AtariEnv",
        kwargs=dict(
            game="breakout",
            repeat_action_probability=0.0,
            full_action_space=False,
            frameskip=1,
            max_num_frames_per_episode=400,
        ),
    )
