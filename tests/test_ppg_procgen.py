"""ppg_procgen.py: the auxiliary phase (value distillation under the clone-KL term), the networks' shapes and PPG's
normed initialisation, the loop's own wiring on StarpilotEasy-v0 with a tiny auxiliary phase (its run is also the smoke
test), SIGKILL + resume, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

pytest.importorskip("envpool")
import ppg_procgen  # noqa: E402
from test_ppo_procgen import env_stream, impala_features, reference_advantages, reference_scaled_rewards  # noqa: E402
from update_reference import RTOL, assert_gradients_match, gradients  # noqa: E402

# 2 envs x 16 steps, an auxiliary phase every 2 iterations (64 steps): 1 epoch over minibatches of 2 rollouts.
TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--n-iteration", "2"]
TINY += ["--e-auxiliary", "1", "--num-aux-rollouts", "2"]
AUX_KEYS = ["losses/aux/kl_loss", "losses/aux/aux_value_loss", "losses/aux/real_value_loss"]
PPO_KEYS = ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac"]


def aux_phase_outcome(beta_clone: float) -> dict[str, float]:
    """Distil learnable value targets on random 16x16 frames; report the errors before and after, and the KL of the
    policy before the phase to the policy after it, over the valid steps."""
    torch.set_num_threads(1)  # as the scripts run (--torch-threads 1): many threads on a busy CPU are far slower
    torch.manual_seed(0)
    num_steps, rollouts, shape = 8, 8, (3, 16, 16)
    obs = torch.randint(0, 256, (num_steps, rollouts) + shape, dtype=torch.uint8)
    returns = 1.0 + (obs.float().mean(dim=(2, 3, 4)) / 255 - 0.5) * 20
    valid = torch.ones(num_steps, rollouts, dtype=torch.bool)
    valid[3, 1] = False  # an autoreset step: its target must not be used
    returns[3, 1] = float("nan")
    torch.manual_seed(1)
    policy, value_net = ppg_procgen.PolicyNetwork(shape, 15), ppg_procgen.ValueNetwork(shape)
    with torch.no_grad():
        policy.actor.weight.normal_(0, 0.5)  # a policy far from uniform, so that drifting from it shows
    optimizer = torch.optim.Adam([*policy.parameters(), *value_net.parameters()], lr=1e-3, eps=1e-8)
    flat, targets = obs.flatten(0, 1)[valid.flatten()], returns.flatten()[valid.flatten()]

    def measure() -> tuple[torch.Tensor, float, float]:
        with torch.no_grad():
            log_probs, aux_values = policy.log_probs_and_aux_value(flat)
            return (
                log_probs,
                ((aux_values - targets) ** 2).mean().item(),
                ((value_net(flat) - targets) ** 2).mean().item(),
            )

    old, aux_before, value_before = measure()
    losses = ppg_procgen.auxiliary_phase(policy, value_net, optimizer, obs, returns, valid, 6, 2, beta_clone, 0.5)
    new, aux_after, value_after = measure()
    assert all(torch.isfinite(p).all() for p in [*policy.parameters(), *value_net.parameters()])
    assert sorted(losses) == sorted(AUX_KEYS) and all(torch.isfinite(v) for v in losses.values())
    kl = (old.exp() * (old - new)).sum(-1).mean().item()
    return dict(aux_before=aux_before, aux_after=aux_after, value_before=value_before, value_after=value_after, kl=kl)


def test_auxiliary_phase_trains_the_aux_head_and_keeps_the_policy_within_its_clone_kl_bound():
    cloned, free = aux_phase_outcome(beta_clone=1.0), aux_phase_outcome(beta_clone=0.0)
    # The auxiliary value head and the value network learn the targets ...
    assert cloned["aux_after"] < 0.2 * cloned["aux_before"]
    assert cloned["value_after"] < 0.2 * cloned["value_before"]
    # ... while the clone term holds the policy: with it the policy moves little, without it far more (measured with
    # the normed initialisation: 0.11 against 7.4).
    assert cloned["kl"] < 0.25
    assert free["kl"] > 20 * cloned["kl"]


def test_networks_take_procgen_frames():
    policy, value_net = ppg_procgen.PolicyNetwork((3, 64, 64), 15), ppg_procgen.ValueNetwork((3, 64, 64))
    assert policy.network[5].in_features == 32 * 8 * 8 and value_net.network[5].in_features == 32 * 8 * 8
    obs = torch.randint(0, 256, (3, 3, 64, 64), dtype=torch.uint8)
    action, logprob = policy.act(obs)
    again, entropy = policy.evaluate_actions(obs, action)
    log_probs, aux_value = policy.log_probs_and_aux_value(obs)
    assert action.shape == logprob.shape == aux_value.shape == value_net(obs).shape == (3,)
    assert torch.allclose(logprob, again) and log_probs.shape == (3, 15) and (entropy > 0).all()
    assert not set(map(id, policy.parameters())) & set(map(id, value_net.parameters()))  # separate networks


# The PPG code's initialisation (openai/phasic-policy-gradient: NormedConv2d, NormedLinear, ImpalaCNN): each layer's
# weight vector per output unit has a fixed norm, biases are zero. Per conv sequence of the 3: first conv 1; residual
# blocks share 1/sqrt(3), each block 1/sqrt(3)/sqrt(2), each of its convs the square root of that; the dense layer 1.4;
# the policy, value and auxiliary value heads 0.1.
RESIDUAL_SCALE = (1 / np.sqrt(3) / np.sqrt(2)) ** 0.5


def normed_scale(name: str) -> float:
    if name.startswith(("actor", "critic", "aux_critic")):
        return 0.1
    if name == "network.5":
        return 1.4
    return RESIDUAL_SCALE if ".res_block" in name else 1.0


def assert_normed_init(state: dict) -> int:
    """Every weight's norm per output unit is its layer's scale and every bias is zero; returns the layers checked."""
    layers = [name.removesuffix(".weight") for name in state if name.endswith(".weight")]
    for name in layers:
        weight = state[f"{name}.weight"]
        norms = weight.flatten(1).norm(dim=1)
        torch.testing.assert_close(norms, torch.full_like(norms, normed_scale(name)), rtol=1e-5, atol=0, msg=name)
        assert not state[f"{name}.bias"].any(), name
    return len(layers)


def test_networks_have_the_ppg_codes_normed_initialisation():
    policy, value_net = ppg_procgen.PolicyNetwork((3, 64, 64), 15), ppg_procgen.ValueNetwork((3, 64, 64))
    # 3 sequences x (1 + 2 blocks x 2) convs, the dense layer, then the heads: actor + aux critic, critic
    assert assert_normed_init(policy.state_dict()) == 3 * 5 + 1 + 2
    assert assert_normed_init(value_net.state_dict()) == 3 * 5 + 1 + 1
    assert RESIDUAL_SCALE == pytest.approx(0.6389, abs=1e-4)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "ALE/Breakout-v5"], ["cleanrl/ppo_atari.py"]),
        (["--env-id", "bigfish"], ["BigfishEasy-v0"]),
        ([*TINY, "--num-aux-rollouts", "9"], ["--num-aux-rollouts 9 exceeds"]),
        (["--n-iteration", "100000"], ["auxiliary buffer needs", "GB"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppg_procgen.py", *flags, cwd=workdir), workdir, *fragments)


# The loop's own wiring: the script runs unchanged under tests/probe.py (4 envs x 16 steps, 4 iterations, an auxiliary
# phase every 2 with 2 minibatches of 4 rollouts, gradients clipped to a norm of 0.05 so that the clipping acts, the
# clone term weighted 0.5 so that its weight shows; seed 3 scores and ends episodes within those 256 steps), which
# copies what the env returned at every step and, at every backward(), the networks, their gradients, the optimiser,
# the rollout storage and the minibatch; the tests rebuild rewards, advantages, both phases' losses and gradients (in
# float64) and each step's clipped gradient from those copies. The same run is the smoke test (TensorBoard keys, the
# saved model and its evaluation).
PROBE_FLAGS = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--n-iteration", "2", "--seed", "3"]
PROBE_FLAGS += ["--e-auxiliary", "1", "--num-aux-rollouts", "4", "--max-grad-norm", "0.05", "--beta-clone", "0.5"]
PROBE_FLAGS += ["--total-timesteps", "256", "--save-model", "--eval-episodes", "1"]
STREAM_NAMES = ["action", "reward", "terminated", "truncated", "next_obs_np"]
UPDATE_NAMES = ["policy", "value_net", "optimizer", "storage", "next_obs", "iteration", "mb_inds", "b_advantages"]
UPDATE_NAMES += ["b_returns", "cols", "mb_obs", "mb_returns", "mb_old", "kl_loss", "aux_value_loss", "real_value_loss"]
GAMMA, GAE_LAMBDA, NUM_ENVS, NUM_STEPS, ITERATIONS, MAX_GRAD_NORM, BETA_CLONE = 0.999, 0.95, 4, 16, 4, 0.05, 0.5
GRADS = ("policy", "value_net")  # the networks whose gradients the probe records, in the optimiser's order


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    torch.set_num_threads(1)  # as the script runs (--torch-threads 1): more threads on a busy CPU are far slower
    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        "ppg_procgen.py",
        PROBE_FLAGS,
        cwd,
        watch=STREAM_NAMES,
        at_backward=UPDATE_NAMES,
        grads=["policy", "value_net"],
        final=STREAM_NAMES,
    )
    return trace, cwd


def networks(update: dict, dtype=torch.float32) -> tuple[ppg_procgen.PolicyNetwork, ppg_procgen.ValueNetwork]:
    policy, value_net = ppg_procgen.PolicyNetwork((3, 64, 64), 15), ppg_procgen.ValueNetwork((3, 64, 64))
    policy.load_state_dict(update["policy"])
    value_net.load_state_dict(update["value_net"])
    return policy.to(dtype), value_net.to(dtype)


def heads(policy, value_net, obs: torch.Tensor, float32: tuple | None = None):
    """The policy, the auxiliary value and the value of uint8 frames, written out (no channels-last layout), in the
    networks' precision; with `float32` (the same two networks in float32), the torsos on the branches of the float32
    pass (test_ppo_procgen.impala_features)."""
    if float32 is None:
        hidden = policy.network(obs.to(policy.actor.weight.dtype) / 255.0)
        value_hidden = value_net.network(obs.to(value_net.critic.weight.dtype) / 255.0)
    else:
        hidden = impala_features(policy.network, float32[0].network, obs)
        value_hidden = impala_features(value_net.network, float32[1].network, obs)
    aux_value, value = policy.aux_critic(hidden).squeeze(-1), value_net.critic(value_hidden).squeeze(-1)
    return torch.distributions.Categorical(logits=policy.actor(hidden)), aux_value, value


def policy_updates(trace) -> list[dict]:
    return [u for u in trace.backward if u["where"] == "<module>"]


def aux_updates(trace) -> list[dict]:
    return [u for u in trace.backward if u["where"] == "auxiliary_phase"]


@pytest.fixture(scope="module")
def references(probed) -> list[dict]:
    """Per iteration, from the env stream and the networks that acted (copies taken at the iteration's first update,
    before any gradient step): scaled rewards, log-probabilities, values, advantages by a plain loop, transitions."""
    trace, _ = probed
    stream = env_stream(trace)
    scaled = reference_scaled_rewards(stream, GAMMA)
    out = []
    for i in range(ITERATIONS):
        update = next(u for u in policy_updates(trace) if u["iteration"] == i + 1)
        rows = stream[i * NUM_STEPS : (i + 1) * NUM_STEPS]
        policy, value_net = networks(update)
        with torch.no_grad():
            obs = torch.from_numpy(np.stack([row["obs"] for row in rows]))
            pi, _, values = heads(policy, value_net, obs.flatten(0, 1))
            last_value = value_net(torch.from_numpy(rows[-1]["next_obs"]))
        actions = torch.from_numpy(np.stack([row["action"] for row in rows]).reshape(-1))
        values = values.view(NUM_STEPS, NUM_ENVS).double().numpy()
        rewards = np.stack(scaled[i * NUM_STEPS : (i + 1) * NUM_STEPS])
        advantages = np.full((NUM_STEPS, NUM_ENVS), np.nan)
        for env in range(NUM_ENVS):
            env_rows = [
                (values[t, env], rewards[t, env], row["terminated"][env], row["truncated"][env], row["reset"][env])
                for t, row in enumerate(rows)
            ]
            env_rows.append((last_value[env].item(), 0.0, False, False, False))
            for t, advantage in enumerate(reference_advantages(env_rows, GAMMA, GAE_LAMBDA)[:NUM_STEPS]):
                if advantage is not None:
                    advantages[t, env] = advantage
        resets = np.stack([row["reset"] for row in rows])
        out.append(
            dict(
                obs=obs,
                actions=actions.view(NUM_STEPS, NUM_ENVS),
                log_probs=pi.log_prob(actions).view(NUM_STEPS, NUM_ENVS),
                rewards=rewards,
                values=values,
                advantages=advantages,
                returns=advantages + values,
                valid=~resets,
                transitions=np.flatnonzero(~resets.reshape(-1)),
            )
        )
    return out


def test_the_rollout_stores_the_stream_and_the_acting_networks_outputs(probed, references):
    trace, _ = probed
    stream = env_stream(trace)
    assert len(stream) == ITERATIONS * NUM_STEPS
    ends = resets = 0
    for i, reference in enumerate(references):
        storage = next(u for u in policy_updates(trace) if u["iteration"] == i + 1)["storage"]
        rows = stream[i * NUM_STEPS : (i + 1) * NUM_STEPS]
        assert torch.equal(storage["obs"], reference["obs"].view(storage["obs"].shape)), i
        assert torch.equal(storage["actions"], reference["actions"]), i
        assert storage["terminations"].tolist() == np.stack([row["terminated"] for row in rows]).astype(float).tolist()
        assert storage["truncations"].tolist() == np.stack([row["truncated"] for row in rows]).astype(float).tolist()
        assert storage["resets"].tolist() == (~reference["valid"]).tolist(), i  # the autoreset steps
        np.testing.assert_allclose(storage["rewards"], reference["rewards"], rtol=1e-5, err_msg=str(i))
        torch.testing.assert_close(storage["logprobs"], reference["log_probs"], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(storage["values"].numpy(), reference["values"], atol=1e-5, rtol=1e-5)
        ends += int(storage["terminations"].sum() + storage["truncations"].sum())
        resets += int(storage["resets"].sum())
    rewards = sum(int((row["reward"] != 0).sum()) for row in stream)
    assert rewards >= 4 and ends >= 2 and resets >= 1, (rewards, ends, resets)


def test_advantages_the_policy_phase_used_are_a_plain_gae_normalised_over_the_batchs_transitions(probed, references):
    trace, _ = probed
    for i, reference in enumerate(references):
        keep = reference["transitions"]
        advantages = reference["advantages"].reshape(-1)[keep]
        normalised = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
        for update in (u for u in policy_updates(trace) if u["iteration"] == i + 1):
            np.testing.assert_allclose(update["b_advantages"].numpy()[keep], normalised, atol=2e-4, rtol=1e-4)
            returns = reference["returns"].reshape(-1)[keep]
            np.testing.assert_allclose(update["b_returns"].numpy()[keep], returns, atol=2e-4, rtol=1e-4)
            assert set(update["mb_inds"].tolist()) <= set(keep.tolist())  # no autoreset step in a minibatch


def policy_phase_loss(update: dict, reference: dict, double: bool) -> tuple[torch.Tensor, tuple]:
    """PPO's loss of the minibatch (`double`: in float64): the clipped surrogate on the policy network with the
    batch-normalised advantages, the entropy bonus, the clipped value loss on the value network. Advantages, returns
    and the rollout's values and log-probabilities are constants."""
    dtype = torch.float64 if double else torch.float32
    policy, value_net = networks(update, dtype)
    mb = update["mb_inds"].numpy()
    keep = reference["transitions"]
    advantages = reference["advantages"].reshape(-1)
    advantages = (advantages - advantages[keep].mean()) / (advantages[keep].std(ddof=1) + 1e-8)
    advantages = torch.from_numpy(advantages[mb]).to(dtype)
    returns = torch.from_numpy(reference["returns"].reshape(-1)[mb]).to(dtype)
    old_values = torch.from_numpy(reference["values"].reshape(-1)[mb]).to(dtype)
    float32 = networks(update) if double else None
    pi, _, values = heads(policy, value_net, reference["obs"].flatten(0, 1)[mb], float32)
    old_log_probs = reference["log_probs"].reshape(-1)[mb].to(dtype)
    ratio = (pi.log_prob(reference["actions"].reshape(-1)[mb]) - old_log_probs).exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean()
    clipped_values = old_values + (values - old_values).clamp(-0.2, 0.2)
    v_loss = 0.5 * torch.max((values - returns) ** 2, (clipped_values - returns) ** 2).mean()
    return pg_loss - 0.01 * pi.entropy().mean() + 0.5 * v_loss, (policy, value_net)


def aux_rollouts(references: list[dict], iteration: int) -> dict:
    """The auxiliary buffer as the phase after `iteration` should hold it: the last --n-iteration iterations' rollouts
    side by side, [steps, rollouts] (rollout k * num_envs + env: iteration k of the phase, that env)."""
    phase = references[iteration - 2 : iteration]
    return dict(
        obs=torch.cat([r["obs"] for r in phase], dim=1),
        returns=torch.from_numpy(np.concatenate([r["returns"] for r in phase], axis=1)).float(),
        valid=torch.from_numpy(np.concatenate([r["valid"] for r in phase], axis=1)),
    )


def aux_phase_loss(update: dict, phase_start: dict, references: list[dict], double: bool) -> tuple:
    """The auxiliary loss of the minibatch (`double`: in float64): beta_clone * KL(policy at the phase's start ||
    policy now) + the auxiliary value head's and the value network's squared errors on the stored returns, over the
    minibatch's rollouts' real steps. The KL's target (the policy at the phase's start; old_pi: computed without
    gradient from the copy taken at the phase's first backward) and the returns are constants."""
    dtype = torch.float64 if double else torch.float32
    buffer = aux_rollouts(references, update["iteration"])
    cols, valid = update["cols"], buffer["valid"][:, update["cols"]].flatten(0, 1)
    obs = buffer["obs"][:, cols].flatten(0, 1)[valid]
    returns = buffer["returns"][:, cols].flatten(0, 1)[valid].to(dtype)
    with torch.no_grad():
        old_pi, _, _ = heads(*networks(phase_start, dtype), obs)
    policy, value_net = networks(update, dtype)
    pi, aux_values, values = heads(policy, value_net, obs, networks(update) if double else None)
    parts = dict(
        obs=obs,
        returns=returns,
        old_log_probs=old_pi.logits,
        # KL(policy at the phase's start || policy now), the target as the script computed it: its float32
        # log-probabilities, which the test below checks against old_pi's. (A float64 target differs from them by
        # float32 rounding, and the KL's gradient, p_now - p_start, is a small difference of the two.)
        kl_loss=torch.distributions.kl_divergence(
            torch.distributions.Categorical(logits=update["mb_old"].to(dtype)), pi
        ).mean(),
        aux_value_loss=0.5 * ((aux_values - returns) ** 2).mean(),
        real_value_loss=0.5 * ((values - returns) ** 2).mean(),
    )
    loss = parts["aux_value_loss"] + BETA_CLONE * parts["kl_loss"] + parts["real_value_loss"]
    return loss, parts, (policy, value_net)


def phase_start_of(trace, update: dict) -> dict:
    return next(u for u in aux_updates(trace) if u["iteration"] == update["iteration"])


def checks_gradient(updates: list[dict], k: int) -> bool:
    """Whether backward k's gradient is checked against a float64 reference (a float64 pass of two IMPALA CNNs costs
    seconds of CPU, so not at every step; one of each kind): the last policy-phase step before the first auxiliary
    phase, and that phase's second step (its first sees the policy as it was when the phase began: a KL of zero, and
    no gradient)."""
    if updates[k]["step"] != 128:  # the first phase (after iteration 2)
        return False
    if updates[k]["where"] == "<module>":
        return updates[k + 1]["where"] == "auxiliary_phase"
    return updates[k - 1]["where"] == "auxiliary_phase"


@pytest.fixture(scope="module")
def recomputed(probed, references) -> list[dict]:
    """Per backward() of the run, the loss rebuilt from the copies (policy phase: PPO's; auxiliary phase: the
    distillation loss; in float64 where checks_gradient), its parts, and its gradient with respect to each network's
    parameters (zeros where it does not reach), by network and parameter name."""
    trace, _ = probed
    out = []
    for k, update in enumerate(trace.backward):
        double = checks_gradient(trace.backward, k)
        if update["where"] == "<module>":
            loss, nets = policy_phase_loss(update, references[update["iteration"] - 1], double)
            parts = {}
        else:
            loss, parts, nets = aux_phase_loss(update, phase_start_of(trace, update), references, double)
        params = {f"{net}.{name}": p for net, module in zip(GRADS, nets) for name, p in module.named_parameters()}
        grads = gradients(loss, params)
        grads = {
            net: {name.split(".", 1)[1]: g for name, g in grads.items() if name.startswith(f"{net}.")} for net in GRADS
        }
        parts = {name: value.detach() for name, value in parts.items()}
        out.append(dict(loss=loss.item(), parts=parts, grads=grads, double=double))
    return out


# The auxiliary phase's minibatches are 64 frames: its first convolutions' gradients sum ~260k float32 terms of both
# signs (64 frames x 64 x 64 positions), and the script's float32 sums are off by up to 4.2e-5 of their norm there
# (measured at the second phase's second step, 7.9e-6 at the first's; a float32 reference in another layout is off by
# as much). The policy phase (32 frames: 3.5e-6) keeps the default.
AUX_RTOL = 1e-4


def test_both_phases_step_on_the_gradient_of_their_loss(probed, recomputed):
    """Both networks' gradients after the backward()s that checks_gradient picks (the last policy-phase step before
    the first auxiliary phase, that phase's second step) are those of the float64 reference loss. Before the loss
    values' tests, so that a term too small to show in a value is caught here."""
    trace, _ = probed
    checked = []
    for update, expected in zip(trace.backward, recomputed):
        if not expected["double"]:
            continue
        where = f"{update['where']} at step {update['step']}"
        rtol = AUX_RTOL if update["where"] == "auxiliary_phase" else RTOL
        for net in GRADS:
            assert_gradients_match(update["grads"][net], expected["grads"][net], f"{where}: {net}", rtol)
        checked.append((update["where"], update["step"]))
    assert checked == [("<module>", 128), ("auxiliary_phase", 128)]


def test_every_policy_phase_loss_is_the_ppo_loss_of_its_minibatch(probed, recomputed):
    trace, _ = probed
    assert len(policy_updates(trace)) == ITERATIONS * 2
    for update, expected in zip(trace.backward, recomputed):
        if update["where"] == "<module>":
            assert update["loss"].item() == pytest.approx(expected["loss"], rel=1e-4, abs=1e-5), update["step"]


def test_the_probed_run_writes_finite_scalars_and_evaluates_saved_model(probed):
    trace, cwd = probed
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + AUX_KEYS + ["eval/episodic_return", "charts/SPS"])
    model = torch.load(run_dir / "ppg_procgen.cleanrl_model", weights_only=False)
    assert model["script"] == "ppg_procgen" and {"policy", "value_net", "reward_scaler"} <= set(model)
    # the networks the loop started from have the PPG code's initialisation
    first = trace.backward[0]
    assert assert_normed_init(first["policy"]) == 18 and assert_normed_init(first["value_net"]) == 17


def test_the_auxiliary_phase_runs_every_n_iteration_iterations_over_their_rollouts(probed):
    trace, cwd = probed
    updates = aux_updates(trace)
    # after iterations 2 and 4: 1 epoch x 2 minibatches of 4 of the 8 rollouts, each rollout once per epoch
    assert [(u["iteration"], u["step"]) for u in updates] == [(2, 128), (2, 128), (4, 256), (4, 256)]
    for iteration in (2, 4):
        columns = torch.cat([u["cols"] for u in updates if u["iteration"] == iteration])
        assert sorted(columns.tolist()) == list(range(2 * NUM_ENVS))
    (run_dir,) = run_dirs(cwd)
    assert [step for step, _ in read_scalars(run_dir)["losses/aux/kl_loss"]] == [128, 256]


def test_the_auxiliary_phase_distils_the_stored_returns_against_the_policy_from_before_the_phase(probed, recomputed):
    trace, _ = probed
    kl_seen = 0.0
    for update, expected in zip(trace.backward, recomputed):
        if update["where"] != "auxiliary_phase":
            continue
        parts = expected["parts"]
        # the minibatch is its rollouts' real steps from the buffer, with the returns the policy phase computed
        assert torch.equal(update["mb_obs"], parts["obs"])
        torch.testing.assert_close(update["mb_returns"], parts["returns"].float(), atol=2e-4, rtol=1e-4)
        # the KL term's target is the policy as it was when the phase began, not the one being trained
        old_log_probs = torch.log_softmax(parts["old_log_probs"], -1).float()
        torch.testing.assert_close(update["mb_old"], old_log_probs, atol=1e-5, rtol=0)
        for name in ("kl_loss", "aux_value_loss", "real_value_loss"):
            assert update[name].item() == pytest.approx(parts[name].item(), rel=1e-4, abs=1e-7), name
        assert update["loss"].item() == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6)
        kl_seen = max(kl_seen, parts["kl_loss"].item())
    assert kl_seen > 1e-6  # the second minibatch of a phase sees a policy that has moved


def test_each_step_applies_the_gradient_of_its_loss_clipped_over_both_networks_together(probed, recomputed):
    """Adam's first moment after step j is 0.9 m_j + 0.1 g_j: the gradient the optimiser applied (g_j, clipped as the
    script clips) follows from the copies of the optimiser taken at backward j and j + 1."""
    trace, _ = probed
    updates = trace.backward
    clipped = 0
    for update, after, expected in zip(updates, updates[1:], recomputed):
        raw = [grad for net in GRADS for grad in expected["grads"][net].values()]  # the optimiser's order
        reached = [bool(grad.any()) for grad in raw]
        # a parameter the loss does not reach gets no gradient at all (None), the others one
        assert reached == [grad is not None for net in GRADS for grad in update["grads"][net].values()], update["step"]
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in raw]))
        scale = min(1.0, MAX_GRAD_NORM / (norm.item() + 1e-6))
        clipped += scale < 1.0
        state_before, state_after = update["optimizer"]["state"], after["optimizer"]["state"]
        applied, wanted = [], []
        for k, grad in enumerate(raw):
            if not reached[k]:  # a head this loss does not reach: Adam leaves it alone
                assert k not in state_before or torch.equal(state_after[k]["exp_avg"], state_before[k]["exp_avg"]), k
                continue
            m_before = state_before[k]["exp_avg"] if k in state_before else 0.0
            applied.append(((state_after[k]["exp_avg"] - 0.9 * m_before) / 0.1).flatten())
            wanted.append((grad * scale).flatten())
        applied, wanted = torch.cat(applied), torch.cat(wanted)
        assert (applied - wanted).norm() <= 2e-3 * wanted.norm(), (update["where"], update["step"])
    assert clipped >= len(updates) // 2  # the clip acted (on both phases' steps)


# Last: the slowest (three runs), so that a planted bug the loop's tests catch fails fast.
def test_sigkill_then_resume_continues_the_curve_and_the_phase_schedule(tmp_path):
    # The first checkpoint (step 96) falls inside a phase: the resumed run's aux phase at 128 distils one rollout.
    flags = [*TINY, "--total-timesteps", "256", "--checkpoint-every", "96"]
    (tmp_path / "straight").mkdir()
    (tmp_path / "killed").mkdir()
    straight = run_script("ppg_procgen.py", *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    run_dir = kill_at_first_checkpoint("ppg_procgen.py", flags, tmp_path / "killed")
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 96 and checkpoint["reward_scaler"]["count"] > 1
    resumed = run_script("ppg_procgen.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming with fresh episodes" in resumed.stdout
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(run_dirs(tmp_path / "straight")[0])
    assert [step for step, _ in resumed_scalars["losses/value_loss"]] == list(range(32, 257, 32))
    assert [step for step, _ in resumed_scalars["losses/aux/kl_loss"]] == [64, 128, 192, 256]
    # Up to the checkpoint the runs are the same run (seeded envpool, the CPU); afterwards the episodes differ.
    for key in ["losses/value_loss", "losses/policy_loss"]:
        assert resumed_scalars[key][:3] == straight_scalars[key][:3], key
        assert resumed_scalars[key][3:] != straight_scalars[key][3:], key
    assert resumed_scalars["losses/aux/kl_loss"][0] == straight_scalars["losses/aux/kl_loss"][0]
