"""The layers of the installed package, read from its import graph.

Every ``import`` and ``from ... import`` of every module of ``cvae_rosetta`` (those inside
functions too) is an arrow. The rules (docs/layout.md):

- ``spec`` imports nothing of the project beyond itself;
- ``files`` imports nothing of the project but ``spec.errors``;
- the implementations import ``spec`` only, and reach nothing else;
- the conformance suite imports ``spec`` and ``files`` (and itself) only;
- the application imports ``spec``, ``files`` and itself; the benchmark, those and ``app``;
- nothing imports the CLI (``python -m cvae_rosetta`` runs it);
- there is no cycle among the modules.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = "cvae_rosetta"


# layer -> the layers it may import (itself included)
ALLOWED = {
    "spec": {"spec"},
    "files": {"spec"},
    "impls": {"spec"},
    "conformance": {"spec", "files", "conformance"},
    "app": {"spec", "files", "app"},
    "bench": {"spec", "files", "app", "bench"},
    "cli": {"spec", "files", "app", "bench"},
    "__main__": {"cli"},
    "root": set(),
}


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name (found through the import system,
    so the package-dir mapping of pyproject.toml is followed, editable or not)."""
    found: dict[str, Path] = {}
    pending = [ROOT]
    while pending:
        package = pending.pop()
        directory = _package_dir(package)
        children = {p.name for p in directory.iterdir() if (p / "__init__.py").is_file()}
        if package == ROOT:  # an editable install maps impls/ and conformance/ from elsewhere
            for layer in ALLOWED:
                spec = importlib.util.find_spec(f"{ROOT}.{layer}") if layer != "root" else None
                if spec is not None and spec.submodule_search_locations:
                    children.add(layer)
        for path in sorted(directory.glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
        pending.extend(f"{package}.{child}" for child in sorted(children))
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports."""
    targets: set[str] = set()
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in MODULES else base)
    return {t for t in targets if t == ROOT or t.startswith(ROOT + ".")}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def test_the_graph_is_read():
    assert {"cvae_rosetta.spec.protocol", "cvae_rosetta.impls.pure_jax"} <= set(MODULES)
    assert "cvae_rosetta.spec.config" in GRAPH["cvae_rosetta.spec.protocol"]
    assert "cvae_rosetta.app.trainer" in GRAPH["cvae_rosetta.app.train"]
    assert "cvae_rosetta.app.train" in GRAPH["cvae_rosetta.cli"]


def test_every_module_has_a_layer():
    assert {_layer(m) for m in MODULES} <= set(ALLOWED), sorted({_layer(m) for m in MODULES})


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    wrong = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items())
        if _layer(module) == layer
        for target in sorted(targets)
        if target != ROOT and _layer(target) not in ALLOWED[layer] | {layer}
    ]
    assert not wrong, "\n".join(wrong)


def test_files_imports_only_the_errors_of_the_spec():
    assert GRAPH["cvae_rosetta.files"] <= {"cvae_rosetta.spec.errors", "cvae_rosetta.spec"}


def test_nothing_imports_the_cli():
    importers = sorted(m for m, targets in GRAPH.items() if "cvae_rosetta.cli" in targets)
    assert importers == ["cvae_rosetta.__main__"]


def test_no_import_cycles():
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if target == module or target not in GRAPH:
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
