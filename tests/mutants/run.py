"""Planted bugs: each patch in this folder is a one-line wiring mistake in a script (or in cleanrl_utils); each must
make that script's tests fail. A test suite that lets one through does not test the algorithm.

    uv run --all-extras python tests/mutants/run.py                 # every patch
    uv run --all-extras python tests/mutants/run.py dqn_atari_*     # some (names or globs, without .patch)
    uv run --all-extras python tests/mutants/run.py --list

A patch is a unified diff against the repository (`git diff` output) preceded by comment lines: the first says what
the bug is, a `# tests:` line names the test files (or pytest node ids) that must catch it. Each patch is applied to
a fresh copy of cleanrl/, cleanrl_utils/, tests/ and pyproject.toml in a temporary folder, those tests run there with
pytest (`-x`, --workers processes; the copy's cleanrl_utils first on PYTHONPATH), and the mutant is reported killed
(the tests failed), survived (they passed) or broken (the patch did not apply, or the patched file does not compile).
The table goes to stdout and to --report (default tests/mutants/RESULTS.md); the exit code is 1 if any survived or
broke. Not part of CI (minutes per mutant); run it after changing a script or its tests.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COPIED = ("cleanrl", "cleanrl_utils", "tests", "pyproject.toml")


def read_patch(path: Path) -> tuple[str, list[str]]:
    """The bug's one-line description and the tests that must catch it."""
    comments = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
    tests = [word for line in comments if line.startswith("tests:") for word in line[len("tests:") :].split()]
    if not comments or not tests:
        raise SystemExit(f"{path.name}: needs a first comment line saying what the bug is and a '# tests:' line")
    return comments[0], tests


def patched_files(path: Path) -> list[str]:
    return [line[len("+++ b/") :].strip() for line in path.read_text().splitlines() if line.startswith("+++ b/")]


def run_mutant(path: Path, workers: int, timeout: float) -> tuple[str, float, str]:
    """Apply one patch to a fresh copy, run its tests; return (outcome, seconds, detail)."""
    _, tests = read_patch(path)
    start = time.monotonic()
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
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
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
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per mutant (default 2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a mutant's tests may take")
    parser.add_argument("--report", default=str(HERE / "RESULTS.md"), help="where to write the table ('' for none)")
    args = parser.parse_args()
    patches = sorted(HERE.glob("*.patch"))
    if args.names:
        wanted = [n.removesuffix(".patch") for n in args.names]
        patches = [p for p in patches if any(fnmatch.fnmatch(p.stem, w) for w in wanted)]
        if not patches:
            print(f"no patch matches {' '.join(args.names)}", file=sys.stderr)
            raise SystemExit(2)
    if args.list:
        for path in patches:
            print(f"{path.stem}: {read_patch(path)[0]}")
        return
    rows, counts = [], {}
    for path in patches:
        what, tests = read_patch(path)
        outcome, seconds, detail = run_mutant(path, args.workers, args.timeout)
        counts[outcome.split()[0]] = counts.get(outcome.split()[0], 0) + 1
        print(f"{outcome:>17}  {seconds:6.0f} s  {path.stem}: {what}  [{detail}]", flush=True)
        rows.append(f"| {path.stem} | {what} | {' '.join(tests)} | {outcome} | {seconds:.0f} | {detail} |")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"{len(patches)} mutants: {summary}")
    if args.report and not args.names:
        header = "| mutant | planted bug | tests | outcome | seconds | first failure |\n|---|---|---|---|---|---|"
        Path(args.report).write_text(
            f"# Planted bugs: last full run ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
            f"`uv run --all-extras python tests/mutants/run.py`: {len(patches)} mutants, {summary}.\n\n"
            + header
            + "\n"
            + "\n".join(rows)
            + "\n"
        )
    raise SystemExit(1 if counts.get("survived") or counts.get("broken") else 0)


if __name__ == "__main__":
    main()
