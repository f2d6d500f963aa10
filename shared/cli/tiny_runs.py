"""Tiny runs of ``cvae`` to interrupt and resume, or only to have a run, for the fault sweep
(``benchmarks/fault_report.py``) and the tests of runs (checkpoints, faults, resuming, export):
``cvae train`` on synthetic data (512 examples, batch 64: 8 steps per epoch) with a model of 8
units, so that a subprocess spends its time starting up; run in this process (:func:`train`) or in
a new one (:func:`start`), signalled, killed or given a fault at a known point (:func:`injected`),
and compared bit for bit with a run never interrupted (:func:`assert_same_run`)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import numpy as np

from cvae_rosetta.app import charts, checkpoint, evaluate, rundir, runpictures
from cvae_rosetta.app.metricslog import read_metrics
from cvae_rosetta.app.paramsfile import flatten
from cvae_rosetta.cli import main
from cvae_rosetta.spec import protocol

TINY = [
    *("--data", "synthetic", "--batch-size", "64", "--latent-dim", "2", "--encoder-dims", "8"),
    *("--decoder-dims", "8", "--iw-samples", "1", "--no-progress", "--epochs", "4"),
]
TOTAL = 4 * 512 // 64  # steps: 4 epochs of 8
WAIT = 120.0  # seconds a subprocess may take to reach the point the caller waits for
EVERY = 3  # --checkpoint-every of the runs faults are injected into: the most steps one may cost
CADENCE = ("--checkpoint-every", str(EVERY))
INSTALLED = [i.name for i in protocol.known() if i.installed and i.builtin]


@contextlib.contextmanager
def fast_outputs():
    """cvae train without its final evaluation and pictures (tested elsewhere), to keep it quick."""
    with (
        mock.patch.object(evaluate, "evaluate", lambda *a, **k: {}),
        mock.patch.object(evaluate, "describe", lambda *a, **k: ""),
        mock.patch.object(runpictures, "write_pictures", lambda *a, **k: None),
        mock.patch.object(charts, "metric_panels", lambda *a, **k: None),
    ):
        yield


def train(*args: str, quiet: bool = False) -> int:
    """``cvae train ARGS`` in this process, without the final evaluation and pictures; ``quiet``:
    its report unprinted."""
    with fast_outputs(), contextlib.redirect_stdout(io.StringIO() if quiet else sys.stdout):
        return main(["train", *args])


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock seconds (the only field that may differ)."""
    metrics = read_metrics(run_dir / rundir.METRICS_FILE)
    return [{k: v for k, v in record.items() if k != "seconds"} for record in metrics]


def last_recorded_step(run_dir: Path) -> int:
    """The last step metrics.jsonl holds (complete lines only), 0 if none."""
    path = run_dir / rundir.METRICS_FILE
    steps = [0]
    for line in path.read_text().splitlines() if path.is_file() else ():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("event") == "step":
                steps.append(record["step"])
    return max(steps)


def final_state(run_dir: Path, total: int = TOTAL) -> dict[str, np.ndarray]:
    latest = checkpoint.latest_of_run(run_dir)
    assert latest.step == total
    return flatten(latest.state)


def assert_same_run(run_dir: Path, reference: Path, total: int = TOTAL) -> None:
    """The same records and, bit for bit, the same final canonical state as ``reference``."""
    assert records(run_dir) == records(reference)
    ours, theirs = final_state(run_dir, total), final_state(reference, total)
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def same_run(run_dir: Path, reference: Path) -> bool:
    """:func:`assert_same_run` as a yes or no."""
    try:
        assert_same_run(run_dir, reference)
    except AssertionError:
        return False
    return True


def committed(run_dir: Path) -> list[int]:
    """The steps of the run's committed checkpoints."""
    with contextlib.closing(checkpoint.Checkpoints(checkpoint.checkpoints_of(run_dir))) as found:
        return found.steps()


def tmp_of(directory: Path, step: int | str = "*") -> list[Path]:
    """What a save of ``step`` (any step by default) left uncommitted."""
    return list(directory.glob(f"{step}{checkpoint.TMP_SUFFIX}*")) if directory.is_dir() else []


def start(
    args: Sequence[str], cwd: Path, *, slow: str = "", driver: str = "", new_session: bool = False
) -> subprocess.Popen:
    """``cvae ARGS`` in a new process in ``cwd`` (outside the source tree: what is installed runs),
    every DeprecationWarning an error. ``slow``: ``CVAE_CHECKPOINT_SLOW_SAVE``'s ``N:SECONDS``;
    ``driver``: Python run first there (to inject a fault), then ``cvae_rosetta.cli.main(ARGS)``."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if slow:
        env[checkpoint.SLOW_SAVE_ENV] = slow
    entry = ["-m", "cvae_rosetta.cli", *args]
    if driver:
        main_code = "import sys\nfrom cvae_rosetta.cli import main\nsys.exit(main(sys.argv[1:]))"
        entry = ["-c", f"{driver}\n{main_code}", *args]
    command = [sys.executable, "-W", "error::DeprecationWarning", *entry]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        start_new_session=new_session,
        preexec_fn=_sigint_as_in_a_terminal,
        **pipes,
    )


def _sigint_as_in_a_terminal() -> None:
    """The child takes SIGINT as a command typed in a terminal does (Python's KeyboardInterrupt),
    even where the tests themselves were started in the background: a shell without job control
    starts a background job with SIGINT ignored, every process under it inherits that, and Python
    leaves an ignored SIGINT ignored, so a Ctrl-C sent by a test would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(process: subprocess.Popen, predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(
                f"exited {process.returncode} before {what}: {process.stderr.read()[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def kill(process: subprocess.Popen, sig: int | None = signal.SIGKILL) -> tuple[int, str]:
    """Send ``sig`` (none: let it end on its own), wait for the process to end (killed after
    :data:`WAIT` seconds); its exit status and stderr."""
    try:
        if sig is not None:
            process.send_signal(sig)
        _, stderr = process.communicate(timeout=WAIT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stderr


finish = functools.partial(kill, sig=None)  # wait for the process to end on its own


def corrupt(path: Path, how: str) -> None:
    """Truncate (``truncate``), bit-flip (``flip``) or else delete the file."""
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        path.unlink()


def largest_array_file(checkpoint_dir: Path) -> Path:
    files = (p for p in (checkpoint_dir / "arrays").rglob("*") if p.is_file())
    return max(files, key=lambda p: p.stat().st_size)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file's bytes, but the lock file's: its holder record changes with each command."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != rundir.LOCK_FILE
    }


def fault_args(impl: str, out: Path, extra: Sequence[str] = ()) -> list[str]:
    """``cvae train`` of a tiny run with a checkpoint every :data:`EVERY` steps."""
    return ["train", "--impl", impl, *TINY, *extra, *CADENCE, "--out", str(out)]


def resume_args(run_dir: Path) -> list[str]:
    """``cvae train --resume`` of such a run, at the same cadence (it is not stored in the run)."""
    return ["train", "--resume", str(run_dir), *CADENCE, "--no-progress"]


def resumes(run_dir: Path) -> int:
    """How many times the run was resumed (config.json's ``resumes``)."""
    try:
        return len(json.loads((run_dir / rundir.CONFIG_FILE).read_text()).get("resumes", []))
    except (OSError, ValueError):
        return 0


def lost_steps(run_dir: Path) -> int:
    """Steps metrics.jsonl holds past the checkpoint a resume starts from: what a fault cost."""
    return last_recorded_step(run_dir) - max(committed(run_dir), default=0)


def kill_during_save(args: Sequence[str], run_dir: Path, save: int) -> tuple[int, int, str]:
    """Run ``args`` (a new run) in a new process and SIGKILL it while its ``save``-th save (of step
    ``save * EVERY``) sleeps before its commit; its exit status, the steps lost and stderr."""
    process = start(args, run_dir.parent, slow=f"{save}:600")
    step = save * EVERY
    wait_for(process, lambda: tmp_of(run_dir / "checkpoints", step), f"the save of step {step}")
    status, stderr = kill(process)
    return status, lost_steps(run_dir), stderr


def signal_after_step(
    args: Sequence[str], run_dir: Path, step: int, sig: int = signal.SIGKILL, delay: float = 0.0
) -> tuple[int, int, str]:
    """Run ``args`` in a new process, send ``sig`` ``delay`` seconds after metrics.jsonl holds
    ``step`` (after the cut of a ``--resume``); exit status, steps lost, stderr."""
    wanted = resumes(run_dir) + ("--resume" in args)
    process = start(args, run_dir.parent)
    reached = lambda: resumes(run_dir) >= wanted and last_recorded_step(run_dir) >= step
    wait_for(process, reached, f"step {step}")
    time.sleep(delay)
    status, stderr = kill(process, sig)
    return status, lost_steps(run_dir), stderr


def injected(where: str, action: str, *, times: int = 1) -> str:
    """Python for ``start(driver=...)``: ``where`` ("module:function") does ``action`` (a statement
    using ``os`` and ``signal``) on its ``times``-th call, then what it did before."""
    module, _, name = where.partition(":")
    owner, _, attribute = name.rpartition(".")
    target = f"_m.{owner}" if owner else "_m"
    return (
        f"import functools, importlib, os, signal\n"
        f"_m = importlib.import_module({module!r})\n"
        f"_calls = [0]\n"
        f"_real = getattr({target}, {attribute!r})\n"
        f"@functools.wraps(_real)\n"
        f"def _injected(*args, **kwargs):\n"
        f"    _calls[0] += 1\n"
        f"    if _calls[0] == {times}:\n"
        f"        {action}\n"
        f"    return _real(*args, **kwargs)\n"
        f"setattr({target}, {attribute!r}, _injected)\n"
    )


# the phases a signal is sent in: the function whose Nth call sends it from inside the process
# (None: from another process, after a random step of the run)
PHASES = {
    "start-up, before JAX": ("cvae_rosetta.app.cache:use", 1),
    "start-up": ("cvae_rosetta.app.train:fit_to_data", 1),
    "the first compile": ("cvae_rosetta.app.devices:RunDevices.epoch_step", 1),
    "an epoch": None,
    "a checkpoint save": ("cvae_rosetta.app.checkpoint:Saver.__call__", 2),
    "the evaluation": ("cvae_rosetta.app.evaluate:evaluate", 1),
    "the pictures": ("cvae_rosetta.app.runpictures:write_pictures", 1),
    "cvae export": ("cvae_rosetta.files:write_bytes", 2),  # after its first file, of several
}


def signal_in_phase(phase: str, sig: int, impl: str, work: Path, reference: Path, step: int = 9):
    """A tiny run of ``impl`` in ``work`` (for ``cvae export``: an export of ``reference``) sent
    ``sig`` in ``phase``, then gone on with as its line says: ``(status, stderr, steps lost,
    whether it then ended as the uninterrupted one did)``. ``step``: of the phase "an epoch"."""
    out, action = work / "run", f"os.kill(os.getpid(), {int(sig)})"
    if phase == "cvae export":
        args = ["export", "--run", str(reference), "--out", str(out)]
        where, times = PHASES[phase]
        status, stderr = finish(start(args, work, driver=injected(where, action, times=times)))
        left = [p.name for p in work.iterdir() if p.name != "run"]  # a temporary directory
        again = not left and not out.exists() and main(args) == 0
        return status, stderr, 0, again and (out / "manifest.json").is_file()
    if PHASES[phase] is None:
        status, lost, stderr = signal_after_step(fault_args(impl, out), out, step, sig)
    else:
        driver = injected(*PHASES[phase][:1], action, times=PHASES[phase][1])
        status, stderr = finish(start(fault_args(impl, out), work, driver=driver))
        lost = lost_steps(out) if out.is_dir() else 0
    if "go on with: cvae train --resume" in stderr:
        again = train(*resume_args(out)[1:], "--iw-samples", "1", quiet=True)
    elif "run the same command" in stderr:
        overwrite = ["--overwrite"] if "--overwrite" in stderr and out.exists() else []
        again = train(*fault_args(impl, out)[1:], *overwrite, quiet=True)
    else:
        return status, stderr, lost, False
    return status, stderr, lost, again == 0 and same_run(out, reference)


def stopped_line(stderr: str) -> str:
    """The one line a run stopped by a signal prints: where it stopped and how to go on."""
    [line] = [line for line in stderr.splitlines() if " stopped by " in line]
    return line


def stopped_step(stderr: str) -> int:
    """The step that line names."""
    found = re.search(r" at (?:step|the last step,) (\d+)", line := stopped_line(stderr))
    assert found, line
    return int(found.group(1))


def second_writer(holder: subprocess.Popen, run_dir: Path, *args: str) -> tuple[int, str, bool]:
    """``cvae train ARGS`` in this process on ``run_dir``, with ``holder`` (its writer) frozen
    meanwhile: exit status, stderr, and whether every file but the lock is as it was."""
    holder.send_signal(signal.SIGSTOP)
    try:
        # a SIGSTOP is only sent when send_signal returns: the writes its threads have in flight
        # (Orbax's) end before the snapshot
        wait_for(holder, lambda: _stopped(holder.pid), "the writer to stop on SIGSTOP")
        before = snapshot(run_dir)
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            status = train(*args)
        return status, printed.getvalue().strip(), snapshot(run_dir) == before
    finally:
        holder.send_signal(signal.SIGCONT)


def _stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (``T`` in ``/proc``); where there is no
    ``/proc``, taken as stopped."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        return not tasks.is_dir() or all(
            (task / "stat").read_text().rpartition(")")[2].split()[0] in "Tt"
            for task in tasks.iterdir()
        )
    except OSError:  # a thread ended while it was read
        return False


# a run of two processes under jax.distributed, one device each, long enough to be signalled
TWO_PROCESSES = [
    *("--impl", "pure_jax", *TINY, "--epochs", "200", "--data-parallel", "sharded"),
    *("--devices", "2", "--checkpoint-every", "40"),
]


def term_one_process_of_two(run_dir: Path, after_step: int = 40) -> tuple[int, str]:
    """``cvae launch`` of :data:`TWO_PROCESSES` into ``run_dir``; SIGTERM to process 1 alone once
    metrics.jsonl holds ``after_step`` (process 0 writes it); the launcher's status and stderr."""
    args = ["train", *TWO_PROCESSES, "--out", str(run_dir)]
    launch = ["launch", "--num-processes", "2", "--timeout", str(WAIT), "--", *args]
    launcher = start(launch, run_dir.parent, new_session=True)
    try:
        wait_for(launcher, lambda: last_recorded_step(run_dir) >= after_step, f"step {after_step}")
        os.kill(process_of(launcher.pid, 1), signal.SIGTERM)
        return finish(launcher)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()


def process_of(launcher: int, process_id: int) -> int:
    """The pid of ``--process-id PROCESS_ID`` among the children of ``cvae launch``."""
    found = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True)
    wanted = str(process_id).encode()
    for pid in found.stdout.split():
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--process-id" in command and command[command.index(b"--process-id") + 1] == wanted:
            return int(pid)
    raise AssertionError(f"no process {process_id} among the children of {launcher}")
