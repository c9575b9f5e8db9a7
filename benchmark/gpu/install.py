"""Install the GPU kit (benchmark/gpu/build_kit.py) on the node with its own python3: no package index, no pip, no
uv, the node's torch and other packages untouched (everything goes into one --target folder, which PYTHONPATH then
puts first). Standard library only.

    python3 benchmark/gpu/install.py benchmark/gpu/kit/call-02 [more call folders] --target benchmark/gpu/site

Incremental, one call's folder at a time (benchmark/gpu/call.sh runs it): the pieces each folder should hold are
checked against the manifest (SHA-256) before anything is touched (a missing or damaged one is refused in one line),
kept under TARGET/.kit/parts, and each group whose pieces are all in is checked whole, its requirements on the
node's own packages checked against the node's versions, and unpacked into TARGET. --require GROUP makes a group
not yet complete an error.
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
import tarfile
from pathlib import Path

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


def unmet(needs: list[str], node: dict[str, str]) -> list[str]:
    """The requirements (name + specifier, as the manifest writes them) that the node's versions do not meet."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement
    bad = []
    for text in needs:
        req = Requirement(text)
        have = node.get(canonical(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            bad.append(f"{text} (the node has {have or 'none'})")
    return bad


def read_calls(folders: list[Path]) -> tuple[dict, dict[int, Path]]:
    """The manifest the call folders carry (all the same kit) and {call number: folder}."""
    manifest, calls = None, {}
    for folder in folders:
        match = re.fullmatch(r"call-(\d+)", folder.name)
        if match is None or not (folder / "manifest.json").is_file():
            fail(f"{folder}: not a call folder of the GPU kit (call-NN holding a manifest.json)")
        this = json.loads((folder / "manifest.json").read_text())
        if manifest is not None and this["kit"] != manifest["kit"]:
            fail(f"{folder} belongs to kit {this['kit']}, the other folders to kit {manifest['kit']}: rebuild or pick")
        manifest = this
        calls[int(match.group(1))] = folder
    return manifest, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calls", type=Path, nargs="+", help="call folders of the kit (call-NN)")
    parser.add_argument("--target", type=Path, required=True, help="the folder to install into (put on PYTHONPATH)")
    parser.add_argument("--require", nargs="*", default=[], help="groups that must be complete after this call")
    args = parser.parse_args()
    manifest, calls = read_calls(args.calls)
    groups = {g["name"]: g for g in manifest["groups"]}
    unknown = [name for name in args.require if name not in groups]
    if unknown:
        fail(f"--require {' '.join(unknown)}: kit {manifest['kit']} has the groups {', '.join(groups)}")
    kit_dir = args.target / ".kit"
    state_path = kit_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"kit": manifest["kit"], "done": []}
    if state["kit"] != manifest["kit"]:
        fail(f"{args.target} holds kit {state['kit']}, these calls are kit {manifest['kit']}: remove {args.target}")
    stash = kit_dir / "parts"

    # 1. Every piece these calls should hold: present and as the manifest says, before anything is touched.
    given = {}
    for group in manifest["groups"]:
        for part in group["parts"]:
            folder = calls.get(part["call"])
            if folder is None or group["name"] in state["done"] or (stash / part["name"]).exists():
                continue
            path = folder / part["name"]
            if not path.is_file():
                fail(f"missing piece {part['name']} of call {part['call']} ({folder}): carry the whole folder again")
            if path.stat().st_size != part["size"] or sha256(path) != part["sha256"]:
                fail(f"checksum mismatch: {path} is not the piece the manifest lists (sha256 {part['sha256'][:16]}...)")
            given[part["name"]] = path
    stash.mkdir(parents=True, exist_ok=True)
    for name, path in given.items():
        shutil.copyfile(path, stash / (name + ".tmp"))
        os.replace(stash / (name + ".tmp"), stash / name)

    # 2. Groups whose pieces are all in: joined, checked, their needs of the node checked, unpacked.
    node = None
    installed = []
    for group in manifest["groups"]:
        if group["name"] in state["done"] or not all((stash / p["name"]).exists() for p in group["parts"]):
            continue
        node = node if node is not None else node_versions()
        bad = unmet(group["needs"], node)
        if bad:
            fail(f"group {group['name']} needs of the node's own packages what it lacks: {'; '.join(bad)}")
        archive = kit_dir / group["archive"]
        with archive.open("wb") as out:
            for part in group["parts"]:
                with (stash / part["name"]).open("rb") as src:
                    shutil.copyfileobj(src, out, MIB)
        if sha256(archive) != group["sha256"]:
            archive.unlink()
            fail(f"checksum mismatch: {group['archive']} joined from its pieces is not the archive the manifest lists")
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(args.target, filter="data")
        archive.unlink()
        for part in group["parts"]:
            (stash / part["name"]).unlink()
        state["done"].append(group["name"])
        state_path.write_text(json.dumps(state, indent=1))
        installed.append(group["name"])
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(json.dumps(state, indent=1))

    waiting = [g["name"] for g in manifest["groups"] if g["name"] not in state["done"]]
    print(
        f"kit {manifest['kit']}: {', '.join(installed) or 'no group'} installed now; in {args.target}: "
        f"{', '.join(state['done']) or 'nothing yet'}" + (f"; waiting for {', '.join(waiting)}" if waiting else "")
    )
    missing = [name for name in args.require if name not in state["done"]]
    if missing:
        fail(f"kit {manifest['kit']}: {', '.join(missing)} not complete after calls {', '.join(map(str, calls))}")


if __name__ == "__main__":
    main()
