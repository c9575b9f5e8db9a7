"""c51.py: smoke run, the distributional projection against hand-computed cases and a plain
loop, bad input, checkpoints and resume, learning."""

from __future__ import annotations

from pathlib import Path

import c51
import numpy as np
import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

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


def test_smoke_writes_finite_scalars_and_evaluates_saved_model(workdir):
    flags = [*TINY, "--total-timesteps", "600", "--save-model", "--eval-episodes", "2", "--exp-name", "mine"]
    result = run_script("c51.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, C51_KEYS + ["eval/episodic_return"])
    assert len(scalars["eval/episodic_return"]) == 2
    # Any --exp-name names the files; the model still says which script saved it.
    assert torch.load(run_dir / "mine.cleanrl_model", weights_only=False)["script"] == "c51"
    assert (run_dir / "args.json").is_file()
    assert "600/600 steps" in result.stdout  # the progress display's final line


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


# --- learning --------------------------------------------------------------------------------


def test_learns_cartpole_clearly_better_than_random(workdir):
    # A uniformly random policy averages ~22 on CartPole-v1. With these settings seeds 1 and 2
    # reached 287 and 189 over their last 20 episodes (~34 s of CPU time; more wall time on a
    # loaded 2-core machine).
    result = run_script(
        "c51.py",
        "--total-timesteps",
        "10000",
        "--learning-starts",
        "1000",
        "--train-frequency",
        "2",
        "--learning-rate",
        "1e-3",
        "--target-network-frequency",
        "100",
        "--batch-size",
        "64",
        "--exploration-fraction",
        "0.25",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    returns = [v for _, v in episodic_returns(run_dirs(workdir)[0])]
    assert np.mean(returns[-20:]) > 100, returns[-20:]
