"""c51_atari.py: the distributional projection against a plain loop, the frame-indexed replay against the observations
the env returned, bad input, SIGKILL + resume; the script's own loop under tests/probe.py (the smoke runs): the rows
stored on Breakout (lives) vs what the env returned, every update's loss and gradient vs a float64 reference loss with
the projected target of the target network recomputed from the sampled rows (no gradient reaching the target network),
target-copy timing, the epsilon schedule."""

from __future__ import annotations

import c51_atari
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, assert_no_gradient, gradients, leaves

from cleanrl_utils.envs.atari import make_envs

MINATAR_TINY = [
    "--env-id",
    "MinAtar/Breakout-v1",
    "--num-envs",
    "2",
    "--buffer-size",
    "400",
    "--learning-starts",
    "100",
    "--batch-size",
    "8",
    "--target-network-frequency",
    "50",
]
C51_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "charts/learning_rate",
    "losses/loss",
    "losses/q_values",
]


# --- the projection --------------------------------------------------------------------------


def reference_projection(next_probs, rewards, terminations, support, gamma):
    """The C51 projection (Bellemare et al. 2017, Algorithm 1), one atom at a time."""
    n_atoms = len(support)
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    projected = np.zeros((len(rewards), n_atoms))
    for i in range(len(rewards)):
        for j in range(n_atoms):
            tz = min(max(rewards[i] + gamma * (1 - terminations[i]) * support[j], v_min), v_max)
            b = (tz - v_min) / delta_z
            lower, upper = int(np.floor(b)), int(np.ceil(b))
            if lower == upper:
                projected[i, lower] += next_probs[i, j]
            else:
                projected[i, lower] += next_probs[i, j] * (upper - b)
                projected[i, upper] += next_probs[i, j] * (b - lower)
    return projected


def test_projection_lands_exactly_on_atoms_and_clamps_outside_the_support():
    # Support [-2, -1, 0, 1, 2]: delta 1, so integer targets are exact atoms in floating point too.
    support = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]] * 5, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 10.0, -1.0, 0.5], dtype=torch.float64)
    terminations = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    got = c51_atari.project_distribution(probs, rewards, terminations, support, 1.0)
    expected = [
        [0, 0.1, 0.2, 0.3, 0.4],  # r 1: every atom moves one up, exactly onto an atom; the top two meet at 2
        [0.1, 0.2, 0.3, 0.2, 0.2],  # r 0, gamma 1: unchanged
        [0, 0, 0, 0, 1],  # far above the support: all on v_max
        [0, 1, 0, 0, 0],  # terminated, r -1: all mass on the atom -1, the next distribution dropped
        [0, 0, 0.5, 0.5, 0],  # terminated, r 0.5: halfway between 0 and 1
    ]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    expected_loop = reference_projection(probs.numpy(), rewards.numpy(), terminations.numpy(), support.numpy(), 1.0)
    np.testing.assert_allclose(got.numpy(), expected_loop)


@pytest.mark.parametrize("gamma", [0.99, 1.0, 0.5])
def test_projection_matches_a_plain_loop_on_the_atari_support(gamma):
    generator = torch.Generator().manual_seed(0)
    batch = 128
    support = torch.linspace(-10, 10, 51, dtype=torch.float64)  # the script's default support
    next_probs = torch.softmax(3 * torch.randn(batch, 51, generator=generator, dtype=torch.float64), dim=1)
    # Clipped rewards (-1, 0, 1) as learning sees them, and rewards beyond both ends of the support.
    rewards = torch.cat(
        [
            torch.randint(-1, 2, (batch // 2,), generator=generator).double(),
            30 * torch.rand(batch // 2, generator=generator, dtype=torch.float64) - 15,
        ]
    )
    terminations = (torch.rand(batch, generator=generator) < 0.3).double()
    got = c51_atari.project_distribution(next_probs, rewards, terminations, support, gamma)
    expected = reference_projection(next_probs.numpy(), rewards.numpy(), terminations.numpy(), support.numpy(), gamma)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    # float32, as in training: no mass lost to rounding in (tz - v_min) / delta_z.
    got32 = c51_atari.project_distribution(
        next_probs.float(), rewards.float(), terminations.float(), support.float(), gamma
    )
    torch.testing.assert_close(got32.sum(dim=1), torch.ones(batch), atol=1e-5, rtol=0)


@pytest.mark.parametrize("obs_shape", [(4, 84, 84), (4, 10, 10)])
def test_network_gives_a_distribution_per_action_and_acts_greedily_on_its_mean(obs_shape):
    q_network = c51_atari.QNetwork(obs_shape, 3, 255.0, n_atoms=5, v_min=-2, v_max=2)
    head = q_network.network[-1]
    with torch.no_grad():
        head.weight.zero_()
        # Action 0: uniform (mean 0); action 1: nearly all on +2; action 2: nearly all on -2.
        head.bias.copy_(torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 20, 20, 0, 0, 0, 0.0]))
    obs = torch.randint(0, 256, (6, *obs_shape), dtype=torch.uint8)
    assert q_network(obs).shape == (6, 3, 5)
    torch.testing.assert_close(q_network.q_values(obs)[0], torch.tensor([0.0, 2.0, -2.0]), atol=1e-6, rtol=0)
    assert (c51_atari.select_actions(q_network, obs, 0.0, 3) == 1).all()


# --- the replay buffer -----------------------------------------------------------------------


def record_stream(env_id: str, num_envs: int, steps: int, buffer_size: int, seed: int = 0):
    """Drive `env_id` with random actions as c51_atari's loop does, filling a FrameReplayBuffer, and return the buffer
    and every (obs, action, clipped reward, training termination, next_obs, was_a_transition) the loop saw."""
    envs = make_envs(env_id, num_envs)
    shape = envs.single_observation_space.shape
    rb = c51_atari.FrameReplayBuffer(buffer_size, num_envs, shape, c51_atari.stack_of(shape), torch.device("cpu"))
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    resets = np.zeros(num_envs, dtype=bool)
    seen = []
    for _ in range(steps):
        actions = rng.integers(envs.single_action_space.n, size=num_envs)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        training_end = terminations | infos["life_loss"]
        rb.add(torch.from_numpy(obs), actions, np.sign(rewards), training_end, resets)
        seen.append((obs, actions, np.sign(rewards), training_end, next_obs, ~resets))
        resets = terminations | truncations
        obs = next_obs
    envs.close()
    return rb, seen


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "MinAtar/Breakout-v1"])
def test_replay_rebuilds_exactly_the_observations_seen_across_games_and_wrap_around(env_id):
    # 1000 steps of 2 envs into 400 rows each: several games (first frames padded with zeros) and a wrap.
    num_envs, steps, rows = 2, 1000, 400
    rb, seen = record_stream(env_id, num_envs, steps, rows * num_envs)
    assert rb.size == rows and rb.pos == steps % rows
    game_starts, env = 0, torch.arange(num_envs)
    for age in range(1, rows - rb.stack + 1):  # every row sample() may draw
        step = steps - 1 - age
        row = torch.full((num_envs,), step % rows)
        obs, actions, rewards, ends, next_obs, is_transition = seen[step]
        assert torch.equal(rb.stacked(row, env), torch.from_numpy(obs))
        assert torch.equal(rb.stacked((row + 1) % rows, env), torch.from_numpy(next_obs))
        assert torch.equal(rb.valid[row, env], torch.from_numpy(is_transition))
        assert torch.equal(rb.actions[row, env], torch.from_numpy(actions))
        assert torch.equal(rb.rewards[row, env], torch.from_numpy(rewards).float())
        assert torch.equal(rb.terminations[row, env].bool(), torch.from_numpy(ends))
        game_starts += int(rb.first[row, env].sum())
    assert game_starts >= 4, "the stream should cross several game starts"
    if rb.stack > 1:  # at a game's first observation the older frames are zeros, never the last game's frames
        rows_first, envs_first = rb.first[: rb.size].nonzero(as_tuple=True)
        assert (rb.stacked(rows_first, envs_first)[:, :-1] == 0).all()


def test_sample_never_draws_an_autoreset_step_and_matches_what_was_seen():
    rb, seen = record_stream("MinAtar/Breakout-v1", 2, 400, 800)
    assert (~rb.valid[: rb.size]).sum() >= 10  # many short random games: many autoreset rows
    torch.manual_seed(0)
    transitions = {
        (obs.tobytes(), int(a), float(r), bool(d), next_obs.tobytes())
        for step in seen
        for obs, a, r, d, next_obs, real in zip(*step)
        if real
    }
    obs, next_obs, actions, rewards, terminations = rb.sample(4096)
    for i in range(len(obs)):
        key = (obs[i].numpy().tobytes(), int(actions[i]), float(rewards[i]), bool(terminations[i]))
        assert key + (next_obs[i].numpy().tobytes(),) in transitions


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--buffer-size", "1000000000000"], ["--buffer-size: the replay buffer needs", "GB", "lower --buffer-size"]),
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "sac_continuous_action.py"]),
    ],
)
def test_bad_input_fails_in_one_line_before_any_run_directory(workdir, flags, fragments):
    assert_bad_input(run_script("c51_atari.py", *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"env_id": "CartPole-v1"}, "cleanrl/c51.py"),
        ({"env_id": "MinAtar/Brekout-v1"}, "did you mean MinAtar/Breakout-v1"),
        ({"v_min": 5, "v_max": 5}, "--v-min must be below --v-max"),
        ({"n_atoms": 1}, "--n-atoms must be at least 2"),
        ({"total_timesteps": 5000}, "--learning-starts 80000 must be in [0, --total-timesteps 5000)"),
        ({"learning_starts": 2}, "--learning-starts must be at least 5"),
    ],
)
def test_validate_refuses_bad_arguments_in_one_line(capsys, fields, fragment):
    # In-process (the subprocess cases above check that nothing is left behind): validate() runs before any work.
    with pytest.raises(SystemExit) as exit_info:
        c51_atari.validate(c51_atari.Args(**fields))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines


# --- runs ------------------------------------------------------------------------------------


def test_minatar_smoke_logs_whole_games_and_evaluates_saved_model(minatar_loop):
    trace, cwd = minatar_loop
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, C51_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 3
    # Cross-entropy against a distribution over 51 atoms: positive, at most ~log(51) early on.
    assert all(0 < value < 10 for _, value in scalars["losses/loss"])
    assert torch.load(run_dir / "c51_atari.cleanrl_model", weights_only=False)["script"] == "c51_atari"


def test_atari_smoke_trains_the_nature_cnn_and_stores_what_the_loop_saw(breakout_loop):
    # 250 steps of 4 envs acting at random: the losses are logged at step 1000, after 25 gradient steps on 4-frame
    # stacks; Breakout has lives, so the rows stored show how life losses are stored.
    trace, cwd = breakout_loop
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), ["losses/loss", "losses/q_values", "charts/epsilon"])
    steps, rb = loop_steps(trace), trace.final["rb"]
    assert len(steps) == 250 and rb["size"] == 100
    resets = np.zeros(4, dtype=bool)
    lives_checked = 0
    for t, step in enumerate(steps):
        if t >= len(steps) - 100:  # the rows the buffer still holds
            row = t % 100
            assert torch.equal(rb["frames"][row], step["obs"][:, -1:])  # the newest frame of the observation acted on
            assert rb["actions"][row].tolist() == step["actions"].tolist()
            assert rb["rewards"][row].tolist() == np.sign(step["rewards"]).tolist()
            ended = step["terminations"] | step["infos"]["life_loss"]  # game overs and lost lives
            assert rb["terminations"][row].tolist() == ended.astype(float).tolist(), f"step {t}"
            assert rb["valid"][row].tolist() == (~resets).tolist()  # an autoreset step is no transition
            lives_checked += int(step["infos"]["life_loss"].sum())
        resets = step["terminations"] | step["truncations"]
    assert lives_checked >= 2, lives_checked


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(tmp_path):
    flags = [*MINATAR_TINY, "--total-timesteps", "2000", "--checkpoint-every", "1000", "--save-model"]
    flags += ["--eval-episodes", "1"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("c51_atari.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    (straight_dir,) = run_dirs(tmp_path / "straight")
    run_dir = kill_at_first_checkpoint("c51_atari.py", flags, tmp_path / "killed")
    assert not (run_dir / "c51_atari.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 1000 and checkpoint["envs"] is not None
    resumed = run_script("c51_atari.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path / "killed") == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_dir)
    for key in ("charts/episodic_return", "charts/epsilon", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    # Losses: the logs after the first post-resume gradient step (the first log after a resume has none yet).
    for key in ("losses/loss", "losses/q_values"):
        after = [entry for entry in straight_scalars[key] if entry[0] > 1000]
        assert after and [entry for entry in resumed_scalars[key] if entry[0] > 1000] == after, key
    resumed_model = torch.load(run_dir / "c51_atari.cleanrl_model", weights_only=False)["q_network"]
    straight_model = torch.load(straight_dir / "c51_atari.cleanrl_model", weights_only=False)["q_network"]
    for name, weight in straight_model.items():
        assert torch.equal(resumed_model[name], weight), name


# --- the loop's own wiring -------------------------------------------------------------------
# The script runs unchanged under tests/probe.py, which copies what its loop saw at each step and what each loss was
# computed from; the tests rebuild all of it from those copies. Breakout (it has lives) for what is stored, MinAtar (a
# small network, cheap to copy at every update) for the updates; both are the smoke runs above too.
BREAKOUT_FLAGS = ["--num-envs", "4", "--buffer-size", "400", "--learning-starts", "800", "--batch-size", "4"]
BREAKOUT_FLAGS += ["--total-timesteps", "1000", "--train-frequency", "8", "--target-network-frequency", "100"]
BREAKOUT_FLAGS += ["--exploration-fraction", "1", "--end-e", "1"]
LEARN_FLAGS = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "2", "--buffer-size", "1200", "--batch-size", "8"]
LEARN_FLAGS += ["--learning-starts", "600", "--train-frequency", "16", "--target-network-frequency", "128"]
LEARN_FLAGS += ["--total-timesteps", "1200", "--exploration-fraction", "0.5", "--end-e", "0.2", "--gamma", "0.9"]
LEARN_FLAGS += ["--save-model", "--eval-episodes", "3"]
STEP_NAMES = ["obs", "obs_np", "actions", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "rewards_b", "terminations_b", "q_network", "target_network"]


@pytest.fixture(scope="module")
def breakout_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("store")
    return probe_script("c51_atari.py", BREAKOUT_FLAGS, cwd, watch=STEP_NAMES, final=["rb"]), cwd


@pytest.fixture(scope="module")
def minatar_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("learn")
    names = dict(watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=["q_network", "target_network"])
    return probe_script("c51_atari.py", LEARN_FLAGS, cwd, **names), cwd


def loop_steps(trace) -> list[dict]:
    """One dict per loop iteration (taken as the step is counted, after envs.step): the observation acted on, the
    actions, what the env returned, epsilon."""
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


def minatar_logits(params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Logits [batch, 3 actions, 51 atoms] from a MinAtar QNetwork's weights (3x3 convolution of 16
    channels, 128 units; cells are 0/1, so the network's 1 / obs_high scale is 1)."""
    h = F.relu(F.conv2d(obs.to(params["network.0.weight"].dtype), params["network.0.weight"], params["network.0.bias"]))
    h = F.relu(F.linear(h.flatten(1), params["network.3.weight"], params["network.3.bias"]))
    return F.linear(h, params["network.5.weight"], params["network.5.bias"]).view(-1, 3, 51)


def test_each_update_samples_real_transitions_and_is_the_cross_entropy_with_the_projected_target(minatar_loop):
    trace, _ = minatar_loop
    steps = loop_steps(trace)
    transitions = transitions_seen(steps)
    updates = trace.backward
    assert len(updates) == 1200 // 16 - 600 // 16
    support = np.linspace(-10, 10, 51)
    terminal_targets = 0
    for update in updates:
        where = f"update at step {update['step']}"
        rows = zip(update["obs_b"], update["actions_b"], update["rewards_b"], update["terminations_b"])
        for i, (obs, action, reward, ended) in enumerate(rows):
            key = (
                obs.numpy().tobytes(),
                int(action),
                float(reward),
                bool(ended),
                update["next_obs_b"][i].numpy().tobytes(),
            )
            assert key in transitions, "a sampled row is not a transition the env produced"
        with torch.no_grad():
            # The target network's distribution at its own greedy (by the mean) next action, shifted and projected: a
            # constant, so the gradient reaches the online network only. The action picked in float32, as the script
            # picks it (a near-tie cannot go the other way); the rest in float64.
            float32_probs = torch.softmax(minatar_logits(update["target_network"], update["next_obs_b"]), dim=2)
            next_actions = (float32_probs * update["target_network"]["support"]).sum(dim=2).argmax(dim=1)
            next_probs = torch.softmax(minatar_logits(leaves(update["target_network"]), update["next_obs_b"]), dim=2)
            next_probs = next_probs[torch.arange(8), next_actions].numpy()
            rewards, ends = update["rewards_b"].double().numpy(), update["terminations_b"].double().numpy()
            target = torch.from_numpy(reference_projection(next_probs, rewards, ends, support, 0.9))
        online = leaves(update["q_network"])
        log_probs = torch.log_softmax(minatar_logits(online, update["obs_b"]), dim=2)[
            torch.arange(8), update["actions_b"]
        ]
        cross_entropy = -(target * log_probs).sum(dim=1).mean()
        assert_gradients_match(update["grads"]["q_network"], gradients(cross_entropy, online), where)
        assert_no_gradient(update["grads"]["target_network"], where)
        assert update["loss"].item() == pytest.approx(cross_entropy.item(), rel=1e-5), where
        terminal_targets += int(update["terminations_b"].sum())
    assert terminal_targets > 0, "some sampled transitions should end a training episode"


def test_the_target_network_is_the_online_network_copied_every_target_network_frequency_steps(minatar_loop):
    updates = minatar_loop[0].backward
    initial = updates[0]["q_network"]
    copy_steps = [c for c in range(128, 1200, 128) if c > 600]
    for k, update in enumerate(updates):
        # Copied at the end of the last iteration whose step crossed a multiple of 128 after learning started (after
        # that iteration's gradient step): the online weights that the next update found.
        copies = [c for c in copy_steps if c < update["step"]]
        expected = next(u for u in updates if u["step"] > copies[-1])["q_network"] if copies else initial
        for name, tensor in update["target_network"].items():
            assert torch.equal(tensor, expected[name]), f"update {k} at step {update['step']}: {name}"
    assert len(copy_steps) >= 3


def test_epsilon_decays_linearly_over_the_exploration_fraction(minatar_loop):
    steps = loop_steps(minatar_loop[0])
    for step in steps:
        acted_at = step["step"] - 2  # epsilon is computed before the step is counted
        assert step["epsilon"] == pytest.approx(max(1 + (0.2 - 1) * acted_at / 600, 0.2))
    assert steps[-1]["epsilon"] == pytest.approx(0.2)
