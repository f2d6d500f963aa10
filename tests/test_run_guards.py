"""What keeps a run safe, piece by piece (the whole runs are in ``test_faults.py``): when a
checkpoint is due (:class:`~cvae_rosetta.app.signals.Cadence`, ``--checkpoint-every-seconds``),
how a signal is taken (:class:`~cvae_rosetta.app.signals.GracefulStop`), the one writer of a
run directory (:class:`~cvae_rosetta.app.runlock.RunLock`) and a write the disk refuses
(:mod:`cvae_rosetta.files`)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from cvae_rosetta import files
from cvae_rosetta.app import optionchecks, rundir, runlock
from cvae_rosetta.app.signals import AGREE_EVERY, Cadence, GracefulStop, Stopped
from cvae_rosetta.app.train import Options, train_and_evaluate
from cvae_rosetta.cli import main
from cvae_rosetta.cli.tiny_runs import TINY, committed, train
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, OutputError


class Clock:
    """A clock the test sets by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- when a checkpoint is due ---------------------------------------------------------------------


def test_a_checkpoint_every_k_steps():
    cadence = Cadence(every=5)
    assert [t for t in range(1, 21) if cadence(t)[0]] == [5, 10, 15, 20]
    assert not any(cadence(t)[1] for t in range(1, 21))


def test_a_checkpoint_every_s_seconds_counted_from_the_previous_one():
    clock = Clock()
    cadence = Cadence(seconds=10.0, clock=clock)
    clock.now = 9.9
    assert cadence(1) == (False, False)
    clock.now = 10.0
    assert cadence(2) == (True, False)  # 10 s since the start
    clock.now = 19.0
    assert cadence(3) == (False, False)  # 9 s since the checkpoint at 10 s
    clock.now = 20.0
    assert cadence(4) == (True, False)


def test_steps_or_seconds_whichever_comes_first():
    clock = Clock()
    cadence = Cadence(every=4, seconds=10.0, clock=clock)
    clock.now = 3.0
    assert cadence(4) == (True, False)  # 4 steps before 10 s; the clock starts again at 3 s
    clock.now = 12.0
    assert cadence(5) == (False, False)  # 9 s since it
    clock.now = 13.0
    assert cadence(6) == (True, False)  # 10 s before the next 4 steps
    clock.now = 14.0
    assert cadence(8) == (True, False)  # and the steps again


def test_a_signal_writes_a_checkpoint_and_stops():
    signum = [0]
    cadence = Cadence(every=100, stop=lambda: signum[0])
    assert cadence(1) == (False, False)
    signum[0] = signal.SIGTERM
    assert cadence(2) == (True, True)
    assert cadence.stopped_by == signal.SIGTERM


def test_processes_agree_every_few_steps_on_what_only_one_of_them_knows():
    """This process got no signal and its clock says nothing is due; another process got SIGTERM
    and finds its checkpoint late. They agree only at every AGREE_EVERY-th step and at an epoch's
    end (boundary), where the maximum of every process's answer decides."""
    asked: list[tuple[int, ...]] = []

    def agree(late: int, signum: int) -> tuple[int, ...]:
        asked.append((late, signum))
        return 1, signal.SIGTERM  # what the other process brings

    cadence = Cadence(every=0, seconds=3600.0, stop=lambda: 0, agree=agree)
    assert [cadence(t) for t in range(1, AGREE_EVERY)] == [(False, False)] * (AGREE_EVERY - 1)
    assert asked == []  # no collective between agreement points
    assert cadence(AGREE_EVERY) == (True, True)
    assert asked == [(0, 0)] and cadence.stopped_by == signal.SIGTERM
    assert Cadence(stop=lambda: 0, agree=agree)(3, boundary=True) == (True, True)


def test_steps_are_counted_alike_in_every_process_without_agreeing():
    cadence = Cadence(every=3, agree=lambda *values: values)
    assert [t for t in range(1, 10) if cadence(t)[0]] == [3, 6, 9]


# --- a signal -------------------------------------------------------------------------------------


def test_a_signal_asks_to_stop_and_a_repeated_sigterm_changes_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop() as stop:
        assert stop() == 0
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop() == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler or a launcher sending it again
        assert stop() == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C after it: stop at once
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_in_the_final_outputs_interrupts_them_at_once():
    with GracefulStop() as stop:
        with pytest.raises(Stopped) as caught, stop.immediately():
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("not interrupted")
        assert caught.value.signum == signal.SIGTERM
        with pytest.raises(Stopped), stop.immediately():  # one that came before: at once too
            raise AssertionError("entered")


# --- one writer per run directory -----------------------------------------------------------------


def holder(path) -> dict:
    return json.loads((path / rundir.LOCK_FILE).read_text())


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    with runlock.RunLock.acquire(tmp_path, command="train", field="out"):
        record = holder(tmp_path)
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(OutputError) as caught:
            runlock.RunLock.acquire(tmp_path, command="train --resume", field="resume")
    assert str(caught.value) == (
        f"resume: expected a run directory no other process is writing, got {tmp_path}, held by "
        f"pid {os.getpid()} on {socket.gethostname()} since {record['since']} (train)"
    )
    assert not (tmp_path / rundir.LOCK_FILE).exists()  # released: the file is gone
    runlock.RunLock.acquire(tmp_path, command="evaluate", field="run_dir").release()


def test_another_process_holding_the_lock_refuses_this_one(tmp_path):
    code = (
        "import sys, pathlib; from cvae_rosetta.app import runlock; "
        "lock = runlock.RunLock.acquire(pathlib.Path(sys.argv[1]), command='train', field='out'); "
        "print('held', flush=True); sys.stdin.read()"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert other.stdout.readline() == "held\n"
        with pytest.raises(OutputError, match=f"held by pid {other.pid} on "):
            runlock.RunLock.acquire(tmp_path, command="train", field="out")
    finally:
        other.communicate("")  # it ends, and the kernel drops its lock
    runlock.RunLock.acquire(tmp_path, command="train", field="out").release()


def test_the_lock_of_a_dead_process_is_taken_over_saying_so(tmp_path, capsys):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(gone.stdout)
    record = {"pid": dead, "host": socket.gethostname(), "since": "then", "command": "train"}
    (tmp_path / rundir.LOCK_FILE).write_text(json.dumps(record))
    with runlock.RunLock.acquire(tmp_path, command="train --resume", field="resume"):
        assert holder(tmp_path)["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert f"took over {tmp_path / rundir.LOCK_FILE} from pid {dead} on " in err
    assert "no longer running" in err


def test_a_run_holds_its_directory_and_a_resume_is_refused_meanwhile(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(*TINY, "--epochs", "1", "--checkpoint-every", "4", "--out", str(out)) == 0
    with runlock.RunLock.acquire(out, command="train", field="out"):
        assert train("--resume", str(out), "--epochs", "2") == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert err.startswith("cvae: error: --resume: expected a run directory no other process")
        assert f"held by pid {os.getpid()}" in err
        assert train(*TINY, "--out", str(out), "--overwrite") == 2
        assert "--out: expected a run directory no other process is writing" in (
            capsys.readouterr().err
        )
        assert main(["evaluate", "--run", str(out)]) == 2
        assert "--run: expected a run directory no other process" in capsys.readouterr().err
    assert committed(out) == [4, 8]  # nothing changed while it was held


# --- a write the disk refuses ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device", "/x/y"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        ValueError(
            'RESOURCE_EXHAUSTED: Error writing "a/0" in OCDBT database at local file "/x/": '
            "Failed to write 185487 bytes to file 15: No space left on device "
            "[os_error_code='28']"
        ),  # what TensorStore raises under Orbax on a full disk
    ],
    ids=["enospc", "edquot", "tensorstore"],
)
def test_a_disk_error_is_found_however_it_is_wrapped(tmp_path, error):
    wrapped = RuntimeError("the save failed")
    wrapped.__cause__ = error
    for raised in (error, wrapped):
        assert files.disk_error(raised) in (errno.ENOSPC, errno.EDQUOT)
        with pytest.raises(files.WriteFailed) as caught, files.writing("checkpoint 9", tmp_path):
            raise raised
        assert caught.value.what == "checkpoint 9"
        assert caught.value.path in (tmp_path, type(tmp_path)("/x/y"))


def test_what_a_failed_save_prints_is_held_back_and_anything_else_let_through(capfd):
    with pytest.raises(OSError), files.stderr_held():
        os.write(2, b"ERROR:absl: a thread of the save failed\n")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert capfd.readouterr().err == ""
    with files.stderr_held():
        os.write(2, b"a warning\n")
    assert capfd.readouterr().err == "a warning\n"
    with pytest.raises(KeyError), files.stderr_held():
        os.write(2, b"what a bug printed\n")
        raise KeyError("a bug")
    assert capfd.readouterr().err == "what a bug printed\n"


def test_other_errors_pass_unchanged(tmp_path):
    assert files.disk_error(PermissionError(errno.EACCES, "Permission denied")) is None
    with pytest.raises(KeyError), files.writing("the summary", tmp_path):
        raise KeyError("not a disk")


# --- --checkpoint-every-seconds -------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), "soon", True])
def test_checkpoint_every_seconds_is_checked_before_anything_is_written(tmp_path, seconds):
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as caught:
        train_and_evaluate(Config(), out, Options(checkpoint_every_seconds=seconds))
    assert str(caught.value) == (
        f"checkpoint_every_seconds: expected a number of seconds >= 0 (0: none), got {seconds!r}"
    )
    assert not out.exists()


@pytest.mark.parametrize("given", ["-5", "soon"])
def test_the_cli_names_the_flag(tmp_path, capsys, given):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--checkpoint-every-seconds", given, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    shown = repr(float(given)) if given != "soon" else repr(given)
    assert err == (
        "cvae: error: --checkpoint-every-seconds: expected a number of seconds >= 0 (0: none), "
        f"got {shown}"
    )
    assert not out.exists()


def test_a_checkpoint_after_every_step_when_every_second_has_passed(tmp_path):
    out = tmp_path / "run"
    args = ["--checkpoint-every", "0", "--checkpoint-every-seconds", "1e-9"]
    assert train(*TINY, "--epochs", "1", *args, "--keep-checkpoints", "20", "--out", str(out)) == 0
    assert committed(out) == list(range(1, 9))


def test_a_long_time_cadence_leaves_the_step_cadence(tmp_path):
    out = tmp_path / "run"
    args = ["--checkpoint-every", "3", "--checkpoint-every-seconds", "3600"]
    assert train(*TINY, "--epochs", "1", *args, "--out", str(out)) == 0
    assert committed(out) == [3, 6, 8]


def test_the_checkpoint_module_checks_the_cadence_options():
    assert optionchecks.check_options(5, 2, 30) == (5, 2, 30.0)
