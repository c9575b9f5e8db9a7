"""PointChasing-v0 (cleanrl_utils/envs/point_chasing.py): the dynamics and reward against a hand computation of
ElegantRL's equations, the batched env against single envs under gymnasium's SAME_STEP autoreset, final
observations at a termination and at the 1024-step cut, seeding, and the continuous scripts taking the id."""

from __future__ import annotations

import importlib
import math
import pickle
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, read_scalars, run_dirs, run_script

from cleanrl_utils.envs.point_chasing import PointChasingEnv, PointChasingVecEnv

CONTINUOUS = [
    "ppo_continuous_action.py",
    "sac_continuous_action.py",
    "td3_continuous_action.py",
    "ddpg_continuous_action.py",
]


def elegantrl_step(p0, v0, p1, v1, action, drift):
    """ElegantRL's PointChasingEnv.step written out in plain Python floats (2-D)."""
    norm = max(math.hypot(*action), 1.0)
    distance = math.hypot(p0[0] - p1[0], p0[1] - p1[1])
    v1 = [0.75 * v + a / norm for v, a in zip(v1, action)]
    p1 = [p + 0.01 * v for p, v in zip(p1, v1)]
    v0 = [0.5 * v + u for v, u in zip(v0, drift)]
    p0 = [p + 0.01 * v for p, v in zip(p0, v0)]
    next_distance = math.hypot(p0[0] - p1[0], p0[1] - p1[1])
    return p0, v0, p1, v1, distance - next_distance - 0.02 * norm, next_distance < 2


def chase(obs):
    """Full speed straight at the target: reaches it in about 370 steps."""
    direction = obs[..., 0:2] - obs[..., 4:6]
    return direction / np.linalg.norm(direction, axis=-1, keepdims=True)


# --- the dynamics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
def test_steps_match_a_hand_computation_of_elegantrls_equations(batched):
    start = [0.3, -0.2, 0.5, 0.1, -7.0, -8.5, 0.2, -0.4]
    actions = [[0.6, -0.3], [3.0, 4.0], [-0.1, 0.9], [1.0, 1.0]]  # norms below 1, 5, below 1, sqrt 2
    drifts = iter([[0.25, 0.75], [0.5, 0.125], [0.9, 0.0], [0.3, 0.6]])
    if batched:
        env = PointChasingVecEnv(num_envs=1)
        env._drift = lambda: torch.tensor([next(drifts)])
        obs, _ = env.reset(options={"state": [start]})
    else:
        env = PointChasingEnv()
        env._drift = lambda: np.array(next(drifts), np.float32)
        obs, _ = env.reset(seed=0, options={"state": start})
    p0, v0, p1, v1 = start[0:2], start[2:4], start[4:6], start[6:8]
    np.testing.assert_allclose(np.asarray(obs).reshape(-1), start, rtol=1e-6)
    drift_values = [[0.25, 0.75], [0.5, 0.125], [0.9, 0.0], [0.3, 0.6]]
    for action, drift in zip(actions, drift_values):
        p0, v0, p1, v1, reward, terminated = elegantrl_step(p0, v0, p1, v1, action, drift)
        obs, r, term, trunc, _ = env.step(np.array([action] if batched else action, np.float32))
        np.testing.assert_allclose(np.asarray(obs).reshape(-1), p0 + v0 + p1 + v1, rtol=1e-5, atol=1e-6)
        assert float(r if not batched else r[0]) == pytest.approx(reward, abs=1e-5)
        assert not terminated and not bool(term if not batched else term[0])  # far apart throughout
        assert not bool(trunc if not batched else trunc[0])


def test_the_start_distribution_is_elegantrls():
    envs = PointChasingVecEnv(num_envs=4096)
    obs, _ = envs.reset(seed=3)
    obs = obs.view(4096, 4, 2)
    assert torch.equal(obs[:, 1], torch.zeros(4096, 2)) and torch.equal(obs[:, 3], torch.zeros(4096, 2))
    for row, mean in ((0, 0.0), (2, -8.0)):  # p0 ~ N(0, 1), p1 ~ N(-8, 1) in each axis
        assert obs[:, row].mean(0).sub(mean).abs().max() < 0.1
        assert obs[:, row].std(0).sub(1.0).abs().max() < 0.1
    single = PointChasingEnv()
    starts = np.stack([single.reset(seed=seed)[0] for seed in range(2000)])
    np.testing.assert_allclose(starts[:, 4:6].mean(0), [-8, -8], atol=0.1)
    assert (starts[:, [2, 3, 6, 7]] == 0).all()


# --- batched == single envs ------------------------------------------------------------------------


def test_batched_env_equals_single_envs_under_same_step_autoreset():
    """Six copies, the same starts and drifts fed to both (hooks replaced by one table): two chase (terminate near
    step 370 and start again), two stand still (truncated at 1024), two act at random with norms up to 2. Equal up to
    float32 rounding: torch's CPU sqrt (AVX-512) is sometimes 1 ulp off NumPy's correctly rounded one."""
    n, steps = 6, 1100
    rng = np.random.default_rng(0)
    starts = rng.standard_normal((steps + 1, n, 2, 2), dtype=np.float32)
    drifts = rng.random((steps, n, 2), dtype=np.float32)
    clock = [-1]  # the step being taken; starts[clock + 1] are the starts drawn in it (starts[0] at reset)

    batched = PointChasingVecEnv(num_envs=n)
    batched._start_noise = lambda: torch.from_numpy(starts[clock[0] + 1])
    batched._drift = lambda: torch.from_numpy(drifts[clock[0]])
    singles = gym.vector.SyncVectorEnv(
        [PointChasingEnv for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    for i, env in enumerate(singles.envs):
        env._start_noise = lambda i=i: starts[clock[0] + 1, i]
        env._drift = lambda i=i: drifts[clock[0], i]
    obs_b, _ = batched.reset(seed=0)
    obs_s, _ = singles.reset(seed=0)
    np.testing.assert_array_equal(obs_b.numpy(), obs_s)
    ended = np.zeros(n, int)
    for t in range(steps):
        clock[0] = t
        actions = np.concatenate([chase(obs_s[:2]), np.zeros((2, 2)), rng.uniform(-2, 2, (2, 2))], dtype=np.float32)
        obs_b, rew_b, term_b, trunc_b, info_b = batched.step(torch.from_numpy(actions))
        obs_s, rew_s, term_s, trunc_s, info_s = singles.step(actions)
        np.testing.assert_allclose(obs_b.numpy(), obs_s, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(rew_b.numpy(), rew_s, atol=4e-6)  # a difference of distances about 11
        np.testing.assert_array_equal(term_b.numpy(), term_s)
        np.testing.assert_array_equal(trunc_b.numpy(), trunc_s)
        done = term_s | trunc_s
        np.testing.assert_array_equal(info_b["_final_obs"].numpy(), done)
        assert torch.equal(info_b["final_obs"][~torch.from_numpy(done)], obs_b[~torch.from_numpy(done)])
        for i in np.flatnonzero(done):
            np.testing.assert_allclose(info_b["final_obs"][i].numpy(), info_s["final_obs"][i], rtol=1e-6, atol=1e-6)
        ended += done
    assert (ended[:2] >= 2).all(), "the chasers should reach the target more than once in 1100 steps"
    assert (ended[2:4] == 1).all(), "standing still ends once, at the 1024-step cut"


# --- autoreset and final observations --------------------------------------------------------------


def test_final_observation_at_termination_and_at_the_1024_step_cut():
    envs = PointChasingVecEnv(num_envs=2)
    near = [0.0, 0.0, 0.0, 0.0, -1.0, -1.0, 0.0, 0.0]  # 1.41 apart: within reach (2) after one step
    far = [0.0, 0.0, 0.0, 0.0, -8.0, -8.0, 0.0, 0.0]
    envs.reset(seed=1, options={"state": [near, far]})
    still = torch.zeros(2, 2)
    obs, rewards, terminations, truncations, infos = envs.step(still)
    assert terminations.tolist() == [True, False] and truncations.tolist() == [False, False]
    assert infos["_final_obs"].tolist() == [True, False] and infos["_episode"].tolist() == [True, False]
    final = infos["final_obs"][0]
    assert final[4:6].tolist() == [-1.0, -1.0] and (final[2:4] > 0).all(), "the target moved, the agent did not"
    assert (obs[0, [2, 3, 6, 7]] == 0).all() and obs[0, 4:6].mean() < -4, "a fresh start: still, about 8 behind"
    assert infos["episode"]["l"][0] == 1 and infos["episode"]["r"][0] == pytest.approx(rewards[0].item())
    assert torch.equal(infos["final_obs"][1], obs[1])
    for step in range(2, 1025):
        obs, rewards, terminations, truncations, infos = envs.step(still)
        assert not terminations[1]
        assert bool(truncations[1]) == (step == 1024), f"step {step}"
    assert infos["episode"]["l"][1] == 1024 and infos["_final_obs"][1]
    assert (infos["final_obs"][1, 2:4] > 0).all() and (obs[1, [2, 3, 6, 7]] == 0).all()
    assert infos["final_obs"][1, 0:2].mean() > 5, "the target drifted about 10 in each axis in 1024 steps"


def test_single_env_ends_by_itself_at_1024_steps_and_on_reaching():
    env = gym.make("PointChasing-v0")
    obs, _ = env.reset(seed=0)
    for step in range(1, 1025):
        obs, _, terminated, truncated, _ = env.step(np.zeros(2, np.float32))
        assert not terminated and truncated == (step == 1024)
    obs, _ = env.reset(seed=0)
    for step in range(1, 1025):
        obs, _, terminated, truncated, _ = env.step(chase(obs))
        if terminated:
            break
    assert terminated and not truncated and np.linalg.norm(obs[0:2] - obs[4:6]) < 2 and 300 < step < 450


def test_seeding_and_pickling():
    a, b = PointChasingVecEnv(num_envs=8), PointChasingVecEnv(num_envs=8)
    actions = torch.rand(8, 2)
    assert torch.equal(a.reset(seed=5)[0], b.reset(seed=5)[0])
    assert torch.equal(a.step(actions)[0], b.step(actions)[0])
    assert not torch.equal(a.reset(seed=6)[0], b.reset(seed=5)[0])
    env = PointChasingEnv()
    env.reset(seed=2)
    env.step(np.ones(2, np.float32))
    copy = pickle.loads(pickle.dumps(env))  # the scripts' checkpoints pickle the envs
    for _ in range(3):
        action = np.array([0.5, -1.0], np.float32)
        np.testing.assert_array_equal(env.step(action)[0], copy.step(action)[0])


def test_registered_ids_and_the_vector_entry_point():
    env = gym.make("PointChasing-v0")
    assert env.observation_space.shape == (8,) and env.observation_space.dtype == np.float32
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    envs = gym.make_vec("PointChasing-v0", num_envs=3, vectorization_mode="vector_entry_point", device="cpu")
    assert (
        isinstance(envs, PointChasingVecEnv) and envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    )
    obs, _ = envs.reset(seed=0)
    obs, rewards, terminations, truncations, _ = envs.step(envs.action_space.sample())
    assert obs.shape == (3, 8) and obs.dtype == torch.float32 and rewards.shape == (3,)
    assert terminations.dtype == truncations.dtype == torch.bool
    frame = gym.make("PointChasing-v0", render_mode="rgb_array")
    frame.reset(seed=0)
    image = frame.render()
    assert image.shape == (128, 128, 3) and image.dtype == np.uint8
    assert ((image == (220, 30, 30)).all(-1).any()) and ((image == (30, 60, 220)).all(-1).any())


# --- the continuous scripts take the id ----------------------------------------------------------


@pytest.mark.parametrize("script", CONTINUOUS)
def test_continuous_scripts_register_the_id(script, monkeypatch):
    """Each script's register_env_family makes the id known (imported here: a subprocess each costs seconds)."""
    module = importlib.import_module(script.removesuffix(".py"))
    monkeypatch.delitem(gym.registry, "PointChasing-v0")
    monkeypatch.delitem(sys.modules, "cleanrl_utils.envs.point_chasing")
    module.register_env_family("Pendulum-v1")
    assert "PointChasing-v0" not in gym.registry
    module.register_env_family("PointChasing-v0")
    assert "PointChasing-v0" in gym.registry


def test_bad_id_names_the_nearest(workdir):
    result = run_script("td3_continuous_action.py", "--env-id", "PointChasing-v1", cwd=workdir)
    assert_bad_input(result, workdir, "PointChasing-v1", "PointChasing-v0")


def test_smoke_sac(workdir):
    flags = ["--batch-size", "32", "--buffer-size", "500", "--learning-starts", "200", "--total-timesteps", "300"]
    flags += ["--torch-threads", "1"]  # more threads than free cores spin: 30 s instead of 1 s here
    result = run_script("sac_continuous_action.py", "--env-id", "PointChasing-v0", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), ["charts/SPS", "losses/qf1_loss", "losses/actor_loss"])


def test_smoke_ppo(workdir):
    flags = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", "256"]
    flags += ["--torch-threads", "1", "--save-model", "--eval-episodes", "1"]
    result = run_script("ppo_continuous_action.py", "--env-id", "PointChasing-v0", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), ["charts/SPS", "losses/value_loss", "eval/episodic_return"])
