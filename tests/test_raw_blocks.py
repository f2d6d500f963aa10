"""A page read as plain Markdown (the repository's web view) is whole: every block the docs build
fills in is committed too, between its marker and an end marker, and is what the sources make now
(``docs_build/raw_blocks.py``). The build drops the copies before it reads the page, so the site
is what the markers alone make, and fails on a copy that is not current.

The checks of the pages and of the copies need no MkDocs (they run with the unit tests); the
builds are marked ``docs``.
"""

from __future__ import annotations

import html as html_module
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / "docs_build" / "hooks.py"
sys.path.insert(0, str(HOOKS.parent))  # the hooks' modules import each other plainly, as in MkDocs

import raw_blocks  # noqa: E402  (the modules of docs_build/)
from conformance_report import REPORT, REPORT_ENV  # noqa: E402
from generated import generated  # noqa: E402
from raw_blocks import REFRESH, check, collapse, copy_of, refreshed  # noqa: E402
from repository import BUILTIN, DOCS, IMPLEMENTATIONS, DocsError  # noqa: E402
from sections import section_text  # noqa: E402

PAGES = raw_blocks.pages()
WHERE = "topics/example.md"  # a page one folder down, as the topic pages are

# A page with one marker of each kind: a snippet under an admonition (its marker right under the
# `??? example` line), a generated block whose copy is stale, a page link, a rosetta directive,
# and a snippet shown as an example inside a code fence, which is text.
PAGE = textwrap.dedent(
    """\
    # A page

    Words before.

    ??? example "`module`: the template's model"
        <!-- snippet template/my_impl.py:module -->

    <!-- generated: tour-loc-table -->

    a table that is no longer what the examples count

    <!-- /generated -->

    See <!-- page-link glossary.md | the glossary | no glossary yet -->.

    ````markdown
    <!-- snippet template/my_impl.py:no_such_section -->
    ````

    <!-- rosetta
    impls:loss
    flax_nnx: impls:loss impls:fast_path
    -->

    Words after.
    """
)


@pytest.mark.parametrize(("where", "path"), PAGES, ids=[where for where, _ in PAGES])
def test_every_page_holds_a_current_copy_of_every_block(where, path):
    problems = check(path.read_text(encoding="utf-8"), where, complete=True)
    assert problems == [], f"docs/{where}: " + "; ".join(problems) + f" (run: {REFRESH})"


def test_the_pages_hold_every_kind_of_block():
    """The check above reads the blocks it should: the pages have each kind, every one closed."""
    kinds = set()
    for _, path in PAGES:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        for block in raw_blocks.blocks(lines):
            assert block.end is not None, block
            kinds.add(block.kind)
    assert kinds == {"snippet", "generated", "rosetta"}
    assert any("<!-- /page-link -->" in path.read_text(encoding="utf-8") for _, path in PAGES)


def test_refresh_writes_the_copies_and_changes_nothing_else():
    new = refreshed(PAGE, WHERE)
    assert collapse(new) == collapse(PAGE)  # all but the copies is as it was
    assert "no longer what the examples count" not in new
    assert refreshed(new, WHERE) == new
    assert check(new, WHERE, complete=True) == []
    # what each copy holds
    assert section_text(ROOT / "template" / "my_impl.py", "module").strip("\n") in new
    assert copy_of("generated", "tour-loc-table", WHERE) in new
    assert "See <!-- page-link glossary.md | the glossary | no glossary yet -->" in new
    assert "[the glossary](../glossary.md)<!-- /page-link -->." in new
    for key in BUILTIN:
        source = IMPLEMENTATIONS[key][1]
        sections = "`loss` and `fast_path`" if key == "flax_nnx" else "`loss`"
        assert f"- {IMPLEMENTATIONS[key][0]}: {sections} of [`{source}`](../../{source})" in new
    # the example inside the fence is left as it is, with no copy
    assert "<!-- snippet template/my_impl.py:no_such_section -->\n````\n" in new


def test_a_copy_that_is_stale_or_missing_is_named_by_its_line():
    problems = check(PAGE, WHERE, complete=True)
    assert problems == [
        "line 6: <!-- snippet template/my_impl.py:module --> has no committed copy",
        "line 8: the copy of <!-- generated: tour-loc-table --> is not what the sources make now",
        "line 20: <!-- rosetta impls:loss flax_nnx: impls:loss impls:fast_path --> has no "
        "committed copy",
        "line 14: a page link to glossary.md has no copy",
    ]
    # a site built elsewhere with the hooks may leave the copies out, but not keep a stale one
    assert check(PAGE, WHERE, complete=False) == problems[1:2]
    stale_link = refreshed(PAGE, WHERE).replace("(../glossary.md)", "(glossary.md)")
    line = next(n for n, text in enumerate(stale_link.splitlines(), 1) if "page-link" in text)
    assert check(stale_link, WHERE, complete=True) == [
        f"line {line}: the copy of the page link to glossary.md is stale"
    ]


@pytest.mark.docs  # markdown-it-py comes with the docs environment's frameworks
def test_the_plain_view_shows_the_code_under_an_admonition():
    """CommonMark, as the repository's web view reads it: the snippet's copy is a Python code
    block, and the markers are comments, never shown as text."""
    markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py is not installed here")
    html = markdown_it.MarkdownIt("commonmark").render(refreshed(PAGE, WHERE))
    code = re.search(r'<pre><code class="language-python">(.*?)</code></pre>', html, re.S)
    assert code and "def build_model(" in code[1]
    shown = html.replace("&lt;!-- snippet template/my_impl.py:no_such_section --&gt;", "")
    assert "&lt;!--" not in shown  # no other marker shown as text, in a code block or elsewhere
    assert "```" not in html


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("<!-- generated: loc-table -->\n\ntext\n\n<!-- /snippet -->\n", "ends a generated block"),
        ("text\n<!-- /rosetta -->\n", "line 2: <!-- /rosetta --> without its marker"),
        ("<!-- rosetta\nimpls:loss\n", "without its closing -->"),
    ],
)
def test_a_malformed_block_is_refused(page, message):
    with pytest.raises(DocsError, match=re.escape(message)):
        check(page, WHERE, complete=True)


def test_a_copy_depends_on_the_repository_alone(monkeypatch, tmp_path):
    """Neither an implementation registered from outside nor another conformance report changes
    what is committed, though both change what the site shows."""
    committed = {
        name: copy_of("generated", name, "choosing.md")
        for name in ("loc-table", "conformance-summary", "conformance-matrix")
    }
    rosetta = copy_of("rosetta", "impls:loss", WHERE)
    report = json.loads(REPORT.read_text(encoding="utf-8"))
    report["created"] = "1999-01-01T00:00:00"
    other = tmp_path / "report.json"
    other.write_text(json.dumps(report), encoding="utf-8")
    monkeypatch.setenv(REPORT_ENV, str(other))
    monkeypatch.setitem(IMPLEMENTATIONS, "outside", ("Outside", str(tmp_path / "impl.py")))
    assert "1999-01-01" in generated("conformance-matrix", "choosing.md")
    for name, text in committed.items():
        assert copy_of("generated", name, "choosing.md") == text, name
    assert copy_of("rosetta", "impls:loss", WHERE) == rosetta
    assert "Outside" not in rosetta
    # and what is installed or set is back once the copy is made
    assert IMPLEMENTATIONS["outside"] == ("Outside", str(tmp_path / "impl.py"))
    assert os.environ[REPORT_ENV] == str(other)


# --- the build -----------------------------------------------------------------------------------


def build(tmp_path: Path, page: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``mkdocs build --strict`` of a one-page site with the project's hooks, and its page."""
    pytest.importorskip("mkdocs", reason="MkDocs is not installed here (the docs extra)")
    pytest.importorskip("material", reason="mkdocs-material is not installed here (the docs extra)")
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text(page, encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(
        textwrap.dedent(
            f"""\
            site_name: test
            theme:
              name: material
              font: false
            hooks:
              - {HOOKS}
            markdown_extensions:
              - admonition
              - md_in_html
              - pymdownx.details
              - pymdownx.superfences
              - pymdownx.tabbed:
                  alternate_style: true
              - pymdownx.snippets:
                  check_paths: true
                  dedent_subsections: true
            """
        ),
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    return result, tmp_path / "site" / "index.html"


BUILT = textwrap.dedent(
    """\
    # Page

    ??? example "`module`: the template's model"
        <!-- snippet template/my_impl.py:module -->

    <!-- generated: tour-loc-table -->

    <!-- rosetta
    impls:loss
    -->

    The end.
    """
)


@pytest.mark.docs
def test_the_copies_leave_the_built_page_as_the_markers_make_it(tmp_path):
    bare, page = build(tmp_path / "bare", BUILT)
    assert bare.returncode == 0, bare.stderr
    with_copies, copied = build(tmp_path / "copies", refreshed(BUILT, "index.md"))
    assert with_copies.returncode == 0, with_copies.stderr
    article = re.compile(r"<article.*?</article>", re.S)
    html = article.search(copied.read_text(encoding="utf-8"))[0]
    assert html == article.search(page.read_text(encoding="utf-8"))[0]
    text = html_module.unescape(re.sub(r"<[^>]+>", "", html))  # highlighted: a tag per token
    assert "def build_model(" in text and 'class="rosetta"' in html and "<table>" in html
    assert "Shown side by side on the site" not in html  # the rosetta copy is not on the site


@pytest.mark.docs
def test_a_stale_copy_fails_the_build_naming_the_page_and_the_command(tmp_path):
    stale = refreshed(BUILT, "index.md").replace("| [surgery]", "| [surgery, edited]")
    line = stale.splitlines().index("<!-- generated: tour-loc-table -->") + 1
    result, _ = build(tmp_path, stale)
    assert result.returncode != 0
    named = f"docs/index.md: line {line}: the copy of <!-- generated: tour-loc-table -->"
    assert named in result.stderr
    assert REFRESH in result.stderr


@pytest.mark.docs
def test_a_page_of_the_project_without_a_copy_fails_the_build():
    pytest.importorskip("mkdocs", reason="MkDocs is not installed here (the docs extra)")
    import hooks
    from mkdocs.exceptions import PluginError

    def page(folder: Path) -> SimpleNamespace:
        path = folder / "example.md"
        return SimpleNamespace(file=SimpleNamespace(src_uri="example.md", abs_src_path=str(path)))

    bare = "# Page\n\n<!-- generated: tour-loc-table -->\n"
    with pytest.raises(PluginError, match="has no committed copy") as error:
        hooks.on_page_markdown(bare, page(DOCS), None, None)
    assert REFRESH in str(error.value)
    built = hooks.on_page_markdown(bare, page(ROOT / "elsewhere"), None, None)
    assert "| tour example |" in built
    committed = refreshed(bare, "example.md")
    assert hooks.on_page_markdown(committed, page(DOCS), None, None) == built
