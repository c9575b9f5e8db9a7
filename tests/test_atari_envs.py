"""cleanrl_utils/envs/atari.py: the ALE vector env against gymnasium's single-env preprocessing, whole-game scores,
life losses, MinAtar frames and their exact snapshot."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv

from cleanrl_utils.checkpoint import restore_envs, snapshot_envs
from cleanrl_utils.envs import atari
from cleanrl_utils.envs.atari import make_envs


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


def test_logged_return_is_the_raw_score_of_a_whole_game_over_all_lives():
    envs = make_envs("BreakoutNoFrameskip-v4", 2)
    obs, infos = envs.reset(seed=1)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and (infos["lives"] == 5).all()
    rng = np.random.default_rng(1)
    running, lives_lost, resets = np.zeros(2), np.zeros(2, int), np.zeros(2, bool)
    games = []
    while len(games) < 4:
        _, rewards, terminations, truncations, infos = envs.step(rng.integers(4, size=2))
        assert not infos["life_loss"][resets].any(), "the autoreset step loses no life"
        running[resets], lives_lost[resets] = 0, 0  # NEXT_STEP: this step started a new game
        running += np.where(resets, 0, rewards)
        lives_lost += infos["life_loss"]
        for env in np.flatnonzero(terminations | truncations):
            assert infos["_episode"][env]
            assert infos["episode"]["r"][env] == running[env]
            assert lives_lost[env] == 5, "a Breakout game spans its five lives"
            games.append(running[env])
        resets = terminations | truncations
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
