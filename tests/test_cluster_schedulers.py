"""``--distributed`` on the schedulers people use: the cluster a scheduler's environment describes,
joined with no coordinator flags, and one run folder for every process.

- :func:`cvae_rosetta.app.cluster.membership.detect` reads SLURM's and Open MPI's environments as
  JAX's own cluster detection reads them (the same coordinator, process count and id); flags given
  win, field by field; without a scheduler the refusal says what was looked for.
- Two local processes given SLURM's environment, and two given Open MPI's, as each scheduler sets
  it, train with no coordinator flags and write parameters equal bit for bit to those of ``cvae
  launch --num-processes 2 -- train`` with the same arguments; a run stopped at ``--max-steps``
  and resumed under SLURM ends bit for bit as the uninterrupted one.
- docs/clusters.md's SLURM batch script, run as written but for what a user edits (a simulated
  ``srun``, the folder of runs and a short run's training flags) and stopped by
  SIGTERM, then submitted again as a new job, resumes the run and ends bit for bit as the
  uninterrupted one.
- docs/clusters.md's two mpirun lines, run as written but for their size (a simulated ``mpirun``
  of two ranks, ``--devices 2``, a short run's flags), are
  stopped by a SIGTERM mpirun passes on, then resumed, ending bit for bit as the uninterrupted run;
  its JobSet, parsed as YAML, gives the run what it needs (a coordinator that pod 0's
  host name and port reach, one pod per process with its index as process id, a shared volume for
  ``--out``, no pod restarted alone, a grace period of its own), and ``cvae`` parses its command and
  the resumed one.
- Two processes whose relative ``--out`` resolves to different folders stop before training, each
  with its joining line and one line of refusal, status 2, nothing written.

The tests that start processes are marked ``faults`` (``tox -e faults``), beside the other runs of
several processes; the rest run in ``unit``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from run_helpers import _group_alive, outputs

from cvae_rosetta.app import checkpoint
from cvae_rosetta.app.cluster import launch, membership
from cvae_rosetta.cli import main
from cvae_rosetta.cli.parser import build_parser
from cvae_rosetta.cli.tiny_runs import WAIT, committed, tmp_of, wait_for
from cvae_rosetta.spec.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
RUN = ["--data-parallel", "shard_map", "--data", "synthetic", "--epochs", "1", "--no-progress"]
RUN += ["--iw-samples", "1", "--no-tensorboard"]


def slurm(job: int, rank: int) -> dict[str, str]:
    """What ``srun --ntasks 2`` sets for task ``rank`` on one node."""
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_STEP_NUM_NODES": "1",
    }


def open_mpi(job: int, rank: int) -> dict[str, str]:
    """What ``mpirun -np 2`` sets for rank ``rank`` (its job ids are multiples of 2**12)."""
    return {
        "OMPI_MCA_orte_hnp_uri": f"{job * 2**12}.0;tcp://127.0.0.1:45123",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
    }


def free_job() -> int:
    """A job id whose port (``membership.FIRST_PORT + job % PORTS``) is free now."""
    for job in random.sample(range(membership.PORTS), 64):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", membership.FIRST_PORT + job))
            except OSError:
                continue
            return job
    raise AssertionError("no free port in the schedulers' range")


# --- the environment, read ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "cluster"),
    [(slurm(1234, 1), "slurm_cluster.SlurmCluster"), (open_mpi(99, 1), "ompi_cluster.OmpiCluster")],
    ids=["slurm", "open_mpi"],
)
def test_a_scheduler_s_cluster_is_read_as_jax_reads_it(monkeypatch, environ, cluster):
    import importlib

    module, name = cluster.split(".")
    jax_cluster = getattr(importlib.import_module(f"jax._src.clusters.{module}"), name)
    for key in [*membership.SLURM, *membership.OPEN_MPI]:
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert jax_cluster.is_env_present()
    found = membership.detect()
    assert found is not None
    assert found.coordinator == jax_cluster.get_coordinator_address(None, None)
    assert found.num_processes == jax_cluster.get_process_count() == 2
    assert found.process_id == jax_cluster.get_process_id() == 1


@pytest.mark.parametrize(
    ("nodes", "first"),
    [
        ("node001", "node001"),
        ("node001,host2", "node001"),
        ("node[001-015],host2", "node001"),
        ("node[001,007-015],host2", "node001"),
        ("gpu[7]", "gpu7"),
    ],
)
def test_the_first_node_of_a_slurm_node_list(nodes, first):
    assert membership.first_host(nodes) == first


def test_no_scheduler_is_none_and_a_bad_value_is_named():
    assert membership.detect({}) is None
    assert membership.detect({"SLURM_JOB_ID": "5"}) is None  # incomplete: not SLURM's
    with pytest.raises(ConfigError, match=r"^SLURM_NTASKS: expected a whole number .*'two'"):
        membership.detect({**slurm(5, 0), "SLURM_NTASKS": "two"})
    with pytest.raises(ConfigError, match=r"^coordinator: .* under Kubernetes"):
        membership.detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def test_flags_win_over_the_scheduler_field_by_field(monkeypatch):
    for key, value in slurm(1234, 1).items():
        monkeypatch.setenv(key, value)
    place = membership.place_from(distributed=True, process_id=0)
    assert (place.coordinator, place.num_processes, place.process_id) == ("localhost:62674", 2, 0)
    assert place.scheduler == "SLURM"
    given = membership.place_from(
        distributed=True, coordinator="10.0.0.1:1234", num_processes=3, process_id=2
    )
    assert (given.coordinator, given.num_processes, given.process_id, given.scheduler) == (
        "10.0.0.1:1234", 3, 2, None
    )  # fmt: skip


def test_without_a_scheduler_the_refusal_says_what_was_looked_for(monkeypatch, capsys, tmp_path):
    for key in [*membership.SLURM, *membership.OPEN_MPI, *membership.ELSEWHERE.values()]:
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "run"
    assert main(["train", "--distributed", *RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("cvae: error: --coordinator: expected a value, or a scheduler's")
    assert "SLURM's SLURM_JOB_ID" in err[0] and "Open MPI's OMPI_MCA_orte_hnp_uri" in err[0]
    assert not out.exists()


def test_print_config_says_which_scheduler_and_what_it_gave(monkeypatch, capsys):
    for key, value in open_mpi(99, 1).items():
        monkeypatch.setenv(key, value)
    assert main(["train", "--distributed", *RUN, "--print-config"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    port = membership.FIRST_PORT + 99  # job 99's (read as JAX reads it: the test above)
    assert last == (
        f"# --distributed: process 1 of 2, coordinator 127.0.0.1:{port} (from Open MPI's "
        "environment)"
    )


# --- two processes, as the scheduler starts them --------------------------------------------------


def run_as(environ: dict[str, str], args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **environ}
    for key in [*membership.SLURM, *membership.OPEN_MPI]:
        if key not in environ:
            env.pop(key, None)
    command = [sys.executable, "-W", "error::DeprecationWarning", "-m", "cvae_rosetta.cli", *args]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, **pipes)


def both(scheduler, args: list[str], cwds: tuple[Path, Path]) -> list[tuple[int, list[str]]]:
    """Processes 0 and 1 of one job under ``scheduler``'s environment; each one's status and
    stderr lines (gloo's chatter dropped, as the launcher drops it). What each printed on stdout
    is kept in :data:`STDOUT`, and holds none of gloo's chatter (file descriptor 1 is not
    stdout's once a process joins: files.native_stdout)."""
    job = free_job()
    procs = [run_as(scheduler(job, rank), args, cwd) for rank, cwd in enumerate(cwds)]
    ended = []
    for proc in procs:
        out, err = outputs(proc, WAIT)
        assert "Gloo" not in out, out
        STDOUT.append(out)
        lines = [line for line in err.splitlines() if launch.without_chatter(line)]
        ended.append((proc.returncode, lines))
    return ended


STDOUT: list[str] = []


def params(run: Path) -> dict[str, np.ndarray]:
    with np.load(run / "params.npz") as stored:
        return {name: stored[name] for name in stored.files}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, np.ndarray]:
    """The parameters of ``cvae launch --num-processes 2 -- train`` with :data:`RUN`."""
    out = tmp_path_factory.mktemp("launched") / "run"
    assert main(["launch", "--num-processes", "2", "--", "train", *RUN, "--out", str(out)]) == 0
    return params(out)


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.faults
@pytest.mark.parametrize("scheduler", [slurm, open_mpi], ids=["slurm", "open_mpi"])
def test_two_processes_under_a_scheduler_equal_cvae_launch_bit_for_bit(
    launched, tmp_path, scheduler
):
    args = ["train", "--distributed", *RUN, "--out", "run"]
    (s0, err0), (s1, err1) = both(scheduler, args, (tmp_path, tmp_path))
    assert (s0, s1) == (0, 0), (err0, err1)
    assert STDOUT[-1] == (  # process 1's one line, where process 0 prints the run's summary
        "cvae: process 1 of 2 done; process 0 wrote the run's outputs in run\n"
    )
    assert STDOUT[-2].startswith("pure_jax on synthetic: ")
    name = "SLURM" if scheduler is slurm else "Open MPI"
    for rank, err in enumerate((err0, err1)):
        assert err[0].startswith(f"cvae: joining the run as process {rank} of 2, coordinator ")
        assert err[0].endswith(f"(from {name}'s environment)"), err
    assert_same(params(tmp_path / "run"), launched)


@pytest.mark.faults
def test_a_run_resumed_under_slurm_ends_as_the_uninterrupted_one(launched, tmp_path):
    stopped = ["train", "--distributed", *RUN, "--max-steps", "3", "--out", "run"]
    ended = both(slurm, stopped, (tmp_path, tmp_path))
    assert [s for s, _ in ended] == [0, 0], ended
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == 3  # ended by --max-steps, written by process 0
    resumed = ["train", "--resume", "run", "--distributed", "--max-steps", "8", "--no-progress"]
    resumed += ["--iw-samples", "1", "--no-tensorboard"]
    ended = both(slurm, resumed, (tmp_path, tmp_path))
    assert [s for s, _ in ended] == [0, 0], ended
    assert_same(params(tmp_path / "run"), launched)


# srun as SLURM starts a job step: SLURM_NTASKS tasks, each with its rank in SLURM_PROCID
SRUN = r"""#!/bin/bash
pids=()
for ((rank = 0; rank < SLURM_NTASKS; rank++)); do
    SLURM_PROCID=$rank SLURM_LOCALID=$rank "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


def batch_script(runs: Path, train: list[str]) -> tuple[str, Path]:
    """docs/clusters.md's SLURM batch script as written, but for what a user edits: the shared
    folder of runs (``/shared/runs/``, here ``runs``) and ``TRAIN=(...)`` (here ``train``); and
    the run's folder it names."""
    page = (ROOT / "docs" / "clusters.md").read_text(encoding="utf-8")
    script = re.search(r"## SLURM\n.*?```bash\n(.*?)```", page, re.DOTALL)[1]
    script, edits = re.subn(r"^RUN=/shared/runs/", f"RUN={runs}/", script, flags=re.MULTILINE)
    script, more = re.subn(
        r"^TRAIN=\(.*\)$", f"TRAIN=({' '.join(train)})", script, flags=re.MULTILINE
    )
    assert (edits, more) == (1, 1), script
    run = re.search(r"^RUN=(\S+)", script, re.MULTILINE)[1]
    return script, Path(run)


def fake_command(bin_dir: Path, name: str, script: str) -> None:
    """``name`` on a PATH that starts with ``bin_dir``: a bash script standing in for it."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(script)
    (bin_dir / name).chmod(0o755)


def assert_resumed(command: list[str], cwd: Path, env: dict[str, str], run: Path, launched) -> None:
    """``command``, the stopped run's resubmission, resumes ``run`` at its last checkpoint and
    ends it with the parameters of the uninterrupted run, ``launched``."""
    at = committed(run)[-1]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    again = subprocess.run(command, cwd=cwd, env=env, timeout=2 * WAIT, **pipes)
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-3000:]
    assert f"resuming {run} at step {at}" in said, said[-3000:]
    assert_same(params(run), launched)


@pytest.mark.faults
def test_the_slurm_batch_script_submitted_again_resumes_the_run(launched, tmp_path):
    """The page's batch script, run as sbatch runs it (a job ID, srun starting two tasks, the
    venv it sources): the first job is stopped by SIGTERM, as ``--signal=TERM@120`` stops it before
    its time limit, sent while it saves step 4 (the processes stop after a step they agree on);
    the same script submitted again, a new job with a new ID, resumes the run where it stopped
    and ends bit for bit as the uninterrupted one."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    (home / "venvs" / "cvae" / "bin").mkdir(parents=True)
    (home / "venvs" / "cvae" / "bin" / "activate").write_text(
        f'export PATH="{Path(sys.executable).parent}:$PATH"\n'
    )
    fake_command(bin_dir, "srun", SRUN)
    script = tmp_path / "cvae.sbatch"
    text, run = batch_script(tmp_path / "runs", [*RUN, "--checkpoint-every", "2"])
    script.write_text(text)
    env = {
        **{k: v for k, v in os.environ.items() if k not in (*membership.SLURM, "VIRTUAL_ENV")},
        "HOME": str(home),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "JAX_PLATFORMS": "cpu",
    }
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    first = subprocess.Popen(
        ["bash", str(script)], cwd=tmp_path, start_new_session=True, **pipes,
        env={**env, **slurm(free_job(), 0), checkpoint.SLOW_SAVE_ENV: "2:4"},
    )  # fmt: skip
    wait_for(first, lambda: tmp_of(run / "checkpoints", 4), "the save of step 4")
    os.killpg(first.pid, signal.SIGTERM)  # the job's tasks, and the batch shell with them
    first.wait(timeout=WAIT)  # the shell (reaped, so that only the tasks keep the group alive)
    deadline = time.monotonic() + WAIT
    while _group_alive(first.pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # the tasks' own exit, after their checkpoint
    _, stopped = outputs(first, WAIT)
    assert " stopped by SIGTERM at " in stopped, stopped[-3000:]  # the processes' agreed step
    assert_resumed(["bash", str(script)], tmp_path, {**env, **slurm(free_job(), 0)}, run, launched)


@pytest.mark.faults
def test_an_out_the_processes_do_not_share_is_refused_before_anything_is_written(tmp_path):
    """A relative --out from two working folders: two folders, each named; process 0 removes
    what it made for its token, the parent folder too."""
    cwds = (tmp_path / "a", tmp_path / "b")
    for cwd in cwds:
        cwd.mkdir()
    args = ["train", "--distributed", *RUN, "--out", "runs/run"]
    ended = both(slurm, args, cwds)
    line = (
        "cvae: error: --out: expected the same folder for every process, got different ones "
        f"(process 0 {cwds[0]}/runs/run, process 1 {cwds[1]}/runs/run; a relative --out is taken "
        "from each process's working folder)"
    )
    for (status, err), cwd in zip(ended, cwds, strict=True):
        assert status == 2, err
        assert len(err) == 2 and "Traceback" not in "\n".join(err), err  # joining, then the line
        assert err[1] == line
        assert list(cwd.iterdir()) == []  # nothing written, process 0's token and runs/ gone


def test_the_resume_command_under_a_scheduler_is_its_line_again(monkeypatch):
    monkeypatch.delenv(membership.LAUNCHED_ENV, raising=False)
    place = membership.Place("localhost:61440", 2, 0, "SLURM")
    assert membership.resume_command(place)("RUN") == (
        "cvae train --resume RUN --distributed (every process, started by SLURM as this job's were)"
    )


# --- Open MPI's mpirun lines, as written ----------------------------------------------------------

# mpirun as Open MPI starts a job on this one host: -np ranks of the command, each with Open MPI's
# variables (the job's id from $MPI_JOB, a multiple of 2**12 as Open MPI numbers jobs); the host
# file must exist; a SIGTERM mpirun gets goes on to every rank, and mpirun exits as its ranks do.
MPIRUN = r"""#!/bin/bash
np="" hostfile=""
while [[ $1 == -* ]]; do
    case $1 in
        -np) np=$2; shift 2 ;;
        --hostfile) hostfile=$2; shift 2 ;;
        -x) export "${2?}"; shift 2 ;;
        *) echo "mpirun (simulated): unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -n $np && -f $hostfile ]] || { echo "mpirun (simulated): -np and a host file" >&2; exit 2; }
pids=()
for ((rank = 0; rank < np; rank++)); do
    OMPI_MCA_orte_hnp_uri="$((MPI_JOB * 4096)).0;tcp://127.0.0.1:45123" \
    OMPI_COMM_WORLD_SIZE=$np OMPI_COMM_WORLD_RANK=$rank OMPI_COMM_WORLD_LOCAL_RANK=$rank "$@" &
    pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
status=0
for pid in "${pids[@]}"; do
    while true; do
        wait "$pid"; code=$?
        kill -0 "$pid" 2>/dev/null || break  # else the trap cut the wait short: wait again
    done
    ((code)) && status=$code
done
exit $status
"""


def mpirun_lines(runs: Path, train: list[str]) -> tuple[str, str]:
    """docs/clusters.md's two mpirun lines (the run, then its resume) as written, but for what a
    user sizes: two ranks instead of four (and ``--devices`` with them), the shared folder of
    runs (here ``runs``) and the training flags a short run needs (``train``, after the page's)."""
    page = (ROOT / "docs" / "clusters.md").read_text(encoding="utf-8")
    section = re.search(r"## Open MPI\n(.*?)\n## ", page, re.DOTALL)[1]
    lines = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    assert len(lines) == 2, lines
    edited = []
    for line in lines:
        line, ranks = re.subn(r"-np 4 ", "-np 2 ", line)
        line, folders = re.subn(r"/shared/runs/", f"{runs}/", line)
        assert (ranks, folders) == (1, 1), line
        edited.append(line.strip())
    first, devices = re.subn(r"--devices 4 ", "--devices 2 ", edited[0])
    assert devices == 1 and first.count("--out ") == 1, first
    return f"{first} {' '.join(train)}", edited[1]


@pytest.mark.faults
def test_the_mpirun_lines_run_stop_on_sigterm_and_resume(launched, tmp_path):
    """The page's mpirun line, run as written (a simulated mpirun of two ranks on this host), is
    stopped by a SIGTERM sent to mpirun alone while the ranks save step 2: mpirun passes it on,
    the ranks stop after the step they agree on (an epoch's end, in a run this short) with its
    checkpoint, status 143. The page's resume line, a new job, goes on from there and ends bit for
    bit as the uninterrupted run."""
    bin_dir = tmp_path / "bin"
    fake_command(bin_dir, "mpirun", MPIRUN)
    (tmp_path / "hosts").write_text("localhost slots=2\n")
    run_line, resume_line = mpirun_lines(tmp_path / "runs", [*RUN[2:], "--checkpoint-every", "2"])
    run = tmp_path / "runs" / "mpi"
    assert f"--out {run}" in run_line and f"--resume {run} " in f"{resume_line} "
    env = {
        **{k: v for k, v in os.environ.items() if k not in membership.OPEN_MPI},
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "JAX_PLATFORMS": "cpu",
    }
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    first = subprocess.Popen(
        ["bash", "-c", f"exec {run_line}"], cwd=tmp_path, start_new_session=True, **pipes,
        env={**env, "MPI_JOB": str(free_job()), checkpoint.SLOW_SAVE_ENV: "1:4"},
    )  # fmt: skip
    wait_for(first, lambda: tmp_of(run / "checkpoints", 2), "the save of step 2")
    os.kill(first.pid, signal.SIGTERM)  # mpirun alone, as a terminal's kill or a scheduler sends it
    _, stopped = outputs(first, WAIT)
    assert first.returncode == 143, stopped[-3000:]
    assert " stopped by SIGTERM at " in stopped, stopped[-3000:]  # the ranks' agreed step
    env["MPI_JOB"] = str(free_job())  # a new job
    assert_resumed(["bash", "-c", resume_line], tmp_path, env, run, launched)


# --- the JobSet, as Kubernetes reads it -----------------------------------------------------------


def jobset() -> dict:
    page = (ROOT / "docs" / "clusters.md").read_text(encoding="utf-8")
    return yaml.safe_load(re.search(r"## Kubernetes.*?```yaml\n(.*?)```", page, re.DOTALL)[1])


def container_command(container: dict) -> list[str]:
    """The ``cvae`` command of the container's ``bash -c`` line (after its ``pip install``), which
    the shell runs with ``exec``: the shell, the container's first process, gives its place to
    ``cvae``, so Kubernetes's SIGTERM reaches the run (docs/checkpoints.md: a shell does not pass
    it on)."""
    assert container["command"] == ["bash", "-c"], container["command"]
    [line] = container["args"]
    [last] = [part for part in line.split("&&") if "cvae train" in part]
    words = shlex.split(last)
    assert words[:2] == ["exec", "cvae"], last
    return words[2:]


def test_the_jobset_gives_the_run_what_it_needs():
    """docs/clusters.md's JobSet: pod 0's host name (``NAME-JOB-0-0.NAME``, with the JobSet's
    DNS host names on) and a port the container opens as the coordinator; as many pods as
    processes, Indexed, each pod's index as its process id; ``--devices`` counting one device a
    pod; ``--out`` on a volume every pod mounts, a claim of its own; no pod restarted alone (a
    process restarted alone cannot join the others); a grace period of its own above Kubernetes's
    30 s default; and, for the re-run the page describes, the same command with ``--resume`` in
    place of the training flags, as ``cvae``'s parser reads both."""
    spec = jobset()
    assert (spec["apiVersion"], spec["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    name = spec["metadata"]["name"]
    assert spec["spec"]["network"]["enableDNSHostnames"] is True
    [workers] = spec["spec"]["replicatedJobs"]
    assert workers["replicas"] == 1
    job = workers["template"]["spec"]
    pod = job["template"]["spec"]
    assert (job["completionMode"], job["backoffLimit"], pod["restartPolicy"]) == (
        "Indexed", 0, "Never"
    )  # fmt: skip
    assert pod["terminationGracePeriodSeconds"] > 30
    [container] = pod["containers"]
    command = container_command(container)
    args = build_parser().parse_args(command)
    assert args.command == "train" and args.distributed
    assert command[command.index("--process-id") + 1] == "$JOB_COMPLETION_INDEX"
    assert job["parallelism"] == job["completions"] == args.num_processes == args.cfg_devices
    host, port = args.coordinator.rsplit(":", 1)
    assert host == f"{name}-{workers['name']}-0-0.{name}"
    assert int(port) in [p["containerPort"] for p in container["ports"]]
    [mount] = [m for m in container["volumeMounts"] if args.out.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"]
    coordination = ["--distributed", "--coordinator", args.coordinator, "--num-processes"]
    coordination += [str(args.num_processes), "--process-id", "0"]
    resumed = build_parser().parse_args(["train", "--resume", args.out, *coordination])
    assert (resumed.resume, resumed.coordinator) == (args.out, args.coordinator)
