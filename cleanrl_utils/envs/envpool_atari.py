"""Atari through envpool (Weng et al. 2022, C++ thread pool) as one gymnasium vector env, with the interface and the
semantics of cleanrl_utils/envs/atari.py (read its docstring): uint8 observations [num_envs, 4, 84, 84] (4 stacked
grayscale frames, oldest first, zeros before a fresh stack's first frame), NEXT_STEP autoreset, raw rewards,
`infos["episode"]` the true score of a whole game (gymnasium's RecordEpisodeStatistics) and `infos["life_loss"]` the
steps that lost a life; a lost life ends a training episode (`terminated=True`) and the next step presses FIRE and
starts a fresh frame stack (`make_envs(..., episodic_life=False)` turns that off), by the same wrapper as ale-py's.

envpool ids are `Breakout-v5`, `MontezumaRevenge-v5` ... Preprocessing is envpool's default: 30 no-ops, frame skip 4
with a max-pool over the last two frames, 84x84 grayscale, FIRE on reset, games cut at 27,000 steps (108,000 frames).
Sticky actions: envpool's v5 default repeat_action_probability is 0 (unlike ale-py's ALE/...-v5 ids, 0.25); pass
`repeat_action_probability` to change it. envpool refills its stack with copies of a new game's first frame; here the
frames before it are zeroed instead, as ale-py does, so that both paths start a stack alike (CleanRL's envpool scripts
see the copies). envpool's own `episodic_life=True` (envpool 1.2.5; CleanRL's envpool scripts use it) is not used:
after a lost life its reset plays a random number (0-29) of single NOOP frames and one FIRE frame hidden from the agent,
keeps the lost life's frames in the stack, and hides the game's end in `info["terminated"]`; here, as on ale-py's path,
the step after a lost life is one visible FIRE step whose observation starts a zeroed stack. Reward clipping is off
too (the scripts clip what learning sees). envpool cannot be pickled:
checkpoints resume with fresh games.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from cleanrl_utils.envs.atari import CONTINUOUS_SCRIPTS, StackStarts, fire_action, wrap_games
from cleanrl_utils.errors import fail, nearest_ids

INFO_KEYS = ("lives", "reward", "terminated", "elapsed_step")  # envpool's info, less the RAM and player ids


def _envpool_atari_ids() -> list[str]:
    from envpool.registration import registry

    return [env_id for env_id, spec in registry.specs.items() if spec[0] == "envpool.atari"]


def check_env_id(env_id: str, ale_hint: str, flat_script: str) -> None:
    """Fail in one line unless `env_id` is an envpool Atari id. An ale-py or MinAtar id gets `ale_hint` (the script
    that runs it, or what to use instead) and the envpool id of its game; Procgen, continuous-action and flat ids name
    the scripts that fit (`flat_script` for discrete actions on flat observations)."""
    from envpool.registration import registry

    atari = _envpool_atari_ids()
    if env_id in atari:
        return
    game = env_id.removeprefix("ALE/").rsplit("-", 1)[0].removesuffix("NoFrameskip").removesuffix("Deterministic")
    if env_id.startswith("MinAtar/"):
        fail(f"{env_id} is a MinAtar id, not an envpool one: {ale_hint}")
    if f"{game}-v5" in atari:
        fail(f"{env_id} is an ale-py id, not an envpool one: {ale_hint}; here use --env-id {game}-v5")
    if env_id in registry.specs:
        module = registry.specs[env_id][0]
        if module == "envpool.procgen":
            fail(f"{env_id} is a Procgen game; use cleanrl/ppo_procgen.py or cleanrl/ppg_procgen.py")
        import envpool

        action_space = envpool.make_spec(env_id).action_space
        if not hasattr(action_space, "n"):
            fail(f"{env_id} has continuous actions ({action_space}); use {CONTINUOUS_SCRIPTS}")
        fail(f"{env_id} is not an Atari game; for flat observations use {flat_script}")
    near = nearest_ids(env_id, atari)
    hint = (
        f"; did you mean {', '.join(near)}?" if near else " (envpool Atari ids: Breakout-v5, MontezumaRevenge-v5 ...)"
    )
    fail(f"unknown envpool Atari id {env_id!r}{hint}")


def minimal_action_set(env_id: str) -> list:
    """The game's actions as envpool orders them (ALE's minimal action set), read from ale-py's copy of the ROM."""
    import ale_py
    import envpool

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner
    ale = ale_py.ALEInterface()
    ale.loadROM(ale_py.roms.get_rom_path(envpool.make_spec(env_id).config.task))
    return ale.getMinimalActionSet()


class EnvpoolAtari(gym.vector.VectorEnv):
    """envpool's synchronous Atari pool as a gymnasium VectorEnv. The pool is made at `reset(seed=...)`, since envpool
    takes its seed at construction; results come back in env order, a new game's stack with zeros before its first
    frame."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, num_envs: int, num_threads: int = 0, **options):
        import envpool

        self.env_id, self.num_envs, self.pool = env_id, num_envs, None
        self.options = dict(num_threads=num_threads, episodic_life=False, reward_clip=False, **options)
        spec = envpool.make_spec(env_id, **self.options)
        self.single_observation_space = gym.spaces.Box(0, 255, spec.observation_space.shape, np.uint8)
        self.single_action_space = gym.spaces.Discrete(int(spec.action_space.n))
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.stacks = StackStarts(num_envs, spec.observation_space.shape[0])
        self.ended = np.zeros(num_envs, dtype=bool)  # envs whose next step starts a new game

    def _infos(self, info: dict) -> tuple[np.ndarray | None, dict]:
        order = np.argsort(info["env_id"], kind="stable")
        if np.array_equal(order, np.arange(self.num_envs)):
            order = None
        return order, {key: info[key] if order is None else info[key][order] for key in INFO_KEYS}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        import envpool

        if self.pool is None or seed is not None:
            if self.pool is not None:
                self.pool.close()
            seed = 0 if seed is None else int(seed)
            self.pool = envpool.make(
                self.env_id, env_type="gymnasium", num_envs=self.num_envs, seed=seed, **self.options
            )
        obs, info = self.pool.reset()
        order, infos = self._infos(info)
        self.ended[:] = False
        return self.stacks.zero_older(obs if order is None else obs[order], np.ones(self.num_envs, bool)), infos

    def step(self, actions):
        obs, rewards, terminations, truncations, info = self.pool.step(np.asarray(actions, dtype=np.int32))
        order, infos = self._infos(info)
        if order is not None:
            obs, rewards, terminations, truncations = (x[order] for x in (obs, rewards, terminations, truncations))
        obs = self.stacks.zero_older(obs, self.ended)
        self.ended = terminations | truncations
        return obs, rewards.astype(np.float32), terminations, truncations, infos

    def close_extras(self, **kwargs):
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __getstate__(self):
        raise TypeError("an envpool pool cannot be pickled")


def make_envs(
    env_id: str,
    num_envs: int,
    capture_video: bool = False,
    video_dir: Path | None = None,
    num_threads: int = 0,
    repeat_action_probability: float = 0.0,
    episodic_life: bool = True,
    stack_num: int = 4,
) -> gym.vector.VectorEnv:
    """`num_envs` copies of the envpool Atari game `env_id` as described above; seed them with
    `envs.reset(seed=...)`. `num_threads`: envpool worker threads, 0 for envpool's choice. `episodic_life`: a lost
    life ends a training episode and FIRE serves the next one (False: the game goes on). `stack_num`: frames stacked
    per observation (1 for a recurrent agent that sees one frame at a time)."""
    options = dict(repeat_action_probability=repeat_action_probability, stack_num=stack_num)
    envs = EnvpoolAtari(env_id, num_envs, num_threads, **options)
    fire = fire_action(minimal_action_set(env_id)) if episodic_life else None
    return wrap_games(envs, capture_video, video_dir, False, fire)
