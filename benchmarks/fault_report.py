"""What faults cost a run, swept over the points of a run where they strike: each fault tried, the
run gone on with as its one line says, and compared with a run that was never interrupted.

For every installed implementation (``--impls``), and pure JAX over two host devices, a tiny run
(``tiny_runs``) is SIGKILLed in a random save and after ``--points`` random steps, each resumed by
the next process; its latest checkpoint is then truncated, and bit-flipped, and resumed with
``--resume-latest-good``; a second writer (``--resume``, ``--overwrite``) is tried on a new run
frozen after a random step; SIGTERM and SIGINT are sent in every phase of ``tiny_runs.PHASES``
(pure JAX; the others in an epoch and a save). Runs of two processes under ``jax.distributed`` are
sent SIGTERM to one process, and a pure JAX run fills a tmpfs of every size from its first write to
its last (where ``unshare`` allows one). Survived: the status promised, at most one line and no
traceback on stderr (per process), no more steps lost than promised (steps ``metrics.jsonl``
recorded past the checkpoint gone on from), and the run ended bit for bit as the uninterrupted
one. ``--render`` only writes the table into docs/checkpoints.md (a measurement does too).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import NamedTuple

# pure JAX over two host devices runs in this process too: the devices are split before JAX starts
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from cvae_rosetta.app import checkpoint, resuming
from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench import results
from cvae_rosetta.bench.markdown import write_between_markers
from cvae_rosetta.cli import tiny_runs as h  # the runs, kills and comparisons of the fault tests
from cvae_rosetta.files import write_json

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "checkpoints.md"
BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"
SHARDED = ("--data-parallel", "sharded", "--devices", "2")
TWO_PROCESS_RUNS = 2  # runs of two processes under jax.distributed, each sent one SIGTERM
FAULTS = {  # fault -> what it is, in the table
    "sigkill": "SIGKILL",
    "sigterm": "SIGTERM",
    "sigint": "SIGINT (Ctrl-C)",
    "sigterm_one_of_two": "SIGTERM to one process of two (jax.distributed)",
    "second_writer": "a second writer on the same run directory",
    "truncated": "latest checkpoint truncated",
    "bit_flipped": "latest checkpoint bit-flipped",
    "full_disk": "a full disk (tmpfs)",
}
COUNTS = ("tried", "survived", "steps_lost_max", "lines_max", "tracebacks")  # the table's columns
HOLDER = r"got \S+, held by pid \d+ on \S+ since \S+"  # a second writer's message: made general


class Tried(NamedTuple):
    """Which try: the implementation, the mode it ran in (one device, sharded over two, two
    processes, a disk's size), the fault, and the phase of the run it struck in."""

    impl: str
    mode: str
    fault: str
    phase: str


def record(tried: Tried, ok: bool, lost, stderr: str = "") -> dict:
    """A try: survived when ``ok`` and no process printed more than a line or a traceback."""
    impl, mode, fault, phase = tried
    said = stderr.strip().splitlines()  # cvae launch prefixes each process's lines with [i]
    lines = max(
        Counter(re.match(r"(\[\d+\] )?", line).group() for line in said).values(), default=0
    )
    tracebacks = stderr.count("Traceback (most recent")
    survived = bool(ok) and lines <= 1 and not tracebacks
    print(
        f"{impl:10} {mode:22} {fault:13} {phase:22} survived={survived} lost={lost} lines={lines}"
    )
    found = {"impl": impl, "mode": mode, "fault": fault, "phase": phase, "survived": survived}
    return found | {"steps_lost": lost, "lines": lines, "tracebacks": tracebacks, "said": said[-1:]}


def in_process(*args: str) -> tuple[int, str]:
    """``cvae train ARGS`` in this process (no final evaluation or pictures): status, stderr."""
    with contextlib.redirect_stderr(err := io.StringIO()):
        return h.train(*args, quiet=True), err.getvalue()


def kills(impl: str, extra: tuple[str, ...], points: int, rng: random.Random, work: Path) -> list:
    """One run SIGKILLed in a save and after random steps, each resumed by the next process; then
    its damaged-checkpoint copies, and a second writer on another run."""
    mode = "sharded over 2 devices" if extra else "one device"
    reference = work / "reference"
    args = ["--impl", impl, *h.TINY, *extra, "--checkpoint-every", "0", "--out", str(reference)]
    assert h.train(*args, quiet=True) == 0, f"{impl}: the uninterrupted run failed"
    out = work / "run"
    status, lost, stderr = h.kill_during_save(
        h.fault_args(impl, out, extra), out, rng.randint(2, 4)
    )
    tries = [("a checkpoint save", status == -signal.SIGKILL, lost, stderr)]
    for left in reversed(range(points)):  # room for the kills still to come
        last = h.TOTAL - 1 - h.EVERY * left
        step = rng.randint(min(max(h.committed(out), default=0) + 1, last), last)
        delay = rng.uniform(0.0, 0.05)  # a step takes milliseconds: somewhere in the next few
        status, lost, stderr = h.signal_after_step(h.resume_args(out), out, step, 9, delay)
        tries.append(("an epoch", status == -signal.SIGKILL and lost <= h.EVERY, lost, stderr))
    finished = in_process(*h.resume_args(out)[1:], "--iw-samples", "1")[0] == 0
    same = finished and h.same_run(out, reference)
    records = [record(Tried(impl, mode, "sigkill", p), ok and same, n, e) for p, ok, n, e in tries]
    records += second_writers(impl, extra, mode, rng, work, reference)
    for kind, how in (("truncated", "truncate"), ("bit_flipped", "flip")):
        shutil.copytree(out, damaged := work / kind)
        latest = max(h.committed(damaged))
        h.corrupt(h.largest_array_file(damaged / "checkpoints" / str(latest)), how)
        status, stderr = in_process(
            "--resume", str(damaged), "--resume-latest-good", "--no-progress"
        )
        _, run, _ = resuming.read_run(damaged)  # config.json: where the resume started
        lost = latest - run["resumes"][-1]["step"] if status == 0 else None
        ok = status == 0 and lost <= h.EVERY and h.same_run(damaged, reference)
        records.append(record(Tried(impl, mode, kind, "a resume"), ok, lost, stderr))
    return records


def signals(impl: str, phases: list[str], rng: random.Random, work: Path, reference: Path) -> list:
    """SIGTERM and SIGINT in each of ``phases``, each run gone on with as its line says."""
    records = []
    for phase in phases:
        for sig in (signal.SIGTERM, signal.SIGINT):
            (where := work / f"{phase}-{sig}".replace(" ", "-")).mkdir()
            step = rng.randint(1, h.TOTAL - 1)
            status, stderr, lost, same = h.signal_in_phase(phase, sig, impl, where, reference, step)
            ok = status == 128 + sig and lost == 0 and same
            fault = signal.Signals(sig).name.lower()
            records.append(record(Tried(impl, "one device", fault, phase), ok, lost, stderr))
    return records


def second_writers(impl, extra, mode: str, rng: random.Random, work: Path, reference: Path) -> list:
    """A new run frozen after a random step, a ``--resume`` and a new run ``--overwrite`` tried on
    its directory, then the run let go on to its end."""
    out = work / "first"
    step = rng.randint(1, h.TOTAL - 1)
    first = h.start(h.fault_args(impl, out, extra), work)
    tries = []
    try:
        h.wait_for(first, lambda: h.last_recorded_step(out) >= step, f"step {step}")
        for args in (h.resume_args(out)[1:], [*h.TINY, "--out", str(out), "--overwrite"]):
            status, message, unchanged = h.second_writer(first, out, *args)
            refused = status == 2 and f"held by pid {first.pid} " in message
            tries.append((refused and unchanged, message))
        status, _ = h.finish(first)
    finally:
        if first.poll() is None:
            h.kill(first)
    same = status == 0 and h.same_run(out, reference)
    lost = h.lost_steps(out)
    tried = Tried(impl, mode, "second_writer", "an epoch")
    return [record(tried, ok and same, lost, m) for ok, m in tries]


def term_one_of_two(rng: random.Random, work: Path) -> dict:
    """A run of two processes sent SIGTERM to process 1 alone after a random step: survived when
    the launcher ended with status 143, the checkpoint of the step both stopped at is intact and
    holds every recorded step, and a resume in one process finished the run."""
    out = work / "run"
    status, stderr = h.term_one_process_of_two(out, after_step=rng.randint(10, 400))
    step = lost = None
    with contextlib.suppress(AssertionError, ValueError):  # no stopped line: not survived
        step = h.stopped_step(stderr)
    if h.committed(out):
        lost = h.lost_steps(out)
    ok = status == 143 and step is not None and lost == 0
    ok = ok and h.committed(out)[-1] == step and checkpoint.latest_of_run(out).step == step
    if ok:  # at its own cadence, not the tiny runs' checkpoint every 3 steps
        resume = ["--resume", str(out), "--checkpoint-every", "40", "--no-progress"]
        ok = h.train(*resume, "--iw-samples", "1", quiet=True) == 0
    mode = "two processes, a device each"
    return record(Tried("pure_jax", mode, "sigterm_one_of_two", "an epoch"), ok, lost, stderr)


FULL_DISK = """
set -u
mount -t tmpfs -o size="${SIZE}k" none "$MNT"
"$PY" -m cvae_rosetta.cli "$@" --out "$MNT/run" > /dev/null 2> "$HOST/first.err"
echo $? > "$HOST/first.status"
ls "$MNT/run/checkpoints" 2> /dev/null | grep -c orbax-checkpoint-tmp > "$HOST/left"
cp -a "$MNT/run" "$HOST/failed" 2> /dev/null  # as the fault left it: the steps lost
mount -o remount,size=64m "$MNT"
if grep -q -- "go on with: cvae train --resume" "$HOST/first.err"; then
    "$PY" -m cvae_rosetta.cli train --resume "$MNT/run" --no-progress --iw-samples 1
else  # the same command, over what the first wrote
    "$PY" -m cvae_rosetta.cli "$@" --out "$MNT/run" --overwrite
fi > /dev/null 2> "$HOST/second.err"
echo $? > "$HOST/second.status"
cp -a "$MNT/run" "$HOST/final"
"""


def full_disk(work: Path, reference: Path, step_kb: int) -> list[dict]:
    """A pure JAX run on a tmpfs of 4, 8, 16 KB, then every ``step_kb`` until one holds the whole
    run (its evaluation and pictures too), in a user namespace where the machine allows one."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"]).returncode:
        print("full disk: no user namespace here (unshare -rm); skipped", flush=True)
        return []
    args = h.fault_args("pure_jax", Path("unused"), ())[:-2]  # --out is the script's
    records = []
    for size in [4, 8, 16, *range(step_kb, 64 * 1024, step_kb)]:  # the first writes are small
        shutil.rmtree(work, ignore_errors=True)
        (mount := work / "mnt").mkdir(parents=True)
        env = {**os.environ, "SIZE": str(size), "MNT": str(mount), "HOST": str(work)}
        env["PY"] = sys.executable
        subprocess.run([unshare, "-rm", "bash", "-c", FULL_DISK, "full-disk", *args], env=env)
        first, second = (int((work / f"{n}.status").read_text()) for n in ("first", "second"))
        if first == 0:  # the whole run fitted: the sweep is over
            return records
        stderr = (work / "first.err").read_text()
        what = re.search(r"could not write \S+ \((.+?)\)", stderr)
        phase = re.sub(r"\d+", "N", what.group(1)) if what else "?"
        lost = h.lost_steps(work / "failed") if (work / "failed").is_dir() else 0
        left = int((work / "left").read_text() or 0)  # a failed save's directory not removed
        ok = first == 74 and second == 0 and not left and h.same_run(work / "final", reference)
        tried = Tried("pure_jax", f"{size} KB", "full_disk", phase)
        records.append(record(tried, ok, lost, stderr))
    return records


def measure(impls: list[str], points: int, seed: int, disk_kb: int, command: list[str]) -> dict:
    result = results.envelope("faults", command)
    rng = random.Random(seed)
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, (impl, extra) in enumerate([(n, ()) for n in impls] + [("pure_jax", SHARDED)]):
            (work := Path(scratch) / f"case{number}").mkdir()
            records += kills(impl, extra, points, rng, work)
            if not extra:
                phases = list(h.PHASES) if impl == "pure_jax" else ["an epoch", "a checkpoint save"]
                records += signals(impl, phases, rng, work, work / "reference")
        for number in range(TWO_PROCESS_RUNS):
            (work := Path(scratch) / f"two-processes{number}").mkdir()
            records.append(term_one_of_two(rng, work))
        reference = Path(scratch) / f"case{impls.index('pure_jax')}" / "reference"
        records += full_disk(Path(scratch) / "disk", reference, disk_kb)
    summary: dict[str, dict] = {}
    for r in records:
        row = summary.setdefault(f"{r['fault']}|{r['phase']}", dict.fromkeys(COUNTS, 0))
        row["tried"], row["survived"] = row["tried"] + 1, row["survived"] + r["survived"]
        row["tracebacks"] += r["tracebacks"]
        row["lines_max"] = max(row["lines_max"], r["lines"])
        row["steps_lost_max"] = max(row["steps_lost_max"], r["steps_lost"] or 0)
    settings = {"checkpoint_every": h.EVERY, "steps": h.TOTAL, "points": points, "seed": seed}
    settings |= {"two_process_runs": TWO_PROCESS_RUNS, "disk_step_kb": disk_kb}
    result.update(settings=settings, implementations=impls, summary=summary, faults=records)
    return result


def table(result: dict) -> str:
    env, settings, summary = result["environment"], result["settings"], result["summary"]
    tried = sum(s["tried"] for s in summary.values())
    survived = sum(s["survived"] for s in summary.values())
    order = list(FAULTS)
    keys = sorted(summary, key=lambda key: order.index(key.split("|")[0]))
    rows = [
        [FAULTS[k.split("|")[0]], k.split("|")[1], *map(str, summary[k].values())] for k in keys
    ]
    header = ("fault", "when", "tried", "survived", "steps lost (max)", "lines (max)", "tracebacks")
    text = (
        f"Measured by `python benchmarks/fault_report.py` on {env['cpu_count']} CPU cores (JAX "
        f"{env['versions']['jax']}): {survived} of {tried} faults survived, in runs of "
        f"{settings['steps']} steps with a checkpoint every {settings['checkpoint_every']} of "
        f"{', '.join(result['implementations'])} (one device) and pure JAX over two host devices, "
        f"{settings['two_process_runs']} runs of pure JAX in two processes under jax.distributed "
        f"(a checkpoint every 40), and a full disk at 4, 8, 16 KB and every "
        f"{settings['disk_step_kb']} KB until the run fitted. Survived: the status promised, at "
        "most one line (per process) and no traceback, and, gone on with as that line says, the "
        "run ended bit for bit as one never interrupted. Promised: at most "
        f"{settings['checkpoint_every']} steps lost to SIGKILL, a damaged checkpoint or a full "
        'disk; none to a signal or a second writer. A full disk\'s "when" is what its line said '
        "it could not write.\n\n"
        f"{markdown_table(header, rows, 'llrrrrr')}"
    )
    said = {r["fault"]: r["said"] for r in reversed(result["faults"]) if r["said"]}  # the first's
    for fault, label in (("full_disk", "A full disk"), ("second_writer", "A second writer")):
        if fault in said:
            message = re.sub(HOLDER, "got RUN, held by pid PID on HOST since TIME", said[fault][0])
            message = re.sub(r"\S*/mnt/run\b", "RUN", message)  # its scratch directory
            text += f"\n{label} was told (RUN its directory): `{message}`\n"
    return text.rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/faults_cpu.json")
    parser.add_argument("--points", type=int, default=2, help="SIGKILLs after a random step [2]")
    parser.add_argument("--impls", default=None, help="comma-separated [every installed one]")
    parser.add_argument("--seed", type=int, default=0, help="of the random points [0]")
    parser.add_argument("--disk-step", type=int, default=32, help="KB between tmpfs sizes [32]")
    parser.add_argument("--render", action="store_true", help="only render --out into the docs")
    args = parser.parse_args(argv)
    if not args.render:
        impls = [n for n in args.impls.split(",") if n] if args.impls else h.INSTALLED
        command = ["python", "benchmarks/fault_report.py", *argv]
        result = measure(impls, args.points, args.seed, args.disk_step, command)
        write_json(args.out, result, parents=True)
        print(f"wrote {args.out}")
    write_between_markers(DOC, BEGIN, END, table(results.load(args.out)))
    print(f"rendered {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
