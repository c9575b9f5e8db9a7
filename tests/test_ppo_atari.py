"""ppo_atari.py: GAE over a NEXT_STEP-autoreset rollout against a plain loop, the networks, smoke runs on MinAtar and
Atari, bad input, SIGKILL + resume."""

from __future__ import annotations

import numpy as np
import ppo_atari
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

MINATAR_TINY = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "4", "--num-steps", "32"]
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
    TD errors up to the end of its training episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        value, reward, terminated, truncated, reset = stream[t]
        if reset:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]  # the observation after step k: the true final one after a game's end
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # One env, 12 steps: a life loss at 2 (cut, the game goes on), a game over at 5 (terminated), its autoreset step 6,
    # a time-limit cut at 9 (bootstrapped from the final observation at 10, the autoreset step), then more play.
    terminated = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    resets = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.choice([-1.0, 0.0, 1.0], size=13)
    gamma, gae_lambda = 0.9, 0.8
    num_steps = 12
    as_tensor = lambda x: torch.tensor(np.asarray(x[:num_steps], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_atari.compute_gae(
        as_tensor(rewards),
        as_tensor(values),
        torch.tensor(values[1:], dtype=torch.float64).unsqueeze(1),
        as_tensor(terminated),
        as_tensor(truncated),
        gamma,
        gae_lambda,
    )[:, 0].tolist()
    stream = list(zip(values, rewards, terminated, truncated, resets))
    expected = reference_advantages(stream, gamma, gae_lambda)
    for t in range(num_steps):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


@pytest.mark.parametrize("shape, hidden", [((4, 84, 84), 512), ((4, 10, 10), 128), ((6, 10, 10), 128)])
def test_agent_picks_the_network_from_the_observation_shape(shape, hidden):
    agent = ppo_atari.Agent(shape, 5, 255.0 if shape[-1] == 84 else 1.0)
    assert agent.actor.in_features == hidden
    obs = torch.randint(0, 2, (3,) + shape, dtype=torch.uint8)
    action, logprob, value = agent.act(obs)
    again, entropy, value_again = agent.evaluate_actions(obs, action)
    assert action.shape == (3,) and torch.allclose(logprob, again) and torch.allclose(value, value_again)
    assert (entropy > 0).all() and (entropy <= np.log(5) + 1e-6).all()


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "ppo_continuous_action.py"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--env-id", "Breakout-v4"], ["BreakoutNoFrameskip-v4"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
        (["--total-timesteps", "100"], ["less than one batch"]),
        (["--num-steps", "0"], ["--num-steps"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_atari.py", *flags, cwd=workdir), workdir, *fragments)


def test_minatar_smoke_writes_finite_scalars_and_evaluates_saved_model(workdir):
    flags = [*MINATAR_TINY, "--total-timesteps", "1024", "--save-model", "--eval-episodes", "2", "--capture-video"]
    result = run_script("ppo_atari.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 8 and len(scalars["eval/episodic_return"]) == 2
    assert list((run_dir / "videos").glob("*.mp4"))
    assert torch.load(run_dir / "ppo_atari.cleanrl_model", weights_only=False)["script"] == "ppo_atari"


def test_atari_smoke_trains_and_evaluates(workdir):
    flags = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
    flags += ["--total-timesteps", "128", "--save-model", "--eval-episodes", "1"]
    result = run_script("ppo_atari.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert_finite_keys(read_scalars(run_dirs(workdir)[0]), ["losses/value_loss", "eval/episodic_return"])


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(tmp_path):
    flags = [*MINATAR_TINY, "--total-timesteps", "1536", "--checkpoint-every", "512"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("ppo_atari.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    run_dir = kill_at_first_checkpoint("ppo_atari.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 512 and checkpoint["envs"] is not None
    resumed = run_script("ppo_atari.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(run_dirs(tmp_path / "straight")[0])
    for key in sorted(set(PPO_KEYS) - {"charts/SPS"}):
        assert resumed_scalars[key] == straight_scalars[key], key
