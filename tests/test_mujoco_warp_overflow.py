"""MuJoCo Warp's contact and constraint buffers (cleanrl_utils/envs/mujoco_warp_env.py): the peak counts the env keeps
on the device are the simulator's counters at every MuJoCo step, and those counters are what MuJoCo (C) counts for the
same states; ppo_isaacgym.py stops in one line naming the flag to raise when a buffer overflows (Ant with
--nconmax 1 or --njmax 2, 4 worlds, 2 iterations of 8 steps), and a run with the defaults logs the buffers' use.

MuJoCo Warp compiles its kernels on first use (cached in ~/.cache/warp): a cold cache adds a minute or two."""

from __future__ import annotations

import os

import gymnasium
import mujoco
import numpy as np
import pytest
import torch
from conftest import read_scalars, run_dirs, run_script

from cleanrl_utils.envs.mujoco_warp_env import MuJoCoWarpVecEnv

SCRIPT = "ppo_isaacgym.py"
TINY_ANT = ["--env-id", "Ant", "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "1", "--update-epochs", "1"]
TINY_ANT += ["--log-every", "1", "--total-timesteps", "64"]
# What this machine's Warp prints on stderr when it finds the CUDA toolkit but no driver, whatever the script does.
NO_DRIVER = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"
CPU = torch.device("cpu")


class CountersAfterEachStep:
    """Stands in for the mujoco_warp module in an env (on the CPU, where step() runs _simulate's Python): records the
    state before every MuJoCo step, and after it the simulator's counters, as the env's kernel sees them, and each
    world's contacts."""

    STATE = ("qpos", "qvel", "ctrl", "qacc_warmstart")

    def __init__(self, mjw):
        self.mjw, self.steps = mjw, []

    def __getattr__(self, name):
        return getattr(self.mjw, name)

    def step(self, model, data) -> None:
        before = {name: getattr(data, name).numpy().astype(np.float64) for name in self.STATE}
        self.mjw.step(model, data)
        nacon = int(data.nacon.numpy()[0])
        per_world = np.bincount(data.contact.worldid.numpy()[: min(nacon, data.naconmax)], minlength=data.nworld)
        self.steps.append((before, nacon, int(data.ncollision.numpy()[0]), data.nefc.numpy().copy(), per_world))


def ant_model() -> mujoco.MjModel:
    """gymnasium's Ant as the env builds it for MuJoCo Warp (elliptic friction cone)."""
    assets = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")
    mjm = mujoco.MjModel.from_xml_path(os.path.join(assets, "ant.xml"))
    mjm.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    return mjm


def mujoco_counts(mjm: mujoco.MjModel, mjd: mujoco.MjData, state: dict) -> tuple[range, range]:
    """The contacts and constraint rows MuJoCo (C) counts in one step (mj_step) from `state`: with Ant's RK4, those of
    its last stage, as MuJoCo Warp's counters. Returned as the ranges MuJoCo Warp's counts must fall in: a contact at
    its margin or a joint limit at its bound (where the solver holds a joint) can go either way between float32 and
    float64 dynamics, so those make only the upper end."""
    for name, value in state.items():
        getattr(mjd, name)[:] = value
    mujoco.mj_step(mjm, mjd)
    near = 1e-3
    contacts = mjd.contact[: mjd.ncon]
    unsure_contacts = np.abs(contacts.dist - contacts.includemargin) < near
    limits = mjd.efc_type[: mjd.nefc] == mujoco.mjtConstraint.mjCNSTR_LIMIT_JOINT
    unsure_rows = contacts.dim[unsure_contacts].sum() + (limits & (np.abs(mjd.efc_pos[: mjd.nefc]) < near)).sum()
    return range(mjd.ncon - unsure_contacts.sum(), mjd.ncon + 1), range(mjd.nefc - unsure_rows, mjd.nefc + 1)


def random_steps(env: MuJoCoWarpVecEnv, generator: torch.Generator, count: int) -> None:
    for _ in range(count):
        env.step(2 * torch.rand((env.num_envs, env.act_dim), generator=generator) - 1)


def test_peaks_are_the_largest_counters_of_every_mujoco_step_and_match_mujoco_c():
    env = MuJoCoWarpVecEnv("Ant", 4, CPU, seed=3)
    env.mjw = counters = CountersAfterEachStep(env.mjw)
    generator = torch.Generator().manual_seed(0)
    mjm = ant_model()
    mjd = mujoco.MjData(mjm)
    contacts_seen = exact = 0
    for interval in range(3):
        counters.steps.clear()
        random_steps(env, generator, 6)
        assert len(counters.steps) == 6 * env.task.frame_skip
        _, nacon, ncollision, nefc, _ = zip(*counters.steps)
        want = [max(nacon), max(ncollision), int(np.max(nefc))]
        assert env.peaks.tolist() == want, interval
        use = env.check_buffers()
        assert use == {
            "charts/contact_buffer_use": max(want[:2]) / (32 * 4),
            "charts/constraint_buffer_use": want[2] / 128,
        }
        assert env.peaks.tolist() == [0, 0, 0]  # each check starts a new interval
        # The counters are what MuJoCo (C) counts in the same step from the same state, world by world.
        for step, (before, total, _, rows, per_world) in enumerate(counters.steps):
            assert total == per_world.sum()
            for world in range(env.num_envs):
                contacts, constraint_rows = mujoco_counts(mjm, mjd, {k: v[world] for k, v in before.items()})
                assert per_world[world] in contacts and rows[world] in constraint_rows, (interval, step, world)
                exact += len(contacts) == len(constraint_rows) == 1
            contacts_seen += total
    assert contacts_seen > 0 and exact > 250, exact  # the legs touched the ground; of 360 counts, most were sure


def test_check_buffers_names_the_flag_and_the_true_need_after_an_overflow(capsys):
    env = MuJoCoWarpVecEnv("Ant", 4, CPU, seed=3, nconmax=1)
    env.mjw = counters = CountersAfterEachStep(env.mjw)
    random_steps(env, torch.Generator().manual_seed(0), 10)
    _, nacon, ncollision, _, _ = zip(*counters.steps)
    needed = max(max(nacon), max(ncollision))
    assert needed > 4  # the 4 pooled slots overflowed
    with pytest.raises(SystemExit) as exit_info:
        env.check_buffers()
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"the 4 worlds needed {needed} at once; 4 allocated, 1 per world" in line, line
    assert line.endswith(f"raise --nconmax (now 1; this peak needs {-(-needed // 4)})"), line
    assert "--njmax" not in line


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(NO_DRIVER)]


@pytest.mark.parametrize(
    "flags, fragments",
    [
        (["--nconmax", "1"], ["ran out of contact slots (the 4 worlds needed", "raise --nconmax (now 1; this peak"]),
        (["--njmax", "2"], ["ran out of constraint rows (a world needed", "raise --njmax (now 2; this peak needs"]),
    ],
)
def test_overflowing_run_stops_in_one_line_naming_the_flag(tmp_path, flags, fragments):
    result = run_script(SCRIPT, *TINY_ANT, *flags, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = stderr_lines(result)
    assert line.startswith("error: MuJoCo Warp ran out of"), line
    for fragment in fragments:
        assert fragment in line, line
    assert "please increase" not in result.stdout  # the simulator's own line per world and step is off


def test_run_with_the_default_buffers_logs_their_use(tmp_path):
    result = run_script(SCRIPT, *TINY_ANT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert stderr_lines(result) == []
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for key in ("charts/contact_buffer_use", "charts/constraint_buffer_use"):
        values = [value for _, value in scalars[key]]
        assert len(values) == 2 and all(0 <= value <= 1 for value in values), (key, values)
    assert max(value for _, value in scalars["charts/constraint_buffer_use"]) > 0  # Ant's joint limits, at least


@pytest.mark.parametrize("flag", ["--nconmax", "--njmax"])
def test_buffer_flags_must_be_positive(capsys, flag):
    import ppo_isaacgym as pig
    import tyro

    args = tyro.cli(pig.Args, args=["--simulator", "mujoco-warp", flag, "0"])
    with pytest.raises(SystemExit) as exit_info:
        pig.validate(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {flag} must be positive, got 0"
