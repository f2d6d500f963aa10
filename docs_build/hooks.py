"""MkDocs hooks of the cvae-rosetta site (``mkdocs.yml``: ``hooks: [docs_build/hooks.py]``).

What they do, in build order:

- ``on_config``: make pymdownx.snippets read from the repository root whatever the working
  directory, and list every top-level ``docs/*.md`` page that the nav leaves out (pages other
  people add, ``docs/checkpoints.md`` for one) under "Reference", titled by its first heading.
- ``on_page_markdown``, before Markdown sees the page:

  1. expand ``<!-- rosetta ... -->`` directives into one Material tab per implementation, each tab
     a code block that pymdownx.snippets fills from a marked section (:func:`expand_rosetta`),
     and ``<!-- snippet FILE[:SECTION] -->`` into one such code block (:func:`include`);
  2. replace ``<!-- generated: NAME -->`` with a table made now from the sources (lines of code
     per section), from the conformance suite's JSON report, or from ``docs/performance.md``, or
     with the compare page's body, every implementation file whole (:func:`compare_files`);
     and ``<!-- page-link PAGE | TEXT | FALLBACK -->`` with a link, or the fallback text while
     the page does not exist;
  3. check every snippet the page then asks for (:func:`check_snippets`): the file exists and
     the section has exactly one start and one end marker, in that order, around at least one
     non-blank line. pymdownx.snippets' own ``check_paths`` fails on a missing file or section
     but takes a section with no end marker to the end of the file, and inserts an empty one;
     this check refuses all of those, naming the page, the file and the sections it has.

Everything here reads files only: building the site imports no framework.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import posixpath
import re
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REPORT = DOCS / "data" / "conformance.json"  # the committed report; see docs/choosing.md
REPORT_ENV = "CVAE_DOCS_CONFORMANCE_REPORT"  # another report instead, e.g. one just written
log = logging.getLogger("mkdocs.hooks.rosetta")

# key: (tab label, source file); the order of the tabs and of every table's columns.
IMPLEMENTATIONS = {
    "pure_jax": ("pure JAX", "impls/pure_jax.py"),
    "flax_linen": ("Flax Linen", "impls/flax_linen.py"),
    "flax_nnx": ("Flax NNX", "impls/flax_nnx.py"),
    "haiku": ("Haiku", "impls/haiku_impl.py"),
    "equinox": ("Equinox", "impls/equinox_impl.py"),
}
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


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri

    def expand(text: str) -> str:
        text = expand_rosetta(text)
        text = INCLUDE.sub(lambda m: include(m["ref"], m["indent"]), text)
        text = GENERATED.sub(lambda m: generated(m["name"], where), text)
        return PAGE_LINK.sub(lambda m: page_link(m, where), text)

    try:
        markdown = outside_fences(markdown, expand)
        check_snippets(markdown)
    except DocsError as error:
        raise _plugin_error(f"docs/{where}: {error}") from None
    return markdown


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
            heading = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
            extra.append({heading[1].strip() if heading else path.stem: path.name})
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


def _tabs(body: str) -> str:
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
        blocks[key] = []
        for ref in overrides.get(key, default):
            file, sep, section = ref.replace("{impl}", key).rpartition(":")
            if not sep or not file or not section:
                raise DocsError(f"rosetta directive: expected FILE:SECTION, got {ref!r}")
            file = source if file == "impls" else file
            blocks[key].append((f"{file} · {section}", [f'--8<-- "{file}:{section}"']))
    return tab_set(blocks)


def tab_set(blocks: dict[str, list[tuple[str, list[str]]]]) -> str:
    """One Material content tab per implementation, in a ``<div class="rosetta">`` that names the
    implementations' keys in tab order (``data-impls``, read by ``docs/javascripts/rosetta.js``);
    ``blocks[key]`` is that tab's code blocks, each ``(title, lines)``: a snippet line for
    pymdownx.snippets, or the code itself as :func:`literal` lines."""
    out = [f'<div class="rosetta" data-impls="{" ".join(IMPLEMENTATIONS)}" markdown>', ""]
    for key, (label, _) in IMPLEMENTATIONS.items():
        out += [f'=== "{label}"', ""]
        for title, lines in blocks[key]:
            fence = "`" * max(3, 1 + max(map(len, re.findall(r"`+", "\n".join(lines))), default=0))
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
    :data:`SECTIONS` order, each under its own heading; rosetta.js shows two of the five.

    The openings are read here rather than through pymdownx.snippets, which drops from what it
    includes every line that mentions its marker syntax (a docstring may explain the markers)."""
    openings = {}
    for key, (_, source) in IMPLEMENTATIONS.items():
        sections = sections_of(ROOT / source)
        if list(sections) != sorted(SECTIONS):
            raise DocsError(f"{source} has sections {list(sections)}, expected {SECTIONS}")
        first = min(start for start, _ in sections.values())
        lines = (ROOT / source).read_text(encoding="utf-8").splitlines()[: first - 1]
        openings[key] = [(f"{source} · lines 1-{first - 1}", literal("\n".join(lines).rstrip()))]
    out = ['<div class="rosetta-compare" markdown>', "", "## Docstring and imports", ""]
    out.append(tab_set(openings))
    for section in SECTIONS:
        out += [f"## `{section}`", "", _tabs(f"impls:{section}")]
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


def loc_table() -> str:
    counts = {key: section_counts(ROOT / source) for key, (_, source) in IMPLEMENTATIONS.items()}
    rows = [_row(["section", *(label for label, _ in IMPLEMENTATIONS.values())])]
    rows.append("|---|" + "---:|" * len(IMPLEMENTATIONS))
    for section in SECTIONS:
        rows.append(_row([f"`{section}`", *(counts[key].get(section, 0) for key in counts)]))
    total = [sum(counts[key].get(s, 0) for s in SECTIONS) for key in counts]
    rows.append(_row(["**all sections**", *(f"**{n}**" for n in total)]))
    rows.append(_row(["whole file (imports included)", *(counts[key]["file"] for key in counts)]))
    return "\n".join(rows) + "\n"


def tour_loc_table() -> str:
    rows = [_row(["tour example", *(label for label, _ in IMPLEMENTATIONS.values())])]
    rows.append("|---|" + "---:|" * len(IMPLEMENTATIONS))
    for name in TOUR:
        counts = section_counts(ROOT / "examples" / "tour" / f"{name}.py")
        rows.append(
            _row([f"[{name}](tour/{name}.md)", *(counts.get(key, 0) for key in IMPLEMENTATIONS)])
        )
    return "\n".join(rows) + "\n"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


# --- the conformance matrix ----------------------------------------------------------------------


def conformance_matrix() -> str:
    path = Path(os.environ.get(REPORT_ENV) or REPORT)
    if not path.is_file():
        raise DocsError(f"no conformance report at {path} (see 'The compliance matrix' there)")
    report = json.loads(path.read_text(encoding="utf-8"))
    impls = [key for key in IMPLEMENTATIONS if key in report["results"]]
    impls += sorted(set(report["results"]) - set(impls))
    label = lambda key: IMPLEMENTATIONS[key][0] if key in IMPLEMENTATIONS else key
    checks: dict[str, dict[str, Counter]] = {}
    for impl in impls:
        for check, outcome in report["results"][impl].items():
            name = re.sub(r"\[.*\]$", "", check).strip(":")
            checks.setdefault(name, {}).setdefault(impl, Counter())[outcome] += 1
    versions = ", ".join(
        f"{label(k)} ({report['implementations'][k]['framework']} "
        f"{report['implementations'][k]['version']})"
        for k in impls
        if k in report.get("implementations", {})
    )
    source = (
        "`$" + REPORT_ENV + "`" if os.environ.get(REPORT_ENV) else "`docs/data/conformance.json`"
    )
    lines = [
        f"From {source}, written {report.get('created', '?')} on {report.get('backend', '?')} "
        f"with jax {report.get('jax', '?')} and Python {report.get('python', '?')}: {versions}.",
        "",
        _row(["check", *map(label, impls)]),
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
    if outcomes["failed"]:
        return f"✗ {outcomes['failed']}/{total} failed"
    parts = []
    if outcomes["passed"]:
        parts.append("✓" if outcomes["passed"] == total else f"✓ {outcomes['passed']}")
    for kind in ("not applicable", "skipped"):
        if outcomes[kind]:
            parts.append(kind if outcomes[kind] == total else f"{outcomes[kind]} {kind}")
    return ", ".join(parts)


def report_excerpt() -> str:
    """The report's header fields and the first few checks of its first implementation."""
    report = json.loads(Path(os.environ.get(REPORT_ENV) or REPORT).read_text(encoding="utf-8"))
    first = next(iter(report["results"]))
    checks = dict(list(report["results"][first].items())[:4])
    excerpt = {
        **{k: report[k] for k in ("backend", "created", "jax", "python") if k in report},
        "implementations": {first: report.get("implementations", {}).get(first)},
        "results": {first: {**checks, "...": "..."}},
        "summary": {first: report.get("summary", {}).get(first)},
    }
    return "```json\n" + json.dumps(excerpt, indent=2) + "\n```\n"


# --- the benchmark tables ------------------------------------------------------------------------


def performance_tables() -> str:
    """``docs/performance.md`` from its first ``##`` heading on, each heading one level down."""
    path = DOCS / "performance.md"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    start = re.search(r"^## ", text, re.MULTILINE)
    if not start:
        return "No benchmark results yet: see [performance](performance.md).\n"
    body = re.sub(
        r"^(#{2,5}) ", lambda m: "#" + m[1] + " ", text[start.start() :], flags=re.MULTILINE
    )
    return body.rstrip() + "\n"


# --- dispatch ------------------------------------------------------------------------------------


def generated(name: str, where: str) -> str:
    makers = {
        "loc-table": loc_table,
        "tour-loc-table": tour_loc_table,
        "conformance-matrix": conformance_matrix,
        "report-excerpt": report_excerpt,
        "performance-tables": performance_tables,
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
