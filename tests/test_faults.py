"""Fault injection: the ways a run dies on a shared machine or a cluster, each followed by a resume
that must go on with no more steps lost than promised (at most ``--checkpoint-every``; none for a
signal) and end, bit for bit, where an uninterrupted run ends.

- SIGKILL at random points (in the middle of a save, and after a random step) of runs of pure JAX,
  of another framework, and of pure JAX data-parallel over two host devices;
- SIGTERM while starting, while resuming, while training (sent in a save, and from another process
  after a random step), in the final evaluation, and sent to one process of two under
  ``jax.distributed``;
- a second writer on the same run directory;
- a full disk and a quota (a save or a metrics record that fails as the file system would);
- a truncated and a bit-flipped latest checkpoint.

A signal or a fault is injected at a known point by a few lines of Python run before the CLI in
the child process (``tiny_runs.start(driver=...)``). ``tox -e faults`` runs this file (two forced
host devices, every framework installed) with the other tests marked ``faults`` (in
``test_full_disk.py``, ``test_learning_rate_schedule.py``, ``test_cluster_schedulers.py`` and
``test_distributed_resume.py``); what that environment costs is in docs/conformance.md, "What
the whole check costs". ``benchmarks/fault_report.py`` runs a larger sweep and counts what it costs.
The runs, signals and second writers both use are in :mod:`cvae_rosetta.cli.tiny_runs`.
"""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
import signal
from pathlib import Path

import pytest
from run_helpers import benchmark_script

from cvae_rosetta.app import checkpoint, metricslog, rundir, signals
from cvae_rosetta.cli.tiny_runs import (
    EVERY,
    INSTALLED,
    PHASES,
    TINY,
    TOTAL,
    assert_same_run,
    committed,
    corrupt,
    fault_args,
    finish,
    injected,
    kill,
    kill_during_save,
    largest_array_file,
    last_recorded_step,
    resume_args,
    resumes,
    second_writer,
    signal_after_step,
    signal_in_phase,
    start,
    stopped_line,
    stopped_step,
    term_one_process_of_two,
    tmp_of,
    train,
    wait_for,
)

pytestmark = pytest.mark.faults

OTHER = next((n for n in ("flax_nnx", "equinox", "haiku", "flax_linen") if n in INSTALLED), None)
SHARDED = ("--data-parallel", "sharded", "--devices", "2")
CASES = {
    "pure_jax": ("pure_jax", ()),
    "other": (OTHER, ()),
    "pure_jax-sharded2": ("pure_jax", SHARDED),
}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each case's uninterrupted run (made on first use)."""
    made: dict[str, Path] = {}

    def reference(case: str) -> Path:
        if case not in made:
            impl, extra = CASES[case]
            out = tmp_path_factory.mktemp(f"reference-{case}") / "run"
            args = ["--impl", impl, *TINY, *extra, "--checkpoint-every", "0", "--out", str(out)]
            assert train(*args) == 0
            made[case] = out
        return made[case]

    return reference


TERM_SELF = "os.kill(os.getpid(), signal.SIGTERM)"


# --- SIGKILL at random points --------------------------------------------------------------------


KILLS = {  # where each case is killed: in the middle of a save, after a step (of a new run or of
    # its resume); the save and the step are drawn at random, the same on every run of the suite
    "pure_jax": ("save", "step"),
    "other": ("save",),
    "pure_jax-sharded2": ("step",),
}


@pytest.mark.parametrize(
    "case",
    [
        "pure_jax",
        pytest.param("other", marks=pytest.mark.skipif(OTHER is None, reason="needs a framework")),
        "pure_jax-sharded2",
    ],
)
def test_killed_at_random_points_goes_on_bit_for_bit(case, references, tmp_path):
    """SIGKILL in the middle of a random one of the second to fourth saves (so that one checkpoint
    is there to go on from; a run killed in its first save starts again), or after a random step,
    then resumed each time: never more than EVERY steps lost, and in the end the very same run."""
    impl, extra = CASES[case]
    rng = random.Random(case)
    out = tmp_path / "run"
    for n, kill_at in enumerate(KILLS[case]):
        args = resume_args(out) if n else fault_args(impl, out, extra)
        if kill_at == "save":
            status, lost, _ = kill_during_save(args, out, rng.randint(2, 4))
        else:
            step = rng.randint(max(committed(out), default=0) + 1, TOTAL - 1)
            status, lost, _ = signal_after_step(args, out, step)
        assert status == -signal.SIGKILL and 0 <= lost <= EVERY, (kill_at, status, lost)
    assert go_on(out) == 0
    assert resumes(out) == len(KILLS[case])
    assert_same_run(out, references(case))


def go_on(out: Path, *extra: str) -> int:
    """Resume the run in ``out`` to its end, in this process."""
    return train("--resume", str(out), *extra, "--no-progress", "--iw-samples", "1")


# --- SIGTERM -------------------------------------------------------------------------------------


SIGNALS = {signal.SIGTERM: 143, signal.SIGINT: 130}
FIRST_STEP = "pure_jax stopped by {sig} at step 0 (before epoch 1), checkpoint written; go on with:"
FINAL = f"pure_jax stopped by {{sig}} at the last step, {TOTAL}, before its final outputs were all "
LINES = {  # what the one line says, after "cvae: " ({out}: the run's directory)
    "start-up, before JAX": "stopped by {sig} while starting, nothing written; run the same "
    "command",
    "start-up": FIRST_STEP + " cvae train --resume {out}",
    "the first compile": FIRST_STEP + " cvae train --resume {out}",
    "an epoch": "pure_jax stopped by {sig} at step ",
    "a checkpoint save": "pure_jax stopped by {sig} at step 6 (6 batches into epoch 1), checkpoint "
    "written; go on with: cvae train --resume {out}",
    "the evaluation": FINAL + "written, checkpoint written; go on with: cvae train --resume {out}",
    "the pictures": FINAL + "written, checkpoint written; go on with: cvae train --resume {out}",
    "cvae export": "export stopped by {sig} before its end, nothing half-written; run the same "
    "command",
}


@pytest.mark.parametrize("sig", list(SIGNALS), ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("phase", list(PHASES))
def test_a_signal_in_any_phase_ends_in_one_line_and_the_run_goes_on(
    phase, sig, references, tmp_path
):
    """SIGTERM (a scheduler) and SIGINT (Ctrl-C) from start-up to the final outputs, and in
    ``cvae export``: status 128 + the signal, exactly one line on stderr saying where it stopped
    and how to go on, no step lost past the checkpoint, and gone on with as it says, the run ends
    bit for bit as the uninterrupted one (an export: no temporary directory left, and made again).
    Before this change SIGTERM killed start-up before JAX and ``cvae export`` without a word
    (-15), and every stop of a run printed a second line (the notice it was stopping)."""
    status, stderr, lost, finished = signal_in_phase(
        phase, sig, "pure_jax", tmp_path, references("pure_jax")
    )
    assert status == SIGNALS[sig], stderr
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr, stderr
    name = signal.Signals(sig).name
    assert stderr.startswith("cvae: " + LINES[phase].format(sig=name, out=tmp_path / "run")), stderr
    assert lost == 0  # promised: a signal costs no step
    assert finished


def test_sigterm_while_resuming_stops_cleanly(references, tmp_path):
    """Before this change the default action killed the process (exit status -15)."""
    out = tmp_path / "run"
    driver = injected("cvae_rosetta.app.train:fit_to_data", TERM_SELF)  # a run stopped at 0
    assert finish(start(fault_args("pure_jax", out), tmp_path, driver=driver))[0] == 143
    driver = injected("cvae_rosetta.app.resuming:Resume.load", TERM_SELF)
    status, stderr = finish(start(["train", "--resume", str(out)], tmp_path, driver=driver))
    assert status == 143, stderr
    assert "stopped by SIGTERM at step 0 (before epoch 1)" in stopped_line(stderr)
    assert go_on(out) == 0
    assert_same_run(out, references("pure_jax"))


def test_sigterm_from_another_process_after_checkpoints_stops_with_status_143(references, tmp_path):
    """As a scheduler sends it: from outside, to the run's own process, at a step of its choosing
    once checkpoints are written. (A TERM sent to a shell that runs cvae train as its child ends
    the shell, status 143, and never reaches the run, which goes on: docs/checkpoints.md.)"""
    out = tmp_path / "run"
    status, lost, stderr = signal_after_step(
        fault_args("pure_jax", out), out, 2 * EVERY + 1, signal.SIGTERM
    )
    assert status == 143, stderr
    line = stopped_line(stderr)
    assert line.endswith(f"checkpoint written; go on with: cvae train --resume {out}"), line
    step = int(re.search(r"stopped by SIGTERM at step (\d+) ", line).group(1))
    assert step > 2 * EVERY and committed(out)[-1] == step  # after two checkpoints at least
    assert lost == 0 and "Traceback" not in stderr
    assert go_on(out) == 0
    assert_same_run(out, references("pure_jax"))


def test_sigterm_to_one_process_of_two_stops_both_after_the_same_step(tmp_path):
    """Under jax.distributed the signal reaches process 1 only. Before this change neither process
    handled it: process 1 died (-15) and process 0 lost every step since its last checkpoint."""
    out = tmp_path / "run"
    status, stderr = term_one_process_of_two(out, after_step=40)
    assert status == 143, stderr
    step = stopped_step(stderr)
    ended = "[1] cvae: process 1 of 2 ended with the others (SIGTERM); process 0 says where and how"
    assert ended in stderr, stderr  # process 1's one line
    assert step % signals.AGREE_EVERY == 0 or step % 8 == 0, stderr  # an agreement point
    assert committed(out)[-1] == step and last_recorded_step(out) == step
    assert checkpoint.latest_of_run(out).step == step  # intact, and --resume goes on from it
    assert "Traceback" not in stderr


# --- a second writer -----------------------------------------------------------------------------


def test_a_second_writer_is_refused_and_a_dead_writers_lock_taken_over(
    references, tmp_path, capsys
):
    """Before this change the second `--resume` ran beside the first, into the same files."""
    out = tmp_path / "run"
    first = start(fault_args("pure_jax", out), tmp_path, slow="2:600")  # holds in its second save
    try:
        wait_for(first, lambda: tmp_of(out / "checkpoints", 6), "the save of step 6")
        status, err, unchanged = second_writer(first, out, "--resume", str(out), "--no-progress")
        assert status == 2 and unchanged
        assert re.fullmatch(
            rf"cvae: error: --resume: expected a run directory no other process is writing, got "
            rf"{re.escape(str(out))}, held by pid {first.pid} on \S+ since \S+ \(train\)",
            err,
        ), err
        status, err, unchanged = second_writer(first, out, *TINY, "--out", str(out), "--overwrite")
        assert status == 2 and unchanged and f"held by pid {first.pid}" in err
        assert committed(out) == [3]
    finally:
        status, _ = kill(first)
    assert status == -signal.SIGKILL
    assert go_on(out) == 0
    err = capsys.readouterr().err
    assert f"took over {out / rundir.LOCK_FILE} from pid {first.pid} on " in err
    assert "no longer running" in err
    assert_same_run(out, references("pure_jax"))


# --- a full disk ---------------------------------------------------------------------------------


def _full_disk_at_save(n: int):
    """``Checkpoints.save`` whose ``n``-th call leaves a partial temporary directory and fails as
    TensorStore does under Orbax on a full disk."""
    real = checkpoint.Checkpoints.save
    calls = [0]

    def save(self, saved):
        calls[0] += 1
        if calls[0] == n:
            partial = self.directory / f"{saved.step}.orbax-checkpoint-tmp-1"
            (partial / "arrays").mkdir(parents=True)
            (partial / "arrays" / "d").write_bytes(b"\0" * 100)
            raise ValueError(
                f'RESOURCE_EXHAUSTED: Error writing "params.decoder.0.bias/0" in OCDBT database '
                f'at local file "{partial}/arrays/": Failed to write 1209 bytes to file 15: No '
                "space left on device [os_error_code='28']"
            )
        return real(self, saved)

    return save


class _OverQuota:
    """A metrics file that takes half of the line of ``step``, then fails as a full quota does."""

    def __init__(self, file, step: int) -> None:
        self._file, self._step = file, step

    def write(self, text: str) -> int:
        if f'"step": {self._step},' in text and '"event": "step"' in text:
            self._file.write(text[: len(text) // 2])
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return self._file.write(text)

    def __getattr__(self, name: str):
        return getattr(self._file, name)


def _quota_at_record(step: int):
    """``MetricsLog.__init__`` whose file fails on the record of ``step``."""
    real = metricslog.MetricsLog.__init__

    def init(self, path):
        real(self, path)
        self._file = _OverQuota(self._file, step)

    return init


@pytest.mark.parametrize(
    ("where", "fault", "what", "reason"),
    [
        ("checkpoints/9", "save", "checkpoint 9", "No space left on device"),
        ("metrics.jsonl", "record", "metrics.jsonl", "Disk quota exceeded"),
    ],
    ids=["enospc-in-a-save", "edquot-in-metrics"],
)
def test_a_full_disk_ends_the_run_with_one_line_and_loses_at_most_a_checkpoint(
    references, tmp_path, monkeypatch, capsys, where, fault, what, reason
):
    """Before this change: a 40-line Orbax traceback and exit status 1 for the save, status 2 and
    no resume command for the metrics."""
    out = tmp_path / "run"
    if fault == "save":
        monkeypatch.setattr(checkpoint.Checkpoints, "save", _full_disk_at_save(3))
    else:
        monkeypatch.setattr(metricslog.MetricsLog, "__init__", _quota_at_record(8))
    assert train(*fault_args("pure_jax", out)[1:]) == 74
    err = capsys.readouterr().err.strip()
    assert err == (
        f"cvae: error: could not write {out / where} ({what}): {reason}; the checkpoints written "
        f"before it are intact; once the disk can be written again, go on with: cvae train "
        f"--resume {out}"
    )
    assert not tmp_of(out / "checkpoints")  # nothing half-written where a resume would look
    assert committed(out) == [3, 6] and last_recorded_step(out) - 6 <= EVERY
    monkeypatch.undo()
    assert go_on(out) == 0
    assert_same_run(out, references("pure_jax"))


# --- a damaged latest checkpoint -----------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A whole run with a checkpoint every EVERY steps: 27, 30 and 32 kept."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert train(*fault_args("pure_jax", out)[1:]) == 0
    assert committed(out) == [27, 30, 32]
    return out


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_a_damaged_latest_checkpoint_costs_the_steps_since_the_one_before(
    references, finished, tmp_path, capsys, how
):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    corrupt(largest_array_file(out / "checkpoints" / "32"), how)
    assert go_on(out, "--resume-latest-good") == 0
    captured = capsys.readouterr()
    assert "checkpoint 32 is damaged" in captured.err and "at step 30 " in captured.out
    assert_same_run(out, references("pure_jax"))


def test_the_suite_covers_another_framework():
    """The faults environment installs every framework: the second case must not be skipped."""
    assert OTHER is not None, f"installed: {INSTALLED}"


def test_the_fault_report_counts_a_second_line_or_a_traceback_as_not_survived(capsys):
    """Its rule, whatever the status: at most one line per process, no traceback."""
    fault_report = benchmark_script("fault_report")

    def survived(stderr: str) -> bool:
        tried = fault_report.Tried("x", "one device", "sigterm", "an epoch")
        return fault_report.record(tried, True, 0, stderr)["survived"]

    assert survived("cvae: x stopped by SIGTERM at step 9 ...\n") and survived("")
    assert survived("[0] cvae: x stopped ...\n[1] cvae: x stopped ...\n")  # one per process
    assert not survived("cvae: SIGTERM: stopping after this step\ncvae: x stopped ...\n")
    assert not survived("Traceback (most recent call last):\n  File ...\nRuntimeError: x\n")
    assert not survived("[1] cvae: a\n[1] cvae: b\n")
    tried = fault_report.Tried("x", "one device", "sigkill", "an epoch")
    assert not fault_report.record(tried, False, 3)["survived"]
