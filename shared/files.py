"""Atomic writes that respect the umask: the one way this project writes a file or a directory.

:func:`atomic_write` writes to a temporary file in the target's own directory, flushes and
``fsync``s it, renames it over the target with ``os.replace`` and then ``fsync``s the directory
(where the platform allows), so a reader, a crash or an interrupted write sees either the old file
or the new one, never half of one; on any failure the temporary is removed and the old file is left
as it was. The temporary is created with mode ``0o666`` through ``os.open``, so the kernel applies
the process's umask exactly as it does for ``open(path, "w")`` (``0o666 & ~umask``, e.g. 0o644
under umask 022), not the private 0o600 of ``tempfile.mkstemp``. A replaced file takes that mode
too; it does not keep the old file's.

:func:`atomic_directory` does the same for a directory filled in one go: a temporary directory
beside the target (mode ``0o777 & ~umask``, not ``tempfile.mkdtemp``'s 0o700), renamed into place
once the caller's block finishes, removed if it fails.

It imports nothing of the project, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o666  # before the umask, as open(path, "w") creates files
DIRECTORY_MODE = 0o777  # before the umask, as os.mkdir creates directories


def _temporary_name(target: Path) -> Path:
    """A hidden, unguessable sibling of ``target``: ``.NAME.PID.RANDOM.tmp``."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where directories can be opened and synced."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some file systems (and platforms) cannot sync a directory; the rename stands
    finally:
        os.close(descriptor)


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any], *, parents: bool = False
) -> Path:
    """Call ``write`` on a binary file that becomes ``path`` only once it has all been written.

    ``parents`` creates missing parent directories first (with the umask's mode). Returns ``path``
    as a :class:`~pathlib.Path`. Whatever ``write`` or the file system raises propagates, with the
    temporary removed and any previous ``path`` untouched.
    """
    target = Path(path)
    if parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_name(target)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)
    return target


def write_bytes(path: str | os.PathLike[str], data: bytes, *, parents: bool = False) -> Path:
    """``data`` as the whole of ``path``, atomically."""
    return atomic_write(path, lambda handle: handle.write(data), parents=parents)


def write_text(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", parents: bool = False
) -> Path:
    """``text`` as the whole of ``path`` (encoded, newlines as given), atomically."""
    return write_bytes(path, text.encode(encoding), parents=parents)


def write_json(
    path: str | os.PathLike[str],
    data: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    newline: bool = True,
    parents: bool = False,
) -> Path:
    """``json.dumps(data, indent=indent, sort_keys=sort_keys)`` (plus ``"\\n"`` if ``newline``) as
    ``path``, atomically. NaN and infinities are written as ``json`` writes them (``NaN``,
    ``Infinity``). Data that cannot be serialised raises before any file is touched."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys)
    return write_text(path, text + "\n" if newline else text, parents=parents)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a new empty directory to fill; when the block ends without an error it becomes
    ``path``.

    The temporary directory is made beside ``path`` (parents created), with mode
    ``0o777 & ~umask``. At the end an existing empty directory at ``path`` is replaced; a non-empty
    one only with ``overwrite`` (removed with its contents first), otherwise the ``OSError``
    (directory not empty) propagates. If the block fails, the temporary directory and everything
    in it are removed and ``path`` is left as it was (with ``overwrite``, only the rename itself,
    after the old directory is removed, can fail with neither in place).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_name(target)
    os.mkdir(temporary, DIRECTORY_MODE)  # the kernel applies the umask, as for any mkdir
    try:
        yield temporary
        _fsync_directory(temporary)
        if target.exists():
            if overwrite and target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.rmdir()  # empty, or the error says why not
        os.replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _fsync_directory(target.parent)
