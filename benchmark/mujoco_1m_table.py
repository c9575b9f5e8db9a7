"""benchmark/results/mujoco_1m.md, .csv and .png: the 1M-step MuJoCo campaign (benchmark/mujoco_1m.sh) beside
CleanRL's published figures, made from the runs alone (benchmark/runs' archives and runs/, nothing typed by hand but
CleanRL's figures below).

    uv run python benchmark/mujoco_1m_table.py        # bash benchmark/mujoco_1m.sh table does this

A run belongs to the campaign when its args.json has the campaign's flags (1M steps, one torch thread, its
--checkpoint-every); finished runs are scored, unfinished ones listed with the step they reached.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from cleanrl_utils.plot import load_curves, make_figure
from cleanrl_utils.results import (
    FINISHED_NAME,
    RunError,
    find_run_dirs,
    iqm,
    machine_description,
    read_scalar,
    read_summary,
)

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmark" / "results" / "mujoco_1m"
CHECKPOINT_EVERY = {"ppo_continuous_action": 20000, "sac_continuous_action": 10000, "td3_continuous_action": 10000}
TASKS = ("Hopper", "HalfCheetah", "Walker2d", "Ant", "Humanoid")
# CleanRL's published returns at 1M steps, MuJoCo v4, 3 seeds (../shared/BENCHMARKS.md): mean, std.
CLEANRL_V4 = {
    ("ppo_continuous_action", "HalfCheetah"): (1442.64, 46.03),
    ("ppo_continuous_action", "Hopper"): (2382.86, 271.74),
    ("ppo_continuous_action", "Walker2d"): (2287.95, 571.78),
    ("sac_continuous_action", "HalfCheetah"): (9634.89, 1423.73),
    ("sac_continuous_action", "Hopper"): (2310.46, 342.82),
    ("sac_continuous_action", "Walker2d"): (3591.45, 911.33),
    ("td3_continuous_action", "HalfCheetah"): (9583.22, 126.09),
    ("td3_continuous_action", "Hopper"): (3134.61, 360.18),
    ("td3_continuous_action", "Walker2d"): (4057.59, 658.78),
}


def campaign_runs() -> list[Path]:
    """The campaign's run directories, each once (an archived run the runner also unpacked into runs/ counts once)."""
    folders = [path for path in (ROOT / "benchmark" / "runs", ROOT / "runs") if path.is_dir()]
    found: dict[str, Path] = {}
    for run_dir in find_run_dirs(folders):
        args_file = run_dir / "args.json"
        if not args_file.is_file():
            continue
        args = json.loads(args_file.read_text())
        every = CHECKPOINT_EVERY.get(args.get("exp_name"))
        ours = every is not None and args.get("total_timesteps") == 1_000_000 and args.get("torch_threads") == 1
        if ours and args.get("checkpoint_every") == every and args["env_id"].split("-v")[0] in TASKS:
            if run_dir.name not in found or (run_dir / FINISHED_NAME).is_file():
                found[run_dir.name] = run_dir
    return sorted(found.values(), key=lambda d: d.name)


def last_returns(run_dir: Path, n: int = 100) -> np.ndarray:
    return read_scalar(run_dir, "charts/episodic_return")[2][-n:]


def reached(run_dir: Path) -> int:
    """The last step a run logged an episode at (0 before its first)."""
    try:
        return int(read_scalar(run_dir, "charts/episodic_return")[0][-1])
    except RunError:
        return 0


def main() -> None:
    runs = campaign_runs()
    finished = [d for d in runs if (d / FINISHED_NAME).is_file()]
    going = [d for d in runs if d not in finished]
    groups: dict[tuple[str, str], list[Path]] = {}
    for run_dir in finished:
        args = json.loads((run_dir / "args.json").read_text())
        groups.setdefault((args["exp_name"], args["env_id"]), []).append(run_dir)
    rows = []
    for (script, env_id), dirs in sorted(groups.items(), key=lambda g: (g[0][0], TASKS.index(g[0][1].split("-v")[0]))):
        summaries = sorted((read_summary(d) for d in dirs), key=lambda s: s.seed)
        scores = np.array([s.score for s in summaries])
        pooled = np.concatenate([last_returns(d) for d in dirs])
        reference = CLEANRL_V4.get((script, env_id.split("-v")[0]))
        row = {
            "script": f"{script}.py",
            "environment": env_id,
            "steps": int(np.mean([s.steps for s in summaries])),
            "seeds": " ".join(str(s.seed) for s in summaries),
            "return (last 100 episodes)": f"{scores.mean():.2f} +- {scores.std():.2f}",
            "per seed": ", ".join(f"{score:.1f}" for score in scores),
            "IQM (pooled episodes)": f"{iqm(pooled):.2f}",
            "CleanRL v4": f"{reference[0]:.2f} +- {reference[1]:.2f}" if reference else "-",
            "difference (CleanRL stds)": f"{(scores.mean() - reference[0]) / reference[1]:+.2f}" if reference else "-",
            "wall time per run (s)": ", ".join(f"{s.wall_time:,.0f}" for s in summaries),
            "SPS per run": ", ".join(f"{s.sps:,.0f}" for s in summaries),
        }
        rows.append(row)
    header = list(rows[0]) if rows else ["script"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[h]) for h in header) + " |" for row in rows]
    still = [f"- {d.name}: {reached(d):,} of 1,000,000 steps" for d in going]
    text = "\n".join(
        [
            "# MuJoCo at 1M steps: ours (v5) beside CleanRL's published v4 figures",
            "",
            "Made by `bash benchmark/mujoco_1m.sh table` (benchmark/mujoco_1m_table.py) from the campaign's runs "
            "(benchmark/runs). Return: each run's mean over its last 100 episodes, then mean +- std (ddof 0) across "
            "seeds; IQM: the interquartile mean of all seeds' last 100 episodes pooled; difference: (our mean - "
            "CleanRL's mean) / CleanRL's std. CleanRL's figures are MuJoCo v4 (../shared/BENCHMARKS.md); ours v5. "
            "Wall time: the time each run's processes ran (a run stopped and resumed across sessions: its pieces "
            "summed); SPS = steps / wall time. The runs share this 2-core machine with whatever else a session runs "
            "(test suites, other benchmarks): ppo_continuous_action does ~2,200 SPS alone here, so a run well below "
            "that was shared.",
            "",
            *lines,
            "",
            f"Machine: {machine_description()}.",
            "",
            "Still running (continue with the same command):" if going else "Every run of the campaign so far ended.",
            *still,
            "",
        ]
    )
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.with_suffix(".md").write_text(text)
    with open(OUTPUT.with_suffix(".csv"), "w") as f:
        f.write(",".join(header) + "\n")
        f.writelines(",".join(f'"{row[h]}"' for h in header) + "\n" for row in rows)
    if finished:
        figure = make_figure(load_curves(finished, "charts/episodic_return"), smoothing=0.6)
        figure.savefig(OUTPUT.with_suffix(".png"), dpi=80)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
