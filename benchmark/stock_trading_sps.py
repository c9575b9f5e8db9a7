"""Raw steps per second of StockTrading-v0 on the default data (20 stocks, the 2009-2019 training period, one-year
episodes): the torch-batched env (StockTradingVecEnv) at 1, 256 and 4096 portfolios (and 65536 with --large, for a
GPU), uniform random actions in [-1, 1] drawn on the env's device, no learning. The single NumPy env through
gymnasium's SyncVectorEnv (what the continuous scripts step) stands beside it.

    uv run python benchmark/stock_trading_sps.py --device cpu --seconds 5
    uv run python benchmark/stock_trading_sps.py --device cuda --sizes 4096 --large --sync-sizes \\
        --output benchmark/results/stock_trading_sps_gpu.md

Each size: 20 warm-up steps, then steps for --seconds (synchronising a GPU before reading the clock). Env steps per
second count one step of all portfolios as num_envs. Writes a Markdown table to --output (and prints it).
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
from cleanrl_utils.envs.stock_trading import StockTradingEnv, StockTradingVecEnv  # noqa: E402
from cleanrl_utils.errors import fail  # noqa: E402
from cleanrl_utils.results import machine_description  # noqa: E402


@dataclass
class Args:
    device: str = "cpu"
    """the batched env's device: cpu or cuda"""
    sizes: list[int] = field(default_factory=lambda: [1, 256, 4096])
    """numbers of portfolios of the batched env"""
    large: bool = False
    """also 65536 portfolios (for a GPU)"""
    seconds: float = 5.0
    """time to step each size for, after the warm-up"""
    torch_threads: int = 1
    """CPU threads for torch: with 2 on 2 busy cores, 4096 portfolios ran 2.3 steps/s against 72 with 1 (spinning)"""
    sync_sizes: list[int] = field(default_factory=lambda: [1, 16])
    """numbers of copies of the single NumPy env in gymnasium's SyncVectorEnv (none: skip)"""
    output: Path = ROOT / "benchmark" / "results" / "stock_trading_sps.md"
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
    envs = StockTradingVecEnv(num_envs=num_envs, device=device)
    envs.reset(seed=0)
    generator = torch.Generator(device).manual_seed(1)
    shape = envs.action_space.shape

    def step():
        envs.step(torch.rand(shape, generator=generator, device=device) * 2 - 1)

    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    return timed(step, seconds, sync)


def sync_vector_sps(num_envs: int, seconds: float) -> tuple[int, float]:
    envs = gym.vector.SyncVectorEnv(
        [StockTradingEnv for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    envs.reset(seed=0)
    rng = np.random.default_rng(1)
    shape = envs.action_space.shape
    return timed(lambda: envs.step(rng.uniform(-1, 1, shape).astype(np.float32)), seconds, lambda: None)


if __name__ == "__main__":
    args = tyro.cli(Args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {args.device}: no CUDA device here; use --device cpu")
    if args.seconds <= 0 or args.torch_threads <= 0 or any(n <= 0 for n in args.sizes + args.sync_sizes):
        fail("--seconds, --torch-threads and every size must be positive")
    device = torch.device(args.device)
    torch.set_num_threads(args.torch_threads)
    load = os.getloadavg()[0]  # other jobs on the machine slow a CPU measurement: say how busy it was
    rows = []
    for num_envs in args.sizes + ([65536] if args.large else []):
        steps, elapsed = batched_sps(num_envs, device, args.seconds)
        rows.append((f"StockTradingVecEnv ({device.type})", num_envs, steps / elapsed))
        print(f"{rows[-1][0]} x {num_envs}: {rows[-1][2] * num_envs:,.0f} env steps/s", flush=True)
    for num_envs in args.sync_sizes:
        steps, elapsed = sync_vector_sps(num_envs, args.seconds)
        rows.append(("SyncVectorEnv of StockTradingEnv (NumPy)", num_envs, steps / elapsed))
        print(f"{rows[-1][0]} x {num_envs}: {rows[-1][2] * num_envs:,.0f} env steps/s", flush=True)
    command = " ".join(sys.argv[1:])
    lines = [
        "# StockTrading-v0: raw environment steps per second",
        "",
        f"Machine: {machine_description()}; torch threads: {torch.get_num_threads()}; "
        f"load average {load:.1f} at the start. Command: `python benchmark/stock_trading_sps.py {command}`.",
        "",
        "| env | portfolios | vector steps/s | env steps/s |",
        "|---|---|---|---|",
        *(f"| {name} | {n:,} | {rate:,.0f} | {rate * n:,.0f} |" for name, n, rate in rows),
        "",
        "The default data (20 stocks: a 201-float observation, 20 actions), the training period 2009-2019 with "
        "252-day episodes; uniform random actions in [-1, 1], no learning; env steps/s counts one step of all "
        "portfolios as `portfolios`. The batched env keeps cash and holdings (float64) on its device, draws the "
        "actions there too and buys in sequence over the 20 stocks (a loop of 20 batched steps: each buy spends "
        "cash the next cannot); the SyncVectorEnv rows are what the continuous scripts step (NumPy arrays).",
        "",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines))
    print("\n".join(lines))
