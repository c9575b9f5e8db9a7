"""ppo_continuous_action_lstm.py: the LSTM state zeroed exactly at episode starts (against a loop over time steps that
resets by hand), the hidden-velocity wrapper against gymnasium's documented observation layouts, the script's own
loop under tests/probe.py (storage and episode starts against the stream, the rollout's memory, values and
log-probabilities against a plain float64 recurrence, GAE with truncations bootstrapped through the critic's memory,
every minibatch's gradient against a float64 reference loss on its replayed env sequences), smoke runs with
--save-model, SIGKILL + --resume (exact), bad input."""

from __future__ import annotations

import math
from pathlib import Path

import continuous_reference as plain
import numpy as np
import ppo_continuous_action_lstm as lstm_ppo
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from test_ppo_continuous import reference_gae, reference_reward_scaling
from update_reference import assert_gradients_match, gradients, leaves

SCRIPT = "ppo_continuous_action_lstm.py"
MODEL = "ppo_continuous_action_lstm.cleanrl_model"
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
    """One CPU thread, as the script runs (--torch-threads 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- plain references: the networks read from their state dicts, in float64 -------------------------------------


def lstm_cell(params: dict, name: str, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
    """One step of an LSTM from its definition (Hochreiter & Schmidhuber 1997; PyTorch's gate order i, f, g, o):
    c' = f * c + i * g, h' = o * tanh(c')."""
    weight_ih, weight_hh = params[f"{name}.weight_ih_l0"].double(), params[f"{name}.weight_hh_l0"].double()
    bias = params[f"{name}.bias_ih_l0"].double() + params[f"{name}.bias_hh_l0"].double()
    gates = x.double() @ weight_ih.T + h @ weight_hh.T + bias
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def tanh_mlp(params: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    h = torch.tanh(plain.linear(x, params, f"{name}.0"))
    h = torch.tanh(plain.linear(h, params, f"{name}.2"))
    return plain.linear(h, params, f"{name}.4")


def plain_unroll(params: dict, obs, starts, memory):
    """One time step at a time over obs [T, B, obs_dim] from `memory` [4, B, H] (actor h, c, critic h, c), each env's
    memory set to zeros before a step whose observation starts an episode (starts [T, B]): the policy's means
    [T, B, act_dim], the values [T, B] and the memory after the last step, in float64."""
    actor_h, actor_c, critic_h, critic_c = (m.double() for m in memory)
    means, values = [], []
    for t in range(len(obs)):
        x = torch.as_tensor(obs[t]).double()
        for env in range(x.shape[0]):
            if starts[t][env]:
                zero = torch.zeros_like(actor_h[env])
                actor_h, actor_c, critic_h, critic_c = (
                    torch.cat([m[:env], zero[None], m[env + 1 :]]) for m in (actor_h, actor_c, critic_h, critic_c)
                )
        actor_h, actor_c = lstm_cell(params, "actor_lstm", x, actor_h, actor_c)
        critic_h, critic_c = lstm_cell(params, "critic_lstm", x, critic_h, critic_c)
        means.append(tanh_mlp(params, "actor_mean", actor_h))
        values.append(tanh_mlp(params, "critic", critic_h).squeeze(-1))
    return torch.stack(means), torch.stack(values), torch.stack([actor_h, actor_c, critic_h, critic_c])


def gaussian_log_prob(params: dict, means: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    log_std = params["actor_logstd"].double()
    return torch.distributions.Normal(means, log_std.exp()).log_prob(torch.as_tensor(actions).double()).sum(-1)


# --- the recurrence and the wrapper --------------------------------------------------------------------------------


def test_lstm_state_is_zeroed_exactly_at_episode_starts_in_the_batched_unroll():
    torch.manual_seed(0)
    agent = lstm_ppo.Agent(3, 2, 8).double()
    num_steps, num_envs = 12, 4
    obs = torch.randn(num_steps, num_envs, 3, dtype=torch.float64)
    starts = torch.zeros(num_steps, num_envs, dtype=torch.bool)
    starts[0, 0] = starts[3, 1] = starts[4, 1] = starts[5, 0] = starts[11, 2] = True  # env 3 never starts
    memory = torch.randn(4, num_envs, 8, dtype=torch.float64)  # mid-episode memory
    with torch.no_grad():
        means, values, after = agent.unroll(obs, memory, starts)
        expected_means, expected_values, expected_after = plain_unroll(agent.state_dict(), obs, starts, memory)
    torch.testing.assert_close(means, expected_means, rtol=0, atol=1e-12)
    torch.testing.assert_close(values, expected_values, rtol=0, atol=1e-12)
    torch.testing.assert_close(after, expected_after, rtol=0, atol=1e-12)
    with torch.no_grad():  # the resets matter: without them the outputs from each start on differ
        unreset, _, _ = agent.unroll(obs, memory, torch.zeros_like(starts))
    assert not torch.allclose(unreset[0, 0], means[0, 0]) and not torch.allclose(unreset[11, 2], means[11, 2])
    torch.testing.assert_close(unreset[:, 3], means[:, 3], rtol=0, atol=1e-12)


def test_hide_velocities_keeps_the_positions_of_pendulums_documented_observation():
    import gymnasium as gym

    env = lstm_ppo.HideVelocities(gym.make("Pendulum-v1"), lstm_ppo.POSITIONS["Pendulum-v1"])
    env.reset(seed=0)
    theta, theta_dot = 2.5, -3.0
    env.unwrapped.state = np.array([theta, theta_dot])
    # Documented: [cos(theta), sin(theta), angular velocity]; hidden: the angular velocity.
    assert env.unwrapped._get_obs().tolist() == pytest.approx([math.cos(theta), math.sin(theta), theta_dot])
    assert env.observation(env.unwrapped._get_obs()).tolist() == pytest.approx([math.cos(theta), math.sin(theta)])
    assert env.observation_space.shape == (2,) and env.observation_space.high.tolist() == [1.0, 1.0]
    obs, *_ = env.step(np.array([0.5], dtype=np.float32))
    assert obs.shape == (2,) and np.allclose(obs**2 @ np.ones(2), 1.0)  # a point on the unit circle


@pytest.mark.parametrize("env_id", ["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5"])
def test_hide_velocities_keeps_qpos_without_x_of_the_documented_mujoco_layout(env_id):
    import gymnasium as gym

    env = lstm_ppo.HideVelocities(gym.make(env_id), lstm_ppo.POSITIONS[env_id])
    env.reset(seed=0)
    base = env.unwrapped
    # Documented (v5, exclude_current_positions_from_observation=True): qpos without the x-coordinate, then qvel.
    structure = base.observation_structure
    assert structure["skipped_qpos"] == 1 and structure["qpos"] == base.data.qpos.size - 1
    assert structure["qvel"] == base.data.qvel.size
    rng = np.random.default_rng(0)
    qpos = base.init_qpos + rng.uniform(-0.3, 0.3, base.model.nq)
    qvel = rng.uniform(-2.0, 2.0, base.model.nv)
    base.set_state(qpos, qvel)
    full = base._get_obs()
    np.testing.assert_allclose(full[: structure["qpos"]], qpos[1:])  # the layout is as documented
    np.testing.assert_array_equal(env.observation(full), full[: structure["qpos"]])  # positions only, all of them
    np.testing.assert_allclose(env.observation(full), qpos[1:])
    assert env.observation_space.shape == (structure["qpos"],)


def test_make_envs_hides_velocities_only_when_asked():
    hidden = lstm_ppo.make_envs("Pendulum-v1", 2, hide_velocities=True)
    full = lstm_ppo.make_envs("Pendulum-v1", 2, hide_velocities=False)
    assert hidden.single_observation_space.shape == (2,) and full.single_observation_space.shape == (3,)
    hidden_obs, _ = hidden.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(hidden_obs, full_obs[:, :2])
    hidden.close(), full.close()


# --- the loop's own wiring -----------------------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, so that a 32-step sequence holds several episode starts), 4 envs x 32 steps, 2
# iterations of 2 epochs of 2 minibatches (2 env sequences each), with a small entropy bonus so that its term is
# checked. The tests rebuild what the loop stored and computed with the plain recurrence above, the episode starts
# read from the stream (the run's first observation, and each one after an episode's end).
NUM_ENVS, NUM_STEPS, ITERATIONS, EPOCHS, MINIBATCHES, LSTM_SIZE = 4, 32, 2, 2, 2, 16
GAMMA, GAE_LAMBDA, ENT_COEF, CLIP = 0.9, 0.8, 1e-3, 0.2
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--no-hide-velocities", "--num-envs", str(NUM_ENVS)]
PROBE_FLAGS += ["--num-steps", str(NUM_STEPS), "--num-minibatches", str(MINIBATCHES), "--lstm-size", str(LSTM_SIZE)]
PROBE_FLAGS += ["--update-epochs", str(EPOCHS), "--total-timesteps", str(NUM_ENVS * NUM_STEPS * ITERATIONS)]
PROBE_FLAGS += ["--gamma", str(GAMMA), "--gae-lambda", str(GAE_LAMBDA), "--ent-coef", str(ENT_COEF)]
PROBE_WATCH = ["next_obs", "obs_rms", "noise", "iteration"]
PROBE_WATCH += ["action", "next_obs_np", "reward", "terminated", "truncated", "infos"]
PROBE_AT_BACKWARD = ["mb", "agent", "storage", "sequences", "rewards", "mb_envs", "iteration", "epoch", "logratio"]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("probe")
    final = ["action", "next_obs_np", "reward", "terminated", "truncated", "infos", "next_obs", "obs_rms", "memory"]
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS,
        cwd,
        watch=PROBE_WATCH,
        at_backward=PROBE_AT_BACKWARD,
        grads=["agent"],
        final=final,
        preload=["probe_box_envs"],
    )
    stream = plain.rollout_stream(trace, NUM_STEPS)
    starts = np.zeros((len(stream) + 1, NUM_ENVS), dtype=bool)
    starts[0] = True  # the run's first observations
    for k, step in enumerate(stream):  # SAME_STEP autoreset: the observation after an episode's end is a new one's
        starts[k + 1] = np.asarray(step["terminated"]) | np.asarray(step["truncated"])
    return trace, stream, starts, cwd


def rollouts(trace, stream):
    """Per iteration: its steps of the stream, their rows, and the first backward of its update (the agent that
    collected the rollout, its storage and sequences, before any gradient step)."""
    firsts = [next(entry for entry in trace.backward if entry["iteration"] == i) for i in range(1, ITERATIONS + 1)]
    for i, first in enumerate(firsts):
        rows = slice(i * NUM_STEPS, (i + 1) * NUM_STEPS)
        yield stream[rows], rows, first


def test_storage_holds_the_stream_and_the_episode_starts(probed):
    trace, stream, starts, cwd = probed
    assert len(stream) == NUM_STEPS * ITERATIONS
    inside = starts[1 : NUM_STEPS * ITERATIONS]
    assert inside.sum() >= 20, "episodes should start inside the rollouts for these tests to mean anything"
    for steps, rows, first in rollouts(trace, stream):
        storage = first["storage"]
        assert storage["starts"].tolist() == starts[rows].tolist()
        for step in steps:
            s, where = step["step"], f"iteration {step['iteration']} step {step['step']}"
            assert torch.equal(storage["obs"][s], step["obs"]), where
            assert torch.equal(storage["actions"][s], step["action"]), where  # as sampled, not clipped
            assert storage["rewards"][s].tolist() == np.float32(step["reward"]).tolist(), where
            assert storage["terminations"][s].tolist() == np.float32(step["terminated"]).tolist(), where
            assert storage["truncations"][s].tolist() == np.float32(step["truncated"]).tolist(), where
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), PPO_KEYS)


def test_the_rollout_acts_from_a_memory_zeroed_at_episode_starts_and_carried_into_the_next_rollout(probed):
    trace, stream, starts, _ = probed
    memory = torch.zeros(4, NUM_ENVS, LSTM_SIZE, dtype=torch.float64)  # the run's first memory
    for steps, rows, first in rollouts(trace, stream):
        storage, params = first["storage"], first["agent"]
        torch.testing.assert_close(storage["initial_memory"].double(), memory, rtol=0, atol=1e-5)
        obs = torch.stack([step["obs"] for step in steps])
        with torch.no_grad():
            means, values, memory = plain_unroll(params, obs, starts[rows], storage["initial_memory"])
        torch.testing.assert_close(storage["values"].double(), values, rtol=1e-5, atol=1e-5)
        log_probs = gaussian_log_prob(params, means, storage["actions"])
        torch.testing.assert_close(storage["logprobs"].double(), log_probs, rtol=1e-5, atol=1e-5)
        noise = torch.stack([step["noise"] for step in steps]).double()
        actions = means + params["actor_logstd"].double().exp() * noise
        torch.testing.assert_close(storage["actions"].double(), actions, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(trace.final["memory"].double(), memory, rtol=0, atol=1e-5)  # what a checkpoint holds


def test_gae_bootstraps_truncations_through_the_critics_memory_of_the_ended_episode(probed):
    trace, stream, starts, _ = probed
    pairs = list(rollouts(trace, stream))
    raw = [[np.asarray(step["reward"], dtype=np.float64).tolist() for step in steps] for steps, _, _ in pairs]
    dones = [[starts[k + 1].tolist() for k in range(rows.start, rows.stop)] for _, rows, _ in pairs]
    for expected, (_, _, first) in zip(reference_reward_scaling(raw, dones, GAMMA, 10.0), pairs):
        np.testing.assert_allclose(first["rewards"].numpy(), expected, rtol=1e-5, atol=1e-6)

    cuts = 0
    for steps, rows, first in pairs:
        params, storage = first["agent"], first["storage"]
        memory = storage["initial_memory"].double()
        values, next_values = [], []
        with torch.no_grad():
            for step in steps:
                k = rows.start + step["step"]
                _, value, memory = plain_unroll(params, step["obs"][None], starts[k][None], memory)
                following = stream[k + 1]["obs"] if k + 1 < len(stream) else trace.final["next_obs"]
                _, next_value, _ = plain_unroll(params, following[None], starts[k + 1][None], memory)
                next_value = next_value[0].clone()
                truncated = np.asarray(step["truncated"]) & ~np.asarray(step["terminated"])
                for env in np.flatnonzero(truncated):  # the true final observation, with the episode's memory
                    stats = plain.rms_state(stream[k + 1]["obs_rms"] if k + 1 < len(stream) else trace.final["obs_rms"])
                    final_obs = torch.as_tensor(plain.normalise(step["infos"]["final_obs"][env], stats, 10.0)).float()
                    _, final_value, _ = plain_unroll(params, final_obs[None, None], [[False]], memory[:, env : env + 1])
                    next_value[env] = final_value[0, 0]
                    cuts += 1
                values.append(value[0].tolist())
                next_values.append(next_value.tolist())
        terminations = [np.asarray(step["terminated"], dtype=float).tolist() for step in steps]
        truncations = [np.asarray(step["truncated"], dtype=float).tolist() for step in steps]
        rewards = first["rewards"].double().tolist()
        advantages = np.array(reference_gae(rewards, values, next_values, terminations, truncations, GAMMA, GAE_LAMBDA))
        sequences = first["sequences"]
        np.testing.assert_allclose(sequences["advantages"].numpy(), advantages, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(sequences["returns"].numpy(), advantages + values, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(sequences["values"].numpy(), values, rtol=1e-5, atol=1e-5)
    assert cuts >= 5, cuts


def reference_ppo_loss(params: dict, mb: dict, starts) -> torch.Tensor:
    """PPO's loss of a minibatch of whole env sequences (Schulman et al. 2017, weighted as CleanRL weighs it), from
    the agent's parameters `params` (float64 leaves): the sequences replayed one step at a time from the memory they
    began with (zeroed at the episode starts read from the stream), minus the clipped surrogate on the minibatch's
    advantages normalised over it, plus 0.5 times half the clipped squared value error, minus ENT_COEF times the
    entropy of the state-independent Gaussian. The rollout's log-probabilities, values, returns and advantages and the
    initial memory are constants."""
    means, value, _ = plain_unroll(params, mb["obs"], starts, mb["initial_memory"])
    ratio = (gaussian_log_prob(params, means, mb["actions"]) - mb["logprobs"].double()).exp()
    advantages = mb["advantages"].double()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * advantages).mean()
    old_value, returns = mb["values"].double(), mb["returns"].double()
    value_error = torch.maximum(
        (value - returns) ** 2, (old_value + (value - old_value).clamp(-CLIP, CLIP) - returns) ** 2
    )
    entropy = (params["actor_logstd"] + 0.5 * math.log(2 * math.pi * math.e)).sum()
    return -surrogate + 0.5 * 0.5 * value_error.mean() - ENT_COEF * entropy


def test_every_minibatch_replays_whole_env_sequences_and_steps_on_the_clipped_ppo_loss(probed):
    trace, stream, starts, _ = probed
    assert len(trace.backward) == ITERATIONS * EPOCHS * MINIBATCHES
    for k, entry in enumerate(trace.backward):
        where = f"update {k} (iteration {entry['iteration']}, epoch {entry['epoch']})"
        iteration_starts = starts[(entry["iteration"] - 1) * NUM_STEPS : entry["iteration"] * NUM_STEPS]
        envs, sequences, mb = entry["mb_envs"], entry["sequences"], entry["mb"]
        for field, value in sequences.items():  # the minibatch is these envs' whole sequences, with their memory
            assert torch.equal(mb[field], value[:, envs]), (where, field)
        params = leaves(entry["agent"])
        expected = reference_ppo_loss(params, mb, iteration_starts[:, envs.numpy()])
        assert_gradients_match(entry["grads"]["agent"], gradients(expected, params), where)
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6), where
    for iteration in range(1, ITERATIONS + 1):
        for epoch in range(EPOCHS):
            taken = [e["mb_envs"] for e in trace.backward if (e["iteration"], e["epoch"]) == (iteration, epoch)]
            assert sorted(torch.cat(taken).tolist()) == list(range(NUM_ENVS)), "an epoch takes every env once"


def test_the_first_replay_of_each_iteration_gives_back_the_rollouts_log_probabilities(probed):
    trace, stream, _, cwd = probed
    for _, _, first in rollouts(trace, stream):  # before the iteration's first gradient step: the same policy
        assert first["logratio"].abs().max() < 1e-5
    later = [entry["logratio"].abs().max() for entry in trace.backward if entry["epoch"] == 1]
    assert min(later) > 1e-4, "later minibatches replay a policy that has moved"
    (run_dir,) = run_dirs(cwd)
    lrs = [value for _, value in read_scalars(run_dir)["charts/learning_rate"]]
    assert lrs == pytest.approx([1e-3 * (1 - i / ITERATIONS) for i in range(ITERATIONS)])


# --- smoke runs, resume ------------------------------------------------------------------------------------------

RUN_FLAGS = ["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2"]
RUN_FLAGS += ["--update-epochs", "2", "--lstm-size", "16", "--total-timesteps", "1024", "--checkpoint-every", "256"]
RUN_FLAGS += ["--save-model", "--eval-episodes", "1"]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    """An uninterrupted run on Pendulum-v1 with its velocity hidden: the smoke run and the resume test's reference."""
    cwd = tmp_path_factory.mktemp("straight")
    result = run_script(SCRIPT, *RUN_FLAGS, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "evaluation over 1 episodes" in result.stdout
    (run_dir,) = run_dirs(cwd)
    return run_dir


def test_smoke_pendulum_without_velocity_writes_finite_scalars_and_evaluates_the_saved_model(straight_run):
    scalars = read_scalars(straight_run)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["charts/episodic_return"]) == 4 and len(scalars["eval/episodic_return"]) == 1
    model = torch.load(straight_run / MODEL, weights_only=False)
    assert model["script"] == "ppo_continuous_action_lstm" and (model["obs_dim"], model["act_dim"]) == (2, 1)
    assert model["args"]["hide_velocities"] is True and model["lstm_size"] == 16


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(straight_run, tmp_path):
    run_dir = kill_at_first_checkpoint(SCRIPT, RUN_FLAGS, tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] < 1024 and checkpoint["envs"] is not None
    assert checkpoint["memory"].shape == (4, 2, 16) and checkpoint["memory"].abs().sum() > 0  # the episodes' memory
    resumed = run_script(SCRIPT, *RUN_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path) == [run_dir]
    scalars, straight = read_scalars(run_dir), read_scalars(straight_run)
    for key in sorted(set(straight) - {"charts/SPS", "perf/peak_memory_gb"}):
        assert scalars[key] == straight[key], key
    model, straight_model = (torch.load(d / MODEL, weights_only=False) for d in (run_dir, straight_run))
    for name, value in straight_model["agent"].items():
        assert torch.equal(model["agent"][name], value), name


# --- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "Pendulm-v1"], ["unknown environment id", "Pendulum-v1"]),
        (["--env-id", "Ant-v5"], ["--hide-velocities knows", "Ant-v5", "--no-hide-velocities"]),
        (["--env-id", "MountainCar-v0", "--no-hide-velocities"], ["Box action space", "ppo_atari_lstm.py"]),
        (["--num-minibatches", "3"], ["--num-minibatches 3 does not divide --num-envs 8"]),
        (["--total-timesteps", "100"], ["less than one batch of 2048"]),
        (["--lstm-size", "0"], ["--lstm-size must be positive"]),
        (["--gamma", "1.5"], ["--gamma must be in (0, 1]"]),
    ],
)
def test_validate_rejects_bad_arguments_in_one_line(capsys, flags, fragments):
    import tyro

    args = tyro.cli(lstm_ppo.Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        lstm_ppo.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_input_exits_before_making_a_run_directory(workdir):
    assert_bad_input(run_script(SCRIPT, "--env-id", "Ant-v5", cwd=workdir), workdir, "--no-hide-velocities")
