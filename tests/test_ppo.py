"""ppo.py: its own loop run under observation (the rollout against the env's stream, GAE from a plain loop, every
minibatch's gradient against a float64 reference loss's, its loss and optimiser step, learning-rate annealing; the same
run is the smoke run), GAE against a plain loop, bad input, checkpoints and resume, learning."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import ppo
import pytest
import torch
from conftest import (
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    script_env,
    sigterm_while_training,
)
from update_reference import assert_gradients_match, gradients

TINY = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
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


# --- the loop's own wiring ---------------------------------------------------------------------------------------
# ppo.py runs unchanged under tests/probe.py on ProbeWalk-v0 (tests/probe_envs.py: 8-step episodes that terminate or
# are truncated, varied rewards, distinct observations). From what its loop saw, the tests rebuild the rollout, the
# advantages (a plain loop), every minibatch's loss and optimiser step and the learning rate, and compare them with
# what the loop stored and used. The same run is the smoke run (TensorBoard keys, the saved model's evaluation).

NUM_ENVS, NUM_STEPS, ITERATIONS, MINIBATCH = 2, 16, 3, 16
LEARNING_RATE = 0.01  # large enough that later minibatches clip both the ratio and the value
LOOP_FLAGS = ["--env-id", "ProbeWalk-v0", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2"]
LOOP_FLAGS += ["--update-epochs", "2", "--total-timesteps", "96", "--learning-rate", str(LEARNING_RATE)]
LOOP_FLAGS += ["--save-model", "--eval-episodes", "2"]
STEP_NAMES = ["next_obs", "action", "reward", "terminated", "truncated", "infos", "iteration"]
BACKWARD_NAMES = ["mb", "agent", "optimizer", "batch", "b_inds", "start", "iteration"]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    names = dict(watch=STEP_NAMES, at_backward=BACKWARD_NAMES, final=["next_obs", "action", "reward", "infos"])
    trace = probe_script("ppo.py", LOOP_FLAGS, cwd, **names, grads=["agent"], preload=["probe_envs"])
    return trace, cwd


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(loop):
    trace, cwd = loop
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    assert (run_dir / "ppo.cleanrl_model").is_file() and (run_dir / "args.json").is_file()
    assert "96/96 steps" in trace.stdout  # the progress display's final line


def rollouts(trace) -> list[dict]:
    """Per iteration, the env stream as the loop met it: the observations acted on, the actions, what the env
    returned, the true final observations of the episodes that ended, and the observation after the rollout."""
    from probe_envs import probe_walk_ends

    acted = [entry for entry in trace.steps if entry["step"] > 0]  # seen as each step begins: the obs to act on
    returned = acted[1:] + [trace.final]  # what a step returned: seen as the next one begins, the last one at exit
    assert [entry["step"] for entry in acted] == list(range(NUM_ENVS, NUM_ENVS * NUM_STEPS * ITERATIONS + 1, NUM_ENVS))
    result = []
    for i in range(ITERATIONS):
        steps = range(i * NUM_STEPS, (i + 1) * NUM_STEPS)
        final_obs = {}
        ends = np.zeros((NUM_STEPS, NUM_ENVS, 2), dtype=bool)  # terminated, truncated
        for t, k in enumerate(steps):
            for env in np.flatnonzero(returned[k]["infos"].get("_final_obs", [])):
                final_obs[t, env] = torch.as_tensor(returned[k]["infos"]["final_obs"][env])
                # A rollout's last step is seen after the loop has reused the names `terminated` and `truncated`:
                # the flags of every step are read from its final observation (ProbeWalk's position and step count).
                ends[t, env] = probe_walk_ends(final_obs[t, env])
            if t < NUM_STEPS - 1:
                assert ends[t, :, 0].tolist() == returned[k]["terminated"].tolist()
                assert ends[t, :, 1].tolist() == returned[k]["truncated"].tolist()
        result.append(
            dict(
                obs=torch.stack([acted[k]["next_obs"] for k in steps]),
                actions=torch.stack([returned[k]["action"] for k in steps]),
                rewards=np.stack([returned[k]["reward"] for k in steps]),
                terminations=ends[..., 0],
                truncations=ends[..., 1],
                final_obs=final_obs,
                after=returned[steps[-1]]["next_obs"],
            )
        )
    return result


def agent_from(state: dict) -> ppo.Agent:
    agent = ppo.Agent(3, 3)
    agent.load_state_dict(state)
    return agent


def test_each_rollout_is_the_env_stream_with_advantages_from_a_plain_gae_loop(loop):
    trace, _ = loop
    truncated_only = terminated = 0
    for i, rollout in enumerate(rollouts(trace), start=1):
        first = next(entry for entry in trace.backward if entry["iteration"] == i)
        agent = agent_from(first["agent"])  # no update between the rollout and its first minibatch
        batch = first["batch"]
        with torch.no_grad():
            values = agent.critic(rollout["obs"]).squeeze(-1)
            # The value of what followed each step: the next observation, or the true final one where the episode
            # ended (a termination ignores it below; a truncation bootstraps from it, never from the reset one).
            next_values = agent.critic(torch.cat([rollout["obs"][1:], rollout["after"][None]])).squeeze(-1)
            for (t, env), final in rollout["final_obs"].items():
                next_values[t, env] = agent.critic(final).squeeze(-1)
            log_probs = torch.log_softmax(agent.actor(rollout["obs"]), dim=-1)
        terminations, truncations = rollout["terminations"], rollout["truncations"]
        advantages = torch.tensor(
            reference_gae(
                rollout["rewards"].tolist(),
                values.tolist(),
                next_values.tolist(),
                terminations.tolist(),
                truncations.tolist(),
                0.99,
                0.95,
            )
        )
        assert torch.equal(batch["obs"], rollout["obs"].reshape(-1, 3))
        assert torch.equal(batch["actions"], rollout["actions"].reshape(-1))
        close = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch["values"], values.reshape(-1), **close)
        torch.testing.assert_close(batch["advantages"], advantages.float().reshape(-1), **close)
        torch.testing.assert_close(batch["returns"], (advantages.float() + values).reshape(-1), **close)
        taken = log_probs.gather(-1, rollout["actions"].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(batch["logprobs"], taken.reshape(-1), **close)
        truncated_only += int((truncations & ~terminations).sum())
        terminated += int(terminations.sum())
    assert truncated_only >= 3 and terminated >= 3, "the rollouts should hold both kinds of episode end"


def reference_loss(agent: ppo.Agent, mb: dict, clip: float = 0.2, ent_coef: float = 0.01, vf_coef: float = 0.5):
    """The clipped PPO objective (Schulman et al. 2017, eq. 7 and 9) with CleanRL's clipped value loss, written from
    the definitions: (loss, fraction of ratios outside the clip range, fraction of values moved past the clip)."""
    probs = torch.softmax(agent.actor(mb["obs"]), dim=-1)
    new_log_prob = probs[torch.arange(len(probs)), mb["actions"]].log()
    entropy = -(probs * probs.log()).sum(dim=-1)
    new_value = agent.critic(mb["obs"]).squeeze(-1)
    ratio = torch.exp(new_log_prob - mb["logprobs"])
    advantages = (mb["advantages"] - mb["advantages"].mean()) / (mb["advantages"].std() + 1e-8)
    surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)
    value_clipped = mb["values"] + torch.clamp(new_value - mb["values"], -clip, clip)
    value_loss = 0.5 * torch.max((new_value - mb["returns"]) ** 2, (value_clipped - mb["returns"]) ** 2).mean()
    loss = -surrogate.mean() - ent_coef * entropy.mean() + vf_coef * value_loss
    moved = (new_value - mb["values"]).abs() > clip
    return loss, ((ratio - 1).abs() > clip).float().mean().item(), moved.float().mean().item()


def float64_minibatch(mb: dict) -> dict:
    """The minibatch's floating tensors in float64: the rollout's log-probabilities, values, advantages and returns,
    constants of the update (recorded, they carry no graph)."""
    return {key: value.double() if value.is_floating_point() else value for key, value in mb.items()}


def test_each_minibatch_is_drawn_from_the_rollout_and_its_gradient_loss_and_step_match_a_plain_reference(loop):
    trace, cwd = loop
    updates = trace.backward
    assert len(updates) == ITERATIONS * 2 * 2  # iterations x epochs x minibatches
    # The reference agent takes each captured agent's weights and steps with its own Adam (state carried along).
    reference = ppo.Agent(3, 3)
    optimizer = torch.optim.Adam(reference.parameters(), lr=LEARNING_RATE, eps=1e-5, foreach=False)
    clipped_ratios = clipped_values = 0.0
    for k, update in enumerate(updates):
        assert update["where"] == "update_minibatch"
        assert sorted(update["b_inds"].tolist()) == list(range(NUM_ENVS * NUM_STEPS))  # each epoch: a permutation
        rows = update["b_inds"][update["start"] : update["start"] + MINIBATCH]
        for field, value in update["mb"].items():
            assert torch.equal(value, update["batch"][field][rows]), field
        # Learning-rate annealing: linear from the full rate at the first iteration towards 0 after the last.
        lr = LEARNING_RATE * (1 - (update["iteration"] - 1) / ITERATIONS)
        assert update["optimizer"]["param_groups"][0]["lr"] == pytest.approx(lr, rel=1e-12)
        # The gradient the backward() left: that of the reference loss in float64, the rollout's values,
        # log-probabilities and returns held constant.
        model = agent_from(update["agent"]).double()
        expected = gradients(reference_loss(model, float64_minibatch(update["mb"]))[0], dict(model.named_parameters()))
        assert_gradients_match(update["grads"]["agent"], expected, f"update {k}")
        reference.load_state_dict(update["agent"])
        loss, ratio_clip, value_clip = reference_loss(reference, update["mb"])
        assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-6), f"update {k}"
        clipped_ratios, clipped_values = clipped_ratios + ratio_clip, clipped_values + value_clip
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        optimizer.step()
        after = updates[k + 1]["agent"] if k + 1 < len(updates) else model_weights(run_dirs(cwd)[0])
        for name, tensor in reference.state_dict().items():
            torch.testing.assert_close(after[name], tensor, rtol=1e-5, atol=1e-6, msg=f"update {k}: {name}")
    assert clipped_ratios > 0 and clipped_values > 0, "some updates should clip the ratio and the value"


def test_capture_video_writes_mp4(workdir):
    result = run_script("ppo.py", *TINY, "--total-timesteps", "256", "--capture-video", cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert list((run_dir / "videos").glob("*.mp4")), "no video written"


def reference_gae(rewards, values, next_values, terminations, truncations, gamma, lam):
    """Plain per-environment Python loop over time, written from the definition."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    advantages = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        running = 0.0
        for t in reversed(range(num_steps)):
            if terminations[t][env]:
                delta = rewards[t][env] - values[t][env]
                running = delta
            elif truncations[t][env]:
                delta = rewards[t][env] + gamma * next_values[t][env] - values[t][env]
                running = delta
            else:
                delta = rewards[t][env] + gamma * next_values[t][env] - values[t][env]
                running = delta + gamma * lam * running
            advantages[t][env] = running
    return advantages


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_matches_python_loop_with_terminations_and_truncations(dtype):
    rng = np.random.default_rng(0)
    num_steps, num_envs = 9, 3
    rewards = rng.normal(size=(num_steps, num_envs))
    values = rng.normal(size=(num_steps, num_envs))
    next_values = rng.normal(size=(num_steps, num_envs))
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
    got = ppo.compute_gae(t(rewards), t(values), t(next_values), t(terminations), t(truncations), 0.99, 0.95)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.numpy(), np.array(expected), rtol=1e-5, atol=1e-6)
    # A truncation keeps its bootstrap, a termination drops it.
    assert got[5, 1].item() == pytest.approx(rewards[5, 1] + 0.99 * next_values[5, 1] - values[5, 1], rel=1e-5)
    assert got[3, 0].item() == pytest.approx(rewards[3, 0] - values[3, 0], rel=1e-5)


def test_sample_action_matches_policy_distribution():
    torch.manual_seed(0)
    agent = ppo.Agent(4, 3)
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([1.0, 0.0, -1.0]))
        agent.actor[-1].weight.zero_()
        obs = torch.zeros(50_000, 4)
        counts = torch.bincount(agent.sample_action(obs), minlength=3).double() / 50_000
        log_probs, entropy = agent.log_prob_and_entropy(obs[:3], torch.tensor([0, 1, 2]))
    expected = torch.softmax(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64), 0)
    assert torch.allclose(counts, expected, atol=0.01)
    assert torch.allclose(log_probs.double(), expected.log(), atol=1e-6)
    assert torch.allclose(entropy.double(), -(expected * expected.log()).sum().expand(3), atol=1e-6)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "Cartpole-v1"], ["unknown environment id", "CartPole-v1"]),
        (["--env-id", "Pendulum-v1"], ["Discrete", "ppo_continuous_action.py"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
        (["--total-timesteps", "0"], ["--total-timesteps must be positive"]),
        (["--total-timesteps", "-5"], ["--total-timesteps must be positive"]),
        (["--num-steps", "-1"], ["--num-steps must be positive"]),
        (["--total-timesteps", "100"], ["less than one batch"]),
        (["--resume", "missing/checkpoint.pt"], ["--resume", "no such file"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo.py", *flags, cwd=workdir), workdir, *fragments)


def fake_checkpoint(path: Path, exp_name: str, env_id: str = "CartPole-v1") -> None:
    from cleanrl_utils.checkpoint import CHECKPOINT_FORMAT

    args = {"exp_name": exp_name, "env_id": env_id}
    torch.save({"format": CHECKPOINT_FORMAT, "script": exp_name, "env_id": env_id, "args": args}, path)


def test_resume_rejects_other_scripts_envs_and_arguments(workdir):
    other = workdir / "other.pt"
    fake_checkpoint(other, "dqn")
    assert_bad_input(
        run_script("ppo.py", "--resume", str(other), cwd=workdir), workdir, "written by dqn.py, not ppo.py"
    )
    fake_checkpoint(other, "ppo", env_id="Acrobot-v1")
    assert_bad_input(run_script("ppo.py", "--resume", str(other), cwd=workdir), workdir, "--env-id Acrobot-v1")
    (workdir / "junk.pt").write_bytes(b"not a checkpoint")
    assert_bad_input(
        run_script("ppo.py", "--resume", str(workdir / "junk.pt"), cwd=workdir), workdir, "not a readable checkpoint"
    )
    # A real checkpoint resumed with different hyperparameters.
    ok = run_script("ppo.py", *TINY, "--total-timesteps", "256", "--checkpoint-every", "128", cwd=workdir)
    assert ok.returncode == 0, ok.stderr
    (run_dir,) = run_dirs(workdir)
    mismatch = run_script(
        "ppo.py",
        *TINY,
        "--total-timesteps",
        "256",
        "--learning-rate",
        "0.1",
        "--resume",
        str(run_dir / "checkpoint.pt"),
        cwd=workdir,
    )
    assert mismatch.returncode != 0 and "--learning-rate" in mismatch.stderr and "Traceback" not in mismatch.stderr


def test_track_without_network_or_key_finishes_offline(workdir):
    env = script_env(
        WANDB_MODE=None, WANDB_BASE_URL="http://127.0.0.1:9", HOME=str(workdir), NETRC=str(workdir / "none")
    )
    start = time.monotonic()
    result = run_script("ppo.py", *TINY, "--total-timesteps", "256", "--track", cwd=workdir, env=env, timeout=180)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 120
    assert "logging offline" in result.stdout
    (run_dir,) = run_dirs(workdir)
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline W&B run written"


def episodic_returns(run_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(run_dir)["charts/episodic_return"]


def model_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "ppo.cleanrl_model", weights_only=False)["agent"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


RESUME_FLAGS = [
    *TINY,
    "--total-timesteps",
    "6144",
    "--checkpoint-every",
    "1024",
    "--save-model",
    "--eval-episodes",
    "1",
]


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script("ppo.py", *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr

    run_dir = kill_at_first_checkpoint("ppo.py", RESUME_FLAGS, interrupted)
    assert not (run_dir / "ppo.cleanrl_model").exists()

    resumed = run_script("ppo.py", *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir], "resume must continue the same run directory"
    (straight_dir,) = run_dirs(straight)
    assert episodic_returns(run_dir) == episodic_returns(straight_dir)
    assert_same_weights(model_weights(run_dir), model_weights(straight_dir))


def test_same_seed_gives_identical_curves(tmp_path):
    curves = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        result = run_script("ppo.py", *TINY, "--total-timesteps", "2048", cwd=tmp_path / name)
        assert result.returncode == 0, result.stderr
        scalars = read_scalars(run_dirs(tmp_path / name)[0])
        curves.append(
            {k: [v for _, v in scalars[k]] for k in ("charts/episodic_return", "losses/value_loss", "losses/approx_kl")}
        )
    assert curves[0] == curves[1]


def test_sigterm_writes_checkpoint_and_exits_zero(workdir):
    out, run_dir = sigterm_while_training("ppo.py", [*TINY, "--total-timesteps", "10000000"], workdir)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 10_000_000
