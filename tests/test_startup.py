"""Start-up: what a training run imports before its first step (benchmark/results/speed.md, "Start-up")."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT, script_env

# Each is imported only where it is used (--track, plotting, the tuner, the results tables), never by a training run:
# wandb alone costs ~2 s of start-up, matplotlib ~0.8 s, scipy ~0.8 s.
ONLY_WHEN_USED = ("wandb", "matplotlib", "optuna", "scipy", "pandas", "rliable")

PROBE = f"""
import gc, sys
sys.path.insert(0, {str(ROOT / "cleanrl")!r})
import ppo, ppo_continuous_action, dqn, td3_continuous_action, sac_continuous_action  # the scripts' module level
import cleanrl_utils.run as run
loaded = sorted(name for name in {ONLY_WHEN_USED!r} if name in sys.modules)
assert not loaded, f"imported by a training script before any work: {{loaded}}"

run.import_dynamo_with_gc_paused()
assert "torch._dynamo" in sys.modules
assert gc.isenabled(), "the garbage collector stayed paused after the torch._dynamo import"
gc.disable()
run.import_dynamo_with_gc_paused()
assert not gc.isenabled(), "a collector the caller had disabled was switched back on"
"""


def test_training_scripts_import_only_what_training_needs():
    """A fresh interpreter: the five scripts' module level and cleanrl_utils.run import none of the packages that only
    --track, plotting, tuning or the result tables need; the torch._dynamo import leaves the collector as it was."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
