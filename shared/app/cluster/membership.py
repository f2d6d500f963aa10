"""Where this process stands in a run of several processes, checked before JAX starts, and how
the processes join, agree and go on.

``cvae train --distributed --coordinator HOST:PORT --num-processes P --process-id I`` gives this
process its :class:`Place`: process ``I`` of ``P``, process 0 hosting the coordinator at
``HOST:PORT``. With a run's config it becomes a :class:`Cluster`, which joins the run
(:meth:`Cluster.start`), checks that ``--out`` is one folder for every process
(:meth:`Cluster.check_shared`) and lets the processes agree on when to stop (:meth:`Cluster.agree`):
SIGTERM or SIGINT may reach only some of them, so all stop after the same step and process 0
writes the checkpoint.

The cluster a scheduler describes (:func:`detect`) gives what no flag gives. A batch scheduler
starts the same command on every host and tells each process, in its environment, where it
stands; :func:`detect` reads that environment as JAX's own cluster detection
(``jax.distributed.initialize()`` with no arguments) reads it, before JAX starts, so that the run
can say what it found, check it, and refuse what cannot run:

- **SLURM** (``srun``, or ``sbatch`` with ``srun`` inside): ``SLURM_JOB_ID``,
  ``SLURM_STEP_NODELIST``, ``SLURM_NTASKS``, ``SLURM_PROCID`` and ``SLURM_LOCALID``. The
  coordinator is the step's first node, on a port derived from the job id.
- **Open MPI** (``mpirun``): ``OMPI_MCA_orte_hnp_uri``, ``OMPI_COMM_WORLD_SIZE`` and
  ``OMPI_COMM_WORLD_RANK``. The coordinator is the launcher's address, on a port derived from the
  job id.
- **Kubernetes** and **Cloud TPU** describe their cluster through their own services (the
  Kubernetes API, the TPU metadata server), which only JAX's detection reads: there the flags are
  given (a JobSet gives every pod the values they need; docs/clusters.md shows one).

The ports follow JAX's: every process of a job computes the same one, in
``[61440, 65535]``. Flags given explicitly win over what is found, field by field.

A run of several processes resumes as itself: ``cvae launch --num-processes P -- train --resume
RUN`` (or ``--resume RUN`` on every host's line) joins the same number of processes
(:meth:`Place.resuming`; ``config.json`` records it), each reading the checkpoint process 0 wrote;
:func:`resume_command` says the line that does it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

# pmap is left out: its multi-process form wants per-process arrays with a leading local-device axis
# and a different data path; the mesh-based mechanisms run unchanged on a global mesh.
DISTRIBUTED_MECHANISMS = ("sharded", "shard_map")
FLAG_NAMES = ("coordinator", "num_processes", "process_id")  # of a place, as errors name them
SHARED_TOKEN = ".cvae-shared-"  # process 0's token in --out, which every process must see
PROCESSES_KEY = "processes"  # in config.json: the processes a run of several goes on as
LAUNCHED_ENV = "CVAE_LAUNCHED"  # set by cvae launch in every process it starts

PORTS = 2**12  # the ephemeral range JAX derives a job's port in: [65536 - PORTS, 65535]
FIRST_PORT = 65535 - PORTS + 1

SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
OPEN_MPI = ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
# what only JAX's own detection reads: refused with the flags to give instead
ELSEWHERE = {
    "Kubernetes": "KUBERNETES_SERVICE_HOST",
    "Cloud TPU": "TPU_WORKER_HOSTNAMES",
}


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

        from cvae_rosetta.app import devices

        config = self.config
        devices.arrange_cpu_devices(config.train.devices // self.num_processes)
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
    environment describes (:func:`detect`); given ones win."""
    if distributed:
        given = (coordinator, num_processes, process_id)
        if None not in given:
            return Place.of(*given)
        found = detect()
        if found is None:
            missing = next(
                name for name, value in zip(FLAG_NAMES, given, strict=True) if value is None
            )
            raise ConfigError(
                f"{missing}: expected a value, or a scheduler's environment that gives it (looked "
                f"for {looked_for()}), got none"
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


# --- going on: the resume command -----------------------------------------------------------------


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


# --- the cluster a scheduler describes ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Found:
    """What a scheduler's environment says of this process: its ``name``, the coordinator's
    ``HOST:PORT``, the number of processes and this one's id."""

    name: str
    coordinator: str
    num_processes: int
    process_id: int

    def describe(self) -> str:
        return (
            f"{self.name}: coordinator {self.coordinator}, process {self.process_id} of "
            f"{self.num_processes}"
        )


def detect(environ: Mapping[str, str] | None = None) -> Found | None:
    """The cluster ``environ`` (default: this process's environment) describes, or None where no
    scheduler's is complete. Refuses, naming the variable, a value that cannot be read."""
    env = os.environ if environ is None else environ
    if all(name in env for name in SLURM):
        return _slurm(env)
    if all(name in env for name in OPEN_MPI):
        return _open_mpi(env)
    for name, variable in ELSEWHERE.items():
        if variable in env:
            raise ConfigError(
                f"coordinator: expected --coordinator HOST:PORT, --num-processes and --process-id "
                f"under {name} ({variable} is set; its cluster is read through its own service, "
                f"see docs/clusters.md), got none"
            )
    return None


def looked_for() -> str:
    """What :func:`detect` looks for, in words for a refusal."""
    return f"SLURM's {', '.join(SLURM)}; Open MPI's {', '.join(OPEN_MPI)}; " + "; ".join(
        f"{name}'s {variable}" for name, variable in ELSEWHERE.items()
    )


def _integer(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    if not value.strip().isdigit():
        raise ConfigError(f"{name}: expected a whole number (the scheduler's), got {value!r}")
    return int(value)


def _slurm(env: Mapping[str, str]) -> Found:
    port = _integer(env, "SLURM_JOB_ID") % PORTS + FIRST_PORT
    return Found(
        "SLURM",
        f"{first_host(env['SLURM_STEP_NODELIST'])}:{port}",
        _integer(env, "SLURM_NTASKS"),
        _integer(env, "SLURM_PROCID"),
    )


def first_host(node_list: str) -> str:
    """The first host of a SLURM node list: ``node001``, ``node001,host2``, ``node[001-015],host2``
    and ``node[001,007-015]`` all give ``node001``."""
    head, bracket, rest = node_list.partition("[")
    if "," in head or not bracket:
        return head.split(",", 1)[0]
    return head + re.split(r"[,-]", rest, maxsplit=1)[0].rstrip("]")


def _open_mpi(env: Mapping[str, str]) -> Found:
    uri = env["OMPI_MCA_orte_hnp_uri"]  # 1531576320.0;tcp://10.96.0.1,10.148.0.1:34911
    job = uri.split(".", 1)[0]
    address = re.search(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]", uri)
    if not job.isdigit() or address is None:
        raise ConfigError(
            f"OMPI_MCA_orte_hnp_uri: expected JOB.STEP;tcp://HOST,...:PORT (Open MPI's), got "
            f"{uri!r}"
        )
    host = next(group for group in address.groups() if group is not None)
    port = int(job) // PORTS % PORTS + FIRST_PORT  # its job ids are multiples of 2**12
    return Found(
        "Open MPI",
        f"{host}:{port}",
        _integer(env, "OMPI_COMM_WORLD_SIZE"),
        _integer(env, "OMPI_COMM_WORLD_RANK"),
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
