"""--amp (bf16 autocast) in ppo_atari, ppo_atari_envpool, dqn_atari, ppo_procgen and ppg_procgen.

Each script runs a few updates twice from the same seed under tests/probe.py, without and with --amp, the second run
written to a checkpoint and a saved model. The checks, per script:

- with --amp the forward passes of the rollout and of every update run in bf16, and without it none does. The witness
  is bf16's grid: a layer run in bf16 returns values with 8 significant bits, which the script's `.float()` turns
  into float32 values that bf16 represents exactly; a float32 layer's outputs almost never all are. So the values
  the rollout stored and the heads' outputs each update trained on lie on the grid with --amp and off it without;
- nothing is stored in reduced precision: every floating tensor of the checkpoint, the saved model, the rollout
  storage and the buffers is float32 (frames uint8), and what the scripts compute in float32 from the bf16 heads
  (log-softmax, GAE's advantages and returns) carries float32 precision (off bf16's grid);
- with --amp, the run trains within bf16's rounding of float32: every update's head outputs are those of the same
  networks run in float32 on the same minibatch up to TOLERANCE, and the two runs, acting alike, compute losses
  within LOSS_BOUND of their size of each other.

bf16 runs on the CPU (emulated where the CPU lacks bf16 instructions, so slower than float32 there: the procgen cases
take seconds); --amp's speed on a GPU is benchmark/gpu/run_all.sh's item amp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_dirs

# bf16 keeps 8 significant bits: rounding to it moves a number by up to 2^-9 (0.2%) of itself. A bf16 layer rounds its
# inputs, its weights and its output, so a head's output is off by a few 2^-9 of the size of the terms it sums (the
# features times the weights, of order 1), more than of its own size where they cancel. Measured over these updates:
# values up to 3.7e-3 from float32 (ppo_atari's; 2.7e-3 ppo_atari_envpool, 2.2e-3 ppo_procgen, 4e-4 ppg_procgen),
# Q-values 1.0e-3, log-probabilities 7e-4, entropies 8e-6; atol 0.01 leaves a margin of 2.7 and more.
TOLERANCE = dict(rtol=0.01, atol=0.01)
# Between the two runs: their updates see the same frames and actions, but the values and log-probabilities their
# rollouts stored differ by bf16's rounding, and each update's small differences carry into the weights the next one
# starts from. Advantages normalised by their standard deviation, small while rewards are rare (procgen's first
# rollouts), magnify the values' differences (4e-4 in ppg_procgen) to 0.12 in the normalised advantages. Measured:
# the losses differ by up to 8% of the run's largest loss (ppg_procgen), 0.7% or less elsewhere; a bound of 25% is a
# sanity check that the runs train alike (the updates' precision is checked against TOLERANCE above). Weights are not
# compared: Adam moves every parameter by about its learning rate whatever the size of its gradient, so a parameter
# whose gradient is near zero goes either way with bf16's rounding (ppo_procgen's changes to the weights differ by
# 90% of their length after 4 updates while its losses agree to 0.5%).
LOSS_BOUND = 0.25

MINATAR = ["--env-id", "MinAtar/Breakout-v1"]
PROCGEN = ["--num-envs", "2", "--num-minibatches", "2"]


def on_bf16_grid(x: torch.Tensor | np.ndarray) -> bool:
    """True if every element of float32 `x` is exactly a bf16 number (what a bf16 layer's output cast back is)."""
    x = torch.as_tensor(x)
    assert x.dtype == torch.float32 and x.numel() >= 8, (x.dtype, x.shape)
    return torch.equal(x.bfloat16().float(), x)


def ppo_heads(entry: dict) -> dict:
    return {"log-prob": entry["newlogprob"], "entropy": entry["entropy"], "value": entry["newvalue"]}


def ppo_recompute(module, model: dict, entry: dict) -> dict:
    """The agent at this update, in float32, on the update's minibatch (ppo_atari passes it as `mb`; the others index
    the flattened rollout with `mb_inds`)."""
    sizes = [model[key] for key in ("obs_shape", "n_actions", "obs_high") if key in model]
    agent = module.Agent(*sizes)
    agent.load_state_dict(entry["agent"])
    if "mb" in entry:
        obs, actions = entry["mb"]["obs"], entry["mb"]["actions"]
    else:
        obs, actions = entry["b_obs"][entry["mb_inds"]], entry["b_actions"][entry["mb_inds"]]
    with torch.no_grad():
        log_prob, entropy, value = agent.evaluate_actions(obs, actions)
    return {"log-prob": log_prob, "entropy": entropy, "value": value}


def dqn_heads(entry: dict) -> dict:
    return {"Q-value": entry["q_values"], "target max": entry["target_max"]}


def dqn_recompute(module, model: dict, entry: dict) -> dict:
    networks = {}
    for name in ("q_network", "target_network"):
        networks[name] = module.QNetwork(model["obs_shape"], model["n_actions"], model["obs_high"])
        networks[name].load_state_dict(entry[name])
    with torch.no_grad():
        q_values = networks["q_network"](entry["obs_b"]).gather(1, entry["actions_b"].unsqueeze(1)).squeeze(1)
        return {"Q-value": q_values, "target max": networks["target_network"](entry["next_obs_b"]).amax(dim=1)}


def ppg_heads(entry: dict) -> dict:
    if entry["where"] == "auxiliary_phase":
        return {"log-probs": entry["log_probs"], "aux value": entry["aux_values"], "value": entry["values"]}
    return {"log-prob": entry["newlogprob"], "entropy": entry["entropy"], "value": entry["newvalue"]}


def ppg_recompute(module, model: dict, entry: dict) -> dict:
    policy = module.PolicyNetwork(model["obs_shape"], model["n_actions"])
    value_net = module.ValueNetwork(model["obs_shape"])
    policy.load_state_dict(entry["policy"])
    value_net.load_state_dict(entry["value_net"])
    with torch.no_grad():
        if entry["where"] == "auxiliary_phase":
            log_probs, aux_values = policy.log_probs_and_aux_value(entry["mb_obs"])
            return {"log-probs": log_probs, "aux value": aux_values, "value": value_net(entry["mb_obs"])}
        obs, actions = entry["b_obs"][entry["mb_inds"]], entry["b_actions"][entry["mb_inds"]]
        log_prob, entropy = policy.evaluate_actions(obs, actions)
        return {"log-prob": log_prob, "entropy": entropy, "value": value_net(obs)}


@dataclass
class Case:
    """One script's tiny run and what to read from it: at every backward (`at_backward`) the networks, the minibatch
    and the heads' outputs the loss was computed from (`heads`: those outputs by name; `recompute`: the same from the
    copied networks and minibatch, run in float32), at the end its rollout storage and buffers (`storage`)."""

    script: str
    flags: list[str]
    steps: int  # --total-timesteps, and --checkpoint-every: one checkpoint, at the end
    at_backward: list[str]
    storage: list[str]
    heads: Callable[[dict], dict]
    recompute: Callable[[object, dict, dict], dict]
    from_heads: list[str] = field(default_factory=list)  # storage fields written straight from a bf16 head
    float32_fields: list[str] = field(default_factory=list)  # storage fields computed in float32 from the heads
    float32_names: list[str] = field(default_factory=list)  # names at backward computed in float32 from the heads


PPO_NAMES = ["agent", "newlogprob", "entropy", "newvalue", "advantages", "returns"]
ROLLOUT_NAMES = ["b_obs", "b_actions", "mb_inds"]
PPO = dict(storage=["storage"], heads=ppo_heads, recompute=ppo_recompute, from_heads=["storage.values"])
PPO |= dict(float32_fields=["storage.logprobs"], float32_names=["advantages", "returns"])
PPG = PPO | dict(storage=["storage", "aux_buffer"], heads=ppg_heads, recompute=ppg_recompute)
PPG |= dict(float32_fields=["storage.logprobs", "aux_buffer.returns"])
CASES = {
    "ppo_atari": Case(
        "ppo_atari.py",
        [*MINATAR, "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"],
        steps=384,
        at_backward=[*PPO_NAMES, "mb"],
        **PPO,
    ),
    "ppo_atari_envpool": Case(
        "ppo_atari_envpool.py",
        ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"],
        steps=192,
        at_backward=[*PPO_NAMES, *ROLLOUT_NAMES],
        **PPO,
    ),
    "dqn_atari": Case(
        "dqn_atari.py",
        # Acting at random throughout (epsilon 1), so that the two runs' replay buffers hold the same games: greedy
        # actions would follow Q-values that bf16 rounds, and a tie broken the other way makes another game.
        [*MINATAR, "--num-envs", "2", "--buffer-size", "1200", "--batch-size", "8", "--learning-starts", "400"]
        + ["--target-network-frequency", "200", "--start-e", "1", "--end-e", "1"],
        steps=800,
        at_backward=["q_network", "target_network", "obs_b", "next_obs_b", "actions_b", "q_values", "target_max"],
        storage=["rb"],
        heads=dqn_heads,
        recompute=dqn_recompute,
    ),
    "ppo_procgen": Case(
        "ppo_procgen.py",
        [*PROCGEN, "--num-steps", "32", "--update-epochs", "1"],
        steps=128,
        at_backward=[*PPO_NAMES, *ROLLOUT_NAMES],
        **PPO,
    ),
    "ppg_procgen": Case(
        "ppg_procgen.py",
        [*PROCGEN, "--num-steps", "16", "--n-iteration", "2", "--e-auxiliary", "1", "--num-aux-rollouts", "2"],
        steps=64,
        at_backward=["policy", "value_net", "newlogprob", "entropy", "newvalue", "advantages", "returns"]
        + [*ROLLOUT_NAMES, "mb_obs", "log_probs", "aux_values", "values"],
        **PPG,
    ),
}
# The heads' outputs straight from a layer (bf16 under --amp, cast back); the others (log-softmax, the entropy over it)
# are computed in float32 from the bf16 logits.
LAYER_OUTPUTS = {"value", "aux value", "Q-value", "target max"}


@dataclass
class Pair:
    case: Case
    float32: object  # the probe's Trace of the run without --amp
    amp: object  # ... and with it
    run_dir: Path  # the --amp run's directory: its checkpoint and saved model


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory) -> Pair:
    from probe import probe_script

    torch.set_num_threads(1)  # as the scripts run (--torch-threads 1)
    case = CASES[request.param]
    flags = [*case.flags, "--total-timesteps", str(case.steps), "--checkpoint-every", str(case.steps)]
    traces, cwd = {}, None
    for amp in (False, True):
        cwd = tmp_path_factory.mktemp(f"{request.param}_{'amp' if amp else 'float32'}")
        run_flags = [*flags, "--amp", "--save-model", "--eval-episodes", "1"] if amp else flags
        traces[amp] = probe_script(
            case.script, run_flags, cwd, watch=["action", "actions"], at_backward=case.at_backward, final=case.storage
        )
    (run_dir,) = run_dirs(cwd)
    return Pair(case, traces[False], traces[True], run_dir)


def stored(trace, name: str):
    """A field of the storage the run left ("storage.values"), from the probe's copy of its attributes."""
    owner, attribute = name.split(".")
    return trace.final[owner][attribute]


def floating_leaves(value, path: str = ""):
    """(path, dtype) of every floating-point tensor or array in a nested checkpoint, model or storage copy."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or (
            isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)
        ):
            yield path, value.dtype
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from floating_leaves(item, f"{path}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from floating_leaves(item, f"{path}/{i}")


def test_amp_runs_the_forward_passes_in_bf16_and_without_it_none(pair):
    case = pair.case
    for trace, amp in ((pair.float32, False), (pair.amp, True)):
        for name in case.from_heads:
            assert on_bf16_grid(stored(trace, name)) == amp, f"{case.script} --amp {amp}: rollout's {name}"
        assert trace.backward, "no update ran"
        for k, entry in enumerate(trace.backward):
            for head, output in case.heads(entry).items():
                if head in LAYER_OUTPUTS:
                    assert on_bf16_grid(output) == amp, f"{case.script} --amp {amp}: update {k}'s {head}"


def test_amp_keeps_everything_stored_in_float32(pair):
    case, run_dir = pair.case, pair.run_dir
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    model = torch.load(run_dir / f"{case.script.removesuffix('.py')}.cleanrl_model", weights_only=False)
    leaves = [*floating_leaves(checkpoint, "checkpoint"), *floating_leaves(model, "model")]
    leaves += floating_leaves(pair.amp.final, "storage")
    assert len(leaves) > 10
    assert [(path, dtype) for path, dtype in leaves if dtype not in (torch.float32, np.float32)] == []
    for name in case.storage:
        frames = pair.amp.final[name]["frames" if name == "rb" else "obs"]
        assert frames.dtype == torch.uint8, name
    # Computed in float32 from the bf16 heads: log-softmax, GAE.
    for name in case.float32_fields:
        assert not on_bf16_grid(stored(pair.amp, name)), f"{name} has only bf16's precision"
    for entry in pair.amp.backward:
        for name in case.float32_names:
            if name in entry and entry["where"] != "auxiliary_phase":
                assert not on_bf16_grid(entry[name]), f"{name} has only bf16's precision"
        for head, output in case.heads(entry).items():
            if head not in LAYER_OUTPUTS:
                assert not on_bf16_grid(output), f"the update's {head} has only bf16's precision"


def test_amp_trains_within_bf16_rounding_of_float32(pair):
    name = pair.case.script.removesuffix(".py")
    module = __import__(name)
    model = torch.load(pair.run_dir / f"{name}.cleanrl_model", weights_only=False)
    # Every update trained on the heads' outputs of its networks up to bf16's rounding.
    for k, entry in enumerate(pair.amp.backward):
        expected = pair.case.recompute(module, model, entry)
        for head, output in pair.case.heads(entry).items():
            torch.testing.assert_close(output, expected[head], **TOLERANCE, msg=f"{name} update {k}: {head}")
    # The two runs acted alike, so their updates saw the same frames and actions: their losses agree.
    actions = [[step.get("action", step.get("actions")) for step in t.steps] for t in (pair.float32, pair.amp)]
    assert len(actions[0]) == len(actions[1]) > 10
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(*actions)), "the runs acted differently"
    float32, amp = (torch.stack([entry["loss"] for entry in t.backward]) for t in (pair.float32, pair.amp))
    assert len(float32) == len(amp) and not torch.equal(float32, amp)
    gap, bound = (amp - float32).abs().max().item(), LOSS_BOUND * float32.abs().max().item()
    assert gap <= bound, f"{name}: the runs' losses differ by up to {gap:.3g} (bound {bound:.3g})\n{float32}\n{amp}"
