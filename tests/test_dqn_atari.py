"""dqn_atari.py: the frame-indexed replay against the observations the env returned, smoke runs on MinAtar and Atari,
bad input, SIGKILL + resume."""

from __future__ import annotations

import dqn_atari
import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

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
