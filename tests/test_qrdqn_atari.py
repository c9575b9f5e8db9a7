"""qrdqn_atari.py: the quantile Huber loss by hand and against a plain loop, its minimiser (the quantiles at the
midpoints), the frame-indexed replay against the observations the env returned, bad input, SIGKILL + resume; the
script's own loop under tests/probe.py (the smoke runs): the rows stored on Breakout (lives) vs what the env
returned, every update's loss and gradient vs the quantile loss (float64) against the target network's quantiles
recomputed from the sampled rows (no gradient reaching the target network), target-copy timing, the epsilon
schedule."""

from __future__ import annotations

import numpy as np
import pytest
import qrdqn_atari
import torch
import torch.nn.functional as F
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients, leaves

from cleanrl_utils.envs.atari import make_envs

QRDQN_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "charts/learning_rate",
    "losses/loss",
    "losses/q_values",
]


# --- the quantile Huber loss -----------------------------------------------------------------


def reference_loss(quantiles, target_quantiles, kappa):
    """Dabney et al. 2018, eq. 10 and Algorithm 1, one pair at a time: sum_i mean_j |tau_i - 1{u < 0}| L_kappa(u) /
    kappa with u = T theta_j - theta_i and tau_i = (2i - 1) / 2N (kappa 0: |u|), averaged over the batch. A tensor,
    differentiable in `quantiles`."""
    batch, n = quantiles.shape
    total = 0.0
    for b in range(batch):
        for i in range(n):
            tau = (2 * (i + 1) - 1) / (2 * n)
            for target in target_quantiles[b]:
                u = target - quantiles[b, i]
                if kappa == 0:
                    huber = abs(u)
                elif abs(u) <= kappa:
                    huber = 0.5 * u * u / kappa
                else:
                    huber = abs(u) - 0.5 * kappa  # kappa (|u| - kappa / 2) / kappa
                total = total + abs(tau - float(u < 0)) * huber / len(target_quantiles[b])
    return total / batch


def test_quantile_huber_loss_by_hand():
    # N = 2: tau = 1/4, 3/4. theta = (0, 1); targets (0.5, 3): the pairs' u are 0.5, 3 (i = 1) and -0.5, 2 (i = 2).
    # i = 1: u > 0 both, weight 1/4: (0.125 + 2.5) / 2 * 1/4 = 0.328125
    # i = 2: u = -0.5 weighs 1 - 3/4, u = 2 weighs 3/4: (0.125 * 0.25 + 1.5 * 0.75) / 2 = 0.578125
    quantiles = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    targets = torch.tensor([[0.5, 3.0]], dtype=torch.float64)
    assert qrdqn_atari.quantile_huber_loss(quantiles, targets, 1.0).item() == pytest.approx(0.328125 + 0.578125)
    # kappa 0, the plain quantile loss: i = 1 (0.5 + 3) / 2 / 4; i = 2 (0.5 / 4 + 2 * 3 / 4) / 2
    assert qrdqn_atari.quantile_huber_loss(quantiles, targets, 0.0).item() == pytest.approx(0.4375 + 0.8125)
    torch.testing.assert_close(
        qrdqn_atari.quantile_midpoints(4, quantiles), torch.tensor([0.125, 0.375, 0.625, 0.875], dtype=torch.float64)
    )


@pytest.mark.parametrize("kappa", [1.0, 0.0, 2.5])
def test_quantile_huber_loss_and_its_gradient_match_a_plain_loop(kappa):
    generator = torch.Generator().manual_seed(0)
    quantiles = (3 * torch.randn(4, 7, generator=generator, dtype=torch.float64)).requires_grad_()
    targets = 3 * torch.randn(4, 9, generator=generator, dtype=torch.float64)  # N' != N
    loss = qrdqn_atari.quantile_huber_loss(quantiles, targets, kappa)
    assert loss.item() == pytest.approx(reference_loss(quantiles.detach(), targets, kappa).item(), rel=1e-12)
    loss.backward()
    # The target is a constant: d/dtheta of the plain loop by central differences.
    step, numeric = 1e-6, torch.zeros_like(quantiles)
    for index in np.ndindex(*quantiles.shape):
        up, down = quantiles.detach().clone(), quantiles.detach().clone()
        up[index] += step
        down[index] -= step
        numeric[index] = (reference_loss(up, targets, kappa) - reference_loss(down, targets, kappa)) / (2 * step)
    torch.testing.assert_close(quantiles.grad, numeric, atol=1e-6, rtol=1e-6)


def test_minimising_the_loss_puts_each_output_on_its_quantile_of_the_target_samples():
    # Lemma 2 of the paper: the minimiser of the quantile loss (kappa 0) puts theta_i on the tau_i-quantile.
    torch.manual_seed(1)
    samples = torch.distributions.Gamma(2.0, 1.0).sample((1, 4000))  # a skewed distribution
    quantiles = torch.zeros(1, 5, requires_grad=True)
    optimizer = torch.optim.Adam([quantiles], lr=0.05)
    for _ in range(1500):
        optimizer.zero_grad()
        qrdqn_atari.quantile_huber_loss(quantiles, samples, 0.0).backward()
        optimizer.step()
    expected = torch.quantile(samples[0], torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9]))
    torch.testing.assert_close(quantiles.detach()[0], expected, atol=0.05, rtol=0)


@pytest.mark.parametrize("obs_shape", [(4, 84, 84), (4, 10, 10)])
def test_network_gives_quantiles_per_action_and_acts_greedily_on_their_mean(obs_shape):
    q_network = qrdqn_atari.QNetwork(obs_shape, 3, 255.0, n_quantiles=4)
    head = q_network.network[-1]
    with torch.no_grad():
        head.weight.zero_()
        # Action 0: mean 0; action 1: mean 1 (one high quantile); action 2: mean 0.75 (all equal).
        head.bias.copy_(torch.tensor([-1, 0, 0, 1, 0, 0, 0, 4, 0.75, 0.75, 0.75, 0.75]))
    obs = torch.randint(0, 256, (6, *obs_shape), dtype=torch.uint8)
    assert q_network(obs).shape == (6, 3, 4)
    torch.testing.assert_close(q_network.q_values(obs)[0], torch.tensor([0.0, 1.0, 0.75]))
    assert (qrdqn_atari.select_actions(q_network, obs, 0.0, 3) == 1).all()


# --- the replay buffer -----------------------------------------------------------------------


def test_replay_rebuilds_exactly_the_observations_seen_across_games_and_wrap_around():
    # 1000 steps of 2 envs of random play into 400 rows each: several games and a wrap.
    num_envs, steps, rows = 2, 1000, 400
    envs = make_envs("MinAtar/Breakout-v1", num_envs)
    shape = envs.single_observation_space.shape
    rb = qrdqn_atari.FrameReplayBuffer(
        rows * num_envs, num_envs, shape, qrdqn_atari.stack_of(shape), torch.device("cpu")
    )
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    resets, seen = np.zeros(num_envs, dtype=bool), []
    for _ in range(steps):
        actions = rng.integers(envs.single_action_space.n, size=num_envs)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        rb.add(torch.from_numpy(obs), actions, np.sign(rewards), terminations | infos["life_loss"], resets)
        seen.append((obs, actions, np.sign(rewards), terminations | infos["life_loss"], next_obs, ~resets))
        resets, obs = terminations | truncations, next_obs
    envs.close()
    env, game_starts = torch.arange(num_envs), 0
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


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--buffer-size", "1000000000000"], ["--buffer-size: the replay buffer needs", "GB", "lower --buffer-size"]),
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "sac_continuous_action.py"]),
    ],
)
def test_bad_input_fails_in_one_line_before_any_run_directory(workdir, flags, fragments):
    assert_bad_input(run_script("qrdqn_atari.py", *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"env_id": "CartPole-v1"}, "cleanrl/c51.py"),
        ({"env_id": "MinAtar/Brekout-v1"}, "did you mean MinAtar/Breakout-v1"),
        ({"n_quantiles": 0}, "--n-quantiles must be positive"),
        ({"kappa": -1.0}, "--kappa must be 0"),
        ({"total_timesteps": 5000}, "--learning-starts 80000 must be in [0, --total-timesteps 5000)"),
        ({"learning_starts": 2}, "--learning-starts must be at least 5"),
    ],
)
def test_validate_refuses_bad_arguments_in_one_line(capsys, fields, fragment):
    # In-process (the subprocess cases above check that nothing is left behind): validate() runs before any work.
    with pytest.raises(SystemExit) as exit_info:
        qrdqn_atari.validate(qrdqn_atari.Args(**fields))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines


# --- runs ------------------------------------------------------------------------------------


def test_minatar_smoke_logs_whole_games_and_evaluates_saved_model(minatar_loop):
    trace, cwd = minatar_loop
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, QRDQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 3
    assert all(value > 0 for _, value in scalars["losses/loss"])
    assert torch.load(run_dir / "qrdqn_atari.cleanrl_model", weights_only=False)["script"] == "qrdqn_atari"


def test_atari_smoke_trains_the_nature_cnn_and_stores_what_the_loop_saw(breakout_loop):
    # 250 steps of 4 envs acting at random, gradient steps on 4-frame stacks from step 800; Breakout has lives, so the
    # rows stored show how life losses are stored.
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
    flags = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "2", "--buffer-size", "400", "--learning-starts", "100"]
    flags += ["--batch-size", "8", "--target-network-frequency", "50", "--n-quantiles", "11"]
    flags += ["--total-timesteps", "2000", "--checkpoint-every", "1000", "--save-model", "--eval-episodes", "1"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("qrdqn_atari.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    (straight_dir,) = run_dirs(tmp_path / "straight")
    run_dir = kill_at_first_checkpoint("qrdqn_atari.py", flags, tmp_path / "killed")
    assert not (run_dir / "qrdqn_atari.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 1000 and checkpoint["envs"] is not None
    resumed = run_script("qrdqn_atari.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path / "killed") == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_dir)
    for key in ("charts/episodic_return", "charts/epsilon", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    # Losses: the logs after the first post-resume gradient step (the first log after a resume has none yet).
    for key in ("losses/loss", "losses/q_values"):
        after = [entry for entry in straight_scalars[key] if entry[0] > 1000]
        assert after and [entry for entry in resumed_scalars[key] if entry[0] > 1000] == after, key
    resumed_model = torch.load(run_dir / "qrdqn_atari.cleanrl_model", weights_only=False)["q_network"]
    straight_model = torch.load(straight_dir / "qrdqn_atari.cleanrl_model", weights_only=False)["q_network"]
    for name, weight in straight_model.items():
        assert torch.equal(resumed_model[name], weight), name


# --- the loop's own wiring -------------------------------------------------------------------
# The script runs unchanged under tests/probe.py, which copies what its loop saw at each step and what each loss was
# computed from; the tests rebuild all of it from those copies. Breakout (it has lives) for what is stored, MinAtar (a
# small network, cheap to copy at every update; 5 quantiles, so the plain loop is quick) for the updates.
BREAKOUT_FLAGS = ["--num-envs", "4", "--buffer-size", "400", "--learning-starts", "800", "--batch-size", "4"]
BREAKOUT_FLAGS += ["--total-timesteps", "1000", "--train-frequency", "8", "--target-network-frequency", "100"]
BREAKOUT_FLAGS += ["--exploration-fraction", "1", "--end-e", "1"]
LEARN_FLAGS = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "2", "--buffer-size", "1200", "--batch-size", "8"]
LEARN_FLAGS += ["--learning-starts", "600", "--train-frequency", "16", "--target-network-frequency", "128"]
LEARN_FLAGS += ["--total-timesteps", "1200", "--exploration-fraction", "0.5", "--end-e", "0.2", "--gamma", "0.9"]
LEARN_FLAGS += ["--n-quantiles", "5", "--kappa", "0.5", "--learning-rate", "1e-3", "--save-model", "--eval-episodes"]
LEARN_FLAGS += ["3"]
STEP_NAMES = ["obs", "obs_np", "actions", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "rewards_b", "terminations_b", "q_network", "target_network"]


@pytest.fixture(scope="module")
def breakout_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("store")
    return probe_script("qrdqn_atari.py", BREAKOUT_FLAGS, cwd, watch=STEP_NAMES, final=["rb"]), cwd


@pytest.fixture(scope="module")
def minatar_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("learn")
    names = dict(watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=["q_network", "target_network"])
    return probe_script("qrdqn_atari.py", LEARN_FLAGS, cwd, **names), cwd


def loop_steps(trace) -> list[dict]:
    """One dict per loop iteration (taken as the step is counted, after envs.step): the observation acted on, the
    actions, what the env returned, epsilon."""
    return [entry for entry in trace.steps if entry["step"] > 0]


def transitions_seen(steps: list[dict]) -> set:
    """(obs, action, clipped reward, training-episode end, next obs) of every real transition, as bytes."""
    transitions = set()
    resets = np.zeros(len(steps[0]["actions"]), dtype=bool)
    for step in steps:
        for env in np.flatnonzero(~resets):
            ended = bool(step["terminations"][env] or step["infos"]["life_loss"][env])
            obs, next_obs = step["obs"][env].numpy().tobytes(), step["obs_np"][env].tobytes()
            transitions.add((obs, int(step["actions"][env]), float(np.sign(step["rewards"][env])), ended, next_obs))
        resets = step["terminations"] | step["truncations"]
    return transitions


def minatar_quantiles(params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Quantiles [batch, 3 actions, 5] from a MinAtar QNetwork's weights (3x3 convolution of 16 channels, 128 units;
    cells are 0/1, so the network's 1 / obs_high scale is 1)."""
    h = F.relu(F.conv2d(obs.to(params["network.0.weight"].dtype), params["network.0.weight"], params["network.0.bias"]))
    h = F.relu(F.linear(h.flatten(1), params["network.3.weight"], params["network.3.bias"]))
    return F.linear(h, params["network.5.weight"], params["network.5.bias"]).view(-1, 3, 5)


def test_each_update_samples_real_transitions_and_is_the_quantile_loss_against_the_target_networks_quantiles(
    minatar_loop,
):
    trace, _ = minatar_loop
    transitions = transitions_seen(loop_steps(trace))
    updates = trace.backward
    assert len(updates) == 1200 // 16 - 600 // 16
    terminal_targets = 0
    for update in updates:
        where = f"update at step {update['step']}"
        rows = zip(update["obs_b"], update["actions_b"], update["rewards_b"], update["terminations_b"])
        for i, (obs, action, reward, ended) in enumerate(rows):
            key = (obs.numpy().tobytes(), int(action), float(reward), bool(ended))
            assert key + (update["next_obs_b"][i].numpy().tobytes(),) in transitions, "a sampled row is no transition"
        # The greedy next action picked in float32, as the script picks it (a near-tie cannot go the other way).
        greedy = minatar_quantiles(update["target_network"], update["next_obs_b"]).mean(dim=2).argmax(dim=1)
        with torch.no_grad():
            next_quantiles = minatar_quantiles(leaves(update["target_network"]), update["next_obs_b"])
        online = leaves(update["q_network"])
        quantiles = minatar_quantiles(online, update["obs_b"])
        targets, taken = [], []
        for i in range(8):
            # The target network's quantiles at its own greedy (by the mean) next action, T theta_j = r + gamma theta_j
            # with no bootstrap after a termination (here also a lost life): constants, so the gradient reaches the
            # online network only.
            bootstrap = 0.0 if update["terminations_b"][i] else 0.9
            targets.append([float(update["rewards_b"][i]) + bootstrap * float(z) for z in next_quantiles[i, greedy[i]]])
            taken.append(quantiles[i, int(update["actions_b"][i])])
        expected = reference_loss(torch.stack(taken), torch.tensor(targets, dtype=torch.float64), 0.5)
        assert_gradients_match(update["grads"]["q_network"], gradients(expected, online), where)
        for name, grad in update["grads"]["target_network"].items():
            assert grad is None or not grad.any(), f"{where}: {name} of the target network received a gradient"
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
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
