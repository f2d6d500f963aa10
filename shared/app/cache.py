"""JAX's persistent compilation cache for the ``cvae`` commands.

A run's first step is mostly compilation (seconds on a CPU), and an identical run compiles the same
programs again. With the cache on, XLA's executables are written to a folder and read back by the
next process that compiles the same program (same JAX, same machine, same shapes), so a second
``cvae train`` or ``cvae sample`` starts sooner.

Where it is, first match wins (:func:`choose`):

1. the command's flags, ``--compilation-cache DIR`` (``off``: none) or ``--no-compilation-cache``;
2. ``$CVAE_COMPILATION_CACHE``: a folder, or ``off`` (``auto`` or empty: as if unset); the
   conformance suite's plugin reads the same variable for its own sessions;
3. ``$JAX_COMPILATION_CACHE_DIR``: JAX's own setting, left as JAX reads it;
4. the per-user default, ``$XDG_CACHE_HOME/cvae-rosetta/jax`` (``~/.cache/cvae-rosetta/jax``
   without it), unless the command's default is off (``cvae bench``, which measures compilation).

Every program is kept however small or quick to compile (the CVAE's are both): the thresholds
``jax_persistent_cache_min_compile_time_secs`` and ``jax_persistent_cache_min_entry_size_bytes``
go to 0 unless their own environment variables are set. A folder that cannot be created or
written is not an error: :func:`use` says so in one line and the command runs without a cache.

Nothing here imports JAX until :func:`use`, which a command calls once its arguments are checked
and before its first compilation.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cvae_rosetta.spec.errors import ConfigError

ENV = "CVAE_COMPILATION_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
OFF = "off"
# JAX's thresholds below which a program is not written; 0: every program
THRESHOLDS = {
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


@dataclasses.dataclass(frozen=True)
class Choice:
    """Where the cache goes: ``folder`` (a path), or none; ``source`` says who decided it
    (``--compilation-cache``, ``$CVAE_COMPILATION_CACHE``, ``default``, ...); ``jax_own``: JAX's
    own setting (``$JAX_COMPILATION_CACHE_DIR``) is left alone."""

    folder: Path | None
    source: str
    jax_own: bool = False


def user_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """The project's per-user cache folder: ``$XDG_CACHE_HOME/cvae-rosetta``, else
    ``~/.cache/cvae-rosetta`` (a relative ``XDG_CACHE_HOME`` is ignored, as the XDG base
    directory specification says); the compilation cache and the data cache live in it."""
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "cvae-rosetta"


def default_folder(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/cvae-rosetta/jax``, else ``~/.cache/cvae-rosetta/jax``."""
    return user_folder(environ) / "jax"


def choose(
    folder: str | None = None,
    *,
    off: bool = False,
    default_on: bool = True,
    environ: Mapping[str, str] = os.environ,
) -> Choice:
    """The cache a command uses: its flags (``folder``, ``off``), else the environment, else the
    default. Imports nothing; refuses an empty ``folder``."""
    if off:
        return Choice(None, "--no-compilation-cache")
    if folder is not None:
        if not folder.strip():
            raise ConfigError(f"compilation_cache: expected a directory or {OFF!r}, got {folder!r}")
        if folder.strip().lower() == OFF:
            return Choice(None, "--compilation-cache off")
        return Choice(Path(folder).expanduser(), "--compilation-cache")
    value = environ.get(ENV, "").strip()
    if value.lower() == OFF:
        return Choice(None, f"${ENV}={OFF}")
    if value and value.lower() != "auto":
        return Choice(Path(value).expanduser(), f"${ENV}")
    if environ.get(JAX_ENV):
        return Choice(None, f"${JAX_ENV}", jax_own=True)
    if not default_on:
        return Choice(None, "default (off for this command)")
    return Choice(default_folder(environ), "default")


def writable(folder: Path) -> str | None:
    """``None`` if ``folder`` exists (created if need be, readable by its owner only) and a file
    can be written in it; otherwise why not, in a few words."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".cvae-probe-"):
            pass
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


def use(choice: Choice, environ: Mapping[str, str] = os.environ) -> tuple[Path | None, str | None]:
    """Point JAX at ``choice`` (before the first compilation; an earlier cache of this process is
    dropped first). Returns the folder in use (``None``: none, or JAX's own) and, where the
    folder cannot be used, a one-line warning for the caller to print."""
    if choice.jax_own:
        return None, None
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    folder, warning = choice.folder, None
    if folder is not None and (why := writable(folder)) is not None:
        warning = (
            f"compilation cache {folder} ({choice.source}) cannot be written ({why}); running "
            f"without it (--compilation-cache DIR moves it, --no-compilation-cache turns it off)"
        )
        folder = None
    wanted = None if folder is None else str(folder.resolve())
    if jax.config.jax_compilation_cache_dir != wanted:
        jax.config.update("jax_compilation_cache_dir", wanted)
        compilation_cache.reset_cache()  # a cache opened at another folder is not reused
    if wanted is not None:
        for name, value in THRESHOLDS.items():
            if name.upper() not in environ:
                jax.config.update(name, value)
    return (None if wanted is None else Path(wanted)), warning
