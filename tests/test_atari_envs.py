"""cleanrl_utils/envs/atari.py and envpool_atari.py: the ALE vector env against gymnasium's single-env preprocessing,
with and without the life semantics (a lost life ends a training episode, the next step presses FIRE and restarts the
frame stack; the reference is a plain single-env wrapper here), a policy that never picks FIRE (its games end, or stall
with the semantics off), frame stacks that restart with zeros on both paths, whole-game scores, life losses, MinAtar
frames and their exact snapshot."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv

from cleanrl_utils.checkpoint import restore_envs, snapshot_envs
from cleanrl_utils.envs import atari
from cleanrl_utils.envs.atari import make_envs

NOOP, FIRE = 0, 1  # Breakout's minimal action set: NOOP, FIRE, RIGHT, LEFT


def test_vector_env_frames_equal_gymnasium_atari_preprocessing_and_frame_stack():
    # The same seed and actions give identical 4 x 84 x 84 stacks, rewards and terminations, step for step. The
    # random no-op count and FIRE on reset are switched off in both: gymnasium's wrapper has no FIRE reset and draws
    # its no-ops from another generator, so those two cannot be aligned; everything else (frame skip 4, max-pool of
    # the last two frames, 84x84 INTER_AREA grayscale, zero-padded stack) is compared here.
    vector = AtariVectorEnv("breakout", 1, noop_max=0, use_fire_reset=False, reward_clipping=False)
    single = gym.make("BreakoutNoFrameskip-v4")
    single = gym.wrappers.AtariPreprocessing(single, noop_max=0, frame_skip=4, screen_size=84, scale_obs=False)
    single = gym.wrappers.FrameStackObservation(single, 4, padding_type="zero")
    vector_obs, _ = vector.reset(seed=3)
    single_obs, _ = single.reset(seed=3)
    assert np.array_equal(vector_obs[0], single_obs)
    rng = np.random.default_rng(0)
    for step in range(2000):
        action = int(rng.integers(4))
        vector_obs, vector_reward, vector_end, _, _ = vector.step(np.array([action]))
        single_obs, single_reward, single_end, single_cut, _ = single.step(action)
        assert np.array_equal(vector_obs[0], single_obs), step
        assert (vector_reward[0], bool(vector_end[0])) == (single_reward, single_end), step
        if single_end or single_cut:
            break
    assert single_end and step > 100, "a whole game should have been compared"
    vector.close()
    single.close()


class ServedLives(gym.Wrapper):
    """The reference for the life semantics, one env, written plainly: a lost life (the game going on) ends the
    training episode; the next step presses FIRE whatever the action and starts a new stack of 4 frames, zeros before
    its frame, as a game's first step does. Wraps single 84x84 frames (AtariPreprocessing)."""

    def reset(self, **kwargs):
        frame, info = self.env.reset(**kwargs)
        self.frames, self.lives, self.serve = [np.zeros_like(frame)] * 3 + [frame], info["lives"], False
        return np.stack(self.frames), info

    def step(self, action):
        frame, reward, terminated, truncated, info = self.env.step(FIRE if self.serve else action)
        if self.serve:
            self.frames = [np.zeros_like(frame)] * 3 + [frame]
        else:
            self.frames = self.frames[1:] + [frame]
        lost = info["lives"] < self.lives
        self.lives, self.serve = info["lives"], lost and not (terminated or truncated)
        return np.stack(self.frames), reward, terminated or lost, truncated, info


def test_lost_lives_end_training_episodes_and_fire_serves_the_next_as_the_plain_reference_does():
    # The vector env with the wrappers make_envs puts on it, against ServedLives on gymnasium's preprocessing, step for
    # step over a whole game. The policy presses FIRE once to start the game, then never again: every later serve is
    # the wrapper's. No-ops and FIRE on reset are off in both, as in the test above.
    game = AtariVectorEnv("breakout", 1, noop_max=0, use_fire_reset=False, reward_clipping=False)
    vector = atari.wrap_games(game, False, None, False, fire=atari.fire_action(game.ale.get_action_set()))
    single = gym.make("BreakoutNoFrameskip-v4")
    single = ServedLives(gym.wrappers.AtariPreprocessing(single, noop_max=0, frame_skip=4, scale_obs=False))
    vector_obs, _ = vector.reset(seed=5)
    single_obs, _ = single.reset(seed=5)
    assert np.array_equal(vector_obs[0], single_obs)
    rng = np.random.default_rng(0)
    served = 0
    for step in range(3000):
        action = FIRE if step == 0 else int(rng.choice([NOOP, 2, 3]))
        vector_obs, vector_reward, vector_end, vector_cut, infos = vector.step(np.array([action]))
        single_obs, single_reward, single_end, single_cut, _ = single.step(action)
        assert np.array_equal(vector_obs[0], single_obs), step
        assert (vector_reward[0], bool(vector_end[0]), bool(vector_cut[0])) == (single_reward, single_end, single_cut)
        served += single.serve
        if infos.get("_episode", [False])[0]:
            break
    assert infos["episode"]["l"][0] == step + 1 and single_end and served == 4, "a whole game, its 4 lives served"
    vector.close()
    single.close()


def play(envs, steps: int, action: int = NOOP, rng=None) -> list[dict]:
    """`steps` steps of `action` (or random actions), each as a dict of what the env returned."""
    n = envs.num_envs
    seen = []
    for _ in range(steps):
        actions = rng.integers(envs.single_action_space.n, size=n) if rng is not None else np.full(n, action)
        obs, rewards, terminations, truncations, infos = envs.step(actions)
        seen.append(dict(obs=obs, rewards=rewards, terminations=terminations, truncations=truncations, infos=infos))
    return seen


def assert_stacks_restart_with_zeros(first_obs: np.ndarray, seen: list[dict]) -> int:
    """Every observation is the previous one shifted by a frame, except where a stack starts (after a reset, after a
    game's end, after a lost life's end of episode): there, zeros before the one new frame; the zeros then move out
    one frame a step. Returns how many stacks started after the first observation."""
    starts = 0
    previous, started = first_obs, np.zeros(len(first_obs), dtype=bool)  # the step after a reset: no new start
    held = np.ones(len(first_obs), dtype=int)  # frames in each stack since it started: reset's one
    assert not first_obs[:, :-1].any() and first_obs[:, -1].any()
    for t, step in enumerate(seen):
        obs = step["obs"]
        held = np.where(started, 1, np.minimum(held + 1, 4))
        for env in range(len(obs)):
            assert obs[env, -1].any(), (t, env)  # the newest frame is a screen
            assert not obs[env, : 4 - held[env]].any(), (t, env, held[env])  # zeros before a fresh stack's frames
            if not started[env]:
                assert np.array_equal(obs[env, :-1], previous[env, 1:]), (t, env)
        starts += int(started.sum())
        previous, started = obs, step["terminations"] | step["truncations"]
    return starts


@pytest.mark.parametrize("path", ["ale", "envpool"])
def test_a_policy_that_never_fires_plays_whole_games_with_each_life_served_and_stacks_restarted(path):
    if path == "envpool":
        pytest.importorskip("envpool")
        from cleanrl_utils.envs.envpool_atari import make_envs as make

        envs = make("Breakout-v5", 2)
    else:
        envs = make_envs("BreakoutNoFrameskip-v4", 2)
    first_obs, _ = envs.reset(seed=2)
    seen = play(envs, 300)
    envs.close()
    lost = np.array([step["infos"]["life_loss"] for step in seen])
    ended = np.array([step["terminations"] for step in seen])
    assert (ended == lost).all(), "a lost life, and only that, ends an episode (never truncated here)"
    games = [
        length
        for step in seen
        if "episode" in step["infos"]
        for length in step["infos"]["episode"]["l"][step["infos"]["_episode"]]
    ]
    assert len(games) == 4 and all(100 < length < 150 for length in games), games  # 2 x 2 games of 5 short lives
    assert lost.sum() >= 10
    assert assert_stacks_restart_with_zeros(first_obs, seen) >= 10


def test_with_the_semantics_off_a_policy_that_never_fires_stalls_after_its_first_life():
    envs = make_envs("BreakoutNoFrameskip-v4", 2, episodic_life=False)
    first_obs, _ = envs.reset(seed=2)
    seen = play(envs, 300)
    envs.close()
    lost = np.array([step["infos"]["life_loss"] for step in seen])
    assert (lost.sum(axis=0) == 1).all(), "the first life is lost, the next one is never served"
    assert not any(step["terminations"].any() or "episode" in step["infos"] for step in seen)
    assert assert_stacks_restart_with_zeros(first_obs, seen) == 0


def test_logged_return_is_the_raw_score_of_a_whole_game_over_all_lives():
    envs = make_envs("BreakoutNoFrameskip-v4", 2)
    obs, infos = envs.reset(seed=1)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and (infos["lives"] == 5).all()
    rng = np.random.default_rng(1)
    running, lives_lost, new_game = np.zeros(2), np.zeros(2, int), np.zeros(2, bool)
    games = []
    while len(games) < 4:
        _, rewards, terminations, truncations, infos = envs.step(rng.integers(4, size=2))
        assert not infos["life_loss"][new_game].any(), "the autoreset step loses no life"
        running[new_game], lives_lost[new_game] = 0, 0  # NEXT_STEP: this step started a new game
        running += np.where(new_game, 0, rewards)  # a life's serving step scores for the game too
        lives_lost += infos["life_loss"]
        assert (terminations[infos["life_loss"]]).all(), "a lost life ends a training episode"
        new_game = infos["_episode"] if "episode" in infos else np.zeros(2, bool)
        for env in np.flatnonzero(new_game):
            assert terminations[env] or truncations[env]
            assert infos["episode"]["r"][env] == running[env]
            assert lives_lost[env] == 5, "a Breakout game spans its five lives"
            games.append(running[env])
    assert sum(games) > 0 and any(r > 1 for r in games), "scores are raw sums, not one clipped reward"
    envs.close()


@pytest.mark.parametrize("env_id, sticky", [("BreakoutNoFrameskip-v4", 0.0), ("ALE/Breakout-v5", 0.25)])
def test_both_id_styles_run_with_their_sticky_actions(monkeypatch, env_id, sticky):
    made = {}

    class Recording(AtariVectorEnv):
        def __init__(self, **kwargs):
            made.update(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr("ale_py.vector_env.AtariVectorEnv", Recording)
    envs = make_envs(env_id, 1)
    assert made["repeat_action_probability"] == sticky and made["game"] == "breakout"
    assert made["reward_clipping"] is False and made["frameskip"] == 4 and made["noop_max"] == 30
    envs.reset(seed=0)
    envs.step(np.array([1]))
    envs.close()


def test_minatar_frames_are_channels_first_uint8_and_snapshot_exactly():
    envs = make_envs("MinAtar/Breakout-v1", 3)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 4, 10, 10) and obs.dtype == np.uint8 and obs.max() == 1
    rng = np.random.default_rng(0)
    for _ in range(50):
        obs, *_ = envs.step(rng.integers(3, size=3))
    snapshot = snapshot_envs(envs, obs)
    assert snapshot is not None
    restored, restored_obs = restore_envs(make_envs("MinAtar/Breakout-v1", 3), snapshot, None)
    assert np.array_equal(restored_obs, obs)
    for _ in range(300):  # sticky actions, spawns and resets all continue identically
        actions = rng.integers(3, size=3)
        first, second = envs.step(actions), restored.step(actions)
        for a, b in zip(first[:4], second[:4]):
            assert np.array_equal(a, b)
        assert first[4].keys() == second[4].keys()
    envs.close()
    restored.close()


def test_ale_envs_cannot_be_snapshot_so_resume_starts_fresh_games():
    envs = make_envs("BreakoutNoFrameskip-v4", 1)
    obs, _ = envs.reset(seed=0)
    assert snapshot_envs(envs, obs) is None
    envs.close()


def test_life_loss_is_read_from_the_lives_counter():
    class Lives(gym.vector.VectorEnv):
        def __init__(self, lives):
            self.num_envs, self.sequence = 2, iter(lives)
            self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

        def reset(self, **kwargs):
            return np.zeros(2), {"lives": np.array(next(self.sequence))}

        def step(self, actions):
            return (
                np.zeros(2),
                np.zeros(2),
                np.zeros(2, bool),
                np.zeros(2, bool),
                {"lives": np.array(next(self.sequence))},
            )

    env = atari.LifeLoss(Lives([[3, 1], [3, 0], [2, 0], [2, 5], [0, 5]]))
    env.reset()
    assert [env.step(None)[4]["life_loss"].tolist() for _ in range(4)] == [
        [False, True],
        [True, False],
        [False, False],  # a reset raises the counter: no loss
        [True, False],
    ]


def test_random_policy_baseline_logs_whole_games_that_results_can_score(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT, run_dirs, script_env

    from cleanrl_utils import results

    command = [sys.executable, str(ROOT / "benchmark" / "random_policy_pixels.py"), "--total-timesteps", "2000"]
    done = subprocess.run(command, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (run_dir,) = run_dirs(tmp_path)
    summary = results.summarize_run(run_dir)
    assert summary.env_id == "MinAtar/Breakout-v1" and summary.steps == 2000 and 0 <= summary.score < 5
