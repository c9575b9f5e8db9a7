"""The learning path (docs/learn/*.md) against the scripts as they are, so that its pages cannot rot.

An exercise is an HTML comment `<!-- exercise: FLAGS -->` on the line before a ```bash block. Each runs in a fresh
directory that holds copies of the cleanrl/*.py files its block names: its `cp` and `sed` lines run with bash (every
`sed -i` must change its file: a pattern that no longer matches fails), and each `uv run python FILE.py ARGS` line
runs FILE.py with ARGS and then the comment's FLAGS, a tiny budget (tyro: the later flag wins), forked from the test
worker's pre-imported interpreter (conftest.run_python). Each run must exit 0 and write its own run directory, named
by its experiment name, with episodic returns and finite losses. Also: each step page has two or three exercises
after its "## Exercises" heading, and every line reference `[[file.py:text]]` names a script in cleanrl/ and text
found on exactly one of its lines (docs/hooks/generate.py turns each into a link to that line)."""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, read_scalars, run_dirs, run_python, script_env

LEARN = ROOT / "docs" / "learn"
STEP_PAGES = ["dqn.md", "ddpg.md", "ppo.md"]
EXERCISE = re.compile(r"^<!-- exercise: (.*?) -->\n```bash\n(.*?)^```$", re.M | re.S)
LINE_REF = re.compile(r"\[\[([\w.]+\.py):(.+?)\]\]")  # as docs/hooks/generate.py reads them
SCRIPT = re.compile(r"\bcleanrl/\w+\.py\b")


def exercises() -> list:
    found = []
    for page in sorted(LEARN.glob("*.md")):
        for number, match in enumerate(EXERCISE.finditer(page.read_text()), 1):
            found.append(pytest.param(match[1], match[2], id=f"{page.stem}-{number}"))
    return found


def run_shell(line: str, cwd: Path) -> None:
    """A `cp`, `sed` ... line, run with bash in `cwd`; a `sed -i` must change the file it names last."""
    words = shlex.split(line)
    edited = cwd / words[-1] if words[0] == "sed" else None
    if edited is not None:
        assert "-i" in words, f"`{line}`: a sed in an exercise edits a copy in place (-i)"
        assert edited.is_file(), f"`{line}`: {words[-1]} does not exist (copy the script first)"
        before = edited.read_bytes()
    result = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"`{line}` exited {result.returncode}: {result.stderr}"
    if edited is not None:
        assert edited.read_bytes() != before, f"`{line}` changed nothing: its pattern no longer matches {words[-1]}"


def run_exercise_script(line: str, budget: list[str], cwd: Path) -> None:
    """`uv run python FILE.py ARGS`, run as FILE.py ARGS BUDGET: exit 0, one new run directory with returns and
    finite losses."""
    words = shlex.split(line)
    script, args = words[3], words[4:]
    assert script.endswith(".py"), f"`{line}`: an exercise runs a script (tools go in a block without the comment)"
    before = set(run_dirs(cwd))
    result = run_python(cwd / script, *args, *budget, cwd=cwd, timeout=300, env=script_env())
    assert result.returncode == 0, f"`{line}` with {' '.join(budget)} exited {result.returncode}:\n{result.stderr}"
    new = [path for path in run_dirs(cwd) if path not in before]
    assert len(new) == 1, f"`{line}` wrote {len(new)} run directories"
    named = [args[i + 1] for i, word in enumerate(args[:-1]) if word == "--exp-name"]  # tyro: the last one wins
    exp_name = named[-1] if named else Path(script).stem
    assert f"__{exp_name}__" in new[0].name, f"`{line}` wrote {new[0].name}, not a run named {exp_name}"
    scalars = read_scalars(new[0])
    assert scalars.get("charts/episodic_return"), f"`{line}`: no episode ended within {' '.join(budget)}"
    losses = {tag: values for tag, values in scalars.items() if tag.startswith("losses/")}
    assert losses, f"`{line}`: no losses logged within {' '.join(budget)} (is the budget past --learning-starts?)"
    bad = sorted(tag for tag, values in losses.items() if not all(math.isfinite(value) for _, value in values))
    assert not bad, f"`{line}`: non-finite {bad}"


@pytest.mark.parametrize("flags, block", exercises())
def test_exercise_runs_as_written(flags: str, block: str, tmp_path: Path):
    budget = shlex.split(flags)
    for name in sorted(set(SCRIPT.findall(block))):
        assert (ROOT / name).is_file(), f"the exercise names {name}, which does not exist"
        (tmp_path / "cleanrl").mkdir(exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    lines = [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert any(line.startswith("uv run python ") for line in lines), "an exercise runs a script"
    for line in lines:
        assert not line.endswith("\\"), f"`{line}`: one command a line, no continuations"
        if line.startswith("uv run python "):
            run_exercise_script(line, budget, tmp_path)
        else:
            run_shell(line, tmp_path)


@pytest.mark.parametrize("page", STEP_PAGES)
def test_each_step_ends_with_two_or_three_exercises(page: str):
    text = (LEARN / page).read_text()
    found = list(EXERCISE.finditer(text))
    assert text.count("<!-- exercise:") == len(found), f"{page}: an exercise comment not followed by a ```bash block"
    assert 2 <= len(found) <= 3, f"{page} has {len(found)} exercises; the path asks for 2 or 3 a page"
    assert "\n## Exercises\n" in text, f"{page} has no '## Exercises' section"
    assert text.index("\n## Exercises\n") < found[0].start(), f"{page}: exercises before the '## Exercises' heading"


def test_every_line_reference_names_one_line_of_a_script():
    pages = sorted(LEARN.glob("*.md"))
    assert {page.name for page in pages} >= {"index.md", *STEP_PAGES}
    problems, count = [], 0
    for page in pages:
        text = page.read_text()
        matches = list(LINE_REF.finditer(text))
        count += len(matches)
        if text.count("[[") != len(matches):
            problems.append(f"{page.name}: {text.count('[[')} '[[' but {len(matches)} well-formed [[file.py:text]]")
        for match in matches:
            script, needle = match.groups()
            path = ROOT / "cleanrl" / script
            if text[match.end() : match.end() + 1] == "]":
                problems.append(f"{page.name}: [[{script}:{needle}]] is followed by ']': end the text before a ']'")
            if not path.is_file():
                problems.append(f"{page.name}: [[{script}:{needle}]]: no cleanrl/{script}")
                continue
            numbers = [n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
            if len(numbers) != 1:
                problems.append(f"{page.name}: [[{script}:{needle}]] matches lines {numbers} of cleanrl/{script}")
    assert not problems, "\n".join(problems)
    assert count >= 3 * 10, f"only {count} line references in docs/learn/"
