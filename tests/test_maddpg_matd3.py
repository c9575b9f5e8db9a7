"""maddpg.py and matd3.py: the centralised critics' input in agent order on VMAS and MPE, the actor's
joint action, target smoothing, the per-agent TD target, the critics and the replay buffer against the
definitions; each script's own loop run under tests/probe.py (stored rows, exploration, every critic and
actor loss, its gradients and optimiser step, no gradient into the targets, the critics unmoved by the actor step,
the targets' Polyak averaging, the actor's delay, MATD3's smoothing noise);
smoke runs on VMAS and MPE (team, per-agent and mean-agent returns, the saved model through
cleanrl_utils.evaluate, refused by the other script); bad input, a replay buffer too large to fit;
checkpoints without logging state, resume and SIGTERM."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from types import SimpleNamespace

import maddpg
import matd3
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    sigterm_while_training,
)
from update_reference import (
    assert_gradients_match,
    assert_no_gradient,
    assert_same_gradient,
    assert_unchanged,
    gradients,
    leaves,
)

from cleanrl_utils.envs.multiagent import make_env, same_action_space

SCRIPTS = {"maddpg": "maddpg.py", "matd3": "matd3.py"}
MODULES = {"maddpg": maddpg, "matd3": matd3}
CPU = torch.device("cpu")
# Tiny runs: 4 worlds, a few hundred steps, small networks, logs every 5 vector steps.
TINY = [
    "--num-envs",
    "4",
    "--buffer-size",
    "2000",
    "--batch-size",
    "16",
    "--hidden-dim",
    "32",
    "--log-every",
    "5",
    "--torch-threads",
    "1",
]
# VMAS episodes last 100 steps by default, MPE 25: shorten VMAS's so episodes end within the run.
SMOKE_ENVS = {"vmas/navigation": ["--max-episode-steps", "20"], "mpe/simple_spread_v3": []}
COMMON_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/qf1_values",
    "losses/qf1_loss",
    "losses/actor_loss",
    "eval/episodic_return",
]
KEYS = {"maddpg": COMMON_KEYS, "matd3": COMMON_KEYS + ["losses/qf2_values", "losses/qf2_loss", "losses/qf_loss"]}
# What each script's checkpoint holds (training_state) besides the format, arguments and RNG states.
TRAINING_STATE = {
    "maddpg": {"actor", "critic", "target_actor", "target_critic"},
    "matd3": {"actor", "qf1", "qf2", "target_actor", "qf1_target", "qf2_target", "updates"},
}


# --- the centralised critics' input, on both simulators --------------------------------------------


def hand_built_critic_input(obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Row i of env b: obs of agent 0, obs of agent 1, ..., action of agent 0, ..., one-hot i."""
    num_envs, n_agents = obs.shape[:2]
    rows = []
    for b in range(num_envs):
        for i in range(n_agents):
            parts = [obs[b, j] for j in range(n_agents)] + [actions[b, j] for j in range(n_agents)]
            parts.append(F.one_hot(torch.tensor(i), n_agents).float())
            rows.append(torch.cat(parts))
    return torch.stack(rows).reshape(num_envs, n_agents, -1)


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
@pytest.mark.parametrize("env_id", ["vmas/navigation", "mpe/simple_spread_v3"])
def test_critic_input_is_observations_then_actions_in_agent_order(algo, env_id):
    module = MODULES[algo]
    envs = make_env(env_id, 3, CPU, seed=0, continuous_actions=True, max_episode_steps=25)
    obs = envs.reset()
    obs, *_ = envs.step(module.random_actions((3, envs.n_agents), envs.action_low, envs.action_high))
    n_agents, obs_dim, act_dim = envs.n_agents, envs.obs_dim, envs.act_dim
    assert n_agents > 2 and obs.shape == (3, n_agents, obs_dim)
    assert not torch.equal(obs[:, 0], obs[:, 1])  # agents see different things, so a swap would show
    # Known actions: agent j's action is (100 j + env, 100 j + env + 0.5, ...).
    actions = (
        100.0 * torch.arange(n_agents)[None, :, None]
        + torch.arange(3.0)[:, None, None]
        + 0.5 * torch.arange(act_dim)[None, None, :]
    )
    x = module.critic_input(obs, actions)
    assert x.shape == (3, n_agents, n_agents * (obs_dim + act_dim) + n_agents)
    torch.testing.assert_close(x, hand_built_critic_input(obs, actions), rtol=0, atol=0)
    # Block by block, for agent 1's row of env 2.
    row = x[2, 1]
    for j in range(n_agents):
        assert torch.equal(row[j * obs_dim : (j + 1) * obs_dim], obs[2, j])
        assert torch.equal(
            row[n_agents * obs_dim + j * act_dim : n_agents * obs_dim + (j + 1) * act_dim], actions[2, j]
        )
    assert row[-n_agents:].tolist() == [0.0, 1.0] + [0.0] * (n_agents - 2)
    if env_id.startswith("mpe"):
        # The observations' part is mpe2's own global state, agent by agent.
        for b, env in enumerate(envs.envs):
            np.testing.assert_array_equal(module.global_state(obs)[b].numpy(), env.state())
    envs.close()


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_actor_update_replaces_only_the_own_action(algo):
    module = MODULES[algo]
    torch.manual_seed(0)
    batch, n_agents, act_dim = 5, 3, 2
    buffer_actions = torch.randn(batch, n_agents, act_dim)
    policy_actions = torch.randn(batch, n_agents, act_dim, requires_grad=True)
    joint = module.replace_own_action(buffer_actions, policy_actions)
    assert joint.shape == (batch, n_agents, n_agents, act_dim)
    for i in range(n_agents):
        for j in range(n_agents):
            expected = policy_actions[:, j] if i == j else buffer_actions[:, j]
            assert torch.equal(joint[:, i, j], expected)
    # Agent i's critic passes gradient to agent i's policy action only.
    joint[:, 1].sum().backward()
    assert policy_actions.grad[:, 1].abs().sum() > 0
    assert policy_actions.grad[:, [0, 2]].abs().sum() == 0
    # The critic input of row i holds row i's joint action.
    obs = torch.randn(batch, n_agents, 4)
    x = module.critic_input(obs, joint.detach())
    for i in range(n_agents):
        torch.testing.assert_close(x[:, i], module.critic_input(obs, joint[:, i].detach())[:, i], rtol=0, atol=0)


def test_shared_actor_takes_the_agent_id_and_scales_to_the_bounds():
    torch.manual_seed(0)
    low, high = torch.tensor([0.0, -2.0]), torch.tensor([1.0, 2.0])  # MPE-like and VMAS-like dimensions
    actor = maddpg.Actor(4, 3, low, high, hidden_dim=16)
    obs = torch.randn(7, 1, 4).expand(7, 3, 4)  # three agents seeing the same thing
    actions = actor(obs)
    assert actions.shape == (7, 3, 2) and (actions >= low).all() and (actions <= high).all()
    assert not torch.allclose(actions[:, 0], actions[:, 1])  # the id tells them apart
    with torch.no_grad():
        actor.fc_mu.bias.fill_(100.0)
        assert torch.allclose(actor(obs), high.expand(7, 3, 2))
        actor.fc_mu.bias.fill_(-100.0)
        assert torch.allclose(actor(obs), low.expand(7, 3, 2))


# --- the maths ------------------------------------------------------------------------------------


def test_matd3_smoothing_noise_stays_within_its_clip_and_the_bounds():
    torch.manual_seed(0)
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 1.0])  # VMAS u_range 1 and MPE's [0, 1]
    scale = (high - low) / 2
    middle = ((low + high) / 2).expand(20_000, 3, 2)
    smoothed = matd3.smooth_target_actions(middle, scale, low, high, policy_noise=1.0, noise_clip=0.5)
    noise = (smoothed - middle) / scale
    assert noise.abs().max() <= 0.5 + 1e-6
    assert (noise.abs() > 0.5 - 1e-6).float().mean() > 0.5  # a wide noise piles up at the clip
    assert ((noise > 0) & (noise < 0.4)).any() and ((noise < 0) & (noise > -0.4)).any()
    narrow = (matd3.smooth_target_actions(middle, scale, low, high, policy_noise=0.2, noise_clip=0.5) - middle) / scale
    np.testing.assert_allclose(narrow.reshape(-1, 2).std(0).numpy(), [0.2, 0.2], rtol=0.04)
    for edge in (low, high):
        smoothed = matd3.smooth_target_actions(
            edge.expand(20_000, 3, 2), scale, low, high, policy_noise=1.0, noise_clip=0.5
        )
        assert (smoothed >= low).all() and (smoothed <= high).all()
        assert (smoothed == edge).float().mean() > 0.45  # half of the draws push out and are clipped back
    assert torch.equal(matd3.smooth_target_actions(middle, scale, low, high, policy_noise=0.2, noise_clip=0.0), middle)


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_exploration_noise_and_random_actions_respect_the_bounds(algo):
    module = MODULES[algo]
    torch.manual_seed(0)
    low, high = torch.tensor([0.0, -1.0]), torch.tensor([1.0, 1.0])
    uniform = module.random_actions((5000, 3), low, high)
    assert uniform.shape == (5000, 3, 2) and (uniform >= low).all() and (uniform <= high).all()
    np.testing.assert_allclose(uniform.reshape(-1, 2).mean(0).numpy(), [0.5, 0.0], atol=0.02)
    at_top = module.add_exploration_noise(high.expand(5000, 3, 2), (high - low) / 2, low, high, 0.1)
    assert (at_top <= high).all() and (at_top >= low).all() and (at_top == high).float().mean() > 0.4


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_td_target_is_per_agent_and_cut_only_at_terminations(algo):
    rewards = torch.tensor([[1.0, 2.0], [0.5, -0.5], [3.0, 4.0]])
    next_q = torch.tensor([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])
    terminations = torch.tensor([1.0, 0.0, 0.0])  # world 1: truncated (stored as not terminated) or mid-episode
    got = MODULES[algo].td_target(rewards, next_q, terminations, 0.5)
    assert got.tolist() == [[1.0, 2.0], [15.5, 19.5], [28.0, 34.0]]


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_critic_is_an_mlp_on_the_critic_input_and_frozen_sends_gradients_to_the_actions_only(algo):
    module = MODULES[algo]
    torch.manual_seed(0)
    critic = module.QNetwork(obs_dim=4, act_dim=2, n_agents=3, hidden_dim=16)
    obs, actions = torch.randn(5, 3, 4), torch.randn(5, 3, 2, requires_grad=True)
    x = module.critic_input(obs, actions)
    expected = critic.fc3(F.relu(critic.fc2(F.relu(critic.fc1(x))))).squeeze(-1)
    torch.testing.assert_close(critic(obs, actions), expected)
    q = critic(obs, actions, frozen=True)
    torch.testing.assert_close(q, expected)
    q.sum().backward()
    assert actions.grad.abs().sum() > 0 and all(p.grad is None for p in critic.parameters())
    critic(obs, actions).sum().backward()  # not frozen: the weights get their gradients
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.parameters())
    if algo == "matd3":  # Q1 and Q2 are built alike but start apart
        other = module.QNetwork(obs_dim=4, act_dim=2, n_agents=3, hidden_dim=16)
        assert not torch.equal(other(obs, actions), critic(obs, actions))


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_buffer_stores_the_true_final_observation_and_wraps_around(algo):
    module = MODULES[algo]
    envs = make_env("vmas/navigation", 2, CPU, seed=0, continuous_actions=True, max_episode_steps=3)
    rb = module.ReplayBuffer(5, envs.n_agents, envs.obs_dim, envs.act_dim, CPU)
    obs = envs.reset()
    seen = []
    for t in range(4):  # 8 transitions into 5 slots
        actions = torch.full((2, envs.n_agents, envs.act_dim), 0.1 * (t + 1))
        next_obs, rewards, terminated, truncated, final_obs, info = envs.step(actions)
        rb.add(obs=obs, actions=actions, rewards=rewards, terminations=terminated, next_obs=final_obs)
        seen.append((obs, actions, rewards, final_obs, next_obs, truncated))
        obs = next_obs
    assert rb.size == 5 and rb.pos == 3
    # The third step truncates both worlds: the buffer keeps the true final observation, not the
    # reset one, and no termination (a truncation bootstraps).
    obs2, actions2, rewards2, final_obs2, next_obs2, truncated2 = seen[2]
    assert truncated2.all() and not torch.allclose(final_obs2, next_obs2)
    fields = rb.fields
    assert torch.equal(fields["next_obs"][4], final_obs2[0])
    assert torch.equal(fields["next_obs"][0], final_obs2[1])  # slot 5 wrapped to 0
    assert fields["terminations"][[4, 0]].eq(0).all()
    assert torch.equal(fields["obs"][4], obs2[0]) and torch.equal(fields["actions"][0], actions2[1])
    assert torch.equal(fields["rewards"][0], rewards2[1])
    # The fourth step (slots 1, 2) starts from the reset observation.
    assert torch.equal(fields["obs"][1], next_obs2[0]) and torch.equal(fields["actions"][2], seen[3][1][1])
    batch = rb.sample(64)
    shapes = {name: tuple(t.shape) for name, t in batch.items()}
    assert shapes == {
        "obs": (64, 4, 18),
        "actions": (64, 4, 2),
        "rewards": (64, 4),
        "terminations": (64,),
        "next_obs": (64, 4, 18),
    }
    # The bytes checked before allocation are the bytes allocated.
    assert module.replay_buffer_bytes(5, envs.n_agents, envs.obs_dim, envs.act_dim) == sum(
        t.numel() * t.element_size() for t in fields.values()
    )
    restored = module.ReplayBuffer(5, envs.n_agents, envs.obs_dim, envs.act_dim, CPU)
    restored.load_state_dict(rb.state_dict())
    assert restored.pos == rb.pos and restored.size == rb.size
    assert all(torch.equal(restored.fields[name], field) for name, field in fields.items())


# --- the loop's own wiring ----------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on probe/walk (tests/probe_multiagent_envs.py: three agents with
# actions in [-1, 1]^2 whose worlds terminate and truncate every few steps). The probe copies what each iteration
# acted on and got back, the replay buffer at the end, and at every backward() the batch and every network. The tests
# replay the environment with the stored actions and recompute with plain code of their own: every critic loss (the
# centralised critics on all agents' observations and actions, the target actors' next actions, MATD3's clipped
# smoothing noise and twin min), every actor loss (agent i's action from the actor, the others' from the buffer),
# each backward()'s gradients against those losses' in float64, each optimiser step as Adam on them, the
# Polyak-averaged targets, the actor's delay and the exploration.
WIRING = ["--env-id", "probe/walk", "--num-envs", "4", "--total-timesteps", "200", "--learning-starts", "60"]
WIRING += ["--buffer-size", "120", "--batch-size", "16", "--hidden-dim", "16", "--log-every", "5", "--gamma", "0.9"]
WIRING += ["--actor-learning-rate", "1e-3", "--critic-learning-rate", "1e-3", "--tau", "0.05"]
WIRING_EXTRA = {"maddpg": [], "matd3": ["--policy-noise", "0.5", "--noise-clip", "0.3"]}
STEP_NAMES = ["obs", "actions", "rewards", "terminated", "final_obs"]
NETWORKS = {
    "maddpg": {"actor": "target_actor", "critic": "target_critic"},
    "matd3": {"actor": "target_actor", "qf1": "qf1_target", "qf2": "qf2_target"},
}
GAMMA, TAU, LR = 0.9, 0.05, 1e-3


@pytest.fixture(scope="module", params=["maddpg", "matd3"])
def wiring(request, tmp_path_factory):
    from probe import probe_script

    algo = request.param
    cwd = tmp_path_factory.mktemp(algo)
    networks = [name for pair in NETWORKS[algo].items() for name in pair]
    at_backward = ["batch", "actor_loss", *networks] + (["next_actions"] if algo == "matd3" else [])
    trace = probe_script(
        SCRIPTS[algo],
        WIRING + WIRING_EXTRA[algo],
        cwd,
        watch=STEP_NAMES,
        at_backward=at_backward,
        grads=networks,
        final=["rb"],
        preload=["probe_multiagent_envs"],
    )
    trace.algo, trace.cwd = algo, cwd
    trace.loop = [entry for entry in trace.steps if entry["step"] > 0]  # one per iteration, after its env step
    for update in trace.backward:  # the actor's backward is the one whose loss is actor_loss
        update["kind"] = (
            "actor" if "actor_loss" in update and torch.equal(update["loss"], update["actor_loss"]) else "critic"
        )
    return trace


def plain_actor(weights: dict, obs: torch.Tensor) -> torch.Tensor:
    """The shared actor on [own observation, one-hot id]: ReLU MLP, tanh, scaled to the bounds."""
    x = torch.cat([obs, torch.eye(obs.shape[-2]).expand(*obs.shape[:-1], obs.shape[-2])], -1)
    x = torch.relu(x @ weights["fc1.weight"].T + weights["fc1.bias"])
    x = torch.relu(x @ weights["fc2.weight"].T + weights["fc2.bias"])
    return (
        torch.tanh(x @ weights["fc_mu.weight"].T + weights["fc_mu.bias"]) * weights["action_scale"]
        + weights["action_bias"]
    )


def plain_critic(weights: dict, obs: torch.Tensor, joint: list[torch.Tensor]) -> torch.Tensor:
    """Q_i for every agent i, [B, n_agents]: agent i's critic sees every agent's observation, then the joint action
    joint[i] [B, n_agents, act_dim] (every agent's, in agent order), then i's one-hot id."""
    n_agents = obs.shape[1]
    values = []
    for i in range(n_agents):
        x = torch.cat([obs.flatten(1), joint[i].flatten(1), torch.eye(n_agents)[i].expand(len(obs), -1)], -1)
        x = torch.relu(x @ weights["fc1.weight"].T + weights["fc1.bias"])
        x = torch.relu(x @ weights["fc2.weight"].T + weights["fc2.bias"])
        values.append((x @ weights["fc3.weight"].T + weights["fc3.bias"]).squeeze(-1))
    return torch.stack(values, 1)


def critic_target(trace, update: dict) -> torch.Tensor:
    """y_i = r_i + gamma (1 - terminated) Q'_i(s', a'): the target actor's next actions (MATD3: the script's smoothed
    ones, checked against the target actor separately) and the target critic (MATD3: the smaller of the two)."""
    batch, n_agents = update["batch"], update["batch"]["obs"].shape[1]
    if trace.algo == "maddpg":
        next_actions = plain_actor(update["target_actor"], batch["next_obs"])
        next_q = plain_critic(update["target_critic"], batch["next_obs"], [next_actions] * n_agents)
    else:
        next_actions = update["next_actions"]
        next_q = torch.min(
            plain_critic(update["qf1_target"], batch["next_obs"], [next_actions] * n_agents),
            plain_critic(update["qf2_target"], batch["next_obs"], [next_actions] * n_agents),
        )
    return batch["rewards"] + GAMMA * (1 - batch["terminations"]).unsqueeze(-1) * next_q


def critic_loss(trace, update: dict, weights: dict) -> torch.Tensor:
    batch, n_agents = update["batch"], update["batch"]["obs"].shape[1]
    with torch.no_grad():
        target = critic_target(trace, update)
    critics = ["critic"] if trace.algo == "maddpg" else ["qf1", "qf2"]
    joint = [batch["actions"]] * n_agents
    return sum(((plain_critic(weights[c], batch["obs"], joint) - target) ** 2).mean() for c in critics)


def actor_loss(trace, update: dict, weights: dict) -> torch.Tensor:
    """-mean over the batch and the agents i of Q_i(s, buffer actions with agent i's replaced by actor(o_i)), Q1's."""
    batch, n_agents = update["batch"], update["batch"]["obs"].shape[1]
    policy = plain_actor(weights, batch["obs"])
    joint = []
    for i in range(n_agents):
        actions = [policy[:, j] if j == i else batch["actions"][:, j] for j in range(n_agents)]
        joint.append(torch.stack(actions, 1))
    return -plain_critic(update["critic" if trace.algo == "maddpg" else "qf1"], batch["obs"], joint).mean()


def as_float64(value):
    """An update's copies (its batch, networks, next actions) in float64, the precision of the gradient references."""
    if isinstance(value, dict):
        return {key: as_float64(item) for key, item in value.items() if key != "grads"}
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def network_gradients(loss: torch.Tensor, networks: dict[str, dict]) -> dict[str, dict]:
    """d loss / d each network's parameters (leaves), by network and then parameter name."""
    flat = {(network, name): value for network, params in networks.items() for name, value in params.items()}
    found = gradients(loss, flat)
    return {network: {name: found[network, name] for name in params} for network, params in networks.items()}


def replayed(trace) -> list[dict]:
    """What probe/walk returns for the actions the loop stored, replayed from the script's seed, step by step."""
    from probe_multiagent_envs import make_walk

    envs = make_walk(4, CPU, 1, True)
    obs, steps = envs.reset(), []
    for entry in trace.loop:
        next_obs, rewards, terminated, truncated, final_obs, _ = envs.step(entry["actions"])
        steps.append(dict(obs=obs, rewards=rewards, terminated=terminated, truncated=truncated, final_obs=final_obs))
        obs = next_obs
    return steps


def test_the_loop_stores_each_world_s_transition_with_per_agent_rewards_and_terminations_only(wiring):
    assert len(wiring.loop) == 50
    replay = replayed(wiring)
    for t, (entry, env) in enumerate(zip(wiring.loop, replay)):
        assert torch.equal(entry["obs"], env["obs"]), f"step {t}: the observation acted on"
        for name in ("rewards", "terminated", "final_obs"):
            assert torch.equal(entry[name], env[name]), f"step {t}: {name}"
    rb = wiring.final["rb"]
    assert (rb["size"], rb["pos"]) == (120, 80)
    ends = {"terminated": 0, "truncated only": 0}
    for t in range(20, 50):  # the buffer holds the last 30 steps of the 4 worlds: rows (4 t + world) % 120
        env, rows = replay[t], [(4 * t + world) % 120 for world in range(4)]
        assert torch.equal(rb["obs"][rows], env["obs"]) and torch.equal(rb["actions"][rows], wiring.loop[t]["actions"])
        assert torch.equal(rb["rewards"][rows], env["rewards"])  # each agent's own reward
        assert torch.equal(rb["next_obs"][rows], env["final_obs"])  # the true final observation where one ended
        assert rb["terminations"][rows].tolist() == env["terminated"].float().tolist()  # a truncation bootstraps
        ends["terminated"] += int(env["terminated"].sum())
        ends["truncated only"] += int((env["truncated"] & ~env["terminated"]).sum())
    assert ends["terminated"] >= 5 and ends["truncated only"] >= 5, ends


def test_random_actions_until_learning_starts_then_the_actor_plus_clipped_gaussian_noise(wiring):
    noise = []
    for entry in wiring.loop:
        actions, acted_at = entry["actions"], entry["step"] - 4
        assert actions.shape == (4, 3, 2) and actions.abs().max() <= 1
        if acted_at < 60:
            continue
        # The actor's weights it acted with: those before this iteration's updates (its first backward's copy).
        current = next(u for u in wiring.backward if u["step"] >= entry["step"])
        with torch.no_grad():
            mean = plain_actor(current["actor"], entry["obs"])
        inside = actions.abs() < 1  # not clipped to the bounds
        noise.append((actions - mean)[inside])
    noise = torch.cat(noise)
    assert len(noise) > 500 and abs(noise.mean().item()) < 0.02
    assert 0.085 < noise.std().item() < 0.115  # --exploration-noise 0.1 times the half-range 1
    first = wiring.loop[0]["actions"]
    assert first.min() < -0.8 and first.max() > 0.8  # uniformly random before learning starts


def test_critic_and_actor_updates_alternate_as_the_script_defines(wiring):
    kinds = [update["kind"] for update in wiring.backward]
    steps = [update["step"] for update in wiring.backward if update["kind"] == "critic"]
    assert steps == list(range(60, 201, 4))  # one critic step per vector step once learning has started
    if wiring.algo == "maddpg":
        assert kinds == ["critic", "actor"] * 36
    else:  # the actor (and the targets) every 2nd critic step, counted across vector steps
        assert kinds == ["critic", "critic", "actor"] * 18


def test_every_critic_loss_is_the_td_error_on_the_target_networks_and_every_step_is_adam_on_it(wiring):
    updates = wiring.backward
    transitions = set()
    for entry, env in zip(wiring.loop, replayed(wiring)):
        for world in range(4):
            key = (env["obs"][world], entry["actions"][world], env["rewards"][world], env["final_obs"][world])
            transitions.add(tuple(x.numpy().tobytes() for x in key) + (float(env["terminated"][world]),))
    critics = [name for name in NETWORKS[wiring.algo] if name != "actor"]
    params = {(c, name): torch.zeros_like(v, requires_grad=True) for c in critics for name, v in updates[0][c].items()}
    adam = torch.optim.Adam(params.values(), lr=LR)
    terminal = 0
    actor_grads = dict.fromkeys(updates[0]["grads"]["actor"])  # as the latest actor step left them (none yet)
    for k, update in enumerate(updates):
        if update["kind"] != "critic":
            actor_grads = update["grads"]["actor"]
            continue
        batch, where = update["batch"], f"update {k}"
        for i in range(16):
            key = tuple(batch[name][i].numpy().tobytes() for name in ("obs", "actions", "rewards", "next_obs"))
            assert key + (batch["terminations"][i].item(),) in transitions, "a sampled row is not a real transition"
        terminal += int(batch["terminations"].sum())
        # The gradients: of the critics' loss in float64, its target held constant (critic_target under no_grad).
        weights = {c: leaves(update[c]) for c in critics}
        reference = network_gradients(critic_loss(wiring, as_float64(update), weights), weights)
        for c in critics:
            assert_gradients_match(update["grads"][c], reference[c], f"{where}, {c}")
        # No gradient through the target: none reaches the target networks, none is added to the actor's.
        for network in NETWORKS[wiring.algo].values():
            assert_no_gradient(update["grads"][network], f"{where}, {network}")
        assert_same_gradient(update["grads"]["actor"], actor_grads, where)
        with torch.no_grad():
            loss = critic_loss(wiring, update, {c: update[c] for c in critics})
        assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        # The critic's optimiser step: Adam on this loss, from these weights.
        with torch.no_grad():
            for (c, name), param in params.items():
                param.copy_(update[c][name])
        adam.zero_grad()
        critic_loss(wiring, update, {c: {n: params[(c, n)] for n in update[c]} for c in critics}).backward()
        adam.step()
        if k + 1 < len(updates):
            for (c, name), param in params.items():
                torch.testing.assert_close(param.detach(), updates[k + 1][c][name], rtol=1e-4, atol=1e-6)
    assert terminal > 0, "some sampled transitions should end an episode"


def test_every_actor_loss_uses_its_own_action_from_the_actor_and_every_step_is_adam_on_it(wiring):
    updates = wiring.backward
    params = {name: torch.zeros_like(v, requires_grad=True) for name, v in updates[0]["actor"].items()}
    trained = [params[name] for name in params if not name.startswith("action_")]  # the scale and bias are buffers
    adam = torch.optim.Adam(trained, lr=LR)
    checked = 0
    critics = [name for name in NETWORKS[wiring.algo] if name != "actor"]
    for k, update in enumerate(updates):
        if update["kind"] != "actor":
            continue
        # The gradient: of the actor's loss in float64, the critic's weights held constant.
        where, weights = f"update {k}", leaves(update["actor"])
        reference = gradients(actor_loss(wiring, as_float64(update), weights), weights)
        assert_gradients_match(update["grads"]["actor"], reference, where)
        # The critics are held still: no gradient added to theirs (as the critic step before left it), none to the
        # targets', and their weights are those the next critic step starts from.
        assert updates[k - 1]["kind"] == "critic"
        for c in critics:
            assert_same_gradient(update["grads"][c], updates[k - 1]["grads"][c], f"{where}, {c}")
            if k + 1 < len(updates):
                assert_unchanged(update[c], updates[k + 1][c], f"{where}, {c}")
        for network in NETWORKS[wiring.algo].values():
            assert_no_gradient(update["grads"][network], f"{where}, {network}")
        with torch.no_grad():
            assert update["loss"].item() == pytest.approx(actor_loss(wiring, update, update["actor"]).item(), rel=1e-5)
            for name, param in params.items():
                param.copy_(update["actor"][name])
        adam.zero_grad()
        actor_loss(wiring, update, params).backward()  # gradients reach the actor through agent i's own action only
        adam.step()
        if k + 1 < len(updates):
            for name, param in params.items():
                torch.testing.assert_close(param.detach(), updates[k + 1]["actor"][name], rtol=1e-4, atol=1e-6)
            checked += 1
    assert checked >= 17


def test_the_targets_follow_the_online_networks_by_polyak_averaging_after_each_actor_step(wiring):
    updates = [u for u in wiring.backward if u["kind"] == "critic"]
    pairs = NETWORKS[wiring.algo]
    for online, target in pairs.items():  # the targets start as copies
        for name, tensor in updates[0][target].items():
            assert torch.equal(tensor, updates[0][online][name]), name
    moved = 0
    for k in range(1, len(updates)):
        before, now = updates[k - 1], updates[k]
        actor_steps = [u for u in wiring.backward if u["kind"] == "actor" and before["step"] <= u["step"] < now["step"]]
        for online, target in pairs.items():
            for name, tensor in now[target].items():
                if actor_steps:  # target <- target + tau (online - target), with the online weights after the steps
                    want = before[target][name] + TAU * (now[online][name] - before[target][name])
                    torch.testing.assert_close(tensor, want, rtol=1e-5, atol=1e-7)
                else:  # MATD3's delay: no actor step, no target update
                    assert torch.equal(tensor, before[target][name])
        moved += bool(actor_steps)
    assert moved == (35 if wiring.algo == "maddpg" else 17)  # MATD3: after critic steps 2, 4, ..., 34 of 36


def test_matd3_next_actions_are_the_target_actor_s_plus_clipped_smoothing_noise(wiring):
    if wiring.algo != "matd3":
        pytest.skip("MADDPG's next actions are the target actor's, checked with its critic loss")
    noise = []
    for update in wiring.backward:
        if update["kind"] == "critic":
            with torch.no_grad():
                mean = plain_actor(update["target_actor"], update["batch"]["next_obs"])
            inside = update["next_actions"].abs() < 1  # not clipped to the bounds
            noise.append((update["next_actions"] - mean)[inside])
    noise = torch.cat(noise)
    assert noise.abs().max() <= 0.3 + 1e-6  # --noise-clip 0.3 (times the half-range 1)
    at_clip = (noise.abs() > 0.3 - 1e-6).float().mean().item()
    assert 0.45 < at_clip < 0.65  # P(|N(0, 0.5^2)| > 0.3) = 0.55
    assert abs(noise.mean().item()) < 0.03 and (noise.abs() < 0.1).float().mean() > 0.1


def test_the_probe_run_logs_the_losses_and_the_team_return(wiring):
    (run_dir,) = run_dirs(wiring.cwd)
    scalars = read_scalars(run_dir)
    keys = [key for key in KEYS[wiring.algo] if key != "eval/episodic_return"]
    assert_finite_keys(scalars, keys + [f"charts/episodic_return_agent{i}" for i in range(3)])
    first_actor_step = 60 if wiring.algo == "maddpg" else 80  # logged every 20 steps; MATD3's first at step 64
    assert [step for step, _ in scalars["losses/actor_loss"]] == list(range(first_actor_step, 201, 20))


# --- bad input --------------------------------------------------------------------------------------


def validation_error(module, **overrides) -> str:
    stderr = io.StringIO()
    with redirect_stderr(stderr), pytest.raises(SystemExit) as exit_info:
        module.validate(module.Args(**overrides))
    assert exit_info.value.code != 0
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"continuous_actions": False}, ["needs continuous actions", "qmix.py, vdn.py or mappo.py"]),
        (
            {"env_id": "vmas/navigaton"},
            ["unknown --env-id 'vmas/navigaton'", "vmas/navigation", "mpe/simple_spread_v3"],
        ),
        ({"env_id": "mpe/simple_tag_v3"}, ["unknown --env-id", "known: vmas/balance"]),
        ({"total_timesteps": 0}, ["--total-timesteps must be positive"]),
        ({"num_envs": 0}, ["--num-envs must be positive"]),
        ({"batch_size": -4}, ["--batch-size must be positive"]),
        ({"buffer_size": 0}, ["--buffer-size must be positive"]),
        ({"gradient_steps": 0}, ["--gradient-steps must be positive"]),
        ({"max_episode_steps": 0}, ["--max-episode-steps must be positive"]),
        ({"learning_starts": -1}, ["--learning-starts must be in [0, --total-timesteps 1000000)", "got -1"]),
        ({"total_timesteps": 5000}, ["--learning-starts must be in [0, --total-timesteps 5000)", "got 10000"]),
        ({"buffer_size": 100, "batch_size": 256}, ["--batch-size 256 is larger than --buffer-size 100"]),
        ({"tau": 0.0}, ["--tau"]),
        ({"exploration_noise": -0.1}, ["--exploration-noise must be 0 or positive"]),
        ({"max_grad_norm": -1.0}, ["--max-grad-norm must be 0 or positive"]),
        ({"capture_video": True}, ["--capture-video is not supported", "display"]),
    ],
)
def test_validate_rejects_bad_input_in_one_line(algo, overrides, fragments):
    message = validation_error(MODULES[algo], **overrides)
    assert f"{algo}.py" in message or "--" in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"policy_frequency": 0}, "--policy-frequency must be positive"),
        ({"noise_clip": -0.1}, "--noise-clip must be 0 or positive"),
        ({"policy_noise": float("nan")}, "--policy-noise must be 0 or positive"),
    ],
)
def test_matd3_rejects_bad_noise_and_delay(overrides, fragment):
    assert fragment in validation_error(matd3, **overrides)


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_agents_with_different_action_spaces_are_rejected(algo):
    from gymnasium.spaces import Box

    def described(*spaces):  # what the adapters say of their agents' action spaces
        return SimpleNamespace(same_action_space=same_action_space(list(spaces)), action_spaces=list(spaces))

    stderr = io.StringIO()
    with redirect_stderr(stderr), pytest.raises(SystemExit):
        MODULES[algo].check_action_spaces(described(Box(-1, 1, (2,)), Box(-2, 2, (2,))))  # other bounds
    line = stderr.getvalue()
    assert f"{algo}.py shares one actor" in line and "different action spaces" in line and len(line.splitlines()) == 1
    MODULES[algo].check_action_spaces(described(Box(-1, 1, (2,)), Box(-1, 1, (2,))))


@pytest.mark.parametrize(
    "algo, flags, fragments",
    [
        (
            "maddpg",
            ["--no-continuous-actions"],
            ["maddpg.py needs continuous actions; for discrete actions use qmix.py, vdn.py or mappo.py"],
        ),
        (
            "matd3",
            ["--env-id", "mpe/simple_spred_v3", "--resume", "missing/checkpoint.pt"],
            ["unknown --env-id", "mpe/simple_spread_v3"],
        ),
    ],
)
# (The other cases go through validate() above: the command line adds only tyro's parsing, checked here.)
def test_bad_input_on_the_command_line_fails_before_any_work(workdir, algo, flags, fragments):
    assert_bad_input(run_script(SCRIPTS[algo], *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize("algo", ["maddpg", "matd3"])
def test_a_replay_buffer_that_cannot_fit_is_refused_before_any_work(workdir, algo):
    # 10^12 transitions of vmas/navigation: 4 agents x 18 floats twice, 4 x 2 actions, 4 rewards and a flag,
    # 157 float32s = 628 bytes each.
    result = run_script(SCRIPTS[algo], "--buffer-size", "1000000000000", "--no-cuda", cwd=workdir)
    assert_bad_input(result, workdir, "--buffer-size: the replay buffer needs 628000.0 GB", "lower --buffer-size")


# --- smoke runs, checkpoints, resume, SIGTERM ---------------------------------------------------------


def smoke_flags(env_id: str, steps: int = 400) -> list[str]:
    return [
        "--env-id",
        env_id,
        *SMOKE_ENVS[env_id],
        *TINY,
        "--total-timesteps",
        str(steps),
        "--learning-starts",
        "100",
        "--save-model",
        "--eval-episodes",
        "2",
        "--checkpoint-every",
        "200",
    ]


# Each script on the simulator that its resume test below does not run (the loop itself is tested on probe/walk above).
@pytest.mark.parametrize("algo, env_id", [("maddpg", "mpe/simple_spread_v3"), ("matd3", "vmas/navigation")])
def test_smoke_writes_team_and_agent_returns_and_evaluates_the_saved_model(workdir, algo, env_id):
    result = run_script(SCRIPTS[algo], *smoke_flags(env_id), cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    n_agents = 4 if env_id == "vmas/navigation" else 3
    agent_keys = [f"charts/episodic_return_agent{i}" for i in range(n_agents)]
    assert_finite_keys(scalars, KEYS[algo] + agent_keys + ["charts/episodic_return_mean_agent"])
    assert f"charts/episodic_return_agent{n_agents}" not in scalars
    assert algo == "matd3" or "losses/qf2_loss" not in scalars
    # The team return is the sum of the agents' returns, the mean-agent return their mean, at the same steps.
    series = zip(
        scalars["charts/episodic_return"],
        scalars["charts/episodic_return_mean_agent"],
        *(scalars[k] for k in agent_keys),
    )
    for (step, team), (mean_step, mean_agent), *agents in series:
        assert all(s == step for s, _ in agents) and mean_step == step
        assert team == pytest.approx(sum(v for _, v in agents), rel=1e-4, abs=1e-4)
        assert mean_agent == pytest.approx(team / n_agents, rel=1e-4, abs=1e-4)
    # Losses from the first gradient step on (learning starts at step 100), up to the last step.
    loss_steps = [step for step, _ in scalars["losses/actor_loss"]]
    assert min(loss_steps) >= 100 and max(loss_steps) == 400
    lengths = [v for _, v in scalars["charts/episodic_length"]]
    assert max(lengths) <= 20 if env_id == "vmas/navigation" else set(lengths) == {25.0}  # MPE episodes never terminate
    assert len(scalars["eval/episodic_return"]) == 2
    assert (run_dir / f"{algo}.cleanrl_model").is_file() and (run_dir / "checkpoint.pt").is_file()
    assert "400/400 steps" in result.stdout
    # The saved model evaluates deterministically through the project's entry point too.
    from cleanrl_utils.evaluate import evaluate_model

    model, first = evaluate_model(run_dir, episodes=3, seed=5, cuda=False)
    assert model["script"] == algo and len(first) == 3
    assert first == evaluate_model(run_dir, episodes=3, seed=5, cuda=False)[1]
    # The other script refuses this model in one line naming the script that saved it.
    other = "matd3" if algo == "maddpg" else "maddpg"
    stderr = io.StringIO()
    with redirect_stderr(stderr), pytest.raises(SystemExit):
        MODULES[other].evaluate(run_dir / f"{algo}.cleanrl_model", 1, CPU)
    assert f"was saved by {algo}.py, not {other}.py" in stderr.getvalue() and len(stderr.getvalue().splitlines()) == 1


@pytest.mark.parametrize("algo, env_id", [("maddpg", "vmas/navigation"), ("matd3", "mpe/simple_spread_v3")])
def test_sigkill_then_resume_continues_the_run_with_fresh_environments(workdir, algo, env_id):
    flags = smoke_flags(env_id, steps=600)
    run_dir = kill_at_first_checkpoint(SCRIPTS[algo], flags, workdir)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 200 <= checkpoint["global_step"] < 600 and checkpoint["replay_buffer"]["size"] == checkpoint["global_step"]
    # Exactly the training state: no logging state (episode statistics, latest losses, log schedule).
    state = TRAINING_STATE[algo] | {"actor_optimizer", "critic_optimizer", "replay_buffer", "global_step"}
    assert set(checkpoint) == state | {"format", "script", "env_id", "args", "rng", "wandb_id"}
    resumed = run_script(SCRIPTS[algo], *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at step {checkpoint['global_step']} with freshly reset environments" in resumed.stdout
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, KEYS[algo])
    steps = [step for step, _ in scalars["charts/SPS"]]
    assert steps == sorted(steps) and steps[-1] == 600  # one curve, continued
    final = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert final["global_step"] == 600 and final["replay_buffer"]["size"] == 600
    assert not torch.equal(final["actor"]["fc1.weight"], checkpoint["actor"]["fc1.weight"])  # it trained on
    if algo == "matd3":  # the delayed actor's count of critic steps goes on: one per vector step from step 100 on
        assert checkpoint["updates"] > 0 and final["updates"] == (600 - 100) // 4 + 1


def test_sigterm_writes_a_checkpoint_that_the_other_script_refuses(tmp_path):
    workdir = tmp_path / "matd3"
    workdir.mkdir()
    flags = ["--env-id", "vmas/navigation", *TINY, "--learning-starts", "100", "--total-timesteps", "10000000"]
    _, run_dir = sigterm_while_training(SCRIPTS["matd3"], flags, workdir, settle=1.0)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 10_000_000
    assert checkpoint["replay_buffer"]["size"] == min(checkpoint["global_step"], 2000)
    other = tmp_path / "maddpg"
    other.mkdir()
    assert_bad_input(
        run_script(SCRIPTS["maddpg"], *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=other),
        other,
        "written by matd3.py, not maddpg.py",
    )
