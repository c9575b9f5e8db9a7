"""c51.py: its own loop run under observation (replay rows against the env's stream, every update's loss against the
C51 target projected by a plain loop from the sampled rows and the copied networks, target-network copies, epsilon;
every update's gradient against a float64 reference loss's, none reaching the target network; the same run is the
smoke run), the distributional projection against hand-computed cases and a plain loop, bad
input, checkpoints and resume, learning."""

from __future__ import annotations

from pathlib import Path

import c51
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, assert_no_gradient, gradients, leaves

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
    "--n-atoms",
    "21",
    "--v-min",
    "-10",
    "--v-max",
    "10",
]
TINY = [*SMALL, "--learning-starts", "100"]
C51_KEYS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/epsilon",
    "losses/loss",
    "losses/q_values",
]


# --- the loop's own wiring -----------------------------------------------------------------------------------------
# c51.py runs unchanged under tests/probe.py on ProbeWalk-v0 (tests/probe_envs.py: 8-step episodes that terminate or
# are truncated, varied rewards, distinct observations): what its loop stored and computed is compared with the env's
# stream and with the C51 loss recomputed from the sampled rows and the copied networks (the projection by the plain
# loop above). The same run is the smoke run (TensorBoard keys, the saved model's evaluation).

LOOP_FLAGS = ["--env-id", "ProbeWalk-v0", "--num-envs", "2", "--buffer-size", "360", "--batch-size", "16"]
LOOP_FLAGS += ["--learning-starts", "100", "--train-frequency", "4", "--target-network-frequency", "40"]
LOOP_FLAGS += ["--total-timesteps", "400", "--exploration-fraction", "0.5", "--end-e", "0.2", "--gamma", "0.9"]
LOOP_FLAGS += ["--n-atoms", "21", "--v-min", "-5", "--v-max", "5", "--learning-rate", "1e-3"]
LOOP_FLAGS += ["--save-model", "--eval-episodes", "2", "--exp-name", "mine"]
STEP_NAMES = ["obs_np", "actions", "next_obs_np", "rewards", "terminations", "truncations", "infos", "epsilon"]
BATCH_NAMES = ["obs_b", "next_obs_b", "actions_b", "rewards_b", "terminations_b", "q_network", "target_network"]


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("loop")
    names = dict(watch=STEP_NAMES, at_backward=BATCH_NAMES, grads=["q_network", "target_network"], final=["rb"])
    return probe_script("c51.py", LOOP_FLAGS, cwd, **names, preload=["probe_envs"]), cwd


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(loop):
    trace, cwd = loop
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, C51_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    # Any --exp-name names the files; the model still says which script saved it.
    assert torch.load(run_dir / "mine.cleanrl_model", weights_only=False)["script"] == "c51"
    assert (run_dir / "args.json").is_file()
    assert "400/400 steps" in trace.stdout  # the progress display's final line


def stream(trace) -> list[dict]:
    """One dict per loop iteration (taken as the step is stored): the observation acted on, the actions, epsilon and
    what the env returned, with `true_next`: the next observation, the true final one where an episode ended."""
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    assert [entry["step"] for entry in steps] == list(range(2, 401, 2))
    for step in steps:
        step["true_next"] = step["next_obs_np"].copy()
        for env in np.flatnonzero(step["infos"].get("_final_obs", [])):
            step["true_next"][env] = step["infos"]["final_obs"][env]
    return steps


def transition(step: dict, env: int) -> tuple:
    """(obs, action, reward, terminated, true next obs) of one env's step, as a replay row holds them (float32)."""
    reward = float(np.float32(step["rewards"][env]))
    action, terminated = float(step["actions"][env]), float(step["terminations"][env])
    return (step["obs_np"][env].tobytes(), action, reward, terminated, step["true_next"][env].tobytes())


def test_the_replay_buffer_holds_each_step_with_its_true_next_observation_and_terminations_only(loop):
    trace, _ = loop
    steps, rb = stream(trace), trace.final["rb"]
    assert (rb["size"], rb["pos"]) == (360, 400 % 360)  # 200 steps of 2 envs: 400 rows, wrapped around
    ends = {"terminated": 0, "truncated": 0}
    for t, step in enumerate(steps[-180:], start=len(steps) - 180):  # the last 180 steps fill the 360 rows
        for env in range(2):
            row = rb["data"][(2 * t + env) % 360]
            # obs, the true next observation (never the reset one), action, reward, the termination flag only
            key = (row[:3].numpy().tobytes(), row[6].item(), row[7].item(), row[8].item(), row[3:6].numpy().tobytes())
            assert key == transition(step, env), f"step {t}, env {env}"
            ends["terminated"] += int(step["terminations"][env])
            ends["truncated"] += int(step["truncations"][env] and not step["terminations"][env])
    assert min(ends.values()) >= 3, ends


def mlp_logits(params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Logits [batch, 3 actions, 21 atoms] from a QNetwork's weights (two hidden ReLU layers of 120 and 84 units)."""
    h = F.relu(F.linear(obs, params["fc1.weight"], params["fc1.bias"]))
    h = F.relu(F.linear(h, params["fc2.weight"], params["fc2.bias"]))
    return F.linear(h, params["fc3.weight"], params["fc3.bias"]).view(-1, 3, 21)


def test_each_update_samples_recent_transitions_and_minimises_the_cross_entropy_to_the_projected_target(loop):
    trace, _ = loop
    steps = stream(trace)
    updates = trace.backward
    assert [u["step"] for u in updates] == list(range(104, 401, 4))  # one gradient step per 4 env steps after 100
    support = np.linspace(-5, 5, 21)
    terminal = 0
    for update in updates:
        t, where = update["step"] // 2, f"update at step {update['step']}"  # t: steps stored; the buffer holds 180
        recent = {transition(step, env) for step in steps[max(0, t - 180) : t] for env in range(2)}
        rows = zip(update["obs_b"], update["actions_b"], update["rewards_b"], update["terminations_b"])
        for i, (obs, action, reward, terminated) in enumerate(rows):
            next_obs = update["next_obs_b"][i].numpy().tobytes()
            key = (obs.numpy().tobytes(), action.item(), reward.item(), terminated.item(), next_obs)
            assert key in recent, f"{where}: a sampled row is not a transition in the buffer"
        with torch.no_grad():
            # The target network's distribution at its own greedy next action (the largest mean), projected: a
            # constant, so the gradient reaches the online network only. The action picked in float32, as the script
            # picks it (a near-tie cannot go the other way); the rest in float64.
            float32_probs = torch.softmax(mlp_logits(update["target_network"], update["next_obs_b"]), dim=2)
            greedy = (float32_probs * update["target_network"]["support"]).sum(dim=2).argmax(dim=1).numpy()
            logits = mlp_logits(leaves(update["target_network"]), update["next_obs_b"].double())
            next_probs = torch.softmax(logits, dim=2).numpy()
            target = reference_projection(
                next_probs[np.arange(16), greedy],
                update["rewards_b"].double().numpy(),
                update["terminations_b"].double().numpy(),
                support,
                0.9,
            )
        online = leaves(update["q_network"])
        log_probs = torch.log_softmax(
            mlp_logits(online, update["obs_b"].double())[torch.arange(16), update["actions_b"]], dim=1
        )
        expected = -(torch.from_numpy(target) * log_probs).sum(dim=1).mean()
        assert_gradients_match(update["grads"]["q_network"], gradients(expected, online), where)
        assert_no_gradient(update["grads"]["target_network"], where)
        assert update["loss"].item() == pytest.approx(expected.item(), rel=1e-5), where
        terminal += int(update["terminations_b"].sum())
    assert terminal > 0, "some sampled rows should be terminations"


def test_the_target_network_is_the_online_network_copied_every_target_network_frequency_steps(loop):
    trace, _ = loop
    updates = trace.backward
    initial = updates[0]["q_network"]
    copy_steps = [c for c in range(40, 401, 40) if c > 100]
    for k, update in enumerate(updates):
        # Copied at the end of the iteration whose step reached a multiple of 40 after learning started (after that
        # iteration's gradient step): the online weights that the next update found.
        copies = [c for c in copy_steps if c < update["step"]]
        expected = next(u for u in updates if u["step"] > copies[-1])["q_network"] if copies else initial
        for name, tensor in update["target_network"].items():
            assert torch.equal(tensor, expected[name]), f"update {k} at step {update['step']}: {name}"
    assert not torch.equal(updates[-1]["target_network"]["fc3.weight"], initial["fc3.weight"])


def test_epsilon_decays_linearly_over_the_exploration_fraction(loop):
    trace, _ = loop
    duration = 0.5 * 400
    steps = stream(trace)
    for step in steps:
        acted_at = step["step"] - 2  # epsilon is computed before the step is counted
        assert step["epsilon"] == pytest.approx(max(1 + (0.2 - 1) * acted_at / duration, 0.2))
    assert steps[-1]["epsilon"] == pytest.approx(0.2)


# --- the projection --------------------------------------------------------------------------

SUPPORT5 = [-2.0, -1.0, 0.0, 1.0, 2.0]


def project5(next_probs, reward, termination, gamma, dtype=torch.float32):
    """project_distribution on one transition over the 5-atom support [-2, -1, 0, 1, 2]."""
    t = lambda a: torch.tensor(a, dtype=dtype)  # noqa: E731
    got = c51.project_distribution(t([next_probs]), t([reward]), t([termination]), t(SUPPORT5), gamma)
    assert got.shape == (1, 5) and got.dtype == dtype
    return got[0].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_projection_matches_hand_computed_cases(dtype):
    spread = [0.1, 0.2, 0.3, 0.2, 0.2]
    # Terminal, reward 0.5: the next distribution is dropped; 0.5 lies halfway between atoms 0 and 1.
    assert project5(spread, 0.5, 1.0, 0.99, dtype) == pytest.approx([0, 0, 0.5, 0.5, 0])
    # Terminal, reward -0.25 (b = 1.75): 1/4 of the mass on atom -1, 3/4 on atom 0.
    assert project5(spread, -0.25, 1.0, 0.99, dtype) == pytest.approx([0, 0.25, 0.75, 0, 0])
    # Targets beyond both ends of the support are clamped onto the end atoms.
    assert project5(spread, 10.0, 0.0, 0.5, dtype) == pytest.approx([0, 0, 0, 0, 1])  # r + 0.5 z in [9, 11]
    assert project5(spread, -10.0, 1.0, 0.5, dtype) == pytest.approx([1, 0, 0, 0, 0])
    # Non-terminal, gamma 0.5, r 0.25: atoms move to [-0.75, -0.25, 0.25, 0.75, 1.25], each split
    # between its neighbours: 0.1 -> 0.075 on -1 + 0.025 on 0; 0.2 -> 0.05 on -1 + 0.15 on 0;
    # 0.3 -> 0.225 on 0 + 0.075 on 1; 0.4 -> 0.1 on 0 + 0.3 on 1; the top atom holds nothing.
    assert project5([0.1, 0.2, 0.3, 0.4, 0.0], 0.25, 0.0, 0.5, dtype) == pytest.approx([0, 0.125, 0.5, 0.375, 0])
    # The same transition as a time-limit truncation is stored as not terminated: it keeps the
    # bootstrap, unlike a termination (all mass at 0.25: 0.75 on atom 0, 0.25 on atom 1).
    assert project5([0.1, 0.2, 0.3, 0.4, 0.0], 0.25, 1.0, 0.5, dtype) == pytest.approx([0, 0, 0.75, 0.25, 0])
    # gamma 0.5, r 0: atoms move to [-1, -0.5, 0, 0.5, 1]; -1, 0 and 1 land exactly on atoms.
    assert project5([0.4, 0.2, 0.1, 0.2, 0.1], 0.0, 0.0, 0.5, dtype) == pytest.approx([0, 0.5, 0.3, 0.2, 0])
    # gamma 1, r 1: every b is an atom ([-1, 0, 1, 2, 3 -> 2]): no mass may be lost where lower == upper.
    assert project5([0.2] * 5, 1.0, 0.0, 1.0, dtype) == pytest.approx([0, 0.2, 0.2, 0.2, 0.4])
    # Terminal, reward exactly on an atom.
    assert project5(spread, -1.0, 1.0, 0.99, dtype) == pytest.approx([0, 1, 0, 0, 0])


def reference_projection(next_probs, rewards, terminations, support, gamma):
    """The C51 projection (Bellemare et al. 2017, Algorithm 1), one atom at a time."""
    n_atoms = len(support)
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    projected = np.zeros((len(rewards), n_atoms))
    for i in range(len(rewards)):
        for j in range(n_atoms):
            tz = min(max(rewards[i] + gamma * (1 - terminations[i]) * support[j], v_min), v_max)
            b = (tz - v_min) / delta_z
            lower, upper = int(np.floor(b)), int(np.ceil(b))
            if lower == upper:
                projected[i, lower] += next_probs[i, j]
            else:
                projected[i, lower] += next_probs[i, j] * (upper - b)
                projected[i, upper] += next_probs[i, j] * (b - lower)
    return projected


def test_projection_keeps_total_probability_and_matches_a_plain_loop():
    generator = torch.Generator().manual_seed(0)
    batch, n_atoms = 256, 51
    support = torch.linspace(-10, 10, n_atoms, dtype=torch.float64)
    next_probs = torch.softmax(3 * torch.randn(batch, n_atoms, generator=generator, dtype=torch.float64), dim=1)
    # Rewards well beyond both ends of the support, some on atoms exactly (integers), some between.
    rewards = torch.cat(
        [
            30 * torch.rand(batch // 2, generator=generator, dtype=torch.float64) - 15,
            torch.randint(-14, 15, (batch // 2,), generator=generator).double(),
        ]
    )
    terminations = (torch.rand(batch, generator=generator) < 0.3).double()
    for gamma in (0.99, 1.0, 0.5):
        got = c51.project_distribution(next_probs, rewards, terminations, support, gamma)
        assert (got >= 0).all()
        torch.testing.assert_close(got.sum(dim=1), torch.ones(batch, dtype=torch.float64))
        expected = reference_projection(
            next_probs.numpy(), rewards.numpy(), terminations.numpy(), support.numpy(), gamma
        )
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-12)
    # float32 with the default support: rounding in (tz - v_min) / delta_z must not lose mass.
    support32 = torch.linspace(-100, 100, 101)
    probs32 = torch.softmax(torch.randn(batch, 101, generator=generator), dim=1)
    rewards32 = torch.cat(
        [
            torch.randint(-300, 301, (batch // 2,), generator=generator).float(),
            400 * torch.rand(batch // 2, generator=generator) - 200,
        ]
    )
    got = c51.project_distribution(probs32, rewards32, terminations.float(), support32, 0.99)
    torch.testing.assert_close(got.sum(dim=1), torch.ones(batch), atol=1e-5, rtol=0)


def test_q_values_are_the_means_and_select_actions_is_greedy_on_them():
    torch.manual_seed(0)
    q_network = c51.QNetwork(4, 3, n_atoms=5, v_min=-2, v_max=2)
    with torch.no_grad():
        q_network.fc3.weight.zero_()
        # Action 0: uniform (mean 0); action 1: all on +2 nearly (mean ~2); action 2: all on -2 nearly.
        q_network.fc3.bias.copy_(torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 20, 20, 0, 0, 0, 0.0]))
    obs = torch.randn(1000, 4)
    q = q_network.q_values(obs)
    assert q.shape == (1000, 3)
    torch.testing.assert_close(q[0], torch.tensor([0.0, 2.0, -2.0]), atol=1e-6, rtol=0)
    assert (c51.select_actions(q_network, obs, 0.0, 3) == 1).all()
    counts = np.bincount(c51.select_actions(q_network, obs, 1.0, 3), minlength=3) / 1000
    np.testing.assert_allclose(counts, [1 / 3] * 3, atol=0.06)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "Pendulum-v1"], ["Discrete", "sac_continuous_action.py", "td3_continuous_action.py"]),
        (["--v-min", "5", "--v-max", "5"], ["--v-min must be below --v-max"]),
        (["--n-atoms", "1"], ["--n-atoms must be at least 2"]),
        (["--total-timesteps", "5000"], ["--learning-starts 10000 must be in [0, --total-timesteps 5000)"]),
        (["--buffer-size", "64", "--batch-size", "128"], ["--batch-size 128 is larger than --buffer-size 64"]),
        # 10**12 transitions of 11 float32s: 44,000 GB, refused before allocating (and before the run directory).
        (
            ["--buffer-size", "1000000000000"],
            ["--buffer-size: the replay buffer needs 44000.0 GB", "lower --buffer-size"],
        ),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script("c51.py", *flags, cwd=workdir), workdir, *fragments)


def test_resume_and_evaluate_reject_a_dqn_checkpoint_and_model(workdir, capsys):
    from cleanrl_utils.checkpoint import CHECKPOINT_FORMAT, MODEL_FORMAT

    path = workdir / "dqn.pt"
    args = {"exp_name": "dqn", "env_id": "CartPole-v1"}
    torch.save({"format": CHECKPOINT_FORMAT, "script": "dqn", "env_id": "CartPole-v1", "args": args}, path)
    assert_bad_input(run_script("c51.py", "--resume", str(path), cwd=workdir), workdir, "written by dqn.py, not c51.py")
    # A DQN model has a q_network too, of another shape: evaluate() refuses it by its script, in one line.
    torch.save({"format": MODEL_FORMAT, "script": "dqn", "env_id": "CartPole-v1", "args": args}, path)
    with pytest.raises(SystemExit) as exit_info:
        c51.evaluate(path, 1, torch.device("cpu"))
    assert exit_info.value.code == 2 and "saved by dqn.py, not c51.py" in capsys.readouterr().err


# --- checkpoints and resume ------------------------------------------------------------------


def episodic_returns(run_dir: Path) -> list[tuple[int, float]]:
    return read_scalars(run_dir)["charts/episodic_return"]


def model_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "c51.cleanrl_model", weights_only=False)["q_network"]


RESUME_FLAGS = [
    *SMALL,
    "--learning-starts",
    "300",
    "--total-timesteps",
    "2000",
    "--checkpoint-every",
    "700",
    "--save-model",
    "--eval-episodes",
    "1",
]


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight_dir, workdir = tmp_path / "straight", tmp_path / "killed"
    straight_dir.mkdir(), workdir.mkdir()
    result = run_script("c51.py", *RESUME_FLAGS, cwd=straight_dir)
    assert result.returncode == 0, result.stderr
    (straight_run,) = run_dirs(straight_dir)

    run_dir = kill_at_first_checkpoint("c51.py", RESUME_FLAGS, workdir)
    assert not (run_dir / "c51.cleanrl_model").exists()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 2000 and checkpoint["replay_buffer"]["size"] == 500

    resumed = run_script("c51.py", *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(workdir) == [run_dir], "resume must continue the same run directory"
    assert "next_log" not in checkpoint and "losses" not in checkpoint  # no logging state in checkpoints
    # Whole curves, exactly: every log after the resume follows a post-resume gradient step (one per vector step).
    resumed_scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_run)
    for key in ("charts/episodic_return", "losses/loss", "losses/q_values", "charts/epsilon"):
        assert resumed_scalars[key] == straight_scalars[key], key
    resumed_weights, straight_weights = model_weights(run_dir), model_weights(straight_run)
    assert resumed_weights.keys() == straight_weights.keys()
    for key in straight_weights:
        assert torch.equal(resumed_weights[key], straight_weights[key]), key
