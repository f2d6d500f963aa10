"""SPEC section 6: which implementations are registered, and what each says of itself, read
without importing any of them (nor JAX).

The one list of implementations is the entry-point group ``cvae_rosetta.impls``: a short name, and
the ``"module:attribute"`` of its protocol object. The built-in ones are the entry points whose
target is in :data:`BUILTIN_PACKAGE`. Each implementation's module may describe itself in a
top-level literal, read from the module's text (:func:`about`)::

    ABOUT = {"label": "Equinox", "module": "equinox", "distribution": "equinox", "extra": "equinox",
             "order": 5}

- ``label``: its name on the docs' and the benchmark's pages;
- ``module``: what must be importable for it to run (whether it is installed);
- ``distribution``: the framework's distribution, whose version is listed and recorded;
- ``extra``: the extra of this project that installs that framework, or None where nothing needs
  installing (the application makes the install hint of it; the contract only hands it on);
- ``order`` (optional): where it comes among the others, lower first; without one, after those
  with one. The installed metadata keeps the entry points sorted by name, not in the order
  ``pyproject.toml`` writes them, so this number is what keeps that order.

Every key may be left out, and a module without ``ABOUT`` (one registered from outside, say) gets
the defaults: the entry point's name as its label, the target's top-level package as its module,
that package's distribution (where the installed metadata knows it, else the package's name), no
extra and no order.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from cvae_rosetta.spec.errors import ImplementationNotFound, describe

ENTRY_POINT_GROUP = "cvae_rosetta.impls"
BUILTIN_PACKAGE = "cvae_rosetta.impls"  # entry points with a target in it are the built-in ones
ABOUT = "ABOUT"  # the top-level name an implementation's module describes itself with


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _dotted(value: Any) -> bool:
    return isinstance(value, str) and all(part.isidentifier() for part in value.split("."))


# the keys of ABOUT: what each must be, and its check
FIELDS = {
    "label": ("a non-empty string", _text),
    "module": ("a module's dotted name", _dotted),
    "distribution": ("a non-empty string", _text),
    "extra": ("None or a non-empty string", lambda v: v is None or _text(v)),
    "order": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
}


@dataclasses.dataclass(frozen=True)
class About:
    """What the project says of an implementation without importing it."""

    label: str  # its name on the docs' and the benchmark's pages
    module: str  # what must be importable for it to run
    distribution: str  # the framework's distribution, whose version is listed and recorded
    extra: str | None  # the extra of this project that installs it (the application's to read)
    order: int | None  # where it comes among the others, lower first (None: after those with one)
    declared: tuple[str, ...]  # the keys its module's ABOUT gives (the rest are defaults)


@dataclasses.dataclass(frozen=True)
class ImplInfo:
    name: str
    target: str
    installed: bool
    module: str  # what must be importable: ``about.module``
    builtin: bool  # registered by this project, with a target in BUILTIN_PACKAGE
    about: About
    source: Path | None  # the file of the target's module; None where it cannot be found


def _entry_points() -> dict[str, str]:
    """``name -> target`` of the group, the built-in ones first (a name registered twice keeps its
    built-in target, else the first one found)."""
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    found: dict[str, str] = {}
    for builtin in (True, False):
        for ep in points:
            if _is_builtin(ep.value) == builtin:
                found.setdefault(ep.name, ep.value)
    return found


def _is_builtin(target: str) -> bool:
    return target.startswith(BUILTIN_PACKAGE + ".")


def source_of(target: str) -> Path | None:
    """The file of ``target``'s module, found without importing it (only the packages above it,
    as any import would); None where there is none."""
    module = target.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None
    return Path(origin)


def read_about(path: Path) -> dict[str, Any] | None:
    """The top-level ``ABOUT = {...}`` of a module's file, checked; None where it has none.

    Raises :class:`ImplementationNotFound` naming the file and the key for one that is assigned
    more than once, is not a literal dict, or has a key not in :data:`FIELDS` or a value not of
    its key's kind.
    """
    text = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as error:
        raise ImplementationNotFound(
            f"{ABOUT} of {path}: expected Python source to read it from, got "
            f"{type(error).__name__} at line {error.lineno}: {error.msg}"
        ) from None
    found = [node for node in tree.body if _assigns_about(node)]
    if not found:
        return None
    where = f"{ABOUT} of {path}"
    if len(found) > 1:
        lines = ", ".join(str(node.lineno) for node in found)
        raise ImplementationNotFound(
            f"{where}: expected one assignment, got {len(found)} (lines {lines})"
        )
    node = found[0]
    try:
        value = ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        given = ast.get_source_segment(text, node.value) or "?"
        raise ImplementationNotFound(
            f"{where} (line {node.lineno}): expected a literal dict, got {given[:60]!r}"
        ) from None
    if not isinstance(value, dict):
        raise ImplementationNotFound(
            f"{where} (line {node.lineno}): expected a literal dict, got {describe(value)}"
        )
    for key, item in value.items():
        if key not in FIELDS:
            raise ImplementationNotFound(
                f"{where}: expected keys among {', '.join(FIELDS)}, got {key!r}"
            )
        expected, check = FIELDS[key]
        if not check(item):
            raise ImplementationNotFound(
                f"{where}: {key!r}: expected {expected}, got {describe(item)}"
            )
    return value


def _assigns_about(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == ABOUT for t in node.targets)
    return (
        isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == ABOUT
        and node.value is not None
    )


def _default_distribution(package: str, cache: dict[str, Any]) -> str:
    if "map" not in cache:
        cache["map"] = importlib.metadata.packages_distributions()
    names = cache["map"].get(package) or [package]
    return names[0]


def about(name: str, target: str, source: Path | None = None, _cache: dict | None = None) -> About:
    """What implementation ``name`` (registered as ``target``) says of itself, defaults filled
    in; ``source``: its module's file, where already found."""
    source = source if source is not None else source_of(target)
    declared = (read_about(source) if source is not None else None) or {}
    top = target.partition(":")[0].split(".")[0]
    module = declared.get("module", top)
    if "distribution" in declared:
        distribution = declared["distribution"]
    else:
        distribution = _default_distribution(module.split(".")[0], {} if _cache is None else _cache)
    return About(
        label=declared.get("label", name),
        module=module,
        distribution=distribution,
        extra=declared.get("extra"),
        order=declared.get("order"),
        declared=tuple(declared),
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def known() -> list[ImplInfo]:
    """Every registered implementation, installed or not, without importing any of them: the
    built-in ones first, then those registered from outside, each group by ``order`` (those
    without one last), then by name."""
    cache: dict[str, Any] = {}
    infos = [info(name, target, cache) for name, target in _entry_points().items()]
    inf = float("inf")
    return sorted(
        infos,
        key=lambda i: (not i.builtin, inf if i.about.order is None else i.about.order, i.name),
    )


def info(name: str, target: str | None = None, _cache: dict | None = None) -> ImplInfo | None:
    """What :func:`known` says of registered implementation ``name`` (whose target is looked up
    where not given), reading its file alone; None for a name not registered."""
    target = target if target is not None else _entry_points().get(name)
    if target is None:
        return None
    source = source_of(target)
    described = about(name, target, source, _cache)
    installed = _installed(described.module)
    return ImplInfo(
        name, target, installed, described.module, _is_builtin(target), described, source
    )


def registered() -> dict[str, str]:
    """``name -> target`` of every registered implementation (whether installed or not)."""
    return _entry_points()
