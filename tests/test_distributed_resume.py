"""A run of several processes stops, loses a process, and goes on as itself.

- ``cvae launch --num-processes 2 -- train --resume RUN`` continues a two-process run as two
  processes from the checkpoint process 0 wrote, and ends bit for bit where an uninterrupted
  two-process run ends; a plain ``cvae train --resume RUN`` continues it in one process; any other
  number of processes is refused in one line naming both counts.
- A process killed with SIGKILL: the other says so in one line (the lost process, the last
  checkpoint, the resume command) and ends at once; the launcher adds one line naming the process
  and exits 128 + 9; the resume from that checkpoint ends bit for bit as the uninterrupted run.
- The launcher prefixes every process's lines with ``[i]`` and drops gloo's connection chatter; a
  SIGTERM sent to the launcher is passed on to every process, which stop after the same step.

The runs are the fault suite's tiny ones (``tiny_runs.TINY``: 4 epochs of 8 steps) in two
processes of one host device each; a save made slow by ``CVAE_CHECKPOINT_SLOW_SAVE`` holds process
0 at a known step while a signal is sent. The tests that start processes are marked ``faults``
(``tox -e faults``), the others run in ``unit``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import jax
import pytest
from run_helpers import outputs

from cvae_rosetta.app.cluster import launch, lost, membership
from cvae_rosetta.cli import build_parser, main
from cvae_rosetta.cli.tiny_runs import (
    TINY,
    WAIT,
    assert_same_run,
    committed,
    process_of,
    start,
    tmp_of,
    wait_for,
)
from cvae_rosetta.spec.config import Config, TrainConfig

TWO = ["--impl", "pure_jax", *TINY, "--data-parallel", "sharded", "--devices", "2"]
TWO += ["--checkpoint-every", "8"]
GO_ON = ["--checkpoint-every", "8", "--no-progress", "--iw-samples", "1"]  # not kept by the run
GLOO = "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"


def listening(port: int) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def launch_args(*train_args: str) -> list[str]:
    return ["launch", "--num-processes", "2", "--timeout", str(WAIT), "--", "train", *train_args]


def ended(process: subprocess.Popen) -> tuple[int, list[str]]:
    """Wait for a process started with ``new_session`` (killed, with its children, after
    :data:`WAIT` seconds); its exit status and every line it wrote, stdout's then stderr's."""
    out, err = outputs(process, WAIT)
    return process.returncode, (out + err).splitlines()


def assert_launcher_lines(lines: list[str]) -> None:
    """Every line of a process prefixed with its number; the launcher's own named; no gloo."""
    assert lines, lines
    for line in lines:
        assert line.startswith(("[0] ", "[1] ", "cvae launch: ")), lines
        assert "[Gloo]" not in line and "connected peer ranks" not in line, lines


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted two-process run."""
    out = tmp_path_factory.mktemp("reference") / "run"
    status, lines = ended(start(launch_args(*TWO, "--out", str(out)), out.parent, new_session=True))
    assert status == 0, lines
    assert_launcher_lines(lines)
    assert json.loads((out / "config.json").read_text())[membership.PROCESSES_KEY] == 2
    return out


# --- in processes: a stop, a lost process, each resumed -------------------------------------------


@pytest.mark.faults
def test_a_two_process_run_stopped_by_sigterm_goes_on_as_two_processes_bit_for_bit(
    reference, tmp_path
):
    """Before this change the launcher died of the SIGTERM, leaving its processes running, and
    the resume was refused: '--resume: expected a run of one process, got --distributed'."""
    out = tmp_path / "run"
    launcher = start(launch_args(*TWO, "--out", str(out)), tmp_path, slow="1:6", new_session=True)
    wait_for(launcher, lambda: tmp_of(out / "checkpoints", 8), "the save of step 8")
    launcher.send_signal(signal.SIGTERM)  # to the launcher alone: it passes it on
    status, lines = ended(launcher)
    assert status == 143, lines
    assert_launcher_lines(lines)
    command = f"cvae launch --num-processes 2 -- train --resume {out}"
    stopped = [line for line in lines if " stopped by SIGTERM at step 8 " in line]
    assert stopped == [f"[0] cvae: pure_jax stopped by SIGTERM at step 8 (the end of epoch 1), "
                       f"checkpoint written; go on with: {command}"], lines  # fmt: skip
    assert committed(out) == [8]

    one = tmp_path / "one"  # the documented other count: one process, on the run's two devices
    shutil.copytree(out, one)
    status, lines = ended(
        start(["train", "--resume", str(one), *GO_ON], tmp_path, new_session=True)
    )
    assert status == 0, lines
    assert membership.PROCESSES_KEY not in json.loads((one / "config.json").read_text())
    assert_same_run(one, reference)

    resumed = launch_args("--resume", str(out), *GO_ON)
    status, lines = ended(start(resumed, tmp_path, new_session=True))
    assert status == 0, lines
    assert_launcher_lines(lines)
    assert f"[0] pure_jax: resuming {out} at step 8 (the end of epoch 1)" in lines
    run = json.loads((out / "config.json").read_text())
    assert run[membership.PROCESSES_KEY] == 2 and [r["step"] for r in run["resumes"]] == [8]
    assert_same_run(out, reference)


@pytest.mark.faults
@pytest.mark.parametrize("delay", [0.5, 1.0, 2.0])
def test_sigterm_to_the_launch_during_start_up_ends_every_process_in_one_line(tmp_path, delay):
    """SIGTERM to the launcher's process group, as a scheduler or a terminal sends it, at points
    of start-up: while the processes import NumPy and JAX, while they join the coordination
    service, as they compile the first step. Every process is gone within 10 s, the status is
    143, each process says at most one line, and no traceback. Before this change process 0
    printed a traceback and waited in the coordination service's connect, deaf to every signal,
    until it aborted 305 s later (status 134); and a stop inside JAX's import now and then (about
    1 run in 10 under load) printed a traceback's last line before the process's own line."""
    out = tmp_path / "run"
    launcher = start(launch_args(*TWO, "--out", str(out)), tmp_path, new_session=True)
    time.sleep(delay)
    os.killpg(launcher.pid, signal.SIGTERM)
    try:
        stdout, stderr = launcher.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate()
        pytest.fail(f"still running 10 s after SIGTERM at {delay} s")
    time.sleep(0.5)  # the processes' own exit after the launcher's
    try:
        os.killpg(launcher.pid, 0)
        alive = True
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        alive = False
    lines = (stdout + stderr).splitlines()
    assert not alive, f"a process of the launch outlived it: {lines}"
    # 143: stopped by SIGTERM (-15: killed by it before Python could take it; a shell says 143)
    assert launcher.returncode in (143, -signal.SIGTERM), lines
    if lines:  # none where the launcher itself was killed before it could say anything
        assert_launcher_lines(lines)
    assert not any("Traceback" in line or "Exception ignored" in line for line in lines), lines
    for prefix in ("[0] ", "[1] ", "cvae launch: "):
        assert sum(line.startswith(prefix) for line in lines) <= 1, lines


@pytest.mark.faults
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_process_waiting_for_its_peers_stops_at_once_in_one_line(tmp_path, signum):
    """Process 0 of two, started alone, waits in the coordination service's connect for a peer
    that never comes (native code, where Python's handlers do not run): SIGTERM or SIGINT ends it
    within 10 s, one line, status 128 + the signal, nothing written."""
    out = tmp_path / "run"
    port = launch.free_port()
    args = ["train", *TWO, "--out", str(out), "--distributed", "--coordinator",
            f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", "0"]  # fmt: skip
    process = start(args, tmp_path, new_session=True)
    # In the connect once process 0's coordination service listens (a fixed wait was not enough
    # under load: the signal then came during the imports), where a peer would be waited for 5 min
    wait_for(process, lambda: listening(port), "the coordination service to listen")
    time.sleep(1)
    assert process.poll() is None, outputs(process, WAIT)
    told = time.monotonic()
    process.send_signal(signum)
    status, lines = ended(process)
    assert time.monotonic() - told < 10, lines
    assert status == 128 + signum, lines
    name = signal.Signals(signum).name
    assert lines == [f"cvae: stopped by {name} while joining the other 1 process of the run, "
                     "before the first step"], lines  # fmt: skip
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


@pytest.mark.faults
@pytest.mark.parametrize(("killed", "slow"), [(1, "1:6"), (0, "2:6")])
def test_a_lost_process_stops_the_other_in_one_line_and_the_run_goes_on(
    reference, tmp_path, killed, slow
):
    """SIGKILL to one process while process 0 writes a checkpoint (the first, at step 8, when
    process 1 is killed; the second, at step 16, when process 0 is, so that step 8 is the last
    committed). Before this change the other process printed a 40-line traceback ending in
    ``JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: ... Connection reset by peer``, then hung
    in jax.distributed's shutdown until the launcher terminated it."""
    out = tmp_path / "run"
    launcher = start(launch_args(*TWO, "--out", str(out)), tmp_path, slow=slow, new_session=True)
    saving = 8 * int(slow[0])
    wait_for(launcher, lambda: tmp_of(out / "checkpoints", saving), f"the save of step {saving}")
    began = time.monotonic()
    os.kill(process_of(launcher.pid, killed), signal.SIGKILL)
    status, lines = ended(launcher)
    seconds = time.monotonic() - began
    assert status == 128 + signal.SIGKILL, lines
    assert len(lines) <= 3, lines
    assert_launcher_lines(lines)
    survivor = 1 - killed
    said = [line for line in lines if line.startswith(f"[{survivor}] cvae: error: lost ")]
    assert len(said) == 1, lines
    assert said[0].startswith(f"[{survivor}] cvae: error: lost process {killed} of 2 ("), said
    assert said[0].endswith(
        f"); the last checkpoint, step 8, is in {out / 'checkpoints'}; go on with: "
        f"cvae launch --num-processes 2 -- train --resume {out}"
    ), said
    assert lines[-1] == f"cvae launch: process {killed} of 2 was killed by SIGKILL", lines
    assert seconds < launch.LOST_GRACE  # the survivor ended on its own, not stopped
    assert committed(out) == [8]

    status, lines = ended(start(launch_args("--resume", str(out), *GO_ON), tmp_path,
                                new_session=True))  # fmt: skip
    assert status == 0, lines
    assert_same_run(out, reference)


# --- in this process: refusals, messages, the launcher's output ---------------------------------


def _run_of(tmp_path: Path, **extra) -> Path:
    """A run directory as a resume reads it before JAX starts: config.json and checkpoints/."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    config = Config(train=TrainConfig(data_parallel="sharded", devices=2))
    data = {"command": "train", "impl": "pure_jax", "config": config.to_dict(), **extra}
    (run / "config.json").write_text(json.dumps(data))
    return run


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("recorded", "given"), [({"processes": 2}, 3), ({}, 2)])
def test_a_resume_as_another_number_of_processes_is_refused_naming_both(
    tmp_path, capsys, recorded, given
):
    run = _run_of(tmp_path, **recorded)
    before = _files(run)
    flags = ["--distributed", "--coordinator", "127.0.0.1:9", "--num-processes", str(given)]
    assert main(["train", "--resume", str(run), *flags, "--process-id", "0"]) == 2
    err = capsys.readouterr().err.splitlines()
    expected = recorded.get("processes", 1)
    assert err == [
        f"cvae: error: --num-processes: expected {expected}, the processes of the run in {run} (a "
        f"run goes on as the same number of processes, or in one without --distributed), got "
        f"{given}"
    ]
    assert _files(run) == before


def test_a_resume_refuses_distributed_flags_without_distributed(tmp_path, capsys):
    run = _run_of(tmp_path, processes=2)
    assert main(["train", "--resume", str(run), "--num-processes", "2"]) == 2
    assert capsys.readouterr().err == (
        "cvae: error: --num-processes: expected only with --distributed, got 2\n"
    )


GLOO_RESET = (
    "UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read error "
    "[127.0.0.1]:37077: Connection reset by peer"
)


def test_what_a_lost_process_raises_is_told_from_other_errors():
    assert lost.is_lost_peer(jax.errors.JaxRuntimeError(GLOO_RESET))
    # the all-gather of Cluster.agree raises it as a ValueError with the runtime's status
    gather = "UNKNOWN: Gloo AllGather failed: [external/gloo/x.cc:547] Connection closed by peer"
    assert lost.is_lost_peer(ValueError(gather))
    assert not lost.is_lost_peer(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: memory"))
    assert not lost.is_lost_peer(ValueError("peer: expected a shape"))
    assert not lost.is_lost_peer(KeyError("connection"))


def test_the_lost_line_names_the_process_the_checkpoint_and_the_command(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for name in ("8", "16", "24.orbax-checkpoint-tmp-1"):  # a save in progress is no checkpoint
        (run / "checkpoints" / name).mkdir(parents=True)
    error = jax.errors.JaxRuntimeError(GLOO_RESET)
    place = membership.Place("127.0.0.1:1234", 2, 0)
    monkeypatch.setenv(membership.LAUNCHED_ENV, "1")
    assert lost.lost_message(place, error, run) == (
        "lost process 1 of 2 (Gloo all-reduce failed: Read error [127.0.0.1]:37077: Connection "
        f"reset by peer); the last checkpoint, step 16, is in {run / 'checkpoints'}; go on with: "
        f"cvae launch --num-processes 2 -- train --resume {run}"
    )
    monkeypatch.delenv(membership.LAUNCHED_ENV)  # every host runs its own line
    line = lost.lost_message(membership.Place("10.0.0.1:99", 3, 2), error, run)
    assert line.startswith("lost one of the other 2 processes of 3 (Gloo all-reduce failed: ")
    assert line.endswith(
        f"go on with: cvae train --resume {run} --distributed --coordinator 10.0.0.1:99 "
        "--num-processes 3 --process-id I (on every host, each its own I)"
    )
    assert lost.lost_message(place, error, tmp_path / "new").endswith(
        "; the run stopped before its first checkpoint: start it again (with --overwrite)"
    )


def test_a_lost_process_ends_this_one_with_one_line(tmp_path, monkeypatch, capsys):
    ends = []
    monkeypatch.setattr(lost, "_end_now", ends.append)
    place = membership.Place("127.0.0.1:1234", 2, 1)
    cleaned = []
    with lost.lost_peers(place, tmp_path):
        try:
            raise jax.errors.JaxRuntimeError(GLOO_RESET)
        finally:
            cleaned.append(True)  # the block's clean-up runs first
    assert cleaned and ends == [lost.LOST_STATUS]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("cvae: error: lost process 0 of 2 (Gloo all-"), err
    with pytest.raises(ValueError, match="a bug"), lost.lost_peers(place, tmp_path):
        raise ValueError("a bug")
    with pytest.raises(jax.errors.JaxRuntimeError), lost.lost_peers(None, tmp_path):
        raise jax.errors.JaxRuntimeError(GLOO_RESET)  # a run of one process: nothing to say
    assert ends == [lost.LOST_STATUS]


def test_the_launcher_drops_gloo_chatter_and_prefixes_each_process():
    assert launch.without_chatter(GLOO + "\n") is None
    interleaved = "[Gloo] Rank 1 is connected to 3[Gloo] Rank 0 is connected to 3 peer ranks. "
    interleaved += "Expected number of connected peer ranks is : 3 peer ranks. Expected number of "
    interleaved += "connected peer ranks is : 3\n"
    assert launch.without_chatter(interleaved) is None
    assert launch.without_chatter(GLOO + "cvae: error: x\n") == "cvae: error: x\n"
    assert launch.without_chatter("step 5: loss 3\n") == "step 5: loss 3\n"
    stream = io.StringIO(f"{GLOO}\nstep 1\n{GLOO}\ncvae: error: a\ncvae: error: a\n")
    sink = io.StringIO()
    launch._forward(stream, "[1] ", sink, launch._Refusals(), lambda: False)
    assert sink.getvalue() == "[1] step 1\n[1] cvae: error: a\n"


def test_once_a_process_is_lost_the_launcher_shows_only_the_others_own_lines():
    """What the runtime prints as a process notices the loss (here when process 0, which hosts
    the coordination service, was killed) is dropped; the process's own line is kept."""
    noticed = (
        "E1205 01:30:23.597388   11656 coordination_service_agent.cc:289] Polled an error from "
        "coordination service (this can be an error from this or another task).\n"
        "F1205 01:30:23.597530   11656 client.h:80] Terminating process because the JAX "
        "distributed service detected fatal errors.\n"
        ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"Socket closed"}\n'
        "cvae: error: lost process 0 of 2 (...)\n"
    )
    sink = io.StringIO()
    launch._forward(io.StringIO(noticed), "[1] ", sink, launch._Refusals(), lambda: True)
    assert sink.getvalue() == "[1] cvae: error: lost process 0 of 2 (...)\n"
    # the process noticed as the killed one's sockets closed, before that one could be seen dead
    dead_at = time.monotonic() + 0.2
    sink = io.StringIO()
    lost = lambda: time.monotonic() > dead_at
    launch._forward(io.StringIO(noticed), "[1] ", sink, launch._Refusals(), lost)
    assert sink.getvalue() == "[1] cvae: error: lost process 0 of 2 (...)\n"
    sink = io.StringIO()  # no process lost: the runtime's lines are shown
    launch._forward(io.StringIO(noticed), "[1] ", sink, launch._Refusals(), bool)
    assert sink.getvalue().count("[1] ") == 4


def test_the_distributed_flags_say_what_they_are():
    """Before this change --coordinator's help read "process 0's" and the other two had none."""
    train = next(
        action.choices["train"]
        for action in build_parser()._actions
        if getattr(action, "choices", None) and "train" in action.choices
    )
    helps = {a.option_strings[0]: a.help for a in train._actions if a.option_strings}
    assert helps["--coordinator"].startswith("the address of the coordinator service")
    assert "process 0" in helps["--coordinator"]
    assert helps["--num-processes"] and "processes" in helps["--num-processes"]
    assert helps["--process-id"] and "0 to P-1" in helps["--process-id"]
