"""The layers of the installed package, read from its import graph.

Every ``import`` and ``from ... import`` of every module of ``cvae_rosetta`` (those inside
functions too) is an arrow. The rules (docs/package.md):

- ``spec`` imports nothing of the project beyond itself;
- ``files`` imports nothing of the project but ``spec.errors``;
- the implementations import ``spec`` only, and reach nothing else;
- the conformance suite imports ``spec`` and ``files`` (and itself) only;
- the application imports ``spec``, ``files`` and itself; the benchmark, those and ``app``;
- nothing imports the CLI (``python -m cvae_rosetta`` runs it);
- there is no cycle among the modules.

And the contract holds what an implementation and the suite need, nothing else:

- every module of ``spec``, and every name one defines, is used by an implementation
  (``impls/``, ``template/``) or by the conformance suite, directly or through another name of
  ``spec`` (a few, listed in :data:`SPEC_FOR_THE_APPLICATION`, by design only by the application);
- no file of ``spec`` names a distribution or an extra of pip: how to install a framework is the
  application's to say (``cvae_rosetta.app.frameworks``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import tomllib
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


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names, relative levels resolved in ``package``."""
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return base


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports."""
    targets: set[str] = set()
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
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
    assert "cvae_rosetta.app.train" in GRAPH["cvae_rosetta.cli.training"]


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
    """Nothing outside the CLI imports it or any of its modules, but ``python -m cvae_rosetta``."""
    importers = sorted(
        m
        for m, targets in GRAPH.items()
        if _layer(m) != "cli" and any(_layer(t) == "cli" for t in targets)
    )
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


# --- the contract holds what its users need ------------------------------------------------------

SPEC = f"{ROOT}.spec"
REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "template"  # outside the package: where an implementation of one's own starts

# Names the spec defines that no implementation and no part of the suite uses, each kept there on
# purpose (anything else that only the application or the benchmark use belongs in their layers).
SPEC_FOR_THE_APPLICATION = {
    "errors.DataError": "one hierarchy of errors, in the one module `files` may import as well",
    "errors.OutputError": "one hierarchy of errors, in the one module `files` may import as well",
    "errors.CheckpointError": "one hierarchy of errors, in the one module `files` may import too",
    "config.SECTIONS": "the config's sections by name, beside the sections themselves",
    "model.step_key": "SPEC section 3: the key of step t; implementations are handed keys",
    "optim.learning_rates": "SPEC section 5: the schedule's rate at each step, as numbers",
}


def _users() -> dict[str, Path]:
    """What the contract is for: the implementations, the template and the conformance suite."""
    users = {m: p for m, p in MODULES.items() if _layer(m) in ("impls", "conformance")}
    users |= {f"template.{p.stem}": p for p in sorted(TEMPLATE.glob("*.py"))}
    return users


def _bindings(name: str, path: Path, tree: ast.Module) -> dict[str, str]:
    """Each name an import binds in the file (inside functions too), to the dotted path of what
    it is bound to: ``parallel`` -> ``cvae_rosetta.spec.parallel``, ``Adapter`` ->
    ``cvae_rosetta.spec.protocol.Adapter``."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    first = alias.name.partition(".")[0]
                    bound[first] = first
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return bound


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; ``None`` for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _spec_name(dotted: str) -> tuple[str, str] | None:
    """``cvae_rosetta.spec.parallel.Plan.create`` -> ``("cvae_rosetta.spec.parallel", "Plan")``."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if module in MODULES and _layer(module) == "spec":
            return module, parts[cut]
    return None


def _uses(node: ast.AST, bound: dict[str, str], own: str | None, defined) -> set[tuple[str, str]]:
    """The names of ``spec`` that ``node`` refers to: through what a file's imports bind, or, in a
    module of ``spec`` (``own``), by the bare name of one of its own definitions."""
    found: set[tuple[str, str]] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.ImportFrom | ast.Import):
            for alias in sub.names:
                target = bound.get(alias.asname or alias.name.partition(".")[0])
                if target and (hit := _spec_name(target)):
                    found.add(hit)
            continue
        parts = _dotted(sub) if isinstance(sub, ast.Name | ast.Attribute) else None
        if not parts:
            continue
        if own is not None and parts[0] in defined[own]:
            found.add((own, parts[0]))
        elif parts[0] in bound and (hit := _spec_name(".".join([bound[parts[0]], *parts[1:]]))):
            found.add(hit)
    return found


def _definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """The names a module defines at its top level, each with the statement that defines it."""
    found: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        found[leaf.id] = node
    return found


def _unused_spec_names(extra_roots: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Every name a module of ``spec`` defines that neither the implementations, the template nor
    the suite reach (directly, or through the definition of a name of ``spec`` they reach)."""
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in MODULES.items()}
    spec = [m for m in MODULES if _layer(m) == "spec"]
    defined = {m: _definitions(trees[m]) for m in spec}
    arrows: dict[tuple[str, str], set[tuple[str, str]]] = {}
    reached = set(extra_roots)
    for m in spec:
        bound = _bindings(m, MODULES[m], trees[m])
        for name, node in defined[m].items():
            arrows[(m, name)] = _uses(node, bound, m, defined)
        for node in trees[m].body:  # anything else at the top level runs on import
            if not isinstance(node, ast.Import | ast.ImportFrom | ast.Expr) and not any(
                node is d for d in defined[m].values()
            ):
                reached |= _uses(node, bound, m, defined)
    for name, path in _users().items():
        tree = trees.get(name) or ast.parse(path.read_text(encoding="utf-8"))
        reached |= _uses(tree, _bindings(name, path, tree), None, defined)
    pending = list(reached)
    while pending:
        for target in arrows.get(pending.pop(), ()):
            if target not in reached:
                reached.add(target)
                pending.append(target)
    return sorted(
        f"{m.removeprefix(SPEC + '.')}.{name}"
        for m in spec
        for name in defined[m]
        if (m, name) not in reached
    )


def test_the_template_is_read():
    users = _users()
    assert {"template.my_impl", "template.raw_impl"} <= set(users), TEMPLATE
    assert {"cvae_rosetta.impls.pure_jax", "cvae_rosetta.conformance.plugin"} <= set(users)


def test_every_module_of_the_spec_is_needed_by_an_implementation_or_the_suite():
    """A module of ``spec`` that only the application or the benchmark import belongs to them."""
    reached: set[str] = set()
    pending = [
        target
        for name, path in _users().items()
        for target in (GRAPH.get(name) or _imports(name, path))
        if _layer(target) == "spec"
    ]
    while pending:
        module = pending.pop()
        if module not in reached:
            reached.add(module)
            pending.extend(GRAPH.get(module, ()))
    reached.add(SPEC)  # importing any of its modules runs the package's __init__
    spec = {m for m in MODULES if _layer(m) == "spec"}
    assert not spec - reached, sorted(spec - reached)


def test_every_name_of_the_spec_is_used_by_an_implementation_or_the_suite():
    """What only the application or the benchmark use (the trainer's epoch step, splitting the
    host into devices) lives in ``cvae_rosetta.app``; the few exceptions are listed, with why
    (what they use counts as used)."""
    listed = {tuple(f"{SPEC}.{name}".rsplit(".", 1)) for name in SPEC_FOR_THE_APPLICATION}
    unused = _unused_spec_names(listed)
    assert not unused, (
        f"names of the spec no implementation and no part of the suite uses: {unused}"
    )
    used = sorted(set(SPEC_FOR_THE_APPLICATION) - set(_unused_spec_names()))
    assert not used, f"listed in SPEC_FOR_THE_APPLICATION, but used by them (or gone): {used}"


def test_uses_of_the_spec_are_seen_in_every_form():
    """Through a module (``parallel.Plan``), a name (``from ... import Adapter``), a function-level
    import (``known`` in the suite's plugin) and another name of the spec (``first_device``, which
    only ``Plan`` uses); a name nobody uses is found."""
    unused = _unused_spec_names()
    for used in ("parallel.Plan", "protocol.Adapter", "protocol.known", "parallel.first_device"):
        assert used not in unused
    assert "model.step_key" in unused


def _pip_names() -> tuple[list[str], list[str]]:
    """The extras of pyproject.toml, and every distribution it names that could not be a module's
    name (``dm-haiku``, ``cvae-rosetta``)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    requirements = [project["name"], *project["dependencies"]]
    requirements += [r for needs in extras.values() for r in needs]
    names = {re.match(r"[A-Za-z0-9._-]+", r).group() for r in requirements}
    return sorted(extras), sorted(n for n in names if not n.isidentifier())


def test_the_spec_names_no_distribution_and_no_extra():
    """How to install a framework is the application's to say (``cvae_rosetta.app.frameworks``):
    no file of the contract mentions pip, an extra (``[flax]``, ``.[all]``) or a distribution
    whose name is not a module's (``dm-haiku``, ``cvae-rosetta``)."""
    extras, distributions = _pip_names()
    assert "haiku" in extras and "dm-haiku" in distributions and "cvae-rosetta" in distributions
    extra = "|".join(map(re.escape, extras))
    patterns = [
        re.compile(r"\bpip\b", re.IGNORECASE),
        re.compile(rf"\[\s*(?:[\w-]+\s*,\s*)*(?:{extra})\s*(?:,\s*[\w-]+\s*)*\]"),
        *(re.compile(rf"(?<![\w-]){re.escape(d)}(?![\w-])", re.IGNORECASE) for d in distributions),
    ]
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for module, path in sorted(MODULES.items())
        if _layer(module) == "spec"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(p.search(line) for p in patterns)
    ]
    assert not found, "\n".join(found)
