"""The docs build pulls code from marked sections and fails on every kind of broken reference.

Run by ``tox -e docs`` (it needs the ``docs`` extra: MkDocs, Material, PyMdown Extensions). Small
sites are built in a temporary folder with the project's own hooks (``docs_build/hooks.py``),
which resolve snippets against the repository root, as the real site does.
"""

from __future__ import annotations

import html as html_module
import importlib.util
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


def load_hooks():
    spec = importlib.util.spec_from_file_location("cvae_docs_hooks", HOOKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = load_hooks()


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
    for label in ("pure JAX", "Flax Linen", "Flax NNX", "Haiku", "Equinox"):
        assert f">{label}</label>" in html
    assert 'class="rosetta"' in html
    assert "method=CVAE.encode" in text  # Linen's forward section
    assert "jax.vmap(in_compute_dtype(model).encode)" in text  # Equinox's


def test_tab_sets_name_their_implementations_for_the_view_script(tmp_path):
    """rosetta.js maps the i-th tab to an implementation by the set's ``data-impls``."""
    result = build(tmp_path, "# Page\n\n<!-- rosetta\nimpls:loss\n-->\n")
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert '<div class="rosetta" data-impls="pure_jax flax_linen flax_nnx haiku equinox">' in html
    labels = re.findall(r"<label for=[^>]+>([^<]+)</label>", html)
    assert labels == [label for label, _ in hooks.IMPLEMENTATIONS.values()]


def test_the_compare_page_holds_every_file_whole_in_sections(tmp_path):
    """Each file's opening (up to its first marker) and every section, in the files' order, one
    tab set each under its heading; the sections laid end to end are the whole file, less the
    marker lines and the blank lines between sections."""
    result = build(tmp_path, "# Compare\n\n<!-- generated: compare-files -->\n")
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert re.findall(r"<h2 id=\"([^\"]+)\"", html) == ["docstring-and-imports", *hooks.SECTIONS]
    assert html.count('<div class="rosetta" ') == 1 + len(hooks.SECTIONS)
    assert '<div class="rosetta-compare">' in html
    code = [html_text(c) for c in re.findall(r"<pre>.*?<code>(.*?)</code>", html, re.DOTALL)]
    assert len(code) == len(hooks.IMPLEMENTATIONS) * (1 + len(hooks.SECTIONS))
    blocks = iter(code)
    shown = {key: [] for key in hooks.IMPLEMENTATIONS}
    for _ in range(1 + len(hooks.SECTIONS)):  # a tab set: one block per implementation, in order
        for key in hooks.IMPLEMENTATIONS:
            shown[key].append(next(blocks))
    for key, (_, source) in hooks.IMPLEMENTATIONS.items():
        lines = (ROOT / source).read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if line.strip() and not hooks.MARKER.match(line)]
        assert [line for text in shown[key] for line in text.splitlines() if line.strip()] == kept


def test_text_in_a_tab_set_keeps_lines_that_look_like_snippet_syntax():
    """pymdownx.snippets reads every line of a page: a line that starts with its marker would
    include a file, one with a section marker in it would vanish; literal() escapes both."""
    import markdown

    lines = [
        '--8<-- "impls/pure_jax.py:loss"',
        "    ``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` mark a section",
        "x = 1  # -8<- [end:body]",
    ]
    blocks = {key: [("text", hooks.literal("\n".join(lines)))] for key in hooks.IMPLEMENTATIONS}
    html = markdown.markdown(
        hooks.tab_set(blocks),
        extensions=["md_in_html", "pymdownx.superfences", "pymdownx.tabbed", "pymdownx.snippets"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(ROOT)], "check_paths": True}},
    )
    shown = html_text(html)
    for line in lines:
        assert shown.count(line) == len(hooks.IMPLEMENTATIONS), line
    assert "cvae_loss" not in shown  # nothing was included


def test_the_compare_page_refuses_a_file_that_lacks_a_section(tmp_path, monkeypatch):
    source = (ROOT / "impls" / "pure_jax.py").read_text(encoding="utf-8")
    start, end = "# --8<-- [start:paths]\n", "# --8<-- [end:paths]\n"
    assert start in source and end in source
    (tmp_path / "impl.py").write_text(source.replace(start, "").replace(end, ""))
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    monkeypatch.setitem(hooks.IMPLEMENTATIONS, "pure_jax", ("pure JAX", "impl.py"))
    with pytest.raises(hooks.DocsError, match="impl.py has sections .*, expected"):
        hooks.compare_files()


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
    with pytest.raises(hooks.DocsError, match=message):
        hooks.check_snippets(f'```python\n--8<-- "{path}:body"\n```\n')


def test_escaped_snippet_lines_are_text(tmp_path):
    hooks.check_snippets(';--8<-- "impls/pure_jax.py:no_such_section"\n')


def test_directives_inside_code_fences_are_left_alone():
    page = "```markdown\n<!-- rosetta\nimpls:nope\n-->\n```\n"
    assert hooks.outside_fences(page, hooks.expand_rosetta) == page


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
    assert sorted(hooks.code_lines(source)) == [5, 7, 8, 9]


def test_every_implementation_file_has_every_section():
    for _, source in hooks.IMPLEMENTATIONS.values():
        assert list(hooks.sections_of(ROOT / source)) == sorted(hooks.SECTIONS)
    for name in hooks.TOUR:
        sections = hooks.sections_of(ROOT / "examples" / "tour" / f"{name}.py")
        assert set(hooks.IMPLEMENTATIONS) <= set(sections), name
