"""The offline GPU kit (benchmark/gpu/): the wheelhouse build on a small real package set (tyro and its three
dependencies, pinned by uv.lock, about 0.3 MB from PyPI), split into parts and batches, installed batch by batch
with a plain python3 and pip into a target folder (no index), a damaged or missing part refused in one line, and
run_all.sh in its tiny CPU mode."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "benchmark" / "gpu" / "build_wheelhouse.py"
INSTALL = ROOT / "benchmark" / "gpu" / "install.py"


def node_python() -> str:
    """A python3 with pip (the installer's only needs), standing in for the node's. The project's venv has no pip and
    comes first on PATH under `uv run`, so every python3 on PATH is tried, then the interpreter the venv was made
    from."""
    candidates = [
        str(Path(folder) / name)
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        for name in ("python3", "python")
    ]
    candidates.append(getattr(sys, "_base_executable", sys.executable))
    for path in candidates:
        if (
            os.access(path, os.X_OK)
            and subprocess.run([path, "-m", "pip", "--version"], capture_output=True).returncode == 0
        ):
            return path
    pytest.fail(
        "no python3 with pip on PATH or behind the venv: the installer needs one (the GPU node's python3 has it)"
    )


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """tyro's wheelhouse in parts of at most 60 kB and batches of at most 100 kB (tyro's 217 kB wheel: 4 parts)."""
    out = tmp_path_factory.mktemp("kit") / "wheelhouse"
    cache = [str(p) for p in [ROOT / "benchmark" / "gpu" / "wheelhouse" / "downloads"] if p.is_dir()]
    command = [sys.executable, str(BUILD), "--out", str(out), "--packages", "tyro", "--part-mb", "0.06"]
    command += ["--call-mib", str(100_000 / (1 << 20)), "--reserve-mib", "0", "--cache", *cache]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out, json.loads((out / "manifest.json").read_text()), result.stdout


def test_build_pins_the_lock_splits_with_checksums_and_packs_batches(kit):
    out, manifest, stdout = kit
    lock = (ROOT / "uv.lock").read_text()
    files = {f["dist"]: f for f in manifest["files"]}
    assert set(files) == {"tyro", "docstring-parser", "typeguard", "typing-extensions"}, stdout
    for f in files.values():
        assert f'name = "{f["dist"]}"\nversion = "{f["version"]}"' in lock  # the version uv.lock pins
        assert f["name"].endswith("-none-any.whl") or "cp312" in f["name"]
        data = b"".join((out / f"batch-{p['batch']:02d}" / p["name"]).read_bytes() for p in f["parts"])
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["size"]
        for p in f["parts"]:
            assert p["size"] <= 60_000
    assert len(files["tyro"]["parts"]) >= 4 and len(files["typing-extensions"]["parts"]) == 1
    assert "typing-extensions>=4.13.0" in files["tyro"]["requires"]
    assert "tyro>=0.9" in manifest["roots"]
    for batch in sorted(out.glob("batch-*")):  # each batch fits its call and carries the whole manifest
        assert sum(p.stat().st_size for p in batch.iterdir() if p.name != "manifest.json") <= 100_000
        assert json.loads((batch / "manifest.json").read_text())["kit"] == manifest["kit"]
    assert manifest["batches"] == len(list(out.glob("batch-*"))) >= 3


def copy_batches(out: Path, where: Path) -> list[Path]:
    shutil.copytree(out, where, ignore=shutil.ignore_patterns("downloads"))
    return sorted(where.glob("batch-*"))


def install(batches, target, *flags):
    command = [node_python(), str(INSTALL), *map(str, batches), "--target", str(target), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})


def test_install_batch_by_batch_then_import(kit, tmp_path):
    batches = copy_batches(kit[0], tmp_path / "wh")
    target = tmp_path / "site"
    first = install(batches[:1], target)
    assert first.returncode == 0, first.stderr
    assert "waiting for batches" in first.stdout and not (target / ".kit" / "complete").exists()
    unfinished = install(batches[1:2], target, "--require-complete")
    assert unfinished.returncode == 2 and unfinished.stderr.count("\n") == 1, unfinished.stderr
    assert unfinished.stderr.startswith("error: kit ") and "not complete" in unfinished.stderr
    rest = install(batches[2:], target, "--require-complete")
    assert rest.returncode == 0, rest.stderr
    assert "kit complete" in rest.stdout and (target / ".kit" / "complete").is_file()
    assert not list((target / ".kit" / "parts").iterdir())  # parts removed once installed
    code = "import tyro, docstring_parser; print(tyro.__file__)"
    imported = subprocess.run(
        [node_python(), "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(target)}
    )
    assert imported.returncode == 0 and imported.stdout.startswith(str(target)), imported.stderr
    again = install(batches, target)  # nothing left to do
    assert again.returncode == 0 and "0 wheels installed now" in again.stdout, again.stderr


@pytest.mark.parametrize("damage", ["corrupt", "missing", "corrupt-unsplit"])
def test_damaged_or_missing_part_is_refused_in_one_line_before_installing(kit, tmp_path, damage):
    out, manifest, _ = kit
    batches = copy_batches(out, tmp_path / "wh")
    files = {f["dist"]: f for f in manifest["files"]}
    part = files["typing-extensions" if damage == "corrupt-unsplit" else "tyro"]["parts"][
        1 if damage != "corrupt-unsplit" else 0
    ]
    path = tmp_path / "wh" / f"batch-{part['batch']:02d}" / part["name"]
    if damage == "missing":
        path.unlink()
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    result = install(batches, tmp_path / "site")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    expected = "error: missing part " if damage == "missing" else "error: checksum mismatch: "
    assert result.stderr.startswith(expected) and part["name"] in result.stderr, result.stderr
    installed = (
        [p.name for p in (tmp_path / "site").iterdir() if p.name != ".kit"] if (tmp_path / "site").exists() else []
    )
    assert installed == []  # nothing of any batch went in


def test_installer_refuses_batches_of_two_kits(kit, tmp_path):
    batches = copy_batches(kit[0], tmp_path / "wh")
    other = json.loads((batches[1] / "manifest.json").read_text())
    other["kit"] = "0" * 16
    (batches[1] / "manifest.json").write_text(json.dumps(other))
    result = install(batches[:2], tmp_path / "site")
    assert result.returncode == 2 and "belongs to kit 0000000000000000" in result.stderr, result.stderr


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
    check_logs(results, ("redq_continuous_action",))


def check_pixels(results: Path) -> None:
    check_logs(results, ("dqn_atari", "pqn_atari", "ppo_atari_envpool", "ppo_procgen"))


def check_impala(results: Path) -> None:
    assert "| MinAtar-Breakout-v1 | --no-cuda --num-actors 2" in (results / "impala_gpu.md").read_text()


RUN_ALL_ITEMS = {
    "ppo_isaacgym": check_ppo_isaacgym,
    "compile_table": check_compile_table,
    "mappo": check_mappo,
    "stock_trading": check_stock_trading,
    "elegant": check_elegant,
    "pixels": check_pixels,
    "impala": check_impala,
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


@pytest.mark.parametrize("item", RUN_ALL_ITEMS)
def test_run_all_tiny_cpu_mode(tmp_path, item):
    """Each item of run_all.sh at tiny sizes on the CPU, alone (ONLY=item), so that the items spread over the
    test workers: the summary lists it as ok, and only it, and its results are in place."""
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


def test_compile_table_rows_use_flags_the_scripts_have():
    """The GPU table's rows (not run here: 15 runs of HalfCheetah and CartPole) name flags their scripts define."""
    sys.path.insert(0, str(ROOT / "benchmark" / "gpu"))
    import compile_table

    for script, env_id, flags, _, _ in compile_table.ROWS:
        source = (ROOT / "cleanrl" / f"{script}.py").read_text()
        for flag in [f for f in flags if f.startswith("--")] + ["--env-id", "--seed", "--exp-name"]:
            assert f"    {flag[2:].replace('-', '_')}:" in source, (script, flag)


def test_installer_keeps_the_nodes_copies_that_meet_every_requirement_and_shadows_the_rest(kit, capsys):
    """install.plan on a made-up node: a copy new enough stays the node's, an older one is replaced (with a note),
    a requirement outside the kit that the node cannot meet is refused in one line."""
    sys.path.insert(0, str(ROOT / "benchmark" / "gpu"))
    import install

    manifest = kit[1]
    action, notes = install.plan(manifest, {"typing-extensions": "4.20.0", "docstring-parser": "0.15"})
    assert action == {
        "tyro": "install",
        "typeguard": "install",
        "typing-extensions": "node",
        "docstring-parser": "install",
    }
    assert notes == [
        "docstring-parser: the node's 0.15 is shadowed by the kit's 0.18.0 (tyro needs docstring-parser>=0.16)"
    ]
    outside = {
        **manifest,
        "files": manifest["files"] + [{**manifest["files"][0], "dist": "x", "requires": ["torch>=9"]}],
    }
    with pytest.raises(SystemExit) as exit_info:
        install.plan(outside, {"torch": "2.11.0+cu130"})
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: torch is not in the kit and the node has 2.11.0+cu130: x needs torch>=9\n"
