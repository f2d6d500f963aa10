"""The Markdown of the pages as the docs build reads and writes it: the text outside fenced code
blocks, a code fence longer than what it holds, a page's title, a sentence's capital (the
generated blocks' tables are :func:`cvae_rosetta.app.markdown.markdown_table`'s)."""

from __future__ import annotations

import re
from pathlib import Path

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


def outside_fences(markdown: str, change) -> str:
    """``change`` applied to the text outside fenced code blocks only (a page may show the
    directives themselves as examples)."""
    chunks, current, fence = [], [], None
    for line in markdown.splitlines(keepends=True):
        m = FENCE.match(line)
        if fence is None and m:
            chunks.append((False, "".join(current)))
            current, fence = [line], m[1]
        elif fence is not None and m and m[1][0] == fence[0] and len(m[1]) >= len(fence):
            current.append(line)
            chunks.append((True, "".join(current)))
            current, fence = [], None
        else:
            current.append(line)
    chunks.append((fence is not None, "".join(current)))
    return "".join(text if fenced else change(text) for fenced, text in chunks)


def unfenced(markdown: str) -> str:
    """``markdown`` without its fenced code blocks (where a page may show a block as an example)."""
    kept: list[str] = []
    outside_fences(markdown, lambda text: kept.append(text) or text)
    return "".join(kept)


def fence_for(text: str) -> str:
    """A code fence longer than any run of backticks in ``text`` (at least three)."""
    return "`" * max(3, 1 + max(map(len, re.findall(r"`+", text)), default=0))


def page_title(path: Path) -> str:
    heading = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return heading[1].strip() if heading else path.stem


def capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]
