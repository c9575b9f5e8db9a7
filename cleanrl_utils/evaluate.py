"""Reload a saved model and evaluate its policy.

    python -m cleanrl_utils.evaluate runs/CartPole-v1__ppo__1__1700000000 --episodes 10
    python -m cleanrl_utils.evaluate runs/CartPole-v1__ppo__1__1700000000/ppo.cleanrl_model \\
        --episodes 3 --capture-video --video-dir videos/ppo-cartpole --seed 7
    python -m cleanrl_utils.evaluate hf://alice/ppo-CartPole-v1 --episodes 10

Works for the model of any script that saves one (train with --save-model): the argument is a
run directory holding one *.cleanrl_model file, the file itself, or hf://USER/NAME, a model pushed to the
Hugging Face Hub (cleanrl_utils.hub) and read from the local Hugging Face cache (downloaded into it when
missing). The file names the script that wrote it and where it was (a copied or renamed script
too); that script is imported (from its recorded path, else cleanrl/<script>.py in this
repository) and its own `evaluate(model_path, eval_episodes, device, seed, capture_video, video_dir)` plays the
episodes, so networks and observation-normalisation statistics are restored exactly as the
script saved them. Prints the episodic returns and their mean and std (ddof 0).

--capture-video records episodes (gymnasium's RecordVideo schedule: episodes 0, 1, 8, 27 ...)
as mp4 into --video-dir, by default <run dir>/videos/evaluate/ (for hf://USER/NAME:
videos/evaluate/USER--NAME/). --seed (default 0) seeds the evaluation environment. --no-cuda
keeps the evaluation on the CPU.

A path without a model, a file that is not a cleanrl saved model (a checkpoint, anything
else) or a model whose script is not in cleanrl/ stops with one line naming the problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cleanrl_utils.checkpoint import MODEL_SUFFIX, load_script, read_model
from cleanrl_utils.errors import fail
from cleanrl_utils.hub import HUB_PREFIX, resolve_model_path


def evaluate_model(
    path: Path,
    episodes: int = 10,
    seed: int = 0,
    capture_video: bool = False,
    video_dir: Path | None = None,
    cuda: bool = True,
) -> tuple[dict, list[float]]:
    """(model contents, episodic returns) for a model file or run directory."""
    import torch

    model_path = resolve_model_path(path)
    model = read_model(model_path)
    module = load_script(model)
    device = torch.device("cuda" if cuda and torch.cuda.is_available() else "cpu")
    if capture_video and video_dir is None:
        video_dir = model_path.parent / "videos" / "evaluate"
    returns = module.evaluate(
        model_path,
        episodes,
        device,
        seed=seed,
        capture_video=capture_video,
        video_dir=Path(video_dir) if video_dir is not None else None,
    )
    return model, [float(r) for r in returns]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", help=f"a run directory with a *{MODEL_SUFFIX} file, the file, or hf://USER/NAME")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the evaluation environment (default 0)")
    parser.add_argument("--capture-video", action="store_true", help="record mp4 videos of the episodes")
    parser.add_argument(
        "--video-dir", type=Path, default=None, help="where the videos go (default <run dir>/videos/evaluate)"
    )
    # Two flags, not argparse.BooleanOptionalAction (Python 3.9+): Isaac Gym's models are evaluated on Python 3.8.
    parser.add_argument("--cuda", action="store_true", default=True, help="use a GPU when present (default)")
    parser.add_argument("--no-cuda", dest="cuda", action="store_false", help="evaluate on the CPU")
    args = parser.parse_args(argv)
    if args.episodes <= 0:
        fail(f"--episodes must be positive, got {args.episodes}")

    import numpy as np

    model_path = resolve_model_path(args.path)
    video_dir = args.video_dir
    if args.capture_video and video_dir is None:
        video_dir = model_path.parent / "videos" / "evaluate"
        if args.path.startswith(HUB_PREFIX):  # not into the Hugging Face cache
            video_dir = Path("videos", "evaluate", args.path[len(HUB_PREFIX) :].replace("/", "--"))
    model, returns = evaluate_model(model_path, args.episodes, args.seed, args.capture_video, video_dir, args.cuda)
    print(f"{model['script']}.py on {model['env_id']}: episodic returns {', '.join(f'{r:.1f}' for r in returns)}")
    print(f"mean {np.mean(returns):.2f} +- std {np.std(returns):.2f} over {len(returns)} episodes")
    if args.capture_video:
        videos = sorted(Path(video_dir).glob("*.mp4"))
        print(f"{len(videos)} video(s) in {video_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
