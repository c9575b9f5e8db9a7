"""ppo_atari.py: its own loop run under tests/probe.py on a short Breakout (lost lives, games over, time-limit cuts) and
rebuilt from the envs' stream: the rollout stored as learning sees it, GAE and its bootstrap against a plain loop, each
epoch's minibatches, every minibatch's clipped PPO loss and its gradient (against a float64 reference's), every Adam
step and the annealed learning rate; GAE over a NEXT_STEP-autoreset rollout against a plain loop, the networks, smoke
runs on MinAtar and Atari, bad input, SIGKILL + resume."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import ppo_atari
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from probe_atari_envs import SHORT_BREAKOUT
from update_reference import assert_gradients_match, gradients

MINATAR_TINY = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "4", "--num-steps", "32"]
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
    """One CPU thread, as the script runs (--torch-threads 1): the tests' own forward and backward passes on a busy
    machine spend far longer spinning in a thread pool than computing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_advantages(stream, gamma, gae_lambda):
    """Per env: walk the recorded steps; each real transition's advantage is the (gamma * lambda)-discounted sum of
    TD errors up to the end of its training episode. `stream` rows: (value, reward, terminated, truncated, reset)."""
    advantages = [None] * len(stream)
    for t in range(len(stream) - 1):
        value, reward, terminated, truncated, reset = stream[t]
        if reset:
            continue  # the autoreset step is not a transition
        total, discount, k = 0.0, 1.0, t
        while True:
            v, r, term, trunc, _ = stream[k]
            next_value = stream[k + 1][0]  # the observation after step k: the true final one after a game's end
            total += discount * (r + (0.0 if term else gamma * next_value) - v)
            if term or trunc or k + 1 == len(stream) - 1:
                break
            discount *= gamma * gae_lambda
            k += 1
        advantages[t] = total
    return advantages


def test_gae_over_a_next_step_autoreset_rollout_matches_a_plain_loop():
    # One env, 12 steps: a life loss at 2 (cut, the game goes on), a game over at 5 (terminated), its autoreset step 6,
    # a time-limit cut at 9 (bootstrapped from the final observation at 10, the autoreset step), then more play.
    terminated = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    resets = [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    rng = np.random.default_rng(0)
    values, rewards = rng.normal(size=13), rng.choice([-1.0, 0.0, 1.0], size=13)
    gamma, gae_lambda = 0.9, 0.8
    num_steps = 12
    as_tensor = lambda x: torch.tensor(np.asarray(x[:num_steps], dtype=np.float64)).unsqueeze(1)  # noqa: E731
    advantages = ppo_atari.compute_gae(
        as_tensor(rewards),
        as_tensor(values),
        torch.tensor(values[1:], dtype=torch.float64).unsqueeze(1),
        as_tensor(terminated),
        as_tensor(truncated),
        gamma,
        gae_lambda,
    )[:, 0].tolist()
    stream = list(zip(values, rewards, terminated, truncated, resets))
    expected = reference_advantages(stream, gamma, gae_lambda)
    for t in range(num_steps):
        if expected[t] is not None:
            assert advantages[t] == pytest.approx(expected[t], abs=1e-12), t


@pytest.mark.parametrize("shape, hidden", [((4, 84, 84), 512), ((4, 10, 10), 128), ((6, 10, 10), 128)])
def test_agent_picks_the_network_from_the_observation_shape(shape, hidden):
    agent = ppo_atari.Agent(shape, 5, 255.0 if shape[-1] == 84 else 1.0)
    assert agent.actor.in_features == hidden
    obs = torch.randint(0, 2, (3,) + shape, dtype=torch.uint8)
    action, logprob, value = agent.act(obs)
    again, entropy, value_again = agent.evaluate_actions(obs, action)
    assert action.shape == (3,) and torch.allclose(logprob, again) and torch.allclose(value, value_again)
    assert (entropy > 0).all() and (entropy <= np.log(5) + 1e-6).all()


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "ppo_continuous_action.py"]),
        (["--env-id", "CartPole-v1"], ["cleanrl/ppo.py"]),
        (["--env-id", "Breakout-v4"], ["BreakoutNoFrameskip-v4"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide"]),
        (["--total-timesteps", "100"], ["less than one batch"]),
        (["--num-steps", "0"], ["--num-steps"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("ppo_atari.py", *flags, cwd=workdir), workdir, *fragments)


# One uninterrupted MinAtar run is both the smoke run (finite logs, the saved model evaluated) and the reference of the
# resume test.
MINATAR_FLAGS = [*MINATAR_TINY, "--total-timesteps", "1536", "--checkpoint-every", "512", "--save-model"]
MINATAR_FLAGS += ["--eval-episodes", "2"]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("straight")
    result = run_script("ppo_atari.py", *MINATAR_FLAGS, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    return run_dir


def test_minatar_smoke_writes_finite_scalars_and_evaluates_saved_model(straight_run):
    scalars = read_scalars(straight_run)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 12 and len(scalars["eval/episodic_return"]) == 2
    assert torch.load(straight_run / "ppo_atari.cleanrl_model", weights_only=False)["script"] == "ppo_atari"


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(straight_run, tmp_path):
    run_dir = kill_at_first_checkpoint("ppo_atari.py", MINATAR_FLAGS, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 512 and checkpoint["envs"] is not None
    resumed = run_script("ppo_atari.py", *MINATAR_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in sorted(set(PPO_KEYS) - {"charts/SPS"}) + ["eval/episodic_return"]:
        assert resumed_scalars[key] == straight_scalars[key], key


# The loop's own wiring: the script runs unchanged under tests/probe.py, which copies the observation each step acted
# on, the actions, and at every backward() the minibatch, the agent and the rollout's tensors; the tests replay the
# actions in a fresh copy of the run's envs (seeded as the script seeds them) and rebuild from that stream everything
# the loop stored and computed. The game: Breakout cut at 400 frames (100 steps), so that a few hundred steps hold lost
# lives, games over and time-limit cuts. This run is also the Atari smoke run (logs, the saved model evaluated).
NUM_ENVS, NUM_STEPS, ITERATIONS, EPOCHS, MINIBATCHES = 2, 64, 3, 2, 2
GAMMA, GAE_LAMBDA, CLIP, LR = 0.95, 0.8, 0.02, 1e-3
LOOP_FLAGS = ["--env-id", SHORT_BREAKOUT, "--num-envs", str(NUM_ENVS), "--num-steps", str(NUM_STEPS)]
LOOP_FLAGS += ["--total-timesteps", str(NUM_ENVS * NUM_STEPS * ITERATIONS), "--update-epochs", str(EPOCHS)]
LOOP_FLAGS += ["--num-minibatches", str(MINIBATCHES), "--gamma", str(GAMMA), "--gae-lambda", str(GAE_LAMBDA)]
LOOP_FLAGS += ["--clip-coef", str(CLIP), "--learning-rate", str(LR), "--save-model", "--eval-episodes", "1"]
LOOP_FLAGS += ["--capture-video"]
ROLLOUT_NAMES = ["rewards", "terminated", "truncated", "reset_steps", "values", "advantages", "returns", "next_obs"]
UPDATE_NAMES = ["mb", "agent", "mb_inds", "iteration", "epoch", *ROLLOUT_NAMES]


def loop_steps(trace) -> list[dict]:
    """One dict per loop iteration (the step counter is moved at the top of the loop body): the observation it acts
    on as `next_obs`, and the previous iteration's `action`."""
    return [entry for entry in trace.steps if entry["step"] > 0]


def actions_taken(trace) -> np.ndarray:
    """[steps, num_envs]: the actions the loop sent to the env, the last one from the names it left at exit."""
    steps = loop_steps(trace)
    return np.stack([step["action"].numpy() for step in steps[1:]] + [trace.final["action"].numpy()])


def replay_stream(envs, seed: int, actions: np.ndarray) -> dict:
    """Reset `envs` with `seed` and step it with `actions`: every observation (obs[k] the one step k acted on; one more
    than steps), raw reward and flag it returns, and each finished game's (step index, env, score)."""
    obs, _ = envs.reset(seed=seed)
    seen = {key: [] for key in ("rewards", "terminated", "truncated", "life_loss")} | {"obs": [obs], "games": []}
    for k, action in enumerate(actions):
        obs, rewards, terminated, truncated, infos = envs.step(action)
        for key, value in zip(("obs", "rewards", "terminated", "truncated"), (obs, rewards, terminated, truncated)):
            seen[key].append(value)
        seen["life_loss"].append(infos["life_loss"])
        if "episode" in infos:
            ended = np.flatnonzero(infos["_episode"])
            seen["games"] += [(k, env, float(infos["episode"]["r"][env])) for env in ended]
    envs.close()
    return {key: value if key == "games" else np.stack(value) for key, value in seen.items()}


def learning_view(stream: dict) -> dict:
    """What learning should see of each step [steps, num_envs]: the sign of the reward, a lost life or a game over
    ending the training episode, the time-limit cut, and which steps are autoreset steps (the step after a step that
    ended an episode for the env: its action was ignored, it is no transition)."""
    ended = stream["terminated"] | stream["truncated"]
    return dict(
        rewards=np.sign(stream["rewards"]),
        terminations=stream["terminated"] | stream["life_loss"],
        truncations=stream["truncated"],
        resets=np.concatenate([np.zeros_like(ended[:1]), ended[:-1]]),
    )


def policy_and_value(agent, obs: torch.Tensor, obs_high: float):
    """The policy (a Categorical) and the value of the agent's torso and heads on uint8 observations (in the agent's
    floating type)."""
    hidden = agent.network(obs.to(agent.actor.weight.dtype) / obs_high)
    return torch.distributions.Categorical(logits=agent.actor(hidden)), agent.critic(hidden).squeeze(-1)


def clipped_ppo_loss(policy, value, mb: dict, clip: float, ent_coef=0.01, vf_coef=0.5, advantage_stats=None):
    """The PPO loss as the paper writes it, with CleanRL's clipped value loss, of the new `policy` (a Categorical) and
    `value` on the rows of `mb`: the surrogate min(r A, clip(r) A) with A normalised over these rows (or with
    `advantage_stats`, a mean and a standard deviation), 0.5 max((V - R)^2, (V_old + clip(V - V_old) - R)^2), minus
    the entropy bonus."""
    ratio = torch.exp(policy.log_prob(mb["actions"]) - mb["logprobs"])
    mean, std = advantage_stats or (mb["advantages"].mean(), mb["advantages"].std())
    advantages = (mb["advantages"] - mean) / (std + 1e-8)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
    value_clipped = mb["values"] + (value - mb["values"]).clamp(-clip, clip)
    value_loss = 0.5 * torch.max((value - mb["returns"]) ** 2, (value_clipped - mb["returns"]) ** 2).mean()
    return -surrogate + vf_coef * value_loss - ent_coef * policy.entropy().mean()


def reference_loss(agent, mb: dict, obs_high: float, clip: float):
    """clipped_ppo_loss of a feed-forward agent on the minibatch `mb` (its observations included)."""
    return clipped_ppo_loss(*policy_and_value(agent, mb["obs"], obs_high), mb, clip)


def float64_minibatch(mb: dict) -> dict:
    """The minibatch's floating tensors in float64: the rollout's log-probabilities, values, advantages and returns,
    constants of the update (recorded, they carry no graph)."""
    return {key: value.double() if value.is_floating_point() else value for key, value in mb.items()}


def assert_adam_steps(updates: list[dict], final_agent: dict, model, lrs: list[float], max_grad_norm: float = 0.5):
    """Every update's parameters are the previous ones after one Adam step (eps 1e-5, lr lrs[k]) on the gradient its
    backward() left, clipped to max_grad_norm; `updates` carry "agent" (the parameters the loss was computed with) and
    "grads" (that gradient by parameter name, None where none reached the parameter: the gradient tests check it
    against the reference loss's, in float64)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lrs[0], eps=1e-5)
    afters = [update["agent"] for update in updates[1:]] + [final_agent]
    for k, (update, after) in enumerate(zip(updates, afters)):
        model.load_state_dict(update["agent"])  # in place: the optimiser's state goes on with the same tensors
        optimizer.param_groups[0]["lr"] = lrs[k]
        for name, param in model.named_parameters():
            grad = update["grads"][name]
            param.grad = None if grad is None else grad.clone()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        for name, tensor in model.state_dict().items():
            assert torch.allclose(tensor, after[name], rtol=0, atol=1e-6), f"update {k}: {name}"


def reference_gae(learning: dict, values: np.ndarray, bootstrap: np.ndarray, gamma: float, gae_lambda: float):
    """[T, num_envs] advantages of one rollout by reference_advantages, env by env (nan at the autoreset steps):
    `values` [T, num_envs] of the observations acted on, `bootstrap` the value of the observation after the last."""
    num_steps, num_envs = values.shape
    advantages = np.full((num_steps, num_envs), np.nan)
    for env in range(num_envs):
        columns = [learning[key][:, env] for key in ("rewards", "terminations", "truncations", "resets")]
        stream = [(values[t, env], *(float(c[t]) for c in columns)) for t in range(num_steps)]
        stream.append((bootstrap[env], 0.0, 0.0, 0.0, 0.0))  # the observation after the rollout: its value only
        for t, advantage in enumerate(reference_advantages(stream, gamma, gae_lambda)[:num_steps]):
            if advantage is not None:
                advantages[t, env] = advantage
    return advantages


class AtariLoop(NamedTuple):
    trace: object
    stream: dict
    learning: dict
    run_dir: Path


@pytest.fixture(scope="module")
def atari_loop(tmp_path_factory) -> AtariLoop:
    from probe import probe_script

    from cleanrl_utils.envs.atari import make_envs

    cwd = tmp_path_factory.mktemp("loop")
    trace = probe_script(
        "ppo_atari.py",
        LOOP_FLAGS,
        cwd,
        watch=["next_obs", "action"],
        at_backward=UPDATE_NAMES,
        grads=["agent"],
        final=["action", "agent"],
        preload=["probe_atari_envs"],
    )
    stream = replay_stream(make_envs(SHORT_BREAKOUT, NUM_ENVS), 1, actions_taken(trace))
    (run_dir,) = run_dirs(cwd)
    return AtariLoop(trace, stream, learning_view(stream), run_dir)


def agent_from(state: dict, shape=(4, 84, 84), n_actions: int = 4, obs_high: float = 255.0) -> ppo_atari.Agent:
    agent = ppo_atari.Agent(shape, n_actions, obs_high)
    agent.load_state_dict(state)
    return agent


def rollouts(loop: AtariLoop):
    """Per iteration: its first update (the agent that collected the rollout, and the rollout's tensors) and the
    slice of the stream it covers."""
    updates_per_iteration = EPOCHS * MINIBATCHES
    for i in range(ITERATIONS):
        yield loop.trace.backward[i * updates_per_iteration], slice(i * NUM_STEPS, (i + 1) * NUM_STEPS)


def test_the_loop_acts_on_what_the_seeded_envs_return_and_stores_it_as_learning_sees_it(atari_loop):
    steps = loop_steps(atari_loop.trace)
    assert len(steps) == NUM_STEPS * ITERATIONS
    for k, step in enumerate(steps):  # the env's seed is the run's, and each step acts on the last observation
        assert torch.equal(step["next_obs"], torch.from_numpy(atari_loop.stream["obs"][k])), k
    learning = atari_loop.learning
    assert learning["terminations"].sum() >= 6 and learning["truncations"].sum() >= 1 and learning["resets"].sum() >= 6
    assert atari_loop.stream["life_loss"].sum() >= 4, "the run should lose lives for this test to mean anything"
    for update, rows in rollouts(atari_loop):
        assert update["rewards"].tolist() == learning["rewards"][rows].tolist()
        assert update["terminated"].tolist() == learning["terminations"][rows].astype(float).tolist()
        assert update["truncated"].tolist() == learning["truncations"][rows].astype(float).tolist()
        assert update["reset_steps"].tolist() == learning["resets"][rows].tolist()
        # The values stored are the rollout's agent's (the one the first update starts from) on the same observations.
        agent = agent_from(update["agent"])
        with torch.no_grad():
            _, values = policy_and_value(agent, torch.from_numpy(atari_loop.stream["obs"][rows]).flatten(0, 1), 255.0)
        assert torch.allclose(update["values"], values.view(NUM_STEPS, NUM_ENVS), atol=1e-5)


def test_advantages_are_gae_of_the_rollout_bootstrapped_from_the_observation_after_it(atari_loop):
    truncated_transitions = 0
    for update, rows in rollouts(atari_loop):
        after = atari_loop.stream["obs"][rows.stop]  # the observation after the rollout's last step
        assert torch.equal(update["next_obs"], torch.from_numpy(after))
        with torch.no_grad():
            _, bootstrap = policy_and_value(agent_from(update["agent"]), torch.from_numpy(after), 255.0)
        learning = {key: value[rows] for key, value in atari_loop.learning.items()}
        values = update["values"].double().numpy()
        expected = reference_gae(learning, values, bootstrap.double().numpy(), GAMMA, GAE_LAMBDA)
        transitions = ~learning["resets"]
        assert np.allclose(update["advantages"].numpy()[transitions], expected[transitions], atol=1e-5)
        assert np.allclose(update["returns"].numpy()[transitions], (expected + values)[transitions], atol=1e-5)
        truncated_transitions += int((learning["truncations"] & transitions).sum())
    assert truncated_transitions >= 1, "a time-limit cut should be bootstrapped in these rollouts"


def expected_rows(loop: AtariLoop, update: dict, rollout_agent, indices: torch.Tensor) -> dict:
    """The minibatch the update should see at flat rollout indices (t * num_envs + env), from the stream: the
    observations and actions, the rollout agent's log-probabilities and values, the advantages and returns it gave."""
    i = update["iteration"] - 1
    t, env = indices // NUM_ENVS + i * NUM_STEPS, indices % NUM_ENVS
    obs = torch.from_numpy(loop.stream["obs"][t.numpy(), env.numpy()])
    actions = torch.from_numpy(actions_taken(loop.trace)[t.numpy(), env.numpy()])
    with torch.no_grad():
        policy, values = policy_and_value(rollout_agent, obs, 255.0)
    flat = lambda x: x.reshape(-1)[indices]  # noqa: E731
    return dict(
        obs=obs,
        actions=actions,
        logprobs=policy.log_prob(actions),
        values=values,
        advantages=flat(update["advantages"]),
        returns=flat(update["returns"]),
    )


def test_each_epoch_takes_every_transition_once_with_the_rollouts_log_probabilities(atari_loop):
    updates = atari_loop.trace.backward
    assert len(updates) == ITERATIONS * EPOCHS * MINIBATCHES
    for first, rows in rollouts(atari_loop):
        rollout_agent = agent_from(first["agent"])
        transitions = np.flatnonzero(~atari_loop.learning["resets"][rows].reshape(-1))
        iteration = [u for u in updates if u["iteration"] == first["iteration"]]
        for epoch in range(EPOCHS):
            taken = torch.cat([u["mb_inds"] for u in iteration if u["epoch"] == epoch])
            assert sorted(taken.tolist()) == transitions.tolist(), "an epoch takes each transition once, no autoreset"
        for update in iteration:
            expected = expected_rows(atari_loop, update, rollout_agent, update["mb_inds"])
            assert torch.equal(update["mb"]["obs"], expected["obs"]) and torch.equal(
                update["mb"]["actions"], expected["actions"]
            )
            for key in ("logprobs", "values", "advantages", "returns"):
                assert torch.allclose(update["mb"][key], expected[key], atol=1e-5), key


def test_every_minibatch_gradient_and_loss_are_those_of_the_clipped_ppo_loss_of_its_rows(atari_loop):
    clipped = 0
    for k, update in enumerate(atari_loop.trace.backward):
        # The gradient the backward() left is the reference loss's, in float64, with the rollout's values,
        # log-probabilities and returns held constant; then the loss's value.
        mb, agent = float64_minibatch(update["mb"]), agent_from(update["agent"]).double()
        policy, value = policy_and_value(agent, mb["obs"], 255.0)
        expected = clipped_ppo_loss(policy, value, mb, CLIP)
        grads = gradients(expected, dict(agent.named_parameters()))
        assert_gradients_match(update["grads"]["agent"], grads, f"update {k}")
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
        ratio = torch.exp(policy.log_prob(mb["actions"]) - mb["logprobs"]).detach()
        clipped += int(((ratio - 1).abs() > CLIP).sum())
    assert clipped > 0, "some ratios should be clipped for this test to mean anything"


def test_every_gradient_step_is_adam_on_the_clipped_gradient_at_the_annealed_learning_rate(atari_loop):
    updates = [dict(agent=u["agent"], grads=u["grads"]["agent"]) for u in atari_loop.trace.backward]
    lrs = [LR * (1 - (k // (EPOCHS * MINIBATCHES)) / ITERATIONS) for k in range(len(updates))]
    assert_adam_steps(updates, atari_loop.trace.final["agent"], ppo_atari.Agent((4, 84, 84), 4, 255.0), lrs)
    logged = read_scalars(atari_loop.run_dir)["charts/learning_rate"]
    assert [value for _, value in logged] == pytest.approx(lrs[:: EPOCHS * MINIBATCHES])


def test_the_atari_run_logs_whole_game_scores_records_videos_and_evaluates_the_saved_model(atari_loop):
    scalars = read_scalars(atari_loop.run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    games = atari_loop.stream["games"]
    assert len(games) >= 1
    assert [(step, value) for step, value in scalars["charts/episodic_return"]] == [
        ((k + 1) * NUM_ENVS, pytest.approx(score)) for k, _, score in games
    ]
    assert list((atari_loop.run_dir / "videos").glob("*.mp4"))
    model = torch.load(atari_loop.run_dir / "ppo_atari.cleanrl_model", weights_only=False)
    assert model["script"] == "ppo_atari" and model["obs_shape"] == (4, 84, 84)
