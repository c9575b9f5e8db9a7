"""qmix.py and vdn.py: the QMIX mixture is monotonic in every agent's Q (autograd, random states and
weights, also after optimiser steps that drive the raw hypernetwork weights negative); VDN is the sum;
double-Q targets against a hand computation; the replay buffer; each script's own loop run under
tests/probe.py (stored rows, every update's loss and gradients, none into the target networks, target copies,
epsilon, greedy actions); smoke runs on MPE and VMAS with the TensorBoard keys read back; bad input;
checkpoints, SIGTERM and resume; the saved model's evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
import qmix
import torch
import tyro
import vdn
from conftest import (
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    sigterm_while_training,
)
from update_reference import RTOL, assert_gradients_match, gradients, leaves

SCRIPTS = {"qmix": "qmix.py", "vdn": "vdn.py"}
MODULES = {"qmix": qmix, "vdn": vdn}
KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
]
# 4 worlds x 100 iterations; a gradient step every 4 steps from step 100 on.
TINY = [
    "--num-envs",
    "4",
    "--total-timesteps",
    "400",
    "--learning-starts",
    "100",
    "--batch-size",
    "16",
    "--buffer-size",
    "500",
    "--train-frequency",
    "4",
    "--target-network-frequency",
    "100",
    "--log-every",
    "5",
    "--hidden-dim",
    "16",
]
MIXER_SIZES = {"qmix": ["--mixing-embed-dim", "8", "--hypernet-embed-dim", "16"], "vdn": []}
SMOKE_ENVS = {"mpe/simple_spread_v3": (3, []), "vmas/balance": (3, ["--max-episode-steps", "10"])}


def tiny(algo: str) -> list[str]:
    return TINY + MIXER_SIZES[algo]


# --- the math -----------------------------------------------------------------------------------------


def monotonicity_gradients(
    mixer: qmix.QMixer, n_agents: int, state_dim: int, samples: int, generator: torch.Generator
) -> torch.Tensor:
    """dQ_tot/dQ_a for `samples` random (state, Q) pairs, [samples, n_agents], by autograd."""
    state = torch.randn(samples, state_dim, generator=generator) * 3
    agent_qs = (torch.randn(samples, n_agents, generator=generator) * 10).requires_grad_()
    q_tot = mixer(agent_qs, state)
    assert q_tot.shape == (samples,)
    (grads,) = torch.autograd.grad(q_tot.sum(), agent_qs)  # sample b's Q_tot depends on sample b's Qs only
    return grads


@pytest.mark.parametrize("n_agents, state_dim", [(3, 54), (5, 7)])
def test_qmix_mixture_is_monotonic_for_random_states_weights_and_after_optimiser_steps(n_agents, state_dim):
    generator = torch.Generator().manual_seed(0)
    for init_seed in range(5):
        torch.manual_seed(init_seed)
        mixer = qmix.QMixer(n_agents, state_dim, embed_dim=8, hypernet_embed_dim=16)
        assert (monotonicity_gradients(mixer, n_agents, state_dim, 2000, generator) >= 0).all()
        # Large Adam steps towards random targets, anti-correlated with the agents' Qs: the raw hypernetwork
        # weights move freely across zero, so without the abs some dQ_tot/dQ_a would be negative.
        optimizer = torch.optim.Adam(mixer.parameters(), lr=0.05)
        for _ in range(10):
            state, agent_qs = (
                torch.randn(64, state_dim, generator=generator),
                torch.randn(64, n_agents, generator=generator),
            )
            loss = (mixer(agent_qs, state) + 5 * agent_qs.sum(-1)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        state = torch.randn(2000, state_dim, generator=generator)
        raw_w1 = mixer.hyper_w1(state)
        assert (raw_w1 < 0).float().mean() > 0.2 and (mixer.hyper_w2(state) < 0).any()  # the abs has work to do
        grads = monotonicity_gradients(mixer, n_agents, state_dim, 2000, generator)
        assert (grads >= 0).all(), grads.min()
        assert (grads > 0).float().mean() > 0.5  # and the check is not vacuous (not all gradients zero)


def test_qmix_without_the_abs_would_fail_the_monotonicity_check():
    """The check above can fail: the same mixer with abs removed has negative partial derivatives."""
    torch.manual_seed(0)
    mixer = qmix.QMixer(3, 6, embed_dim=8, hypernet_embed_dim=16)
    state, agent_qs = torch.randn(500, 6), torch.randn(500, 3, requires_grad=True)
    w1 = mixer.hyper_w1(state).unflatten(-1, (3, 8))
    hidden = torch.nn.functional.elu((agent_qs.unsqueeze(-2) @ w1).squeeze(-2) + mixer.hyper_b1(state))
    q_tot = (hidden * mixer.hyper_w2(state)).sum(-1) + mixer.hyper_b2(state).squeeze(-1)
    (grads,) = torch.autograd.grad(q_tot.sum(), agent_qs)
    assert (grads < 0).any()
    # With the abs (the real forward), the same numbers give non-negative gradients.
    (grads,) = torch.autograd.grad(mixer(agent_qs, state).sum(), agent_qs)
    assert (grads >= 0).all()


def test_qmix_mixer_handles_extra_batch_dimensions():
    torch.manual_seed(0)
    mixer = qmix.QMixer(3, 6, embed_dim=4, hypernet_embed_dim=8)
    agent_qs, state = torch.randn(2, 5, 3), torch.randn(2, 5, 6)
    torch.testing.assert_close(
        mixer(agent_qs, state), mixer(agent_qs.reshape(10, 3), state.reshape(10, 6)).reshape(2, 5)
    )


def test_vdn_mixer_is_the_sum():
    agent_qs, state = torch.randn(100, 4), torch.randn(100, 12)
    torch.testing.assert_close(vdn.VDNMixer()(agent_qs, state), agent_qs.sum(-1))
    assert list(vdn.VDNMixer().parameters()) == []


def reference_target(rewards, terminated, next_q_online, next_q_target, mix, gamma):
    """Per transition, per agent, from the definition: argmax by the online Q, value from the target Q."""
    targets = []
    for b in range(len(rewards)):
        chosen = []
        for agent in range(len(next_q_online[b])):
            row = next_q_online[b][agent]
            best = max(range(len(row)), key=lambda a: row[a])
            chosen.append(next_q_target[b][agent][best])
        targets.append(rewards[b] + (0.0 if terminated[b] else gamma * mix(b, chosen)))
    return targets


def test_double_q_targets_match_a_hand_computation():
    # Transition 0 continues, 1 terminated (no bootstrap), 2 was truncated by the time limit: it
    # keeps its bootstrap (terminated 0; its next observation is the true final one).
    rewards, terminated = [1.0, -2.0, 0.5], [0.0, 1.0, 0.0]
    next_q_online = [
        [[0.0, 3.0, 1.0], [2.0, -1.0, 0.0]],
        [[5.0, 0.0, 0.0], [0.0, 0.0, 9.0]],
        [[0.0, 0.0, 1.0], [-5.0, -1.0, -3.0]],
    ]
    next_q_target = [
        [[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]],
        [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
        [[-1.0, -2.0, -3.0], [7.0, 8.0, 9.0]],
    ]
    t = torch.tensor
    gamma = 0.9
    # VDN: y0 = 1 + 0.9 * (20 + 40) = 55; y1 = -2; y2 = 0.5 + 0.9 * (-3 + 8) = 5.
    got = vdn.double_q_target(
        t(rewards), t(terminated), t(next_q_online), t(next_q_target), torch.zeros(3, 6), vdn.VDNMixer(), gamma
    )
    torch.testing.assert_close(got, t([55.0, -2.0, 5.0]))
    assert reference_target(
        rewards, terminated, next_q_online, next_q_target, lambda b, q: sum(q), gamma
    ) == pytest.approx([55.0, -2.0, 5.0])
    # QMIX: the target mixer mixes the chosen target values on the next global state.
    torch.manual_seed(0)
    mixer, next_state = qmix.QMixer(2, 6, embed_dim=4, hypernet_embed_dim=8), torch.randn(3, 6)
    got = qmix.double_q_target(t(rewards), t(terminated), t(next_q_online), t(next_q_target), next_state, mixer, gamma)
    with torch.no_grad():
        mix = lambda b, chosen: mixer(t([chosen]), next_state[b : b + 1]).item()  # noqa: E731
        want = reference_target(rewards, terminated, next_q_online, next_q_target, mix, gamma)
    torch.testing.assert_close(got.detach(), t(want))
    assert got[1].item() == -2.0


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
def test_replay_buffer_wraps_and_round_trips(algo):
    module = MODULES[algo]
    rb = module.ReplayBuffer(5, 2, 3, 4, torch.device("cpu"))
    for step in range(4):  # 8 transitions into 5 rows: the last two steps overwrite rows 0, 1, 2
        obs = torch.full((2, 3, 4), float(step)) + torch.tensor([0.0, 0.5]).view(2, 1, 1)
        actions, rewards = torch.full((2, 3), step), torch.tensor([step, -step])
        rb.add(obs=obs, actions=actions, rewards=rewards, next_obs=obs + 100, terminated=torch.tensor([False, True]))
    fields = rb.fields
    assert (rb.pos, rb.size) == (3, 5)
    assert fields["obs"][:, 0, 0].tolist() == [2.5, 3.0, 3.5, 1.5, 2.0]
    assert fields["rewards"][:3].tolist() == [-2.0, 3.0, -3.0]
    assert fields["actions"].dtype == torch.long and fields["actions"][:, 0].tolist() == [2, 3, 3, 1, 2]
    assert fields["terminated"].tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    batch = rb.sample(64)
    assert batch["obs"].shape == (64, 3, 4) and batch["actions"].shape == (64, 3)
    assert torch.equal(batch["next_obs"], batch["obs"] + 100)
    assert module.replay_buffer_bytes(5, 3, 4) == sum(field.nbytes for field in fields.values())
    copy = module.ReplayBuffer(5, 2, 3, 4, torch.device("cpu"))
    copy.load_state_dict(rb.state_dict())
    assert (copy.pos, copy.size) == (rb.pos, rb.size)
    assert all(torch.equal(copy.fields[name], field) for name, field in fields.items())


def test_epsilon_greedy_is_per_agent():
    torch.manual_seed(0)
    q_network = qmix.QNetwork(4, 3, 5, 8)
    obs = torch.randn(200, 3, 4)
    greedy = q_network(obs).argmax(-1)
    assert torch.equal(qmix.select_actions(q_network, obs, 0.0, 5), greedy)
    mixed = qmix.select_actions(q_network, obs, 0.5, 5)
    differs = mixed != greedy  # about 0.5 * 4/5 of the agents explore to another action, each on its own
    assert 0.3 < differs.float().mean() < 0.5 and (differs.any(1) & ~differs.all(1)).any()


def test_q_network_input_has_the_agent_id():
    q_network = qmix.QNetwork(4, 3, 5, 8)
    obs = torch.randn(7, 1, 4).expand(7, 3, 4)  # the same observation for every agent ...
    q = q_network(obs)
    assert q.shape == (7, 3, 5) and not torch.allclose(q[:, 0], q[:, 1])  # ... still different Q-values


# --- the loop's own wiring ----------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on probe/walk (tests/probe_multiagent_envs.py: three agents whose
# worlds terminate and truncate every few steps). The probe copies what each loop iteration acted on and got back,
# the replay buffer at the end, and at every backward() the sampled batch and the four networks. The tests replay the
# environment with the stored actions and recompute every update's loss with plain code: the per-agent Q-network,
# the double-Q target (online argmax per agent, target network's values, target mixer on the next global state),
# QMIX's mixer with abs on its hypernetworks' weights and VDN's sum; target-copy timing; the epsilon schedule. Each
# backward()'s gradients (the probe's grads) are those of that loss in float64 with the target held constant: the agent
# network and the mixer train together, and no gradient reaches the target networks.
WIRING = ["--env-id", "probe/walk", "--num-envs", "4", "--total-timesteps", "400", "--learning-starts", "100"]
WIRING += ["--batch-size", "16", "--buffer-size", "300", "--train-frequency", "4", "--target-network-frequency", "48"]
WIRING += ["--exploration-fraction", "0.5", "--end-e", "0", "--gamma", "0.9", "--log-every", "5", "--hidden-dim", "16"]
WIRING += ["--learning-rate", "0.01"]  # weights that move: the target network acts otherwise than the online one
STEP_NAMES = ["obs", "actions", "rewards", "terminated", "final_obs", "epsilon"]
BATCH_NAMES = ["batch", "q_network", "mixer", "target_q_network", "target_mixer"]
GAMMA = 0.9
# QMIX's float32 gradients are up to 2.1e-5 (hyper_b2's bias, 2.0e-5 hyper_b1's weight, 1.1e-5 the Q-network's first
# layer) off the float64 reference's in this run: the same plain loss computed in float32 is off by the same amounts.
# Rounding: at the end the residuals average -0.0018 against a mean magnitude of 1.4, and the biases' gradients are
# their mean. VDN's worst is 1.1e-6 (RTOL). The mutants this check is for move a gradient by its whole norm.
QMIX_RTOL = 1e-4


@pytest.fixture(scope="module", params=["qmix", "vdn"])
def wiring(request, tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp(request.param)
    trace = probe_script(
        SCRIPTS[request.param],
        WIRING + MIXER_SIZES[request.param],
        cwd,
        watch=STEP_NAMES,
        at_backward=BATCH_NAMES,
        grads=BATCH_NAMES[1:],
        final=["rb"],
        preload=["probe_multiagent_envs"],
    )
    trace.algo, trace.cwd = request.param, cwd
    trace.loop = [entry for entry in trace.steps if entry["step"] > 0]  # one per iteration, after its env step
    return trace


def plain_relu_mlp(weights: dict, prefix: str, x: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
    for k, layer in enumerate(layers):
        x = x @ weights[f"{prefix}{layer}.weight"].T + weights[f"{prefix}{layer}.bias"]
        x = torch.relu(x) if k < len(layers) - 1 else x
    return x


def plain_q(weights: dict, obs: torch.Tensor) -> torch.Tensor:
    """Every agent's Q-values from [own observation, one-hot id], [..., n_agents, num_actions]."""
    ids = torch.eye(obs.shape[-2], dtype=obs.dtype).expand(*obs.shape[:-1], obs.shape[-2])
    return plain_relu_mlp(weights, "network.", torch.cat([obs, ids], -1), (0, 2, 4))


def plain_mix(algo: str, weights: dict, agent_qs: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """VDN: the sum. QMIX: |w2| . elu(q |W1| + b1) + b2, with W1, b1, w2, b2 made from the global state (all agents'
    observations in agent order) by the hypernetworks."""
    if algo == "vdn":
        return agent_qs.sum(-1)
    state = obs.flatten(-2)
    w1 = plain_relu_mlp(weights, "hyper_w1.", state, (0, 2)).abs().reshape(len(state), agent_qs.shape[-1], -1)
    b1 = state @ weights["hyper_b1.weight"].T + weights["hyper_b1.bias"]
    hidden = torch.nn.functional.elu(torch.einsum("ba,bak->bk", agent_qs, w1) + b1)
    w2 = plain_relu_mlp(weights, "hyper_w2.", state, (0, 2)).abs()
    b2 = plain_relu_mlp(weights, "hyper_b2.", state, (0, 2)).squeeze(-1)
    return (hidden * w2).sum(-1) + b2


def replayed(trace) -> list[dict]:
    """What probe/walk returns for the actions the loop stored, replayed from the script's seed, step by step."""
    from probe_multiagent_envs import make_walk

    envs = make_walk(4, torch.device("cpu"), 1, False)
    obs, steps = envs.reset(), []
    for entry in trace.loop:
        next_obs, rewards, terminated, truncated, final_obs, _ = envs.step(entry["actions"])
        steps.append(dict(obs=obs, rewards=rewards, terminated=terminated, truncated=truncated, final_obs=final_obs))
        obs = next_obs
    return steps


def test_the_loop_stores_each_world_s_transition_with_the_team_reward_and_terminations_only(wiring):
    assert len(wiring.loop) == 100
    replay = replayed(wiring)
    for t, (entry, env) in enumerate(zip(wiring.loop, replay)):
        assert torch.equal(entry["obs"], env["obs"]), f"step {t}: the observation acted on"
        for name in ("rewards", "terminated", "final_obs"):
            assert torch.equal(entry[name], env[name]), f"step {t}: {name}"
    rb = wiring.final["rb"]
    assert (rb["size"], rb["pos"]) == (300, 100)
    ends = {"terminated": 0, "truncated only": 0}
    for t in range(25, 100):  # the buffer holds the last 75 steps of the 4 worlds: rows (4 t + world) % 300
        env, rows = replay[t], [(4 * t + world) % 300 for world in range(4)]
        assert torch.equal(rb["obs"][rows], env["obs"])
        assert torch.equal(rb["actions"][rows], wiring.loop[t]["actions"])
        assert torch.equal(rb["rewards"][rows], env["rewards"].sum(1))  # the team reward
        assert torch.equal(rb["next_obs"][rows], env["final_obs"])  # the true final observation where one ended
        assert rb["terminated"][rows].tolist() == env["terminated"].float().tolist()  # a truncation bootstraps
        ends["terminated"] += int(env["terminated"].sum())
        ends["truncated only"] += int((env["truncated"] & ~env["terminated"]).sum())
    assert ends["terminated"] >= 5 and ends["truncated only"] >= 5, ends


def test_epsilon_decays_linearly_and_the_greedy_actions_are_the_online_networks_argmax(wiring):
    updates = wiring.backward
    greedy_checked = target_differs = 0
    for entry in wiring.loop:
        acted_at = entry["step"] - 4  # epsilon is computed before the step is counted
        assert entry["epsilon"] == pytest.approx(max(1.0 - acted_at / 200, 0.0))
        if entry["epsilon"] == 0.0:
            # The weights it acted with: those before this iteration's gradient step (the next update's copy).
            current = next((u for u in updates if u["step"] >= entry["step"]), None)
            if current is not None:
                with torch.no_grad():
                    assert torch.equal(entry["actions"], plain_q(current["q_network"], entry["obs"]).argmax(-1))
                    target_actions = plain_q(current["target_q_network"], entry["obs"]).argmax(-1)
                greedy_checked += 1
                target_differs += int(not torch.equal(entry["actions"], target_actions))
    assert greedy_checked >= 40
    assert target_differs >= 5, "the target network should act otherwise at times, for this test to mean anything"


def test_each_gradient_step_regresses_the_mixed_online_q_on_the_double_q_target_held_constant(wiring):
    transitions = set()
    for entry, env in zip(wiring.loop, replayed(wiring)):
        for world in range(4):
            obs, next_obs = env["obs"][world].numpy().tobytes(), env["final_obs"][world].numpy().tobytes()
            reward, ended = float(env["rewards"][world].sum()), float(env["terminated"][world])
            transitions.add((obs, tuple(entry["actions"][world].tolist()), reward, ended, next_obs))
    updates = wiring.backward
    assert len(updates) == (400 - 100) // 4 and [u["step"] for u in updates] == list(range(104, 401, 4))
    terminal_targets = 0
    for update in updates:
        batch = update["batch"]
        for i in range(16):
            key = (batch["obs"][i].numpy().tobytes(), tuple(batch["actions"][i].tolist()), batch["rewards"][i].item())
            key += (batch["terminated"][i].item(), batch["next_obs"][i].numpy().tobytes())
            assert key in transitions, "a sampled row is not a transition the env produced"
        where = f"update at step {update['step']}"
        obs, next_obs = batch["obs"].double(), batch["next_obs"].double()
        with torch.no_grad():
            # Double Q: each agent's next action by the online network (picked in float32, as the script picks it),
            # valued by the target network, mixed by the target mixer on the next global state; no bootstrap after a
            # termination. A constant.
            next_actions = plain_q(update["q_network"], batch["next_obs"]).argmax(-1, keepdim=True)
            target_q, target_mixer = leaves(update["target_q_network"]), leaves(update["target_mixer"])
            next_q = plain_q(target_q, next_obs).gather(-1, next_actions).squeeze(-1)
            next_tot = plain_mix(wiring.algo, target_mixer, next_q, next_obs)
            target = batch["rewards"].double() + GAMMA * (1 - batch["terminated"].double()) * next_tot
        # The agent network and the mixer in one graph: Q_tot of the chosen actions, regressed on the target.
        q_weights, mixer_weights = leaves(update["q_network"]), leaves(update["mixer"])
        chosen = plain_q(q_weights, obs).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
        q_tot = plain_mix(wiring.algo, mixer_weights, chosen, obs)
        loss = ((q_tot - target) ** 2).mean()
        grads, reference = update["grads"], gradients(loss, q_weights | mixer_weights)  # no name in both
        rtol = QMIX_RTOL if wiring.algo == "qmix" else RTOL
        assert_gradients_match(grads["q_network"], reference, where, rtol)
        if wiring.algo == "qmix":  # VDN's sum has no parameters
            assert_gradients_match(grads["mixer"], reference, where, rtol)
        assert grads["target_q_network"].keys() == update["target_q_network"].keys()
        for name in ("target_q_network", "target_mixer"):
            got = [grad for grad in grads[name].values() if grad is not None and grad.any()]
            assert not got, f"{where}: a gradient reached the {name}"
        assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        terminal_targets += int(batch["terminated"].sum())
    assert terminal_targets > 0, "some sampled transitions should end an episode"


def test_the_target_networks_are_the_online_ones_copied_every_target_network_frequency_steps(wiring):
    updates = wiring.backward
    initial = updates[0]
    copy_steps = [c for c in range(48, 401, 48) if c > 100]  # crossings of a multiple of 48 once learning started
    for k, update in enumerate(updates):
        # Copied at the end of the iteration that crossed it (after its gradient step): the online weights that the
        # next update found.
        copies = [c for c in copy_steps if c < update["step"]]
        source = next(u for u in updates if u["step"] > copies[-1]) if copies else initial
        for online, target in (("q_network", "target_q_network"), ("mixer", "target_mixer")):
            assert update[target].keys() == source[online].keys()
            for name, tensor in update[target].items():
                assert torch.equal(tensor, source[online][name]), f"update {k} at step {update['step']}: {name}"
    assert len(copy_steps) == 6


def test_the_probe_run_logs_the_losses_and_the_team_return(wiring):
    (run_dir,) = run_dirs(wiring.cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS + [f"charts/episodic_return_agent{i}" for i in range(3)])
    assert [step for step, _ in scalars["losses/td_loss"]] == list(range(120, 401, 20))
    assert [value for _, value in scalars["charts/epsilon"]][-1] == 0.0


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
@pytest.mark.parametrize(
    "flags, fragments",
    [
        (
            ["--continuous-actions"],
            ["{algo}.py needs discrete actions; for continuous actions use maddpg.py, matd3.py or mappo.py"],
        ),
        (
            ["--env-id", "vmas/navigaton"],
            ["unknown --env-id 'vmas/navigaton'", "did you mean vmas/navigation", "known: vmas/balance"],
        ),
        (["--env-id", "mpe/simple_tag_v3"], ["unknown --env-id", "mpe/simple_spread_v3"]),
        (["--num-envs", "0"], ["--num-envs must be positive"]),
        (["--batch-size", "-4"], ["--batch-size must be positive"]),
        (["--buffer-size", "0"], ["--buffer-size must be positive"]),
        (["--total-timesteps", "0"], ["--total-timesteps must be positive"]),
        (
            ["--total-timesteps", "1000", "--learning-starts", "1000"],
            ["--learning-starts must be in [0, --total-timesteps 1000)"],
        ),
        (["--learning-starts", "-1"], ["--learning-starts must be in"]),
        (["--max-episode-steps", "0"], ["--max-episode-steps must be positive"]),
        (["--batch-size", "512", "--buffer-size", "256"], ["larger than --buffer-size"]),
        (["--capture-video"], ["--capture-video is not supported"]),
    ],
)
def test_validate_rejects_bad_arguments_in_one_line(capsys, algo, flags, fragments):
    args = tyro.cli(MODULES[algo].Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        MODULES[algo].validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment.format(algo=algo) in lines[0], lines[0]


def test_agents_with_different_action_spaces_are_refused(capsys):
    class Envs:
        same_action_space = False

    for module in (qmix, vdn):
        with pytest.raises(SystemExit):
            module.check_envs(Envs())
        err = capsys.readouterr().err
        assert f"{module.__name__}.py shares one Q-network" in err and "different action spaces" in err


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
def test_bad_input_exits_before_any_work(workdir, algo):
    assert_bad_input(
        run_script(SCRIPTS[algo], "--continuous-actions", cwd=workdir),
        workdir,
        f"{algo}.py needs discrete actions",
        "maddpg.py, matd3.py or mappo.py",
    )
    assert_bad_input(
        run_script(SCRIPTS[algo], "--env-id", "mpe/simple_spred", cwd=workdir),
        workdir,
        "unknown --env-id 'mpe/simple_spred'",
        "mpe/simple_spread_v3",
    )


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
def test_a_replay_buffer_that_cannot_fit_is_refused_before_any_work(workdir, algo):
    # 10^12 transitions: 3 agents x 18 floats twice, 3 int64 actions, a float reward and flag: 464 bytes each.
    result = run_script(SCRIPTS[algo], "--buffer-size", "1000000000000", "--no-cuda", cwd=workdir)
    assert_bad_input(result, workdir, "--buffer-size: the replay buffer needs 464000.0 GB", "lower --buffer-size")


# --- smoke runs -----------------------------------------------------------------------------------


# One simulator per script (the loop itself is tested on probe/walk above, for both scripts).
@pytest.mark.parametrize("algo, env_id", [("qmix", "mpe/simple_spread_v3"), ("vdn", "vmas/balance")])
def test_smoke_writes_team_and_agent_returns_and_losses(workdir, algo, env_id):
    n_agents, extra = SMOKE_ENVS[env_id]
    save = ["--save-model", "--eval-episodes", "2"] if env_id.startswith("mpe/") else []
    result = run_script(SCRIPTS[algo], "--env-id", env_id, *tiny(algo), *extra, *save, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    agent_keys = [f"charts/episodic_return_agent{i}" for i in range(n_agents)]
    assert_finite_keys(scalars, KEYS + agent_keys)
    assert f"charts/episodic_return_agent{n_agents}" not in scalars
    # The team return is the sum of the agents' returns (each logged value averages the same episodes).
    assert_finite_keys(scalars, ["charts/episodic_return_mean_agent"])
    series = zip(
        scalars["charts/episodic_return"],
        scalars["charts/episodic_return_mean_agent"],
        *(scalars[k] for k in agent_keys),
    )
    for (step, team), (mean_step, mean_agent), *agents in series:
        assert team == pytest.approx(sum(value for _, value in agents), rel=1e-4, abs=1e-3)
        assert mean_step == step and mean_agent == pytest.approx(team / n_agents, rel=1e-4, abs=1e-3)
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    if env_id.startswith("mpe/"):
        assert all(value == 25 for value in lengths)  # MPE episodes only end at the time limit
    else:
        assert all(0 < value <= 10 for value in lengths)  # --max-episode-steps 10, or balance's own end
    assert (
        max(step for step, _ in scalars["losses/td_loss"]) == 400
        and min(step for step, _ in scalars["losses/td_loss"]) > 100
    )
    epsilon = [value for _, value in scalars["charts/epsilon"]]
    assert epsilon[0] > epsilon[-1] and epsilon == sorted(epsilon, reverse=True)
    if save:
        assert len(scalars["eval/episodic_return"]) == 2
        from cleanrl_utils.evaluate import evaluate_model

        model, returns = evaluate_model(run_dir, episodes=3, seed=5, cuda=False)  # the generic entry point
        assert model["script"] == algo and len(returns) == 3 and all(r < 0 for r in returns)  # distances


# --- checkpoints, SIGTERM and resume -------------------------------------------------------------------


def resumable(algo: str) -> list[str]:
    return tiny(algo) + ["--total-timesteps", "600", "--checkpoint-every", "200"]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_resumed(algo: str, run_dir: Path, workdir: Path) -> None:
    before = load(run_dir / "checkpoint.pt")
    assert before["global_step"] < 600 and before["replay_buffer"]["size"] == min(before["global_step"], 500)
    resumed = run_script(SCRIPTS[algo], *resumable(algo), "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at step {before['global_step']} with freshly reset environments" in resumed.stdout
    assert run_dirs(workdir) == [run_dir]
    after = load(run_dir / "checkpoint.pt")
    assert after["global_step"] == 600 and after["replay_buffer"]["size"] == 500
    assert not torch.equal(after["q_network"]["network.0.weight"], before["q_network"]["network.0.weight"])
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS)
    steps = [step for step, _ in scalars["losses/td_loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == 600  # one continuous curve, no duplicates


@pytest.mark.parametrize("algo", ["qmix", "vdn"])
def test_killed_run_resumes_from_its_checkpoint(workdir, algo):
    run_dir = kill_at_first_checkpoint(SCRIPTS[algo], resumable(algo), workdir)
    assert_resumed(algo, run_dir, workdir)


def test_sigterm_writes_a_checkpoint_and_resumes(workdir):
    _, run_dir = sigterm_while_training(
        "qmix.py", resumable("qmix") + ["--total-timesteps", "100000"], workdir, settle=1.0
    )
    checkpoint = load(run_dir / "checkpoint.pt")
    assert 0 < checkpoint["global_step"] < 100000 and set(checkpoint) >= {
        "mixer",
        "target_mixer",
        "optimizer",
        "replay_buffer",
        "rng",
    }
    # The other script, or other arguments, refuse the checkpoint in one line.
    result = run_script("vdn.py", *resumable("vdn"), "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert result.returncode == 2 and "written by qmix.py, not vdn.py" in result.stderr
    result = run_script("qmix.py", *resumable("qmix"), "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert result.returncode == 2 and "--total-timesteps is 600 but the checkpointed run used 100000" in result.stderr
