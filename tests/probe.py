"""Run a script's own training loop under observation, so that tests can check what the loop stored and computed.

    trace = probe_script("dqn_atari.py", flags, cwd, watch=["actions", "rewards"], at_backward=["obs_b", "q_network"],
                         final=["rb"])
    trace.steps[3]["rewards"]    # what `rewards` held when `global_step` changed for the 4th time
    trace.backward[0]["obs_b"]   # what `obs_b` held when the first loss's backward() was called
    trace.backward[0]["grads"]["q_network"]  # with grads=["q_network"]: its parameters' .grad after that backward()
    trace.final["rb"]            # the replay buffer as the run left it

The script runs unchanged, as `python cleanrl/<script> <flags>` would run it, in a process of its own (this file is
that process's driver: `python tests/probe.py SPEC`, forked from the test worker's zygote, see tests/conftest.py;
with `nproc`, torchrun starts that many of them, the ranks of one distributed run, each observed and saved on its
own). Two observers are installed before it starts:

- `watch`: a line tracer on the script's frames (the module-level main block, and functions named in `functions`)
  copies the watched names every time the step counter (`step_name`, by default `global_step`) takes a new value:
  one entry per step of the loop, taken at the first line after the counter moved, with the counter's value under
  "step". A script that counts its steps at the top of its loop body shows there the previous step's values.
- `at_backward`: `torch.Tensor.backward` and `torch.autograd.backward` are wrapped; at each call the named variables
  are copied from the script's innermost frame that has them, with the loss itself (key "loss") and the innermost
  script function calling backward (key "where"). A dotted name copies an attribute of a local (`rb.tree.nodes`,
  `q_network.value.0.eps_in`: what a state dict leaves out, such as a noisy layer's non-persistent noise buffers).
- `grads`: names found as `at_backward` finds them, read right after that backward() returned: a module's
  parameters' `.grad` by parameter name (None where a parameter got no gradient), a tensor's `.grad`, a list of
  tensors' (an optimiser's parameters) element-wise; under entry["grads"][name]. What the loss did to the gradients,
  before any clipping or optimiser step: tests compare it with a reference loss's gradient (tests/update_reference.py).

Copies: tensors detached and moved to the CPU (dtype kept), numpy arrays copied, nn.Modules and objects with a
state_dict() as their state dicts, other objects as copies of their attributes (`vars`), containers element-wise.
`final` names are copied from the module's globals when the script ends, however it ends (exit code in
`trace.returncode`). Nothing here changes what the script computes: the observers only read.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Trace:
    returncode: int
    stdout: str
    stderr: str
    steps: list  # one dict per change of the step counter: "step" and the watched names
    backward: list  # one dict per backward() call: "loss", "where", "step" and the names asked for
    final: dict  # name -> value at the end
    ranks: list = dataclasses.field(default_factory=list)  # with nproc (torchrun): every rank's Trace, rank 0's first


def probe_script(
    script: str,
    flags: list[str] | tuple[str, ...],
    cwd: Path,
    *,
    watch: list[str] | tuple[str, ...] = (),
    at_backward: list[str] | tuple[str, ...] = (),
    grads: list[str] | tuple[str, ...] = (),
    final: list[str] | tuple[str, ...] = (),
    functions: list[str] | tuple[str, ...] = (),
    step_name: str = "global_step",
    preload: list[str] | tuple[str, ...] = (),
    env: dict | None = None,
    timeout: float = 300,
    check: bool = True,
    nproc: int = 0,
) -> Trace:
    """Run cleanrl/<script> with `flags` in `cwd` under the observers above and return what they saw. `preload`:
    modules (from tests/) imported first in the script's process, e.g. one that registers a test environment.
    `nproc` > 0: run it under torchrun (--standalone) as that many ranks, each observed alike; the Trace returned is
    rank 0's, and its `ranks` holds every rank's."""
    import torch
    from conftest import run_python, script_env

    with tempfile.TemporaryDirectory() as scratch:
        spec = dict(
            script=str(ROOT / "cleanrl" / script),
            argv=list(flags),
            watch=list(watch),
            at_backward=list(at_backward),
            grads=list(grads),
            final=list(final),
            functions=list(functions),
            step_name=step_name,
            preload=list(preload),
            output=str(Path(scratch) / "trace.pt"),
            per_rank=nproc > 0,
        )
        spec_path = Path(scratch) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        if nproc:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
            result = subprocess.run(
                [*launcher, str(Path(__file__).resolve()), str(spec_path)],
                cwd=cwd,
                env=env or script_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        else:
            result = run_python(Path(__file__).resolve(), str(spec_path), cwd=cwd, env=env, timeout=timeout)
        if check:
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        outputs = [f"{spec['output']}.{rank}" for rank in range(nproc)] if nproc else [spec["output"]]
        traces = []
        for output in outputs:
            saved = torch.load(output, weights_only=False) if Path(output).exists() else {}
            traces.append(
                Trace(
                    returncode=result.returncode,
                    stdout=result.stdout,
                    stderr=result.stderr,
                    steps=saved.get("steps", []),
                    backward=saved.get("backward", []),
                    final=saved.get("final", {}),
                )
            )
    return dataclasses.replace(traces[0], ranks=traces) if nproc else traces[0]


def copy_value(value, depth: int = 0):
    """A copy of `value` that survives the script: see the module docstring."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (bool, int, float, str, bytes, type(None), np.generic)):
        return value
    if depth > 4:
        return repr(value)
    if isinstance(value, dict):
        return {key: copy_value(item, depth + 1) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple: its fields by name
        return {name: copy_value(item, depth + 1) for name, item in zip(value._fields, value)}
    if isinstance(value, (list, tuple)):
        return type(value)(copy_value(item, depth + 1) for item in value)
    if callable(getattr(value, "state_dict", None)):
        try:
            return copy_value(value.state_dict(), depth + 1)
        except Exception:  # a state_dict that needs arguments or a live resource: fall back to the attributes
            pass
    if hasattr(value, "__dict__"):
        return {"__class__": type(value).__name__} | {
            key: copy_value(item, depth + 1) for key, item in vars(value).items() if not key.startswith("__")
        }
    try:
        return copy.deepcopy(value)
    except Exception:
        return repr(value)


def drive(spec_path: str) -> None:
    """The subprocess: install the observers, run the script as __main__, save what was seen."""
    import runpy
    import threading

    import torch

    spec = json.loads(Path(spec_path).read_text())
    script = os.path.realpath(spec["script"])
    watch, at_backward, functions = spec["watch"], spec["at_backward"], {"<module>", *spec["functions"]}
    grads = spec.get("grads", [])
    step_name = spec["step_name"]
    seen = {"steps": [], "backward": []}
    last_step = {}  # the step counter's value at the last entry
    module_globals = {}

    @functools.lru_cache(maxsize=None)
    def is_script(filename: str) -> bool:  # realpath makes system calls: once per file name, not at every call event
        return os.path.realpath(filename) == script

    def current_step(frame):
        while frame is not None:
            if is_script(frame.f_code.co_filename) and step_name in frame.f_globals:
                return frame.f_globals[step_name]
            frame = frame.f_back
        return None

    def record_watched(frame) -> None:
        names = frame.f_locals
        if step_name not in names:
            return
        step = names[step_name]
        if "value" in last_step and last_step["value"] == step:
            return
        last_step["value"] = copy_value(step)
        seen["steps"].append({"step": last_step["value"]} | {n: copy_value(names[n]) for n in watch if n in names})

    def local_tracer(frame, event, arg):
        if event in ("line", "return"):
            record_watched(frame)
        return local_tracer

    def global_tracer(frame, event, arg):
        if not is_script(frame.f_code.co_filename):
            return None
        if frame.f_code.co_name == "<module>":
            module_globals["globals"] = frame.f_globals
        return local_tracer if watch and frame.f_code.co_name in functions else None

    def script_frames():
        frame = sys._getframe(2)
        while frame is not None:
            if is_script(frame.f_code.co_filename):
                yield frame
            frame = frame.f_back

    def find(name: str, frames: list):
        """The value of `name` (a local, or a dotted attribute of one) in the innermost frame holding it; a
        sentinel when none does."""
        head, *attributes = name.split(".")
        for frame in frames:
            if head in frame.f_locals:
                value = frame.f_locals[head]
                for attribute in attributes:  # a dotted name: an attribute of a local
                    value = getattr(value, attribute, None)
                return value
        return missing

    missing = object()

    def record_backward(loss):
        """The entry of this backward() call, and the objects whose gradients are read after it (or None)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        frames = list(script_frames())
        if not frames:
            return None
        entry = {"loss": copy_value(loss), "where": frames[0].f_code.co_name, "step": current_step(frames[0])}
        for name in at_backward:
            value = find(name, frames)
            if value is not missing:
                entry[name] = copy_value(value)
        seen["backward"].append(entry)
        return entry, {name: value for name in grads if (value := find(name, frames)) is not missing}

    def gradient_of(value):
        """What backward() left in `value`'s gradients: see the module docstring."""
        if isinstance(value, torch.nn.Module):
            return {name: copy_value(p.grad) for name, p in value.named_parameters()}
        if isinstance(value, torch.Tensor):
            return copy_value(value.grad)
        if isinstance(value, (list, tuple)):
            return [gradient_of(item) for item in value]
        if isinstance(value, torch.optim.Optimizer):
            return [[copy_value(p.grad) for p in group["params"]] for group in value.param_groups]
        return None

    tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward
    inside = []  # Tensor.backward calls torch.autograd.backward: record the outer call only

    def observed(backward):
        def observed_backward(loss, *args, **kwargs):
            recorded = None if inside else record_backward(loss)
            inside.append(True)
            try:
                result = backward(loss, *args, **kwargs)
            finally:
                inside.pop()
            if recorded is not None and recorded[1]:
                entry, holders = recorded
                entry["grads"] = {name: gradient_of(value) for name, value in holders.items()}
            return result

        return observed_backward

    observed_tensor_backward, observed_autograd_backward = observed(tensor_backward), observed(autograd_backward)

    torch.Tensor.backward = observed_tensor_backward
    torch.autograd.backward = observed_autograd_backward

    def save() -> None:
        found = module_globals.get("globals", {})
        seen["final"] = {name: copy_value(found[name]) for name in spec["final"] if name in found}
        torch.save(seen, spec["output"] + (f".{os.environ['RANK']}" if spec.get("per_rank") else ""))

    for module in spec.get("preload", []):  # tests/ is this driver's folder, first on sys.path
        importlib.import_module(module)
    sys.argv = [script, *spec["argv"]]
    sys.path.insert(0, os.path.dirname(script))
    code = 0
    sys.settrace(global_tracer)
    threading.settrace(global_tracer)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.settrace(None)
        threading.settrace(None)
        save()
    sys.stdout.flush()
    os._exit(code)  # as the script would have exited, without waiting for its environments' worker threads


if __name__ == "__main__":
    drive(sys.argv[1])
