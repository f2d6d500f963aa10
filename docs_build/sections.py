"""The marked sections of a file (``# --8<-- [start:NAME]`` ... ``# --8<-- [end:NAME]``), and the
check of every snippet a page asks for (:func:`check_snippets`).

The check: the file exists and the section has exactly one start and one end marker, in that
order, around at least one non-blank line. pymdownx.snippets' own ``check_paths`` fails on a
missing file or section but takes a section with no end marker to the end of the file, and inserts
an empty one; this check refuses all of those, naming the file and the sections it has.
"""

from __future__ import annotations

import re
from pathlib import Path

from repository import ROOT, DocsError, repo_path

MARKER = re.compile(
    r"^[ \t]*#?[ \t]*-{1,}8<-{1,}[ \t]+\[[ \t]*(start|end)[ \t]*:[ \t]*([-\w]+)[ \t]*\]"
)
SNIPPET = re.compile(r"""^[ \t]*(?P<escape>;*)-{1,}8<-{1,}[ \t]+(?P<q>["'])(?P<target>.+?)(?P=q)""")
SECTION_SUFFIX = re.compile(r"^(?P<path>.+?):(?P<section>[a-z][-_0-9a-z]*)$", re.IGNORECASE)


# a section marker anywhere in a line: pymdownx.snippets drops such lines from what it includes
ANY_MARKER = re.compile(r"-{1,}8<-{1,}[ \t]+\[[ \t]*(?:start|end)[ \t]*:", re.IGNORECASE)


def sections_of(path: Path) -> dict[str, tuple[int, int]]:
    """``{name: (start line, end line)}`` of a file's marked sections (1-based marker lines).

    Raises :class:`DocsError` for a section that starts or ends twice, ends before it starts, or
    does not end.
    """
    starts: dict[str, list[int]] = {}
    ends: dict[str, list[int]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = MARKER.match(line)
        if m:
            (starts if m[1] == "start" else ends).setdefault(m[2], []).append(number)
    found = {}
    for name in sorted(set(starts) | set(ends)):
        s, e = starts.get(name, []), ends.get(name, [])
        if len(s) != 1 or len(e) != 1:
            raise DocsError(
                f"{repo_path(path)}: section {name!r} must have one start and one end marker, "
                f"has {len(s)} start and {len(e)} end (lines {sorted(s + e)})"
            )
        if e[0] < s[0]:
            raise DocsError(
                f"{repo_path(path)}: section {name!r} ends (line {e[0]}) before it starts"
            )
        found[name] = (s[0], e[0])
    return found


def section_text(path: Path, name: str) -> str:
    """The lines of section ``name`` of ``path`` as pymdownx.snippets includes them (without the
    lines that hold a section marker); refused where the section is missing or empty."""
    found = sections_of(path)
    if name not in found:
        have = ", ".join(found) or "none"
        raise DocsError(f"{repo_path(path)} has no section {name!r} (it has: {have})")
    start, end = found[name]
    lines = path.read_text(encoding="utf-8").splitlines()[start : end - 1]
    kept = [line for line in lines if not ANY_MARKER.search(line)]
    if not any(line.strip() for line in kept):
        raise DocsError(f"section {name!r} of {repo_path(path)} is empty")
    return "\n".join(kept)


def check_snippets(markdown: str) -> None:
    """Refuse any ``--8<-- "FILE:SECTION"`` whose file or section is missing, unterminated or
    empty (escaped ``;--8<--`` lines are text, not snippets)."""
    problems = []
    for line in markdown.splitlines():
        m = SNIPPET.match(line)
        if not m or m["escape"]:
            continue
        target = m["target"]
        section = SECTION_SUFFIX.match(target)
        file = section["path"] if section else re.sub(r"(:-?\d*)+(,.*)?$", "", target)
        path = ROOT / file
        if not path.is_file():
            problems.append(f"snippet {target!r}: no file {file}")
            continue
        if not section:
            continue
        try:
            found = sections_of(path)
        except DocsError as error:
            problems.append(str(error))
            continue
        name = section["section"]
        if name not in found:
            have = ", ".join(found) or "none"
            problems.append(f"snippet {target!r}: {file} has no section {name!r} (it has: {have})")
            continue
        start, end = found[name]
        body = path.read_text(encoding="utf-8").splitlines()[start : end - 1]
        if not any(line.strip() and not MARKER.match(line) for line in body):
            problems.append(f"snippet {target!r}: section {name!r} of {file} is empty")
    if problems:
        raise DocsError("; ".join(problems))
