"""A rehearsal of the GPU runbook's headline on the CPU: a fresh CPython 3.12 holding only packages the lent node
has (benchmark/gpu/h200_packages.txt; torch 2.11 as the node's), the kit's headline calls made as the device tool
makes them (the repository's travelling files copied over a node folder that starts bare, the call's folder carried
beside them, ignored files kept from one call to the next as on a warm node), `bash benchmark/gpu/call.sh N` run
there with no uv, no package index and no project venv, and the headline item (ppo_isaacgym.py on MuJoCo Warp, and
whatever else the same call runs) at tiny size, each checked as tests/test_gpu_kit.py checks the other items. It fails
if a wheel or package is missing, if a call with the tree beside it is over the 64 MiB a call carries, or if a call
needs a file that only a cold node's earlier life had left (the node starts bare, and nothing but the calls writes to
it).

The kit here is packed at xz level 1 (quick; more calls than the real kit's 9e) and warp-clang.so, which the kit
leaves out because GPU kernels never need it, is put back into the site folder: this CPU compiles Warp's kernels
with it."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_gpu_kit import HEADLINE_ITEM, RUN_ALL_ITEMS

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmark" / "gpu"
CALL_BYTES = 64 << 20
# What the scripts import from the node itself (besides what the kit's packages need of it, read from its manifest).
NODE_PACKAGES = ["torch==2.11.0", "numpy", "tensorboard", "tqdm", "rich", "packaging", "pyyaml"]


def canonical(name: str) -> str:
    return name.split("=")[0].split(">")[0].split("<")[0].replace("_", "-").replace(".", "-").lower().strip()


def python312() -> str:
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() or "/root/.pyenv"
    found = sorted(Path(root).glob("versions/3.12*/bin/python3.12"))
    if not found:
        pytest.fail(f"no CPython 3.12 under {root}/versions (pyenv install 3.12): the node's Python is rehearsed")
    return str(found[-1])


def travelling_files() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [p for p in listed.split("\0") if p and (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "kit"
    cache = [str(p) for p in [GPU / "kit" / "downloads"] if p.is_dir()]
    command = [sys.executable, str(GPU / "build_kit.py"), "--groups", "headline", "--xz-preset", "1"]
    command += ["--out", str(out), "--cache", *cache]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out, json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def node_python(kit, tmp_path_factory):
    """A CPython 3.12 virtual environment with only the node's packages: those the scripts import and those the
    kit's manifest says its packages need of the node."""
    venv = tmp_path_factory.mktemp("node") / "venv"
    wanted = NODE_PACKAGES + [need for group in kit[1]["groups"] for need in group["needs"]]
    node_list = {
        canonical(line.split("#")[0]) for line in (GPU / "h200_packages.txt").read_text().splitlines() if line
    } - {""}
    assert {canonical(w) for w in wanted} <= node_list, "the rehearsal may only install what the node has"
    subprocess.run(["uv", "venv", "--quiet", "--python", python312(), str(venv)], check=True, timeout=300)
    installed = subprocess.run(
        ["uv", "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *wanted],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    code = "import importlib.metadata as m; print('\\n'.join(d.name for d in m.distributions()))"
    names = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True, check=True).stdout
    extra = {canonical(n) for n in names.split()} - node_list
    assert not extra, f"the rehearsal's node holds packages the real node lacks: {sorted(extra)}"
    return venv / "bin" / "python"


def test_the_headline_calls_run_back_to_back_on_a_bare_node_with_only_its_packages(kit, node_python, tmp_path):
    out, manifest = kit
    headline = next(c["call"] for c in manifest["calls"] if "ppo_isaacgym" in c["items"])
    assert headline == max(p["call"] for p in manifest["groups"][0]["parts"])  # installed and run in one call
    node = tmp_path / "node"
    node.mkdir()
    tree = travelling_files()
    tree_bytes = sum((ROOT / p).stat().st_size for p in tree)
    env = {  # the node's python3 first, nothing of this machine's Python tooling (no uv, no pyenv)
        "PATH": f"{node_python.parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PIP_NO_INDEX": "1",
        "TINY": "1",
        "LANG": "C.UTF-8",
    }
    for call in manifest["calls"][:headline]:
        n = call["call"]
        for path in tree:  # the device copies the working tree over what the node holds ...
            (node / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / path, node / path)
        carried = node / "benchmark" / "gpu" / "kit" / f"call-{n:02d}"  # ... and replaces the carried folder
        shutil.rmtree(carried, ignore_errors=True)
        shutil.copytree(out / f"call-{n:02d}", carried)
        carried_bytes = sum(p.stat().st_size for p in carried.iterdir())
        assert tree_bytes + carried_bytes <= CALL_BYTES, f"call {n}: {tree_bytes + carried_bytes} bytes travel"
        if n == 1:  # this CPU compiles Warp's kernels with warp-clang.so, which no GPU run loads
            shutil.copytree(out / "cpu-only" / "headline", node / "benchmark" / "gpu" / "site")
        result_dir = tmp_path / f"out-{n}"
        run = subprocess.run(
            ["bash", "benchmark/gpu/call.sh", str(n)],
            cwd=node,
            env={**env, "OUT": str(result_dir)},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        log = (result_dir / f"call-{n:02d}.log").read_text() if (result_dir / f"call-{n:02d}.log").is_file() else ""
        assert run.returncode == 0, log[-4000:] + run.stderr[-2000:]
        returned = list(result_dir.iterdir())
        assert len(returned) <= 8 and all(p.is_file() for p in returned)
        if n < headline:
            assert "waiting for headline" in log, log[-2000:]
    with tarfile.open(result_dir / f"call-{headline:02d}-results.tar.gz") as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "returned", filter="data")
    assert any(name.startswith("runs/Ant__ppo_isaacgym_gpu__1__") for name in names), names
    summary = (result_dir / "gpu_run_all.md").read_text()
    assert HEADLINE_ITEM in call["items"]  # test_gpu_kit runs the other items
    for item in call["items"]:
        assert f"| {item} | ok |" in summary, summary
        RUN_ALL_ITEMS[item](tmp_path / "returned" / "benchmark" / "results")
