"""rainbow_atari.py: the sum tree, n-step returns, noisy layers, the dueling aggregation and the C51 projection
against plain references; the prioritized frame replay against the stream it was fed; SIGKILL + --resume exactness
(priorities included), bad input; the script's own loop under tests/probe.py (the smoke runs): the rows stored on
Breakout (lives), and every update rebuilt from the stream and the copied networks and noise (n-step returns, the
double-Q target, importance weights with the annealed beta, the priorities written back, the gradient against the
network written out in float64 with the target held constant and none reaching the target network), target-copy
timing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import rainbow_atari
import torch
import torch.nn.functional as F
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from scipy import stats
from update_reference import assert_gradients_match, gradients
from update_reference import leaves as float64_leaves  # `leaves` here: the replay's

MINATAR = ["--env-id", "MinAtar/Breakout-v1"]
# Eight envs and a gradient step every 8 vector steps; the losses are logged every 1000 steps, so runs go to 1000.
SMALL = [*MINATAR, "--num-envs", "8", "--buffer-size", "800", "--batch-size", "16", "--train-frequency", "64"]
SMALL += ["--target-network-frequency", "200", "--learning-starts", "200", "--gamma", "0.9"]
KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/beta",
    "losses/loss",
    "losses/q_values",
]


# Checkpoints at 504 and at the end (1000); the resume test kills a run after the first and compares the final ones.
RUN_FLAGS = [*SMALL, "--total-timesteps", "1000", "--checkpoint-every", "500"]


# What each update is computed from, copied at its backward() by tests/probe.py: the sampled batch, both networks with
# the noise they drew (non-persistent buffers, not in a state dict), the sum tree sampled from.
NETWORKS = [f"{net}.{stream}" for net in ("q_network", "target_network") for stream in ("value", "advantage")]
NOISE = [f"{name}.{layer}.{eps}" for name in NETWORKS for layer in (0, 2) for eps in ("eps_in", "eps_out")]
BATCH_NAMES = ["leaves", "weights", "obs_b", "next_obs_b", "actions_b", "returns_b", "discounts_b", "beta"]
BATCH_NAMES += ["q_network", "target_network", "rb.tree.nodes", "rb.max_priority", *NOISE]
STEP_NAMES = ["obs", "actions", "rewards", "terminations", "truncations", "infos"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One MinAtar run to the end under tests/probe.py (which only observes): the loop tests read what its loop saw
    and computed, the smoke test its logs, the resume test compares against it."""
    from probe import probe_script

    workdir = tmp_path_factory.mktemp("uninterrupted")
    flags = [*RUN_FLAGS, "--save-model", "--eval-episodes", "2", "--exp-name", "mine"]  # operational: resumes alike
    trace = probe_script(
        "rainbow_atari.py",
        flags,
        workdir,
        watch=STEP_NAMES,
        at_backward=BATCH_NAMES,
        grads=["q_network", "target_network"],
        final=["rb"],
    )
    (run_dir,) = run_dirs(workdir)
    return trace, run_dir


def test_minatar_smoke_writes_finite_scalars_and_evaluates_saved_model(uninterrupted):
    trace, run_dir = uninterrupted
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    assert scalars["charts/beta"] == [(1000, 1.0)]  # annealed from 0.4 to 1 at the end
    assert torch.load(run_dir / "mine.cleanrl_model", weights_only=False)["script"] == "rainbow_atari"
    assert "1,000/1,000 steps" in trace.stdout


def test_atari_smoke_runs_the_nature_cnn_and_stores_what_the_loop_saw(workdir):
    # 137 vector steps of 8 games (the Atari CNN on the CPU is slow), to the first log at step 1000, under
    # tests/probe.py: Breakout has lives, so the rows stored show how life losses are stored.
    from probe import probe_script

    flags = ["--num-envs", "8", "--train-frequency", "8", "--total-timesteps", "1096", "--learning-starts", "900"]
    flags += ["--buffer-size", "2000", "--batch-size", "4", "--checkpoint-every", "1000"]
    trace = probe_script("rainbow_atari.py", flags, workdir, watch=STEP_NAMES, final=["rb"])
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), ["charts/SPS", "charts/beta", "losses/loss", "losses/q_values"])
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["envs"] is None  # ALE cannot be saved: a resume starts fresh games
    assert checkpoint["replay_buffer"]["frames"].shape[1:] == (8, 1, 84, 84)  # one uint8 frame per row
    assert checkpoint["replay_buffer"]["frames"].dtype == torch.uint8
    # Row t of the buffer (250 rows per env: nothing overwritten) is loop step t, as the loop saw it.
    stream, rb = stream_of(trace), trace.final["rb"]
    assert rb["size"] == 137
    assert torch.equal(rb["frames"], stream["obs"][:, :, -1:])  # the newest frame of the observation acted on
    assert rb["actions"].tolist() == stream["actions"].tolist()
    assert rb["rewards"].tolist() == stream["rewards"].tolist()  # clipped to their sign
    assert rb["terminations"].tolist() == stream["ends"].tolist()  # game overs and lost lives
    assert rb["valid"].tolist() == (~stream["resets"]).tolist()  # an autoreset step is no transition
    lives_lost = sum(int(entry["infos"]["life_loss"].sum()) for entry in trace.steps if "infos" in entry)
    assert lives_lost >= 4 and stream["rewards"].any(), lives_lost


# --- the sum tree --------------------------------------------------------------------------------------------------


def random_priorities(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    priorities = torch.rand(n, generator=generator, dtype=torch.float64) ** 3  # spread over three decades
    priorities[torch.rand(n, generator=generator) < 0.2] = 0  # never drawn
    return priorities


def test_sum_tree_draws_leaves_in_proportion_to_their_priorities():
    capacity = 300  # not a power of two: the padding leaves hold 0
    priorities = random_priorities(capacity, seed=0)
    tree = rainbow_atari.SumTree(capacity, "cpu")
    tree.update(torch.arange(capacity), priorities)
    torch.manual_seed(0)
    draws = []
    for _ in range(400):
        leaves, probs = tree.sample(128)
        torch.testing.assert_close(probs, priorities[leaves] / priorities.sum())
        draws.append(leaves)
    counts = np.bincount(torch.cat(draws).numpy(), minlength=capacity)
    assert counts.sum() == 400 * 128 and len(counts) == capacity
    positive = priorities.numpy() > 0
    assert counts[~positive].sum() == 0  # a leaf of priority 0 is never drawn
    expected = counts.sum() * priorities.numpy()[positive] / priorities.sum().item()
    assert stats.chisquare(counts[positive], expected).pvalue > 1e-3
    # The test has power: the same counts are far from uniform draws over the positive leaves.
    uniform = np.full(positive.sum(), counts.sum() / positive.sum())
    assert stats.chisquare(counts[positive], uniform).pvalue < 1e-12


def test_sum_tree_updates_keep_every_node_the_sum_of_its_children_and_find_matches_a_cumulative_search():
    capacity = 100
    tree = rainbow_atari.SumTree(capacity, "cpu")
    generator = torch.Generator().manual_seed(1)
    reference = np.zeros(capacity)
    for _ in range(50):
        leaves = torch.randperm(capacity, generator=generator)[:7]
        values = torch.rand(7, generator=generator, dtype=torch.float64)
        leaves = torch.cat([leaves, leaves[:2]])  # a leaf repeated with an equal value, as a batch can draw twice
        values = torch.cat([values, values[:2]])
        tree.update(leaves, values)
        for leaf, value in zip(leaves.tolist(), values.tolist()):
            reference[leaf] = value
    nodes = tree.nodes.numpy()
    np.testing.assert_array_equal(nodes[tree.leaves : tree.leaves + capacity], reference)
    assert (nodes[tree.leaves + capacity :] == 0).all()
    for node in range(1, tree.leaves):
        assert nodes[node] == nodes[2 * node] + nodes[2 * node + 1]
    assert tree.total().item() == pytest.approx(math.fsum(reference), rel=1e-14)
    # The descent finds the first leaf whose cumulative priority exceeds the mass.
    masses = torch.rand(2000, generator=generator, dtype=torch.float64) * tree.total()
    expected = np.searchsorted(np.cumsum(reference), masses.numpy(), side="right")
    np.testing.assert_array_equal(tree.find(masses).numpy(), expected)


def test_sum_tree_over_a_million_leaves_stays_exact_and_never_finds_a_leaf_of_priority_0():
    capacity = 1_000_000
    priorities = random_priorities(capacity, seed=2)
    priorities[:10] = 0
    priorities[-1000:] = 0  # the last leaves empty: a mass at the very total must not land there
    tree = rainbow_atari.SumTree(capacity, "cpu")
    tree.update(torch.arange(capacity), priorities)
    assert abs(tree.total().item() - math.fsum(priorities.tolist())) < 1e-9 * tree.total().item()
    total = tree.total()
    masses = torch.stack([total * 0, total * (1 - 1e-16), total, torch.nextafter(total, total * 2)])
    leaves = tree.find(masses)
    assert (priorities[leaves] > 0).all(), leaves  # rounding at the top end never walks into the empty leaves
    assert leaves[0] == int(priorities.nonzero().min())
    # One leaf changed: the root follows exactly (its ancestors are recomputed, not incremented).
    tree.update(torch.tensor([500_000]), torch.tensor([123.0], dtype=torch.float64))
    priorities[500_000] = 123.0
    assert abs(tree.total().item() - math.fsum(priorities.tolist())) < 1e-9 * tree.total().item()


@pytest.mark.parametrize("beta", [0.0, 0.4, 0.7, 1.0])
def test_importance_weights_match_the_definition(beta):
    priorities = random_priorities(50, seed=3) + 0.01
    probs = priorities / priorities.sum()
    sampled = torch.tensor([0, 3, 3, 7, 10, 49, 20])
    n = len(priorities)
    plain = [(n * probs[i].item()) ** -beta for i in sampled.tolist()]
    expected = [w / max(plain) for w in plain]
    got = rainbow_atari.importance_weights(probs[sampled], beta)
    assert got.dtype == torch.float32 and got.max() == 1.0
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


def test_beta_is_annealed_from_beta0_to_1_over_the_run():
    assert rainbow_atari.beta_schedule(0.4, 1000, 0) == 0.4
    assert rainbow_atari.beta_schedule(0.4, 1000, 500) == pytest.approx(0.7)
    assert rainbow_atari.beta_schedule(0.4, 1000, 1000) == 1.0
    assert rainbow_atari.beta_schedule(0.4, 1000, 1004) == 1.0


# --- n-step returns ------------------------------------------------------------------------------------------------


def reference_n_step(rewards, terminations, valid, gamma):
    """One window at a time: (return, offset of the bootstrap row, its discount)."""
    n = len(rewards)
    g = 0.0
    for i in range(n):
        if i > 0 and not valid[i]:
            return g, i, gamma**i  # row t+i holds the true final observation of a truncated game
        g += gamma**i * rewards[i]
        if terminations[i]:
            return g, n, 0.0
    return g, n, gamma**n


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_returns_cut_at_terminations_and_bootstrap_at_truncations_like_a_python_loop(n):
    generator = torch.Generator().manual_seed(n)
    batch, gamma = 2000, 0.9
    rewards = torch.randint(-1, 2, (batch, n), generator=generator).float()
    terminations = torch.rand(batch, n, generator=generator) < 0.2
    valid = torch.rand(batch, n, generator=generator) > 0.2
    valid[:, 0] = True  # a sampled row is always a transition
    got_returns, got_offsets, got_discounts = rainbow_atari.n_step_returns(rewards, terminations, valid, gamma)
    for b in range(batch):
        g, offset, discount = reference_n_step(rewards[b].tolist(), terminations[b].tolist(), valid[b].tolist(), gamma)
        assert got_returns[b].item() == pytest.approx(g, abs=1e-6)
        assert got_discounts[b].item() == pytest.approx(discount, abs=1e-7)
        if discount > 0:
            assert got_offsets[b].item() == offset
    # The cases all occurred: a cut, a bootstrap before a truncation's final observation, a full window.
    if n > 1:
        assert (got_discounts == 0).any() and (got_discounts == gamma**n).any()
        assert ((got_discounts > 0) & (got_offsets < n)).any()


# --- the frame-indexed prioritized replay --------------------------------------------------------------------------


def play_stream(rb, num_envs: int, length: int, stack: int, frame_shape: tuple, seed: int) -> dict:
    """Feed `rb` `length` steps of a fake pixel env that behaves like cleanrl_utils.envs.atari's: observations are
    the last `stack` frames of the current game (zeros before its first), NEXT_STEP autoreset (the step after a game's
    end ignores its action and returns the next game's first observation), games ended by termination or truncation,
    lives lost in between. Returns the stream as the env produced it, per time step and env."""
    rng = np.random.default_rng(seed)
    games = [[rng.integers(1, 256, frame_shape, dtype=np.uint8)] for _ in range(num_envs)]

    def observation(e):
        frames = games[e][-stack:]
        padding = [np.zeros(frame_shape, np.uint8)] * (stack - len(frames))
        return np.concatenate(padding + frames)

    stream = {key: [] for key in ("obs", "actions", "rewards", "learn_terminations", "truncations", "autoreset")}
    resets = np.zeros(num_envs, dtype=bool)
    for _ in range(length):
        obs = np.stack([observation(e) for e in range(num_envs)])
        actions = rng.integers(0, 4, num_envs)
        rewards = rng.choice([0.0, 0.0, 1.0, 4.0, -2.0], num_envs)
        terminations = rng.random(num_envs) < 0.05
        truncations = ~terminations & (rng.random(num_envs) < 0.05)
        life_loss = rng.random(num_envs) < 0.1
        for e in range(num_envs):
            if resets[e]:  # autoreset: a new game, its first frame
                games[e] = [rng.integers(1, 256, frame_shape, dtype=np.uint8)]
                rewards[e], terminations[e], truncations[e], life_loss[e] = 0, False, False, False
            else:
                games[e].append(rng.integers(1, 256, frame_shape, dtype=np.uint8))
        learn_terminations = terminations | life_loss
        rb.add(torch.from_numpy(obs), actions, np.sign(rewards), learn_terminations, resets)
        for key, value in zip(stream, (obs, actions, np.sign(rewards), learn_terminations, truncations, resets)):
            stream[key].append(value.copy())
        resets = terminations | truncations
    return {key: np.stack(values) for key, values in stream.items()}


def reference_transition(stream: dict, t: int, e: int, n: int, gamma: float):
    """The n-step transition from step t of env e in the env's own terms: (return, discount, bootstrap obs)."""
    g = 0.0
    for i in range(n):
        g += gamma**i * stream["rewards"][t + i, e]
        if stream["learn_terminations"][t + i, e]:
            return g, 0.0, None
        if stream["truncations"][t + i, e]:  # the next acted-on observation is the game's true final one
            return g, gamma ** (i + 1), stream["obs"][t + i + 1, e]
    return g, gamma**n, stream["obs"][t + n, e]


@pytest.mark.parametrize("stack, frame_channels", [(4, 1), (1, 3)])  # Atari frames; MinAtar grids
def test_replay_returns_the_observations_seen_and_their_n_step_targets_across_games_and_wraps(stack, frame_channels):
    num_envs, steps, length, n, gamma = 3, 40, 150, 3, 0.9  # the stream wraps the buffer more than three times
    frame_shape = (frame_channels, 3, 3)
    obs_shape = (stack * frame_channels, 3, 3)
    rb = rainbow_atari.PrioritizedFrameReplay(steps * num_envs, num_envs, obs_shape, stack, n, gamma, 0.5, "cpu")
    stream = play_stream(rb, num_envs, length, stack, frame_shape, seed=stack)
    assert (
        stream["autoreset"].sum() > 10
        and stream["truncations"].sum() > 5
        and (stack == 1 or (stream["obs"] == 0).any())
    )
    # Row r holds the latest step t with t % steps == r. It can be drawn iff it is a transition, its n-step window
    # is complete, and the frames of its stack were not overwritten.
    priorities = rb.tree.nodes[rb.tree.leaves : rb.tree.leaves + steps * num_envs].view(steps, num_envs)
    drawable = []
    for row in range(steps):
        t = length - 1 - (length - 1 - row) % steps
        for e in range(num_envs):
            expected = not stream["autoreset"][t, e] and t + n <= length - 1 and t - stack + 1 >= length - steps
            assert (priorities[row, e] > 0) == expected, (row, e, t)
            if expected:
                assert priorities[row, e] == 1.0  # the initial max priority, to the power alpha
                drawable.append((row, e, t))
    assert len(drawable) > steps  # most rows
    leaves = torch.tensor([row * num_envs + e for row, e, _ in drawable])
    obs, next_obs, actions, returns, discounts = rb.transitions(leaves)
    assert obs.dtype == torch.uint8 and obs.shape == (len(drawable), *obs_shape)
    for i, (row, e, t) in enumerate(drawable):
        np.testing.assert_array_equal(obs[i].numpy(), stream["obs"][t, e])  # zeros before a game's first frame too
        assert actions[i] == stream["actions"][t, e]
        g, discount, bootstrap_obs = reference_transition(stream, t, e, n, gamma)
        assert returns[i].item() == pytest.approx(g, abs=1e-6) and discounts[i].item() == pytest.approx(discount)
        if bootstrap_obs is not None:
            np.testing.assert_array_equal(next_obs[i].numpy(), bootstrap_obs)
    # Sampling draws only these rows, and new priorities raise the maximum that new rows get.
    drawn = rb.sample(256, beta=0.4)[-2]
    assert set(drawn.tolist()) <= set(leaves.tolist())
    rb.update_priorities(leaves[:4], torch.tensor([9.0, 4.0, 4.0, 1.0]))
    assert rb.max_priority.item() == 9.0 and rb.tree.nodes[rb.tree.leaves + leaves[0]].item() == 3.0  # 9 ** 0.5
    rb.add(*[torch.from_numpy(stream["obs"][-1])] + [np.zeros(num_envs)] * 3 + [np.zeros(num_envs, dtype=bool)])
    newest_complete = rb.leaves(torch.tensor([(length - n) % steps]))[0]
    assert (rb.tree.nodes[rb.tree.leaves + newest_complete][~rb.valid[(length - n) % steps]] == 0).all()
    assert (rb.tree.nodes[rb.tree.leaves + newest_complete][rb.valid[(length - n) % steps]] == 3.0).all()


def test_new_games_after_a_resume_make_the_last_row_a_bootstrap_and_never_a_sample():
    steps, n, gamma = 30, 3, 0.9
    rb = rainbow_atari.PrioritizedFrameReplay(steps, 1, (4, 2, 2), 4, n, gamma, 0.5, "cpu")
    stream = play_stream(rb, 1, 12, 4, (1, 2, 2), seed=13)
    # Rows 10 and 11 are transitions, 10 neither terminated nor rewarded 0; a game started before them.
    assert not stream["autoreset"][10:12, 0].any() and not stream["learn_terminations"][10, 0]
    assert stream["rewards"][10, 0] == 1 and stream["autoreset"].any()
    rb.new_games()  # a resumed Atari run: fresh games, the step after row 11 was never seen
    zeros = np.zeros(1)
    for _ in range(n):
        rb.add(torch.full((1, 4, 2, 2), 7, dtype=torch.uint8), zeros, zeros + 1, zeros.astype(bool), zeros.astype(bool))
    priorities = rb.tree.nodes[rb.tree.leaves : rb.tree.leaves + steps]
    assert priorities[11] == 0 and priorities[12] == 0  # no next observation; incomplete window
    assert rb.first[12] and (rb.stacked(torch.tensor([12]), torch.tensor([0]))[0, :3] == 0).all()
    # Row 10's window stops before row 11 and bootstraps from it (its observation is the one the policy saw).
    _, next_obs, _, returns, discounts = rb.transitions(torch.tensor([10]))
    assert discounts.item() == pytest.approx(gamma) and returns.item() == 1.0
    np.testing.assert_array_equal(next_obs[0].numpy(), stream["obs"][11, 0])


# --- networks ------------------------------------------------------------------------------------------------------


def test_scaled_noise_is_sign_times_square_root_of_standard_normals():
    torch.manual_seed(0)
    got = rainbow_atari.scaled_noise(1000, torch.device("cpu"))
    torch.manual_seed(0)
    x = torch.randn(1000)
    torch.testing.assert_close(got, torch.sign(x) * torch.sqrt(torch.abs(x)))


def test_noisy_layer_noise_is_an_outer_product_with_the_papers_statistics_and_initialisation():
    torch.manual_seed(0)
    n_in, n_out, sigma0 = 6, 5, 0.5
    layer = rainbow_atari.NoisyLinear(n_in, n_out, sigma0)
    assert (layer.weight_mu.abs() <= 1 / math.sqrt(n_in)).all() and (layer.bias_mu.abs() <= 1 / math.sqrt(n_in)).all()
    assert (layer.weight_sigma == sigma0 / math.sqrt(n_in)).all() and (
        layer.bias_sigma == sigma0 / math.sqrt(n_in)
    ).all()
    assert set(layer.state_dict()) == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}  # noise is not saved
    with torch.no_grad():  # mu 0, sigma 1: the layer's output is its noise
        layer.weight_mu.zero_(), layer.bias_mu.zero_(), layer.weight_sigma.fill_(1), layer.bias_sigma.fill_(1)
    with torch.no_grad():
        for _ in range(20):
            layer.reset_noise()
            bias = layer(torch.zeros(1, n_in))[0]
            weight = (layer(torch.eye(n_in)) - bias).T  # column j: the response to input j
            # One factor per output and one per input: eps_w = f(eps_out) f(eps_in)^T, eps_b = f(eps_out), rank 1.
            torch.testing.assert_close(weight, torch.outer(layer.eps_out, layer.eps_in))
            torch.testing.assert_close(bias, layer.eps_out)
            assert torch.linalg.matrix_rank(weight) == 1
    factors = []
    for _ in range(20000):
        layer.reset_noise()
        factors.append((layer.eps_out, layer.eps_in))
    bias = torch.stack([eps_out for eps_out, _ in factors])
    weight = bias.unsqueeze(2) * torch.stack([eps_in for _, eps_in in factors]).unsqueeze(1)
    # f(x) = sign(x) sqrt(|x|) of a standard normal: mean 0, variance E|x| = sqrt(2 / pi); a product of two: 2 / pi.
    assert weight.mean(0).abs().max() < 0.03 and bias.mean(0).abs().max() < 0.03
    np.testing.assert_allclose(bias.var(0).numpy(), math.sqrt(2 / math.pi), rtol=0.05)
    np.testing.assert_allclose(weight.var(0).numpy(), 2 / math.pi, rtol=0.05)
    # Entries sharing an output factor are uncorrelated yet dependent: their squares are correlated.
    first_row = weight[:, 0, :]
    assert abs(np.corrcoef(first_row[:, 0], first_row[:, 1])[0, 1]) < 0.03
    assert np.corrcoef(first_row[:, 0] ** 2, first_row[:, 1] ** 2)[0, 1] > 0.1


def test_select_actions_draws_fresh_noise_every_step_and_is_greedy_on_the_noisy_means():
    torch.manual_seed(0)
    net = rainbow_atari.RainbowNetwork((1, 10, 10), 3, 1.0, n_atoms=11, v_min=-5, v_max=5, sigma0=0.5)
    obs = torch.randint(0, 2, (64, 1, 10, 10), dtype=torch.uint8)
    actions = rainbow_atari.select_actions(net, obs)
    eps_in = net.value[0].eps_in.clone()
    with torch.no_grad():
        np.testing.assert_array_equal(actions, net.q_values(obs).argmax(dim=1).numpy())
    actions_again = rainbow_atari.select_actions(net, obs)
    assert not torch.equal(eps_in, net.value[0].eps_in)
    assert (actions != actions_again).any()  # the noise explores: no epsilon-greedy
    log_probs = net(obs)
    assert log_probs.shape == (64, 3, 11)
    torch.testing.assert_close(log_probs.exp().sum(dim=2), torch.ones(64, 3))


def test_dueling_aggregation_subtracts_the_mean_advantage_per_atom():
    generator = torch.Generator().manual_seed(0)
    value = torch.randn(8, 1, 5, generator=generator)
    advantage = torch.randn(8, 4, 5, generator=generator)
    got = rainbow_atari.dueling(value, advantage)
    for b in range(8):
        for a in range(4):
            for z in range(5):
                mean = sum(advantage[b, k, z].item() for k in range(4)) / 4
                expected = value[b, 0, z].item() + advantage[b, a, z].item() - mean
                assert got[b, a, z].item() == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(got.mean(dim=1, keepdim=True), value)  # identifiable: the mean is V
    # A constant added to every advantage changes nothing.
    torch.testing.assert_close(rainbow_atari.dueling(value, advantage + 3.0), got)


# --- the C51 projection with n-step discounts ----------------------------------------------------------------------


def reference_projection(next_probs, returns, discounts, support):
    """The C51 projection (Bellemare et al. 2017, Algorithm 1) of G + discount * z, one atom at a time."""
    n_atoms = len(support)
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    projected = np.zeros((len(returns), n_atoms))
    for i in range(len(returns)):
        for j in range(n_atoms):
            tz = min(max(returns[i] + discounts[i] * support[j], v_min), v_max)
            b = (tz - v_min) / delta_z
            lower, upper = int(np.floor(b)), int(np.ceil(b))
            if lower == upper:
                projected[i, lower] += next_probs[i, j]
            else:
                projected[i, lower] += next_probs[i, j] * (upper - b)
                projected[i, upper] += next_probs[i, j] * (b - lower)
    return projected


def test_projection_with_n_step_discounts_matches_a_plain_loop():
    generator = torch.Generator().manual_seed(0)
    batch, n_atoms, gamma, n = 256, 51, 0.99, 3
    support = torch.linspace(-10, 10, n_atoms, dtype=torch.float64)
    next_probs = torch.softmax(3 * torch.randn(batch, n_atoms, generator=generator, dtype=torch.float64), dim=1)
    # 3-step returns of clipped rewards (some beyond the support once discounted sums grow), some on atoms exactly.
    returns = torch.cat(
        [
            24 * torch.rand(batch // 2, generator=generator, dtype=torch.float64) - 12,
            torch.randint(-3, 4, (batch // 2,), generator=generator).double() * 0.4,
        ]
    )
    terminated = torch.rand(batch, generator=generator) < 0.3
    offsets = torch.randint(1, n + 1, (batch,), generator=generator)  # truncations bootstrap earlier
    discounts = torch.where(terminated, 0.0, gamma ** offsets.double())
    got = rainbow_atari.project_distribution(next_probs, returns, discounts, support)
    assert (got >= 0).all()
    torch.testing.assert_close(got.sum(dim=1), torch.ones(batch, dtype=torch.float64))
    expected = reference_projection(next_probs.numpy(), returns.numpy(), discounts.numpy(), support.numpy())
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    # By hand on [-2, -1, 0, 1, 2]: gamma^3 = 0.5 shifts the atoms to [-1, -0.5, 0, 0.5, 1] after G = 0; a terminated
    # transition puts all its mass at G = 0.25 (0.75 on atom 0, 0.25 on atom 1).
    support5 = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    probs = torch.tensor([[0.4, 0.2, 0.1, 0.2, 0.1], [0.4, 0.2, 0.1, 0.2, 0.1]])
    got = rainbow_atari.project_distribution(probs, torch.tensor([0.0, 0.25]), torch.tensor([0.5, 0.0]), support5)
    torch.testing.assert_close(got, torch.tensor([[0, 0.5, 0.3, 0.2, 0], [0, 0, 0.75, 0.25, 0]]))


# --- bad input -----------------------------------------------------------------------------------------------------


def test_an_oversized_buffer_is_refused_in_one_line_before_any_run_directory(workdir):
    # 10**12 Atari steps of one 84x84 uint8 frame each: ~7 million GB, refused before allocation.
    result = run_script("rainbow_atari.py", "--buffer-size", "1000000000000", cwd=workdir)
    assert_bad_input(result, workdir, "--buffer-size: the replay buffer needs 7", " GB", "lower --buffer-size")


@pytest.mark.parametrize(
    "fields, fragments",
    [
        (dict(env_id="HalfCheetah-v5"), ["continuous actions", "sac_continuous_action.py", "td3_continuous_action.py"]),
        (dict(env_id="CartPole-v1"), ["not an Atari or MinAtar game", "cleanrl/c51.py"]),
        (dict(env_id="MinAtar/Breakout-v9"), ["unknown environment id", "MinAtar/Breakout-v1"]),
        (dict(n_step=0), ["--n-step must be positive"]),
        (dict(v_min=5, v_max=5), ["--v-min must be below --v-max"]),
        (dict(n_atoms=1), ["--n-atoms must be at least 2"]),
        (dict(prioritized_replay_beta=1.5), ["--prioritized-replay-beta must be in [0, 1]"]),
        (dict(prioritized_replay_alpha=-1), ["must not be negative"]),
        (dict(noisy_sigma=0), ["--noisy-sigma must be positive"]),
        (dict(total_timesteps=5000), ["--learning-starts 80000 must be in [0, --total-timesteps 5000)"]),
        (dict(buffer_size=12, num_envs=2), ["--buffer-size 12 must hold at least 7 steps"]),
        (dict(learning_starts=5), ["--learning-starts must be at least 7"]),
    ],
)
def test_validate_refuses_bad_arguments_in_one_line(capsys, fields, fragments):
    # In-process (a subprocess per case costs seconds); the test above checks the command line end to end.
    with pytest.raises(SystemExit) as exit_info:
        rainbow_atari.validate(rainbow_atari.Args(**fields))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- checkpoints and resume ----------------------------------------------------------------------------------------


def test_sigkill_then_resume_reproduces_the_uninterrupted_run_priorities_included(tmp_path, uninterrupted):
    _, straight_run = uninterrupted
    run_dir = kill_at_first_checkpoint("rainbow_atari.py", RUN_FLAGS, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 504 and checkpoint["envs"] is not None  # MinAtar games are saved
    priorities = checkpoint["replay_buffer"]["priorities"]
    assert len(priorities.unique()) > 20 and checkpoint["replay_buffer"]["max_priority"] > 1  # learned priorities

    resumed = run_script("rainbow_atari.py", *RUN_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path) == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in ("charts/episodic_return", "charts/episodic_length", "losses/loss", "losses/q_values", "charts/beta"):
        assert resumed_scalars[key] == straight_scalars[key], key
    # The final checkpoints agree exactly: networks, optimiser, the replay buffer and every priority of its tree.
    final, straight_final = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (run_dir, straight_run))
    assert final["global_step"] == straight_final["global_step"] == 1000
    for name, tensor in straight_final["replay_buffer"].items():
        assert torch.equal(torch.as_tensor(final["replay_buffer"][name]), torch.as_tensor(tensor)), name
    for network in ("q_network", "target_network"):
        for key, tensor in straight_final[network].items():
            assert torch.equal(final[network][key], tensor), (network, key)
    for param, state in straight_final["optimizer"]["state"].items():
        for key, tensor in state.items():
            assert torch.equal(final["optimizer"]["state"][param][key], tensor), (param, key)


# --- the loop's own wiring -----------------------------------------------------------------------------------------
# The MinAtar run above ran under tests/probe.py: every update is rebuilt from what its loop saw (the stream of steps)
# and the copies taken at its backward(): the rows drawn against the stream, their n-step returns by a plain walk, the
# double-Q target (the online network picks the next action, the target network gives its distribution) projected
# one atom at a time, importance weights from the sum tree with the annealed beta, the priorities written back.
ROWS, ENVS, N_STEP, GAMMA = 100, 8, 3, 0.9


def stream_of(trace) -> dict:
    """What the loop saw at each step t (the watched entry is taken as the step is counted, after envs.step): the
    observation acted on, the actions, rewards clipped to their sign, training-episode ends (game overs and lost
    lives) and whether the step was an autoreset (the env's previous step ended a game: NEXT_STEP)."""
    entries = [entry for entry in trace.steps if entry["step"] > 0]
    num_envs = len(entries[0]["actions"])
    no_lives = np.zeros(num_envs, dtype=bool)
    terminations = np.stack([entry["terminations"] for entry in entries])
    game_ends = terminations | np.stack([entry["truncations"] for entry in entries])
    return dict(
        obs=torch.stack([entry["obs"] for entry in entries]),
        actions=np.stack([entry["actions"] for entry in entries]),
        rewards=np.sign(np.stack([entry["rewards"] for entry in entries])),
        ends=terminations | np.stack([entry["infos"].get("life_loss", no_lives) for entry in entries]),
        resets=np.concatenate([np.zeros((1, num_envs), dtype=bool), game_ends[:-1]]),
    )


def reference_loop_n_step(stream: dict, t: int, e: int):
    """The n-step transition from step t of env e, walked plainly: (return, discount, bootstrap observation)."""
    g = 0.0
    for i in range(N_STEP):
        if i > 0 and stream["resets"][t + i, e]:  # step t + i acted on the true final observation of a cut game
            return g, GAMMA**i, stream["obs"][t + i, e]
        g += GAMMA**i * stream["rewards"][t + i, e]
        if stream["ends"][t + i, e]:
            return g, 0.0, None
    return g, GAMMA**N_STEP, stream["obs"][t + N_STEP, e]


def network_as_at(update: dict, name: str) -> rainbow_atari.RainbowNetwork:
    """`name` ("q_network" or "target_network") with the weights and the noise it had at this update."""
    network = rainbow_atari.RainbowNetwork((4, 10, 10), 3, 1.0, n_atoms=51, v_min=-10, v_max=10, sigma0=0.5)
    network.load_state_dict(update[name])
    for stream in ("value", "advantage"):
        for layer in (0, 2):
            for eps in ("eps_in", "eps_out"):
                setattr(getattr(network, stream)[layer], eps, update[f"{name}.{stream}.{layer}.{eps}"])
    return network


def noisy_linear(x: torch.Tensor, params: dict, layer: str, eps_in: torch.Tensor, eps_out: torch.Tensor):
    """A factorised noisy layer written out: (mu_w + sigma_w * eps_out eps_in^T) x + mu_b + sigma_b * eps_out."""
    weight = params[f"{layer}.weight_mu"] + params[f"{layer}.weight_sigma"] * torch.outer(eps_out, eps_in)
    bias = params[f"{layer}.bias_mu"] + params[f"{layer}.bias_sigma"] * eps_out
    return x @ weight.T + bias


def reference_log_probs(params: dict, update: dict, name: str, obs: torch.Tensor) -> torch.Tensor:
    """The MinAtar Rainbow network written out from its state dict (`params`, float64) and the noise `name` drew at
    this update: convolution, two noisy streams, dueling per atom, log-softmax over the atoms, [batch, actions,
    atoms]."""
    h = torch.relu(F.conv2d(obs.double(), params["torso.0.weight"], params["torso.0.bias"])).flatten(1)
    streams = {}
    for stream in ("value", "advantage"):
        noise = [(update[f"{name}.{stream}.{i}.eps_in"].double(), update[f"{name}.{stream}.{i}.eps_out"].double())
                 for i in (0, 2)]  # fmt: skip
        hidden = torch.relu(noisy_linear(h, params, f"{stream}.0", *noise[0]))
        streams[stream] = noisy_linear(hidden, params, f"{stream}.2", *noise[1])
    value, advantage = streams["value"].view(-1, 1, 51), streams["advantage"].view(-1, 3, 51)
    return torch.log_softmax(value + advantage - advantage.mean(dim=1, keepdim=True), dim=2)


def test_each_update_is_the_double_q_n_step_c51_loss_weighted_by_importance_and_writes_priorities_back(uninterrupted):
    trace, _ = uninterrupted
    stream, updates = stream_of(trace), trace.backward
    assert len(updates) == (1000 - 200) // 64
    support = torch.linspace(-10, 10, 51)
    checked = dict(cut=0, priorities=0, online_argmax_differs=0)
    previous = None
    for update in updates:
        newest = update["step"] // ENVS - 1  # the loop step of the newest row
        leaves = update["leaves"]
        rows, envs = (leaves // ENVS).numpy(), (leaves % ENVS).numpy()
        steps = newest - (newest - rows) % ROWS  # the loop step each drawn row holds
        # Priorities: drawn in proportion to the tree's leaves; weights (N P(i))^-beta over their maximum, beta
        # annealed from 0.4 to 1 over the run.
        priorities = update["rb.tree.nodes"][-1024:][: ROWS * ENVS]
        beta = min(1.0, 0.4 + 0.6 * update["step"] / 1000)
        assert update["beta"] == pytest.approx(beta)
        probs = priorities[leaves] / priorities.sum()
        weights = (len(priorities) * probs) ** -beta
        torch.testing.assert_close(update["weights"], (weights / weights.max()).float())
        # The rows drawn, against the stream: observations, actions, n-step returns, discounts, bootstrap observations.
        next_obs = update["next_obs_b"].clone()
        for i, (t, e) in enumerate(zip(steps, envs)):
            assert t + N_STEP <= newest, "a row is drawn only once its n-step window is complete"
            assert (
                torch.equal(update["obs_b"][i], stream["obs"][t, e])
                and update["actions_b"][i] == stream["actions"][t, e]
            )
            g, discount, bootstrap = reference_loop_n_step(stream, t, e)
            assert update["returns_b"][i].item() == pytest.approx(g, abs=1e-6)
            assert update["discounts_b"][i].item() == pytest.approx(discount, rel=1e-6)
            if bootstrap is not None:
                assert torch.equal(update["next_obs_b"][i], bootstrap)
                next_obs[i] = bootstrap
            checked["cut"] += discount == 0
        # The loss, from the copied networks and their noise.
        q_network, target_network = network_as_at(update, "q_network"), network_as_at(update, "target_network")
        returns, discounts = update["returns_b"].double().numpy(), update["discounts_b"].double().numpy()
        batch = torch.arange(len(leaves))
        with torch.no_grad():
            next_actions = q_network.q_values(next_obs).argmax(dim=1)  # double Q: the online network chooses
            next_probs = target_network(next_obs)[batch, next_actions].exp()  # the target network values
            target = reference_projection(next_probs.double().numpy(), returns, discounts, support.double().numpy())
            log_probs = q_network(update["obs_b"])[batch, update["actions_b"]]
        cross_entropy = -(torch.as_tensor(target).float() * log_probs).sum(dim=1)
        expected_weights = (weights / weights.max()).float()
        # Its gradient, in float64 from the network written out: the target distribution (double Q, projected) a
        # constant, the importance weights constants; no gradient reaches the target network.
        where = f"update at step {update['step']}"
        params = float64_leaves(update["q_network"], only=lambda name: name != "support")
        with torch.no_grad():
            targets = float64_leaves(update["target_network"], only=lambda name: False)
            online_q = (reference_log_probs(params, update, "q_network", next_obs).exp() * support).sum(dim=2)
            assert torch.equal(online_q.argmax(dim=1), next_actions), where
            next_probs64 = reference_log_probs(targets, update, "target_network", next_obs)[batch, next_actions].exp()
            target64 = reference_projection(next_probs64.numpy(), returns, discounts, support.double().numpy())
        log_probs64 = reference_log_probs(params, update, "q_network", update["obs_b"])[batch, update["actions_b"]]
        loss64 = ((weights / weights.max()).double() * -(torch.as_tensor(target64) * log_probs64).sum(dim=1)).mean()
        assert_gradients_match(update["grads"]["q_network"], gradients(loss64, params), where)
        assert all(grad is None for grad in update["grads"]["target_network"].values()), f"{where}: target gradient"
        assert update["loss"].item() == pytest.approx((expected_weights * cross_entropy).mean().item(), rel=1e-4)
        checked["online_argmax_differs"] += int((next_actions != target_network.q_values(next_obs).argmax(1)).sum())
        # The previous update's priorities, |cross-entropy| + eps to the power alpha 0.5, are in the tree this one
        # sampled from, except on the rows the steps between rewrote (the newest rows and those whose window closed).
        if previous is not None:
            rewritten = {u % ROWS for u in range(previous["newest"] + 1, newest + 1)}
            rewritten |= {(u - N_STEP) % ROWS for u in range(previous["newest"] + 1, newest + 1)}
            for leaf, value in zip(previous["leaves"].tolist(), previous["cross_entropy"].tolist()):
                if leaf // ENVS not in rewritten:
                    assert priorities[leaf].item() == pytest.approx((value + 1e-6) ** 0.5, rel=1e-4)
                    checked["priorities"] += 1
            largest = max(previous["max_priority"], max(previous["cross_entropy"].tolist()) + 1e-6)
            assert update["rb.max_priority"].item() == pytest.approx(largest, rel=1e-4)
        previous = dict(leaves=leaves, cross_entropy=cross_entropy, newest=newest)
        previous["max_priority"] = update["rb.max_priority"].item()
    assert checked["cut"] >= 10 and checked["priorities"] >= 50 and checked["online_argmax_differs"] >= 5, checked


def test_the_target_network_is_the_online_network_copied_every_target_network_frequency_steps(uninterrupted):
    trace, _ = uninterrupted
    updates = trace.backward
    copy_steps = [400, 600, 800]  # after learning starts (200), the multiples of 200 before the last update
    for k, update in enumerate(updates):
        # Copied (tau 1) at the end of the iteration whose step reached a multiple of 200, after its gradient steps:
        # the online weights that the next update found; before the first copy, the initial weights.
        copies = [c for c in copy_steps if c < update["step"]]
        expected = (
            next(u for u in updates if u["step"] > copies[-1])["q_network"] if copies else updates[0]["q_network"]
        )
        for name, tensor in update["target_network"].items():
            assert torch.equal(tensor, expected[name]), f"update {k} at step {update['step']}: {name}"
