"""d3qn.py: its own loop run under observation (replay rows against the env's stream; every update's n-step
transitions, double-Q target through a plain dueling network, importance weights and loss against plain references;
priorities written back and given to new rows; target-network copies; epsilon and beta); the sum tree, importance
weights, n-step returns, the dueling aggregation and the double-Q target against plain references; every update's
gradient against a float64 reference loss's, none reaching the target network; the replay buffer
against the stream it was fed (true final observations, windows cut at episode ends, priorities of new rows); smoke
runs (all on, and plain Double DQN), SIGKILL + --resume exactness (priorities included), bad input."""

from __future__ import annotations

import math

import d3qn
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from scipy import stats
from update_reference import assert_gradients_match, gradients, leaves

SMALL = [
    "--num-envs",
    "2",
    "--buffer-size",
    "500",
    "--batch-size",
    "32",
    "--train-frequency",
    "2",
    "--target-network-frequency",
    "50",
    "--learning-starts",
    "400",
]
KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/epsilon",
    "charts/beta",
    "losses/td_loss",
    "losses/q_values",
]
# Checkpoints at 800 and at the end (1600); the resume test kills a run after the first and compares the final ones.
RUN_FLAGS = [*SMALL, "--total-timesteps", "1600", "--checkpoint-every", "800", "--save-model", "--eval-episodes", "2"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One run to the end, dueling, prioritized and 3-step: the smoke test reads it, the resume test compares."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    result = run_script("d3qn.py", *RUN_FLAGS, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    return result, run_dir


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(uninterrupted):
    result, run_dir = uninterrupted
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2 and "evaluation over 2 episodes" in result.stdout
    model = torch.load(run_dir / "d3qn.cleanrl_model", weights_only=False)
    assert model["script"] == "d3qn" and model["dueling"] and "value.weight" in model["q_network"]
    assert [v for _, v in scalars["charts/beta"]][-1] == pytest.approx(1.0)  # annealed to 1 by the end


def test_plain_double_dqn_smoke(workdir):
    flags = [*SMALL, "--total-timesteps", "500", "--no-dueling", "--no-prioritized", "--n-step", "1"]
    result = run_script("d3qn.py", *flags, "--save-model", "--eval-episodes", "1", "--exp-name", "ddqn", cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), KEYS)
    model = torch.load(run_dir / "ddqn.cleanrl_model", weights_only=False)
    assert not model["dueling"] and not any(key.startswith("value.") for key in model["q_network"])


# --- the loop's own wiring -----------------------------------------------------------------------------------------
# d3qn.py runs unchanged under tests/probe.py on ProbeWalk-v0 (tests/probe_envs.py: 8-step episodes that terminate or
# are truncated, varied rewards, distinct observations), dueling, prioritized and 3-step. What its loop stored, drew
# and computed is compared with the env's stream and with plain references: each sampled row's n-step transition
# (reference_transition above), the dueling Q-values from the copied weights, the double-Q target, the importance
# weights from the tree's priorities, the loss, and the priorities written back.

N_STEP, GAMMA, ALPHA, BETA0, EPS = 3, 0.9, 0.6, 0.4, 1e-6
LOOP_FLAGS = ["--env-id", "ProbeWalk-v0", "--num-envs", "2", "--buffer-size", "360", "--batch-size", "16"]
LOOP_FLAGS += ["--learning-starts", "100", "--train-frequency", "4", "--target-network-frequency", "40"]
LOOP_FLAGS += ["--total-timesteps", "400", "--exploration-fraction", "0.5", "--end-e", "0.2", "--gamma", str(GAMMA)]
LOOP_FLAGS += ["--learning-rate", "1e-3", "--n-step", str(N_STEP)]
STEP_NAMES = ["obs_np", "actions", "next_obs_np", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "returns_b", "discounts_b", "leaves", "weights", "beta"]
BATCH_NAMES += ["q_network", "target_network", "rb"]
ROWS = 180  # rows per env: 360 // 2


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    names = dict(watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=["q_network", "target_network"], final=["rb"])
    return probe_script("d3qn.py", LOOP_FLAGS, cwd, **names, preload=["probe_envs"])


def env_streams(trace) -> tuple[list[dict], list[dict]]:
    """The loop's steps (taken as each is stored), and per env the lists reference_transition reads: obs, the true
    next observation (the true final one where an episode ended), action, reward, terminated, truncated."""
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    assert [entry["step"] for entry in steps] == list(range(2, 401, 2))
    streams = [dict(obs=[], next_obs=[], actions=[], rewards=[], terminations=[], truncations=[]) for _ in range(2)]
    for step in steps:
        true_next = step["next_obs_np"].copy()
        for env in np.flatnonzero(step["infos"].get("_final_obs", [])):
            true_next[env] = step["infos"]["final_obs"][env]
        for env, s in enumerate(streams):
            s["obs"].append(step["obs_np"][env])
            s["next_obs"].append(true_next[env])
            s["actions"].append(int(step["actions"][env]))
            s["rewards"].append(float(np.float32(step["rewards"][env])))
            s["terminations"].append(bool(step["terminations"][env]))
            s["truncations"].append(bool(step["truncations"][env]))
    return steps, streams


def dueling_q(state: dict, obs: torch.Tensor) -> torch.Tensor:
    """Q = V + A - mean_a A, computed from a dueling QNetwork's weights (two hidden ReLU layers, then the heads)."""
    h = F.relu(F.linear(obs, state["torso.0.weight"], state["torso.0.bias"]))
    h = F.relu(F.linear(h, state["torso.2.weight"], state["torso.2.bias"]))
    value = F.linear(h, state["value.weight"], state["value.bias"])
    advantage = F.linear(h, state["advantage.weight"], state["advantage.bias"])
    return value + advantage - advantage.mean(dim=1, keepdim=True)


def stored_step(row: int, stored: int) -> int:
    """The step whose transitions a buffer row holds once `stored` steps were written: the latest t < stored at it."""
    return row + ROWS * ((stored - 1 - row) // ROWS)


def test_the_replay_buffer_holds_each_step_with_its_true_next_observation_and_both_end_flags(loop):
    _, streams = env_streams(loop)
    rb = loop.final["rb"]
    assert (rb["size"], rb["pos"]) == (ROWS, 200 % ROWS)  # 200 steps into 180 rows: wrapped around
    ends = {"terminated": 0, "truncated": 0}
    for t in range(200 - ROWS, 200):
        for env, s in enumerate(streams):
            row = rb["data"][t % ROWS, env]
            assert row[:3].numpy().tobytes() == s["obs"][t].tobytes()
            assert row[3:6].numpy().tobytes() == s["next_obs"][t].tobytes(), f"step {t}, env {env}"  # never a reset
            assert row[6:].tolist() == [s["actions"][t], s["rewards"][t], s["terminations"][t], s["truncations"][t]]
            ends["terminated"] += s["terminations"][t]
            ends["truncated"] += s["truncations"][t] and not s["terminations"][t]
    assert min(ends.values()) >= 3, ends


def tree_leaves(rb: dict) -> torch.Tensor:
    """The sum tree's leaves from a copy of the buffer (its state_dict): priority ** alpha of row t of env e at leaf
    t * 2 + e. The tree's nodes: the root at 1, then each level, the leaves in the second half."""
    nodes = rb["priorities"]
    return nodes[len(nodes) // 2 : len(nodes) // 2 + 2 * ROWS]


def test_each_update_learns_from_n_step_transitions_with_double_q_dueling_targets_and_importance_weights(loop):
    _, streams = env_streams(loop)
    updates = loop.backward
    assert [u["step"] for u in updates] == list(range(104, 401, 4))  # one gradient step per 4 env steps after 100
    cut = {"terminated": 0, "truncated": 0}
    for update in updates:
        stored = update["step"] // 2
        assert update["beta"] == pytest.approx(min(1.0, BETA0 + (1 - BETA0) * update["step"] / 400))
        for i, leaf in enumerate(update["leaves"].tolist()):
            row, env = divmod(leaf, 2)
            t = stored_step(row, stored)
            assert t + N_STEP <= stored, "a sampled row's n-step window must be complete"
            obs, boot_obs, action, g, discount = reference_transition(streams[env], t, N_STEP, GAMMA)
            assert update["obs_b"][i].numpy().tobytes() == obs.tobytes()
            assert update["next_obs_b"][i].numpy().tobytes() == boot_obs.tobytes()
            assert update["actions_b"][i].item() == action
            assert update["returns_b"][i].item() == pytest.approx(g, rel=1e-5, abs=1e-6)
            assert update["discounts_b"][i].item() == pytest.approx(discount, rel=1e-6)
            window = [streams[env][key][t : t + N_STEP] for key in ("rewards", "terminations", "truncations")]
            if reference_n_step(*window, GAMMA)[1] < N_STEP:  # a window cut short by an episode's end
                cut["terminated" if discount == 0 else "truncated"] += 1
        # Importance weights from the tree the batch was drawn from: (N P(i))^-beta over their largest.
        priorities = tree_leaves(update["rb"])[update["leaves"]]
        probs = priorities / tree_leaves(update["rb"]).sum()
        complete = (update["rb"]["size"] - N_STEP + 1) * 2
        weights = (complete * probs) ** -update["beta"]
        weights = weights / weights.max()
        torch.testing.assert_close(update["weights"].double(), weights, rtol=1e-6, atol=0)
        # The loss in float64, weighted by those reference weights; the double-Q target a constant (the gradient
        # reaches the online network through Q(s, a) only). The bootstrap action picked in float32, as the script
        # picks it (a near-tie cannot go the other way).
        online, where = leaves(update["q_network"]), f"update at step {update['step']}"
        with torch.no_grad():
            next_actions = dueling_q(update["q_network"], update["next_obs_b"]).argmax(dim=1)  # the online network
            next_q = dueling_q(leaves(update["target_network"]), update["next_obs_b"].double())  # the target values
            target = (
                update["returns_b"].double() + update["discounts_b"].double() * next_q[torch.arange(16), next_actions]
            )
        q_taken = dueling_q(online, update["obs_b"].double())[torch.arange(16), update["actions_b"]]
        expected = (weights * (q_taken - target) ** 2).mean()
        # 5e-5, not the default 2e-5: the value head's bias gets the weighted mean TD error, a sum of terms of size ~2
        # that cancels to ~3e-3 (the update at step 308), where float32 rounding of the TD errors is 1.75e-5 of it;
        # every other tensor is within 2.1e-6.
        assert_gradients_match(update["grads"]["q_network"], gradients(expected, online), where, rtol=5e-5)
        for name, grad in update["grads"]["target_network"].items():
            assert grad is None or not grad.any(), f"{where}: {name} of the target network received a gradient"
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
    assert min(cut.values()) > 0, cut


def test_priorities_are_written_back_as_abs_td_plus_eps_and_new_rows_enter_at_the_largest_so_far(loop):
    updates = loop.backward
    largest = 1.0  # the largest priority so far, new rows' priority
    checked = 0
    for k, update in enumerate(updates):
        stored = update["step"] // 2
        leaves = tree_leaves(update["rb"]).view(ROWS, 2)
        # Rows whose window became complete since the previous draw enter at the largest priority so far; the
        # newest n - 1 steps' rows, still incomplete, at 0.
        previous = updates[k - 1]["step"] // 2 if k else 0
        for t in range(max(0, previous - N_STEP + 1), stored - N_STEP + 1):
            assert leaves[t % ROWS].tolist() == pytest.approx([largest**ALPHA] * 2), f"step {t}"
        for t in range(stored - N_STEP + 1, stored):
            assert leaves[t % ROWS].eq(0).all()
        assert update["rb"]["max_priority"].item() == pytest.approx(largest)
        # This update's priorities, found in the tree at the next draw (or at the end): (|TD error| + eps)^alpha,
        # except on rows that new steps overwrote meanwhile.
        with torch.no_grad():
            online, target = update["q_network"], update["target_network"]
            next_actions = dueling_q(online, update["next_obs_b"]).argmax(dim=1)
            next_q = dueling_q(target, update["next_obs_b"])[torch.arange(16), next_actions]
            q_taken = dueling_q(online, update["obs_b"])[torch.arange(16), update["actions_b"]]
            priorities = (q_taken - update["returns_b"] - update["discounts_b"] * next_q).abs() + EPS
        after = updates[k + 1] if k + 1 < len(updates) else {"rb": loop.final["rb"], "step": update["step"]}
        rewritten = {t % ROWS for t in range(stored - N_STEP + 1, after["step"] // 2)}
        written_back = tree_leaves(after["rb"])
        for leaf, priority in zip(update["leaves"].tolist(), priorities.double()):
            if leaf // 2 not in rewritten:
                # Compared as priorities: a small TD error is a difference of two float32 Q-values (abs 1e-6).
                assert written_back[leaf].item() ** (1 / ALPHA) == pytest.approx(priority.item(), rel=1e-5, abs=1e-6)
                checked += 1
        largest = max(largest, priorities.max().item())
    assert checked > 0.9 * 16 * len(updates)


def test_the_target_network_is_the_online_network_copied_every_target_network_frequency_steps(loop):
    updates = loop.backward
    initial = updates[0]["q_network"]
    copy_steps = [c for c in range(40, 401, 40) if c > 100]
    for k, update in enumerate(updates):
        # Copied at the end of the iteration whose step reached a multiple of 40 after learning started (after that
        # iteration's gradient step): the online weights that the next update found.
        copies = [c for c in copy_steps if c < update["step"]]
        expected = next(u for u in updates if u["step"] > copies[-1])["q_network"] if copies else initial
        for name, tensor in update["target_network"].items():
            assert torch.equal(tensor, expected[name]), f"update {k} at step {update['step']}: {name}"
    assert not torch.equal(updates[-1]["target_network"]["value.weight"], initial["value.weight"])


def test_epsilon_decays_linearly_over_the_exploration_fraction(loop):
    steps, _ = env_streams(loop)
    for step in steps:
        acted_at = step["step"] - 2  # epsilon is computed before the step is counted
        assert step["epsilon"] == pytest.approx(max(1 + (0.2 - 1) * acted_at / 200, 0.2))


# --- the sum tree and importance weights ---------------------------------------------------------------------------


def random_priorities(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    priorities = torch.rand(n, generator=generator, dtype=torch.float64) ** 3 * 10  # a wide spread
    priorities[torch.rand(n, generator=generator) < 0.2] = 0  # never drawn
    return priorities


def test_sum_tree_draws_leaves_in_proportion_to_their_priorities():
    capacity = 300  # not a power of two: the padding leaves hold 0
    priorities = random_priorities(capacity, seed=0)
    tree = d3qn.SumTree(capacity, "cpu")
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
    tree = d3qn.SumTree(capacity, "cpu")
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
    masses = torch.rand(2000, generator=generator, dtype=torch.float64) * tree.total()
    expected = np.searchsorted(np.cumsum(reference), masses.numpy(), side="right")
    np.testing.assert_array_equal(tree.find(masses).numpy(), expected)


@pytest.mark.parametrize("beta", [0.0, 0.4, 0.7, 1.0])
def test_importance_weights_match_the_definition(beta):
    priorities = random_priorities(50, seed=3) + 0.01
    probs = priorities / priorities.sum()
    sampled = torch.tensor([0, 3, 3, 7, 10, 49, 20])
    n = len(priorities)
    plain = [(n * probs[i].item()) ** -beta for i in sampled.tolist()]
    expected = [w / max(plain) for w in plain]
    got = d3qn.importance_weights(probs[sampled], n, beta)
    assert got.dtype == torch.float32 and got.max() == 1.0
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    if beta > 0:  # the rarest draw weighs the most
        assert got.argmax() == probs[sampled].argmin()


def test_beta_is_annealed_from_beta0_to_1_over_the_run():
    assert d3qn.beta_schedule(0.4, 1000, 0) == 0.4
    assert d3qn.beta_schedule(0.4, 1000, 500) == pytest.approx(0.7)
    assert d3qn.beta_schedule(0.4, 1000, 1000) == 1.0
    assert d3qn.beta_schedule(0.4, 1000, 1004) == 1.0


# --- n-step returns, the dueling head, the double-Q target ---------------------------------------------------------


def reference_n_step(rewards, terminations, truncations, gamma):
    """One window: (return, rows used, bootstrap discount), stopping at the first row that ends the episode."""
    g = 0.0
    for i in range(len(rewards)):
        g += gamma**i * rewards[i]
        if terminations[i]:
            return g, i + 1, 0.0  # a termination cuts: no bootstrap
        if truncations[i]:
            return g, i + 1, gamma ** (i + 1)  # a truncation bootstraps from the true final observation
    return g, len(rewards), gamma ** len(rewards)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_step_returns_stop_at_episode_ends_like_a_python_loop(n):
    generator = torch.Generator().manual_seed(n)
    batch, gamma = 2000, 0.9
    rewards = torch.randn(batch, n, generator=generator)
    ends = torch.rand(batch, n, generator=generator)
    terminations, truncations = ends < 0.15, (ends >= 0.15) & (ends < 0.3)
    returns, lengths, discounts = d3qn.n_step_returns(rewards, terminations, truncations, gamma)
    expected = [
        reference_n_step(r, te, tr, gamma)
        for r, te, tr in zip(rewards.tolist(), terminations.tolist(), truncations.tolist())
    ]
    np.testing.assert_allclose(returns.numpy(), [e[0] for e in expected], rtol=1e-5, atol=1e-6)
    assert lengths.tolist() == [e[1] for e in expected]
    np.testing.assert_allclose(discounts.numpy(), [e[2] for e in expected], rtol=1e-6)
    if n > 1:  # every kind of window occurs: cut by a termination, by a truncation, and full
        assert (discounts == 0).any() and ((lengths < n) & (discounts > 0)).any() and (lengths == n).any()


def test_dueling_aggregation_is_value_plus_advantage_minus_its_mean():
    generator = torch.Generator().manual_seed(4)
    value, advantage = torch.randn(6, 1, generator=generator), torch.randn(6, 4, generator=generator)
    expected = [[v[0] + a - sum(adv) / len(adv) for a in adv] for v, adv in zip(value.tolist(), advantage.tolist())]
    np.testing.assert_allclose(d3qn.dueling(value, advantage).numpy(), expected, rtol=1e-6, atol=1e-6)
    # In the network: the mean of Q over the actions is the value head's output; without dueling, no value head.
    torch.manual_seed(0)
    network, obs = d3qn.QNetwork(4, 3, dueling=True), torch.randn(10, 4)
    torch.testing.assert_close(network(obs).mean(dim=1), network.value(network.torso(obs)).squeeze(1))
    plain = d3qn.QNetwork(4, 3, dueling=False)
    assert plain.value is None and torch.equal(plain(obs), plain.advantage(plain.torso(obs)))


def test_double_q_target_takes_the_online_argmax_valued_by_the_target_network():
    online = torch.tensor([[1.0, 5.0, 2.0], [3.0, 0.0, 0.0]])
    target = torch.tensor([[10.0, -1.0, 7.0], [2.0, 9.0, 4.0]])
    returns, discounts = torch.tensor([0.5, 1.0]), torch.tensor([0.9**3, 0.0])
    got = d3qn.double_q_target(returns, discounts, online, target)
    torch.testing.assert_close(got, torch.tensor([0.5 - 0.9**3, 1.0]))
    assert got[0] != 0.5 + 0.9**3 * 10  # not DQN's max over the target network
    generator = torch.Generator().manual_seed(5)
    online, target = torch.randn(500, 4, generator=generator), torch.randn(500, 4, generator=generator)
    returns, discounts = torch.randn(500, generator=generator), torch.rand(500, generator=generator)
    expected = []
    for g, d, q_online, q_target in zip(returns.tolist(), discounts.tolist(), online.tolist(), target.tolist()):
        expected.append(g + d * q_target[max(range(4), key=lambda a: q_online[a])])
    np.testing.assert_allclose(d3qn.double_q_target(returns, discounts, online, target).numpy(), expected, rtol=1e-5)


# --- the replay buffer ---------------------------------------------------------------------------------------------


def feed_stream(rb: d3qn.ReplayBuffer, steps: int, num_envs: int, seed: int):
    """Feed `rb` a SAME_STEP stream of `steps` with random ends; return per env the lists a plain loop would keep:
    obs, the true next observation, action, reward, terminated, truncated."""
    rng = np.random.default_rng(seed)
    stream = [
        dict(obs=[], next_obs=[], actions=[], rewards=[], terminations=[], truncations=[]) for _ in range(num_envs)
    ]
    obs = np.stack([[-1.0, e] for e in range(num_envs)]).astype(np.float32)
    for t in range(steps):
        true_next = np.stack([[1000.0 + t, e] for e in range(num_envs)]).astype(np.float32)
        ends = rng.random(num_envs)
        terminations, truncations = ends < 0.2, (ends >= 0.2) & (ends < 0.4)
        ended = terminations | truncations
        # SAME_STEP: an ended env returns its reset observation, the true final one in infos.
        returned = np.where(ended[:, None], np.stack([[-2000.0 - t, e] for e in range(num_envs)]), true_next)
        final_obs = np.empty(num_envs, dtype=object)  # as gymnasium: None where the episode goes on
        for e in np.flatnonzero(ended):
            final_obs[e] = true_next[e]
        infos = {"final_obs": final_obs, "_final_obs": ended} if ended.any() else {}
        actions, rewards = rng.integers(0, 3, num_envs), rng.normal(size=num_envs).astype(np.float32)
        rb.add(obs, returned.astype(np.float32), actions, rewards, terminations, truncations, infos)
        for e, s in enumerate(stream):
            for key, value in zip(s, (obs[e], true_next[e], actions[e], rewards[e], terminations[e], truncations[e])):
                s[key].append(value)
        obs = returned.astype(np.float32)
    return stream


def reference_transition(s: dict, t: int, n: int, gamma: float):
    """The n-step transition of step t of one env's stream: (obs, bootstrap obs, action, return, discount)."""
    g, k, discount = reference_n_step(
        s["rewards"][t : t + n], s["terminations"][t : t + n], s["truncations"][t : t + n], gamma
    )
    return s["obs"][t], s["next_obs"][t + k - 1], s["actions"][t], g, discount


def test_buffer_gives_the_n_step_transitions_of_the_stream_and_new_rows_the_largest_priority():
    num_envs, n, gamma, alpha, steps = 2, 3, 0.9, 0.6, 7
    rb = d3qn.ReplayBuffer(steps * num_envs, num_envs, 2, n, gamma, alpha, True, "cpu")
    stream = feed_stream(rb, 11, num_envs, seed=0)  # 11 steps into 7 rows: the buffer wraps
    assert (rb.pos, rb.size) == (11 % steps, steps)
    assert any(any(s["terminations"]) and any(s["truncations"]) for s in stream)
    # Every complete row (steps 4..8: in the buffer, window written) against the plain reference.
    complete = [(t, e) for t in range(4, 9) for e in range(num_envs)]
    leaves = torch.tensor([(t % steps) * num_envs + e for t, e in complete])
    obs, boot_obs, actions, returns, discounts = rb.transitions(leaves)
    for i, (t, e) in enumerate(complete):
        ref_obs, ref_boot, ref_action, ref_return, ref_discount = reference_transition(stream[e], t, n, gamma)
        np.testing.assert_array_equal(obs[i].numpy(), ref_obs)
        np.testing.assert_array_equal(boot_obs[i].numpy(), ref_boot)  # never a reset observation (-2000 - t)
        assert actions[i].item() == ref_action
        assert returns[i].item() == pytest.approx(ref_return, rel=1e-5, abs=1e-6)
        assert discounts[i].item() == pytest.approx(ref_discount, rel=1e-6)
    # Priorities: the complete rows at the largest so far (1), the newest n - 1 steps (9, 10) at 0.
    rb.prioritize_new_rows()
    tree_leaves = rb.tree.nodes[rb.tree.leaves : rb.tree.leaves + steps * num_envs]
    assert tree_leaves[leaves].eq(1.0).all() and tree_leaves.sum() == len(complete)
    rb.update_priorities(leaves[:3], torch.tensor([0.5, 5.0, 2.0]))
    assert tree_leaves[leaves[:3]].tolist() == pytest.approx([0.5**alpha, 5.0**alpha, 2.0**alpha])
    feed_stream(rb, 1, num_envs, seed=1)  # step 11 overwrites step 4's row and completes step 9's window
    rb.prioritize_new_rows()
    tree_leaves = rb.tree.nodes[rb.tree.leaves : rb.tree.leaves + steps * num_envs].view(steps, num_envs)
    assert tree_leaves[9 % steps].tolist() == pytest.approx([5.0**alpha] * 2)  # the new largest priority
    assert tree_leaves[10 % steps].eq(0).all() and tree_leaves[11 % steps].eq(0).all()
    assert rb.tree.total().item() == pytest.approx(tree_leaves.sum().item(), rel=1e-12)
    # Draws land on complete rows only, with weights that are 1 at the rarest.
    _, _, _, _, _, drawn, weights = rb.sample(512, beta=0.5)
    assert set((drawn // num_envs).tolist()) <= {t % steps for t in range(5, 10)} and weights.max() == 1.0
    # A checkpoint restores data and priorities exactly.
    restored = d3qn.ReplayBuffer(steps * num_envs, num_envs, 2, n, gamma, alpha, True, "cpu")
    restored.load_state_dict(rb.state_dict())
    assert torch.equal(restored.data, rb.data) and torch.equal(restored.tree.nodes, rb.tree.nodes)
    assert (restored.pos, restored.size, restored.max_priority.item()) == (rb.pos, rb.size, 5.0)


def test_uniform_buffer_draws_every_complete_row_alike():
    num_envs, n, steps = 2, 3, 7
    rb = d3qn.ReplayBuffer(steps * num_envs, num_envs, 2, n, 0.9, 0.6, False, "cpu")
    feed_stream(rb, 11, num_envs, seed=2)
    assert rb.tree is None
    torch.manual_seed(0)
    _, _, _, _, _, leaves, weights = rb.sample(20000, beta=0.4)
    assert weights.eq(1).all()
    expected_leaves = sorted((t % steps) * num_envs + e for t in range(4, 9) for e in range(num_envs))
    counts = np.bincount(leaves.numpy(), minlength=steps * num_envs)
    assert np.flatnonzero(counts).tolist() == expected_leaves
    assert stats.chisquare(counts[expected_leaves]).pvalue > 1e-3


# --- bad input -----------------------------------------------------------------------------------------------------


def test_an_oversized_buffer_is_refused_in_one_line_before_any_run_directory(workdir):
    # 10**12 rows of 12 float32s (48,000 GB) and a sum tree of 2**41 float64 nodes (17,592 GB).
    result = run_script("d3qn.py", "--buffer-size", "1000000000000", cwd=workdir)
    assert_bad_input(result, workdir, "--buffer-size: the replay buffer needs 65592.2 GB", "lower --buffer-size")


@pytest.mark.parametrize(
    "fields, fragments",
    [
        (dict(env_id="Pendulum-v1"), ["Discrete", "ddpg_continuous_action.py", "sac_continuous_action.py"]),
        (dict(env_id="CartPole-v9"), ["unknown environment id", "CartPole-v1"]),
        (dict(n_step=0), ["--n-step must be positive"]),
        (dict(buffer_size=6, num_envs=2, batch_size=4, learning_starts=6), ["--buffer-size 6 must hold at least 4"]),
        (dict(learning_starts=2), ["--learning-starts must be at least 3"]),
        (dict(batch_size=128, buffer_size=64), ["--batch-size 128 is larger than --buffer-size 64"]),
        (dict(prioritized_replay_beta=1.5), ["--prioritized-replay-beta must be in [0, 1]"]),
        (dict(prioritized_replay_alpha=-1), ["--prioritized-replay-alpha must not be negative"]),
        (dict(prioritized_replay_eps=0), ["--prioritized-replay-eps must be positive"]),
        (dict(total_timesteps=5000), ["--learning-starts 10000 must be in [0, --total-timesteps 5000)"]),
    ],
)
def test_validate_refuses_bad_arguments_in_one_line(capsys, fields, fragments):
    # In-process (a subprocess per case costs seconds); the test above checks the command line end to end.
    with pytest.raises(SystemExit) as exit_info:
        d3qn.validate(d3qn.Args(**fields))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- checkpoints and resume ----------------------------------------------------------------------------------------


def test_sigkill_then_resume_reproduces_the_uninterrupted_run_priorities_included(tmp_path, uninterrupted):
    _, straight_run = uninterrupted
    run_dir = kill_at_first_checkpoint("d3qn.py", RUN_FLAGS, tmp_path)
    assert not (run_dir / "d3qn.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 800 and checkpoint["envs"] is not None
    priorities = checkpoint["replay_buffer"]["priorities"]
    assert len(priorities.unique()) > 50 and checkpoint["replay_buffer"]["max_priority"] > 1  # learned priorities

    resumed = run_script("d3qn.py", *RUN_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path) == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in ("charts/episodic_return", "losses/td_loss", "losses/q_values", "charts/beta", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    # The final checkpoints agree exactly: networks, optimiser, the replay buffer and every priority of its tree.
    final, straight_final = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (run_dir, straight_run))
    assert final["global_step"] == straight_final["global_step"] == 1600
    for name, value in straight_final["replay_buffer"].items():
        assert torch.equal(torch.as_tensor(final["replay_buffer"][name]), torch.as_tensor(value)), name
    for network in ("q_network", "target_network"):
        for key, tensor in straight_final[network].items():
            assert torch.equal(final[network][key], tensor), (network, key)
    for param, state in straight_final["optimizer"]["state"].items():
        for key, tensor in state.items():
            assert torch.equal(final["optimizer"]["state"][param][key], tensor), (param, key)
