"""rpo_continuous_action.py: Robust Policy Optimization. The perturbed log-probability against scipy's normal density at
the shifted mean, the update's draw of the shift, alpha 0 being PPO's update; the script's own loop under
tests/probe.py (the rollout samples and stores the unperturbed policy, every minibatch's loss and gradient score its
actions under the mean shifted by that minibatch's uniform draw); alpha 0 reproducing ppo_continuous_action.py's run
exactly; smoke runs (Hopper-v5, dm_control) with the saved model evaluated, SIGKILL and exact resume, bad input,
learning."""

from __future__ import annotations

import math
from pathlib import Path

import continuous_reference as plain
import numpy as np
import ppo_continuous_action as pca
import pytest
import rpo_continuous_action as rpo
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from scipy.stats import norm
from update_reference import assert_gradients_match, gradients, leaves

SCRIPT = "rpo_continuous_action.py"
MODEL = "rpo_continuous_action.cleanrl_model"
TINY = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
LOSS_KEYS = [
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
KEYS = ["charts/episodic_return", "charts/episodic_length", *LOSS_KEYS]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def curves(run_dir: Path) -> dict:
    """Every curve but the wall-clock ones."""
    return {
        key: value for key, value in read_scalars(run_dir).items() if key not in ("charts/SPS", "perf/peak_memory_gb")
    }


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key


# --- the perturbed log-probability and the update's draw -------------------------------------------------------------


def small_agent(seed: int = 0) -> rpo.Agent:
    torch.manual_seed(seed)
    agent = rpo.Agent(3, 2)
    with torch.no_grad():  # a policy away from the initial one: mean not ~0, std not 1
        agent.actor_logstd.copy_(torch.tensor([-0.4, 0.25]))
        agent.actor_mean[-1].bias.copy_(torch.tensor([0.7, -1.1]))
    return agent


def scipy_log_prob(agent_state: dict, obs: torch.Tensor, actions: torch.Tensor, shift) -> np.ndarray:
    """sum_i log N(a_i; mean_i(obs) + shift_i, std_i), the mean read from the state dict, the density scipy's."""
    mean, log_std = plain.gaussian_policy(agent_state, obs)
    loc = mean.numpy() + np.asarray(shift, dtype=np.float64)
    return norm.logpdf(actions.double().numpy(), loc=loc, scale=np.exp(log_std.numpy())).sum(-1)


def test_log_prob_is_the_normal_density_at_the_shifted_mean_and_sampling_is_unperturbed():
    agent = small_agent()
    state = {key: value.clone() for key, value in agent.state_dict().items()}
    rng = np.random.default_rng(0)
    obs = torch.tensor(rng.normal(size=(6, 3)), dtype=torch.float32)
    actions = torch.tensor(rng.normal(size=(6, 2)), dtype=torch.float32)
    shift = rng.uniform(-0.5, 0.5, size=(6, 2))
    with torch.no_grad():
        shifted = agent.log_prob(obs, actions, torch.tensor(shift, dtype=torch.float32))
        plain_log_prob = agent.log_prob(obs, actions)
        noise = torch.randn(6, 2)
        sample = agent.sample_action(obs, noise)
        mean, std = agent.actor_mean(obs), agent.actor_logstd.exp()
    np.testing.assert_allclose(shifted.numpy(), scipy_log_prob(state, obs, actions, shift), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain_log_prob.numpy(), scipy_log_prob(state, obs, actions, 0.0), rtol=1e-5, atol=1e-5)
    assert (shifted - plain_log_prob).abs().min() > 1e-3  # the shift matters
    # The rollout's sample: the unperturbed mean plus std times the caller's N(0, I) noise, whatever alpha is.
    assert torch.equal(sample, mean + std * noise)


def minibatch(seed: int = 1, size: int = 16) -> rpo.Batch:
    rng = np.random.default_rng(seed)
    t = lambda *shape: torch.tensor(rng.normal(size=shape), dtype=torch.float32)  # noqa: E731
    return rpo.Batch(obs=t(size, 3), actions=t(size, 2), logprobs=t(size) - 3, advantages=t(size), returns=t(size),
                     values=t(size))  # fmt: skip


def test_update_scores_the_minibatch_under_the_mean_shifted_by_a_fresh_uniform_draw():
    alpha, mb = 0.3, minibatch()
    agent = small_agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)
    args = rpo.Args(rpo_alpha=alpha)
    # The same seeded stream: one U(-alpha, alpha) number per sample and action dimension, a new draw per minibatch.
    torch.manual_seed(7)
    shifts = [torch.empty(16, 2).uniform_(-alpha, alpha) for _ in range(2)]
    torch.manual_seed(7)
    for shift in shifts:
        assert shift.abs().max() <= alpha and len(set(shift.reshape(-1).tolist())) == 32
        before = {key: value.clone() for key, value in agent.state_dict().items()}
        stats = rpo.update_minibatch(agent, optimizer, mb, args)
        new_log_prob = (stats["logratio"] + mb.logprobs).double().numpy()
        expected = scipy_log_prob(before, mb.obs, mb.actions, shift)
        np.testing.assert_allclose(new_log_prob, expected, rtol=1e-5, atol=1e-5)
        assert np.abs(new_log_prob - scipy_log_prob(before, mb.obs, mb.actions, 0.0)).min() > 1e-4


def test_alpha_0_update_is_ppo_continuous_actions_and_draws_nothing():
    mb = minibatch(seed=2)
    agents = [small_agent(), pca.Agent(3, 2)]
    agents[1].load_state_dict(agents[0].state_dict())
    optimizers = [torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5) for agent in agents]
    rng_before = torch.get_rng_state()
    ours = rpo.update_minibatch(agents[0], optimizers[0], mb, rpo.Args(rpo_alpha=0.0))
    assert torch.equal(torch.get_rng_state(), rng_before), "alpha 0 must leave the random stream as PPO's"
    theirs = pca.update_minibatch(agents[1], optimizers[1], mb, pca.Args())
    for key in ("policy_loss", "value_loss", "logratio", "clipped"):
        assert torch.equal(ours[key], theirs[key]), key
    assert_same_tensors(agents[0].state_dict(), agents[1].state_dict())


# --- the loop's own wiring -------------------------------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes, two action
# dimensions with asymmetric bounds), 2 envs x 32 steps, 2 iterations of 2 epochs of 2 minibatches, alpha 0.5, a small
# entropy bonus (CleanRL's RPO has none; on here so that its term is checked). The tests rebuild, from the copies and
# the agent's state dict, the rollout's samples and stored log-probabilities (unperturbed) and every minibatch's loss
# and gradient (perturbed by the draw update_minibatch made, `mean_shift`).
ALPHA, NUM_STEPS, ENT_COEF = 0.5, 32, 1e-3
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--num-steps", str(NUM_STEPS), "--num-minibatches", "2"]
PROBE_FLAGS += ["--update-epochs", "2", "--total-timesteps", "128", "--rpo-alpha", str(ALPHA), "--ent-coef", "1e-3"]
RESULTS = ["action", "next_obs_np", "reward", "terminated", "truncated", "infos"]


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    return probe_script(
        SCRIPT,
        PROBE_FLAGS,
        tmp_path_factory.mktemp("probe"),
        watch=["next_obs", "obs_rms", "noise", "iteration", *RESULTS],
        at_backward=["mb", "agent", "batch", "mean_shift", "iteration", "epoch"],
        grads=["agent"],
        final=[*RESULTS, "next_obs", "obs_rms"],
        preload=["probe_box_envs"],
    )


def test_the_rollout_samples_the_unperturbed_policy_and_stores_its_unperturbed_log_probabilities(probed):
    stream = plain.rollout_stream(probed, NUM_STEPS)
    assert len(stream) == 64
    for iteration in (1, 2):
        first = next(entry for entry in probed.backward if entry["iteration"] == iteration)  # the rollout's policy
        agent, batch = first["agent"], first["batch"]
        with torch.no_grad():
            for step in (step for step in stream if step["iteration"] == iteration):
                mean, log_std = plain.gaussian_policy(agent, step["obs"])
                torch.testing.assert_close(step["action"].double(), mean + log_std.exp() * step["noise"].double())
            mean, log_std = plain.gaussian_policy(agent, batch["obs"])
            stored = torch.distributions.Normal(mean, log_std.exp()).log_prob(batch["actions"].double()).sum(-1)
        torch.testing.assert_close(batch["logprobs"].double(), stored, rtol=1e-5, atol=1e-5)


def rpo_loss(params: dict, mb: dict, mean_shift, clip_coef: float = 0.2, vf_coef: float = 0.5, ent_coef=ENT_COEF):
    """From the agent's parameters `params` (a state dict, or float64 leaves to differentiate): the clipped surrogate
    with the new log-probabilities under N(mean + mean_shift, std) against the stored (unperturbed) ones, plus
    CleanRL's clipped value loss weighted vf_coef, minus ent_coef times the entropy of the policy (its
    state-independent std: sum(log std + log(2 pi e) / 2)). The rollout's log-probabilities, values and returns are
    constants."""
    mean, log_std = plain.gaussian_policy(params, mb["obs"])
    perturbed = torch.distributions.Normal(mean + torch.as_tensor(mean_shift).double(), log_std.exp())
    ratio = (perturbed.log_prob(mb["actions"].double()).sum(-1) - mb["logprobs"].double()).exp()
    advantages = mb["advantages"].double()
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages)
    value, old_value, returns = plain.state_value(params, mb["obs"]), mb["values"].double(), mb["returns"].double()
    clipped_value = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
    value_loss = 0.5 * torch.maximum((value - returns) ** 2, (clipped_value - returns) ** 2).mean()
    entropy = (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum()
    return -surrogate.mean() + vf_coef * value_loss - ent_coef * entropy


def test_each_minibatch_steps_on_the_loss_of_its_actions_under_the_mean_shifted_by_its_own_uniform_draw(probed):
    assert len(probed.backward) == 2 * 2 * 2  # iterations x epochs x minibatches
    draws = []
    for entry in probed.backward:
        mb, shift, where = entry["mb"], entry["mean_shift"], f"iteration {entry['iteration']} epoch {entry['epoch']}"
        assert shift.shape == mb["actions"].shape == (32, 2), where
        assert shift.abs().max() <= ALPHA, where
        params = leaves(entry["agent"])
        expected = rpo_loss(params, mb, shift)
        with torch.no_grad():
            unperturbed = rpo_loss(entry["agent"], mb, 0.0)
        assert_gradients_match(entry["grads"]["agent"], gradients(expected, params), where)
        assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6), where
        assert abs(expected.item() - unperturbed.item()) > 1e-3, where  # the shift shows in the loss
        draws.append(shift)
    pooled = torch.cat(draws).reshape(-1)
    assert len(set(pooled.tolist())) == len(pooled), "every minibatch, sample and dimension draws afresh"
    # 512 draws of U(-0.5, 0.5): the mean within 5 standard errors of 0, both ends reached.
    assert abs(pooled.mean().item()) < 5 * ALPHA / math.sqrt(3 * len(pooled))
    assert pooled.min() < -0.9 * ALPHA and pooled.max() > 0.9 * ALPHA


# --- alpha 0 is ppo_continuous_action.py -----------------------------------------------------------------------------


def test_alpha_0_reproduces_ppo_continuous_action_exactly(tmp_path):
    flags = ["--env-id", "Pendulum-v1", *TINY, "--total-timesteps", "512", "--save-model", "--eval-episodes", "1"]
    run = {}
    for script, extra in (("ppo_continuous_action.py", []), (SCRIPT, ["--rpo-alpha", "0"])):
        (tmp_path / script).mkdir()
        result = run_script(script, *flags, *extra, cwd=tmp_path / script)
        assert result.returncode == 0, result.stderr
        (run[script],) = run_dirs(tmp_path / script)
    ppo_curves, rpo_curves = curves(run["ppo_continuous_action.py"]), curves(run[SCRIPT])
    assert_finite_keys(rpo_curves, [key for key in KEYS if key != "charts/SPS"] + ["eval/episodic_return"])
    assert rpo_curves == ppo_curves
    rpo_model = load(run[SCRIPT] / MODEL)
    ppo_model = load(run["ppo_continuous_action.py"] / "ppo_continuous_action.cleanrl_model")
    assert_same_tensors(rpo_model["agent"], ppo_model["agent"])
    assert rpo_model["args"]["rpo_alpha"] == 0.0


# --- smoke runs, checkpoints, resume ----------------------------------------------------------------------------------

HOPPER_FLAGS = ["--env-id", "Hopper-v5", *TINY, "--total-timesteps", "1024", "--checkpoint-every", "256"]
HOPPER_FLAGS += ["--save-model", "--eval-episodes", "1"]


def test_smoke_hopper_then_sigkill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    (tmp_path / "straight").mkdir()
    straight = run_script(SCRIPT, *HOPPER_FLAGS, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    (straight_dir,) = run_dirs(tmp_path / "straight")
    assert_finite_keys(read_scalars(straight_dir), KEYS + ["eval/episodic_return"])
    model = load(straight_dir / MODEL)
    assert (model["obs_dim"], model["act_dim"], model["args"]["rpo_alpha"]) == (11, 3, 0.5)

    (tmp_path / "killed").mkdir()
    run_dir = kill_at_first_checkpoint(SCRIPT, HOPPER_FLAGS, tmp_path / "killed")
    assert not (run_dir / MODEL).exists() and load(run_dir / "checkpoint.pt")["global_step"] < 1024
    resumed = run_script(SCRIPT, *HOPPER_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert "could not be saved" not in resumed.stdout  # the MuJoCo simulators were restored
    assert run_dirs(tmp_path / "killed") == [run_dir], "resume must continue the same run directory"
    # The update's uniform draws come from the restored random stream: every curve and the model continue exactly.
    assert curves(run_dir) == curves(straight_dir)
    for key in ("agent", "obs_rms", "return_rms"):
        assert_same_tensors(load(run_dir / MODEL)[key], model[key])


def test_smoke_dm_control_flattens_dict_observations_and_evaluates_the_saved_model(tmp_path):
    flags = ["--env-id", "dm_control/cartpole-balance-v0", *TINY, "--total-timesteps", "256", "--save-model"]
    result = run_script(SCRIPT, *flags, "--eval-episodes", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, LOSS_KEYS + ["eval/episodic_return"])  # no episode ends in 128 steps of 1000
    assert load(run_dir / MODEL)["obs_dim"] == 5  # position (3) + velocity (2)


# --- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--rpo-alpha", "-0.1"], ["--rpo-alpha must be a finite number >= 0", "-0.1"]),
        (["--rpo-alpha", "nan"], ["--rpo-alpha must be a finite number >= 0"]),
        (["--rpo-alpha", "inf"], ["--rpo-alpha must be a finite number >= 0"]),
        (["--env-id", "MountainCar-v0"], ["rpo_continuous_action.py handles Box", "Discrete", "cleanrl/ppo.py"]),
        (["--env-id", "HalfCheeta-v5"], ["unknown environment id", "HalfCheetah-v5"]),
    ],
)
def test_validate_rejects_bad_arguments_in_one_line(capsys, flags, fragments):
    import tyro

    with pytest.raises(SystemExit) as exit_info:
        rpo.validate(tyro.cli(rpo.Args, args=["--env-id", "Pendulum-v1", *flags]))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_negative_alpha_exits_2_before_any_work(tmp_path):
    result = run_script(SCRIPT, "--env-id", "Pendulum-v1", "--rpo-alpha", "-1", cwd=tmp_path)
    assert result.returncode == 2
    assert_bad_input(result, tmp_path, "--rpo-alpha must be a finite number >= 0")
