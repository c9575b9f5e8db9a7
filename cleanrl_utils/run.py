"""A training run's bookkeeping: everything a script does that changes nothing its agent learns.

    run = Run(args, __file__)           # seed, device, --resume check, run directory, SIGTERM/SIGINT
    ...build envs and networks; if run.checkpoint: load what training_state() saved...
    run.begin(training_state)           # what a checkpoint holds; resumed: the RNGs are restored
    for ...:
        run.log_episodes(global_step, infos)             # charts/episodic_return, _length
        run.log(global_step, {"losses/td_loss": loss})   # one host read; a non-finite loss stops the run
        run.end_iteration(global_step)                   # checkpoint when due; SIGTERM: checkpoint, exit 0
    run.finish(global_step, evaluate, agent=agent.state_dict(), ...)   # --save-model: save, reload, evaluate

A script's identity is its file (`Run(args, __file__)`): a copy under a new name, or any
--exp-name, saves, evaluates and resumes its own models and checkpoints, and a file saved by
another script is refused in one line naming that script.

Every run writes to runs/{env_id}__{exp_name}__{seed}__{unix_time}/: TensorBoard events,
the hyperparameters (a Markdown table in TensorBoard's text tab and args.json), checkpoints,
the saved model and videos, and at the very end finished.json (how the benchmark runner tells a
finished run from one that was killed). With --track a W&B run mirrors it (offline without a key or server).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import netrc
import os
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.checkpoint import (
    CHECKPOINT_NAME,
    MODEL_SUFFIX,
    StopSignal,
    load_checkpoint,
    remove_stale_temporary_files,
    restore_rng_state,
    save_checkpoint,
    save_model,
)
from cleanrl_utils.errors import fail
from cleanrl_utils.progress import Progress
from cleanrl_utils.results import FINISHED_NAME

RUNS_ROOT = Path("runs")


def claim_run_dir(args) -> Path:
    """A new folder runs/{env_id}__{exp_name}__{seed}__{unix_time} that no other run writes to. mkdir is atomic, so
    of two runs started in the same second with the same env, exp-name and seed, the second takes the next free
    second's name instead of sharing the first one's folder."""
    env_name = args.env_id.replace("/", "-")  # ids such as "ALE/Breakout-v5" must not create nested folders
    stamp = int(time.time())
    while True:
        run_dir = RUNS_ROOT / f"{env_name}__{args.exp_name}__{args.seed}__{stamp}"
        try:
            run_dir.mkdir(parents=True)  # raises if the folder exists, even when another process made it just now
            return run_dir
        except FileExistsError:
            stamp += 1


def hyperparameter_table(config: dict) -> str:
    rows = "\n".join(f"|{key}|{value}|" for key, value in config.items())
    return f"|param|value|\n|-|-|\n{rows}"


def import_dynamo_with_gc_paused() -> None:
    """Import torch._dynamo now, with the garbage collector paused. Every script pays this import anyway: torch.optim
    runs `import torch._dynamo` when an optimizer is built and in every step() (torch 2.15: the torch._disable_dynamo
    wrapper on Optimizer.add_param_group, _use_grad_for_differentiable on step), ~1.3 s CPU here. Paused, the
    collector skips its full passes over the ~100k objects the import creates: 1.33 -> 1.06 s CPU for that import,
    a whole 512-step ppo.py 5.16 -> 4.63 s CPU, +7 MB peak (medians of 5 alternated; benchmark/results/speed.md,
    "Start-up"). Called before seeding, so it cannot shift a seeded random stream. Torch before 2.0 (Isaac Gym's
    Python 3.8 environments) has no torch._dynamo: nothing to import."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import torch._dynamo  # noqa: F401
    except ModuleNotFoundError:
        pass
    finally:
        if was_enabled:
            gc.enable()


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    """Seed python, numpy and torch (the environments and their action spaces are seeded by the script)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


class Run:
    """A training run: its directory, TensorBoard writer and optional W&B run, the checkpoint it
    resumes from, the console progress line, and the checkpoint schedule.

    `script` is the training script's `__file__`; its stem names the algorithm in every saved
    model and checkpoint. `run_dir` and `purge_step` are for tools that log a run of their own
    (benchmark/random_policy.py); a training script passes neither.

    `writes=False` makes a Run that writes nothing (the processes of a distributed run other than rank 0): it
    seeds, picks the device, reads --resume's checkpoint and catches SIGTERM/SIGINT like any Run, reads what
    `log` is given (a non-finite loss stops it too), and calls `training_state()` whenever a checkpoint is due,
    so that state gathered from every process is gathered on all of them, but it has no run directory, no
    TensorBoard writer, no W&B run, no console line, and saves no checkpoint or model.
    """

    def __init__(self, args, script: str | os.PathLike, run_dir: Path | None = None, writes: bool = True):
        self.writes = writes
        self.args = args
        self.script = Path(script).resolve()
        self.checkpoint = (
            load_checkpoint(args.resume, args, self.script.stem) if getattr(args, "resume", None) else None
        )
        self.stop = StopSignal()  # from here on, SIGTERM/SIGINT lead to a checkpoint and a clean exit
        import_dynamo_with_gc_paused()
        seed_everything(args.seed, getattr(args, "torch_deterministic", True))
        if getattr(args, "torch_threads", 0):
            torch.set_num_threads(args.torch_threads)
        self.device = torch.device("cuda" if getattr(args, "cuda", False) and torch.cuda.is_available() else "cpu")

        resumed = self.checkpoint is not None
        self.start_step = self.checkpoint["global_step"] if resumed else 0
        self.training_state: Callable[[], dict] | None = None
        self.next_checkpoint = None
        self.start_time = time.time()
        self.dir = self.name = self.writer = self.wandb_run = self.progress = None
        if not writes:
            return
        if resumed:
            self.dir = Path(args.resume).parent
        elif run_dir is not None:
            self.dir = Path(run_dir)
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            self.dir = claim_run_dir(args)
        self.name = self.dir.name
        if resumed:
            remove_stale_temporary_files(args.resume)  # a kill in the middle of a checkpoint write leaves one
        config = dataclasses.asdict(args)
        (self.dir / "args.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        wandb_id = self.checkpoint.get("wandb_id") if resumed else None
        self.wandb_run = start_wandb(args, self.name, self.dir, wandb_id) if getattr(args, "track", False) else None
        # Resuming: TensorBoard drops the events a killed run wrote after its last checkpoint,
        # so the resumed curve continues without duplicates.
        self.writer = SummaryWriter(str(self.dir), purge_step=self.start_step + 1 if resumed else None)
        if not resumed:
            self.writer.add_text("hyperparameters", hyperparameter_table(config))
        self.progress = Progress(
            args.total_timesteps, start_step=self.start_step, label=f"{args.env_id} {args.exp_name}"
        )

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def begin(self, training_state: Callable[[], dict]) -> None:
        """Start the training loop. `training_state()` returns everything a checkpoint holds
        (networks, optimisers, buffers, environments, counters, with "global_step"); a resumed
        run has read it back from `run.checkpoint`. Resuming, the random number generators are
        restored here, after the set-up that drew from them. Starts the clock of charts/SPS and of the console line."""
        self.training_state = training_state
        if self.checkpoint is not None:
            restore_rng_state(self.checkpoint["rng"])
        every = self.args.checkpoint_every
        self.next_checkpoint = (self.start_step // every + 1) * every if every else None
        self.start_time = time.time()
        if self.progress is not None:
            self.progress.start_time = time.perf_counter()  # the console SPS also counts from here

    def write_checkpoint(self) -> Path | None:
        if not self.writes:
            self.training_state()  # a state gathered from several processes needs every one of them
            return None
        self.writer.flush()  # events up to the checkpoint must be on disk: a resumed run purges the later ones
        path = self.dir / CHECKPOINT_NAME
        save_checkpoint(path, self.args, self.script.stem, wandb_id=self.wandb_id, **self.training_state())
        return path

    def log(self, step: int, scalars: dict) -> dict[str, float]:
        """Write `scalars` (tensors or numbers) at `step` with one device-to-host read, plus charts/SPS, and
        redraw the progress line. A non-finite loss (a key whose last part names a loss: losses/td_loss, not
        losses/explained_variance) writes a checkpoint and stops the run in one line. Returns the values read."""
        names = list(scalars)
        tensors = [v for v in scalars.values() if isinstance(v, torch.Tensor)]
        read = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist() if tensors else [])
        values = {k: next(read) if isinstance(v, torch.Tensor) else float(v) for k, v in zip(names, scalars.values())}
        if self.writes:
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)
            self.writer.add_scalar(
                "charts/SPS", int((step - self.start_step) / max(time.time() - self.start_time, 1e-9)), step
            )
            self.log_peak_memory(step)
            self.progress.update(step)
        for name, value in values.items():
            if "loss" in name.rsplit("/", 1)[-1] and not math.isfinite(value):  # losses/td_loss, not losses/entropy
                path = self.write_checkpoint()
                fail(f"{name} is {value} at step {step}" + (f"; checkpoint written to {path}" if path else ""))
        return values

    def log_peak_memory(self, step: int) -> None:
        """perf/peak_memory_gb: the process's peak resident memory so far (host); perf/peak_gpu_memory_gb: the peak
        allocated by torch on the GPU, when one is used."""
        self.writer.add_scalar("perf/peak_memory_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, step)
        if self.device.type == "cuda":
            self.writer.add_scalar("perf/peak_gpu_memory_gb", torch.cuda.max_memory_allocated(self.device) / 1e9, step)

    def log_episodes(self, step: int, infos: dict | None = None, returns=None, lengths=None) -> None:
        """charts/episodic_return and charts/episodic_length of the episodes that just ended:
        from gymnasium's RecordEpisodeStatistics `infos`, or given as `returns` and `lengths`."""
        if not self.writes:
            return
        if infos is not None:
            if "episode" not in infos:
                return
            finished = infos["_episode"]
            returns, lengths = infos["episode"]["r"][finished], infos["episode"]["l"][finished]
        returns, lengths = np.asarray(returns, dtype=np.float64), np.asarray(lengths)
        for episodic_return, episodic_length in zip(returns.tolist(), lengths.tolist()):
            self.writer.add_scalar("charts/episodic_return", episodic_return, step)
            self.writer.add_scalar("charts/episodic_length", episodic_length, step)
        self.progress.add_returns(returns)

    def end_iteration(self, step: int, stop: bool | None = None) -> None:
        """Write a checkpoint when --checkpoint-every steps have passed since the last one, or
        when SIGTERM/SIGINT arrived; after a signal, close the run and exit with code 0. `stop`, when given,
        replaces this process's own signal flag: the processes of a distributed run pass the one they agreed on
        (true when any of them was signalled), so that all of them checkpoint and exit at the same step."""
        stop = bool(self.stop) if stop is None else stop
        due = self.next_checkpoint is not None and step >= self.next_checkpoint
        if not (stop or due):
            return
        path = self.write_checkpoint()
        if self.next_checkpoint is not None:
            self.next_checkpoint = (step // self.args.checkpoint_every + 1) * self.args.checkpoint_every
        if stop:
            if self.writes:
                signal_name = self.stop.received or "SIGTERM/SIGINT on another process"
                print(f"\n{signal_name}: checkpoint written to {path}; continue with --resume {path}", flush=True)
            self.close()
            raise SystemExit(0)

    def finish(self, step: int, evaluate: Callable | None = None, **model) -> None:
        """End the run. With --save-model, save `model` (state dicts and whatever the script's
        evaluate() needs to rebuild it) as <exp_name>.cleanrl_model, reload it with `evaluate`
        and log the returns of --eval-episodes episodes as eval/episodic_return (their mean printed). Last, write
        finished.json into the run directory and print where the run was written. A Run that writes nothing does
        nothing here."""
        if not self.writes:
            return
        self.progress.close(step)
        if self.args.save_model:
            model_path = self.dir / f"{self.args.exp_name}{MODEL_SUFFIX}"
            save_model(model_path, self.args, self.script, **model)
            print(f"model saved to {model_path}")
            if evaluate is not None:
                returns = evaluate(
                    model_path,
                    self.args.eval_episodes,
                    self.device,
                    seed=self.args.seed + 1_000,
                    capture_video=self.args.capture_video,
                    video_dir=self.dir / "videos" / "eval",
                )
                for idx, episodic_return in enumerate(returns):
                    self.writer.add_scalar("eval/episodic_return", episodic_return, idx)
                print(f"evaluation over {len(returns)} episodes: {np.mean(returns):.2f} +- {np.std(returns):.2f}")
        self.close()
        (self.dir / FINISHED_NAME).write_text(json.dumps({"global_step": step, "finished": time.time()}) + "\n")
        where = os.path.relpath(self.dir) if not os.path.relpath(self.dir).startswith("..") else str(self.dir)
        print(f"run written to {where}; its curves: tensorboard --logdir {os.path.dirname(where) or '.'}", flush=True)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def has_wandb_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def start_wandb(args, run_name: str, run_dir: Path, wandb_id: str | None):
    """Start a W&B run that mirrors TensorBoard. Without an API key or a reachable server it
    says so in one line and logs offline (sync later with `wandb sync`); it never hangs:
    the connection attempt is bounded by `init_timeout`."""
    import wandb

    init = dict(
        project=args.wandb_project_name,
        entity=args.wandb_entity,
        name=run_name,
        id=wandb_id,
        resume="allow",
        config=dataclasses.asdict(args),
        sync_tensorboard=True,
        save_code=True,
        dir=str(run_dir),
    )
    mode = os.environ.get("WANDB_MODE") or "online"
    if mode == "online" and not has_wandb_api_key():
        print(
            f"wandb: no API key found, logging offline to {run_dir}/wandb (upload later with `wandb sync`)", flush=True
        )
        mode = "offline"
    try:
        return wandb.init(mode=mode, settings=wandb.Settings(init_timeout=30), **init)
    except Exception as error:  # wandb raises several error types for an unreachable server
        if mode != "online":
            raise
        print(
            f"wandb: could not reach the server ({type(error).__name__}), logging offline to {run_dir}/wandb",
            flush=True,
        )
        return wandb.init(mode="offline", **init)
