"""ppo_trxl.py: the sliding memory window and its mask against a plain per-env walk of the episodes (inside the script's
own loop, across episode ends and rollout boundaries), the rollout acting with those windows, the update recomputing
the rollout's log-probabilities, GAE with truncations bootstrapped in the ended episode's memory, masked attention,
ProofofMemory-v0, smoke + save/evaluate on ProofofMemory-v0 and MortarMayhem-Grid-v0, bad input, SIGKILL + resume."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import ppo_trxl
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients

import cleanrl_utils.envs.proof_of_memory as pom

SCRIPT = "ppo_trxl.py"
NET = ["--trxl-num-layers", "2", "--trxl-num-heads", "2", "--trxl-dim", "8", "--trxl-positional-encoding", "absolute"]
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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_proof_of_memory_shows_the_goals_for_two_steps_then_rewards_the_remembered_side():
    env = gym.make(pom.ENV_ID)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        goals, start = obs[[0, 2]].copy(), obs[1]
        assert sorted(goals.tolist()) == [-1.0, 1.0] and round(start / pom.STEP) in pom.START_CELLS
        obs, reward, terminated, _, _ = env.step(0)  # frozen: no move, no reward, goals still shown
        assert obs.tolist() == [goals[0], start, goals[1]] and reward == 0.0 and not terminated
        obs, reward, _, _, _ = env.step(1)
        assert obs[0] == obs[2] == 0.0 and obs[1] == start and reward == 0.0  # hidden from now on
        side = 1 if goals[1] > 0 else 0
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(side)
            total, done = total + reward, terminated or truncated
        moves = round((1.0 - abs(start)) / pom.STEP) if (start > 0) == (side == 1) else round((1 + abs(start)) / 0.2)
        assert terminated and total == pytest.approx(pom.GOAL_REWARD - pom.TIME_PENALTY * (moves - 1))
    env.reset(seed=3)
    for t in range(16):  # dithering on the spot: cut after 16 steps
        *_, terminated, truncated, _ = env.step(t % 2)
        assert terminated is False and truncated == (t == 15)
    assert gym.make(pom.ENV_ID).reset(seed=5)[0].tolist() == gym.make(pom.ENV_ID).reset(seed=5)[0].tolist()


def test_masked_slots_and_a_step_without_past_change_nothing():
    torch.manual_seed(0)
    layer = ppo_trxl.TransformerLayer(8, 2).double()
    x, memory = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 5, 8, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    out = layer(x, memory, mask)
    scrambled = torch.where(mask[..., None], memory, 1e3 * torch.randn_like(memory))
    assert torch.allclose(layer(x, scrambled, mask), out, atol=1e-12)
    unattended = x[2] + layer.out.bias  # nothing attended: the output projection of zeros
    no_attention = unattended + layer.projection(layer.norm_out(unattended))
    assert torch.allclose(out[2], no_attention, atol=1e-12)
    # By hand for env 0: softmax over its three valid slots, per head, scaled by the head width.
    kv = layer.norm_memory(memory[0, 2:])
    q, k, v = layer.query(layer.norm_query(x[0])).view(2, 4), layer.key(kv).view(3, 2, 4), layer.value(kv).view(3, 2, 4)
    heads = [torch.softmax(k[:, h] @ q[h] / 2.0, 0) @ v[:, h] for h in range(2)]
    attended = x[0] + layer.out(torch.cat(heads))
    assert torch.allclose(out[0], attended + layer.projection(layer.norm_out(attended)), atol=1e-12)


def test_positional_encoding_is_the_sinusoid_table():
    positions = torch.tensor([[0, 3], [7, 1]])
    encoded = ppo_trxl.positional_encoding(positions, 6)
    for pos in (0, 3, 7, 1):
        row = encoded[positions == pos][0]
        angles = [pos / 10000 ** (i / 6) for i in (0, 2, 4)]
        expected = np.concatenate([np.sin(angles), np.cos(angles)])
        assert np.allclose(row.numpy(), expected, atol=1e-6)


def plain_window(history: list, episode_of: list, t: int, memory_length: int, window_size: int, shape) -> tuple:
    """By hand: the past steps of step t's episode, at most memory_length, right-aligned in window_size slots, zeros
    and False elsewhere; each slot's step in the episode (0 where empty)."""
    window, mask, positions = torch.zeros((window_size,) + tuple(shape)), [False] * window_size, [0] * window_size
    first = next(s for s in range(t + 1) if episode_of[s] == episode_of[t])
    for back in range(1, min(memory_length, t - first) + 1):
        window[window_size - back] = history[t - back]
        mask[window_size - back], positions[window_size - back] = True, t - back - first
    return window, torch.tensor(mask), torch.tensor(positions)


@pytest.mark.parametrize("memory_length", [0, 3])
def test_memory_window_holds_the_current_episodes_last_steps(memory_length):
    window_size, num_envs = max(memory_length, 1), 2
    rng = np.random.default_rng(memory_length)
    ends = rng.random((20, num_envs)) < 0.25
    memory, episode_step = torch.zeros(num_envs, window_size, 2, 3), torch.zeros(num_envs, dtype=torch.long)
    history, episodes = torch.randn(20, num_envs, 2, 3), np.cumsum(np.vstack([np.zeros((1, 2)), ends[:-1]]), 0)
    for t in range(20):
        window, mask, positions = ppo_trxl.memory_window(memory, episode_step, memory_length)
        for env in range(num_envs):
            expected = plain_window(history[:, env], episodes[:, env], t, memory_length, window_size, (2, 3))
            assert torch.equal(window[env], expected[0]) and torch.equal(mask[env], expected[1]), (t, env)
            assert torch.equal(positions[env][mask[env]], expected[2][expected[1]]), (t, env)
        memory = torch.cat([memory[:, 1:], history[t][:, None]], dim=1)
        episode_step = torch.where(torch.as_tensor(ends[t]), 0, episode_step + 1)


# The loop's own wiring on ProofofMemory-v0 (episodes of 5 to 16 steps): the script runs unchanged under
# tests/probe.py, which copies its variables at every backward(). Memory 4 < most episodes, so the window slides; 40
# steps per rollout, so episodes cross rollout boundaries. A plain walk over each env's steps (all rollouts, with the
# episode ends the envs returned) rebuilds every step's window, mask and positions.
NUM_ENVS, NUM_STEPS, ITERATIONS, EPOCHS, MINIBATCHES, MEMORY = 2, 40, 3, 2, 2, 4
GAMMA, GAE_LAMBDA, CLIP, ANNEAL_STEPS = 0.9, 0.8, 0.3, 32 * 512 * 10000  # ANNEAL_STEPS: the script's default
LOOP_FLAGS = ["--env-id", pom.ENV_ID, "--num-envs", str(NUM_ENVS), "--num-steps", str(NUM_STEPS), *NET]
LOOP_FLAGS += ["--total-timesteps", str(NUM_ENVS * NUM_STEPS * ITERATIONS), "--update-epochs", str(EPOCHS)]
LOOP_FLAGS += ["--num-minibatches", str(MINIBATCHES), "--trxl-memory-length", str(MEMORY), "--init-lr", "1e-2"]
LOOP_FLAGS += ["--gamma", str(GAMMA), "--gae-lambda", str(GAE_LAMBDA), "--clip-coef", "0.3"]
LOOP_FLAGS += ["--checkpoint-every", str(NUM_ENVS * NUM_STEPS), "--save-model", "--eval-episodes", "2"]
UPDATE_NAMES = ["agent", "storage", "mb_inds", "mb_window", "mb_mask", "mb_positions", "newlogprob", "newvalue"]
UPDATE_NAMES += ["iteration", "epoch", "advantages", "returns", "next_obs", "memory", "episode_step"]


class Loop(NamedTuple):
    updates: list
    firsts: list  # each iteration's first update: the agent that collected its rollout
    hidden: torch.Tensor  # [ITERATIONS * NUM_STEPS, NUM_ENVS, layers, dim]: every step's memories
    episodes: np.ndarray  # [steps, NUM_ENVS]: which episode each step belongs to, from the episode ends
    final_obs: dict  # (step, env) -> the true final observation of an episode cut there
    run_dir: Path  # the probed run's directory: the smoke run, and the reference of the resume test
    stdout: str


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Loop:
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    trace = probe_script(SCRIPT, LOOP_FLAGS, cwd, at_backward=UPDATE_NAMES, grads=["agent"])
    (run_dir,) = run_dirs(cwd)
    updates = trace.backward
    assert len(updates) == ITERATIONS * EPOCHS * MINIBATCHES
    firsts = updates[:: EPOCHS * MINIBATCHES]
    hidden = torch.cat([f["storage"]["hidden"] for f in firsts])
    ends = np.concatenate([f["storage"]["terminations"] + f["storage"]["truncations"] for f in firsts]) > 0
    episodes = np.cumsum(np.vstack([np.zeros((1, NUM_ENVS)), ends[:-1]]), 0)
    # Replay the seeded envs with the actions taken: what the loop stored, and the final observations of cut episodes.
    envs = ppo_trxl.make_envs(pom.ENV_ID, NUM_ENVS)
    obs, _ = envs.reset(seed=1)
    final_obs, actions = {}, torch.cat([f["storage"]["actions"] for f in firsts])
    for t in range(len(actions)):
        assert np.array_equal(obs, firsts[t // NUM_STEPS]["storage"]["obs"][t % NUM_STEPS].numpy()), t
        obs, _, terminated, truncated, infos = envs.step(actions[t].numpy())
        assert np.array_equal(terminated | truncated, ends[t]), t
        for env in np.flatnonzero(truncated & ~terminated):
            final_obs[t, env] = infos["final_obs"][env]
    return Loop(updates, firsts, hidden, episodes, final_obs, run_dir, trace.stdout)


def test_the_rollouts_cross_episode_ends_and_cut_episodes(loop):
    starts = np.diff(loop.episodes, axis=0) > 0
    assert starts.sum() >= 6 and len(loop.final_obs) >= 1, "the test needs episode ends, and at least one truncation"
    assert (loop.episodes[NUM_STEPS] == loop.episodes[NUM_STEPS - 1]).any(), "an episode should cross a rollout"
    for first in loop.firsts:  # the steps taken in each step's episode, as the window's mask reads them
        i = first["iteration"] - 1
        rows = loop.episodes[i * NUM_STEPS : (i + 1) * NUM_STEPS]
        for env in range(NUM_ENVS):
            for t in range(NUM_STEPS):
                g = i * NUM_STEPS + t
                expected = g - next(s for s in range(g + 1) if loop.episodes[s, env] == rows[t, env])
                assert first["storage"]["episode_steps"][t, env] == expected, (g, env)


def agent_from(state: dict) -> ppo_trxl.Agent:
    args = ppo_trxl.Args(trxl_num_layers=2, trxl_num_heads=2, trxl_dim=8, trxl_memory_length=MEMORY)
    agent = ppo_trxl.Agent((3,), 2, args)
    agent.load_state_dict(state)
    return agent


def reference_window(loop: Loop, g: int, env: int) -> tuple:
    return plain_window(loop.hidden[:, env], loop.episodes[:, env], g, MEMORY, MEMORY, loop.hidden.shape[2:])


def test_the_update_replays_each_step_with_the_window_of_its_episodes_past(loop):
    for update in loop.updates:
        i = update["iteration"] - 1
        for k, index in enumerate(update["mb_inds"].tolist()):
            g, env = i * NUM_STEPS + index // NUM_ENVS, index % NUM_ENVS
            window, mask, positions = reference_window(loop, g, env)
            assert torch.allclose(update["mb_window"][k], window, atol=1e-6), (g, env)
            assert torch.equal(update["mb_mask"][k], mask), (g, env)
            assert torch.equal(update["mb_positions"][k][mask], positions[mask]), (g, env)
    for first in loop.firsts:  # an epoch takes every step once
        iteration = [u for u in loop.updates if u["iteration"] == first["iteration"] and u["epoch"] == 0]
        assert sorted(torch.cat([u["mb_inds"] for u in iteration]).tolist()) == list(range(NUM_STEPS * NUM_ENVS))


def test_the_rollout_acts_with_those_windows_and_the_first_minibatch_recomputes_its_log_probabilities(loop):
    for first in loop.firsts:
        i, storage = first["iteration"] - 1, first["storage"]
        agent = agent_from(first["agent"])  # no gradient step yet in this iteration: the agent that collected it
        obs = storage["obs"].flatten(0, 1)
        refs = [reference_window(loop, i * NUM_STEPS + t, env) for t in range(NUM_STEPS) for env in range(NUM_ENVS)]
        window, mask, positions = (torch.stack(x) for x in zip(*refs))
        with torch.no_grad():
            log_probs, values, hidden = agent(obs, window, mask, positions)
        actions = storage["actions"].flatten()
        logprobs = log_probs.gather(-1, actions[:, None]).squeeze(-1)
        assert torch.allclose(storage["logprobs"].flatten(), logprobs, atol=1e-5)
        assert torch.allclose(storage["values"].flatten(), values, atol=1e-5)
        assert torch.allclose(storage["hidden"].flatten(0, 1), hidden, atol=1e-5)
        # The update's first minibatch of the first epoch: new log-probabilities == the rollout's (the check).
        assert first["epoch"] == 0
        assert torch.allclose(first["newlogprob"], storage["logprobs"].flatten()[first["mb_inds"]], atol=1e-5)
        assert torch.allclose(first["newvalue"], storage["values"].flatten()[first["mb_inds"]], atol=1e-5)


def plain_gae(rewards, values, next_values, terminated, truncated) -> np.ndarray:
    advantages = np.zeros_like(rewards)
    for env in range(rewards.shape[1]):
        for t in range(len(rewards)):
            total, discount, k = 0.0, 1.0, t
            while True:
                bootstrap = 0.0 if terminated[k, env] else GAMMA * next_values[k, env]
                total += discount * (rewards[k, env] + bootstrap - values[k, env])
                if terminated[k, env] or truncated[k, env] or k == len(rewards) - 1:
                    break
                discount, k = discount * GAMMA * GAE_LAMBDA, k + 1
            advantages[t, env] = total
    return advantages


def test_advantages_bootstrap_a_cut_episode_from_its_final_observation_in_its_own_memory(loop):
    for first in loop.firsts:
        i, storage = first["iteration"] - 1, first["storage"]
        agent = agent_from(first["agent"])
        values = storage["values"].double().numpy()
        next_values = np.vstack([values[1:], np.zeros((1, NUM_ENVS))])
        with torch.no_grad():
            window, mask, positions = ppo_trxl.memory_window(first["memory"], first["episode_step"], MEMORY)
            next_values[-1] = agent(first["next_obs"], window, mask, positions)[1].double().numpy()
            for (g, env), final in loop.final_obs.items():
                if g // NUM_STEPS == i:  # the ended episode's memory: its past plus the last step's
                    w, m, p = plain_window(
                        torch.cat([loop.hidden[: g + 1, env], torch.zeros_like(loop.hidden[:1, env])]),
                        np.append(loop.episodes[: g + 1, env], loop.episodes[g, env]),
                        g + 1,
                        MEMORY,
                        MEMORY,
                        loop.hidden.shape[2:],
                    )
                    final_value = agent(torch.as_tensor(final)[None], w[None], m[None], p[None])[1]
                    next_values[g % NUM_STEPS, env] = final_value.item()
        expected = plain_gae(
            storage["rewards"], values, next_values, storage["terminations"] > 0, storage["truncations"] > 0
        )
        assert np.allclose(first["advantages"].numpy(), expected, atol=1e-5)
        assert np.allclose(first["returns"].numpy(), expected + values, atol=1e-5)


def reference_ppo_loss(agent: ppo_trxl.Agent, update: dict) -> torch.Tensor:
    """The PPO-TrXL loss of one minibatch as CleanRL's ppo_trxl defines it, in float64: the clipped surrogate on the
    raw advantages (no normalisation by default), the clipped value loss (the squared error without a 1/2) weighted
    0.5, minus the annealed entropy bonus. Advantages, returns and the rollout's values and log-probabilities are
    constants (the rollout's, computed before the update)."""
    storage, rows = update["storage"], update["mb_inds"]
    agent = agent.double()
    log_probs, value, _ = agent(
        storage["obs"].flatten(0, 1)[rows].double(),
        update["mb_window"].double(),
        update["mb_mask"],
        update["mb_positions"],
    )
    new_log_prob = log_probs.gather(-1, storage["actions"].flatten()[rows, None]).squeeze(-1)
    ratio = torch.exp(new_log_prob - storage["logprobs"].flatten()[rows].double())
    advantages = update["advantages"].flatten()[rows].double()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * advantages).mean()
    returns, old_values = update["returns"].flatten()[rows].double(), storage["values"].flatten()[rows].double()
    value_clipped = old_values + (value - old_values).clamp(-CLIP, CLIP)
    value_loss = torch.max((value - returns) ** 2, (value_clipped - returns) ** 2).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    global_step = (update["iteration"] - 1) * NUM_ENVS * NUM_STEPS  # at the iteration's start
    ent_coef = 1e-6 + (1e-4 - 1e-6) * max(1 - global_step / ANNEAL_STEPS, 0.0)
    return -surrogate + 0.5 * value_loss - ent_coef * entropy


def test_every_gradient_step_is_the_gradient_of_the_ppo_trxl_loss_of_its_minibatch(loop):
    for k, update in enumerate(loop.updates):
        agent = agent_from(update["agent"]).double()
        loss = reference_ppo_loss(agent, update)
        where = f"update {k} (iteration {update['iteration']}, epoch {update['epoch']})"
        reference = gradients(loss, dict(agent.named_parameters()))
        assert_gradients_match(update["grads"]["agent"], reference, where)
        assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-4, abs=1e-6), where


@pytest.mark.parametrize(
    "changes, fragments",
    [
        (dict(env_id="Pendulum-v1"), ["Discrete actions"]),
        (dict(trxl_num_heads=5), ["--trxl-num-heads 5 does not divide --trxl-dim 384"]),
        (dict(trxl_memory_length=-1), ["--trxl-memory-length"]),
        (dict(num_minibatches=7), ["--num-minibatches 7 does not divide the batch"]),
        (dict(total_timesteps=100), ["less than one batch of 16384"]),
        (dict(trxl_dim=0), ["--trxl-dim must be positive"]),
    ],
)
def test_validation_fails_in_one_line(capsys, changes, fragments):
    args = ppo_trxl.Args(**{"env_id": pom.ENV_ID, **changes})
    with pytest.raises(SystemExit) as exit_info:
        ppo_trxl.validate(args)
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    for fragment in fragments:
        assert fragment in line, line


def test_bad_input_from_the_command_line_fails_in_one_line_without_a_run_directory(workdir):
    result = run_script(SCRIPT, "--env-id", "ProofOfMemory-v1", cwd=workdir)
    assert_bad_input(result, workdir, "unknown environment id", "ProofofMemory-v0")


def test_smoke_writes_finite_scalars_and_evaluates_the_saved_model(loop):
    scalars = read_scalars(loop.run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return", "charts/entropy_coefficient"])
    assert len(scalars["losses/value_loss"]) == ITERATIONS and len(scalars["eval/episodic_return"]) == 2
    assert "evaluation over 2 episodes" in loop.stdout
    model = torch.load(loop.run_dir / "ppo_trxl.cleanrl_model", weights_only=False)
    assert model["script"] == "ppo_trxl" and model["obs_shape"] == (3,)


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(loop, tmp_path):
    run_dir = kill_at_first_checkpoint(SCRIPT, LOOP_FLAGS, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == NUM_ENVS * NUM_STEPS and checkpoint["envs"] is not None
    # The memory goes on into the next rollout: it is the one the second rollout began with.
    assert torch.equal(checkpoint["memory"], loop.firsts[1]["storage"]["initial_memory"])
    assert checkpoint["memory"].abs().sum() > 0
    resumed = run_script(SCRIPT, *LOOP_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(loop.run_dir)
    for key in sorted(set(PPO_KEYS) - {"charts/SPS"}) + ["eval/episodic_return"]:
        assert resumed_scalars[key] == straight_scalars[key], key


def test_memory_gym_grid_smoke_and_evaluation(workdir):
    flags = ["--env-id", "MortarMayhem-Grid-v0", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2"]
    flags += [*NET, "--update-epochs", "1", "--total-timesteps", "32", "--trxl-memory-length", "8"]
    result = run_script(SCRIPT, *flags, "--save-model", "--eval-episodes", "1", cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, [k for k in PPO_KEYS if "episodic" not in k] + ["eval/episodic_return"])
