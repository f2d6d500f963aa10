"""``CONTRIBUTING.md`` against the repository: every file it names exists, each recipe names the
test that guards it, and the built-in recipe lists every registry of built-in implementations
there is (a file outside the tests and the docs prose that names every one of them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
BUILTINS = ("pure_jax", "flax_linen", "flax_nnx", "haiku", "equinox")
PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|toml|ini|yml|json))`")


def recipes() -> dict[str, str]:
    parts = re.split(r"^### (.+)$", TEXT.split("## Recipes", 1)[1], flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        return out.stdout.split()
    # not a git checkout (an unpacked source tree): every file under the root
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]


def test_every_file_named_exists():
    named = [p for p in PATH.findall(TEXT) if "NAME" not in p and "*" not in p]
    assert len(named) > 20
    missing = [p for p in named if "/" in p and not (ROOT / p).exists()]
    missing += [p for p in named if "/" not in p and not (ROOT / p).exists() and "." in p]
    assert missing == []


def test_every_recipe_names_the_tests_that_guard_it():
    found = recipes()
    assert len(found) == 5, list(found)
    for name, body in found.items():
        guard = body[body.index("Guarded by:") :]
        assert re.search(r"tests/test_\w+\.py|tox -e \w+", guard), name
        for path in PATH.findall(guard):
            assert (ROOT / path).exists(), (name, path)


def test_the_built_in_recipe_lists_every_registry_of_built_ins():
    body = recipes()["A built-in implementation"]
    registries = body[body.index("The registries") : body.index("Guarded by:")]
    listed = set(PATH.findall(registries))
    found = set()
    for name in tracked():
        if name.startswith(("tests/", "examples/", "benchmarks/results/", "docs/data/")):
            continue
        path = ROOT / name
        if name.endswith((".md", ".png", ".json")) or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if all(b in text for b in BUILTINS):
            found.add(name)
    assert listed == found
