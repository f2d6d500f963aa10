"""Every implementation file has the same sections, in the same order (the docs pull them out)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

IMPLS = Path(__file__).resolve().parent.parent / "impls"
sys.path.insert(0, str(IMPLS.parent / "docs_build"))
from repository import SECTIONS  # noqa: E402  (docs_build/repository.py: the sections the docs show)

FILES = sorted(p for p in IMPLS.glob("*.py") if p.name != "__init__.py")
MARKER = re.compile(r"^# --8<-- \[(start|end):(\w+)\]$", re.MULTILINE)


def test_there_are_implementation_files():
    assert any(p.name == "pure_jax.py" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_sections_are_complete_and_in_order(path):
    markers = MARKER.findall(path.read_text())
    expected = [(kind, name) for name in SECTIONS for kind in ("start", "end")]
    assert markers == expected, f"{path.name}: sections {markers}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_file_builds_one_adapter_named_implementation(path):
    text = path.read_text()
    adapter = text.split("# --8<-- [start:adapter]")[1].split("# --8<-- [end:adapter]")[0]
    assert "implementation = Adapter(" in adapter, path.name
    assert text.startswith('"""'), f"{path.name} has no module docstring"


ROOT = IMPLS.parent
MAX_MODULE_LINES = 750  # one idea per module: past this a module holds several
OWN_CODE = ("shared", "conformance", "impls", "docs_build")


def test_no_module_holds_several_ideas():
    """No module of the package, the suite, the implementations or the docs build is over
    :data:`MAX_MODULE_LINES` lines: a larger one is split at its seams, one idea each."""
    modules = [p for folder in OWN_CODE for p in (ROOT / folder).rglob("*.py")]
    assert len(modules) > 50
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules}
    assert {name: n for name, n in lines.items() if n > MAX_MODULE_LINES} == {}
