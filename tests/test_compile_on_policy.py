"""--compile and --cudagraphs in the on-policy scripts (ppo, ppo_continuous_action, ppo_isaacgym, ppo_atari).

The compiled minibatch update (torch.compile of the very function the eager loop calls, with the optimizer --compile
builds) gives the eager update's losses and parameters after a few updates, and annealing the learning rate in between
recompiles nothing; the compiled policy step and GAE give the eager results; --cudagraphs is refused in one line where
there is no CUDA. Compiling on the CPU is slow (inductor writes and builds C++): each case compiles one small update.
"""

from __future__ import annotations

import copy

import ppo
import ppo_atari
import ppo_continuous_action
import ppo_isaacgym
import pytest
import torch
import tyro
from conftest import assert_bad_input, run_script
from torch._dynamo.utils import counters

CPU = torch.device("cpu")
MINIBATCH = 64
# The compiled update is not bitwise the eager one: inductor fuses the loss and the backward pass and sums in another
# order, and --compile's Adam (single-tensor, its learning rate a float32 tensor) is not the eager run's fused Adam.
# Measured over these 4 updates: statistics within 2.4e-6 absolute (3e-5 relative, on approx_kl, the smallest),
# parameters within 3e-7 absolute; the tolerances leave a margin of 4x or more. A wrong term is off by far more.
LOSS_TOLERANCE = dict(rtol=1e-4, atol=1e-5)
PARAMETER_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def make_case(name: str):
    """The script, a freshly initialised agent and four minibatches of made-up rollout data."""
    torch.manual_seed(0)
    n = MINIBATCH
    if name == "ppo":
        module, agent = ppo, ppo.Agent(4, 2)
        obs = torch.randn(4, n, 4)
        actions = torch.randint(0, 2, (4, n))
        with torch.no_grad():
            logprobs = torch.stack([agent.log_prob_and_entropy(o, a)[0] for o, a in zip(obs, actions)])
    elif name == "ppo_atari":
        module, agent = ppo_atari, ppo_atari.Agent((4, 10, 10), 3, 1.0)  # MinAtar's grids and its small network
        obs = torch.randint(0, 2, (4, n, 4, 10, 10), dtype=torch.uint8)
        actions = torch.randint(0, 3, (4, n))
        with torch.no_grad():
            logprobs = torch.stack([agent.evaluate_actions(o, a)[0] for o, a in zip(obs, actions)])
    else:
        module = ppo_continuous_action if name == "ppo_continuous_action" else ppo_isaacgym
        agent = module.Agent(11, 3)  # Hopper's sizes
        obs = torch.randn(4, n, 11)
        with torch.no_grad():
            actions = torch.stack([agent.actor_mean(o) + torch.randn(n, 3) for o in obs])
            logprobs = torch.stack([agent.log_prob(o, a) for o, a in zip(obs, actions)])
    logprobs = logprobs + 0.3 * torch.randn(4, n)  # the policy has moved since the rollout: ratios beyond the clip
    advantages, returns, values = torch.randn(3, 4, n)
    batches = [module.Batch(*fields) for fields in zip(obs, actions, logprobs, advantages, returns, values)]
    return module, agent, batches


SCRIPTS = ["ppo", "ppo_continuous_action", "ppo_isaacgym", "ppo_atari"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_compiled_update_matches_eager_and_annealing_does_not_recompile(name):
    torch._dynamo.reset()
    counters.clear()
    module, eager_agent, batches = make_case(name)
    compiled_agent = copy.deepcopy(eager_agent)
    initial = [p.detach().clone() for p in eager_agent.parameters()]
    eager_args, compiled_args = module.Args(), module.Args(compile=True)
    eager_optimizer = module.make_optimizer(eager_agent, eager_args, CPU)
    compiled_optimizer = module.make_optimizer(compiled_agent, compiled_args, CPU)
    assert isinstance(compiled_optimizer.param_groups[0]["lr"], torch.Tensor)
    update = torch.compile(module.update_minibatch)

    graphs_before_annealing = None
    for i, mb in enumerate(batches):
        if i == 2:  # anneal as the script does: a new float for eager Adam, written into the tensor for compiled Adam
            graphs_before_annealing = counters["stats"]["unique_graphs"]
            eager_optimizer.param_groups[0]["lr"] = 0.5 * eager_args.learning_rate
            compiled_optimizer.param_groups[0]["lr"].fill_(0.5 * eager_args.learning_rate)
        expected = module.update_minibatch(eager_agent, eager_optimizer, mb, eager_args)
        got = update(compiled_agent, compiled_optimizer, mb, compiled_args)
        assert got.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], **LOSS_TOLERANCE, msg=f"{name} update {i}: {key}")

    for (param_name, eager), compiled in zip(eager_agent.named_parameters(), compiled_agent.parameters()):
        torch.testing.assert_close(compiled, eager, **PARAMETER_TOLERANCE, msg=f"{name}: parameter {param_name}")
    moved = max((p.detach() - p0).abs().max().item() for p, p0 in zip(eager_agent.parameters(), initial))
    assert moved > 1e-4, "the updates left the parameters where they were: the comparison would prove nothing"
    clipped = expected["clipped"] if "clipped" in expected else expected["clipfrac"]
    assert clipped > 0, "no ratio left the clip range: the clipped branch of the loss went untested"
    # Compiled for real (no silent fallback to eager), and the learning-rate change reused the compiled graphs.
    assert graphs_before_annealing >= 2
    assert counters["stats"]["unique_graphs"] == graphs_before_annealing, "annealing the learning rate recompiled"


def test_compiled_policy_step_and_gae_match_eager():
    """ppo_continuous_action's policy step is deterministic given its noise, so the compiled one is comparable; the
    GAE is ppo.py's (the same function in ppo_atari.py and ppo_isaacgym.py)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    agent = ppo_continuous_action.Agent(11, 3)
    obs, noise = torch.randn(2, 4, 11), torch.randn(2, 4, 3)
    policy = torch.compile(agent.sample_action)
    with torch.no_grad():
        for o, z in zip(obs, noise):
            torch.testing.assert_close(policy(o, z), agent.sample_action(o, z), rtol=1e-5, atol=1e-6)

    steps, envs = 6, 3
    rewards, values, next_values = torch.randn(3, steps, envs)
    terminations = (torch.rand(steps, envs) < 0.2).float()
    truncations = (torch.rand(steps, envs) < 0.2).float() * (1 - terminations)
    inputs = (rewards, values, next_values, terminations, truncations, 0.99, 0.95)
    gae = torch.compile(ppo.compute_gae)  # ppo_continuous_action's GAE stays eager (its rollouts are 2048 steps)
    torch.testing.assert_close(gae(*inputs), ppo.compute_gae(*inputs), rtol=1e-5, atol=1e-6)


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="--cudagraphs is refused only without CUDA")


@needs_no_cuda
@pytest.mark.parametrize("module", [ppo, ppo_continuous_action, ppo_isaacgym, ppo_atari], ids=lambda m: m.__name__)
def test_cudagraphs_without_cuda_is_refused_in_one_line(module, capsys):
    # In-process for each script (validate() is the first thing a script runs); end to end for ppo.py below.
    args = tyro.cli(module.Args, args=["--cudagraphs"])
    with pytest.raises(SystemExit) as exit_info:
        module.validate(args)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: --cudagraphs needs a CUDA GPU and none is in use; drop it (--compile works on the CPU)"]


@needs_no_cuda
def test_cudagraphs_without_cuda_exits_2_before_any_work(workdir):
    result = run_script("ppo.py", "--cudagraphs", cwd=workdir)
    assert result.returncode == 2
    assert_bad_input(result, workdir, "--cudagraphs needs a CUDA GPU")
