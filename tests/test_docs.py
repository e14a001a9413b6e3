"""The documentation as a user meets it: a short README that opens with set-up, the default run and a Python
API example, docs/ pages it links, links that resolve (files and their #headings), and docstrings that point
only at files the repository has. Reads the real files; no model is loaded."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXPERIMENTS = ROOT / "experiments"
PACKAGE = ROOT / "modelopt"

MAX_README_LINES = 300
API_EXAMPLE_BY = 120  # the Python API example starts within this many lines
SETUP = ('python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/modelopt optimize',
         ".venv/bin/python -m pytest")  # CI (.ci/run) runs exactly these

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
EXTERNAL = ("http://", "https://", "mailto:")


def _markdown_files() -> list[Path]:
    """README.md, the docs/ pages and the Markdown beside the sweep files (not the generated tables)."""
    return [README, *sorted(DOCS.glob("*.md")), *sorted(EXPERIMENTS.glob("*.md")),
            *sorted(EXPERIMENTS.glob("*/README.md"))]


def _prose(text: str) -> str:
    """The text with fenced code blocks and inline code removed: links and headings live outside them."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def _links(path: Path) -> list[str]:
    return LINK.findall(_prose(path.read_text(encoding="utf-8")))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(_prose(path.read_text(encoding="utf-8")))}


def _relative_links() -> list[tuple[Path, str, Path, str]]:
    """(file, link, target path, anchor) for every relative link of the Markdown files."""
    found = []
    for md in _markdown_files():
        for link in _links(md):
            if link.startswith(EXTERNAL):
                continue
            target, _, anchor = link.partition("#")
            found.append((md, link, (md.parent / target).resolve() if target else md, anchor))
    return found


def test_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; at most {MAX_README_LINES}: move detail to docs/"


def test_readme_opens_with_the_two_setup_commands_and_a_python_api_example() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    head = "\n".join(lines[:API_EXAMPLE_BY])
    for command in SETUP:
        assert command in head, f"README.md's first {API_EXAMPLE_BY} lines lack the set-up command {command!r}"
    starts = [i + 1 for i, line in enumerate(lines) if line.strip() == "```python"]
    api = []
    for start in starts:
        end = next((j for j in range(start, len(lines)) if lines[j].strip() == "```"), len(lines))
        if any(line.strip().startswith("import modelopt") for line in lines[start:end]):
            api.append(start)
    assert api, "README.md has no ```python block with `import modelopt`"
    assert api[0] <= API_EXAMPLE_BY, (
        f"README.md's Python API example starts at line {api[0]}; it should start by line {API_EXAMPLE_BY}")


def test_readme_python_examples_name_only_what_modelopt_exports() -> None:
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    exported = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    code = "\n".join(block.group(0) for block in FENCE.finditer(README.read_text(encoding="utf-8"))
                     if block.group(0).startswith("```python"))
    used = set(re.findall(r"\bmodelopt\.(\w+)\(", code))
    used |= {name.strip() for names in re.findall(r"^from modelopt import ([\w, ]+)", code, re.MULTILINE)
             for name in names.split(",") if name.strip()}
    assert used, "the README's Python examples call nothing from modelopt"
    missing = sorted(used - set(exported))
    assert not missing, f"README.md's Python examples use {missing}, which modelopt/__init__.py does not export"


def test_readme_links_every_docs_page() -> None:
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in _links(README)}
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    unlinked = [p.name for p in pages if p.resolve() not in linked]
    assert not unlinked, f"README.md links no docs/ page named {unlinked}"


def test_relative_links_resolve_to_files() -> None:
    links = _relative_links()
    assert len(links) >= 20, f"only {len(links)} relative links found: the link pattern no longer matches?"
    broken = [f"{md.relative_to(ROOT)}: ({link})" for md, link, target, _ in links if not target.is_file()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_links_to_headings_name_a_heading_of_the_page() -> None:
    broken = [f"{md.relative_to(ROOT)}: ({link})" for md, link, target, anchor in _relative_links()
              if anchor and target.suffix == ".md" and target.is_file() and anchor not in _anchors(target)]
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)


def test_docstrings_point_at_files_the_repository_has() -> None:
    missing = []
    for source in sorted(PACKAGE.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        named = set(re.findall(r"\bdocs/[\w.-]+\.md\b", text))
        if "DESIGN.md" in text:
            named.add("DESIGN.md")
        missing += [f"{source.relative_to(ROOT)}: {name}" for name in sorted(named) if not (ROOT / name).is_file()]
    assert not missing, "modelopt/ points at files the repository does not have:\n" + "\n".join(missing)


def test_docstrings_point_at_headings_the_docs_have() -> None:
    """Code says where a measured figure lives (`docs/search.md#measured`): the heading must be there, or the
    pointer sends a reader nowhere once a page is reorganised."""
    broken = []
    for source in sorted(PACKAGE.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        for page, anchor in sorted(set(re.findall(r"\b(docs/[\w.-]+\.md)#([\w-]+)", text))):
            if not (ROOT / page).is_file() or anchor not in _anchors(ROOT / page):
                broken.append(f"{source.relative_to(ROOT)}: {page}#{anchor}")
    assert not broken, "modelopt/ points at headings the docs do not have:\n" + "\n".join(broken)
