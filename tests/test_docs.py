"""The documentation site: it builds with `mkdocs build --strict` (no broken link, anchor or missing page), every script
has its page and one place in the navigation's families, the generator refuses what would drift (a script without
notes or without a family, a line reference that no longer resolves), and the built pages render in headless
Chromium: a title, the results tables, images that loaded."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chromium import Browser, Site, chromium_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "cleanrl").glob("*.py"))


def load_generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs/hooks/generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_every_script_has_notes_and_a_built_page(site):
    missing = [p.name for p in SCRIPTS if not (ROOT / "docs/scripts" / f"{p.stem}.md").is_file()]
    assert not missing, f"scripts without docs/scripts/<stem>.md: {missing}"
    for path in SCRIPTS:
        html = (site / "scripts" / path.stem / "index.html").read_text()
        for section in ("Implementation details", "Hyperparameters", "Results", "Resuming", "Source"):
            assert f">{section}<" in html, (path.name, section)
        assert "__codelineno-source-1" in html  # the source listing with line anchors
    for page in ("index.html", "learn/dqn/index.html", "tools/index.html", "gpu/index.html", "results/index.html"):
        assert (site / page).is_file(), page


def test_a_script_added_without_notes_fails_the_build(tmp_path, monkeypatch):
    generate = load_generator()
    scripts = tmp_path / "cleanrl"
    scripts.mkdir()
    shutil.copy(ROOT / "cleanrl/dqn.py", scripts / "dqn.py")
    shutil.copy(ROOT / "cleanrl/dqn.py", scripts / "my_new_algorithm.py")
    monkeypatch.setattr(generate, "SCRIPTS", scripts)
    with pytest.raises(generate.DocsError, match=r"my_new_algorithm\.py has no notes page"):
        generate.generated_pages()


def test_the_navigation_lists_every_script_once_in_a_family():
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    config = config.plugins.on_config(config)  # the hook fills the Algorithms section, as in a build
    algorithms = next(entry["Algorithms"] for entry in config["nav"] if "Algorithms" in entry)
    assert algorithms[0] == "algorithms.md"
    families = algorithms[1:]
    assert [next(iter(family)) for family in families] == list(load_generator().FAMILIES)
    in_families = [
        page for family in families for entries in family.values() for entry in entries for page in entry.values()
    ]

    def pages(nav):  # every page of the whole navigation, at any depth
        for entry in nav:
            values = entry.values() if isinstance(entry, dict) else [entry]
            for value in values:
                yield from pages(value) if isinstance(value, list) else [value]

    every = [page for page in pages(config["nav"]) if page.startswith("scripts/")]
    expected = sorted(f"scripts/{p.stem}.md" for p in SCRIPTS)
    assert sorted(every) == sorted(in_families) == expected  # none missing, none twice, none outside a family


def test_a_script_without_a_family_fails_the_build(tmp_path, monkeypatch):
    generate = load_generator()
    scripts = tmp_path / "cleanrl"
    scripts.mkdir()
    for name in ("dqn.py", "ppo.py", "my_new_algorithm.py"):
        (scripts / name).write_text('"""A script."""\n')
    monkeypatch.setattr(generate, "SCRIPTS", scripts)
    monkeypatch.setattr(generate, "FAMILIES", {"Classic control": ["dqn"], "Other": ["ppo"]})
    nav = lambda: [{"Algorithms": ["algorithms.md"]}]  # noqa: E731
    with pytest.raises(generate.DocsError, match=r"cleanrl/my_new_algorithm\.py: no family"):
        generate.on_config({"nav": nav()})
    (scripts / "my_new_algorithm.py").unlink()
    monkeypatch.setattr(generate, "FAMILIES", {"Classic control": ["dqn", "ppo"], "Other": ["ppo"]})
    with pytest.raises(generate.DocsError, match="lists ppo in more than one place"):
        generate.on_config({"nav": nav()})
    monkeypatch.setattr(generate, "FAMILIES", {"Classic control": ["dqn", "ppo"]})
    assert generate.on_config({"nav": nav()})["nav"] == [
        {
            "Algorithms": [
                "algorithms.md",
                {"Classic control": [{"dqn.py": "scripts/dqn.md"}, {"ppo.py": "scripts/ppo.md"}]},
            ]
        }
    ]


def test_line_references_resolve_to_exactly_one_line():
    generate = load_generator()
    lines = (ROOT / "cleanrl/dqn.py").read_text().splitlines()
    number = next(n for n, line in enumerate(lines, 1) if "class Args" in line)
    assert generate.resolve_line_refs("see [[dqn.py:class Args]]", "learn/dqn.md") == (
        f"see [dqn.py line {number}](../scripts/dqn.md#__codelineno-source-{number})"
    )
    assert generate.resolve_line_refs("[[dqn.py:class Args]]", "scripts/dqn.md") == (
        f"[line {number}](#__codelineno-source-{number})"
    )
    with pytest.raises(generate.DocsError, match="matches no line"):
        generate.resolve_line_refs("[[dqn.py:a line that is not there]]", "learn/dqn.md")
    with pytest.raises(generate.DocsError, match=r"matches \d+ lines"):
        generate.resolve_line_refs("[[dqn.py:import]]", "learn/dqn.md")
    with pytest.raises(generate.DocsError, match="not in cleanrl/"):
        generate.resolve_line_refs("[[no_such_script.py:x]]", "learn/dqn.md")


def test_generated_tables_come_from_the_code_and_the_readme():
    generate = load_generator()
    table = generate.args_table(ROOT / "cleanrl/dqn.py")
    assert "| `--target-network-frequency` | `500` |" in table
    assert "--wandb-project-name" not in table  # shared options live on the runs page
    links = generate.rewrite_links(
        "[a](cleanrl/ppo.py) [b](benchmark/results/ppo.md) [c](#scaling-out) [d](tests/test_ppo.py) [e](https://x.org)",
        "README.md",
        "scripts/dqn.md",
        generate.section_pages(),
    )
    assert links == "[a](ppo.md) [b](../results/ppo.md) [c](../scaling.md#scaling-out) d [e](https://x.org)"
    results = ROOT / "benchmark/results"
    ppo = generate.with_curves("", results / "ppo.md")
    assert "](ppo.png)" in ppo and "ppo_atari" not in ppo  # ppo_atari.png belongs to ppo_atari.md
    d3qn = generate.with_curves("", results / "d3qn.md")
    assert "](d3qn_CartPole-v1.png)" in d3qn and "](d3qn_Acrobot-v1.png)" in d3qn
    shown = "![curves](qrdqn_atari.png)"
    assert generate.with_curves(shown, results / "qrdqn_atari.md") == shown  # already shown: not twice


@pytest.mark.skipif(chromium_path() is None, reason="needs Debian's chromium package (.ci/run installs it)")
def test_pages_render_in_headless_chromium(site):
    server, browser = Site(site), Browser()
    try:
        home = browser.page(server.url + "index.html")
        assert home["title"] == "CleanRL" and home["navLinks"] > 40
        assert (
            "uv run python cleanrl/ppo.py"
            in browser.call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)["result"][
                "value"
            ]
        )
        script = browser.page(server.url + "scripts/crossq_continuous_action/index.html")
        assert script["h1"].startswith("crossq_continuous_action.py")
        assert script["tables"] >= 3  # hyperparameters, results, resume
        assert script["images"] and all(image["loaded"] for image in script["images"]), script["images"]
        results = browser.page(server.url + "results/dqn_atari/index.html")
        assert results["tables"] >= 1 and results["images"]
        assert all(image["loaded"] for image in results["images"]), results["images"]
    finally:
        browser.close()
        server.close()
