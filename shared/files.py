"""Atomic writes that respect the umask: the way this project writes a file or a directory (but
a checkpoint's ``cvae_files.json``, inside a folder Orbax's rename commits, and a run's token,
written into ``--out`` and deleted once every process has seen it).

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

A write the disk refuses (full, read-only, over quota) inside :func:`writing` becomes
:class:`WriteFailed`, naming the file and what was being written, whether the error came from
Python or wrapped by a library (Orbax, TensorStore).

It imports nothing of the project, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
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


@contextlib.contextmanager
def closed_after(*things: Any) -> Iterator[None]:
    """Close ``things`` (those not None) when the block ends. Where the block fails, its failure is
    the one raised: a close that fails after it is dropped (a full disk fails the close of a file
    whose write it failed, since the close writes the buffer again)."""
    things = tuple(thing for thing in things if thing is not None)
    try:
        yield
    except BaseException:
        for thing in things:
            with contextlib.suppress(Exception):
                thing.close()
        raise
    for thing in things:
        thing.close()


# --- a write the disk refuses ---------------------------------------------------------------------

# errno values that mean the disk, not the program: full, read-only, over quota
DISK_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT)
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # how TensorStore (under Orbax) reports one


class WriteFailed(Exception):
    """A write into a run directory failed because of the disk (full, read-only, over quota).

    Not one of the project's refusals (``CvaeError``): the input was fine, so the CLI ends with its
    own exit status. ``workdir`` is the run directory, set once known."""

    def __init__(self, path: Path, what: str, reason: str, workdir: Path | None = None) -> None:
        super().__init__(f"{path}: could not write {what}: {reason}")
        self.path, self.what, self.reason, self.workdir = Path(path), what, reason, workdir


def disk_error(err: BaseException) -> int | None:
    """The errno of :data:`DISK_ERRNOS` behind ``err`` (itself, its causes, or the text of an error
    wrapped by Orbax or TensorStore), or None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
            return err.errno
        code = _OS_ERROR_CODE.search(str(err))
        if code and int(code.group(1)) in DISK_ERRNOS:
            return int(code.group(1))
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def writing(what: str, path: Path) -> Iterator[None]:
    """Turn a disk error raised in the block into :class:`WriteFailed` naming ``path`` (or the
    file the error names) and ``what`` was being written; anything else passes unchanged."""
    try:
        yield
    except WriteFailed:
        raise
    except Exception as err:
        number = disk_error(err)
        if number is None:
            raise
        where = getattr(err, "filename", None)
        raise WriteFailed(
            _target_of(Path(where)) if where else Path(path), what, os.strerror(number)
        ) from err


def _target_of(path: Path) -> Path:
    """The file a temporary of :func:`atomic_write` was to become, or ``path`` itself."""
    temporary = re.fullmatch(r"\.(.+)\.\d+\.[0-9a-f]{8}\.tmp", path.name)
    return path.with_name(temporary.group(1)) if temporary else path


@contextlib.contextmanager
def stderr_held() -> Iterator[None]:
    """Hold what the block writes to file descriptor 2 (threads and C code included) and write it
    out after, unless the block fails with a disk error: a library that fails to write (Orbax,
    TensorStore) logs and prints tracebacks from its threads, which :class:`WriteFailed` sums up
    in one line. Its threads go on after the failure (TensorStore's writes still in flight call
    back into Orbax's event loop, closed by then, and print ``RuntimeError: Event loop is closed``
    at any moment), so after a disk error file descriptor 2 stays silenced for the rest of the
    process (:func:`silence_stderr`), where it is the process's own: :func:`say` still reaches it.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failure: BaseException | None = None
        try:
            yield
        except BaseException as err:
            failure = err
            raise
        finally:
            sys.stderr.flush()
            failed = failure is not None and disk_error(failure) is not None
            if failed and _own_stderr():
                _silence(saved)  # what the failed library's threads print from now on goes too
            else:
                os.dup2(saved, 2)
                os.close(saved)
            if not failed:
                held.seek(0)
                text = held.read()
                if text:
                    sys.stderr.flush()
                    os.write(2, text)


# the process's own stderr, kept once silence_stderr sent file descriptor 2 to the null device
_REAL_STDERR: list[int] = []


def _own_stderr() -> bool:
    """Whether ``sys.stderr`` is the process's own (file descriptor 2), not a test's capture."""
    return sys.__stderr__ is not None and sys.stderr is sys.__stderr__


def _silence(real: int) -> None:
    """File descriptor 2 to the null device; ``real`` (a descriptor of the process's stderr, now
    owned here) kept for :func:`say`, or closed if one is kept already."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    if _REAL_STDERR:
        os.close(real)
    else:
        _REAL_STDERR.append(real)


# How to go on after a command stopped before it claimed a run directory (the CLI says it without
# importing the application, which a stop during start-up may have left half imported).
RUN_AGAIN = (
    "run the same command, adding --overwrite if its output directory is then refused as not empty"
)


def native_stdout(*, to_stderr: bool) -> None:
    """Point file descriptor 1 at stderr (``to_stderr``) or the null device for the rest of the
    process, ``sys.stdout`` going on to the real stdout through a copy of it: what native code
    prints there (gloo's "[Gloo] Rank 0 is connected to 1 peer ranks") is not the command's
    output. Only where ``sys.stdout`` is the process's own (file descriptor 1), not a test's
    capture, and once."""
    if sys.__stdout__ is None or sys.stdout is not sys.__stdout__ or _REAL_STDOUT:
        return
    sys.stdout.flush()
    real = os.dup(1)
    target = os.dup(2) if to_stderr else os.open(os.devnull, os.O_WRONLY)
    os.dup2(target, 1)
    os.close(target)
    _REAL_STDOUT.append(real)
    sys.stdout = open(real, "w", buffering=1, encoding=sys.__stdout__.encoding, closefd=False)  # noqa: SIM115


_REAL_STDOUT: list[int] = []


def silence_stderr() -> None:
    """Send file descriptor 2 to the null device for the rest of the process: what a failed
    library's threads still print while the process ends is not the process's to say (only when
    the process's own stderr is in place, not a test's capture). The process's own last line goes
    through :func:`say`, which writes to a copy of the real stderr kept here."""
    if _own_stderr() and not _REAL_STDERR:
        sys.stderr.flush()
        _silence(os.dup(2))


def on_terminal(stream: Any = None) -> bool:
    """Whether a progress bar belongs on ``stream`` (default: stderr as it is now): a terminal, or
    a notebook (where tqdm draws a widget). Anywhere else (a file, a pipe, a CI log) its
    carriage-return frames would pile up, so the run prints plain lines there instead; so does a
    terminal that says it has no columns."""
    from tqdm.asyncio import tqdm as console
    from tqdm.auto import tqdm

    if tqdm is not console:  # tqdm.auto chose the notebook's widget
        return True
    stream = sys.stderr if stream is None else stream
    try:
        if not stream.isatty():
            return False
        # a pseudo-terminal of no columns (``script -qc``, some CI "tty" modes) draws no bar
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # no isatty or fileno, closed, no size
        return False


def say(line: str) -> None:
    """``line`` (and a newline) on the process's stderr: where :func:`silence_stderr` kept it
    once it silenced file descriptor 2, else on ``sys.stderr``."""
    if not _REAL_STDERR:
        print(line, file=sys.stderr, flush=True)
        return
    data = (line + "\n").encode(sys.stderr.encoding or "utf-8", "backslashreplace")
    while data:
        data = data[os.write(_REAL_STDERR[0], data) :]
