"""The cluster a scheduler describes: where ``--distributed`` finds its coordinator, process count
and process id when no flag gives them.

A batch scheduler starts the same command on every host and tells each process, in its
environment, where it stands. :func:`detect` reads that environment as JAX's own cluster
detection (``jax.distributed.initialize()`` with no arguments) reads it, before JAX starts, so
that the run can say what it found, check it, and refuse what cannot run:

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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cvae_rosetta.spec.errors import ConfigError

PORTS = 2**12  # the ephemeral range JAX derives a job's port in: [65536 - PORTS, 65535]
FIRST_PORT = 65535 - PORTS + 1

SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
OPEN_MPI = ("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
# what only JAX's own detection reads: refused with the flags to give instead
ELSEWHERE = {
    "Kubernetes": "KUBERNETES_SERVICE_HOST",
    "Cloud TPU": "TPU_WORKER_HOSTNAMES",
}


@dataclass(frozen=True)
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
