"""cleanrl/ppo_isaacgym.py with --simulator mjlab: the asymmetric actor-critic's wiring (the value network on mjlab's
critic observations, truncations bootstrapped from the critic's final observations), mjlab's episode logs, bad input,
and SIGKILL / --resume (fresh episodes, said once; everything else continues). mjlab lives in the uv project
projects/mjlab, so these tests run there (.ci/run does):

    uv run --project projects/mjlab pytest -q -p no:cacheprovider tests/test_ppo_isaacgym_mjlab.py

The main suite skips them, except the line a run without mjlab fails with. The probed run: the test task of
tests/probe_mjlab_tasks.py (Cartpole with a 12-step limit, a termination and a critic group of 7 against the actor's
5), 4 envs x 8 steps x 4 iterations.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, read_scalars, run_script

MJLAB = importlib.util.find_spec("mjlab") is not None
needs_mjlab = pytest.mark.skipif(
    not MJLAB,
    reason="mjlab is in projects/mjlab: uv run --project projects/mjlab pytest tests/test_ppo_isaacgym_mjlab.py",
)
SCRIPT = "ppo_isaacgym.py"
TASK, OBS_DIM, CRITIC_DIM = "Test-Mjlab-Cartpole-Falls", 5, 7
FLAGS = ["--simulator", "mjlab", "--env-id", TASK, "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "2"]
FLAGS += ["--update-epochs", "2", "--total-timesteps", "128", "--log-every", "1", "--no-cuda"]
AT_BACKWARD = ["batch", "agent", "value_obs", "final_value_obs", "obs", "rewards", "terminations", "truncations"]
AT_BACKWARD += ["next_value_obs", "iteration", "epoch", "first"]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("mjlab")
    flags = [*FLAGS, "--save-model", "--eval-episodes", "2"]
    trace = probe_script(SCRIPT, flags, cwd, at_backward=AT_BACKWARD, preload=["probe_mjlab_tasks"])
    (run_dir,) = sorted((cwd / "runs").iterdir())
    return trace, run_dir


def rollout_backwards(trace):
    """The first backward of each iteration: its agent is the one that collected the rollout and computed the values."""
    return [entry for entry in trace.backward if entry["epoch"] == 0 and entry["first"] == 0]


@needs_mjlab
def test_value_network_sees_the_critic_observations(probed):
    trace, _ = probed
    entries = rollout_backwards(trace)
    assert len(entries) == 4
    ended_some = 0
    for entry in entries:
        obs, value_obs, final_value_obs = entry["obs"], entry["value_obs"], entry["final_value_obs"]
        assert obs.shape == (8, 4, OBS_DIM) and value_obs.shape == (8, 4, CRITIC_DIM)
        batch = entry["batch"]
        torch.testing.assert_close(batch["value_obs"], value_obs.reshape(-1, CRITIC_DIM), rtol=0, atol=0)
        # where no episode ended, the final observation is the next step's (the critic's, both normalised alike)
        done = (entry["terminations"] + entry["truncations"]) > 0
        following = torch.cat([value_obs[1:], entry["next_value_obs"][None]])
        torch.testing.assert_close(final_value_obs[~done], following[~done], rtol=0, atol=0)
        ended_some += int(done.sum())
        assert not torch.equal(final_value_obs[done], following[done])
    assert ended_some > 0


@needs_mjlab
def test_values_and_returns_from_the_critic_observations(probed):
    """The stored values and returns, recomputed in float64 from the rollout's critic observations with the agent of
    that rollout: a truncation bootstraps from the critic's final observation, a termination from nothing."""
    import ppo_isaacgym as pig

    trace, _ = probed
    kinds = set()
    for entry in rollout_backwards(trace):
        agent = pig.Agent(OBS_DIM, 1, CRITIC_DIM).double()
        agent.load_state_dict(entry["agent"])
        value = lambda x: agent.get_value(x.double())  # noqa: E731
        with torch.no_grad():
            values = value(entry["value_obs"])
            following = torch.cat([values[1:], value(entry["next_value_obs"])[None]])
            final = value(entry["final_value_obs"])
        rewards, terminated, truncated = (entry[k].double() for k in ("rewards", "terminations", "truncations"))
        advantages, running = torch.zeros_like(rewards), torch.zeros(rewards.shape[1], dtype=torch.float64)
        for t in reversed(range(rewards.shape[0])):
            bootstrap = torch.where(truncated[t] > 0, final[t], following[t]) * (1 - terminated[t])
            delta = rewards[t] + 0.99 * bootstrap - values[t]
            running = delta + 0.99 * 0.95 * (1 - torch.maximum(terminated[t], truncated[t])) * running
            advantages[t] = running
        batch = entry["batch"]
        torch.testing.assert_close(batch["values"].double(), values.reshape(-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batch["returns"].double(), (advantages + values).reshape(-1), rtol=1e-5, atol=1e-5)
        kinds |= {"terminated"} if terminated.any() else set()
        kinds |= {"truncated"} if truncated.any() else set()
    assert kinds == {"terminated", "truncated"}


@needs_mjlab
def test_logs_model_and_evaluation(probed):
    trace, run_dir = probed
    assert trace.returncode == 0
    scalars = read_scalars(run_dir)
    keys = ["charts/episodic_return", "losses/value_loss", "eval/episodic_return"]
    keys += ["mjlab/Episode_Reward/smooth_reward", "mjlab/Episode_Termination/cart_out"]
    keys += ["mjlab/Episode_Termination/time_out"]
    assert_finite_keys(scalars, keys)
    model = torch.load(run_dir / "ppo_isaacgym.cleanrl_model", weights_only=False)
    assert (model["obs_dim"], model["critic_obs_dim"], model["simulator"]) == (OBS_DIM, CRITIC_DIM, "mjlab")
    assert model["agent"]["critic.0.weight"].shape == (256, CRITIC_DIM)
    assert model["agent"]["actor_mean.0.weight"].shape == (256, OBS_DIM)
    # the return of a whole episode of at most 12 steps of at most 0.05 each (mjlab scales rewards by dt)
    assert all(0 < value <= 12 * 0.05 + 1e-6 for _, value in scalars["charts/episodic_return"])


@needs_mjlab
def test_bad_mjlab_tasks_exit_before_any_work(workdir):
    bad = run_script(SCRIPT, "--simulator", "mjlab", "--env-id", "Mjlab-Cartpol-Balance", cwd=workdir)
    assert_bad_input(bad, workdir, "unknown mjlab task 'Mjlab-Cartpol-Balance' (did you mean Mjlab-Cartpole-Balance")
    bad = run_script(SCRIPT, "--simulator", "mjlab", "--env-id", "Mjlab-Tracking-Flat-Unitree-G1", cwd=workdir)
    assert_bad_input(bad, workdir, "tracks a motion clip that mjlab does not ship")


@pytest.mark.skipif(MJLAB, reason="checks the line of an environment without mjlab")
def test_without_mjlab_names_the_command(workdir):
    bad = run_script(SCRIPT, "--simulator", "mjlab", "--env-id", "Mjlab-Cartpole-Balance", cwd=workdir)
    assert_bad_input(bad, workdir, "uv run --project projects/mjlab python cleanrl/ppo_isaacgym.py --simulator mjlab")


@needs_mjlab
def test_sigkill_then_resume_says_so_and_continues_all_but_the_episodes(tmp_path):
    """mjlab's state cannot be saved: a resumed run says so once, starts fresh episodes and continues everything else
    (the steps, the optimiser, both observation statistics), in the same run directory. Mjlab-Cartpole-Balance
    itself: 4 envs x 8 steps x 4 iterations, a checkpoint after each."""
    from conftest import kill_at_first_checkpoint, run_dirs

    flags = ["--simulator", "mjlab", "--env-id", "Mjlab-Cartpole-Balance", "--num-envs", "4", "--num-steps", "8"]
    flags += ["--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "128", "--checkpoint-every", "32"]
    flags += ["--no-cuda"]
    run_dir = kill_at_first_checkpoint(SCRIPT, flags, tmp_path)
    killed = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert killed["envs"] is None and killed["global_step"] < 128
    resumed = run_script(SCRIPT, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line = "mjlab's state is not in the checkpoint: resuming with freshly reset environments"
    assert resumed.stdout.count(line) == 1, resumed.stdout
    assert run_dirs(tmp_path) == [run_dir]
    final = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    remaining = 128 - killed["global_step"]
    assert final["global_step"] == 128 and final["iteration"] == 4
    steps = [state["step"].item() for state in final["optimizer"]["state"].values()]
    killed_steps = [state["step"].item() for state in killed["optimizer"]["state"].values()]
    assert steps == [k + remaining // 32 * 2 for k in killed_steps]  # 2 minibatch steps per iteration
    for key in ("obs_rms", "critic_rms"):  # the fresh episodes' first observations, then every step's
        assert final[key]["count"].item() == pytest.approx(killed[key]["count"].item() + 4 + remaining), key
