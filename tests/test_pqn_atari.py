"""pqn_atari.py: Q(lambda) returns under NEXT_STEP autoreset against a plain loop, the LayerNorm networks, smoke runs
on MinAtar and Atari, bad input, SIGKILL + resume; the script's own loop under tests/probe.py: the rollout stored on
Breakout (lives, autoreset steps) vs what the env returned, and on MinAtar the Q(lambda) returns from max Q of the next
observations and every minibatch's loss and its gradient (the full squared error, resets masked, the returns held
constant; float64), the epsilon and learning-rate schedules."""

from __future__ import annotations

import numpy as np
import pqn_atari
import pytest
import torch
import tyro
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, gradients

MINATAR_TINY = ["--env-id", "MinAtar/Breakout-v1", "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "4"]
PQN_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
]


# --- the maths -------------------------------------------------------------------------------


def reference_returns(rewards, next_max_q, terminations, truncations, resets, gamma, q_lambda):
    """The recursion written out per environment and step, in plain Python floats."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    returns = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        for t in reversed(range(num_steps)):
            r, q = rewards[t][env], next_max_q[t][env]
            if resets[t][env]:
                returns[t][env] = 0.0  # an autoreset step: no transition
            elif terminations[t][env]:
                returns[t][env] = r  # game over or a lost life: no bootstrap at all
            elif truncations[t][env] or t == num_steps - 1:
                returns[t][env] = r + gamma * q  # bootstrap from the next (true final) observation only
            else:
                returns[t][env] = r + gamma * ((1 - q_lambda) * q + q_lambda * returns[t + 1][env])
    return returns


def autoreset_rollout(num_steps: int = 9, num_envs: int = 4, seed: int = 0) -> dict:
    """A rollout as the NEXT_STEP env gives it: every game end (termination or truncation) is followed by a reset
    step, whose reward and flags are zero; lost lives end training episodes without a reset."""
    rng = np.random.default_rng(seed)
    terminations = np.zeros((num_steps, num_envs))
    truncations = np.zeros((num_steps, num_envs))
    resets = np.zeros((num_steps, num_envs))
    terminations[2, 0] = resets[3, 0] = 1  # game over, then the autoreset
    terminations[5, 0] = 1  # a lost life: the game goes on, no reset
    resets[0, 1] = 1  # the game ended on the last step of the previous rollout
    truncations[4, 1] = resets[5, 1] = 1  # the time limit: bootstraps from the true final observation
    terminations[8, 1] = 1  # game over on the rollout's last step (its reset is in the next rollout)
    truncations[7, 2] = resets[8, 2] = 1  # a reset on the rollout's last step
    terminations[1, 3] = truncations[1, 3] = resets[2, 3] = 1  # a life lost on the time limit's step: cut
    rewards = rng.choice([-1.0, 0.0, 1.0], size=(num_steps, num_envs)) * (1 - resets)
    next_max_q = rng.normal(2.0, 3.0, size=(num_steps, num_envs))
    return dict(
        rewards=rewards, next_max_q=next_max_q, terminations=terminations, truncations=truncations, resets=resets
    )


def torch_returns(rollout: dict, gamma: float, q_lambda: float, dtype=torch.float64) -> torch.Tensor:
    names = ("rewards", "next_max_q", "terminations", "truncations", "resets")
    return pqn_atari.q_lambda_returns(*(torch.tensor(rollout[n], dtype=dtype) for n in names), gamma, q_lambda)


@pytest.mark.parametrize("q_lambda", [0.0, 0.65, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_q_lambda_returns_match_a_python_loop_across_game_ends_lives_and_autoresets(q_lambda, dtype):
    gamma = 0.9
    rollout = autoreset_rollout()
    got = torch_returns(rollout, gamma, q_lambda, dtype)
    expected = reference_returns(*(rollout[n].tolist() for n in rollout), gamma, q_lambda)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    rewards, next_max_q = rollout["rewards"], rollout["next_max_q"]
    assert got[2, 0].item() == pytest.approx(rewards[2, 0])  # game over: the reward alone
    assert got[5, 0].item() == pytest.approx(rewards[5, 0])  # a lost life cuts the return too
    assert got[4, 1].item() == pytest.approx(rewards[4, 1] + gamma * next_max_q[4, 1])  # truncated: bootstraps
    assert (got[rollout["resets"] == 1] == 0).all()


def test_autoreset_steps_never_reach_into_the_returns_of_real_transitions():
    rollout = autoreset_rollout()
    perturbed = {name: values.copy() for name, values in rollout.items()}
    on_reset = rollout["resets"] == 1
    perturbed["rewards"][on_reset] = 1e6  # what the env reports on a reset step must not matter
    perturbed["next_max_q"][on_reset] = -1e6  # nor the first observation of the next game
    for q_lambda in (0.0, 0.65, 1.0):
        torch.testing.assert_close(torch_returns(perturbed, 0.99, q_lambda), torch_returns(rollout, 0.99, q_lambda))


def test_a_truncated_game_bootstraps_from_the_observation_its_reset_step_acted_on():
    # One env: step 1 hits the time limit, step 2 is the autoreset (it acted on the true final observation obs[2] and
    # returned the next game's first one, obs[3]), step 3 plays the new game. max_q[t] = max_a Q(obs[t]) as acting
    # computed it; next_max_q shifts it by one step, with max Q of the observation after the rollout last.
    gamma, q_lambda = 0.5, 0.5
    max_q = torch.tensor([[10.0], [20.0], [30.0], [40.0]])  # obs[2] (the final observation) has max Q 30
    after_rollout = torch.tensor([[50.0]])
    next_max_q = torch.cat([max_q[1:], after_rollout])
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0]])
    terminations = torch.zeros_like(rewards)
    truncations = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    resets = torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    got = pqn_atari.q_lambda_returns(rewards, next_max_q, terminations, truncations, resets, gamma, q_lambda)
    g1 = 2 + 0.5 * 30  # bootstraps from the final observation alone
    g0 = 1 + 0.5 * (0.5 * 20 + 0.5 * g1)
    assert got[:, 0].tolist() == pytest.approx([g0, g1, 0.0, 3 + 0.5 * 50])


def test_q_lambda_zero_is_the_one_step_target_masked_at_resets():
    rollout = autoreset_rollout()
    got = torch_returns(rollout, 0.99, 0.0)
    r, q, d, reset = (torch.tensor(rollout[n]) for n in ("rewards", "next_max_q", "terminations", "resets"))
    torch.testing.assert_close(got, (r + 0.99 * q * (1 - d)) * (1 - reset))


def test_masked_mean_ignores_reset_steps():
    values = torch.tensor([1.0, 2.0, 1e9, 3.0])
    assert pqn_atari.masked_mean(values, torch.tensor([1.0, 1.0, 0.0, 1.0])).item() == pytest.approx(2.0)
    assert pqn_atari.masked_mean(values, torch.zeros(4)).item() == 0.0


def test_epsilon_greedy_is_greedy_at_zero_and_uniform_at_one():
    torch.manual_seed(0)
    q_values = torch.tensor([[0.0, 1.0, -1.0]]).repeat(3000, 1)  # action 1 is greedy everywhere
    assert (pqn_atari.epsilon_greedy(q_values, 0.0) == 1).all()
    counts = torch.bincount(pqn_atari.epsilon_greedy(q_values, 1.0), minlength=3) / 3000
    np.testing.assert_allclose(counts.numpy(), [1 / 3] * 3, atol=0.04)


# --- the networks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obs_shape, obs_high, norm_shapes",
    [
        ((4, 84, 84), 255.0, [(32, 20, 20), (64, 9, 9), (64, 7, 7), (512,)]),  # Atari: the Nature CNN
        ((4, 10, 10), 1.0, [(16, 8, 8), (128,)]),  # MinAtar Breakout: 4 channels
        ((6, 10, 10), 1.0, [(16, 8, 8), (128,)]),  # MinAtar SpaceInvaders: 6 channels
    ],
)
def test_layernorm_networks_take_uint8_batches(obs_shape, obs_high, norm_shapes):
    torch.manual_seed(0)
    q_network = pqn_atari.QNetwork(obs_shape, 6, obs_high)
    norms = [m for m in q_network.network if isinstance(m, torch.nn.LayerNorm)]
    assert [tuple(m.normalized_shape) for m in norms] == norm_shapes  # a LayerNorm after every hidden layer
    obs = torch.randint(0, int(obs_high) + 1, (5, *obs_shape), dtype=torch.uint8)
    with torch.no_grad():
        q_values = q_network(obs)
        assert q_values.shape == (5, 6) and q_values.dtype == torch.float32 and torch.isfinite(q_values).all()
        # pixels are scaled to [0, 1] before the first layer
        torch.testing.assert_close(q_values, q_network.network(obs.float() / obs_high))
        first_norm = q_network.network[:2](obs.float() / obs_high)  # the first convolution's output, normalised
    torch.testing.assert_close(first_norm.mean(dim=(1, 2, 3)), torch.zeros(5), atol=1e-5, rtol=0)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["cleanrl/pqn.py"]),
        (["--env-id", "Breakout-v4"], ["BreakoutNoFrameskip-v4"]),
        (["--env-id", "MinAtar/Brekout-v1"], ["MinAtar/Breakout-v1"]),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], ["does not divide the batch of 15"]),
        (["--num-envs", "0"], ["--num-envs must be positive"]),
        (["--update-epochs", "0"], ["--update-epochs must be positive"]),
        (["--total-timesteps", "1000"], ["less than one batch of 4096 steps"]),
        (["--q-lambda", "1.5"], ["--q-lambda in [0, 1]"]),
        (["--end-e", "0.5", "--start-e", "0.1"], ["epsilon"]),
        (["--num-steps", "100000000", "--total-timesteps", "100000000000"], ["--num-steps", "GB"]),
    ],
)
def test_validate_refuses_bad_arguments_in_one_line(flags, fragments, capsys):
    # In-process: a subprocess per case would spend most of its time importing torch. The two cases below run the
    # script itself, for the exit code, the single stderr line and the absent run directory.
    args = tyro.cli(pqn_atari.Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        pqn_atari.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "HalfCheetah-v5"], ["continuous actions", "sac_continuous_action.py"]),
        (["--resume", "missing/checkpoint.pt"], ["missing/checkpoint.pt"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("pqn_atari.py", *flags, cwd=workdir), workdir, *fragments)


# --- runs ------------------------------------------------------------------------------------


MINATAR_RUN = [*MINATAR_TINY, "--total-timesteps", "2560", "--checkpoint-every", "640", "--save-model"]
MINATAR_RUN += ["--eval-episodes", "3", "--num-minibatches", "2", "--update-epochs", "1", "--gamma", "0.9"]
STEP_NAMES = ["obs", "action", "reward", "terminated", "truncated", "infos", "epsilon"]
LAST_ANSWER = ["action", "reward", "terminated", "truncated", "infos"]  # a rollout's last step, seen at its backward


@pytest.fixture(scope="module")
def straight_minatar_run(tmp_path_factory):
    """One uninterrupted MinAtar run, under tests/probe.py (which only observes): the loop tests read what its loop
    saw and computed, the smoke test its logs, the resume test compares against it."""
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("straight")
    at_backward = ["storage", "obs", "q_network", "b_returns", "b_is_transition", "mb_inds", *LAST_ANSWER]
    trace = probe_script(
        "pqn_atari.py", MINATAR_RUN, cwd, watch=STEP_NAMES, at_backward=at_backward, grads=["q_network"]
    )
    (run_dir,) = run_dirs(cwd)
    return trace, run_dir


def test_minatar_smoke_logs_whole_games_and_evaluates_saved_model(straight_minatar_run):
    trace, run_dir = straight_minatar_run
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PQN_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/td_loss"]) == 20  # one log per iteration of 4 x 32 steps
    assert len(scalars["charts/episodic_return"]) >= 10  # many whole games
    assert len(scalars["eval/episodic_return"]) == 3
    assert torch.load(run_dir / "pqn_atari.cleanrl_model", weights_only=False)["script"] == "pqn_atari"
    assert "2,560/2,560 steps" in trace.stdout


def test_atari_smoke_trains_and_resumes_with_fresh_games(workdir):
    flags = ["--num-envs", "4", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"]
    flags += ["--total-timesteps", "192", "--checkpoint-every", "64"]
    run_dir = kill_at_first_checkpoint("pqn_atari.py", flags, workdir)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["envs"] is None  # ALE's vector env cannot be saved
    resumed = run_script("pqn_atari.py", *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert "freshly reset" in resumed.stdout
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, ["losses/td_loss", "losses/q_values", "charts/epsilon", "charts/SPS"])
    assert [step for step, _ in scalars["losses/td_loss"]] == [64, 128, 192]  # one curve, continued


def test_sigkill_then_resume_on_minatar_reproduces_the_uninterrupted_run(straight_minatar_run, workdir):
    _, straight_dir = straight_minatar_run
    run_dir = kill_at_first_checkpoint("pqn_atari.py", MINATAR_RUN, workdir)
    assert not (run_dir / "pqn_atari.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 640 and checkpoint["envs"] is not None
    resumed = run_script("pqn_atari.py", *MINATAR_RUN, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_dir)
    for key in (
        "charts/episodic_return",
        "losses/td_loss",
        "losses/q_values",
        "charts/epsilon",
        "eval/episodic_return",
    ):
        assert resumed_scalars[key] == straight_scalars[key], key
    resumed_weights = torch.load(run_dir / "pqn_atari.cleanrl_model", weights_only=False)["q_network"]
    straight_weights = torch.load(straight_dir / "pqn_atari.cleanrl_model", weights_only=False)["q_network"]
    for key in straight_weights:
        assert torch.equal(resumed_weights[key], straight_weights[key]), key


# --- the loop's own wiring -------------------------------------------------------------------
# tests/probe.py copies what the loop saw at every step and what every loss was computed from; the tests rebuild the
# stored rollout, the Q(lambda) returns and the losses from those copies. Breakout (it has lives; acting at random) for
# what is stored, MinAtar (above) for the updates.
BREAKOUT_FLAGS = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2", "--num-steps", "50", "--end-e", "1"]
BREAKOUT_FLAGS += ["--num-minibatches", "1", "--update-epochs", "1", "--total-timesteps", "600"]


@pytest.fixture(scope="module")
def breakout_loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("breakout")
    return probe_script("pqn_atari.py", BREAKOUT_FLAGS, cwd, watch=STEP_NAMES, at_backward=["storage", *LAST_ANSWER])


def rollouts(trace, num_envs: int, num_steps: int) -> list[dict]:
    """Per iteration, what its loop saw: the observations acted on, epsilon, and the env's answer to each step
    (actions, raw rewards, terminations, truncations, infos), with each step's autoreset flag as the loop's own
    NEXT_STEP rule gives it (the env's previous step ended a game), and the first update of the iteration. A watched
    entry is taken right after the step counter moves, before the env is stepped: the answer to a step shows in the
    next entry, and a rollout's last one at the iteration's first backward."""
    entries = [entry for entry in trace.steps if entry["step"] > 0]
    first_updates = {}
    for update in trace.backward:
        first_updates.setdefault(update["step"], update)
    found, game_ended = [], np.zeros(num_envs, dtype=bool)
    for i, (step, update) in enumerate(sorted(first_updates.items())):
        acted = entries[i * num_steps : (i + 1) * num_steps]
        assert [entry["step"] for entry in acted] == [step - (num_steps - t - 1) * num_envs for t in range(num_steps)]
        answers = entries[i * num_steps + 1 : (i + 1) * num_steps] + [update]
        rollout = dict(obs=torch.stack([entry["obs"] for entry in acted]), epsilon=[e["epsilon"] for e in acted])
        rollout |= {name: np.stack([np.asarray(answer[name]) for answer in answers]) for name in LAST_ANSWER[:4]}
        rollout["life_loss"] = np.stack([a["infos"].get("life_loss", np.zeros(num_envs, bool)) for a in answers])
        resets = []
        for terminated, truncated in zip(rollout["terminated"], rollout["truncated"]):
            resets.append(game_ended)
            game_ended = terminated | truncated
        found.append(rollout | dict(resets=np.stack(resets), update=update, step=step))
    return found


def check_stored_rollouts(found: list[dict]) -> dict:
    """Each iteration's stored rollout against what its loop saw; returns how many lives, resets and rewards it held."""
    counts = dict(lives=0, resets=0, rewards=0)
    for rollout in found:
        storage = rollout["update"]["storage"]
        assert torch.equal(storage["obs"], rollout["obs"])  # uint8, as acted on
        assert storage["actions"].tolist() == rollout["action"].tolist()
        np.testing.assert_array_equal(storage["rewards"], np.sign(rollout["reward"]))
        np.testing.assert_array_equal(storage["terminations"], rollout["terminated"] | rollout["life_loss"])
        np.testing.assert_array_equal(storage["truncations"], rollout["truncated"])
        np.testing.assert_array_equal(storage["resets"], rollout["resets"])
        counts["lives"] += int(rollout["life_loss"].sum())
        counts["resets"] += int(rollout["resets"].sum())
        counts["rewards"] += int((rollout["reward"] != 0).sum())
    return counts


def test_the_rollout_stores_each_step_with_clipped_rewards_and_life_losses_as_terminations(breakout_loop):
    found = rollouts(breakout_loop, 2, 50)
    assert len(found) == 6
    counts = check_stored_rollouts(found)
    assert counts["lives"] >= 2 and counts["rewards"] >= 2, counts


def test_the_rollout_stores_game_ends_and_marks_the_autoreset_steps_after_them(straight_minatar_run):
    found = rollouts(straight_minatar_run[0], 4, 32)
    counts = check_stored_rollouts(found)
    assert counts["resets"] >= 5 and counts["rewards"] >= 5, counts


def reference_rollout_returns(rollout: dict, q_network, after_obs, gamma: float, q_lambda: float) -> np.ndarray:
    """Q(lambda) returns written out per env and step: an autoreset step is no transition (0); a termination or lost
    life keeps the clipped reward alone; else bootstrap from max Q of the next observation (the true final one where a
    game was cut by its time limit, as NEXT_STEP autoreset returns it), mixed with the next return while the episode
    and the rollout go on."""
    obs, num_steps, num_envs = rollout["obs"], *rollout["reward"].shape
    ended = rollout["terminated"] | rollout["life_loss"]
    returns = np.zeros((num_steps, num_envs))
    with torch.no_grad():
        next_max_q = q_network(torch.cat([obs[1:], after_obs.unsqueeze(0)]).flatten(0, 1)).amax(1).view(num_steps, -1)
    for env in range(num_envs):
        for t in reversed(range(num_steps)):
            reward, q = np.sign(rollout["reward"][t, env]), next_max_q[t, env].item()
            if rollout["resets"][t, env]:
                returns[t, env] = 0.0
            elif ended[t, env]:
                returns[t, env] = reward
            elif rollout["truncated"][t, env] or t == num_steps - 1:
                returns[t, env] = reward + gamma * q
            else:
                returns[t, env] = reward + gamma * ((1 - q_lambda) * q + q_lambda * returns[t + 1, env])
    return returns


def test_each_update_regresses_q_on_the_q_lambda_returns_of_the_next_observations_with_resets_masked(
    straight_minatar_run,
):
    trace, _ = straight_minatar_run
    found = rollouts(trace, 4, 32)
    assert len(found) == 20
    updates = {}
    for update in trace.backward:
        updates.setdefault(update["step"], []).append(update)
    q_network = pqn_atari.QNetwork((4, 10, 10), 3, 1.0)
    q_network64 = pqn_atari.QNetwork((4, 10, 10), 3, 1.0).double()
    counts = dict(game_ends=0, masked=0)
    for rollout in found:
        first = rollout["update"]
        q_network.load_state_dict(first["q_network"])  # the returns were computed before this iteration's updates
        expected = reference_rollout_returns(rollout, q_network, first["obs"], 0.9, 0.65).reshape(-1)
        np.testing.assert_allclose(first["b_returns"].numpy(), expected, rtol=1e-5, atol=1e-5)
        is_transition = ~rollout["resets"].reshape(-1)
        assert first["b_is_transition"].bool().tolist() == is_transition.tolist()
        assert len(updates[rollout["step"]]) == 2  # 1 epoch of 2 minibatches
        for update in updates[rollout["step"]]:
            q_network64.load_state_dict(update["q_network"])
            rows = update["mb_inds"]
            q_values = q_network64.network(rollout["obs"].flatten(0, 1)[rows].double())  # MinAtar: 0/1 cells, scale 1
            q_taken = q_values[torch.arange(len(rows)), torch.as_tensor(rollout["action"].reshape(-1)[rows.numpy()])]
            errors = (q_taken - torch.as_tensor(expected[rows.numpy()])) ** 2  # the returns: constants
            kept = torch.as_tensor(is_transition[rows.numpy()])
            # The mean squared error over real transitions (CleanRL's F.mse_loss, no factor 1/2), and its gradient.
            loss = errors[kept].mean()
            where = f"update at step {rollout['step']}"
            assert_gradients_match(
                update["grads"]["q_network"], gradients(loss, dict(q_network64.named_parameters())), where
            )
            assert update["loss"].item() == pytest.approx(loss.item(), rel=1e-5)
            counts["masked"] += int((~kept).sum())
        counts["game_ends"] += int(rollout["terminated"].sum())
    assert counts["game_ends"] >= 5 and counts["masked"] >= 5, counts


def test_epsilon_and_the_learning_rate_follow_their_schedules(straight_minatar_run):
    trace, run_dir = straight_minatar_run
    found = rollouts(trace, 4, 32)
    for rollout in found:
        for t, epsilon in enumerate(rollout["epsilon"]):
            acted_at = rollout["step"] - (32 - t) * 4  # epsilon is computed before the step is counted
            assert epsilon == pytest.approx(max(1 + (0.001 - 1) * acted_at / (0.1 * 2560), 0.001))
    learning_rates = [value for _, value in read_scalars(run_dir)["charts/learning_rate"]]
    assert learning_rates == pytest.approx([2.5e-4 * (1 - i / 20) for i in range(20)])  # annealed towards 0
