"""An implementation added by an entry point alone, with no file of the repository edited.

A temporary distribution (a folder put on ``PYTHONPATH``: a module, and a ``.dist-info`` whose
``entry_points.txt`` registers it under ``cvae_rosetta.impls``) holds a thin copy of pure JAX named
``mine``, whose ``ABOUT`` gives its label only. It must appear everywhere the built-in ones do:
``cvae impls``, ``cvae compare``, ``cvae bench`` and the docs site. Pure JAX underneath, so every
test but the docs build runs where only JAX is installed (tox: unit).
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_BUILD = ROOT / "docs_build"  # the docs build: hooks.py and its modules
sys.path.insert(0, str(DOCS_BUILD))
from repository import SECTIONS  # noqa: E402  (docs_build/repository.py: the sections the docs show)

NAME, PACKAGE, LABEL = "mine", "mine_cvae", "Mine, on pure JAX"


def install(folder: Path, distribution: str, entry_points: dict[str, str], files: dict) -> Path:
    """``folder`` made a place distributions are found in: ``files`` (path -> text) written, and
    ``distribution``'s metadata registering ``entry_points`` (name -> target) under
    ``cvae_rosetta.impls``, with the top-level packages of their targets; put it on the path."""
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text, encoding="utf-8")
    info = folder / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    points = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[cvae_rosetta.impls]\n{points}")
    tops = sorted({target.split(".")[0].split(":")[0] for target in entry_points.values()})
    (info / "top_level.txt").write_text("".join(f"{top}\n" for top in tops))
    return folder


def section(name: str) -> str:
    if name == "adapter":
        lines = [
            f"ABOUT = {{'label': {LABEL!r}}}",
            f"implementation = dataclasses.replace(pure_jax.implementation, name={NAME!r})",
        ]
    else:
        lines = [f'SECTION_{name.upper()} = "{PACKAGE} {name}"']
    return "\n".join([f"# --8<-- [start:{name}]", *lines, f"# --8<-- [end:{name}]", "", ""])


MODULE = (
    '"""Pure JAX under another name, registered by an entry point alone."""\n\n'
    "import dataclasses\n\nfrom cvae_rosetta.impls import pure_jax\n\n\n"
    + "".join(section(name) for name in SECTIONS)
)


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that finds ``mine`` (and the built-in ones)."""
    folder = install(
        tmp_path_factory.mktemp("site"),
        "mine-cvae",
        {NAME: f"{PACKAGE}.impl:implementation"},
        {f"{PACKAGE}/__init__.py": "", f"{PACKAGE}/impl.py": MODULE},
    )
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu", "NO_MKDOCS_2_WARNING": "1"}


def run(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def test_cvae_impls_lists_it_after_the_built_in_ones(outside):
    lines = run(outside, "-m", "cvae_rosetta", "impls").stdout.splitlines()
    names = [line.split()[0] for line in lines]
    assert names[-1] == NAME and names[0] == "pure_jax", names
    # its framework: the distribution of its top-level package, as no ABOUT says otherwise
    assert re.fullmatch(rf"{NAME} +mine-cvae 0\.1  {PACKAGE}\.impl:implementation", lines[-1])


def test_cvae_compare_trains_it(outside, tmp_path):
    out = tmp_path / "compare"
    run(
        outside,
        *("-m", "cvae_rosetta", "compare", "--impls", f"{NAME},pure_jax", "--out", str(out)),
        *("--data", "synthetic", "--epochs", "1", "--batch-size", "128", "--latent-dim", "3"),
        *("--encoder-dims", "8", "--decoder-dims", "8", "--iw-samples", "1", "--no-progress"),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert [row["impl"] for row in summary["rows"]] == [NAME, "pure_jax"]
    assert (out / NAME / "params.npz").is_file()


def test_cvae_bench_measures_it_under_its_label(outside, tmp_path):
    out = tmp_path / "bench"
    env = {**outside, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    run(
        env,
        *("-m", "cvae_rosetta", "bench", "--impls", NAME, "--out", str(out), "--no-progress"),
        *("--batch-sizes", "2", "--rounds", "5", "--steps", "8", "--epoch-examples", "16"),
        *("--unrolls", "1", "--devices", "1", "--mechanisms", "sharded", "--parallel-batch", "2"),
        *("--parallel-impls", "pure_jax", "--roof-size", "64", "--precision-batches", "none"),
        *("--technique-batches", "none"),
        timeout=600,
    )
    result = json.loads((out / "bench.json").read_text())
    measured = {row["impl"] for batch in result["batches"].values() for row in batch["paths"]}
    assert measured == {"pure_jax", NAME}
    assert "mine-cvae" in result["environment"]["versions"]  # its distribution's version
    page = (out / "bench.md").read_text()
    assert f"| {LABEL} |" in page, page


def test_the_docs_hooks_show_it_from_its_own_file(outside, tmp_path):
    """Without MkDocs: the side-by-side tabs, the compare page and the lines-of-code table of the
    hooks list it under its label, its sections read from its file outside the repository; the
    tour, which has no section for it, leaves it out."""
    script = textwrap.dedent(
        f"""\
        import json, sys
        sys.path.insert(0, {str(DOCS_BUILD)!r})  # the hooks' modules, as MkDocs loads them
        import hooks  # all of the hook's modules: none may import JAX
        from compare_page import compare_files
        from lines_of_code import loc_table, tour_loc_table
        from repository import IMPLEMENTATIONS
        from tabs import expand_rosetta
        print(json.dumps({{
            "implementations": IMPLEMENTATIONS,
            "tabs": expand_rosetta("<!-- rosetta\\nimpls:loss\\n-->\\n"),
            "tour": expand_rosetta(
                "<!-- rosetta\\nexamples/tour/variables.py:{{impl}}_update\\n-->\\n"
            ),
            "compare": compare_files(),
            "loc": loc_table(),
            "tour_loc": tour_loc_table(),
            "jax": "jax" in sys.modules,
        }}))
        """
    )
    found = json.loads(run(outside, "-c", script).stdout)
    keys = list(found["implementations"])
    assert keys[0] == "pure_jax" and keys[-1] == NAME
    label, source = found["implementations"][NAME]
    assert label == LABEL and Path(source).is_absolute() and Path(source).name == "impl.py"
    assert not found["jax"]  # the hooks read files only
    tabs = found["tabs"]
    assert f'data-impls="{" ".join(keys)}"' in tabs
    assert f'=== "{LABEL}"' in tabs
    assert f'SECTION_LOSS = "{PACKAGE} loss"' in tabs  # the code itself, not a snippet line
    assert f"{PACKAGE}/impl.py" not in tabs  # nor its path
    assert NAME not in found["tour"].split("data-impls=")[1].split(">")[0]
    compare = found["compare"]
    assert compare.count(f'=== "{LABEL}"') == 1 + len(SECTIONS)
    for name in SECTIONS[:-1]:
        assert f'SECTION_{name.upper()} = "{PACKAGE} {name}"' in compare
    assert "implementation = dataclasses.replace(pure_jax.implementation" in compare
    assert f"| {LABEL} |" in found["loc"].splitlines()[0]
    assert LABEL not in found["tour_loc"]


@pytest.mark.docs
def test_the_docs_site_builds_with_it(outside, tmp_path):
    """``mkdocs build --strict`` of the whole site, with ``mine`` installed: its tab on the
    side-by-side pages and its file on the compare page."""
    pytest.importorskip("mkdocs", reason="MkDocs is not installed here (the docs extra)")
    site = tmp_path / "site"
    run(
        outside,
        *("-m", "mkdocs", "build", "--strict", "-q", "--config-file", str(ROOT / "mkdocs.yml")),
        *("--site-dir", str(site)),
        timeout=600,
    )
    loss = (site / "topics" / "loss_gradients" / "index.html").read_text(encoding="utf-8")
    assert f">{LABEL}</label>" in loss
    assert "data-impls=" in loss and f" {NAME}" in loss.split("data-impls=")[1].split(">")[0]
    compare = (site / "compare" / "index.html").read_text(encoding="utf-8")
    assert f'SECTION_FORWARD = "{PACKAGE} forward"' in html.unescape(
        re.sub(r"<[^>]+>", "", compare)
    )
