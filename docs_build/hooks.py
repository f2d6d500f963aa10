"""MkDocs hooks of the cvae-rosetta site (``mkdocs.yml``: ``hooks: [docs_build/hooks.py]``).

What they do, in build order:

- ``on_config``: make pymdownx.snippets read from the repository root whatever the working
  directory, and list every top-level ``docs/*.md`` page that the nav leaves out (pages other
  people add, ``docs/checkpoints.md`` for one) under "Reference", titled by its first heading.
- ``on_files``: a page of its own for every repository file the pages name (:mod:`source_pages`).
- ``on_page_markdown``, before Markdown sees the page:

  0. check the committed copy that follows each of the markers below (the block as a plain view
     of the page shows it, :mod:`raw_blocks`): the build fails on a copy that is not what the
     sources make now, and on a marker of the project's pages that has none, naming the page and
     the command that rewrites them; then drop the copies, so that the site is what the markers
     alone make;
  1. expand ``<!-- rosetta ... -->`` directives into one Material tab per implementation, each tab
     a code block that pymdownx.snippets fills from a marked section (:func:`tabs.expand_rosetta`),
     and ``<!-- snippet FILE[:SECTION] -->`` into one such code block (:func:`tabs.include`);
  2. replace ``<!-- generated: NAME -->`` (:func:`generated.generated`) with what is made now
     from the sources (lines of code per section), from the conformance suite's JSON report (the
     compliance matrix and its one-paragraph summary, every count in them computed), from the
     committed benchmark results (what the jit wrappers cost, read through
     :mod:`cvae_rosetta.bench.results`), or with the compare page's body, every implementation
     file whole (:func:`compare_page.compare_files`); and
     ``<!-- page-link PAGE | TEXT | FALLBACK -->`` with a link, or the fallback text while the
     page does not exist;
  3. check every snippet the page then asks for (:func:`sections.check_snippets`): the file exists
     and the section has exactly one start and one end marker, in that order, around at least one
     non-blank line. pymdownx.snippets' own ``check_paths`` fails on a missing file or section
     but takes a section with no end marker to the end of the file, and inserts an empty one;
     this check refuses all of those, naming the page, the file and the sections it has.
- ``on_page_content``: a code block's title that names a file with a page of its own links to it,
  and inline code in a table may break only between tokens.

The work is done by the modules beside this one, one idea each (MkDocs puts this file's folder on
``sys.path`` while it loads it, so they import each other plainly): :mod:`repository` (the
implementations shown, the repository's paths, :class:`~repository.DocsError`),
:mod:`markdown_text`, :mod:`sections` (marked sections and the snippet check), :mod:`tabs`,
:mod:`differences` (what differs, framework by framework), :mod:`compare_page`,
:mod:`source_pages`, :mod:`lines_of_code`, :mod:`conformance_report`, :mod:`jit_overhead`,
:mod:`generated` (which block each ``<!-- generated: NAME -->`` is) and :mod:`raw_blocks` (the
committed copies).

Everything here reads files only: building the site imports no framework (nor JAX).
"""

from __future__ import annotations

import html as html_module
import posixpath
import re
from pathlib import Path

import source_pages
from differences import check_words_first, differences
from generated import GENERATED, generated
from markdown_text import outside_fences, page_title
from raw_blocks import REFRESH, check, collapse
from repository import DOCS, ROOT, DocsError
from sections import check_snippets
from source_pages import FILENAME, link_sources, source_files, source_page, source_uri
from tabs import INCLUDE, expand_rosetta, include

PAGE_LINK = re.compile(
    r"<!-- page-link (?P<page>[^|]+?) \| (?P<text>[^|]+?) \| (?P<fallback>.+?) -->"
)


def _plugin_error(message: str) -> Exception:
    from mkdocs.exceptions import PluginError

    return PluginError(message)


# --- MkDocs events -------------------------------------------------------------------------------


def on_config(config):
    snippets = config["mdx_configs"].setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [str(ROOT)]
    _add_unlisted_pages(config)
    return config


def on_files(files, config):
    """A page of its own for every repository file the pages name (:func:`source_files`)."""
    from mkdocs.structure.files import File

    try:
        source_pages.SOURCE_FILES = source_files()
    except DocsError as error:
        raise _plugin_error(str(error)) from None
    for path in source_pages.SOURCE_FILES:
        files.append(File.generated(config, source_uri(path), content=source_page(path)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri
    try:
        problems = check(markdown, where, complete=_in_docs(page.file.abs_src_path))
    except DocsError as error:
        raise _plugin_error(f"docs/{where}: {error}") from None
    if problems:
        raise _plugin_error(
            f"docs/{where}: {'; '.join(problems)} (the copies are rewritten by: {REFRESH})"
        )
    markdown = collapse(markdown)

    def expand(text: str) -> str:
        text = expand_rosetta(text)
        text = INCLUDE.sub(lambda m: include(m["ref"], m["indent"]), text)
        text = GENERATED.sub(lambda m: generated(m["name"], where), text)
        text = PAGE_LINK.sub(lambda m: page_link(m, where), text)
        return link_sources(text, where)

    try:
        differences(markdown)  # refuses a malformed block
        check_words_first(markdown, where)
        markdown = outside_fences(markdown, expand)
        check_snippets(markdown)
    except DocsError as error:
        raise _plugin_error(f"docs/{where}: {error}") from None
    return markdown


def on_page_content(html: str, page, config, files) -> str:
    """A code block's title that names a file with a page of its own links to that page; inline
    code in tables may break only between tokens (:func:`_breakable`)."""
    known = set(source_pages.SOURCE_FILES)
    here = posixpath.dirname(page.file.dest_uri)

    def link(m: re.Match) -> str:
        if m["path"] not in known:
            return m[0]
        target = posixpath.dirname(files.get_file_from_path(source_uri(m["path"])).dest_uri)
        href = posixpath.relpath(target, here or ".") + "/"
        return f'<span class="filename"><a href="{href}">{m["path"]}</a>{m["rest"] or ""}</span>'

    return TABLE.sub(lambda m: TABLE_CODE.sub(_breakable, m[0]), FILENAME.sub(link, html))


TABLE = re.compile(r"<table>.*?</table>", re.DOTALL)
TABLE_CODE = re.compile(r"<code>([^<]*)</code>")
BREAK_AT = re.compile(r"(?<=\w)(?=\.\w)|(?<=[(,=/])(?=\S)")


BREAK_LONGER_THAN = 20  # characters: a shorter name (`nnx.jit`, `eqx.filter_jit`) stays whole


def _breakable(m: re.Match) -> str:
    """Inline code in a table's cell longer than :data:`BREAK_LONGER_THAN` characters may break
    before a dot and after ``(``, ``,``, ``=`` or ``/``, never inside a name (the stylesheet stops
    the browser breaking it anywhere else); a shorter one never breaks."""
    if len(html_module.unescape(m[1])) <= BREAK_LONGER_THAN:
        return m[0]
    return "<code>" + BREAK_AT.sub("<wbr>", m[1]) + "</code>"


def _add_unlisted_pages(config) -> None:
    nav = config.get("nav")
    if not nav:
        return
    listed = set(_nav_files(nav))
    extra = []
    for path in sorted(DOCS.glob("*.md")):
        if path.name not in listed:
            extra.append({page_title(path): path.name})
    if not extra:
        return
    for item in nav:
        if isinstance(item, dict) and "Reference" in item:
            item["Reference"].extend(extra)
            return
    nav.append({"Reference": extra})


def _nav_files(nav):
    for item in nav:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                yield from _nav_files(value) if isinstance(value, list) else [value]


def _in_docs(path: str | None) -> bool:
    """Whether a page is one of the project's own (``docs/``), whose markers must have copies; a
    site built elsewhere with these hooks (the tests' small ones) may leave them out."""
    return path is not None and Path(path).resolve().is_relative_to(DOCS.resolve())


def page_link(match: re.Match, where: str) -> str:
    page = match["page"].strip()
    if not (DOCS / page).is_file():
        return match["fallback"].strip()
    href = posixpath.relpath(page, posixpath.dirname(where) or ".")
    return f"[{match['text'].strip()}]({href})"
