"""Source files as pages: every repository source file the pages name (Python, TOML, INI, YAML or
shell: :data:`SOURCE_SUFFIXES`) gets a page of its own (``source/FILE.md``, generated), that shows
it whole with line numbers and lists its marked sections; inline code naming such a file links to
its page (:func:`link_sources`)."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from markdown_text import fence_for
from raw_blocks import collapse
from repository import DOCS, IMPLEMENTATIONS, ROOT, DocsError, in_repository
from sections import sections_of
from tabs import INCLUDE, literal

# the repository files with a page of their own (hooks.on_files sets it)
SOURCE_FILES: list[str] = []
SOURCE_PAGES = "source"  # docs/source/FILE.md: generated, one per repository file the pages name
SOURCE_SUFFIXES = {".py": "python", ".toml": "toml", ".ini": "ini", ".cfg": "ini", ".sh": "bash",
                   ".yml": "yaml", ".yaml": "yaml"}  # fmt: skip
INLINE_PATH = re.compile(
    r"(?<![\[\w`])`(?P<path>[\w.-]+(?:/[\w.-]+)*\.(?:"
    + "|".join(s[1:] for s in SOURCE_SUFFIXES)
    + r"))`(?![\]\w`])"
)
FILENAME = re.compile(r'<span class="filename">(?P<path>[\w./-]+)(?P<rest> · [^<]*)?</span>')


def source_files() -> list[str]:
    """The repository files the site shows as pages of their own: every file a page names in
    inline code (`` `impls/flax_nnx.py` ``) or includes (``<!-- snippet FILE -->``), the
    implementations' and the concept tour's files; text files with a known suffix only."""
    named = {source for _, source in IMPLEMENTATIONS.values() if in_repository(source)}
    named.update(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples" / "tour").glob("*.py"))
    for page in DOCS.rglob("*.md"):
        text = collapse(page.read_text(encoding="utf-8"))  # as the build reads it
        named.update(m["path"] for m in INLINE_PATH.finditer(text))
        named.update(m["ref"].partition(":")[0] for m in INCLUDE.finditer(text))
    return sorted(
        path
        for path in named
        if Path(path).suffix in SOURCE_SUFFIXES
        and not path.startswith(("docs/", "/", "."))
        and (ROOT / path).is_file()
    )


def source_page(path: str) -> str:
    """The Markdown of a file's page: its whole text with line numbers, and its marked sections."""
    text = (ROOT / path).read_text(encoding="utf-8").rstrip("\n")
    lines = literal(text)
    fence = fence_for(text)
    language = SOURCE_SUFFIXES[Path(path).suffix]
    about = [f"The file as the site was built from it: {len(text.splitlines())} lines."]
    try:
        sections = sections_of(ROOT / path)
    except DocsError:
        sections = {}
    impls = [key for key, (_, source) in IMPLEMENTATIONS.items() if source == path]
    if impls:
        other = next(k for k in ("flax_nnx", "pure_jax", *IMPLEMENTATIONS) if k != impls[0])
        href = posixpath.relpath("compare.md", posixpath.dirname(source_uri(path)))
        about.append(
            f"It is the {IMPLEMENTATIONS[impls[0]][0]} implementation: read it beside another, "
            f"section by section, on [the compare page]({href}?a={impls[0]}&b={other})."
        )
    if sections:
        listed = ", ".join(
            f"`{name}` (lines {s + 1}-{e - 1})"
            for name, (s, e) in sorted(sections.items(), key=lambda item: item[1])
        )
        about.append(f"Its marked sections, which the side-by-side pages show: {listed}.")
    return "\n".join(
        [
            "---",
            "hide:",
            "  - navigation",
            "  - toc",
            "---",
            "",
            f"# `{path}`",
            "",
            " ".join(about),
            "",
            f'{fence}{language} linenums="1" title="{path}"',
            *lines,
            fence,
            "",
        ]
    )


def source_uri(path: str) -> str:
    return f"{SOURCE_PAGES}/{path}.md"


def link_sources(markdown: str, where: str) -> str:
    """Inline code naming a file that has a page of its own becomes a link to that page."""
    if where.startswith(SOURCE_PAGES + "/"):
        return markdown
    known = set(SOURCE_FILES)

    def link(m: re.Match) -> str:
        if m["path"] not in known:
            return m[0]
        href = posixpath.relpath(source_uri(m["path"]), posixpath.dirname(where) or ".")
        return f"[{m[0]}]({href})"

    return INLINE_PATH.sub(link, markdown)
