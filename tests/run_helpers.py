"""Tiny runs to interrupt and resume: shared by the checkpoint tests (``test_checkpoint.py``), the
fault-injection suite (``test_faults.py``) and its larger sweep (``benchmarks/fault_report.py``).

A run is ``cvae train`` on synthetic data (512 examples, batch 64: 8 steps per epoch) with a model
of 8 units, so its steps take milliseconds and a subprocess spends its time starting up. In-process
runs skip the final evaluation and pictures (:func:`fast_outputs`; tested elsewhere).
"""

from __future__ import annotations

import contextlib
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

import numpy as np
import pytest

from cvae_rosetta.app import checkpoint
from cvae_rosetta.cli import main
from cvae_rosetta.spec import protocol

TINY = [
    *("--data", "synthetic", "--batch-size", "64", "--latent-dim", "2", "--encoder-dims", "8"),
    *("--decoder-dims", "8", "--iw-samples", "1", "--no-progress", "--epochs", "4"),
]
STEPS_PER_EPOCH = 512 // 64
TOTAL = 4 * STEPS_PER_EPOCH
WAIT = 120.0  # seconds a subprocess may take to reach the point the test waits for
INSTALLED = [i.name for i in protocol.known() if i.installed and i.name in protocol.BUILTIN]


@contextlib.contextmanager
def fast_outputs():
    """cvae train without its final evaluation and pictures (tested elsewhere), to keep it quick."""
    from cvae_rosetta.app import evaluate, images
    from cvae_rosetta.app import rundir as run

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluate, "evaluate", lambda *a, **k: {})
        mp.setattr(evaluate, "describe", lambda *a, **k: "")
        mp.setattr(run, "write_pictures", lambda *a, **k: None)
        mp.setattr(images, "metric_panels", lambda *a, **k: None)
        yield


def train(*args: str) -> int:
    """``cvae train ARGS`` in this process, without the final evaluation and pictures."""
    with fast_outputs():
        return main(["train", *args])


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock seconds (the only field that may differ)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


def last_recorded_step(run_dir: Path) -> int:
    """The last step metrics.jsonl holds (complete lines only), 0 if none."""
    path = run_dir / "metrics.jsonl"
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
    return checkpoint.flatten(latest.state)


def assert_same_run(run_dir: Path, reference: Path, total: int = TOTAL) -> None:
    """The same records and, bit for bit, the same final canonical state as ``reference``."""
    assert records(run_dir) == records(reference)
    ours, theirs = final_state(run_dir, total), final_state(reference, total)
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def committed(run_dir: Path) -> list[int]:
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def tmp_of(directory: Path, step: int | str = "*") -> list[Path]:
    """What a save of ``step`` (any step by default) left uncommitted."""
    return list(directory.glob(f"{step}.orbax-checkpoint-tmp*")) if directory.is_dir() else []


def start(
    args: Sequence[str],
    cwd: Path,
    *,
    slow: str = "",
    driver: str | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """``cvae ARGS`` in a new process (from outside the source tree, so it runs what is
    installed), every DeprecationWarning an error. ``slow``: the ``N:SECONDS`` of
    ``CVAE_CHECKPOINT_SLOW_SAVE``. ``driver``: Python run first in that process (to inject a fault
    at a known point), before ``cvae_rosetta.cli.main(ARGS)``."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if slow:
        env[checkpoint.SLOW_SAVE_ENV] = slow
    if driver is None:
        entry = ["-m", "cvae_rosetta.cli", *args]
    else:
        code = (
            f"{driver}\nimport sys\nfrom cvae_rosetta.cli import main\nsys.exit(main(sys.argv[1:]))"
        )
        entry = ["-c", code, *args]
    return subprocess.Popen(
        [sys.executable, "-W", "error::DeprecationWarning", *entry],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


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


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """Wait for the process to end on its own; its exit status and stderr."""
    return kill(process, None)


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        path.unlink()


def largest_array_file(checkpoint_dir: Path) -> Path:
    return max(
        (p for p in (checkpoint_dir / "arrays").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file's bytes, but the lock file's: its holder record changes with each command."""
    from cvae_rosetta.app.rundir import LOCK_FILE

    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


# --- faults, for the fault-injection suite and its report ---------------------------------------

EVERY = 3  # --checkpoint-every of the runs faults are injected into: the most steps one may cost


def fault_args(impl: str, out: Path, extra: Sequence[str] = ()) -> list[str]:
    """``cvae train`` of a tiny run with a checkpoint every :data:`EVERY` steps."""
    return [
        "train",
        "--impl",
        impl,
        *TINY,
        *extra,
        "--checkpoint-every",
        str(EVERY),
        "--out",
        str(out),
    ]


def resume_args(run_dir: Path) -> list[str]:
    """``cvae train --resume`` of such a run, at the same cadence (it is not stored in the run)."""
    return ["train", "--resume", str(run_dir), "--checkpoint-every", str(EVERY), "--no-progress"]


def resumes(run_dir: Path) -> int:
    """How many times the run was resumed (config.json's ``resumes``)."""
    try:
        return len(json.loads((run_dir / "config.json").read_text()).get("resumes", []))
    except (OSError, ValueError):
        return 0


def lost_steps(run_dir: Path) -> int:
    """Steps metrics.jsonl holds past the checkpoint a resume starts from: what a fault cost."""
    return last_recorded_step(run_dir) - max(committed(run_dir), default=0)


def kill_during_save(args: Sequence[str], run_dir: Path, save: int) -> tuple[int, int]:
    """Run ``args`` (a new run) in a new process and SIGKILL it while its ``save``-th save (of step
    ``save * EVERY``) sleeps before its commit; its exit status and the steps lost."""
    process = start(args, run_dir.parent, slow=f"{save}:600")
    step = save * EVERY
    wait_for(process, lambda: tmp_of(run_dir / "checkpoints", step), f"the save of step {step}")
    status, _ = kill(process)
    return status, lost_steps(run_dir)


def signal_after_step(
    args: Sequence[str], run_dir: Path, step: int, sig: int = signal.SIGKILL, delay: float = 0.0
) -> tuple[int, int, str]:
    """Run ``args`` in a new process and send ``sig`` ``delay`` seconds after metrics.jsonl holds
    ``step`` (for a ``--resume``, once the resume has cut it back); exit status, steps lost,
    stderr."""
    wanted = resumes(run_dir) + ("--resume" in args)
    process = start(args, run_dir.parent)
    wait_for(
        process,
        lambda: resumes(run_dir) >= wanted and last_recorded_step(run_dir) >= step,
        f"step {step}",
    )
    time.sleep(delay)
    status, stderr = kill(process, sig)
    return status, lost_steps(run_dir), stderr


def stopped_line(stderr: str) -> str:
    """The one line a run stopped by a signal prints: where it stopped and how to go on."""
    [line] = [line for line in stderr.splitlines() if " stopped by " in line]
    return line


def stopped_step(stderr: str) -> int:
    """The step that line names."""
    line = stopped_line(stderr)
    found = re.search(r" at (?:step|the last step,) (\d+)", line)
    assert found, line
    return int(found.group(1))


def second_writer(holder: subprocess.Popen, run_dir: Path, *args: str) -> tuple[int, str, bool]:
    """``cvae train ARGS`` in this process, on ``run_dir`` while ``holder`` writes it: its exit
    status, what it printed on stderr, and whether every file of ``run_dir`` (but the lock's) is as
    it was. ``holder`` is frozen (SIGSTOP) meanwhile, so that only the second writer could change
    a file, and let go on (SIGCONT) after."""
    holder.send_signal(signal.SIGSTOP)
    try:
        before = snapshot(run_dir)
        printed = io.StringIO()
        with contextlib.redirect_stderr(printed):
            status = train(*args)
        return status, printed.getvalue().strip(), snapshot(run_dir) == before
    finally:
        holder.send_signal(signal.SIGCONT)


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
