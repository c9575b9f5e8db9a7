"""The CPU simulators behind the batched interface (cleanrl_utils/envs/envpool_mujoco_env.py and gymnasium_vec_env.py)
against the libraries stepped directly, for a fixed action sequence, across episode ends: Hopper under random actions
falls (terminations) and a 25-step time limit truncates the others. Checked exactly: the observations (the reset one
where an episode ended), rewards, terminations, truncations, the true final observations, and the episode statistics.

envpool resets an ended environment on the step after its end (the action of that step is ignored); the adapter resets
it within the step. So the reference pool is stepped per environment: an environment whose episode ended takes that
reset step (its observation is the next episode's first, its reward 0), and only then its next action."""

from __future__ import annotations

import envpool
import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_utils.envs.envpool_mujoco_env import ENVPOOL_TASKS, EnvPoolMuJoCoVecEnv
from cleanrl_utils.envs.gymnasium_vec_env import GymnasiumVecEnv

NUM_ENVS, STEPS, LIMIT, SEED = 4, 80, 25, 3
CPU = torch.device("cpu")


def fixed_actions(act_dim: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (STEPS, NUM_ENVS, act_dim)).astype(np.float32)


def envpool_reference(task: str, actions: np.ndarray) -> tuple[np.ndarray, list[list[dict]]]:
    """envpool stepped directly (NEXT_STEP autoreset): the first observations, and per environment its transitions
    {obs (next), reward, terminated, truncated, final_obs}, the reset step folded into the transition that ended."""
    pool = envpool.make_gymnasium(ENVPOOL_TASKS[task], num_envs=NUM_ENVS, seed=SEED, max_episode_steps=LIMIT)
    first, info = pool.reset()
    assert np.array_equal(info["env_id"], np.arange(NUM_ENVS))
    used = np.zeros(NUM_ENVS, dtype=int)  # actions consumed per environment
    resetting = np.zeros(NUM_ENVS, dtype=bool)  # its next pool step is envpool's reset step
    transitions: list[list[dict]] = [[] for _ in range(NUM_ENVS)]
    while used.min() < STEPS:
        step_actions = actions[np.minimum(used, STEPS - 1), np.arange(NUM_ENVS)]
        obs, reward, terminated, truncated, info = pool.step(step_actions)
        assert np.array_equal(info["env_id"], np.arange(NUM_ENVS))
        for i in range(NUM_ENVS):
            if resetting[i]:  # the reset step: its action was ignored, its observation starts the next episode
                assert reward[i] == 0 and not terminated[i] and not truncated[i]
                transitions[i][-1]["obs"] = obs[i].astype(np.float32)
                resetting[i] = False
            elif used[i] < STEPS:
                final = obs[i].astype(np.float32)
                transitions[i].append(
                    dict(obs=final, reward=reward[i], terminated=terminated[i], truncated=truncated[i], final_obs=final)
                )
                used[i] += 1
                resetting[i] = terminated[i] or truncated[i]
    pool.close()
    return first.astype(np.float32), transitions


def gymnasium_reference(task: str, actions: np.ndarray) -> tuple[np.ndarray, list[list[dict]]]:
    """gymnasium's v5 task stepped directly, one env per column, reset with seed + i and then unseeded at each end, as
    a SAME_STEP vector env does."""
    first, transitions = [], []
    for i in range(NUM_ENVS):
        env = gym.make(ENVPOOL_TASKS[task], max_episode_steps=LIMIT)
        obs, _ = env.reset(seed=SEED + i)
        first.append(obs)
        rows = []
        for t in range(STEPS):
            final, reward, terminated, truncated, _ = env.step(actions[t, i])
            obs = env.reset()[0] if terminated or truncated else final
            rows.append(
                dict(
                    obs=obs,
                    reward=reward,
                    terminated=terminated,
                    truncated=truncated,
                    final_obs=final.astype(np.float32),
                )
            )
        transitions.append(rows)
        env.close()
    return np.asarray(first, dtype=np.float32), transitions


def make_adapter(simulator: str, task: str):
    if simulator == "envpool":
        return EnvPoolMuJoCoVecEnv(task, NUM_ENVS, CPU, SEED, max_episode_steps=LIMIT)
    return GymnasiumVecEnv(ENVPOOL_TASKS[task], NUM_ENVS, CPU, SEED, max_episode_steps=LIMIT)


@pytest.mark.parametrize("simulator", ["envpool", "gymnasium"])
def test_same_step_adapter_equals_the_library_stepped_directly_across_episode_ends(simulator):
    task = "Hopper"
    envs = make_adapter(simulator, task)
    actions = fixed_actions(envs.act_dim)
    reference = envpool_reference if simulator == "envpool" else gymnasium_reference
    first, transitions = reference(task, actions)
    assert torch.equal(envs.reset(), torch.from_numpy(first))
    returns, lengths = np.zeros(NUM_ENVS, dtype=np.float32), np.zeros(NUM_ENVS, dtype=np.int32)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(STEPS):
        obs, reward, terminated, truncated, info = envs.step(torch.from_numpy(actions[t]))
        want = {key: np.stack([transitions[i][t][key] for i in range(NUM_ENVS)]) for key in transitions[0][0]}
        assert obs.dtype == torch.float32 and obs.shape == (NUM_ENVS, envs.obs_dim)
        assert np.array_equal(obs.numpy(), want["obs"].astype(np.float32)), f"step {t}: observations"
        assert np.array_equal(info["final_obs"].numpy(), want["final_obs"]), f"step {t}: final observations"
        assert np.array_equal(reward.numpy(), want["reward"].astype(np.float32)), f"step {t}: rewards"
        assert np.array_equal(terminated.numpy(), want["terminated"]), f"step {t}: terminations"
        assert np.array_equal(truncated.numpy(), want["truncated"]), f"step {t}: truncations"
        done = want["terminated"] | want["truncated"]
        assert np.array_equal(info["done"].numpy(), done), f"step {t}: done"
        returns += want["reward"].astype(np.float32)
        lengths += 1
        # The statistics of the episode so far, as returned at this step; they start again after an end.
        np.testing.assert_allclose(info["episode_return"].numpy(), returns, rtol=1e-6, atol=1e-5)
        assert np.array_equal(info["episode_length"].numpy(), lengths), f"step {t}: episode lengths"
        returns[done], lengths[done] = 0.0, 0
        ends["terminated"] += int(want["terminated"].sum())
        ends["truncated"] += int((want["truncated"] & ~want["terminated"]).sum())
    assert ends["terminated"] >= 3 and ends["truncated"] >= 3, ends  # both kinds of end, in several environments
    envs.close()


def test_envpool_ant_and_humanoid_match_envpool_stepped_directly():
    """The headline tasks: their (contact-force) observations and rewards over a few steps."""
    for task in ("Ant", "Humanoid"):
        envs = EnvPoolMuJoCoVecEnv(task, 2, CPU, SEED)
        pool = envpool.make_gymnasium(ENVPOOL_TASKS[task], num_envs=2, seed=SEED)
        assert torch.equal(envs.reset(), torch.from_numpy(pool.reset()[0].astype(np.float32)))
        assert envs.obs_dim == {"Ant": 105, "Humanoid": 348}[task]
        for action in np.random.default_rng(1).uniform(-0.4, 0.4, (3, 2, envs.act_dim)).astype(np.float32):
            obs, reward, _, _, _ = envs.step(torch.from_numpy(action))
            want_obs, want_reward, *_ = pool.step(action)
            assert torch.equal(obs, torch.from_numpy(want_obs.astype(np.float32))), task
            assert torch.equal(reward, torch.from_numpy(want_reward.astype(np.float32))), task
        envs.close()
        pool.close()


def test_actions_are_clipped_to_the_bounds_and_the_state_cannot_be_saved():
    envs = EnvPoolMuJoCoVecEnv("Hopper", 2, CPU, SEED)
    pool = envpool.make_gymnasium("Hopper-v5", num_envs=2, seed=SEED)
    envs.reset(), pool.reset()
    obs, *_ = envs.step(torch.full((2, 3), 5.0))
    assert torch.equal(obs, torch.from_numpy(pool.step(np.ones((2, 3), np.float32))[0].astype(np.float32)))
    assert envs.state_dict() is None and envs.check_buffers() == {}
    envs.close()


def test_the_task_names_are_envpools_and_gymnasiums_v5_ids():
    known = set(envpool.list_all_envs())
    for name, env_id in ENVPOOL_TASKS.items():
        assert env_id == f"{name}-v5" and env_id in known and env_id in gym.registry, env_id
