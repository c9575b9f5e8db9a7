"""crossq_continuous_action.py: batch renormalisation against the paper's formulas (warm-up, clipping, running
statistics, evaluation mode, r and d held constant in the gradient); the joint forward against two separate forwards;
the script's own loop under tests/probe.py (stored rows, acting with the policy's running statistics, every critic loss
from the joint training-mode pass with no target network, the running statistics it leaves, every policy and alpha
loss, the policy's delay); smoke, save and evaluate, SIGKILL + exact resume, bad input."""

from __future__ import annotations

import continuous_reference as plain
import crossq_continuous_action as crossq
import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, assert_unchanged, gradients, leaves

SCRIPT = "crossq_continuous_action.py"
EPS, R_MAX, D_MAX = 1e-3, 3.0, 5.0  # the authors' batch renormalisation constants
LOSS_KEYS = ["losses/qf1_values", "losses/qf2_values", "losses/qf1_loss", "losses/qf2_loss", "losses/qf_loss"]
LOSS_KEYS += ["losses/actor_loss", "losses/alpha", "losses/alpha_loss"]


# --- batch renormalisation -----------------------------------------------------------------------


def renorm_reference(x, weight, bias, running_mean, running_var, steps, warmup, momentum):
    """Ioffe 2017, Algorithm 1 with CrossQ's running variance, in float64 with r and d as constants: the output and
    the running statistics after the step."""
    x = x.double()
    mean, var = x.mean(0), ((x - x.mean(0)) ** 2).mean(0)  # the biased batch variance
    std, running_std = (var + EPS).sqrt(), (running_var.double() + EPS).sqrt()
    if steps >= warmup:
        r = (std / running_std).clamp(1 / R_MAX, R_MAX).detach()
        d = ((mean - running_mean.double()) / running_std).clamp(-D_MAX, D_MAX).detach()
    else:
        r, d = 1.0, 0.0
    out = ((x - mean) / std * r + d) * weight.double() + bias.double()
    new_mean = momentum * running_mean.double() + (1 - momentum) * mean.detach()
    new_var = momentum * running_var.double() + (1 - momentum) * var.detach()
    return out, new_mean, new_var


@pytest.mark.parametrize("warmed_up", [False, True])
def test_batch_renorm_training_step_matches_the_paper_and_holds_r_and_d_constant(warmed_up):
    generator = torch.Generator().manual_seed(0)
    layer = crossq.BatchRenorm(6, momentum=0.9, warmup_steps=4).double()
    with torch.no_grad():
        layer.weight.copy_(torch.rand(6, generator=generator, dtype=torch.float64) + 0.5)
        layer.bias.copy_(torch.randn(6, generator=generator, dtype=torch.float64))
        # Running statistics far from the batch's in some features, so that r and d are clipped there.
        layer.running_mean.copy_(torch.tensor([0.0, 1.0, -40.0, 40.0, 0.5, 0.0]))
        layer.running_var.copy_(torch.tensor([1.0, 100.0, 1.0, 1.0, 0.01, 4.0]))
        layer.steps.fill_(5 if warmed_up else 3)
    x = (torch.randn(32, 6, generator=generator, dtype=torch.float64) * 2 + 1).requires_grad_()
    reference_x = x.detach().clone().requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()
    expected, new_mean, new_var = renorm_reference(
        reference_x, weight, layer.bias, layer.running_mean, layer.running_var, int(layer.steps), 4, 0.9
    )
    out = layer(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(layer.running_mean, new_mean)
    torch.testing.assert_close(layer.running_var, new_var)
    assert int(layer.steps) == (6 if warmed_up else 4)
    upstream = torch.randn(32, 6, generator=generator, dtype=torch.float64)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    torch.testing.assert_close(x.grad, reference_x.grad)
    torch.testing.assert_close(layer.weight.grad, weight.grad)
    if not warmed_up:  # plain batch normalisation (torch's, with the biased variance)
        plain_bn = torch.nn.functional.batch_norm(x, None, None, layer.weight, layer.bias, training=True, eps=EPS)
        torch.testing.assert_close(out, plain_bn)


def test_batch_renorm_evaluation_uses_the_running_statistics_and_changes_nothing():
    layer = crossq.BatchRenorm(3, momentum=0.99, warmup_steps=0).double().eval()
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, -2.0, 0.0]))
        layer.running_var.copy_(torch.tensor([4.0, 0.25, 1.0]))
        layer.weight.copy_(torch.tensor([2.0, 1.0, 1.0]))
        layer.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
    x = torch.tensor([[3.0, -2.0, 1.0]], dtype=torch.float64)  # a batch of one: evaluation needs no batch statistics
    expected = (x - layer.running_mean) / (layer.running_var + EPS).sqrt() * layer.weight + layer.bias
    torch.testing.assert_close(layer(x), expected)
    assert layer.running_mean.tolist() == [1.0, -2.0, 0.0] and int(layer.steps) == 0


def test_after_warmup_a_training_output_equals_the_evaluation_output_when_the_statistics_agree():
    # What renormalisation is for: with r and d unclipped, training-mode outputs are those of the running statistics.
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator, dtype=torch.float64) * 1.5 + 0.3
    layer = crossq.BatchRenorm(4, momentum=0.99, warmup_steps=0).double()
    with torch.no_grad():
        layer.running_mean.copy_(x.mean(0) + 0.2)
        layer.running_var.copy_(x.var(0, correction=0) * 1.3)
    evaluation = layer.eval()(x)
    torch.testing.assert_close(layer.train()(x), evaluation)


def test_joint_forward_equals_two_separate_forwards_in_evaluation_mode_and_normalises_over_both_in_training():
    generator = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    qf = crossq.TwinCritic(5, 2, hidden=16, momentum=0.99, warmup_steps=100).double()
    obs, next_obs = torch.randn(8, 5, generator=generator).double(), torch.randn(8, 5, generator=generator).double()
    actions, next_actions = (torch.rand(8, 2, generator=generator).double() for _ in range(2))
    qf.train()
    for _ in range(3):  # running statistics away from their initial values
        qf(torch.randn(8, 5, generator=generator).double(), torch.rand(8, 2, generator=generator).double())
    qf.eval()
    joint = qf(torch.cat([obs, next_obs]), torch.cat([actions, next_actions]))
    torch.testing.assert_close(joint, torch.cat([qf(obs, actions), qf(next_obs, next_actions)], dim=1))
    # Training mode: the input layer's statistics are those of the 16 concatenated rows, not of either half.
    qf.train()
    first = qf.critics[0][0]
    before = first.running_mean.clone()
    qf(torch.cat([obs, next_obs]), torch.cat([actions, next_actions]))
    inputs = torch.cat([torch.cat([obs, actions], 1), torch.cat([next_obs, next_actions], 1)])
    torch.testing.assert_close(first.running_mean, 0.99 * before + 0.01 * inputs.mean(0))


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs: 88 steps of random actions, then 16 critic steps and
# a policy step after every 3rd. Narrow networks (critics 16, policy 8 wide) and the default warm-up (never reached
# here), so training-mode outputs depend on the batch alone; the running statistics are checked step by step.
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "120", "--batch-size", "16"]
PROBE_FLAGS += ["--learning-starts", "88", "--total-timesteps", "104", "--gamma", "0.9"]
PROBE_FLAGS += ["--critic-hidden", "16", "--actor-hidden", "8"]
PROBE_STEP_NAMES = ["obs_np", "next_obs_np", "actions", "rewards", "terminations", "truncations", "infos"]
PROBE_STEP_NAMES += ["acting_noise"]
PROBE_AT_BACKWARD = ["batch", "noise", "obs", "t", "alpha", "log_alpha", "actor_loss", "alpha_loss", "actor", "qf"]
GAMMA, LEARNING_STARTS, TARGET_ENTROPY, MOMENTUM = 0.9, 88, -2.0, 0.99


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS,
        cwd,
        watch=PROBE_STEP_NAMES,
        at_backward=PROBE_AT_BACKWARD,
        grads=["qf", "actor", "log_alpha"],
        final=["rb"],
        preload=["probe_box_envs"],
    )
    return trace, cwd


def renorm(state: dict, prefix: str, x: torch.Tensor, training: bool) -> tuple[torch.Tensor, tuple]:
    """A BatchRenorm layer read from a state dict, before its warm-up ends: batch statistics in training mode,
    running ones in evaluation mode; the output and the batch's (mean, biased variance)."""
    x = x.double()
    weight, bias = state[f"{prefix}.weight"].double(), state[f"{prefix}.bias"].double()
    if training:
        mean, var = x.mean(0), ((x - x.mean(0)) ** 2).mean(0)
    else:
        mean, var = state[f"{prefix}.running_mean"].double(), state[f"{prefix}.running_var"].double()
    return (x - mean) / (var + EPS).sqrt() * weight + bias, (x.mean(0), ((x - x.mean(0)) ** 2).mean(0))


def critic(state: dict, i: int, obs, actions, training: bool) -> tuple[torch.Tensor, list]:
    """Critic i of TwinCritic: renorm, (linear, relu, renorm) x 2, linear; Q [batch] and each renorm's batch stats."""
    p = f"critics.{i}."
    x, stats = torch.cat([obs, actions], dim=-1), []
    for norm, linear in ((0, 1), (3, 4), (6, None)):
        x, batch_stats = renorm(state, f"{p}{norm}", x, training)
        stats.append(batch_stats)
        if linear is not None:
            x = plain.linear(x, state, f"{p}{linear}").relu()
    return plain.linear(x, state, f"{p}7").squeeze(-1), stats


def policy(state: dict, obs, noise, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The squashed Gaussian of Actor: renorm, (linear, relu, renorm) x 2, the mean and the clipped log std heads."""
    x, _ = renorm(state, "trunk.0", obs, training)
    for linear, norm in ((1, 3), (4, 6)):
        x, _ = renorm(state, f"trunk.{norm}", plain.linear(x, state, f"trunk.{linear}").relu(), training)
    mean, log_std = plain.linear(x, state, "fc_mean"), plain.linear(x, state, "fc_logstd").clamp(-20, 2)
    u = mean + log_std.exp() * noise.double()
    scale, bias = state["action_scale"].double(), state["action_bias"].double()
    normal = torch.distributions.Normal(mean, log_std.exp())
    log_prob = normal.log_prob(u).sum(-1) - torch.log(scale * (1 - torch.tanh(u) ** 2)).sum(-1)
    return torch.tanh(u) * scale + bias, log_prob


def probe_steps(trace) -> list[dict]:
    return [entry for entry in trace.steps if entry["step"] > 0]


def critic_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_critics"]


def policy_entries(trace) -> list[dict]:
    """The policy's backward of each policy step: the first of update_actor's two (alpha's is the second)."""
    return [entry for entry in trace.backward if entry["where"] == "update_actor"][0::2]


def alpha_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_actor"][1::2]


def test_the_loop_stores_each_step_with_the_true_next_observation_and_only_terminations(probed):
    trace, cwd = probed
    steps = probe_steps(trace)
    assert len(steps) == 52
    ends = plain.check_stored_rows(steps, trace.final["rb"], 4, 2, actions_name="actions")
    assert min(ends.values()) >= 5, ends
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), LOSS_KEYS)


def test_acting_samples_the_policy_with_its_running_statistics(probed):
    trace, _ = probed
    steps = [step for step in probe_steps(trace) if step["step"] - 2 >= LEARNING_STARTS]
    assert len(steps) == 8
    for step in steps:
        # The policy that acted: as the first backward of this step's updates found it (no policy step in between).
        actor = next(entry for entry in trace.backward if entry["step"] == step["step"])["actor"]
        with torch.no_grad():
            actions, _ = policy(actor, torch.as_tensor(step["obs_np"]), step["acting_noise"], training=False)
        np.testing.assert_allclose(step["actions"], actions.numpy(), rtol=1e-5, atol=1e-5)


def test_each_critic_step_is_the_joint_training_pass_regressing_on_its_own_second_half(probed):
    trace, _ = probed
    rows = plain.buffer_rows(trace.final["rb"], 4, 2)
    stored = {plain.row_key(rows, i) for i in range(104)}
    updates = critic_entries(trace)
    assert [entry["t"] for entry in updates] == list(range(LEARNING_STARTS + 1, 105))  # one per env step
    terminal_targets = 0
    for entry in updates:
        batch, qf, where = entry["batch"], leaves(entry["qf"]), f"update {entry['t']}"
        assert all(plain.row_key(batch, i) in stored for i in range(16)), "a sampled row was never stored"
        alpha = entry["log_alpha"].double().exp()
        with torch.no_grad():  # a' ~ pi(.|s') with the policy's running statistics
            next_actions, next_log_prob = policy(entry["actor"], batch["next_obs"], entry["noise"], training=False)
        # One training-mode pass over both halves; the target from its second half, held constant (the paper's
        # stop-gradient: CrossQ has no target network, so this is what keeps Q(s', a') out of the gradient).
        obs = torch.cat([batch["obs"].double(), batch["next_obs"].double()])
        actions = torch.cat([batch["actions"].double(), next_actions])
        joint = torch.stack([critic(qf, i, obs, actions, training=True)[0] for i in (0, 1)])
        q, next_q = joint[:, :16], joint[:, 16:].detach()
        soft_value = next_q.amin(0) - alpha * next_log_prob
        target = batch["rewards"].double() + GAMMA * (1 - batch["terminations"].double()) * soft_value
        expected = 0.5 * ((q - target) ** 2).mean(1).sum()
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        assert_gradients_match(entry["grads"]["qf"], gradients(expected, qf), where)
        terminal_targets += int(batch["terminations"].sum())
    assert terminal_targets > 10, "sampled transitions should end episodes"


def test_the_critics_running_statistics_move_only_in_critic_steps_towards_the_joint_batch(probed):
    trace, _ = probed
    updates = critic_entries(trace)
    for before, after in zip(updates, updates[1:]):
        # The statistics `after` holds were updated once since `before`: by its own joint pass (the policy step in
        # between evaluates the critics without touching them).
        batch = after["batch"]
        with torch.no_grad():
            next_actions, _ = policy(after["actor"], batch["next_obs"], after["noise"], training=False)
            obs = torch.cat([batch["obs"].double(), batch["next_obs"].double()])
            actions = torch.cat([batch["actions"].double(), next_actions])
            for i in (0, 1):
                _, stats = critic(after["qf"], i, obs, actions, training=True)
                for norm, (mean, var) in zip((0, 3, 6), stats):
                    prefix, where = f"critics.{i}.{norm}", f"t={after['t']}, critic {i}, layer {norm}"
                    for name, value in (("running_mean", mean), ("running_var", var)):
                        expected = MOMENTUM * before["qf"][f"{prefix}.{name}"].double() + (1 - MOMENTUM) * value
                        torch.testing.assert_close(
                            after["qf"][f"{prefix}.{name}"].double(), expected, rtol=1e-4, atol=1e-6, msg=where
                        )
                    assert int(after["qf"][f"{prefix}.steps"]) == after["t"] - LEARNING_STARTS, where


def test_the_policy_and_alpha_step_every_policy_frequency_critic_steps_with_the_critics_evaluated(probed):
    trace, _ = probed
    critics, policies, alphas = critic_entries(trace), policy_entries(trace), alpha_entries(trace)
    expected_t = [t for t in range(LEARNING_STARTS + 1, 105) if (t - LEARNING_STARTS) % 3 == 0]
    assert [entry["t"] for entry in policies] == expected_t and [entry["t"] for entry in alphas] == expected_t
    by_t = {entry["t"]: entry for entry in critics}
    for entry, alpha_entry in zip(policies, alphas):
        obs, where = entry["obs"], f"policy step at t={entry['t']}"
        assert torch.equal(obs, by_t[entry["t"]]["batch"]["obs"])  # the critic step's minibatch
        assert not torch.equal(entry["noise"], by_t[entry["t"]]["noise"])  # fresh noise
        log_alpha = entry["log_alpha"].double().requires_grad_(True)
        actor = leaves(entry["actor"])
        # The policy in training mode (its batch statistics), the critics with their running statistics; alpha a
        # constant in the policy's loss, the log-probabilities constants in alpha's.
        actions, log_prob = policy(actor, obs, entry["noise"], training=True)
        q = torch.minimum(*(critic(entry["qf"], i, obs, actions, training=False)[0] for i in (0, 1)))
        loss = (log_alpha.detach().exp() * log_prob - q).mean()
        alpha_loss = (-log_alpha.exp() * (log_prob.detach() + TARGET_ENTROPY)).mean()
        assert entry["actor_loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        assert alpha_entry["alpha_loss"].item() == pytest.approx(alpha_loss.item(), rel=1e-5), where
        assert_gradients_match(entry["grads"]["actor"], gradients(loss, actor), where)
        assert_gradients_match(
            {"log_alpha": alpha_entry["grads"]["log_alpha"]}, gradients(alpha_loss, {"log_alpha": log_alpha}), where
        )
        # The critics are untouched by the policy step: its statistics as the critic step left them (its backward came
        # after the joint pass moved them), its weights as the next critic step finds them.
        for name, value in entry["qf"].items():
            assert torch.equal(value, by_t[entry["t"]]["qf"][name]) or not name.endswith(
                ("running_mean", "running_var", "steps")
            )
        if entry["t"] + 1 in by_t:
            weights = lambda name: not name.endswith(("running_mean", "running_var", "steps"))  # noqa: E731
            assert_unchanged(entry["qf"], by_t[entry["t"] + 1]["qf"], where, names=weights)
    # The policy's statistics moved once per policy step (its normalisation trains only there).
    assert int(policies[-1]["actor"]["trunk.0.steps"]) == len(policies)
    assert alphas[-1]["alpha"].item() < 1.0  # alpha (from 1) was tuned


# --- runs ----------------------------------------------------------------------------------------
TINY = ["--critic-hidden", "32", "--actor-hidden", "16", "--batch-size", "32", "--buffer-size", "500"]
RESUME_FLAGS = ["--env-id", "Pendulum-v1", *TINY, "--learning-starts", "150", "--total-timesteps", "800"]
RESUME_FLAGS += ["--checkpoint-every", "300", "--save-model", "--eval-episodes", "1"]


def saved_weights(run_dir) -> dict:
    model = torch.load(run_dir / "crossq_continuous_action.cleanrl_model", weights_only=False)
    return {**{f"actor.{k}": v for k, v in model["actor"].items()}, **{f"qf.{k}": v for k, v in model["qf"].items()}}


def test_sigkill_then_resume_reproduces_the_uninterrupted_run_and_evaluates_the_saved_model(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    assert not (run_dir / "crossq_continuous_action.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] in (300, 600) and int(checkpoint["qf"]["critics.0.0.steps"]) > 0
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir], "resume must continue the same run directory"
    (straight_dir,) = run_dirs(straight)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    assert_finite_keys(straight_scalars, LOSS_KEYS + ["charts/episodic_return", "eval/episodic_return"])
    for key in (
        "charts/episodic_return",
        "losses/qf1_loss",
        "losses/actor_loss",
        "losses/alpha",
        "eval/episodic_return",
    ):
        assert resumed_scalars[key] == straight_scalars[key], key
    a, b = saved_weights(run_dir), saved_weights(straight_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["Box", "cleanrl/dqn.py"]),
        (["--env-id", "Pendulum-v1", "--buffer-size", "1000000000000"], ["replay buffer needs", "GB available"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(batch_size=1), "--batch-size must be at least 2"),
        (dict(bn_momentum=1.0), "--bn-momentum and --adam-beta1 must be in [0, 1)"),
        (dict(renorm_warmup_steps=-1), "--renorm-warmup-steps must be 0 or positive"),
        (dict(critic_hidden=0), "--critic-hidden must be positive"),
        (dict(total_timesteps=1000, learning_starts=1000), "--learning-starts 1000 is not below --total-timesteps"),
        (dict(env_id="Pendulm-v1"), "did you mean Pendulum-v1"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    with pytest.raises(SystemExit) as exit_info:
        crossq.validate(crossq.Args(**{"env_id": "Pendulum-v1", **overrides}))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
