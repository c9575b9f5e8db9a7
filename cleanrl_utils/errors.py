"""Bad input ends a run with one clear line on stderr and a non-zero exit, before any work."""

from __future__ import annotations

import difflib
import os
import sys
from typing import NoReturn

EXIT_BAD_INPUT = 2
# A run that stopped for a reason outside its command (a full disk): the same command can succeed once that is fixed,
# so tools that retry (the benchmark runner) tell it from bad input, which fails again however often it is rerun.
EXIT_RUN_STOPPED = 1


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `error: message` to stderr and exit with `code`, 2 (bad input) unless told (no traceback)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def check_positive(**values: float) -> None:
    """Fail on the first argument that is not > 0, naming it as a command-line flag."""
    for name, value in values.items():
        if not value > 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {value}")


def nearest_ids(env_id: str, known) -> list[str]:
    """Up to three of the `known` ids closest to `env_id`, compared case-insensitively so that "cartpole-v1" still
    finds "CartPole-v1"."""
    lowered = {k.lower(): k for k in known}
    return [lowered[k] for k in difflib.get_close_matches(env_id.lower(), list(lowered), n=3, cutoff=0.5)]


def check_env_id(env_id: str) -> None:
    """Fail with the nearest registered ids when gymnasium does not know `env_id`."""
    import gymnasium as gym

    if env_id in gym.registry:
        return
    near = nearest_ids(env_id, gym.registry.keys())
    hint = f"; did you mean {', '.join(near)}?" if near else "; see gymnasium.registry for the known ids"
    fail(f"unknown environment id {env_id!r}{hint}")


def available_memory(device) -> int:
    """Bytes that can still be allocated on `device`: free GPU memory, or the host's MemAvailable."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(nbytes: int, device, what: str, flag: str) -> None:
    """Fail before allocating `what` of `nbytes` when `device` has less memory available."""
    free = available_memory(device)
    if nbytes > free:
        fail(
            f"{flag}: the {what} needs {nbytes / 1e9:.1f} GB but {device} has {free / 1e9:.1f} GB available; "
            f"lower {flag}"
        )
