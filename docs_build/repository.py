"""The repository the site is built from: where its files are, and the implementations the
pages show, in the order of the tabs, each under its label and with its source file; and the error
every part of the docs build raises when a page asks for something the sources do not have.

The implementations shown are the registered ones, in the registry's order, each under the label
its module's ``ABOUT`` gives (:func:`registered_implementations`); one registered from outside the
repository appears wherever its file has the section a page asks for.
"""

from __future__ import annotations

import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
log = logging.getLogger("mkdocs.hooks.rosetta")

IMPLS = ROOT / "impls"  # the built-in implementations' folder (cvae_rosetta.impls)


def registered_implementations() -> tuple[dict[str, tuple[str, str]], set[str]]:
    """``key: (tab label, source file)`` of every registered implementation, in the order of the
    tabs and of every table's columns, and the keys of the built-in ones.

    Read from the ``cvae_rosetta.impls`` entry points and each module's ``ABOUT`` (its label) by
    :mod:`cvae_rosetta.spec.registry`, which imports neither an implementation nor JAX. A source
    file is relative to :data:`ROOT` where it lives in the repository (a built-in's is its file in
    :data:`IMPLS`, whatever copy is installed), else absolute: one registered from outside, whose
    sections the hooks read themselves (pymdownx.snippets reads below its base path only).
    """
    try:
        from cvae_rosetta.spec import registry
    except ImportError as error:
        raise ImportError(
            f"docs_build/repository.py: the implementations are read from the installed project's "
            f"entry points, and it is not installed here ({error})"
        ) from error
    found, builtin = {}, set()
    for info in registry.known():
        source = info.source
        if info.builtin:
            module = info.target.partition(":")[0].removeprefix(registry.BUILTIN_PACKAGE + ".")
            copy = IMPLS / (module.replace(".", "/") + ".py")
            source = copy if copy.is_file() else source
            builtin.add(info.name)
        if source is None:
            log.info("%s: no source file found for %s; left out", info.name, info.target)
            continue
        try:
            shown = source.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            shown = str(source.resolve())
        found[info.name] = (info.about.label, shown)
    return found, builtin


# key: (tab label, source file); the order of the tabs and of every table's columns.
IMPLEMENTATIONS, BUILTIN = registered_implementations()
# the marked sections of every implementation's file, in their order: what the pages show of it
# (the tests of the files' layout and of an implementation registered from outside read it here)
SECTIONS = ["module", "init", "forward", "loss", "train_step", "fast_path", "paths", "adapter"]
TOUR = ["stateful_layers", "surgery", "scan_layers", "inspect_model", "variables"]


class DocsError(Exception):
    """A page asks for something the sources do not have; raised as MkDocs' PluginError."""


def repo_path(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def in_repository(file: str) -> bool:
    """Whether ``file`` (relative to :data:`ROOT`, or absolute) is in the repository, where
    pymdownx.snippets can read it."""
    try:
        (ROOT / file).resolve().relative_to(ROOT.resolve())
    except ValueError:
        return False
    return True


def shown_name(file: str) -> str:
    """How a code block's title names ``file``: its path in the repository, else its name."""
    return file if in_repository(file) else Path(file).name
