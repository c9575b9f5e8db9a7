"""cleanrl_utils.envs.multiagent, checked against the simulators themselves.

- MPE: MPEVecEnv keeps agents, rewards and dones aligned with a plain mpe2 parallel env stepped with the
  same actions, across an episode boundary (the last observation goes to final_obs, the reset one to
  next_obs), and its observations flattened in agent order are mpe2's state().
- VMAS: observations and rewards are stacked in VMAS's agent order; a finished world is reset alone,
  the other worlds go on.
- The episode tally: per-agent means of the episodes that ended since the last read.
- Env ids and action spaces are checked in one line; benchmark/random_policy.py logs like a run.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete

from cleanrl_utils.envs.multiagent import (
    KNOWN_ENV_IDS,
    EpisodeTally,
    check_env_id,
    make_env,
    same_action_space,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("continuous", [False, True])
def test_mpe_adapter_keeps_agents_rewards_and_dones_aligned(continuous):
    from mpe2 import simple_spread_v3

    num_envs, horizon, seed = 2, 4, 7
    env = make_env("mpe/simple_spread_v3", num_envs, CPU, seed, continuous, horizon)
    references = [
        simple_spread_v3.parallel_env(max_cycles=horizon, continuous_actions=continuous) for _ in range(num_envs)
    ]
    obs = env.reset()
    reference_obs = [ref.reset(seed=seed + i)[0] for i, ref in enumerate(references)]
    agents = references[0].possible_agents
    rng = np.random.default_rng(0)
    episode_returns = np.zeros((num_envs, len(agents)))
    for step in range(1, 2 * horizon + 2):  # two whole episodes and one step into the third
        for i, ref in enumerate(references):
            for a, name in enumerate(agents):
                np.testing.assert_array_equal(obs[i, a].numpy(), reference_obs[i][name])
            np.testing.assert_array_equal(obs[i].flatten().numpy(), ref.state())  # the scripts' global state
        if continuous:
            actions = torch.as_tensor(rng.uniform(0, 1, (num_envs, len(agents), 5)), dtype=torch.float32)
        else:
            actions = torch.as_tensor(rng.integers(0, 5, (num_envs, len(agents))))
        obs, rewards, terminated, truncated, final_obs, info = env.step(actions)
        for i, ref in enumerate(references):
            ref_obs, ref_rew, ref_term, ref_trunc, _ = ref.step(
                {name: actions[i, a].numpy() for a, name in enumerate(agents)}
            )
            episode_returns[i] += [ref_rew[name] for name in agents]
            for a, name in enumerate(agents):
                np.testing.assert_array_equal(final_obs[i, a].numpy(), ref_obs[name])
                assert rewards[i, a].item() == pytest.approx(ref_rew[name])
            assert bool(terminated[i]) is any(ref_term.values())
            assert bool(truncated[i]) is (any(ref_trunc.values()) and not any(ref_term.values()))
            assert bool(truncated[i]) is (step % horizon == 0)  # simple_spread ends by its time limit only
            if truncated[i]:
                np.testing.assert_allclose(info["episode_return"][i].numpy(), episode_returns[i], rtol=1e-5)
                assert info["episode_length"][i].item() == horizon
                episode_returns[i] = 0
                ref_obs, _ = ref.reset()  # the adapter resets a finished copy without a new seed
            reference_obs[i] = ref_obs
    env.close()


def test_vmas_adapter_stacks_agents_in_vmas_order_and_resets_finished_worlds_alone():
    num_envs, horizon = 3, 5
    env = make_env("vmas/navigation", num_envs, CPU, 1, True, horizon)
    vmas_env = env.env
    obs = env.reset()
    for a, agent_obs in enumerate(
        vmas_env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)[0]
    ):
        torch.testing.assert_close(obs[:, a, : agent_obs.shape[-1]], agent_obs)

    # Record what VMAS itself returns, to check the stacking order of the rewards.
    raw_step = vmas_env.step
    returned = {}

    def recording_step(actions):
        result = raw_step(actions)
        returned["rewards"] = [reward.clone() for reward in result[1]]
        return result

    vmas_env.step = recording_step

    # Worlds started together hit the time limit together: all are reset at once.
    actions = torch.zeros(num_envs, env.n_agents, env.act_dim)
    for _ in range(horizon):
        obs, rewards, terminated, truncated, final_obs, info = env.step(actions + 0.5)
        torch.testing.assert_close(rewards, torch.stack(returned["rewards"], dim=1))
    assert truncated.all() and vmas_env.steps.tolist() == [0, 0, 0]
    assert info["episode_length"].tolist() == [horizon] * num_envs
    assert not torch.allclose(obs, final_obs)

    # World 1 restarts two steps later than the others, so it is still running when they hit the limit.
    for _ in range(2):
        env.step(actions)
    vmas_env.reset_at(1, return_observations=False)
    env.episode_returns[1] = 0
    env.episode_lengths[1] = 0
    for _ in range(horizon - 2):
        obs, rewards, terminated, truncated, final_obs, info = env.step(actions - 0.5)
    assert truncated.tolist() == [True, False, True] and not terminated.any()
    assert info["episode_length"].tolist() == [horizon, horizon - 2, horizon]
    assert vmas_env.steps.tolist() == [0, horizon - 2, 0]  # only the finished worlds were reset
    torch.testing.assert_close(obs[1], final_obs[1])  # a running world's next obs is its last obs
    assert not torch.allclose(obs[0], final_obs[0]) and not torch.allclose(obs[2], final_obs[2])
    assert env.episode_lengths.tolist() == [0, horizon - 2, 0]
    env.close()


def test_episode_tally_means_the_finished_episodes_per_agent_and_starts_again():
    tally = EpisodeTally(2, CPU)
    assert tally.read() is None
    returns = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    tally.add(torch.tensor([True, False, True]), returns, torch.tensor([4, 7, 6]))
    tally.add(torch.tensor([False, True, False]), returns * 2, torch.tensor([1, 8, 1]))
    episodes = tally.read()
    assert episodes.count == 3 and episodes.length == pytest.approx(6.0)
    assert episodes.agent_returns == pytest.approx([(1 + 20 + 100) / 3, (2 + 40 + 200) / 3])
    assert episodes.team_return == pytest.approx((3 + 60 + 300) / 3)
    assert episodes.agent_scalars() == pytest.approx(
        {
            "charts/episodic_return_agent0": 121 / 3,
            "charts/episodic_return_agent1": 242 / 3,
            "charts/episodic_return_mean_agent": 363 / 6,
        }
    )
    assert tally.read() is None  # a read starts a new tally


def test_adapters_tally_what_info_reports():
    for env_id in ["mpe/simple_spread_v3", "vmas/navigation"]:
        env = make_env(env_id, 3, CPU, 0, False, 3)
        env.reset()
        team_returns = []
        for step in range(7):
            *_, info = env.step(torch.randint(5, (3, env.n_agents)))
            team_returns += info["episode_return"][info["done"]].sum(1).tolist()
        episodes = env.read_episodes()
        assert episodes.count == 6 and episodes.length == 3 and len(episodes.agent_returns) == env.n_agents
        assert episodes.team_return == pytest.approx(np.mean(team_returns), rel=1e-5)
        env.close()


def test_unknown_env_id_fails_in_one_line_listing_the_known_ones(capsys):
    check_env_id("mpe/simple_spread_v3")
    with pytest.raises(SystemExit) as exit_info:
        check_env_id("vmas/navigaton")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: unknown --env-id 'vmas/navigaton'; did you mean vmas/navigation")
    assert all(env_id in err for env_id in KNOWN_ENV_IDS)


def test_same_action_space_compares_type_size_and_bounds():
    box = Box(-1.0, 1.0, (2,))
    assert same_action_space([box, Box(-1.0, 1.0, (2,))]) and same_action_space([Discrete(5), Discrete(5)])
    assert not same_action_space([box, Box(-2.0, 1.0, (2,))])  # other bounds
    assert not same_action_space([box, Box(-1.0, 1.0, (3,))])
    assert not same_action_space([Discrete(5), Discrete(4)]) and not same_action_space([Discrete(2), box])


def test_random_policy_baseline_is_logged_like_a_run(workdir):
    # benchmark/random_policy.py: the baseline row of the multi-agent benchmark tables.
    from conftest import ROOT, read_scalars, run_dirs, script_env

    from cleanrl_utils import results

    tool = [sys.executable, str(ROOT / "benchmark" / "random_policy.py")]
    flags = [
        "--script",
        "cleanrl/qmix.py",
        "--env-id",
        "mpe/simple_spread_v3",
        "--no-continuous-actions",
        "--num-envs",
        "4",
        "--total-timesteps",
        "400",
        "--log-every",
        "25",
        "--seed",
        "3",
    ]
    finished = subprocess.run(tool + flags, cwd=workdir, env=script_env(), capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    (run_dir,) = run_dirs(workdir)
    assert run_dir.name.startswith("mpe-simple_spread_v3__random_policy__3__")
    scalars = read_scalars(run_dir)
    team = np.array([value for _, value in scalars["charts/episodic_return"]])
    agents = np.array([[value for _, value in scalars[f"charts/episodic_return_agent{i}"]] for i in range(3)])
    mean_agent = np.array([value for _, value in scalars["charts/episodic_return_mean_agent"]])
    assert len(team) == 4 and np.allclose(team, agents.sum(0), atol=1e-4)  # 100 vector steps, one log per 25
    assert np.allclose(mean_agent, agents.mean(0), atol=1e-4)
    assert all(value == 25 for _, value in scalars["charts/episodic_length"])
    summary = results.summarize_run(run_dir, last_n=4)
    assert summary.exp_name == "random_policy" and summary.score == pytest.approx(team.mean(), rel=1e-5)

    unknown = subprocess.run(
        tool + ["--env-id", "mpe/simple_sprad"],
        cwd=workdir,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode != 0 and "unknown --env-id" in unknown.stderr and "mpe/simple_spread_v3" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and len(run_dirs(workdir)) == 1
    for bad, message in [
        (["--script", "cleanrl/ppo.py"], "is not a multi-agent script"),
        (["--max-episode-steps", "0"], "--max-episode-steps must be positive"),
    ]:
        refused = subprocess.run(tool + bad, cwd=workdir, env=script_env(), capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert len(run_dirs(workdir)) == 1
