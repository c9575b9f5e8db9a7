"""cleanrl_utils/envs/mjlab_env.py against mjlab's own env stepped directly. mjlab lives in the uv project
projects/mjlab (its MuJoCo pins conflict with the main environment's), so these tests run there:

    uv run --project projects/mjlab pytest -q -p no:cacheprovider tests/test_mjlab_env.py

and are skipped by the main suite, except the one that checks the line a run without mjlab fails with.

The task: Cartpole balance (4 envs, a 12-step time limit) with a termination added here (the cart beyond 0.3 m; mjlab's
Cartpole ends only at its time limit), so that one fixed action sequence gives terminations, truncations and both kinds
of reset. mjlab's generators are global and reseeded by each env it builds, so the runs below go one after another.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

MJLAB = importlib.util.find_spec("mjlab") is not None
needs_mjlab = pytest.mark.skipif(
    not MJLAB, reason="mjlab is in projects/mjlab: uv run --project projects/mjlab pytest tests/test_mjlab_env.py"
)

TASK = "Test-Mjlab-Cartpole-Falls"
NUM_ENVS, STEPS, LIMIT, SEED = 4, 40, 12, 3


def cart_out(env, limit: float = 0.3) -> torch.Tensor:
    return env.scene["cartpole"].data.joint_pos[:, 0].abs() > limit


def register_task() -> None:
    from mjlab.managers.termination_manager import TerminationTermCfg
    from mjlab.tasks.registry import _REGISTRY, load_env_cfg, load_rl_cfg, register_mjlab_task

    if TASK in _REGISTRY:
        return
    cfg = load_env_cfg("Mjlab-Cartpole-Balance")
    cfg.terminations["cart_out"] = TerminationTermCfg(func=cart_out)
    register_mjlab_task(TASK, cfg, cfg, load_rl_cfg("Mjlab-Cartpole-Balance"))


def fixed_actions() -> torch.Tensor:
    """Bang-bang pushes, each env its own period and sign, with noise: some carts leave the track, some do not."""
    generator = torch.Generator().manual_seed(0)
    steps = torch.arange(STEPS)[:, None]
    period = torch.tensor([3, 5, 40, 7])
    sign = torch.where((steps // period) % 2 == 0, 1.0, -1.0) * torch.tensor([1.0, -1.0, 1.0, 1.0])
    return (3.0 * sign + torch.randn(STEPS, NUM_ENVS, generator=generator))[..., None]


def direct_env(auto_reset: bool):
    import mjlab.tasks  # noqa: F401
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(TASK)
    cfg.scene.num_envs, cfg.seed, cfg.auto_reset = NUM_ENVS, SEED, auto_reset
    cfg.episode_length_s = (LIMIT - 0.5) * cfg.sim.mujoco.timestep * cfg.decimation
    return ManagerBasedRlEnv(cfg, device="cpu")


@pytest.fixture(scope="module")
def runs():
    """The wrapper's run and two direct runs of mjlab's env on the same actions: with mjlab's auto-reset (its
    default, what its training uses) and with auto_reset=False and each step's ended envs reset by hand."""
    from cleanrl_utils.envs.mjlab_env import MjlabVecEnv

    register_task()
    actions = fixed_actions()
    envs = MjlabVecEnv(TASK, NUM_ENVS, torch.device("cpu"), SEED, max_episode_steps=LIMIT)
    wrapper = dict(obs=[], critic=[], step=[], raw_actions=[])
    wrapper["first_obs"], wrapper["first_critic"] = envs.reset(), envs.critic_obs
    for action in actions:
        obs, reward, terminated, truncated, info = envs.step(action)
        wrapper["obs"].append(obs)
        wrapper["critic"].append(envs.critic_obs)
        wrapper["step"].append((reward, terminated, truncated, info))
        wrapper["raw_actions"].append(envs.env.action_manager.action.clone())
    wrapper["limits"] = (envs.action_low, envs.action_high, envs.max_episode_steps)
    envs.close()

    auto = dict(obs=[], step=[])
    env = direct_env(auto_reset=True)
    obs, _ = env.reset()
    auto["first_obs"] = {k: v.clone() for k, v in obs.items()}
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        auto["obs"].append({k: v.clone() for k, v in obs.items()})
        auto["step"].append((reward.clone(), terminated.clone(), truncated.clone()))
    env.close()

    manual = dict(final=[], log=[])
    env = direct_env(auto_reset=False)
    env.reset()
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        manual["final"].append({k: v.clone() for k, v in obs.items()})
        ended = (terminated | truncated).nonzero().squeeze(-1)
        log = {}
        if len(ended):
            _, extras = env.reset(env_ids=ended)
            log = dict(extras["log"])
        manual["log"].append(log)
    env.close()
    return wrapper, auto, manual


@needs_mjlab
def test_run_has_terminations_and_truncations(runs):
    """The fixed actions end episodes both ways, at different steps, so the tests below see every kind of reset."""
    wrapper, _, _ = runs
    terminated = torch.stack([step[1] for step in wrapper["step"]])
    truncated = torch.stack([step[2] for step in wrapper["step"]])
    assert terminated.sum() >= 3 and truncated.sum() >= 3
    assert (terminated.any(1) & ~terminated.all(1)).any()  # a step where only some envs end
    assert wrapper["limits"][2] == LIMIT


@needs_mjlab
def test_steps_equal_mjlab_auto_reset(runs):
    """Observations (actor and critic, after the reset), rewards, terminations and truncations equal those of mjlab's
    env with its own auto-reset: the resets made by the wrapper are mjlab's."""
    wrapper, auto, _ = runs
    torch.testing.assert_close(wrapper["first_obs"], auto["first_obs"]["actor"], rtol=0, atol=0)
    torch.testing.assert_close(wrapper["first_critic"], auto["first_obs"]["critic"], rtol=0, atol=0)
    for t in range(STEPS):
        reward, terminated, truncated, _ = wrapper["step"][t]
        torch.testing.assert_close(wrapper["obs"][t], auto["obs"][t]["actor"], rtol=0, atol=0)
        torch.testing.assert_close(wrapper["critic"][t], auto["obs"][t]["critic"], rtol=0, atol=0)
        torch.testing.assert_close(reward, auto["step"][t][0], rtol=0, atol=0)
        assert torch.equal(terminated, auto["step"][t][1]) and torch.equal(truncated, auto["step"][t][2])


@needs_mjlab
def test_final_observations_and_logs(runs):
    """info's final observations are the terminal ones mjlab returns with auto_reset=False (and the next observation
    where nothing ended); info["log"] is mjlab's episode log of the envs reset in that step."""
    wrapper, _, manual = runs
    for t in range(STEPS):
        _, terminated, truncated, info = wrapper["step"][t]
        done = terminated | truncated
        assert torch.equal(info["done"], done)
        torch.testing.assert_close(info["final_obs"], manual["final"][t]["actor"], rtol=0, atol=0)
        torch.testing.assert_close(info["final_critic_obs"], manual["final"][t]["critic"], rtol=0, atol=0)
        torch.testing.assert_close(info["final_obs"][~done], wrapper["obs"][t][~done], rtol=0, atol=0)
        if done.any():
            assert not torch.equal(info["final_obs"][done], wrapper["obs"][t][done])
        assert info["log"].keys() == manual["log"][t].keys()
        for key, value in manual["log"][t].items():
            torch.testing.assert_close(torch.as_tensor(info["log"][key]), torch.as_tensor(value), rtol=0, atol=0)
    assert any("Episode_Termination/cart_out" in step[3]["log"] for step in wrapper["step"])


@needs_mjlab
def test_episode_statistics(runs):
    """episode_return / episode_length: the sums of the rewards and steps since each env's last reset."""
    wrapper, _, _ = runs
    running = torch.zeros(NUM_ENVS)
    length = torch.zeros(NUM_ENVS, dtype=torch.int32)
    for reward, terminated, truncated, info in wrapper["step"]:
        running, length = running + reward, length + 1
        torch.testing.assert_close(info["episode_return"], running)
        assert torch.equal(info["episode_length"], length)
        done = terminated | truncated
        running, length = running.masked_fill(done, 0.0), length.masked_fill(done, 0)


@needs_mjlab
def test_actions_reach_mjlab_unclipped(runs):
    """mjlab's training clips no action (clip_actions None for Cartpole): the wrapper passes them as they are
    (the fixed actions reach +-4, beyond the actuator's control range)."""
    wrapper, _, _ = runs
    low, high, _ = wrapper["limits"]
    assert torch.isinf(low).all() and torch.isinf(high).all()
    # mjlab's reset zeroes the reset envs' last action: compared where the step ended no episode
    kept = torch.stack([~step[3]["done"] for step in wrapper["step"]])
    torch.testing.assert_close(torch.stack(wrapper["raw_actions"])[kept], fixed_actions()[kept], rtol=0, atol=0)


@needs_mjlab
def test_bad_tasks_one_line():
    from cleanrl_utils.envs.mjlab_env import task_problem

    tracking = task_problem("Mjlab-Tracking-Flat-Unitree-G1", "ppo_isaacgym.py")
    assert "motion clip that mjlab does not ship" in tracking and "\n" not in tracking
    unknown = task_problem("Mjlab-Cartpol-Balance", "ppo_isaacgym.py")
    assert "unknown mjlab task 'Mjlab-Cartpol-Balance' (did you mean Mjlab-Cartpole-Balance" in unknown
    assert "camera images" in task_problem("Mjlab-Lift-Cube-Yam-Depth", "ppo_isaacgym.py")
    assert task_problem("Mjlab-Velocity-Flat-Unitree-Go1", "ppo_isaacgym.py") is None


@pytest.mark.skipif(MJLAB, reason="checks the line of an environment without mjlab")
def test_without_mjlab_names_the_command():
    from cleanrl_utils.envs.mjlab_env import task_problem

    line = task_problem("Mjlab-Cartpole-Balance", "ppo_isaacgym.py")
    assert "uv run --project projects/mjlab python cleanrl/ppo_isaacgym.py --simulator mjlab" in line
