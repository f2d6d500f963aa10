"""Several processes, one run: ``jax.distributed`` and a launcher for trying it on one machine.

``cvae train --distributed --coordinator HOST:PORT --num-processes P --process-id I`` joins process
``I`` of ``P`` to the run; process 0 hosts the coordinator at ``HOST:PORT``. Every process builds
the same global mesh over all processes' devices, computes the same shuffled epoch, and puts only
its own rows of each global batch on its own devices (``Plan.place_rows``), so the step is the
single-process ``sharded`` or ``shard_map`` step over a bigger mesh. Only process 0 writes outputs.
On CPU, collectives go through gloo, and each process arranges ``devices / P`` host devices.

:func:`launch` (``cvae launch --num-processes P -- train ...``) starts ``P`` such processes on
loopback, forwards their output (each line prefixed ``[i]``, gloo's connection chatter dropped), and
stops them all as soon as one fails, on a timeout, or on Ctrl-C; a SIGTERM it receives it passes
on. On a real cluster, run the same ``cvae train ... --distributed`` line on every host with its
own ``--process-id`` and the coordinator's address.

SIGTERM or SIGINT may reach only some processes: they agree every few steps on whether to stop
(:meth:`Cluster.agree`), so all stop after the same step and process 0 writes the checkpoint. When
one process stops that way (exit status 130 or 143), the launcher waits for the others to stop too
instead of terminating them.

A run of several processes resumes as itself: ``cvae launch --num-processes P -- train --resume
RUN`` (or ``--resume RUN`` on every host's line) joins the same number of processes
(:meth:`Place.resuming`; ``config.json`` records it), each reading the checkpoint process 0 wrote.

A process that dies (SIGKILL, a crashed host) breaks the next collective of the others:
:func:`lost_peers` turns that ``jax.errors.JaxRuntimeError`` into one line naming the lost process,
the last checkpoint and the command that goes on from it, and ends the process at once (the
shutdown ``jax.distributed`` runs at exit would wait for the lost process, then abort with a stack
trace). The launcher gives the others :data:`LOST_GRACE` seconds to say so and end, and says in
one line which process it lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app import resources, schedulers
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

# pmap is left out: its multi-process form wants per-process arrays with a leading local-device axis
# and a different data path; the mesh-based mechanisms run unchanged on a global mesh.
DISTRIBUTED_MECHANISMS = ("sharded", "shard_map")
# a process stopped by a signal after its checkpoint (128 + SIGINT, 128 + SIGTERM); the others stop
# after the same step, so the launcher waits for them
STOPPED_STATUSES = {128 + signal.SIGINT, 128 + signal.SIGTERM}
FLAG_NAMES = ("coordinator", "num_processes", "process_id")  # of a place, as errors name them
SHARED_TOKEN = ".cvae-shared-"  # process 0's token in --out, which every process must see
PROCESSES_KEY = "processes"  # in config.json: the processes a run of several goes on as
LAUNCHED_ENV = "CVAE_LAUNCHED"  # set by cvae launch in every process it starts
LOST_STATUS = 2  # the exit status of a process whose run lost another process
LOST_GRACE = 30.0  # seconds the launcher gives the others, once one is lost, to say so and end
GRACE = 10.0  # seconds a process stopped by the launcher (SIGTERM) has before SIGKILL


@dataclasses.dataclass(frozen=True)
class Place:
    """This process's place in a run of several processes, checked before JAX starts: process
    ``process_id`` of ``num_processes``, process 0 hosting the coordinator at ``coordinator``
    (``HOST:PORT``). :meth:`cluster` makes it a :class:`Cluster` of a new run, :meth:`resuming`
    one of a run it goes on with."""

    coordinator: str
    num_processes: int
    process_id: int
    scheduler: str | None = None  # the scheduler whose environment gave them, where one did

    @classmethod
    def of(cls, coordinator: Any, num_processes: Any, process_id: Any) -> Place:
        host, _, port = str(coordinator or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"coordinator: expected HOST:PORT (for example 127.0.0.1:1234), got {coordinator!r}"
            )
        if not _is_int(num_processes) or num_processes < 1:
            raise ConfigError(f"num_processes: expected an integer >= 1, got {num_processes!r}")
        if not _is_int(process_id) or not 0 <= process_id < num_processes:
            raise ConfigError(
                f"process_id: expected an integer in [0, {num_processes}), got {process_id!r}"
            )
        return cls(str(coordinator), num_processes, process_id)

    def cluster(self, config: Config, *, devices_given: bool) -> Cluster:
        """The cluster of a run of ``config``; ``devices_given``: ``train.devices`` was set on
        purpose (otherwise each process brings one device)."""
        if config.train.data_parallel not in DISTRIBUTED_MECHANISMS:
            raise ConfigError(
                f"train.data_parallel: expected one of {', '.join(DISTRIBUTED_MECHANISMS)} with "
                f"a distributed run, got {config.train.data_parallel!r}"
            )
        if not devices_given:
            config = config.replace(train=config.train.replace(devices=self.num_processes))
        cluster = Cluster(
            self.coordinator, self.num_processes, self.process_id, config, self.scheduler
        )
        cluster.check()
        return cluster

    def describe(self) -> str:
        return describe(self)

    def resuming(self, run: Mapping[str, Any], config: Config, directory: Any) -> Cluster:
        """The cluster that goes on with the run in ``directory`` (``run``: its ``config.json``;
        ``config``: its config, with the changes the resume makes): as many processes as the run
        was written by, on the devices its config names."""
        processes = processes_of(run)
        if processes != self.num_processes:
            raise ConfigError(
                f"num_processes: expected {processes}, the processes of the run in {directory} "
                f"(a run goes on as the same number of processes, or in one without "
                f"distributed=True), got {self.num_processes}"
            )
        return self.cluster(config, devices_given=True)


def describe(place: Place | Cluster) -> str:
    """Where this process stands, and who said so: ``process 1 of 2, coordinator
    node001:62077 (from SLURM's environment)``."""
    found = f" (from {place.scheduler}'s environment)" if place.scheduler else ""
    return (
        f"process {place.process_id} of {place.num_processes}, coordinator "
        f"{place.coordinator}{found}"
    )


def processes_of(run: Mapping[str, Any]) -> int:
    """The processes a run directory's ``config.json`` (``run``) was last written by (1 if it
    does not say)."""
    count = run.get(PROCESSES_KEY, 1)
    return count if _is_int(count) and count >= 1 else 1


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where this process stands in a multi-process run."""

    coordinator: str  # HOST:PORT of process 0
    num_processes: int
    process_id: int
    config: Config  # the run's, with one device per process unless --devices said otherwise
    scheduler: str | None = None  # the scheduler whose environment placed it, where one did

    @classmethod
    def create(
        cls, coordinator, num_processes, process_id, config: Config, *, devices_given: bool
    ) -> Cluster:
        place = Place.of(coordinator, num_processes, process_id)
        return place.cluster(config, devices_given=devices_given)

    def describe(self) -> str:
        return describe(self)

    def check(self) -> None:
        """Refuse, before JAX starts, what cannot run across these processes."""
        train = self.config.train
        if train.devices % self.num_processes:
            raise ConfigError(
                f"train.devices: expected a multiple of num_processes ({self.num_processes}: "
                f"every process brings the same number of devices), got {train.devices}"
            )

    def start(self) -> None:
        """Arrange this process's host devices and join the run (blocks until all have joined)."""
        import jax

        from cvae_rosetta.app import parallel

        config = self.config
        parallel.arrange_cpu_devices(config.train.devices // self.num_processes)
        # JAX's preemption service would catch SIGTERM in native code from the connect on, where
        # no Python handler sees it (a process told to stop would train on); the run agrees on
        # stopping itself (Cluster.agree), so SIGTERM stays Python's
        jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(
            coordinator_address=self.coordinator,
            num_processes=self.num_processes,
            process_id=self.process_id,
        )
        if jax.device_count() != config.train.devices:
            raise ConfigError(
                f"train.devices: expected {jax.device_count()} (the devices of all "
                f"{self.num_processes} processes together), got {config.train.devices}"
            )

    def check_shared(self, out: Path) -> None:
        """Refuse, before the first step, an ``out`` that is not one folder for every process
        (node-local disks, or a relative path from different working folders): process 0 writes a
        token into it, every process looks for it after a collective, and they agree on what
        they saw. The token (and the folders it made for it) is removed again either way. Where the
        processes were given different folders, the refusal names each process's."""
        import numpy as np
        from jax.experimental import multihost_utils

        out = Path(out).expanduser()
        number = secrets.randbits(31) if self.process_id == 0 else 0
        made = [] if self.process_id else [d for d in (out, *out.parents) if not d.exists()]
        if self.process_id == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{SHARED_TOKEN}{number}").write_text(self.coordinator)
        # after process 0 wrote it: the broadcast is a collective every process waits in
        number = int(multihost_utils.broadcast_one_to_all(np.asarray(number, np.int32)))
        token = out / f"{SHARED_TOKEN}{number}"
        seen = token.is_file()
        blind = self.agree(
            *(int(i == self.process_id and not seen) for i in range(self.num_processes))
        )
        if self.process_id == 0:
            token.unlink(missing_ok=True)
            for folder in made:  # out, then each parent it took, deepest first
                folder.rmdir()
        if any(blind):
            which = [str(i) for i, flag in enumerate(blind) if flag]
            paths = self._paths(out)
            if len(set(paths)) > 1:
                named = ", ".join(f"process {i} {p}" for i, p in enumerate(paths))
                raise ConfigError(
                    f"out: expected the same folder for every process, got different ones "
                    f"({named}; a relative --out is taken from each process's working folder)"
                )
            raise ConfigError(
                f"out: expected one folder that every process sees, got {out} ({out.resolve()} "
                f"for process {self.process_id}), where process {', '.join(which)} of "
                f"{self.num_processes} does not see what process 0 wrote "
                "(put --out on a filesystem every process sees, as an absolute path where their "
                "working folders differ)"
            )

    def _paths(self, out: Path, room: int = 4096) -> list[str]:
        """Every process's ``out`` as an absolute path (one all-gather of ``room`` bytes each)."""
        import numpy as np
        from jax.experimental import multihost_utils

        mine = np.zeros(room, np.uint8)
        encoded = os.fsencode(out.absolute())[:room]
        mine[: len(encoded)] = np.frombuffer(encoded, np.uint8)
        gathered = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, room)
        return [os.fsdecode(bytes(row).rstrip(b"\0")) for row in gathered]

    def agree(self, *values: int) -> tuple[int, ...]:
        """Each value's maximum over all processes (one small all-gather): how the processes
        agree to stop, or to write a checkpoint, when only some of them know
        (:class:`cvae_rosetta.app.signals.Cadence`). Every process must call it at the same
        point."""
        import numpy as np
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.asarray(values, np.int32))
        return tuple(int(v) for v in np.asarray(gathered).reshape(-1, len(values)).max(axis=0))


def place_from(
    *,
    distributed: bool,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> Place | None:
    """This process's place in a run of several processes (``None`` for a run of one), checked
    before JAX starts: ``coordinator``, ``num_processes`` and ``process_id`` are given with
    ``distributed`` and only with it. Those not given come from the cluster a scheduler's
    environment describes (:func:`cvae_rosetta.app.schedulers.detect`); given ones win."""
    if distributed:
        given = (coordinator, num_processes, process_id)
        if None not in given:
            return Place.of(*given)
        found = schedulers.detect()
        if found is None:
            missing = next(
                name for name, value in zip(FLAG_NAMES, given, strict=True) if value is None
            )
            raise ConfigError(
                f"{missing}: expected a value, or a scheduler's environment that gives it (looked "
                f"for {schedulers.looked_for()}), got none"
            )
        place = Place.of(
            found.coordinator if coordinator is None else coordinator,
            found.num_processes if num_processes is None else num_processes,
            found.process_id if process_id is None else process_id,
        )
        return dataclasses.replace(place, scheduler=found.name)
    for name, value in (
        ("coordinator", coordinator),
        ("num_processes", num_processes),
        ("process_id", process_id),
    ):
        if value is not None:
            raise ConfigError(f"{name}: expected only with distributed=True, got {value!r}")
    return None


def cluster_from(
    config: Config,
    *,
    distributed: bool,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    devices_given: bool = False,
) -> Cluster | None:
    """This process's place in a new run of several processes (``None`` for a run of one),
    checked before JAX starts (:func:`place_from`). ``devices_given``: ``train.devices`` was set
    on purpose (otherwise each process brings one device)."""
    place = place_from(
        distributed=distributed,
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
    )
    return None if place is None else place.cluster(config, devices_given=devices_given)


# --- going on: the resume command, a lost process -------------------------------------------------


def resume_command(place: Place | Cluster | None) -> Callable[[Any], str]:
    """``run_dir -> the command that goes on with it``: ``cvae train --resume RUN`` for a run of
    one process; ``cvae launch --num-processes P -- train --resume RUN`` for one of several started
    by ``cvae launch``; under a scheduler, the ``--distributed`` line it starts on every host
    again; and otherwise that line with the coordinator flags."""

    def command(run_dir: Any) -> str:
        if place is None:
            return f"cvae train --resume {run_dir}"
        if os.environ.get(LAUNCHED_ENV):
            return f"cvae launch --num-processes {place.num_processes} -- train --resume {run_dir}"
        if place.scheduler:  # the scheduler places every process again
            return (
                f"cvae train --resume {run_dir} --distributed (every process, started by "
                f"{place.scheduler} as this job's were)"
            )
        return (
            f"cvae train --resume {run_dir} --distributed --coordinator {place.coordinator} "
            f"--num-processes {place.num_processes} --process-id I (on every host, each its own I)"
        )

    return command


# what a collective that lost a process raises says (gloo's, the coordination service's)
_LOST = re.compile(
    r"gloo|connection|peer|heartbeat|unavailable|coordinat|barrier|collective|socket", re.I
)
# the runtime's errors start with their status; some reach Python as another type (the all-gather
# of Cluster.agree raises ValueError("UNKNOWN: Gloo AllGather failed: ... Connection closed by
# peer ..."))
_STATUS = re.compile(r"^(?:UNKNOWN|UNAVAILABLE|INTERNAL|ABORTED|CANCELLED|DEADLINE_EXCEEDED): ")


def is_lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because a process of the run is gone: a
    ``jax.errors.JaxRuntimeError`` (or another error with the runtime's status) that says so
    (gloo: ``Gloo all-reduce failed: ... Connection reset by peer``)."""
    import jax

    text = str(error)
    runtime = isinstance(error, jax.errors.JaxRuntimeError) or bool(_STATUS.match(text))
    return runtime and bool(_LOST.search(text))


def _reason(error: BaseException) -> str:
    """The first line of the runtime's error, without its status code and source locations."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    text = re.sub(r"^[A-Z_]+: ", "", text)
    text = re.sub(r"\[[\w./-]+\.(?:cc|h|cpp):\d+\] ", "", text)
    return text if len(text) <= 160 else text[:157] + "..."


def latest_checkpoint(run_dir: Path) -> int | None:
    """The step of the newest committed checkpoint of ``run_dir`` (a directory named by its step;
    one being written has a longer name), ``None`` if none."""
    from cvae_rosetta.app.checkpoint import checkpoints_of

    where = checkpoints_of(run_dir)
    steps = [int(p.name) for p in where.iterdir() if p.name.isdigit()] if where.is_dir() else []
    return max(steps, default=None)


def lost_message(place: Place | Cluster, error: BaseException, run_dir: Any) -> str:
    """The line a process says when its run lost another process: which one (the other one of
    two; of more, the launcher names it), why, the last checkpoint and how to go on."""
    others = place.num_processes - 1
    if others == 1:
        who = f"process {1 - place.process_id} of 2"
    else:
        who = f"one of the other {others} processes of {place.num_processes}"
    line = f"lost {who} ({_reason(error)})"
    step = latest_checkpoint(Path(run_dir))
    if step is None:
        return (
            f"{line}; the run stopped before its first checkpoint: start it again (with "
            "--overwrite)"
        )
    from cvae_rosetta.app.checkpoint import checkpoints_of

    where = checkpoints_of(Path(run_dir))
    return (
        f"{line}; the last checkpoint, step {step}, is in {where}; go on with: "
        f"{resume_command(place)(run_dir)}"
    )


def _end_now(status: int) -> None:
    """End the process at once: its output flushed, and neither ``jax.distributed``'s shutdown
    (which waits for every process, the lost one too, then aborts) nor any thread heard from."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@contextlib.contextmanager
def lost_peers(place: Place | Cluster | None, run_dir: Any) -> Iterator[None]:
    """Around the training of a run of several processes (nothing for one of one process): a
    collective that fails because a process is gone (:func:`is_lost_peer`) prints one line on
    stderr (:func:`lost_message`) and ends this process with :data:`LOST_STATUS` at once, once
    the block's own clean-up (its ``finally`` and ``with`` exits) has run."""
    if place is None:
        yield
        return
    try:
        yield
    except Exception as err:
        if not is_lost_peer(err):
            raise
        # the runtime's threads log the lost peer on file descriptor 2 as the process ends:
        # silenced first, so that none of it lands inside the line (a line of theirs once
        # followed this one's text before its newline)
        line = f"cvae: error: {lost_message(place, err, run_dir)}"
        files.silence_stderr()
        files.say(line)
        _end_now(LOST_STATUS)


# --- the launcher ---------------------------------------------------------------------------------


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
    says already (:func:`lost_peers`); a process that dies no longer prints. A process notices
    as the killed one's sockets close, a moment before that one can be seen dead, so a line of
    the runtime's log waits up to :data:`NOTICE_SECONDS` for that."""
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
    their own (:func:`lost_peers`). A SIGTERM to the launcher is passed on to every process (they
    stop after the same step, at a checkpoint). Every process is stopped (SIGTERM, then SIGKILL
    after :data:`GRACE` seconds) before returning.
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
