"""The checks of a command's arguments that need no JAX, run before JAX starts and before the
first file is written: the paths a flag must not leave empty, the data directory, the names of the
implementations.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from cvae_rosetta.cli.flags import Resolved
from cvae_rosetta.spec.errors import (
    ConfigError,
    DataError,
    ImplementationNotFound,
    field_error,
)

# the data sets that read --data-dir
READS_DATA_DIR = ("mnist", "fashion_mnist")


def check_data_dir(resolved: Resolved) -> None:
    """``--data-dir`` is read for mnist and fashion_mnist only: with another data set it is
    refused, and for those two a directory that is not there is refused before JAX starts."""
    data = resolved.config.data
    if data.data_dir is None:
        if data.name in READS_DATA_DIR:
            raise ConfigError(
                f"--data-dir: expected the directory that holds the files of --data {data.name}, "
                f"which nothing downloads (the four IDX files or {data.name}.npz, from the data "
                "set's own site or keras.datasets' cache), got none"
            )
        return
    where = resolved.sources.get("data.data_dir", "--data-dir")
    if not data.data_dir.strip():  # '' would be the working directory
        raise field_error(ConfigError, "data.data_dir", "a directory", data.data_dir)
    if data.name not in READS_DATA_DIR:
        raise ConfigError(
            f"data.data_dir: expected no data directory with data.name {data.name} (only "
            f"{' and '.join(READS_DATA_DIR)} read one), got {data.data_dir!r}"
            + ("" if where == "--data-dir" else f" (set in {where})")
        )
    if not Path(data.data_dir).expanduser().is_dir():
        raise field_error(
            DataError,
            "data.data_dir",
            "an existing directory holding the data set's files, which nothing downloads (the "
            "IDX files or the .npz from the data set's own site, or keras.datasets' cache)",
            data.data_dir,
        )


IMPL_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_impl_names(names: Sequence[str], field: str = "impl") -> None:
    """Each name is registered (``cvae impls``) or reads ``module:attribute``; checked from the
    entry points without importing an implementation (or JAX). Whether it imports is checked
    when it is loaded. ``field``: the flag's name in a refusal (``impls`` for cvae compare's)."""
    from cvae_rosetta.spec import registry

    registered = registry.registered()
    for name in names:
        if name in registered or IMPL_NAME.match(name):
            continue
        if ":" in name or not name:
            raise field_error(ImplementationNotFound, field, "a name or 'module:attribute'", name)
        listing = ", ".join(
            f"{i.name} ({'installed' if i.installed else 'not installed'})"
            for i in registry.known()
        )
        close = difflib.get_close_matches(name.replace("-", "_").lower(), sorted(registered), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ImplementationNotFound(
            f"{field}: expected a known implementation or 'module:attribute', got {name!r}{hint}; "
            f"known implementations: {listing}"
        )


# paths a flag must not leave empty ('' would mean the working directory)
PATH_FLAGS = {
    "out": ("--out", "a path"),
    "run": ("--run", "a run directory"),
    "resume": ("--resume", "a run directory"),
    "config": ("--config", "a config file"),
    "cfg_data_dir": ("--data-dir", "a directory"),
}


def check_paths(args: argparse.Namespace) -> None:
    for dest, (flag, expected) in PATH_FLAGS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            if dest == "out":
                expected = getattr(args, "out_kind", "a directory")
            raise ConfigError(f"{flag}: expected {expected}, got {value!r}")
