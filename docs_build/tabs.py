"""The side-by-side tabs: a ``<!-- rosetta ... -->`` directive becomes one Material content tab
per implementation (:func:`expand_rosetta`), each tab a code block that pymdownx.snippets fills
from a marked section, or that holds the section itself where the file is outside the repository;
``<!-- snippet FILE[:SECTION] -->`` becomes one such code block (:func:`include`)."""

from __future__ import annotations

import re

from markdown_text import fence_for
from repository import BUILTIN, IMPLEMENTATIONS, ROOT, DocsError, in_repository, shown_name
from sections import SECTION_SUFFIX, section_text, sections_of

DIRECTIVE = re.compile(r"^<!-- rosetta[ \t]*\n?(?P<body>.*?)-->[ \t]*$", re.MULTILINE | re.DOTALL)
INCLUDE = re.compile(r"^(?P<indent>[ \t]*)<!-- snippet (?P<ref>\S+) -->[ \t]*$", re.MULTILINE)


def expand_rosetta(markdown: str) -> str:
    """Each directive becomes one tab per implementation, in a ``<div class="rosetta">``.

    The directive's first line lists the snippets of every tab (``FILE:SECTION``, space-separated;
    ``impls`` as FILE is the implementation's own file, ``{impl}`` is replaced by its key); a
    later line ``KEY: ...`` replaces the list for one implementation::

        <!-- rosetta
        impls:loss
        flax_nnx: impls:loss impls:fast_path
        -->
    """
    return DIRECTIVE.sub(lambda m: directive_tabs(m["body"]), markdown)


def directive_refs(body: str) -> dict[str, list[tuple[str, str]]]:
    """``{key: [(file, section), ...]}``: what one directive's body asks each registered
    implementation's tab to show, in the order of the tabs."""
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    if not lines:
        raise DocsError("an empty rosetta directive")
    default, overrides = lines[0].split(), {}
    for line in lines[1:]:
        key, _, refs = line.partition(":")
        if key.strip() not in IMPLEMENTATIONS or not refs.split():
            raise DocsError(
                f"rosetta directive: expected 'IMPLEMENTATION: FILE:SECTION ...', got {line!r}"
            )
        overrides[key.strip()] = refs.split()
    found = {}
    for key, (_, source) in IMPLEMENTATIONS.items():
        refs = []
        for ref in overrides.get(key, default):
            file, sep, section = ref.replace("{impl}", key).rpartition(":")
            if not sep or not file or not section:
                raise DocsError(f"rosetta directive: expected FILE:SECTION, got {ref!r}")
            refs.append((source if file == "impls" else file, section))
        found[key] = refs
    return found


def directive_tabs(body: str, keys: set[str] | None = None) -> str:
    """The tab set of one directive's body; ``keys``: only these implementations."""
    blocks = {}
    for key, refs in directive_refs(body).items():
        if keys is not None and key not in keys:
            continue
        if key not in BUILTIN and not all(_has_section(f, s) for f, s in refs):
            continue  # one registered from outside: shown where its file has what is asked for
        blocks[key] = [(f"{shown_name(f)} · {s}", _code(f, s)) for f, s in refs]
    return tab_set(blocks)


def _has_section(file: str, section: str) -> bool:
    path = ROOT / file
    return path.is_file() and section in sections_of(path)


def _code(file: str, section: str) -> list[str]:
    """A code block's lines for a section: a snippet line where pymdownx.snippets can read the
    file, else the section itself, read here (a file outside the repository)."""
    if in_repository(file):
        return [f'--8<-- "{file}:{section}"']
    return literal(section_text(ROOT / file, section))


def tab_set(blocks: dict[str, list[tuple[str, list[str]]]]) -> str:
    """One Material content tab per implementation, in a ``<div class="rosetta">`` that names the
    implementations' keys in tab order (``data-impls``, read by ``docs/javascripts/rosetta.js``);
    ``blocks[key]`` is that tab's code blocks, each ``(title, lines)``: a snippet line for
    pymdownx.snippets, or the code itself as :func:`literal` lines."""
    keys = [key for key in IMPLEMENTATIONS if key in blocks]
    out = [f'<div class="rosetta" data-impls="{" ".join(keys)}" markdown>', ""]
    for key in keys:
        out += [f'=== "{IMPLEMENTATIONS[key][0]}"', ""]
        for title, lines in blocks[key]:
            fence = fence_for("\n".join(lines))
            body = [f"    {line}".rstrip() for line in lines]
            out += [f'    {fence}python title="{title}"', *body, f"    {fence}", ""]
    return "\n".join([*out, "</div>", ""])


# Where pymdownx.snippets would see its syntax in a line: a marker that starts the line (an
# inclusion), or a section marker anywhere.
SNIPPET_SYNTAX = re.compile(
    r"^(?P<indent>[ \t]*)(?=-+8<-)|(?=-+8<-+[ \t]+\[[ \t]*(?:start|end)[ \t]*:)", re.IGNORECASE
)


def literal(text: str) -> list[str]:
    """``text``'s lines, escaped so that pymdownx.snippets leaves them as they are: it reads every
    line of a page, takes one that starts with its marker for an inclusion and drops one with a
    section marker anywhere in it, unless the marker is escaped with ``;`` (which it removes)."""
    return [
        SNIPPET_SYNTAX.sub(lambda m: (m["indent"] or "") + ";", line, count=1)
        for line in text.splitlines()
    ]


def include(ref: str, indent: str = "") -> str:
    """``<!-- snippet FILE[:SECTION] -->``: one code block holding a whole file or one section.
    (A directive rather than a fenced block with a snippet line in the page's source, so that
    formatters of Python code in Markdown leave the page alone.)"""
    lines = [f'```python title="{snippet_title(ref)}"', f'--8<-- "{ref}"', "```"]
    return "\n".join(indent + line for line in lines)


def snippet_title(ref: str) -> str:
    """The title of the code block of ``<!-- snippet REF -->``: the file, and the section."""
    return ref.replace(":", " · ") if SECTION_SUFFIX.match(ref) else ref
