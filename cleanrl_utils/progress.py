"""A live console line for long work: steps done of total, SPS, recent return, time left.

On a terminal it redraws one line about twice a second; in a log file it writes a new line
every `log_interval` seconds, so it can be left on.
"""

from __future__ import annotations

import sys
import time
from collections import deque


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    def __init__(self, total_steps: int, start_step: int = 0, label: str = "", log_interval: float = 30.0, stream=None):
        self.total_steps = total_steps
        self.start_step = start_step
        self.label = f"{label} | " if label else ""
        self.stream = stream if stream is not None else sys.stdout
        self.is_tty = self.stream.isatty()
        self.interval = 0.5 if self.is_tty else log_interval
        self.start_time = time.perf_counter()
        self.last_print = -float("inf")
        self.recent_returns: deque[float] = deque(maxlen=100)

    def add_returns(self, returns) -> None:
        self.recent_returns.extend(float(r) for r in returns)

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)

    def line(self, step: int) -> str:
        sps = self.sps(step)
        done = step / self.total_steps
        ret = f"{sum(self.recent_returns) / len(self.recent_returns):.1f}" if self.recent_returns else "-"
        left = format_duration((self.total_steps - step) / sps) if sps > 0 else "-"
        return (
            f"{self.label}{step:,}/{self.total_steps:,} steps ({done:.0%}) | {sps:,.0f} SPS | "
            f"return {ret} (last {len(self.recent_returns)}) | {left} left"
        )

    def update(self, step: int) -> None:
        now = time.perf_counter()
        if now - self.last_print < self.interval:
            return
        self.last_print = now
        if self.is_tty:
            self.stream.write("\r\033[K" + self.line(step))
        else:
            self.stream.write(self.line(step) + "\n")
        self.stream.flush()

    def close(self, step: int) -> None:
        self.stream.write(("\r\033[K" if self.is_tty else "") + self.line(step) + "\n")
        self.stream.flush()
