"""ppo_continuous_action.py: its own loop under tests/probe.py (storage against the stream, observation statistics, the
reward scaler, GAE with truncations, every minibatch's loss and gradient); smoke runs (Pendulum, Hopper, dm_control),
normalisation, reward scaling and GAE against plain references, frozen statistics in evaluation, bad input,
checkpoints and resume, learning."""

from __future__ import annotations

import math
from pathlib import Path

import continuous_reference as plain
import numpy as np
import ppo_continuous_action as pca
import pytest
import torch
from conftest import (
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    sigterm_while_training,
)
from update_reference import assert_gradients_match, gradients, leaves

SCRIPT = "ppo_continuous_action.py"
MODEL = "ppo_continuous_action.cleanrl_model"
TINY = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
LOSS_KEYS = [
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]
PPO_KEYS = ["charts/episodic_return", "charts/episodic_length", *LOSS_KEYS]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs x 32 steps, 2 iterations of 2 epochs of 2
# minibatches. The tests rebuild what the loop stored and computed from the copies: the stream of what the policy saw
# and the env returned (tests/continuous_reference.rollout_stream) against the rollout storage, the normalisation,
# the reward scaler, GAE and every minibatch's loss and gradient, with plain references that read the agent from its
# state dict. A small entropy bonus (--ent-coef 1e-3; CleanRL's default is 0) is on, so that its term is checked too.
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
PROBE_FLAGS += ["--update-epochs", "2", "--total-timesteps", "128", "--gamma", "0.9", "--gae-lambda", "0.8"]
PROBE_FLAGS += ["--ent-coef", "1e-3"]
PROBE_WATCH = ["next_obs", "obs_rms", "noise", "iteration"]
PROBE_WATCH += ["action", "next_obs_np", "reward", "terminated", "truncated", "infos"]
PROBE_AT_BACKWARD = ["mb", "agent", "batch", "storage", "rewards", "iteration", "epoch"]
NUM_STEPS, NUM_ENVS, GAMMA, GAE_LAMBDA, ENT_COEF = 32, 2, 0.9, 0.8, 1e-3
LOW, HIGH = np.array([-1.0, 0.0]), np.array([2.0, 5.0])


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("probe")
    final = ["action", "next_obs_np", "reward", "terminated", "truncated", "infos", "next_obs", "obs_rms"]
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS,
        cwd,
        watch=PROBE_WATCH,
        at_backward=PROBE_AT_BACKWARD,
        grads=["agent"],
        final=final,
        preload=["probe_box_envs"],
    )
    return trace, cwd


def rollouts(trace) -> list[tuple[list[dict], dict]]:
    """Per iteration: its steps of the stream and the first backward of its update (the rollout's agent, storage,
    scaled rewards and batch, before any gradient step)."""
    stream = plain.rollout_stream(trace, NUM_STEPS)
    firsts = [next(entry for entry in trace.backward if entry["iteration"] == i) for i in (1, 2)]
    return [([s for s in stream if s["iteration"] == i], first) for i, first in zip((1, 2), firsts)]


def test_storage_holds_the_observations_as_the_policy_saw_them_and_its_unclipped_samples(probed):
    trace, cwd = probed
    stream = plain.rollout_stream(trace, NUM_STEPS)
    assert len(stream) == 64
    for k, step in enumerate(stream[1:], 1):  # the statistics: every raw observation entered before normalising
        raw = np.asarray(stream[k - 1]["next_obs_np"], dtype=np.float64)
        expected = plain.merge_statistics(plain.rms_state(stream[k - 1]["obs_rms"]), raw)
        np.testing.assert_allclose(step["obs_rms"]["mean"].numpy(), expected["mean"], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(step["obs_rms"]["var"].numpy(), expected["var"], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(step["obs"].numpy(), plain.normalise(raw, expected, 10.0), rtol=1e-5, atol=1e-6)
    outside = 0
    for steps, first in rollouts(trace):
        storage = first["storage"]
        for step in steps:
            s, where = step["step"], f"iteration {step['iteration']} step {step['step']}"
            assert torch.equal(storage["obs"][s], step["obs"]), where
            assert torch.equal(storage["actions"][s], step["action"]), where  # as sampled, not clipped
            assert storage["rewards"][s].tolist() == np.float32(step["reward"]).tolist(), where  # raw
            assert storage["terminations"][s].tolist() == np.float32(step["terminated"]).tolist(), where
            assert storage["truncations"][s].tolist() == np.float32(step["truncated"]).tolist(), where
            # The action is a sample of the policy of the moment: mean + std * the rollout's noise.
            with torch.no_grad():
                mean, log_std = plain.gaussian_policy(first["agent"], step["obs"])
            torch.testing.assert_close(step["action"].double(), mean + log_std.exp() * step["noise"].double())
            outside += int(((step["action"].numpy() < LOW) | (step["action"].numpy() > HIGH)).sum())
    assert outside > 10, "the policy's samples should leave the bounds (they are clipped only for the env)"
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), PPO_KEYS)


def test_rewards_are_scaled_by_the_running_std_of_the_discounted_return_across_rollouts(probed):
    trace, _ = probed
    pairs = rollouts(trace)
    raw = [[np.asarray(step["reward"], dtype=np.float64).tolist() for step in steps] for steps, _ in pairs]
    dones = [
        [(np.asarray(step["terminated"]) | np.asarray(step["truncated"])).tolist() for step in steps]
        for steps, _ in pairs
    ]
    for expected, (_, first) in zip(reference_reward_scaling(raw, dones, GAMMA, 10.0), pairs):
        np.testing.assert_allclose(first["rewards"].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_gae_bootstraps_truncations_from_the_true_final_observation_and_cuts_terminations(probed):
    trace, _ = probed
    stream = plain.rollout_stream(trace, NUM_STEPS)
    ends = {"terminated": 0, "truncated": 0}
    for iteration, (steps, first) in enumerate(rollouts(trace)):
        agent, values, next_values = first["agent"], [], []
        with torch.no_grad():
            for step in steps:
                k = (step["iteration"] - 1) * NUM_STEPS + step["step"]
                following = stream[k + 1]["obs"] if k + 1 < len(stream) else trace.final["next_obs"]
                next_value = plain.state_value(agent, following)
                truncated = np.asarray(step["truncated"]) & ~np.asarray(step["terminated"])
                for env in np.flatnonzero(truncated):  # the true final observation, normalised when it arrived
                    stats = plain.rms_state(stream[k + 1]["obs_rms"] if k + 1 < len(stream) else trace.final["obs_rms"])
                    final_obs = torch.as_tensor(plain.normalise(step["infos"]["final_obs"][env], stats, 10.0))
                    next_value[env] = plain.state_value(agent, final_obs.float())
                values.append(plain.state_value(agent, step["obs"]).tolist())
                next_values.append(next_value.tolist())
                ends["terminated"] += int(np.sum(step["terminated"]))
                ends["truncated"] += int(truncated.sum())
        terminations = [np.asarray(step["terminated"], dtype=float).tolist() for step in steps]
        truncations = [np.asarray(step["truncated"], dtype=float).tolist() for step in steps]
        rewards = first["rewards"].double().tolist()
        advantages = np.array(reference_gae(rewards, values, next_values, terminations, truncations, GAMMA, GAE_LAMBDA))
        batch = first["batch"]
        where = f"iteration {iteration + 1}"
        np.testing.assert_allclose(
            batch["advantages"].numpy(), advantages.reshape(-1), rtol=1e-4, atol=1e-5, err_msg=where
        )
        np.testing.assert_allclose(batch["values"].numpy(), np.reshape(values, -1), rtol=1e-5, atol=1e-6, err_msg=where)
        np.testing.assert_allclose(batch["returns"].numpy(), (advantages + values).reshape(-1), rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            mean, log_std = plain.gaussian_policy(agent, batch["obs"])
            logprobs = torch.distributions.Normal(mean, log_std.exp()).log_prob(batch["actions"].double()).sum(-1)
        torch.testing.assert_close(batch["logprobs"].double(), logprobs, rtol=1e-5, atol=1e-5)
    assert min(ends.values()) >= 5, ends


def reference_ppo_loss(
    params: dict, mb: dict, clip_coef: float, vf_coef: float, ent_coef: float, clip_vloss: bool = True
) -> torch.Tensor:
    """PPO's loss of one minibatch (Schulman et al. 2017, weighted as CleanRL weighs it) from the agent's parameters
    `params` (float64 leaves): minus the clipped surrogate on the minibatch's advantages (as given), plus vf_coef times
    half the squared value error (clipped around the rollout's values, or not), minus ent_coef times the entropy of the
    Gaussian policy (its state-independent log std: sum(log std + log(2 pi e) / 2)). The rollout's log-probabilities,
    values and returns are constants."""
    mean, log_std = plain.gaussian_policy(params, mb["obs"])
    policy = torch.distributions.Normal(mean, log_std.exp())
    ratio = (policy.log_prob(mb["actions"].double()).sum(-1) - mb["logprobs"].double()).exp()
    advantages = mb["advantages"].double()
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages).mean()
    value, old_value, returns = plain.state_value(params, mb["obs"]), mb["values"].double(), mb["returns"].double()
    value_error = (value - returns) ** 2
    if clip_vloss:
        value_error = torch.maximum(
            value_error, (old_value + (value - old_value).clamp(-clip_coef, clip_coef) - returns) ** 2
        )
    entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum()
    return -surrogate + vf_coef * 0.5 * value_error.mean() - ent_coef * entropy


def test_each_minibatch_steps_on_the_clipped_ppo_loss_of_its_rows_with_normalised_advantages(probed):
    trace, _ = probed
    assert len(trace.backward) == 2 * 2 * 2  # iterations x epochs x minibatches
    for iteration in (1, 2):
        updates = [entry for entry in trace.backward if entry["iteration"] == iteration]
        batch = updates[0]["batch"]
        row_of = {
            tuple(obs.tolist()) + tuple(a.tolist()): i for i, (obs, a) in enumerate(zip(batch["obs"], batch["actions"]))
        }
        for epoch in (0, 1):
            minibatches = [entry for entry in updates if entry["epoch"] == epoch]
            rows = [
                [row_of[tuple(o.tolist()) + tuple(a.tolist())] for o, a in zip(e["mb"]["obs"], e["mb"]["actions"])]
                for e in minibatches
            ]
            assert sorted(sum(rows, [])) == list(range(NUM_STEPS * NUM_ENVS)), "an epoch's minibatches split the batch"
            for entry, indices in zip(minibatches, rows):
                mb, where = entry["mb"], f"iteration {iteration} epoch {epoch}"
                for field in ("logprobs", "returns", "values"):
                    assert torch.equal(mb[field], batch[field][indices]), where
                advantages = batch["advantages"][indices].double()
                normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                torch.testing.assert_close(mb["advantages"].double(), normalised, rtol=1e-5, atol=1e-6)
                params = leaves(entry["agent"])
                expected = reference_ppo_loss(params, mb, clip_coef=0.2, vf_coef=0.5, ent_coef=ENT_COEF)
                assert_gradients_match(entry["grads"]["agent"], gradients(expected, params), where)
                assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6), where


# --- smoke runs ----------------------------------------------------------------------------------


def test_smoke_pendulum_writes_finite_scalars_video_and_evaluates_saved_model(workdir):
    # 256 steps per env: one time-limit truncation each (Pendulum ends only by truncation).
    result = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *TINY,
        "--total-timesteps",
        "512",
        "--save-model",
        "--eval-episodes",
        "1",
        "--capture-video",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["charts/episodic_return"]) == 2
    assert all(length == 200 for _, length in scalars["charts/episodic_length"])
    assert len(scalars["eval/episodic_return"]) == 1
    assert (run_dir / MODEL).is_file() and (run_dir / "args.json").is_file()
    assert "512/512 steps" in result.stdout  # the progress display's final line
    assert list((run_dir / "videos").glob("*.mp4")), "no training video written"
    assert list((run_dir / "videos" / "eval").glob("*.mp4")), "no evaluation video written"


def test_smoke_dm_control_flattens_dict_observations(workdir):
    # cartpole-balance episodes last 1000 steps: none ends during training, so no episodic keys.
    # A tiny --target-kl stops every update after its first epoch; --ent-coef adds the entropy bonus.
    result = run_script(
        SCRIPT,
        "--env-id",
        "dm_control/cartpole-balance-v0",
        *TINY,
        "--total-timesteps",
        "256",
        "--target-kl",
        "1e-12",
        "--ent-coef",
        "0.01",
        "--save-model",
        "--eval-episodes",
        "1",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, LOSS_KEYS + ["eval/episodic_return"])
    assert "charts/episodic_return" not in scalars
    assert len(scalars["eval/episodic_return"]) == 1
    assert load(run_dir / MODEL)["obs_dim"] == 5  # position (3) + velocity (2)


# --- normalisation, reward scaling, GAE, the policy ------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_running_mean_std_matches_numpy_over_concatenated_batches(dtype):
    rng = np.random.default_rng(0)
    sizes = [1, 7, 1, 300, 2, 64]
    batches = [rng.normal(loc=3.0 * i, scale=1.0 + i, size=(n, 4)) for i, n in enumerate(sizes)]
    rms = pca.RunningMeanStd(4, epsilon=0.0)
    for i, batch in enumerate(batches):
        rms.update(torch.tensor(batch, dtype=dtype))
        seen = np.concatenate(batches[: i + 1])
        tolerance = 1e-5 if dtype == torch.float32 else 1e-12
        np.testing.assert_allclose(rms.mean.numpy(), seen.mean(0), rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(rms.var.numpy(), seen.var(0), rtol=tolerance, atol=tolerance)
        assert rms.count == len(seen)
    assert rms.mean.dtype == rms.var.dtype == torch.float64

    # With gymnasium's prior (count 1e-4, mean 0, variance 1) the result is the pooled statistics.
    prior = pca.RunningMeanStd(4)
    for batch in batches:
        prior.update(torch.tensor(batch, dtype=dtype))
    data = np.concatenate(batches)
    n, eps = len(data), 1e-4
    total = n + eps
    mean = data.sum(0) / total
    var = (eps * 1.0 + data.var(0) * n + data.mean(0) ** 2 * eps * n / total) / total
    np.testing.assert_allclose(prior.mean.numpy(), mean, rtol=1e-5)
    np.testing.assert_allclose(prior.var.numpy(), var, rtol=1e-5)


def test_normalize_clips_does_not_update_and_survives_a_state_dict_round_trip():
    rng = np.random.default_rng(1)
    rms = pca.RunningMeanStd(3)
    rms.update(torch.tensor(rng.normal(5.0, 2.0, size=(50, 3))))
    mean, var, count = rms.mean.clone(), rms.var.clone(), rms.count
    x = torch.tensor([[5.0, 5.0, 5.0], [1e6, -1e6, 7.0]], dtype=torch.float64)
    got = rms.normalize(x, 10.0)
    expected = np.clip((x.numpy() - mean.numpy()) / np.sqrt(var.numpy() + 1e-8), -10, 10)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)
    assert got[1, 0] == 10.0 and got[1, 1] == -10.0
    assert torch.equal(rms.mean, mean) and torch.equal(rms.var, var) and rms.count == count
    restored = pca.RunningMeanStd(3)
    restored.load_state_dict(rms.state_dict())
    assert torch.equal(restored.mean, mean) and torch.equal(restored.var, var) and restored.count == count
    assert torch.equal(restored.normalize(x, 10.0), got)


def reference_reward_scaling(rollouts, dones_list, gamma, clip, eps=1e-4):
    """Per-environment Python loops from the definition: G_t = r_t + gamma * G_{t-1}, restarted
    after an episode ends; the std of all returns so far (with gymnasium's prior) scales the
    rollout's rewards."""
    num_envs = len(rollouts[0][0])
    running = [0.0] * num_envs
    seen, scaled_rollouts = [], []
    for rewards, dones in zip(rollouts, dones_list):
        for t in range(len(rewards)):
            for env in range(num_envs):
                running[env] = rewards[t][env] + gamma * running[env]
                seen.append(running[env])
                if dones[t][env]:
                    running[env] = 0.0
        data = np.array(seen)
        n = len(data)
        total = n + eps
        var = (eps * 1.0 + data.var() * n + data.mean() ** 2 * eps * n / total) / total
        scaled_rollouts.append(np.clip(np.array(rewards) / np.sqrt(var + 1e-8), -clip, clip))
    return scaled_rollouts


def test_reward_scaler_matches_python_loop_across_rollouts_and_episode_ends():
    rng = np.random.default_rng(2)
    num_steps, num_envs, gamma, clip = 7, 3, 0.9, 2.5
    rollouts = [rng.normal(1.0, 1.0, size=(num_steps, num_envs)) for _ in range(3)]
    rollouts[1][2, 1] = 40.0  # an outlier that the clip must catch
    dones_list = [np.zeros((num_steps, num_envs)) for _ in range(3)]
    dones_list[0][2, 0] = 1  # an episode end in the middle
    dones_list[0][-1, 1] = 1  # at the end of a rollout: the next rollout starts afresh
    dones_list[1][0, 2] = dones_list[1][1, 2] = 1  # two one-step episodes in a row
    expected = reference_reward_scaling([r.tolist() for r in rollouts], [d.tolist() for d in dones_list], gamma, clip)
    scaler = pca.RewardScaler(num_envs, gamma, clip)
    for rewards, dones, want in zip(rollouts, dones_list, expected):
        got = scaler(torch.tensor(rewards, dtype=torch.float32), torch.tensor(dones, dtype=torch.float32))
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert (np.abs(expected[1]) == clip).any()
    assert scaler.return_rms.count == pytest.approx(3 * num_steps * num_envs + 1e-4)


def reference_gae(rewards, values, next_values, terminations, truncations, gamma, lam):
    """Plain per-environment Python loop over time, written from the definition."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    advantages = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        running = 0.0
        for t in reversed(range(num_steps)):
            if terminations[t][env]:
                running = rewards[t][env] - values[t][env]
            elif truncations[t][env]:
                running = rewards[t][env] + gamma * next_values[t][env] - values[t][env]
            else:
                delta = rewards[t][env] + gamma * next_values[t][env] - values[t][env]
                running = delta + gamma * lam * running
            advantages[t][env] = running
    return advantages


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_matches_python_loop_with_terminations_and_truncations(dtype):
    rng = np.random.default_rng(0)
    num_steps, num_envs = 9, 3
    rewards, values, next_values = (rng.normal(size=(num_steps, num_envs)) for _ in range(3))
    terminations = np.zeros((num_steps, num_envs))
    truncations = np.zeros((num_steps, num_envs))
    terminations[3, 0] = 1  # termination in the middle
    truncations[5, 1] = 1  # truncation in the middle
    terminations[-1, 2] = 1  # termination at the last step
    truncations[-1, 0] = 1  # truncation at the last step
    truncations[1, 2] = terminations[1, 2] = 1  # both at once counts as a termination
    expected = reference_gae(
        rewards.tolist(), values.tolist(), next_values.tolist(), terminations.tolist(), truncations.tolist(), 0.99, 0.95
    )
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    got = pca.compute_gae(t(rewards), t(values), t(next_values), t(terminations), t(truncations), 0.99, 0.95)
    assert got.dtype == dtype and got.shape == (num_steps, num_envs)
    np.testing.assert_allclose(got.numpy(), np.array(expected), rtol=1e-5, atol=1e-6)
    assert got[5, 1].item() == pytest.approx(rewards[5, 1] + 0.99 * next_values[5, 1] - values[5, 1], rel=1e-5)
    assert got[3, 0].item() == pytest.approx(rewards[3, 0] - values[3, 0], rel=1e-5)


def test_log_prob_entropy_and_sampling_match_a_diagonal_gaussian():
    torch.manual_seed(0)
    agent = pca.Agent(4, 2)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([-0.5, 0.3]))
        agent.actor_mean[-1].bias.copy_(torch.tensor([1.5, -2.0]))
        obs, actions = torch.randn(6, 4), torch.randn(6, 2)
        log_prob, value = agent.log_prob(obs, actions), agent.get_value(obs)
        normal = torch.distributions.Normal(agent.actor_mean(obs), agent.actor_logstd.exp())
        assert log_prob.shape == value.shape == (6,)
        torch.testing.assert_close(log_prob, normal.log_prob(actions).sum(-1))
        torch.testing.assert_close(value, agent.critic(obs)[:, 0])
        torch.testing.assert_close(agent.entropy(), normal.entropy().sum(-1)[0])
        # Samples of one state have the policy's mean and standard deviation.
        state = torch.zeros(50_000, 4)
        samples = agent.sample_action(state, torch.randn(50_000, 2))
        torch.testing.assert_close(samples.mean(0), agent.actor_mean(state[0]), atol=0.02, rtol=0)
        torch.testing.assert_close(samples.std(0), agent.actor_logstd.exp(), atol=0.02, rtol=0)


def test_batch_take_selects_the_same_rows_of_every_field():
    fields = [
        torch.arange(12.0).view(6, 2),
        torch.arange(6.0),
        torch.arange(6.0) * 10,
        *(torch.randn(6) for _ in range(3)),
    ]
    batch = pca.Batch(*fields)
    rows = torch.tensor([4, 0, 5])
    for taken, field in zip(batch.take(rows), fields):
        assert torch.equal(taken, field[rows])
    assert torch.equal(batch.take(slice(1, 3)).obs, fields[0][1:3]) and batch.take(rows).logprobs.tolist() == [
        40,
        0,
        50,
    ]


def test_evaluate_uses_the_saved_statistics_frozen(tmp_path, monkeypatch):
    from cleanrl_utils.checkpoint import save_model

    torch.manual_seed(3)
    args = pca.Args(env_id="Pendulum-v1", clip_obs=5.0)
    agent = pca.Agent(3, 1)
    obs_rms = pca.RunningMeanStd(3)
    obs_rms.update(torch.tensor([[0.5, -0.2, 3.0], [0.1, 0.9, -4.0], [-0.7, 0.3, 1.0]]))
    path = tmp_path / MODEL
    save_model(
        path,
        args,
        pca.__file__,
        agent=agent.state_dict(),
        obs_rms=obs_rms.state_dict(),
        return_rms=pca.RunningMeanStd(()).state_dict(),
        obs_dim=3,
        act_dim=1,
    )

    seen = []
    original_normalize = pca.RunningMeanStd.normalize

    def recording_normalize(self, x, clip):
        seen.append((self.mean.clone(), self.var.clone(), self.count, clip))
        return original_normalize(self, x, clip)

    def no_update(self, batch):
        raise AssertionError("evaluate() must not update the observation statistics")

    monkeypatch.setattr(pca.RunningMeanStd, "normalize", recording_normalize)
    monkeypatch.setattr(pca.RunningMeanStd, "update", no_update)
    returns = pca.evaluate(path, 1, torch.device("cpu"), seed=5)
    assert len(returns) == 1 and len(seen) == 200  # one Pendulum episode, every observation normalised
    for mean, var, count, clip in seen:
        assert torch.equal(mean, obs_rms.mean) and torch.equal(var, obs_rms.var) and count == obs_rms.count
        assert clip == 5.0
    assert pca.evaluate(path, 1, torch.device("cpu"), seed=5) == returns  # the mean action: deterministic


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "Hoper-v5"], ["unknown environment id", "Hopper-v5"]),
        (
            ["--env-id", "Pendulum-v1", "--num-minibatches", "3"],
            ["--num-minibatches 3 does not divide the batch of 2048"],
        ),
        (["--total-timesteps", "0"], ["--total-timesteps must be positive"]),
        (["--num-envs", "-2"], ["--num-envs must be positive"]),
        (["--update-epochs", "0"], ["--update-epochs must be positive"]),
        (["--clip-obs", "0"], ["--clip-obs must be positive"]),
        (["--gamma", "1.5"], ["--gamma must be in (0, 1]"]),
        (["--env-id", "Pendulum-v1", "--total-timesteps", "1000"], ["less than one batch"]),
        (["--env-id", "MountainCar-v0"], ["Discrete", "cleanrl/ppo.py"]),
    ],
)
def test_validate_rejects_bad_arguments_in_one_line(capsys, flags, fragments):
    # In-process (a subprocess per case costs seconds of imports); the end-to-end case below
    # checks that the script exits this way before making a run directory.
    import tyro

    args = tyro.cli(pca.Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        pca.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_resume_rejects_a_checkpoint_of_another_script(workdir):
    from cleanrl_utils.checkpoint import CHECKPOINT_FORMAT

    other = workdir / "other.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "script": "ppo", "env_id": "Hopper-v5", "args": {}}, other)
    assert_bad_input(
        run_script(SCRIPT, "--resume", str(other), cwd=workdir),
        workdir,
        "written by ppo.py, not ppo_continuous_action.py",
    )


# --- checkpoints, resume, determinism ------------------------------------------------------------


def episodic_returns(run_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(run_dir)["charts/episodic_return"]


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


HOPPER_FLAGS = [
    "--env-id",
    "Hopper-v5",
    *TINY,
    "--total-timesteps",
    "1024",
    "--checkpoint-every",
    "256",
    "--save-model",
    "--eval-episodes",
    "1",
]


@pytest.fixture(scope="module")
def hopper_run(tmp_path_factory) -> Path:
    """One uninterrupted Hopper-v5 run, shared by the smoke, same-seed and resume tests."""
    cwd = tmp_path_factory.mktemp("hopper")
    result = run_script(SCRIPT, *HOPPER_FLAGS, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    return run_dir


def test_smoke_hopper_writes_finite_scalars_and_evaluates_saved_model(hopper_run):
    scalars = read_scalars(hopper_run)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 1
    model = load(hopper_run / MODEL)
    assert (model["obs_dim"], model["act_dim"]) == (11, 3)
    assert model["obs_rms"]["_extra_state"]["count"] == pytest.approx(2 + 1024 + 1e-4)  # the resets, then every step
    # The last checkpoint was written after the last iteration: its statistics are the model's.
    final = load(hopper_run / "checkpoint.pt")
    assert final["global_step"] == 1024
    assert_same_tensors(final["obs_rms"], model["obs_rms"])
    return_rms = {
        key.removeprefix("return_rms."): value for key, value in final["reward_scaler"].items() if key != "carry"
    }
    assert_same_tensors(return_rms, model["return_rms"])


def test_same_seed_gives_identical_runs(hopper_run, tmp_path):
    result = run_script(SCRIPT, *HOPPER_FLAGS, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(tmp_path)
    scalars, reference = read_scalars(run_dir), read_scalars(hopper_run)
    for key in ("charts/episodic_return", "losses/value_loss", "losses/approx_kl", "eval/episodic_return"):
        assert scalars[key] == reference[key], key
    assert_same_tensors(load(run_dir / MODEL)["agent"], load(hopper_run / MODEL)["agent"])


def test_sigkill_then_resume_on_hopper_reproduces_the_uninterrupted_run(hopper_run, tmp_path):
    run_dir = kill_at_first_checkpoint(SCRIPT, HOPPER_FLAGS, tmp_path)
    assert not (run_dir / MODEL).exists()
    assert load(run_dir / "checkpoint.pt")["global_step"] < 1024

    resumed = run_script(SCRIPT, *HOPPER_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "could not be saved" not in resumed.stdout  # the MuJoCo simulators were restored
    assert run_dirs(tmp_path) == [run_dir], "resume must continue the same run directory"
    returns = episodic_returns(run_dir)
    assert len(returns) > 20 and returns == episodic_returns(hopper_run)
    # Every iteration updates before it logs, so every curve but the wall-clock SPS continues exactly.
    scalars, straight = read_scalars(run_dir), read_scalars(hopper_run)
    assert scalars.keys() == straight.keys()
    for key in sorted(set(straight) - {"charts/SPS", "perf/peak_memory_gb"}):
        assert scalars[key] == straight[key], key
    model, straight_model = load(run_dir / MODEL), load(hopper_run / MODEL)
    for key in ("agent", "obs_rms", "return_rms"):
        assert_same_tensors(model[key], straight_model[key])
    assert_same_tensors(
        load(run_dir / "checkpoint.pt")["reward_scaler"], load(hopper_run / "checkpoint.pt")["reward_scaler"]
    )


def test_sigterm_writes_checkpoint_and_exits_zero(workdir):
    out, run_dir = sigterm_while_training(
        SCRIPT, ["--env-id", "Pendulum-v1", *TINY, "--total-timesteps", "10000000"], workdir
    )
    checkpoint = load(run_dir / "checkpoint.pt")
    assert 0 < checkpoint["global_step"] < 10_000_000
    assert checkpoint["obs_rms"]["_extra_state"]["count"] == pytest.approx(checkpoint["global_step"] + 2 + 1e-4)
    assert math.isfinite(checkpoint["reward_scaler"]["return_rms.var"].item())
