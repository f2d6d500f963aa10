"""What pip knows of the built-in implementations: the distribution each one's framework comes
from, and the extra of this project that installs it.

The contract (:mod:`cvae_rosetta.spec.protocol`) knows only the module each built-in needs, to say
whether it is installed without importing it. What a user installs is the application's to say:
``cvae impls`` lists every implementation with its framework's distribution and version
(:func:`known`), the refusal of a built-in whose framework is missing names the extra that
installs it (:func:`load`), and a checkpoint records the version of its framework
(:func:`distribution`). ``tests/test_protocol.py`` holds the table to pyproject.toml.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util

from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.errors import ImplementationNotFound

DISTRIBUTION = "cvae-rosetta"


@dataclasses.dataclass(frozen=True)
class Install:
    distribution: str  # the framework's distribution, whose version is listed and recorded
    extra: str | None  # the extra of cvae-rosetta that installs it (None: always installed)


# By entry-point name, one row for each of protocol.BUILTIN_FRAMEWORKS.
INSTALLS: dict[str, Install] = {
    "pure_jax": Install("jax", None),
    "flax_linen": Install("flax", "flax"),
    "flax_nnx": Install("flax", "flax"),
    "haiku": Install("dm-haiku", "haiku"),
    "equinox": Install("equinox", "equinox"),
}


@dataclasses.dataclass(frozen=True)
class Known:
    """One line of ``cvae impls``."""

    name: str
    target: str
    installed: bool
    framework: str  # a built-in's framework distribution, else its target's top-level package
    version: str | None


def distribution(name: str) -> str | None:
    """The distribution of built-in ``name``'s framework; ``None`` for any other name."""
    install = INSTALLS.get(name)
    return install.distribution if install and name in protocol.BUILTIN else None


def install_command(name: str) -> str | None:
    """What installs built-in ``name``'s framework; ``None`` where nothing needs to be."""
    install = INSTALLS.get(name)
    if install is None or install.extra is None or name not in protocol.BUILTIN:
        return None
    return f"pip install '{DISTRIBUTION}[{install.extra}]'"


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def known() -> list[Known]:
    """:func:`cvae_rosetta.spec.protocol.known`, with each framework's distribution and version."""
    rows = []
    for info in protocol.known():
        framework = distribution(info.name) or info.module
        rows.append(Known(info.name, info.target, info.installed, framework, version(framework)))
    return rows


def load(name: str) -> protocol.Implementation:
    """:func:`cvae_rosetta.spec.protocol.load`; refusing a built-in because its framework is not
    installed, it also says how to install it."""
    try:
        return protocol.load(name)
    except ImplementationNotFound as err:
        command = install_command(name)
        builtin = protocol.BUILTIN.get(name)
        if (
            command is None
            or builtin is None
            or not isinstance(err.__cause__, ModuleNotFoundError)
            or importlib.util.find_spec(builtin.module) is not None
        ):
            raise
        raise ImplementationNotFound(
            f"{err}; install its framework with: {command}"
        ) from err.__cause__
