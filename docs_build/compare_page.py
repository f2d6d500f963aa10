"""The compare page's body (``<!-- generated: compare-files -->``): every implementation file
whole, as one tab set for its opening and one per marked section, each under its own heading with
what the section holds (from the table of ``docs/layout.md``), a contrast line for each ordered
pair of styles (from ``docs/data/contrasts.toml``) and what differs (the topic pages' differences
blocks, their links moved to the compare page); ``docs/javascripts/rosetta.js`` shows two of
them."""

from __future__ import annotations

import posixpath
import re
import tomllib

from differences import section_differences
from markdown_text import capitalized, page_title
from repository import BUILTIN, DOCS, IMPLEMENTATIONS, ROOT, SECTIONS, DocsError, shown_name
from sections import sections_of
from tabs import directive_tabs, literal, tab_set


def compare_files() -> str:
    """The compare page's body: every implementation file whole, as one tab set for its opening
    (docstring and imports, up to the first marker) and one per marked section, in
    :data:`SECTIONS` order, each under its own heading; rosetta.js shows two of them.

    The openings are read here rather than through pymdownx.snippets, which drops from what it
    includes every line that mentions its marker syntax (a docstring may explain the markers)."""
    openings = {}
    for key, (_, source) in IMPLEMENTATIONS.items():
        sections = sections_of(ROOT / source)
        if list(sections) != sorted(SECTIONS):
            if key not in BUILTIN:
                continue  # one registered from outside, laid out otherwise: not compared
            raise DocsError(f"{source} has sections {list(sections)}, expected {SECTIONS}")
        first = min(start for start, _ in sections.values())
        lines = (ROOT / source).read_text(encoding="utf-8").splitlines()[: first - 1]
        title = f"{shown_name(source)} · lines 1-{first - 1}"
        openings[key] = [(title, literal("\n".join(lines).rstrip()))]
    out = ['<div class="rosetta-compare" markdown>', "", "## Docstring and imports", ""]
    out += [
        '<div class="rosetta-section-about" markdown>',
        "",
        "Holds what the file says of itself and what it imports: the framework's modules, and "
        "from the project's `spec` the config, the loss, the protocol's `Adapter` and the "
        "helpers every style shares. [The layout](layout.md) says what each part is for.",
        "",
        "</div>",
        "",
        *contrast_lines(contrasts()[OPENING], set(openings)),
    ]
    out.append(tab_set(openings))
    differs, holds = section_differences(), section_holds()
    for section in SECTIONS:
        out += [
            f"## `{section}`",
            "",
            compare_section_intro(section, set(openings), differs, holds),
        ]
        out += [directive_tabs(f"impls:{section}", set(openings))]
    return "\n".join([*out, "</div>", ""])


LAYOUT_PAGE = DOCS / "layout.md"  # its table says what each section holds


def section_holds() -> dict[str, str]:
    """What each section holds, from the table of ``docs/layout.md`` (``| `name` | holds |``)."""
    rows = re.findall(
        r"^\| `([-\w]+)` \| (.+?) \|[ \t]*$", LAYOUT_PAGE.read_text(encoding="utf-8"), re.MULTILINE
    )
    holds = dict(rows)
    missing = [s for s in SECTIONS if s not in holds]
    if missing:
        raise DocsError(f"docs/layout.md's table has no row for section(s) {', '.join(missing)}")
    return holds


CONTRASTS = DOCS / "data" / "contrasts.toml"  # each style's phrase per section: the pair lines
OPENING = "opening"  # the contrasts' name for the files' docstring and imports


def contrasts() -> dict[str, dict[str, str]]:
    """``{section: {"axis": ..., implementation: phrase}}`` from :data:`CONTRASTS`; every
    built-in implementation has a phrase in the opening and every section."""
    data = tomllib.loads(CONTRASTS.read_text(encoding="utf-8"))
    for section in (OPENING, *SECTIONS):
        table = data.get(section) or {}
        missing = [k for k in ("axis", *sorted(BUILTIN)) if not table.get(k)]
        if missing:
            raise DocsError(
                f"docs/data/contrasts.toml [{section}]: expected a phrase for "
                f"{', '.join(missing)}, got none"
            )
    return data


def contrast(table: dict[str, str], a: str, b: str) -> str:
    """What ``a`` does in one section against what ``b`` does: one or two sentences."""
    label = {key: capitalized(label) for key, (label, _) in IMPLEMENTATIONS.items()}
    first = table["axis"]
    if table[a] == table[b]:
        return f"**{first}.** {label[a]} and {label[b]} alike: {table[b]}."
    return f"**{first}.** {label[a]}: {table[a]}. {label[b]}: {table[b]}."


def contrast_lines(table: dict[str, str], keys: set[str]) -> list[str]:
    """One paragraph per ordered pair of the implementations ``table`` has a phrase for
    (``data-pair="LEFT RIGHT"``); rosetta.js shows the chosen pair's."""
    known = [k for k in IMPLEMENTATIONS if k in keys and k in table]
    out = ['<div class="rosetta-contrasts" markdown>', ""]
    for a in known:
        for b in known:
            if a != b:
                out += [
                    f'<div class="rosetta-contrast" data-pair="{a} {b}" markdown>',
                    "",
                    contrast(table, a, b),
                    "",
                    "</div>",
                    "",
                ]
    return [*out, "</div>", ""]


def compare_section_intro(section: str, keys: set[str], differs: dict, holds: dict) -> str:
    """Under a section's heading on the compare page: one line on what the section holds, a link
    to its topic page, and what differs, one bullet per implementation (rosetta.js shows the two
    chosen ones' bullets)."""
    page, items = differs[section]
    title = page_title(DOCS / page)
    out = [
        '<div class="rosetta-section-about" markdown>',
        "",
        f"Holds {holds[section]}. All of them side by side, with more on why: [{title}]({page}).",
        "",
        "</div>",
        "",
        *contrast_lines(contrasts()[section], keys),
        '<div class="rosetta-differs" markdown>',
        "",
    ]
    for impls, text in items:
        shown = [k for k in impls if k in keys]
        if not shown:
            continue
        out += [
            f'<div class="rosetta-differ" data-impls="{" ".join(shown)}" markdown>',
            "",
            moved_links(text, page, "compare.md"),
            "",
            "</div>",
            "",
        ]
    return "\n".join([*out, "</div>", ""])


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def moved_links(text: str, page: str, to: str) -> str:
    """``text``'s relative Markdown links, written on ``page``, made relative to page ``to``."""

    def move(m: re.Match) -> str:
        target = m["target"]
        if re.match(r"^[a-z][-+.a-z]*:|^/", target):
            return m[0]
        path, _, anchor = target.partition("#")
        resolved = (
            posixpath.normpath(posixpath.join(posixpath.dirname(page), path)) if path else page
        )
        moved = posixpath.relpath(resolved, posixpath.dirname(to) or ".")
        return f"]({moved}{'#' + anchor if anchor else ''})"

    return LINK.sub(move, text)
