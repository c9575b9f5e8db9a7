"""td3_continuous_action.py and ddpg_continuous_action.py: each script's own loop under tests/probe.py (stored rows,
every critic and actor loss and its gradients against a plain reference, no gradient into the targets, the critic
unmoved by the actor step, the delayed actor, Polyak targets, exploration noise); smoke
runs on classic control, MuJoCo and dm_control; the action maths, the twin critic (against two plain q_networks) and
the replay buffer's named fields against the definitions; bad input; checkpoints and exact resume; learning
Pendulum."""

from __future__ import annotations

import io
import subprocess
from contextlib import redirect_stderr
from pathlib import Path

import continuous_reference as plain
import ddpg_continuous_action as ddpg
import gymnasium as gym
import numpy as np
import pytest
import td3_continuous_action as td3
import torch
import torch.nn.functional as F
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

SCRIPTS = {"td3": "td3_continuous_action.py", "ddpg": "ddpg_continuous_action.py"}
MODULES = {"td3": td3, "ddpg": ddpg}
SMALL = ["--num-envs", "2", "--buffer-size", "1000", "--batch-size", "32"]
COMMON_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/qf1_values",
    "losses/qf1_loss",
    "losses/actor_loss",
]
KEYS = {"td3": COMMON_KEYS + ["losses/qf2_values", "losses/qf2_loss", "losses/qf_loss"], "ddpg": COMMON_KEYS}
# Asymmetric bounds: shifted, of different widths, one entirely negative.
LOW, HIGH = torch.tensor([-1.0, 0.0, -3.0]), torch.tensor([2.0, 5.0, -1.0])


# --- the loop's own wiring ---------------------------------------------------------------------
# Each script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs: 80 steps of random actions, then 24 gradient steps
# (12 of the actor and the targets). The tests rebuild what the loop stored and computed from the copies, with plain
# references written from the definitions; the networks are read from their state dicts, never run through the
# scripts' forward(), and each backward()'s gradients are compared with a float64 reference loss's. The run also logs
# once (at step 100): its TensorBoard keys are the smoke test.
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "120", "--batch-size", "16"]
PROBE_FLAGS += ["--learning-starts", "80", "--total-timesteps", "104", "--gamma", "0.9", "--tau", "0.1"]
PROBE_FLAGS += ["--exploration-noise", "0.3"]
PROBE_EXTRA = {"td3": ["--policy-noise", "0.4", "--noise-clip", "0.5"], "ddpg": []}
PROBE_STEP_NAMES = ["obs_np", "next_obs_np", "actions_np", "rewards", "terminations", "truncations", "infos"]
PROBE_NETWORKS = ["actor", "critic", "target_actor", "target_critic"]
GAMMA, TAU, LEARNING_STARTS, NUM_ENVS = 0.9, 0.1, 80, 2


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The probed run of a script, made once when a test first asks for it: (trace, cwd)."""
    from probe import probe_script

    traces = {}

    def get(algo: str):
        if algo not in traces:
            cwd = tmp_path_factory.mktemp(f"probe-{algo}")
            at_backward = ["batch", "update", "obs", "standard_normal", *PROBE_NETWORKS]
            flags = PROBE_FLAGS + PROBE_EXTRA[algo]
            trace = probe_script(
                SCRIPTS[algo],
                flags,
                cwd,
                watch=PROBE_STEP_NAMES,
                at_backward=at_backward,
                grads=PROBE_NETWORKS,
                final=["rb"],
                preload=["probe_box_envs"],
            )
            traces[algo] = trace, cwd
        return traces[algo]

    return get


def plain_critic(algo: str, state: dict, i: int, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Critic i's Q(s, a) [batch] from its state dict: TD3's stacked critics, DDPG's QNetwork (fc1-fc3)."""
    if algo == "td3":
        return plain.stacked_critic(state, i, obs, actions)
    x = torch.cat([obs, actions], dim=-1)
    h = plain.linear(plain.linear(x, state, "fc1").relu(), state, "fc2").relu()
    return plain.linear(h, state, "fc3").squeeze(-1)


def probe_steps(trace) -> list[dict]:
    """One dict per loop iteration: the observation acted on, the actions, what the env returned."""
    return [entry for entry in trace.steps if entry["step"] > 0]


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_the_loop_stores_each_step_with_the_true_next_observation_and_only_terminations(probed, algo):
    trace, cwd = probed(algo)
    steps = probe_steps(trace)
    assert len(steps) == 104 // NUM_ENVS
    ends = plain.check_stored_rows(steps, trace.final["rb"], 4, 2, actions_name="actions_np")
    assert min(ends.values()) >= 5, ends
    # Random actions until learning starts: uniform over the asymmetric bounds.
    random_actions = plain.buffer_rows(trace.final["rb"], 4, 2)["actions"][:LEARNING_STARTS]
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([2.0, 5.0])
    assert (random_actions >= low).all() and (random_actions <= high).all()
    assert (random_actions.min(0).values < low + 0.2 * (high - low)).all()
    assert (random_actions.max(0).values > high - 0.2 * (high - low)).all()
    # The run's TensorBoard keys (logged once, at step 100, after learning started).
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS[algo])
    assert algo == "td3" or "losses/qf2_loss" not in scalars


def critic_entries(trace, algo: str) -> list[dict]:
    """The critics' gradient steps, one per update, in order. TD3 computes its losses in update_critics; DDPG in the
    loop itself, where the critic's backward comes first in each update and the actor's (every policy_frequency-th)
    second."""
    if algo == "td3":
        return [entry for entry in trace.backward if entry["where"] == "update_critics"]
    seen, entries = set(), []
    for entry in trace.backward:
        if entry["update"] not in seen:
            seen.add(entry["update"])
            entries.append(entry)
    return entries


def actor_entries(trace, algo: str) -> list[dict]:
    critics = critic_entries(trace, algo)
    return [entry for entry in trace.backward if not any(entry is critic for critic in critics)]


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_each_critic_update_regresses_on_the_target_networks_bootstrap_from_real_transitions(probed, algo):
    trace, _ = probed(algo)
    rows = plain.buffer_rows(trace.final["rb"], 4, 2)
    stored = {plain.row_key(rows, i) for i in range(104)}
    updates = critic_entries(trace, algo)
    assert [entry["update"] for entry in updates] == list(range(LEARNING_STARTS + 1, 105))  # one per env step
    low, high = torch.tensor([-1.0, 0.0], dtype=torch.float64), torch.tensor([2.0, 5.0], dtype=torch.float64)
    terminal_targets, clipped_noise = 0, 0
    actor_grads = dict.fromkeys(updates[0]["grads"]["actor"])  # as the latest actor step left them (none yet)
    actor_steps = {entry["update"]: entry for entry in actor_entries(trace, algo)}
    for entry in updates:
        batch, where = entry["batch"], f"update {entry['update']}"
        assert all(plain.row_key(batch, i) in stored for i in range(16)), "a sampled row was never stored"
        with torch.no_grad():  # the target held constant, from the target actor and critic(s)
            next_actions = plain.deterministic_actor(entry["target_actor"], batch["next_obs"])
            if algo == "td3":  # target policy smoothing: clipped noise in half-ranges, then the bounds
                scale = (high - low) / 2
                noise = (0.4 * entry["standard_normal"].double()).clamp(-0.5, 0.5)
                next_actions = torch.minimum(torch.maximum(next_actions + noise * scale, low), high)
                clipped_noise += int((0.4 * entry["standard_normal"]).abs().gt(0.5).sum())
                next_q = torch.minimum(
                    *(plain_critic(algo, entry["target_critic"], i, batch["next_obs"], next_actions) for i in (0, 1))
                )
            else:
                next_q = plain_critic(algo, entry["target_critic"], 0, batch["next_obs"], next_actions)
            target = batch["rewards"].double() + GAMMA * (1 - batch["terminations"].double()) * next_q
        critic = leaves(entry["critic"])
        expected = sum(
            ((plain_critic(algo, critic, i, batch["obs"], batch["actions"]) - target) ** 2).mean()
            for i in ((0, 1) if algo == "td3" else (0,))
        )
        assert_gradients_match(entry["grads"]["critic"], gradients(expected, critic), where)
        # No gradient through the target: none reaches the target networks, none is added to the actor's.
        for network in ("target_actor", "target_critic"):
            assert_no_gradient(entry["grads"][network], f"{where}, {network}")
        assert_same_gradient(entry["grads"]["actor"], actor_grads, where)
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        if entry["update"] in actor_steps:
            actor_grads = actor_steps[entry["update"]]["grads"]["actor"]
        terminal_targets += int(batch["terminations"].sum())
    assert terminal_targets > 10, "sampled transitions should end episodes"
    if algo == "td3":
        assert clipped_noise > 10  # the smoothing noise's clip was exercised
        draws = torch.stack([entry["standard_normal"] for entry in updates])
        assert draws.std().item() == pytest.approx(1.0, abs=0.1) and not torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_the_actor_climbs_the_first_critic_every_policy_frequency_updates_on_the_same_minibatch(probed, algo):
    trace, _ = probed(algo)
    critics, actors = critic_entries(trace, algo), actor_entries(trace, algo)
    assert [entry["update"] for entry in actors] == list(range(LEARNING_STARTS + 2, 105, 2))  # delayed: every 2nd
    by_update = {entry["update"]: entry for entry in critics}
    for entry in actors:
        update, where = entry["update"], f"update {entry['update']}"
        obs = by_update[update]["batch"]["obs"]  # the critics' minibatch of the same update
        if algo == "td3":
            assert torch.equal(entry["obs"], obs)
        actor = leaves(entry["actor"])  # the critic's weights held constant
        expected = -plain_critic(algo, entry["critic"], 0, obs, plain.deterministic_actor(actor, obs)).mean()
        assert_gradients_match(entry["grads"]["actor"], gradients(expected, actor), where)
        # The critic is held still: no gradient added to its own (as its step left it), none to the targets', and its
        # weights are those the next critic step starts from.
        assert_same_gradient(entry["grads"]["critic"], by_update[update]["grads"]["critic"], where)
        for network in ("target_actor", "target_critic"):
            assert_no_gradient(entry["grads"][network], f"{where}, {network}")
        if update + 1 in by_update:
            assert_unchanged(entry["critic"], by_update[update + 1]["critic"], where)
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        # The critic it climbs is the one this update's critic step left (the step came first).
        first_weight = next(iter(entry["critic"]))
        assert not torch.equal(entry["critic"][first_weight], by_update[entry["update"]]["critic"][first_weight])


def assert_polyak(new: dict, old: dict, online: dict, where: str) -> None:
    """new == old + tau * (online - old), parameter by parameter (buffers, the action scale and bias, are copies)."""
    for name, value in new.items():
        expected = old[name].double() + TAU * (online[name].double() - old[name].double())
        if name in ("action_scale", "action_bias"):
            expected = old[name].double()
        torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7, msg=f"{where}: {name}")


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_the_targets_follow_by_polyak_averaging_right_after_each_actor_step(probed, algo):
    trace, _ = probed(algo)
    critics, actors = critic_entries(trace, algo), actor_entries(trace, algo)
    first = critics[0]
    for name in ("actor", "critic"):  # the targets start as copies of the online networks
        assert all(torch.equal(first[f"target_{name}"][k], first[name][k]) for k in first[name])
    actor_step = {entry["update"]: entry for entry in actors}
    for before, after in zip(critics, critics[1:]):
        update = before["update"]
        where = f"after update {update}"
        if update in actor_step:
            # The critic as the actor step found it (after this update's critic step), and the actor after its step.
            assert_polyak(after["target_critic"], before["target_critic"], actor_step[update]["critic"], where)
            assert_polyak(after["target_actor"], before["target_actor"], after["actor"], where)
        else:
            for name in ("target_actor", "target_critic"):
                assert all(torch.equal(after[name][k], before[name][k]) for k in before[name]), where


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_exploration_adds_gaussian_noise_in_half_ranges_to_the_actor_of_the_moment(probed, algo):
    trace, _ = probed(algo)
    steps = [step for step in probe_steps(trace) if step["step"] - NUM_ENVS >= LEARNING_STARTS]
    assert len(steps) == 12
    critics = critic_entries(trace, algo)
    scale = torch.tensor([1.5, 2.5], dtype=torch.float64)
    residuals = []
    for step in steps:
        # The actor that acted: no actor step between the acting and this step's first critic update.
        actor = next(entry for entry in critics if entry["step"] == step["step"])["actor"]
        with torch.no_grad():
            mean = plain.deterministic_actor(actor, torch.as_tensor(step["obs_np"]))
        residuals.append((torch.as_tensor(step["actions_np"]).double() - mean) / scale)
    residuals = torch.cat(residuals)
    assert (residuals.abs() > 1e-6).all()  # every action was perturbed
    assert residuals.std().item() == pytest.approx(0.3, rel=0.3)  # --exploration-noise 0.3 half-ranges
    assert abs(residuals.mean().item()) < 0.15


# --- smoke runs --------------------------------------------------------------------------------

# Classic control and MuJoCo runs that also write checkpoints: the smoke tests read them, and the
# resume tests compare an interrupted run with them.
RESUMABLE = [("td3", "Pendulum-v1", 1000), ("ddpg", "Pendulum-v1", 1000), ("td3", "Hopper-v5", 600)]


def resumable_flags(env_id: str, steps: int) -> list[str]:
    return [
        "--env-id",
        env_id,
        "--num-envs",
        "1",
        "--buffer-size",
        "2000",
        "--batch-size",
        "32",
        "--learning-starts",
        "200",
        "--total-timesteps",
        str(steps),
        "--checkpoint-every",
        "300",
        "--save-model",
        "--eval-episodes",
        "1",
    ]


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory):
    """Uninterrupted runs with resumable_flags, made once when a test first asks for one."""
    runs = {}

    def get(algo: str, env_id: str, steps: int) -> tuple[Path, subprocess.CompletedProcess]:
        if (algo, env_id) not in runs:
            workdir = tmp_path_factory.mktemp(f"straight-{algo}-{env_id}")
            result = run_script(SCRIPTS[algo], *resumable_flags(env_id, steps), cwd=workdir)
            assert result.returncode == 0, result.stderr
            (run_dir,) = run_dirs(workdir)
            runs[algo, env_id] = run_dir, result
        return runs[algo, env_id]

    return get


def check_smoke_run(run_dir: Path, stdout: str, algo: str, steps: int) -> None:
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS[algo] + ["eval/episodic_return"])
    assert algo == "td3" or "losses/qf2_loss" not in scalars
    assert len(scalars["eval/episodic_return"]) == 1
    assert (run_dir / f"{SCRIPTS[algo][:-3]}.cleanrl_model").is_file() and (run_dir / "args.json").is_file()
    assert f"{steps:,}/{steps:,} steps" in stdout  # the progress display's final line


@pytest.mark.parametrize("algo, env_id, steps", RESUMABLE)
def test_smoke_writes_finite_scalars_and_evaluates_saved_model(straight_runs, algo, env_id, steps):
    run_dir, result = straight_runs(algo, env_id, steps)
    check_smoke_run(run_dir, result.stdout, algo, steps)


# dm_control episodes last 1000 steps: 2 envs x 1000 steps end one episode each. (Both scripts with 2 envs on a
# gymnasium task: the probed runs above.)
@pytest.mark.parametrize(
    "algo, env_id, steps, learning_starts",
    [
        ("td3", "dm_control/cartpole-balance-v0", 2000, 1800),
        ("ddpg", "dm_control/cartpole-balance-v0", 2000, 1800),
    ],
)
def test_smoke_with_several_envs(workdir, algo, env_id, steps, learning_starts):
    result = run_script(
        SCRIPTS[algo],
        "--env-id",
        env_id,
        *SMALL,
        "--total-timesteps",
        str(steps),
        "--learning-starts",
        str(learning_starts),
        "--save-model",
        "--eval-episodes",
        "1",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    check_smoke_run(run_dir, result.stdout, algo, steps)


def test_capture_video_writes_mp4_of_training_and_evaluation(workdir):
    result = run_script(
        SCRIPTS["td3"],
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "400",
        "--learning-starts",
        "300",
        "--capture-video",
        "--save-model",
        "--eval-episodes",
        "1",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert list((run_dir / "videos").glob("*.mp4")), "no training video written"
    assert list((run_dir / "videos" / "eval").glob("*.mp4")), "no evaluation video written"


# --- the action maths --------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_action_scaling_to_asymmetric_bounds_round_trips(algo):
    module = MODULES[algo]
    actor = module.Actor(4, LOW, HIGH)
    assert torch.equal(actor.action_scale, (HIGH - LOW) / 2) and torch.equal(actor.action_bias, (HIGH + LOW) / 2)
    scale = lambda u: module.scale_action(u, actor.action_scale, actor.action_bias)  # noqa: E731
    assert torch.equal(scale(-torch.ones(3)), LOW) and torch.equal(scale(torch.ones(3)), HIGH)
    assert torch.equal(scale(torch.zeros(3)), (LOW + HIGH) / 2)
    squashed = torch.rand(100, 3) * 2 - 1
    np.testing.assert_allclose(
        ((scale(squashed) - actor.action_bias) / actor.action_scale).numpy(), squashed.numpy(), atol=1e-6
    )
    # The actor's outputs stay within the bounds and reach both ends of each.
    with torch.no_grad():
        actor.fc_mu.bias.fill_(100.0)
        assert torch.allclose(actor(torch.randn(5, 4)), HIGH.expand(5, 3))
        actor.fc_mu.bias.fill_(-100.0)
        assert torch.allclose(actor(torch.randn(5, 4)), LOW.expand(5, 3))
        actor.fc_mu.bias.zero_()
        actions = actor(torch.randn(1000, 4) * 10)
    assert (actions >= LOW).all() and (actions <= HIGH).all()


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_random_and_exploration_actions_respect_asymmetric_bounds(algo):
    module = MODULES[algo]
    torch.manual_seed(0)
    uniform = module.random_actions(20_000, LOW, HIGH)
    assert uniform.shape == (20_000, 3) and (uniform >= LOW).all() and (uniform <= HIGH).all()
    np.testing.assert_allclose(uniform.mean(0).numpy(), ((LOW + HIGH) / 2).numpy(), atol=0.05)
    np.testing.assert_allclose(uniform.std(0).numpy(), ((HIGH - LOW) / 12**0.5).numpy(), rtol=0.03)
    torch.manual_seed(0)
    assert torch.equal(module.random_actions(20_000, LOW, HIGH), uniform)  # torch's RNG, so seeded and checkpointed

    scale = (HIGH - LOW) / 2
    middle = ((LOW + HIGH) / 2).expand(20_000, 3)
    noisy = module.add_exploration_noise(middle, scale, LOW, HIGH, 0.1)
    np.testing.assert_allclose(
        (noisy - middle).std(0).numpy(), (0.1 * scale).numpy(), rtol=0.03
    )  # noise in half-ranges
    at_top = module.add_exploration_noise(HIGH.expand(20_000, 3), scale, LOW, HIGH, 0.1)
    assert (at_top <= HIGH).all() and (at_top >= LOW).all() and (at_top == HIGH).float().mean() > 0.4  # clipped


def test_td3_smoothing_noise_stays_within_its_clip_and_the_bounds():
    torch.manual_seed(0)
    scale = (HIGH - LOW) / 2
    middle = ((LOW + HIGH) / 2).expand(50_000, 3)
    # A wide noise (std 1) clipped at 0.5 half-ranges: most draws hit the clip.
    smoothed = td3.smooth_target_actions(middle, scale, LOW, HIGH, torch.randn_like(middle), 1.0, 0.5)
    noise = (smoothed - middle) / scale
    assert noise.abs().max() <= 0.5 + 1e-6
    assert (noise.abs() > 0.5 - 1e-6).float().mean() > 0.5  # the clip is where the noise piles up
    assert ((noise > 0) & (noise < 0.4)).any() and (
        (noise < 0) & (noise > -0.4)
    ).any()  # and it is noise, not a constant
    # A narrow noise (std 0.2) is barely touched by the clip: std ~0.2 half-ranges per dimension.
    narrow = (td3.smooth_target_actions(middle, scale, LOW, HIGH, torch.randn_like(middle), 0.2, 0.5) - middle) / scale
    np.testing.assert_allclose(narrow.std(0).numpy(), [0.2] * 3, rtol=0.04)
    # At the bounds the smoothed action is clipped back into them.
    for edge in (LOW, HIGH):
        edges = edge.expand(50_000, 3)
        smoothed = td3.smooth_target_actions(edges, scale, LOW, HIGH, torch.randn_like(edges), 1.0, 0.5)
        assert (smoothed >= LOW).all() and (smoothed <= HIGH).all()
        assert (smoothed == edge).float().mean() > 0.45  # half of the draws push out and are clipped
    assert td3.smooth_target_actions(middle, scale, LOW, HIGH, torch.randn_like(middle), 0.2, 0.0).equal(middle)


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_td_target_cuts_the_bootstrap_only_at_terminations(algo, dtype):
    gamma = 0.9
    rewards = [1.0, 0.5, -1.0, 2.0]
    next_q = [3.0, 4.0, 5.0, -6.0]
    # 0: terminated; 1: truncated by a time limit (stored as not terminated, s' the true final
    # observation); 2: mid-episode; 3: terminated with a negative next value.
    terminations = [1.0, 0.0, 0.0, 1.0]
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    got = MODULES[algo].td_target(t(rewards), t(next_q), t(terminations), gamma)
    assert got.dtype == dtype
    assert got.tolist() == pytest.approx([1.0, 0.5 + 0.9 * 4.0, -1.0 + 0.9 * 5.0, 2.0])


def test_twin_critic_is_two_independent_q_networks():
    torch.manual_seed(0)
    critic = td3.TwinQNetwork(3, 2)
    obs, actions = torch.randn(7, 3), torch.randn(7, 2, requires_grad=True)
    q = critic(obs, actions)
    assert q.shape == (2, 7)
    x = torch.cat([obs, actions], dim=-1)
    for i in range(2):  # critic i is an ordinary q_network holding slice i of the stacked parameters
        plain = td3.q_network(3, 2)
        layers = {"0": (critic.w1[i].T, critic.b1[i, 0]), "2": (critic.w2[i].T, critic.b2[i, 0])}
        layers["4"] = (critic.w3[i], critic.b3[i])
        plain.load_state_dict(
            {f"{k}.{kind}": t for k, pair in layers.items() for kind, t in zip(("weight", "bias"), pair)}
        )
        torch.testing.assert_close(q[i], plain(x).squeeze(-1))
    assert not torch.equal(q[0], q[1]) and not torch.equal(critic.w2[0], critic.w2[1])
    bound = 1 / 256**0.5  # nn.Linear's initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert critic.w2.abs().max() <= bound and critic.w2.abs().max() > 0.95 * bound
    # The first critic alone, frozen as in the actor's step: gradients reach the actions, not the weights.
    critic.requires_grad_(False)
    q1 = critic(obs, actions, num_critics=1)
    torch.testing.assert_close(q1, q[:1])
    q1.sum().backward()
    assert actions.grad is not None and actions.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())
    critic.requires_grad_(True)
    q.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.parameters())


def test_ddpg_frozen_critic_passes_gradients_to_the_actions_only():
    torch.manual_seed(0)
    critic = ddpg.QNetwork(3, 2)
    obs, actions = torch.randn(7, 3), torch.randn(7, 2, requires_grad=True)
    critic.requires_grad_(False)  # as in the actor's step
    q = critic(obs, actions)
    torch.testing.assert_close(
        q, critic.fc3(F.relu(critic.fc2(F.relu(critic.fc1(torch.cat([obs, actions], -1)))))).squeeze(-1)
    )
    q.sum().backward()
    assert actions.grad.abs().sum() > 0 and all(p.grad is None for p in critic.parameters())


# --- the replay buffer -------------------------------------------------------------------------


def fill_from_rollout(module, env_id: str, actions: np.ndarray, num_envs: int, seed: int):
    """Step a vector env exactly as the scripts' loop does and store every step in a ReplayBuffer."""
    envs = module.make_envs(env_id, num_envs)
    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    rb = module.ReplayBuffer(100, num_envs, obs_dim, action_dim, torch.device("cpu"))
    obs, _ = envs.reset(seed=seed)
    obs = obs.astype(np.float32)
    returned_obs = []
    for action in actions:
        step_actions = np.tile(action, (num_envs, 1)).astype(np.float32)
        next_obs, rewards, terminations, truncations, infos = envs.step(step_actions)
        rb.add(obs, next_obs, step_actions, rewards, terminations, infos)
        obs = next_obs.astype(np.float32)
        returned_obs.append(obs)
    envs.close()
    return rb, returned_obs


def reference_rollout(env_id: str, actions: np.ndarray, seed: int) -> tuple[list[np.ndarray], bool]:
    """The observations a single, plain environment goes through, and whether it terminated."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        seen.append(obs)
        if terminated or truncated:
            break
    env.close()
    return seen, terminated


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_buffer_stores_the_true_final_observation_of_a_truncated_episode(algo):
    if "PendulumFiveSteps-v1" not in gym.registry:
        gym.register(
            "PendulumFiveSteps-v1",
            entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
            max_episode_steps=5,
        )
    actions = np.linspace(-2, 2, 7, dtype=np.float32)[:, None]  # the 5th step truncates, nothing terminates
    rb, returned_obs = fill_from_rollout(MODULES[algo], "PendulumFiveSteps-v1", actions, num_envs=2, seed=3)
    for env_index in range(2):
        reference, terminated = reference_rollout("PendulumFiveSteps-v1", actions, seed=3 + env_index)
        assert len(reference) == 6 and not terminated
        rows = rb.fields(rb.data[env_index : 7 * 2 : 2])  # the env's transitions, in step order, by field
        np.testing.assert_allclose(rows.next_obs[4].numpy(), reference[5], rtol=1e-6)  # the true final observation
        assert not np.allclose(rows.next_obs[4].numpy(), returned_obs[4][env_index])  # not the reset one
        assert rows.terminations[4].item() == 0.0  # a truncation is not a termination: it bootstraps
        for t in range(4):
            np.testing.assert_array_equal(rows.next_obs[t].numpy(), rows.obs[t + 1].numpy())
        np.testing.assert_array_equal(rows.obs[5].numpy(), returned_obs[4][env_index])  # then a fresh episode
        np.testing.assert_array_equal(rows.actions[:, 0].numpy(), actions[:, 0])
    batch = rb.sample(64)
    assert batch._fields == ("obs", "next_obs", "actions", "rewards", "terminations")
    assert [t.shape for t in batch] == [(64, 3), (64, 3), (64, 1), (64,), (64,)]


def test_buffer_stores_a_termination_with_the_terminal_observation():
    actions = np.tile(np.array([1.0, -1.0, 1.0], dtype=np.float32), (60, 1))  # Hopper falls within a few dozen steps
    rb, _ = fill_from_rollout(td3, "Hopper-v5", actions, num_envs=1, seed=0)
    reference, terminated = reference_rollout("Hopper-v5", actions, seed=0)
    assert terminated
    t = len(reference) - 2  # index of the terminating transition
    fields = rb.fields(rb.data)
    assert fields.terminations[t].item() == 1.0 and fields.terminations[:t].eq(0).all()
    np.testing.assert_allclose(fields.next_obs[t].numpy(), reference[-1], rtol=1e-5, atol=1e-6)
    assert fields.terminations[t + 1].item() == 0.0  # the next episode goes on


# --- bad input ---------------------------------------------------------------------------------


def validation_error(module, **overrides) -> str:
    """The one-line message validate() fails with for Args(**overrides)."""
    stderr = io.StringIO()
    with redirect_stderr(stderr), pytest.raises(SystemExit) as exit_info:
        module.validate(module.Args(**overrides))
    assert exit_info.value.code != 0
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"env_id": "CartPole-v1"}, ["Box", "cleanrl/dqn.py"]),
        ({"env_id": "Pendulm-v1"}, ["unknown environment id", "Pendulum-v1"]),
        ({"buffer_size": 256, "batch_size": 512}, ["--batch-size 512 is larger than --buffer-size 256"]),
        ({"total_timesteps": 0}, ["--total-timesteps must be positive"]),
        ({"buffer_size": -1}, ["--buffer-size must be positive"]),
        ({"num_envs": 0}, ["--num-envs must be positive"]),
        ({"policy_frequency": 0}, ["--policy-frequency must be positive"]),
        ({"learning_starts": -1}, ["--learning-starts must be 0 or positive"]),
        ({"total_timesteps": 1000}, ["--learning-starts 25000 is not below --total-timesteps 1000"]),
        ({"tau": 0.0}, ["--tau"]),
        ({"gamma": 1.5}, ["--gamma"]),
        ({"exploration_noise": -0.1}, ["--exploration-noise must be 0 or positive"]),
        ({"checkpoint_every": -5}, ["--checkpoint-every"]),
    ],
)
def test_validate_rejects_bad_input_in_one_line(algo, overrides, fragments):
    message = validation_error(MODULES[algo], **overrides)
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"noise_clip": -0.1}, "--noise-clip must be 0 or positive"),
        ({"policy_noise": -0.2}, "--policy-noise must be 0 or positive"),
        ({"policy_noise": float("nan")}, "--policy-noise must be 0 or positive"),
    ],
)
def test_td3_rejects_negative_noise(overrides, fragment):
    assert fragment in validation_error(td3, **overrides)


@pytest.mark.parametrize(
    "algo, flags, fragments",
    [
        ("td3", ["--env-id", "CartPole-v1"], ["Box", "cleanrl/dqn.py"]),
        ("ddpg", ["--env-id", "Pendulum-v1", "--resume", "missing/checkpoint.pt"], ["--resume", "no such file"]),
    ],
)
def test_bad_input_on_the_command_line_fails_before_any_work(workdir, algo, flags, fragments):
    assert_bad_input(run_script(SCRIPTS[algo], *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_a_replay_buffer_that_cannot_fit_is_refused_before_allocation(workdir, algo):
    # 10^12 rows of Pendulum transitions (3 + 3 + 1 + 1 + 1 float32 each) are 36,000 GB.
    result = run_script(SCRIPTS[algo], "--env-id", "Pendulum-v1", "--buffer-size", "1000000000000", cwd=workdir)
    assert result.returncode == 2
    assert_bad_input(result, workdir, "--buffer-size", "replay buffer needs 36000.0 GB", "GB available")


# --- checkpoints, resume ------------------------------------------------------------------------


def episodic_returns(run_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(run_dir)["charts/episodic_return"]


def model_weights(run_dir: Path, algo: str) -> dict:
    model = torch.load(run_dir / f"{SCRIPTS[algo][:-3]}.cleanrl_model", weights_only=False)
    return {f"{net}.{key}": value for net in ("actor", "critic") for key, value in model[net].items()}


@pytest.mark.parametrize("algo, env_id, steps", RESUMABLE)
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(workdir, straight_runs, algo, env_id, steps):
    straight_dir, _ = straight_runs(algo, env_id, steps)
    flags = resumable_flags(env_id, steps)
    run_dir = kill_at_first_checkpoint(SCRIPTS[algo], flags, workdir)
    assert not (run_dir / f"{SCRIPTS[algo][:-3]}.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < steps and checkpoint["replay_buffer"]["size"] == checkpoint["global_step"]
    assert not {"next_log", "latest", "next_obs"} & checkpoint.keys()  # no logging state; next_obs is in envs
    assert checkpoint["envs"] is not None  # classic-control and MuJoCo simulators are saved exactly

    resumed = run_script(SCRIPTS[algo], *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    assert len(episodic_returns(straight_dir)) >= 3
    assert episodic_returns(run_dir) == episodic_returns(straight_dir)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    for key in ("losses/qf1_loss", "losses/qf1_values", "losses/actor_loss", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    weights, expected = model_weights(run_dir, algo), model_weights(straight_dir, algo)
    assert weights.keys() == expected.keys()
    for key in weights:
        assert torch.equal(weights[key], expected[key]), key


def test_sigterm_writes_checkpoint_and_exits_zero(tmp_path):
    workdir = tmp_path / "td3"
    workdir.mkdir()
    out, run_dir = sigterm_while_training(
        SCRIPTS["td3"],
        ["--env-id", "Pendulum-v1", *SMALL, "--learning-starts", "100", "--total-timesteps", "10000000"],
        workdir,
        settle=0.5,
    )
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 10_000_000
    assert checkpoint["replay_buffer"]["size"] == min(checkpoint["global_step"], 1000)
    for key in (
        "actor",
        "critic",
        "target_actor",
        "target_critic",
        "actor_optimizer",
        "critic_optimizer",
        "envs",
        "rng",
    ):
        assert checkpoint[key] is not None, key

    # The other script refuses this checkpoint.
    other = tmp_path / "ddpg"
    other.mkdir()
    assert_bad_input(
        run_script(SCRIPTS["ddpg"], "--env-id", "Pendulum-v1", "--resume", str(run_dir / "checkpoint.pt"), cwd=other),
        other,
        "written by td3_continuous_action.py, not ddpg_continuous_action.py",
    )
