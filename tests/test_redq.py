"""redq_continuous_action.py: the target entropy (the authors' per-task choice); its own loop under tests/probe.py
(stored rows, acting, G critic steps per env step, every loss and its gradients against the min of the drawn target
critics and the mean of all, no gradient into the targets, the critics unmoved by the policy step, the policy and
alpha's Adam steps, Polyak after every critic step); the random draw of the target
critics, the target of exactly the two drawn ones, the batched ensemble against N plain q_networks (outputs and
gradients), bad input, a smoke run with a saved model, SIGKILL + --resume exactness on Pendulum; and
benchmark/steps_to_threshold.py's reader."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import continuous_reference as plain
import numpy as np
import pytest
import redq_continuous_action as redq
import torch
from conftest import (
    ROOT,
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
)
from update_reference import (
    assert_gradients_match,
    assert_no_gradient,
    assert_same_gradient,
    assert_unchanged,
    gradients,
    leaves,
)

sys.path.insert(0, str(ROOT / "benchmark"))


def steps_to_threshold():
    """benchmark/steps_to_threshold.py; the copies tests/mutants/run.py makes leave benchmark/ out: skipped there."""
    return pytest.importorskip("steps_to_threshold")


SCRIPT = "redq_continuous_action.py"
LOSS_KEYS = [
    "losses/qf_values",
    "losses/qf_values_std",
    "losses/qf_loss",
    "losses/actor_loss",
    "losses/alpha",
    "losses/alpha_loss",
]
REDQ_KEYS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", *LOSS_KEYS]


# --- the target entropy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id, act_dim, expected",
    [
        ("Hopper-v5", 3, -1.0),  # MBPO's values, as the REDQ authors use them (redq/algos/core.py) ...
        ("HalfCheetah-v5", 6, -3.0),
        ("Walker2d-v5", 6, -3.0),
        ("Ant-v5", 8, -4.0),
        ("Humanoid-v5", 17, -2.0),
        ("Hopper-v4", 3, -1.0),  # ... listed there for v2-v4, the same tasks
        ("HumanoidStandup-v5", 17, -17.0),  # ... and -|A| for every other task
        ("Pendulum-v1", 1, -1.0),
        ("dm_control/walker-walk-v0", 6, -6.0),
        ("HopperBulletEnv-v0", 3, -3.0),
    ],
)
def test_the_default_target_entropy_is_the_authors_choice(env_id, act_dim, expected):
    assert redq.Args().target_entropy is None  # the default: decided per task
    assert redq.default_target_entropy(env_id, act_dim) == expected


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs, 3 critics (M = 2 drawn), 3 critic steps per env
# step: 96 steps of random actions, then 8 env steps of 3 critic steps and one policy step each, with
# --target-entropy -1.5. The tests rebuild what the loop stored and computed from the copies with plain references
# (tests/continuous_reference.py) reading the networks from their state dicts; each backward()'s gradients are compared
# with a float64 reference loss's. The run logs once (step 100).
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "120", "--batch-size", "16"]
PROBE_FLAGS += ["--learning-starts", "96", "--total-timesteps", "104", "--gamma", "0.9", "--tau", "0.1"]
PROBE_FLAGS += ["--num-critics", "3", "--num-target-critics", "2", "--utd-ratio", "3", "--target-entropy", "-1.5"]
PROBE_STEP_NAMES = ["obs_np", "next_obs_np", "actions", "rewards", "terminations", "truncations", "infos"]
PROBE_AT_BACKWARD = ["batch", "drawn", "noise", "t", "alpha", "log_alpha", "actor_loss", "alpha_loss"]
PROBE_AT_BACKWARD += ["actor", "qf", "qf_target", "actor_optimizer"]
GAMMA, TAU, LEARNING_STARTS, UTD_RATIO, TARGET_ENTROPY = 0.9, 0.1, 96, 3, -1.5
ACTOR_PARAMETERS = [name for name, _ in redq.Actor(4, np.zeros(2), np.ones(2)).named_parameters()]


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
        final=["rb", "target_entropy"],
        preload=["probe_box_envs"],
    )
    return trace, cwd


def entries_by_step(trace) -> list[tuple[list[dict], dict]]:
    """Per environment step t after learning starts: its critic steps (in order) and its policy step, the last
    backward of each t."""
    steps = {}
    for entry in trace.backward:
        steps.setdefault(entry["t"], []).append(entry)
    return [(entries[:-1], entries[-1]) for _, entries in sorted(steps.items())]


def test_the_loop_stores_each_step_with_the_true_next_observation_and_only_terminations(probed):
    trace, cwd = probed
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    assert len(steps) == 52
    ends = plain.check_stored_rows(steps, trace.final["rb"], 4, 2, actions_name="actions")
    assert min(ends.values()) >= 5, ends
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), REDQ_KEYS)
    # The policy of the moment acted (after learning started): its squashed Gaussian, not its mean.
    scale, bias = torch.tensor([1.5, 2.5], dtype=torch.float64), torch.tensor([0.5, 2.5], dtype=torch.float64)
    residuals = []
    for step in steps[LEARNING_STARTS // 2 :]:
        actor = next(entry for entry in trace.backward if entry["step"] == step["step"])["actor"]
        with torch.no_grad():
            mean, log_std = plain.policy_head(actor, torch.as_tensor(step["obs_np"]))
        residuals.append(plain.gaussian_residuals(step["actions"], mean, log_std, scale, bias))
    residuals = torch.cat(residuals)
    assert len(residuals) == 8 and residuals.std().item() == pytest.approx(1.0, rel=0.5)


def test_utd_ratio_critic_steps_per_env_step_each_on_a_fresh_minibatch_then_one_policy_step(probed):
    trace, _ = probed
    per_step = entries_by_step(trace)
    assert [critics[0]["t"] for critics, _ in per_step] == list(range(LEARNING_STARTS + 1, 105))
    for critics, policy in per_step:
        assert len(critics) == UTD_RATIO
        batches = [entry["batch"]["obs"] for entry in critics]
        assert not any(torch.equal(a, b) for a, b in zip(batches, batches[1:]))  # a fresh minibatch each time
        assert torch.equal(policy["batch"]["obs"], batches[-1])  # the policy: on the last critic step's minibatch


def test_each_critic_step_regresses_all_critics_on_the_min_of_the_two_drawn_target_critics(probed):
    trace, _ = probed
    rows = plain.buffer_rows(trace.final["rb"], 4, 2)
    stored = {plain.row_key(rows, i) for i in range(104)}
    per_step = entries_by_step(trace)
    critic_steps = [entry for critics, _ in per_step for entry in critics]
    # The policy's and alpha's gradients as the policy step before each critic step left them (none before the first).
    left_by_step = [{"actor": dict.fromkeys(ACTOR_PARAMETERS), "log_alpha": None}]
    left_by_step += [policy["grads"] for _, policy in per_step[:-1]]
    left_before = [left for (critics, _), left in zip(per_step, left_by_step) for _ in critics]
    terminal_targets, undrawn_lower = 0, 0
    for k, (entry, left) in enumerate(zip(critic_steps, left_before)):
        batch, drawn, where = entry["batch"], entry["drawn"].tolist(), f"critic step {k}"
        assert all(plain.row_key(batch, i) in stored for i in range(16)), "a sampled row was never stored"
        assert len(set(drawn)) == 2 and set(drawn) <= {0, 1, 2}
        alpha = entry["log_alpha"].double().exp()
        assert torch.equal(entry["alpha"], entry["log_alpha"].exp())
        with torch.no_grad():  # the target held constant, from the drawn target critics and the policy
            next_actions, next_log_prob = plain.squashed_gaussian(entry["actor"], batch["next_obs"], entry["noise"])
            next_q = [plain.stacked_critic(entry["qf_target"], i, batch["next_obs"], next_actions) for i in range(3)]
            drawn_min = torch.minimum(next_q[drawn[0]], next_q[drawn[1]])
            undrawn_lower += int((torch.stack(next_q).amin(0) < drawn_min).sum())
            soft_value = drawn_min - alpha * next_log_prob
            target = batch["rewards"].double() + GAMMA * (1 - batch["terminations"].double()) * soft_value
        qf = leaves(entry["qf"])
        expected = sum(
            ((plain.stacked_critic(qf, i, batch["obs"], batch["actions"]) - target) ** 2).mean() for i in range(3)
        )
        assert_gradients_match(entry["grads"]["qf"], gradients(expected, qf), where)
        # No gradient through the target: none reaches the target critics, none is added to the policy's or alpha's.
        assert_no_gradient(entry["grads"]["qf_target"], where)
        assert_same_gradient(entry["grads"]["actor"], left["actor"], where)
        assert_same_gradient(entry["grads"]["log_alpha"], left["log_alpha"], where)
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        terminal_targets += int(batch["terminations"].sum())
    assert terminal_targets > 10 and undrawn_lower > 10  # the undrawn critic was often the lowest: the draw mattered
    pairs = [frozenset(entry["drawn"].tolist()) for entry in critic_steps]
    assert len(set(pairs)) == 3 and sum(a != b for a, b in zip(pairs, pairs[1:])) > 5  # drawn afresh, at random


def test_the_policy_and_alpha_step_on_the_mean_of_all_critics_towards_the_target_entropy(probed):
    trace, _ = probed
    assert trace.final["target_entropy"] == TARGET_ENTROPY  # --target-entropy
    following = {id(entry): after for entry, after in zip(trace.backward, trace.backward[1:])}
    per_step = entries_by_step(trace)
    for k, (critics, entry) in enumerate(per_step):
        obs, alpha = entry["batch"]["obs"], entry["log_alpha"].double().exp()
        assert torch.equal(entry["alpha"], entry["log_alpha"].exp())

        def policy_loss(actor_state: dict):
            actions, log_prob = plain.squashed_gaussian(actor_state, obs, entry["noise"])
            q_mean = torch.stack([plain.stacked_critic(entry["qf"], i, obs, actions) for i in range(3)]).mean(0)
            return (alpha * log_prob - q_mean).mean(), log_prob

        where = f"policy step at t={entry['t']}"
        # The one backward of the policy loss plus alpha's: alpha a constant in the first, the critics' weights
        # constants, and the log-probabilities constants in alpha's (only log_alpha gets its gradient).
        params = leaves(entry["actor"]) | {"log_alpha": entry["log_alpha"].double().requires_grad_(True)}
        reference_loss, reference_log_prob = policy_loss(params)
        reference_alpha_loss = (-params["log_alpha"].exp() * (reference_log_prob.detach() + TARGET_ENTROPY)).mean()
        reference = gradients(reference_loss + reference_alpha_loss, params)
        assert_gradients_match(entry["grads"]["actor"], reference, where)
        assert_gradients_match({"log_alpha": entry["grads"]["log_alpha"]}, reference, where)
        # The critics are held still: no gradient added to theirs (as the last critic step left it), none to the
        # targets', and their weights are those the next critic step starts from.
        assert_same_gradient(entry["grads"]["qf"], critics[-1]["grads"]["qf"], where)
        assert_no_gradient(entry["grads"]["qf_target"], where)
        if k + 1 < len(per_step):
            assert_unchanged(entry["qf"], per_step[k + 1][0][0]["qf"], where)
        with torch.no_grad():
            loss, log_prob = policy_loss(entry["actor"])
            alpha_loss = (-alpha * (log_prob + TARGET_ENTROPY)).mean()
        assert entry["actor_loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        assert entry["alpha_loss"].item() == pytest.approx(alpha_loss.item(), rel=1e-5), where
        assert entry["loss"].item() == pytest.approx((loss + alpha_loss).item(), rel=1e-5, abs=1e-6), where
        if id(entry) in following:  # Adam on the policy loss's gradient (critics and alpha held still) and on alpha's
            after = following[id(entry)]
            new_actor, new_log_alpha = plain.policy_and_alpha_step(entry, policy_loss, TARGET_ENTROPY, ACTOR_PARAMETERS)
            for name, value in new_actor.items():
                torch.testing.assert_close(after["actor"][name].double(), value, rtol=1e-4, atol=2e-6, msg=where)
            torch.testing.assert_close(after["log_alpha"].double(), new_log_alpha, rtol=1e-4, atol=2e-6, msg=where)


def test_the_targets_follow_every_critic_step_by_polyak_averaging(probed):
    trace, _ = probed
    critic_steps = [entry for critics, _ in entries_by_step(trace) for entry in critics]
    first = critic_steps[0]
    assert all(torch.equal(first["qf_target"][k], first["qf"][k]) for k in first["qf"])
    following = {id(entry): after for entry, after in zip(trace.backward, trace.backward[1:])}
    for before, after in zip(critic_steps, critic_steps[1:]):
        online = following[id(before)]["qf"]  # the critics after this step, as the next backward found them
        for name, value in after["qf_target"].items():
            old = before["qf_target"][name].double()
            expected = old + TAU * (online[name].double() - old)
            torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7, msg=f"t={before['t']}")


# --- the maths -----------------------------------------------------------------------------------


def test_target_critics_are_two_distinct_indices_drawn_uniformly_and_afresh():
    torch.manual_seed(0)
    draws = [redq.draw_target_critics(10, 2, torch.device("cpu")) for _ in range(4500)]
    pairs = []
    for drawn in draws:
        assert drawn.shape == (2,) and drawn.dtype == torch.int64
        i, j = drawn.tolist()
        assert i != j and 0 <= i < 10 and 0 <= j < 10
        pairs.append(frozenset((i, j)))
    counts = {pair: pairs.count(pair) for pair in set(pairs)}
    assert len(counts) == 45  # every pair of the 10 critics is drawn ...
    assert min(counts.values()) > 60 and max(counts.values()) < 140  # ... about equally often (100 expected)
    assert sum(a != b for a, b in zip(pairs, pairs[1:])) > 0.95 * len(pairs)  # a new draw for every update
    firsts = np.bincount([d[0].item() for d in draws], minlength=10)
    assert firsts.min() > 350  # the order is random too (450 expected each)
    torch.manual_seed(0)  # torch's RNG, which checkpoints save and resuming restores, decides the draws
    assert all(torch.equal(redq.draw_target_critics(10, 2, torch.device("cpu")), d) for d in draws[:50])
    assert sorted(redq.draw_target_critics(10, 10, torch.device("cpu")).tolist()) == list(range(10))


def plain_critics(qf: redq.EnsembleQNetwork) -> list[torch.nn.Sequential]:
    """N ordinary q_networks, critic i holding slice i of the ensemble's stacked parameters (copies)."""
    critics = []
    for i in range(len(qf.w1)):
        critic = redq.q_network(qf.w1.shape[1], 0)  # only obs_dim + act_dim matters
        layers = {"0": (qf.w1[i].T, qf.b1[i, 0]), "2": (qf.w2[i].T, qf.b2[i, 0]), "4": (qf.w3[i], qf.b3[i])}
        state = {f"{k}.weight": w.detach().clone() for k, (w, _) in layers.items()}
        critic.load_state_dict(state | {f"{k}.bias": b.detach().clone() for k, (_, b) in layers.items()})
        critics.append(critic)
    return critics


def test_batched_ensemble_equals_ten_plain_mlps_in_outputs_and_gradients():
    torch.manual_seed(0)
    qf = redq.EnsembleQNetwork(5, 2, 10)
    critics = plain_critics(qf)
    obs, targets = torch.randn(32, 5), torch.randn(32)
    actions = torch.randn(32, 2, requires_grad=True)
    q = qf(obs, actions)
    assert q.shape == (10, 32)
    x = torch.cat([obs, actions], dim=-1)
    plain = torch.stack([critic(x).squeeze(-1) for critic in critics])
    torch.testing.assert_close(q, plain)
    assert len({round(v, 4) for v in q[:, 0].tolist()}) == 10  # independently initialised
    # The training loss: the sum over critics of each one's MSE; its gradients, parameter by parameter.
    ((q - targets) ** 2).mean(1).sum().backward()
    grad_actions, actions.grad = actions.grad, None
    ((plain - targets) ** 2).mean(1).sum().backward()
    torch.testing.assert_close(actions.grad, grad_actions)
    for i, critic in enumerate(critics):
        grads = dict(critic.named_parameters())
        torch.testing.assert_close(qf.w1.grad[i].T, grads["0.weight"].grad)
        torch.testing.assert_close(qf.b1.grad[i, 0], grads["0.bias"].grad)
        torch.testing.assert_close(qf.w2.grad[i].T, grads["2.weight"].grad)
        torch.testing.assert_close(qf.b2.grad[i, 0], grads["2.bias"].grad)
        torch.testing.assert_close(qf.w3.grad[i], grads["4.weight"].grad)
        torch.testing.assert_close(qf.b3.grad[i], grads["4.bias"].grad)
    # Indexed: the drawn critics only, in the order drawn.
    drawn = torch.tensor([7, 2])
    torch.testing.assert_close(qf(obs, actions, drawn), plain[[7, 2]])
    bound = 1 / 256**0.5  # nn.Linear's initialisation of the hidden layer: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert qf.w2.abs().max() <= bound and qf.w2.abs().max() > 0.95 * bound


def test_the_target_uses_exactly_the_two_drawn_critics():
    torch.manual_seed(1)
    gamma, alpha = 0.9, torch.tensor(0.5)
    qf_target = redq.EnsembleQNetwork(3, 2, 10)
    next_obs, next_actions = torch.randn(6, 3), torch.randn(6, 2)
    rewards = torch.tensor([1.0, 0.5, -1.0, 2.0, 0.0, 3.0])
    terminations = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # 0 and 3 terminated; the others bootstrap
    next_log_prob = torch.tensor([0.2, -1.0, 0.0, 3.0, 0.5, -0.5])

    def target(drawn):
        q = qf_target(next_obs, next_actions, drawn)
        return redq.soft_q_target(rewards, terminations, q, next_log_prob, alpha, gamma)

    drawn = redq.draw_target_critics(10, 2, torch.device("cpu"))
    critics = plain_critics(qf_target)
    x = torch.cat([next_obs, next_actions], dim=-1)
    with torch.no_grad():
        got = target(drawn)
        a, b = (critics[i](x).squeeze(-1) for i in drawn.tolist())
        for k in range(6):  # a plain loop over the batch
            soft = min(a[k].item(), b[k].item()) - alpha.item() * next_log_prob[k].item()
            expected = rewards[k].item() + (0.0 if terminations[k] else gamma * soft)
            assert got[k].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
        # It depends on those two critics and on no other: perturb each critic in turn.
        b3 = qf_target.b3.clone()
        for i in range(10):
            qf_target.b3[i] -= 10.0  # lowered: a drawn critic becomes the minimum
            moved = (got - target(drawn))[terminations == 0]
            assert (moved > 5.0).all() if i in drawn.tolist() else torch.equal(target(drawn), got)
            qf_target.b3.copy_(b3)
        full = qf_target(next_obs, next_actions)  # min over all 10 is lower: the draw matters
        all_min = redq.soft_q_target(rewards, terminations, full, next_log_prob, alpha, gamma)
        assert (all_min <= got + 1e-6).all() and (all_min < got - 1e-4)[terminations == 0].any()


# --- the reader of benchmark/redq.sh ----------------------------------------------------------------


def test_first_step_reaching_a_moving_mean():
    steps = np.array([200, 400, 600, 800, 1000])
    returns = np.array([-1000.0, -300.0, -150.0, -100.0, -400.0])
    f = steps_to_threshold().first_step_reaching
    assert f(steps, returns, -200.0, 2) == 800  # means of pairs: -650, -225, -125 (after episode 4), -250
    assert f(steps, returns, -200.0, 1) == 600
    assert f(steps, returns, -100.0, 2) is None
    assert f(steps[:1], returns[:1], -2000.0, 2) is None  # fewer episodes than the window: not yet


def test_steps_to_threshold_table_over_seeds(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for seed, curve in ((1, [-900, -150, -150]), (2, [-900, -900, -100, -100]), (3, [-900, -800])):
        run_dir = tmp_path / f"Pendulum-v1__redq__{seed}__0"
        run_dir.mkdir()
        (run_dir / "args.json").write_text(json.dumps({"env_id": "Pendulum-v1", "exp_name": "redq", "seed": seed}))
        with SummaryWriter(str(run_dir)) as writer:
            for episode, value in enumerate(curve, 1):
                writer.add_scalar("charts/episodic_return", value, 200 * episode)
    steps_to_threshold().main([str(tmp_path), "--threshold", "-200", "--window", "2", "--output", str(tmp_path / "t")])
    row = (tmp_path / "t.md").read_text().splitlines()[-1]
    # seed 1 reaches at 600 (-150, -150), seed 2 at 800 (-100, -100), seed 3 never: 700 +- 100 over two.
    assert row.startswith("| redq.py | Pendulum-v1 | 1 2 3 | 700 +- 100 (2 of 3 reached) |"), row
    assert "1: 600, 2: 800, 3: not reached" in row


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["Box", "cleanrl/dqn.py", "cleanrl/ppo.py"]),
        # 10^12 rows of Pendulum transitions (3 + 3 + 1 + 1 + 1 float32 each) are 36,000 GB.
        (["--env-id", "Pendulum-v1", "--buffer-size", "1000000000000"], ["replay buffer needs 36000.0 GB"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(total_timesteps=0), "--total-timesteps must be positive"),
        (dict(buffer_size=0), "--buffer-size must be positive"),
        (dict(batch_size=-1), "--batch-size must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(num_critics=0), "--num-critics must be positive"),
        (dict(num_target_critics=0), "--num-target-critics must be positive"),
        (dict(utd_ratio=0), "--utd-ratio must be positive"),
        (dict(num_critics=3, num_target_critics=4), "--num-target-critics 4 is larger than --num-critics 3"),
        (dict(q_lr=0.0), "--q-lr must be positive"),
        (dict(learning_starts=-1), "--learning-starts must be 0 or positive"),
        (dict(total_timesteps=1000, learning_starts=1000), "--learning-starts 1000 is not below --total-timesteps"),
        (dict(tau=0.0), "--tau must be in (0, 1]"),
        (dict(gamma=1.5), "--gamma and --tau must be in (0, 1]"),
        (dict(alpha=-0.1), "--alpha must be 0 or positive"),
        (dict(buffer_size=256, batch_size=512), "--batch-size 512 is larger than --buffer-size 256"),
        (dict(num_envs=8, buffer_size=4, batch_size=4), "--num-envs 8 is larger than --buffer-size 4"),
        (dict(env_id="Pendulm-v1"), "unknown environment id 'Pendulm-v1'; did you mean Pendulum-v1"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = redq.Args(**{"env_id": "Pendulum-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        redq.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


# --- a smoke run, checkpoints and exact resume ------------------------------------------------------

# Pendulum, 500 steps (2 episodes and a half), learning from step 100, two critic steps per environment step
# (the default 20 only costs time here); the buffer (400) is smaller than the run: the resumed run also wraps
# around. One torch thread: on a busy 2-core machine two threads made these runs three times slower.
RESUME_FLAGS = [
    "--env-id",
    "Pendulum-v1",
    "--batch-size",
    "32",
    "--buffer-size",
    "400",
    "--learning-starts",
    "100",
    "--utd-ratio",
    "2",
    "--total-timesteps",
    "500",
    "--checkpoint-every",
    "250",
    "--torch-threads",
    "1",
    "--save-model",
    "--eval-episodes",
    "1",
]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """The uninterrupted run, with --save-model: the smoke test reads it, the resume test compares with it."""
    cwd = tmp_path_factory.mktemp("straight")
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "500/500 steps" in result.stdout and "evaluation over 1 episodes" in result.stdout
    (run_dir,) = run_dirs(cwd)
    return run_dir


def saved_weights(run_dir: Path) -> dict:
    model = torch.load(run_dir / "redq_continuous_action.cleanrl_model", weights_only=False)
    return {**{f"actor.{k}": v for k, v in model["actor"].items()}, **{f"qf.{k}": v for k, v in model["qf"].items()}}


def test_smoke_pendulum_with_saved_model(straight_run):
    scalars = read_scalars(straight_run)
    assert_finite_keys(scalars, REDQ_KEYS + ["eval/episodic_return"])
    assert len(scalars["charts/episodic_return"]) == 2 and len(scalars["eval/episodic_return"]) == 1
    model = torch.load(straight_run / "redq_continuous_action.cleanrl_model", weights_only=False)
    assert model["qf"]["w2"].shape == (10, 256, 256) and (model["obs_dim"], model["act_dim"]) == (3, 1)
    returns = redq.evaluate(straight_run / "redq_continuous_action.cleanrl_model", 1, torch.device("cpu"), seed=1001)
    assert returns == [pytest.approx(scalars["eval/episodic_return"][0][1], rel=1e-6)]  # the seed run.finish uses


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(straight_run, tmp_path):
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, tmp_path)
    assert not (run_dir / "redq_continuous_action.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 250 and checkpoint["replay_buffer"]["size"] == 250
    assert checkpoint["log_alpha"].item() != 0.0  # learning had started
    for key in ("actor", "qf", "qf_target", "q_optimizer", "actor_optimizer", "envs", "rng"):
        assert checkpoint[key] is not None, key

    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path) == [run_dir], "resume must continue the same run directory"
    straight, again = read_scalars(straight_run), read_scalars(run_dir)
    # The critics' losses after step 250 differ unless the draws of the target critics (torch's RNG) match too.
    for key in ("charts/episodic_return", "losses/qf_loss", "losses/qf_values", "losses/actor_loss", "losses/alpha"):
        assert again[key] == straight[key], key
    assert [step for step, _ in straight["losses/qf_loss"]] == [200, 300, 400, 500]
    a, b = saved_weights(run_dir), saved_weights(straight_run)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
