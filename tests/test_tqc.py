"""tqc_continuous_action.py: the truncated pooled quantile target and the quantile Huber loss against plain loops
written from the paper, the stacked critics against N plain MLPs; the script's own loop under tests/probe.py (stored
rows, every critic, policy and alpha step's gradients against float64 references with the target held constant, no
gradient into the target critics, the critics unmoved by the policy step, Polyak averaging after every critic step);
smoke with the saved model's evaluation, SIGKILL + exact resume, bad input."""

from __future__ import annotations

import continuous_reference as plain
import pytest
import torch
import tqc_continuous_action as tqc
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from update_reference import assert_gradients_match, assert_unchanged, gradients, leaves

SCRIPT = "tqc_continuous_action.py"
LOSS_KEYS = ["losses/qf_loss", "losses/qf_values", "losses/actor_loss", "losses/alpha", "losses/alpha_loss"]


# --- the math against the paper ---------------------------------------------------------------------------------


def plain_target(next_quantiles, drop, rewards, terminations, next_log_prob, alpha, gamma):
    """Per sample: pool the N * M quantiles of all target critics, sort them, keep the N * M - drop smallest, and
    shift each kept atom z to r + gamma * (1 - done) * (z - alpha * log pi(a'|s'))."""
    n, batch, m = next_quantiles.shape
    out = []
    for i in range(batch):
        pooled = sorted(float(next_quantiles[c, i, j]) for c in range(n) for j in range(m))
        kept = pooled[: n * m - drop]
        out.append(
            [
                float(rewards[i]) + gamma * (1 - float(terminations[i])) * (z - alpha * float(next_log_prob[i]))
                for z in kept
            ]
        )
    return torch.tensor(out, dtype=torch.float64)


def plain_quantile_huber(quantiles, targets):
    """The paper's loss by loops: for critic n, sample i, quantile j at tau_j = (2j + 1) / 2M and target atom k,
    |tau_j - 1{u < 0}| * huber(u) with u = atom - quantile, huber(u) = u^2 / 2 if |u| <= 1 else |u| - 1/2; averaged."""
    n, batch, m = quantiles.shape
    total, count = 0.0, 0
    for c in range(n):
        for i in range(batch):
            for j in range(m):
                tau = (2 * j + 1) / (2 * m)
                for k in range(targets.shape[1]):
                    u = targets[i, k] - quantiles[c, i, j]
                    huber = 0.5 * u**2 if abs(u) <= 1 else abs(u) - 0.5
                    total = total + abs(tau - float(u < 0)) * huber
                    count += 1
    return total / count


@pytest.mark.parametrize("drop", [0, 3, 7])
def test_the_target_pools_every_critics_quantiles_and_drops_the_largest(drop):
    generator = torch.Generator().manual_seed(drop)
    next_quantiles = torch.randn(3, 5, 4, generator=generator, dtype=torch.float64) * 3
    rewards, log_prob = torch.randn(5, generator=generator, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    terminations = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    got = tqc.truncated_quantile_target(next_quantiles, drop, rewards, terminations, log_prob, 0.3, 0.9)
    expected = plain_target(next_quantiles, drop, rewards, terminations, log_prob, 0.3, 0.9)
    assert got.shape == (5, 12 - drop)
    torch.testing.assert_close(got, expected)


def test_quantile_huber_loss_and_its_gradient_match_the_papers_loops():
    generator = torch.Generator().manual_seed(0)
    quantiles = (torch.randn(2, 3, 4, generator=generator, dtype=torch.float64) * 2).requires_grad_(True)
    targets = torch.randn(3, 5, generator=generator, dtype=torch.float64) * 2  # |u| on both sides of 1
    reference = quantiles.detach().clone().requires_grad_(True)
    loss, expected = tqc.quantile_huber_loss(quantiles, targets), plain_quantile_huber(reference, targets)
    torch.testing.assert_close(loss, expected)
    loss.backward(), expected.backward()
    torch.testing.assert_close(quantiles.grad, reference.grad)


def test_the_stacked_critics_are_n_plain_mlps_with_m_outputs():
    torch.manual_seed(0)
    critics = tqc.QuantileCritics(obs_dim=3, act_dim=2, n_critics=4, n_quantiles=6, hidden=8)
    obs, actions = torch.randn(7, 3), torch.randn(7, 2)
    out = critics(obs, actions)
    assert out.shape == (4, 7, 6)
    state = critics.state_dict()
    for n in range(4):
        torch.testing.assert_close(out[n].double(), plain_critic(state, n, obs, actions))
    assert not torch.equal(out[0], out[1])  # each critic initialised on its own


def plain_critic(state: dict, n: int, obs, actions) -> torch.Tensor:
    """Critic n of QuantileCritics, from its state dict: three ReLU layers and the M outputs, x W + b on rows."""
    x = torch.cat([obs, actions], dim=-1).double()
    for k in range(4):
        x = x @ state[f"weights.{k}"][n].double() + state[f"biases.{k}"][n].double()
        x = x.relu() if k < 3 else x
    return x


# --- the loop's own wiring ----------------------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation, asymmetric action bounds), 2 envs: 88 steps of random actions, then 16 rounds of a
# critic step, a Polyak update and a policy-and-alpha step. 3 critics of 4 quantiles, 2 dropped per critic (6 of 12).
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--buffer-size", "120", "--batch-size", "16"]
PROBE_FLAGS += ["--learning-starts", "88", "--total-timesteps", "104", "--gamma", "0.9", "--tau", "0.1"]
PROBE_FLAGS += ["--n-critics", "3", "--n-quantiles", "4", "--top-quantiles-to-drop-per-net", "2"]
PROBE_FLAGS += ["--critic-hidden", "16", "--actor-hidden", "8", "--learning-rate", "1e-2"]
PROBE_STEP_NAMES = ["obs_np", "next_obs_np", "actions", "rewards", "terminations", "truncations", "infos"]
PROBE_AT_BACKWARD = ["batch", "noise", "obs", "t", "alpha", "log_alpha", "actor", "qf", "qf_target"]
GAMMA, TAU, LEARNING_STARTS, TARGET_ENTROPY, DROP = 0.9, 0.1, 88, -2.0, 6


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("probe")
    trace = probe_script(
        SCRIPT,
        PROBE_FLAGS,
        cwd,
        watch=PROBE_STEP_NAMES,
        at_backward=PROBE_AT_BACKWARD,
        grads=["qf", "actor", "log_alpha", "qf_target"],
        final=["rb"],
        preload=["probe_box_envs"],
    )
    return trace, cwd


def critic_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_critics"]


def policy_entries(trace) -> list[dict]:
    return [entry for entry in trace.backward if entry["where"] == "update_actor"]


def critic_quantiles(state: dict, obs, actions) -> torch.Tensor:
    return torch.stack([plain_critic(state, n, obs, actions) for n in range(3)])


def test_the_loop_stores_each_step_with_the_true_next_observation_and_only_terminations(probed):
    trace, cwd = probed
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    assert len(steps) == 52
    ends = plain.check_stored_rows(steps, trace.final["rb"], 4, 2, actions_name="actions")
    assert min(ends.values()) >= 5, ends
    (run_dir,) = run_dirs(cwd)
    assert_finite_keys(read_scalars(run_dir), LOSS_KEYS)


def test_each_critic_step_regresses_every_quantile_on_the_truncated_pooled_target(probed):
    trace, _ = probed
    rows = plain.buffer_rows(trace.final["rb"], 4, 2)
    stored = {plain.row_key(rows, i) for i in range(104)}
    updates = critic_entries(trace)
    assert [entry["t"] for entry in updates] == list(range(LEARNING_STARTS + 1, 105))  # one per env step
    terminal = 0
    for entry in updates:
        batch, where = entry["batch"], f"critic step at t={entry['t']}"
        assert all(plain.row_key(batch, i) in stored for i in range(16)), "a sampled row was never stored"
        alpha = entry["log_alpha"].double().exp()
        with torch.no_grad():  # the target held constant: the target critics at a' ~ pi(.|s') from this step's noise
            next_actions, next_log_prob = plain.squashed_gaussian(entry["actor"], batch["next_obs"], entry["noise"])
            next_quantiles = critic_quantiles(entry["qf_target"], batch["next_obs"], next_actions)
            target = plain_target(
                next_quantiles, DROP, batch["rewards"], batch["terminations"], next_log_prob, alpha.item(), GAMMA
            )
        qf = leaves(entry["qf"])
        loss = tqc_loss(critic_quantiles(qf, batch["obs"], batch["actions"]), target)
        assert_gradients_match(entry["grads"]["qf"], gradients(loss, qf), where)
        reached = [name for name, grad in entry["grads"]["qf_target"].items() if grad is not None]
        assert not reached, f"{where}: a gradient reached the target critics ({reached})"
        assert entry["loss"].item() == pytest.approx(loss.item(), rel=1e-5), where
        terminal += int(batch["terminations"].sum())
    assert terminal > 10, "sampled transitions should end episodes"


def tqc_loss(quantiles: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The quantile Huber loss, vectorised from plain_quantile_huber's definition (checked against it above)."""
    u = target[None, :, None, :] - quantiles[..., None]
    tau = (2 * torch.arange(quantiles.shape[-1], dtype=torch.float64) + 1) / (2 * quantiles.shape[-1])
    huber = torch.where(u.abs() <= 1, 0.5 * u**2, u.abs() - 0.5)
    return ((tau[:, None] - (u < 0).double()).abs() * huber).mean()


def test_each_policy_and_alpha_step_follows_the_mean_of_all_quantiles_with_the_critics_frozen(probed):
    trace, _ = probed
    critics, policies = critic_entries(trace), policy_entries(trace)
    assert [entry["t"] for entry in policies] == [entry["t"] for entry in critics]
    by_t = {entry["t"]: entry for entry in critics}
    for entry in policies:
        obs, where = entry["obs"], f"policy step at t={entry['t']}"
        assert torch.equal(obs, by_t[entry["t"]]["batch"]["obs"])  # the critic step's minibatch
        assert not torch.equal(entry["noise"], by_t[entry["t"]]["noise"])  # fresh noise
        params = leaves(entry["actor"]) | {"log_alpha": entry["log_alpha"].double().requires_grad_(True)}
        actions, log_prob = plain.squashed_gaussian(params, obs, entry["noise"])
        q = critic_quantiles(entry["qf"], obs, actions).mean(dim=(0, 2))  # every critic's every quantile
        actor_loss = (params["log_alpha"].detach().exp() * log_prob - q).mean()
        alpha_loss = (-params["log_alpha"] * (log_prob.detach() + TARGET_ENTROPY)).mean()  # the authors' form
        reference = gradients(actor_loss + alpha_loss, params)
        assert_gradients_match(entry["grads"]["actor"], reference, where)
        assert_gradients_match({"log_alpha": entry["grads"]["log_alpha"]}, reference, where)
        assert entry["loss"].item() == pytest.approx((actor_loss + alpha_loss).item(), rel=1e-5, abs=1e-6), where
        # The critics were frozen: the policy's loss left their gradients as the critic step did, and their weights
        # are those the next critic step starts from.
        for name, grad in entry["grads"]["qf"].items():
            assert torch.equal(grad, by_t[entry["t"]]["grads"]["qf"][name]), f"{where}: {name} got a gradient"
        if entry["t"] + 1 in by_t:
            assert_unchanged(entry["qf"], by_t[entry["t"] + 1]["qf"], where)
    assert policies[-1]["alpha"].item() < 1.0  # alpha (from 1) was tuned


def test_the_target_critics_follow_every_critic_step_by_polyak_averaging(probed):
    trace, _ = probed
    critics = critic_entries(trace)
    assert all(torch.equal(critics[0]["qf_target"][k], critics[0]["qf"][k]) for k in critics[0]["qf"])
    following = {id(entry): after for entry, after in zip(trace.backward, trace.backward[1:])}
    for before, after in zip(critics, critics[1:]):
        online = following[id(before)]["qf"]  # the critics after this step, as the policy step found them
        for name, value in after["qf_target"].items():
            expected = before["qf_target"][name].double() + TAU * (
                online[name].double() - before["qf_target"][name].double()
            )
            torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7, msg=f"after t={before['t']}")


# --- runs ------------------------------------------------------------------------------------------------------------
TINY = ["--env-id", "Pendulum-v1", "--batch-size", "32", "--buffer-size", "500", "--critic-hidden", "32"]
TINY += ["--actor-hidden", "16", "--n-critics", "2", "--n-quantiles", "5", "--top-quantiles-to-drop-per-net", "1"]
RESUME_FLAGS = [*TINY, "--learning-starts", "150", "--total-timesteps", "800", "--checkpoint-every", "300"]
RESUME_FLAGS += ["--save-model", "--eval-episodes", "1"]


def saved_weights(run_dir) -> dict:
    model = torch.load(run_dir / "tqc_continuous_action.cleanrl_model", weights_only=False)
    return {**{f"actor.{k}": v for k, v in model["actor"].items()}, **{f"qf.{k}": v for k, v in model["qf"].items()}}


def test_sigkill_then_resume_reproduces_the_uninterrupted_run_and_evaluates_the_saved_model(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    result = run_script(SCRIPT, *RESUME_FLAGS, cwd=straight)
    assert result.returncode == 0, result.stderr
    assert "evaluation over 1 episodes" in result.stdout
    run_dir = kill_at_first_checkpoint(SCRIPT, RESUME_FLAGS, interrupted)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] in (300, 600) and checkpoint["replay_buffer"]["size"] == checkpoint["global_step"]
    resumed = run_script(SCRIPT, *RESUME_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=interrupted)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(interrupted) == [run_dir]
    (straight_dir,) = run_dirs(straight)
    straight_scalars, resumed_scalars = read_scalars(straight_dir), read_scalars(run_dir)
    assert_finite_keys(straight_scalars, ["charts/episodic_return", *LOSS_KEYS, "eval/episodic_return"])
    for key in ("charts/episodic_return", "losses/qf_loss", "losses/actor_loss", "losses/alpha"):
        assert resumed_scalars[key] == straight_scalars[key], key
    a, b = saved_weights(run_dir), saved_weights(straight_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--env-id", "CartPole-v1"], ["Box", "cleanrl/dqn.py"]),
        (["--env-id", "Pendulum-v1", "--n-quantiles", "4", "--top-quantiles-to-drop-per-net", "4"], ["leaves no"]),
    ],
)
def test_bad_input_fails_in_one_line(workdir, flags, fragments):
    assert_bad_input(run_script(SCRIPT, *flags, cwd=workdir), workdir, *fragments)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(n_critics=0), "--n-critics must be positive"),
        (dict(n_quantiles=0), "--n-quantiles must be positive"),
        (dict(top_quantiles_to_drop_per_net=-1), "--top-quantiles-to-drop-per-net must be 0 or positive"),
        (dict(learning_rate=0.0), "--learning-rate must be positive"),
        (dict(batch_size=2000, buffer_size=1000), "--batch-size 2000 is larger than --buffer-size 1000"),
        (dict(buffer_size=10**13), "replay buffer"),
    ],
)
def test_validate_rejects(capsys, overrides, fragment):
    args = tqc.Args(**{"env_id": "Pendulum-v1", **overrides})
    with pytest.raises(SystemExit) as exit_info:
        tqc.validate(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
