"""ppg_procgen.py: the auxiliary phase (value distillation under the clone-KL term), the networks' shapes, a smoke run
on StarpilotEasy-v0 with a tiny auxiliary phase, SIGKILL + resume, bad input."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_bad_input, assert_finite_keys, kill_at_first_checkpoint, read_scalars, run_dirs, run_script

pytest.importorskip("envpool")
import ppg_procgen  # noqa: E402

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
    # ... while the clone term holds the policy: with it the policy moves little, without it far more.
    assert cloned["kl"] < 0.02
    assert free["kl"] > 10 * cloned["kl"]


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


def test_starpilot_smoke_runs_both_phases_and_evaluates_saved_model(workdir):
    flags = [*TINY, "--total-timesteps", "128", "--save-model", "--eval-episodes", "1"]
    result = run_script("ppg_procgen.py", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + AUX_KEYS + ["eval/episodic_return", "charts/SPS"])
    assert [step for step, _ in scalars["losses/aux/kl_loss"]] == [64, 128]
    model = torch.load(run_dir / "ppg_procgen.cleanrl_model", weights_only=False)
    assert model["script"] == "ppg_procgen" and {"policy", "value_net", "reward_scaler"} <= set(model)


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
