"""What faults cost a run: a sweep of injected faults, each resumed and compared with a run that
was never interrupted.

For every installed implementation (``--impls``), and pure JAX over two host devices, a tiny run
(``tiny_runs``) is SIGKILLed in a random save, SIGKILLed after ``--points`` random steps and sent
SIGTERM after one, each resumed by the next process; its latest checkpoint is then truncated, and
bit-flipped, and resumed with ``--resume-latest-good``; and a second writer (``--resume``,
``--overwrite``) is tried on a new run frozen after a random step. Runs of two processes under
``jax.distributed`` are sent SIGTERM to one process, and a pure JAX run fills a 1 MB tmpfs (where
``unshare`` allows one). Survived: the process ended as promised (killed; status 143, 74 or 2 with
one line), lost no more steps than promised (steps ``metrics.jsonl`` recorded past the checkpoint
resumed from) and the run ended bit for bit as the uninterrupted one. ``--render`` only writes the
table into docs/checkpoints.md (a measurement does too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
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

import tiny_runs as h  # the runs, kills and comparisons of the fault tests

from cvae_rosetta.app import checkpoint, resuming
from cvae_rosetta.bench import results
from cvae_rosetta.bench.report import markdown_table, write_between_markers
from cvae_rosetta.files import write_json

ROOT = Path(__file__).resolve().parent.parent
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
HOLDER = r"got \S+, held by pid \d+ on \S+ since \S+"  # a second writer's message: made general


def same_run(run_dir: Path, reference: Path) -> bool:
    try:
        h.assert_same_run(run_dir, reference)
    except AssertionError:
        return False
    return True


def record(impl: str, mode: str, kind: str, survived: bool, lost: int | None, **more) -> dict:
    print(f"{impl:12} {mode:24} {kind:16} survived={survived} lost={lost}", flush=True)
    found = {"impl": impl, "mode": mode, "fault": kind, "survived": survived, "steps_lost": lost}
    return found | more


def chain(impl: str, extra: tuple[str, ...], points: int, rng: random.Random, work: Path) -> list:
    """One run through every process-level fault, each resumed by the next process; then its
    damaged-checkpoint copies, and a second writer on another run."""
    mode = "sharded over 2 devices" if extra else "one device"
    reference = work / "reference"
    args = ["--impl", impl, *h.TINY, *extra, "--checkpoint-every", "0", "--out", str(reference)]
    assert h.train(*args, quiet=True) == 0, f"{impl}: the uninterrupted run failed"
    out = work / "run"
    status, lost = h.kill_during_save(h.fault_args(impl, out, extra), out, rng.randint(2, 4))
    faults = [("kill_in_save", status == -signal.SIGKILL, lost)]
    kills = [("kill_after_step", signal.SIGKILL, -signal.SIGKILL, h.EVERY)] * points
    plan = [*kills, ("sigterm", signal.SIGTERM, 143, 0)]
    for left, (kind, sig, expected, promised) in reversed(list(enumerate(reversed(plan)))):
        # room for the faults still to come: a signal lands a few steps after the one asked for
        last = h.TOTAL - 1 - h.EVERY * left
        step = rng.randint(min(max(h.committed(out), default=0) + 1, last), last)
        delay = rng.uniform(0.0, 0.05)  # a step takes milliseconds: somewhere in the next few
        status, lost, _ = h.signal_after_step(h.resume_args(out), out, step, sig, delay)
        faults.append((kind, status == expected and lost <= promised, lost))
    finished = h.train(*h.resume_args(out)[1:], "--iw-samples", "1", quiet=True) == 0
    same = finished and same_run(out, reference)
    records = [record(impl, mode, kind, ok and same, lost) for kind, ok, lost in faults]
    records += second_writers(impl, extra, mode, rng, work, reference)
    for kind, how in (("truncated", "truncate"), ("bit_flipped", "flip")):
        shutil.copytree(out, damaged := work / kind)
        latest = max(h.committed(damaged))
        h.corrupt(h.largest_array_file(damaged / "checkpoints" / str(latest)), how)
        resume = ["--resume", str(damaged), "--resume-latest-good", "--no-progress"]
        resumed = h.train(*resume, quiet=True) == 0
        _, run, _ = resuming.read_run(damaged)  # config.json: where the resume started
        lost = latest - run["resumes"][-1]["step"] if resumed else None
        ok = resumed and lost <= h.EVERY and same_run(damaged, reference)
        records.append(record(impl, mode, kind, ok, lost))
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
            tries.append((refused and unchanged and len(message.splitlines()) == 1, message))
        status, _ = h.finish(first)
    finally:
        if first.poll() is None:
            h.kill(first)
    same = status == 0 and same_run(out, reference)
    lost = h.lost_steps(out)
    return [record(impl, mode, "second_writer", ok and same, lost, message=m) for ok, m in tries]


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
    ok = status == 143 and step is not None and lost == 0 and "Traceback" not in stderr
    ok = ok and h.committed(out)[-1] == step and checkpoint.latest_of_run(out).step == step
    if ok:  # at its own cadence, not the tiny runs' checkpoint every 3 steps
        resume = ["--resume", str(out), "--checkpoint-every", "40", "--no-progress"]
        ok = h.train(*resume, "--iw-samples", "1", quiet=True) == 0
    mode = "two processes, a device each"
    return record("pure_jax", mode, "sigterm_one_of_two", ok, lost, stopped_at=step)


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


def full_disk(work: Path, reference: Path) -> list[dict]:
    """A run on a 1 MB tmpfs in a user namespace, where the machine allows one."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"]).returncode:
        print("full disk: no user namespace here (unshare -rm); skipped", flush=True)
        return []
    (mount := work / "mnt").mkdir(parents=True)
    env = {**os.environ, "MNT": str(mount), "HOST": str(work), "PY": sys.executable}
    args = h.fault_args("pure_jax", Path("unused"), ())[:-2]  # --out is the script's
    subprocess.run([unshare, "-rm", "bash", "-c", FULL_DISK, "full-disk", *args], env=env)
    first, second = (int((work / f"{n}.status").read_text()) for n in ("first", "second"))
    lines = (work / "first.err").read_text().strip().splitlines()
    lost = h.lost_steps(work / "failed")
    ok = first == 74 and len(lines) == 1 and second == 0 and lost <= h.EVERY
    ok = ok and same_run(work / "final", reference)
    message = lines[-1] if lines else ""
    return [record("pure_jax", "one device", "full_disk", ok, lost, message=message)]


def measure(impls: list[str], points: int, seed: int, command: list[str]) -> dict:
    result = results.envelope("faults", command)
    rng = random.Random(seed)
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        for number, (impl, extra) in enumerate([(n, ()) for n in impls] + [("pure_jax", SHARDED)]):
            (work := Path(scratch) / f"case{number}").mkdir()
            records += chain(impl, extra, points, rng, work)
        for number in range(TWO_PROCESS_RUNS):
            (work := Path(scratch) / f"two-processes{number}").mkdir()
            records.append(term_one_of_two(rng, work))
        records += full_disk(Path(scratch) / "disk", Path(scratch) / "case0" / "reference")
    summary = {}
    for kind in KINDS:
        if mine := [r for r in records if r["fault"] == kind]:
            lost = [r["steps_lost"] for r in mine if r["steps_lost"] is not None]
            summary[kind] = {
                "tried": len(mine),
                "survived": sum(r["survived"] for r in mine),
                "steps_lost_max": max(lost, default=None),
                "steps_lost_mean": round(statistics.mean(lost), 2) if lost else None,
            }
    settings = {"checkpoint_every": h.EVERY, "steps": h.TOTAL, "points": points, "seed": seed}
    settings["two_process_runs"] = TWO_PROCESS_RUNS
    result.update(settings=settings, implementations=impls, summary=summary, faults=records)
    return result


def table(result: dict) -> str:
    env, settings, summary = result["environment"], result["settings"], result["summary"]
    every = settings["checkpoint_every"]
    tried = sum(s["tried"] for s in summary.values())
    survived = sum(s["survived"] for s in summary.values())
    cells = ("tried", "survived", "steps_lost_max", "steps_lost_mean")
    rows = [
        [KINDS[k], *("-" if s[c] is None else str(s[c]) for c in cells)] for k, s in summary.items()
    ]
    header = ("fault", "tried", "survived", "steps lost (max)", "steps lost (mean)")
    text = (
        f"Measured by `python benchmarks/fault_report.py` on {env['cpu_count']} CPU cores (JAX "
        f"{env['versions']['jax']}): {survived} of {tried} faults survived, in runs of "
        f"{settings['steps']} steps with a checkpoint every {every} of "
        f"{', '.join(result['implementations'])} (one device) and pure JAX over two host devices, "
        f"and {settings.get('two_process_runs', 0)} runs of pure JAX in two processes "
        "under jax.distributed (1,600 steps, a checkpoint every 40). Promised: at most "
        f"{every} steps lost to SIGKILL, a damaged checkpoint or a full disk; none to SIGTERM or a "
        f"second writer.\n\n{markdown_table(header, rows, 'lrrrr')}"
    )
    messages = {r["fault"]: r.get("message") for r in reversed(result["faults"])}  # the first's
    if message := messages.get("full_disk"):
        message = re.sub(r"\S*/mnt/run\b", "RUN", message)  # its scratch directory
        text += f"\nThe full disk ended the run with (RUN its directory): `{message}`\n"
    if message := messages.get("second_writer"):
        message = re.sub(HOLDER, "got RUN, held by pid PID on HOST since TIME", message)
        text += f"\nA second writer was refused with: `{message}`\n"
    return text.rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/faults_cpu.json")
    parser.add_argument("--points", type=int, default=2, help="SIGKILLs after a random step [2]")
    parser.add_argument("--impls", default=None, help="comma-separated [every installed one]")
    parser.add_argument("--seed", type=int, default=0, help="of the random points [0]")
    parser.add_argument("--render", action="store_true", help="only render --out into the docs")
    args = parser.parse_args(argv)
    if not args.render:
        impls = [n for n in args.impls.split(",") if n] if args.impls else h.INSTALLED
        command = ["python", "benchmarks/fault_report.py", *argv]
        result = measure(impls, args.points, args.seed, command)
        write_json(args.out, result, parents=True)
        print(f"wrote {args.out}")
    write_between_markers(DOC, BEGIN, END, table(results.load(args.out)))
    print(f"rendered {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
