"""``cvae launch --num-processes P -- train ...``: a run of several processes tried on one machine.

:func:`launch` starts ``P`` processes of ``cvae train ... --distributed`` on loopback, forwards
their output (each line prefixed ``[i]``, gloo's connection chatter dropped), and stops them all as
soon as one fails, on a timeout, or on Ctrl-C; a SIGTERM it receives it passes on. On a real
cluster, run the same ``cvae train ... --distributed`` line on every host with its own
``--process-id`` and the coordinator's address.

When one process stops on a signal (exit status 130 or 143), the others stop after the same step
(:meth:`cvae_rosetta.app.cluster.membership.Cluster.agree`), so the launcher waits for them too
instead of terminating them. When one is killed, the others notice in their next collective and say
so (:func:`cvae_rosetta.app.cluster.lost.lost_peers`); the launcher gives them :data:`LOST_GRACE`
seconds, then says in one line which process it lost.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cvae_rosetta.app import resources
from cvae_rosetta.app.cluster.membership import LAUNCHED_ENV
from cvae_rosetta.spec.errors import ConfigError

# a process stopped by a signal after its checkpoint (128 + SIGINT, 128 + SIGTERM); the others stop
# after the same step, so the launcher waits for them
STOPPED_STATUSES = {128 + signal.SIGINT, 128 + signal.SIGTERM}
LOST_GRACE = 30.0  # seconds the launcher gives the others, once one is lost, to say so and end
GRACE = 10.0  # seconds a process stopped by the launcher (SIGTERM) has before SIGKILL


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Refusals:
    """The refusals already shown: every process meets the same bad input and says so in the same
    line (``cvae: error: ...``); the launcher shows that line once."""

    def __init__(self) -> None:
        self._shown: set[str] = set()
        self._lock = threading.Lock()

    def first(self, line: str) -> bool:
        if not line.startswith("cvae: error: "):
            return True
        with self._lock:
            seen = line in self._shown
            self._shown.add(line)
        return not seen


# gloo's lines as each process joins its collectives ("[Gloo] Rank 1 is connected to 3 peer ranks.
# Expected number of connected peer ranks is : 3"), written in pieces from several threads, so that
# pieces of several lines may share one line, or one line hold them and other text
_GLOO = re.compile(
    r"\[Gloo\] Rank \d*| is connected to \d*| peer ranks\. "
    r"|Expected number of connected peer ranks is : \d*"
)


def without_chatter(line: str) -> str | None:
    """``line`` without gloo's connection messages: ``None`` where nothing else was on it (the
    numbers of interleaved pieces may be left side by side: digits alone go too)."""
    if not _GLOO.search(line):
        return line
    rest = _GLOO.sub("", line)
    if not rest.strip("0123456789 \n"):
        return None
    return rest


# a line of the runtime's own log (absl's prefix: level, date, time, thread, file:line)
_RUNTIME_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.-]+:\d+\] ")
NOTICE_SECONDS = 0.5  # how long a process killed may take to be seen dead once others notice


def _forward(stream, prefix: str, sink, refusals: _Refusals, lost: Callable[[], bool]) -> None:
    """A process's lines, prefixed. Once a process of the run was killed (``lost()``), only the
    others' own lines (``cvae: ...``) are shown: what the runtime prints as it notices (the
    coordination service's errors and fatal message, several lines each) the process's one line
    says already (:func:`cvae_rosetta.app.cluster.lost.lost_peers`); a process that dies no longer
    prints. A process notices as the killed one's sockets close, a moment before that one can be
    seen dead, so a line of the runtime's log waits up to :data:`NOTICE_SECONDS` for that."""
    for line in iter(stream.readline, ""):
        shown = without_chatter(line)
        if shown is not None and _RUNTIME_LOG.match(shown):
            deadline = time.monotonic() + NOTICE_SECONDS
            while not lost() and time.monotonic() < deadline:
                time.sleep(0.01)
        if shown is None or (lost() and not shown.startswith("cvae")):
            continue
        if refusals.first(shown):
            sink.write(prefix + shown)
            sink.flush()
    stream.close()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return _is_int(value) or isinstance(value, float)


def launch(
    num_processes: int,
    command: Sequence[str],
    *,
    port: int | None = None,
    timeout: float | None = None,
    oversubscribe: bool = False,
    check: Callable[[list[str]], None] | None = None,
) -> int:
    """Run ``cvae COMMAND --distributed ...`` as ``num_processes`` local processes on loopback.
    ``check(command)`` refuses the train command before any process starts, after the launch's
    own checks.

    Returns 0 when every process succeeds, else the status of the first that failed: a process
    killed by a signal counts as 128 + the signal, and the launcher says which process it was
    (124 on timeout). A process that fails otherwise (a refusal) stops the others at once; one that
    is killed gives them :data:`LOST_GRACE` seconds to notice in their next collective and end on
    their own (:func:`cvae_rosetta.app.cluster.lost.lost_peers`). A SIGTERM to the launcher is
    passed on to every process (they stop after the same step, at a checkpoint). Every process is
    stopped (SIGTERM, then SIGKILL after :data:`GRACE` seconds) before returning.
    """
    if not _is_int(num_processes) or num_processes < 1:
        raise ConfigError(f"num_processes: expected an integer >= 1, got {num_processes!r}")
    command = list(command)
    if command[:1] == ["--"]:
        command = command[1:]
    if command[:1] != ["train"]:
        raise ConfigError(
            f"launch: expected a train command after --, as in `cvae launch --num-processes 2 "
            f"-- train --impl pure_jax ...`, got {' '.join(command) or 'nothing'!r}"
        )
    if port is not None and (not _is_int(port) or not 0 < port < 65536):
        raise ConfigError(f"port: expected an integer in [1, 65535], got {port!r}")
    if timeout is not None and (not _is_number(timeout) or not timeout > 0):
        raise ConfigError(f"timeout: expected a number of seconds > 0, got {timeout!r}")
    resources.check_launch(num_processes, oversubscribe=oversubscribe)
    if check is not None:
        check(command)
    coordinator = f"127.0.0.1:{port or free_port()}"
    run = _Launch(num_processes, command, coordinator, grace=GRACE, lost_grace=LOST_GRACE)
    return run.run(timeout)


class _Launch:
    """The processes of one :func:`launch`: started, watched, stopped."""

    def __init__(
        self,
        num_processes: int,
        command: list[str],
        coordinator: str,
        *,
        grace: float,
        lost_grace: float,
    ) -> None:
        self.count, self.command, self.coordinator = num_processes, command, coordinator
        self.grace, self.lost_grace = grace, lost_grace
        self.procs: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        self.ended: list[int] = []  # the processes that ended, in the order they were seen to
        self.lost_since: float | None = None  # when a process was first seen killed
        self.told_at: float | None = None  # when the launcher was told to stop (SIGTERM)
        self.told_by = 0  # the signal that told it

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", LAUNCHED_ENV: "1"}
        refusals = _Refusals()
        for i in range(self.count):
            if self.told_at is not None:  # told to stop: start no more
                break
            argv = [
                *(sys.executable, "-m", "cvae_rosetta.cli", *self.command, "--distributed"),
                *("--coordinator", self.coordinator, "--num-processes", str(self.count)),
                *("--process-id", str(i)),
            ]
            if i:  # the others say nothing unless something goes wrong: no progress bars
                argv.append("--no-progress")
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            self.procs.append(proc)
            for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                args = (stream, f"[{i}] ", sink, refusals, self._lost)
                thread = threading.Thread(target=_forward, args=args, daemon=True)
                thread.start()
                self.threads.append(thread)

    def run(self, timeout: float | None) -> int:
        passed_on = None
        if threading.current_thread() is threading.main_thread():
            passed_on = signal.signal(signal.SIGTERM, self._pass_on)
        said = ""
        try:
            self.start()
            status, said = self.wait(timeout)
        except KeyboardInterrupt:
            status = 130
        finally:
            if passed_on is not None:
                signal.signal(signal.SIGTERM, passed_on)
            overdue = self.told_at is not None and time.monotonic() - self.told_at > self.grace
            _stop(self.procs, self.grace, kill=self.lost_since is not None or overdue)
            for t in self.threads:
                t.join(timeout=5)
        if said:  # after every line of the processes
            print(f"cvae launch: {said}", file=sys.stderr)
        return status

    def _lost(self) -> bool:
        """Whether a process was killed by a signal (a process of the run is lost)."""
        return any(p.poll() is not None and p.returncode < 0 for p in self.procs)

    def _pass_on(self, signum: int, frame: Any) -> None:
        if self.told_at is None:
            self.told_at, self.told_by = time.monotonic(), signum
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def wait(self, timeout: float | None) -> tuple[int, str]:
        """Until every process ended, or one failed, or the timeout: the status and what to say."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done():
            if deadline is not None and time.monotonic() > deadline:
                return 124, f"timed out after {timeout:g} s"
            time.sleep(0.05)
        return self._status()

    def _done(self) -> bool:
        for i, p in enumerate(self.procs):
            if p.poll() is not None and i not in self.ended:
                self.ended.append(i)
                if p.returncode < 0 and self.lost_since is None:
                    self.lost_since = time.monotonic()
        if len(self.ended) == len(self.procs) and (
            len(self.procs) == self.count or self.told_at is not None
        ):
            return True
        if self.told_at is not None and time.monotonic() - self.told_at > self.grace:
            return True  # told to stop, and some did not within the grace: _stop ends them
        if self.lost_since is not None:  # the others notice in their next collective
            return time.monotonic() - self.lost_since > self.lost_grace
        codes = {self.procs[i].returncode for i in self.ended} - {0}
        return not codes <= STOPPED_STATUSES  # a stop: the others stop after the same step

    def _status(self) -> tuple[int, str]:
        """The status of the first process killed by a signal (128 + the signal) and a line
        naming it, else of the first that failed, else 0."""
        codes = {i: self.procs[i].returncode for i in self.ended}
        killed = [i for i in self.ended if codes[i] < 0]
        failed = [i for i in self.ended if codes[i] != 0]
        if not killed and self.told_by:  # told to stop: that signal's status, whoever ran
            return (codes[failed[0]] if failed else 128 + self.told_by), ""
        if not killed:
            return (codes[failed[0]], "") if failed else (0, "")
        first, signum = killed[0], -codes[killed[0]]
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        left = sum(p.poll() is None for p in self.procs)
        after = f"; stopped the {left} still running after {self.lost_grace:g} s" if left else ""
        return 128 + signum, f"process {first} of {self.count} was killed by {name}{after}"


def _stop(procs: list[subprocess.Popen], grace: float, *, kill: bool = False) -> None:
    """End every process still running: SIGTERM (they stop at a checkpoint), SIGKILL after
    ``grace`` seconds; ``kill``: SIGKILL at once (a run that lost a process can write none)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
