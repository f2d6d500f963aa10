"""Several processes, one run: ``jax.distributed`` and a launcher for trying it on one machine.

``cvae train --distributed --coordinator HOST:PORT --num-processes P --process-id I`` joins process
``I`` of ``P`` to the run; process 0 hosts the coordinator at ``HOST:PORT``. Every process builds
the same global mesh over all processes' devices, computes the same shuffled epoch, and puts only
its own rows of each global batch on its own devices (``Plan.place_rows``), so the step is the
single-process ``sharded`` or ``shard_map`` step over a bigger mesh. Only process 0 writes outputs.
On CPU, collectives go through gloo, and each process arranges ``devices / P`` host devices.

:func:`launch` (``cvae launch --num-processes P -- train ...``) starts ``P`` such processes on
loopback, forwards their output, and stops them all as soon as one fails, on a timeout, or on
Ctrl-C. On a real cluster, run the same ``cvae train ... --distributed`` line on every host with
its own ``--process-id`` and the coordinator's address.

SIGTERM or SIGINT may reach only some processes: they agree every few steps on whether to stop
(:meth:`Cluster.agree`), so all stop after the same step and process 0 writes the checkpoint. When
one process stops that way (exit status 130 or 143), the launcher waits for the others to stop too
instead of terminating them.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

# pmap is left out: its multi-process form wants per-process arrays with a leading local-device axis
# and a different data path; the mesh-based mechanisms run unchanged on a global mesh.
DISTRIBUTED_MECHANISMS = ("sharded", "shard_map")
# a process stopped by a signal after its checkpoint (128 + SIGINT, 128 + SIGTERM); the others stop
# after the same step, so the launcher waits for them
STOPPED_STATUSES = {128 + signal.SIGINT, 128 + signal.SIGTERM}


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where this process stands in a multi-process run."""

    coordinator: str  # HOST:PORT of process 0
    num_processes: int
    process_id: int
    config: Config  # the run's, with one device per process unless --devices said otherwise

    @classmethod
    def create(
        cls, coordinator, num_processes, process_id, config: Config, *, devices_given: bool
    ) -> Cluster:
        host, _, port = str(coordinator or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"coordinator: expected HOST:PORT (for example 127.0.0.1:1234), got {coordinator!r}"
            )
        if not isinstance(num_processes, int) or num_processes < 1:
            raise ConfigError(f"num_processes: expected an integer >= 1, got {num_processes!r}")
        if not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise ConfigError(
                f"process_id: expected an integer in [0, {num_processes}), got {process_id!r}"
            )
        if config.train.data_parallel not in DISTRIBUTED_MECHANISMS:
            raise ConfigError(
                f"train.data_parallel: expected one of {', '.join(DISTRIBUTED_MECHANISMS)} with "
                f"a distributed run, got {config.train.data_parallel!r}"
            )
        if not devices_given:
            config = config.replace(train=config.train.replace(devices=num_processes))
        cluster = cls(str(coordinator), num_processes, process_id, config)
        cluster.check()
        return cluster

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

    def agree(self, *values: int) -> tuple[int, ...]:
        """Each value's maximum over all processes (one small all-gather): how the processes
        agree to stop, or to write a checkpoint, when only some of them know
        (:class:`cvae_rosetta.app.signals.Cadence`). Every process must call it at the same
        point."""
        import numpy as np
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.asarray(values, np.int32))
        return tuple(int(v) for v in np.asarray(gathered).reshape(-1, len(values)).max(axis=0))


def cluster_from(
    config: Config,
    *,
    distributed: bool,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    devices_given: bool = False,
) -> Cluster | None:
    """This process's place in a run of several processes (``None`` for a run of one), checked
    before JAX starts: ``coordinator``, ``num_processes`` and ``process_id`` are given with
    ``distributed`` and only with it. ``devices_given``: ``train.devices`` was set on purpose
    (otherwise each process brings one device)."""
    if distributed:
        return Cluster.create(
            coordinator, num_processes, process_id, config, devices_given=devices_given
        )
    for name, value in (
        ("coordinator", coordinator),
        ("num_processes", num_processes),
        ("process_id", process_id),
    ):
        if value is not None:
            raise ConfigError(f"{name}: expected only with distributed=True, got {value!r}")
    return None


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


def _forward(stream, prefix: str, sink, refusals: _Refusals) -> None:
    for line in iter(stream.readline, ""):
        if refusals.first(line):
            sink.write(prefix + line)
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
    grace: float = 10.0,
) -> int:
    """Run ``cvae COMMAND --distributed ...`` as ``num_processes`` local processes on loopback.

    Returns 0 when every process succeeds, else the first failing exit status (124 on timeout).
    Every process is stopped (SIGTERM, then SIGKILL after ``grace`` seconds) before returning.
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
    coordinator = f"127.0.0.1:{port or free_port()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    threads = []
    refusals = _Refusals()
    for i in range(num_processes):
        argv = [
            sys.executable,
            "-m",
            "cvae_rosetta.cli",
            *command,
            "--distributed",
            "--coordinator",
            coordinator,
            "--num-processes",
            str(num_processes),
            "--process-id",
            str(i),
        ]
        if i:  # the others say nothing unless something goes wrong: no progress bars
            argv.append("--no-progress")
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append(proc)
        for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            prefix = f"[{i}] " if i else ""
            t = threading.Thread(target=_forward, args=(stream, prefix, sink, refusals))
            t.daemon = True
            t.start()
            threads.append(t)
    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            stopping = set(failed) <= STOPPED_STATUSES and None in codes  # the others follow
            if failed and not stopping:
                status = failed[0]
                break
            if all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"cvae launch: timed out after {timeout:g} s", file=sys.stderr)
                status = 124
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = 130
    finally:
        _stop(procs, grace)
        for t in threads:
            t.join(timeout=5)
    return status


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
