"""ppo_atari_lstm.py: the LSTM state zeroed exactly at episode starts (against a loop that resets by hand), the update's
replay of a real rollout giving back its log-probabilities, GAE over a NEXT_STEP-autoreset rollout, the masked means,
smoke runs on MinAtar and Atari, bad input, SIGKILL + resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import ppo_atari_lstm
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

from cleanrl_utils.envs.atari import make_envs

SCRIPT = "ppo_atari_lstm.py"
# One minibatch and one epoch: the logged old_approx_kl is then measured before any gradient step of its iteration.
MINATAR_FLAGS = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "1"]
MINATAR_FLAGS += ["--update-epochs", "1", "--total-timesteps", "1536", "--checkpoint-every", "512"]
MINATAR_FLAGS += ["--save-model", "--eval-episodes", "2"]
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


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One CPU thread, as the script runs (--torch-threads 1): a busy machine's thread pool slows small ops."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_lstm_state_is_zeroed_exactly_at_episode_starts():
    torch.manual_seed(0)
    agent = ppo_atari_lstm.Agent((4, 10, 10), 3, 1.0).double()
    num_steps, num_envs = 12, 4
    features = torch.randn(num_steps, num_envs, 128, dtype=torch.float64)
    starts = torch.zeros(num_steps, num_envs, dtype=torch.bool)
    starts[0, 0] = starts[3, 1] = starts[4, 1] = starts[5, 0] = starts[11, 2] = True  # env 3 never starts
    state = tuple(torch.randn(1, num_envs, 128, dtype=torch.float64) for _ in range(2))  # mid-episode memory
    outputs, (h_last, c_last) = agent.recur(features, state, starts)

    for env in range(num_envs):  # by hand: one env, one step at a time, zeros where an episode starts
        h, c = state[0][:, env : env + 1], state[1][:, env : env + 1]
        for t in range(num_steps):
            if starts[t, env]:
                h, c = torch.zeros_like(h), torch.zeros_like(c)
            output, (h, c) = agent.lstm(features[t, env].view(1, 1, -1), (h, c))
            assert torch.allclose(outputs[t, env], output.view(-1), atol=1e-12), (t, env)
        assert torch.allclose(h_last[0, env], h.view(-1), atol=1e-12) and torch.allclose(c_last[0, env], c.view(-1))
    # The resets matter: without them the outputs from each start on are different.
    unreset, _ = agent.recur(features, state, torch.zeros_like(starts))
    assert not torch.allclose(unreset[0, 0], outputs[0, 0]) and not torch.allclose(unreset[11, 2], outputs[11, 2])
    assert torch.allclose(unreset[:, 3], outputs[:, 3], atol=1e-12)


def test_episode_starts_follow_life_losses_and_the_autoreset_step():
    life_loss = np.array([1, 1, 0, 0, 0], dtype=bool)
    game_over = np.array([0, 1, 1, 0, 0], dtype=bool)  # env 1 lost its last life, env 2's game was cut
    resets = np.array([0, 0, 0, 1, 0], dtype=bool)  # env 3's step was an autoreset: a new game's first obs follows
    starts = ppo_atari_lstm.episode_starts(life_loss, game_over, resets)
    # A new life starts (env 0) and a new game starts (env 3); a game's final observation, which the autoreset step
    # acts on, keeps the old game's state (envs 1 and 2).
    assert starts.tolist() == [True, False, False, True, False]


def rollout(agent, envs, storage, obs, state, starts, resets, rng):
    """The script's rollout (phase 1) on a MinAtar vector env, with life losses drawn at random (MinAtar has none)."""
    storage.initial_state = state
    for step in range(storage.obs.shape[0]):
        starts_t = torch.from_numpy(starts)
        storage.obs[step], storage.starts[step] = obs, starts_t
        action, storage.logprobs[step], storage.values[step], state = agent.act(obs, state, starts_t)
        storage.actions[step] = action
        obs_np, _, terminated, truncated, _ = envs.step(action.numpy())
        obs = torch.from_numpy(obs_np)
        storage.resets[step] = resets
        game_over = terminated | truncated
        life_loss = (rng.random(len(starts)) < 0.05) & ~game_over & ~resets
        starts, resets = ppo_atari_lstm.episode_starts(life_loss, game_over, resets), game_over
    return obs, state, starts, resets


def test_first_epoch_replay_gives_back_the_rollouts_log_probabilities():
    torch.manual_seed(0)
    envs = make_envs("MinAtar/Breakout-v1", 4)
    agent = ppo_atari_lstm.Agent(envs.single_observation_space.shape, int(envs.single_action_space.n), 1.0)
    torch.nn.init.normal_(agent.actor.weight, std=1.0)  # a policy that depends on the memory (init's std is 0.01)
    storage = ppo_atari_lstm.RolloutStorage(48, 4, envs.single_observation_space.shape, torch.device("cpu"))
    obs, _ = envs.reset(seed=0)
    carry = (torch.from_numpy(obs), agent.initial_state(4, "cpu"), np.ones(4, dtype=bool), np.zeros(4, dtype=bool))
    rng = np.random.default_rng(0)
    with torch.no_grad():
        carry = rollout(agent, envs, storage, *carry, rng)  # a first rollout: the second starts mid-game
        rollout(agent, envs, storage, *carry, rng)
        assert storage.resets.any() and storage.starts[1:].any() and storage.initial_state[0].abs().sum() > 0
        for mb_envs in torch.tensor([[2, 0], [3, 1]]):  # the update's minibatches: whole env sequences
            mb_state = tuple(s[:, mb_envs] for s in storage.initial_state)
            replay = (storage.obs[:, mb_envs], storage.actions[:, mb_envs], mb_state, storage.starts[:, mb_envs])
            newlogprob, entropy, newvalue = agent.evaluate_actions(*replay)
            assert torch.allclose(newlogprob, storage.logprobs[:, mb_envs], atol=1e-5)
            assert torch.allclose(newvalue, storage.values[:, mb_envs], atol=1e-5)
            # Replays that get the memory wrong are told apart: from a zero state, or never reset.
            from_zero = agent.evaluate_actions(*replay[:2], agent.initial_state(2, "cpu"), replay[3])[0]
            unreset = agent.evaluate_actions(*replay[:3], torch.zeros_like(replay[3]))[0]
            assert (from_zero - newlogprob).abs().max() > 1e-3 and (unreset - newlogprob).abs().max() > 1e-3
    envs.close()


def reference_advantages(stream, gamma, gae_lambda):
    """Per env: walk the recorded steps; each real transition's advantage is the (gamma * lambda)-discounted sum of
    TD errors up to the end of its training episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        if stream[t][4]:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]  # the observation after step k: the true final one after a game's end
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # One env, 12 steps: a life loss at 2 (cut, the game goes on), a game over at 5 (terminated), its autoreset step 6,
    # a time-limit cut at 9 (bootstrapped from the final observation at 10, the autoreset step), then more play.
    terminated = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    resets = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.choice([-1.0, 0.0, 1.0], size=13)
    gamma, gae_lambda, num_steps = 0.9, 0.8, 12
    as_tensor = lambda x: torch.tensor(np.asarray(x[:num_steps], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_atari_lstm.compute_gae(
        as_tensor(rewards),
        as_tensor(values),
        torch.tensor(values[1:], dtype=torch.float64).unsqueeze(1),
        as_tensor(terminated),
        as_tensor(truncated),
        gamma,
        gae_lambda,
    )[:, 0].tolist()
    expected = reference_advantages(list(zip(values, rewards, terminated, truncated, resets)), gamma, gae_lambda)
    for t in range(num_steps):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


def test_masked_means_and_normalisation_ignore_the_autoreset_steps():
    x = torch.tensor([[1.0, 100.0], [2.0, 4.0], [-7.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False], [True, True], [False, True]])
    kept = x[mask]
    assert ppo_atari_lstm.masked_mean(x, mask).item() == pytest.approx(kept.mean().item())
    normalised = ppo_atari_lstm.normalize_advantages(x, mask)
    assert torch.allclose(normalised[mask], (kept - kept.mean()) / (kept.std() + 1e-8))


@pytest.mark.parametrize("shape, hidden", [((1, 84, 84), 512), ((4, 10, 10), 128), ((6, 10, 10), 128)])
def test_agent_picks_the_network_from_the_observation_shape(shape, hidden):
    agent = ppo_atari_lstm.Agent(shape, 5, 255.0 if shape[-1] == 84 else 1.0)
    assert agent.lstm.input_size == hidden and agent.actor.in_features == 128
    obs = torch.randint(0, 2, (3,) + shape, dtype=torch.uint8)
    action, logprob, value, state = agent.act(obs, agent.initial_state(3, "cpu"), torch.ones(3, dtype=torch.bool))
    assert action.shape == logprob.shape == value.shape == (3,) and state[0].shape == state[1].shape == (1, 3, 128)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "ppo_continuous_action.py"]),
        (["--env-id", "MinAtar/Breakot-v1"], ["unknown environment id", "MinAtar/Breakout-v1"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide --num-envs 8"]),
        (["--total-timesteps", "100"], ["less than one batch of 1024"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """An uninterrupted MinAtar run with MINATAR_FLAGS: the smoke run, and the reference of the resume test."""
    workdir = tmp_path_factory.mktemp("straight")
    result = run_script(SCRIPT, *MINATAR_FLAGS, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "evaluation over 2 episodes" in result.stdout
    (run_dir,) = run_dirs(workdir)
    return run_dir


def test_minatar_smoke_writes_finite_scalars_and_evaluates_the_saved_model(straight_run):
    scalars = read_scalars(straight_run)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 12 and len(scalars["eval/episodic_return"]) == 2
    # Measured before the iteration's only gradient step: the replay recomputes the rollout's log-probabilities.
    assert max(abs(v) for _, v in scalars["losses/old_approx_kl"]) < 1e-7
    assert max(v for _, v in scalars["losses/clipfrac"]) == 0.0
    model = torch.load(straight_run / "ppo_atari_lstm.cleanrl_model", weights_only=False)
    assert model["script"] == "ppo_atari_lstm" and model["obs_shape"] == (4, 10, 10)


def test_atari_smoke_sees_one_frame_and_evaluates(workdir):
    flags = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
    flags += ["--total-timesteps", "128", "--save-model", "--eval-episodes", "1"]
    result = run_script(SCRIPT, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), ["losses/value_loss", "losses/approx_kl", "eval/episodic_return"])
    assert torch.load(run_dir / "ppo_atari_lstm.cleanrl_model", weights_only=False)["obs_shape"] == (1, 84, 84)


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(straight_run, tmp_path):
    run_dir = kill_at_first_checkpoint(SCRIPT, MINATAR_FLAGS, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 512 and checkpoint["envs"] is not None
    h, c = checkpoint["lstm_state"]  # the next rollout's first state: the games' memory goes on after the resume
    assert h.shape == c.shape == (1, 4, 128) and h.abs().sum() > 0
    resumed = run_script(SCRIPT, *MINATAR_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in sorted(set(PPO_KEYS) - {"charts/SPS"}) + ["eval/episodic_return"]:
        assert resumed_scalars[key] == straight_scalars[key], key
