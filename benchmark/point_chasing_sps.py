"""Raw steps per second of PointChasing-v0: the torch-batched env (PointChasingVecEnv) at 1, 64 and 4096 copies
(and 65536 with --large, for a GPU), uniform random actions in [-1, 1] drawn on the env's device, no learning.
The single NumPy env through gymnasium's SyncVectorEnv (what the continuous scripts step) stands beside it.

    uv run python benchmark/point_chasing_sps.py --device cpu --seconds 5
    uv run python benchmark/point_chasing_sps.py --device cuda --large

Each size: 20 warm-up steps, then steps for --seconds (synchronising a GPU before reading the clock). Env steps per
second count one step of all copies as num_envs. Writes a Markdown table to --output (and prints it).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from cleanrl_utils.envs.point_chasing import PointChasingEnv, PointChasingVecEnv  # noqa: E402
from cleanrl_utils.errors import fail  # noqa: E402
from cleanrl_utils.results import machine_description  # noqa: E402


@dataclass
class Args:
    device: str = "cpu"
    """the batched env's device: cpu or cuda"""
    sizes: list[int] = field(default_factory=lambda: [1, 64, 4096])
    """numbers of copies of the batched env"""
    large: bool = False
    """also 65536 copies (for a GPU)"""
    seconds: float = 5.0
    """time to step each size for, after the warm-up"""
    sync_sizes: list[int] = field(default_factory=lambda: [1, 64])
    """numbers of copies of the single NumPy env in gymnasium's SyncVectorEnv (empty: skip)"""
    output: Path = ROOT / "benchmark" / "results" / "point_chasing_sps.md"
    """the Markdown table written"""


def timed(step, seconds: float, sync) -> tuple[int, float]:
    """(vector steps, elapsed seconds) of calling `step` for about `seconds`, after 20 warm-up calls."""
    for _ in range(20):
        step()
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):  # read the clock (and sync) every 10 steps, not every step
            step()
        count += 10
        sync()
    return count, time.perf_counter() - start


def batched_sps(num_envs: int, device: torch.device, seconds: float) -> tuple[int, float]:
    envs = PointChasingVecEnv(num_envs=num_envs, device=device)
    envs.reset(seed=0)
    generator = torch.Generator(device).manual_seed(1)

    def step():
        envs.step(torch.rand(num_envs, 2, generator=generator, device=device) * 2 - 1)

    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    return timed(step, seconds, sync)


def sync_vector_sps(num_envs: int, seconds: float) -> tuple[int, float]:
    envs = gym.vector.SyncVectorEnv(
        [PointChasingEnv for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=0)
    rng = np.random.default_rng(1)
    return timed(lambda: envs.step(rng.uniform(-1, 1, (num_envs, 2)).astype(np.float32)), seconds, lambda: None)


if __name__ == "__main__":
    args = tyro.cli(Args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {args.device}: no CUDA device here; use --device cpu")
    if args.seconds <= 0 or any(n <= 0 for n in args.sizes + args.sync_sizes):
        fail("--seconds and every size must be positive")
    device = torch.device(args.device)
    load = os.getloadavg()[0]  # other jobs on the machine slow a CPU measurement: say how busy it was
    rows = []
    for num_envs in args.sizes + ([65536] if args.large else []):
        steps, elapsed = batched_sps(num_envs, device, args.seconds)
        rows.append((f"PointChasingVecEnv ({device.type})", num_envs, steps / elapsed))
        print(f"{rows[-1][0]} x {num_envs}: {rows[-1][2] * num_envs:,.0f} env steps/s", flush=True)
    for num_envs in args.sync_sizes:
        steps, elapsed = sync_vector_sps(num_envs, args.seconds)
        rows.append(("SyncVectorEnv of PointChasingEnv (NumPy)", num_envs, steps / elapsed))
        print(f"{rows[-1][0]} x {num_envs}: {rows[-1][2] * num_envs:,.0f} env steps/s", flush=True)
    lines = [
        "# PointChasing-v0: raw environment steps per second",
        "",
        f"Machine: {machine_description()}; torch threads: {torch.get_num_threads()}; "
        f"load average {load:.1f} at the start. "
        f"Command: `python benchmark/point_chasing_sps.py --device {args.device} --seconds {args.seconds:g}"
        f"{' --large' if args.large else ''}`.",
        "",
        "| env | copies | vector steps/s | env steps/s |",
        "|---|---|---|---|",
        *(f"| {name} | {n:,} | {rate:,.0f} | {rate * n:,.0f} |" for name, n, rate in rows),
        "",
        "Uniform random actions in [-1, 1], no learning; env steps/s counts one step of all copies as `copies`. "
        "The batched env keeps its state and returns on its device (random actions drawn there too); the "
        "SyncVectorEnv rows are what the continuous scripts step (NumPy arrays).",
        "",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines))
    print("\n".join(lines))
