"""ppo_atari_envpool.py and its plumbing: envpool's next-step autoreset (the reset step is flagged and left out of the
batch, episode returns are raw-reward sums over whole games), GAE against a plain loop, smoke run, bad input,
SIGKILL + resume."""

from __future__ import annotations

import numpy as np
import ppo_atari_envpool
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

pytest.importorskip("envpool")

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
PPO_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]


def test_envpool_autoreset_steps_are_flagged_dropped_and_games_are_whole():
    from cleanrl_utils.envs.envpool_atari import make_envs

    envs = make_envs("Breakout-v5", 3)
    envs.reset(seed=1)
    rng = np.random.default_rng(0)
    resets = np.zeros(3, dtype=bool)  # as the script keeps it: the previous step ended a game
    flags, games, logged, sums, life_losses = [], [], [], np.zeros(3), 0
    for _ in range(1200):
        _, reward, terminated, truncated, infos = envs.step(rng.integers(0, 4, 3))
        # envpool's reset step: its episode counter restarts and it pays nothing
        assert (infos["elapsed_step"][resets] == 0).all() and (reward[resets] == 0).all()
        assert (infos["elapsed_step"][~resets] > 0).all()
        flags.append(resets.copy())
        sums[~resets] += infos["reward"][~resets]  # envpool's raw reward
        life_losses += int(infos["life_loss"].sum())
        if "episode" in infos:
            logged += infos["episode"]["r"][infos["_episode"]].tolist()
            assert (infos["lives"][terminated] == 0).all()  # a termination is a game over, never a lost life
        resets = terminated | truncated
        games += sums[resets].tolist()
        sums[resets] = 0
    envs.close()
    assert len(games) >= 10 and logged == games
    assert life_losses >= 5 * len(games)  # Breakout's 5 lives each end inside a game
    kept = ppo_atari_envpool.transition_indices(torch.as_tensor(np.array(flags)))
    expected = [i for i, flag in enumerate(np.array(flags).reshape(-1)) if not flag]
    assert kept.tolist() == expected and len(expected) < 1200 * 3


def test_envpool_episodic_life_only_signals_a_life_loss():
    # What the plumbing's docstring says about envpool's own episodic_life, and why it is off.
    import envpool

    env = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=1, episodic_life=True, seed=3)
    env.reset()
    rng = np.random.default_rng(0)
    ended, elapsed, lives, game_over, life_ends = False, 0, 5, False, 0
    while not game_over:
        _, reward, terminated, _, info = env.step(rng.integers(0, 4, 1))
        if ended:  # the step after a lost life is an autoreset step of its own, and the game goes on
            assert info["elapsed_step"][0] == elapsed and reward[0] == 0 and info["lives"][0] == lives
        ended, elapsed, lives = bool(terminated[0]), info["elapsed_step"][0], info["lives"][0]
        game_over = bool(info["terminated"][0])
        assert not game_over or lives == 0
        life_ends += ended and not game_over
    env.close()
    assert life_ends == 4


def reference_advantages(stream, gamma, gae_lambda):
    """Per env: each real transition's advantage is the (gamma * lambda)-discounted sum of TD errors up to the end of
    its training episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        if stream[t][4]:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # A life loss at 2, a game over at 5 with its autoreset step 6, a time-limit cut at 9 (its autoreset step 10).
    terminated = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    resets = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.choice([-1.0, 0.0, 1.0], size=13)
    column = lambda x: torch.tensor(np.asarray(x[:12], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_atari_envpool.compute_gae(
        column(rewards),
        column(values),
        torch.tensor(values[1:]).unsqueeze(1),
        column(terminated),
        column(truncated),
        0.9,
        0.8,
    )[:, 0].tolist()
    expected = reference_advantages(list(zip(values, rewards, terminated, truncated, resets)), 0.9, 0.8)
    for t in range(12):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "BreakoutNoFrameskip-v4"], ["ale-py id", "cleanrl/ppo_atari.py", "--env-id Breakout-v5"]),
        (["--env-id", "MinAtar/Breakout-v1"], ["MinAtar id", "cleanrl/ppo_atari.py"]),
        (["--env-id", "BigfishEasy-v0"], ["Procgen", "cleanrl/ppo_procgen.py"]),
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "ppo_continuous_action.py"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--env-id", "Breakou-v5"], ["did you mean Breakout-v5"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
        (["--total-timesteps", "100"], ["less than one batch"]),
        (["--repeat-action-probability", "1.5"], ["--repeat-action-probability"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_atari_envpool.py", *flags, cwd=workdir), workdir, *fragments)


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(workdir):
    flags = [*TINY, "--total-timesteps", "256", "--save-model", "--eval-episodes", "1", "--capture-video"]
    result = run_script("ppo_atari_envpool.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, [k for k in PPO_KEYS if "episodic" not in k] + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 4
    assert list((run_dir / "videos" / "eval").glob("*.mp4"))
    assert torch.load(run_dir / "ppo_atari_envpool.cleanrl_model", weights_only=False)["script"] == "ppo_atari_envpool"


def test_sigkill_then_resume_continues_the_curve_with_fresh_games(tmp_path):
    flags = [*TINY, "--total-timesteps", "384", "--checkpoint-every", "128"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("ppo_atari_envpool.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    run_dir = kill_at_first_checkpoint("ppo_atari_envpool.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 128 and checkpoint["envs"] is None
    resume = ["--resume", str(run_dir / "checkpoint.pt")]
    resumed = run_script("ppo_atari_envpool.py", *flags, *resume, cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset" in resumed.stdout
    losses = read_scalars(run_dir)["losses/value_loss"]
    straight_losses = read_scalars(run_dirs(tmp_path / "straight")[0])["losses/value_loss"]
    assert [step for step, _ in losses] == [64, 128, 192, 256, 320, 384]  # one curve, no gap, no duplicate
    assert losses[:2] == straight_losses[:2]  # the part before the checkpoint is the original run's
    assert all(np.isfinite(value) for _, value in losses)
