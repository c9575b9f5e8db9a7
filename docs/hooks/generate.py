"""The generated part of the documentation site (an MkDocs hook, named in mkdocs.yml).

Nothing generated here is copied by hand, so it cannot drift from the code and the results:

- one page per script in cleanrl/, `scripts/<stem>.md`: its docstring (the algorithm, the paper, the command), the
  implementation notes of docs/scripts/<stem>.md, the hyperparameters of its `Args` (read with `ast`: no import),
  the results files the README's algorithm table links for it, the rows of the README's `--resume` table for its
  environments, and its source with line numbers; the sidebar lists these pages by family (`FAMILIES`);
- every file under benchmark/results/ as `results/...` (tables as pages, curves and CSVs as they are), and
  benchmark/gpu/README.md as `gpu.md`;
- in a hand-written page, `<!-- readme: Section title -->` becomes that section of README.md (down to the next
  heading of its level) and `<!-- docstring: cleanrl_utils.tool -->` that module's docstring.

Links are rewritten from the repository's layout to the site's (cleanrl/X.py -> the script's page,
benchmark/results/F -> results/F, README.md#section -> the page that includes it); a link to any other file of the
repository keeps its text and loses the link. `[[dqn.py:text]]` in any page is a line reference: a link to the one
line of cleanrl/dqn.py that contains `text`; text found on no line or on several fails the build.
"""

from __future__ import annotations

import ast
import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "cleanrl"
RESULTS = REPO / "benchmark" / "results"
DOCS = REPO / "docs"

LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^()\s]+)\)")
LINE_REF = re.compile(r"\[\[([\w.]+\.py):(.+?)\]\]")
README_INCLUDE = re.compile(r"^<!-- readme: (.+?) -->$", re.M)
DOCSTRING_INCLUDE = re.compile(r"^<!-- docstring: ([\w.]+) -->$", re.M)
ALGORITHM_MARKER = "# Algorithm specific arguments"

# Which rows of the README's `--resume` table apply to a script, read from its row of the algorithm table
# ("environments" column): a row applies when one of its patterns is in that cell.
RESUME_ROWS = {
    "classic control": r"gymnasium, flat|CartPole|Pendulum|PointChasing|StockTrading|MinAtar|ProofofMemory|MiniGrid"
    r"|Taxi",
    "gymnasium MuJoCo v5": r"MuJoCo v5|Hopper-v5|gymnasium's CPU vector envs",
    "dm_control suite": r"dm_control",
    "MuJoCo Warp": r"MuJoCo Warp",
    "dm_control composer": r"Atari|envpool|Procgen|PyBullet|VMAS|MPE|Isaac Gym|memory-gym",
}

# The sidebar's Algorithms section: the script pages by family, as CleanRL's documentation groups them; within a
# family, the order of the README's algorithm table. A script of cleanrl/ that no family lists fails the build, as
# one without its notes page does.
FAMILIES = {
    "Classic control": ["ppo", "ppo_action_mask", "dqn", "d3qn", "c51", "pqn"],
    "Continuous control": [
        "ppo_continuous_action",
        "rpo_continuous_action",
        "td3_continuous_action",
        "ddpg_continuous_action",
        "sac_continuous_action",
        "redq_continuous_action",
        "crossq_continuous_action",
        "tqc_continuous_action",
        "simbav2_continuous_action",
    ],
    "Pixels": [
        "dqn_atari",
        "c51_atari",
        "qrdqn_atari",
        "rainbow_atari",
        "pqn_atari",
        "sac_atari",
        "ppo_atari",
        "ppo_atari_multigpu",
        "impala_atari",
        "qdagger_dqn_atari_impalacnn",
        "ppo_atari_envpool",
        "ppo_rnd_envpool",
        "ppo_procgen",
        "ppg_procgen",
    ],
    "Memory": ["ppo_atari_lstm", "pqn_atari_envpool_lstm", "ppo_trxl", "ppo_continuous_action_lstm"],
    "Multi-agent": ["mappo", "qmix", "vdn", "maddpg", "matd3", "ppo_pettingzoo_ma_atari"],
    "GPU simulators": ["ppo_isaacgym", "fast_td3_isaacgym", "fast_sac_isaacgym"],
    "ElegantRL's extras": ["ppo_continuous_action_hterm"],
}


GENERATED: set[str] = set()  # the pages on_files made, by site path


class DocsError(PluginError):
    """A page the site cannot be built with: a missing notes file, a line reference that does not resolve."""


# ---------------------------------------------------------------- README sections


def slug(title: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading; GitHub's differs only in characters not used here."""
    text = re.sub(r"[^\w\s-]", "", title.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def readme_sections() -> dict[str, tuple[int, str]]:
    """README.md's sections by title: (level, the section's markdown from its heading to the next of its level)."""
    lines = (REPO / "README.md").read_text().splitlines()
    headings, in_fence = [], False
    for number, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and (match := re.match(r"(#+) (.+)", line)):
            headings.append((number, len(match[1]), match[2].strip()))
    sections = {}
    for index, (start, level, title) in enumerate(headings):
        end = next((n for n, lv, _ in headings[index + 1 :] if lv <= level), len(lines))
        sections[title] = (level, "\n".join(lines[start:end]).strip() + "\n")
    return sections


def section_pages() -> dict[str, str]:
    """Anchor of every README heading -> the site page that includes it (directly or inside an included section)."""
    sections = readme_sections()
    pages = {}
    for page in sorted(DOCS.rglob("*.md")):
        for title in README_INCLUDE.findall(page.read_text()):
            if title not in sections:
                raise DocsError(f"{page.relative_to(REPO)}: README.md has no section {title!r}")
            level, text = sections[title]
            for inner, (inner_level, _) in sections.items():
                if inner == title or (inner_level > level and f"\n{'#' * inner_level} {inner}\n" in text):
                    pages.setdefault(slug(inner), page.relative_to(DOCS).as_posix())
    return pages


# ---------------------------------------------------------------- links


def site_path(repo_path: str, anchor: str, anchors: dict[str, str]) -> str | None:
    """Where a file of the repository (a path relative to its root) is on the site; None: nowhere."""
    if repo_path in ("README.md", ""):
        return f"{anchors[anchor]}#{anchor}" if anchor in anchors else ("index.md" if not anchor else None)
    suffix = f"#{anchor}" if anchor else ""
    if repo_path.startswith("cleanrl/") and repo_path.endswith(".py") and (REPO / repo_path).is_file():
        return f"scripts/{Path(repo_path).stem}.md{suffix}"
    if repo_path.startswith("benchmark/results/") and (REPO / repo_path).is_file():
        return repo_path.removeprefix("benchmark/") + suffix
    if repo_path.startswith("docs/") and (REPO / repo_path).is_file() and not repo_path.startswith("docs/hooks/"):
        return repo_path.removeprefix("docs/") + suffix
    if repo_path == "benchmark/gpu/README.md":
        return "gpu.md" + suffix
    return None


def rewrite_links(markdown: str, source: str, page: str, anchors: dict[str, str]) -> str:
    """Links written for `source` (a repository path) made to work on the site page `page` (a docs path)."""

    def replace(match: re.Match) -> str:
        bang, text, target = match.groups()
        if re.match(r"[a-z]+:", target):
            return match[0]
        path, _, anchor = target.partition("#")
        if path:
            repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        else:
            repo_path = source
        where = site_path(repo_path, anchor, anchors)
        if where is None:
            return text
        if repo_path == source and source != "README.md":
            return f"{bang}[{text}](#{anchor})"
        return f"{bang}[{text}]({posixpath.relpath(where, posixpath.dirname(page) or '.')})"

    return LINK.sub(replace, markdown)


def resolve_line_refs(markdown: str, page: str) -> str:
    """`[[dqn.py:text]]` -> a link to the one line of cleanrl/dqn.py holding `text` in the script page's listing."""

    def replace(match: re.Match) -> str:
        script, text = match.groups()
        path = SCRIPTS / script
        if not path.is_file():
            raise DocsError(f"{page}: line reference to {script}, which is not in cleanrl/")
        numbers = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
        if len(numbers) != 1:
            where = "no line" if not numbers else f"{len(numbers)} lines ({', '.join(map(str, numbers))})"
            raise DocsError(f"{page}: [[{script}:{text}]] matches {where} of cleanrl/{script}: make it match one")
        target = f"scripts/{path.stem}.md"
        anchor = f"#__codelineno-source-{numbers[0]}"
        href = anchor if page == target else posixpath.relpath(target, posixpath.dirname(page) or ".") + anchor
        label = f"line {numbers[0]}" if page == target else f"{script} line {numbers[0]}"
        return f"[{label}]({href})"

    return LINE_REF.sub(replace, markdown)


def demote(markdown: str, levels: int) -> str:
    """Headings pushed down `levels` levels (a results file inside a script's page), code blocks left alone."""
    out, in_fence = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#+ ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


# ---------------------------------------------------------------- script pages


def module_docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def args_table(path: Path) -> str:
    """The algorithm's own arguments (after `# Algorithm specific arguments`, with the environment and the budget):
    flag, default, help, as the script's `Args` declares them."""
    source = path.read_text()
    tree = ast.parse(source)
    args = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args"), None)
    if args is None:
        raise DocsError(f"cleanrl/{path.name} has no Args dataclass")
    marker = next((n for n, line in enumerate(source.splitlines(), 1) if line.strip() == ALGORITHM_MARKER), 0)
    rows = ["| flag | default | what it sets |", "|---|---|---|"]
    for field, following in zip(args.body, [*args.body[1:], None]):
        if not isinstance(field, ast.AnnAssign) or not isinstance(field.target, ast.Name):
            continue
        name = field.target.id
        if field.lineno < marker and name not in ("env_id", "total_timesteps"):
            continue
        default = ast.get_source_segment(source, field.value) if field.value is not None else ""
        if name == "exp_name":
            default = f'"{path.stem}"'
        helptext = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            helptext = str(following.value.value)
        cell = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        rows.append(f"| `--{name.replace('_', '-')}` | `{cell(default)}` | {cell(helptext)} |")
    return "\n".join(rows)


def algorithm_rows() -> dict[str, dict[str, str]]:
    """The README's algorithm table, by script stem: its cells by column name."""
    level, text = readme_sections()["Algorithms"]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        row = dict(zip(columns, cells))
        if stem := re.search(r"cleanrl/(\w+)\.py", row.get("script", "")):
            rows[stem[1]] = row
    return rows


def resume_table() -> tuple[str, dict[str, str]]:
    """The README's paragraph on what `--resume` guarantees, and its table's rows by first cell."""
    _, text = readme_sections()["Options shared by every script"]
    rows, header = {}, []
    for line in text.splitlines():
        if line.startswith("| environments"):
            header = [line]
        elif header and line.startswith("|"):
            if line.startswith("|---"):
                header.append(line)
            else:
                rows[line.strip("|").split("|")[0].strip()] = line
    return "\n".join(header), rows


def resume_section(stem: str, environments: str) -> str:
    header, rows = resume_table()
    chosen = [
        line
        for first, line in rows.items()
        for name, pattern in RESUME_ROWS.items()
        if first.startswith(name) and re.search(pattern, environments)
    ]
    if not chosen:
        raise DocsError(f"cleanrl/{stem}.py: no row of the README's --resume table matches {environments!r}")
    return (
        f"`--checkpoint-every N` writes `runs/<run>/checkpoint.pt`; `--resume runs/<run>/checkpoint.pt` continues the "
        f"run (SIGTERM and Ctrl-C write one too). What a resumed run reproduces, for this script's environments "
        f"([all of them](../runs.md#options-shared-by-every-script)):\n\n{header}\n" + "\n".join(dict.fromkeys(chosen))
    )


def with_curves(text: str, results_file: Path) -> str:
    """A results file with its curves: the images beside it that belong to it (named after it: `dqn.png`,
    `d3qn_CartPole-v1.png`; each to the results file with the longest such name) and that it does not show yet."""
    tables = {p.stem for p in results_file.parent.glob("*.md")}
    missing = []
    for image in sorted(results_file.parent.glob("*.png")):
        owners = [t for t in tables if image.stem == t or image.stem.startswith(t + "_")]
        if owners and max(owners, key=len) == results_file.stem and f"]({image.name})" not in text:
            missing.append(f"![{image.stem}]({image.name})")
    return text.rstrip() + "\n\n" + "\n\n".join(missing) + "\n" if missing else text


def results_section(stem: str, row: dict[str, str], anchors: dict[str, str]) -> str:
    """Every results file the README links for this script, whole (tables, curves, how they were made)."""
    page = f"scripts/{stem}.md"
    files = dict.fromkeys(re.findall(r"\]\((benchmark/results/[^)#\s]+\.md)\)", row.get("results", "")))
    parts = [rewrite_links(row.get("results", "—"), "README.md", page, anchors)]
    for name in files:
        text = with_curves((REPO / name).read_text(), REPO / name)
        title = Path(name).relative_to("benchmark/results").as_posix()
        body = rewrite_links(demote(text, 2), name, page, anchors)
        parts.append(f"### [{title}](../results/{title})\n\n{body}")
    return "\n\n".join(parts)


def script_page(path: Path, rows: dict[str, dict[str, str]], anchors: dict[str, str]) -> str:
    stem = path.stem
    page = f"scripts/{stem}.md"
    notes = DOCS / "scripts" / f"{stem}.md"
    if not notes.is_file():
        raise DocsError(
            f"cleanrl/{path.name} has no notes page: write docs/scripts/{stem}.md (README.md, 'The documentation site')"
        )
    if stem not in rows:
        raise DocsError(f"cleanrl/{path.name} has no row in README.md's algorithm table")
    row = rows[stem]
    environments = row.get("environments", "")
    if same := re.fullmatch(r"as (\w+)\.py", environments):  # "as ppo_continuous_action.py"
        environments = rows[same[1]].get("environments", "")
    docstring = module_docstring(path)
    title, _, body = docstring.partition("\n")
    source = path.read_text()
    parts = [
        f"# {path.name}",
        f"**{title.rstrip('.')}.** "
        + rewrite_links(
            f"{row.get('algorithm', '')}. Action space: {row.get('action space', '')}. Environments: {environments}.",
            "README.md",
            page,
            anchors,
        ),
        rewrite_links(body.strip(), f"cleanrl/{path.name}", page, anchors),
        "## Implementation details",
        resolve_line_refs(notes.read_text().strip(), page),
        "## Hyperparameters",
        f"The defaults of `Args` (`uv run python cleanrl/{path.name} --help` lists every flag; the options every "
        f"script shares are on [Runs and options](../runs.md)):",
        args_table(path),
        "## Results",
        results_section(stem, row, anchors),
        "## Resuming",
        resume_section(stem, environments),
        "## Source",
        f"`cleanrl/{path.name}`, {len(source.splitlines())} lines:",
        f'``` {{ .python #source linenums="1" }}\n{source.rstrip()}\n```',
    ]
    return "\n\n".join(parts) + "\n"


def results_index() -> str:
    lines = ["# Results", "", "Every table under `benchmark/results/`, as committed:", ""]
    for name in sorted(RESULTS.rglob("*.md")):
        relative = name.relative_to(RESULTS).as_posix()
        first = next((line for line in name.read_text().splitlines() if line.startswith("# ")), "")
        lines.append(f"- [{relative}]({relative})" + (f": {first[2:]}" if first else ""))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- hand-written pages


def expand_includes(markdown: str, page: str, anchors: dict[str, str]) -> str:
    sections = readme_sections()

    def readme(match: re.Match) -> str:
        return rewrite_links(sections[match[1]][1], "README.md", page, anchors)

    def docstring(match: re.Match) -> str:
        path = REPO / (match[1].replace(".", "/") + ".py")
        if not path.is_file():
            raise DocsError(f"{page}: no module {match[1]}")
        text = module_docstring(path)
        return f"`{match[1]}`: " + text

    return DOCSTRING_INCLUDE.sub(docstring, README_INCLUDE.sub(readme, markdown))


def generated_pages() -> dict[str, str]:
    """Every generated page: its path on the site -> its markdown."""
    anchors = section_pages()
    rows = algorithm_rows()
    pages = {f"scripts/{p.stem}.md": script_page(p, rows, anchors) for p in sorted(SCRIPTS.glob("*.py"))}
    for name in sorted(RESULTS.rglob("*.md")):
        repo_path = name.relative_to(REPO).as_posix()
        site = repo_path.removeprefix("benchmark/")
        pages[site] = rewrite_links(with_curves(name.read_text(), name), repo_path, site, anchors)
    pages["results/index.md"] = results_index()
    gpu = (REPO / "benchmark/gpu/README.md").read_text()
    pages["gpu.md"] = rewrite_links(gpu, "benchmark/gpu/README.md", "gpu.md", anchors)
    return pages


# ---------------------------------------------------------------- MkDocs events


def on_files(files: Files, config) -> Files:
    for notes in (DOCS / "scripts").glob("*.md"):  # the notes are parts of generated pages, not pages
        files.remove(files.get_file_from_path(f"scripts/{notes.name}"))
    for path in (DOCS / "hooks").rglob("*"):
        if (file := files.get_file_from_path(path.relative_to(DOCS).as_posix())) is not None:
            files.remove(file)
    GENERATED.clear()
    for site, markdown in generated_pages().items():
        GENERATED.add(site)
        files.append(File.generated(config, site, content=markdown))
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix != ".md":
            files.append(
                File.generated(config, path.relative_to(REPO / "benchmark").as_posix(), abs_src_path=str(path))
            )
    return files


def algorithm_nav() -> list[dict]:
    """Every script page once, in its family: [{family: [{"x.py": "scripts/x.md"}, ...]}, ...] (FAMILIES)."""
    stems = {p.stem for p in SCRIPTS.glob("*.py")}
    listed = [stem for members in FAMILIES.values() for stem in members]
    if unplaced := sorted(stems - set(listed)):
        raise DocsError(
            f"{', '.join(f'cleanrl/{s}.py' for s in unplaced)}: no family in the site's navigation "
            f"(add it to FAMILIES in docs/hooks/generate.py)"
        )
    if twice := sorted({stem for stem in listed if listed.count(stem) > 1}):
        raise DocsError(f"docs/hooks/generate.py: FAMILIES lists {', '.join(twice)} in more than one place")
    if gone := [stem for stem in listed if stem not in stems]:
        raise DocsError(f"docs/hooks/generate.py: FAMILIES lists {', '.join(gone)}, not in cleanrl/")
    return [
        {family: [{f"{stem}.py": f"scripts/{stem}.md"} for stem in members]} for family, members in FAMILIES.items()
    ]


def on_config(config):
    """The sidebar's Algorithms section lists every script page by family (nav entries are not globbed by MkDocs)."""
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Algorithms" in entry:
            entry["Algorithms"] = [*entry["Algorithms"], *algorithm_nav()]
    return config


def on_page_content(html: str, page, config, files) -> str:
    """MkDocs checks links against the anchors of the page's Markdown; the source listing's line anchors are raw HTML
    made by pymdownx.highlight, so they are added here for the check."""
    page.present_anchor_ids.update(re.findall(r'id="(__codelineno-[^"]+)"', html))
    return html


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri in GENERATED:  # made whole by generated_pages(), line references included
        return markdown
    return resolve_line_refs(expand_includes(markdown, page.file.src_uri, section_pages()), page.file.src_uri)
