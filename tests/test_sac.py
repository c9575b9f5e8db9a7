"""sac_continuous_action.py: its own loop under tests/probe.py (stored rows, acting, every critic loss, every policy
and alpha loss, their gradients and Adam steps against plain references, the critics unmoved by the policy step, no
gradient into the targets, Polyak timing); smoke runs (classic control, MuJoCo,
dm_control), the squashed Gaussian and the soft Q target against their definitions, the twin critics against two
plain q_networks, the replay buffer's named fields, bad input, checkpoints and exact resume, learning."""

from __future__ import annotations

import math
from pathlib import Path

import continuous_reference as plain
import gymnasium as gym
import numpy as np
import pytest
import sac_continuous_action as sac
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
from update_reference import (
    assert_gradients_match,
    assert_no_gradient,
    assert_same_gradient,
    assert_unchanged,
    gradients,
    leaves,
)

SCRIPT = "sac_continuous_action.py"
SMALL = ["--batch-size", "32", "--buffer-size", "1000"]
TINY = [*SMALL, "--learning-starts", "200"]
LOSS_KEYS = [
    "losses/qf1_values",
    "losses/qf2_values",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/qf_loss",
    "losses/actor_loss",
    "losses/alpha",
    "losses/alpha_loss",
]
SAC_KEYS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", *LOSS_KEYS]


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs: 88 steps of random actions, then 16 critic steps,
# 8 rounds of 2 policy steps and a Polyak update every 2nd critic step (--target-network-frequency 2). The tests
# rebuild what the loop stored and computed from the copies with plain references (tests/continuous_reference.py)
# that read the networks from their state dicts; each backward()'s gradients are compared with a float64 reference
# loss's. The run logs once (step 100): its TensorBoard keys are checked too.
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "120", "--batch-size", "16"]
PROBE_FLAGS += ["--learning-starts", "88", "--total-timesteps", "104", "--gamma", "0.9", "--tau", "0.1"]
PROBE_FLAGS += ["--target-network-frequency", "2"]
PROBE_STEP_NAMES = ["obs_np", "next_obs_np", "actions", "rewards", "terminations", "truncations", "infos"]
PROBE_AT_BACKWARD = ["batch", "noise", "obs", "t", "alpha", "log_alpha", "actor_loss", "alpha_loss"]
PROBE_AT_BACKWARD += ["actor", "qf", "qf_target", "actor_optimizer"]
GAMMA, TAU, LEARNING_STARTS, TARGET_ENTROPY = 0.9, 0.1, 88, -2.0  # -|A| for ProbeDrift's two action dimensions
ACTOR_PARAMETERS = [name for name, _ in sac.Actor(4, np.zeros(2), np.ones(2)).named_parameters()]


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
        grads=["qf", "actor", "log_alpha", "qf_target"],
        final=["rb"],
        preload=["probe_box_envs"],
    )
    return trace, cwd


def probe_steps(trace) -> list[dict]:
    return [entry for entry in trace.steps if entry["step"] > 0]


def test_the_loop_stores_each_step_with_the_true_next_observation_and_only_terminations(probed):
    trace, cwd = probed
    steps = probe_steps(trace)
    assert len(steps) == 52
    ends = plain.check_stored_rows(steps, trace.final["rb"], 4, 2, actions_name="actions")
    assert min(ends.values()) >= 5, ends
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), LOSS_KEYS)


def test_acting_samples_the_squashed_gaussian_of_the_policy_of_the_moment(probed):
    trace, _ = probed
    steps = [step for step in probe_steps(trace) if step["step"] - 2 >= LEARNING_STARTS]
    assert len(steps) == 8
    scale, bias = torch.tensor([1.5, 2.5], dtype=torch.float64), torch.tensor([0.5, 2.5], dtype=torch.float64)
    residuals = []
    for step in steps:
        # The policy that acted: the first backward of this step's updates comes before any policy step.
        actor = next(entry for entry in trace.backward if entry["step"] == step["step"])["actor"]
        with torch.no_grad():
            mean, log_std = plain.policy_head(actor, torch.as_tensor(step["obs_np"]))
        residuals.append(plain.gaussian_residuals(step["actions"], mean, log_std, scale, bias))
    residuals = torch.cat(residuals)
    assert residuals.std().item() == pytest.approx(1.0, rel=0.35) and abs(residuals.mean().item()) < 0.5


def critic_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_critics"]


def policy_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_actor"]


def test_each_critic_step_regresses_on_the_soft_target_of_the_next_action_from_real_transitions(probed):
    trace, _ = probed
    rows = plain.buffer_rows(trace.final["rb"], 4, 2)
    stored = {plain.row_key(rows, i) for i in range(104)}
    updates = critic_entries(trace)
    assert [entry["t"] for entry in updates] == list(range(LEARNING_STARTS + 1, 105))  # one per env step
    terminal_targets = 0
    # The policy's and alpha's gradients as the latest policy step left them (none before the first).
    left = {"actor": dict.fromkeys(ACTOR_PARAMETERS), "log_alpha": None}
    for entry in trace.backward:
        if entry["where"] == "update_actor":
            left = entry["grads"]
            continue
        batch, where = entry["batch"], f"update {entry['t']}"
        assert all(plain.row_key(batch, i) in stored for i in range(16)), "a sampled row was never stored"
        assert torch.equal(entry["alpha"], entry["log_alpha"].exp())  # alpha follows log_alpha
        alpha = entry["log_alpha"].double().exp()
        qf = leaves(entry["qf"])
        with torch.no_grad():  # the target held constant, from the target critics and the policy
            # a' ~ pi(.|s') from this step's noise; the entropy term takes the log-probability of a', not of a.
            next_actions, next_log_prob = plain.squashed_gaussian(entry["actor"], batch["next_obs"], entry["noise"])
            next_q = torch.minimum(
                *(plain.stacked_critic(entry["qf_target"], i, batch["next_obs"], next_actions) for i in (0, 1))
            )
            soft_value = next_q - alpha * next_log_prob
            target = batch["rewards"].double() + GAMMA * (1 - batch["terminations"].double()) * soft_value
        expected = sum(
            ((plain.stacked_critic(qf, i, batch["obs"], batch["actions"]) - target) ** 2).mean() for i in (0, 1)
        )
        assert_gradients_match(entry["grads"]["qf"], gradients(expected, qf), where)
        # No gradient through the target: none reaches the target critics, none is added to the policy's or alpha's.
        assert_no_gradient(entry["grads"]["qf_target"], where)
        assert_same_gradient(entry["grads"]["actor"], left["actor"], where)
        assert_same_gradient(entry["grads"]["log_alpha"], left["log_alpha"], where)
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        terminal_targets += int(batch["terminations"].sum())
    assert terminal_targets > 10, "sampled transitions should end episodes"
    assert updates[-1]["alpha"].item() < 1.0  # alpha (from 1) was tuned


def test_the_policy_and_alpha_take_policy_frequency_steps_every_policy_frequency_critic_steps(probed):
    trace, _ = probed
    critics, policies = critic_entries(trace), policy_entries(trace)
    assert [entry["t"] for entry in policies] == [
        t for t in range(LEARNING_STARTS + 1, 105) if t % 2 == 0 for _ in "ab"
    ]
    by_t = {entry["t"]: entry for entry in critics}
    following = {id(entry): after for entry, after in zip(trace.backward, trace.backward[1:])}
    for k, entry in enumerate(policies):
        obs = entry["obs"]
        assert torch.equal(obs, by_t[entry["t"]]["batch"]["obs"])  # the critic step's minibatch, both times
        assert k % 2 == 0 or not torch.equal(entry["noise"], policies[k - 1]["noise"])  # fresh noise each step
        alpha = entry["log_alpha"].double().exp()
        assert torch.equal(entry["alpha"], entry["log_alpha"].exp())

        def policy_loss(actor_state: dict):
            actions, log_prob = plain.squashed_gaussian(actor_state, obs, entry["noise"])
            q = torch.minimum(*(plain.stacked_critic(entry["qf"], i, obs, actions) for i in (0, 1)))
            return (alpha * log_prob - q).mean(), log_prob

        where = f"policy step {k} at t={entry['t']}"
        # The one backward of the policy loss plus alpha's: alpha a constant in the first, the critics' weights
        # constants, and the log-probabilities constants in alpha's (only log_alpha gets its gradient).
        params = leaves(entry["actor"]) | {"log_alpha": entry["log_alpha"].double().requires_grad_(True)}
        reference_loss, reference_log_prob = policy_loss(params)
        reference_alpha_loss = (-params["log_alpha"].exp() * (reference_log_prob.detach() + TARGET_ENTROPY)).mean()
        reference = gradients(reference_loss + reference_alpha_loss, params)
        assert_gradients_match(entry["grads"]["actor"], reference, where)
        assert_gradients_match({"log_alpha": entry["grads"]["log_alpha"]}, reference, where)
        # The critics are held still: no gradient added to theirs (as their own step left it), none to the targets',
        # and their weights are those the next critic step starts from.
        assert_same_gradient(entry["grads"]["qf"], by_t[entry["t"]]["grads"]["qf"], where)
        assert_no_gradient(entry["grads"]["qf_target"], where)
        if entry["t"] + 1 in by_t:
            assert_unchanged(entry["qf"], by_t[entry["t"] + 1]["qf"], where)
        with torch.no_grad():
            loss, log_prob = policy_loss(entry["actor"])
            alpha_loss = (-alpha * (log_prob + TARGET_ENTROPY)).mean()
        assert entry["actor_loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        assert entry["alpha_loss"].item() == pytest.approx(alpha_loss.item(), rel=1e-5), where
        assert entry["loss"].item() == pytest.approx((loss + alpha_loss).item(), rel=1e-5, abs=1e-6), where
        # The step itself: Adam on the policy loss's gradient (the critics and alpha held still) and on alpha's.
        if id(entry) in following:
            after = following[id(entry)]
            new_actor, new_log_alpha = plain.policy_and_alpha_step(entry, policy_loss, TARGET_ENTROPY, ACTOR_PARAMETERS)
            for name, value in new_actor.items():
                torch.testing.assert_close(after["actor"][name].double(), value, rtol=1e-4, atol=2e-6, msg=where)
            torch.testing.assert_close(after["log_alpha"].double(), new_log_alpha, rtol=1e-4, atol=2e-6, msg=where)


def test_the_targets_follow_by_polyak_averaging_every_target_network_frequency_critic_steps(probed):
    trace, _ = probed
    critics = critic_entries(trace)
    assert all(torch.equal(critics[0]["qf_target"][k], critics[0]["qf"][k]) for k in critics[0]["qf"])
    following = {id(entry): after for entry, after in zip(trace.backward, trace.backward[1:])}
    for before, after in zip(critics, critics[1:]):
        where = f"after t={before['t']}"
        if before["t"] % 2 == 0:  # the critics after this step (as the next backward found them) pulled in by tau
            online = following[id(before)]["qf"]
            for name, value in after["qf_target"].items():
                expected = before["qf_target"][name].double() + TAU * (
                    online[name].double() - before["qf_target"][name].double()
                )
                torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7, msg=where)
        else:
            assert all(torch.equal(after["qf_target"][k], before["qf_target"][k]) for k in before["qf_target"]), where


# --- smoke runs ----------------------------------------------------------------------------------


def test_smoke_pendulum_two_envs_with_video_and_saved_model(workdir):
    result = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--learning-starts",
        "100",
        "--num-envs",
        "2",
        "--total-timesteps",
        "400",
        "--capture-video",
        "--save-model",
        "--eval-episodes",
        "1",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, SAC_KEYS + ["eval/episodic_return"])
    assert len(scalars["charts/episodic_return"]) == 2  # one 200-step episode in each environment
    assert len(scalars["eval/episodic_return"]) == 1
    assert (run_dir / "sac_continuous_action.cleanrl_model").is_file() and (run_dir / "args.json").is_file()
    assert list((run_dir / "videos").glob("*.mp4")), "no video written"
    assert "400/400 steps" in result.stdout  # the progress display's final line


def test_smoke_dm_control_flattens_dict_observations(workdir):
    result = run_script(
        SCRIPT,
        "--env-id",
        "dm_control/cheetah-run-v0",
        *SMALL,
        "--learning-starts",
        "100",
        "--total-timesteps",
        "300",
        "--save-model",
        "--eval-episodes",
        "1",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    # dm_control episodes last 1000 steps: none ends in training, so no episodic return is logged there.
    assert_finite_keys(scalars, ["charts/SPS", *LOSS_KEYS, "eval/episodic_return"])
    model = torch.load(run_dir / "sac_continuous_action.cleanrl_model", weights_only=False)
    assert (model["obs_dim"], model["act_dim"]) == (8 + 9, 6)  # position (8) and velocity (9), flattened


# --- the maths -----------------------------------------------------------------------------------

LOW = np.array([-1.0, 0.0, 2.0])
HIGH = np.array([3.0, 0.5, 10.0])  # asymmetric bounds of different widths


def normal_log_density(u: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (-0.5 * ((u - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)


def from_env_action(action: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """An action within the bounds -> [-1, 1], the inverse of sac.to_env_action."""
    return (action - bias) / scale


def squash_numpy(u: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """a = tanh(u) mapped onto [low, high], written from the definition."""
    return low + (np.tanh(u) + 1.0) / 2.0 * (high - low)


def test_squashed_log_prob_matches_finite_difference_change_of_variables():
    rng = np.random.default_rng(0)
    scale, _ = sac.action_scale_and_bias(LOW, HIGH)
    for _ in range(20):
        mean, log_std = rng.normal(size=3), rng.uniform(-2, 1, size=3)
        u = mean + np.exp(log_std) * rng.normal(size=3)
        # log p(a) = log N(u) - log |det da/du|, with the Jacobian from central differences.
        h = 1e-6
        jacobian = np.stack(
            [(squash_numpy(u + h * e, LOW, HIGH) - squash_numpy(u - h * e, LOW, HIGH)) / (2 * h) for e in np.eye(3)],
            axis=1,
        )
        t = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
        reference = normal_log_density(t(u), t(mean), t(np.exp(log_std))) - np.linalg.slogdet(jacobian)[1]
        noise = (u - mean) / np.exp(log_std)
        got = sac.squashed_gaussian_log_prob(t(u), t(noise), t(log_std), scale.double())
        assert got.dtype == torch.float64
        assert got.item() == pytest.approx(reference.item(), rel=1e-7, abs=1e-7)


def test_squashed_density_integrates_to_one_over_asymmetric_bounds():
    low, high = np.array([-1.0]), np.array([3.0])
    scale, bias = (t.double() for t in sac.action_scale_and_bias(low, high))
    mean, log_std = torch.tensor([0.4], dtype=torch.float64), torch.tensor([-0.3], dtype=torch.float64)
    a = torch.linspace(-1.0, 3.0, 400_001, dtype=torch.float64)[1:-1].unsqueeze(-1)
    u = torch.atanh(from_env_action(a, scale, bias))
    density = sac.squashed_gaussian_log_prob(u, (u - mean) / log_std.exp(), log_std, scale).exp()
    assert np.trapezoid(density.numpy(), a[:, 0].numpy()) == pytest.approx(1.0, abs=1e-4)


def test_squashed_log_prob_is_exact_where_tanh_saturates():
    u = torch.tensor([[-30.0], [-12.0], [0.0], [12.0], [30.0]])  # tanh(u) rounds to +-1 in float32 at |u| >= 9
    log_std = torch.zeros_like(u)
    got = sac.squashed_gaussian_log_prob(u, u, log_std, torch.ones(1))
    # log(1 - tanh(u)^2) = -2 log cosh(u) = -2 (|u| + log(1 + exp(-2|u|)) - log 2)
    log_det = -2.0 * (u.abs() + torch.log1p(torch.exp(-2.0 * u.abs())) - math.log(2.0))
    expected = (-0.5 * u**2 - 0.5 * math.log(2 * math.pi) - log_det).squeeze(-1)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, rtol=1e-6)


def test_actor_sample_returns_the_log_density_of_its_action():
    torch.manual_seed(0)
    actor = sac.Actor(5, LOW, HIGH).double()
    obs = torch.randn(64, 5, dtype=torch.float64)
    actions, log_prob = actor.sample(obs)
    low, high = torch.tensor(LOW), torch.tensor(HIGH)
    assert ((actions > low) & (actions < high)).all()
    mean, log_std = actor(obs)
    assert (log_std >= sac.LOG_STD_MIN).all() and (log_std <= sac.LOG_STD_MAX).all()
    u = torch.atanh(from_env_action(actions, actor.action_scale, actor.action_bias))
    # Change of variables, the textbook way: log N(u) - sum log(scale * (1 - tanh(u)^2)).
    reference = normal_log_density(u, mean, log_std.exp()) - torch.log(
        actor.action_scale * (1 - torch.tanh(u) ** 2)
    ).sum(-1)
    assert torch.allclose(log_prob, reference, rtol=1e-6, atol=1e-6)
    mean_actions = actor.mean_action(obs)
    assert torch.allclose(mean_actions, sac.to_env_action(torch.tanh(mean), actor.action_scale, actor.action_bias))


def test_action_scaling_round_trips_asymmetric_bounds():
    low, high = np.array([-1.0, 0.0, 2.0, -10.0], dtype=np.float32), np.array([3.0, 0.5, 10.0, -4.0], dtype=np.float32)
    scale, bias = sac.action_scale_and_bias(low, high)
    assert scale.dtype == bias.dtype == torch.float32
    ones = torch.ones(4)
    assert torch.equal(sac.to_env_action(-ones, scale, bias), torch.from_numpy(low))
    assert torch.equal(sac.to_env_action(ones, scale, bias), torch.from_numpy(high))
    assert torch.allclose(sac.to_env_action(0 * ones, scale, bias), torch.from_numpy((low + high) / 2))
    squashed = torch.rand(1000, 4) * 2 - 1
    actions = sac.to_env_action(squashed, scale, bias)
    assert ((actions >= torch.from_numpy(low)) & (actions <= torch.from_numpy(high))).all()
    assert torch.allclose(from_env_action(actions, scale, bias), squashed, atol=1e-6)
    assert torch.allclose(from_env_action(torch.from_numpy(low), scale, bias), -ones)


def test_random_actions_are_uniform_within_asymmetric_bounds():
    low, high = np.array([-1.0, 0.0, 2.0], dtype=np.float32), np.array([3.0, 0.5, 10.0], dtype=np.float32)
    scale, bias = sac.action_scale_and_bias(low, high)
    torch.manual_seed(0)
    actions = sac.random_actions(50_000, scale, bias)
    torch.manual_seed(0)
    assert torch.equal(sac.random_actions(50_000, scale, bias), actions)  # torch's RNG: reproducible
    width = torch.from_numpy(high - low)
    assert actions.shape == (50_000, 3)
    assert ((actions >= torch.from_numpy(low)) & (actions <= torch.from_numpy(high))).all()
    assert torch.allclose(actions.mean(0), torch.from_numpy((low + high) / 2), atol=0.01 * width.max().item())
    assert torch.allclose(actions.std(0), width / math.sqrt(12), rtol=0.02)  # the std of a uniform distribution
    assert torch.allclose(actions.amin(0), torch.from_numpy(low), atol=1e-3 * width.max().item())
    assert torch.allclose(actions.amax(0), torch.from_numpy(high), atol=1e-3 * width.max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_soft_q_target_cuts_the_bootstrap_only_at_terminations(dtype):
    gamma, alpha = 0.9, 0.5
    rewards = [1.0, 0.5, -1.0, 2.0]
    next_q_min = [3.0, 4.0, 5.0, -6.0]
    next_log_prob = [0.2, -1.0, 0.0, 3.0]
    # 0: terminated; 1: truncated by a time limit (stored as not terminated); 2: mid-episode;
    # 3: terminated with a negative soft value (must not leak into the target either).
    terminations = [1.0, 0.0, 0.0, 1.0]
    expected = [
        r if done else r + gamma * (q - alpha * lp)
        for r, q, lp, done in zip(rewards, next_q_min, next_log_prob, terminations)
    ]
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    got = sac.soft_q_target(t(rewards), t(terminations), t(next_q_min), t(next_log_prob), t(alpha), gamma)
    assert got.dtype == dtype
    assert got.tolist() == pytest.approx(expected)
    assert got[1].item() == pytest.approx(0.5 + 0.9 * (4.0 + 0.5))


def test_twin_critics_are_two_plain_q_networks_and_frozen_ones_pass_gradients_to_the_actions_only():
    torch.manual_seed(0)
    qf = sac.TwinQNetwork(5, 2)
    obs = torch.randn(16, 5)
    actions = torch.randn(16, 2, requires_grad=True)
    q = qf(obs, actions)
    assert q.shape == (2, 16)
    for i in range(2):  # critic i is an ordinary q_network holding slice i of the stacked parameters
        critic = sac.q_network(5, 2)
        layers = {"0": (qf.w1[i].T, qf.b1[i, 0]), "2": (qf.w2[i].T, qf.b2[i, 0]), "4": (qf.w3[i], qf.b3[i])}
        critic.load_state_dict(
            {f"{k}.weight": w for k, (w, _) in layers.items()} | {f"{k}.bias": b for k, (_, b) in layers.items()}
        )
        torch.testing.assert_close(q[i], critic(torch.cat([obs, actions], dim=-1)).squeeze(-1))
    assert not torch.allclose(q[0], q[1])  # independently initialised
    bound = 1 / 256**0.5  # nn.Linear's initialisation of the hidden layer: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert qf.w2.abs().max() <= bound and qf.w2.abs().max() > 0.95 * bound
    (grad_actions,) = torch.autograd.grad(q.sum(), actions)
    qf.requires_grad_(False)  # as in the policy's step: through the critics, not into their weights
    frozen = qf(obs, actions)
    assert torch.equal(frozen, q.detach())
    frozen.sum().backward()
    assert all(p.grad is None for p in qf.parameters())
    assert torch.allclose(actions.grad, grad_actions)


# --- the replay buffer ---------------------------------------------------------------------------


def test_buffer_stores_the_true_final_observation_and_only_terminations():
    gym.register(
        "PendulumFiveSteps-v1", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv", max_episode_steps=5
    )
    envs = sac.make_envs("PendulumFiveSteps-v1", 2)
    rb = sac.ReplayBuffer(100, 2, 3, 1, torch.device("cpu"))
    obs, _ = envs.reset(seed=3)
    obs = obs.astype(np.float32)
    returned, actions_taken = [], []
    for step in range(7):
        actions = np.array([[0.5 * step - 1.0], [1.5]], dtype=np.float32)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        rb.add(obs, next_obs, actions, rewards, terminations, infos)
        obs = next_obs.astype(np.float32)
        returned.append(obs)
        actions_taken.append(actions)
    envs.close()
    for env_index in range(2):
        plain = gym.make("PendulumFiveSteps-v1")  # the same episode without vector env or autoreset
        seen = [plain.reset(seed=3 + env_index)[0]]
        for step in range(5):
            seen.append(plain.step(actions_taken[step][env_index])[0])
        rows = rb.fields(rb.data[env_index:14:2])  # this env's transitions, in step order, by field
        np.testing.assert_allclose(rows.next_obs[4].numpy(), seen[5], rtol=1e-6)  # the true final observation
        assert not np.allclose(rows.next_obs[4].numpy(), returned[4][env_index])  # not the reset one
        np.testing.assert_array_equal(rows.obs[5].numpy(), returned[4][env_index])  # the next episode starts from it
        np.testing.assert_array_equal(rows.actions[:, 0].numpy(), [a[env_index, 0] for a in actions_taken])
        assert rows.terminations.eq(0).all()  # a truncation is not a termination: it bootstraps
        for t in range(4):
            np.testing.assert_array_equal(rows.next_obs[t].numpy(), rows.obs[t + 1].numpy())
    batch = rb.sample(50)
    assert batch._fields == ("obs", "next_obs", "actions", "rewards", "terminations")
    assert [t.shape for t in batch] == [(50, 3), (50, 3), (50, 1), (50,), (50,)]


def test_buffer_wraps_around_and_keeps_the_newest_transitions():
    rb = sac.ReplayBuffer(5, 3, 2, 1, torch.device("cpu"))
    for step in range(4):  # 3 envs x 4 steps: transitions k = 0..11, transition k goes to row k % 5
        obs = np.full((3, 2), step, dtype=np.float32) + np.arange(3, dtype=np.float32)[:, None] / 10
        rb.add(obs, obs + 1, obs[:, :1], obs[:, 0], np.zeros(3, dtype=bool), {})
    assert (rb.size, rb.pos) == (5, 12 % 5)
    fields = rb.fields(rb.data)
    for k in range(7, 12):  # the newest five
        value = k // 3 + (k % 3) / 10  # step + env / 10
        row = k % 5
        assert fields.obs[row].tolist() == pytest.approx([value, value])
        assert fields.next_obs[row].tolist() == pytest.approx([value + 1, value + 1])
        assert fields.actions[row, 0].item() == pytest.approx(value) and fields.rewards[row].item() == pytest.approx(
            value
        )


def test_buffer_flags_hopper_terminations():
    envs = sac.make_envs("Hopper-v5", 1)
    rb = sac.ReplayBuffer(500, 1, 11, 3, torch.device("cpu"))
    obs, _ = envs.reset(seed=0)
    for step in range(300):
        actions = np.full((1, 3), 1.0, dtype=np.float32)  # full torque: the hopper falls within ~100 steps
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        rb.add(obs, next_obs, actions, rewards, terminations, infos)
        obs = next_obs
        if terminations[0]:
            break
    envs.close()
    assert terminations[0] and not truncations[0]
    fields = rb.fields(rb.data[: rb.size])
    assert fields.terminations[-1].item() == 1.0 and fields.terminations[:-1].eq(0).all()
    np.testing.assert_allclose(fields.next_obs[-1].numpy(), infos["final_obs"][0], rtol=1e-6)


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["Box", "cleanrl/dqn.py"]),
        (
            ["--env-id", "Pendulum-v1", "--buffer-size", "256", "--batch-size", "512"],
            ["--batch-size 512 is larger than --buffer-size 256"],
        ),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


def test_a_replay_buffer_that_cannot_fit_is_refused_before_allocation(workdir):
    # 10^12 rows of Pendulum transitions (3 + 3 + 1 + 1 + 1 float32 each) are 36,000 GB.
    result = run_script(SCRIPT, "--env-id", "Pendulum-v1", "--buffer-size", "1000000000000", cwd=workdir)
    assert result.returncode == 2
    assert_bad_input(result, workdir, "--buffer-size", "replay buffer needs 36000.0 GB", "GB available")


class UnboundedActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Box(-np.inf, np.inf, (2,))


gym.register("UnboundedAction-v0", entry_point=UnboundedActionEnv)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(total_timesteps=0), "--total-timesteps must be positive"),
        (dict(buffer_size=0), "--buffer-size must be positive"),
        (dict(batch_size=-1), "--batch-size must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(policy_frequency=0), "--policy-frequency must be positive"),
        (dict(q_lr=0.0), "--q-lr must be positive"),
        (dict(learning_starts=-1), "--learning-starts must be 0 or positive"),
        (dict(total_timesteps=1000, learning_starts=1000), "--learning-starts 1000 is not below --total-timesteps"),
        (dict(tau=0.0), "--tau must be in (0, 1]"),
        (dict(gamma=1.5), "--gamma and --tau must be in (0, 1]"),
        (dict(alpha=-0.1), "--alpha must be 0 or positive"),
        (dict(num_envs=8, buffer_size=4, batch_size=4), "--num-envs 8 is larger than --buffer-size 4"),
        (dict(env_id="Pendulm-v1"), "unknown environment id 'Pendulm-v1'; did you mean Pendulum-v1"),
        (dict(env_id="UnboundedAction-v0"), "finite bounds"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = sac.Args(**{"env_id": "Pendulum-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        sac.validate(args)
    assert exit_info.value.code != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


def test_resume_rejects_another_scripts_checkpoint(workdir):
    from cleanrl_utils.checkpoint import CHECKPOINT_FORMAT

    path = workdir / "dqn.pt"
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "script": "dqn",
            "env_id": "Pendulum-v1",
            "args": {"exp_name": "dqn", "env_id": "Pendulum-v1"},
        },
        path,
    )
    result = run_script(SCRIPT, "--env-id", "Pendulum-v1", "--resume", str(path), cwd=workdir)
    assert_bad_input(result, workdir, "written by dqn.py, not sac_continuous_action.py")


# --- checkpoints and exact resume ----------------------------------------------------------------


def episodic_returns(run_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(run_dir)["charts/episodic_return"]


def saved_weights(run_dir: Path) -> dict:
    model = torch.load(run_dir / "sac_continuous_action.cleanrl_model", weights_only=False)
    return {**{f"actor.{k}": v for k, v in model["actor"].items()}, **{f"qf.{k}": v for k, v in model["qf"].items()}}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# The buffer (500) is smaller than the run (800 steps): the resumed run also wraps around.
RESUME_FLAGS = [
    "--env-id",
    "Pendulum-v1",
    "--batch-size",
    "32",
    "--buffer-size",
    "500",
    "--learning-starts",
    "150",
    "--total-timesteps",
    "800",
    "--checkpoint-every",
    "300",
    "--save-model",
    "--eval-episodes",
    "1",
]


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr

    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    assert not (run_dir / "sac_continuous_action.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    step = checkpoint["global_step"]  # 300 unless the poll above was held up for a whole interval
    assert step in (300, 600) and checkpoint["replay_buffer"]["size"] == min(step, 500)
    assert checkpoint["log_alpha"].item() != 0.0  # learning had started
    assert not {"next_log", "critic_stats", "actor_stats"} & checkpoint.keys()  # no logging state is checkpointed

    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir], "resume must continue the same run directory"
    (straight_dir,) = run_dirs(straight)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    for key in ("charts/episodic_return", "losses/qf1_loss", "losses/actor_loss", "losses/alpha"):
        assert resumed_scalars[key] == straight_scalars[key], key
    assert len(straight_scalars["charts/episodic_return"]) == 4
    assert_same_weights(saved_weights(run_dir), saved_weights(straight_dir))


def test_hopper_smoke_then_resume_continues_exactly(workdir):
    # A checkpoint at step 400 of a 700-step run stays on disk; resuming from it must redo
    # steps 401-700 exactly: Hopper's physics, its random generator and the episode counters.
    flags = [
        "--env-id",
        "Hopper-v5",
        *SMALL,
        "--learning-starts",
        "200",
        "--total-timesteps",
        "700",
        "--checkpoint-every",
        "400",
        "--save-model",
        "--eval-episodes",
        "1",
    ]
    result = run_script(SCRIPT, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, SAC_KEYS + ["eval/episodic_return"])  # random Hopper episodes end within ~100 steps
    straight_returns, straight_weights = scalars["charts/episodic_return"], saved_weights(run_dir)
    assert sum(step > 400 for step, _ in straight_returns) >= 3  # episodes end after the checkpoint
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["global_step"] == 400

    resumed = run_script(SCRIPT, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert "fresh" not in resumed.stdout
    assert episodic_returns(run_dir) == straight_returns
    assert_same_weights(saved_weights(run_dir), straight_weights)


def test_sigterm_writes_checkpoint_and_exits_zero(workdir):
    out, run_dir = sigterm_while_training(
        SCRIPT, ["--env-id", "Pendulum-v1", *TINY, "--total-timesteps", "10000000"], workdir
    )
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 10_000_000
    assert checkpoint["replay_buffer"]["size"] == min(checkpoint["global_step"], 1000)
    for key in ("actor", "qf", "qf_target", "q_optimizer", "actor_optimizer", "log_alpha", "envs", "rng"):
        assert checkpoint[key] is not None, key
