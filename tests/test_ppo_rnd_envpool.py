"""ppo_rnd_envpool.py: the observation and reward normalisers against NumPy, GAE with two value heads (the intrinsic
return never cut) against a plain loop, smoke run, bad input, SIGKILL + resume with the normalisers restored."""

from __future__ import annotations

import numpy as np
import ppo_rnd_envpool
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

pytest.importorskip("envpool")

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
TINY += ["--num-iterations-obs-norm-init", "2"]
KEYS = [
    "charts/SPS",
    "charts/learning_rate",
    "charts/intrinsic_reward",
    "losses/value_loss",
    "losses/ext_value_loss",
    "losses/int_value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/fwd_loss",
    "losses/approx_kl",
    "losses/clipfrac",
]


def numpy_moments(batches, eps=1e-4):
    """Mean and variance of a prior (mean 0, variance 1, weight eps) pooled with all the data at once."""
    data = np.concatenate(batches).astype(np.float64)
    n, mean, var = len(data), data.mean(0), data.var(0)
    total = eps + n
    pooled_mean = n * mean / total
    pooled_var = (eps * 1.0 + n * var + mean**2 * eps * n / total) / total
    return pooled_mean, pooled_var, total


def test_running_mean_std_and_observation_normalisation_match_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (n, 6, 5)).astype(np.uint8) for n in (7, 1, 30)]
    rnd_model = ppo_rnd_envpool.RNDModel.__new__(ppo_rnd_envpool.RNDModel)
    torch.nn.Module.__init__(rnd_model)
    rnd_model.obs_rms = ppo_rnd_envpool.RunningMeanStd((6, 5))
    for batch in batches:
        rnd_model.obs_rms.update(torch.from_numpy(batch))
    mean, var, count = numpy_moments(batches)
    np.testing.assert_allclose(rnd_model.obs_rms.mean.numpy(), mean, rtol=1e-10)
    np.testing.assert_allclose(rnd_model.obs_rms.var.numpy(), var, rtol=1e-10)
    assert rnd_model.obs_rms.count.item() == pytest.approx(count)
    frames = np.zeros((3, 6, 5), np.uint8)
    frames[1] = 255
    frames[2] = batches[0][0]
    expected = np.clip((frames - mean) / np.sqrt(var), -5, 5)
    normalized = rnd_model.normalize(torch.from_numpy(frames))
    assert normalized.shape == (3, 1, 6, 5) and normalized.dtype == torch.float32
    np.testing.assert_allclose(normalized[:, 0].numpy(), expected, rtol=1e-6, atol=1e-6)
    rnd_model.obs_rms.var.fill_(1e-6)  # far-out frames are clipped to [-5, 5]
    assert normalized.abs().max() <= 5 and rnd_model.normalize(torch.from_numpy(frames)).abs().max() == 5


def test_reward_normaliser_divides_by_the_std_of_uncut_discounted_sums():
    rng = np.random.default_rng(1)
    gamma, num_envs = 0.9, 3
    rollouts = [rng.exponential(size=(4, num_envs)) for _ in range(3)]
    normalizer = ppo_rnd_envpool.RewardNormalizer(num_envs, gamma)
    outputs = [normalizer(torch.tensor(r)).numpy() for r in rollouts]
    # NumPy reference: per env, one discounted sum over the whole stream, never reset (episode ends do not exist here).
    running, sums = np.zeros(num_envs), []
    for k, rollout in enumerate(rollouts):
        for t in range(len(rollout)):
            running = running * gamma + rollout[t]
            sums.append(running.copy())
        _, var, _ = numpy_moments([np.concatenate(sums)])
        np.testing.assert_allclose(outputs[k], rollout / np.sqrt(var), rtol=1e-10)


def plain_gae(values, rewards, cuts, truncs, next_values, gamma, lam):
    """Per step: the (gamma * lambda)-discounted sum of TD errors up to the end of the episode (if any)."""
    n = len(rewards)
    out = []
    for t in range(n):
        total, discount = 0.0, 1.0
        for k in range(t, n):
            total += discount * (rewards[k] + (0.0 if cuts[k] else gamma * next_values[k]) - values[k])
            if cuts[k] or truncs[k]:
                break
            discount *= gamma * lam
        out.append(total)
    return out


def test_gae_with_two_value_heads_cuts_only_the_extrinsic_stream():
    # A life loss at 2, a game over at 5 (its autoreset step 6), a time-limit cut at 9 (its autoreset step 10).
    terminated = np.array([0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0], np.float64)
    truncated = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0], np.float64)
    rng = np.random.default_rng(2)
    ext_v, int_v = rng.normal(size=13), rng.normal(size=13)
    ext_r, int_r = rng.choice([-1.0, 0.0, 1.0], size=12), rng.exponential(size=12)
    column = lambda x: torch.tensor(x).unsqueeze(1)  # noqa: E731
    ext = ppo_rnd_envpool.compute_gae(
        column(ext_r), column(ext_v[:12]), column(ext_v[1:]), column(terminated), column(truncated), 0.999, 0.95
    )
    never = column(np.zeros(12))
    intr = ppo_rnd_envpool.compute_gae(column(int_r), column(int_v[:12]), column(int_v[1:]), never, never, 0.99, 0.95)
    expected_ext = plain_gae(ext_v[:12], ext_r, terminated, truncated, ext_v[1:], 0.999, 0.95)
    expected_int = plain_gae(int_v[:12], int_r, np.zeros(12), np.zeros(12), int_v[1:], 0.99, 0.95)
    keep = [t for t in range(12) if t not in (6, 10)]  # the autoreset steps leave the batch
    assert ppo_rnd_envpool.transition_indices(torch.tensor([t in (6, 10) for t in range(12)])).tolist() == keep
    np.testing.assert_allclose(ext[:, 0].numpy()[keep], np.array(expected_ext)[keep], atol=1e-12)
    np.testing.assert_allclose(intr[:, 0].numpy(), expected_int, atol=1e-12)
    # the intrinsic advantage at the game's last step still sees the next game; the extrinsic one does not
    assert intr[5, 0] != pytest.approx(int_r[5] + 0.99 * int_v[6] - int_v[5])
    assert ext[5, 0] == pytest.approx(ext_r[5] - ext_v[5])


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "BreakoutNoFrameskip-v4"], ["ale-py id", "--env-id Breakout-v5"]),
        (["--env-id", "MontezumaRevengeNoFrameskip-v4"], ["--env-id MontezumaRevenge-v5"]),
        (["--env-id", "BigfishEasy-v0"], ["Procgen", "cleanrl/ppo_procgen.py"]),
        (["--env-id", "HalfCheetah-v5"], ["continuous actions"]),
        (["--update-proportion", "0"], ["--update-proportion"]),
        (["--int-gamma", "1.5"], ["--int-gamma"]),
        (["--num-envs", "3", "--num-steps", "3", "--num-minibatches", "4"], ["does not divide"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_rnd_envpool.py", *flags, cwd=workdir), workdir, *fragments)


def test_sigkill_then_resume_restores_the_normalisers_and_continues_the_curve(tmp_path):
    flags = [*TINY, "--total-timesteps", "256", "--checkpoint-every", "128"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script(
        "ppo_rnd_envpool.py", *flags, "--save-model", "--eval-episodes", "1", cwd=tmp_path / "straight"
    )
    assert straight.returncode == 0, straight.stderr
    assert "mean intrinsic reward" in straight.stdout
    (straight_dir,) = run_dirs(tmp_path / "straight")
    straight_scalars = read_scalars(straight_dir)
    assert_finite_keys(straight_scalars, KEYS + ["eval/episodic_return"])
    model = torch.load(straight_dir / "ppo_rnd_envpool.cleanrl_model", weights_only=False)
    # 2 random-play rollouts initialise the normaliser, then 4 rollouts of 2 x 32 frames each
    assert model["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 6 * 64)
    assert model["rnd_model"]["obs_rms.mean"].abs().sum() > 0

    run_dir = kill_at_first_checkpoint("ppo_rnd_envpool.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 128 and checkpoint["envs"] is None
    assert checkpoint["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 4 * 64)
    assert checkpoint["reward_normalizer"]["rms.count"].item() == pytest.approx(1e-4 + 2 * 64)
    resume = ["--resume", str(run_dir / "checkpoint.pt"), "--save-model", "--eval-episodes", "1"]
    resumed = run_script("ppo_rnd_envpool.py", *flags, *resume, cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset" in resumed.stdout
    resumed_model = torch.load(run_dir / "ppo_rnd_envpool.cleanrl_model", weights_only=False)
    # the normalisers went on from the checkpoint (no second random-play initialisation)
    assert resumed_model["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 6 * 64)
    losses = read_scalars(run_dir)["losses/fwd_loss"]
    assert [step for step, _ in losses] == [64, 128, 192, 256]
    assert losses[:2] == straight_scalars["losses/fwd_loss"][:2]
