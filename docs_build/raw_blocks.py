"""The committed copy of every block the docs build fills in, so that a page read as plain
Markdown (the repository's web view) is whole.

    python docs_build/raw_blocks.py refresh    # rewrite every page's copies from the sources
    python docs_build/raw_blocks.py check      # name the copies that are not current (status 1)

The build fills in ``<!-- snippet FILE[:SECTION] -->``, ``<!-- generated: NAME -->``,
``<!-- rosetta ... -->`` and ``<!-- page-link PAGE | TEXT | FALLBACK -->`` when it makes the site;
a plain view shows nothing there. So each marker of the pages in ``docs/`` is followed by its
*copy* and an end marker (``<!-- /snippet -->``, ``<!-- /generated -->``, ``<!-- /rosetta -->``;
a page link's copy and ``<!-- /page-link -->`` stay on its line)::

    <!-- generated: loc-table -->

    | | pure JAX | Flax Linen | ... |

    <!-- /generated -->

What the copy is, by kind:

- a snippet: the code block the site shows, the code itself. It starts at the beginning of the
  line whatever the marker's indentation: under an admonition (``??? example``, whose body MkDocs
  reads indented by four spaces), a plain view would take four-space-indented lines for an
  indented code block and show the fence's text. The marker keeps its indentation, which says
  where the build puts the block; written right under the ``??? example`` line, a plain view reads
  it as part of that line and hides it.
- a generated block: the block itself (a table, a paragraph, a JSON excerpt), but for the compare
  page's body (every implementation file whole, as tabs), whose copy links to the files.
- a rosetta directive: a list of links to the files, with the sections each tab shows: six files
  side by side are what the site is for, and a plain view cannot lay them out.
- a page link: the link (or the fallback text, while the page does not exist).

A copy is made from what the repository holds, whatever is installed or set here: the built-in
implementations only (:data:`repository.BUILTIN`) and the committed conformance report (never
``$CVAE_DOCS_CONFORMANCE_REPORT``'s). The site is built as before: the hook checks each copy
(:func:`check`: the build fails on a copy that is not what the sources make now, naming the page
and the command above, and on a marker of the project's own pages that has none), then drops the
copies (:func:`collapse`) and fills in the markers from the sources.
"""

from __future__ import annotations

import os
import posixpath
import re
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from conformance_report import REPORT_ENV
from generated import generated
from markdown_text import FENCE, fence_for, outside_fences
from repository import BUILTIN, DOCS, IMPLEMENTATIONS, ROOT, SECTIONS, DocsError
from sections import ANY_MARKER, SECTION_SUFFIX, section_text
from tabs import directive_refs, snippet_title

REFRESH = "python docs_build/raw_blocks.py refresh"
HEADS = {
    "snippet": re.compile(r"^(?P<indent>[ \t]*)<!-- snippet (?P<arg>\S+) -->[ \t]*$"),
    "generated": re.compile(r"^<!-- generated: (?P<arg>[-\w]+) -->[ \t]*$"),
    "rosetta": re.compile(r"^<!-- rosetta\b"),
}
END = re.compile(r"^[ \t]*<!-- /(?P<kind>[-\w]+) -->[ \t]*$")
COMMENT_END = re.compile(r"-->[ \t]*$")
PAGE_LINK = re.compile(
    r"<!-- page-link (?P<page>[^|]+?) \| (?P<text>[^|]+?) \| (?P<fallback>.+?) -->"
    r"(?:(?P<copy>.*?)<!-- /page-link -->)?"
)


class Block(NamedTuple):
    """A marker of a page and its copy: ``lines[start:body]`` is the marker (a rosetta directive
    may take several lines), ``lines[body:end]`` the copy and ``lines[end]`` the end marker;
    ``end`` is None for a marker without a copy."""

    kind: str
    arg: str
    start: int
    body: int
    end: int | None

    def name(self) -> str:
        """The marker as the messages name it."""
        if self.kind == "rosetta":
            return "<!-- rosetta " + " ".join(self.arg.split()) + " -->"
        separator = ": " if self.kind == "generated" else " "
        return f"<!-- {self.kind}{separator}{self.arg} -->"


# --- reading the blocks of a page ----------------------------------------------------------------


def _fence_after(fence: str | None, line: str) -> str | None:
    """The code fence open after ``line`` (None: outside any), given the one open before it."""
    m = FENCE.match(line)
    if fence is None:
        return m[1] if m else None
    closes = m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not line[m.end() :].strip()
    return None if closes else fence


def _head(lines: list[str], i: int) -> tuple[str, str, int] | None:
    """``(kind, argument, index after the marker)`` where a marker starts at line ``i``."""
    for kind, pattern in HEADS.items():
        m = pattern.match(lines[i])
        if not m:
            continue
        if kind != "rosetta":
            return kind, m["arg"], i + 1
        for j in range(i, len(lines)):
            if COMMENT_END.search(lines[j]):
                body = "".join(lines[i : j + 1]).strip()
                return kind, body.removeprefix("<!-- rosetta").removesuffix("-->").strip(), j + 1
        raise DocsError(f"line {i + 1}: a rosetta directive without its closing -->")
    return None


def _end_of(lines: list[str], start: int, kind: str) -> int | None:
    """The line of the end marker of a copy that starts at ``start``; None where the next marker,
    or the page's end, comes first (a marker without a copy)."""
    fence = None
    for j in range(start, len(lines)):
        if fence is None:
            m = END.match(lines[j])
            if m and m["kind"] == kind:
                return j
            if m and m["kind"] in HEADS:
                raise DocsError(f"line {j + 1}: <!-- /{m['kind']} --> ends a {kind} block")
            if _head(lines, j):
                return None
        fence = _fence_after(fence, lines[j])
    return None


def blocks(lines: list[str]) -> list[Block]:
    """Every marker of a page's lines outside code fences (a page may show markers as examples),
    with its copy where it has one."""
    found, fence, i = [], None, 0
    while i < len(lines):
        head = _head(lines, i) if fence is None else None
        if head:
            kind, arg, body = head
            end = _end_of(lines, body, kind)
            found.append(Block(kind, arg, i, body, end))
            i = body if end is None else end + 1
            continue
        m = END.match(lines[i]) if fence is None else None
        if m and m["kind"] in HEADS:
            raise DocsError(f"line {i + 1}: <!-- /{m['kind']} --> without its marker")
        fence = _fence_after(fence, lines[i])
        i += 1
    return found


# --- the copies ----------------------------------------------------------------------------------


@contextmanager
def committed_sources():
    """While a copy is made: the built-in implementations only, and the committed conformance
    report, so that a copy does not depend on what is installed or set here."""
    shown = dict(IMPLEMENTATIONS)
    report = os.environ.pop(REPORT_ENV, None)
    for key in shown:
        if key not in BUILTIN:
            del IMPLEMENTATIONS[key]
    try:
        yield
    finally:
        IMPLEMENTATIONS.clear()
        IMPLEMENTATIONS.update(shown)
        if report is not None:
            os.environ[REPORT_ENV] = report


def copy_of(kind: str, arg: str, where: str) -> str:
    """The copy of a marker of page ``where`` (relative to ``docs/``), without its blank lines
    around."""
    with committed_sources():
        if kind == "snippet":
            text = snippet_copy(arg)
        elif kind == "rosetta":
            text = rosetta_copy(arg, where)
        elif arg == "compare-files":
            text = compare_copy(where)
        else:
            text = generated(arg, where)
    return text.strip("\n")


def snippet_copy(ref: str) -> str:
    """The code block of ``<!-- snippet REF -->`` with the code in it: the section (dedented, as
    the site's snippets are), or the whole file without its section markers."""
    section = SECTION_SUFFIX.match(ref)
    file = section["path"] if section else ref
    if not (ROOT / file).is_file():
        raise DocsError(f"snippet {ref!r}: no file {file}")
    if section:
        code = textwrap.dedent(section_text(ROOT / file, section["section"]))
    else:
        text = (ROOT / file).read_text(encoding="utf-8")
        code = "\n".join(line for line in text.splitlines() if not ANY_MARKER.search(line))
    code = code.strip("\n")
    fence = fence_for(code)
    return f'{fence}python title="{snippet_title(ref)}"\n{code}\n{fence}'


def _link(file: str, where: str) -> str:
    """A Markdown link from page ``where`` to repository file ``file``, named by its path."""
    return f"[`{file}`]({posixpath.relpath(file, posixpath.dirname('docs/' + where))})"


def _names(items: list[str]) -> str:
    names = [f"`{item}`" for item in items]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def rosetta_copy(body: str, where: str) -> str:
    """For each implementation, the sections its tab shows, with a link to each file."""
    lines = ["Shown side by side on the site, one tab per implementation, from these sections:", ""]
    for key, refs in directive_refs(body).items():
        by_file: dict[str, list[str]] = {}
        for file, section in refs:
            by_file.setdefault(file, []).append(section)
        parts = [f"{_names(found)} of {_link(file, where)}" for file, found in by_file.items()]
        lines.append(f"- {IMPLEMENTATIONS[key][0]}: " + "; ".join(parts))
    return "\n".join(lines)


def compare_copy(where: str) -> str:
    """The compare page's body: links to the files it holds whole."""
    lines = [
        "On the site, every implementation file whole, its opening and then each section "
        f"({_names(SECTIONS)}), two files side by side:",
        "",
    ]
    lines += [f"- {label}: {_link(source, where)}" for label, source in IMPLEMENTATIONS.values()]
    return "\n".join(lines)


def page_link_copy(m: re.Match, where: str) -> str:
    page = m["page"].strip()
    if not (DOCS / page).is_file():
        return m["fallback"].strip()
    return f"[{m['text'].strip()}]({posixpath.relpath(page, posixpath.dirname(where) or '.')})"


def _body(copy: str) -> str:
    return f"\n{copy}\n\n"


# --- what the build and the command do with them -------------------------------------------------


def check(markdown: str, where: str, *, complete: bool) -> list[str]:
    """What is wrong with the copies of page ``where``: a copy that is not what the sources make
    now, and (``complete``: a page of the project's own) a marker without one."""
    lines = markdown.splitlines(keepends=True)
    problems = []
    for block in blocks(lines):
        if block.end is None:
            if complete:
                problems.append(f"line {block.start + 1}: {block.name()} has no committed copy")
            continue
        if "".join(lines[block.body : block.end]) != _body(copy_of(block.kind, block.arg, where)):
            problems.append(
                f"line {block.start + 1}: the copy of {block.name()} is not what the sources "
                "make now"
            )

    def links(text: str) -> str:
        for m in PAGE_LINK.finditer(text):
            line = markdown.count("\n", 0, markdown.index(m[0])) + 1
            if m["copy"] is None:
                if complete:
                    problems.append(f"line {line}: a page link to {m['page']} has no copy")
            elif m["copy"] != page_link_copy(m, where):
                problems.append(f"line {line}: the copy of the page link to {m['page']} is stale")
        return text

    outside_fences(collapse_blocks(markdown), links)
    return problems


def collapse_blocks(markdown: str) -> str:
    """The page without the copies of its line markers (the page links' are left)."""
    lines = markdown.splitlines(keepends=True)
    kept, last = [], 0
    for block in blocks(lines):
        kept += lines[last : block.body]
        last = block.body if block.end is None else block.end + 1
    return "".join(kept + lines[last:])


def collapse(markdown: str) -> str:
    """The page as the build reads it: every marker without its copy."""
    return outside_fences(collapse_blocks(markdown), lambda text: PAGE_LINK.sub(_marker, text))


def _marker(m: re.Match) -> str:
    """A page link's marker, without its copy."""
    return m[0].split("-->")[0] + "-->"


def refreshed(markdown: str, where: str) -> str:
    """The page with every marker's copy made now from the sources; nothing else changes."""
    lines = markdown.splitlines(keepends=True)
    out, last = [], 0
    for block in blocks(lines):
        out += lines[last : block.body]
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out += [_body(copy_of(block.kind, block.arg, where)), f"<!-- /{block.kind} -->\n"]
        last = block.body if block.end is None else block.end + 1
    text = "".join(out + lines[last:])

    def links(text: str) -> str:
        return PAGE_LINK.sub(
            lambda m: f"{_marker(m)}{page_link_copy(m, where)}<!-- /page-link -->",
            text,
        )

    return outside_fences(text, links)


def pages() -> list[tuple[str, Path]]:
    """Every page of ``docs/``: ``(its path there, its file)``."""
    return [(p.relative_to(DOCS).as_posix(), p) for p in sorted(DOCS.rglob("*.md"))]


def main(argv: list[str]) -> int:
    if argv not in (["refresh"], ["check"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    status = 0
    for where, path in pages():
        text = path.read_text(encoding="utf-8")
        if argv == ["refresh"]:
            new = refreshed(text, where)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote the copies of docs/{where}")
            continue
        for problem in check(text, where, complete=True):
            print(f"docs/{where}: {problem}")
            status = 1
    if status:
        print(f"run: {REFRESH}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
