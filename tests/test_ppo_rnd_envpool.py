"""ppo_rnd_envpool.py: the observation and reward normalisers against NumPy, GAE with two value heads (the intrinsic
return never cut) against a plain loop, the loop's own wiring (its run is also the smoke test), bad input, SIGKILL +
resume with the normalisers restored."""

from __future__ import annotations

import numpy as np
import ppo_rnd_envpool
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, assert_no_gradient, assert_unchanged, gradients

pytest.importorskip("envpool")

TINY = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
TINY += ["--num-iterations-obs-norm-init", "2"]
KEYS = [
    "charts/SPS",
    "charts/learning_rate",
    "charts/intrinsic_reward",
    "losses/value_loss",
    "losses/ext_value_loss",
    "losses/int_value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/fwd_loss",
    "losses/approx_kl",
    "losses/clipfrac",
]


def numpy_moments(batches, eps=1e-4):
    """Mean and variance of a prior (mean 0, variance 1, weight eps) pooled with all the data at once."""
    data = np.concatenate(batches).astype(np.float64)
    n, mean, var = len(data), data.mean(0), data.var(0)
    total = eps + n
    pooled_mean = n * mean / total
    pooled_var = (eps * 1.0 + n * var + mean**2 * eps * n / total) / total
    return pooled_mean, pooled_var, total


def test_running_mean_std_and_observation_normalisation_match_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (n, 6, 5)).astype(np.uint8) for n in (7, 1, 30)]
    rnd_model = ppo_rnd_envpool.RNDModel.__new__(ppo_rnd_envpool.RNDModel)
    torch.nn.Module.__init__(rnd_model)
    rnd_model.obs_rms = ppo_rnd_envpool.RunningMeanStd((6, 5))
    for batch in batches:
        rnd_model.obs_rms.update(torch.from_numpy(batch))
    mean, var, count = numpy_moments(batches)
    np.testing.assert_allclose(rnd_model.obs_rms.mean.numpy(), mean, rtol=1e-10)
    np.testing.assert_allclose(rnd_model.obs_rms.var.numpy(), var, rtol=1e-10)
    assert rnd_model.obs_rms.count.item() == pytest.approx(count)
    frames = np.zeros((3, 6, 5), np.uint8)
    frames[1] = 255
    frames[2] = batches[0][0]
    expected = np.clip((frames - mean) / np.sqrt(var), -5, 5)
    normalized = rnd_model.normalize(torch.from_numpy(frames))
    assert normalized.shape == (3, 1, 6, 5) and normalized.dtype == torch.float32
    np.testing.assert_allclose(normalized[:, 0].numpy(), expected, rtol=1e-6, atol=1e-6)
    rnd_model.obs_rms.var.fill_(1e-6)  # far-out frames are clipped to [-5, 5]
    assert normalized.abs().max() <= 5 and rnd_model.normalize(torch.from_numpy(frames)).abs().max() == 5


def test_reward_normaliser_divides_by_the_std_of_uncut_discounted_sums():
    rng = np.random.default_rng(1)
    gamma, num_envs = 0.9, 3
    rollouts = [rng.exponential(size=(4, num_envs)) for _ in range(3)]
    normalizer = ppo_rnd_envpool.RewardNormalizer(num_envs, gamma)
    outputs = [normalizer(torch.tensor(r)).numpy() for r in rollouts]
    # NumPy reference: per env, one discounted sum over the whole stream, never reset (episode ends do not exist here).
    running, sums = np.zeros(num_envs), []
    for k, rollout in enumerate(rollouts):
        for t in range(len(rollout)):
            running = running * gamma + rollout[t]
            sums.append(running.copy())
        _, var, _ = numpy_moments([np.concatenate(sums)])
        np.testing.assert_allclose(outputs[k], rollout / np.sqrt(var), rtol=1e-10)


def plain_gae(values, rewards, cuts, truncs, next_values, gamma, lam):
    """Per step: the (gamma * lambda)-discounted sum of TD errors up to the end of the episode (if any)."""
    n = len(rewards)
    out = []
    for t in range(n):
        total, discount = 0.0, 1.0
        for k in range(t, n):
            total += discount * (rewards[k] + (0.0 if cuts[k] else gamma * next_values[k]) - values[k])
            if cuts[k] or truncs[k]:
                break
            discount *= gamma * lam
        out.append(total)
    return out


def test_gae_with_two_value_heads_cuts_only_the_extrinsic_stream():
    # A life loss at 2, a game over at 5 (its autoreset step 6), a time-limit cut at 9 (its autoreset step 10).
    terminated = np.array([0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0], np.float64)
    truncated = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0], np.float64)
    rng = np.random.default_rng(2)
    ext_v, int_v = rng.normal(size=13), rng.normal(size=13)
    ext_r, int_r = rng.choice([-1.0, 0.0, 1.0], size=12), rng.exponential(size=12)
    column = lambda x: torch.tensor(x).unsqueeze(1)  # noqa: E731
    ext = ppo_rnd_envpool.compute_gae(
        column(ext_r), column(ext_v[:12]), column(ext_v[1:]), column(terminated), column(truncated), 0.999, 0.95
    )
    never = column(np.zeros(12))
    intr = ppo_rnd_envpool.compute_gae(column(int_r), column(int_v[:12]), column(int_v[1:]), never, never, 0.99, 0.95)
    expected_ext = plain_gae(ext_v[:12], ext_r, terminated, truncated, ext_v[1:], 0.999, 0.95)
    expected_int = plain_gae(int_v[:12], int_r, np.zeros(12), np.zeros(12), int_v[1:], 0.99, 0.95)
    keep = [t for t in range(12) if t not in (6, 10)]  # the autoreset steps leave the batch
    assert ppo_rnd_envpool.transition_indices(torch.tensor([t in (6, 10) for t in range(12)])).tolist() == keep
    np.testing.assert_allclose(ext[:, 0].numpy()[keep], np.array(expected_ext)[keep], atol=1e-12)
    np.testing.assert_allclose(intr[:, 0].numpy(), expected_int, atol=1e-12)
    # the intrinsic advantage at the game's last step still sees the next game; the extrinsic one does not
    assert intr[5, 0] != pytest.approx(int_r[5] + 0.99 * int_v[6] - int_v[5])
    assert ext[5, 0] == pytest.approx(ext_r[5] - ext_v[5])


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "BreakoutNoFrameskip-v4"], ["ale-py id", "--env-id Breakout-v5"]),
        (["--env-id", "MontezumaRevengeNoFrameskip-v4"], ["--env-id MontezumaRevenge-v5"]),
        (["--env-id", "BigfishEasy-v0"], ["Procgen", "cleanrl/ppo_procgen.py"]),
        (["--env-id", "HalfCheetah-v5"], ["continuous actions"]),
        (["--update-proportion", "0"], ["--update-proportion"]),
        (["--int-gamma", "1.5"], ["--int-gamma"]),
        (["--num-envs", "3", "--num-steps", "3", "--num-minibatches", "4"], ["does not divide"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_rnd_envpool.py", *flags, cwd=workdir), workdir, *fragments)


# The loop's own wiring: the script runs unchanged under tests/probe.py on Breakout-v5 (lives to lose and points to
# score within a few hundred steps), 2 envs x 64 steps, 3 iterations of 1 epoch x 2 minibatches, a learning rate of
# 2e-3 (1e-4 by default) so that the policy leaves uniform within the run (at uniform the entropy bonus has no
# gradient: see the gradient test). It copies what the env returned at every step and, at every backward(), the
# networks (the RND model with its observation statistics) and their gradients, the rollout storage, the advantages
# and the minibatch with the predictor's mask; the tests rebuild the intrinsic rewards, their normalisation, both GAEs
# and every loss and gradient from those copies, relative to what the loop saw from the env (its terminations, life
# losses and autoreset steps). The same run is the smoke test (TensorBoard keys, the saved model and its evaluation).
PROBE_FLAGS = ["--env-id", "Breakout-v5", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2"]
PROBE_FLAGS += ["--update-epochs", "1", "--num-iterations-obs-norm-init", "1", "--total-timesteps", "384"]
PROBE_FLAGS += ["--learning-rate", "2e-3"]
PROBE_FLAGS += ["--save-model", "--eval-episodes", "1"]
STREAM_NAMES = ["action", "reward", "terminated", "truncated", "infos", "next_obs_np"]
UPDATE_NAMES = ["agent", "rnd_model", "storage", "next_obs", "iteration", "mb_inds", "mask", "int_rewards"]
UPDATE_NAMES += ["ext_advantages", "int_advantages", "b_advantages", "ext_v_loss", "int_v_loss", "fwd_loss"]
NUM_ENVS, NUM_STEPS, ITERATIONS = 2, 64, 3
NETS = ("agent", "rnd_model")  # the networks whose gradients the probe records
GAMMA, INT_GAMMA, GAE_LAMBDA = 0.999, 0.99, 0.95


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    torch.set_num_threads(1)  # as the script runs (--torch-threads 1): more threads on a busy CPU are far slower
    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        "ppo_rnd_envpool.py",
        PROBE_FLAGS,
        cwd,
        watch=STREAM_NAMES,
        at_backward=UPDATE_NAMES,
        grads=["agent", "rnd_model"],
        final=STREAM_NAMES,
    )
    return trace, cwd


def env_stream(trace) -> list[dict]:
    """Per env step: the observation acted on, the action and what the env returned, with the training episode's end
    as the loop should see it (a termination or a lost life) and whether the step was an autoreset step (the env's
    previous step ended its episode). The watch sees each step's results at the next step; the last one at exit."""
    entries = [entry for entry in trace.steps if entry["step"] > 0]
    stream = []
    for entry in entries[1:] + [trace.final]:
        life_loss = entry["infos"].get("life_loss", np.zeros_like(entry["terminated"]))
        stream.append(
            dict(
                action=entry["action"].numpy(),
                reward=entry["reward"],
                ended=entry["terminated"] | life_loss,
                truncated=entry["truncated"],
                game_or_episode_over=entry["terminated"] | entry["truncated"],
                life_loss=life_loss,
                next_obs=entry["next_obs_np"],
            )
        )
    previous_obs = entries[0]["next_obs_np"]  # the first reset's observation
    previous_over = np.zeros(NUM_ENVS, bool)
    for step in stream:
        step["obs"], step["reset"] = previous_obs, previous_over
        previous_obs, previous_over = step["next_obs"], step["game_or_episode_over"]
    return stream


def rnd_outputs(rnd_model, frames: torch.Tensor, stats: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The predictor's and the fixed target's features of uint8 frames [batch, 84, 84], normalised (clipped to
    [-5, 5], as float32) by the observation statistics `stats` (default: the model's own). `rnd_model`: an RNDModel
    (run in its precision) or its state dict."""
    if isinstance(rnd_model, dict):
        rnd_model = network("rnd_model", rnd_model)
    stats = stats or rnd_model.state_dict()
    x = ((frames.double() - stats["obs_rms.mean"]) / stats["obs_rms.var"].sqrt()).clamp(-5, 5).float().unsqueeze(1)
    x = x.to(rnd_model.predictor[0].weight.dtype)
    return rnd_model.predictor(x), rnd_model.target(x)


def network(name: str, state: dict, double: bool = False) -> torch.nn.Module:
    """The Agent ("agent") or the RNDModel ("rnd_model") holding `state`; `double`: in float64 (the RND model's
    running statistics are float64 already)."""
    module = ppo_rnd_envpool.Agent((4, 84, 84), 4) if name == "agent" else ppo_rnd_envpool.RNDModel((84, 84))
    module.load_state_dict(state)
    return module.double() if double else module


def agent_heads(agent, obs: torch.Tensor):
    """The policy and both values of uint8 observations: the agent sees raw pixels / 255, never the RND statistics.
    `agent`: an Agent (run in its precision) or its state dict."""
    if isinstance(agent, dict):
        agent = network("agent", agent)
    hidden = agent.network(obs.to(agent.critic_ext.weight.dtype) / 255.0)
    features = agent.extra_layer(hidden) + hidden
    pi = torch.distributions.Categorical(logits=agent.actor(hidden))
    return pi, agent.critic_ext(features).squeeze(-1), agent.critic_int(features).squeeze(-1)


def pooled_var(samples: np.ndarray) -> float:
    """The variance of `samples` pooled with a prior of mean 0, variance 1 and weight 1e-4 (RunningMeanStd's start)."""
    n = len(samples)
    total = 1e-4 + n
    return (1e-4 + n * samples.var() + samples.mean() ** 2 * 1e-4 * n / total) / total


@pytest.fixture(scope="module")
def references(probed) -> list[dict]:
    """Per iteration, rebuilt from the env stream and the copies: rewards as extrinsic learning sees them, the raw and
    the normalised intrinsic rewards, both values, both GAEs by plain loops, the transitions."""
    trace, _ = probed
    stream = env_stream(trace)
    firsts = [next(u for u in trace.backward if u["iteration"] == i + 1) for i in range(ITERATIONS)]
    raw_int = torch.cat([u["storage"]["int_rewards"] for u in firsts]).double().numpy()  # [all steps, envs]
    # the intrinsic return's statistics: one discounted sum per env over the whole stream, never cut
    sums, running = np.zeros_like(raw_int), np.zeros(NUM_ENVS)
    for t in range(len(raw_int)):
        running = running * INT_GAMMA + raw_int[t]
        sums[t] = running
    out = []
    for i, update in enumerate(firsts):
        rows = stream[i * NUM_STEPS : (i + 1) * NUM_STEPS]
        obs = torch.from_numpy(np.stack([row["obs"] for row in rows]))
        with torch.no_grad():
            pi, ext_values, int_values = agent_heads(update["agent"], obs.flatten(0, 1))
            _, last_ext, last_int = agent_heads(update["agent"], torch.from_numpy(rows[-1]["next_obs"]))
        ext_values = ext_values.view(NUM_STEPS, NUM_ENVS).double().numpy()
        int_values = int_values.view(NUM_STEPS, NUM_ENVS).double().numpy()
        ext_rewards = np.sign(np.stack([row["reward"] for row in rows]))
        ended = np.stack([row["ended"] for row in rows])
        truncated = np.stack([row["truncated"] for row in rows])
        int_raw = raw_int[i * NUM_STEPS : (i + 1) * NUM_STEPS]
        int_rewards = int_raw / np.sqrt(pooled_var(sums[: (i + 1) * NUM_STEPS].reshape(-1)))
        ext_adv, int_adv = np.zeros((NUM_STEPS, NUM_ENVS)), np.zeros((NUM_STEPS, NUM_ENVS))
        for env in range(NUM_ENVS):
            next_ext = np.append(ext_values[1:, env], last_ext[env].item())
            next_int = np.append(int_values[1:, env], last_int[env].item())
            ext_adv[:, env] = plain_gae(
                ext_values[:, env], ext_rewards[:, env], ended[:, env], truncated[:, env], next_ext, GAMMA, GAE_LAMBDA
            )
            never = np.zeros(NUM_STEPS, bool)
            int_adv[:, env] = plain_gae(
                int_values[:, env], int_rewards[:, env], never, never, next_int, INT_GAMMA, GAE_LAMBDA
            )
        resets = np.stack([row["reset"] for row in rows])
        actions = torch.from_numpy(np.stack([row["action"] for row in rows]))
        out.append(
            dict(
                rows=rows,
                obs=obs,
                actions=actions,
                log_probs=pi.log_prob(actions.reshape(-1)).view(NUM_STEPS, NUM_ENVS),
                next_frames=torch.from_numpy(np.stack([row["next_obs"][:, -1] for row in rows])),
                ext_rewards=ext_rewards,
                ended=ended,
                truncated=truncated,
                int_raw=int_raw,
                int_rewards=int_rewards,
                ext_values=ext_values,
                int_values=int_values,
                ext_advantages=ext_adv,
                int_advantages=int_adv,
                transitions=np.flatnonzero(~resets.reshape(-1)),
                resets=resets,
            )
        )
    return out


def iteration_updates(trace, i: int) -> list[dict]:
    return [u for u in trace.backward if u["iteration"] == i + 1]


def test_the_rollout_stores_the_stream_as_extrinsic_learning_sees_it(probed, references):
    trace, _ = probed
    for i, reference in enumerate(references):
        storage = iteration_updates(trace, i)[0]["storage"]
        assert torch.equal(storage["obs"], reference["obs"]), i
        assert torch.equal(storage["actions"], reference["actions"]), i
        # the RND input: the newest frame of the observation each step led to
        assert torch.equal(storage["next_frames"], reference["next_frames"]), i
        assert storage["rewards"].tolist() == reference["ext_rewards"].astype(np.float32).tolist(), i
        assert storage["terminations"].tolist() == reference["ended"].astype(np.float32).tolist(), i
        assert storage["truncations"].tolist() == reference["truncated"].astype(np.float32).tolist(), i
        assert storage["resets"].tolist() == reference["resets"].tolist(), i
        torch.testing.assert_close(storage["logprobs"], reference["log_probs"], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(storage["ext_values"].numpy(), reference["ext_values"], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(storage["int_values"].numpy(), reference["int_values"], atol=1e-5, rtol=1e-5)
    stream = env_stream(trace)
    lives_lost = sum(int(step["life_loss"].sum()) for step in stream)
    points = sum(int((step["reward"] != 0).sum()) for step in stream)
    assert lives_lost >= 2 and points >= 1, (lives_lost, points)  # something for the extrinsic stream to cut and score


def test_intrinsic_rewards_are_the_predictors_error_on_the_next_frame_under_the_statistics_before_the_rollout(
    probed, references
):
    trace, _ = probed
    # Iterations 2 and 3: the rollout's statistics are those the previous iteration's update had (the first
    # rollout's come from random play, which no copy holds).
    for i in (1, 2):
        update, before = iteration_updates(trace, i)[0], iteration_updates(trace, i - 1)[0]
        with torch.no_grad():
            predicted, target = rnd_outputs(
                update["rnd_model"], references[i]["next_frames"].flatten(0, 1), before["rnd_model"]
            )
        novelty = ((predicted - target) ** 2).sum(-1) / 2
        torch.testing.assert_close(update["storage"]["int_rewards"].reshape(-1), novelty, rtol=1e-4, atol=1e-6)


def test_the_observation_statistics_take_in_each_rollouts_next_frames_before_its_update(probed, references):
    trace, _ = probed
    for i in (1, 2):
        before, after = (iteration_updates(trace, k)[0]["rnd_model"] for k in (i - 1, i))
        frames = references[i]["next_frames"].reshape(-1, 84, 84).double()
        n, count = len(frames), before["obs_rms.count"]
        total = count + n
        delta = frames.mean(0) - before["obs_rms.mean"]
        mean = before["obs_rms.mean"] + delta * n / total
        var = (before["obs_rms.var"] * count + frames.var(0, unbiased=False) * n + delta**2 * count * n / total) / total
        assert after["obs_rms.count"].item() == pytest.approx(total.item())
        torch.testing.assert_close(after["obs_rms.mean"], mean)
        torch.testing.assert_close(after["obs_rms.var"], var)
    # the target network is fixed (from one gradient step to the next), the predictor learns
    for update, after in zip(trace.backward, trace.backward[1:]):
        target = lambda name: name.startswith("target.")  # noqa: E731
        assert_unchanged(update["rnd_model"], after["rnd_model"], f"step {update['step']}", names=target)
    first, last = trace.backward[0]["rnd_model"], trace.backward[-1]["rnd_model"]
    assert not all(torch.equal(first[k], last[k]) for k in first if k.startswith("predictor."))


def test_the_intrinsic_return_is_normalised_by_its_running_std_and_never_cut_the_extrinsic_one_is(probed, references):
    trace, _ = probed
    for i, reference in enumerate(references):
        keep = reference["transitions"]
        for update in iteration_updates(trace, i):
            np.testing.assert_allclose(update["int_rewards"].numpy(), reference["int_rewards"], rtol=1e-5)
            ext = update["ext_advantages"].numpy().reshape(-1)[keep]
            np.testing.assert_allclose(ext, reference["ext_advantages"].reshape(-1)[keep], atol=1e-4, rtol=1e-4)
            # every step of the intrinsic stream, the autoreset steps included, flows into the one before
            np.testing.assert_allclose(
                update["int_advantages"].numpy(), reference["int_advantages"], atol=1e-4, rtol=1e-4
            )
            combined = 2.0 * reference["ext_advantages"] + reference["int_advantages"]
            np.testing.assert_allclose(
                update["b_advantages"].numpy()[keep], combined.reshape(-1)[keep], atol=2e-4, rtol=1e-4
            )
            assert set(update["mb_inds"].tolist()) <= set(keep.tolist())  # no autoreset step in a minibatch
    # the intrinsic GAE crossed at least one training episode's end that the extrinsic one stopped at
    assert sum(int(r["ended"][:-1].sum()) for r in references) >= 1


@pytest.fixture(scope="module")
def recomputed(probed, references) -> list[dict]:
    """Per backward() of the run, its loss rebuilt in float64 from the networks' parameters: PPO's clipped surrogate on
    the normalised sum 2 A_ext + A_int, the entropy bonus (0.001), 0.5 times both value heads' losses (the extrinsic
    one clipped), and the predictor's error against the fixed random target on its masked share of the minibatch.
    Advantages, returns (plain GAEs over the stream), the rollout's values and log-probabilities and the target
    network's features are constants. With its parts and its gradient, by network and parameter name."""
    trace, _ = probed
    out = []
    for update in trace.backward:
        reference, mb = references[update["iteration"] - 1], update["mb_inds"]
        flat = lambda x: torch.as_tensor(np.asarray(x)).reshape(-1)[mb].double()  # noqa: E731
        advantages = 2.0 * flat(reference["ext_advantages"]) + flat(reference["int_advantages"])
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ext_returns = flat(reference["ext_advantages"]) + flat(reference["ext_values"])
        int_returns = flat(reference["int_advantages"]) + flat(reference["int_values"])
        old_ext = flat(reference["ext_values"])
        agent = network("agent", update["agent"], double=True)
        rnd_model = network("rnd_model", update["rnd_model"], double=True)
        rnd_model.target.requires_grad_(False)  # the fixed random network: its features are constants
        pi, ext_values, int_values = agent_heads(agent, reference["obs"].flatten(0, 1)[mb])
        predicted, target = rnd_outputs(rnd_model, reference["next_frames"].flatten(0, 1)[mb])
        ratio = (pi.log_prob(reference["actions"].reshape(-1)[mb]) - flat(reference["log_probs"])).exp()
        pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.9, 1.1)).mean()
        clipped = old_ext + (ext_values - old_ext).clamp(-0.1, 0.1)
        ext_v_loss = 0.5 * torch.max((ext_values - ext_returns) ** 2, (clipped - ext_returns) ** 2).mean()
        int_v_loss = 0.5 * ((int_values - int_returns) ** 2).mean()
        mask = update["mask"]
        fwd_loss = (((predicted - target) ** 2).mean(-1) * mask).sum() / mask.sum().clamp(min=1)
        loss = pg_loss - 0.001 * pi.entropy().mean() + 0.5 * (ext_v_loss + int_v_loss) + fwd_loss
        params = {f"agent.{name}": p for name, p in agent.named_parameters()}
        params |= {f"rnd_model.{name}": p for name, p in rnd_model.named_parameters()}
        # zeros for the target network's parameters: the loss holds its features constant
        grads = {name: torch.zeros_like(p) for name, p in params.items()} | gradients(loss, params)
        grads = {net: {n.split(".", 1)[1]: g for n, g in grads.items() if n.startswith(f"{net}.")} for net in NETS}
        parts = dict(loss=loss, ext_v_loss=ext_v_loss, int_v_loss=int_v_loss, fwd_loss=fwd_loss)
        out.append(dict(grads=grads) | {name: value.item() for name, value in parts.items()})
    return out


def test_every_step_is_the_gradient_of_its_loss_and_none_reaches_the_fixed_target_network(probed, recomputed):
    """Before the loss values' test, so that a term too small to show in a value is caught here. The entropy bonus's
    gradient vanishes at the uniform policy the RND init starts from (its sign flipped moves the actor's gradient by
    2e-7 to 7e-6 of its norm at the default learning rate, under float32's noise); with --learning-rate 2e-3 it moves
    it by 1e-3 from the third step on."""
    trace, _ = probed
    for update, expected in zip(trace.backward, recomputed):
        for net in NETS:
            assert_gradients_match(update["grads"][net], expected["grads"][net], f"step {update['step']}: {net}")
        target = {name: grad for name, grad in update["grads"]["rnd_model"].items() if name.startswith("target.")}
        assert_no_gradient(target, f"step {update['step']}: the fixed target network")


def test_every_loss_is_ppo_with_two_value_heads_plus_the_predictors_loss_on_its_share_of_the_minibatch(
    probed, recomputed
):
    trace, _ = probed
    assert len(trace.backward) == ITERATIONS * 2
    for update, expected in zip(trace.backward, recomputed):
        for name in ("ext_v_loss", "int_v_loss", "fwd_loss"):
            assert update[name].item() == pytest.approx(expected[name], rel=1e-4, abs=1e-7), name
        assert update["loss"].item() == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6), update["step"]
        assert len(update["mask"]) == len(update["mb_inds"])
    # the predictor trains on a random --update-proportion (0.25) of each minibatch
    assert 0.17 < torch.cat([update["mask"] for update in trace.backward]).mean().item() < 0.33


def test_the_probed_run_writes_finite_scalars_and_evaluates_saved_model(probed):
    trace, cwd = probed
    assert "mean intrinsic reward" in trace.stdout
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), KEYS + ["eval/episodic_return"])
    model = torch.load(run_dir / "ppo_rnd_envpool.cleanrl_model", weights_only=False)
    # 1 random-play rollout initialised the observation normaliser, then 3 rollouts of 2 x 64 frames each
    assert model["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 4 * 128)


# Last: the slowest (three runs), so that a planted bug the loop's tests catch fails fast.
def test_sigkill_then_resume_restores_the_normalisers_and_continues_the_curve(tmp_path):
    flags = [*TINY, "--total-timesteps", "256", "--checkpoint-every", "128"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("ppo_rnd_envpool.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    (straight_dir,) = run_dirs(tmp_path / "straight")
    straight_scalars = read_scalars(straight_dir)
    final = torch.load(straight_dir / "checkpoint.pt", weights_only=False)  # the last one: at step 256
    # 2 random-play rollouts initialise the normaliser, then 4 rollouts of 2 x 32 frames each
    assert final["global_step"] == 256 and final["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 6 * 64)
    assert final["rnd_model"]["obs_rms.mean"].abs().sum() > 0

    run_dir = kill_at_first_checkpoint("ppo_rnd_envpool.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 128 and checkpoint["envs"] is None
    assert checkpoint["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 4 * 64)
    assert checkpoint["reward_normalizer"]["rms.count"].item() == pytest.approx(1e-4 + 2 * 64)
    resumed = run_script(
        "ppo_rnd_envpool.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset" in resumed.stdout
    resumed_final = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    # the normalisers went on from the checkpoint (no second random-play initialisation)
    assert resumed_final["global_step"] == 256
    assert resumed_final["rnd_model"]["obs_rms.count"].item() == pytest.approx(1e-4 + 6 * 64)
    losses = read_scalars(run_dir)["losses/fwd_loss"]
    assert [step for step, _ in losses] == [64, 128, 192, 256]
    assert losses[:2] == straight_scalars["losses/fwd_loss"][:2]
