"""ppo_procgen.py: GAE over a NEXT_STEP-autoreset rollout against a plain loop, the IMPALA CNN's shapes, the reward
scaler's statistics, a smoke run on StarpilotEasy-v0, SIGKILL + resume, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

pytest.importorskip("envpool")
import ppo_procgen  # noqa: E402

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
PPO_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
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


def reference_advantages(stream, gamma, gae_lambda):
    """Per env: walk the recorded steps; each real transition's advantage is the (gamma * lambda)-discounted sum of
    TD errors up to the end of its episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        if stream[t][4]:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]  # the observation after step k: the true final one after an episode's end
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # One env, 12 steps: an episode terminates at 3, its autoreset step 4, a time-limit cut at 8 (bootstrapped from the
    # final observation at 9, the autoreset step), then more play running past the rollout's end.
    terminated = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    resets = [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.normal(size=13)
    gamma, gae_lambda, num_steps = 0.9, 0.8, 12
    as_tensor = lambda x: torch.tensor(np.asarray(x[:num_steps], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_procgen.compute_gae(
        as_tensor(rewards),
        as_tensor(values),
        torch.tensor(values[1:], dtype=torch.float64).unsqueeze(1),
        as_tensor(terminated),
        as_tensor(truncated),
        gamma,
        gae_lambda,
    )[:, 0].tolist()
    expected = reference_advantages(list(zip(values, rewards, terminated, truncated, resets)), gamma, gae_lambda)
    assert sum(e is not None for e in expected) == 10
    for t in range(num_steps):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


def test_impala_cnn_shapes_and_agent_heads():
    network = ppo_procgen.impala_cnn((3, 64, 64))
    x = torch.zeros(2, 3, 64, 64)
    shapes = []
    for layer in network:
        x = layer(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes[:3] == [(16, 32, 32), (32, 16, 16), (32, 8, 8)] and shapes[-1] == (256,)
    assert network[5].in_features == 32 * 8 * 8
    agent = ppo_procgen.Agent((3, 64, 64), 15)
    obs = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8)
    action, logprob, value = agent.act(obs)
    again, entropy, value_again = agent.evaluate_actions(obs, action)
    assert action.shape == (3,) and torch.allclose(logprob, again) and torch.allclose(value, value_again)
    assert (entropy > 0).all() and (entropy <= np.log(15) + 1e-6).all()


def test_reward_scaler_tracks_the_discounted_return_and_skips_autoreset_steps():
    gamma = 0.9
    rewards = np.array([[1.0, 2.0], [0.0, 1.0], [3.0, 0.0], [0.0, 5.0], [2.0, 1.0]])
    ended = np.array([[0, 0], [1, 0], [0, 1], [0, 0], [0, 0]], dtype=bool)
    resets = np.array([[0, 0], [0, 0], [1, 0], [0, 1], [0, 0]], dtype=bool)
    rewards[resets] = 0.0  # an autoreset step's reward
    scaler = ppo_procgen.RewardScaler(2, gamma)
    seen, returns = [], np.zeros(2)
    for t in range(len(rewards)):
        scaled = scaler(rewards[t], ended[t], ~resets[t])
        returns = returns * gamma + rewards[t]
        seen += returns[~resets[t]].tolist()
        returns[ended[t]] = 0.0
        assert scaled == pytest.approx(np.clip(rewards[t] / np.sqrt(scaler.var + 1e-8), -10, 10))
    # The running statistics start from a count of 1e-4 (gymnasium's), so they match the plain ones closely.
    assert scaler.count == pytest.approx(len(seen) + 1e-4)
    assert scaler.mean == pytest.approx(np.mean(seen), rel=1e-4) and scaler.var == pytest.approx(np.var(seen), rel=1e-4)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "BreakoutNoFrameskip-v4"], ["Atari game", "cleanrl/ppo_atari.py"]),
        (["--env-id", "MinAtar/Breakout-v1"], ["cleanrl/ppo_atari.py"]),
        (["--env-id", "Starpilot-v0"], ["StarpilotEasy-v0"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_procgen.py", *flags, cwd=workdir), workdir, *fragments)


def test_starpilot_smoke_writes_finite_scalars_and_evaluates_saved_model(workdir):
    flags = [*TINY, "--num-envs", "4", "--total-timesteps", "256", "--save-model", "--eval-episodes", "2"]
    result = run_script("ppo_procgen.py", *flags, "--capture-video", cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 2 and len(scalars["eval/episodic_return"]) == 2
    assert list((run_dir / "videos").rglob("*.mp4"))
    model = torch.load(run_dir / "ppo_procgen.cleanrl_model", weights_only=False)
    assert model["script"] == "ppo_procgen" and model["reward_scaler"]["count"] > 1


def test_sigkill_then_resume_continues_the_curve_with_fresh_episodes(tmp_path):
    flags = [*TINY, "--num-steps", "16", "--total-timesteps", "256", "--checkpoint-every", "64"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("ppo_procgen.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    run_dir = kill_at_first_checkpoint("ppo_procgen.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 64 and checkpoint["reward_scaler"]["count"] > 1
    resumed = run_script("ppo_procgen.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with fresh episodes" in resumed.stdout
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(run_dirs(tmp_path / "straight")[0])
    for key in ["losses/value_loss", "losses/policy_loss", "losses/entropy"]:
        steps = [step for step, _ in resumed_scalars[key]]
        assert steps == list(range(32, 257, 32)), key  # one point per iteration, none lost or repeated
        # Up to the checkpoint the runs are the same run (seeded envpool, the CPU); afterwards the episodes differ.
        assert resumed_scalars[key][:2] == straight_scalars[key][:2], key
        assert resumed_scalars[key][2:] != straight_scalars[key][2:], key
