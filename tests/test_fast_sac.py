"""fast_sac_isaacgym.py: the squashed Gaussian's log-probability against torch.distributions, the temperature loss and
its direction, the projection of the soft target against a plain loop, the replay buffer's n-step windows; the script's
own loop under tests/probe.py on gymnasium's path (stored rows, actions sampled from the policy with the noise drawn,
every critic, temperature and policy gradient against float64 references with the targets held constant, no gradient
into the target critics, the critics and the temperature unmoved by the policy step, Polyak averaging); SIGKILL + exact
resume with the saved model's evaluation; envpool's smoke; --amp; bad input. MuJoCo Warp: the GPU runbook item's tiny
CPU run (tests/test_gpu_kit.py), beside fast_td3's own smoke of the same adapter."""

from __future__ import annotations

import math

import fast_sac_isaacgym as fast_sac
import numpy as np
import pytest
import torch
from conftest import (
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
)
from test_fast_td3 import fill, plain_window, reference_projection
from update_reference import assert_gradients_match, assert_same_gradient, assert_unchanged, gradients, leaves

SCRIPT = "fast_sac_isaacgym.py"


# --- the math ---------------------------------------------------------------------------------------


def test_squashed_gaussian_log_probability_is_the_gaussians_less_tanhs_jacobian():
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=generator, dtype=torch.float64)
    log_std = torch.rand(64, 3, generator=generator, dtype=torch.float64) * 3 - 3
    noise = torch.randn(64, 3, generator=generator, dtype=torch.float64)
    actions, log_probs = fast_sac.squashed_gaussian(mean, log_std, noise)
    u = mean + log_std.exp() * noise
    gaussian = torch.distributions.Normal(mean, log_std.exp())
    expected = (gaussian.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2 + 1e-6)).sum(-1)  # the authors' form
    torch.testing.assert_close(actions, torch.tanh(u))
    torch.testing.assert_close(log_probs, expected, rtol=1e-12, atol=1e-12)
    # Within the 1e-6 the authors add, the density of tanh(u) (torch's exact Jacobian), away from the bounds.
    squashed = torch.distributions.TransformedDistribution(gaussian, [torch.distributions.TanhTransform()])
    exact = squashed.log_prob(actions).sum(-1)
    inside = (actions.abs() < 0.9).all(-1)
    torch.testing.assert_close(log_probs[inside], exact[inside], rtol=0, atol=3e-5)


def test_the_policy_starts_at_mean_zero_and_mid_range_log_std_and_plays_its_squashed_mean():
    actor = fast_sac.Actor(obs_dim=5, act_dim=3, hidden=16, log_std_min=-5.0, log_std_max=0.0)
    obs = torch.randn(7, 5)
    mean, log_std = actor(obs)
    assert torch.equal(mean, torch.zeros(7, 3)) and torch.allclose(log_std, torch.full((7, 3), -2.5))
    with torch.no_grad():
        actor.fc_logstd.bias.fill_(100.0)
        actor.fc_mean.bias.fill_(0.5)
    mean, log_std = actor(obs)
    assert torch.allclose(log_std, torch.zeros(7, 3))  # tanh saturates at log_std_max
    torch.testing.assert_close(actor.deterministic(obs), torch.tanh(torch.full((7, 3), 0.5)))


def test_the_temperature_loss_lowers_alpha_above_the_entropy_target_and_raises_it_below():
    log_probs = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    weights = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    log_alpha = torch.tensor([math.log(0.2)], dtype=torch.float64, requires_grad=True)
    loss = fast_sac.temperature_loss(log_alpha, log_probs, -1.5, weights)
    expected = -0.2 * ((1.0 - 1.5) + (-2.0 - 1.5) + (3.0 - 1.5)) / 3  # the window of weight 0 left out
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    assert log_alpha.grad.item() == pytest.approx(expected, rel=1e-12)  # d/d log alpha of alpha x c is alpha x c
    # The weighted windows' entropy, -mean(log pi) = -2/3, is above the target -1.5: descending lowers alpha.
    assert log_alpha.grad.item() > 0
    low_entropy = torch.full((4,), 5.0, dtype=torch.float64)  # entropy -5, below the target: alpha rises
    log_alpha.grad = None
    fast_sac.temperature_loss(log_alpha, low_entropy, -1.5, weights).backward()
    assert log_alpha.grad.item() < 0
    # No gradient reaches the log-probabilities: the temperature's loss trains alpha alone.
    log_probs.requires_grad_(True)
    fast_sac.temperature_loss(log_alpha, log_probs, -1.5, weights).backward()
    assert log_probs.grad is None


def test_the_projection_of_the_soft_target_matches_a_plain_loop():
    generator = torch.Generator().manual_seed(1)
    support = torch.linspace(-10, 10, 21, dtype=torch.float64)
    probs = torch.softmax(torch.randn(64, 21, generator=generator, dtype=torch.float64) * 2, dim=1)
    rewards = torch.randn(64, generator=generator, dtype=torch.float64) * 6
    discounts = torch.tensor([0.0, 0.97, 0.9409, 0.912673], dtype=torch.float64).repeat(16)
    next_log_probs = torch.randn(64, generator=generator, dtype=torch.float64) * 3
    soft_rewards = rewards - discounts * 0.3 * next_log_probs  # r + discount (z - alpha log pi), alpha 0.3
    got = fast_sac.project_distribution(probs, soft_rewards, discounts, support)
    expected = np.zeros((64, 21))
    for i in range(64):  # each atom z moved to r + discount (z - alpha log pi), clamped, split between its neighbours
        for j in range(21):
            shifted = rewards[i].item() + discounts[i].item() * (support[j].item() - 0.3 * next_log_probs[i].item())
            b = (min(max(shifted, -10.0), 10.0) + 10.0) / 1.0
            lower, upper = math.floor(b), math.ceil(b)
            if lower == upper:
                expected[i, lower] += probs[i, j].item()
            else:
                expected[i, lower] += probs[i, j].item() * (upper - b)
                expected[i, upper] += probs[i, j].item() * (b - lower)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    np.testing.assert_allclose(got.sum(1).numpy(), np.ones(64), atol=1e-12)  # mass is kept


def test_the_replay_buffers_n_step_windows_stop_at_ends_and_the_newest_step():
    rb = fast_sac.ReplayBuffer(num_envs=3, buffer_size=9, obs_dim=3, act_dim=2, device=torch.device("cpu"))
    fill(rb, 23)  # wrapped around twice
    columns = {name: getattr(rb, name) for name in ("rewards", "terminations", "truncations")}
    starts = torch.arange(rb.size).repeat(3, 1)
    obs, _, rewards, discounts, next_obs, weights, *critics_obs = rb.n_step_window(starts, 4, 0.9)
    # no critic observations of their own: the critics see the policy's
    assert torch.equal(critics_obs[0], obs) and torch.equal(critics_obs[1], next_obs)
    newest = (rb.pos - 1) % 9
    for env in range(3):
        for start in range(rb.size):
            i = env * rb.size + start
            total, discount, last = plain_window(columns, env, start, newest, 4, 0.9)
            assert rewards[i].item() == pytest.approx(total, rel=1e-6, abs=1e-6)
            assert discounts[i].item() == pytest.approx(discount, rel=1e-6)
            assert torch.equal(next_obs[i], rb.next_obs[env, last])
            assert weights[i] == (0.0 if rb.reset_steps[env, start] else 1.0)


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on gymnasium's ProbeDrift-v0 (tests/probe_box_envs.py: 8-step
# episodes ending by termination or truncation, asymmetric action bounds), 2 envs x 40 steps (the buffer never wraps):
# learning from step 30 (after the 15th step), 2 critic and temperature updates per step, a policy update after every
# 2nd critic update, 3-step returns, an entropy target of -1 (ratio 0.5 of 2 actions), alpha from the authors' 0.001.
PROBE_FLAGS = ["--simulator", "gymnasium", "--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "64"]
PROBE_FLAGS += ["--batch-size", "16", "--learning-starts", "30", "--total-timesteps", "80", "--gamma", "0.9"]
PROBE_FLAGS += ["--critic-hidden", "32", "--actor-hidden", "16", "--num-atoms", "11", "--v-min", "-5", "--v-max", "5"]
PROBE_FLAGS += ["--num-updates", "2", "--policy-frequency", "2", "--n-steps", "3", "--target-entropy-ratio", "0.5"]
PROBE_FLAGS += ["--log-every", "20", "--torch-threads", "1"]
STEP_NAMES = ["actions", "noise", "next_raw_obs", "rewards", "terminations", "truncations", "info", "actor"]
STEP_NAMES += ["obs_normalizer"]
AT_BACKWARD = ["obs", "actions", "rewards", "discounts", "next_obs", "next_noise", "noise", "weights", "qnet"]
AT_BACKWARD += ["qnet_target", "actor", "log_alpha", "next_log_probs", "critic_updates", "obs_normalizer", "rb"]
AT_BACKWARD += ["critic_obs", "next_critic_obs"]  # the critics' inputs: the policy's observations here
GRADS = ["qnet", "qnet_target", "actor", "log_alpha"]
GAMMA, TAU, N_STEPS, TARGET_ENTROPY = 0.9, 0.125, 3, -1.0
SUPPORT = np.linspace(-5, 5, 11)


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS,
        cwd,
        watch=STEP_NAMES,
        at_backward=AT_BACKWARD,
        grads=GRADS,
        final=["rb"],
        preload=["probe_box_envs"],
    )
    assert trace.returncode == 0, trace.stderr[-3000:]
    return trace, cwd


def linear(x, state, name):
    return x @ state[f"{name}.weight"].double().T + state[f"{name}.bias"].double()


def layer_norm_silu(x, state, linear_name, norm_name):
    h = linear(x, state, linear_name)
    mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    h = (h - mean) / torch.sqrt(var + 1e-5) * state[f"{norm_name}.weight"].double() + state[
        f"{norm_name}.bias"
    ].double()
    return h * torch.sigmoid(h)


def plain_trunk(x, state, prefix):
    h = x.double()
    for layer in (0, 3, 6):  # Linear, LayerNorm, SiLU three times
        h = layer_norm_silu(h, state, f"{prefix}{layer}", f"{prefix}{layer + 1}")
    return h


def plain_policy(state: dict, obs, noise) -> tuple:
    """tanh(mean + std noise) and its log-probability, written from the definitions (log std in [-5, 0])."""
    h = plain_trunk(obs, state, "net.")
    mean = linear(h, state, "fc_mean")
    log_std = -5.0 + 2.5 * (torch.tanh(linear(h, state, "fc_logstd")) + 1)
    u = mean + log_std.exp() * noise.double()
    actions = torch.tanh(u)
    log_probs = torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - actions**2 + 1e-6)
    return actions, log_probs.sum(-1)


def plain_critic_logits(state: dict, i: int, obs, actions) -> torch.Tensor:
    h = plain_trunk(torch.cat([obs.double(), actions.double()], dim=-1), state, f"qnets.{i}.")
    return linear(h, state, f"qnets.{i}.9")


def normalise(state: dict, x) -> torch.Tensor:
    return ((torch.as_tensor(x).double() - state["mean"]) / (state["var"].sqrt() + 0.01)).float()


def entries(trace, where: str) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == where]


def soft_targets(entry: dict) -> tuple:
    """The critic update's targets, held constant: for each critic, its own target critic's distribution at (s', a')
    with a' ~ pi (the recorded noise), projected after the shift r + discount (z - alpha log pi(a'|s')); the next
    log-probabilities; and the targets' means before projection [2, batch]."""
    with torch.no_grad():
        next_actions, next_log_probs = plain_policy(entry["actor"], entry["next_obs"], entry["next_noise"])
        alpha = entry["log_alpha"].double().exp()
        rewards, discounts = entry["rewards"].double(), entry["discounts"].double()
        soft_rewards = rewards - discounts * alpha * next_log_probs
        targets, means = [], []
        for i in (0, 1):
            logits = plain_critic_logits(entry["qnet_target"], i, entry["next_critic_obs"], next_actions)
            probs = torch.softmax(logits, -1)
            targets.append(
                torch.as_tensor(reference_projection(probs.numpy(), soft_rewards.numpy(), discounts.numpy(), SUPPORT))
            )
            means.append(soft_rewards + discounts * (probs * torch.as_tensor(SUPPORT)).sum(-1))
    return torch.stack(targets), next_log_probs, torch.stack(means)


def test_the_loop_stores_each_step_and_acts_with_actions_sampled_from_the_policy(probed):
    trace, _ = probed
    steps, rb = [s for s in trace.steps if s["step"] > 0], trace.final["rb"]
    assert len(steps) == 40 and rb["size"] == 40
    ends = 0
    for t, step in enumerate(steps):
        assert torch.equal(rb["actions"][:, t], step["actions"])  # in [-1, 1], as the policy gave them
        assert torch.equal(rb["rewards"][:, t], step["rewards"])
        assert torch.equal(rb["terminations"][:, t], step["terminations"])
        assert torch.equal(rb["truncations"][:, t], step["truncations"])
        assert torch.equal(rb["next_obs"][:, t], step["info"]["final_obs"])  # the true final observation at an end
        ends += int((step["terminations"] | step["truncations"]).sum())
        if t == 0:
            continue
        assert torch.equal(rb["obs"][:, t], steps[t - 1]["next_raw_obs"])
        with torch.no_grad():
            expected, _ = plain_policy(step["actor"], normalise(step["obs_normalizer"], rb["obs"][:, t]), step["noise"])
        torch.testing.assert_close(step["actions"].double(), expected, rtol=1e-5, atol=1e-5)
    assert ends >= 6, ends


def test_each_critic_update_is_the_cross_entropy_to_its_own_target_critics_projected_soft_target(probed):
    trace, _ = probed
    updates = entries(trace, "update_critic")
    assert [u["critic_updates"] for u in updates] == list(range(50))
    for entry in updates:
        where = f"update {entry['critic_updates']}"
        targets, _, _ = soft_targets(entry)
        qnet = leaves(entry["qnet"])
        weights = entry["weights"].double()
        assert torch.equal(weights, torch.ones(16))  # no reset steps on gymnasium's path
        loss = sum(
            (
                -(
                    targets[i]
                    * torch.log_softmax(plain_critic_logits(qnet, i, entry["critic_obs"], entry["actions"]), -1)
                ).sum(-1)
            )
            .mul(weights)
            .sum()
            / weights.sum()
            for i in (0, 1)
        )
        assert_gradients_match(entry["grads"]["qnet"], gradients(loss, qnet), where)
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-4), where
        # The target critics take no gradient: they move by Polyak averaging alone.
        assert all(grad is None for grad in entry["grads"]["qnet_target"].values()), where
    assert sum(float((u["discounts"] == 0).sum()) for u in updates) > 0, "some windows should terminate"


def test_each_temperature_update_follows_the_critic_updates_next_actions(probed):
    trace, _ = probed
    critics, temperatures = entries(trace, "update_critic"), entries(trace, "update_temperature")
    assert len(temperatures) == len(critics) == 50
    alphas = []
    for critic, entry in zip(critics, temperatures):
        where = f"temperature update after critic update {critic['critic_updates']}"
        assert entry["critic_updates"] == critic["critic_updates"], where
        _, next_log_probs, _ = soft_targets(critic)
        torch.testing.assert_close(entry["next_log_probs"].double(), next_log_probs, rtol=1e-4, atol=1e-4)
        log_alpha = entry["log_alpha"].double().clone().requires_grad_(True)
        weights = entry["weights"].double()
        loss = -(log_alpha.exp() * (next_log_probs + TARGET_ENTROPY) * weights).sum() / weights.sum()
        assert_gradients_match({"log_alpha": entry["grads"]["log_alpha"]}, gradients(loss, {"log_alpha": log_alpha}))
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-4), where
        assert all(grad is None for grad in entry["grads"]["qnet_target"].values()), where
        alphas.append(entry["log_alpha"].exp().item())
    assert alphas[0] == pytest.approx(0.001, rel=1e-5) and alphas[-1] != alphas[0]


def test_each_policy_update_climbs_the_critics_mean_q_less_alpha_log_pi_with_the_critics_and_alpha_fixed(probed):
    trace, _ = probed
    actors, critics = entries(trace, "update_actor"), entries(trace, "update_critic")
    temperatures = entries(trace, "update_temperature")
    assert [entry["critic_updates"] for entry in actors] == list(range(2, 51, 2))
    critic_by_update = {entry["critic_updates"]: entry for entry in critics}
    temperature_by_update = {entry["critic_updates"] + 1: entry for entry in temperatures}  # the one just before
    for entry in actors:
        where = f"policy update after critic update {entry['critic_updates']}"
        actor = leaves(entry["actor"])
        actions, log_probs = plain_policy(actor, entry["obs"], entry["noise"])
        q = [
            (
                torch.softmax(plain_critic_logits(entry["qnet"], i, entry["critic_obs"], actions), -1)
                * torch.as_tensor(SUPPORT)
            ).sum(-1)
            for i in (0, 1)
        ]
        alpha = entry["log_alpha"].double().exp()
        loss = (alpha * log_probs - (q[0] + q[1]) / 2).mean()
        assert_gradients_match(entry["grads"]["actor"], gradients(loss, actor), where)
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-4), where
        # alpha is held constant: log alpha's gradient is what the temperature update before it left.
        before = temperature_by_update[entry["critic_updates"]]
        assert_same_gradient(entry["grads"]["log_alpha"], before["grads"]["log_alpha"], where)
        if entry["critic_updates"] in critic_by_update:  # the critics as the policy step found them and left them
            after = critic_by_update[entry["critic_updates"]]
            assert_unchanged(entry["qnet"], after["qnet"], where)
            assert torch.equal(entry["log_alpha"], after["log_alpha"]), where
    # Polyak averaging after each critic update: the target the next critic update found.
    following = {id(a): b for a, b in zip(trace.backward, trace.backward[1:])}
    for before, after in zip(critics, critics[1:]):
        online = following[id(before)]["qnet"]  # the critics after this update's step
        for name, value in after["qnet_target"].items():
            expected = before["qnet_target"][name].double() + TAU * (
                online[name].double() - before["qnet_target"][name].double()
            )
            torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7)


def test_sampled_windows_are_stored_n_step_transitions(probed):
    trace, _ = probed
    final = trace.final["rb"]
    columns = {name: final[name] for name in ("rewards", "terminations", "truncations")}
    for entry in entries(trace, "update_critic")[::7]:
        stored = entry["rb"]["size"]
        for i in range(16):
            env = i // 8
            matches = [
                start
                for start in range(stored)
                if torch.equal(entry["actions"][i], final["actions"][env, start])
                and abs(
                    plain_window(
                        {k: v[:, :stored] for k, v in columns.items()}, env, start, stored - 1, N_STEPS, GAMMA
                    )[0]
                    - float(entry["rewards"][i])
                )
                < 1e-5
            ]
            assert matches, f"update {entry['critic_updates']}, row {i}"
            torch.testing.assert_close(
                entry["critic_obs"][i], normalise(entry["obs_normalizer"], final["obs"][env, matches[0]])
            )


def test_the_log_holds_sacs_keys(probed):
    _, cwd = probed
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    keys = ["losses/qf1_loss", "losses/qf2_loss", "losses/actor_loss", "losses/alpha", "losses/alpha_loss"]
    assert_finite_keys(scalars, keys + ["charts/episodic_return"])


# --- runs ----------------------------------------------------------------------------------------
RESUME_FLAGS = ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "300"]
RESUME_FLAGS += ["--batch-size", "32", "--learning-starts", "100", "--total-timesteps", "600", "--critic-hidden", "32"]
RESUME_FLAGS += ["--actor-hidden", "16", "--v-min", "-1000", "--v-max", "10", "--checkpoint-every", "200"]
RESUME_FLAGS += ["--num-updates", "2", "--policy-frequency", "2", "--save-model", "--eval-episodes", "1"]
RESUME_FLAGS += ["--log-every", "100", "--torch-threads", "1"]


def saved_weights(run_dir) -> dict:
    model = torch.load(run_dir / "fast_sac_isaacgym.cleanrl_model", weights_only=False)
    return {**model["actor"], **{f"norm.{k}": v for k, v in model["obs_normalizer"].items()}}


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] in (200, 400) and checkpoint["envs"] is not None
    assert checkpoint["log_alpha"].item() != pytest.approx(math.log(0.001))  # tuned by then, and saved
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir]
    (straight_dir,) = run_dirs(straight)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    keys = ["charts/episodic_return", "losses/qf1_loss", "losses/actor_loss", "losses/alpha", "losses/alpha_loss"]
    assert_finite_keys(straight_scalars, keys)
    for key in keys + ["eval/episodic_return"]:
        assert resumed_scalars[key] == straight_scalars[key], key
    a, b = saved_weights(run_dir), saved_weights(straight_dir)
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_envpool_smoke_saves_and_evaluates_and_task_names_map_onto_v5_ids(workdir):
    flags = ["--simulator", "envpool", "--env-id", "Hopper", "--num-envs", "4", "--buffer-size", "100"]
    flags += ["--batch-size", "32", "--learning-starts", "200", "--total-timesteps", "400", "--critic-hidden", "32"]
    flags += ["--actor-hidden", "16", "--num-updates", "2", "--policy-frequency", "2", "--save-model"]
    flags += ["--eval-episodes", "2", "--torch-threads", "1"]
    result = run_script(SCRIPT, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "simulator: envpool, task Hopper" in result.stdout
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, ["losses/qf1_loss", "losses/alpha_loss", "losses/actor_loss", "eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    assert fast_sac.gymnasium_id("Hopper") == "Hopper-v5" and fast_sac.gymnasium_id("Pendulum-v1") == "Pendulum-v1"


def test_amp_trains_in_bf16_autocast_and_keeps_everything_stored_in_float32(workdir):
    flags = ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "200"]
    flags += ["--batch-size", "32", "--learning-starts", "100", "--total-timesteps", "200", "--critic-hidden", "32"]
    flags += ["--actor-hidden", "16", "--v-min", "-1000", "--v-max", "10", "--log-every", "100", "--amp"]
    flags += ["--num-updates", "2", "--policy-frequency", "2", "--checkpoint-every", "200", "--torch-threads", "1"]
    result = run_script(SCRIPT, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), ["losses/qf1_loss", "losses/actor_loss", "losses/alpha_loss"])
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    stored = [*checkpoint["actor"].values(), *checkpoint["qnet"].values(), *checkpoint["qnet_target"].values()]
    stored += [value for key, value in checkpoint["replay_buffer"].items() if key in ("obs", "actions", "rewards")]
    assert all(value.dtype == torch.float32 for value in stored + [checkpoint["log_alpha"]])


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--simulator", "gymnasium", "--env-id", "CartPole-v1"], ["1-D Box actions"]),
        (
            ["--simulator", "mujoco-warp", "--env-id", "Hopper-v5"],
            ["unknown task 'Hopper-v5'", "--simulator gymnasium"],
        ),
        (["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--buffer-size", "10000000000"], ["replay buffer"]),
        (["--simulator", "envpool", "--env-id", "Hopper-v5"], ["unknown task 'Hopper-v5'", "--env-id Hopper;"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(batch_size=8, num_envs=16), "--batch-size 8 is below --num-envs 16"),
        (dict(v_min=1.0, v_max=1.0), "the support needs --v-min < --v-max"),
        (dict(log_std_min=0.0, log_std_max=-1.0), "--log-std-min < --log-std-max"),
        (dict(alpha_init=0.0), "--alpha-init must be positive"),
        (dict(tau=0.0), "--gamma and --tau must be in (0, 1]"),
        (dict(capture_video=True), "--capture-video is not supported"),
        (dict(gamma=1.0), "--gamma 1 puts no bound on the returns"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = fast_sac.Args(**{"simulator": "gymnasium", "env_id": "Pendulum-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        fast_sac.validate(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines


def test_the_task_gives_the_critics_support_unless_it_is_given():
    small = dict(num_envs=2, buffer_size=10, batch_size=2)
    for env_id, simulator, expected in [
        ("Hopper-v5", "gymnasium", (-1 / 0.03, 5 / 0.03)),  # gamma 0.97, the authors'
        ("Humanoid", "mujoco-warp", (-1 / 0.03, 12 / 0.03)),
        ("Pendulum-v1", "gymnasium", fast_sac.DEFAULT_SUPPORT),
    ]:
        args = fast_sac.Args(simulator=simulator, env_id=env_id, **small)
        fast_sac.validate(args)
        assert (args.v_min, args.v_max) == pytest.approx(expected), env_id


def test_actions_of_a_task_without_bounds_are_the_policys_own():
    """mjlab's tasks have no action bounds (joint offsets): the policy's [-1, 1] goes to the task as it is; finite
    bounds keep their mapping."""
    from types import SimpleNamespace

    envs = SimpleNamespace(action_low=torch.tensor([-np.inf, -2.0]), action_high=torch.tensor([np.inf, 3.0]))
    low, high = fast_sac.action_bounds(envs)
    actions = torch.tensor([[0.5, 1.0], [-1.0, -1.0]])
    assert torch.equal(fast_sac.to_env_actions(actions, low, high), torch.tensor([[0.5, 3.0], [-1.0, -2.0]]))
