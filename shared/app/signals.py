"""Stopping on a signal, and when to write a checkpoint: :class:`GracefulStop` takes SIGINT and
SIGTERM for a whole run, :class:`Stopped` is what a signal raises where the run cannot wait for a
checkpoint, and :class:`Cadence` is the trainer's ``decide`` (a checkpoint every so many steps or
seconds, and one, then a stop, on a signal).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cvae_rosetta import files


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal at a point that cannot wait for a checkpoint (its final outputs);
    a ``KeyboardInterrupt``, so no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class GracefulStop:
    """SIGINT and SIGTERM for a whole run: the first one asks the trainer to stop after its current
    step, once a checkpoint is written (``stop()`` returns the signal's number, 0 before any).

    Inside :meth:`immediately` (the final outputs, once training is done and checkpointed) a signal
    raises :class:`Stopped` at once instead. A second SIGINT (Ctrl-C again) stops at once anywhere;
    a repeated SIGTERM does not (schedulers and launchers send it again while the run stops).
    """

    def __init__(self) -> None:
        self.signum = 0
        self._immediate = False
        self._previous: dict[int, Any] = {}

    def __call__(self) -> int:
        return self.signum

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signum = signum
        if self._immediate:
            raise Stopped(signum)
        if files.on_terminal():  # someone waits at it; a log gets the one line the stop ends with
            print(
                f"cvae: {signal.Signals(signum).name}: stopping after this step, once a "
                "checkpoint is written (Ctrl-C again to stop at once)",
                file=sys.stderr,
            )

    @contextlib.contextmanager
    def immediately(self) -> Iterator[None]:
        """A block a signal interrupts at once (raising :class:`Stopped`), as one that came
        before it does on entering."""
        if self.signum:
            raise Stopped(self.signum)
        self._immediate = True
        try:
            yield
        finally:
            self._immediate = False

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again after ``jax.distributed.initialize``, in case anything
        replaced them: JAX's preemption service, which would, is turned off before it)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous = signal.signal(sig, self._handle)
                self._previous.setdefault(sig, previous)
        if _PENDING and not self.signum:  # a stop raised where Python had to drop it
            self.signum = _PENDING[0]

    def __enter__(self) -> GracefulStop:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


# The signal :func:`_raise_stopped` raised for, kept: Python drops an exception raised in a
# callback it cannot raise from (a garbage collection callback during an import, say), and the
# run must still stop (:meth:`GracefulStop.install`, :func:`ends_at_once` look here).
_PENDING: list[int] = []


def pending() -> int:
    """The signal a stop was raised for during start-up (kept even where Python dropped the
    exception), 0 if none."""
    return _PENDING[0] if _PENDING else 0


def _raise_stopped(signum: int, frame: Any) -> None:
    _PENDING.append(signum)
    raise Stopped(signum)


def _quiet_unraisable(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """``sys.unraisablehook`` without the traceback of a :class:`Stopped` it had to drop (the
    stop is kept in :data:`_PENDING`)."""

    def unraisable(info: Any) -> None:
        if not isinstance(info.exc_value, Stopped):
            hook(info)

    return unraisable


@contextlib.contextmanager
def sigterm_stops_at_once() -> Iterator[None]:
    """Inside the block SIGTERM raises :class:`Stopped` (as SIGINT raises ``KeyboardInterrupt``),
    so a command that is not inside a :class:`GracefulStop` (start-up, ``cvae export``,
    ``sample``, ...) ends through its ``finally`` blocks and the CLI's one line rather than the
    default action's silent death. A :class:`GracefulStop` inside takes it over while it lasts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    hook, sys.unraisablehook = sys.unraisablehook, _quiet_unraisable(sys.unraisablehook)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = hook
        _PENDING.clear()  # this command's stop is told: a next one in this process starts clean


@contextlib.contextmanager
def ends_at_once(what: str, after: str = "before the first step") -> Iterator[None]:
    """Inside the block, a call into native code that may block for minutes (joining the other
    processes of a distributed run) or imports that a stop must not cut in half (JAX's, whose
    native parts print what they cannot raise), SIGINT or SIGTERM ends the process at once: one
    line (``stopped by SIGTERM while WHAT, AFTER``), status 128 + the signal. Python runs its
    signal handlers only between the main thread's bytecodes, which such a call does not reach;
    the signal's wakeup byte (``signal.set_wakeup_fd``) wakes a thread that ends the process
    instead. The block writes nothing, so there is nothing to finish."""
    if _PENDING:  # a stop raised where Python had to drop it: stop before blocking
        raise Stopped(_PENDING[0])
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    stopping = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda signum, frame: None) for sig in stopping}
    old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def watch() -> None:
        while data := os.read(read, 1):
            if data[0] in stopping:
                name = signal.Signals(data[0]).name
                files.silence_stderr()  # one line: no library's thread may print after it
                files.say(f"cvae: stopped by {name} while {what}, {after}")
                os._exit(128 + data[0])

    watcher = threading.Thread(target=watch, name="cvae-stop-at-once", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write)  # the watcher reads the end of the pipe and returns
        watcher.join(timeout=1)
        os.close(read)


AGREE_EVERY = 10  # in a run of several processes, steps between agreements on stopping and time


class Cadence:
    """``decide`` for the trainer: after step ``t``, whether to write a checkpoint and whether to
    stop. A checkpoint every ``every`` steps or ``seconds`` after the previous one, whichever comes
    first (0: never by that measure), and one when ``stop()`` names a signal, which also stops.

    ``agree`` (a run of several processes:
    :meth:`cvae_rosetta.app.cluster.membership.Cluster.agree`) makes the processes decide alike,
    since a signal may reach only one of them and their clocks differ: every :data:`AGREE_EVERY`
    steps and at every epoch's end, each process's signal and "a checkpoint is late" are reduced to
    their maximum over all processes. ``stopped_by`` is the signal the run stopped for (agreed, so
    the same in every process).
    """

    def __init__(
        self,
        every: int = 0,
        seconds: float = 0.0,
        stop: Callable[[], int] | None = None,
        agree: Callable[..., tuple[int, ...]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.seconds, self.stop, self.agree = every, seconds, stop, agree
        self.clock = clock
        self.last = clock()  # when the latest checkpoint was written (or the run started)
        self.stopped_by = 0

    def __call__(self, step: int, boundary: bool = False) -> tuple[bool, bool]:
        counted = bool(self.every) and step % self.every == 0
        if self.agree is not None and not boundary and step % AGREE_EVERY:
            if counted:  # decided alike without asking: by the step count alone
                self.last = self.clock()
            return counted, False
        now = self.clock()
        signum = self.stop() if self.stop is not None else 0
        late = bool(self.seconds) and now - self.last >= self.seconds
        if self.agree is not None:
            late, signum = self.agree(int(late), signum)
        if signum:
            self.stopped_by = signum
        save = counted or bool(late) or bool(signum)
        if save:
            self.last = now
        return save, bool(signum)
