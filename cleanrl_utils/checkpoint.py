"""Checkpoints, saved models and clean shutdown.

A checkpoint holds everything a run needs to continue: the script's own state (networks,
optimiser, counters, buffers) plus the arguments, the random number generators and, where
the simulator can be pickled, the environments. Files are written atomically (temporary file,
fsync, rename), so a crash mid-write never leaves a torn checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import signal
from pathlib import Path

import numpy as np
import torch

from cleanrl_utils.errors import fail

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


def save_atomic(obj, path: str | os.PathLike) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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


def _mujoco_state(env):
    """The integration state and random generator of a gymnasium MuJoCo env, else None.

    gymnasium's MuJoCo envs pickle as their constructor arguments (a fresh simulator at time
    0), so their physics is saved with mj_getState and put back with mj_setState."""
    base = env.unwrapped
    model, data = getattr(base, "model", None), getattr(base, "data", None)
    if model is None or data is None or not type(model).__module__.startswith("mujoco"):
        return None
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    state = np.empty(mujoco.mj_stateSize(model, spec), dtype=np.float64)
    mujoco.mj_getState(model, data, state, spec)
    return state, base.np_random.bit_generator.state


def _set_mujoco_state(env, saved) -> None:
    import mujoco

    base = env.unwrapped
    state, rng_state = saved
    mujoco.mj_setState(base.model, base.data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(base.model, base.data)
    base.np_random.bit_generator.state = rng_state


def snapshot_envs(envs, next_obs=None) -> dict | None:
    """Capture a gymnasium vector env with its simulator state and the observation the policy
    acts on next, or return None where it cannot be captured (a video recorder, a simulator
    handle that does not pickle, PyBullet).

    Wrappers (time limits, episode statistics, autoreset flags) and classic-control simulators
    are pickled whole; MuJoCo simulators are saved with mj_getState. The env factories are left
    out: they are closures, and the resumed run already has its own."""
    if any(type(env.unwrapped).__module__.startswith("pybullet_envs") for env in _sub_envs(envs)):
        return None  # PyBullet envs pickle as their constructor arguments, a fresh simulator without its state
    base = envs.unwrapped
    env_fns = getattr(base, "env_fns", None)
    try:
        if env_fns is not None:
            base.env_fns = None
        pickled = pickle.dumps(envs)
        mujoco_states = [_mujoco_state(env) for env in _sub_envs(envs)]
    except (pickle.PicklingError, TypeError, AttributeError, ValueError):
        return None
    finally:
        if env_fns is not None:
            base.env_fns = env_fns
    if isinstance(next_obs, torch.Tensor):
        next_obs = next_obs.cpu()
    return {"pickle": pickled, "mujoco": mujoco_states, "next_obs": next_obs}


def restore_envs(envs, snapshot: dict | None, next_obs=None):
    """(envs, next_obs) as at checkpoint time, replacing the freshly made `envs`; where the
    snapshot is None (the environments could not be saved), say so and keep `envs` and their
    fresh `next_obs`."""
    if snapshot is None:
        print("the environments could not be saved with the checkpoint: resuming with freshly reset ones", flush=True)
        return envs, next_obs
    restored = pickle.loads(snapshot["pickle"])
    for env, saved in zip(_sub_envs(restored), snapshot["mujoco"]):
        if saved is not None:
            _set_mujoco_state(env, saved)
    if hasattr(envs.unwrapped, "env_fns"):
        restored.unwrapped.env_fns = envs.unwrapped.env_fns
    envs.close()
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
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        fail(f"{flag} {path}: not a readable {what} ({type(error).__name__})")
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
