"""pqn.py: smoke run, Q(lambda) returns against a plain loop, bad input, checkpoints and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pqn
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
PQN_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
]


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(workdir):
    flags = [*TINY, "--total-timesteps", "640", "--save-model", "--eval-episodes", "2"]
    result = run_script("pqn.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    assert len(scalars["losses/td_loss"]) == 10  # one log per iteration of 2 x 32 steps
    assert torch.load(run_dir / "pqn.cleanrl_model", weights_only=False)["script"] == "pqn"
    assert "640/640 steps" in result.stdout


# --- the maths -------------------------------------------------------------------------------


def reference_returns(rewards, next_max_q, terminations, truncations, gamma, q_lambda):
    """The recursion written out per environment and step, in plain Python floats."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    returns = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        for t in reversed(range(num_steps)):
            r, q = rewards[t][env], next_max_q[t][env]
            if terminations[t][env]:
                returns[t][env] = r  # no bootstrap at all
            elif truncations[t][env] or t == num_steps - 1:
                returns[t][env] = r + gamma * q  # bootstrap from the next (true final) observation only
            else:
                returns[t][env] = r + gamma * ((1 - q_lambda) * q + q_lambda * returns[t + 1][env])
    return returns


@pytest.mark.parametrize("q_lambda", [0.0, 0.65, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_q_lambda_returns_match_a_python_loop_across_terminations_and_truncations(q_lambda, dtype):
    gamma, num_steps, num_envs = 0.9, 7, 3
    generator = np.random.default_rng(0)
    rewards = generator.normal(size=(num_steps, num_envs)).tolist()
    next_max_q = generator.normal(2.0, 3.0, size=(num_steps, num_envs)).tolist()
    terminations = np.zeros((num_steps, num_envs))
    truncations = np.zeros((num_steps, num_envs))
    terminations[2, 0] = terminations[6, 1] = 1  # env 1 terminates on the last step
    truncations[4, 0] = truncations[1, 1] = 1
    terminations[3, 2] = truncations[3, 2] = 1  # both at once: the termination wins
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    got = pqn.q_lambda_returns(t(rewards), t(next_max_q), t(terminations), t(truncations), gamma, q_lambda)
    expected = reference_returns(rewards, next_max_q, terminations.tolist(), truncations.tolist(), gamma, q_lambda)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert got[2, 0].item() == pytest.approx(rewards[2][0])  # terminated: the reward alone
    assert got[4, 0].item() == pytest.approx(rewards[4][0] + gamma * next_max_q[4][0])  # truncated: bootstraps


def test_q_lambda_one_is_the_discounted_return_bootstrapped_at_the_end():
    gamma = 0.5
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    next_max_q = torch.tensor([[100.0], [200.0], [300.0], [8.0]])  # only the last one may count
    no_ends = torch.zeros_like(rewards)
    got = pqn.q_lambda_returns(rewards, next_max_q, no_ends, no_ends, gamma, 1.0)
    expected = [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4 + 0.0625 * 8, 2 + 0.5 * 3 + 0.25 * 4 + 0.125 * 8, 3 + 2 + 2, 4 + 4]
    assert got[:, 0].tolist() == pytest.approx(expected)


def test_q_lambda_zero_is_the_one_step_target():
    gamma = 0.99
    rewards = torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]])
    next_max_q = torch.tensor([[3.0, 4.0], [-5.0, 6.0], [7.0, -8.0]])
    terminations = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    truncations = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    got = pqn.q_lambda_returns(rewards, next_max_q, terminations, truncations, gamma, 0.0)
    torch.testing.assert_close(got, rewards + gamma * next_max_q * (1 - terminations))


def test_select_actions_is_greedy_at_zero_and_uniform_at_one():
    torch.manual_seed(0)
    q_network = pqn.QNetwork(4, 3)
    with torch.no_grad():
        q_network.network[-1].weight.zero_()
        q_network.network[-1].bias.copy_(torch.tensor([0.0, 1.0, -1.0]))  # action 1 is greedy everywhere
    obs = torch.randn(3000, 4)
    with torch.no_grad():
        assert (pqn.select_actions(q_network, obs, 0.0, 3) == 1).all()
        counts = torch.bincount(pqn.select_actions(q_network, obs, 1.0, 3), minlength=3) / 3000
    np.testing.assert_allclose(counts.numpy(), [1 / 3] * 3, atol=0.04)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "Pendulum-v1"], ["Discrete", "sac_continuous_action.py", "ppo_continuous_action.py"]),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], ["does not divide the batch of 15"]),
        (["--num-envs", "0"], ["--num-envs must be positive"]),
        (["--update-epochs", "-1"], ["--update-epochs must be positive"]),
        (["--total-timesteps", "100"], ["less than one batch of 512 steps"]),
        (["--q-lambda", "1.5"], ["--q-lambda in [0, 1]"]),
        (["--env-id", "CartPol-v1"], ["CartPole-v1"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("pqn.py", *flags, cwd=workdir), workdir, *fragments)


# --- checkpoints, resume and determinism -----------------------------------------------------


RESUME_FLAGS = [*TINY, "--total-timesteps", "1280", "--checkpoint-every", "640", "--save-model", "--eval-episodes", "1"]


def model_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "pqn.cleanrl_model", weights_only=False)["q_network"]


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(workdir, tmp_path_factory):
    straight_dir = tmp_path_factory.mktemp("straight")
    assert run_script("pqn.py", *RESUME_FLAGS, cwd=straight_dir).returncode == 0
    (straight_run,) = run_dirs(straight_dir)

    run_dir = kill_at_first_checkpoint("pqn.py", RESUME_FLAGS, workdir)
    assert not (run_dir / "pqn.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 640
    resumed = run_script("pqn.py", *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in ("charts/episodic_return", "losses/td_loss", "losses/q_values", "charts/epsilon"):
        assert resumed_scalars[key] == straight_scalars[key], key
    resumed_weights, straight_weights = model_weights(run_dir), model_weights(straight_run)
    assert resumed_weights.keys() == straight_weights.keys()
    for key in resumed_weights:
        assert torch.equal(resumed_weights[key], straight_weights[key]), key
