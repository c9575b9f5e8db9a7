"""ppo_isaacgym.py's Isaac Gym path on CPython 3.8, the only Python that Isaac Gym Preview 4 runs on: a training run
that saves, reloads and evaluates its model (evaluated again by cleanrl_utils.evaluate), and SIGTERM + resume with
freshly reset environments, all against tests/isaacgym_double.py, the test double of isaacgymenvs.

The Python 3.8 environment is a fresh virtual environment (uv, from pyenv's CPython 3.8) holding what the README's
Isaac Gym recipe installs (tyro tensorboard wandb moviepy, numpy with them) and the torch that Isaac Gym users bring,
so a 3.8-incompatible construct on this path (`list[int]` in an evaluated annotation, `str.removeprefix`, argparse's
BooleanOptionalAction ...) or a call that old torch lacks fails here. Two more packages: gymnasium, which the double
imports (isaacgymenvs brings gym), and six, which torch <= 1.13's torch.utils.tensorboard imports without declaring it.

torch 1.12.1: the newest release whose PyPI wheel for Linux bundles CUDA and so imports on a CPU machine on its own
(one 776 MB wheel). From 1.13 on, the wheels load CUDA from nvidia-* packages and `import torch` fails without them
(measured, installed with --no-deps: 1.13.1, 2.0.1, 2.4.1). With them, 1.13.1 is 887 + 896 MB (cu11) and 2.4.1, the
last release for Python 3.8, 797 + 2,038 MB (cu12, triton). Older releases save little (1.8-1.11: 735-882 MB).
Measured here: this environment installs in 19 s with a cold uv cache and 6 s with a warm one (1.13.1 alone: 15 s
cold, 2.4.1 alone: 29 s); the two tests then take 10-15 s.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import isaacgym_double
import pytest
import torch
from conftest import ROOT, assert_finite_keys, read_scalars, run_dirs, script_env

TORCH = "torch==1.12.1"
PACKAGES = [TORCH, "six", "tyro", "tensorboard", "wandb", "moviepy", "numpy", "gymnasium"]
SCRIPT = ROOT / "cleanrl" / "ppo_isaacgym.py"
TINY = ["--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2", "--log-every", "1"]
FLAGS = ["--simulator", "isaacgym", "--env-id", "Cartpole", *TINY]
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


def python38() -> str:
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() or "/root/.pyenv"
    found = sorted(Path(root).glob("versions/3.8*/bin/python3.8"))
    if not found:
        pytest.fail(f"no CPython 3.8 under {root}/versions (pyenv install 3.8): Isaac Gym's Python is tested")
    return str(found[-1])


def uv(*command: str, cwd: Path) -> None:
    result = subprocess.run(["uv", *command], cwd=cwd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"uv {' '.join(command)} failed: {result.stderr.strip()[-2000:]}")


@pytest.fixture(scope="module")
def py38(tmp_path_factory) -> tuple[str, dict]:
    """(the Python 3.8 environment's interpreter, the environment for its runs: PYTHONPATH = the repository root,
    as in the README's `PYTHONPATH=. python cleanrl/ppo_isaacgym.py`, and the test double's stand-in packages)."""
    base = tmp_path_factory.mktemp("py38")
    venv = base / "venv"
    # Outside the repository, so that uv reads neither its pyproject.toml (Python >= 3.10) nor its lock.
    uv("venv", "--quiet", "--python", python38(), str(venv), cwd=base)
    python = str(venv / "bin" / "python")
    uv("pip", "install", "--quiet", "--python", python, *PACKAGES, cwd=base)
    isaacgym_double.write_shims(base / "shims")
    env = script_env(PYTHONPATH=f"{ROOT}:{base / 'shims'}:{ROOT / 'tests'}")
    versions = subprocess.run(
        [python, "-c", "import sys, torch; print('%d.%d' % sys.version_info[:2], torch.__version__)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert versions.stdout.split() == ["3.8", "1.12.1+cu102"], versions.stdout + versions.stderr
    return python, env


def run38(py38, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    python, env = py38
    return subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_trains_saves_and_evaluates_on_python38(py38, tmp_path):
    result = run38(
        py38, str(SCRIPT), *FLAGS, "--total-timesteps", "512", "--save-model", "--eval-episodes", "2", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0].startswith("simulator: Isaac Gym (isaacgymenvs), task Cartpole"), result.stdout
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, PPO_KEYS + ["eval/episodic_return"])
    assert len(scalars["losses/value_loss"]) == 4 and len(scalars["eval/episodic_return"]) == 2
    model = torch.load(run_dir / "ppo_isaacgym.cleanrl_model", map_location="cpu", weights_only=False)
    assert (model["obs_dim"], model["act_dim"], model["simulator"]) == (4, 1, "isaacgym")
    assert json.loads((run_dir / "finished.json").read_text())["global_step"] == 512
    # The saved model evaluates in a 3.8 process of its own too.
    evaluated = run38(py38, "-m", "cleanrl_utils.evaluate", str(run_dir), "--episodes", "3", "--no-cuda", cwd=ROOT)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert "ppo_isaacgym.py on Cartpole" in evaluated.stdout and "over 3 episodes" in evaluated.stdout, evaluated.stdout


def test_sigterm_then_resume_with_freshly_reset_environments_on_python38(py38, tmp_path):
    # A run that never ends by itself; SIGTERM once it has started (its first line is printed after the handler is
    # installed). The resumed run, with the same arguments, ends at --time-limit-seconds.
    flags = [*FLAGS, "--total-timesteps", "100000000", "--time-limit-seconds", "1"]
    python, env = py38
    proc = subprocess.Popen(
        [python, str(SCRIPT), *flags], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first_line = proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, first_line + out + err
    assert first_line.startswith("simulator: Isaac Gym"), first_line
    assert "SIGTERM: checkpoint written" in out, out
    (run_dir,) = run_dirs(tmp_path)
    # SIGTERM during an iteration checkpoints the state that iteration started from (here, likely the first one's)
    stopped_at = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)["global_step"]

    resumed = run38(py38, str(SCRIPT), *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Isaac Gym's state is not in the checkpoint: resuming with freshly reset environments" in resumed.stdout
    assert "--time-limit-seconds 1 reached" in resumed.stdout, resumed.stdout
    assert run_dirs(tmp_path) == [run_dir]
    final_step = json.loads((run_dir / "finished.json").read_text())["global_step"]
    steps = [step for step, _ in read_scalars(run_dir)["losses/value_loss"]]
    assert final_step > stopped_at and steps == sorted(set(steps)) and steps[-1] == final_step, steps
