"""Install the offline wheelhouse (benchmark/gpu/build_wheelhouse.py) on a GPU node with the node's own python3:
no package index, no uv, the node's torch and its other packages untouched (everything goes into one --target
folder, which PYTHONPATH then puts first).

    python3 benchmark/gpu/install.py benchmark/gpu/wheelhouse/batch-01 [batch-02 ...] --target benchmark/gpu/site
    export PYTHONPATH=$PWD/benchmark/gpu/site:$PWD

It is incremental: feed it the batches over as many calls as they need (one 64 MiB device call each). Each call
checks the SHA-256 of every part of the batches it is given (a missing or damaged part is refused in one line,
before anything is installed), keeps parts of files still incomplete under TARGET/.kit/parts, reassembles each file
whose parts are all in, checks it against the manifest and installs it with
`python3 -m pip install --no-index --find-links ... --no-deps --target`. A wheel of a distribution the node already
has at a version that meets every requirement of the kit is not installed (the node's copy is used). When the last
file is in, it prints `kit complete` and writes TARGET/.kit/complete; --require-complete makes an unfinished kit an
error. Needs only the standard library and pip.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

MIB = 1 << 20


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def node_versions() -> dict[str, str]:
    """Distributions the node's python3 has by itself (isolated: no PYTHONPATH, so not the target folder)."""
    code = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"
    result = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    return {canonical(name): version for name, version in json.loads(result.stdout).items() if name}


def plan(manifest: dict, node: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """({dist: 'install' or 'node'}, notes): a kit wheel is installed unless the node's version meets every
    specifier that the kit's roots and the wheels being installed put on it; a requirement neither can meet is fatal."""
    kit = {f["dist"]: f for f in manifest["files"]}
    action = {dist: "node" if dist in node else "install" for dist in kit}
    while True:
        wanted: dict[str, list[tuple[str, Requirement]]] = {}
        for text in manifest["roots"]:
            wanted.setdefault(canonical(Requirement(text).name), []).append(("the benchmarks", Requirement(text)))
        for dist, f in kit.items():
            if action[dist] == "install":
                for text in f["requires"]:
                    wanted.setdefault(canonical(Requirement(text).name), []).append((dist, Requirement(text)))
        changed = False
        for name, reqs in wanted.items():
            if name in kit and action[name] == "node":
                if not all(r.specifier.contains(Version(node[name]), prereleases=True) for _, r in reqs):
                    action[name], changed = "install", True
        if not changed:
            break
    notes = []
    for name, reqs in sorted(wanted.items()):
        if name in kit and action[name] == "install":
            version = kit[name]["version"]
            bad = [
                f"{who} needs {r}" for who, r in reqs if not r.specifier.contains(Version(version), prereleases=True)
            ]
            if bad:
                fail(f"the kit's {name} {version} does not meet its own requirements ({'; '.join(bad)}): rebuild it")
            if name in node:
                needs = "; ".join(f"{who} needs {r}" for who, r in reqs)
                notes.append(f"{name}: the node's {node[name]} is shadowed by the kit's {version} ({needs})")
        elif name not in kit:
            have = node.get(name)
            bad = [f"{who} needs {r}" for who, r in reqs if have is None or not r.specifier.contains(Version(have))]
            if bad:
                fail(f"{name} is not in the kit and the node has {have or 'none'}: {'; '.join(bad)}")
    return action, notes


def read_batches(folders: list[Path]) -> tuple[dict, dict[int, Path]]:
    """The manifest the batch folders carry (all the same kit) and {batch number: folder}."""
    manifest, batches = None, {}
    for folder in folders:
        match = re.fullmatch(r"batch-(\d+)", folder.name)
        if match is None or not (folder / "manifest.json").is_file():
            fail(f"{folder}: not a batch folder of the wheelhouse (batch-NN holding a manifest.json)")
        this = json.loads((folder / "manifest.json").read_text())
        if manifest is not None and this["kit"] != manifest["kit"]:
            fail(f"{folder} belongs to kit {this['kit']}, the other batches to kit {manifest['kit']}: rebuild or pick")
        manifest = this
        batches[int(match.group(1))] = folder
    return manifest, batches


def merge(source: Path, target: Path) -> None:
    """Move the tree under source into target, folder by folder (packages sharing a namespace folder both stay)."""
    for entry in source.iterdir():
        destination = target / entry.name
        if entry.is_dir() and destination.is_dir():
            merge(entry, destination)
        else:
            if destination.is_dir():
                shutil.rmtree(destination)
            os.replace(entry, destination)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("batches", type=Path, nargs="+", help="batch folders of the wheelhouse (batch-NN)")
    parser.add_argument("--target", type=Path, required=True, help="the folder to install into (put on PYTHONPATH)")
    parser.add_argument("--require-complete", action="store_true", help="an unfinished kit is an error")
    args = parser.parse_args()
    manifest, batches = read_batches(args.batches)
    kit_dir = args.target / ".kit"
    state_path = kit_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else None
    if state is not None and state["kit"] != manifest["kit"]:
        fail(f"{args.target} holds kit {state['kit']}, these batches are kit {manifest['kit']}: remove {args.target}")
    if state is None:
        action, notes = plan(manifest, node_versions())
        state = {"kit": manifest["kit"], "action": action, "done": {}, "seen": [], "notes": notes}
        for note in notes:
            print(note)
    stash = kit_dir / "parts"
    stash.mkdir(parents=True, exist_ok=True)

    # 1. Every part of every batch given: present and as the manifest says, before anything is touched.
    given = {}
    for f in manifest["files"]:
        for part in f["parts"]:
            folder = batches.get(part["batch"])
            if folder is None or f["name"] in state["done"] or (stash / part["name"]).exists():
                continue
            path = folder / part["name"]
            if not path.is_file():
                fail(f"missing part {part['name']} of batch {part['batch']} ({folder}): carry the whole batch again")
            if path.stat().st_size != part["size"] or sha256(path) != part["sha256"]:
                fail(f"checksum mismatch: {path} is not the part the manifest lists (sha256 {part['sha256'][:16]}...)")
            given[part["name"]] = path
    for name, path in given.items():
        shutil.copyfile(path, stash / (name + ".tmp"))
        os.replace(stash / (name + ".tmp"), stash / name)

    # 2. Files whose parts are all in: reassembled, checked, then the ones to install go to pip in one call.
    wheels_dir = kit_dir / "wheels"
    wheels_dir.mkdir(exist_ok=True)
    ready, kept = [], []
    for f in manifest["files"]:
        if f["name"] in state["done"] or not all((stash / p["name"]).exists() for p in f["parts"]):
            continue
        if state["action"][f["dist"]] == "node":
            kept.append(f)
            continue
        wheel = wheels_dir / f["name"]
        with wheel.open("wb") as out:
            for part in f["parts"]:
                with (stash / part["name"]).open("rb") as src:
                    shutil.copyfileobj(src, out, MIB)
        if sha256(wheel) != f["sha256"]:
            wheel.unlink()
            fail(f"checksum mismatch: {f['name']} reassembled from its parts is not the file the manifest lists")
        ready.append(f)
    if ready:
        with tempfile.TemporaryDirectory(dir=kit_dir) as stage:
            command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels_dir)]
            command += ["--no-deps", "--no-compile", "--disable-pip-version-check", "--target", stage]
            env = {**os.environ, "PIP_ROOT_USER_ACTION": "ignore"}  # root on a GPU node is the norm
            result = subprocess.run(command + [f"{f['dist']}=={f['version']}" for f in ready], env=env)
            if result.returncode != 0:
                fail(f"pip could not install {', '.join(f['name'] for f in ready)} (its message is above)")
            merge(Path(stage), args.target)
    for f in ready + kept:
        state["done"][f["name"]] = "installed" if f in ready else "node"
        for part in f["parts"]:
            (stash / part["name"]).unlink()
        (wheels_dir / f["name"]).unlink(missing_ok=True)
    state["seen"] = sorted(set(state["seen"]) | set(batches))
    state_path.write_text(json.dumps(state, indent=1))

    waiting = sorted({p["batch"] for f in manifest["files"] if f["name"] not in state["done"] for p in f["parts"]})
    waiting = [b for b in waiting if b not in state["seen"]]
    installed = sum(v == "installed" for v in state["done"].values())
    print(
        f"kit {manifest['kit']}: {len(ready)} wheels installed now, {installed} in all, "
        f"{sum(v == 'node' for v in state['done'].values())} left to the node's own copy, into {args.target}"
    )
    if waiting:
        missing = ", ".join(f"{b:02d}" for b in waiting)
        if args.require_complete:
            fail(f"kit {manifest['kit']} is not complete: batches {missing} of {manifest['batches']} not yet given")
        print(f"waiting for batches {missing} of {manifest['batches']}")
    else:
        (kit_dir / "complete").write_text(f"{manifest['kit']}\n")
        print(f"kit complete: export PYTHONPATH={args.target.resolve()}:$PYTHONPATH")


if __name__ == "__main__":
    main()
