"""fast_td3_isaacgym.py: the n-step windows of the device replay buffer against a plain walk (terminations cut,
truncations and the newest step bootstrap, wrap-around), the distributional projection with per-sample discounts
against a plain loop, the running observation statistics; the script's own loop under tests/probe.py on gymnasium's
path (stored rows, acting with per-environment noise scales redrawn at episode ends, every critic loss against the
projected clipped-double-Q target of the target critics, the policy's delay and loss, Polyak averaging, sampled windows
that the buffer holds); MuJoCo Warp smoke with save and evaluate; SIGKILL + exact resume; bad input."""

from __future__ import annotations

import fast_td3_isaacgym as fast_td3
import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    script_env,
)
from update_reference import assert_gradients_match, assert_unchanged, gradients, leaves

SCRIPT = "fast_td3_isaacgym.py"


# --- the replay buffer's n-step windows -----------------------------------------------------------


def plain_window(columns: dict, env: int, start: int, newest: int, n: int, gamma: float) -> tuple:
    """Walk from `start`: add gamma^k r_k; a termination ends the window with no bootstrap; a truncation, the newest
    stored step or the n-th step ends it bootstrapping from that step's next observation with gamma^(k + 1)."""
    size = len(columns["rewards"][env])
    total, row = 0.0, start
    for k in range(n):
        row = (start + k) % size
        total += gamma**k * float(columns["rewards"][env][row])
        if columns["terminations"][env][row]:
            return total, 0.0, row
        if columns["truncations"][env][row] or row == newest or k == n - 1:
            return total, gamma ** (k + 1), row
    raise AssertionError("unreachable")


def fill(rb: fast_td3.ReplayBuffer, steps: int, seed: int = 0) -> dict:
    """`steps` random columns into `rb` (observations numbered by step), returning them as written."""
    generator, reset_generator = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    written = {name: [] for name in fast_td3.ReplayBuffer.FIELDS}
    for t in range(steps):
        column = dict(
            obs=torch.full((rb.num_envs, 3), float(t)) + torch.arange(rb.num_envs).view(-1, 1) / 10,
            actions=torch.rand(rb.num_envs, 2, generator=generator) * 2 - 1,
            rewards=torch.randn(rb.num_envs, generator=generator),
            terminations=torch.rand(rb.num_envs, generator=generator) < 0.2,
            truncations=torch.rand(rb.num_envs, generator=generator) < 0.2,
            next_obs=torch.full((rb.num_envs, 3), t + 0.5) + torch.arange(rb.num_envs).view(-1, 1) / 10,
            reset_steps=torch.rand(rb.num_envs, generator=reset_generator) < 0.1,
        )
        column["truncations"] &= ~column["terminations"]
        rb.add(*(column[name] for name in fast_td3.ReplayBuffer.FIELDS))
        for name in written:
            written[name].append(column[name])
    return written


@pytest.mark.parametrize("steps", [5, 9, 23])  # not full, just full, wrapped around twice and more
def test_n_step_windows_stop_at_episode_ends_and_the_newest_step_and_bootstrap_only_truncations(steps):
    rb = fast_td3.ReplayBuffer(num_envs=3, buffer_size=9, obs_dim=3, act_dim=2, device=torch.device("cpu"))
    fill(rb, steps)
    gamma, n = 0.9, 4
    columns = {name: getattr(rb, name) for name in ("rewards", "terminations", "truncations")}
    starts = torch.arange(rb.size).repeat(3, 1)  # every stored step of every env
    obs, actions, rewards, discounts, next_obs, weights, *critics_obs = rb.n_step_window(starts, n, gamma)
    # no critic observations of their own: the critics see the policy's
    assert torch.equal(critics_obs[0], obs) and torch.equal(critics_obs[1], next_obs)
    newest = (rb.pos - 1) % 9
    cut = {"terminated": 0, "truncated": 0, "newest": 0, "full": 0}
    for env in range(3):
        for start in range(rb.size):
            i = env * rb.size + start
            total, discount, last = plain_window(columns, env, start, newest, n, gamma)
            where = f"env {env}, start {start}"
            assert rewards[i].item() == pytest.approx(total, rel=1e-6, abs=1e-6), where
            assert discounts[i].item() == pytest.approx(discount, rel=1e-6), where
            assert torch.equal(next_obs[i], rb.next_obs[env, last]), where
            assert torch.equal(obs[i], rb.obs[env, start]) and torch.equal(actions[i], rb.actions[env, start]), where
            assert weights[i] == (0.0 if rb.reset_steps[env, start] else 1.0), where  # a reset step learns nothing
            if discount == 0.0:
                cut["terminated"] += 1
            elif rb.truncations[env, last]:
                cut["truncated"] += 1
            elif last == newest:
                cut["newest"] += 1
            else:
                cut["full"] += 1
    assert min(cut.values()) > 0, cut


def test_sampling_draws_every_env_evenly_from_the_stored_steps():
    rb = fast_td3.ReplayBuffer(num_envs=4, buffer_size=50, obs_dim=3, act_dim=2, device=torch.device("cpu"))
    fill(rb, 20)
    torch.manual_seed(0)
    obs, *_ = rb.sample(per_env=500, n_steps=3, gamma=0.99)
    assert obs.shape == (2000, 3)
    env_of_row = torch.round((obs[:, 0] % 1) * 10).long()  # the observations were numbered t + env / 10
    assert torch.equal(env_of_row, torch.arange(4).repeat_interleave(500))
    assert set(obs[:, 0].floor().long().tolist()) == set(range(20))  # only steps written, all of them


def test_the_checkpointed_buffer_samples_as_the_original_does():
    rb = fast_td3.ReplayBuffer(num_envs=2, buffer_size=7, obs_dim=3, act_dim=2, device=torch.device("cpu"))
    fill(rb, 11)
    copy = fast_td3.ReplayBuffer(num_envs=2, buffer_size=7, obs_dim=3, act_dim=2, device=torch.device("cpu"))
    copy.load_state_dict(rb.state_dict())
    torch.manual_seed(3)
    original = rb.sample(16, 3, 0.9)
    torch.manual_seed(3)
    for a, b in zip(original, copy.sample(16, 3, 0.9)):
        assert torch.equal(a, b)


# --- the projection and the observation statistics ----------------------------------------------------


def reference_projection(next_probs, rewards, discounts, support):
    n_atoms = len(support)
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    projected = np.zeros((len(rewards), n_atoms))
    for i in range(len(rewards)):
        for j in range(n_atoms):
            b = (min(max(rewards[i] + discounts[i] * support[j], v_min), v_max) - v_min) / delta_z
            lower, upper = int(np.floor(b)), int(np.ceil(b))
            if lower == upper:
                projected[i, lower] += next_probs[i, j]
            else:
                projected[i, lower] += next_probs[i, j] * (upper - b)
                projected[i, upper] += next_probs[i, j] * (b - lower)
    return projected


def test_projection_with_per_sample_discounts_matches_a_plain_loop():
    generator = torch.Generator().manual_seed(0)
    support = torch.linspace(-10, 10, 21, dtype=torch.float64)
    probs = torch.softmax(torch.randn(64, 21, generator=generator, dtype=torch.float64) * 2, dim=1)
    rewards = torch.randn(64, generator=generator, dtype=torch.float64) * 6
    discounts = torch.tensor([0.0, 0.9, 0.81, 0.729], dtype=torch.float64).repeat(16)  # terminated, 1-, 2-, 3-step
    got = fast_td3.project_distribution(probs, rewards, discounts, support)
    expected = reference_projection(probs.numpy(), rewards.numpy(), discounts.numpy(), support.numpy())
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)


def test_observation_statistics_are_those_of_every_batch_seen_and_normalise_as_the_authors_do():
    generator = torch.Generator().manual_seed(0)
    normalizer = fast_td3.ObservationNormalizer(4)
    batches = [torch.randn(n, 4, generator=generator) * 3 + 1 for n in (1, 5, 17)]
    for batch in batches:
        normalizer.update(batch)
    seen = torch.cat(batches).double()
    torch.testing.assert_close(normalizer.mean, seen.mean(0))
    torch.testing.assert_close(normalizer.var, seen.var(0, unbiased=False))
    x = torch.randn(3, 4, generator=generator)
    expected = ((x.double() - seen.mean(0)) / (seen.var(0, unbiased=False).sqrt() + 0.01)).float()
    torch.testing.assert_close(normalizer(x), expected)


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on gymnasium's ProbeDrift-v0 (tests/probe_box_envs.py: 8-step
# episodes ending by termination or truncation, asymmetric action bounds), 2 envs x 40 steps (the buffer never wraps):
# learning from step 30 (after the 15th step), 2 critic updates per step, a policy update after every 2nd, 3-step
# returns, narrow networks.
PROBE_FLAGS = ["--simulator", "gymnasium", "--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "64"]
PROBE_FLAGS += ["--batch-size", "16", "--learning-starts", "30", "--total-timesteps", "80", "--gamma", "0.9"]
PROBE_FLAGS += ["--critic-hidden", "32", "--actor-hidden", "16", "--num-atoms", "11", "--v-min", "-5", "--v-max", "5"]
PROBE_FLAGS += ["--policy-noise", "0.2", "--std-min", "0.1", "--std-max", "0.5", "--log-every", "20"]
STEP_NAMES = ["actions", "noise", "noise_scales", "next_raw_obs", "rewards", "terminations", "truncations", "info"]
STEP_NAMES += ["actor", "obs_normalizer"]
AT_BACKWARD = ["obs", "actions", "rewards", "discounts", "next_obs", "smoothing_noise", "qnet", "qnet_target", "actor"]
AT_BACKWARD += ["critic_updates", "actor_loss", "obs_normalizer", "rb", "weights", "global_step"]
AT_BACKWARD += ["critic_obs", "next_critic_obs"]  # the critics' inputs: the policy's observations here
GRADS = ["qnet", "qnet_target", "actor"]
GAMMA, TAU, N_STEPS, LOW, HIGH = 0.9, 0.1, 3, np.array([-1.0, 0.0]), np.array([2.0, 5.0])
# The same loop and checks on envpool's C++ InvertedDoublePendulum (its pole falls within ~7-11 steps under these small
# actions: terminations) with a 9-step time limit (tests/probe_short_episodes.py: truncations).
ENVPOOL_PROBE_FLAGS = ["--simulator", "envpool", "--env-id", "InvertedDoublePendulum", *PROBE_FLAGS[4:]]


@pytest.fixture(scope="module", params=["gymnasium", "envpool"])
def probed(request, tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp(f"probe-{request.param}")
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS if request.param == "gymnasium" else ENVPOOL_PROBE_FLAGS,
        cwd,
        watch=STEP_NAMES,
        at_backward=AT_BACKWARD,
        grads=GRADS,
        final=["rb"],
        preload=["probe_box_envs", "probe_short_episodes"],
        env=script_env(PROBE_MAX_EPISODE_STEPS="9" if request.param == "envpool" else "8"),
    )
    return trace, cwd


def linear(x, state, name):
    return x.double() @ state[f"{name}.weight"].double().T + state[f"{name}.bias"].double()


def plain_actor(state: dict, obs: torch.Tensor) -> torch.Tensor:
    h = obs.double()
    for i in (0, 2, 4):
        h = linear(h, state, f"net.{i}").relu()
    return torch.tanh(linear(h, state, "fc_mu"))


def plain_critic_logits(state: dict, i: int, obs, actions) -> torch.Tensor:
    h = torch.cat([obs, actions], dim=-1).double()
    for layer in (0, 2, 4):
        h = linear(h, state, f"qnets.{i}.{layer}").relu()
    return linear(h, state, f"qnets.{i}.6")


def normalise(state: dict, x) -> torch.Tensor:
    return ((torch.as_tensor(x).double() - state["mean"]) / (state["var"].sqrt() + 0.01)).float()


def steps_of(trace) -> list[dict]:
    return [entry for entry in trace.steps if entry["step"] > 0]


def test_the_loop_stores_each_step_and_acts_with_each_envs_noise_scale(probed):
    trace, cwd = probed
    steps, rb = steps_of(trace), trace.final["rb"]
    assert len(steps) == 40 and rb["size"] == 40 and rb["pos"] == 40
    ends = 0
    for t, step in enumerate(steps):
        assert torch.equal(rb["actions"][:, t], step["actions"])  # in [-1, 1], as the policy gave them
        assert torch.equal(rb["rewards"][:, t], step["rewards"])
        assert torch.equal(rb["terminations"][:, t], step["terminations"])
        assert torch.equal(rb["truncations"][:, t], step["truncations"])
        assert torch.equal(rb["next_obs"][:, t], step["info"]["final_obs"])  # the true final observation at an end
        assert not rb["reset_steps"][:, t].any()  # gymnasium resets within the step: every step is a transition
        done = step["terminations"] | step["truncations"]
        ends += int(done.sum())
        if t == 0:
            continue
        previous = steps[t - 1]
        # The observation acted on is what the env returned the step before (the reset one after an end).
        assert torch.equal(rb["obs"][:, t], previous["next_raw_obs"])
        with torch.no_grad():
            greedy = plain_actor(step["actor"], normalise(step["obs_normalizer"], rb["obs"][:, t]))
        expected = (greedy + step["noise"].double() * previous["noise_scales"].double()).clamp(-1, 1)
        torch.testing.assert_close(step["actions"].double(), expected, rtol=1e-5, atol=1e-5)
        # A new episode draws a new noise scale in [std_min, std_max]; a running one keeps its own.
        kept = ~done
        assert torch.equal(step["noise_scales"][kept], previous["noise_scales"][kept]) or not kept.any()
        assert ((step["noise_scales"] >= 0.1) & (step["noise_scales"] <= 0.5)).all()
    assert ends >= 6, ends
    redrawn = [bool((s["noise_scales"] != p["noise_scales"]).any()) for p, s in zip(steps, steps[1:])]
    assert any(redrawn)


def critic_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_critic"]


def actor_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_actor"]


def projected_target(entry: dict, support: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The critics' target of a critic update, held constant: the projected n-step distribution of the target critic
    whose mean is lower at (s', a' + clipped noise), and that mean's n-step target before projection."""
    with torch.no_grad():
        noise = entry["smoothing_noise"].double().clamp(-0.5, 0.5)
        next_actions = (plain_actor(entry["actor"], entry["next_obs"]) + noise).clamp(-1, 1)
        next_probs = [
            torch.softmax(plain_critic_logits(entry["qnet_target"], i, entry["next_critic_obs"], next_actions), -1)
            for i in (0, 1)
        ]
        means = [(p * torch.as_tensor(support)).sum(-1) for p in next_probs]
    rewards, discounts = entry["rewards"].double().numpy(), entry["discounts"].double().numpy()
    targets = [reference_projection(p.numpy(), rewards, discounts, support) for p in next_probs]
    target = torch.as_tensor(np.where((means[0] < means[1]).numpy()[:, None], targets[0], targets[1]))
    return target, torch.as_tensor(rewards) + torch.as_tensor(discounts) * torch.minimum(*means)


def reference_critic_loss(entry: dict, qnet: dict, target: torch.Tensor) -> torch.Tensor:
    """Both critics' cross-entropies to the target, each averaged over the windows of weight 1, summed."""
    weights = entry["weights"].double()
    logits = [plain_critic_logits(qnet, i, entry["critic_obs"], entry["actions"]) for i in (0, 1)]
    return sum((-(target * torch.log_softmax(x, -1)).sum(-1) * weights).sum() / weights.sum() for x in logits)


def test_each_critic_update_is_the_cross_entropy_to_the_projected_clipped_double_q_target(probed):
    trace, _ = probed
    updates = critic_entries(trace)
    assert len(updates) == 2 * (40 - 15) and [u["critic_updates"] for u in updates] == list(range(50))
    support = np.linspace(-5, 5, 11)
    for entry in updates:
        where = f"update {entry['critic_updates']}"
        assert torch.equal(entry["weights"], torch.ones(16))  # no reset steps on gymnasium's path
        target, _ = projected_target(entry, support)
        qnet = leaves(entry["qnet"])
        loss = reference_critic_loss(entry, qnet, target)
        assert_gradients_match(entry["grads"]["qnet"], gradients(loss, qnet), where)
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-4), where
        # The target critics take no gradient: they move by Polyak averaging alone.
        assert all(grad is None for grad in entry["grads"]["qnet_target"].values()), where
    assert sum(float((u["discounts"] == 0).sum()) for u in updates) > 0, "some windows should terminate"


SMALL = dict(num_envs=2, buffer_size=10, batch_size=2)


def test_the_task_gives_the_critics_support_unless_it_is_given():
    for env_id, simulator, expected in [
        ("Hopper-v5", "gymnasium", (-100.0, 500.0)),
        ("Humanoid", "mujoco-warp", (-100.0, 1200.0)),  # above the ~500 the alive bonus alone is worth
        ("Pendulum-v1", "gymnasium", fast_td3.DEFAULT_SUPPORT),
    ]:
        args = fast_td3.Args(simulator=simulator, env_id=env_id, **SMALL)
        fast_td3.validate(args)
        assert (args.v_min, args.v_max) == pytest.approx(expected), env_id
    args = fast_td3.Args(simulator="gymnasium", env_id="Hopper-v5", gamma=0.98, v_max=7.0, **SMALL)
    fast_td3.validate(args)
    assert (args.v_min, args.v_max) == pytest.approx((-50.0, 7.0))


def test_sampled_windows_are_the_stored_steps_n_step_transitions_at_the_time(probed):
    trace, _ = probed
    final = trace.final["rb"]
    columns = {name: final[name] for name in ("rewards", "terminations", "truncations")}
    for entry in critic_entries(trace):
        stored = entry["rb"]["size"]  # columns written when the update ran; the newest is the last of them
        windows = {}
        for env in range(2):
            for start in range(stored):
                total, discount, _ = plain_window(
                    {k: v[:, :stored] for k, v in columns.items()}, env, start, stored - 1, N_STEPS, GAMMA
                )
                windows[(env, start)] = (total, discount)
        norm = entry["obs_normalizer"]
        for i in range(16):
            env = i // 8  # batch_size // num_envs rows from each env, env 0 first
            matches = [
                start
                for start in range(stored)
                if torch.equal(entry["actions"][i], final["actions"][env, start])
                and abs(windows[(env, start)][0] - float(entry["rewards"][i])) < 1e-5
                and abs(windows[(env, start)][1] - float(entry["discounts"][i])) < 1e-6
            ]
            assert matches, f"update {entry['critic_updates']}, row {i}: no stored window of env {env} matches"
            torch.testing.assert_close(entry["critic_obs"][i], normalise(norm, final["obs"][env, matches[0]]))


def test_the_policy_updates_after_every_second_critic_update_on_the_lower_critic(probed):
    trace, _ = probed
    actors, critics = actor_entries(trace), critic_entries(trace)
    assert [entry["critic_updates"] for entry in actors] == list(range(2, 51, 2))
    by_update = {entry["critic_updates"]: entry for entry in critics}
    for entry in actors:
        where = f"policy update after critic update {entry['critic_updates']}"
        actor = leaves(entry["actor"])
        actions = plain_actor(actor, entry["obs"])
        q = [
            (
                torch.softmax(plain_critic_logits(entry["qnet"], i, entry["critic_obs"], actions), -1)
                * torch.linspace(-5, 5, 11).double()
            ).sum(-1)
            for i in (0, 1)
        ]
        loss = -torch.minimum(*q).mean()
        assert_gradients_match(entry["grads"]["actor"], gradients(loss, actor), where)
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-4), where
        if entry["critic_updates"] in by_update:  # the critics as the policy step found them and as it left them
            assert_unchanged(entry["qnet"], by_update[entry["critic_updates"]]["qnet"], where)
    # Polyak averaging after each critic update: the target the next critic update found.
    following = {id(a): b for a, b in zip(trace.backward, trace.backward[1:])}
    for before, after in zip(critics, critics[1:]):
        online = following[id(before)]["qnet"]  # the critics after this update's step
        for name, value in after["qnet_target"].items():
            expected = before["qnet_target"][name].double() + TAU * (
                online[name].double() - before["qnet_target"][name].double()
            )
            torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7)


# --- Isaac Gym's reset step ------------------------------------------------------------------------
# Isaac Gym resets an ended episode during the next step (tests/isaacgym_double.py does as isaacgymenvs): that step acts
# on the final observation and returns the new episode's first, so it is no transition. The script runs on the double
# (episodes of at most 20 steps), 2 envs x 60 steps, learning from the 20th step.
ISAACGYM_FLAGS = ["--simulator", "isaacgym", "--env-id", "Cartpole", "--num-envs", "2", "--buffer-size", "64"]
ISAACGYM_FLAGS += ["--batch-size", "32", "--learning-starts", "40", "--total-timesteps", "120", "--gamma", "0.9"]
ISAACGYM_FLAGS += ["--critic-hidden", "16", "--actor-hidden", "8", "--num-atoms", "11", "--log-every", "40"]
ISAACGYM_FLAGS += ["--v-min", "-2", "--v-max", "2"]  # rewards near 1 a step: many targets lie above 2


@pytest.fixture(scope="module")
def isaacgym_probed(tmp_path_factory):
    import isaacgym_double
    from probe import probe_script

    shims = tmp_path_factory.mktemp("isaacgym_double")
    isaacgym_double.write_shims(shims)
    cwd = tmp_path_factory.mktemp("isaacgym_probe")
    at_backward = ["obs", "actions", "rewards", "discounts", "next_obs", "smoothing_noise", "qnet", "qnet_target"]
    at_backward += ["actor", "weights", "critic_updates", "global_step", "critic_obs", "next_critic_obs"]
    trace = probe_script(
        SCRIPT,
        ISAACGYM_FLAGS,
        cwd,
        watch=["info", "terminations", "truncations"],
        at_backward=at_backward,
        grads=["qnet"],
        final=["rb"],
        env=script_env(PYTHONPATH=f"{shims}:{ROOT / 'tests'}"),
    )
    return trace, cwd


def test_isaacgyms_step_after_an_episode_end_is_stored_as_a_reset_step_and_learns_nothing(isaacgym_probed):
    trace, _ = isaacgym_probed
    steps, rb = steps_of(trace), trace.final["rb"]
    assert "simulator: isaacgym" in trace.stdout and len(steps) == 60
    done = torch.stack([step["terminations"] | step["truncations"] for step in steps], dim=1)  # [envs, steps]
    expected = torch.cat([torch.zeros(2, 1, dtype=torch.bool), done[:, :-1]], dim=1)  # the step after each end
    assert torch.equal(rb["reset_steps"][:, :60], expected) and expected.sum() >= 4
    updates = critic_entries(trace)
    assert len(updates) == 2 * (60 - 20)
    masked = 0
    for entry in updates:
        # Each sampled window's weight is 0 exactly where it starts at a reset step (matched by its stored action).
        for i in range(32):
            env = i // 16
            (start,) = [t for t in range(60) if torch.equal(rb["actions"][env, t], entry["actions"][i])]
            assert entry["weights"][i] == (0.0 if expected[env, start] else 1.0)
        masked += int((entry["weights"] == 0).sum())
        target, _ = projected_target(entry, np.linspace(-2, 2, 11))
        qnet = leaves(entry["qnet"])
        assert_gradients_match(
            entry["grads"]["qnet"], gradients(reference_critic_loss(entry, qnet, target), qnet), entry["critic_updates"]
        )
    assert masked > 0, "some updates should sample reset steps"


def test_targets_beyond_the_support_are_reported_at_each_log_line(isaacgym_probed):
    trace, cwd = isaacgym_probed
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    above, below = (dict(scalars[f"losses/targets_{side}_support"]) for side in ("above", "below"))
    since_last_log, checked = [], 0
    for entry in critic_entries(trace):
        _, target_q = projected_target(entry, np.linspace(-2, 2, 11))
        since_last_log.append(((target_q > 2).double().mean().item(), (target_q < -2).double().mean().item()))
        step = entry["global_step"]
        if step % 40 == 0 and entry["critic_updates"] % 2 == 1:  # the step's last update, before its log line
            above_mean, below_mean = np.mean(since_last_log, axis=0)
            assert above[step] == pytest.approx(above_mean, abs=1e-6), step
            assert below[step] == pytest.approx(below_mean, abs=1e-6), step
            line = f"step {step}: {above_mean:.1%} of the critics' targets lie above the support's top 2 and"
            assert (line in trace.stdout) == (above_mean + below_mean > 0), (step, trace.stdout[-2000:])
            since_last_log, checked = [], checked + 1
    assert checked == 2 and min(above.values()) > 0, "the support should be too narrow for some targets"


def test_isaacgym_adapter_marks_the_step_after_each_end_as_a_reset_step(monkeypatch, tmp_path):
    import isaacgym_double

    isaacgym_double.write_shims(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = fast_td3.IsaacGymVecEnv("Cartpole", 3, torch.device("cpu"), seed=0)
    env.reset()
    env.envs.state[1, 0] = 5.0  # out of bounds: world 1 terminates at the first step
    _, _, terminated, _, info = env.step(torch.zeros(3, 1))
    assert terminated.tolist() == [False, True, False] and not info["reset_step"].any()
    obs, _, _, _, info = env.step(torch.zeros(3, 1))
    assert info["reset_step"].tolist() == [False, True, False]  # reset during this step: a fresh start returned
    assert obs[1, 0].abs() <= 0.1 + 1e-6
    _, _, _, _, info = env.step(torch.zeros(3, 1))
    assert not info["reset_step"].any()


# --- runs ----------------------------------------------------------------------------------------
RESUME_FLAGS = ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "300"]
RESUME_FLAGS += ["--batch-size", "32", "--learning-starts", "100", "--total-timesteps", "800", "--critic-hidden", "32"]
RESUME_FLAGS += ["--actor-hidden", "16", "--v-min", "-1000", "--v-max", "10", "--checkpoint-every", "300"]
RESUME_FLAGS += ["--save-model", "--eval-episodes", "1", "--log-every", "100"]


def saved_weights(run_dir) -> dict:
    model = torch.load(run_dir / "fast_td3_isaacgym.cleanrl_model", weights_only=False)
    return {**model["actor"], **{f"norm.{k}": v for k, v in model["obs_normalizer"].items()}}


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] in (300, 600) and checkpoint["envs"] is not None
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir]
    (straight_dir,) = run_dirs(straight)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    assert_finite_keys(straight_scalars, ["charts/episodic_return", "losses/qf1_loss", "losses/actor_loss"])
    for key in ("charts/episodic_return", "losses/qf1_loss", "losses/actor_loss", "eval/episodic_return"):
        assert resumed_scalars[key] == straight_scalars[key], key
    a, b = saved_weights(run_dir), saved_weights(straight_dir)
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_mujoco_warp_smoke_saves_and_evaluates(workdir):
    flags = ["--simulator", "mujoco-warp", "--env-id", "Hopper", "--num-envs", "8", "--buffer-size", "40"]
    flags += ["--batch-size", "32", "--learning-starts", "80", "--total-timesteps", "160", "--critic-hidden", "32"]
    flags += ["--actor-hidden", "16", "--save-model", "--eval-episodes", "2", "--log-every", "80"]
    result = run_script(SCRIPT, *flags, cwd=workdir, timeout=600)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, ["losses/qf1_loss", "losses/qf2_loss", "losses/actor_loss", "eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--simulator", "gymnasium", "--env-id", "CartPole-v1"], ["1-D Box actions"]),
        (
            ["--simulator", "mujoco-warp", "--env-id", "Hopper-v5"],
            ["unknown task 'Hopper-v5'", "--simulator gymnasium"],
        ),
        (["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--buffer-size", "10000000000"], ["replay buffer"]),
        (
            ["--simulator", "envpool", "--env-id", "Pendulum"],
            ["unknown task 'Pendulum' for envpool", "known tasks: Ant"],
        ),
        (
            ["--simulator", "envpool", "--env-id", "Hopper-v5"],
            ["unknown task 'Hopper-v5' for envpool", "--env-id Hopper;"],
        ),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(batch_size=8, num_envs=16), "--batch-size 8 is below --num-envs 16"),
        (dict(v_min=1.0, v_max=1.0), "the support needs --v-min < --v-max"),
        (dict(std_min=0.5, std_max=0.1), "--std-min <= --std-max"),
        (dict(n_steps=0), "--n-steps must be positive"),
        (dict(tau=0.0), "--gamma and --tau must be in (0, 1]"),
        (dict(capture_video=True), "--capture-video is not supported"),
        (dict(time_limit_seconds=-1.0), "--time-limit-seconds must be 0 or positive"),
        (dict(gamma=1.0), "--gamma 1 puts no bound on the returns"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = fast_td3.Args(**{"simulator": "gymnasium", "env_id": "Pendulum-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        fast_td3.validate(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines


def test_amp_trains_in_bf16_autocast_and_keeps_everything_stored_in_float32(workdir):
    flags = ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "200"]
    flags += ["--batch-size", "32", "--learning-starts", "100", "--total-timesteps", "300", "--critic-hidden", "32"]
    flags += ["--actor-hidden", "16", "--v-min", "-1000", "--v-max", "10", "--log-every", "100", "--amp"]
    flags += ["--checkpoint-every", "300"]
    result = run_script(SCRIPT, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    assert_finite_keys(read_scalars(run_dir), ["losses/qf1_loss", "losses/qf2_loss", "losses/actor_loss"])
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    stored = [*checkpoint["actor"].values(), *checkpoint["qnet"].values(), *checkpoint["qnet_target"].values()]
    stored += [value for key, value in checkpoint["replay_buffer"].items() if key in ("obs", "actions", "rewards")]
    assert all(value.dtype == torch.float32 for value in stored)


def test_a_time_limit_stops_training_and_still_saves_and_evaluates(workdir):
    flags = ["--simulator", "gymnasium", "--env-id", "Pendulum-v1", "--num-envs", "2", "--buffer-size", "200"]
    flags += [
        "--batch-size",
        "32",
        "--learning-starts",
        "100",
        "--total-timesteps",
        "10000000",
        "--critic-hidden",
        "32",
    ]
    flags += ["--actor-hidden", "16", "--log-every", "50", "--time-limit-seconds", "4", "--save-model"]
    flags += ["--eval-episodes", "1"]
    result = run_script(SCRIPT, *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "--time-limit-seconds 4 reached at step" in result.stdout
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    last_step = max(step for step, _ in scalars["charts/SPS"])
    assert 100 < last_step < 10_000_000 and len(scalars["eval/episodic_return"]) == 1


# --- envpool and the task names ------------------------------------------------------------------------------------


def test_a_missing_envpool_is_named_in_one_line(capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:
        fast_td3.validate(fast_td3.Args(simulator="envpool", env_id="Ant", **SMALL))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert "--simulator envpool needs the envpool package" in lines[0] and "uv sync --extra envpool" in lines[0]


def test_task_names_map_onto_v5_ids_and_the_log_interval_scales_with_the_envs():
    for simulator in ("envpool", "gymnasium"):
        args = fast_td3.Args(simulator=simulator, env_id="Hopper", **SMALL)
        fast_td3.validate(args)
        assert (args.v_min, args.v_max) == pytest.approx((-100.0, 500.0)), simulator  # Hopper's support
        envs = fast_td3.make_envs(simulator, "Hopper", 2, torch.device("cpu"), 1, vars(args))
        assert envs.obs_dim == 11 and envs.act_dim == 3, simulator
        envs.close()
    assert fast_td3.gymnasium_id("Ant") == "Ant-v5" and fast_td3.gymnasium_id("Pendulum-v1") == "Pendulum-v1"
    # --log-every: every 100 steps of each environment unless given (102,400 with 1024 envs, 1,600 with 16).
    for num_envs, expected in ((1024, 102_400), (16, 1_600)):
        args = fast_td3.Args(simulator="gymnasium", env_id="Pendulum-v1", num_envs=num_envs, batch_size=num_envs)
        fast_td3.validate(args)
        assert args.log_every == expected
    args = fast_td3.Args(simulator="gymnasium", env_id="Pendulum-v1", log_every=50, **SMALL)
    fast_td3.validate(args)
    assert args.log_every == 50


ENVPOOL_RESUME_FLAGS = ["--simulator", "envpool", "--env-id", "InvertedDoublePendulum", *RESUME_FLAGS[4:]]


def test_envpool_sigkill_then_resume_says_so_and_continues_all_but_the_episodes(tmp_path):
    run_dir = kill_at_first_checkpoint(SCRIPT, ENVPOOL_RESUME_FLAGS, tmp_path)
    killed = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert killed["envs"] is None and killed["global_step"] == 300
    resumed = run_script(SCRIPT, *ENVPOOL_RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    line = "the simulator's state is not in the checkpoint: resuming with freshly reset environments"
    assert resumed.stdout.count(line) == 1, resumed.stdout
    assert run_dirs(tmp_path) == [run_dir]
    final = torch.load(run_dir / "checkpoint.pt", weights_only=False)  # the last one, at step 600
    steps = (600 - 300) // 2  # steps of each of the 2 envs from the resume to it
    assert final["global_step"] == 600 and final["critic_updates"] == killed["critic_updates"] + 2 * steps
    # The replay buffer continues: the saved columns that the new ones (written after them, wrapping around at 300)
    # have not overwritten are as they were.
    rb, saved = final["replay_buffer"], killed["replay_buffer"]
    total = saved["size"] + steps
    assert rb["size"] == min(total, 300) and rb["pos"] == total % 300
    kept = slice(max(0, total - 300), saved["size"])
    assert all(torch.equal(rb[name][:, kept], saved[name][:, kept]) for name in fast_td3.ReplayBuffer.FIELDS)
    # The statistics continue: every observation acted on after the resume (2 a step) joins the saved ones.
    assert final["obs_normalizer"]["count"].item() == killed["obs_normalizer"]["count"].item() + 2 * steps


def test_actions_of_a_task_without_bounds_are_the_policys_own():
    """mjlab's tasks have no action bounds (joint offsets): the policy's [-1, 1] goes to the task as it is (the authors'
    Isaac Lab action_bounds 1.0); finite bounds keep their mapping."""
    from types import SimpleNamespace

    envs = SimpleNamespace(action_low=torch.tensor([-np.inf, -2.0]), action_high=torch.tensor([np.inf, 3.0]))
    low, high = fast_td3.action_bounds(envs)
    assert torch.equal(low, torch.tensor([-1.0, -2.0])) and torch.equal(high, torch.tensor([1.0, 3.0]))
    actions = torch.tensor([[0.5, 1.0], [-1.0, -1.0]])
    assert torch.equal(fast_td3.to_env_actions(actions, low, high), torch.tensor([[0.5, 3.0], [-1.0, -2.0]]))
