"""The installed package writes nothing into this repository's ``docs/``: what fills its pages from
the committed results is the docs build's (``docs_build/``, which ``benchmarks/render.py`` runs),
and ``cvae bench`` writes its user's ``bench.md`` and terminal summary only.

Read from the source of the package that ``shared/`` makes, every string of it (docstrings
included; comments are not strings). What writes a page leaves two traces there, and neither may
appear:

- a docs block marker: ``<!--`` opens the markers a generated block is written between
  (``<!-- decision:begin -->``, ``<!-- fast-step:NAME:end -->``);
- a string whose whole value is a page of ``docs/`` (``"performance.md"``,
  ``"docs/fast_step.md"``, an f-string such as ``f"docs/{name}.md"``, its fields taken as
  wildcards) or the folder ``"docs"`` itself: a name a program opens, not words.

A page named inside a sentence stays: the help of ``cvae bench`` ends in
``(docs/performance.md)``, and a docstring or an error may point its reader to a page. Those are
pointers a person reads, never a whole string. And no module of the package imports one of the
docs build's (they are found on ``sys.path`` by their bare names).
"""

from __future__ import annotations

import ast
import fnmatch
import glob
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "shared"
DOCS = ROOT / "docs"
DOCS_BUILD = ROOT / "docs_build"
MARKER = "<!--"


def page_names() -> set[str]:
    """Every name a program would give a page of ``docs/`` by: its path below ``docs/``, that path
    with ``docs/`` before it, its file name; and the folder."""
    names = {"docs"}
    for page in DOCS.rglob("*.md"):
        below = page.relative_to(DOCS).as_posix()
        names |= {below, f"docs/{below}", page.name}
    return names


def _text(node: ast.Constant | ast.JoinedStr) -> str:
    """A string's value; an f-string's with each field as ``{}``."""
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def _names_a_page(node: ast.Constant | ast.JoinedStr, pages: set[str]) -> bool:
    """Whether the whole string is a page's name: a constant equal to one, an f-string whose own
    words say ``docs`` or ``.md`` and match one with each field as a wildcard."""
    if isinstance(node, ast.Constant):
        return node.value.strip() in pages
    words = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    if "docs" not in words and ".md" not in words:
        return False
    parts = [glob.escape(v.value) if isinstance(v, ast.Constant) else "*" for v in node.values]
    pattern = "".join(parts).strip()
    return any(fnmatch.fnmatchcase(p, pattern) for p in pages)


def docs_writing(source: str, pages: set[str]) -> list[str]:
    """What in ``source`` names a docs block marker, or is a page of ``docs/`` as a whole string:
    ``line: text`` for each."""
    found = []
    tree = ast.parse(source)
    inside_fstrings = {
        id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in inside_fstrings:
                continue  # read with its f-string
        elif not isinstance(node, ast.JoinedStr):
            continue
        text = _text(node)
        if MARKER in text or _names_a_page(node, pages):
            found.append(f"{node.lineno}: {text[:80]!r}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_the_check_finds_what_writes_a_page_and_not_what_points_to_one():
    """The check itself, on what the package held when it rendered the pages, and on pointers."""
    pages = page_names()
    rendered = (
        'FAST_STEP_FILE = "fast_step.md"\n'
        'write_text(docs / "performance.md", page)\n'
        'begin = f"<!-- fast-step:{name}:begin -->"\n'
        'DECISION = "<!-- decision:begin -->"\n'
        'target = ROOT / "docs" / "choosing.md"\n'
        'other = f"docs/{name}.md"\n'
    )
    assert [line.split(":")[0] for line in docs_writing(rendered, pages)] == [
        "1", "2", "3", "4", "5", "5", "6",
    ]  # fmt: skip
    pointers = (
        '"""Measured in docs/fast_step.md."""\n'
        'parser.add_parser("bench", description=f"{text} (docs/performance.md)")\n'
        'write_text(out / "bench.md", page)\n'
        'raise SystemExit("see docs/clusters.md")\n'
        'files = sorted(folder.glob("*"))\n'
        'name = f"{stem}"\n'
    )
    assert docs_writing(pointers, pages) == []


def test_no_module_of_the_package_writes_a_docs_page():
    pages = page_names()
    modules = sorted(SHARED.rglob("*.py"))
    assert len(modules) > 20
    found = {
        str(path.relative_to(ROOT)): hits
        for path in modules
        if (hits := docs_writing(path.read_text(encoding="utf-8"), pages))
    }
    assert found == {}, (
        "the installed package names a docs page or a block marker; what renders the "
        f"repository's pages belongs in docs_build/: {found}"
    )


def test_no_module_of_the_package_imports_the_docs_build():
    own = {p.stem for p in DOCS_BUILD.glob("*.py")}
    wrong = []
    for path in sorted(SHARED.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in own]
    assert wrong == []
