"""cleanrl_utils.hub: push a saved model with its model card, pull it, evaluate hf://USER/NAME. Nothing here reaches
the network: push talks to a fake Hub installed as huggingface_hub's HTTP transport (its client factory builds a
client whose transport is the fake), and pull reads a Hugging Face cache laid out by the test, with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from conftest import ROOT, assert_bad_input, read_scalars, run_dirs, run_script, script_env
from huggingface_hub import ModelCard, constants, set_client_factory
from huggingface_hub.utils._http import default_client_factory

REPO_ID = "alice/ppo-CartPole-v1"
TOKEN = "hf_test_token"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# ppo.py at tiny sizes, its model saved and evaluated over 3 episodes (seed 3: returns that differ, so a std > 0)
TRAIN = (
    *("--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"),
    *("--total-timesteps", "256", "--seed", "3", "--save-model", "--eval-episodes", "3", "--capture-video"),
)
STALE = "old-run.cleanrl_model"  # on the fake Hub before the push: a file of an earlier push


class FakeHub:
    """huggingface.co as huggingface_hub's HTTP client sees it: every request is recorded and answered as the Hub
    answers an upload. Its preupload answer makes every file a regular git blob, so each file's bytes travel inside
    the commit request (base64), where the test reads them back."""

    def __init__(self, existing: list[str]):
        self.existing = existing
        self.requests: list[tuple[str, str, dict, bytes]] = []
        probe = default_client_factory()  # the client huggingface_hub builds: httpx (1.x) or httpx2 (2.x)
        self.http = sys.modules[type(probe).__module__.split(".")[0]]
        self.event_hooks = probe.event_hooks
        probe.close()

    def client(self):
        transport = self.http.MockTransport(self.handle)
        return self.http.Client(transport=transport, event_hooks=self.event_hooks, follow_redirects=True)

    def handle(self, request):
        body = request.read()
        self.requests.append((request.method, str(request.url), dict(request.headers), body))
        path, respond = request.url.path, self.http.Response
        if request.method == "POST" and path == "/api/repos/create":
            return respond(200, json={"url": f"{constants.ENDPOINT}/{REPO_ID}", "name": REPO_ID})
        if request.method == "GET" and path == f"/api/models/{REPO_ID}/tree/main":
            return respond(200, json=[{"type": "file", "path": p, "oid": "f" * 40, "size": 1} for p in self.existing])
        if request.method == "POST" and path == "/api/validate-yaml":
            return respond(200, json={"errors": [], "warnings": []})
        if request.method == "POST" and path == f"/api/models/{REPO_ID}/preupload/main":
            files = json.loads(body)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]
            return respond(200, json={"files": modes})
        if request.method == "POST" and path == f"/api/models/{REPO_ID}/commit/main":
            return respond(
                200, json={"commitUrl": f"{constants.ENDPOINT}/{REPO_ID}/commit/{COMMIT}", "commitOid": COMMIT}
            )
        return respond(404, json={"error": f"not on the fake Hub: {request.method} {path}"})

    def commit(self) -> tuple[dict[str, bytes], list[str]]:
        """(the files the one commit added, path -> bytes; the paths it deleted)."""
        commits = [r for r in self.requests if r[0] == "POST" and r[1].endswith(f"/api/models/{REPO_ID}/commit/main")]
        assert len(commits) == 1, [r[:2] for r in self.requests]
        files, deleted = {}, []
        for line in commits[0][3].decode().splitlines():
            item = json.loads(line)
            assert item["key"] in ("header", "file", "deletedFile"), item["key"]
            if item["key"] == "file":
                files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            elif item["key"] == "deletedFile":
                deleted.append(item["value"]["path"])
        return files, deleted


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("train")
    result = run_script("ppo.py", *TRAIN, cwd=workdir)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(workdir)
    return run_dir


@pytest.fixture(scope="module")
def pushed(trained_run) -> tuple[FakeHub, str]:
    """The trained run pushed to the fake Hub: (the hub, the URL push returned)."""
    from cleanrl_utils.hub import push

    hub = FakeHub(existing=[".gitattributes", STALE])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_TOKEN", TOKEN)
        patch.delenv("HF_OIDC_RESOURCE", raising=False)
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        set_client_factory(hub.client)
        try:
            url = push(trained_run, REPO_ID)
        finally:
            set_client_factory(default_client_factory)
    return hub, url


class RefusingHub(FakeHub):
    """A Hub that refuses the token: 401 to everything."""

    def handle(self, request):
        self.requests.append((request.method, str(request.url), dict(request.headers), request.read()))
        return self.http.Response(401, json={"error": "Invalid credentials in Authorization header"})


def test_push_refused_by_the_hub_ends_in_one_line(trained_run, monkeypatch, capsys):
    """An HTTP error is not bad input (the same command can succeed later): exit 1, one line, nothing committed."""
    from cleanrl_utils.hub import push

    hub = RefusingHub(existing=[])
    monkeypatch.setenv("HF_TOKEN", "hf_revoked")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    set_client_factory(hub.client)
    try:
        with pytest.raises(SystemExit) as stopped:
            push(trained_run, REPO_ID)
    finally:
        set_client_factory(default_client_factory)
    assert stopped.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: push to {REPO_ID} failed:") and "401" in line, line
    assert not [r for r in hub.requests if "/commit/" in r[1]]


def evaluation_returns(run_dir: Path) -> np.ndarray:
    return np.array([value for _, value in read_scalars(run_dir)["eval/episodic_return"]])


def test_push_uploads_the_run_with_its_model_card(trained_run, pushed):
    hub, url = pushed
    assert url == f"{constants.ENDPOINT}/{REPO_ID}"
    host = urlparse(constants.ENDPOINT).hostname
    assert all(urlparse(request_url).hostname == host for _, request_url, _, _ in hub.requests)
    create = [r for r in hub.requests if r[1].endswith("/api/repos/create")]
    assert len(create) == 1 and json.loads(create[0][3]) == {
        "name": "ppo-CartPole-v1",
        "organization": "alice",
        "visibility": "public",
    }
    assert all(headers.get("authorization") == f"Bearer {TOKEN}" for _, _, headers, _ in create + hub.requests[-1:])

    files, deleted = hub.commit()
    assert deleted == [STALE], "a file of an earlier push was kept (or .gitattributes deleted)"
    videos = sorted(p.relative_to(trained_run).as_posix() for p in trained_run.rglob("*.mp4"))
    assert "videos/eval/rl-video-episode-0.mp4" in videos
    (events,) = trained_run.glob("events.out.tfevents.*")
    run_files = ["ppo.cleanrl_model", "args.json", "finished.json", events.name, *videos]
    assert sorted(files) == sorted([*run_files, "ppo.py", "README.md", "learning_curve.png", "replay.mp4"])
    for name in run_files:
        assert files[name] == (trained_run / name).read_bytes(), name
    assert files["ppo.py"] == (ROOT / "cleanrl" / "ppo.py").read_bytes()
    assert files["replay.mp4"] == (trained_run / "videos/eval/rl-video-episode-0.mp4").read_bytes()
    assert files["learning_curve.png"].startswith(b"\x89PNG\r\n\x1a\n") and len(files["learning_curve.png"]) > 5000

    # The card: the Hub's metadata and the evaluation the run recorded (the saved model's, not training episodes').
    returns = evaluation_returns(trained_run)
    assert len(returns) == 3 and returns.std() > 0
    mean, std = returns.mean(), returns.std()
    card = ModelCard(files["README.md"].decode())
    assert card.data.library_name == "cleanrl"
    assert {"CartPole-v1", "ppo", "reinforcement-learning"} <= set(card.data.tags)
    (result,) = card.data.eval_results
    assert (result.task_type, result.dataset_type, result.metric_type) == (
        "reinforcement-learning",
        "CartPole-v1",
        "mean_reward",
    )
    assert result.metric_value == f"{mean:.2f} +/- {std:.2f}"
    assert f"**{mean:.2f} +- {std:.2f}** (mean +- std over 3 episodes" in card.text
    assert "](learning_curve.png)" in card.text
    assert f"/{REPO_ID}/resolve/main/replay.mp4" in card.text
    assert f"python -m cleanrl_utils.evaluate hf://{REPO_ID}" in card.text
    args = json.loads((trained_run / "args.json").read_text())
    for key, value in args.items():
        assert f"| `{key}` | `{json.dumps(value)}` |" in card.text, key


def test_card_command_reproduces_the_training_arguments(trained_run, pushed):
    """The card's command, parsed by the script's own tyro Args, gives the run's args.json (fields the script
    computes at run time aside)."""
    import ppo
    import tyro

    card = ModelCard(pushed[0].commit()[0]["README.md"].decode())
    command = card.text.split("## Train it again\n\n```bash\n", 1)[1].split("\n```", 1)[0]
    words = shlex.split(command)
    assert words[:4] == ["uv", "run", "python", "cleanrl/ppo.py"]
    flags = words[4:]
    computed = {"batch_size", "minibatch_size", "num_iterations"}
    assert not {f"--{name.replace('_', '-')}" for name in computed} & set(flags)
    assert "--seed" in flags and "--learning-rate" not in flags, "only the flags that differ from the defaults"
    parsed = dataclasses.asdict(tyro.cli(ppo.Args, args=flags))
    recorded = json.loads((trained_run / "args.json").read_text())
    assert {k: v for k, v in parsed.items() if k not in computed} == {
        k: v for k, v in recorded.items() if k not in computed
    }


def lay_out_cache(hf_home: Path, files: dict[str, bytes]) -> Path:
    """The Hugging Face cache as snapshot_download leaves it after a download of REPO_ID's main: refs/main holding the
    commit, the files under snapshots/<commit>/ (plain files where the real cache links into blobs/)."""
    repo = hf_home / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    for name, data in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(data)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def run_module(module: str, *flags: str, cwd: Path, **env: str | None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *flags],
        cwd=cwd,
        env=script_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pull_from_the_cache_then_evaluate_hf_model(pushed, tmp_path):
    hf_home = tmp_path / "hf"
    snapshot = lay_out_cache(hf_home, pushed[0].commit()[0])
    offline = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": None, "HF_TOKEN": None}
    pulled = run_module("cleanrl_utils.hub", "pull", REPO_ID, cwd=tmp_path, **offline)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == str(snapshot)
    result = run_module(
        "cleanrl_utils.evaluate", f"hf://{REPO_ID}", "--episodes", "2", "--no-cuda", cwd=tmp_path, **offline
    )
    assert result.returncode == 0, result.stderr
    assert "ppo.py on CartPole-v1: episodic returns" in result.stdout
    assert "over 2 episodes" in result.stdout


def test_resolve_model_path_of_local_models(trained_run):
    from cleanrl_utils.hub import resolve_model_path

    assert resolve_model_path(trained_run) == trained_run / "ppo.cleanrl_model"
    assert resolve_model_path(str(trained_run / "ppo.cleanrl_model")) == trained_run / "ppo.cleanrl_model"


@pytest.mark.parametrize(
    "case",
    ["no model", "malformed repo id", "malformed hf://", "no token", "offline push", "not cached", "not cached pull"],
)
def test_bad_input(case, trained_run, tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": None, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": None}
    env["HF_OIDC_RESOURCE"] = None
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    empty_run = tmp_path / "runs_elsewhere" / "CartPole-v1__ppo__1__1"
    empty_run.mkdir(parents=True)
    (empty_run / "args.json").write_text("{}")
    commands = {
        "no model": (("cleanrl_utils.hub", "push", str(empty_run), "--repo-id", REPO_ID), env, "--save-model"),
        "malformed repo id": (
            ("cleanrl_utils.hub", "push", str(trained_run), "--repo-id", "alice"),
            env,
            "malformed repository id 'alice'",
        ),
        "malformed hf://": (
            ("cleanrl_utils.evaluate", "hf://alice/bad--name", "--no-cuda"),
            offline,
            "malformed repository id",
        ),
        "no token": (
            ("cleanrl_utils.hub", "push", str(trained_run), "--repo-id", REPO_ID),
            {**env, "HF_TOKEN": None},
            "hf auth login",
        ),
        "offline push": (
            ("cleanrl_utils.hub", "push", str(trained_run), "--repo-id", REPO_ID),
            offline,
            "HF_HUB_OFFLINE=1",
        ),
        "not cached": (
            ("cleanrl_utils.evaluate", f"hf://{REPO_ID}", "--episodes", "2", "--no-cuda"),
            offline,
            "is not in the Hugging Face cache",
        ),
        "not cached pull": (("cleanrl_utils.hub", "pull", REPO_ID), offline, "HF_HUB_OFFLINE=1 forbids downloading"),
    }
    (module, *flags), case_env, fragment = commands[case]
    result = run_module(module, *flags, cwd=tmp_path, **case_env)
    assert result.returncode == 2, result.stderr
    assert_bad_input(result, tmp_path, fragment)
