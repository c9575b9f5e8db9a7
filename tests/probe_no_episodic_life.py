"""Preloaded (`probe_script(..., preload=["probe_no_episodic_life"])`) by tests that run a pixel script as a
researcher following Machado et al. 2018 would: `make_envs(..., episodic_life=False)` (cleanrl_utils/envs/atari.py),
the game going on after a lost life with no FIRE and no episode end. The scripts must then end their training
episodes at `infos["life_loss"]` themselves, which with the default (a lost life is already a termination) no test
could see. Sets the default of that keyword for the script's process; the script itself runs unchanged."""

from __future__ import annotations

import inspect

from cleanrl_utils.envs import atari

_names = list(inspect.signature(atari.make_envs).parameters)
_defaults = list(atari.make_envs.__defaults__)
_defaults[_names.index("episodic_life") - (len(_names) - len(_defaults))] = False
atari.make_envs.__defaults__ = tuple(_defaults)
