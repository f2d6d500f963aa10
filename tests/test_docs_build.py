"""The docs build pulls code from marked sections and fails on every kind of broken reference.

Run by ``tox -e docs`` (it needs the ``docs`` extra: MkDocs, Material, PyMdown Extensions). Small
sites are built in a temporary folder with the project's own hooks (``docs_build/hooks.py``),
which resolve snippets against the repository root, as the real site does.
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

import pytest

pytestmark = pytest.mark.docs

pytest.importorskip("mkdocs", reason="MkDocs is not installed here (the docs extra)")
pytest.importorskip("material", reason="mkdocs-material is not installed here (the docs extra)")

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / "docs_build" / "hooks.py"
sys.path.insert(0, str(HOOKS.parent))  # the hooks' modules import each other plainly, as in MkDocs

import compare_page  # noqa: E402  (the modules of docs_build/)
import conformance_report  # noqa: E402
import hooks  # noqa: E402
import jit_overhead  # noqa: E402
from compare_page import (  # noqa: E402
    OPENING,
    compare_files,
    contrasts,
    moved_links,
    section_holds,
)
from conformance_report import (  # noqa: E402
    NUMBER_WORDS,
    REPORT,
    REPORT_ENV,
    conformance_matrix,
    conformance_summary,
    reference_checks,
    suite_checks,
    suite_drift,
)
from differences import check_words_first, differences, section_differences  # noqa: E402
from lines_of_code import (  # noqa: E402
    ROLES,
    code_lines,
    loc_table,
    role_counts,
    section_counts,
    shared_state_lines,
)
from markdown_text import capitalized, outside_fences  # noqa: E402
from repository import BUILTIN, IMPLEMENTATIONS, SECTIONS, TOUR, DocsError  # noqa: E402
from sections import MARKER, check_snippets, sections_of  # noqa: E402
from tabs import expand_rosetta, literal, tab_set  # noqa: E402


def html_text(html: str) -> str:
    """The page's text: highlighted code is split into one element per token."""
    return html_module.unescape(re.sub(r"<[^>]+>", "", html))


def build(tmp_path: Path, page: str) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of a one-page site whose page is ``page``."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(textwrap.dedent(page))
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
              - md_in_html
              - pymdownx.superfences
              - pymdownx.tabbed:
                  alternate_style: true
              - pymdownx.snippets:
                  check_paths: true
            """
        )
    )
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )


def test_a_section_is_pulled_exactly(tmp_path):
    result = build(
        tmp_path,
        """\
        # Page

        ```python
        --8<-- "impls/pure_jax.py:fast_path"
        ```
        """,
    )
    assert result.returncode == 0, result.stderr
    text = html_text((tmp_path / "site" / "index.html").read_text())
    assert "compiles it as ``jax.jit(train_step, donate_argnums=0)``" in text  # a comment only
    assert "--8<--" not in text  # no marker line came along
    assert "PATHS" not in text  # nor the next section
    assert "implementation = Adapter(" not in text


def test_a_rosetta_directive_makes_one_tab_per_implementation(tmp_path):
    result = build(tmp_path, "# Page\n\n<!-- rosetta\nimpls:forward\n-->\n")
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    text = html_text(html)
    for label, _ in IMPLEMENTATIONS.values():
        assert f">{label}</label>" in html
    assert ">pure JAX</label>" in html and ">Equinox</label>" in html  # each file's ABOUT label
    assert 'class="rosetta"' in html
    assert "method=CVAE.encode" in text  # Linen's forward section
    assert "jax.vmap(in_compute_dtype(model).encode)" in text  # Equinox's


def test_tab_sets_name_their_implementations_for_the_view_script(tmp_path):
    """rosetta.js maps the i-th tab to an implementation by the set's ``data-impls``."""
    result = build(tmp_path, "# Page\n\n<!-- rosetta\nimpls:loss\n-->\n")
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert f'<div class="rosetta" data-impls="{" ".join(IMPLEMENTATIONS)}">' in html
    assert list(IMPLEMENTATIONS)[:2] == ["pure_jax", "flax_linen"]  # the registry's order
    labels = re.findall(r"<label for=[^>]+>([^<]+)</label>", html)
    assert labels == [label for label, _ in IMPLEMENTATIONS.values()]


@pytest.fixture(scope="module")
def compare_html(tmp_path_factory) -> str:
    """The HTML of a one-page site whose page is the compare page, built once for the checks that
    read it."""
    folder = tmp_path_factory.mktemp("compare")
    result = build(folder, "# Compare\n\n<!-- generated: compare-files -->\n")
    assert result.returncode == 0, result.stderr
    return (folder / "site" / "index.html").read_text()


def test_the_compare_page_holds_every_file_whole_in_sections(compare_html):
    """Each file's opening (up to its first marker) and every section, in the files' order, one
    tab set each under its heading; the sections laid end to end are the whole file, less the
    marker lines and the blank lines between sections."""
    html = compare_html
    assert re.findall(r"<h2 id=\"([^\"]+)\"", html) == ["docstring-and-imports", *SECTIONS]
    assert html.count('<div class="rosetta" ') == 1 + len(SECTIONS)
    assert '<div class="rosetta-compare">' in html
    code = [html_text(c) for c in re.findall(r"<pre>.*?<code>(.*?)</code>", html, re.DOTALL)]
    assert len(code) == len(IMPLEMENTATIONS) * (1 + len(SECTIONS))
    blocks = iter(code)
    shown = {key: [] for key in IMPLEMENTATIONS}
    for _ in range(1 + len(SECTIONS)):  # a tab set: one block per implementation, in order
        for key in IMPLEMENTATIONS:
            shown[key].append(next(blocks))
    for key, (_, source) in IMPLEMENTATIONS.items():
        lines = (ROOT / source).read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if line.strip() and not MARKER.match(line)]
        assert [line for text in shown[key] for line in text.splitlines() if line.strip()] == kept


def test_every_compare_section_says_what_it_holds_and_what_differs(compare_html):
    """Under each section's heading: the line of docs/layout.md's table on what it holds, a link
    to the topic page whose differences block names the section, and that block's bullets, one
    note per bullet, each naming the implementations it covers (rosetta.js shows two)."""
    html = compare_html
    holds, differs = section_holds(), section_differences()
    parts = re.split(r"<h2 id=\"", html)[2:]  # after the opening's heading, one per section
    assert len(parts) == len(SECTIONS)
    for section, part in zip(SECTIONS, parts, strict=True):
        about = re.search(r'<div class="rosetta-section-about">(.*?)</div>', part, re.DOTALL)
        assert about, section
        assert "Holds " + holds[section].replace("`", "")[:30] in html_text(about[1]), section
        page, bullets = differs[section]
        # a link to the topic page (a .md link here: this one-page site has no such page)
        assert re.search(rf'href="(\.\./)?{page.removesuffix(".md")}', about[1]), about[1]
        notes = re.findall(r'<div class="rosetta-differ" data-impls="([^"]+)">', part)
        assert [n.split() for n in notes] == [keys for keys, _ in bullets], section
        assert sorted(k for n in notes for k in n.split()) == sorted(IMPLEMENTATIONS)


def test_every_pair_has_its_contrast_in_every_compare_section(compare_html):
    """Under the opening's heading and every section's: one contrast line for each ordered pair
    of implementations (30 for six: the 15 pairs, either side left), made from the two styles'
    phrases of docs/data/contrasts.toml, and naming both; the same phrase is said alike."""
    html = compare_html
    table = contrasts()
    labels = {key: capitalized(label) for key, (label, _) in IMPLEMENTATIONS.items()}
    parts = re.split(r"<h2 id=\"", html)[1:]
    for section, part in zip((OPENING, *SECTIONS), parts, strict=True):
        lines = dict(
            re.findall(r'<div class="rosetta-contrast" data-pair="([^"]+)">(.*?)</div>', part, re.S)
        )
        pairs = [f"{a} {b}" for a in labels for b in labels if a != b]
        assert sorted(lines) == sorted(pairs), section
        for pair, text in lines.items():
            a, b = pair.split()
            text = html_text(text).strip()
            assert text.startswith(table[section]["axis"] + "."), text
            assert text.index(labels[a]) < text.index(labels[b]), text
            phrase = table[section][b].replace("`", "")
            assert phrase in text, (phrase, text)
            assert ("alike" in text) == (table[section][a] == table[section][b]), text


def test_a_style_without_a_contrast_phrase_fails_the_build(tmp_path, monkeypatch):
    path = tmp_path / "contrasts.toml"
    path.write_text(
        compare_page.CONTRASTS.read_text().replace('keras = "`stateless_call` given', "# ")
    )
    monkeypatch.setattr(compare_page, "CONTRASTS", path)
    with pytest.raises(DocsError, match=r"\[forward\]: expected a phrase for keras"):
        contrasts()


def differences_block(*bullets: str, name: str = "module") -> str:
    return "\n".join([f"<!-- differences: {name} -->", *bullets, "<!-- end differences -->", ""])


SIX = [
    "- **Pure JAX** has no module.",
    "- **Flax Linen**, **Flax NNX** and **Haiku** have modules,",
    "  over two lines.",
    "- **Equinox** has pytrees.",
    "- **Keras 3** has layers.",
]


def test_a_differences_block_is_read_bullet_by_bullet():
    [(name, items)] = differences(differences_block(*SIX))
    assert name == "module"
    assert items == [
        (["pure_jax"], "**Pure JAX** has no module."),
        (
            ["flax_linen", "flax_nnx", "haiku"],
            "**Flax Linen**, **Flax NNX** and **Haiku** have modules, over two lines.",
        ),
        (["equinox"], "**Equinox** has pytrees."),
        (["keras"], "**Keras 3** has layers."),
    ]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            differences_block(*SIX[:-1]),
            "expected every implementation in exactly one bullet, got no Keras 3",
        ),
        (differences_block(*SIX, "- **Haiku** again."), "Haiku more than once"),
        (
            differences_block(*SIX[1:], "- **Plain JAX** has none."),
            "expected each bullet to start with bold labels",
        ),
        (differences_block(*SIX, "A paragraph."), "expected bullets"),
        (differences_block(*SIX, name="modules"), "expected a section of the implementation files"),
    ],
    ids=["missing", "twice", "unknown-label", "not-a-bullet", "unknown-section"],
)
def test_a_malformed_differences_block_is_refused(block, message):
    with pytest.raises(DocsError, match=re.escape(message)):
        differences(block)


def test_a_side_by_side_page_must_put_words_before_code():
    code = "<!-- rosetta\nimpls:module\n-->\n"
    words = "What this page is about, in a sentence of its own.\n\n"
    block = differences_block(*SIX, name="module")
    with pytest.raises(DocsError, match="expected a paragraph before the first code"):
        check_words_first(f"# T\n\n{code}\n{words}", "tour/x.md")
    with pytest.raises(DocsError, match="expected a differences block"):
        check_words_first(f"# T\n\n{words}{code}", "topics/x.md")
    check_words_first(f"# T\n\n{words}{code}", "tour/x.md")
    check_words_first(f"# T\n\n{words}{block}\n{code}", "topics/x.md")
    check_words_first(f"# T\n\n{code}", "topics/index.md")  # not a side-by-side page
    check_words_first(f"# T\n\n{code}", "cli.md")


def test_links_in_a_bullet_are_moved_to_the_page_that_shows_it():
    text = "see [state](state.md), [a part](state.md#x), [here](#y) and [out](https://a.b/c)"
    assert moved_links(text, "topics/modules.md", "compare.md") == (
        "see [state](topics/state.md), [a part](topics/state.md#x), [here](topics/modules.md#y) "
        "and [out](https://a.b/c)"
    )


def test_a_file_the_pages_name_gets_a_page_and_a_link(tmp_path):
    """Inline code naming a repository file links to a page of its own that shows the file whole,
    line by line; a code block's title that names it links there too."""
    result = build(
        tmp_path,
        "# Page\n\nThe reference is `impls/pure_jax.py`; `not/a/file.py` is not.\n\n"
        "<!-- snippet shared/spec/model.py -->\n",
    )
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert '<a href="source/impls/pure_jax.py/"><code>impls/pure_jax.py</code></a>' in html
    assert "<code>not/a/file.py</code>" in html and "not/a/file.py/" not in html
    assert '<a href="source/shared/spec/model.py/">shared/spec/model.py</a>' in html
    page = (tmp_path / "site" / "source" / "impls" / "pure_jax.py" / "index.html").read_text()
    source = (ROOT / "impls" / "pure_jax.py").read_text(encoding="utf-8")
    code = html_text(re.search(r'<td class="code">.*?<code>(.*?)</code>', page, re.DOTALL)[1])
    assert code.rstrip("\n") == source.rstrip("\n")  # marker lines and all
    assert f"{len(source.splitlines())} lines" in html_text(page)


def test_text_in_a_tab_set_keeps_lines_that_look_like_snippet_syntax():
    """pymdownx.snippets reads every line of a page: a line that starts with its marker would
    include a file, one with a section marker in it would vanish; literal() escapes both."""
    import markdown

    lines = [
        '--8<-- "impls/pure_jax.py:loss"',
        "    ``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` mark a section",
        "x = 1  # -8<- [end:body]",
    ]
    blocks = {key: [("text", literal("\n".join(lines)))] for key in IMPLEMENTATIONS}
    html = markdown.markdown(
        tab_set(blocks),
        extensions=["md_in_html", "pymdownx.superfences", "pymdownx.tabbed", "pymdownx.snippets"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(ROOT)], "check_paths": True}},
    )
    shown = html_text(html)
    for line in lines:
        assert shown.count(line) == len(IMPLEMENTATIONS), line
    assert "cvae_loss" not in shown  # nothing was included


def test_the_compare_page_refuses_a_file_that_lacks_a_section(tmp_path, monkeypatch):
    source = (ROOT / "impls" / "pure_jax.py").read_text(encoding="utf-8")
    start, end = "# --8<-- [start:paths]\n", "# --8<-- [end:paths]\n"
    assert start in source and end in source
    (tmp_path / "impl.py").write_text(source.replace(start, "").replace(end, ""))
    monkeypatch.setattr(compare_page, "ROOT", tmp_path)
    monkeypatch.setitem(IMPLEMENTATIONS, "pure_jax", ("pure JAX", "impl.py"))
    with pytest.raises(DocsError, match="impl.py has sections .*, expected"):
        compare_files()


def test_a_missing_section_fails_the_build_naming_it(tmp_path):
    result = build(tmp_path, '# Page\n\n```python\n--8<-- "impls/pure_jax.py:modul"\n```\n')
    assert result.returncode != 0
    assert "docs/index.md" in result.stderr
    assert "impls/pure_jax.py has no section 'modul'" in result.stderr
    assert "module" in result.stderr  # the sections it does have
    assert not (tmp_path / "site" / "index.html").exists()


def test_a_missing_section_in_a_directive_fails_the_build(tmp_path):
    result = build(tmp_path, "# Page\n\n<!-- rosetta\nimpls:modules\n-->\n")
    assert result.returncode != 0
    assert "has no section 'modules'" in result.stderr


def test_a_missing_file_fails_the_build(tmp_path):
    result = build(tmp_path, '# Page\n\n```python\n--8<-- "impls/no_such_file.py:module"\n```\n')
    assert result.returncode != 0
    assert "no file impls/no_such_file.py" in result.stderr


def test_pymdownx_alone_fails_on_a_missing_section_too(tmp_path):
    """Without the hook's check, ``check_paths: true`` is what stops the build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text('# Page\n\n```python\n--8<-- "impls/pure_jax.py:modul"\n```\n')
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\nmarkdown_extensions:\n  - pymdownx.superfences\n  - pymdownx.snippets:\n"
        f"      check_paths: true\n      base_path: ['{ROOT}']\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "Snippet section 'modul' could not be located" in result.stderr


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("# --8<-- [start:body]\nx = 1\n", "has 1 start and 0 end"),  # would take the rest
        ("# --8<-- [start:body]\n\n# --8<-- [end:body]\n", "is empty"),
        (
            "# --8<-- [end:body]\nx = 1\n# --8<-- [start:body]\n",
            r"ends \(line 1\) before it starts",
        ),
        (
            "# --8<-- [start:body]\nx = 1\n# --8<-- [end:body]\n# --8<-- [start:body]\n",
            "has 2 start and 1 end",
        ),
    ],
    ids=["unterminated", "empty", "reversed", "twice"],
)
def test_the_hook_refuses_what_pymdownx_lets_through(tmp_path, source, message):
    path = tmp_path / "example.py"
    path.write_text(source)
    with pytest.raises(DocsError, match=message):
        check_snippets(f'```python\n--8<-- "{path}:body"\n```\n')


def test_escaped_snippet_lines_are_text(tmp_path):
    check_snippets(';--8<-- "impls/pure_jax.py:no_such_section"\n')


def test_directives_inside_code_fences_are_left_alone():
    page = "```markdown\n<!-- rosetta\nimpls:nope\n-->\n```\n"
    assert outside_fences(page, expand_rosetta) == page


def test_code_lines_leave_out_blank_lines_comments_and_docstrings():
    source = textwrap.dedent(
        '''\
        """Module docstring,
        two lines."""
        # a comment

        def f(x):
            """Docstring."""
            y = (x +  # trailing comment
                 1)
            return y
        '''
    )
    assert sorted(code_lines(source)) == [5, 7, 8, 9]


def test_line_counts_compare_like_with_like(tmp_path, monkeypatch):
    """The roles add up to the sections; the converters count for the protocol, not the state;
    the shared TrainState counts, as shared, for a file that imports it and for no other."""
    source = textwrap.dedent(
        """\
        from cvae_rosetta.spec.state import TrainState
        """
    )
    for name in SECTIONS:
        body = "x = 1\n"
        if name == "init":
            body = "def init_params(k):\n    return k\n\n\ndef to_canonical(p):\n    return p\n"
        source += f"# --8<-- [start:{name}]\n{body}# --8<-- [end:{name}]\n"
    path = tmp_path / "impl.py"
    path.write_text(source)
    roles = dict(zip([r for r, _ in ROLES], role_counts(path), strict=True))
    shared = shared_state_lines(path)
    assert shared > 0
    assert roles["its parameters and state: `init` without the converters"] == (2, shared)
    assert roles["for the protocol: the converters, `fast_path`, `paths`, `adapter`"] == (5, 0)
    counts = section_counts(path)
    assert sum(own for own, _ in roles.values()) == sum(counts[s] for s in SECTIONS)
    path.write_text(source.replace("TrainState", "State"))
    assert shared_state_lines(path) == 0
    assert "+ " + str(shared) + " shared" in loc_table()  # pure JAX and Haiku use it


def test_the_site_description_names_every_style():
    """The meta description search engines and link previews show names all six."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    description = re.search(r"^site_description: (.+)$", config, re.MULTILINE)[1]
    for key in BUILTIN:
        assert IMPLEMENTATIONS[key][0].lower() in description.lower(), key


def test_code_in_a_table_breaks_only_between_tokens_and_only_when_long():
    html = "<table><tr><td><code>nnx.jit</code> <code>jax.nn.initializers.lecun_normal()</code>"
    out = hooks.TABLE.sub(lambda m: hooks.TABLE_CODE.sub(hooks._breakable, m[0]), html + "</table>")
    assert "<code>nnx.jit</code>" in out  # short: whole
    assert "<code>jax<wbr>.nn<wbr>.initializers<wbr>.lecun_normal(" in out  # long: before dots


def test_every_implementation_file_has_every_section():
    for _, source in IMPLEMENTATIONS.values():
        assert list(sections_of(ROOT / source)) == sorted(SECTIONS)
    for name in TOUR:
        sections = sections_of(ROOT / "examples" / "tour" / f"{name}.py")
        assert set(IMPLEMENTATIONS) <= set(sections), name


# --- the generated blocks made from reports and results ------------------------------------------


def committed_report() -> dict:
    return json.loads(REPORT.read_text(encoding="utf-8"))


def write_report(tmp_path, monkeypatch, report: dict) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    monkeypatch.setenv(REPORT_ENV, str(path))


def test_the_conformance_summary_counts_what_the_report_holds(monkeypatch):
    """Every count in the paragraph is the report's: its checks (test functions), its cases per
    implementation, its date; 'all N pass' only where nothing failed or was skipped."""
    monkeypatch.delenv(REPORT_ENV, raising=False)
    report = committed_report()
    checks = {re.sub(r"\[.*\]$", "", c) for cases in report["results"].values() for c in cases}
    counts = {len(cases) for cases in report["results"].values()}
    outcomes = {o for cases in report["results"].values() for o in cases.values()}
    text = conformance_summary("choosing.md")
    assert "\n" not in text.strip()  # one paragraph
    assert f"{len(checks)} checks" in text
    if len(counts) == 1:
        assert f"{counts.pop()} cases each" in text
    assert f"report of {report['created'][:10]}" in text
    everyone = f"All {NUMBER_WORDS[len(report['results'])]} implementations pass"
    assert text.startswith(everyone) == (outcomes <= {"passed", "not applicable"})
    assert "[conformance](conformance.md#the-compliance-matrix)" in text
    nested = conformance_summary("topics/jit.md")
    assert "[conformance](../conformance.md#the-compliance-matrix)" in nested


def test_the_conformance_summary_says_who_fails_and_who_skips(tmp_path, monkeypatch):
    report = committed_report()
    nnx = report["results"]["flax_nnx"]
    failing = [c for c in nnx if c.startswith("test_loss.py::test_loss_matches_reference")]
    for case in failing:
        nnx[case] = "failed"
    report["results"]["haiku"]["test_shapes.py::test_output_shapes"] = (
        "skipped: earlier layer failed"
    )
    write_report(tmp_path, monkeypatch, report)
    text = conformance_summary("choosing.md")
    assert not text.startswith("All ")
    assert f"Flax NNX fails {len(failing)} of its {len(nnx)} cases, in 1 check " in text
    assert "`loss`: loss matches reference" in text
    assert "Haiku passes every case that ran but has 1 of its" in text
    others = [
        label
        for key, (label, _) in IMPLEMENTATIONS.items()
        if key in report["results"] and key not in ("flax_nnx", "haiku")
    ]
    passing = ", ".join(others[:-1]) + " and " + others[-1]
    assert f"{passing} pass every check that applies to them" in text
    assert "report.json` (from `$CVAE_DOCS_CONFORMANCE_REPORT`)" in text
    matrix = conformance_matrix()
    assert f"| `loss`: loss matches reference | ✓ | ✓ | ✗ {len(failing)}/" in matrix


def test_the_conformance_blocks_name_the_checks_a_report_lacks(tmp_path, monkeypatch):
    """A check the suite has and the report does not (one added since the report was written) is
    named below the matrix and in the summary, with the suite's count of checks."""
    suite = tmp_path / "conformance"
    suite.mkdir()
    for path in conformance_report.SUITE.glob("test_*.py"):
        (suite / path.name).write_text(path.read_text(encoding="utf-8"))
    (suite / "test_new.py").write_text("def test_a_new_thing():\n    pass\n")
    monkeypatch.setattr(conformance_report, "SUITE", suite)
    monkeypatch.delenv(REPORT_ENV, raising=False)
    total = len(suite_checks())
    for text in (conformance_summary("choosing.md"), conformance_matrix()):
        assert f"The suite has {total} checks now; the report lacks" in text
        assert "`new`: a new thing" in text


def test_a_report_does_not_lack_the_reference_checks_it_holds_apart():
    """The suite's check of its own reference is no row of the matrix: a report that holds it
    under ``reference`` (as the plugin writes it) is not said to lack it; one without that part
    is."""
    name = "test_properties.py::test_reference_gradient_matches_central_differences"
    report = {"reference": {"results": {name: "passed"}, "summary": {"passed": 1}}}
    assert reference_checks(report) == {name} and reference_checks({}) == set()
    rows = suite_checks() - {name}
    assert suite_drift(rows, reference_checks(report)) == ""
    assert "`properties`: reference gradient matches central differences" in suite_drift(rows)


def test_the_jit_overhead_table_is_made_from_the_results():
    """One row per idiomatic path, one column per backend at its smallest and largest batch, each
    cell the row's ratio to its fast path with its interval, as results.load reads it."""
    results = pytest.importorskip("cvae_rosetta.bench.results")
    text = jit_overhead.jit_overhead()
    for name in jit_overhead.BENCH_FILES:
        result = results.load(jit_overhead.RESULTS / name)
        assert f"`{name}` ({results.provenance(result)})" in text
        backend = result["environment"]["backend"].upper()
        size = sorted(result["batches"], key=int)[-1]
        assert f"{backend}, batch {size}" in text
        for row in result["batches"][size]["paths"]:
            if row["path"] not in (results.FAST, results.SAME_AS_FAST):
                e = row["vs_fast"]["step"]
                assert f"{e['ratio']:.2f}x ({e['low']:.2f}–{e['high']:.2f})" in text, row["path"]
                # the confidence the rounds give, not the target: 98% of 10 rounds, 94% of 5
                assert f"{e['confidence']:.0%}" in text
                assert f"{backend}'s {e['rounds']} rounds" in text


def test_the_jit_overhead_table_refuses_a_row_without_its_ratio(tmp_path, monkeypatch):
    """A result whose idiomatic row has no ratio to its fast path fails the build, naming it."""
    results = pytest.importorskip("cvae_rosetta.bench.results")
    read = {
        "environment": {"backend": "cpu"},
        "batches": {"1": {"paths": [{"impl": "flax_nnx", "path": "nnx.jit in place"}]}},
    }
    (tmp_path / "bench_cpu.json").write_text("{}")
    monkeypatch.setattr(jit_overhead, "RESULTS", tmp_path)
    monkeypatch.setattr(results, "load", lambda path: read)
    with pytest.raises(DocsError, match=r"flax_nnx:nnx.jit in place has no vs_fast"):
        jit_overhead.jit_overhead()


def test_an_unknown_generated_block_fails_the_build_naming_the_known_ones(tmp_path):
    """The performance page's tables are no longer copied into another page."""
    result = build(tmp_path, "# Page\n\n<!-- generated: performance-tables -->\n")
    assert result.returncode != 0
    assert "unknown generated block 'performance-tables'" in result.stderr
    assert "conformance-summary" in result.stderr and "jit-overhead" in result.stderr
