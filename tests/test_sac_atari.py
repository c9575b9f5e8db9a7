"""sac_atari.py: the discrete-SAC losses on a hand-computed case, the frame-indexed replay against the observations
the env returned, smoke runs on MinAtar (with evaluation) and Atari, SIGKILL + --resume exactness, bad input; the
script's own loop under tests/probe.py: the rows stored on Breakout (lives), and each update's critic, actor and
temperature losses and their gradients recomputed in float64 from the sampled rows and copied networks (the target
critics' soft value, held constant), no gradient reaching the target critics or leaking from one of the three steps
into another's parameters, the critics unmoved by the actor's step, the target-critic copy timing."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import sac_atari
import torch
from conftest import (
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
)
from update_reference import assert_gradients_match, assert_same_gradient, assert_unchanged, gradients

SCRIPT = "sac_atari.py"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One CPU thread, as the script runs (--torch-threads 1): on a busy machine torch's thread pool turns the
    buffer's small gathers from microseconds into tens of milliseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SAC_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "losses/qf1_values",
    "losses/qf2_values",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/qf_loss",
    "losses/actor_loss",
    "losses/alpha",
    "losses/alpha_loss",
    "losses/entropy",
]

# --- the maths: 2 states, 3 actions, computed by hand ------------------------------------------------------------
#
# pi(.|s0) = (1/2, 1/4, 1/4): log pi = (-ln 2, -2 ln 2, -2 ln 2), entropy H0 = 1.5 ln 2 = 1.039721
# pi(.|s1) = (1/3, 1/3, 1/3): log pi = -ln 3 each,               entropy H1 = ln 3     = 1.098612
# Q1(s0) = (2, 4, -1), Q2(s0) = (3, 1, 0)   -> min = (2, 1, -1), E_pi[min] = 1 + 1/4 - 1/4 = 1
# Q1(s1) = (0, 6, 9),  Q2(s1) = (3, -3, 12) -> min = (0, -3, 9), E_pi[min] = (0 - 3 + 9) / 3 = 2
# alpha = 0.5, gamma = 0.9; soft values V(s) = E_pi[min Q] + alpha H:
# V(s0) = 1 + 0.5 * 1.039721 = 1.519860, V(s1) = 2 + 0.5 * 1.098612 = 2.549306

PROBS = [[1 / 2, 1 / 4, 1 / 4], [1 / 3, 1 / 3, 1 / 3]]
Q1 = [[2.0, 4.0, -1.0], [0.0, 6.0, 9.0]]
Q2 = [[3.0, 1.0, 0.0], [3.0, -3.0, 12.0]]
ALPHA, GAMMA = 0.5, 0.9


def t(values, **kwargs) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, **kwargs)


def test_soft_q_target_takes_the_expectation_over_next_actions():
    probs = t(PROBS)
    q_min = torch.min(t(Q1), t(Q2))
    rewards = t([1.0, -1.0])
    # r + gamma V(s'): 1 + 0.9 * 1.519860 = 2.367874 and -1 + 0.9 * 2.549306 = 1.294376
    got = sac_atari.soft_q_target(rewards, t([0.0, 0.0]), probs, probs.log(), q_min, ALPHA, GAMMA)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx([2.367874, 1.294376], abs=1e-6)
    # s1's episode terminated (a lost life counts): only its reward, -1; s0 unchanged.
    got = sac_atari.soft_q_target(rewards, t([0.0, 1.0]), probs, probs.log(), q_min, ALPHA, GAMMA)
    assert got.tolist() == pytest.approx([2.367874, -1.0], abs=1e-6)
    # alpha = 0: the plain expected value of min Q, 1 + 0.9 * 1 and -1 + 0.9 * 2.
    got = sac_atari.soft_q_target(rewards, t([0.0, 0.0]), probs, probs.log(), q_min, 0.0, GAMMA)
    assert got.tolist() == pytest.approx([1.9, 0.8], abs=1e-12)


def test_policy_loss_and_its_gradient_through_the_probabilities_and_log_probabilities():
    logits = t(PROBS).log().requires_grad_()
    probs, log_probs = sac_atari.policy(lambda obs: logits, obs=None)  # any callable giving logits is an actor
    np.testing.assert_allclose(probs.detach().numpy(), PROBS, rtol=1e-12)
    np.testing.assert_allclose(log_probs.detach().numpy(), np.log(PROBS), rtol=1e-12)
    loss = sac_atari.policy_loss(probs, log_probs, torch.min(t(Q1), t(Q2)), ALPHA)
    # per state sum_a pi (alpha log pi - min Q) = -V(s): mean of -1.519860 and -2.549306
    assert loss.item() == pytest.approx(-2.034583, abs=1e-6)
    loss.backward()
    # d/dz_a = pi_a (c_a - sum_b pi_b c_b) / 2 states, c = alpha log pi - min Q:
    # s0: c = (-2.346574, -1.693147, 0.306853), E c = -1.519860 -> (-0.206678, -0.021661, 0.228339)
    # s1: alpha log pi is the same for each action, c - E c = -(min Q - 2) = (2, 5, -7) -> (2, 5, -7) / 6
    expected = [[-0.206678, -0.021661, 0.228339], [2 / 6, 5 / 6, -7 / 6]]
    np.testing.assert_allclose(logits.grad.numpy(), expected, atol=1e-6)


def test_temperature_loss_moves_alpha_towards_the_target_entropy_with_the_policy_held_fixed():
    target = sac_atari.target_entropy(3, 0.89)  # 0.89 * ln 3
    assert target == pytest.approx(0.977765, abs=1e-6)
    assert sac_atari.target_entropy(6, 1.0) == pytest.approx(math.log(6))
    probs = t(PROBS, requires_grad=True)
    log_probs = probs.log()
    log_alpha = t(math.log(ALPHA), requires_grad=True)
    loss = sac_atari.temperature_loss(log_alpha, probs, log_probs, target)
    # mean_s alpha (H(s) - target) = 0.5 * ((1.039721 - 0.977765) + (1.098612 - 0.977765)) / 2 = 0.045701
    assert loss.item() == pytest.approx(0.045701, abs=1e-6)
    loss.backward()
    # d/d log_alpha = alpha * the same = 0.045701 > 0: both entropies are above the target, so alpha falls.
    assert log_alpha.grad.item() == pytest.approx(0.045701, abs=1e-6)
    assert probs.grad is None  # the policy's probabilities are constants in this loss
    # Below the target (the maximum, ln 3: above H0, equal to H1) the gradient is negative: alpha rises.
    log_alpha.grad = None
    sac_atari.temperature_loss(log_alpha, probs, log_probs, math.log(3)).backward()
    assert log_alpha.grad.item() == pytest.approx(0.5 * ((1.5 * math.log(2) - math.log(3)) + 0) / 2, abs=1e-12)


def test_sample_actions_draws_from_the_policy():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20_000, -1)
    actions = sac_atari.sample_actions(lambda obs: logits, torch.zeros(20_000))
    np.testing.assert_allclose(np.bincount(actions, minlength=3) / 20_000, [0.7, 0.2, 0.1], atol=0.015)
    generator = torch.Generator().manual_seed(5)
    first = sac_atari.sample_actions(lambda obs: logits, None, generator)
    assert np.array_equal(first, sac_atari.sample_actions(lambda obs: logits, None, torch.Generator().manual_seed(5)))


def test_networks_follow_the_observation_shape():
    atari = sac_atari.PixelNetwork((4, 84, 84), 4, 255.0)
    minatar = sac_atari.PixelNetwork((4, 10, 10), 6, 1.0)
    assert atari(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 4)
    assert minatar(torch.zeros(2, 4, 10, 10, dtype=torch.uint8)).shape == (2, 6)
    assert isinstance(minatar.network[0], torch.nn.Conv2d) and minatar.network[0].out_channels == 16
    assert minatar.network[3].out_features == 128 and atari.network[7].out_features == 512
    assert all(layer.bias.abs().max() == 0 for layer in atari.network if hasattr(layer, "bias"))


# --- the replay buffer -------------------------------------------------------------------------------------------


def test_frame_replay_returns_exactly_the_stacked_observations_seen_across_game_starts():
    """Breakout, 2 envs, random actions, stored as the script's loop stores them into a buffer that wraps around;
    each stack rebuilt from the buffer equals the observation the env returned, including the zero-padded first
    observations of new games, and samples are real transitions only (never an autoreset step)."""
    num_envs, steps_kept, total = 2, 150, 400
    envs = sac_atari.make_envs("BreakoutNoFrameskip-v4", num_envs)
    rb = sac_atari.FrameReplayBuffer(num_envs * steps_kept, num_envs, (4, 84, 84), 4, torch.device("cpu"))
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=3)
    resets = np.zeros(num_envs, dtype=bool)
    seen, transitions, game_starts = [], {}, 0
    for step in range(total):
        actions = rng.integers(4, size=num_envs)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        learn_terminations = terminations | infos["life_loss"]
        rb.add(torch.from_numpy(obs), actions, np.sign(rewards), learn_terminations, resets)
        seen.append(obs)
        for env in np.flatnonzero(~resets):  # the real transitions, keyed by their observations
            key = (obs[env].tobytes(), next_obs[env].tobytes())
            transitions.setdefault(key, set()).add((actions[env], np.sign(rewards[env]), learn_terminations[env]))
        if step >= total - steps_kept + 3:
            game_starts += int(resets.sum())
        resets = terminations | truncations
        obs = next_obs
    envs.close()
    assert game_starts >= 2, "the rows kept should cross game starts"
    assert rb.size == steps_kept and rb.pos == total % steps_kept
    # Every row kept whose 3 frames behind are kept too: row of step s is s % steps_kept.
    for step in range(total - steps_kept + 3, total):
        rows, env_ids = torch.full((num_envs,), step % steps_kept), torch.arange(num_envs)
        np.testing.assert_array_equal(rb.stacked(rows, env_ids).numpy(), seen[step], err_msg=f"step {step}")
        for env in range(num_envs):
            if rb.first[step % steps_kept, env]:  # a game's first observation: the env pads the older frames
                assert not seen[step][env, :3].any()
    obs_b, next_obs_b, actions_b, rewards_b, terminations_b = rb.sample(512)
    for i in range(512):
        key = (obs_b[i].numpy().tobytes(), next_obs_b[i].numpy().tobytes())
        assert key in transitions, "sampled a pair of observations that is not a transition"
        stored = (actions_b[i].item(), rewards_b[i].item(), bool(terminations_b[i]))
        assert stored in {(a, r, bool(d)) for a, r, d in transitions[key]}
    assert terminations_b.any(), "life losses and game ends should be among the samples"
    # A resume with fresh games (ALE): the newest row has no next observation any more, the next row starts a game.
    rb.new_games()
    assert not rb.valid[(rb.pos - 1) % steps_kept].any() and rb.starts_game.all()


# --- runs --------------------------------------------------------------------------------------------------------

MINATAR = [
    "--env-id",
    "MinAtar/Breakout-v1",
    "--buffer-size",
    "2000",
    "--batch-size",
    "16",
    "--learning-starts",
    "500",
    "--target-network-frequency",
    "500",
]
RESUME_FLAGS = [
    *MINATAR,
    "--total-timesteps",
    "2000",
    "--checkpoint-every",
    "1000",
    "--save-model",
    "--eval-episodes",
    "2",
]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """An uninterrupted MinAtar run with RESUME_FLAGS: the smoke run, and the reference of the resume test."""
    workdir = tmp_path_factory.mktemp("straight")
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "evaluation over 2 episodes" in result.stdout
    (run_dir,) = run_dirs(workdir)
    return run_dir


def test_minatar_smoke_writes_finite_scalars_and_evaluates_the_saved_model(straight_run):
    scalars = read_scalars(straight_run)
    assert_finite_keys(scalars, SAC_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    assert [step for step, _ in scalars["losses/qf_loss"]] == [1000, 2000]
    assert scalars["losses/alpha"][-1][1] < 1.0  # autotuned from 1: the policy's entropy starts above the target
    model = torch.load(straight_run / "sac_atari.cleanrl_model", weights_only=False)
    assert model["script"] == "sac_atari" and model["obs_shape"] == (4, 10, 10) and model["obs_high"] == 1.0


def test_atari_smoke_stores_what_the_loop_saw(workdir):
    # 900 uniformly random steps of one Breakout game, then 25 updates; under tests/probe.py: Breakout has lives, so
    # the rows stored show how life losses are stored.
    from probe import probe_script

    flags = ["--buffer-size", "1000", "--batch-size", "4", "--learning-starts", "900", "--total-timesteps", "1000"]
    flags += ["--target-network-frequency", "100"]
    trace = probe_script(SCRIPT, flags, workdir, watch=STEP_NAMES, final=["rb"])
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, SAC_KEYS)  # Breakout's random games end within 1000 steps
    assert "1,000/1,000 steps" in trace.stdout
    steps, rb = loop_steps(trace), trace.final["rb"]
    assert len(steps) == 1000 and rb["size"] == 1000  # row t is step t: nothing overwritten
    resets, lives = np.zeros(1, dtype=bool), 0
    for t, step in enumerate(steps):
        assert torch.equal(rb["frames"][t], step["obs"][:, -1:])  # the newest frame of the observation acted on
        assert rb["actions"][t].tolist() == step["actions"].tolist()
        assert rb["rewards"][t].tolist() == np.sign(step["rewards"]).tolist()  # clipped to their sign
        ended = step["terminations"] | step["infos"]["life_loss"]  # game overs and lost lives
        assert rb["terminations"][t].tolist() == ended.astype(float).tolist(), f"step {t}"
        assert rb["valid"][t].tolist() == (~resets).tolist()  # an autoreset step is no transition
        resets = step["terminations"] | step["truncations"]
        lives += int(step["infos"]["life_loss"].sum())
    assert lives >= 2, lives


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(workdir, straight_run):
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, workdir)
    assert not (run_dir / "sac_atari.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 1000 and checkpoint["replay_buffer"]["size"] == 1000
    assert checkpoint["envs"] is not None  # MinAtar games are saved with the checkpoint
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    # Whole curves, exactly: the losses at 2000 follow 250 post-resume gradient steps; the evaluation samples too.
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in [k for k in SAC_KEYS if k != "charts/SPS"] + ["eval/episodic_return"]:
        assert resumed_scalars[key] == straight_scalars[key], key
    weights = [torch.load(d / "sac_atari.cleanrl_model", weights_only=False) for d in (run_dir, straight_run)]
    for network in ("actor", "qf1", "qf2"):
        for name, value in weights[0][network].items():
            assert torch.equal(value, weights[1][network][name]), f"{network}.{name}"


# --- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "cleanrl/sac_continuous_action.py"]),
        # 10^12 Atari steps of one 84x84 uint8 frame plus action, reward, termination and two flags: 7074 bytes each.
        (["--buffer-size", "1000000000000"], ["--buffer-size: the replay buffer needs 7074000.0 GB", "GB available"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(total_timesteps=0), "--total-timesteps must be positive"),
        (dict(batch_size=0), "--batch-size must be positive"),
        (dict(update_frequency=-4), "--update-frequency must be positive"),
        (dict(q_lr=0.0), "--q-lr must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(total_timesteps=1000, learning_starts=1000), "--learning-starts 1000 must be in [0, --total-timesteps"),
        (dict(tau=0.0), "--gamma and --tau must be in (0, 1]"),
        (dict(alpha=-0.1), "--alpha must be 0 or positive"),
        (dict(target_entropy_scale=0.0), "--target-entropy-scale must be in (0, 1]"),
        (dict(target_entropy_scale=1.5), "--target-entropy-scale must be in (0, 1]"),
        (dict(buffer_size=4), "--buffer-size 4 must hold at least 5 steps"),
        (dict(checkpoint_every=-1), "--checkpoint-every must be 0 (off) or positive"),
        (
            dict(env_id="CartPole-v1"),
            "CartPole-v1 is not an Atari or MinAtar game; for flat observations use cleanrl/dqn.py",
        ),
        (
            dict(env_id="MinAtar/Breakot-v1"),
            "unknown environment id 'MinAtar/Breakot-v1'; did you mean MinAtar/Breakout-v1",
        ),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = sac_atari.Args(**{"env_id": "MinAtar/Breakout-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        sac_atari.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


# --- the loop's own wiring ---------------------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py, which copies what its loop saw at each step and, at each of an
# update's three backward() calls (critics, actor, alpha), the batch and the networks; the tests recompute every loss
# from those copies with plain references. MinAtar: small networks, cheap to copy.
LEARN_FLAGS = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "2", "--buffer-size", "1200", "--batch-size", "8"]
LEARN_FLAGS += ["--learning-starts", "600", "--update-frequency", "40", "--target-network-frequency", "80"]
LEARN_FLAGS += ["--total-timesteps", "1000", "--gamma", "0.9"]
STEP_NAMES = ["obs", "obs_np", "actions", "rewards", "terminations", "truncations", "infos"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "rewards_b", "terminations_b", "actor", "qf1", "qf2"]
BATCH_NAMES += ["qf1_target", "qf2_target", "log_alpha", "alpha"]


@pytest.fixture(scope="module")
def minatar_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("learn")
    grads = ["qf1", "qf2", "actor", "log_alpha", "qf1_target", "qf2_target"]
    return probe_script(SCRIPT, LEARN_FLAGS, cwd, watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=grads)


def loop_steps(trace) -> list[dict]:
    """One dict per loop iteration (taken as the step is counted, after envs.step): the observation acted on, the
    actions, what the env returned."""
    return [entry for entry in trace.steps if entry["step"] > 0]


def transitions_seen(steps: list[dict]) -> set:
    """(obs, action, clipped reward, training-episode end, next obs) of every real transition, as bytes."""
    transitions = set()
    resets = np.zeros(len(steps[0]["actions"]), dtype=bool)
    for step in steps:
        life_loss = step["infos"].get("life_loss", np.zeros_like(resets))
        for env in np.flatnonzero(~resets):
            ended = bool(step["terminations"][env] or life_loss[env])
            obs, next_obs = step["obs"][env].numpy().tobytes(), step["obs_np"][env].tobytes()
            transitions.add((obs, int(step["actions"][env]), float(np.sign(step["rewards"][env])), ended, next_obs))
        resets = step["terminations"] | step["truncations"]
    return transitions


def network(state_dict: dict) -> sac_atari.PixelNetwork:
    net = sac_atari.PixelNetwork((4, 10, 10), 3, 1.0)
    net.load_state_dict(state_dict)
    return net


def network64(state_dict: dict) -> tuple[torch.nn.Module, dict]:
    """The network in float64 (its layers run on the float64 observations: MinAtar's cells are 0/1, scale 1) and its
    parameters, by name, as leaves of the reference's gradient."""
    net = network(state_dict).double()
    return net.network, dict(net.named_parameters())


def updates_of(trace) -> list[tuple[dict, dict, dict]]:
    """The backward() calls in threes: the critics', the actor's and alpha's of one update."""
    calls = trace.backward
    assert len(calls) % 3 == 0
    return [tuple(calls[i : i + 3]) for i in range(0, len(calls), 3)]


def no_gradients(call: dict, name: str):
    """None in place of each of `name`'s recorded gradients."""
    recorded = call["grads"][name]
    return dict.fromkeys(recorded) if isinstance(recorded, dict) else None


def test_each_update_samples_real_transitions_and_its_three_losses_match_plain_references(minatar_loop):
    steps = loop_steps(minatar_loop)
    transitions = transitions_seen(steps)
    updates = updates_of(minatar_loop)
    assert len(updates) == (1000 - 600) // 40
    entropy_target = 0.89 * math.log(3)
    terminal_targets = 0
    previous_alpha_call = None
    for k, (critic_call, actor_call, alpha_call) in enumerate(updates):
        where = f"update {k} at step {critic_call['step']}"
        assert critic_call["step"] == actor_call["step"] == alpha_call["step"]
        batch = critic_call
        rows = zip(batch["obs_b"], batch["actions_b"], batch["rewards_b"], batch["terminations_b"])
        for i, (obs, action, reward, ended) in enumerate(rows):
            key = (
                obs.numpy().tobytes(),
                int(action),
                float(reward),
                bool(ended),
                batch["next_obs_b"][i].numpy().tobytes(),
            )
            assert key in transitions, "a sampled row is not a transition the env produced"
        obs, next_obs = batch["obs_b"].double(), batch["next_obs_b"].double()
        taken = torch.arange(8), batch["actions_b"]
        # The critics: both regress on r + gamma (1 - d) sum_a' pi(a'|s') (min of the TARGET critics - alpha log pi),
        # pi the current policy, alpha = exp(log_alpha) as the last temperature step left it; the target a constant.
        alpha = batch["log_alpha"].double().exp()
        assert batch["alpha"].item() == pytest.approx(alpha.item(), rel=1e-6)
        with torch.no_grad():
            next_logits = network64(batch["actor"])[0](next_obs)
            next_probs, next_log_probs = torch.softmax(next_logits, 1), torch.log_softmax(next_logits, 1)
            next_q = torch.min(network64(batch["qf1_target"])[0](next_obs), network64(batch["qf2_target"])[0](next_obs))
            next_value = (next_probs * (next_q - alpha * next_log_probs)).sum(1)
            target = batch["rewards_b"].double() + 0.9 * (1 - batch["terminations_b"].double()) * next_value
        (qf1, qf1_params), (qf2, qf2_params) = network64(batch["qf1"]), network64(batch["qf2"])
        critic_loss = ((qf1(obs)[taken] - target) ** 2).mean() + ((qf2(obs)[taken] - target) ** 2).mean()
        assert_gradients_match(critic_call["grads"]["qf1"], gradients(critic_loss, qf1_params), f"{where}, qf1")
        assert_gradients_match(critic_call["grads"]["qf2"], gradients(critic_loss, qf2_params), f"{where}, qf2")
        assert critic_call["loss"].item() == pytest.approx(critic_loss.item(), rel=1e-4)
        terminal_targets += int(batch["terminations_b"].sum())
        # The actor, against the critics just updated (constants here): E_s sum_a pi(a|s) (alpha log pi(a|s) - min_i
        # Q_i(s, a)), alpha a constant.
        assert actor_call["actor"].keys() == batch["actor"].keys()
        assert_unchanged(batch["actor"], actor_call["actor"], f"{where}: the critic step")
        actor, actor_params = network64(actor_call["actor"])
        logits = actor(obs)
        probs, log_probs = torch.softmax(logits, 1), torch.log_softmax(logits, 1)
        with torch.no_grad():
            q_min = torch.min(network64(actor_call["qf1"])[0](obs), network64(actor_call["qf2"])[0](obs))
        actor_loss = (probs * (alpha * log_probs - q_min)).sum(1).mean()
        assert_gradients_match(actor_call["grads"]["actor"], gradients(actor_loss, actor_params), f"{where}, actor")
        assert actor_call["loss"].item() == pytest.approx(actor_loss.item(), rel=1e-4, abs=1e-6)
        # alpha: E_s[-alpha sum_a pi(a|s) (log pi(a|s) + target entropy)], the policy of before the actor's step a
        # constant.
        assert alpha_call["log_alpha"].item() == batch["log_alpha"].item()  # not stepped in between
        log_alpha = batch["log_alpha"].double().requires_grad_(True)
        weighted = (probs * (log_probs + entropy_target)).sum(1).detach()
        alpha_loss = (-log_alpha.exp() * weighted).mean()
        (reference,) = torch.autograd.grad(alpha_loss, log_alpha)
        # Its gradient alpha (H - target entropy) is a difference of two terms of ~1 that float32 rounds at ~1e-7: it
        # is compared on their scale (relative to itself it was off by up to 1.4e-5 with the entropy near the target).
        scale = (log_alpha.exp() * (-(probs * log_probs).sum(1) + entropy_target)).mean().item()
        assert alpha_call["grads"]["log_alpha"].item() == pytest.approx(reference.item(), abs=2e-5 * scale), where
        assert alpha_call["loss"].item() == pytest.approx(alpha_loss.item(), rel=1e-4, abs=1e-7)
        # What each backward() must leave alone: no gradient ever reaches the target critics; the critics' loss adds
        # none to the actor or alpha, the actor's none to the critics or alpha, alpha's none to the actor or critics
        # (their .grad as the previous backward left it); the actor's step leaves the critics where they were.
        for call in (critic_call, actor_call, alpha_call):
            for critic in ("qf1_target", "qf2_target"):
                assert all(grad is None for grad in call["grads"][critic].values()), f"{where}: {critic} has a gradient"
        for name in ("actor", "log_alpha"):  # before the first update's actor and alpha steps: none yet
            before = previous_alpha_call["grads"][name] if previous_alpha_call else no_gradients(critic_call, name)
            assert_same_gradient(critic_call["grads"][name], before, f"{where}, critic step: {name}")
        for name in ("qf1", "qf2", "log_alpha"):
            assert_same_gradient(actor_call["grads"][name], critic_call["grads"][name], f"{where}, actor step: {name}")
        for name in ("qf1", "qf2", "actor"):
            assert_same_gradient(alpha_call["grads"][name], actor_call["grads"][name], f"{where}, alpha step: {name}")
        for critic in ("qf1", "qf2"):
            assert_unchanged(actor_call[critic], alpha_call[critic], f"{where}: the actor step")
        previous_alpha_call = alpha_call
    assert terminal_targets > 0, "some sampled transitions should end a training episode"
    # Each update's temperature step is what the next update's target uses, and it moved: alpha is learned.
    log_alphas = [critic_call["log_alpha"].item() for critic_call, _, _ in updates]
    assert log_alphas[0] == 0.0 and len(set(log_alphas)) == len(log_alphas)


def test_the_target_critics_are_the_critics_copied_every_target_network_frequency_steps(minatar_loop):
    updates = updates_of(minatar_loop)
    copy_steps = [c for c in range(80, 1000, 80) if c > 600]
    for k, (critic_call, _, _) in enumerate(updates):
        # Copied (tau 1) at the end of the iteration whose step crossed a multiple of 80, after its update: the
        # critics that the next update found; before the first copy, the initial ones.
        copies = [c for c in copy_steps if c < critic_call["step"]]
        source = next(u for u, _, _ in updates if u["step"] > copies[-1]) if copies else updates[0][0]
        for critic in ("qf1", "qf2"):
            for name, tensor in critic_call[f"{critic}_target"].items():
                assert torch.equal(tensor, source[critic][name]), (
                    f"update {k} at {critic_call['step']}: {critic}.{name}"
                )
    assert len(copy_steps) >= 3
