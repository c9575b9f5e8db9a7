"""ppo_procgen.py: GAE over a NEXT_STEP-autoreset rollout against a plain loop, the IMPALA CNN's shapes, the reward
scaler's statistics, the loop's own wiring (its run is also the smoke test), SIGKILL + resume, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients

pytest.importorskip("envpool")
import ppo_procgen  # noqa: E402

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


def reference_advantages(stream, gamma, gae_lambda):
    """Per env: walk the recorded steps; each real transition's advantage is the (gamma * lambda)-discounted sum of
    TD errors up to the end of its episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        if stream[t][4]:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]  # the observation after step k: the true final one after an episode's end
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # One env, 12 steps: an episode terminates at 3, its autoreset step 4, a time-limit cut at 8 (bootstrapped from the
    # final observation at 9, the autoreset step), then more play running past the rollout's end.
    terminated = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    resets = [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.normal(size=13)
    gamma, gae_lambda, num_steps = 0.9, 0.8, 12
    as_tensor = lambda x: torch.tensor(np.asarray(x[:num_steps], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_procgen.compute_gae(
        as_tensor(rewards),
        as_tensor(values),
        torch.tensor(values[1:], dtype=torch.float64).unsqueeze(1),
        as_tensor(terminated),
        as_tensor(truncated),
        gamma,
        gae_lambda,
    )[:, 0].tolist()
    expected = reference_advantages(list(zip(values, rewards, terminated, truncated, resets)), gamma, gae_lambda)
    assert sum(e is not None for e in expected) == 10
    for t in range(num_steps):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


def test_impala_cnn_shapes_and_agent_heads():
    network = ppo_procgen.impala_cnn((3, 64, 64))
    x = torch.zeros(2, 3, 64, 64)
    shapes = []
    for layer in network:
        x = layer(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes[:3] == [(16, 32, 32), (32, 16, 16), (32, 8, 8)] and shapes[-1] == (256,)
    assert network[5].in_features == 32 * 8 * 8
    agent = ppo_procgen.Agent((3, 64, 64), 15)
    obs = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8)
    action, logprob, value = agent.act(obs)
    again, entropy, value_again = agent.evaluate_actions(obs, action)
    assert action.shape == (3,) and torch.allclose(logprob, again) and torch.allclose(value, value_again)
    assert (entropy > 0).all() and (entropy <= np.log(15) + 1e-6).all()


def test_reward_scaler_tracks_the_discounted_return_and_skips_autoreset_steps():
    gamma = 0.9
    rewards = np.array([[1.0, 2.0], [0.0, 1.0], [3.0, 0.0], [0.0, 5.0], [2.0, 1.0]])
    ended = np.array([[0, 0], [1, 0], [0, 1], [0, 0], [0, 0]], dtype=bool)
    resets = np.array([[0, 0], [0, 0], [1, 0], [0, 1], [0, 0]], dtype=bool)
    rewards[resets] = 0.0  # an autoreset step's reward
    scaler = ppo_procgen.RewardScaler(2, gamma)
    seen, returns = [], np.zeros(2)
    for t in range(len(rewards)):
        scaled = scaler(rewards[t], ended[t], ~resets[t])
        returns = returns * gamma + rewards[t]
        seen += returns[~resets[t]].tolist()
        returns[ended[t]] = 0.0
        assert scaled == pytest.approx(np.clip(rewards[t] / np.sqrt(scaler.var + 1e-8), -10, 10))
    # The running statistics start from a count of 1e-4 (gymnasium's), so they match the plain ones closely.
    assert scaler.count == pytest.approx(len(seen) + 1e-4)
    assert scaler.mean == pytest.approx(np.mean(seen), rel=1e-4) and scaler.var == pytest.approx(np.var(seen), rel=1e-4)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "BreakoutNoFrameskip-v4"], ["Atari game", "cleanrl/ppo_atari.py"]),
        (["--env-id", "MinAtar/Breakout-v1"], ["cleanrl/ppo_atari.py"]),
        (["--env-id", "Starpilot-v0"], ["StarpilotEasy-v0"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_procgen.py", *flags, cwd=workdir), workdir, *fragments)


# The loop's own wiring: the script runs unchanged under tests/probe.py, which copies what the env returned at every
# step and, at every backward(), the rollout storage, the network, the minibatch and the gradient; the tests rebuild the
# scaled rewards, the advantages and every loss and gradient from those copies. The same run is the smoke test
# (TensorBoard keys, a video, the saved model and its evaluation). 8 envs x 32 steps, 2 iterations of 2 epochs x 2
# minibatches.
PROBE_FLAGS = ["--num-envs", "8", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
PROBE_FLAGS += ["--total-timesteps", "512", "--save-model", "--eval-episodes", "2", "--capture-video"]
STREAM_NAMES = ["action", "reward", "terminated", "truncated", "next_obs_np"]
UPDATE_NAMES = ["storage", "agent", "next_obs", "iteration", "epoch", "mb_inds", "b_advantages", "b_returns"]
GAMMA, GAE_LAMBDA, NUM_ENVS, NUM_STEPS = 0.999, 0.95, 8, 32


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    torch.set_num_threads(1)  # as the script runs (--torch-threads 1): more threads on a busy CPU are far slower
    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        "ppo_procgen.py",
        PROBE_FLAGS,
        cwd,
        watch=STREAM_NAMES,
        at_backward=UPDATE_NAMES,
        grads=["agent"],
        final=STREAM_NAMES,
    )
    return trace, cwd


def env_stream(trace) -> list[dict]:
    """Per env step: the observation acted on, the action, and what the env returned. The watch sees each step's
    results at the next step (the script counts its steps at the top of the loop body); the last one at exit."""
    entries = [entry for entry in trace.steps if entry["step"] > 0]
    stream = []
    for entry in entries[1:] + [trace.final]:
        stream.append(
            dict(
                obs=None,
                action=entry["action"].numpy(),
                reward=entry["reward"],
                terminated=entry["terminated"],
                truncated=entry["truncated"],
                next_obs=entry["next_obs_np"],
            )
        )
    stream[0]["obs"] = entries[0]["next_obs_np"]  # the first reset's observation
    for previous, step in zip(stream, stream[1:]):
        step["obs"] = previous["next_obs"]
    for k, step in enumerate(stream):
        step["reset"] = (
            np.zeros_like(step["terminated"]) if k == 0 else stream[k - 1]["terminated"] | stream[k - 1]["truncated"]
        )
    return stream


def reference_scaled_rewards(stream, gamma) -> list[np.ndarray]:
    """gymnasium's NormalizeReward written out: each env's discounted return (restarted after an episode's end); the
    mean and variance of all returns of real transitions so far, pooled with a prior of mean 0, variance 1 and weight
    1e-4; each reward divided by sqrt(variance + 1e-8), clipped to [-10, 10]. Autoreset steps feed no statistics."""
    returns, seen, scaled = np.zeros(len(stream[0]["reward"])), [], []
    for step in stream:
        returns = returns * gamma + step["reward"]
        seen += returns[~step["reset"]].tolist()
        data = np.array(seen)
        n, total = len(data), 1e-4 + len(data)
        var = (1e-4 + n * data.var() + data.mean() ** 2 * 1e-4 * n / total) / total if n else 1.0
        scaled.append(np.clip(step["reward"] / np.sqrt(var + 1e-8), -10, 10))
        returns[step["terminated"] | step["truncated"]] = 0.0
    return scaled


def first_update_of_each_iteration(trace) -> list[dict]:
    return [next(u for u in trace.backward if u["iteration"] == i) for i in (1, 2)]


def network(state: dict) -> ppo_procgen.Agent:
    agent = ppo_procgen.Agent((3, 64, 64), 15)
    agent.load_state_dict(state)
    return agent


def policy_and_value(agent, obs: torch.Tensor) -> tuple[torch.distributions.Categorical, torch.Tensor]:
    """The agent's policy and value of uint8 frames, written out (no channels-last layout, no Gumbel trick)."""
    hidden = agent.network(obs.float() / 255.0)
    return torch.distributions.Categorical(logits=agent.actor(hidden)), agent.critic(hidden).squeeze(-1)


@pytest.fixture(scope="module")
def references(probed) -> list[dict]:
    return rollout_reference(probed[0])


def rollout_reference(trace) -> list[dict]:
    """Per iteration, from the env stream and the network that acted (a copy taken at the iteration's first update,
    before any gradient step): scaled rewards, values, advantages by a plain loop, and the transitions."""
    stream = env_stream(trace)
    scaled = reference_scaled_rewards(stream, GAMMA)
    out = []
    for i, update in enumerate(first_update_of_each_iteration(trace)):
        rows = stream[i * NUM_STEPS : (i + 1) * NUM_STEPS]
        agent = network(update["agent"])
        with torch.no_grad():
            obs = torch.from_numpy(np.stack([row["obs"] for row in rows]))
            policy, values = policy_and_value(agent, obs.flatten(0, 1))
            _, last_value = policy_and_value(agent, torch.from_numpy(rows[-1]["next_obs"]))
        actions = torch.from_numpy(np.stack([row["action"] for row in rows]).reshape(-1))
        log_probs = policy.log_prob(actions).view(NUM_STEPS, NUM_ENVS)
        values = values.view(NUM_STEPS, NUM_ENVS).double().numpy()
        rewards = np.stack(scaled[i * NUM_STEPS : (i + 1) * NUM_STEPS])
        advantages = np.full((NUM_STEPS, NUM_ENVS), np.nan)
        for env in range(NUM_ENVS):
            env_rows = [
                (
                    values[t, env],
                    rewards[t, env],
                    rows[t]["terminated"][env],
                    rows[t]["truncated"][env],
                    rows[t]["reset"][env],
                )
                for t in range(NUM_STEPS)
            ]
            env_rows.append((last_value[env].item(), 0.0, False, False, False))
            for t, advantage in enumerate(reference_advantages(env_rows, GAMMA, GAE_LAMBDA)[:NUM_STEPS]):
                if advantage is not None:
                    advantages[t, env] = advantage
        resets = np.stack([row["reset"] for row in rows])
        out.append(
            dict(
                rows=rows,
                rewards=rewards,
                log_probs=log_probs,
                values=values,
                advantages=advantages,
                transitions=np.flatnonzero(~resets.reshape(-1)),
            )
        )
    return out


def test_the_rollout_stores_the_stream_with_rewards_scaled_as_learning_sees_them(probed):
    trace, _ = probed
    stream = env_stream(trace)
    assert len(stream) == 2 * NUM_STEPS
    scaled = reference_scaled_rewards(stream, GAMMA)
    rewards_seen = ends_seen = resets_seen = 0
    for i, update in enumerate(first_update_of_each_iteration(trace)):
        storage = update["storage"]
        for t in range(NUM_STEPS):
            step = stream[i * NUM_STEPS + t]
            assert np.array_equal(storage["obs"][t].numpy(), step["obs"]), (i, t)
            assert storage["actions"][t].tolist() == step["action"].tolist(), (i, t)
            assert storage["terminations"][t].tolist() == step["terminated"].astype(float).tolist(), (i, t)
            assert storage["truncations"][t].tolist() == step["truncated"].astype(float).tolist(), (i, t)
            assert storage["resets"][t].tolist() == step["reset"].tolist(), (i, t)  # the autoreset steps
            np.testing.assert_allclose(storage["rewards"][t], scaled[i * NUM_STEPS + t], rtol=1e-5, err_msg=f"{i} {t}")
            rewards_seen += int((step["reward"] != 0).sum())
            ends_seen += int((step["terminated"] | step["truncated"]).sum())
            resets_seen += int(step["reset"].sum())
    # enough happened for the test to mean something: rewards to scale, episodes ending, autoreset steps stored
    assert rewards_seen >= 4 and ends_seen >= 2 and resets_seen >= 1, (rewards_seen, ends_seen, resets_seen)


def test_stored_log_probs_and_values_are_the_acting_networks(probed, references):
    trace, _ = probed
    for update, reference in zip(first_update_of_each_iteration(trace), references):
        storage = update["storage"]
        torch.testing.assert_close(storage["logprobs"], reference["log_probs"], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(storage["values"].numpy(), reference["values"], atol=1e-5, rtol=1e-5)


def test_advantages_and_returns_the_update_used_match_a_plain_gae_over_the_stream(probed, references):
    trace, _ = probed
    for i, reference in enumerate(references):
        keep = reference["transitions"]
        for update in (u for u in trace.backward if u["iteration"] == i + 1):
            np.testing.assert_allclose(
                update["b_advantages"].numpy()[keep], reference["advantages"].reshape(-1)[keep], atol=2e-4, rtol=1e-4
            )
            returns = (reference["advantages"] + reference["values"]).reshape(-1)[keep]
            np.testing.assert_allclose(update["b_returns"].numpy()[keep], returns, atol=2e-4, rtol=1e-4)


def test_each_epoch_visits_every_transition_once_and_never_an_autoreset_step(probed, references):
    trace, _ = probed
    for i in (1, 2):
        for epoch in (0, 1):
            minibatches = [u["mb_inds"] for u in trace.backward if u["iteration"] == i and u["epoch"] == epoch]
            assert len(minibatches) == 2
            assert sorted(torch.cat(minibatches).tolist()) == references[i - 1]["transitions"].tolist()


def impala_features(network: torch.nn.Sequential, float32_network: torch.nn.Sequential, obs: torch.Tensor):
    """The features of uint8 frames from an IMPALA CNN (impala_cnn's layers) in float64, each max-pool and ReLU taking
    the branch that the same network in float32 and the channels-last layout (the script's pass) takes. Procgen's flat
    backgrounds make nearly equal activations, near-ties that float32 and float64 round apart: without this the
    gradient goes back through another, equally valid, branch (measured on the probed runs: 8 of the 3.4M pooled
    positions of a minibatch; the torso's gradients then off by up to 3.5e-4 of their norm here, 2.3e-3 in
    ppg_procgen's, the heads' by 6e-7)."""

    def relu(x, x32):  # the float64 activations on the float32 pass's pattern, and the float32 pass's
        return x * (x32 > 0), torch.relu(x32)

    float32_network.requires_grad_(False)  # its pass only picks the branches
    x = obs.double() / 255.0
    x32 = (obs.float() / 255.0).contiguous(memory_format=torch.channels_last)
    for sequence, sequence32 in zip(network[:3], float32_network[:3]):
        x32, positions = torch.nn.functional.max_pool2d(sequence32.conv(x32), 3, 2, 1, return_indices=True)
        x = sequence.conv(x).flatten(2).gather(2, positions.flatten(2)).view(positions.shape)
        for block, block32 in zip(
            (sequence.res_block0, sequence.res_block1), (sequence32.res_block0, sequence32.res_block1)
        ):
            a, a32 = relu(x, x32)
            b, b32 = relu(block.conv0(a), block32.conv0(a32))
            x, x32 = x + block.conv1(b), x32 + block32.conv1(b32)
    x, x32 = relu(x.flatten(1), x32.flatten(1))
    return relu(network[5](x), float32_network[5](x32))[0]


def ppo_loss(update: dict, reference: dict, double: bool = False) -> tuple[torch.Tensor, ppo_procgen.Agent]:
    """PPO's loss of the update's minibatch from the network it stepped (returned with it; `double`: in float64, the
    IMPALA CNN on the float32 pass's branches): the clipped surrogate on the minibatch's normalised advantages, 0.5
    times half the clipped squared value error, minus 0.01 times the entropy. The advantages (a plain GAE over the
    stream), the returns, the rollout's values and log-probabilities are constants."""
    storage, mb, dtype = update["storage"], update["mb_inds"], torch.float64 if double else torch.float32
    advantages = torch.from_numpy(reference["advantages"].reshape(-1)[mb.numpy()]).to(dtype)
    old_values, old_log_probs = (storage[name].reshape(-1)[mb].to(dtype) for name in ("values", "logprobs"))
    returns = advantages + old_values
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    agent, obs = network(update["agent"]).to(dtype), storage["obs"].flatten(0, 1)[mb]
    if double:
        hidden = impala_features(agent.network, network(update["agent"]).network, obs)
        policy, values = torch.distributions.Categorical(logits=agent.actor(hidden)), agent.critic(hidden).squeeze(-1)
    else:
        policy, values = policy_and_value(agent, obs)
    ratio = (policy.log_prob(storage["actions"].reshape(-1)[mb]) - old_log_probs).exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean()
    clipped_values = old_values + (values - old_values).clamp(-0.2, 0.2)
    v_loss = 0.5 * torch.max((values - returns) ** 2, (clipped_values - returns) ** 2).mean()
    return pg_loss - 0.01 * policy.entropy().mean() + 0.5 * v_loss, agent


def test_the_last_step_of_each_iteration_steps_on_the_gradient_of_its_ppo_loss(probed, references):
    """In float64, at the last step of each iteration (after three steps moved the network): a float64 pass of the
    IMPALA CNN costs ~2.5 s of CPU per minibatch, too much for every step. Before the loss values' test, so that a
    term too small to show in a value is caught here."""
    trace, _ = probed
    updates = trace.backward
    lasts = [u for k, u in enumerate(updates) if k + 1 == len(updates) or updates[k + 1]["iteration"] != u["iteration"]]
    assert [(u["iteration"], u["epoch"]) for u in lasts] == [(1, 1), (2, 1)]
    for update in lasts:
        loss, agent = ppo_loss(update, references[update["iteration"] - 1], double=True)
        where = f"iteration {update['iteration']}'s last step"
        assert_gradients_match(update["grads"]["agent"], gradients(loss, dict(agent.named_parameters())), where)


def test_every_loss_is_the_ppo_loss_of_its_minibatch(probed, references):
    trace, _ = probed
    assert len(trace.backward) == 2 * 2 * 2
    for update in trace.backward:
        with torch.no_grad():
            expected, _ = ppo_loss(update, references[update["iteration"] - 1])
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-5), update["step"]


def test_the_probed_run_writes_finite_scalars_at_a_constant_learning_rate_and_evaluates_saved_model(probed):
    _, cwd = probed
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 2 and len(scalars["eval/episodic_return"]) == 2
    # CleanRL's and the Procgen paper's setting: no annealing unless --anneal-lr asks for it
    assert [value for _, value in scalars["charts/learning_rate"]] == pytest.approx([5e-4, 5e-4])
    assert ppo_procgen.Args().anneal_lr is False
    assert list((run_dir / "videos").rglob("*.mp4"))
    model = torch.load(run_dir / "ppo_procgen.cleanrl_model", weights_only=False)
    assert model["script"] == "ppo_procgen" and model["reward_scaler"]["count"] > 1


# Last: the slowest (three runs), so that a planted bug the loop's tests catch fails fast.
def test_sigkill_then_resume_continues_the_curve_with_fresh_episodes(tmp_path):
    flags = [*TINY, "--num-steps", "16", "--total-timesteps", "256", "--checkpoint-every", "64"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("ppo_procgen.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    run_dir = kill_at_first_checkpoint("ppo_procgen.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 64 and checkpoint["reward_scaler"]["count"] > 1
    resumed = run_script("ppo_procgen.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with fresh episodes" in resumed.stdout
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(run_dirs(tmp_path / "straight")[0])
    for key in ["losses/value_loss", "losses/policy_loss", "losses/entropy"]:
        steps = [step for step, _ in resumed_scalars[key]]
        assert steps == list(range(32, 257, 32)), key  # one point per iteration, none lost or repeated
        # Up to the checkpoint the runs are the same run (seeded envpool, the CPU); afterwards the episodes differ.
        assert resumed_scalars[key][:2] == straight_scalars[key][:2], key
        assert resumed_scalars[key][2:] != straight_scalars[key][2:], key
