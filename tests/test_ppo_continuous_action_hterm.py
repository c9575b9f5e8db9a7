"""ppo_continuous_action_hterm.py: PPO with ElegantRL's H-term. The episode memory (episodes assembled across
rollouts, the lowest returns dropped before new ones are added, the reward-to-go min-max normalised over the whole
memory as ElegantRL does), the term's value on a hand-built memory, its gradient's sign, the variant being exactly
ppo_continuous_action.py until the term starts, exact resume with the term on, bad input; and the script's own loop
under tests/probe.py (the memory rebuilt from what the rollouts stored, the term in every minibatch's loss and
gradient)."""

from __future__ import annotations

import math
from pathlib import Path

import continuous_reference as plain
import numpy as np
import ppo_continuous_action_hterm as hterm
import pytest
import torch
from conftest import kill_at_first_checkpoint, read_scalars, run_dirs, run_script
from test_ppo_continuous import reference_ppo_loss
from update_reference import assert_gradients_match, gradients, leaves

SCRIPT = "ppo_continuous_action_hterm.py"
# Pendulum episodes are cut at 200 steps: 2 envs x 512 steps end 4 episodes, so the memory fills during the run.
FLAGS = ["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2"]
FLAGS += ["--update-epochs", "2", "--total-timesteps", "1024"]
H_ON = ["--h-term-lambda", "0.125", "--h-term-min-transitions", "256"]


def observations(num_steps: int, num_envs: int, offset: int = 0) -> torch.Tensor:
    """obs[t, env] = (offset + t, env): every stored row says where it came from."""
    t, env = torch.meshgrid(torch.arange(num_steps) + offset, torch.arange(num_envs), indexing="ij")
    return torch.stack([t, env], dim=-1).float()


def reward_to_go(rewards: list[float], gamma: float) -> list[float]:
    returns, future = [], 0.0
    for reward in reversed(rewards):
        future = reward + gamma * future
        returns.insert(0, future)
    return returns


def normalised_over_memory(*episodes: list[float]) -> list[float]:
    """ElegantRL's R_norm: every transition's reward-to-go scaled by the minimum and maximum over the whole memory."""
    values = [g for episode in episodes for g in episode]
    low, high = min(values), max(values)
    return [(g - low) / (high - low) for g in values]


def test_memory_assembles_episodes_across_rollouts_drops_the_lowest_returns_first_and_normalises_over_all():
    memory = hterm.EpisodeMemory(num_envs=2, gamma=0.5, drop_rate=0.5)
    # Rollout 1 (4 steps): env 0 ends an episode (rewards 1, 4) at step 1 and starts another; env 1 ends one at step 3.
    rewards = np.array([[1, 0], [4, 1], [3, 0], [4, 2]], dtype=np.float32)
    dones = np.array([[0, 0], [1, 0], [0, 0], [0, 1]], dtype=np.float32)
    obs = observations(4, 2)
    memory.add_rollout(obs, -obs, rewards, dones)
    # Episodes: A = env 0 steps 0-1 (return 5), B = env 1 steps 0-3 (return 3); nothing was stored before, so nothing
    # is dropped yet (ElegantRL drops before it adds).
    assert [episode[3] for episode in memory.episodes] == [5.0, 3.0] and memory.size == 6
    assert memory.obs.tolist() == [[0, 0], [1, 0], [0, 1], [1, 1], [2, 1], [3, 1]]
    assert memory.actions.tolist() == (-memory.obs).tolist()
    rtg_a, rtg_b = reward_to_go([1, 4], 0.5), reward_to_go([0, 1, 0, 2], 0.5)
    assert memory.r_norm.tolist() == pytest.approx(normalised_over_memory(rtg_a, rtg_b))
    obs.fill_(99.0)  # the next rollout overwrites the storage: the memory holds copies
    assert memory.episodes[0][0].tolist() == [[0, 0], [1, 0]] and memory.unfinished[0][0].tolist() == [[2, 0], [3, 0]]
    # Rollout 2: B (the lower half) is dropped first; then env 0's episode (3, 4 from rollout 1, then 5) ends at step 0.
    rewards = np.array([[5, 1], [0, 1]], dtype=np.float32)
    dones = np.array([[1, 0], [0, 0]], dtype=np.float32)
    memory.add_rollout(observations(2, 2, offset=4), -observations(2, 2, offset=4), rewards, dones)
    assert [episode[3] for episode in memory.episodes] == [5.0, 12.0]
    assert memory.obs.tolist() == [[0, 0], [1, 0], [2, 0], [3, 0], [4, 0]]
    assert memory.r_norm.tolist() == pytest.approx(normalised_over_memory(rtg_a, reward_to_go([3, 4, 5], 0.5)))
    assert memory.unfinished[0][0].tolist() == [[5, 0]]  # env 0's next episode has begun
    assert memory.unfinished[1][2].tolist() == [1, 1]  # env 1's: two steps so far
    # A state-dict round trip keeps the memory and the unfinished episodes.
    copy = hterm.EpisodeMemory(num_envs=2, gamma=0.5, drop_rate=0.5)
    copy.load_state_dict(memory.state_dict())
    assert torch.equal(copy.obs, memory.obs) and torch.equal(copy.r_norm, memory.r_norm)
    assert torch.equal(copy.unfinished[0][0], memory.unfinished[0][0]) and copy.size == memory.size


def test_a_low_return_episode_weighs_less_than_a_high_return_one():
    """The review's case: normalised within each episode, returns of 0.5 and of 50 got identical weights."""
    memory = hterm.EpisodeMemory(num_envs=2, gamma=1.0, drop_rate=0.0)
    rewards = np.array([[0.25, 25.0], [0.25, 25.0]], dtype=np.float32)
    memory.add_rollout(observations(2, 2), observations(2, 2), rewards, np.ones((2, 2), dtype=np.float32))
    # Episodes of one step each, env by env: returns 0.25, 0.25 (env 0) and 25, 25 (env 1).
    assert memory.r_norm.tolist() == pytest.approx([0.0, 0.0, 1.0, 1.0])
    memory = hterm.EpisodeMemory(num_envs=2, gamma=1.0, drop_rate=0.0)
    memory.add_rollout(observations(2, 2), observations(2, 2), rewards, np.array([[0, 0], [1, 1]], dtype=np.float32))
    low, high = [0.5, 0.25], [50.0, 25.0]  # the reward-to-go of each two-step episode
    assert memory.r_norm.tolist() == pytest.approx(normalised_over_memory(low, high))
    assert max(memory.r_norm[:2]) < 0.01 < 0.49 < min(memory.r_norm[2:])


def hand_built_memory() -> hterm.EpisodeMemory:
    memory = hterm.EpisodeMemory(num_envs=1, gamma=0.9, drop_rate=0.0)
    memory.obs = torch.tensor([[0.5, -1.0], [0.5, -1.0], [1.0, 2.0]])
    memory.actions = torch.tensor([[0.3], [-0.3], [1.2]])
    memory.r_norm = torch.tensor([1.0, 0.0, 0.5])
    return memory


def constant_policy(mean: float, std: float) -> hterm.Agent:
    """A policy whose mean is `mean` in every state (output layer zero, bias = mean)."""
    agent = hterm.Agent(obs_dim=2, act_dim=1)
    with torch.no_grad():
        agent.actor_mean[-1].weight.zero_()
        agent.actor_mean[-1].bias.fill_(mean)
        agent.actor_logstd.fill_(math.log(std))
    return agent


def test_h_term_value_on_a_hand_built_memory():
    memory, agent = hand_built_memory(), constant_policy(mean=0.1, std=0.5)
    torch.manual_seed(3)
    value = memory.h_term(agent, sample_rate=1.0, h_lambda=0.125)
    torch.manual_seed(3)
    rows = torch.randint(3, (4,)).tolist()  # the same uniform draw, with replacement: int(3 * 1.0 + 1) rows
    density = [math.exp(-0.5 * ((a - 0.1) / 0.5) ** 2) / (0.5 * math.sqrt(2 * math.pi)) for a in (0.3, -0.3, 1.2)]
    expected = -0.125 * np.mean([density[i] * [1.0, 0.0, 0.5][i] for i in rows])
    assert value.item() == pytest.approx(expected, rel=1e-5)


def test_h_term_gradient_raises_the_density_of_high_return_actions():
    memory, agent = hand_built_memory(), constant_policy(mean=0.0, std=0.5)
    memory.obs, memory.actions, memory.r_norm = memory.obs[:2], memory.actions[:2], memory.r_norm[:2]
    obs = memory.obs[:1]
    before = {a: agent.log_prob(obs, torch.tensor([[a]])).item() for a in (0.3, -0.3)}
    optimizer = torch.optim.SGD(agent.parameters(), lr=0.05)
    for _ in range(5):
        optimizer.zero_grad()
        memory.h_term(agent, sample_rate=1.0, h_lambda=1.0).backward()
        optimizer.step()
    after = {a: agent.log_prob(obs, torch.tensor([[a]])).item() for a in (0.3, -0.3)}
    assert after[0.3] > before[0.3]  # the action of reward-to-go 1 got likelier
    assert after[-0.3] < before[-0.3]  # the one of reward-to-go 0 less so


# --- the loop's own wiring -----------------------------------------------------------------------
# The script runs unchanged under tests/probe.py on ProbeDrift-v0 (tests/probe_box_envs.py: 8-step episodes that end
# by termination or truncation), 2 envs x 32 steps, 3 iterations of 2 epochs of 2 minibatches, the term on from 100
# stored transitions (the 2nd iteration on), a quarter of the episodes dropped before each rollout's are added, a small
# entropy bonus on. The tests rebuild the episode memory from the stream of what the policy saw and the env returned
# (tests/continuous_reference.rollout_stream) and check every minibatch's loss and gradient as PPO's plus the term's,
# over the rows the term drew (torch's generator, copied at each backward, replayed to the next draw).
PROBE_FLAGS = ["--env-id", "ProbeDrift-v0", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
PROBE_FLAGS += ["--update-epochs", "2", "--total-timesteps", "192", "--gamma", "0.9", "--gae-lambda", "0.8"]
PROBE_FLAGS += ["--h-term-lambda", "0.5", "--h-term-drop-rate", "0.25", "--h-term-sample-rate", "1.0"]
PROBE_FLAGS += ["--h-term-min-transitions", "100", "--ent-coef", "1e-3"]
PROBE_WATCH = ["next_obs", "obs_rms", "noise", "iteration", "memory"]
PROBE_WATCH += ["action", "next_obs_np", "reward", "terminated", "truncated", "infos"]
PROBE_AT_BACKWARD = ["mb", "agent", "iteration", "epoch", "memory", "h_term", "h_term_on", "torch.default_generator"]
PROBE_GAMMA, PROBE_LAMBDA, PROBE_DROP_RATE, PROBE_MIN_TRANSITIONS = 0.9, 0.5, 0.25, 100
PROBE_ENT_COEF, PROBE_STEPS, PROBE_ENVS, ACT_DIM = 1e-3, 32, 2, 2


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    from probe import probe_script

    final = ["action", "next_obs_np", "reward", "terminated", "truncated", "infos", "next_obs", "obs_rms", "memory"]
    cwd = tmp_path_factory.mktemp("probe")
    return probe_script(
        SCRIPT,
        PROBE_FLAGS,
        cwd,
        watch=PROBE_WATCH,
        at_backward=PROBE_AT_BACKWARD,
        grads=["agent"],
        final=final,
        preload=["probe_box_envs"],
    )


def reference_memories(stream: list[dict], num_envs: int) -> list[list[tuple]]:
    """The stored episodes after each rollout, rebuilt from the stream: whole episodes (assembled across rollouts) of
    (observations as the policy saw them, the actions as sampled, the raw rewards); before a rollout's finished
    episodes are added, the lowest-return share of those stored is dropped. An episode: (obs, actions, reward-to-go,
    return)."""
    memories, stored = [], []
    running = [([], [], []) for _ in range(num_envs)]
    for iteration in sorted({step["iteration"] for step in stream}):
        finished = []
        for env in range(num_envs):
            for step in (step for step in stream if step["iteration"] == iteration):
                obs, actions, rewards = running[env]
                obs.append(step["obs"][env])
                actions.append(step["action"][env])
                rewards.append(float(step["reward"][env]))
                if step["terminated"][env] or step["truncated"][env]:
                    finished.append(
                        (torch.stack(obs), torch.stack(actions), reward_to_go(rewards, PROBE_GAMMA), sum(rewards))
                    )
                    running[env] = ([], [], [])
        stored.sort(key=lambda episode: episode[3])
        del stored[: int(len(stored) * PROBE_DROP_RATE)]
        stored += finished
        memories.append(list(stored))
    return memories


def memories(trace) -> list[dict]:
    """The episode memory's state dict (its episodes) after each rollout was added: as the next rollout's first step
    found it, or at the end. (At a backward, `memory` is update_minibatch's argument: None while the term is off.)"""
    steps = [entry for entry in trace.steps if entry["step"] > 0]
    return [next(entry for entry in steps if entry["iteration"] == i)["memory"] for i in (2, 3)] + [
        trace.final["memory"]
    ]


def test_the_memory_holds_the_best_whole_episodes_of_what_the_rollouts_stored_with_raw_rewards(probed):
    stream = plain.rollout_stream(probed, 32)
    assert len(stream) == 96
    expected = reference_memories(stream, 2)
    assert len(expected) == 3 and len(expected[0]) >= 8  # so that the 2nd and 3rd rollouts drop episodes first
    for iteration, (episodes, memory) in enumerate(zip(expected, memories(probed)), 1):
        got = sorted(memory["episodes"], key=lambda episode: episode[3])
        episodes = sorted(episodes, key=lambda episode: episode[3])
        returns = [episode[3] for episode in episodes]  # the script sums float32 rewards
        assert [episode[3] for episode in got] == pytest.approx(returns, rel=1e-5, abs=1e-5), iteration
        for (obs, actions, to_go, _), (want_obs, want_actions, want_to_go, _) in zip(got, episodes):
            assert torch.equal(obs, want_obs) and torch.equal(actions, want_actions)
            assert to_go.tolist() == pytest.approx(want_to_go, rel=1e-5, abs=1e-6)
        assert len(memory["unfinished"]) == 2  # each env's episode so far waits for the next rollout


def drawn_rows(updates: list[dict], k: int, size: int) -> torch.Tensor:
    """The memory rows the H-term of backward k drew (k > 0): torch's generator as backward k - 1 found it, run through
    the draws the loop makes in between (a new iteration's rollout noise, a new epoch's permutation of the batch), then
    the term's own: size + 1 rows uniformly with replacement (--h-term-sample-rate 1)."""
    before, entry = updates[k - 1], updates[k]
    generator = torch.Generator()
    generator.set_state(before["torch.default_generator"].get_state())
    if entry["iteration"] != before["iteration"]:
        torch.randn((PROBE_STEPS, PROBE_ENVS, ACT_DIM), generator=generator)
    if (entry["iteration"], entry["epoch"]) != (before["iteration"], before["epoch"]):
        torch.randperm(PROBE_STEPS * PROBE_ENVS, generator=generator)
    return torch.randint(size, (size + 1,), generator=generator)


def test_each_minibatch_adds_the_h_term_of_a_uniform_sample_of_the_memory_once_it_is_full_enough(probed):
    states, stored = set(), memories(probed)
    for k, entry in enumerate(probed.backward):
        mb, where = entry["mb"], f"iteration {entry['iteration']} epoch {entry['epoch']}"
        params = leaves(entry["agent"])
        ppo = reference_ppo_loss(params, mb, clip_coef=0.2, vf_coef=0.5, ent_coef=PROBE_ENT_COEF)
        # The memory as this rollout left it, as [size, ...] tensors; R_norm: the reward-to-go min-max normalised
        # over all of it (ElegantRL's h_term_r_min_max).
        episodes = stored[entry["iteration"] - 1]["episodes"]
        obs, actions, to_go = (torch.cat([episode[i] for episode in episodes]) for i in range(3))
        r_norm = (to_go - to_go.min()) / (to_go.max() - to_go.min())
        on = len(r_norm) >= PROBE_MIN_TRANSITIONS
        assert entry["h_term_on"] == on, where
        states.add(on)
        if not on:
            assert entry["memory"] is None and "h_term" not in entry, where
            assert_gradients_match(entry["grads"]["agent"], gradients(ppo, params), where)
            assert entry["loss"].item() == pytest.approx(ppo.item(), rel=1e-5, abs=1e-6), where
            continue
        assert all(torch.equal(a[0], b[0]) for a, b in zip(entry["memory"]["episodes"], episodes)), where
        # -lambda * mean[pi(a|s) R_norm] over the rows drawn, pi the joint density of the action (not its log).
        rows = drawn_rows(probed.backward, k, len(r_norm))
        mean, log_std = plain.gaussian_policy(params, obs[rows])
        density = torch.distributions.Normal(mean, log_std.exp()).log_prob(actions[rows].double()).sum(-1).exp()
        h_term = -PROBE_LAMBDA * (density * r_norm[rows].double()).mean()
        assert_gradients_match(entry["grads"]["agent"], gradients(ppo + h_term, params), where)
        assert entry["h_term"].item() == pytest.approx(h_term.item(), rel=1e-5), where  # the draw replayed is the run's
        assert entry["loss"].item() == pytest.approx(ppo.item() + h_term.item(), rel=1e-5, abs=1e-6), where
    assert states == {False, True}, "the run should show the term both off and on"


def curves(run_dir: Path) -> dict:
    scalars = read_scalars(run_dir)
    return {key: values for key, values in scalars.items() if key not in ("charts/SPS", "perf/peak_memory_gb")}


def test_the_variant_is_exactly_ppo_continuous_action_until_the_term_starts_and_the_term_changes_the_run(tmp_path):
    for name in ("plain", "idle", "on"):
        (tmp_path / name).mkdir()
    plain = run_script("ppo_continuous_action.py", *FLAGS, cwd=tmp_path / "plain")
    # The memory kept but the term never reached: the bookkeeping alone must not change a single number.
    idle_flags = ["--h-term-lambda", "0.125", "--h-term-min-transitions", "99999"]
    idle = run_script(SCRIPT, *FLAGS, *idle_flags, cwd=tmp_path / "idle")
    on = run_script(SCRIPT, *FLAGS, *H_ON, cwd=tmp_path / "on")
    for result in (plain, idle, on):
        assert result.returncode == 0, result.stderr
    (plain_dir,), (idle_dir,), (on_dir,) = (run_dirs(tmp_path / name) for name in ("plain", "idle", "on"))
    assert curves(idle_dir) == curves(plain_dir)
    on_curves = curves(on_dir)
    assert "losses/h_term" not in curves(plain_dir)
    h_terms = [value for _, value in on_curves["losses/h_term"]]
    assert h_terms and all(math.isfinite(v) and v < 0 for v in h_terms)  # -lambda * mean(density * R_norm)
    assert min(value for _, value in on_curves["charts/h_term_transitions"]) >= 256
    assert on_curves["losses/policy_loss"] != curves(plain_dir)["losses/policy_loss"]


def test_sigkill_then_resume_with_the_h_term_reproduces_the_uninterrupted_run(tmp_path):
    flags = [*FLAGS, *H_ON, "--checkpoint-every", "512"]  # at 512 the memory holds episodes and the term is on
    (tmp_path / "straight").mkdir()
    straight = run_script(SCRIPT, *flags, cwd=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    (straight_dir,) = run_dirs(tmp_path / "straight")
    (tmp_path / "killed").mkdir()
    run_dir = kill_at_first_checkpoint(SCRIPT, flags, tmp_path / "killed")
    resumed = run_script(SCRIPT, *flags, "--resume", str(run_dir / "checkpoint.pt"), cwd=tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert curves(run_dir) == curves(straight_dir)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--h-term-lambda", "-0.1"], "--h-term-lambda must be >= 0"),
        (["--h-term-drop-rate", "1"], "--h-term-drop-rate in [0, 1)"),
        (["--h-term-sample-rate", "0"], "--h-term-sample-rate in (0, 1]"),
        (["--h-term-min-transitions", "0"], "--h-term-min-transitions must be positive"),
    ],
)
def test_bad_h_term_flags_fail_in_one_line(capsys, flags, fragment):
    import tyro

    with pytest.raises(SystemExit) as exit_info:
        hterm.validate(tyro.cli(hterm.Args, args=["--env-id", "Pendulum-v1", *flags]))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines
