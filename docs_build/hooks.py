"""MkDocs hooks of the cvae-rosetta site (``mkdocs.yml``: ``hooks: [docs_build/hooks.py]``).

What they do, in build order:

- ``on_config``: make pymdownx.snippets read from the repository root whatever the working
  directory, and list every top-level ``docs/*.md`` page that the nav leaves out (pages other
  people add, ``docs/checkpoints.md`` for one) under "Reference", titled by its first heading.
- ``on_page_markdown``, before Markdown sees the page:

  1. expand ``<!-- rosetta ... -->`` directives into one Material tab per implementation, each tab
     a code block that pymdownx.snippets fills from a marked section (:func:`expand_rosetta`),
     and ``<!-- snippet FILE[:SECTION] -->`` into one such code block (:func:`include`);
  2. replace ``<!-- generated: NAME -->`` with what is made now from the sources (lines of code
     per section), from the conformance suite's JSON report (the compliance matrix and its
     one-paragraph summary, every count in them computed), from the committed benchmark results
     (what the jit wrappers cost, read through :mod:`cvae_rosetta.bench.results`), or with the
     compare page's body, every implementation file whole (:func:`compare_files`); and
     ``<!-- page-link PAGE | TEXT | FALLBACK -->`` with a link, or the fallback text while the
     page does not exist;
  3. check every snippet the page then asks for (:func:`check_snippets`): the file exists and
     the section has exactly one start and one end marker, in that order, around at least one
     non-blank line. pymdownx.snippets' own ``check_paths`` fails on a missing file or section
     but takes a section with no end marker to the end of the file, and inserts an empty one;
     this check refuses all of those, naming the page, the file and the sections it has.

The implementations shown are the registered ones, in the registry's order, each under the label
its module's ``ABOUT`` gives (:func:`registered_implementations`); one registered from outside the
repository appears wherever its file has the section a page asks for.

Everything here reads files only: building the site imports no framework (nor JAX).

Words: a *check* is one test function of the suite (one row of the matrix); its *cases* are its
parametrisations (loss kinds, partners, mechanisms, ...), each run and reported on its own.
"""

from __future__ import annotations

import ast
import html as html_module
import io
import json
import logging
import os
import posixpath
import re
import tokenize
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REPORT = DOCS / "data" / "conformance.json"  # the committed report; see docs/conformance.md
REPORT_ENV = "CVAE_DOCS_CONFORMANCE_REPORT"  # another report instead, e.g. one just written
SUITE = ROOT / "conformance"  # the suite's test modules, for the checks a report lacks
MATRIX = "conformance.md#the-compliance-matrix"  # where the whole matrix is
RESULTS = ROOT / "benchmarks" / "results"
BENCH_FILES = ("bench_cpu.json", "bench_gpu.json")  # the committed `cvae bench` results
SOURCE_FILES: list[str] = []  # the repository files with a page of their own (on_files sets it)
log = logging.getLogger("mkdocs.hooks.rosetta")

IMPLS = ROOT / "impls"  # the built-in implementations' folder (cvae_rosetta.impls)


def registered_implementations() -> tuple[dict[str, tuple[str, str]], set[str]]:
    """``key: (tab label, source file)`` of every registered implementation, in the order of the
    tabs and of every table's columns, and the keys of the built-in ones.

    Read from the ``cvae_rosetta.impls`` entry points and each module's ``ABOUT`` (its label) by
    :mod:`cvae_rosetta.spec.registry`, which imports neither an implementation nor JAX. A source
    file is relative to :data:`ROOT` where it lives in the repository (a built-in's is its file in
    :data:`IMPLS`, whatever copy is installed), else absolute: one registered from outside, whose
    sections the hooks read themselves (pymdownx.snippets reads below its base path only).
    """
    try:
        from cvae_rosetta.spec import registry
    except ImportError as error:
        raise ImportError(
            f"docs_build/hooks.py: the implementations are read from the installed project's "
            f"entry points, and it is not installed here ({error})"
        ) from error
    found, builtin = {}, set()
    for info in registry.known():
        source = info.source
        if info.builtin:
            module = info.target.partition(":")[0].removeprefix(registry.BUILTIN_PACKAGE + ".")
            copy = IMPLS / (module.replace(".", "/") + ".py")
            source = copy if copy.is_file() else source
            builtin.add(info.name)
        if source is None:
            log.info("%s: no source file found for %s; left out", info.name, info.target)
            continue
        try:
            shown = source.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            shown = str(source.resolve())
        found[info.name] = (info.about.label, shown)
    return found, builtin


# key: (tab label, source file); the order of the tabs and of every table's columns.
IMPLEMENTATIONS, BUILTIN = registered_implementations()
SECTIONS = ["module", "init", "forward", "loss", "train_step", "fast_path", "paths", "adapter"]
TOUR = ["stateful_layers", "surgery", "scan_layers", "inspect_model", "variables"]

MARKER = re.compile(
    r"^[ \t]*#?[ \t]*-{1,}8<-{1,}[ \t]+\[[ \t]*(start|end)[ \t]*:[ \t]*([-\w]+)[ \t]*\]"
)
SNIPPET = re.compile(r"""^[ \t]*(?P<escape>;*)-{1,}8<-{1,}[ \t]+(?P<q>["'])(?P<target>.+?)(?P=q)""")
SECTION_SUFFIX = re.compile(r"^(?P<path>.+?):(?P<section>[a-z][-_0-9a-z]*)$", re.IGNORECASE)
DIRECTIVE = re.compile(r"^<!-- rosetta[ \t]*\n?(?P<body>.*?)-->[ \t]*$", re.MULTILINE | re.DOTALL)
INCLUDE = re.compile(r"^(?P<indent>[ \t]*)<!-- snippet (?P<ref>\S+) -->[ \t]*$", re.MULTILINE)
GENERATED = re.compile(r"^<!-- generated: (?P<name>[-\w]+) -->[ \t]*$", re.MULTILINE)
PAGE_LINK = re.compile(
    r"<!-- page-link (?P<page>[^|]+?) \| (?P<text>[^|]+?) \| (?P<fallback>.+?) -->"
)


class DocsError(Exception):
    """A page asks for something the sources do not have; raised as MkDocs' PluginError."""


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

    global SOURCE_FILES
    try:
        SOURCE_FILES = source_files()
    except DocsError as error:
        raise _plugin_error(str(error)) from None
    for path in SOURCE_FILES:
        files.append(File.generated(config, source_uri(path), content=source_page(path)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri

    def expand(text: str) -> str:
        text = expand_rosetta(text)
        text = INCLUDE.sub(lambda m: include(m["ref"], m["indent"]), text)
        text = GENERATED.sub(lambda m: generated(m["name"], where), text)
        text = PAGE_LINK.sub(lambda m: page_link(m, where), text)
        return link_sources(text, where)

    try:
        differences(markdown, where)  # refuses a malformed block
        check_words_first(markdown, where)
        markdown = outside_fences(markdown, expand)
        check_snippets(markdown)
    except DocsError as error:
        raise _plugin_error(f"docs/{where}: {error}") from None
    return markdown


def on_page_content(html: str, page, config, files) -> str:
    """A code block's title that names a file with a page of its own links to that page; inline
    code in tables may break only between tokens (:func:`_breakable`)."""
    known = set(SOURCE_FILES)
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


# --- side-by-side tabs ---------------------------------------------------------------------------


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
    return DIRECTIVE.sub(lambda m: _tabs(m["body"]), markdown)


def _tabs(body: str, keys: set[str] | None = None) -> str:
    """The tab set of one directive's body; ``keys``: only these implementations."""
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
    blocks = {}
    for key, (_, source) in IMPLEMENTATIONS.items():
        if keys is not None and key not in keys:
            continue
        refs = []
        for ref in overrides.get(key, default):
            file, sep, section = ref.replace("{impl}", key).rpartition(":")
            if not sep or not file or not section:
                raise DocsError(f"rosetta directive: expected FILE:SECTION, got {ref!r}")
            refs.append((source if file == "impls" else file, section))
        if key not in BUILTIN and not all(_has_section(f, s) for f, s in refs):
            continue  # one registered from outside: shown where its file has what is asked for
        blocks[key] = [(f"{_shown(f)} · {s}", _code(f, s)) for f, s in refs]
    return tab_set(blocks)


def _inside(file: str) -> bool:
    """Whether ``file`` (relative to :data:`ROOT`, or absolute) is in the repository, where
    pymdownx.snippets can read it."""
    try:
        (ROOT / file).resolve().relative_to(ROOT.resolve())
    except ValueError:
        return False
    return True


def _shown(file: str) -> str:
    """How a code block's title names ``file``: its path in the repository, else its name."""
    return file if _inside(file) else Path(file).name


def _has_section(file: str, section: str) -> bool:
    path = ROOT / file
    return path.is_file() and section in sections_of(path)


def _code(file: str, section: str) -> list[str]:
    """A code block's lines for a section: a snippet line where pymdownx.snippets can read the
    file, else the section itself, read here (a file outside the repository)."""
    if _inside(file):
        return [f'--8<-- "{file}:{section}"']
    return literal(section_text(ROOT / file, section))


# a section marker anywhere in a line: pymdownx.snippets drops such lines from what it includes
ANY_MARKER = re.compile(r"-{1,}8<-{1,}[ \t]+\[[ \t]*(?:start|end)[ \t]*:", re.IGNORECASE)


def section_text(path: Path, name: str) -> str:
    """The lines of section ``name`` of ``path`` as pymdownx.snippets includes them (without the
    lines that hold a section marker); refused where the section is missing or empty."""
    found = sections_of(path)
    if name not in found:
        have = ", ".join(found) or "none"
        raise DocsError(f"{_rel(path)} has no section {name!r} (it has: {have})")
    start, end = found[name]
    lines = path.read_text(encoding="utf-8").splitlines()[start : end - 1]
    kept = [line for line in lines if not ANY_MARKER.search(line)]
    if not any(line.strip() for line in kept):
        raise DocsError(f"section {name!r} of {_rel(path)} is empty")
    return "\n".join(kept)


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
        title = f"{_shown(source)} · lines 1-{first - 1}"
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
        out += [_tabs(f"impls:{section}", set(openings))]
    return "\n".join([*out, "</div>", ""])


def include(ref: str, indent: str = "") -> str:
    """``<!-- snippet FILE[:SECTION] -->``: one code block holding a whole file or one section.
    (A directive rather than a fenced block with a snippet line in the page's source, so that
    formatters of Python code in Markdown leave the page alone.)"""
    title = ref.replace(":", " · ") if SECTION_SUFFIX.match(ref) else ref
    lines = [f'```python title="{title}"', f'--8<-- "{ref}"', "```"]
    return "\n".join(indent + line for line in lines)


# --- the snippet check ---------------------------------------------------------------------------


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
                f"{_rel(path)}: section {name!r} must have one start and one end marker, "
                f"has {len(s)} start and {len(e)} end (lines {sorted(s + e)})"
            )
        if e[0] < s[0]:
            raise DocsError(f"{_rel(path)}: section {name!r} ends (line {e[0]}) before it starts")
        found[name] = (s[0], e[0])
    return found


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


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


# --- what differs, framework by framework --------------------------------------------------------

DIFFERENCES = re.compile(
    r"^<!-- differences(?::[ \t]*(?P<name>[-\w]+))?[ \t]*-->[ \t]*\n(?P<body>.*?)"
    r"^<!-- end differences -->[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
BULLET_LABELS = re.compile(r"^- (?P<labels>\*\*[^*\n]+\*\*(?:(?:,? and |, )\*\*[^*\n]+\*\*)*)")
TOPICS = DOCS / "topics"
LAYOUT_PAGE = DOCS / "layout.md"  # its table says what each section holds
CODE_START = re.compile(r"^(?:<!-- (?:rosetta|snippet)\b|[ \t]*(?:`{3,}|~{3,}))", re.MULTILINE)


def differences(markdown: str, where: str) -> list[tuple[str | None, list[tuple[list[str], str]]]]:
    """A page's differences blocks, in order: ``(name, [(keys, text), ...])``, one item per
    bullet, ``keys`` the implementations its bold labels name, ``text`` the bullet without its
    ``- `` and its continuation lines' indentation.

    A block is written::

        <!-- differences: SECTION -->
        - **Pure JAX** has no module: ...
        - **Flax NNX**, **Equinox** and **Keras 3** ...
        <!-- end differences -->

    and must name every built-in implementation exactly once (by its label, any case); a block
    named after a section of the implementation files is what the compare page shows under that
    section for the two implementations chosen."""
    by_label = {label.lower(): key for key, (label, _) in IMPLEMENTATIONS.items()}
    blocks = []
    for m in DIFFERENCES.finditer(unfenced(markdown)):
        name = m["name"]
        if name is not None and name not in SECTIONS:
            raise DocsError(
                f"differences block {name!r}: expected a section of the implementation files "
                f"({', '.join(SECTIONS)}) or no name"
            )
        items: list[tuple[list[str], list[str]]] = []
        for line in m["body"].splitlines():
            if not line.strip():
                continue
            if line.startswith("- "):
                lead = BULLET_LABELS.match(line)
                labels = re.findall(r"\*\*([^*]+)\*\*", lead["labels"]) if lead else []
                unknown = [label for label in labels if label.lower() not in by_label]
                if not labels or unknown:
                    raise DocsError(
                        f"differences block {name or '(unnamed)'}: expected each bullet to start "
                        f"with bold labels ({', '.join(lab for lab, _ in IMPLEMENTATIONS.values())}"
                        f"), got {line[:60]!r}"
                    )
                items.append(([by_label[label.lower()] for label in labels], [line[2:]]))
            elif line.startswith((" ", "\t")) and items:
                items[-1][1].append(line.strip())
            else:
                raise DocsError(
                    f"differences block {name or '(unnamed)'}: expected bullets ('- **Label** "
                    f"...') and their indented continuation lines, got {line[:60]!r}"
                )
        named = Counter(key for keys, _ in items for key in keys)
        missing = [IMPLEMENTATIONS[k][0] for k in IMPLEMENTATIONS if k in BUILTIN and not named[k]]
        twice = [IMPLEMENTATIONS[k][0] for k, n in named.items() if n > 1]
        if missing or twice:
            raise DocsError(
                f"differences block {name or '(unnamed)'}: expected every implementation in "
                f"exactly one bullet, got {'no ' + ', '.join(missing) if missing else ''}"
                f"{'; ' if missing and twice else ''}"
                f"{', '.join(twice) + ' more than once' if twice else ''}"
            )
        blocks.append((name, [(keys, " ".join(lines)) for keys, lines in items]))
    return blocks


def unfenced(markdown: str) -> str:
    """``markdown`` without its fenced code blocks (where a page may show a block as an example)."""
    kept: list[str] = []
    outside_fences(markdown, lambda text: kept.append(text) or text)
    return "".join(kept)


def check_words_first(markdown: str, where: str) -> None:
    """A side-by-side page (``topics/*.md``, ``tour/*.md``, not their index pages) says what it
    is about in a paragraph before its first code; a topic page also says, framework by
    framework, what differs (a differences block) before it."""
    parts = where.split("/")
    if len(parts) != 2 or parts[0] not in ("topics", "tour") or parts[1] == "index.md":
        return
    body = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.DOTALL)
    first = CODE_START.search(body)
    before = body[: first.start()] if first else body
    prose = [
        line
        for line in re.sub(r"<!--.*?-->", "", before, flags=re.DOTALL).splitlines()
        if line.strip() and not line.startswith(("#", "- ", "  ", "|"))
    ]
    if first and not prose:
        raise DocsError("expected a paragraph before the first code, got code first")
    if first and parts[0] == "topics" and not DIFFERENCES.search(before):
        raise DocsError(
            "expected a differences block (<!-- differences --> ... <!-- end differences -->) "
            "before the first code: what differs, framework by framework"
        )


def section_differences() -> dict[str, tuple[str, list[tuple[list[str], str]]]]:
    """``{section: (topic page, bullets)}``: the named differences blocks of ``docs/topics``;
    every section of the implementation files must be named by exactly one."""
    found: dict[str, tuple[str, list[tuple[list[str], str]]]] = {}
    for path in sorted(TOPICS.glob("*.md")):
        page = path.relative_to(DOCS).as_posix()
        try:
            blocks = differences(path.read_text(encoding="utf-8"), page)
        except DocsError as error:
            raise DocsError(f"docs/{page}: {error}") from None
        for name, items in blocks:
            if name is None:
                continue
            if name in found:
                raise DocsError(
                    f"differences block {name!r}: expected one, got one in docs/{found[name][0]} "
                    f"and one in docs/{page}"
                )
            found[name] = (page, items)
    missing = [s for s in SECTIONS if s not in found]
    if missing:
        raise DocsError(
            f"no differences block names section(s) {', '.join(missing)} (expected one "
            "'<!-- differences: SECTION -->' per section in docs/topics/*.md)"
        )
    return found


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


def fence_for(text: str) -> str:
    """A code fence longer than any run of backticks in ``text`` (at least three)."""
    return "`" * max(3, 1 + max(map(len, re.findall(r"`+", text)), default=0))


def page_title(path: Path) -> str:
    heading = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return heading[1].strip() if heading else path.stem


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
    label = {key: _cap(label) for key, (label, _) in IMPLEMENTATIONS.items()}
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


# --- source files as pages -----------------------------------------------------------------------

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
    named = {source for _, source in IMPLEMENTATIONS.values() if _inside(source)}
    named.update(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples" / "tour").glob("*.py"))
    for page in DOCS.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
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


# --- lines of code -------------------------------------------------------------------------------


def code_lines(source: str) -> set[int]:
    """Line numbers holding code: no blank lines, no comment-only lines, no docstrings."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    ignored = {
        tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENCODING, tokenize.ENDMARKER,
    }  # fmt: skip
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in ignored:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def section_counts(path: Path) -> dict[str, int]:
    """Code lines per marked section, and ``"file"`` for the whole file."""
    source = path.read_text(encoding="utf-8")
    code = code_lines(source)
    counts = {
        name: len({n for n in code if s < n < e}) for name, (s, e) in sections_of(path).items()
    }
    counts["file"] = len(code)
    return counts


SHARED_STATE = ROOT / "shared" / "spec" / "state.py"  # the TrainState pure JAX and Haiku use
# What each style's file is counted as, like with like: the model and its training (what a project
# of its own writes in that style), its state (the `init` section, without the converters to and
# from the spec's canonical tree; with the shared TrainState where the file uses it), and what
# this project's protocol adds (the converters, the fast path, the other paths, the adapter).
ROLES = (
    ("the model: `module`, `forward`", ("module", "forward")),
    ("its loss and step: `loss`, `train_step`", ("loss", "train_step")),
    ("its parameters and state: `init` without the converters", ("init",)),
    ("for the protocol: the converters, `fast_path`, `paths`, `adapter`", ("fast_path", "paths",
                                                                          "adapter")),
)  # fmt: skip


def converter_lines(path: Path) -> set[int]:
    """The code lines of the file's top-level functions whose name says they convert to or from
    the canonical tree (``to_canonical``, ``from_canonical_params``, ...)."""
    source = path.read_text(encoding="utf-8")
    code = code_lines(source)
    spans = [
        range(min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno + 1)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and "canonical" in node.name
    ]
    return {n for span in spans for n in span if n in code}


def shared_state_lines(path: Path) -> int:
    """The shared ``TrainState``'s code lines where the file imports it, else 0."""
    uses = re.search(r"^from cvae_rosetta\.spec\.state import .*\bTrainState\b",
                     path.read_text(encoding="utf-8"), re.MULTILINE)  # fmt: skip
    if not uses:
        return 0
    source = SHARED_STATE.read_text(encoding="utf-8")
    code = code_lines(source)
    cls = next(n for n in ast.parse(source).body if getattr(n, "name", None) == "TrainState")
    return len({n for n in code if cls.lineno <= n <= cls.end_lineno})


def role_counts(path: Path) -> list[tuple[int, int]]:
    """Per role of :data:`ROLES`: ``(own lines, shared lines)``."""
    counts, sections = section_counts(path), sections_of(path)
    converters = converter_lines(path)
    start, end = sections.get("init", (0, 0))
    in_init = len({n for n in converters if start < n < end})
    out = []
    for _, names in ROLES:
        own = sum(counts.get(name, 0) for name in names)
        if "init" in names:
            out.append((own - in_init, shared_state_lines(path)))
        elif "adapter" in names:
            out.append((own + len(converters), 0))
        else:
            out.append((own, 0))
    return out


def loc_table() -> str:
    paths = {key: ROOT / source for key, (_, source) in IMPLEMENTATIONS.items()}
    roles = {key: role_counts(path) for key, path in paths.items()}
    counts = {key: section_counts(path) for key, path in paths.items()}

    def cell(own: int, shared: int) -> str:
        return f"{own} + {shared} shared" if shared else str(own)

    rows = [_row(["", *(label for label, _ in IMPLEMENTATIONS.values())])]
    rows.append("|---|" + "---:|" * len(IMPLEMENTATIONS))
    for i, (role, _) in enumerate(ROLES):
        rows.append(_row([role, *(cell(*roles[k][i]) for k in roles)]))
    total = [(sum(o for o, _ in roles[k]), sum(s for _, s in roles[k])) for k in roles]
    rows.append(_row(["**all**", *(f"**{cell(*t)}**" for t in total)]))
    rows.append(_row(["whole file (imports included)", *(counts[k]["file"] for k in counts)]))
    return "\n".join(rows) + "\n"


def tour_loc_table() -> str:
    """Code lines of each tour example per implementation: its section named after the
    implementation's key. A column for every built-in, and for one registered from outside that
    some example has a section for."""
    counts = {name: section_counts(ROOT / "examples" / "tour" / f"{name}.py") for name in TOUR}
    keys = [k for k in IMPLEMENTATIONS if k in BUILTIN or any(k in c for c in counts.values())]
    rows = [_row(["tour example", *(IMPLEMENTATIONS[key][0] for key in keys)])]
    rows.append("|---|" + "---:|" * len(keys))
    for name in TOUR:
        rows.append(
            _row([f"[{name}](tour/{name}.md)", *(counts[name].get(key, 0) for key in keys)])
        )
    return "\n".join(rows) + "\n"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


# --- the conformance matrix and its summary ------------------------------------------------------


def read_report() -> tuple[dict, str]:
    """The conformance report the pages are made from, and how a page names it: the committed
    one, or the one ``$CVAE_DOCS_CONFORMANCE_REPORT`` points at."""
    given = os.environ.get(REPORT_ENV)
    path = Path(given or REPORT)
    if not path.is_file():
        raise DocsError(
            f"no conformance report at {path} (see 'The compliance matrix' in docs/conformance.md)"
        )
    report = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(report.get("results"), dict) or not report["results"]:
        raise DocsError(f"{path}: the conformance report has no results")
    source = f"`{path.name}` (from `${REPORT_ENV}`)" if given else "`docs/data/conformance.json`"
    return report, source


def _label(key: str) -> str:
    return IMPLEMENTATIONS[key][0] if key in IMPLEMENTATIONS else key


def _check_of(case: str) -> str:
    """``test_spec.py::test_loss_matches_reference[mse-1.0]`` -> its check, without the case."""
    return re.sub(r"\[.*\]$", "", case).strip(":")


def _failed(outcome: str) -> bool:
    """Anything but a pass, a skip or "not applicable" counts as a failure (an error, say)."""
    return outcome not in ("passed", "not applicable") and not outcome.startswith("skipped")


def outcomes(report: dict) -> tuple[list[str], dict[str, dict[str, Counter]]]:
    """The report's implementations in tab order, and for every check the outcomes of its cases
    per implementation."""
    impls = [key for key in IMPLEMENTATIONS if key in report["results"]]
    impls += sorted(set(report["results"]) - set(impls))
    checks: dict[str, dict[str, Counter]] = {}
    for impl in impls:
        for case, outcome in report["results"][impl].items():
            checks.setdefault(_check_of(case), {}).setdefault(impl, Counter())[outcome] += 1
    return impls, checks


def suite_checks() -> set[str] | None:
    """Every check the suite has now (``FILE::FUNCTION``, ``FILE::CLASS::METHOD`` in a test
    class), read from ``conformance/test_*.py`` without importing it; None without the suite."""
    if not SUITE.is_dir():
        return None
    found = set()
    functions = ast.FunctionDef | ast.AsyncFunctionDef
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, functions) and node.name.startswith("test"):
                found.add(f"{path.name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                found.update(
                    f"{path.name}::{node.name}::{item.name}"
                    for item in node.body
                    if isinstance(item, functions) and item.name.startswith("test")
                )
    return found


def suite_drift(checks) -> str:
    """A sentence naming the suite's checks that a report lacks and the ones it has that the suite
    no longer has; empty when they agree (or the suite is not here to compare)."""
    now = suite_checks()
    if now is None:
        return ""
    missing, gone = sorted(now - set(checks)), sorted(set(checks) - now)
    out = []
    if missing:
        out.append(
            f"The suite has {len(now)} checks now; the report lacks {len(missing)} of them: "
            f"{_check_list(missing)}."
        )
    if gone:
        out.append(
            f"The report holds {_count(len(gone), 'check')} the suite no longer has: "
            f"{_check_list(gone)}."
        )
    return " ".join(out)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)


def _group(impls: list[str], everyone: list[str]) -> str:
    """ "all six", "Flax NNX", "pure JAX, Flax Linen and Haiku"."""
    if impls == everyone and len(everyone) > 1:
        n = len(everyone)
        return f"all {NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else n}"
    labels = [_label(i) for i in impls]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _check_list(checks: list[str], limit: int = 6) -> str:
    shown = [_check_name(c) for c in checks[:limit]]
    more = len(checks) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _report_environment(report: dict, impls: list[str]) -> str:
    """``on the CPU (jax 0.10.2, flax 0.12.8, ..., Python 3.11.7)``."""
    versions = {"jax": report.get("jax", "?")}
    for impl in impls:
        entry = report.get("implementations", {}).get(impl) or {}
        if entry.get("framework"):
            versions.setdefault(entry["framework"], entry.get("version", "?"))
    listed = ", ".join(f"{name} {version}" for name, version in versions.items())
    backend = str(report.get("backend", "?")).upper()
    return f"on the {backend} ({listed}, Python {report.get('python', '?')})"


def conformance_summary(where: str) -> str:
    """One paragraph from the conformance report, every count computed: who passes every check
    that applies, who fails or skips which, what is not applicable to whom, which of the suite's
    checks the report lacks, and a link to the whole matrix."""
    report, source = read_report()
    impls, checks = outcomes(report)
    cases = {i: len(report["results"][i]) for i in impls}
    failed = {i: [c for c in sorted(checks) if _failing(checks[c].get(i))] for i in impls}
    n_failed = {i: sum(_n(checks[c].get(i), _failed) for c in checks) for i in impls}
    skipped = {i: [c for c in sorted(checks) if _n(checks[c].get(i), _skipped)] for i in impls}
    n_skipped = {i: sum(_n(checks[c].get(i), _skipped) for c in checks) for i in impls}
    lo, hi = min(cases.values()), max(cases.values())
    case_counts = _count(lo, "case") if lo == hi else f"{lo} to {hi} cases"
    when = f"report of {str(report.get('created', '?'))[:10]}"
    if os.environ.get(REPORT_ENV):
        when += f", {source},"
    when += f" {_report_environment(report, impls)}"
    clean = [i for i in impls if not n_failed[i] and not n_skipped[i]]
    if clean == impls:
        who = (
            f"{_label(impls[0])} passes every check that applies to it"
            if len(impls) == 1
            else f"{_cap(_group(impls, impls))} implementations pass every check that applies "
            "to them"
        )
        first = (
            f"{who} in the conformance suite's {when}: {_count(len(checks), 'check')}, "
            f"{case_counts} each (a check's cases are its parametrisations)."
        )
    else:
        parts = []
        for i in impls:
            if n_failed[i]:
                part = (
                    f"{_label(i)} fails {n_failed[i]} of its {cases[i]} cases, in "
                    f"{_count(len(failed[i]), 'check')} ({_check_list(failed[i])})"
                )
                if n_skipped[i]:
                    part += f", and has {n_skipped[i]} skipped"
                parts.append(part)
            elif n_skipped[i]:
                parts.append(
                    f"{_label(i)} passes every case that ran but has {n_skipped[i]} of its "
                    f"{cases[i]} cases skipped, neither passed nor failed, in "
                    f"{_count(len(skipped[i]), 'check')} ({_check_list(skipped[i])})"
                )
        if clean:
            verb = "passes" if len(clean) == 1 else "pass"
            them = "it" if len(clean) == 1 else "them"
            parts.append(f"{_group(clean, impls)} {verb} every check that applies to {them}")
        first = (
            f"In the conformance suite's {when}, its {_count(len(checks), 'check')} ran as "
            f"{case_counts} for each implementation (a check's cases are its parametrisations): "
            + "; ".join(parts)
            + "."
        )
    sentences = [first]
    na = []
    for check in sorted(checks):
        whom = [i for i in impls if checks[check].get(i, Counter())["not applicable"]]
        if whom:
            partly = [
                i
                for i in whom
                if sum(checks[check][i].values()) > checks[check][i]["not applicable"]
            ]
            note = f" (some of its cases for {_group(partly, impls)})" if partly else ""
            na.append(f"{_check_name(check)}, for {_group(whom, impls)}{note}")
    if na:
        sentences.append(
            "Not applicable, neither passed nor failed (a capability the implementation does not "
            "have, or one the run did not: a second device, say): " + "; ".join(na) + "."
        )
    drift = suite_drift(checks)
    if drift:
        sentences.append(drift)
    href = posixpath.relpath(MATRIX.partition("#")[0], posixpath.dirname(where) or ".")
    sentences.append(f"The whole matrix: [conformance]({href}#{MATRIX.partition('#')[2]}).")
    return " ".join(sentences) + "\n"


def _skipped(outcome: str) -> bool:
    return outcome.startswith("skipped")


def _n(counts: Counter | None, kind) -> int:
    return sum(n for outcome, n in (counts or {}).items() if kind(outcome))


def _failing(counts: Counter | None) -> bool:
    return _n(counts, _failed) > 0


def conformance_matrix() -> str:
    report, source = read_report()
    impls, checks = outcomes(report)
    versions = ", ".join(
        f"{_label(k)} ({report['implementations'][k]['framework']} "
        f"{report['implementations'][k]['version']})"
        for k in impls
        if k in report.get("implementations", {})
    )
    lines = [
        f"From {source}, written {report.get('created', '?')} on {report.get('backend', '?')} "
        f"with jax {report.get('jax', '?')} and Python {report.get('python', '?')}: {versions}. "
        f"{len(checks)} checks, one a row; the last row counts each implementation's cases.",
        "",
        _row(["check", *map(_label, impls)]),
        "|---|" + ":---:|" * len(impls),
    ]
    for name in sorted(checks):
        lines.append(_row([_check_name(name), *(_cell(checks[name].get(i)) for i in impls)]))
    summary = report.get("summary", {})
    totals = [
        ", ".join(f"{n} {k}" for k, n in sorted(summary.get(i, {}).items()) if n) or "-"
        for i in impls
    ]
    lines.append(_row(["**all**", *totals]))
    drift = suite_drift(checks)
    if drift:
        lines += ["", drift]
    return "\n".join(lines) + "\n"


def _check_name(check: str) -> str:
    """``test_cross.py::test_one_step_agrees`` -> ``cross``: one step agrees."""
    file, _, test = check.rpartition("::")
    group = file.removesuffix(".py").removeprefix("test_")
    words = test.removeprefix("test_").replace("_", " ")
    return f"`{group}`: {words}" if group else words


def _cell(outcomes: Counter | None) -> str:
    if not outcomes:
        return "-"
    total = sum(outcomes.values())
    failed = _n(outcomes, _failed)
    if failed:
        return f"✗ {failed}/{total} failed"
    parts = []
    if outcomes["passed"]:
        parts.append("✓" if outcomes["passed"] == total else f"✓ {outcomes['passed']}")
    for kind in ("not applicable", "skipped", "skipped: earlier layer failed"):
        if outcomes[kind]:
            parts.append(kind if outcomes[kind] == total else f"{outcomes[kind]} {kind}")
    return ", ".join(parts)


def report_excerpt() -> str:
    """The report's header fields and the first few checks of its first implementation."""
    report, _ = read_report()
    first = next(iter(report["results"]))
    checks = dict(list(report["results"][first].items())[:4])
    excerpt = {
        **{k: report[k] for k in ("backend", "created", "jax", "python") if k in report},
        "implementations": {first: report.get("implementations", {}).get(first)},
        "results": {first: {**checks, "...": "..."}},
        "summary": {first: report.get("summary", {}).get(first)},
    }
    return "```json\n" + json.dumps(excerpt, indent=2) + "\n```\n"


# --- what the jit wrappers cost ------------------------------------------------------------------


def jit_overhead() -> str:
    """Each idiomatic path's step time against its own implementation's fast path, with the
    interval of the paired rounds, at the smallest and the largest batch size of every committed
    ``cvae bench`` result (:data:`BENCH_FILES`), read through ``cvae_rosetta.bench.results.load``
    (which reads JSON and imports no JAX)."""
    try:
        from cvae_rosetta.bench import results
    except ImportError as error:
        raise DocsError(f"jit-overhead: the project is not installed here ({error})") from None
    columns: list[str] = []
    cells: dict[tuple[str, str], dict[int, str]] = {}
    sources = []
    for name in BENCH_FILES:
        path = RESULTS / name
        if not path.is_file():
            continue
        try:
            result = results.load(path)
        except (ValueError, KeyError) as error:
            raise DocsError(f"{_rel(path)}: {error}") from None
        backend = str((result.get("environment") or {}).get("backend") or "?").upper()
        sources.append(f"`{name}` ({results.provenance(result)})")
        sizes = sorted(result["batches"], key=int)
        for size in dict.fromkeys([sizes[0], sizes[-1]]):
            column = len(columns)
            columns.append(f"{backend}, batch {size}")
            for row in result["batches"][size]["paths"]:
                if row["path"] in (results.FAST, results.SAME_AS_FAST):
                    continue
                entry = (row.get("vs_fast") or {}).get("step")
                if not entry or entry.get("ratio") is None:
                    raise DocsError(
                        f"{_rel(path)}: batch {size}: {row['impl']}:{row['path']} has no "
                        "vs_fast['step'] ratio"
                    )
                cells.setdefault((row["impl"], row["path"]), {})[column] = _ratio(entry)
    if not columns:
        raise DocsError(f"no benchmark results in {_rel(RESULTS)} ({', '.join(BENCH_FILES)})")
    order = list(IMPLEMENTATIONS)
    rows = sorted(cells, key=lambda k: order.index(k[0]) if k[0] in order else len(order))
    lines = [
        "Time per call of each idiomatic path's step, from a Python loop that calls it, as a "
        "multiple of its own implementation's fast path's, timed in the same rounds (the median, "
        f"and the {results.CONFIDENCE:.0%} interval over the paired rounds: an interval that holds "
        "1.00x is noise), at the smallest and the largest batch measured; from "
        f"{' and '.join(sources)}:",
        "",
        _row(["idiomatic path", *columns]),
        "|---|" + "---:|" * len(columns),
    ]
    for impl, path in rows:
        first, _, rest = path.partition(" ")
        name = f"`{first}` {rest}".rstrip()
        lines.append(
            _row(
                [
                    f"{_label(impl)}: {name}",
                    *(cells[impl, path].get(c, "-") for c in range(len(columns))),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def _ratio(entry: dict) -> str:
    if entry.get("low") is None or entry.get("high") is None:
        return f"{entry['ratio']:.2f}x"
    return f"{entry['ratio']:.2f}x ({entry['low']:.2f}–{entry['high']:.2f})"


# --- dispatch ------------------------------------------------------------------------------------


def generated(name: str, where: str) -> str:
    makers = {
        "loc-table": loc_table,
        "tour-loc-table": tour_loc_table,
        "conformance-matrix": conformance_matrix,
        "conformance-summary": lambda: conformance_summary(where),
        "report-excerpt": report_excerpt,
        "jit-overhead": jit_overhead,
        "compare-files": compare_files,
    }
    if name not in makers:
        raise DocsError(f"unknown generated block {name!r} (known: {', '.join(makers)})")
    return makers[name]()


def page_link(match: re.Match, where: str) -> str:
    page = match["page"].strip()
    if not (DOCS / page).is_file():
        return match["fallback"].strip()
    href = posixpath.relpath(page, posixpath.dirname(where) or ".")
    return f"[{match['text'].strip()}]({href})"
