"""simbav2_continuous_action.py: the hyperspherical pieces (normalisation, the weight projection, the encoder, the
critics and the policy) against plain float64 references written from the authors' definitions, the categorical
projection against a plain loop, the reward scale against a plain computation; the script's own loop under
tests/probe.py (stored rows; the observation and reward statistics; every policy-and-temperature and critic step's
gradients against float64 references with the target held constant; no gradient into the target critics, the critics
unmoved by the policy step; every step Adam's, then the projection back onto the sphere, with every constrained weight
on the sphere after every step; the learning-rate schedule; Polyak averaging); smoke with the saved model's evaluation,
SIGKILL + exact resume, bad input."""

from __future__ import annotations

import json
import math

import continuous_reference as plain
import numpy as np
import pytest
import simbav2_continuous_action as simba
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, assert_same_gradient, gradients, leaves

SCRIPT = "simbav2_continuous_action.py"
LOSS_KEYS = ["losses/qf_loss", "losses/qf_values", "losses/actor_loss", "losses/alpha", "losses/alpha_loss"]
LOSS_KEYS += ["charts/learning_rate", "charts/reward_scale"]


# --- plain references, read from state dicts in float64 ----------------------------------------------------------


def unit(x: torch.Tensor) -> torch.Tensor:
    """x over its Euclidean norm, row by row."""
    return x / torch.sqrt((x**2).sum(-1, keepdim=True)).clamp_min(1e-8)


def plain_encoder(s: dict, prefix: str, i: int, x, c_shift: float, num_blocks: int, hidden: int) -> torch.Tensor:
    """The authors' HyperEmbedder and HyperLERPBlocks for network i of a stack: concat(x, c_shift) onto the sphere,
    embed, scale, onto the sphere; each block: h = unit(W2 (ReLU(s1 * W1 x) + 1e-8)), x = unit(x + alpha (h - x)). A
    scaler is its parameter times init / scale: 1 everywhere but alpha, whose init is 1 / (num_blocks + 1) and scale
    1 / sqrt(hidden)."""
    x = torch.cat([x.double(), torch.full((len(x), 1), c_shift, dtype=torch.float64)], dim=1)
    x = unit(unit(x) @ s[f"{prefix}.embed.weight"][i] * s[f"{prefix}.embed_scaler.scaler"][i])
    alpha_factor = (1 / (num_blocks + 1)) / (1 / math.sqrt(hidden))
    for b in range(num_blocks):
        block = f"{prefix}.blocks.{b}"
        h = (x @ s[f"{block}.up.weight"][i] * s[f"{block}.up_scaler.scaler"][i]).relu() + 1e-8
        h = unit(h @ s[f"{block}.down.weight"][i])
        x = unit(x + s[f"{block}.alpha.scaler"][i] * alpha_factor * (h - x))
    return x


def plain_head(s: dict, prefix: str, i: int, z: torch.Tensor) -> torch.Tensor:
    return (z @ s[f"{prefix}.w1.weight"][i] * s[f"{prefix}.scaler.scaler"][i]) @ s[f"{prefix}.w2.weight"][i] + s[
        f"{prefix}.bias"
    ][i]


def plain_critic_log_probs(state: dict, i: int, obs, actions, c_shift, num_blocks, hidden) -> torch.Tensor:
    """Critic i's log-probabilities over the bins [batch, bins]."""
    s = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    z = plain_encoder(s, "encoder", i, torch.cat([obs, actions], dim=-1), c_shift, num_blocks, hidden)
    return torch.log_softmax(plain_head(s, "head", i, z), dim=-1)


def plain_policy(state: dict, obs, noise, c_shift, num_blocks, hidden) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' HyperNormalTanhPolicy: mean and log std heads, the log std tanh-squashed onto [-10, 2]; the
    action tanh(mean + std * noise) and its log-probability (change of variables)."""
    s = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    z = plain_encoder(s, "encoder", 0, obs, c_shift, num_blocks, hidden)
    mean = plain_head(s, "mean_head", 0, z)
    log_std = -10.0 + 12.0 * 0.5 * (1 + torch.tanh(plain_head(s, "log_std_head", 0, z)))
    u = mean + log_std.exp() * noise.double()
    log_prob = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1)
    return torch.tanh(u), log_prob - torch.log(1 - torch.tanh(u) ** 2).sum(-1)


def plain_projection(probs, atoms, v_min: float, v_max: float) -> torch.Tensor:
    """By loops: each atom clipped into [v_min, v_max], at fractional bin position b, gives p * (ceil(b) - b) to bin
    floor(b) and p * (b - floor(b)) to bin ceil(b); all of p to bin b where b is a whole number."""
    batch, k = probs.shape
    dz = (v_max - v_min) / (k - 1)
    out = torch.zeros(batch, k, dtype=torch.float64)
    for i in range(batch):
        for j in range(k):
            b = (min(max(float(atoms[i, j]), v_min), v_max) - v_min) / dz
            lower, upper = math.floor(b), math.ceil(b)
            if lower == upper:
                out[i, lower] += probs[i, j]
            else:
                out[i, lower] += probs[i, j] * (upper - b)
                out[i, upper] += probs[i, j] * (b - lower)
    return out


# --- the math ----------------------------------------------------------------------------------------------------


def test_l2_normalize_puts_rows_on_the_unit_sphere_and_keeps_their_direction():
    x = torch.randn(5, 7, dtype=torch.float64) * 3
    y = simba.l2_normalize(x)
    torch.testing.assert_close(y.norm(dim=-1), torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(y * x.norm(dim=-1, keepdim=True), x)
    assert torch.equal(simba.l2_normalize(torch.zeros(2, 3)), torch.zeros(2, 3))


def test_the_projection_puts_every_hyper_weight_back_on_the_sphere_and_leaves_the_rest():
    torch.manual_seed(0)
    critics = simba.Critics(3, 2, n=2, hidden=8, num_blocks=2, c_shift=3.0, num_bins=11, g_max=5.0)
    with torch.no_grad():
        for p in critics.parameters():
            p.add_(torch.randn_like(p))
    before = {k: v.clone() for k, v in critics.state_dict().items()}
    simba.project_onto_sphere(critics)
    hyper = [k for k in before if k.endswith(".weight")]
    assert len(hyper) == 1 + 2 * 2 + 2  # the embedding, up and down per block, the head's two
    for name, value in critics.state_dict().items():
        if name in hyper:  # every column [critic, :, unit]: the weights into one unit
            torch.testing.assert_close(value.norm(dim=1), torch.ones_like(value.norm(dim=1)))
            torch.testing.assert_close(value * before[name].norm(dim=1, keepdim=True), before[name])
        else:
            assert torch.equal(value, before[name]), name


def test_the_critics_and_the_policy_are_the_authors_networks_at_the_authors_initial_scales():
    torch.manual_seed(1)
    critics = simba.Critics(3, 2, n=2, hidden=16, num_blocks=2, c_shift=3.0, num_bins=11, g_max=5.0)
    actor = simba.Actor(3, 2, hidden=8, num_blocks=1, c_shift=3.0)
    with torch.no_grad():  # move the scalers and biases off their initial values, so that every term shows
        for name, p in [*critics.named_parameters(), *actor.named_parameters()]:
            if not name.endswith(".weight"):
                p.mul_(1 + 0.5 * torch.rand_like(p)).add_(0.1 * torch.randn_like(p))
    obs, actions, noise = torch.randn(6, 3) * 4, torch.rand(6, 2) * 2 - 1, torch.randn(6, 2)
    log_probs = critics(obs, actions)
    assert log_probs.shape == (2, 6, 11)
    for i in range(2):
        expected = plain_critic_log_probs(critics.state_dict(), i, obs, actions, 3.0, 2, 16)
        torch.testing.assert_close(log_probs[i].double(), expected, rtol=1e-5, atol=1e-5)
    bins = torch.linspace(-5, 5, 11, dtype=torch.float64)
    expected_q = (log_probs.double().exp() * bins).sum(-1)
    torch.testing.assert_close(critics.expected_q(log_probs).double(), expected_q, rtol=1e-5, atol=1e-6)
    action, log_prob = actor.sample(obs, noise)
    expected_action, expected_log_prob = plain_policy(actor.state_dict(), obs, noise, 3.0, 1, 8)
    torch.testing.assert_close(action.double(), expected_action, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(log_prob.double(), expected_log_prob, rtol=1e-5, atol=1e-4)
    # The authors' initial values: scalers sqrt(2 / hidden) (a block's wide one halved), alpha 1 / sqrt(hidden)
    # (times sqrt(hidden) / (blocks + 1) forward: 1 / 3), the heads' scalers 1, biases 0, weights on the sphere.
    fresh = simba.Critics(3, 2, n=2, hidden=16, num_blocks=2, c_shift=3.0, num_bins=11, g_max=5.0).state_dict()
    assert torch.allclose(fresh["encoder.embed_scaler.scaler"], torch.tensor(math.sqrt(2 / 16)))
    assert torch.allclose(fresh["encoder.blocks.1.up_scaler.scaler"], torch.tensor(math.sqrt(2 / 16) / 2))
    assert torch.allclose(fresh["encoder.blocks.0.alpha.scaler"], torch.tensor(1 / 4.0))
    assert torch.equal(fresh["head.scaler.scaler"], torch.ones(2, 1, 16)) and not fresh["head.bias"].any()
    for name in (k for k in fresh if k.endswith(".weight")):
        torch.testing.assert_close(fresh[name].norm(dim=1), torch.ones_like(fresh[name].norm(dim=1)))
    assert not torch.equal(fresh["encoder.embed.weight"][0], fresh["encoder.embed.weight"][1])  # initialised apart


def test_the_categorical_projection_matches_a_plain_loop_with_clipping_and_whole_positions():
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4, 11, generator=generator, dtype=torch.float64), -1)
    atoms = torch.randn(4, 11, generator=generator, dtype=torch.float64) * 4  # some beyond [-5, 5]
    atoms[0, :5] = torch.tensor([-5.0, 0.0, 2.0, 5.0, 7.0])  # on bins, and clipped onto the last
    bins = torch.linspace(-5, 5, 11, dtype=torch.float64)
    got = simba.categorical_projection(probs, atoms, bins)
    torch.testing.assert_close(got, plain_projection(probs, atoms, -5.0, 5.0))
    torch.testing.assert_close(got.sum(-1), torch.ones(4, dtype=torch.float64))


def plain_reward_denominators(rewards, dones, gamma, g_max) -> list[float]:
    """After each step [num_envs] of rewards and episode ends: G_e <- gamma (1 - done_e) G_e + r_e for each env, the
    population variance of every G value so far (with gymnasium's prior: count 1e-4, mean 0, variance 1), the largest
    |G| so far; the scale max(sqrt(var + 1e-8), max |G| / g_max)."""
    returns, seen, largest, out = [0.0] * len(rewards[0]), [], 0.0, []
    for reward, done in zip(rewards, dones):
        returns = [gamma * (1 - float(d)) * g + float(r) for g, r, d in zip(returns, reward, done)]
        seen += returns
        count = 1e-4 + len(seen)
        mean = sum(seen) / count  # the prior's mean 0 weighs 1e-4
        var = (1e-4 * (1 + mean**2) + sum((g - mean) ** 2 for g in seen)) / count
        largest = max([largest] + [abs(g) for g in returns])
        out.append(max(math.sqrt(var + 1e-8), largest / g_max))
    return out


@pytest.mark.parametrize("g_max, bound", [(0.5, "largest return"), (50.0, "standard deviation")])
def test_the_reward_scale_matches_a_plain_computation(g_max, bound):
    generator = np.random.default_rng(0)
    rewards, dones = generator.normal(1.0, 2.0, (30, 3)), generator.random((30, 3)) < 0.2
    scaler = simba.RewardScaler(3, gamma=0.9, g_max=g_max)
    got = []
    for reward, done in zip(rewards, dones):
        scaler.update(torch.tensor(reward), torch.tensor(done, dtype=torch.float64))
        got.append(scaler.denominator().item())
    np.testing.assert_allclose(got, plain_reward_denominators(rewards, dones, 0.9, g_max), rtol=1e-10)
    std, largest = math.sqrt(scaler.return_rms.var.item() + 1e-8), scaler.max_abs_return.item() / g_max
    assert got[-1] == pytest.approx(largest if bound == "largest return" else std) and largest != pytest.approx(std)


def test_the_discount_follows_the_time_limit_as_the_authors_set_it():
    assert simba.discount_from_time_limit(1000) == pytest.approx(0.995)
    assert simba.discount_from_time_limit(200) == pytest.approx(0.975)
    assert simba.discount_from_time_limit(8) == pytest.approx(0.95)
    assert simba.discount_from_time_limit(None) == pytest.approx(0.995)


# --- the loop's own wiring ----------------------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs: 88 steps of random actions, then 16 environment
# steps of 2 updates each (--utd-ratio 2), each a policy-and-temperature step, a critic step and a Polyak update.
# Two critics of 2 blocks of 8 (expanded to 32), 11 bins on [-2, 2]; the actor 1 block of 8. A large learning rate
# and a small support, so that every term moves the weights and some target atoms are clipped.
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "120", "--batch-size", "16"]
PROBE_FLAGS += ["--learning-starts", "88", "--total-timesteps", "104", "--gamma", "0.9", "--tau", "0.1"]
PROBE_FLAGS += ["--utd-ratio", "2", "--critic-hidden-dim", "8", "--actor-hidden-dim", "8", "--num-bins", "11"]
PROBE_FLAGS += [
    "--g-max",
    "2",
    "--learning-rate-init",
    "1e-2",
    "--learning-rate-end",
    "4e-3",
    "--temperature-init",
    "0.2",
]
PROBE_STEP_NAMES = ["obs_np", "next_obs_np", "actions", "rewards", "terminations", "truncations", "infos"]
PROBE_AT_BACKWARD = ["raw_batch", "noise", "t", "repeat", "update", "lr", "temperature", "log_temperature"]
PROBE_AT_BACKWARD += ["actor", "qf", "qf_target", "obs_rms", "reward_scaler", "q_optimizer", "actor_optimizer"]
GAMMA, TAU, LEARNING_STARTS, UTD, TARGET_ENTROPY, G_MAX = 0.9, 0.1, 88, 2, -1.0, 2.0
C_SHIFT, CRITIC_BLOCKS, ACTOR_BLOCKS, HIDDEN = 3.0, 2, 1, 8


@pytest.fixture(scope="module", params=["two_critics", "one_critic"])
def probed(request, tmp_path_factory):
    """The probed run with the authors' two critics (the target from the one of smaller mean), and with one
    (--no-use-cdq: the authors' num_qs 1)."""
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS + ([] if request.param == "two_critics" else ["--no-use-cdq"]),
        cwd,
        watch=PROBE_STEP_NAMES,
        at_backward=PROBE_AT_BACKWARD,
        grads=["qf", "actor", "log_temperature", "qf_target"],
        final=["rb", "actor", "qf"],
        preload=["probe_box_envs"],
    )
    return trace, cwd


def critics_in(state: dict) -> int:
    """How many critics a state dict of Critics holds (its weights are stacked [critics, in, out])."""
    return state["head.w2.weight"].shape[0]


def steps_of(trace) -> list[dict]:
    return [entry for entry in trace.steps if entry["step"] > 0]


def policy_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_actor"]


def critic_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_critics"]


@pytest.fixture(scope="module")
def statistics(probed):
    """What the normalisers should hold after each vector step k (plain computations from what the env returned):
    the running mean / variance of every observation acted on (from the prior count 1e-4, mean 0, variance 1), and the
    reward scale."""
    trace, _ = probed
    steps = steps_of(trace)
    obs_stats, stats = [], {"mean": np.zeros(4), "var": np.ones(4), "count": 1e-4}
    for step in steps:
        stats = plain.merge_statistics(stats, np.asarray(step["obs_np"], dtype=np.float64))
        obs_stats.append(stats)
    rewards = [np.asarray(step["rewards"], dtype=np.float64) for step in steps]
    dones = [np.asarray(step["terminations"]) | np.asarray(step["truncations"]) for step in steps]
    return obs_stats, plain_reward_denominators(rewards, dones, GAMMA, G_MAX)


def normalised_batch(entry: dict, statistics) -> dict:
    """The entry's raw minibatch as the update should see it: observations by the plain statistics after the step
    that preceded the update, rewards over the plain reward scale."""
    obs_stats, denominators = statistics
    k = (entry["t"] + 1) // 2 - 1  # the vector step (2 envs) that environment step t belongs to
    stats, raw = obs_stats[k], entry["raw_batch"]
    norm = lambda x: (x.double() - torch.as_tensor(stats["mean"])) / torch.sqrt(torch.as_tensor(stats["var"]) + 1e-8)  # noqa: E731
    return {
        "obs": norm(raw["obs"]),
        "next_obs": norm(raw["next_obs"]),
        "actions": raw["actions"].double(),
        "rewards": raw["rewards"].double() / denominators[k],
        "terminations": raw["terminations"].double(),
    }


def test_the_loop_stores_each_step_raw_with_unit_actions_and_the_true_next_observation(probed):
    trace, cwd = probed
    steps = steps_of(trace)
    assert len(steps) == 52
    ends = plain.check_stored_rows(steps, trace.final["rb"], 4, 2, actions_name="actions")
    assert min(ends.values()) >= 5, ends
    assert all(np.abs(step["actions"]).max() <= 1 for step in steps)  # the policy's [-1, 1], not the env's bounds
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), LOSS_KEYS)
    use_cdq = json.loads((run_dir / "args.json").read_text())["use_cdq"]
    assert critics_in(trace.final["qf"]) == (2 if use_cdq else 1)


def test_the_observation_and_reward_statistics_follow_every_step(probed, statistics):
    trace, _ = probed
    obs_stats, denominators = statistics
    for entry in trace.backward:
        k, where = (entry["t"] + 1) // 2 - 1, f"update at t={entry['t']}"
        rms = plain.rms_state(entry["obs_rms"])
        np.testing.assert_allclose(rms["mean"], obs_stats[k]["mean"], rtol=1e-9, atol=1e-12, err_msg=where)
        np.testing.assert_allclose(rms["var"], obs_stats[k]["var"], rtol=1e-9, err_msg=where)
        assert rms["count"] == pytest.approx(obs_stats[k]["count"])
        scaler = entry["reward_scaler"]
        got = max(math.sqrt(scaler["return_rms.var"].item() + 1e-8), scaler["max_abs_return"].item() / G_MAX)
        assert got == pytest.approx(denominators[k], rel=1e-9), where
    assert max(denominators) > min(denominators) * 1.05  # the scale moved during the probe


def test_each_policy_and_temperature_step_follows_the_minimum_critic_with_the_critics_frozen(probed, statistics):
    trace, _ = probed
    policies, critics = policy_entries(trace), critic_entries(trace)
    expected_updates = [(t, r) for t in range(LEARNING_STARTS + 1, 105) for r in range(UTD)]
    assert [(e["t"], e["repeat"]) for e in policies] == expected_updates
    assert [(e["t"], e["repeat"]) for e in critics] == expected_updates
    previous_critic = None
    for entry, critic in zip(policies, critics):
        where = f"policy step at t={entry['t']}.{entry['repeat']}"
        batch = normalised_batch(entry, statistics)
        params = leaves(entry["actor"]) | {"log_temperature": entry["log_temperature"].double().requires_grad_(True)}
        actions, log_prob = plain_policy(params, batch["obs"], entry["noise"], C_SHIFT, ACTOR_BLOCKS, HIDDEN)
        bins = torch.linspace(-G_MAX, G_MAX, 11, dtype=torch.float64)
        q = torch.stack(
            [
                (
                    plain_critic_log_probs(entry["qf"], i, batch["obs"], actions, C_SHIFT, CRITIC_BLOCKS, HIDDEN).exp()
                    * bins
                ).sum(-1)
                for i in range(critics_in(entry["qf"]))
            ]
        ).amin(0)
        temperature = params["log_temperature"].detach().exp()
        actor_loss = (temperature * log_prob - q).mean()
        temperature_loss = params["log_temperature"].exp() * (-log_prob.detach().mean() - TARGET_ENTROPY)
        reference = gradients(actor_loss + temperature_loss, params)
        assert_gradients_match(entry["grads"]["actor"], reference, where)
        assert_gradients_match({"log_temperature": entry["grads"]["log_temperature"]}, reference, where)
        assert entry["loss"].item() == pytest.approx((actor_loss + temperature_loss).item(), rel=1e-5, abs=1e-6)
        # The critics were frozen: their gradients are what the previous critic step left.
        assert_same_gradient(
            entry["grads"]["qf"],
            previous_critic["grads"]["qf"] if previous_critic else {k: None for k in entry["grads"]["qf"]},
            where,
        )
        assert not torch.equal(entry["noise"], critic["noise"])  # fresh noise for the target's a'
        assert torch.equal(entry["raw_batch"]["obs"], critic["raw_batch"]["obs"])  # one minibatch per update
        previous_critic = critic
    assert policies[-1]["temperature"].item() != pytest.approx(0.2)  # the temperature was tuned


def test_each_critic_step_minimises_the_cross_entropy_to_the_projected_target_of_the_smaller_critic(probed, statistics):
    trace, _ = probed
    policies = policy_entries(trace)
    bins = torch.linspace(-G_MAX, G_MAX, 11, dtype=torch.float64)
    clipped = terminal = 0
    for entry, policy in zip(critic_entries(trace), policies):
        where = f"critic step at t={entry['t']}.{entry['repeat']}"
        batch = normalised_batch(entry, statistics)
        with torch.no_grad():  # the target held constant: the updated policy and temperature, the target critics
            next_actions, next_log_prob = plain_policy(
                entry["actor"], batch["next_obs"], entry["noise"], C_SHIFT, ACTOR_BLOCKS, HIDDEN
            )
            next_log_probs = [
                plain_critic_log_probs(
                    entry["qf_target"], i, batch["next_obs"], next_actions, C_SHIFT, CRITIC_BLOCKS, HIDDEN
                )
                for i in range(critics_in(entry["qf"]))
            ]
            means = torch.stack([(lp.exp() * bins).sum(-1) for lp in next_log_probs])
            chosen = torch.stack([next_log_probs[int(means[:, j].argmin())][j].exp() for j in range(16)])
            alpha = entry["log_temperature"].double().exp()
            atoms = batch["rewards"][:, None] + GAMMA * (1 - batch["terminations"][:, None]) * (
                bins[None] - alpha * next_log_prob[:, None]
            )
            target = plain_projection(chosen, atoms, -G_MAX, G_MAX)
        qf = leaves(entry["qf"])
        loss = sum(
            -(target * plain_critic_log_probs(qf, i, batch["obs"], batch["actions"], C_SHIFT, CRITIC_BLOCKS, HIDDEN))
            .sum(-1)
            .mean()
            for i in range(critics_in(entry["qf"]))
        )
        assert_gradients_match(entry["grads"]["qf"], gradients(loss, qf), where)
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        reached = [name for name, grad in entry["grads"]["qf_target"].items() if grad is not None]
        assert not reached, f"{where}: a gradient reached the target critics ({reached})"
        assert_same_gradient(entry["grads"]["actor"], policy["grads"]["actor"], f"{where}: the actor")
        clipped += int((atoms.abs() > G_MAX).sum())
        terminal += int(batch["terminations"].sum())
    assert clipped > 0 and terminal > 10, (clipped, terminal)


def adam_then_sphere(params: dict, grads: dict, optimizer: dict, names: list[str], lr: float, project) -> dict:
    """Each named parameter after one Adam step with `grads` (the recorded ones) from the optimiser state before it,
    then, for the names `project` picks, back onto the sphere (columns of [ensemble, in, out] normalised)."""
    states, group = optimizer["state"], {**optimizer["param_groups"][0], "lr": lr}
    out = {}
    for index, name in enumerate(names):
        value = plain.adam_step(params[name], grads[name].double(), states.get(index, {}), group)
        out[name] = value / value.norm(dim=1, keepdim=True) if project(name) else value
    return out


def on_sphere(state: dict, where: str) -> None:
    weights = [name for name in state if name.endswith(".weight")]
    assert weights, where
    for name in weights:
        norms = state[name].double().norm(dim=1)
        torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=2e-6, msg=f"{where}: {name} off")


def test_every_step_is_adam_at_the_scheduled_rate_then_the_projection_onto_the_sphere(probed):
    trace, _ = probed
    policies, critics = policy_entries(trace), critic_entries(trace)
    hyper = lambda name: name.endswith(".weight")  # noqa: E731
    for k, (policy, critic) in enumerate(zip(policies, critics)):
        where = f"update {k} (t={policy['t']}.{policy['repeat']})"
        expected_lr = 1e-2 + (4e-3 - 1e-2) * min(k / (UTD * 104), 1.0)
        assert policy["update"] == k and policy["lr"] == pytest.approx(expected_lr), where
        for optimizer in ("actor_optimizer", "q_optimizer"):
            assert all(g["lr"] == pytest.approx(expected_lr) for g in critic[optimizer]["param_groups"]), where
        on_sphere(policy["actor"], where), on_sphere(policy["qf"], where)
        # The actor and temperature after this update's policy step (as the critic step found them).
        names = list(policy["actor"])
        names = [n for n in names if n in policy["grads"]["actor"]]
        params = {n: policy["actor"][n].double() for n in names} | {"log_temperature": policy["log_temperature"]}
        grads = policy["grads"]["actor"] | {"log_temperature": policy["grads"]["log_temperature"]}
        after = adam_then_sphere(
            params, grads, policy["actor_optimizer"], [*names, "log_temperature"], expected_lr, hyper
        )
        for name in names:
            torch.testing.assert_close(
                critic["actor"][name].double(), after[name], rtol=1e-5, atol=1e-6, msg=f"{where}: {name}"
            )
        torch.testing.assert_close(critic["log_temperature"].double(), after["log_temperature"], rtol=1e-6, atol=1e-7)
        # The critics after this update's critic step (as the next policy step found them), and the Polyak update.
        if k + 1 < len(critics):
            names = list(critic["grads"]["qf"])
            after = adam_then_sphere(
                {n: critic["qf"][n].double() for n in names},
                critic["grads"]["qf"],
                critic["q_optimizer"],
                names,
                expected_lr,
                hyper,
            )
            nxt = critics[k + 1]
            assert_same_state = policies[k + 1]["qf"]
            for name in names:
                torch.testing.assert_close(assert_same_state[name], nxt["qf"][name], rtol=0, atol=0)  # unmoved
                torch.testing.assert_close(
                    nxt["qf"][name].double(), after[name], rtol=1e-5, atol=1e-6, msg=f"{where}: {name}"
                )
                polyak = critic["qf_target"][name].double() + TAU * (
                    nxt["qf"][name].double() - critic["qf_target"][name].double()
                )
                torch.testing.assert_close(nxt["qf_target"][name].double(), polyak, rtol=1e-5, atol=1e-7)
    on_sphere(trace.final["actor"], "the final actor"), on_sphere(trace.final["qf"], "the final critics")
    assert all(torch.equal(critics[0]["qf_target"][k], critics[0]["qf"][k]) for k in critics[0]["qf"])


# --- runs ------------------------------------------------------------------------------------------------------------
TINY = ["--env-id", "Pendulum-v1", "--batch-size", "32", "--buffer-size", "500", "--critic-hidden-dim", "16"]
TINY += ["--actor-hidden-dim", "8", "--critic-num-blocks", "1", "--num-bins", "21", "--torch-threads", "1"]
RESUME_FLAGS = [*TINY, "--learning-starts", "150", "--total-timesteps", "400", "--checkpoint-every", "150"]
RESUME_FLAGS += ["--save-model", "--eval-episodes", "1"]


def saved_weights(run_dir) -> dict:
    model = torch.load(run_dir / "simbav2_continuous_action.cleanrl_model", weights_only=False)
    return {f"{part}.{k}": v for part in ("actor", "qf", "obs_rms") for k, v in model[part].items()}


def test_sigkill_then_resume_reproduces_the_uninterrupted_run_and_evaluates_the_saved_model(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr
    assert "evaluation over 1 episodes" in result.stdout
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] in (150, 300) and checkpoint["replay_buffer"]["size"] == checkpoint["global_step"]
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir]
    (straight_dir,) = run_dirs(straight)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    assert_finite_keys(straight_scalars, ["charts/episodic_return", *LOSS_KEYS, "eval/episodic_return"])
    for key in ("charts/episodic_return", "losses/qf_loss", "losses/actor_loss", "losses/alpha", "charts/reward_scale"):
        assert resumed_scalars[key] == straight_scalars[key], key
    a, b = saved_weights(run_dir), saved_weights(straight_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a if isinstance(a[key], torch.Tensor))


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["Box", "cleanrl/dqn.py"]),
        (["--env-id", "Pendulum-v1", "--num-bins", "1"], ["--num-bins must be at least 2"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(utd_ratio=0), "--utd-ratio must be positive"),
        (dict(critic_hidden_dim=0), "--critic-hidden-dim must be positive"),
        (dict(learning_rate_end=-1.0), "--learning-rate-end must be 0 or positive"),
        (dict(gamma=1.5), "--gamma and --tau must be in (0, 1]"),
        (dict(batch_size=2000, buffer_size=1000), "--batch-size 2000 is larger than --buffer-size 1000"),
        (dict(buffer_size=10**13), "replay buffer"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = simba.Args(**{"env_id": "Pendulum-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        simba.validate(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
