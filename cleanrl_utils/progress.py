"""A live console line for long work: steps done of total, SPS, recent return, time left.

tqdm does the display: `tqdm.format_meter` fills the line (percentage, rate, time left as [H:]MM:SS, trimmed to the
terminal's width) and, on a terminal, `tqdm.status_printer` redraws it in place about twice a second. In a log file
(not a tty) it writes a new plain line every `log_interval` seconds instead, never a carriage return, so it can be
left on and `tail` of a log stays readable.

Why not a tqdm bar object: its printer always redraws with a carriage return (what a log file must not get), its
clock starts when it is made while the run's SPS counts from `Run.begin` (which sets `start_time`), and it starts a
monitor thread inside the training process.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque

from tqdm import tqdm

# The step count is ours ({steps}), not tqdm's {n}: format_meter drops the total (and this format) once n passes it,
# and a run may end a few steps past its total (the last batch of environment steps).
LINE_FORMAT = "{desc}{steps}/{total:,} steps ({percentage:.0f}%) | {rate_noinv:,.0f} SPS | {recent} | {remaining} left"


class Progress:
    def __init__(self, total_steps: int, start_step: int = 0, label: str = "", log_interval: float = 30.0, stream=None):
        self.total_steps = total_steps
        self.start_step = start_step  # a resumed run counts its SPS from the step it resumed at
        self.label = f"{label} | " if label else ""
        self.stream = stream if stream is not None else sys.stdout
        self.is_tty = self.stream.isatty()
        self.interval = 0.5 if self.is_tty else log_interval
        self.print_status = tqdm.status_printer(self.stream) if self.is_tty else None
        self.start_time = time.perf_counter()
        self.last_print = -float("inf")
        self.recent_returns: deque[float] = deque(maxlen=100)

    def add_returns(self, returns) -> None:
        self.recent_returns.extend(float(r) for r in returns)

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)

    def width(self) -> int | None:
        """The terminal's width less one (a line that fills it would wrap), None in a log file (no trimming)."""
        if not self.is_tty:
            return None
        try:
            return os.get_terminal_size(self.stream.fileno()).columns - 1
        except (AttributeError, OSError, ValueError):  # no file descriptor, or not a terminal after all
            return None

    def line(self, step: int) -> str:
        count = len(self.recent_returns)
        recent = f"return {sum(self.recent_returns) / count:.1f} (last {count})" if count else "return - (last 0)"
        return tqdm.format_meter(
            min(step, self.total_steps),
            self.total_steps,
            time.perf_counter() - self.start_time,
            ncols=self.width(),
            prefix=self.label,
            rate=self.sps(step),
            bar_format=LINE_FORMAT,
            steps=f"{step:,}",
            recent=recent,
        )

    def update(self, step: int) -> None:
        now = time.perf_counter()
        if now - self.last_print < self.interval:
            return
        self.last_print = now
        self.write(step, final=False)

    def close(self, step: int) -> None:
        self.write(step, final=True)

    def write(self, step: int, final: bool) -> None:
        try:
            if self.is_tty:
                self.print_status(self.line(step))  # "\r" + the line, padded over the previous one; flushes
                if final:
                    self.stream.write("\n")
            else:
                self.stream.write(self.line(step) + "\n")
            self.stream.flush()
        except BrokenPipeError:
            # Whatever read this output is gone (`| head`, a runner killed alone): the run goes on to its end or its
            # checkpoint, and what it prints from now on goes to /dev/null instead of raising.
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
