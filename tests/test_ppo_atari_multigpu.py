"""ppo_atari_multigpu.py under torchrun on the CPU (gloo), 2 ranks on MinAtar, each rank's own loop observed by
tests/probe.py (nproc=2) and rebuilt from its games replayed in envs seeded seed + rank x local_num_envs: each rank's
rollout as learning sees it and its GAE by a plain loop, every rank's loss and gradient (against a float64 reference's)
on its share of the minibatch with the advantages normalised over all ranks' shares, every Adam step on the gradient
averaged over the ranks then clipped, identical parameters on every rank, a --target-kl early stop in the same update on
all ranks, rank 0 alone writing, SIGTERM to one rank stopping all of them, and the 2-rank checkpoint resumed exactly
over two "nodes" (two torchrun launches meeting at a c10d rendezvous on localhost). The script's collectives (the KL
early stop, the global mean and std, the gradient average) on two spawned gloo ranks whose inputs differ. Bad input, and
the GPU count check.

The resume and SIGTERM runs go through `rank.py` below, which records the seeds the script gives its vector env
and, when the script is done, saves that rank's agent and optimiser state for the test to compare."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import ppo_atari_multigpu
import pytest
import torch
from conftest import ROOT, assert_bad_input, assert_finite_keys, read_scalars, run_dirs, run_script, script_env
from test_ppo_atari import (
    actions_taken,
    assert_adam_steps,
    clipped_ppo_loss,
    float64_minibatch,
    learning_view,
    loop_steps,
    policy_and_value,
    reference_gae,
    replay_stream,
)
from update_reference import assert_gradients_match, gradients

from cleanrl_utils.envs.atari import make_envs

SCRIPT = ROOT / "cleanrl" / "ppo_atari_multigpu.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# 2 ranks x 2 envs x 32 steps: 128 steps an iteration, 6 iterations; a checkpoint at 512; the KL early stop after
# the first of two epochs in every update.
FLAGS = ["--env-id", "MinAtar/Breakout-v1", "--local-num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
FLAGS += ["--update-epochs", "2", "--target-kl", "1e-9", "--total-timesteps", "768", "--checkpoint-every", "512"]
FLAGS += ["--save-model", "--eval-episodes", "1", "--clip-coef", "0.02", "--learning-rate", "1e-3"]
ITERATIONS, MINIBATCHES, LOCAL_ENVS, NUM_STEPS, CLIP, LR = 6, 2, 2, 32, 0.02, 1e-3
UPDATE_NAMES = ["mb", "agent", "mb_inds", "iteration", "epoch", "rewards", "terminated", "truncated", "reset_steps"]
UPDATE_NAMES += ["values", "advantages", "returns", "next_obs"]
RANK_WRAPPER = """
import os, runpy, sys
import gymnasium as gym
import torch

script, out = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "0")
open(os.path.join(out, f"pid{rank}"), "w").write(str(os.getpid()))
seeds = []
reset = gym.vector.SyncVectorEnv.reset


def recording_reset(self, *, seed=None, options=None):
    # the seed of each game: an int seeds game i with seed + i (gymnasium's SyncVectorEnv, as ale-py's vector env)
    seeds.append([seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed))
    return reset(self, seed=seed, options=options)


gym.vector.SyncVectorEnv.reset = recording_reset
sys.argv = [script, *sys.argv[3:]]
done = runpy.run_path(script, run_name="__main__")
state = dict(local_rank=os.environ.get("LOCAL_RANK"), seeds=seeds[0], agent=done["agent"].state_dict())
torch.save(dict(state, optimizer=done["optimizer"].state_dict()), os.path.join(out, f"rank{rank}.pt"))
"""
SCALAR_KEYS = ["charts/episodic_return", "losses/value_loss", "losses/approx_kl", "losses/explained_variance"]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One CPU thread, as the script runs (--torch-threads 1): the tests' own forward and backward passes on a busy
    machine spend far longer spinning in a thread pool than computing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def torchrun(cwd: Path, out: Path, *launch: str, flags=FLAGS, timeout: float = 300, wait: bool = True):
    """torchrun `launch` rank.py ppo_atari_multigpu.py `flags` in `cwd`; each rank saves its state into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    wrapper = out / "rank.py"
    if not wrapper.exists():  # written once: the two launches of a two-node run share it
        wrapper.write_text(RANK_WRAPPER)
    command = [*TORCHRUN, *launch, str(wrapper), str(SCRIPT), str(out), *flags]
    env = script_env(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if not wait:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def rank_states(out: Path, world_size: int = 2) -> list[dict]:
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


def assert_same_parameters(states: list[dict]) -> None:
    first = states[0]["agent"]
    for state in states[1:]:
        assert state["agent"].keys() == first.keys()
        for name, tensor in state["agent"].items():
            assert torch.equal(tensor, first[name]), name


def adam_steps(state: dict) -> int:
    return int(state["optimizer"]["state"][0]["step"])


class TwoRanks(NamedTuple):
    cwd: Path
    ranks: list  # each rank's probe Trace
    streams: list  # each rank's games replayed from its actions, its envs seeded as the script says


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> TwoRanks:
    """One 2-rank run under torchrun, each rank observed by tests/probe.py (the observation each step acted on, the
    actions, and at every backward() the minibatch share, the agent and the rollout's tensors), shared by the tests
    below; each rank's games are replayed in fresh envs seeded with seed + rank x local_num_envs."""
    from probe import probe_script

    cwd = tmp_path_factory.mktemp("two_ranks")
    names = dict(
        watch=["next_obs", "action"], at_backward=UPDATE_NAMES, grads=["agent"], final=["action", "agent", "optimizer"]
    )
    trace = probe_script("ppo_atari_multigpu.py", FLAGS, cwd, nproc=2, **names)
    streams = [
        replay_stream(make_envs("MinAtar/Breakout-v1", LOCAL_ENVS), 1 + rank * LOCAL_ENVS, actions_taken(ranked))
        for rank, ranked in enumerate(trace.ranks)
    ]
    return TwoRanks(cwd, trace.ranks, streams)


def final_states(two_ranks: TwoRanks) -> list[dict]:
    return [ranked.final for ranked in two_ranks.ranks]


def test_two_ranks_hold_identical_parameters_after_several_updates(two_ranks):
    states = final_states(two_ranks)
    assert_same_parameters(states)
    initial = ppo_atari_multigpu.Agent((4, 10, 10), 3, 1.0).state_dict()  # it trained: not the initial weights
    assert not torch.equal(states[0]["agent"]["actor.weight"], initial["actor.weight"])
    for (name, a), b in zip(states[0]["optimizer"]["state"].items(), states[1]["optimizer"]["state"].values()):
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"]), name


def test_each_rank_acts_on_its_own_seeded_games(two_ranks):
    # Rank r's game i is seeded with seed + r x local_num_envs + i: replayed so, each rank's envs return exactly what
    # its loop acted on, and the two ranks' games differ.
    for ranked, stream in zip(two_ranks.ranks, two_ranks.streams):
        steps = loop_steps(ranked)
        assert len(steps) == ITERATIONS * NUM_STEPS
        for k, step in enumerate(steps):
            assert torch.equal(step["next_obs"], torch.from_numpy(stream["obs"][k])), k
    assert not np.array_equal(two_ranks.streams[0]["obs"], two_ranks.streams[1]["obs"])


def test_each_ranks_rollout_is_its_stream_as_learning_sees_it_with_gae_from_its_agent(two_ranks):
    for ranked, stream in zip(two_ranks.ranks, two_ranks.streams):
        learning = learning_view(stream)
        assert learning["resets"].sum() >= 4, "games should end in the rollouts for this test to mean anything"
        for i, first in enumerate(ranked.backward[::MINIBATCHES]):  # one epoch per update: the KL stop
            rows = slice(i * NUM_STEPS, (i + 1) * NUM_STEPS)
            seen = {key: value[rows] for key, value in learning.items()}
            assert first["rewards"].tolist() == seen["rewards"].tolist()
            assert first["terminated"].tolist() == seen["terminations"].astype(float).tolist()
            assert first["reset_steps"].tolist() == seen["resets"].tolist()
            agent = ppo_atari_multigpu.Agent((4, 10, 10), 3, 1.0)
            agent.load_state_dict(first["agent"])
            with torch.no_grad():  # the rollout's observations and the one after it, by the agent that collected it
                obs = torch.from_numpy(stream["obs"][rows.start : rows.stop + 1])
                _, values = policy_and_value(agent, obs.flatten(0, 1), 1.0)
            values = values.view(NUM_STEPS + 1, LOCAL_ENVS).double()
            assert torch.allclose(first["values"].double(), values[:-1], atol=1e-5)
            expected = reference_gae(seen, values[:-1].numpy(), values[-1].numpy(), 0.99, 0.95)
            transitions = ~seen["resets"]
            assert np.allclose(first["advantages"].numpy()[transitions], expected[transitions], atol=1e-5)
            returns = (expected + values[:-1].numpy())[transitions]
            assert np.allclose(first["returns"].numpy()[transitions], returns, atol=1e-5)


def minibatch_losses(model, shares: list[dict]) -> list[torch.Tensor]:
    """Each rank's loss on its share of one minibatch, the advantages normalised with the mean and the standard
    deviation of the whole minibatch (every rank's share)."""
    everything = torch.cat([share["advantages"] for share in shares])
    stats = (everything.mean(), everything.std())
    return [
        clipped_ppo_loss(*policy_and_value(model, share["obs"], 1.0), share, CLIP, advantage_stats=stats)
        for share in shares
    ]


def test_every_ranks_gradient_and_loss_are_its_share_of_the_minibatch_normalised_over_all_ranks(two_ranks):
    zero, one = (ranked.backward for ranked in two_ranks.ranks)
    assert len(zero) == len(one) == ITERATIONS * MINIBATCHES
    for k, updates in enumerate(zip(zero, one)):
        assert_same_parameters(updates)  # every rank computes with the same parameters
        model = ppo_atari_multigpu.Agent((4, 10, 10), 3, 1.0)
        model.load_state_dict(updates[0]["agent"])
        model.double()
        expected = minibatch_losses(model, [float64_minibatch(update["mb"]) for update in updates])
        for rank, update in enumerate(updates):
            # What backward() left on this rank, before the script averages it over the ranks: the gradient of this
            # rank's reference loss, in float64, with the rollout's values, log-probabilities and returns held
            # constant; then the loss's value.
            grads = gradients(expected[rank], dict(model.named_parameters()))
            assert_gradients_match(update["grads"]["agent"], grads, f"update {k}, rank {rank}")
            assert update["loss"].item() == pytest.approx(expected[rank].item(), rel=1e-5, abs=1e-6), (k, rank)


def test_every_gradient_step_is_adam_on_the_gradient_averaged_over_ranks_then_clipped(two_ranks):
    zero, one = (ranked.backward for ranked in two_ranks.ranks)
    # The gradient each rank's backward() left (its own loss's: checked above), averaged over the two ranks.
    updates = []
    for a, b in zip(zero, one):
        grads = {name: (grad + b["grads"]["agent"][name]) / 2 for name, grad in a["grads"]["agent"].items()}
        updates.append(dict(agent=a["agent"], grads=grads))
    lrs = [LR * (1 - (k // MINIBATCHES) / ITERATIONS) for k in range(len(updates))]
    model = ppo_atari_multigpu.Agent((4, 10, 10), 3, 1.0)
    assert_adam_steps(updates, two_ranks.ranks[0].final["agent"], model, lrs)


def collectives_on_one_rank(rank: int, init_method: str, results) -> None:
    """Rank `rank` of 2 (gloo, spawned): the script's three collectives on inputs that differ between the ranks."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    # The early stop: local approx KLs 0.0 and 1.0, mean 0.5; a per-rank decision would split the ranks.
    stops = [ppo_atari_multigpu.kl_says_stop(torch.tensor(float(rank)), target) for target in (0.4, 0.6)]
    x = torch.arange(3.0) + 10 * rank  # rank 0: 0 1 2; rank 1: 10 11 12
    mean, std = ppo_atari_multigpu.global_mean_std(x)
    torch.manual_seed(rank)
    agent = ppo_atari_multigpu.Agent((4, 10, 10), 3, 1.0)
    for param in agent.parameters():
        param.grad = torch.full_like(param, float(rank))  # rank 0: zeros, rank 1: ones
    ppo_atari_multigpu.average_gradients(agent)
    grads = {name: param.grad.unique().tolist() for name, param in agent.named_parameters()}
    results[rank] = dict(stops=stops, mean=mean.item(), std=std.item(), grads=grads)
    dist.destroy_process_group()


def test_collectives_agree_on_every_rank_when_their_inputs_differ(tmp_path):
    """kl_says_stop, global_mean_std and average_gradients on 2 gloo ranks against plain references: every rank
    gets the value of the ranks' data together (a rank's own value would differ)."""
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.spawn(collectives_on_one_rank, args=(f"file://{tmp_path / 'rendezvous'}", results), nprocs=2)
    everything = torch.tensor([0.0, 1, 2, 10, 11, 12])
    for rank in (0, 1):
        assert results[rank]["stops"] == [True, False], rank
        assert results[rank]["mean"] == pytest.approx(everything.mean().item())
        assert results[rank]["std"] == pytest.approx(everything.std().item())
        assert set(map(tuple, results[rank]["grads"].values())) == {(0.5,)}


def test_target_kl_stops_every_rank_in_the_same_update(two_ranks):
    # Two epochs asked for, one taken in each update, on both ranks: the Adam step counts agree (and a rank that
    # stopped alone would have left the other waiting in its next all-reduce).
    for ranked in two_ranks.ranks:
        assert [update["epoch"] for update in ranked.backward] == [0] * ITERATIONS * MINIBATCHES
        assert adam_steps(ranked.final) == ITERATIONS * MINIBATCHES


def test_rank_zero_alone_writes(two_ranks):
    (run_dir,) = run_dirs(two_ranks.cwd)
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    scalars = read_scalars(run_dir)
    assert_finite_keys(scalars, SCALAR_KEYS + ["charts/SPS", "eval/episodic_return"])
    assert [step for step, _ in scalars["losses/value_loss"]] == [128 * i for i in range(1, ITERATIONS + 1)]
    assert (run_dir / "ppo_atari_multigpu.cleanrl_model").is_file() and (run_dir / "finished.json").is_file()
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert checkpoint["global_step"] == 512 and len(checkpoint["ranks"]) == 2
    assert all(own["envs"] is not None for own in checkpoint["ranks"])  # each rank's games, to resume exactly


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_a_two_rank_checkpoint_resumes_exactly_on_two_nodes(two_ranks, tmp_path):
    """The 2-rank run's checkpoint (step 512 of 768), resumed by two torchrun launches (`--nnodes 2`, a c10d
    rendezvous on localhost) of one rank each: both have LOCAL_RANK 0, so only the global RANK tells them apart.
    The resumed run ends as the uninterrupted one did: the same curves, the same parameters on both ranks."""
    (straight_dir,) = run_dirs(two_ranks.cwd)
    run_dir = tmp_path / "runs" / straight_dir.name
    shutil.copytree(straight_dir, run_dir)
    endpoint = f"localhost:{free_port()}"
    launch = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    launch += ["--rdzv-id", "two_nodes"]
    resume = [*FLAGS, "--resume", str(run_dir / "checkpoint.pt")]
    nodes = [
        torchrun(tmp_path, tmp_path / "out", *launch, "--node-rank", str(node), flags=resume, wait=False)
        for node in (0, 1)
    ]
    for node in nodes:
        out, err = node.communicate(timeout=300)
        assert node.returncode == 0, out[-2000:] + err[-3000:]
    states = rank_states(tmp_path / "out")
    assert [state["local_rank"] for state in states] == ["0", "0"]
    assert [state["seeds"] for state in states] == [[1, 2], [3, 4]]
    assert_same_parameters(states)
    assert_same_parameters([states[0], final_states(two_ranks)[0]])
    assert run_dirs(tmp_path) == [run_dir]  # rank 1 wrote nothing
    resumed, straight = read_scalars(run_dir), read_scalars(straight_dir)
    for key in SCALAR_KEYS + ["losses/policy_loss", "charts/learning_rate"]:
        assert resumed[key] == straight[key], key

    # One rank cannot take over the games of two.
    (tmp_path / "one").mkdir()
    refused = run_script("ppo_atari_multigpu.py", *resume, cwd=tmp_path / "one")
    assert_bad_input(refused, tmp_path / "one", "--world-size is 1 but the checkpointed run used 2")


def test_sigterm_to_one_rank_stops_all_ranks_at_the_same_step(tmp_path):
    flags = [*FLAGS[: FLAGS.index("--total-timesteps")], "--total-timesteps", "200000"]
    proc = torchrun(tmp_path, tmp_path / "out", "--standalone", "--nproc-per-node", "2", flags=flags, wait=False)
    first_line = proc.stdout.readline()  # rank 0's first progress line: training is under way
    assert "steps (" in first_line, first_line + proc.stderr.read()
    os.kill(int((tmp_path / "out" / "pid1").read_text()), signal.SIGTERM)  # rank 1 only
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM/SIGINT on another process: checkpoint written" in out
    (run_dir,) = run_dirs(tmp_path)
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert 0 < checkpoint["global_step"] < 200000 and len(checkpoint["ranks"]) == 2


def test_two_ranks_train_on_an_atari_id(tmp_path):
    # ale-py's vector env, which takes an int seed (or an array), not a list: each rank seeds its games from
    # seed + rank x local_num_envs
    flags = ["--env-id", "BreakoutNoFrameskip-v4", "--local-num-envs", "2", "--num-steps", "16"]
    flags += ["--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "128", "--torch-threads", "1"]
    command = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(SCRIPT), *flags]
    result = subprocess.run(command, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    assert (run_dir / "finished.json").is_file()


def test_bad_input_fails_in_one_line(workdir):
    flags = ["--local-num-envs", "8", "--num-steps", "32", "--num-minibatches", "3"]
    result = run_script("ppo_atari_multigpu.py", *flags, cwd=workdir)
    assert_bad_input(result, workdir, "--num-minibatches 3 does not divide each rank's batch of 256")


def test_more_ranks_on_a_machine_than_gpus_fail_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as stopped:
        ppo_atari_multigpu.validate(ppo_atari_multigpu.Args(env_id="MinAtar/Breakout-v1"), 4, 2)
    assert stopped.value.code == 2
    assert "2 ranks on this machine but 1 GPUs" in capsys.readouterr().err
    ppo_atari_multigpu.validate(ppo_atari_multigpu.Args(env_id="MinAtar/Breakout-v1", cuda=False), 4, 2)
