"""--compile and --cudagraphs of dqn.py, td3_continuous_action.py and sac_continuous_action.py.

A --compile run draws the same random numbers as the default run (minibatch indices, epsilon-greedy draws and the
policies' noise stay outside the compiled functions), so it follows the same trajectory and only the float rounding of
inductor's fused kernels differs. After 5 updates the logged losses of a compiled run must equal the eager run's to
a relative 1e-4, and each saved parameter tensor to 1e-4 of its norm (+ 1e-4). Longer runs drift further apart: where a
gradient element is rounding noise, Adam still steps it by +-lr, so after 200 TD3 updates parameters differ by up to
4e-3 on fixed minibatches (a chaos of rounding, not an error: eager foreach vs fused Adam alone differ by 6e-8).
torch.compile on the CPU takes tens of seconds a script (inductor's C++ kernels), so each script is compiled once.
--cudagraphs needs CUDA; on a CPU it is refused in one line before any work.
"""

from __future__ import annotations

import math

import dqn
import pytest
import sac_continuous_action
import td3_continuous_action
import torch
import tyro
from conftest import assert_bad_input, read_scalars, run_dirs, run_script

OFF_POLICY_TINY = ["--buffer-size", "500", "--batch-size", "16", "--save-model", "--eval-episodes", "1"]
# Per script: its flags and the loss keys it logs. 200 steps, the last ones with 5 updates (dqn: one every 10 steps).
SCRIPTS = {
    "dqn.py": (
        ["--env-id", "CartPole-v1", "--learning-starts", "150"],
        ["losses/td_loss", "losses/q_values"],
    ),
    "td3_continuous_action.py": (
        ["--env-id", "Pendulum-v1", "--learning-starts", "195"],
        ["losses/qf1_loss", "losses/qf2_loss", "losses/qf1_values", "losses/actor_loss"],
    ),
    "sac_continuous_action.py": (
        ["--env-id", "Pendulum-v1", "--learning-starts", "195"],
        ["losses/qf1_loss", "losses/qf2_loss", "losses/qf1_values", "losses/actor_loss", "losses/alpha_loss"],
    ),
}
RTOL = ATOL = 1e-4


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL)


@pytest.mark.parametrize("script", SCRIPTS)
def test_compiled_run_equals_the_eager_run(tmp_path, script):
    flags, loss_keys = SCRIPTS[script]
    runs = {}
    for mode in ("eager", "compiled"):
        cwd = tmp_path / mode
        cwd.mkdir()
        extra = ["--compile"] if mode == "compiled" else []
        result = run_script(script, *flags, *OFF_POLICY_TINY, "--total-timesteps", "200", *extra, cwd=cwd, timeout=600)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        (run_dir,) = run_dirs(cwd)
        model = torch.load(next(run_dir.glob("*.cleanrl_model")), weights_only=False)
        runs[mode] = read_scalars(run_dir), model
    (eager_scalars, eager_model), (compiled_scalars, compiled_model) = runs["eager"], runs["compiled"]
    for key in loss_keys:
        eager, compiled = eager_scalars[key], compiled_scalars[key]
        assert [step for step, _ in eager] == [step for step, _ in compiled], key
        assert eager, f"{key}: nothing logged to compare"
        bad = [(step, a, b) for (step, a), (_, b) in zip(eager, compiled) if not close(a, b)]
        assert not bad, f"{key}: eager vs compiled differ beyond rtol {RTOL}: {bad[:3]}"
    networks = [key for key, value in eager_model.items() if isinstance(value, dict) and "args" != key]
    assert networks, sorted(eager_model)
    for network in networks:
        for name, eager in eager_model[network].items():
            # Per tensor, relative to its norm: one update fewer or more moves a 256x256 layer by ~lr * 256 = 0.08 in
            # norm (5e-3 relative), 50x this tolerance; a single element whose gradient is rounding noise may differ
            # by 2 lr, which an element-wise test would flag although nothing is wrong.
            difference = (compiled_model[network][name] - eager).norm().item()
            assert difference <= RTOL * eager.norm().item() + ATOL, f"{network}.{name}: {difference} apart"


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --cudagraphs is allowed")
REFUSAL = "error: --cudagraphs needs a CUDA GPU and none is in use; drop it (--compile works on the CPU)"


@needs_no_cuda
@pytest.mark.parametrize("module", [dqn, td3_continuous_action, sac_continuous_action], ids=lambda m: m.__name__)
def test_cudagraphs_is_refused_on_the_cpu_in_one_line(module, capsys):
    # In-process for each script (validate() is the first thing a script runs); end to end for dqn.py below.
    args = tyro.cli(module.Args, args=["--cudagraphs"])
    with pytest.raises(SystemExit) as exit_info:
        module.validate(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [REFUSAL]


@needs_no_cuda
def test_cudagraphs_exits_2_before_any_work(tmp_path):
    result = run_script("dqn.py", *SCRIPTS["dqn.py"][0], "--cudagraphs", cwd=tmp_path)
    assert result.returncode == 2
    assert_bad_input(result, tmp_path, "--cudagraphs needs a CUDA GPU", "--compile works on the CPU")
