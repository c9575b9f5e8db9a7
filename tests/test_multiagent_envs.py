"""The environment section that the five multi-agent scripts carry (mappo, qmix, vdn, maddpg, matd3):
each copy is checked against the simulators themselves.

- MPE: MPEVecEnv keeps agents, rewards and dones aligned with a plain mpe2 parallel env stepped with the
  same actions, across an episode boundary (the last observation goes to final_obs, the reset one to
  next_obs), and its global state is mpe2's state().
- VMAS: observations and rewards are stacked in VMAS's agent order; a finished world is reset alone,
  the other worlds go on; global_state concatenates the agents' observations in that order.
- The copies are the same code, so the scripts agree on env ids, layout and autoreset.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import numpy as np
import pytest
import torch

SCRIPTS = ["mappo", "qmix", "vdn", "maddpg", "matd3"]
CPU = torch.device("cpu")


@pytest.fixture(params=SCRIPTS)
def section(request):
    return importlib.import_module(request.param)


def environment_section_source(module) -> str:
    source = inspect.getsource(module)
    return source[source.index("VMAS_SCENARIOS = (") : source.index("def global_state")]


def test_every_script_carries_the_same_environment_section():
    sources = {name: environment_section_source(importlib.import_module(name)) for name in SCRIPTS}
    assert len(set(sources.values())) == 1, "the environment sections differ: copy one script's section to the others"


@pytest.mark.parametrize("continuous", [False, True])
def test_mpe_adapter_keeps_agents_rewards_and_dones_aligned(section, continuous):
    from mpe2 import simple_spread_v3

    num_envs, horizon, seed = 2, 4, 7
    env = section.make_env("mpe/simple_spread_v3", num_envs, CPU, seed, continuous, horizon)
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
            np.testing.assert_array_equal(section.global_state(obs)[i].numpy(), ref.state())
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


def test_vmas_adapter_stacks_agents_in_vmas_order_and_resets_finished_worlds_alone(section):
    num_envs, horizon = 3, 5
    env = section.make_env("vmas/navigation", num_envs, CPU, 1, True, horizon)
    vmas_env = env.env
    obs = env.reset()
    for a, agent_obs in enumerate(
        vmas_env.get_from_scenario(get_observations=True, get_rewards=False, get_infos=False, get_dones=False)[0]
    ):
        torch.testing.assert_close(obs[:, a, : agent_obs.shape[-1]], agent_obs)
    torch.testing.assert_close(section.global_state(obs), torch.cat([obs[:, a] for a in range(env.n_agents)], dim=-1))

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


def test_unknown_env_id_lists_the_known_ones(section):
    message = section.check_env_id("vmas/navigaton")
    assert "vmas/navigation" in message and "mpe/simple_spread_v3" in message
    assert section.check_env_id("mpe/simple_spread_v3") is None


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
    assert len(team) == 4 and np.allclose(team, agents.sum(0), atol=1e-4)  # 100 vector steps, one log per 25
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
        (["--script", "cleanrl/ppo.py"], "no multi-agent environment section"),
        (["--max-episode-steps", "0"], "--max-episode-steps must be positive"),
    ]:
        refused = subprocess.run(tool + bad, cwd=workdir, env=script_env(), capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and message in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert len(run_dirs(workdir)) == 1
