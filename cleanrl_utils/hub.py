"""Share saved models through the Hugging Face Hub.

    python -m cleanrl_utils.hub push runs/CartPole-v1__ppo__1__1700000000 --repo-id alice/ppo-CartPole-v1
    python -m cleanrl_utils.hub pull alice/ppo-CartPole-v1
    python -m cleanrl_utils.evaluate hf://alice/ppo-CartPole-v1 --episodes 10

push uploads a run directory whose model was saved with --save-model, in one commit to the model repository
(created if missing; --private for a private one): the model, args.json, finished.json, the TensorBoard events, the
videos (videos/**.mp4, one of them again as replay.mp4), the script that saved the model, learning_curve.png
(charts/episodic_return against steps and wall time) and README.md, the model card: the algorithm (the script),
the environment, the evaluation of the saved model (mean +- std of the run's eval/episodic_return, the episodes
--save-model played), the learning curve, the video, the command that reproduces the training (the flags of
args.json that differ from the script's defaults) and every hyperparameter; its YAML header (library_name: cleanrl,
tags, model-index with mean_reward) is what the Hub reads. Files of an earlier push that this one does not
upload are deleted, so the repository holds one run. The token is HF_TOKEN or the one `hf auth login` saved.

pull downloads a model repository into the local Hugging Face cache (HF_HOME, ~/.cache/huggingface by default;
nothing is downloaded again when the cache holds it) and prints the folder. With HF_HUB_OFFLINE=1 it only looks in
the cache. `resolve_model_path("hf://USER/NAME")` does the same from Python and returns the saved model's file
(a run directory or a model file is returned as its model file), for any tool that takes a model.

A saved model is a pickle: loading one runs code, so evaluate models only from people you trust.

Bad input stops before any work with one line: a malformed repository id, a run directory without a saved model
or without its evaluation, no token to push with, HF_HUB_OFFLINE=1 for a push, or a model that is neither in the
cache nor downloadable (HF_HUB_OFFLINE=1), or not on the Hub.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import json
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np

from cleanrl_utils.errors import EXIT_RUN_STOPPED, fail
from cleanrl_utils.results import EVENTS_GLOB, FINISHED_NAME, RunError, read_scalar

HUB_PREFIX = "hf://"  # a model on the Hugging Face Hub, for cleanrl_utils.evaluate and resolve_model_path
CARD_NAME = "README.md"
CURVE_NAME = "learning_curve.png"
PREVIEW_NAME = "replay.mp4"  # the Hub shows a reinforcement-learning model's replay.mp4 on its page
EVAL_TAG = "eval/episodic_return"  # written by Run.finish: the saved model, reloaded and evaluated
CURVE_TAG = "charts/episodic_return"
COMPUTED = "(computed in runtime"  # how an Args field filled in by the script says so in its docstring
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_PART}/{_PART}")  # the Hub's rules: 1-96 characters a part, no "--" or ".." (below)


def check_repo_id(repo_id: str) -> str:
    """`repo_id` (an hf:// prefix removed) when it is a valid USER/NAME model repository id; else fail in one line."""
    repo_id = repo_id[len(HUB_PREFIX) :] if repo_id.startswith(HUB_PREFIX) else repo_id
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        fail(
            f"malformed repository id {repo_id!r}: give USER/NAME, each part 1-96 letters, digits, '-', '_' or '.' "
            "(no '--' or '..'), e.g. alice/ppo-CartPole-v1"
        )
    return repo_id


def require_huggingface_hub() -> None:
    """Fail in one line where huggingface_hub is missing (a Python 3.8 environment for Isaac Gym may lack it)."""
    try:
        import huggingface_hub  # noqa: F401
    except ModuleNotFoundError:
        fail("the Hugging Face Hub needs the huggingface_hub package here: pip install huggingface_hub")


# ---------------------------------------------------------------------------- pull


def pull(repo_id: str, revision: str | None = None) -> Path:
    """The local folder of the model repository `repo_id` in the Hugging Face cache, downloaded unless it is there."""
    repo_id = check_repo_id(repo_id)
    require_huggingface_hub()
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision))
    except RepositoryNotFoundError:
        fail(f"{repo_id}: no such model on the Hugging Face Hub (a private one needs `hf auth login` first)")
    except LocalEntryNotFoundError as error:
        if constants.HF_HUB_OFFLINE:
            fail(
                f"{HUB_PREFIX}{repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                "HF_HUB_OFFLINE=1 forbids downloading it: unset HF_HUB_OFFLINE, or copy the cache from a machine "
                f"that ran `python -m cleanrl_utils.hub pull {repo_id}`"
            )
        cause = error.__cause__ or error  # the connection error behind it
        fail(
            f"cannot download {repo_id} ({type(cause).__name__}: {str(cause).splitlines()[0]}) and it is not in the "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}); check the connection and try again",
            EXIT_RUN_STOPPED,
        )
    except (HfHubHTTPError, OSError) as error:
        fail(f"cannot download {repo_id}: {type(error).__name__}: {str(error).splitlines()[0]}", EXIT_RUN_STOPPED)


def resolve_model_path(spec: str | os.PathLike) -> Path:
    """The saved model file that `spec` names: hf://USER/NAME (pulled into the Hugging Face cache unless there), a run
    directory holding one *.cleanrl_model file, or the file itself. Fails in one line when there is none."""
    from cleanrl_utils.checkpoint import find_model

    text = os.fspath(spec)
    if text.startswith(HUB_PREFIX):
        return find_model(pull(text))
    return find_model(Path(text))


# ---------------------------------------------------------------------------- the model card


def evaluation(run_dir: Path) -> np.ndarray:
    """The episodic returns of the saved model's evaluation at the end of the run (eval/episodic_return)."""
    try:
        _, _, returns = read_scalar(run_dir, EVAL_TAG)
    except RunError as error:
        fail(f"{error}; the run stopped before evaluating its saved model, push a run that finished")
    return returns


def computed_fields(script: Path) -> set[str]:
    """The fields of the script's Args that it fills in at run time (their docstring says so): not flags to give."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            return {
                field.target.id
                for field, doc in zip(node.body, node.body[1:])
                if isinstance(field, ast.AnnAssign)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and COMPUTED in str(doc.value.value)
            }
    return set()


def as_json(value):
    """`value` as args.json holds it (tuples as lists, other objects as strings)."""
    return json.loads(json.dumps(value, default=str))


def flag_words(name: str, value) -> list[str]:
    """The command-line words (tyro's) that set the field `name` to the args.json `value`."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + name.replace("_", "-")]
    if isinstance(value, list):
        return [flag, *(str(v) for v in value)]
    return [flag, str(value)]


def training_command(module, script: Path, args: dict) -> str:
    """The command that trains this model again: the flags of args.json whose values differ from the script's
    defaults (fields the script computes, and --resume, left out)."""
    skip = computed_fields(script) | {"resume"}
    words = ["uv", "run", "python", f"cleanrl/{script.name}"]
    for field in dataclasses.fields(module.Args):
        if field.name in skip or field.name not in args:
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if as_json(default) != args[field.name]:
            words += flag_words(field.name, args[field.name])
    return shlex.join(words)


def hyperparameter_rows(args: dict) -> str:
    rows = "\n".join(f"| `{key}` | `{json.dumps(value)}` |" for key, value in args.items())
    return f"| parameter | value |\n|---|---|\n{rows}"


def model_card(
    repo_id: str, model: dict, args: dict, returns: np.ndarray, steps: int, command: str, video: str | None
) -> str:
    """README.md of the model repository: YAML metadata for the Hub, then the card."""
    from huggingface_hub import EvalResult, ModelCardData, constants

    script, env_id = model["script"], model["env_id"]
    mean, std = float(np.mean(returns)), float(np.std(returns))
    metadata = ModelCardData(
        library_name="cleanrl",
        tags=[env_id, script, "deep-reinforcement-learning", "reinforcement-learning", "custom-implementation"],
        model_name=script,
        eval_results=[
            EvalResult(
                task_type="reinforcement-learning",
                task_name="reinforcement-learning",
                dataset_type=env_id,
                dataset_name=env_id,
                metric_type="mean_reward",
                metric_name="mean_reward",
                metric_value=f"{mean:.2f} +/- {std:.2f}",
            )
        ],
    )
    video_html = (
        f'\n## Video\n\n<video controls autoplay loop src="{constants.ENDPOINT}/{repo_id}/resolve/main/{video}">'
        "</video>\n"
        if video
        else ""
    )
    return f"""---
{metadata.to_yaml()}
---

# `{script}.py` on {env_id}

A `{script}.py` agent trained on {env_id} for {steps:,} environment steps with the single-file scripts of this
project (CleanRL style), seed {args.get("seed")}.

## Evaluation

Episodic return of the saved model: **{mean:.2f} +- {std:.2f}** (mean +- std over {len(returns)} episodes, played by
`--save-model` at the end of training: `eval/episodic_return` in the TensorBoard events here).

## Learning curve

![episodic return during training]({CURVE_NAME})
{video_html}
## Use it

```bash
uv run python -m cleanrl_utils.evaluate {HUB_PREFIX}{repo_id} --episodes 10
uv run python -m cleanrl_utils.hub pull {repo_id}   # the files, in the local Hugging Face cache
```

## Train it again

```bash
{command}
```

`{script}.py` here is the script as it was when it saved this model.

## Hyperparameters

{hyperparameter_rows(args)}
"""


def learning_curve_png(run_dir: Path) -> bytes:
    """The run's charts/episodic_return against steps and wall time, drawn by cleanrl_utils.plot, as PNG bytes."""
    from cleanrl_utils.plot import load_curves, make_figure

    figure = make_figure(load_curves([run_dir], CURVE_TAG), CURVE_TAG)
    figure.suptitle(f"{run_dir.name}: episodic return during training", fontsize="medium")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def preview_video(run_dir: Path) -> Path | None:
    """The video the card shows: the saved model's evaluation (videos/eval/), else the latest training episode."""

    def episode(path: Path) -> int:
        digits = re.findall(r"\d+", path.stem)
        return int(digits[-1]) if digits else -1

    for folder in (run_dir / "videos" / "eval", run_dir / "videos"):
        videos = sorted(folder.glob("*.mp4"), key=episode)
        if videos:
            return videos[0] if folder.name == "eval" else videos[-1]
    return None


# ---------------------------------------------------------------------------- push


def push(run_dir: Path, repo_id: str, private: bool = False) -> str:
    """Upload the run's saved model with its model card to `repo_id`; returns the repository's URL."""
    repo_id = check_repo_id(repo_id)
    require_huggingface_hub()
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, constants, get_token

    if constants.HF_HUB_OFFLINE:
        fail("HF_HUB_OFFLINE=1 forbids the upload: unset it to push")
    token = get_token()
    if token is None:
        fail("no Hugging Face token to push with: log in with `uv run hf auth login`, or set HF_TOKEN")

    from cleanrl_utils.checkpoint import find_model, load_script, read_model  # torch: once the checks above pass

    run_dir = Path(run_dir)
    if run_dir.is_file():
        fail(f"{run_dir}: give the run directory (it holds args.json and the events), not the model file")
    model_path = find_model(run_dir)
    if not (run_dir / "args.json").is_file():
        fail(f"{run_dir}: no args.json (not a run directory)")
    model = read_model(model_path)
    returns = evaluation(run_dir)
    args = json.loads((run_dir / "args.json").read_text())
    module = load_script(model)
    script = Path(module.__file__)
    finished = run_dir / FINISHED_NAME
    steps = json.loads(finished.read_text())["global_step"] if finished.is_file() else args["total_timesteps"]
    video = preview_video(run_dir)
    card = model_card(
        repo_id,
        model,
        args,
        returns,
        steps,
        training_command(module, script, args),
        PREVIEW_NAME if video else None,
    )

    files = {CARD_NAME: card.encode(), CURVE_NAME: learning_curve_png(run_dir), script.name: script}
    for path in [model_path, run_dir / "args.json", finished, *sorted(run_dir.glob(EVENTS_GLOB))]:
        if path.is_file():
            files[path.name] = path
    for path in sorted((run_dir / "videos").rglob("*.mp4")):
        files[path.relative_to(run_dir).as_posix()] = path
    if video is not None:
        files[PREVIEW_NAME] = video

    score = f"{np.mean(returns):.2f} +- {np.std(returns):.2f}"
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        stale = [path for path in api.list_repo_files(repo_id) if path not in files and path != ".gitattributes"]
        operations = [CommitOperationDelete(path) for path in stale]
        operations += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=data) for name, data in files.items()]
        api.create_commit(
            repo_id,
            operations,
            commit_message=f"{model['script']}.py on {model['env_id']}, {steps:,} steps: {score}",
        )
    except Exception as error:  # HTTP errors, refused tokens, lost connections: one line, and a retry may succeed
        fail(f"push to {repo_id} failed: {type(error).__name__}: {str(error).splitlines()[0]}", EXIT_RUN_STOPPED)
    return str(url)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cleanrl_utils.hub", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    push_parser = commands.add_parser("push", help="upload a run's saved model with a model card")
    push_parser.add_argument("run_dir", type=Path, help="a run directory holding a model saved with --save-model")
    push_parser.add_argument("--repo-id", required=True, help="USER/NAME of the model repository (created if missing)")
    push_parser.add_argument("--private", action="store_true", help="create the repository private")
    pull_parser = commands.add_parser("pull", help="download a model into the Hugging Face cache; print its folder")
    pull_parser.add_argument("repo_id", help="USER/NAME (or hf://USER/NAME)")
    pull_parser.add_argument("--revision", default=None, help="a branch, tag or commit (default: main)")
    args = parser.parse_args(argv)
    if args.command == "push":
        url = push(args.run_dir, args.repo_id, args.private)
        print(f"pushed {args.run_dir} to {url}")
    else:
        print(pull(args.repo_id, args.revision))


if __name__ == "__main__":
    main(sys.argv[1:])
