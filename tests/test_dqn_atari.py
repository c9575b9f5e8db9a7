"""dqn_atari.py: the frame-indexed replay against the observations the env returned, smoke runs on MinAtar and Atari,
bad input, SIGKILL + resume; the script's own loop under tests/probe.py: the rows stored on Breakout (lives), every
update's loss and gradient on MinAtar against a float64 reference loss (none reaching the target network), target-copy
timing, the epsilon schedule."""

from __future__ import annotations

import dqn_atari
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
DQN_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "charts/learning_rate",
    "losses/td_loss",
    "losses/q_values",
]


def record_stream(env_id: str, num_envs: int, steps: int, buffer_size: int, seed: int = 0):
    """Drive `env_id` with random actions as dqn_atari's loop does, filling a FrameReplayBuffer, and return the buffer
    and every (obs, action, clipped reward, training termination, next_obs, was_a_transition) the loop saw."""
    envs = make_envs(env_id, num_envs)
    shape = envs.single_observation_space.shape
    rb = dqn_atari.FrameReplayBuffer(buffer_size, num_envs, shape, dqn_atari.stack_of(shape), torch.device("cpu"))
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
    stack = rb.stack
    game_starts = 0
    for age in range(1, rows - stack + 1):  # every row sample() may draw
        step = steps - 1 - age
        row = torch.full((num_envs,), step % rows)
        env = torch.arange(num_envs)
        obs, actions, rewards, ends, next_obs, is_transition = seen[step]
        assert torch.equal(rb.stacked(row, env), torch.from_numpy(obs))
        assert torch.equal(rb.stacked((row + 1) % rows, env), torch.from_numpy(next_obs))
        assert torch.equal(rb.valid[row, env], torch.from_numpy(is_transition))
        assert torch.equal(rb.actions[row, env], torch.from_numpy(actions))
        assert torch.equal(rb.rewards[row, env], torch.from_numpy(rewards).float())
        assert torch.equal(rb.terminations[row, env].bool(), torch.from_numpy(ends))
        game_starts += int(rb.first[row, env].sum())
    assert game_starts >= 4, "the stream should cross several game starts"
    if stack > 1:  # at a game's first observation the older frames are zeros, never the last game's frames
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


def test_replay_is_refused_before_allocation_when_it_cannot_fit(workdir):
    result = run_script("dqn_atari.py", "--buffer-size", "1000000000000", cwd=workdir)
    assert_bad_input(result, workdir, "--buffer-size", "GB")


def test_a_million_step_atari_buffer_needs_under_7_5_gb():
    args = dqn_atari.Args()
    nbytes = dqn_atari.replay_nbytes(args, (4, 84, 84))
    assert nbytes < 7.5e9 and nbytes == pytest.approx(7.07e9, rel=0.01)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "sac_continuous_action.py"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/dqn.py"]),
        (["--env-id", "Breakout-v4"], ["BreakoutNoFrameskip-v4"]),
        (["--env-id", "MinAtar/Brekout-v1"], ["MinAtar/Breakout-v1"]),
        (["--env-id", "StarpilotEasy-v0"], ["Procgen", "ppo_procgen.py"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--learning-starts", "2"], ["--learning-starts"]),
        (["--end-e", "0.5", "--start-e", "0.1"], ["epsilon"]),
        (["--resume", "missing/checkpoint.pt"], ["missing/checkpoint.pt"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("dqn_atari.py", *flags, cwd=workdir), workdir, *fragments)


def test_minatar_smoke_logs_whole_games_and_evaluates_saved_model(workdir):
    flags = [*MINATAR_TINY, "--total-timesteps", "1000", "--save-model", "--eval-episodes", "3", "--capture-video"]
    result = run_script("dqn_atari.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, DQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 3
    assert list((run_dir / "videos").glob("*.mp4"))
    assert torch.load(run_dir / "dqn_atari.cleanrl_model", weights_only=False)["script"] == "dqn_atari"


def test_atari_smoke_trains_and_evaluates(workdir):
    flags = ["--num-envs", "2", "--buffer-size", "400", "--learning-starts", "900", "--batch-size", "4"]
    flags += ["--total-timesteps", "1000", "--train-frequency", "8", "--save-model", "--eval-episodes", "1"]
    result = run_script("dqn_atari.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, ["losses/td_loss", "losses/q_values", "eval/episodic_return"])


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(tmp_path):
    flags = [*MINATAR_TINY, "--total-timesteps", "2000", "--checkpoint-every", "1000", "--save-model"]
    flags += ["--eval-episodes", "1"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("dqn_atari.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    run_dir = kill_at_first_checkpoint("dqn_atari.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 1000 and checkpoint["envs"] is not None
    resumed = run_script("dqn_atari.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(run_dirs(tmp_path / "straight")[0])
    for key in ("charts/episodic_return", "charts/epsilon"):
        assert resumed_scalars[key] == straight_scalars[key], key
    # Losses: the logs after the first post-resume gradient step (the first log after a resume has none yet).
    for key in ("losses/td_loss", "losses/q_values"):
        after = [entry for entry in straight_scalars[key] if entry[0] > 1000]
        assert [entry for entry in resumed_scalars[key] if entry[0] > 1000] == after, key


# The loop's own wiring: the script runs unchanged under tests/probe.py, which copies what its loop saw at each step
# and what each loss was computed from; the tests rebuild all of it from those copies. Breakout (it has lives) for
# what is stored, acting only; MinAtar (a small network, cheap to copy at every update) for the updates.
STORE_FLAGS = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2", "--buffer-size", "800", "--batch-size", "4"]
STORE_FLAGS += ["--learning-starts", "1196", "--total-timesteps", "1200"]
LEARN_FLAGS = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "2", "--buffer-size", "1200", "--batch-size", "8"]
LEARN_FLAGS += ["--learning-starts", "600", "--train-frequency", "8", "--target-network-frequency", "64"]
LEARN_FLAGS += ["--total-timesteps", "1200", "--exploration-fraction", "0.5", "--end-e", "0.2", "--gamma", "0.9"]
STEP_NAMES = ["obs", "obs_np", "actions", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "rewards_b", "terminations_b", "q_network", "target_network"]


@pytest.fixture(scope="module")
def breakout_loop(tmp_path_factory):
    from probe import probe_script

    # Machado et al.'s protocol (no episode end at a lost life from the env): the script's own `| infos["life_loss"]`
    # is what ends its training episodes there, which the default env semantics would hide.
    cwd = tmp_path_factory.mktemp("store")
    return probe_script(
        "dqn_atari.py", STORE_FLAGS, cwd, watch=STEP_NAMES, final=["rb"], preload=["probe_no_episodic_life"]
    )


@pytest.fixture(scope="module")
def minatar_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("learn")
    grads = ["q_network", "target_network"]
    return probe_script("dqn_atari.py", LEARN_FLAGS, cwd, watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=grads)


def loop_steps(trace) -> list[dict]:
    """One dict per loop iteration: the observation acted on, the actions, what the env returned."""
    return [entry for entry in trace.steps if entry["step"] > 0]


def test_the_loop_stores_each_step_with_clipped_rewards_and_life_losses_as_terminations(breakout_loop):
    steps = loop_steps(breakout_loop)
    assert len(steps) == 600
    lives_lost = sum(int((step["infos"]["life_loss"] & ~step["terminations"]).sum()) for step in steps)
    assert lives_lost >= 4, "the run should lose lives the env does not end episodes at, for this test to mean anything"
    rb = breakout_loop.final["rb"]
    rows = rb["size"]
    assert rows == 400
    resets = np.zeros(2, dtype=bool)
    lives_checked = 0
    for t, step in enumerate(steps):
        row = t % rows
        if t >= len(steps) - rows:  # the rows the buffer still holds
            assert torch.equal(rb["frames"][row], step["obs"][:, -1:])  # the newest frame of the observation acted on
            assert rb["actions"][row].tolist() == step["actions"].tolist()
            assert rb["rewards"][row].tolist() == np.sign(step["rewards"]).tolist()
            ended = step["terminations"] | step["infos"]["life_loss"]
            assert rb["terminations"][row].tolist() == ended.astype(float).tolist(), f"step {t}"
            assert rb["valid"][row].tolist() == (~resets).tolist()  # an autoreset step is no transition
            lives_checked += int(step["infos"]["life_loss"].sum())
        resets = step["terminations"] | step["truncations"]
    assert lives_checked >= 2


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


def minatar_q(params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Q-values from a MinAtar QNetwork's weights (3x3 convolution of 16 channels, 128 units; cells are 0/1, so
    the network's 1 / obs_high scale is 1)."""
    h = F.relu(F.conv2d(obs.to(params["network.0.weight"].dtype), params["network.0.weight"], params["network.0.bias"]))
    h = F.relu(F.linear(h.flatten(1), params["network.3.weight"], params["network.3.bias"]))
    return F.linear(h, params["network.5.weight"], params["network.5.bias"])


def test_each_update_samples_real_transitions_and_regresses_on_the_target_networks_max(minatar_loop):
    steps = loop_steps(minatar_loop)
    transitions = transitions_seen(steps)
    updates = minatar_loop.backward
    assert len(updates) == (1200 - 600) // 8
    terminal_targets = 0
    for update in updates:
        where = f"update at step {update['step']}"
        rows = zip(update["obs_b"], update["actions_b"], update["rewards_b"], update["terminations_b"])
        for i, (obs, action, reward, ended) in enumerate(rows):
            next_obs = update["next_obs_b"][i].numpy().tobytes()
            key = (obs.numpy().tobytes(), int(action), float(reward), bool(ended), next_obs)
            assert key in transitions, "a sampled row is not a transition the env produced"
        # The loss in float64: Q(s, a) of the online weights against r + gamma max_a' Q_target(s', a'), the target
        # network's (a constant: the gradient reaches the online network only).
        online = leaves(update["q_network"])
        with torch.no_grad():
            next_max = minatar_q(leaves(update["target_network"]), update["next_obs_b"]).max(dim=1).values
            target = update["rewards_b"].double() + 0.9 * next_max * (1 - update["terminations_b"].double())
        q_taken = minatar_q(online, update["obs_b"])[torch.arange(8), update["actions_b"]]
        expected = ((q_taken - target) ** 2).mean()
        assert_gradients_match(update["grads"]["q_network"], gradients(expected, online), where)
        assert_no_gradient(update["grads"]["target_network"], where)
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        terminal_targets += int(update["terminations_b"].sum())
    assert terminal_targets > 0, "some sampled transitions should end a training episode"


def test_the_target_network_is_the_online_network_copied_every_target_network_frequency_steps(minatar_loop):
    updates = minatar_loop.backward
    initial = updates[0]["q_network"]
    copy_steps = [c for c in range(64, 1200, 64) if c > 600]
    for k, update in enumerate(updates):
        # Copied at the end of the last iteration whose step crossed a multiple of 64 after learning started (after
        # that iteration's gradient step): the online weights that the next update found.
        copies = [c for c in copy_steps if c < update["step"]]
        expected = next(u for u in updates if u["step"] > copies[-1])["q_network"] if copies else initial
        for name, tensor in update["target_network"].items():
            assert torch.equal(tensor, expected[name]), f"update {k} at step {update['step']}: {name}"
    assert len(copy_steps) >= 3


def test_epsilon_decays_linearly_over_the_exploration_fraction(minatar_loop):
    duration = 0.5 * 1200
    steps = loop_steps(minatar_loop)
    for step in steps:
        acted_at = step["step"] - 2  # epsilon is computed before the step is counted
        assert step["epsilon"] == pytest.approx(max(1 + (0.2 - 1) * acted_at / duration, 0.2))
    assert steps[-1]["epsilon"] == pytest.approx(0.2)
