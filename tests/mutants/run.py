"""Planted bugs: each patch in this folder is a one-line wiring mistake in a script (or in cleanrl_utils); each must
make that script's tests fail. A test suite that lets one through does not test the algorithm.

    uv run --all-extras python tests/mutants/run.py                 # every patch
    uv run --all-extras python tests/mutants/run.py dqn_atari_*     # some (names or globs, without .patch)
    uv run --all-extras python tests/mutants/run.py --stale         # those whose result is missing or out of date
    uv run --all-extras python tests/mutants/run.py --list

A patch is a unified diff against the repository (`git diff` output) preceded by comment lines: the first says what
the bug is, a `# tests:` line names the test files (or pytest node ids) that must catch it. Each patch is applied to
a fresh copy of cleanrl/, cleanrl_utils/, tests/ and pyproject.toml in a temporary folder, those tests run there with
pytest (`-x`, --workers processes; the copy's cleanrl_utils first on PYTHONPATH), and the mutant is reported killed
(the tests failed), survived (they passed) or broken (the patch did not apply, or the patched file does not compile).
--jobs mutants run at once (each in its own copy). A mutant whose tests name mjlab runs in projects/mjlab's
environment (`uv sync --project projects/mjlab` first), where those tests do not skip.

The report (--report, default tests/mutants/RESULTS.md) keeps one row per mutant: its last outcome and the commit it
ran at ("+" when files it depends on had uncommitted changes). A run replaces the rows of the mutants it ran and keeps
the others; a row is out of date when a file it depends on (the patched files, its test files and the test files they
import from, tests/conftest.py, tests/probe*.py, tests/*_reference.py, cleanrl_utils/, pyproject.toml) changed since
its commit. The exit code is 1 if any mutant of this run survived or broke. Not part of CI (minutes per mutant); run
it after changing a script or its tests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COPIED = ("cleanrl", "cleanrl_utils", "tests", "pyproject.toml")
# Every mutant's tests use them (update_reference: the gradient checks; continuous_reference: the continuous scripts').
SHARED = ["tests/conftest.py", "tests/probe*.py", "tests/*_reference.py", "cleanrl_utils", "pyproject.toml"]
HEADER = "| mutant | planted bug | tests | outcome | seconds | commit | first failure |"
# --simulator mjlab's tests run in projects/mjlab's environment (mjlab pins its own MuJoCo) and skip in the main one,
# where its mutants would survive: a mutant whose tests name mjlab runs with that environment's Python.
MJLAB_PYTHON = ROOT / "projects" / "mjlab" / ".venv" / "bin" / "python"


def python_for(tests: list[str]) -> str | None:
    """The interpreter that runs these tests; None where it is not installed."""
    if any("mjlab" in Path(test.split("::")[0]).name for test in tests):
        return str(MJLAB_PYTHON) if MJLAB_PYTHON.is_file() else None
    return sys.executable


def read_patch(path: Path) -> tuple[str, list[str]]:
    """The bug's one-line description and the tests that must catch it."""
    comments = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
    tests = [word for line in comments if line.startswith("tests:") for word in line[len("tests:") :].split()]
    if not comments or not tests:
        raise SystemExit(f"{path.name}: needs a first comment line saying what the bug is and a '# tests:' line")
    return comments[0], tests


def patched_files(path: Path) -> list[str]:
    return [line[len("+++ b/") :].strip() for line in path.read_text().splitlines() if line.startswith("+++ b/")]


def imported_test_files(test_file: str) -> set[str]:
    """The other test files a test file imports from (tests/test_ppo_atari.py's references, say), transitively."""
    found, todo = set(), [test_file]
    while todo:
        path = ROOT / todo.pop()
        text = path.read_text() if path.is_file() else ""
        for module in re.findall(r"^(?:from|import) (test_\w+)", text, re.MULTILINE):
            name = f"tests/{module}.py"
            if name not in found:
                found.add(name)
                todo.append(name)
    return found


def depends_on(path: Path) -> list[str]:
    """The files whose change can change this mutant's outcome (git pathspecs): the patched files, its test files and
    the test files they import from, and the files every test uses (SHARED)."""
    _, tests = read_patch(path)
    test_files = {t.split("::")[0] for t in tests}
    imported = set().union(*(imported_test_files(t) for t in test_files))
    return sorted({*patched_files(path), *test_files, *imported, *SHARED})


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def commit_of(path: Path) -> str:
    """HEAD's short hash, with "+" when a file the mutant depends on differs from HEAD."""
    head = git("rev-parse", "--short", "HEAD").stdout.strip()
    dirty = git("diff", "--quiet", "HEAD", "--", *depends_on(path)).returncode != 0
    return head + ("+" if dirty else "")


def is_current(path: Path, row: dict) -> bool:
    """A row is current if it ran at a clean commit and nothing it depends on changed since (working tree included)."""
    commit = row["commit"]
    if not commit or commit.endswith("+"):
        return False
    return git("diff", "--quiet", commit, "--", *depends_on(path)).returncode == 0


def read_report(report: Path) -> dict[str, dict]:
    """The rows of an earlier report, by mutant name."""
    rows = {}
    if report.is_file():
        for line in report.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 7 and cells[0] not in ("mutant", "---"):
                keys = ("mutant", "what", "tests", "outcome", "seconds", "commit", "detail")
                rows[cells[0]] = dict(zip(keys, cells))
    return rows


def write_report(report: Path, rows: dict[str, dict], patches: list[Path]) -> None:
    by_name = {p.stem: p for p in patches}
    kept = {name: row for name, row in rows.items() if name in by_name}  # a deleted patch's row goes
    counts: dict[str, int] = {}
    for row in kept.values():
        counts[row["outcome"].split()[0]] = counts.get(row["outcome"].split()[0], 0) + 1
    current = sum(is_current(by_name[name], row) for name, row in kept.items())
    missing = len(patches) - len(kept)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    lines = [
        f"# Planted bugs: last results ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`uv run --all-extras python tests/mutants/run.py`: {len(patches)} mutants; rows: {summary}"
        + (f"; {missing} never run" if missing else "")
        + f". {current} of {len(kept)} rows are current (nothing they depend on changed since their commit).",
        "",
        HEADER,
        "|---|---|---|---|---|---|---|",
    ]
    for name in sorted(kept):
        row = kept[name]
        cells = [name, row["what"], row["tests"], row["outcome"], row["seconds"], row["commit"], row["detail"]]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    report.write_text("\n".join(lines) + "\n")


def run_mutant(path: Path, workers: int, timeout: float) -> tuple[str, float, str]:
    """Apply one patch to a fresh copy, run its tests; return (outcome, seconds, detail)."""
    _, tests = read_patch(path)
    start = time.monotonic()
    python = python_for(tests)
    if python is None:
        return "broken", 0.0, "its tests need projects/mjlab's environment: uv sync --project projects/mjlab"
    with tempfile.TemporaryDirectory(prefix="mutant_") as scratch:
        copy = Path(scratch)
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "mutants"))
            else:
                shutil.copy2(source, copy / name)
        applied = subprocess.run(["git", "apply", str(path)], cwd=copy, capture_output=True, text=True)
        if applied.returncode != 0:
            return "broken", time.monotonic() - start, applied.stderr.strip().splitlines()[0]
        for name in patched_files(path):
            try:
                py_compile.compile(str(copy / name), doraise=True)
            except py_compile.PyCompileError as error:
                return "broken", time.monotonic() - start, str(error).splitlines()[0]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")]))
        command = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        if workers > 1:
            command += ["-n", str(workers)]
        try:
            result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed (timeout)", time.monotonic() - start, f"the tests ran past {timeout:.0f} s"
        summary = (result.stdout.strip().splitlines() or [""])[-1]
        if result.returncode == 0:
            return "survived", time.monotonic() - start, summary
        failed = [line.split(" - ")[0] for line in result.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        return "killed", time.monotonic() - start, (failed[0] if failed else summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="patch names or globs (default: all)")
    parser.add_argument("--list", action="store_true", help="list the patches and what each plants, then exit")
    parser.add_argument("--stale", action="store_true", help="only mutants whose report row is missing or out of date")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per mutant (default 2)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a mutant's tests may take")
    parser.add_argument("--report", default=str(HERE / "RESULTS.md"), help="the report to update ('' for none)")
    args = parser.parse_args()
    every_patch = sorted(HERE.glob("*.patch"))
    patches = every_patch
    if args.names:
        wanted = [n.removesuffix(".patch") for n in args.names]
        patches = [p for p in patches if any(fnmatch.fnmatch(p.stem, w) for w in wanted)]
        if not patches:
            print(f"no patch matches {' '.join(args.names)}", file=sys.stderr)
            raise SystemExit(2)
    report = Path(args.report) if args.report else None
    rows = read_report(report) if report else {}
    if args.stale:
        patches = [p for p in patches if p.stem not in rows or not is_current(p, rows[p.stem])]
    if args.list:
        for path in patches:
            print(f"{path.stem}: {read_patch(path)[0]}")
        return
    counts: dict[str, int] = {}
    commits = {path: commit_of(path) for path in patches}  # before the runs: what they ran against
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_mutant, path, args.workers, args.timeout): path for path in patches}
        for future in concurrent.futures.as_completed(futures):
            path = futures[future]
            what, tests = read_patch(path)
            outcome, seconds, detail = future.result()
            counts[outcome.split()[0]] = counts.get(outcome.split()[0], 0) + 1
            print(f"{outcome:>17}  {seconds:6.0f} s  {path.stem}: {what}  [{detail}]", flush=True)
            rows[path.stem] = dict(
                mutant=path.stem,
                what=what,
                tests=" ".join(tests),
                outcome=outcome,
                seconds=f"{seconds:.0f}",
                commit=commits[path],
                detail=re.sub(r"\s+", " ", detail),
            )
            if report:
                write_report(report, rows, every_patch)  # after each mutant: an interrupted run keeps its rows
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"{len(patches)} mutants: {summary}")
    raise SystemExit(1 if counts.get("survived") or counts.get("broken") else 0)


if __name__ == "__main__":
    main()
