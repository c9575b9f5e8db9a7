"""ppo_action_mask.py: the masked distribution against a plain categorical over the valid actions only
(log-probabilities, entropy, no gradient into masked logits, sampling); the script's own loop under tests/probe.py on
Taxi-v4 (every stored mask is the environment's for the stored observation, every action taken valid, every update's
gradient that of a float64 masked PPO loss with the rollout's masks); --no-mask-actions samples invalid actions;
SIGKILL + exact resume with the saved model's evaluation; bad input."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import ppo_action_mask as pam
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients

SCRIPT = "ppo_action_mask.py"
PPO_KEYS = ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl", "charts/episodic_return"]


def plain_masked(logits: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The categorical over the valid actions alone, row by row: softmax of their logits; (log-probabilities with
    -inf at invalid actions, entropy over the valid ones)."""
    log_probs = torch.full_like(logits, -torch.inf)
    entropies = []
    for i in range(len(logits)):
        valid = masks[i].nonzero().squeeze(-1)
        row = torch.log_softmax(logits[i, valid], dim=-1)
        log_probs[i, valid] = row
        entropies.append(-(row.exp() * row).sum())
    return log_probs, torch.stack(entropies)


def random_masks(generator, rows: int, n_actions: int) -> torch.Tensor:
    masks = torch.rand(rows, n_actions, generator=generator) < 0.5
    masks[torch.arange(rows), torch.randint(n_actions, (rows,), generator=generator)] = True  # one valid at least
    return masks


def test_log_probabilities_and_entropy_are_those_of_the_valid_actions_alone_and_masked_logits_learn_nothing():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    agent = pam.Agent(5, 6).double()
    torch.nn.init.normal_(agent.actor[-1].weight, std=1.0)  # logits far from uniform
    obs, masks = torch.randn(40, 5, generator=generator, dtype=torch.float64), random_masks(generator, 40, 6)
    expected_log_probs, expected_entropy = plain_masked(agent.actor(obs), masks)
    for action in range(6):
        actions = torch.full((40,), action)
        valid = masks[:, action]
        log_prob, entropy = agent.log_prob_and_entropy(obs, actions, masks)
        torch.testing.assert_close(log_prob[valid], expected_log_probs[valid, action])
        assert (log_prob[~valid] < -1e30).all()  # probability 0 for an invalid action
        torch.testing.assert_close(entropy, expected_entropy)
    logits = agent.actor(obs).detach().requires_grad_(True)
    masked = logits.masked_fill(~masks, torch.finfo(logits.dtype).min)
    log_probs = torch.log_softmax(masked, -1)
    (log_probs.gather(-1, masks.float().argmax(-1, keepdim=True)).sum()).backward()
    assert (logits.grad[~masks] == 0).all()  # what is masked gets no gradient


def test_sampling_follows_the_masked_distribution_and_never_picks_an_invalid_action():
    torch.manual_seed(1)
    agent = pam.Agent(3, 6)
    torch.nn.init.normal_(agent.actor[-1].weight, std=1.0)
    obs = torch.randn(1, 3).expand(20000, 3)
    masks = torch.tensor([[True, False, True, True, False, True]]).expand(20000, 6)
    with torch.no_grad():
        actions = agent.sample_action(obs, masks)
        probs = plain_masked(agent.actor(obs[:1]).double(), masks[:1])[0].exp()[0]
    counts = torch.bincount(actions, minlength=6).double() / 20000
    assert counts[~masks[0]].sum() == 0
    torch.testing.assert_close(counts, probs, atol=0.015, rtol=0)


# --- the loop's own wiring ------------------------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on Taxi-v4 (a Discrete state, one-hot), 2 envs x 32 steps x 2
# iterations, 2 epochs of 2 minibatches; a large learning rate so that the policy moves between minibatches.
NUM_ENVS, NUM_STEPS, ITERATIONS, MINIBATCH, N_ACTIONS, N_STATES = 2, 32, 2, 32, 6, 500
LOOP_FLAGS = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
LOOP_FLAGS += ["--total-timesteps", "128", "--learning-rate", "0.01"]
STEP_NAMES = ["next_obs", "next_masks", "action", "iteration"]
BACKWARD_NAMES = ["mb", "agent", "batch", "iteration"]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    trace = probe_script(SCRIPT, LOOP_FLAGS, cwd, watch=STEP_NAMES, at_backward=BACKWARD_NAMES, grads=["agent"])
    return trace, cwd


def taxi_masks(obs: torch.Tensor) -> torch.Tensor:
    """The environment's own masks of one-hot Taxi observations (Taxi's action_mask(state))."""
    taxi = gym.make("Taxi-v4").unwrapped
    return torch.as_tensor(np.stack([taxi.action_mask(int(state)) for state in obs.argmax(-1)]), dtype=torch.bool)


def test_the_rollout_stores_each_observations_own_mask_and_acts_only_validly(loop):
    trace, cwd = loop
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), PPO_KEYS[:-1])
    for update in trace.backward[:: 2 * 2]:  # each iteration's first minibatch carries its whole batch
        batch = update["batch"]
        assert batch["obs"].shape == (NUM_ENVS * NUM_STEPS, N_STATES)
        assert torch.equal(batch["masks"], taxi_masks(batch["obs"]))
        assert batch["masks"].gather(-1, batch["actions"][:, None]).all(), "an invalid action was taken"
        assert (~batch["masks"]).any(dim=-1).float().mean() > 0.5  # most states forbid something: masking matters


def reference_masked_ppo_loss(agent, mb: dict, clip=0.2, ent_coef=0.01, vf_coef=0.5) -> torch.Tensor:
    """ppo.py's clipped loss (normalised advantages, clipped value loss, entropy bonus), each row's distribution the
    categorical over its valid actions alone (plain_masked), under the mask the rollout stored."""
    log_probs, entropy = plain_masked(agent.actor(mb["obs"]), mb["masks"])
    new_log_prob = log_probs.gather(-1, mb["actions"][:, None]).squeeze(-1)
    new_value = agent.critic(mb["obs"]).squeeze(-1)
    ratio = torch.exp(new_log_prob - mb["logprobs"])
    advantages = (mb["advantages"] - mb["advantages"].mean()) / (mb["advantages"].std() + 1e-8)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
    value_clipped = mb["values"] + (new_value - mb["values"]).clamp(-clip, clip)
    value_loss = 0.5 * torch.max((new_value - mb["returns"]) ** 2, (value_clipped - mb["returns"]) ** 2).mean()
    return -surrogate + vf_coef * value_loss - ent_coef * entropy.mean()


def test_every_gradient_step_is_that_of_the_masked_ppo_loss_under_the_rollouts_masks(loop):
    trace, _ = loop
    assert len(trace.backward) == ITERATIONS * 2 * 2
    for k, update in enumerate(trace.backward):
        mb = {key: value.double() if value.is_floating_point() else value for key, value in update["mb"].items()}
        agent = pam.Agent(N_STATES, N_ACTIONS).double()
        agent.load_state_dict(update["agent"])
        loss = reference_masked_ppo_loss(agent, mb)
        assert_gradients_match(update["grads"]["agent"], gradients(loss, dict(agent.named_parameters())), f"update {k}")
        assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-6), f"update {k}"


def test_without_masking_the_policy_samples_invalid_actions(workdir):
    from probe import probe_script

    flags = [*LOOP_FLAGS[:-4], "--total-timesteps", "64", "--no-mask-actions"]
    trace = probe_script(SCRIPT, flags, workdir, at_backward=["batch"])
    batch = trace.backward[0]["batch"]
    assert batch["masks"].all()  # nothing masked
    assert not taxi_masks(batch["obs"]).gather(-1, batch["actions"][:, None]).all(), "no invalid action sampled"


# --- runs -------------------------------------------------------------------------------------------------------------
RESUME_FLAGS = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"]
RESUME_FLAGS += ["--total-timesteps", "768", "--checkpoint-every", "256", "--save-model", "--eval-episodes", "1"]


def saved_weights(run_dir) -> dict:
    return torch.load(run_dir / "ppo_action_mask.cleanrl_model", weights_only=False)["agent"]


def test_sigkill_then_resume_reproduces_the_uninterrupted_run_and_evaluates_the_saved_model(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr
    assert "evaluation over 1 episodes" in result.stdout
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir]
    (straight_dir,) = run_dirs(straight)
    a, b = read_scalars(straight_dir), read_scalars(run_dir)
    assert_finite_keys(a, ["losses/value_loss", "losses/entropy", "eval/episodic_return"])
    for key in ("losses/value_loss", "losses/policy_loss", "losses/entropy", "eval/episodic_return"):
        assert a[key] == b[key], key
    x, y = saved_weights(run_dir), saved_weights(straight_dir)
    assert all(torch.equal(x[key], y[key]) for key in x)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["CartPole-v1 gives no action_mask", "cleanrl/ppo.py"]),
        (["--env-id", "Pendulum-v1"], ["handles Discrete actions"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide the batch"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)
