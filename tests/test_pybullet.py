"""PyBullet locomotion ids in the continuous-action scripts (the pybullet extra, Python <= 3.11): every script accepts
the four tasks by id, ppo_continuous_action trains on one and saves its model, and a checkpoint resumes with freshly
reset environments (PyBullet's simulator state does not pickle: its envs pickle as their constructor arguments)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import kill_at_first_checkpoint, read_scalars, run_script

pytest.importorskip("pybullet_envs_gymnasium")

import ddpg_continuous_action  # noqa: E402
import ppo_continuous_action  # noqa: E402
import redq_continuous_action as redq  # noqa: E402
import sac_continuous_action  # noqa: E402
import td3_continuous_action  # noqa: E402

IDS = ["HopperBulletEnv-v0", "HalfCheetahBulletEnv-v0", "AntBulletEnv-v0", "Walker2DBulletEnv-v0"]
SCRIPTS = [ppo_continuous_action, sac_continuous_action, td3_continuous_action, ddpg_continuous_action, redq]
TINY = ["--num-steps", "256", "--num-minibatches", "4", "--update-epochs", "1", "--torch-threads", "1"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda module: module.__name__)
def test_every_continuous_script_accepts_the_pybullet_ids(script):
    import tyro

    for env_id in IDS:
        script.validate(tyro.cli(script.Args, args=["--env-id", env_id]))  # exits 2 on an id it does not know
    envs = script.make_envs("HopperBulletEnv-v0", 2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 15) and envs.single_action_space.shape == (3,)
    envs.close()


def test_ppo_trains_on_hopper_bullet_saves_and_resumes_with_fresh_environments(workdir):
    from cleanrl_utils.checkpoint import snapshot_envs

    envs = ppo_continuous_action.make_envs("HopperBulletEnv-v0", 1)
    envs.reset(seed=0)
    assert snapshot_envs(envs) is None  # not saved: a resumed run says so and starts new episodes
    envs.close()
    flags = ["--env-id", "HopperBulletEnv-v0", *TINY, "--total-timesteps", "1024", "--checkpoint-every", "256"]
    flags += ["--save-model", "--eval-episodes", "1"]
    run_dir = kill_at_first_checkpoint("ppo_continuous_action.py", flags, workdir)
    resumed = run_script("ppo_continuous_action.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset" in resumed.stdout
    scalars = read_scalars(run_dir)
    assert len(scalars["charts/episodic_return"]) > 5 and len(scalars["eval/episodic_return"]) == 1
    assert max(step for step, _ in scalars["losses/value_loss"]) == 1024


def test_pybullet_ids_are_registered_by_the_package():
    import pybullet_envs_gymnasium  # noqa: F401

    assert all(env_id in gym.registry for env_id in IDS)
