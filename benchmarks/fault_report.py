"""What faults cost a run: a sweep of injected faults, each resumed and compared with a run that
was never interrupted.

    python benchmarks/fault_report.py [--out benchmarks/results/faults_cpu.json] [--points 2]
                                      [--impls a,b] [--seed 0] [--render]

For every installed implementation (and pure JAX data-parallel over two host devices), one tiny run
(``tests/run_helpers.py``: 4 epochs of 8 steps, a checkpoint every 3) goes through a chain of
faults, each resumed by the next process: SIGKILL in the middle of a random one of the second to
fourth saves (a run killed in its first save has no checkpoint and starts again), SIGKILL after
``--points`` random steps, SIGTERM after a random step; then it is resumed to its end. The finished
run's latest checkpoint is then truncated, and bit-flipped, and each copy resumed with
``--resume-latest-good``. A second writer is tried on each case too: after a random step of a new
run, ``cvae train --resume`` and ``cvae train --out --overwrite`` are tried on its directory from
this process (the run frozen meanwhile, so that only they could change a file), then the run goes
on to its end. Under ``jax.distributed``, two runs of two processes (``cvae launch``) are sent
SIGTERM to process 1 alone after a random step, and each is resumed (in one process) to its end.
For pure JAX, a run is also made on a real 1 MB file system (a tmpfs mounted in a user namespace
with ``unshare``, where the machine allows it without root) that fills up; space is freed and the
run resumed.

A fault is survived when the process ended as promised (SIGKILL: killed; SIGTERM: status 143 with
nothing lost; a full disk: status 74), the resume started from a checkpoint no more than
``--checkpoint-every`` steps behind the last step recorded, and the run ended with the records and
the canonical state, bit for bit, of the uninterrupted run. A second writer is survived when it was
refused (status 2, one line naming the holder's pid) with every file of the run as it was, and the
first run then ended, bit for bit, as the uninterrupted one. SIGTERM to one process of two is
survived when the launcher ended with status 143, the checkpoint of the step both stopped at is
intact and holds every recorded step, and ``--resume`` finished the run. Steps lost: steps recorded
in ``metrics.jsonl`` past the checkpoint the resume started from (for a second writer: past the
first run's last checkpoint when it ended).

``--render`` rewrites the table in docs/checkpoints.md between its ``faults`` markers from the
result file.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# pure JAX over two host devices runs in this process too: the devices are split before JAX starts
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the runs, kills and comparisons of the fault suite

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "faults_cpu.json"
DOC = ROOT / "docs" / "checkpoints.md"
BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"
SHARDED = ("--data-parallel", "sharded", "--devices", "2")
TWO_PROCESS_RUNS = 2  # runs of two processes under jax.distributed, each sent one SIGTERM
KINDS = {  # kind -> what it is, in the table
    "kill_in_save": "SIGKILL in the middle of a save",
    "kill_after_step": "SIGKILL after a random step",
    "sigterm": "SIGTERM after a random step",
    "sigterm_one_of_two": "SIGTERM to one process of two (jax.distributed)",
    "second_writer": "a second writer on the same run directory",
    "truncated": "latest checkpoint truncated",
    "bit_flipped": "latest checkpoint bit-flipped",
    "full_disk": "a real 1 MB file system fills up",
}


def quiet_train(*args: str) -> int:
    """``cvae train`` in this process (no final evaluation and pictures), its report unprinted."""
    import run_helpers as h

    with contextlib.redirect_stdout(io.StringIO()):
        return h.train(*args)


def same_run(run_dir: Path, reference: Path) -> bool:
    import run_helpers as h

    try:
        h.assert_same_run(run_dir, reference)
    except AssertionError:
        return False
    return True


def chain(impl: str, extra: tuple[str, ...], points: int, rng: random.Random, work: Path) -> list:
    """One run through every process-level fault; then its damaged-checkpoint copies."""
    import run_helpers as h

    reference = work / "reference"
    args = ["--impl", impl, *h.TINY, *extra, "--checkpoint-every", "0", "--out", str(reference)]
    assert quiet_train(*args) == 0, f"{impl}: the uninterrupted run failed"
    out = work / "run"
    faults = []
    status, lost = h.kill_during_save(h.fault_args(impl, out, extra), out, rng.randint(2, 4))
    faults.append(("kill_in_save", status == -signal.SIGKILL, lost))
    for kind, sig, expected in [("kill_after_step", signal.SIGKILL, -signal.SIGKILL)] * points + [
        ("sigterm", signal.SIGTERM, 128 + signal.SIGTERM)
    ]:
        step = rng.randint(max(h.committed(out), default=0) + 1, h.TOTAL - 1)
        delay = rng.uniform(0.0, 0.05)  # a step takes milliseconds: somewhere in the next few
        status, lost, _ = h.signal_after_step(h.resume_args(out), out, step, sig, delay)
        promised = 0 if sig == signal.SIGTERM else h.EVERY
        faults.append((kind, status == expected and lost <= promised, lost))
    finished = quiet_train(*h.resume_args(out)[1:], "--iw-samples", "1") == 0
    same = finished and same_run(out, reference)
    records = [record(impl, extra, kind, ok and same, lost) for kind, ok, lost in faults]
    records += second_writers(impl, extra, rng, work, reference)
    for kind, how in (("truncated", "truncate"), ("bit_flipped", "flip")):
        damaged = work / kind
        shutil.copytree(out, damaged)
        latest = max(h.committed(damaged))
        h.corrupt(h.largest_array_file(damaged / "checkpoints" / str(latest)), how)
        resumed = quiet_train("--resume", str(damaged), "--resume-latest-good", "--no-progress")
        resumed = resumed == 0
        config = json.loads((damaged / "config.json").read_text())
        lost = latest - config["resumes"][-1]["step"] if resumed else None
        ok = resumed and lost <= h.EVERY and same_run(damaged, reference)
        records.append(record(impl, extra, kind, ok, lost))
    return records


def second_writers(
    impl: str, extra: tuple[str, ...], rng: random.Random, work: Path, reference: Path
) -> list:
    """A new run frozen after a random step, a ``--resume`` and a new run ``--overwrite`` tried on
    its directory, then the run let go on to its end."""
    import run_helpers as h

    out = work / "first"
    step = rng.randint(1, h.TOTAL - 1)
    first = h.start(h.fault_args(impl, out, extra), work)
    tries = []
    try:
        h.wait_for(first, lambda: h.last_recorded_step(out) >= step, f"step {step}")
        for args in (h.resume_args(out)[1:], [*h.TINY, "--out", str(out), "--overwrite"]):
            status, message, unchanged = h.second_writer(first, out, *args)
            refused = status == 2 and f"held by pid {first.pid} " in message
            tries.append((refused and unchanged and len(message.splitlines()) == 1, message))
        status, _ = h.finish(first)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    same = status == 0 and same_run(out, reference)
    lost = h.lost_steps(out)
    records = []
    for ok, message in tries:
        records.append(record(impl, extra, "second_writer", ok and same, lost))
        records[-1]["message"] = message
    return records


def term_one_of_two(rng: random.Random, work: Path) -> dict:
    """A run of two processes sent SIGTERM to process 1 alone after a random step, then resumed in
    one process to its end."""
    import run_helpers as h

    from cvae_rosetta.app import checkpoint

    out = work / "run"
    status, stderr = h.term_one_process_of_two(out, after_step=rng.randint(10, 400))
    step = lost = None
    with contextlib.suppress(AssertionError, ValueError):  # no stopped line: not survived
        step = h.stopped_step(stderr)
    if h.committed(out):
        lost = h.lost_steps(out)
    ok = status == 143 and step is not None and lost == 0 and "Traceback" not in stderr
    ok = ok and h.committed(out)[-1] == step and checkpoint.latest_of_run(out).step == step
    if ok:  # at its own cadence, not the tiny runs' checkpoint every 3 steps
        resume = ["--resume", str(out), "--checkpoint-every", "40", "--no-progress"]
        ok = quiet_train(*resume, "--iw-samples", "1") == 0
    rec = record(
        "pure_jax", SHARDED, "sigterm_one_of_two", ok, lost, "two processes, a device each"
    )
    rec["stopped_at"] = step
    return rec


def record(
    impl: str,
    extra: tuple[str, ...],
    kind: str,
    survived: bool,
    lost: int | None,
    mode: str | None = None,
) -> dict:
    mode = mode or ("sharded over 2 devices" if extra else "one device")
    print(f"{impl:12} {mode:24} {kind:16} survived={survived} lost={lost}", flush=True)
    return {"impl": impl, "mode": mode, "fault": kind, "survived": survived, "steps_lost": lost}


FULL_DISK = """
set -u
mount -t tmpfs -o size=1m none "$MNT"
head -c 307200 /dev/zero > "$MNT/filler"      # the room freed before the resume
"$PY" -m cvae_rosetta.cli "$@" --keep-checkpoints 100 --out "$MNT/run" 2> "$HOST/first.err"
echo $? > "$HOST/first.status"
cp -a "$MNT/run" "$HOST/failed"
rm "$MNT/filler"
"$PY" -m cvae_rosetta.cli train --resume "$MNT/run" --checkpoint-every 3 --no-progress \
    --iw-samples 1 2> "$HOST/second.err"
echo $? > "$HOST/second.status"
cp -a "$MNT/run" "$HOST/final"
"""


def full_disk(work: Path, reference: Path) -> dict | None:
    """A run on a 1 MB tmpfs in a user namespace; None where the machine does not allow one."""
    import run_helpers as h

    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"]).returncode:
        print("full disk: no user namespace here (unshare -rm); skipped", flush=True)
        return None
    mount = work / "mnt"
    mount.mkdir(parents=True)
    env = {**os.environ, "MNT": str(mount), "HOST": str(work), "PY": sys.executable}
    args = h.fault_args("pure_jax", Path("unused"), ())[:-2]  # --out is the script's
    subprocess.run([unshare, "-rm", "bash", "-c", FULL_DISK, "full-disk", *args], env=env)
    first = int((work / "first.status").read_text())
    second = int((work / "second.status").read_text())
    message = (work / "first.err").read_text().strip().splitlines()
    lost = h.lost_steps(work / "failed")
    ok = first == 74 and len(message) == 1 and second == 0 and lost <= h.EVERY
    ok = ok and same_run(work / "final", reference)
    print(f"full disk: {message[-1] if message else ''}", flush=True)
    rec = record("pure_jax", (), "full_disk", ok, lost)
    rec["message"] = message[-1] if message else ""
    return rec


def measure(impls: list[str], points: int, seed: int) -> dict:
    import jax

    rng = random.Random(seed)
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        cases = [(name, ()) for name in impls] + [("pure_jax", SHARDED)]
        for number, (impl, extra) in enumerate(cases):
            work = Path(scratch) / f"case{number}"
            work.mkdir()
            records += chain(impl, extra, points, rng, work)
        for number in range(TWO_PROCESS_RUNS):
            work = Path(scratch) / f"two-processes{number}"
            work.mkdir()
            records.append(term_one_of_two(rng, work))
        disk = full_disk(Path(scratch) / "disk", Path(scratch) / "case0" / "reference")
        if disk is not None:
            records.append(disk)
    summary = {}
    for kind in KINDS:
        mine = [r for r in records if r["fault"] == kind]
        if mine:
            lost = [r["steps_lost"] for r in mine if r["steps_lost"] is not None]
            summary[kind] = {
                "tried": len(mine),
                "survived": sum(r["survived"] for r in mine),
                "steps_lost_max": max(lost, default=None),
                "steps_lost_mean": round(statistics.mean(lost), 2) if lost else None,
            }
    return {
        "schema": 1,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {"jax": jax.__version__},
        "settings": {
            "checkpoint_every": 3,
            "steps": 32,
            "points": points,
            "seed": seed,
            "two_process_runs": TWO_PROCESS_RUNS,
        },
        "implementations": impls,
        "summary": summary,
        "faults": records,
    }


_HOLDER = "got RUN, held by pid PID on HOST since TIME"  # a second writer's message, made general


def table(result: dict) -> str:
    every = result["settings"]["checkpoint_every"]
    tried = sum(s["tried"] for s in result["summary"].values())
    survived = sum(s["survived"] for s in result["summary"].values())
    lines = [
        f"Measured by `python benchmarks/fault_report.py` on {result['machine']['cpu_count']} CPU "
        f"cores (JAX {result['versions']['jax']}): {survived} of {tried} faults survived, in runs "
        f"of {result['settings']['steps']} steps with a checkpoint every {every} of "
        f"{', '.join(result['implementations'])} (one device) and pure JAX over two host devices, "
        f"and {result['settings'].get('two_process_runs', 0)} runs of pure JAX in two processes "
        "under jax.distributed (1,600 steps, a checkpoint every 40). Promised: at most "
        f"{every} steps lost to SIGKILL, a damaged checkpoint or a full disk; none to SIGTERM or a "
        "second writer.",
        "",
        "| fault | tried | survived | steps lost (max) | steps lost (mean) |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, s in result["summary"].items():
        lines.append(
            f"| {KINDS[kind]} | {s['tried']} | {s['survived']} | "
            f"{s['steps_lost_max'] if s['steps_lost_max'] is not None else '-'} | "
            f"{s['steps_lost_mean'] if s['steps_lost_mean'] is not None else '-'} |"
        )
    disk = next((r for r in result["faults"] if r["fault"] == "full_disk"), None)
    if disk is not None and disk.get("message"):
        message = re.sub(r"\S*/mnt/run\b", "RUN", disk["message"])  # its scratch directory
        lines += ["", f"The full disk ended the run with (RUN its directory): `{message}`"]
    writer = next((r for r in result["faults"] if r["fault"] == "second_writer"), None)
    if writer is not None and writer.get("message"):
        message = re.sub(r"got \S+, held by pid \d+ on \S+ since \S+", _HOLDER, writer["message"])
        lines += ["", f"A second writer was refused with: `{message}`"]
    return "\n".join(lines)


def render(result: dict, doc: Path = DOC) -> None:
    from cvae_rosetta.bench.report import write_between_markers

    write_between_markers(doc, BEGIN, END, table(result))


def main(argv: list[str] | None = None) -> int:
    from cvae_rosetta.files import write_text
    from cvae_rosetta.spec import protocol

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--points", type=int, default=2, help="SIGKILLs after a random step [2]")
    parser.add_argument("--impls", default=None, help="comma-separated [every installed one]")
    parser.add_argument("--seed", type=int, default=0, help="of the random points [0]")
    parser.add_argument("--render", action="store_true", help="only render --out into the docs")
    args = parser.parse_args(argv)
    if not args.render:
        installed = [i.name for i in protocol.known() if i.installed and i.name in protocol.BUILTIN]
        impls = [n for n in args.impls.split(",") if n] if args.impls else installed
        result = measure(impls, args.points, args.seed)
        write_text(args.out, json.dumps(result, indent=2) + "\n", parents=True)
        print(f"wrote {args.out}")
    render(json.loads(args.out.read_text()))
    print(f"rendered {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
