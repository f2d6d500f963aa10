"""The Markdown table of ``cvae compare``'s ``summary.md``, ``cvae bench``'s ``bench.md``, the
benchmark scripts' tables and most of the docs build's (the versions table, the refusals table,
the whole check's cost and the suite's page of catches write their own rows). It imports
nothing, so the docs build reads it without JAX.
"""

from __future__ import annotations

from collections.abc import Sequence

ALIGN = {"l": "---", "r": "---:", "c": ":---:"}  # a column's rule by its alignment


def markdown_table(
    header: Sequence[object], rows: Sequence[Sequence[object]], align: str = ""
) -> str:
    """A Markdown table, each cell as ``str`` makes it (a cell holding ``|`` is the caller's to
    escape); ``align`` has an ``l``, ``r`` or ``c`` per column (default: all left); one line a
    row, each ending in a newline."""
    rule = "|" + "|".join(ALIGN[a] for a in (align or "l" * len(header))) + "|"
    lines = [_row(header), rule, *map(_row, rows)]
    return "\n".join(lines) + "\n"


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"
