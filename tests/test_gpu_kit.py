"""The offline GPU kit (benchmark/gpu/): the builder's cut and schedule, a small real kit (two groups, tyro and
stockstats with what they need beyond the node's packages, pinned by uv.lock, about 0.4 MB from PyPI) cut into calls
of 100 kB, installed call by call with install.py into a target folder (a damaged or missing piece, calls of two kits,
and a node lacking what a group needs each refused in one line before anything is unpacked), `--check` against the
tree, and run_all.sh's items in their tiny CPU mode. The whole headline kit on a rehearsed node:
tests/test_gpu_rehearsal.py."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmark" / "gpu"
INSTALL = GPU / "install.py"
CALL_BYTES = 100_000


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build_kit = load("build_kit")


def test_cut_lays_the_archives_end_to_end_in_calls_of_the_capacity():
    calls = build_kit.cut([("a", 250), ("b", 30), ("c", 100)], 100)
    assert calls == [
        [("a", 0, 100)],
        [("a", 100, 100)],
        [("a", 200, 50), ("b", 0, 30), ("c", 0, 20)],
        [("c", 20, 80)],
    ]
    assert build_kit.cut([("a", 100)], 100) == [[("a", 0, 100)]]  # exactly full: no empty call after it
    assert build_kit.cut([], 100) == []


def test_schedule_runs_each_item_once_its_group_is_in_within_the_calls_seconds():
    groups = [build_kit.Group("g1", [], ["x", "y"]), build_kit.Group("g2", [], ["z"])]
    items = {"x": 300, "y": 150, "w": 10, "z": 100}  # priority order; w belongs to no group of this kit
    plan, used = build_kit.schedule({"g1": 2, "g2": 2}, groups, items, budget=400)
    assert plan == {2: ["x"], 3: ["y", "z"]} and used == {2: 300, 3: 250}
    plan, _ = build_kit.schedule({"g1": 1, "g2": 3}, groups, items, budget=540)
    assert plan == {1: ["x"], 2: ["y"], 3: ["z"]}  # the first (headline) item alone; z waits for its group
    plan, _ = build_kit.schedule({"g1": 1, "g2": 1}, groups, {"y": 150, "x": 300, "z": 100}, budget=540)
    assert plan == {1: ["y"], 2: ["x", "z"]}
    plan, _ = build_kit.schedule({"g1": 1, "g2": 1}, groups, {"x": 600, "y": 10}, budget=540)
    assert plan == {1: ["x"], 2: ["y"]}  # an item over the budget still runs, alone in its call


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """Two groups cut into 100 kB calls beside a tree counted as empty (the builder run in this process, with its
    GROUPS replaced: the real ones are hundreds of MB)."""
    out = tmp_path_factory.mktemp("kit") / "kit"
    groups = [
        build_kit.Group("cli", ["tyro"], ["ppo_isaacgym"], prune={"**/py.typed": "type-checker marker"}),
        build_kit.Group("indicators", ["stockstats"], ["stock_trading"]),
    ]
    argv = ["build_kit.py", "--out", str(out), "--xz-preset", "1", "--tree-bytes", "0", "--margin-mib", "0"]
    argv += ["--call-mib", str(CALL_BYTES / (1 << 20))]
    saved = build_kit.GROUPS, sys.argv
    build_kit.GROUPS, sys.argv = groups, argv
    try:
        build_kit.main()
    finally:
        build_kit.GROUPS, sys.argv = saved
    return out, json.loads((out / "manifest.json").read_text())


def test_build_pins_the_lock_leaves_the_nodes_packages_out_and_cuts_calls_that_fit(kit):
    out, manifest = kit
    lock = (ROOT / "uv.lock").read_text()
    cli, indicators = manifest["groups"]
    assert set(cli["dists"]) == {"tyro", "docstring-parser", "typeguard"}  # typing-extensions is the node's
    assert set(indicators["dists"]) == {"stockstats"}  # pandas and numpy are the node's
    for group in manifest["groups"]:
        for name, version in group["dists"].items():
            assert f'name = "{name}"\nversion = "{version}"' in lock  # the version uv.lock pins
    assert any(n.startswith("typing-extensions>=") for n in cli["needs"]), cli["needs"]
    assert any(n.startswith("pandas") for n in indicators["needs"]), indicators["needs"]
    assert cli["pruned"]["**/py.typed"][0] > 0
    for group in manifest["groups"]:  # the pieces, joined, are the archive
        data = b"".join((out / f"call-{p['call']:02d}" / p["name"]).read_bytes() for p in group["parts"])
        assert len(data) == group["size"] and build_kit.hashlib.sha256(data).hexdigest() == group["sha256"]
    calls = sorted(out.glob("call-*"))
    assert len(calls) == len(manifest["calls"]) >= 3
    for folder in calls:  # each call fits, and carries the whole manifest
        pieces = sum(p.stat().st_size for p in folder.iterdir() if p.name != "manifest.json")
        assert pieces <= CALL_BYTES - build_kit.MANIFEST_ROOM
        assert pieces + (folder / "manifest.json").stat().st_size <= CALL_BYTES
        assert json.loads((folder / "manifest.json").read_text()) == manifest
    last_cli = cli["parts"][-1]["call"]
    assert manifest["calls"][last_cli - 1]["items"][0] == "ppo_isaacgym"  # runs where its group is complete
    runbook = (out / "RUNBOOK.md").read_text()
    assert all(f"`bash benchmark/gpu/call.sh {c['call']}`" in runbook for c in manifest["calls"])


def test_check_says_whether_the_kit_still_fits_beside_the_tree(kit):
    out, _ = kit
    command = [sys.executable, str(GPU / "build_kit.py"), "--out", str(out), "--check"]
    command += ["--call-mib", str(CALL_BYTES / (1 << 20))]
    fits = subprocess.run([*command, "--tree-bytes", "0"], capture_output=True, text=True)
    assert fits.returncode == 0 and "calls fit beside the 0.0 MiB tree" in fits.stdout, fits.stderr
    over = subprocess.run([*command, "--tree-bytes", str(CALL_BYTES)], capture_output=True, text=True)
    assert over.returncode == 2 and over.stderr.count("\n") == 1, over.stderr
    assert over.stderr.startswith("error: call 1 carries ") and "rebuild the kit" in over.stderr


def copy_calls(out: Path, where: Path) -> list[Path]:
    shutil.copytree(out, where, ignore=shutil.ignore_patterns("downloads", "archives", "cpu-only"))
    return sorted(where.glob("call-*"))


def install(calls, target, *flags):
    command = [sys.executable, str(INSTALL), *map(str, calls), "--target", str(target), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})


def unpacked(target: Path) -> list[str]:
    return sorted(p.name for p in target.iterdir() if p.name != ".kit") if target.exists() else []


def test_install_call_by_call_then_import(kit, tmp_path):
    calls = copy_calls(kit[0], tmp_path / "kit")
    manifest = kit[1]
    early = install(calls[:1], tmp_path / "early", "--require", "indicators")  # its pieces are not all in
    assert early.returncode == 2 and early.stderr.count("\n") == 1, early.stderr
    assert early.stderr.startswith("error: kit ") and "indicators not complete after calls 1" in early.stderr
    target = tmp_path / "site"
    for n, folder in enumerate(calls, start=1):  # each group unpacked by the call that brings its last piece
        complete = [g["name"] for g in manifest["groups"] if g["parts"][-1]["call"] <= n]
        result = install([folder], target, "--require", *complete)
        assert result.returncode == 0, result.stderr
        assert f"in {target}: {', '.join(complete) or 'nothing yet'}" in result.stdout, result.stdout
        assert ("tyro" in unpacked(target)) == ("cli" in complete)
        assert ("stockstats.py" in unpacked(target)) == ("indicators" in complete)
    assert complete == ["cli", "indicators"]
    assert not list((target / ".kit" / "parts").iterdir())  # pieces removed once unpacked
    assert not list(target.rglob("py.typed"))  # pruned
    code = "import tyro, stockstats, docstring_parser, typeguard; print(tyro.__file__, stockstats.__file__)"
    imported = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(target)}
    )
    assert imported.returncode == 0 and imported.stdout.count(str(target)) == 2, imported.stderr
    again = install(calls, target)  # nothing left to do
    assert again.returncode == 0 and "no group installed now" in again.stdout, again.stderr


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_or_missing_piece_is_refused_in_one_line_before_anything_is_unpacked(kit, tmp_path, damage):
    out, manifest = kit
    calls = copy_calls(out, tmp_path / "kit")
    part = manifest["groups"][0]["parts"][1]
    path = tmp_path / "kit" / f"call-{part['call']:02d}" / part["name"]
    if damage == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    result = install(calls, tmp_path / "site")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    expected = "error: missing piece " if damage == "missing" else "error: checksum mismatch: "
    assert result.stderr.startswith(expected) and part["name"] in result.stderr, result.stderr
    assert unpacked(tmp_path / "site") == []


def test_calls_of_two_kits_are_refused(kit, tmp_path):
    calls = copy_calls(kit[0], tmp_path / "kit")
    other = json.loads((calls[1] / "manifest.json").read_text())
    other["kit"] = "0" * 16
    (calls[1] / "manifest.json").write_text(json.dumps(other))
    result = install(calls[:2], tmp_path / "site")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "belongs to kit 0000000000000000" in result.stderr
    target = tmp_path / "site"
    assert install(calls[:1], target).returncode == 0  # and a target folder holding another kit's pieces
    later = install(calls[1:2], target)
    assert later.returncode == 2 and f"holds kit {kit[1]['kit']}, these calls are kit 0000" in later.stderr


def test_a_node_lacking_what_a_group_needs_is_refused_in_one_line(kit, tmp_path):
    calls = copy_calls(kit[0], tmp_path / "kit")
    for folder in calls:
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["groups"][0]["needs"].append("typing-extensions>=999")
        (folder / "manifest.json").write_text(json.dumps(manifest))
    result = install(calls, tmp_path / "site")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: group cli needs of the node's own packages what it lacks: ")
    assert "typing-extensions>=999 (the node has 4." in result.stderr
    assert unpacked(tmp_path / "site") == []


def test_pack_is_deterministic_and_keeps_modes(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "lib.so").write_bytes(b"\x7fELF" + bytes(range(256)) * 40)
    (site / "pkg" / "lib.so").chmod(0o755)
    (site / "pkg" / "__init__.py").write_text("x = 1\n")
    build_kit.pack(site, tmp_path / "a.tar.xz", "1")
    os.utime(site / "pkg" / "__init__.py", (1, 1))
    build_kit.pack(site, tmp_path / "b.tar.xz", "1")
    assert (tmp_path / "a.tar.xz").read_bytes() == (tmp_path / "b.tar.xz").read_bytes()
    with tarfile.open(tmp_path / "a.tar.xz") as tar:
        assert tar.getnames() == ["pkg", "pkg/__init__.py", "pkg/lib.so"]
        assert tar.getmember("pkg/lib.so").mode == 0o755 and tar.getmember("pkg/lib.so").uid == 0


def check_ppo_isaacgym(results: Path) -> None:
    assert "| Ant | MuJoCo Warp" in (results / "ppo_isaacgym_gpu.md").read_text()


def check_compile_table(results: Path) -> None:
    table = (results / "compile_tiny.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| ppo | CartPole-v1 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2].endswith("(256 steps)") and float(cells[2].split()[0].replace(",", "")) > 0  # eager
    assert cells[4].startswith("refused:") and "--cudagraphs needs a CUDA GPU" in cells[4]  # on a CPU
    assert cells[3].endswith("(256 steps)") and float(cells[3].split()[0].replace(",", "")) > 0  # --compile


def check_mappo(results: Path) -> None:
    assert "| 8 |" in (results / "mappo_gpu.md").read_text()


def check_stock_trading(results: Path) -> None:
    assert "StockTradingVecEnv (cpu) | 4 |" in (results / "stock_trading_sps_gpu.md").read_text()


def check_logs(results: Path, scripts: tuple) -> None:
    for script in scripts:
        log = next(results.glob(f"{script}_gpu.log")).read_text()
        assert "Traceback" not in log and "100%" in log, log[-2000:]


def check_elegant(results: Path) -> None:
    assert "PointChasingVecEnv (cpu) | 4 |" in (results / "point_chasing_sps_gpu.md").read_text()
    check_logs(results, ("redq_continuous_action", "crossq_continuous_action"))


def check_pixels(results: Path) -> None:
    check_logs(results, ("dqn_atari", "pqn_atari", "ppo_atari_envpool", "ppo_procgen"))


def check_impala(results: Path) -> None:
    assert "| MinAtar-Breakout-v1 | --no-cuda --num-actors 2" in (results / "impala_gpu.md").read_text()


def check_fast_td3(results: Path) -> None:
    for log in ("fast_td3_gpu_Hopper.log", "ppo_beside_fast_td3_gpu_Hopper.log"):
        text = (results / log).read_text()
        assert "Traceback" not in text and "64/64 steps (100%)" in text, text[-2000:]


def check_fast_sac(results: Path) -> None:
    text = (results / "fast_sac_gpu_Hopper.log").read_text()
    assert "Traceback" not in text and "64/64 steps (100%)" in text, text[-2000:]


def check_amp(results: Path) -> None:
    table = (results / "amp_tiny.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| ppo_atari | MinAtar/Breakout-v1 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    for cell in cells[3:5]:  # float32, --amp
        assert cell.endswith("(512 steps)") and float(cell.split()[0].replace(",", "")) > 0, row
    assert cells[5].endswith("x") and cells[6] == "- / -", row  # the ratio; no GPU memory on a CPU
    assert "--amp" in (results / "amp_gpu_logs" / "ppo_atari__amp.log").read_text().splitlines()[0]


def check_simbav2(results: Path) -> None:
    check_logs(results, ("simbav2_continuous_action_simbav2", "sac_continuous_action_simbav2"))


RUN_ALL_ITEMS = {
    "ppo_isaacgym": check_ppo_isaacgym,
    "compile_table": check_compile_table,
    "mappo": check_mappo,
    "stock_trading": check_stock_trading,
    "elegant": check_elegant,
    "pixels": check_pixels,
    "impala": check_impala,
    "fast_td3": check_fast_td3,
    "fast_sac": check_fast_sac,
    "amp": check_amp,
    "simbav2": check_simbav2,
}


def run_all_tiny(tmp_path: Path, only: str) -> tuple[subprocess.CompletedProcess, Path]:
    """run_all.sh --tiny with ONLY=`only`, in a copy of the repository (its runs/ stay there)."""
    for name in ("cleanrl", "cleanrl_utils"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "benchmark" / "gpu").mkdir(parents=True)
    for path in [*(ROOT / "benchmark").glob("*.sh"), *(ROOT / "benchmark").glob("*.py")]:
        shutil.copy(path, tmp_path / "benchmark")
    for path in (ROOT / "benchmark" / "gpu").glob("*.[ps][yh]"):
        shutil.copy(path, tmp_path / "benchmark" / "gpu")
    results = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "RESULTS": str(results), "PYTHONPATH": "", "ONLY": only}
    result = subprocess.run(
        ["bash", str(tmp_path / "benchmark" / "gpu" / "run_all.sh"), "--tiny"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert not list(tmp_path.glob("benchmark/results"))  # nothing written beside the copied scripts
    return result, results


# The headline item runs in tests/test_gpu_rehearsal.py (on a bare node's Python, checked as here).
HEADLINE_ITEM = "ppo_isaacgym"


@pytest.mark.parametrize("item", [item for item in RUN_ALL_ITEMS if item != HEADLINE_ITEM])
def test_run_all_tiny_cpu_mode(tmp_path, item):
    """Each other item of run_all.sh at tiny sizes on the CPU, alone (ONLY=item): the summary lists it as ok, and
    only it, and its results are in place."""
    result, results = run_all_tiny(tmp_path, item)
    summary = (results / "gpu_run_all.md").read_text()
    rows = [line for line in summary.splitlines() if line.startswith("| ") and not line.startswith("| item")]
    assert rows[0].startswith(f"| {item} | ok |") and len(rows) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    RUN_ALL_ITEMS[item](results)


def test_run_all_refuses_an_unknown_item_in_one_line(tmp_path):
    result = subprocess.run(
        ["bash", str(ROOT / "benchmark" / "gpu" / "run_all.sh"), "--tiny"],
        capture_output=True,
        text=True,
        env={**os.environ, "ONLY": "pixels atari", "RESULTS": str(tmp_path)},
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "ONLY names atari" in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.parametrize("table", ["compile_table", "amp_table"])
def test_gpu_table_rows_use_flags_the_scripts_have(table):
    """The GPU tables' rows (not run here: 15 runs of HalfCheetah and CartPole; 10 of Atari and Procgen) name flags
    their scripts define."""
    module = load(table)
    for script, env_id, flags, *_ in module.ROWS:
        source = (ROOT / "cleanrl" / f"{script}.py").read_text()
        mode_flags = [flag for _, flags in module.MODES for flag in flags]
        for flag in [f for f in flags + mode_flags if f.startswith("--")] + ["--env-id", "--seed", "--exp-name"]:
            assert f"    {flag[2:].replace('-', '_')}:" in source, (script, flag)
