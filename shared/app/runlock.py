"""The one process writing a run directory: an exclusive ``flock`` on ``RUN/run.lock``
(:class:`RunLock`), and the check a reader makes before it reads a run another process may be
writing (:func:`refuse_if_held`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.spec.errors import OutputError

LOCK_FILE = "run.lock"  # flocked by the one process writing the directory; names it (RunLock)


class RunLock:
    """The one process writing a run directory: an exclusive ``flock`` on ``RUN/run.lock``, held
    from the first write of ``cvae train`` (or ``--resume``, or ``cvae evaluate``) to its end.

    The file holds the holder's record (pid, host, since when, command) while it is held and is
    removed when released, so a run that ended (finished, refused or stopped) leaves none: the
    holder unlinks it while still holding the lock, and a process that locks a file checks that
    the path still names that very file (else it was released meanwhile, and it locks afresh), so
    two processes never hold two different ``run.lock`` files. The kernel drops the lock of a
    process that dies (SIGKILL leaves the file), so a record left behind by a killed run is taken
    over, with a warning naming it. Where the file system cannot lock files, the record alone
    decides: a record of a live process on this host (or of any other host) refuses.
    """

    ATTEMPTS = 20  # locks of a file released between its open and its flock, before giving up

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path, self._descriptor = path, descriptor

    @classmethod
    def acquire(cls, directory: Path, *, command: str, field: str) -> RunLock:
        """Lock ``directory`` or refuse at once, naming the holder (``field`` leads the message)."""
        path = Path(directory) / LOCK_FILE
        for _ in range(cls.ATTEMPTS):
            with files.writing(LOCK_FILE, path):
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                held = cls._lock(descriptor)
            except BaseException:
                os.close(descriptor)
                raise
            if held is False or _same_file(descriptor, path):
                break
            os.close(descriptor)  # released and removed since it was opened: open it afresh
        else:
            raise OutputError(
                f"{field}: could not lock {path}: it was removed {cls.ATTEMPTS} times"
            )
        return cls._claim(path, descriptor, held, command=command, field=field)

    @classmethod
    def _claim(
        cls, path: Path, descriptor: int, held: bool | None, *, command: str, field: str
    ) -> RunLock:
        """Write this process's record into the lock file ``descriptor`` locked (``held``), or
        refuse naming its holder."""
        directory = path.parent
        try:
            previous = _read_holder(descriptor)
            if held is None and previous and _alive(previous):
                held = False  # no file locks here: the record of a live process refuses
            if held is False:
                raise OutputError(
                    f"{field}: expected a run directory no other process is writing, got "
                    f"{directory}, held by {describe_holder(previous)}"
                )
            if previous:
                state = "no longer running" if _dead_here(previous) else "no longer holding it"
                print(
                    f"cvae: warning: took over {path} from {describe_holder(previous)}, {state}",
                    file=sys.stderr,
                )
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": command,
            }
            with files.writing(LOCK_FILE, path):
                _write_holder(descriptor, json.dumps(record) + "\n")
        except BaseException:
            os.close(descriptor)
            raise
        return cls(path, descriptor)

    @staticmethod
    def _lock(descriptor: int) -> bool | None:
        """True: locked; False: another process holds it; None: this file system cannot lock."""
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as err:
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise
        return True

    def release(self) -> None:
        """Remove the lock file (while holding it: see the class) and drop the lock."""
        if self._descriptor < 0:
            return
        with contextlib.suppress(OSError):  # a full disk cannot refuse a truncation
            os.ftruncate(self._descriptor, 0)
        with contextlib.suppress(OSError):  # gone or not ours to remove: emptied all the same
            if _same_file(self._descriptor, self.path):
                self.path.unlink()
        os.close(self._descriptor)  # drops the flock
        self._descriptor = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _same_file(descriptor: int, path: Path) -> bool:
    """The open file ``descriptor`` is still the one ``path`` names."""
    try:
        opened, named = os.fstat(descriptor), os.stat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def refuse_if_held(directory: Path, *, field: str) -> None:
    """Refuse, naming its holder, a run directory another live process holds (a run still being
    written), without taking the lock: for a reader that checks before it reads."""
    path = Path(directory) / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody holds it
    try:
        holder = _read_holder(descriptor)
        held = RunLock._lock(descriptor)
    finally:
        os.close(descriptor)  # drops the lock this check may have taken
    if held is True or (held is None and not (holder and _alive(holder))):
        return  # nobody holds it (where files cannot be locked, no live process's record)
    raise OutputError(
        f"{field}: expected a run directory no other process is writing, got {directory}, held "
        f"by {describe_holder(holder)}"
    )


def _read_holder(descriptor: int) -> dict[str, Any]:
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _write_holder(descriptor: int, text: str) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, text.encode(), 0)
    os.fsync(descriptor)


def _dead_here(holder: dict[str, Any]) -> bool:
    """The holder ran on this host and its process is gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, someone else's
    return False


def _alive(holder: dict[str, Any]) -> bool:
    return not _dead_here(holder) and holder.get("pid") != os.getpid()


def describe_holder(holder: dict[str, Any]) -> str:
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since "
        f"{holder.get('since', '?')} ({holder.get('command', '?')})"
    )
