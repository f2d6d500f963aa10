"""What pip knows of each implementation: the distribution its framework comes from, and the extra
of this project that installs it.

Every implementation says both of itself, in its module's ``ABOUT`` (``distribution`` and
``extra``), which the contract reads without importing it (:mod:`cvae_rosetta.spec.registry`) and
hands on uninterpreted. What a user installs is the application's to say: ``cvae impls`` lists
every implementation with its framework's distribution and version (:func:`known`), the refusal of
one whose framework is missing names the extra that installs it (:func:`load`), and a checkpoint
records the version of its framework (:func:`distribution`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import TYPE_CHECKING

import cvae_rosetta
from cvae_rosetta.spec import registry
from cvae_rosetta.spec.errors import ImplementationNotFound

if TYPE_CHECKING:  # the protocol imports JAX: cvae impls lists without it
    from cvae_rosetta.spec import protocol

DISTRIBUTION = "cvae-rosetta"


@dataclasses.dataclass(frozen=True)
class Known:
    """One line of ``cvae impls``."""

    name: str
    target: str
    installed: bool
    framework: str  # its framework's distribution (ABOUT's, else its top-level package's)
    version: str | None


def _info(name: str) -> registry.ImplInfo | None:
    """What the registry says of ``name`` alone (another implementation's file is not read)."""
    return registry.info(name)


def distribution(name: str) -> str | None:
    """The distribution of registered implementation ``name``'s framework; ``None`` for any
    other name (a ``module:attribute`` string, say)."""
    info = _info(name)
    return info.about.distribution if info else None


def install_command(name: str) -> str | None:
    """What installs registered implementation ``name``'s framework; ``None`` where nothing
    needs to be (its ``extra`` is None) or the name is not registered."""
    info = _info(name)
    if info is None or info.about.extra is None:
        return None
    return f"pip install '{DISTRIBUTION}[{info.about.extra}]'"


def version(distribution: str) -> str | None:
    return cvae_rosetta.version_of(distribution)


def known() -> list[Known]:
    """:func:`cvae_rosetta.spec.registry.known` (what the protocol lists, without importing JAX or
    a framework), with each framework's distribution and version."""
    rows = []
    for info in registry.known():
        framework = info.about.distribution
        rows.append(Known(info.name, info.target, info.installed, framework, version(framework)))
    return rows


def load(name: str) -> protocol.Implementation:
    """:func:`cvae_rosetta.spec.protocol.load`; refusing a registered implementation because its
    framework is not installed, it also says how to install it."""
    from cvae_rosetta.spec import protocol

    try:
        return protocol.load(name)
    except ImplementationNotFound as err:
        info = _info(name)
        command = install_command(name)
        if (
            command is None
            or info is None
            or not isinstance(err.__cause__, ModuleNotFoundError)
            or _importable(info.module)
        ):
            raise
        raise ImplementationNotFound(
            f"{err}; install its framework with: {command}"
        ) from err.__cause__


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
