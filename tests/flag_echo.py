"""Test double of a training script for the tooling tests: it trains nothing.

It makes a run directory like the real scripts do, runs/{env_id}__{exp_name}__{seed}__{unix_time}/
with args.json, records the exact argv it received (argv.json), and writes the TensorBoard scalar
charts/episodic_return = X + SEED at steps 10, 20, 30, where X is its --x flag (default 0).
So a tuner's trial value tells which --x reached it, and a benchmark table of it can be computed
by hand. --sleep S waits S seconds first (to see commands overlap); --fail exits with code 3.
Only tensorboard is imported, so it starts in well under a second.
"""

import json
import sys
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    for i, word in enumerate(argv):
        if word == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(f"--{name}="):
            return word.split("=", 1)[1]
    return default


if __name__ == "__main__":
    argv = sys.argv[1:]
    started = time.time()
    if "--fail" in argv:
        print("error: asked to fail", file=sys.stderr)
        raise SystemExit(3)
    env_id, seed = flag(argv, "env-id", "CartPole-v1"), int(flag(argv, "seed", "1"))
    exp_name = flag(argv, "exp-name", "flag_echo")
    time.sleep(float(flag(argv, "sleep", "0")))
    run_dir = Path("runs") / f"{env_id.replace('/', '-')}__{exp_name}__{seed}__{int(time.time())}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "argv.json").write_text(json.dumps(argv))
    writer = EventFileWriter(str(run_dir))
    score = float(flag(argv, "x", "0")) + seed
    for step in (10, 20, 30):
        summary = Summary(value=[Summary.Value(tag="charts/episodic_return", simple_value=score)])
        writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()
    (run_dir / "args.json").write_text(
        json.dumps({"env_id": env_id, "exp_name": exp_name, "seed": seed, "started": started, "finished": time.time()})
    )
    print(f"flag_echo: {run_dir} return {score}")
