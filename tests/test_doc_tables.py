"""Every table of the docs names an implementation by its label ("pure JAX", "Flax NNX"), as the
rest of the site does, never by its key (``pure_jax``, ``flax_nnx``) alone.

Reads every Markdown table of ``docs/**/*.md`` (a row of cells, then a delimiter row of dashes,
then rows until a line without a pipe), outside fenced code blocks, and fails on a cell that is
an implementation's key and nothing else, with or without backticks or bold. The keys and labels
are the registry's (:func:`cvae_rosetta.spec.registry.known`). A key in a cell with more in it (a
command such as ``--impl pure_jax``, a file name) is left alone: there the key is what one types.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cvae_rosetta.spec import registry

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
PIPE = re.compile(r"(?<!\\)\|")  # a cell boundary: a pipe not escaped


def labels() -> dict[str, str]:
    """``key -> label`` of every registered implementation."""
    return {info.name: info.about.label for info in registry.known()}


def cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip() for cell in PIPE.split(inner)]


def tables(text: str) -> list[list[tuple[int, list[str]]]]:
    """Every Markdown table of ``text`` outside fenced code blocks: its rows (the header and
    the body, not the delimiter row), each as ``(line number, cells)``."""
    lines = text.splitlines()
    found, fence, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        if match := FENCE.match(line):
            mark = match.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark) :]:
                fence = None
            i += 1
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        # GFM: the delimiter row has as many cells as the header
        header = fence is None and "|" in line and DELIMITER.match(nxt)
        if header and len(cells(nxt)) == len(cells(line)):
            rows = [(i + 1, cells(line))]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append((i + 1, cells(lines[i])))
                i += 1
            found.append(rows)
            continue
        i += 1
    return found


def bare_keys(text: str, names: dict[str, str]) -> list[tuple[int, str]]:
    """``(line, cell)`` of every table cell of ``text`` that is a key alone."""
    return [
        (number, cell)
        for table in tables(text)
        for number, row in table
        for cell in row
        if cell.strip("`*").strip() in names
    ]


PAGES = sorted(DOCS.rglob("*.md"))


def test_the_tables_are_found():
    # every page with a table is read: the reader finds the tables it should
    sample = "a\n\n| x | y |\n|---|:--:|\n| `pure_jax` | 1 |\n| a \\| b | 2 |\n\nafter | no\n"
    assert tables(sample) == [[(3, ["x", "y"]), (5, ["`pure_jax`", "1"]), (6, ["a \\| b", "2"])]]
    fenced = "```text\n| x | y |\n|---|---|\n| pure_jax | 1 |\n```\n"
    assert tables(fenced) == []
    assert tables("a | b\n---\n") == []  # a heading: the delimiter row has too few cells
    assert bare_keys(sample, {"pure_jax": "pure JAX"}) == [(5, "`pure_jax`")]
    assert bare_keys("| a | b |\n|---|---|\n| `--impl pure_jax` | **haiku** |\n", labels()) == [
        (3, "**haiku**")
    ]
    assert sum(len(tables(page.read_text())) for page in PAGES) > 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_no_table_names_an_implementation_by_its_key(page):
    names = labels()
    assert {"pure_jax", "flax_nnx", "keras"} <= set(names)  # the registry is read
    found = bare_keys(page.read_text(), names)
    assert not found, "\n".join(
        f"{page.relative_to(ROOT)}:{line}: the cell {cell!r} names an implementation by its "
        f"key; write its label, {names[cell.strip('`*').strip()]!r}"
        for line, cell in found
    )
