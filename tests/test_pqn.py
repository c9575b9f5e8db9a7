"""pqn.py: Q(lambda) returns against a plain loop; the script's own loop (rollouts, returns, every loss and its
gradient against a float64 reference loss's with the returns held constant, schedules) on ProbeWalk, which is the smoke
run too; bad input, checkpoints and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pqn
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients, leaves

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


# --- the loop's own wiring -------------------------------------------------------------------
# The script runs unchanged under tests/probe.py, which copies what its loop saw at every step and what every loss was
# computed from; the tests rebuild the rollouts, the Q(lambda) returns and the losses from those copies. The run is on
# tests/probe_envs.py's ProbeWalk-v0, whose episodes end every few steps, by termination and by time-limit truncation
# (which bootstraps from the true final observation), and it is the smoke run too: its model is saved and evaluated.
LOOP_FLAGS = ["--env-id", "ProbeWalk-v0", *TINY, "--gamma", "0.9", "--q-lambda", "0.7", "--exploration-fraction", "0.4"]
LOOP_FLAGS += ["--end-e", "0.3", "--total-timesteps", "640", "--save-model", "--eval-episodes", "2"]
STEP_NAMES = ["next_obs", "action", "reward", "terminated", "truncated", "infos", "epsilon"]
BATCH_NAMES = ["b_obs", "b_actions", "b_returns", "mb_inds", "q_network", "next_obs"]
BATCH_NAMES += ["action", "reward", "infos"]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    names = dict(watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=["q_network"], preload=["probe_envs"])
    trace = probe_script("pqn.py", LOOP_FLAGS, cwd, **names)
    return trace, cwd


def rollouts(trace, num_envs: int = 2, num_steps: int = 32) -> list[dict]:
    """Per iteration, what its loop saw: the observations acted on, the actions, what the env returned, epsilon, and
    the observation after the rollout. A watched entry is taken right after the step counter moves, before the env is
    stepped: the env's answer to a step shows in the next entry. A rollout's last answer shows at its first backward,
    where `terminated` and `truncated` name the rollout's stored flags instead: there the episode ends are read from
    the true final observations (ProbeWalk: position at +-3, terminated; 8 steps taken, truncated)."""
    entries = [entry for entry in trace.steps if entry["step"] > 0]
    updates = {}
    for update in trace.backward:
        updates.setdefault(update["step"], []).append(update)
    found = []
    for i, step in enumerate(sorted(updates)):
        acted = entries[i * num_steps : (i + 1) * num_steps]
        assert [entry["step"] for entry in acted] == [step - (num_steps - t - 1) * num_envs for t in range(num_steps)]
        answers = entries[i * num_steps + 1 : (i + 1) * num_steps]
        last = updates[step][0]
        ended = last["infos"].get("_final_obs", np.zeros(num_envs, dtype=bool))
        final_obs = [last["infos"]["final_obs"][env] if ended[env] else np.zeros(3) for env in range(num_envs)]
        last_answer = dict(
            terminated=np.array([abs(obs[0]) >= 3 for obs in final_obs]) & ended,
            truncated=np.array([obs[1] == 1.0 for obs in final_obs]) & ended,
        )
        answers.append(last_answer | {name: last[name] for name in ("action", "reward", "infos")})
        found.append(
            dict(
                obs=torch.stack([entry["next_obs"] for entry in acted]),
                epsilon=[entry["epsilon"] for entry in acted],
                actions=torch.stack([answer["action"] for answer in answers]),
                rewards=np.stack([answer["reward"] for answer in answers]),
                terminated=np.stack([answer["terminated"] for answer in answers]),
                truncated=np.stack([answer["truncated"] for answer in answers]),
                infos=[answer["infos"] for answer in answers],
                after=last["next_obs"],
                updates=updates[step],
                step=step,
            )
        )
    return found


def reference_rollout_returns(rollout: dict, q_network, gamma: float, q_lambda: float) -> np.ndarray:
    """Q(lambda) returns written out per env and step, bootstrapping from max Q of the observation that followed each
    step: the next one acted on, the true final one where the time limit cut the episode, none after a termination."""
    obs, rewards, terminated, truncated = (
        rollout["obs"],
        rollout["rewards"],
        rollout["terminated"],
        rollout["truncated"],
    )
    num_steps, num_envs = rewards.shape
    returns = np.zeros((num_steps, num_envs))
    for env in range(num_envs):
        for t in reversed(range(num_steps)):
            if terminated[t, env]:
                returns[t, env] = rewards[t, env]
                continue
            if truncated[t, env]:
                following = torch.as_tensor(rollout["infos"][t]["final_obs"][env], dtype=torch.float32)
            else:
                following = obs[t + 1, env] if t + 1 < num_steps else rollout["after"][env]
            with torch.no_grad():
                next_max_q = q_network(following.view(1, -1)).max().item()
            if truncated[t, env] or t == num_steps - 1:
                returns[t, env] = rewards[t, env] + gamma * next_max_q
            else:
                mixed = (1 - q_lambda) * next_max_q + q_lambda * returns[t + 1, env]
                returns[t, env] = rewards[t, env] + gamma * mixed
    return returns


def layer_norm_q(params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Q-values from a QNetwork's weights: Linear-LayerNorm-ReLU of 120, then of 84 units, then a linear head."""
    h = F.linear(obs, params["network.0.weight"], params["network.0.bias"])
    h = F.relu(F.layer_norm(h, (120,), params["network.1.weight"], params["network.1.bias"], eps=1e-5))
    h = F.linear(h, params["network.3.weight"], params["network.3.bias"])
    h = F.relu(F.layer_norm(h, (84,), params["network.4.weight"], params["network.4.bias"], eps=1e-5))
    return F.linear(h, params["network.6.weight"], params["network.6.bias"])


def test_loop_regresses_q_on_the_q_lambda_returns_of_its_own_rollout_with_the_full_squared_error(loop):
    trace, _ = loop
    found = rollouts(trace)
    assert len(found) == 10
    q_network = pqn.QNetwork(3, 3)
    ends = {"terminated": 0, "truncated": 0, "cut mid-rollout": 0}
    for rollout in found:
        first = rollout["updates"][0]
        assert len(rollout["updates"]) == 2 * 2  # 2 epochs of 2 minibatches
        # The batch is the rollout, step-major, as the loop acted on it.
        torch.testing.assert_close(first["b_obs"], rollout["obs"].reshape(-1, 3))
        assert first["b_actions"].tolist() == rollout["actions"].reshape(-1).tolist()
        # The returns, computed before any update of this iteration: with the network the first update found.
        q_network.load_state_dict(first["q_network"])
        expected = reference_rollout_returns(rollout, q_network, 0.9, 0.7)
        np.testing.assert_allclose(first["b_returns"].numpy(), expected.reshape(-1), rtol=1e-5, atol=1e-5)
        # Every minibatch's loss: the mean squared error (CleanRL's F.mse_loss, no factor 1/2) of Q(s, a) against
        # those returns, with the network as that update found it.
        # Its gradient: that of the same loss in float64, the returns held constant (PQN has no target network: they
        # come from the online network as the iteration began, and no gradient may flow through them).
        for k, update in enumerate(rollout["updates"]):
            rows, where = update["mb_inds"], f"iteration ending at step {rollout['step']}, minibatch {k}"
            assert sorted(rows.tolist()) != list(range(64)) and len(set(rows.tolist())) == 32
            online = leaves(update["q_network"])
            q_all = layer_norm_q(online, rollout["obs"].reshape(-1, 3)[rows].double())
            q_taken = q_all[torch.arange(32), first["b_actions"][rows]]
            target = torch.from_numpy(expected.reshape(-1)[rows.numpy()])
            loss = ((q_taken - target) ** 2).mean()
            assert_gradients_match(update["grads"]["q_network"], gradients(loss, online), where)
            assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        ends["terminated"] += int(rollout["terminated"].sum())
        ends["truncated"] += int((rollout["truncated"] & ~rollout["terminated"]).sum())
        ends["cut mid-rollout"] += int((rollout["terminated"] | rollout["truncated"])[:-1].sum())
    assert min(ends.values()) >= 5, ends  # the cuts and bootstraps above were exercised, several times


def test_epsilon_and_the_learning_rate_follow_their_schedules(loop):
    trace, cwd = loop
    found = rollouts(trace)
    for rollout in found:
        for t, epsilon in enumerate(rollout["epsilon"]):
            acted_at = rollout["step"] - (32 - t) * 2  # epsilon is computed before the step is counted
            assert epsilon == pytest.approx(max(1 + (0.3 - 1) * acted_at / (0.4 * 640), 0.3))
    assert found[-1]["epsilon"][-1] == 0.3
    learning_rates = [value for _, value in read_scalars(run_dirs(cwd)[0])["charts/learning_rate"]]
    assert learning_rates == pytest.approx([2.5e-4 * (1 - i / 10) for i in range(10)])  # annealed towards 0


def test_smoke_logs_finite_scalars_and_evaluates_saved_model(loop):
    trace, cwd = loop
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    assert len(scalars["losses/td_loss"]) == 10  # one log per iteration of 2 x 32 steps
    assert torch.load(run_dir / "pqn.cleanrl_model", weights_only=False)["script"] == "pqn"
    assert "640/640 steps" in trace.stdout
