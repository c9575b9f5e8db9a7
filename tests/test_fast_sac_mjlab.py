"""cleanrl/fast_sac_isaacgym.py with --simulator mjlab: the asymmetric critics' wiring (the replay buffer keeps mjlab's
critic observations beside the policy's, the true final ones at episode ends; the critics learn and judge on them,
normalised by statistics of their own, while the policy samples on its own), every critic and policy gradient against
a float64 reference, mjlab's episode logs, the saved model's evaluation and bad input. mjlab lives in the uv project
projects/mjlab, so these tests run there (.ci/run does):

    uv run --project projects/mjlab pytest -q -p no:cacheprovider tests/test_fast_sac_mjlab.py

The main suite skips them, except the line a run without mjlab fails with. The probed run: the test task of
tests/probe_mjlab_tasks.py (Cartpole with a 12-step limit, a termination and a critic group of 7 against the actor's
5), 4 envs x 24 steps, learning after the 5th step, the support of tests/test_fast_sac.py's probe.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, read_scalars, run_script
from test_fast_sac import SUPPORT, normalise, plain_critic_logits, plain_policy, soft_targets
from update_reference import assert_gradients_match, assert_unchanged, gradients, leaves

MJLAB = importlib.util.find_spec("mjlab") is not None
needs_mjlab = pytest.mark.skipif(
    not MJLAB,
    reason="mjlab is in projects/mjlab: uv run --project projects/mjlab pytest tests/test_fast_sac_mjlab.py",
)
SCRIPT = "fast_sac_isaacgym.py"
TASK, OBS_DIM, CRITIC_DIM, NUM_ENVS, STEPS = "Test-Mjlab-Cartpole-Falls", 5, 7, 4, 24
FLAGS = ["--simulator", "mjlab", "--env-id", TASK, "--num-envs", str(NUM_ENVS), "--buffer-size", "32"]
FLAGS += ["--batch-size", "16", "--learning-starts", "20", "--total-timesteps", str(NUM_ENVS * STEPS)]
FLAGS += ["--gamma", "0.9", "--critic-hidden", "32", "--actor-hidden", "16", "--num-atoms", "11"]
FLAGS += ["--v-min", "-5", "--v-max", "5", "--num-updates", "2", "--policy-frequency", "2", "--n-steps", "3"]
FLAGS += ["--log-every", "16", "--no-cuda"]
AT_BACKWARD = ["obs", "actions", "rewards", "discounts", "next_obs", "next_noise", "noise", "weights", "qnet"]
AT_BACKWARD += ["qnet_target", "actor", "log_alpha", "critic_updates", "critic_obs", "next_critic_obs"]
AT_BACKWARD += ["critic_obs_normalizer", "obs_normalizer"]


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
        info, done = step["info"], step["info"]["done"]
        assert torch.equal(rb["next_critic_obs"][:, t], info["final_critic_obs"]), f"step {t}"
        if t + 1 < STEPS:  # the critics' observation after a step (the reset one after an end) is the next row's
            assert torch.equal(rb["critic_obs"][:, t + 1], step["raw_critic_obs"]), f"step {t}"
        assert torch.equal(rb["next_critic_obs"][:, t][~done], step["raw_critic_obs"][~done]), f"step {t}"
        if done.any():
            assert not torch.equal(rb["next_critic_obs"][:, t][done], step["raw_critic_obs"][done])
            ends += int(done.sum())
    assert ends > 0
    statistics = trace.final["critic_obs_normalizer"]  # every critic observation acted on (4 a step), only those
    assert statistics["count"].item() == NUM_ENVS * STEPS
    torch.testing.assert_close(statistics["mean"], rb["critic_obs"].double().reshape(-1, CRITIC_DIM).mean(0))


def entries(trace, where: str) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == where]


@needs_mjlab
def test_each_critic_update_learns_on_the_critic_observations(probed):
    trace, _ = probed
    rb, updates = trace.final["rb"], entries(trace, "update_critic")
    assert len(updates) == 2 * (STEPS - 5)  # after the 5th step (20 steps of all envs), 2 a step
    for entry in updates:
        where = f"update {entry['critic_updates']}"
        assert entry["critic_obs"].shape == (16, CRITIC_DIM) and entry["next_obs"].shape == (16, OBS_DIM)
        for i in range(16):  # each row a stored row's critic observation, normalised by the critics' statistics
            env = i // 4
            (start,) = [t for t in range(STEPS) if torch.equal(rb["actions"][env, t], entry["actions"][i])]
            expected = normalise(entry["critic_obs_normalizer"], rb["critic_obs"][env, start])
            torch.testing.assert_close(entry["critic_obs"][i], expected, msg=where)
        targets, _, _ = soft_targets(entry)  # the policy on next_obs, the target critics on next_critic_obs
        qnet, weights = leaves(entry["qnet"]), entry["weights"].double()
        logits = [plain_critic_logits(qnet, i, entry["critic_obs"], entry["actions"]) for i in (0, 1)]
        loss = sum(
            (-(targets[i] * torch.log_softmax(logits[i], -1)).sum(-1) * weights).sum() / weights.sum() for i in (0, 1)
        )
        assert_gradients_match(entry["grads"]["qnet"], gradients(loss, qnet), where)
        assert all(grad is None for grad in entry["grads"]["qnet_target"].values()), where


@needs_mjlab
def test_each_policy_update_samples_on_its_observations_and_is_judged_on_the_critics(probed):
    trace, _ = probed
    actors = entries(trace, "update_actor")
    by_update = {entry["critic_updates"]: entry for entry in entries(trace, "update_critic")}
    just_before = {entry["critic_updates"] + 1: entry for entry in entries(trace, "update_critic")}
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
        actions, log_probs = plain_policy(actor, entry["obs"], entry["noise"])
        support = torch.as_tensor(SUPPORT)
        q = [
            (torch.softmax(plain_critic_logits(entry["qnet"], i, entry["critic_obs"], actions), -1) * support).sum(-1)
            for i in (0, 1)
        ]
        loss = (entry["log_alpha"].double().exp() * log_probs - (q[0] + q[1]) / 2).mean()
        assert_gradients_match(entry["grads"]["actor"], gradients(loss, actor), where)
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
    model = torch.load(run_dir / "fast_sac_isaacgym.cleanrl_model", weights_only=False)
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
    assert_bad_input(bad, workdir, "uv run --project projects/mjlab python cleanrl/fast_sac_isaacgym.py --simulator")
