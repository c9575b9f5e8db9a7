"""benchmark/mjlab_gpu.sh (ppo_isaacgym and fast_td3_isaacgym beside mjlab's own rsl_rl training on mjlab's robots, for
a GPU) in its tiny CPU mode: each trainer runs, and benchmark/mjlab_gpu_table.py tables the three runs from their
TensorBoard events. mjlab lives in projects/mjlab, so this runs there (.ci/run's mjlab step):

    uv run --project projects/mjlab pytest -q -p no:cacheprovider tests/test_mjlab_gpu.py
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mjlab") is None, reason="mjlab is in projects/mjlab")
def test_tiny_mode_runs_the_three_trainers_and_tables_them(tmp_path):
    for name in ("cleanrl", "cleanrl_utils"):  # a copy of the repository: the runs land in its runs/
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "benchmark").mkdir()
    for name in ("mjlab_gpu.sh", "mjlab_gpu_table.py"):
        shutil.copy(ROOT / "benchmark" / name, tmp_path / "benchmark" / name)
    results = tmp_path / "results"
    env = {**os.environ, "TINY": "1", "PYTHON": sys.executable, "RESULTS": str(results), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        ["bash", "benchmark/mjlab_gpu.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (results / "mjlab_gpu.md").read_text()
    assert "### Mjlab-Cartpole-Balance, 16 worlds" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.count("|") == 7}
    assert rows["ppo_isaacgym"][1] == "768" and rows["fast_td3_isaacgym"][1] == "768", table
    assert rows["rsl_rl (mjlab.scripts.train)"][1] == "1,024", table  # 2 iterations of 16 envs x 32 steps
    assert float(rows["fast_td3_isaacgym"][4]) > 0 and float(rows["rsl_rl (mjlab.scripts.train)"][4]) > 0, table
    runs = sorted(p.name.split("__")[1] for p in (tmp_path / "runs").iterdir())
    assert runs == ["fast_td3_mjlab_gpu", "ppo_isaacgym_mjlab_gpu", "rsl_rl_mjlab_gpu"], runs
    assert not list(tmp_path.glob("mjlab_gpu_rsl_rl.*"))  # rsl_rl's own log folder, removed after the copy
