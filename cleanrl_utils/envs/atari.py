"""Pixel games as one vector env: the Arcade Learning Environment (ale-py's C++ vector env, DQN-paper
preprocessing) and MinAtar (Young & Tian 2019, 10x10 games that learn on a CPU).

Both give uint8 observations [num_envs, C, H, W] (ALE: 4 stacked 84x84 grayscale frames, oldest first, zeros
before a fresh stack's first frame; MinAtar: its C boolean channels) and NEXT_STEP autoreset: the step after an
episode ends ignores its action and returns the first observation of the next one. Rewards are raw (unclipped):
clipping is the scripts' business. `infos["episode"]` is the true score of a whole game (all lives; gymnasium's
RecordEpisodeStatistics, on the game) and `infos["life_loss"]` marks the steps that lost a life.

A lost life ends a training episode, as in CleanRL (its EpisodicLifeEnv and FireResetEnv, envpool's
`episodic_life=True`): the step that loses a life while the game goes on returns `terminated=True`, and the next step
is an autoreset step like a new game's first (its action ignored, no transition for the scripts, which already treat
the step after any `terminated | truncated` so): it presses FIRE (NOOP in games without FIRE), which serves the ball
again in Breakout, and its observation starts a fresh frame stack, zeros before its frame. The game itself goes on
(the score, the lives and the 108,000-frame cap run across its lives); `infos["episode"]` comes once per game. Without
this a policy that never picks FIRE stalls a Breakout game until the 108,000-frame cap (27,000 steps; measured in
benchmark/results/atari_fire.md).

Where CleanRL's gym wrappers differ: their reset after a lost life plays a NOOP, a FIRE and an action-2 step (4
frames each) hidden from the agent (not counted as steps, no observation) and refills the stack with copies of the
frame they end on; here there is one FIRE step per lost life, a visible step counted in `global_step` and in the game's
`infos["episode"]["l"]` (its observation is the new life's first, its action ignored), and the stack starts with
zeros. So a game that lost k lives before its last step has k FIRE steps in its length, where CleanRL's plays 12
hidden frames per lost life.

Turning it off: `make_envs(..., episodic_life=False)` (the scripts have no flag: pass it where the script calls
make_envs) restores the semantics before this change, as in Machado et al. 2018's protocol: the game goes on after a
lost life with no episode end, FIRE is pressed only when a game starts (a policy must learn to serve), and the stack
runs on. The scripts also cut their returns at `infos["life_loss"]` (they store `terminated | life_loss`); for
Machado et al.'s protocol drop that too.

ALE preprocessing: 30 no-ops, frame skip 4 with a max-pool over the last two frames, 84x84 grayscale, 4 stacked
frames, FIRE on reset, games cut at 108,000 frames. `BreakoutNoFrameskip-v4` ids have no sticky actions,
`ALE/Breakout-v5` ids 0.25. The C++ env's own `episodic_life=True` restarts the whole game at every life loss
(5 one-life games in Breakout), so life losses are read from `lives` here instead, and its stack (which cannot be
restarted) has the frames before a life's first one zeroed here.
"""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import numpy as np

from cleanrl_utils.errors import fail, nearest_ids

# Atari frames per agent step (the vector env's frame skip) and the video frame rate that plays them in real time.
FRAME_SKIP = 4
VIDEO_FPS = 60 // FRAME_SKIP
CONTINUOUS_SCRIPTS = "cleanrl/sac_continuous_action.py, td3_continuous_action.py or ppo_continuous_action.py"


def register_envs() -> None:
    """Make the ALE and MinAtar ids known to gymnasium (idempotent)."""
    import ale_py

    gym.register_envs(ale_py)
    if "MinAtar/Breakout-v1" not in gym.registry:
        import logging
        import sys

        # minatar imports seaborn only to draw its own display, which is not used here (videos are drawn from the
        # observations): hiding it while minatar imports takes 1.9 s -> 0.7 s off every MinAtar process (measured),
        # and its warning that seaborn is missing is silenced. seaborn stays importable afterwards.
        hide_seaborn = "seaborn" not in sys.modules
        if hide_seaborn:
            sys.modules["seaborn"] = None
        logging.disable(logging.WARNING)
        try:
            import minatar.gym
        finally:
            logging.disable(logging.NOTSET)
            if hide_seaborn:
                del sys.modules["seaborn"]
        minatar.gym.register_envs()


def is_minatar(env_id: str) -> bool:
    return env_id.startswith("MinAtar/")


def _is_ale(env_id: str) -> bool:
    return str(gym.spec(env_id).entry_point).startswith("ale_py")


def _runs_here(env_id: str) -> bool:
    """An ALE id with pixel observations and no random frame skip, or a MinAtar id."""
    if is_minatar(env_id):
        return True
    kwargs = gym.spec(env_id).kwargs
    return _is_ale(env_id) and kwargs.get("obs_type", "rgb") == "rgb" and kwargs.get("frameskip", 1) in (1, FRAME_SKIP)


def _action_space(env_id: str) -> gym.Space:
    """The action space of a registered id, with the simulator's own stderr chatter (MuJoCo's) silenced."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            probe = gym.make(env_id)
        action_space = probe.action_space
        probe.close()
        return action_space
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_env_id(env_id: str, flat_script: str) -> None:
    """Fail in one line unless `env_id` is an ALE or MinAtar game this module can run; for other known ids name the
    scripts that fit (`flat_script` for discrete actions on flat observations)."""
    register_envs()
    if env_id.endswith(("Easy-v0", "Hard-v0")) and env_id not in gym.registry:
        fail(f"{env_id} is a Procgen game (envpool); use cleanrl/ppo_procgen.py or cleanrl/ppg_procgen.py")
    if env_id not in gym.registry:
        games = [k for k in gym.registry if _runs_here(k)]
        near = nearest_ids(env_id, games)
        hint = (
            f"; did you mean {', '.join(near)}?"
            if near
            else " (Atari: BreakoutNoFrameskip-v4, ALE/Breakout-v5; MinAtar/Breakout-v1)"
        )
        fail(f"unknown environment id {env_id!r}{hint}")
    if _runs_here(env_id):
        return
    if _is_ale(env_id):
        kwargs = gym.spec(env_id).kwargs
        game = "".join(part.capitalize() for part in kwargs["game"].split("_"))
        fail(
            f"{env_id} has a random frame skip or non-pixel observations; the pixel scripts use a fixed frame "
            f"skip of {FRAME_SKIP}: use {game}NoFrameskip-v4 (no sticky actions) or ALE/{game}-v5 (sticky 0.25)"
        )
    try:
        action_space = _action_space(env_id)
    except Exception as error:  # a known id whose simulator is not installed
        fail(f"{env_id} is not an Atari or MinAtar game and could not be made: {error}")
    if isinstance(action_space, gym.spaces.Box):
        fail(f"{env_id} has continuous actions ({action_space}); use {CONTINUOUS_SCRIPTS}")
    fail(f"{env_id} is not an Atari or MinAtar game; for flat observations use {flat_script}")


class MinAtarFrames(gym.ObservationWrapper):
    """MinAtar's (10, 10, C) boolean grids as (C, 10, 10) uint8, channels first like the Atari frames."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (c, h, w), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(observation.transpose(2, 0, 1), dtype=np.uint8)


class LifeLoss(gym.vector.VectorWrapper):
    """Adds `infos["life_loss"]`: the env lost a life on this step (a game's last life included; never on the step
    that resets it). Games without lives (MinAtar) never lose one."""

    def reset(self, **kwargs):
        obs, infos = self.env.reset(**kwargs)
        self.lives = np.asarray(infos.get("lives", np.zeros(self.num_envs, np.int32))).copy()
        return obs, infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        lives = np.asarray(infos.get("lives", self.lives))
        infos["life_loss"] = lives < self.lives
        self.lives = lives.copy()
        return obs, rewards, terminations, truncations, infos


class StackStarts:
    """Restarts frame stacks: in the first observations after an env's stack (re)starts, the frames older than that
    start are zeroed, so that a fresh stack reads as zeros before its first frame whatever the simulator still holds
    there (the lost life's frames in ale-py's C++ stack, copies of the first frame in envpool's)."""

    def __init__(self, num_envs: int, stack_num: int):
        self.stack_num = stack_num
        self.held = np.full(num_envs, stack_num)  # frames held since each env's stack started, up to stack_num

    def zero_older(self, obs: np.ndarray, started: np.ndarray) -> np.ndarray:
        """`obs` [num_envs, stack_num, ...] with the frames from before each env's start zeroed in place; `started`
        marks the envs whose newest frame is the first of a fresh stack."""
        self.held = np.where(started, 1, np.minimum(self.held + 1, self.stack_num))
        older = np.arange(self.stack_num) < (self.stack_num - self.held)[:, None]  # [num_envs, stack_num]
        if older.any():
            obs[older] = 0
        return obs


def fire_action(action_set: list) -> int:
    """The index of FIRE in a game's action set, or of NOOP (0) in games without FIRE."""
    from ale_py import Action

    return list(action_set).index(Action.FIRE) if Action.FIRE in action_set else 0


class EpisodicLife(gym.vector.VectorWrapper):
    """A lost life ends a training episode (the module docstring): a step that loses a life while the game goes on
    returns terminated=True; the next step presses `fire` whatever the action, and its observation starts a fresh
    frame stack. Rewards, lives and the game's `infos["episode"]` (recorded inside this wrapper) pass through."""

    def __init__(self, env: gym.vector.VectorEnv, fire: int):
        super().__init__(env)
        self.fire = fire
        self.stacks = StackStarts(self.num_envs, self.single_observation_space.shape[0])
        self.serve = np.zeros(self.num_envs, dtype=bool)  # envs whose next step serves a new life

    def reset(self, **kwargs):
        obs, infos = self.env.reset(**kwargs)
        self.serve[:] = False
        return self.stacks.zero_older(obs, np.ones(self.num_envs, dtype=bool)), infos

    def step(self, actions):
        serve = self.serve
        obs, rewards, terminations, truncations, infos = self.env.step(np.where(serve, self.fire, actions))
        obs = self.stacks.zero_older(obs, serve)
        self.serve = infos["life_loss"] & ~(terminations | truncations)  # the game goes on: serve the next life
        return obs, rewards, terminations | infos["life_loss"], truncations, infos


class RecordGameVideos(gym.vector.VectorWrapper):
    """Writes the first environment's games as mp4 files on gymnasium's capped cubic schedule (games 0, 1, 8, 27 ...,
    then every 1000th), from the observations themselves: the ALE vector env does not render."""

    def __init__(self, env: gym.vector.VectorEnv, video_dir: Path, minatar: bool):
        super().__init__(env)
        self.video_dir, self.minatar = Path(video_dir), minatar
        self.frames, self.game, self.ended = [], 0, False
        if minatar:
            from matplotlib import colormaps

            channels = env.single_observation_space.shape[0]
            # Black background, then one colour per channel (MinAtar's own display uses cubehelix too).
            self.palette = np.concatenate([[[0, 0, 0]], colormaps["cubehelix"](np.linspace(0.2, 0.9, channels))[:, :3]])

    def to_rgb(self, observation: np.ndarray) -> np.ndarray:
        if self.minatar:
            # The highest set channel colours each cell; cells are drawn 8x8 pixels.
            cell = (observation * np.arange(1, len(observation) + 1)[:, None, None]).max(axis=0)
            rgb = (self.palette[cell] * 255).astype(np.uint8)
            return rgb.repeat(8, axis=0).repeat(8, axis=1)
        return np.repeat(observation[-1][:, :, None], 3, axis=2)  # the newest 84x84 grayscale frame

    def write(self) -> None:
        from gymnasium.utils.save_video import capped_cubic_video_schedule, save_video

        if self.frames and capped_cubic_video_schedule(self.game):
            save_video(self.frames, str(self.video_dir), fps=VIDEO_FPS, episode_index=self.game, name_prefix="game")
        self.frames, self.game = [], self.game + 1

    def reset(self, **kwargs):
        obs, infos = self.env.reset(**kwargs)
        self.frames, self.ended = [self.to_rgb(obs[0])], False
        return obs, infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        if self.ended:  # this step reset the first env: its last game is complete
            self.write()
        self.frames.append(self.to_rgb(obs[0]))
        self.ended = bool(terminations[0] or truncations[0])
        return obs, rewards, terminations, truncations, infos

    def close(self):
        if self.ended:
            self.write()
        return super().close()


def wrap_games(envs, capture_video: bool, video_dir: Path | None, minatar: bool, fire: int | None):
    """The wrappers of every pixel vector env, inside out: life losses, whole-game statistics, videos of whole games,
    and (`fire` not None) a lost life as the end of a training episode, served with action `fire`."""
    envs = gym.wrappers.vector.RecordEpisodeStatistics(LifeLoss(envs))
    if capture_video:
        envs = RecordGameVideos(envs, video_dir, minatar)
    if fire is not None:
        envs = EpisodicLife(envs, fire)
    return envs


def make_envs(
    env_id: str,
    num_envs: int,
    capture_video: bool = False,
    video_dir: Path | None = None,
    num_threads: int = 0,
    stack_num: int = 4,
    episodic_life: bool = True,
) -> gym.vector.VectorEnv:
    """`num_envs` copies of `env_id` (checked with `check_env_id` first) as described above; seed them with
    `envs.reset(seed=...)`. `num_threads` (ALE only): C++ worker threads, 0 for one per core up to num_envs.
    `stack_num` (ALE only): frames stacked per observation (1 for a recurrent agent that sees one frame at a time).
    `episodic_life` (ALE only; MinAtar has no lives): a lost life ends a training episode and FIRE serves the next
    one; False lets the game go on with FIRE pressed only at a game's start."""
    register_envs()
    if is_minatar(env_id):
        envs = gym.vector.SyncVectorEnv(
            [lambda: MinAtarFrames(gym.make(env_id, disable_env_checker=True)) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
    else:
        from ale_py.vector_env import AtariVectorEnv

        kwargs = gym.spec(env_id).kwargs
        envs = AtariVectorEnv(
            game=kwargs["game"],
            num_envs=num_envs,
            num_threads=num_threads or min(num_envs, os.cpu_count() or 1),
            repeat_action_probability=kwargs.get("repeat_action_probability", 0.0),
            max_num_frames_per_episode=kwargs.get("max_num_frames_per_episode", 108_000),
            stack_num=stack_num,
            frameskip=FRAME_SKIP,
            noop_max=30,
            use_fire_reset=True,
            reward_clipping=False,  # clipped rewards would make the logged game scores wrong
            episodic_life=False,
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
    fire = fire_action(envs.ale.get_action_set()) if episodic_life and not is_minatar(env_id) else None
    return wrap_games(envs, capture_video, video_dir, is_minatar(env_id), fire)
