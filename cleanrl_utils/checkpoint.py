"""Checkpoints, saved models and clean shutdown.

A checkpoint holds everything a run needs to continue: the script's own state (networks,
optimiser, counters, buffers) plus the arguments, the random number generators and, where
the simulator allows it, the environments. Files are written atomically (temporary file,
fsync, rename), so a crash mid-write never leaves a torn checkpoint (tests/test_fault_injection.py
kills runs at 52 moments, most inside writes); the resume removes the temporary file such a crash
left. A full disk stops the run in one line with exit code 1, the previous checkpoint whole.

What a resumed CPU run gets, per environment family (tests/test_resume_families.py):
- classic control, PointChasing-v0 (single and batched), MinAtar: pickled whole; exact.
- gymnasium MuJoCo v5 (all eleven tasks): mjSTATE_INTEGRATION plus xpos and xipos, which mj_step
  leaves one substep behind and Ant's and Humanoid's rewards read before stepping (LAGGING_ARRAYS),
  about 1-2.5 kB an environment instead of 0.2-0.8 MB for a pickled MjData; exact.
- dm_control suite tasks (through shimmy): the integration state and the model arrays that a task may
  change at a reset (targets, terrain), 30-280 kB, instead of 12-74 MB with the textures and meshes;
  the task's random state and step count are pickled with it; exact.
- MuJoCo Warp (cleanrl/ppo_isaacgym.py) saves its own state_dict (simulator state, the position the
  next forward reward starts from, counters, reset generator); exact on the CPU.
- Freshly reset environments, said in one line at the resume, where the state cannot be saved: video
  recording (RecordVideo holds a lambda trigger and the frames of the video being recorded), PyBullet
  (its envs pickle as constructor arguments, a new simulator; its state lives in the physics server),
  dm_control composer tasks (locomotion, manipulation: their physics is recompiled from the MJCF scene
  at every reset), ALE's vector env, envpool and Isaac Gym (native handles without a state interface).
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import importlib.util
import inspect
import io
import os
import pickle
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from cleanrl_utils.errors import EXIT_RUN_STOPPED, fail

CHECKPOINT_FORMAT = "cleanrl-checkpoint-v2"
MODEL_FORMAT = "cleanrl-model-v2"
CHECKPOINT_NAME = "checkpoint.pt"
MODEL_SUFFIX = ".cleanrl_model"

# Arguments that may differ between a run and its resumption: they change how the run is
# observed or stored, not what it computes.
OPERATIONAL_ARGS = {
    "resume",
    "checkpoint_every",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "save_model",
    "cuda",
    "torch_threads",
    "eval_episodes",
}

# Checkpoints hold pickled objects, not only weights: torch >= 2.6 must be told (weights_only=False), and torch
# < 1.13 (Isaac Gym's Python 3.8 environments) has no weights_only and always unpickles.
FULL_UNPICKLING = {"weights_only": False} if "weights_only" in inspect.signature(torch.load).parameters else {}


def temporary_path(path: str | os.PathLike, pid: int | str | None = None) -> Path:
    """Where save_atomic writes `path` before renaming it: .NAME.PID.tmp beside it; pid "*" is a glob of them all."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid() if pid is None else pid}.tmp")


def remove_stale_temporary_files(path: str | os.PathLike) -> None:
    """Delete what a process killed in the middle of writing `path` left beside it (the file itself, written by
    rename only, is always whole)."""
    for stale in Path(path).parent.glob(temporary_path(path, "*").name):
        stale.unlink(missing_ok=True)


class _KeepWriteError:
    """The file torch.save writes to, keeping the OSError of a failed write: torch reports it as a RuntimeError
    without the errno ("unexpected pos ...")."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()


def without_spare_storage(obj):
    """`obj` with every tensor that views less than half of its storage replaced by a copy of its own elements, inside
    dicts, lists and tuples (their types and attributes kept: a state_dict's _metadata). torch.save writes a tensor's
    whole storage, so the filled rows of a replay buffer, sliced on the CPU, would carry every empty row with them
    (100 rows of a 1M x 10 float buffer: 40 MB instead of 4 kB). Past half full the view is written as it is: the
    copy would then cost more memory than it saves on disk (an Atari buffer's frames are gigabytes)."""
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "untyped_storage"):
            storage_bytes = obj.untyped_storage().nbytes()
        else:  # torch < 2.0 (the Isaac Gym environment's 1.12): only the typed storage, its size in elements
            storage_bytes = obj.storage().size() * obj.element_size()
        mostly_spare = 2 * obj.numel() * obj.element_size() < storage_bytes
        return obj.clone() if mostly_spare else obj
    if isinstance(obj, (dict, list, tuple)):
        items = list(obj.items() if isinstance(obj, dict) else enumerate(obj))
        compacted = {key: without_spare_storage(value) for key, value in items}
        if all(compacted[key] is value for key, value in items):
            return obj
        if isinstance(obj, dict):
            copied = copy.copy(obj)  # keeps the mapping's type and attributes (OrderedDict, a state_dict's _metadata)
            copied.update(compacted)
            return copied
        values = [compacted[i] for i in range(len(obj))]
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)  # namedtuples too
    return obj


def save_atomic(obj, path: str | os.PathLike) -> None:
    """Write `obj` to `path` so that `path` is always whole: into a temporary file beside it, fsync, rename over it,
    fsync the folder. A full disk (or quota) stops the run in one line, exit code 1, with the temporary file removed
    and the previous `path`, if any, untouched. Views of larger storages are written as copies of their elements
    (without_spare_storage)."""
    obj = without_spare_storage(obj)
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            file = _KeepWriteError(f)
            try:
                torch.save(obj, file)
            except RuntimeError:
                if file.error is None:
                    raise
                raise file.error from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            if not path.exists():
                state = f"no {path.name} was written; free some space and run again"
            elif path.name == CHECKPOINT_NAME:
                state = f"the previous {path.name} is whole: free some space, then continue with --resume {path}"
            else:
                state = f"the previous {path.name} is whole; free some space and run again"
            fail(f"the disk is full ({error.strerror}) writing {path}; {state}", code=EXIT_RUN_STOPPED)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sub_envs(envs) -> list:
    return list(getattr(envs.unwrapped, "envs", []))


# mj_step leaves the position-dependent arrays at the start of its last substep; these two are read before a step by
# the v5 rewards (Ant's torso xpos, Humanoid's centre of mass from xipos), so they are saved as they are, not
# recomputed from qpos. Every other array a task reads is recomputed by the step before it is read.
LAGGING_ARRAYS = ("xpos", "xipos")
# dm_control tasks change their model at a reset (target positions, sizes, colours, damping, terrain); a snapshot
# holds every model array but the asset data, which no task changes (textures alone are ~12 MB per environment).
ASSET_PREFIXES = ("tex_", "mesh_", "bvh_", "skin_", "oct_", "names", "paths")


def _simulator(env):
    """The object in a sub-env that holds a MuJoCo simulation: a gymnasium MujocoEnv, or the Physics of a dm_control
    suite task (shimmy's DmControlCompatibilityV0 holds the dm_control env in `_env`); None for other envs.
    Raises TypeError for a dm_control composer task (locomotion, manipulation), whose physics is recompiled at
    every reset from its MJCF scene, so that it cannot be put back into a freshly made one."""
    base = env.unwrapped
    model = getattr(base, "model", None)
    if model is not None and type(model).__module__.startswith("mujoco") and hasattr(base, "data"):
        return base
    inner = getattr(base, "_env", None)
    if type(inner).__module__.startswith("dm_control"):
        from dm_control.rl import control

        if not isinstance(inner, control.Environment):
            raise TypeError(f"{type(inner).__name__}: a dm_control composer environment")
        return inner.physics
    return None


def _integration_state(model, data) -> np.ndarray:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(model, spec), dtype=np.float64)
    mujoco.mj_getState(model, data, state, spec)
    return state


def _save_simulator(simulator) -> dict:
    """A simulator's state: mjSTATE_INTEGRATION (everything mj_step reads: qpos, qvel, act, warm start, controls,
    applied forces, time ...) plus, for gymnasium, the lagging arrays and the env's random generator, for
    dm_control, the model arrays (the task's random state is pickled with the task)."""
    if hasattr(simulator, "np_random"):  # gymnasium's MujocoEnv
        model, data = simulator.model, simulator.data
        lagging = {name: getattr(data, name).copy() for name in LAGGING_ARRAYS}
        return {
            "integration": _integration_state(model, data),
            **lagging,
            "rng": simulator.np_random.bit_generator.state,
        }
    model, data = simulator.model.ptr, simulator.data.ptr  # dm_control's Physics
    arrays = {}
    for name in dir(model):
        value = getattr(model, name)
        if isinstance(value, np.ndarray) and not name.startswith(("_", *ASSET_PREFIXES)):
            arrays[name] = value.copy()
    return {"integration": _integration_state(model, data), "model": arrays}


def _load_simulator(simulator, state: dict) -> None:
    import mujoco

    gymnasium_env = hasattr(simulator, "np_random")
    model, data = (simulator.model, simulator.data) if gymnasium_env else (simulator.model.ptr, simulator.data.ptr)
    for name, value in state.get("model", {}).items():
        np.copyto(getattr(model, name), value)
    mujoco.mj_setState(model, data, state["integration"], mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(model, data)
    for name in LAGGING_ARRAYS if gymnasium_env else ():
        np.copyto(getattr(data, name), state[name])
    if gymnasium_env:
        simulator.np_random.bit_generator.state = state["rng"]


class _EnvPickler(pickle.Pickler):
    """Pickles a vector env with its simulators replaced by references (their state is saved apart, small), and
    gymnasium's FlattenObservation, whose flattening function is a lambda, rebuilt from the env it wraps (it holds
    no other state)."""

    def __init__(self, file, simulators: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.simulator_index = {id(simulator): i for i, simulator in enumerate(simulators) if simulator is not None}

    def persistent_id(self, obj):
        return self.simulator_index.get(id(obj))

    def reducer_override(self, obj):
        wrappers = sys.modules.get("gymnasium.wrappers")
        if wrappers is not None and type(obj) is wrappers.FlattenObservation:
            return wrappers.FlattenObservation, (obj.env,)
        return NotImplemented


class _EnvUnpickler(pickle.Unpickler):
    def __init__(self, file, simulators: list):
        super().__init__(file)
        self.simulators = simulators

    def persistent_load(self, index):
        return self.simulators[index]


def snapshot_envs(envs, next_obs=None) -> dict | None:
    """Capture a gymnasium vector env with its simulator state and the observation the policy
    acts on next, or return None where it cannot be captured (a video recorder, a simulator
    handle that does not pickle, PyBullet, a dm_control composer task).

    Wrappers (time limits, episode statistics, autoreset flags), the dm_control task (its random
    state, its episode step count) and classic-control simulators are pickled whole; a MuJoCo
    simulator (gymnasium's or dm_control's) is left out of the pickle and saved as its state
    (_save_simulator), to be put back into the freshly made envs' simulator. The env factories
    are left out too: they are closures, and the resumed run already has its own."""
    if any(type(env.unwrapped).__module__.startswith("pybullet_envs") for env in _sub_envs(envs)):
        return None  # PyBullet envs pickle as their constructor arguments, a fresh simulator without its state
    base = envs.unwrapped
    env_fns = getattr(base, "env_fns", None)
    try:
        if env_fns is not None:
            base.env_fns = None
        simulators = [_simulator(env) for env in _sub_envs(envs)]
        buffer = io.BytesIO()
        _EnvPickler(buffer, simulators).dump(envs)
    except (pickle.PicklingError, TypeError, AttributeError, ValueError):
        return None
    finally:
        if env_fns is not None:
            base.env_fns = env_fns
    states = [None if simulator is None else _save_simulator(simulator) for simulator in simulators]
    if isinstance(next_obs, torch.Tensor):
        next_obs = next_obs.cpu()
    return {"pickle": buffer.getvalue(), "simulators": states, "next_obs": next_obs}


def restore_envs(envs, snapshot: dict | None, next_obs=None):
    """(envs, next_obs) as at checkpoint time, replacing the freshly made `envs`; where the
    snapshot is None (the environments could not be saved), say so and keep `envs` and their
    fresh `next_obs`. The fresh envs' simulators are set to the saved state and reused."""
    if snapshot is None:
        print("the environments could not be saved with the checkpoint: resuming with freshly reset ones", flush=True)
        return envs, next_obs
    if "simulators" not in snapshot:  # written before the MuJoCo state held the lagging arrays
        fail(
            "--resume: the checkpoint's environments were saved in an older format that this version does not read; "
            "use the version of cleanrl that wrote it, or start a new run"
        )
    simulators = [_simulator(env) for env in _sub_envs(envs)]
    for simulator, state in zip(simulators, snapshot["simulators"]):
        if state is not None:
            _load_simulator(simulator, state)
    restored = _EnvUnpickler(io.BytesIO(snapshot["pickle"]), simulators).load()
    if hasattr(envs.unwrapped, "env_fns"):
        restored.unwrapped.env_fns = envs.unwrapped.env_fns
    if not any(state is not None for state in snapshot["simulators"]):
        envs.close()  # else dropped unclosed: closing would free the simulators that the restored envs now use
    saved_obs = snapshot["next_obs"]
    if isinstance(next_obs, torch.Tensor) and isinstance(saved_obs, torch.Tensor):
        saved_obs = saved_obs.to(next_obs.device)
    return restored, saved_obs


def save_checkpoint(path: str | os.PathLike, args, script: str, **state) -> None:
    """Write `state` with the arguments, the random number generators and the name of the
    script that wrote it (its file's stem)."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "script": script,
        "env_id": args.env_id,
        "args": dataclasses.asdict(args),
        "rng": rng_state(),
        **state,
    }
    save_atomic(payload, path)


def _read(path: str | os.PathLike, flag: str, expected_format: str, what: str) -> dict:
    path = Path(path)
    if not path.is_file():
        fail(f"{flag} {path}: no such file")
    try:
        payload = torch.load(path, map_location="cpu", **FULL_UNPICKLING)
    except Exception as error:
        fail(f"{flag} {path}: not a readable {what} ({type(error).__name__})")
    version = payload.get("format") if isinstance(payload, dict) else None
    family, current = expected_format.rsplit("-v", 1)
    if isinstance(version, str) and version.startswith(family + "-v") and version != expected_format:
        number = version.rsplit("-v", 1)[1]
        relation = "older than" if number.isdigit() and int(number) < int(current) else "not"
        fail(
            f"{flag} {path}: written in {what} format {version}, {relation} this version's {expected_format}; "
            "use the version of cleanrl that wrote it, or start a new run"
        )
    if not isinstance(payload, dict) or payload.get("format") != expected_format:
        other = "saved model" if expected_format == CHECKPOINT_FORMAT else "checkpoint"
        if isinstance(payload, dict) and payload.get("format") in (CHECKPOINT_FORMAT, MODEL_FORMAT):
            fail(f"{flag} {path}: a {other}, not a {what}")
        fail(f"{flag} {path}: not a cleanrl {what}")
    return payload


def load_checkpoint(path: str | os.PathLike, args, script: str) -> dict:
    """Read a checkpoint for `args`, failing in one line when another script wrote it, or it
    is for another environment, or for a run with other arguments (resume with the original
    command)."""
    checkpoint = _read(path, "--resume", CHECKPOINT_FORMAT, "checkpoint")
    if checkpoint.get("script") != script:
        fail(f"--resume {path}: checkpoint was written by {checkpoint.get('script')}.py, not {script}.py")
    if checkpoint["env_id"] != args.env_id:
        fail(f"--resume {path}: checkpoint is for {checkpoint['env_id']}; add --env-id {checkpoint['env_id']}")
    current = dataclasses.asdict(args)
    for key, value in checkpoint["args"].items():
        if key not in OPERATIONAL_ARGS and current.get(key) != value:
            flag = "--" + key.replace("_", "-")
            fail(
                f"--resume {path}: {flag} is {current.get(key)!r} but the checkpointed run used {value!r}; "
                "resume with the original arguments"
            )
    return checkpoint


def save_model(path: str | os.PathLike, args, script: str | os.PathLike, **payload) -> None:
    """Write a model for evaluation: `payload` plus the arguments and the script that saved it
    (its stem, which identifies it, and its path, where cleanrl_utils.evaluate finds it)."""
    script = Path(script).resolve()
    save_atomic(
        {
            "format": MODEL_FORMAT,
            "script": script.stem,
            "script_path": str(script),
            "exp_name": args.exp_name,
            "env_id": args.env_id,
            "args": dataclasses.asdict(args),
            **payload,
        },
        path,
    )


def load_model(path: str | os.PathLike, script: str | os.PathLike) -> dict:
    """Read a model saved by `script` (a script passes its __file__); a model saved by another
    script fails in one line naming it."""
    model = _read(path, "model", MODEL_FORMAT, "saved model")
    if model.get("script") != Path(script).stem:
        fail(f"model {path} was saved by {model.get('script')}.py, not {Path(script).stem}.py")
    return model


class StopSignal:
    """Turns SIGTERM and SIGINT into a flag that the training loop polls, so a preempted or
    interrupted run writes a checkpoint and exits cleanly. A second SIGINT stops at once."""

    def __init__(self):
        self.received: str | None = None
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __bool__(self) -> bool:
        return self.received is not None


# --- finding, reading and evaluating saved models (cleanrl_utils.evaluate, .hub, .backtest) -------------

SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "cleanrl"


def find_model(path: str | os.PathLike) -> Path:
    """The saved model file at `path`: the file itself, or the one *.cleanrl_model in a run directory (hf://USER/NAME:
    cleanrl_utils.hub.resolve_model_path). Fails in one line when there is none."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        fail(f"{path}: no such file or directory")
    models = sorted(path.glob(f"*{MODEL_SUFFIX}"))
    if not models:
        fail(f"{path}: no *{MODEL_SUFFIX} file in this directory (train with --save-model to write one)")
    if len(models) > 1:
        fail(f"{path}: several models ({', '.join(m.name for m in models)}); pass the file to evaluate")
    return models[0]


def read_model(path: Path) -> dict:
    """The saved model's contents; fails in one line for anything that is not a cleanrl model."""
    try:
        model = torch.load(path, map_location="cpu", **FULL_UNPICKLING)
    except Exception as error:
        fail(f"{path}: not a cleanrl saved model (cannot be read: {type(error).__name__})")
    kind = model.get("format") if isinstance(model, dict) else None
    if kind == CHECKPOINT_FORMAT:
        fail(
            f"{path}: a training checkpoint, not a saved model; continue training with --resume, "
            f"or evaluate the {MODEL_SUFFIX} file written with --save-model"
        )
    if kind != MODEL_FORMAT or not isinstance(model.get("script"), str):
        fail(f"{path}: not a cleanrl saved model (no {MODEL_FORMAT!r} format marker)")
    return model


def load_script(model: dict, scripts_dir: Path = SCRIPTS_DIR):
    """Import the script that saved `model` as a module (its training loop is guarded by __main__):
    the file it was saved from, else cleanrl/<script>.py."""
    name = model["script"]
    script = Path(model.get("script_path") or "")
    if not script.is_file():
        script = scripts_dir / f"{name}.py"
    if not script.is_file():
        fail(
            f"the model was saved by {name}.py ({model.get('script_path')}), which is no longer there, nor is {script}"
        )
    spec = importlib.util.spec_from_file_location(f"cleanrl_script_{name}", script)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as a normal import would be: dataclasses resolve string annotations
    # (`from __future__ import annotations`) through sys.modules.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        fail(f"cannot import {script}: {type(error).__name__}: {error}")
    if not callable(getattr(module, "evaluate", None)):
        fail(f"{script} has no evaluate() function, so its models cannot be evaluated here")
    return module
