"""cleanrl/fast_td3_isaacgym.py with --simulator mjlab: the asymmetric critics' wiring (the replay buffer keeps mjlab's
critic observations beside the policy's, the true final ones at episode ends; the critics learn and judge on them,
normalised by statistics of their own, while the policy acts on its own), every critic and policy gradient against a
float64 reference, mjlab's episode logs, the saved model's evaluation, bad input and SIGKILL / --resume. mjlab lives in
the uv project projects/mjlab, so these tests run there (.ci/run does):

    uv run --project projects/mjlab pytest -q -p no:cacheprovider tests/test_fast_td3_mjlab.py

The main suite skips them, except the line a run without mjlab fails with. The probed run: the test task of
tests/probe_mjlab_tasks.py (Cartpole with a 12-step limit, a termination and a critic group of 7 against the actor's
5), 4 envs x 24 steps, learning after the 5th step.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, read_scalars, run_script
from test_fast_td3 import normalise, plain_actor, plain_critic_logits, projected_target, reference_critic_loss
from update_reference import assert_gradients_match, assert_unchanged, gradients, leaves

MJLAB = importlib.util.find_spec("mjlab") is not None
needs_mjlab = pytest.mark.skipif(
    not MJLAB,
    reason="mjlab is in projects/mjlab: uv run --project projects/mjlab pytest tests/test_fast_td3_mjlab.py",
)
SCRIPT = "fast_td3_isaacgym.py"
TASK, OBS_DIM, CRITIC_DIM, NUM_ENVS, STEPS = "Test-Mjlab-Cartpole-Falls", 5, 7, 4, 24
FLAGS = ["--simulator", "mjlab", "--env-id", TASK, "--num-envs", str(NUM_ENVS), "--buffer-size", "32"]
FLAGS += ["--batch-size", "16", "--learning-starts", "20", "--total-timesteps", str(NUM_ENVS * STEPS)]
FLAGS += ["--gamma", "0.9", "--critic-hidden", "32", "--actor-hidden", "16", "--num-atoms", "11", "--log-every", "16"]
FLAGS += ["--policy-noise", "0.2", "--std-max", "0.5", "--no-cuda"]
AT_BACKWARD = ["obs", "actions", "rewards", "discounts", "next_obs", "smoothing_noise", "qnet", "qnet_target", "actor"]
AT_BACKWARD += ["critic_obs", "next_critic_obs", "weights", "critic_updates", "critic_obs_normalizer", "obs_normalizer"]
SUPPORT = np.linspace(-10.0, 10.0, 11)  # the mjlab tasks' support (the authors' Isaac Lab preset)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("mjlab")
    flags = [*FLAGS, "--save-model", "--eval-episodes", "2"]
    trace = probe_script(
        SCRIPT,
        flags,
        cwd,
        watch=["raw_critic_obs", "info"],
        at_backward=AT_BACKWARD,
        grads=["qnet", "qnet_target", "actor"],
        final=["rb", "critic_obs_normalizer"],
        preload=["probe_mjlab_tasks"],
    )
    (run_dir,) = sorted((cwd / "runs").iterdir())
    return trace, run_dir


@needs_mjlab
def test_the_buffer_keeps_the_critics_observations_and_their_true_final_ones(probed):
    trace, _ = probed
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    rb = trace.final["rb"]
    assert len(steps) == STEPS and rb["size"] == STEPS
    assert rb["obs"].shape == (NUM_ENVS, STEPS, OBS_DIM) and rb["critic_obs"].shape == (NUM_ENVS, STEPS, CRITIC_DIM)
    ends = 0
    for t, step in enumerate(steps):
        info = step["info"]
        torch.testing.assert_close(rb["next_critic_obs"][:, t], info["final_critic_obs"], rtol=0, atol=0)
        # the critics' observation after a step (the reset one after an end) is the next row's
        if t + 1 < STEPS:
            assert torch.equal(rb["critic_obs"][:, t + 1], step["raw_critic_obs"]), f"step {t}"
        done = info["done"]
        same = torch.equal(rb["next_critic_obs"][:, t][~done], step["raw_critic_obs"][~done])
        assert same, f"step {t}: the final critic observation of a running episode is the next one"
        if done.any():
            assert not torch.equal(rb["next_critic_obs"][:, t][done], step["raw_critic_obs"][done])
            ends += int(done.sum())
    assert ends > 0
    # the critics' statistics hold every critic observation acted on (4 a step), and only those
    statistics = trace.final["critic_obs_normalizer"]
    assert statistics["count"].item() == NUM_ENVS * STEPS
    torch.testing.assert_close(statistics["mean"], rb["critic_obs"][:, :STEPS].double().reshape(-1, 7).mean(0))


def critic_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_critic"]


@needs_mjlab
def test_each_critic_update_learns_on_the_critic_observations(probed):
    trace, _ = probed
    rb, updates = trace.final["rb"], critic_entries(trace)
    assert len(updates) == 2 * (STEPS - 5)  # after the 5th step (20 steps of all envs), 2 a step
    for entry in updates:
        where = f"update {entry['critic_updates']}"
        assert entry["critic_obs"].shape == (16, CRITIC_DIM) and entry["next_obs"].shape == (16, OBS_DIM)
        # each row is a stored row's critic observation, normalised by the critics' statistics of the moment
        for i in range(16):
            env = i // 4
            (start,) = [t for t in range(STEPS) if torch.equal(rb["actions"][env, t], entry["actions"][i])]
            expected = normalise(entry["critic_obs_normalizer"], rb["critic_obs"][env, start])
            torch.testing.assert_close(entry["critic_obs"][i], expected, msg=where)
        target, _ = projected_target(entry, SUPPORT)  # the policy on next_obs, the target critics on next_critic_obs
        qnet = leaves(entry["qnet"])
        assert_gradients_match(
            entry["grads"]["qnet"], gradients(reference_critic_loss(entry, qnet, target), qnet), where
        )
        assert all(grad is None for grad in entry["grads"]["qnet_target"].values()), where


@needs_mjlab
def test_each_policy_update_acts_on_its_observations_and_is_judged_on_the_critics(probed):
    trace, _ = probed
    actors = [entry for entry in trace.backward if entry["where"] == "update_actor"]
    by_update = {entry["critic_updates"]: entry for entry in critic_entries(trace)}
    just_before = {entry["critic_updates"] + 1: entry for entry in critic_entries(trace)}
    rb = trace.final["rb"]
    assert len(actors) == STEPS - 5
    for entry in actors:
        where = f"policy update after critic update {entry['critic_updates']}"
        assert entry["obs"].shape == (16, OBS_DIM) and entry["critic_obs"].shape == (16, CRITIC_DIM)
        # the batch of the critic update just before it: its critic observations, and the stored rows' own observations
        batch = just_before[entry["critic_updates"]]
        assert torch.equal(entry["critic_obs"], batch["critic_obs"]), where
        for i in range(16):
            env = i // 4
            (start,) = [t for t in range(STEPS) if torch.equal(rb["actions"][env, t], batch["actions"][i])]
            torch.testing.assert_close(entry["obs"][i], normalise(entry["obs_normalizer"], rb["obs"][env, start]))
        actor = leaves(entry["actor"])
        actions = plain_actor(actor, entry["obs"])
        q = [
            (
                torch.softmax(plain_critic_logits(entry["qnet"], i, entry["critic_obs"], actions), -1)
                * torch.as_tensor(SUPPORT)
            ).sum(-1)
            for i in (0, 1)
        ]
        assert_gradients_match(entry["grads"]["actor"], gradients(-torch.minimum(*q).mean(), actor), where)
        if entry["critic_updates"] in by_update:  # the critics as the policy step found them and as it left them
            assert_unchanged(entry["qnet"], by_update[entry["critic_updates"]]["qnet"], where)


@needs_mjlab
def test_logs_model_and_evaluation(probed):
    trace, run_dir = probed
    assert trace.returncode == 0, trace.stdout[-2000:]
    scalars = read_scalars(run_dir)
    keys = ["charts/episodic_return", "losses/qf1_loss", "losses/actor_loss", "eval/episodic_return"]
    keys += ["mjlab/Episode_Reward/smooth_reward", "mjlab/Episode_Termination/cart_out"]
    assert_finite_keys(scalars, keys)
    model = torch.load(run_dir / "fast_td3_isaacgym.cleanrl_model", weights_only=False)
    assert (model["obs_dim"], model["simulator"]) == (OBS_DIM, "mjlab")
    assert model["actor"]["net.0.weight"].shape == (16, OBS_DIM)
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
    assert_bad_input(bad, workdir, "uv run --project projects/mjlab python cleanrl/fast_td3_isaacgym.py --simulator")


@needs_mjlab
def test_sigkill_then_resume_says_so_and_continues_all_but_the_episodes(tmp_path):
    """mjlab's state cannot be saved: a resumed run says so once, starts fresh episodes and continues everything else
    (the steps and updates, the replay buffer with its critic observations, both observation statistics), in the same
    run directory. Mjlab-Cartpole-Balance itself: 4 envs x 24 steps, a checkpoint every 12 steps."""
    from conftest import kill_at_first_checkpoint, run_dirs

    flags = [*FLAGS[:3], "Mjlab-Cartpole-Balance", *FLAGS[4:], "--checkpoint-every", "48"]
    run_dir = kill_at_first_checkpoint(SCRIPT, flags, tmp_path)
    killed = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert killed["envs"] is None and killed["global_step"] == 48
    resumed = run_script(SCRIPT, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line = "the simulator's state is not in the checkpoint: resuming with freshly reset environments"
    assert resumed.stdout.count(line) == 1, resumed.stdout
    assert run_dirs(tmp_path) == [run_dir]
    final = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert final["global_step"] == 96 and final["critic_updates"] == killed["critic_updates"] + 2 * 12
    rb, saved = final["replay_buffer"], killed["replay_buffer"]
    assert rb["size"] == STEPS and rb["critic_obs"].shape == (NUM_ENVS, STEPS, CRITIC_DIM - 2)  # Cartpole's own 5
    for name in ("obs", "critic_obs", "next_critic_obs", "actions"):  # the columns before the kill, kept
        assert torch.equal(rb[name][:, :12], saved[name]), name
    for key in ("obs_normalizer", "critic_obs_normalizer"):  # every observation acted on after the resume joins
        assert final[key]["count"].item() == killed[key]["count"].item() + NUM_ENVS * 12, key
