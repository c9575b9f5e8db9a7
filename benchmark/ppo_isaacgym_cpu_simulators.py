"""ppo_isaacgym.py's simulator paths on a CPU at the headline size (4096 environments x 16 steps, the GPU defaults):
the training SPS of a few iterations through each --simulator, envpool's raw steps/s per --envpool-threads, and where an
iteration's time goes on the envpool path (simulator, the adapter's copies, the policy, the advantages and update).

    uv run --all-extras python benchmark/ppo_isaacgym_cpu_simulators.py            # all: ~25 min on 2 idle cores
    uv run --all-extras python benchmark/ppo_isaacgym_cpu_simulators.py --tasks Ant --simulators envpool

Writes benchmark/results/ppo_isaacgym_cpu_simulators.md (--output). One process at a time; the machine's load average
is written beside the numbers, since a shared machine's numbers move with it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "cleanrl"))
import ppo_isaacgym as pig  # noqa: E402

from cleanrl_utils.envs.envpool_mujoco_env import EnvPoolMuJoCoVecEnv  # noqa: E402

NUM_ENVS, NUM_STEPS = 4096, 16
BATCH = NUM_ENVS * NUM_STEPS
# Iterations per training measurement: MuJoCo Warp takes minutes per iteration of 65,536 steps here.
ITERATIONS = {"envpool": 2, "gymnasium": 2, "mujoco-warp": 1}


def load() -> str:
    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg())


def training_sps(task: str, simulator: str, iterations: int, threads: int) -> tuple[float, float, str]:
    """The last charts/SPS of a run of `iterations` iterations (start-up excluded), its wall time, and the command."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    command = [sys.executable, str(ROOT / "cleanrl" / "ppo_isaacgym.py"), "--simulator", simulator, "--env-id", task]
    command += ["--total-timesteps", str(BATCH * iterations), "--log-every", "1"]
    if simulator == "envpool":
        command += ["--envpool-threads", str(threads)]
    with tempfile.TemporaryDirectory() as cwd:
        start = time.time()
        subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
        wall = time.time() - start
        (run_dir,) = Path(cwd, "runs").iterdir()
        events = EventAccumulator(str(run_dir))
        events.Reload()
        sps = events.Scalars("charts/SPS")[-1].value
    shown = "uv run --all-extras python cleanrl/ppo_isaacgym.py " + " ".join(command[2:])
    return sps, wall, shown


class TimedPool:
    """envpool's pool with the time spent in its step and reset (the simulator's work) added up."""

    def __init__(self, pool):
        self.pool, self.seconds = pool, 0.0

    def step(self, *args):
        start = time.perf_counter()
        out = self.pool.step(*args)
        self.seconds += time.perf_counter() - start
        return out

    def reset(self, *args):
        start = time.perf_counter()
        out = self.pool.reset(*args)
        self.seconds += time.perf_counter() - start
        return out

    def close(self):
        self.pool.close()


def envpool_breakdown(task: str, threads: int, steps: int = 32) -> dict:
    """Per environment step of all 4096 environments, in ms: envpool's step and resets (simulator), the adapter's
    conversions and copies (adapter), and the policy (observation statistics, normalisation, the Gaussian's sample),
    on the envpool path as ppo_isaacgym.py's rollout runs them (1 torch thread, its default)."""
    torch.set_num_threads(1)
    envs = EnvPoolMuJoCoVecEnv(task, NUM_ENVS, torch.device("cpu"), seed=1, num_threads=threads)
    envs.envs = TimedPool(envs.envs)
    agent, rms = pig.Agent(envs.obs_dim, envs.act_dim), pig.RunningMeanStd(envs.obs_dim)
    obs = envs.reset()
    policy = adapter = 0.0
    with torch.no_grad():
        for step in range(steps + 2):  # 2 warm-up steps
            if step == 2:
                policy = adapter = envs.envs.seconds = 0.0
            start = time.perf_counter()
            rms.update(obs)
            action = agent.sample_action(rms.normalize(obs, 10.0))
            middle = time.perf_counter()
            obs, *_ = envs.step(action)
            end = time.perf_counter()
            policy += middle - start
            adapter += end - middle
    envs.close()
    simulator = envs.envs.seconds
    return {
        "simulator": 1e3 * simulator / steps,
        "adapter": 1e3 * (adapter - simulator) / steps,
        "policy": 1e3 * policy / steps,
        "raw_sps": NUM_ENVS * steps / simulator,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["Ant", "Humanoid"])
    parser.add_argument("--simulators", nargs="+", default=["envpool", "gymnasium", "mujoco-warp"])
    parser.add_argument(
        "--skip", nargs="*", default=[], help="TASK:SIMULATOR pairs to leave out (Humanoid:mujoco-warp)"
    )
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="envpool thread counts to compare")
    parser.add_argument("--output", default=str(ROOT / "benchmark/results/ppo_isaacgym_cpu_simulators.md"))
    args = parser.parse_args()
    lines = [f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPU cores, no GPU"]
    print(lines[0], flush=True)

    rows = ["| task | simulator | training SPS | iterations | wall time (s, start-up included) | load before |"]
    rows.append("|---|---|---|---|---|---|")
    commands = []
    for task in args.tasks:
        for simulator in args.simulators:
            if f"{task}:{simulator}" in args.skip:
                continue
            before = load()
            sps, wall, command = training_sps(task, simulator, ITERATIONS[simulator], max(args.threads))
            rows.append(f"| {task} | {simulator} | {sps:,.0f} | {ITERATIONS[simulator]} | {wall:.0f} | {before} |")
            commands.append(command)
            print(rows[-1], flush=True)

    split = ["| task | envpool threads | raw envpool SPS | simulator ms | adapter ms | policy ms | load before |"]
    split.append("|---|---|---|---|---|---|---|")
    for task in args.tasks:
        for threads in args.threads:
            before = load()
            b = envpool_breakdown(task, threads)
            split.append(
                f"| {task} | {threads} | {b['raw_sps']:,.0f} | {b['simulator']:.1f} | {b['adapter']:.1f} | "
                f"{b['policy']:.1f} | {before} |"
            )
            print(split[-1], flush=True)

    text = [
        "# ppo_isaacgym.py on a CPU: the simulator paths at 4096 environments x 16 steps",
        "",
        f"Machine: {subprocess.run(['uname', '-srm'], capture_output=True, text=True).stdout.strip()}, {lines[0]}. "
        "Made by `uv run --all-extras python benchmark/ppo_isaacgym_cpu_simulators.py` (its docstring); the GPU "
        "defaults throughout (2 minibatches, 4 epochs, 256x256 networks, 1 torch thread).",
        "",
        "## Training SPS per simulator",
        "",
        *rows,
        "",
        "Training SPS: the last charts/SPS the script logged (steps since the start of training over its wall time; "
        "simulator start-up excluded). Commands:",
        "",
        *[f"    {command}" for command in commands],
        "",
        "## envpool: threads, and where a step's time goes",
        "",
        *split,
        "",
        "Per step of all 4096 environments, on the envpool path as the rollout runs it: simulator = envpool's step and "
        "its partial resets of the ended environments (C++, on its threads); adapter = the rest of "
        "EnvPoolMuJoCoVecEnv.step (float64 to float32, rows in env order, one copy to the device, episode "
        "statistics); policy = observation statistics, normalisation and the Gaussian policy's sample (1 torch "
        "thread). Raw envpool SPS: 4096 over the simulator time. 32 steps after 2 warm-up steps, untrained policy "
        "(Ant's episodes end early, so resets are frequent).",
        "",
    ]
    Path(args.output).write_text("\n".join(text))
    print(f"written to {args.output}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
