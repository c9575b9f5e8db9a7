"""The run directory, its TensorBoard writer and hyperparameters, and the optional W&B run.

Every run writes to runs/{env_id}__{exp_name}__{seed}__{unix_time}/: TensorBoard events,
the hyperparameters (a Markdown table in TensorBoard's text tab and args.json), checkpoints,
the saved model and videos.
"""

from __future__ import annotations

import dataclasses
import json
import netrc
import os
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

RUNS_ROOT = Path("runs")


def make_run_name(args) -> str:
    # Ids such as "ALE/Breakout-v5" must not create nested folders.
    env_name = args.env_id.replace("/", "-")
    return f"{env_name}__{args.exp_name}__{args.seed}__{int(time.time())}"


def hyperparameter_table(config: dict) -> str:
    rows = "\n".join(f"|{key}|{value}|" for key, value in config.items())
    return f"|param|value|\n|-|-|\n{rows}"


class Run:
    """A run directory with its TensorBoard writer and, with --track, a W&B run mirroring it.

    `purge_step` is set when resuming: TensorBoard then drops the events a killed run wrote
    after its last checkpoint, so the resumed curve continues without duplicates.
    """

    def __init__(self, args, run_dir: Path | None = None, purge_step: int | None = None, wandb_id: str | None = None):
        self.dir = Path(run_dir) if run_dir is not None else RUNS_ROOT / make_run_name(args)
        self.name = self.dir.name
        self.dir.mkdir(parents=True, exist_ok=True)
        config = dataclasses.asdict(args)
        (self.dir / "args.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        self.wandb_run = start_wandb(args, self.name, self.dir, wandb_id) if args.track else None
        self.writer = SummaryWriter(str(self.dir), purge_step=purge_step)
        if purge_step is None:
            self.writer.add_text("hyperparameters", hyperparameter_table(config))

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def close(self) -> None:
        self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


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
