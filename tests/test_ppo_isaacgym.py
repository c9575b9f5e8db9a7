"""ppo_isaacgym.py: its own loop on MuJoCo Warp under tests/probe.py (no host reads in the rollout or the update,
storage and statistics against the stream, GAE with truncations, every minibatch's loss and gradient); the five MuJoCo
Warp tasks against gymnasium's v5 tasks (Ant and Hopper over 100 steps, the others over 10; the step and the first
observation after an automatic reset), smoke runs on both simulators (Isaac Gym through the test double in
tests/isaacgym_double.py), bad input, evaluation, and SIGTERM + resume reproducing the uninterrupted run.

MuJoCo Warp compiles its kernels on first use (cached in ~/.cache/warp): a cold cache adds a minute or two to the
first test that steps a task."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import continuous_reference as plain
import gymnasium as gym
import isaacgym_double
import mujoco
import numpy as np
import ppo_isaacgym as pig
import pytest
import torch
from conftest import (
    ROOT,
    assert_bad_input,
    assert_finite_keys,
    kill_at_first_checkpoint,
    read_scalars,
    run_dirs,
    run_script,
    script_env,
)
from test_ppo_continuous import reference_ppo_loss
from update_reference import assert_gradients_match, gradients, leaves

SCRIPT = "ppo_isaacgym.py"
MODEL = "ppo_isaacgym.cleanrl_model"
TINY = ["--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--log-every", "1"]
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
PPO_KEYS = ["charts/episodic_return", "charts/episodic_length", *LOSS_KEYS]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# --- the loop's own wiring, on MuJoCo Warp ---------------------------------------------------------------
# The script runs unchanged under tests/probe.py, resumed from the uninterrupted Hopper run's last checkpoint (step
# 512) for 2 more iterations, with every world's step count set to 996 so that those that stay up are truncated by
# the 1000-step limit 4 steps in (others terminate by falling): both ends in 32 steps of 8 tiny worlds, and a small
# entropy bonus (--ent-coef 1e-3; the default is 0) so that its term is checked too. The tests rebuild what the loop
# stored and computed (every minibatch's loss and gradient included) from the copies with plain references
# (tests/continuous_reference.py), and check from the host reads it made (tests/probe_host_reads.py) that its rollout
# and update stay on the device.
PROBE_WATCH = ["next_obs", "obs_rms", "iteration", "action", "raw_obs", "reward", "terminated", "truncated", "info"]
PROBE_RESULTS = ("action", "raw_obs", "reward", "terminated", "truncated", "info")
PROBE_AT_BACKWARD = ["mb", "agent", "batch", "obs", "actions", "rewards", "terminations", "truncations", "final_obs"]
PROBE_AT_BACKWARD += ["iteration", "epoch"]
ROLLOUT_FUNCTIONS = {"update_minibatch", "compute_gae", "step", "_simulate", "_position", "_observe", "_healthy"}
ROLLOUT_FUNCTIONS |= {"_reset_worlds", "_observe_after_reset", "sample_action", "log_prob", "get_value", "normalize"}
ROLLOUT_FUNCTIONS |= {"update"}  # RunningMeanStd.update
PROBE_ENT_COEF = 1e-3


#
# The CPU simulators (envpool, gymnasium) run the same loop under the same checks, with a 20-step time limit
# (tests/probe_short_episodes.py) in place of the step count set near 1000: envpool resumed from its own straight run's
# checkpoint at step 512 (its environments start fresh episodes there), gymnasium as a fresh run of 768 steps whose
# last 32 are checked.
CPU_SIMULATORS = ("envpool", "gymnasium")
SHORT_EPISODES = "20"


@pytest.fixture(scope="module", params=["mujoco-warp", *CPU_SIMULATORS])
def probed(request):
    return request.getfixturevalue({"mujoco-warp": "warp_probed"}.get(request.param, f"{request.param}_probed"))


@pytest.fixture(scope="module")
def warp_probed(hopper_run, tmp_path_factory):
    return probe_resumed(hopper_run[0], tmp_path_factory.mktemp("probe"))


@pytest.fixture(scope="module")
def envpool_probed(cpu_runs, tmp_path_factory):
    return probe_resumed(cpu_runs["envpool"][0], tmp_path_factory.mktemp("probe-envpool"), "envpool")


@pytest.fixture(scope="module")
def gymnasium_probed(tmp_path_factory):
    return probe_run(["--simulator", "gymnasium", *HOPPER_FLAGS[:-4]], tmp_path_factory.mktemp("probe-gymnasium"))


def probe_resumed(straight_dir: Path, cwd: Path, simulator: str = "mujoco-warp"):
    """The probed run (see above) in `cwd`, resumed from a copy of `straight_dir`'s last checkpoint; its trace, its
    host reads (line, function, method) and the checkpoint it resumed from."""
    run_dir = cwd / "runs" / straight_dir.name
    shutil.copytree(straight_dir, run_dir)
    checkpoint = load(run_dir / "checkpoint.pt")
    assert checkpoint["global_step"] == 512 and checkpoint["iteration"] == 4
    checkpoint["args"].update(total_timesteps=768, num_iterations=6, ent_coef=PROBE_ENT_COEF)
    if simulator == "mujoco-warp":
        checkpoint["envs"]["elapsed"].fill_(996)  # 4 steps from gymnasium's time limit
    torch.save(checkpoint, run_dir / "checkpoint.pt")
    flags = [*HOPPER_FLAGS[:-4], "--resume", str(run_dir / "checkpoint.pt")]
    flags += [] if simulator == "mujoco-warp" else ["--simulator", simulator]
    trace, host_reads = probe_run(flags, cwd)
    return trace, host_reads, checkpoint


def probe_run(flags: list[str], cwd: Path):
    """The script under the probe for 768 steps (see above): its trace and its host reads (line, function, method)."""
    from probe import probe_script

    flags = [*flags, "--total-timesteps", "768", "--ent-coef", str(PROBE_ENT_COEF)]
    host_reads = cwd / "host_reads.txt"
    trace = probe_script(
        SCRIPT,
        flags,
        cwd,
        watch=PROBE_WATCH,
        at_backward=PROBE_AT_BACKWARD,
        grads=["agent"],
        final=[*PROBE_RESULTS, "next_obs", "obs_rms"],
        preload=["probe_host_reads", "probe_short_episodes"],
        env=script_env(PROBE_HOST_READS=str(host_reads), PROBE_MAX_EPISODE_STEPS=SHORT_EPISODES),
        timeout=600,
    )
    reads = host_reads.read_text().split("\n") if host_reads.exists() else []
    return trace, [line.split() for line in reads if line]


def test_the_rollout_and_the_update_stay_on_the_device(probed):
    trace, host_reads = probed[:2]
    stream = plain.rollout_stream(trace, 16, PROBE_RESULTS, start_step=512)
    assert len(stream) == 32
    for step in stream:  # the simulator's outputs are tensors where the agent's parameters are, never arrays
        values = [step[name] for name in PROBE_RESULTS[:-1]] + list(step["info"].values())
        assert all(isinstance(value, torch.Tensor) and value.device.type == "cpu" for value in values)
    source = (ROOT / "cleanrl" / SCRIPT).read_text().splitlines()
    collect = next(i for i, line in enumerate(source, 1) if "# 1. Collect a rollout" in line)
    log = next(i for i, line in enumerate(source, 1) if "# 4. Log" in line)
    in_loop = [read for read in host_reads if read[1] in ROLLOUT_FUNCTIONS or collect <= int(read[0]) < log]
    assert not in_loop, f"host reads in the rollout or the update (line, function, method): {in_loop}"
    assert any(read[2] == "tolist" for read in host_reads)  # the recorder works: the logging's read is seen


def test_storage_and_normalisation_follow_the_stream_and_the_final_observation_stays_out_of_the_statistics(probed):
    trace = probed[0]
    stream = plain.rollout_stream(trace, 16, PROBE_RESULTS, start_step=512)
    for k, step in enumerate(stream):
        stats = plain.rms_state(stream[k + 1]["obs_rms"] if k + 1 < len(stream) else trace.final["obs_rms"])
        before = plain.rms_state(step["obs_rms"])
        expected = plain.merge_statistics(before, step["raw_obs"].double().numpy())  # the new observations only
        np.testing.assert_allclose(stats["mean"], expected["mean"], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(stats["var"], expected["var"], rtol=1e-9, atol=1e-12)
        assert stats["count"] == pytest.approx(expected["count"])
        following = stream[k + 1]["obs"] if k + 1 < len(stream) else trace.final["next_obs"]
        np.testing.assert_allclose(
            following.numpy(), plain.normalise(step["raw_obs"], stats, 10.0), rtol=1e-5, atol=1e-5
        )
    ends = {"terminated": 0, "truncated": 0}
    for iteration in (5, 6):
        first = next(entry for entry in trace.backward if entry["iteration"] == iteration)
        z = []
        for step in (step for step in stream if step["iteration"] == iteration):
            s = step["step"]
            k = (iteration - 5) * 16 + s
            assert torch.equal(first["obs"][s], step["obs"]) and torch.equal(first["actions"][s], step["action"])
            assert torch.equal(first["rewards"][s], step["reward"])  # --reward-scaler 1
            assert torch.equal(first["terminations"][s], step["terminated"].float())
            assert torch.equal(first["truncations"][s], step["truncated"].float())
            stats = plain.rms_state(stream[k + 1]["obs_rms"] if k + 1 < len(stream) else trace.final["obs_rms"])
            final = plain.normalise(step["info"]["final_obs"], stats, 10.0)
            np.testing.assert_allclose(first["final_obs"][s].numpy(), final, rtol=1e-5, atol=1e-5)
            with torch.no_grad():  # a sample of the rollout's policy
                mean, log_std = plain.gaussian_policy(first["agent"], step["obs"])
            z.append((step["action"].double() - mean) / log_std.exp())
            ends["terminated"] += int(step["terminated"].sum())
            ends["truncated"] += int((step["truncated"] & ~step["terminated"]).sum())
        z = torch.cat(z)
        assert z.std().item() == pytest.approx(1.0, abs=0.12) and abs(z.mean().item()) < 0.15
    assert ends["terminated"] >= 3 and ends["truncated"] >= 3, ends


def test_gae_bootstraps_truncations_from_the_final_observation_and_each_minibatch_steps_on_its_loss(probed):
    trace = probed[0]
    for iteration in (5, 6):
        updates = [entry for entry in trace.backward if entry["iteration"] == iteration]
        first, where = updates[0], f"iteration {iteration}"
        agent, batch = first["agent"], first["batch"]
        with torch.no_grad():
            values = plain.state_value(agent, first["obs"])
            # After the rollout's last step: the next rollout's first observation, or where the run ended.
            following = [entry for entry in trace.backward if entry["iteration"] == iteration + 1]
            last_obs = following[0]["obs"][0] if following else trace.final["next_obs"]
            next_obs = torch.cat([first["obs"][1:], last_obs[None]])
            next_values = plain.state_value(agent, next_obs)
            final_values = plain.state_value(agent, first["final_obs"])
        terminations, truncations = first["terminations"].double(), first["truncations"].double()
        next_values = torch.where(truncations > 0, final_values, next_values)  # where the time limit cut
        advantages = reference_gae(
            *(x.tolist() for x in (first["rewards"].double(), values, next_values, terminations, truncations)),
            0.99,
            0.95,
        )
        advantages = torch.tensor(advantages, dtype=torch.float64)
        torch.testing.assert_close(batch["advantages"].double(), advantages.reshape(-1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(batch["returns"].double(), (advantages + values).reshape(-1), rtol=1e-4, atol=1e-4)
        row_of = {tuple(o.tolist()): i for i, o in enumerate(batch["obs"])}
        for entry in updates:
            mb = entry["mb"]
            rows = [row_of[tuple(o.tolist())] for o in mb["obs"]]
            assert all(torch.equal(mb[field], batch[field][rows]) for field in ("actions", "advantages", "returns")), (
                where
            )
            normalised = (mb["advantages"] - mb["advantages"].mean()) / (mb["advantages"].std() + 1e-8)
            params = leaves(entry["agent"])
            expected = reference_ppo_loss(
                params, mb | {"advantages": normalised}, 0.2, 2.0, PROBE_ENT_COEF, clip_vloss=False
            )
            assert_gradients_match(entry["grads"]["agent"], gradients(expected, params), where)
            assert entry["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6), where


# --- MuJoCo Warp against gymnasium ----------------------------------------------------------------

# Largest |warp - gymnasium| allowed per step, as atol + rtol * |gymnasium|. Hopper matches to
# float32 precision (measured: ~1e-6 relative). Ant goes through an iterative contact solver with an
# elliptic friction cone in float32: velocities after a contact-rich step and the contact forces
# differ more (measured: ~5e-3 relative on the observation, ~1e-4 on the reward).
# HalfCheetah, Walker2d and Humanoid are checked over 10 steps only (test time); measured there:
# ~6e-5 absolute on the observation (HalfCheetah, Walker2d), ~7e-3 on Humanoid's contact forces.
TOLERANCES = {
    "Hopper": dict(obs=(1e-4, 1e-4), reward=(1e-4, 1e-4)),
    "Ant": dict(obs=(2e-2, 1e-2), reward=(5e-3, 1e-3)),
    "HalfCheetah": dict(obs=(1e-3, 1e-4), reward=(1e-4, 1e-4)),
    "Walker2d": dict(obs=(1e-3, 1e-4), reward=(1e-4, 1e-4)),
    "Humanoid": dict(obs=(1e-2, 1e-3), reward=(1e-3, 1e-3)),
}
STEPS = {"Hopper": 100, "Ant": 100, "HalfCheetah": 10, "Walker2d": 10, "Humanoid": 10}


def make_gym(task: str) -> gym.Env:
    env = gym.make(f"{task}-v5")
    if task == "Ant":  # the same friction cone as the MuJoCo Warp task (see ppo_isaacgym.py)
        env.unwrapped.model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    if task == "Humanoid":  # the same solver (MuJoCo Warp has no PGS)
        env.unwrapped.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return env


def set_world(env: pig.MuJoCoWarpVecEnv, world: int, gym_env: gym.Env) -> None:
    """Put world `world` in the state of gymnasium's env: qpos, qvel, the solver's warm start, time,
    the TimeLimit's step count, and the position the forward reward is measured from (gymnasium
    reads it from the simulator before the step: the torso's xpos for Ant, the centre of mass of
    the bodies' xipos for Humanoid, qpos[0] for the others)."""
    model, data = gym_env.unwrapped.model, gym_env.unwrapped.data
    as_tensor = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    env.qpos[world] = as_tensor(data.qpos)
    env.qvel[world] = as_tensor(data.qvel)
    env.qacc_warmstart[world] = as_tensor(data.qacc_warmstart)
    env.time[world] = float(data.time)
    env.elapsed[world] = gym_env._elapsed_steps
    if env.env_id == "Ant":
        env.position_before[world] = as_tensor(data.xpos[1, :2])
    elif env.env_id == "Humanoid":
        env.position_before[world] = as_tensor(
            (model.body_mass[:, None] * data.xipos).sum(0)[:2] / model.body_mass.sum()
        )
    else:
        env.position_before[world] = as_tensor(data.qpos[:1])


def gymnasium_reset_observation(gym_env: gym.Env, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
    """gymnasium's first observation of an episode that starts at (qpos, qvel): what its reset does
    (mj_resetData, which zeroes the controls and contact forces, then set_state, which runs mj_forward),
    with the reset noise replaced by the given state."""
    base = gym_env.unwrapped
    mujoco.mj_resetData(base.model, base.data)
    base.set_state(qpos, qvel)
    return base._get_obs()


def relative_excess(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> float:
    """max(|got - want| / (atol + rtol * |want|)): at most 1 within tolerance."""
    return float(np.max(np.abs(got - want) / (atol + rtol * np.abs(want))))


@pytest.mark.parametrize("task", ["Hopper", "Ant", "HalfCheetah", "Walker2d", "Humanoid"])
def test_mujoco_warp_task_matches_gymnasium_v5_step_for_step(task):
    """World 0 is set to the state of gymnasium's CPU env before every step and given the same
    action: next observation, reward, termination and truncation must agree within TOLERANCES.
    Where world 0's episode ends, the observation MuJoCo Warp returns after its automatic reset
    must be the one gymnasium's reset gives from the same initial state (zero controls and
    contact forces, fresh kinematics), and gymnasium continues from that state.
    World 1 runs free from the same start beside a second gymnasium env: the drift is printed,
    and bounded only loosely (contact dynamics are chaotic; float32 against float64)."""
    tol = TOLERANCES[task]
    env = pig.MuJoCoWarpVecEnv(task, 2, torch.device("cpu"), seed=0)
    synced, free = make_gym(task), make_gym(task)
    rng = np.random.default_rng(0)
    synced.reset(seed=0)
    free.reset(seed=1)
    set_world(env, 1, free)
    worst, largest = {"obs": 0.0, "reward": 0.0, "reset_obs": 0.0}, {"obs": 0.0, "reward": 0.0}
    ends, drift, free_running, truncations = {"terminated": 0, "truncated": 0}, [], True, 0
    steps = STEPS[task]
    for step in range(steps):
        if step == steps // 2:
            synced._elapsed_steps = 999  # this step reaches gymnasium's TimeLimit (1000 steps)
        set_world(env, 0, synced)
        action = rng.uniform(synced.action_space.low, synced.action_space.high)
        obs, reward, terminated, truncated, _ = synced.step(action)
        # The free-running pair gets gentler actions, so that its episode tends to last the 100 steps.
        free_obs, _, free_terminated, free_truncated, _ = free.step(0.3 * action)
        w_next_obs, w_reward, w_terminated, w_truncated, info = env.step(
            torch.as_tensor(np.stack([action, 0.3 * action]), dtype=torch.float32)
        )
        w_obs = info["final_obs"].double().numpy()  # before the autoreset, as gymnasium returns it
        assert w_obs.shape[1] == obs.shape[0]
        worst["obs"] = max(worst["obs"], relative_excess(w_obs[0], obs, *tol["obs"]))
        largest["obs"] = max(largest["obs"], float(np.max(np.abs(w_obs[0] - obs))))
        largest["reward"] = max(largest["reward"], abs(float(w_reward[0]) - reward))
        worst["reward"] = max(
            worst["reward"], relative_excess(w_reward[0].double().numpy(), np.float64(reward), *tol["reward"])
        )
        assert bool(w_terminated[0]) == terminated and bool(w_truncated[0]) == truncated, f"step {step}"
        truncations += truncated
        if terminated or truncated:
            ends["terminated" if terminated else "truncated"] += 1
            synced.reset(seed=100 + step)  # the TimeLimit restarts; the state becomes world 0's reset state
            reset_obs = gymnasium_reset_observation(synced, env.qpos[0].double().numpy(), env.qvel[0].double().numpy())
            w_reset_obs = w_next_obs[0].double().numpy()
            worst["reset_obs"] = max(worst["reset_obs"], relative_excess(w_reset_obs, reset_obs, *tol["obs"]))
        if free_running:
            drift.append(float(np.max(np.abs(w_obs[1] - free_obs))))
            free_running = not (free_terminated or free_truncated or w_terminated[1] or w_truncated[1])
    print(
        f"\n{task}: worst error / tolerance: obs {worst['obs']:.3g}, reward {worst['reward']:.3g}, "
        f"first obs after a reset {worst['reset_obs']:.3g}; largest "
        f"|difference|: obs {largest['obs']:.2e}, reward {largest['reward']:.2e} "
        f"(tolerances {tol}); episode ends in the synced trajectory {ends}; free-run drift "
        f"(max |obs difference|) after 1, 10, {len(drift)} steps: {drift[0]:.2e}, "
        f"{drift[min(9, len(drift) - 1)]:.2e}, {drift[-1]:.2e}"
    )
    assert worst["obs"] <= 1.0 and worst["reward"] <= 1.0 and worst["reset_obs"] <= 1.0, worst
    assert truncations == 1  # the TimeLimit case was exercised
    if task == "Hopper":
        assert ends["terminated"] >= 1  # so was a termination (random actions topple the hopper)
    # One free step from the same state is as close as a synced step; later ones may drift apart.
    assert drift[0] <= tol["obs"][0] + tol["obs"][1] * 10


def test_mujoco_warp_autoreset_statistics_and_reset_noise():
    env = pig.MuJoCoWarpVecEnv("Hopper", 4, torch.device("cpu"), seed=3)
    obs = env.reset()
    assert obs.shape == (4, 11) and obs.dtype == torch.float32
    init = env.init_qpos
    assert (env.qpos - init).abs().max() <= 5e-3 and (env.qpos - init).abs().max() > 0  # U(-5e-3, 5e-3)
    # Push world 2 over so that it terminates: its episode statistics come back, then reset.
    returns = torch.zeros(4)
    for step in range(3):
        if step == 2:
            env.qpos[2, 1] = 0.3  # z below the healthy range
        obs, reward, terminated, truncated, info = env.step(torch.full((4, 3), 0.25))
        returns += reward
    assert terminated.tolist() == [False, False, True, False] and not truncated.any()
    assert info["done"].tolist() == [False, False, True, False]
    assert info["episode_length"][2] == 3 and info["episode_return"][2] == pytest.approx(returns[2].item(), rel=1e-5)
    assert info["final_obs"][2, 0] < 0.7  # the final (unhealthy) z, not the reset one (~1.25)
    assert env.elapsed.tolist() == [3, 3, 0, 3] and env.episode_length[2] == 0 and env.episode_return[2] == 0
    assert abs(env.qpos[2, 1] - init[1]) <= 5e-3  # world 2 was reset, its controls zeroed as gymnasium's reset does ...
    assert env.ctrl[2].abs().max() == 0 and (env.ctrl[[0, 1, 3]] == 0.25).all()
    assert torch.equal(obs[2], torch.cat([env.qpos[2, 1:], env.qvel[2].clamp(-10, 10)]))
    assert torch.equal(obs[[0, 1, 3]], info["final_obs"][[0, 1, 3]])  # ... and only world 2


# --- the math: GAE and running statistics against plain references -------------------------------


def reference_gae(rewards, values, next_values, terminations, truncations, gamma, lam):
    """Plain per-environment Python loop over time, written from the definition."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    advantages = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        running = 0.0
        for t in reversed(range(num_steps)):
            delta = rewards[t][env] + (0.0 if terminations[t][env] else gamma * next_values[t][env]) - values[t][env]
            running = delta if (terminations[t][env] or truncations[t][env]) else delta + gamma * lam * running
            advantages[t][env] = running
    return advantages


def test_gae_matches_python_loop_with_terminations_and_truncations():
    rng = np.random.default_rng(0)
    rewards, values, next_values = (rng.normal(size=(9, 3)) for _ in range(3))
    terminations, truncations = np.zeros((9, 3)), np.zeros((9, 3))
    terminations[3, 0] = truncations[5, 1] = terminations[-1, 2] = truncations[-1, 0] = 1
    truncations[1, 2] = terminations[1, 2] = 1  # both at once counts as a termination
    expected = reference_gae(
        *(a.tolist() for a in (rewards, values, next_values, terminations, truncations)), 0.99, 0.95
    )
    t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    got = pig.compute_gae(t(rewards), t(values), t(next_values), t(terminations), t(truncations), 0.99, 0.95)
    np.testing.assert_allclose(got.numpy(), np.array(expected), rtol=1e-5, atol=1e-6)


def test_running_mean_std_matches_numpy_and_keeps_its_count_on_the_device():
    rng = np.random.default_rng(1)
    batches = [rng.normal(3.0 * i, 1.0 + i, size=(n, 4)) for i, n in enumerate([1, 7, 300, 64])]
    rms = pig.RunningMeanStd(4, epsilon=0.0)
    for batch in batches:
        rms.update(torch.tensor(batch, dtype=torch.float32))
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(rms.var.numpy(), data.var(0), rtol=1e-5)
    assert isinstance(rms.count, torch.Tensor) and rms.count.item() == len(data)
    restored = pig.RunningMeanStd(4)
    restored.load_state_dict(rms.state_dict())
    x = torch.tensor([[0.0, 1e6, -1e6, 3.0]])
    assert torch.equal(restored.normalize(x, 5.0), rms.normalize(x, 5.0)) and rms.normalize(x, 5.0).abs().max() == 5.0


# --- smoke runs -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def isaacgym_path(tmp_path_factory) -> str:
    """PYTHONPATH on which `import isaacgym, isaacgymenvs` finds the test double."""
    root = tmp_path_factory.mktemp("isaacgym_double")
    isaacgym_double.write_shims(root)
    return f"{root}:{ROOT / 'tests'}"


def test_smoke_isaacgym_path_through_the_test_double(workdir, isaacgym_path):
    # Episodes of the double last at most 20 steps: terminations and time-outs both happen.
    result = run_script(
        SCRIPT,
        "--env-id",
        "Cartpole",
        *TINY,
        "--total-timesteps",
        "512",
        "--save-model",
        "--eval-episodes",
        "2",
        cwd=workdir,
        env=script_env(PYTHONPATH=isaacgym_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("simulator: Isaac Gym"), result.stdout  # auto picked it
    (run_dir,) = run_dirs(workdir)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 4 and len(scalars["eval/episodic_return"]) == 2
    assert all(0 < length <= 20 for _, length in scalars["charts/episodic_length"])
    model = load(run_dir / MODEL)
    assert (model["obs_dim"], model["act_dim"], model["simulator"]) == (4, 1, "isaacgym")
    # The model evaluates in a process of its own, through evaluate()'s common signature.
    evaluated = subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.evaluate", str(run_dir), "--episodes", "3", "--seed", "4"],
        cwd=ROOT,
        env=script_env(PYTHONPATH=f"{isaacgym_path}:{ROOT}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "over 3 episodes" in evaluated.stdout, evaluated.stdout


def test_evaluate_refuses_capture_video_in_one_line(tmp_path, capsys):
    from cleanrl_utils.checkpoint import save_model

    path = tmp_path / MODEL
    save_model(path, pig.Args(env_id="Hopper"), pig.__file__, simulator="mujoco-warp")
    with pytest.raises(SystemExit) as exit_info:
        pig.evaluate(path, 1, torch.device("cpu"), capture_video=True, video_dir=tmp_path)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot record videos" in lines[0], lines


def test_isaacgym_adapter_splits_reset_buffer_into_terminations_and_truncations(isaacgym_path, monkeypatch):
    for path in reversed(isaacgym_path.split(":")):
        monkeypatch.syspath_prepend(path)
    env = pig.IsaacGymVecEnv("Cartpole", 3, torch.device("cpu"), seed=0)
    assert (env.obs_dim, env.act_dim) == (4, 1) and env.reset().shape == (3, 4)
    env.envs.state[1, 0] = 5.0  # out of bounds: world 1 terminates at the next step
    seen_truncation = False
    for step in range(19):
        obs, reward, terminated, truncated, info = env.step(torch.full((3, 1), 2.0))  # clamped to 1
        if step == 0:
            assert terminated.tolist() == [False, True, False] and info["episode_length"][1] == 1
        assert not (terminated & truncated).any()
        assert torch.equal(info["done"], terminated | truncated) and torch.equal(info["final_obs"], obs)
        seen_truncation |= bool(truncated.any())
    assert seen_truncation and int(info["episode_length"].max()) == 19


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (
            ["--env-id", "Anymal", "--simulator", "mujoco-warp"],
            ["unknown task 'Anymal'", "an Isaac Gym task", "Ant, Humanoid, Hopper, HalfCheetah, Walker2d"],
        ),
        (["--simulator", "isaacgym"], ["--simulator isaacgym needs Isaac Gym", "Preview 4", "isaacgymenvs"]),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "2"], ["does not divide the batch of 15"]),
        (["--num-envs", "0"], ["--num-envs must be positive"]),
        (["--num-steps", "-1"], ["--num-steps must be positive"]),
        (["--total-timesteps", "100"], ["less than one batch"]),
        (["--capture-video"], ["not supported"]),
        (
            ["--simulator", "envpool", "--env-id", "Anymal"],
            ["unknown task 'Anymal' for envpool", "known tasks: Ant, Humanoid, Hopper"],
        ),
        (["--simulator", "gymnasium", "--env-id", "Ant-v5"], ["unknown task 'Ant-v5' for gymnasium", "--env-id Ant)"]),
        (["--simulator", "envpool", "--njmax", "8"], ["size MuJoCo Warp's buffers; envpool sizes its own"]),
        (["--simulator", "envpool", "--envpool-threads", "-1"], ["--envpool-threads must be 0"]),
    ],
)
def test_validate_rejects_bad_arguments_in_one_line(capsys, flags, fragments):
    import tyro

    args = tyro.cli(pig.Args, args=flags)
    with pytest.raises(SystemExit) as exit_info:
        pig.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_missing_envpool_is_named_in_one_line(capsys, monkeypatch):
    import importlib.util

    import tyro

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:
        pig.validate(tyro.cli(pig.Args, args=["--simulator", "envpool"]))
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert "--simulator envpool needs the envpool package" in lines[0] and "uv sync --extra envpool" in lines[0]


def test_bad_input_exits_before_any_work(workdir):
    assert_bad_input(
        run_script(SCRIPT, "--env-id", "Pendulum", cwd=workdir), workdir, "unknown task 'Pendulum'", "known tasks: Ant"
    )
    assert_bad_input(
        run_script(SCRIPT, "--simulator", "isaacgym", cwd=workdir), workdir, "pip install NVIDIA's Isaac Gym"
    )
    assert_bad_input(
        run_script(SCRIPT, "--simulator", "envpool", "--env-id", "Pendulum", cwd=workdir),
        workdir,
        "unknown task 'Pendulum' for envpool",
    )


# --- SIGTERM, checkpoints and resume ----------------------------------------------------------------

# No --save-model here: evaluating an untrained Hopper takes ~140 MuJoCo Warp steps, which on this
# CPU costs more than the training; evaluation is exercised by the Isaac Gym smoke run. The last
# checkpoint (written at the last step) holds the final weights and statistics.
HOPPER_FLAGS = ["--env-id", "Hopper", *TINY, "--total-timesteps", "512", "--checkpoint-every", "128"]


@pytest.fixture(scope="module")
def hopper_run(tmp_path_factory) -> tuple[Path, str]:
    """One uninterrupted Hopper run, shared by the smoke and the resume tests."""
    cwd = tmp_path_factory.mktemp("hopper")
    result = run_script(SCRIPT, *HOPPER_FLAGS, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    return run_dir, result.stdout


def test_smoke_mujoco_warp_is_the_default_and_writes_finite_scalars(hopper_run):
    run_dir, stdout = hopper_run
    assert stdout.splitlines()[0].startswith("simulator: MuJoCo Warp, task Hopper"), stdout  # no Isaac Gym here
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS)
    assert len(scalars["losses/value_loss"]) == 4
    checkpoint = load(run_dir / "checkpoint.pt")
    assert checkpoint["global_step"] == 512
    assert checkpoint["obs_rms"]["count"].item() == pytest.approx(8 + 512 + 1e-4)  # the reset, then every step
    assert set(checkpoint["envs"]) >= {"qpos", "qvel", "time", "generator", "elapsed", "episode_return"}


def test_sigterm_then_resume_reproduces_the_uninterrupted_run(hopper_run, tmp_path):
    straight_dir, _ = hopper_run
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cleanrl" / SCRIPT), *HOPPER_FLAGS],
        cwd=tmp_path,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("runs/*/checkpoint.pt")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: checkpoint written" in out, out
    (run_dir,) = run_dirs(tmp_path)
    assert load(run_dir / "checkpoint.pt")["global_step"] < 512

    resumed = run_script(SCRIPT, *HOPPER_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert run_dirs(tmp_path) == [run_dir]
    final, straight = load(run_dir / "checkpoint.pt"), load(straight_dir / "checkpoint.pt")
    assert final["global_step"] == straight["global_step"] == 512
    for key in ("agent", "obs_rms", "optimizer", "envs", "next_obs"):
        assert_same(final[key], straight[key], key)
    # --log-every 1: every iteration updates, then logs, so every curve but the wall-clock SPS continues exactly.
    scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_dir)
    assert scalars.keys() == straight_scalars.keys() and len(scalars["charts/episodic_return"]) >= 2
    for key in sorted(set(straight_scalars) - {"charts/SPS", "perf/peak_memory_gb"}):
        assert scalars[key] == straight_scalars[key], key


def assert_same(a, b, where: str) -> None:
    """Exact equality of nested dicts / lists of tensors and numbers."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


# --- the headline on a CPU, as a newcomer meets it ---------------------------------------------------------------
# Iterations of 64 worlds x 64 steps: seconds each here (minutes at the default 4096 x 16), so that a signal lands in
# the middle of one; one epoch of updates, so that the rollout is nearly all of it.
SLOW_FLAGS = ["--env-id", "Hopper", "--num-envs", "64", "--num-steps", "64", "--num-minibatches", "2"]
SLOW_FLAGS += ["--update-epochs", "1", "--total-timesteps", "8192", "--checkpoint-every", "4096"]


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory) -> tuple[Path, float]:
    """The uninterrupted run of two slow iterations, and how long one iteration took."""
    cwd = tmp_path_factory.mktemp("slow")
    result = run_script(SCRIPT, *SLOW_FLAGS, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    sps = read_scalars(run_dir)["charts/SPS"][-1][1]
    return run_dir, 4096 / sps


def test_on_a_cpu_the_run_names_its_device_stays_quiet_and_answers_sigterm_midway_then_resumes_exactly(
    slow_run, tmp_path
):
    straight_dir, iteration_seconds = slow_run
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "cleanrl" / SCRIPT), *SLOW_FLAGS],
        cwd=tmp_path,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = [proc.stdout.readline() for _ in range(3)]  # the simulator, the device, the first progress line
    assert lines[0].startswith("simulator: MuJoCo Warp, task Hopper, 64 environments"), lines
    assert lines[1].startswith("device: CPU (no CUDA GPU found). ") and "--num-envs 64" in lines[1], lines
    assert lines[2].startswith("Hopper ppo_isaacgym | 64/8,192 steps"), lines  # after the first step, not the first log
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("runs/*/checkpoint.pt")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the checkpoint at the end of iteration 1
    time.sleep(iteration_seconds / 4)  # into iteration 2's rollout
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    answered = time.monotonic() - signalled
    assert proc.returncode == 0, err
    # Answered in the rollout, where it arrived, not once the rollout was over: the script says where, and the
    # checkpoint below holds iteration 1, not 2. The wall time only rules out a hang: writing the checkpoint and
    # exiting took 4 s of a 6.5 s iteration on a loaded CI machine, so it is no measure of where it was answered.
    assert "SIGTERM during iteration 2's rollout, at step " in out, out
    assert answered < 60, (answered, iteration_seconds)
    assert "SIGTERM: checkpoint written" in out, out
    printed = "".join(lines + [out, err]).splitlines()
    chatter = [line for line in printed if line.startswith(("Warp ", "Module ")) or "Warp CUDA warning" in line]
    assert not chatter, chatter  # Warp's banner, its kernel-module lines, its missing-driver warning
    (run_dir,) = run_dirs(tmp_path)
    stopped = load(run_dir / "checkpoint.pt")
    assert stopped["global_step"] == 4096 and stopped["iteration"] == 1  # iteration 2 dropped, to be done again

    resumed = run_script(SCRIPT, *SLOW_FLAGS, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    final, straight = load(run_dir / "checkpoint.pt"), load(straight_dir / "checkpoint.pt")
    assert final["global_step"] == straight["global_step"] == 8192
    for key in ("agent", "obs_rms", "optimizer", "envs", "next_obs", "rng"):
        assert_same(final[key], straight[key], key)


# --- the CPU simulators: envpool and gymnasium ----------------------------------------------------------------
# The straight runs of HOPPER_FLAGS on each (saving and evaluating the model), a run SIGKILLed at its first checkpoint
# and resumed: gymnasium's state is saved, so the resumed run is the uninterrupted one exactly; envpool's is not, so it
# says so and starts fresh episodes, while the networks, the optimiser, the statistics and the counters continue.
CPU_FLAGS = [*HOPPER_FLAGS, "--save-model", "--eval-episodes", "2"]


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory) -> dict:
    runs = {}
    for simulator in CPU_SIMULATORS:
        cwd = tmp_path_factory.mktemp(simulator)
        result = run_script(SCRIPT, "--simulator", simulator, *CPU_FLAGS, cwd=cwd)
        assert result.returncode == 0, result.stderr
        (run_dir,) = run_dirs(cwd)
        runs[simulator] = (run_dir, result.stdout)
    return runs


@pytest.mark.parametrize("simulator", CPU_SIMULATORS)
def test_smoke_cpu_simulators_train_save_and_evaluate(cpu_runs, simulator):
    run_dir, stdout = cpu_runs[simulator]
    name = {"envpool": "envpool (C++ MuJoCo)", "gymnasium": "gymnasium (SyncVectorEnv)"}[simulator]
    assert stdout.splitlines()[0] == f"simulator: {name}, task Hopper, 8 environments", stdout
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, [*PPO_KEYS, "eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 4 and len(scalars["eval/episodic_return"]) == 2
    checkpoint = load(run_dir / "checkpoint.pt")
    assert checkpoint["global_step"] == 512 and (checkpoint["envs"] is None) == (simulator == "envpool")
    assert load(run_dir / MODEL)["simulator"] == simulator


def test_gymnasium_sigkill_then_resume_reproduces_the_uninterrupted_run(cpu_runs, tmp_path):
    straight_dir = cpu_runs["gymnasium"][0]
    flags = ["--simulator", "gymnasium", *CPU_FLAGS]
    run_dir = kill_at_first_checkpoint(SCRIPT, flags, tmp_path)
    assert load(run_dir / "checkpoint.pt")["global_step"] < 512
    resumed = run_script(SCRIPT, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "not in the checkpoint" not in resumed.stdout and run_dirs(tmp_path) == [run_dir]
    final, straight = load(run_dir / "checkpoint.pt"), load(straight_dir / "checkpoint.pt")
    for key in ("agent", "obs_rms", "optimizer", "next_obs", "global_step", "iteration"):
        assert_same(final[key], straight[key], key)
    # The simulators' states and the episode statistics (the wrappers' pickle is not byte-identical once restored).
    for key in ("episode_return", "episode_length"):
        assert_same(final["envs"][key], straight["envs"][key], key)
    assert_same(final["envs"]["envs"]["simulators"], straight["envs"]["envs"]["simulators"], "simulators")
    scalars, straight_scalars = read_scalars(run_dir), read_scalars(straight_dir)
    for key in sorted(set(straight_scalars) - {"charts/SPS", "perf/peak_memory_gb"}):
        assert scalars[key] == straight_scalars[key], key


def test_envpool_sigkill_then_resume_says_so_and_continues_all_but_the_episodes(tmp_path):
    flags = ["--simulator", "envpool", *CPU_FLAGS]
    run_dir = kill_at_first_checkpoint(SCRIPT, flags, tmp_path)
    killed = load(run_dir / "checkpoint.pt")
    assert killed["envs"] is None and killed["global_step"] < 512
    resumed = run_script(SCRIPT, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    line = "envpool's state is not in the checkpoint: resuming with freshly reset environments"
    assert resumed.stdout.count(line) == 1, resumed.stdout
    assert run_dirs(tmp_path) == [run_dir]
    final = load(run_dir / "checkpoint.pt")
    remaining = 512 - killed["global_step"]
    assert final["global_step"] == 512 and final["iteration"] == 4
    # The optimiser continues (4 minibatch steps per iteration) and so do the statistics (the fresh episodes' first
    # observations, then every step's).
    steps = [state["step"].item() for state in final["optimizer"]["state"].values()]
    killed_steps = [state["step"].item() for state in killed["optimizer"]["state"].values()]
    assert steps == [k + remaining // 128 * 4 for k in killed_steps]
    assert final["obs_rms"]["count"].item() == pytest.approx(killed["obs_rms"]["count"].item() + 8 + remaining)


def test_a_resumed_envpool_run_acts_with_the_saved_networks_and_statistics(envpool_probed):
    trace, _, checkpoint = envpool_probed
    assert "envpool's state is not in the checkpoint: resuming with freshly reset environments" in trace.stdout
    first_update = trace.backward[0]
    assert first_update["iteration"] == 5
    assert_same(first_update["agent"], checkpoint["agent"], "agent")  # no update yet: the saved networks
    first_step = next(entry for entry in trace.steps if entry["step"] > 512)
    # The statistics the first action was normalised with: the saved ones, merged with the fresh reset observations.
    assert first_step["obs_rms"]["count"].item() == pytest.approx(checkpoint["obs_rms"]["count"].item() + 8)
