"""Every GPU measurement of this project in one prepared run: the driver of ``benchmarks/gpu.sh``.

    benchmarks/gpu.sh [--smoke-cpu] [--budget SECONDS] [--out DIR] [--only PART,PART]
                      [--limit PART=SECONDS,...]
    benchmarks/gpu.sh --merge LATER/bench_gpu.json [--out DIR]

Read ``benchmarks/gpu.sh`` first: it says how to install, what the run does and why each part
has the time it has. In short, on a machine whose JAX sees a GPU, one part after the other, each
in processes of its own under a time limit:

- ``preflight``: the device, the versions, ``jax.print_environment_info()``;
- ``bench``: ``cvae bench`` over every implementation and path at batch sizes 1 and 4096, with
  its compile times, per-call overhead, roof and pure JAX's data-parallel mechanisms;
- ``bf16``: ``benchmarks/step_time.py``, float32 against bfloat16 at batch 256 and 4096;
- ``dispatch``: ``benchmarks/dispatch.py``, what one call costs at batch 1;
- ``data_parallel``: ``benchmarks/data_parallel.py``, every mechanism on the devices present;
- ``roof``: ``benchmarks/roof_gap.py``, pure JAX's step and its parts against a large matmul;
- ``bench_2``, ``bench_3``: ``cvae bench`` at batch sizes 8 and 256, 64 and 1024, merged into
  the same file, as far as the time goes;
- ``suite``: the conformance suite, every implementation at once (one process for its
  precision and bfloat16 checks, one for the rest) and the pairs of implementations.

Every part's outcome (done, failed, timed out, skipped for lack of time) is recorded in
``bench_SUFFIX.json`` under ``gpu_run``; a failing part never stops the others. The figures go to
``bench_gpu.json`` (the ``cvae bench`` result), ``step_time_gpu.json``, ``dispatch_gpu.json``,
``data_parallel_gpu.json`` and ``roof_gap_gpu.json`` (the files those scripts write with
``--out``), the logs and the suite's reports to ``gpu_logs/`` beside them (``runs/gpu_logs/``
when the files go to ``benchmarks/results/``). With ``--smoke-cpu`` the same parts
run on the CPU at toy sizes and the files are named ``*_smoke.json`` (no figure there means
anything; it checks that the script still runs).

``--limit bench=240`` replaces a part's time limit (still shrunk to what the budget leaves).
``--merge`` runs nothing: it folds the ``bench_gpu.json`` of a later run of some parts (say
``--only bench --out elsewhere``) into the one in ``--out`` (default ``benchmarks/results``), the
later run's parts replacing the earlier's, each marked with the run it came from
(:func:`merge_runs`).

This file imports no JAX: every measurement runs in a child process, so that a part that crashes
or hangs costs only its own time limit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SUITE_DIR = ROOT / "conformance"
SCHEMA = "cvae-gpu-run/1"
REFERENCE = "pure_jax"
TOY = "--rounds 1 --steps 2"  # a smoke run's rounds
REFUSED = 2  # the exit status when there is no GPU (the CLI's for refused input)
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_")
SMOKE_WORKERS = 3  # parts side by side in a smoke run
GRACE_S = 10.0  # from the polite stop (SIGINT, SIGTERM) to SIGKILL
LOG_TAIL = 3000  # characters of a failed process's output kept in the JSON
# What the mode changes: the budget, what the suite gets at least and at most, the file suffix.
BUDGET_S = {"gpu": 450.0, "smoke": 600.0}
SUITE_RESERVE_S = {"gpu": 120.0, "smoke": 60.0}
SUITE_MAX_S = {"gpu": 330.0, "smoke": 240.0}

PROBE = r"""
import importlib.metadata as md, json, os, platform
import jax
from cvae_rosetta.bench.harness import cpu_model
from cvae_rosetta.spec import protocol

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

devices = jax.devices()
names = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
         "jax-cuda13-pjrt", "numpy", "optax", "flax", "dm-haiku", "jmp", "equinox",
         "orbax-checkpoint", "chex", "pytest", "hypothesis", "tensorboardX", "cvae-rosetta")
memory = None
try:
    memory = (devices[0].memory_stats() or {}).get("bytes_limit")
except Exception:
    pass
try:
    info = jax.print_environment_info(return_string=True)
except Exception as err:
    info = f"jax.print_environment_info failed: {err!r}"
print("PROBE " + json.dumps({
    "device": {
        "platform": devices[0].platform,
        "backend": jax.default_backend(),
        "kind": devices[0].device_kind,
        "count": len(devices),
        "devices": [str(d) for d in devices],
        "memory_bytes": memory,
    },
    "versions": {"python": platform.python_version(), **{n: version(n) for n in names}},
    "host": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
             "platform": platform.platform()},
    "implementations": [i.name for i in protocol.known() if i.installed],
    "matmul_precision": str(getattr(jax.config, "jax_default_matmul_precision", None)),
    "environment_info": info,
}))
"""


# --- running child processes under a time limit ---------------------------------------------------


@dataclasses.dataclass
class Job:
    """One child process: what it runs, where its output goes, and how it ended."""

    name: str
    command: list[str]
    log: Path
    env: dict[str, str]
    cwd: Path
    stop: int = signal.SIGTERM  # the polite stop at the time limit (pytest: SIGINT)
    rc: int | None = None
    seconds: float = 0.0
    timed_out: bool = False

    def status(self) -> str:
        return "timed out" if self.timed_out else "ok" if self.rc == 0 else "failed"

    def tail(self, chars: int = LOG_TAIL) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status(),
            "rc": self.rc,
            "seconds": round(self.seconds, 1),
            "command": self.command,
            "log": self.log.name,
            **({"tail": self.tail()} if self.status() != "ok" else {}),
        }


def run_jobs(jobs: Sequence[Job], limit: float) -> None:
    """Run ``jobs`` side by side, each in a process group of its own; at ``limit`` seconds stop
    the ones still running (their ``stop`` signal, SIGKILL :data:`GRACE_S` later)."""
    started = time.monotonic()
    procs = []
    for job in jobs:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        with open(job.log, "wb") as log:
            procs.append(
                subprocess.Popen(
                    job.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=job.env,
                    cwd=job.cwd,
                    start_new_session=True,
                )
            )
    try:
        for job, proc in zip(jobs, procs, strict=True):
            left = max(0.0, limit - (time.monotonic() - started))
            try:
                job.rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                job.timed_out = True
                _signal(proc, job.stop)
            job.seconds = time.monotonic() - started
        grace = time.monotonic() + GRACE_S  # one grace period for all of them
        for job, proc in zip(jobs, procs, strict=True):
            if job.timed_out:
                try:
                    job.rc = proc.wait(timeout=max(0.0, grace - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal(proc, signal.SIGKILL)
                    job.rc = proc.wait()
                job.seconds = time.monotonic() - started
    finally:  # the driver itself stopped (Ctrl-C): leave no child behind
        for proc in procs:
            if proc.poll() is None:
                _signal(proc, signal.SIGKILL)
                proc.wait()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


# --- the run --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """Where everything goes, the clock and the record being written."""

    mode: str  # "gpu" or "smoke"
    out: Path
    logs: Path
    deadline: float
    python: str
    record: dict[str, Any]
    probe: dict[str, Any]
    benches: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # by part
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def smoke(self) -> bool:
        return self.mode == "smoke"

    def file(self, stem: str) -> Path:
        return self.out / f"{stem}_{'smoke' if self.smoke else 'gpu'}.json"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def env(self, **changes: str | None) -> dict[str, str]:
        """The children's environment: the caller's, with JAX's persistent compilation cache
        off (compile times are measured cold); a smoke run's on the CPU, its programs compiled
        without optimisation and kept in a cache of its own, which the parts share (the same
        small programs recur from part to part; no figure of a smoke run means anything)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(CACHE_VARIABLES)}
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        if self.smoke:
            env["JAX_PLATFORMS"] = "cpu"
            env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # compiles twice as fast
            env["JAX_ENABLE_COMPILATION_CACHE"] = "true"
            env["JAX_COMPILATION_CACHE_DIR"] = str(self.logs / "jax-cache" / "smoke")
            env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
            env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def job(self, name: str, command: list[str], **kwargs: Any) -> Job:
        env = kwargs.pop("env", None) or self.env()
        cwd = kwargs.pop("cwd", None) or self.logs
        return Job(name, command, self.logs / f"{name}.log", env, cwd, **kwargs)

    def add_bench(self, part: str, measured: dict[str, Any]) -> None:
        with self.lock:
            self.benches[part] = measured

    def write(self) -> None:
        """``bench_SUFFIX.json``: the ``cvae bench`` figures (its runs merged, in the order of
        :data:`PARTS`), if any, and the run's record under ``gpu_run``."""
        with self.lock:
            bench: dict[str, Any] = {}
            for part in PARTS:
                if part.name in self.benches:
                    bench = merge_bench(bench, self.benches[part.name])
            write_json(
                self.file("bench"), {**bench, "gpu_run": json.loads(json.dumps(self.record))}
            )


def write_json(path: Path, data: Any) -> None:
    """``data`` as ``path``, replaced whole (a temporary file renamed over it)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


@dataclasses.dataclass(frozen=True)
class Part:
    name: str
    what: str
    limit_s: dict[str, float]  # by mode: at most this long
    run: Callable[[Run, float], dict[str, Any]]
    minimum_s: float = 15.0  # less time than this left: skipped


def _script(run: Run, name: str, *args: str) -> list[str]:
    return [run.python, str(BENCHMARKS / name), *args]


def _device_counts(run: Run) -> str:
    """The data-parallel device counts: 1, 2, 4, 8 as far as the devices present go."""
    count = run.probe["device"]["count"] if not run.smoke else 1
    return ",".join(str(n) for n in (1, 2, 4, 8) if n <= count)


def _figures_part(stem: str, make_args: Callable[[Run], list[str]], script: str):
    """A part that runs one benchmark script with ``--out`` its file, and reads the file back."""

    def part(run: Run, limit: float) -> dict[str, Any]:
        path = run.file(stem)
        path.unlink(missing_ok=True)
        job = run.job(stem, _script(run, script, *make_args(run), "--out", str(path)))
        run_jobs([job], limit)
        result = {"status": job.status(), "file": path.name, "jobs": [job.record()]}
        if not path.is_file():
            result["status"] = "failed" if job.status() == "ok" else job.status()
            result["error"] = f"{script} wrote no {path.name}"
        elif job.status() == "timed out":
            result["status"] = "partial"  # step_time.py writes after every case
        return result

    return part


def _flags(text: str) -> list[str]:
    return text.split()


def _bf16_args(run: Run) -> list[str]:
    if run.smoke:
        return _flags(f"--impls {REFERENCE} --dtypes float32,bfloat16 --batch-sizes 2 {TOY}")
    # batch 4096 first: if the time runs out, the comparison where bfloat16 matters is there
    return _flags("--dtypes float32,bfloat16 --batch-sizes 4096,256 --rounds 5 --steps 100")


def _dispatch_args(run: Run) -> list[str]:
    # the two other configurations of dispatch.py are XLA:CPU settings
    if run.smoke:
        return _flags(f"--configs default --impls {REFERENCE} --batch-sizes 2 {TOY}")
    return _flags("--configs default --batch-sizes 1 --rounds 5 --steps 100")


def _parallel_args(run: Run) -> list[str]:
    if run.smoke:
        return _flags(f"--impls {REFERENCE} --devices 1 --batch-size 2 {TOY}")
    return _flags(f"--devices {_device_counts(run)} --batch-size 256 --rounds 5 --steps 50")


def _roof_args(run: Run) -> list[str]:
    # the other flag sets of roof_gap.py are XLA:CPU flags; the default set measures the step and
    # its parts against an N x N matmul on the same device (N = 8192 here: a 1024 matmul takes a
    # few microseconds on a large GPU and would measure the call, not the device)
    if run.smoke:
        return _flags(f"--sets default --passes 1 --batch-size 2 --roof-size 64 {TOY}")
    return _flags(
        "--sets default --passes 1 --batch-size 4096 --roof-size 8192 --rounds 5 --steps 12"
    )


# --- cvae bench, in runs of two batch sizes merged into one file ---------------------------------

# The batch sizes of each run, on the GPU and in a smoke run: small runs, so that a run the time
# limit stops loses only its own two; the first pair spans the range.
BENCH_BATCHES = {
    "bench": ("1,4096", "2"),
    "bench_2": ("8,256", "4"),
    "bench_3": ("64,1024", None),  # not in a smoke run: two runs check the merge
}


def _bench_args(run: Run, name: str) -> list[str]:
    gpu, smoke = BENCH_BATCHES[name]
    first = name == "bench"
    if run.smoke:
        return [
            *("--impls", REFERENCE, "--batch-sizes", smoke),
            *("--rounds", "1", "--steps", "8", "--epoch-examples", "16", "--unrolls", "1"),
            *("--devices", "1", "--mechanisms", "sharded", "--parallel-impls", REFERENCE),
            *("--parallel-batch", "2", "--roof-size", "64"),
        ]
    # Every implementation and path. Five rounds and no unroll beyond 1: compiles, not rounds,
    # are what costs time here (one step at batch 4096 is well under a millisecond), and each
    # unroll is one more compile per batch size. --epoch-examples 65536: at least 16 steps a
    # round even at batch 4096. The roof is an 8192 matmul (see _roof_args). The first run times
    # pure JAX's data-parallel mechanisms on every device count present (data_parallel.py times
    # every implementation's); the others only the least the command accepts.
    common = ["--batch-sizes", gpu, "--rounds", "5", "--unrolls", "1", "--epoch-examples", "65536"]
    common += ["--roof-size", "8192", "--parallel-impls", REFERENCE]
    if first:
        return [*common, "--devices", _device_counts(run)]
    return [*common, "--devices", "1", "--mechanisms", "sharded"]


def _bench_part(name: str):
    def part(run: Run, limit: float) -> dict[str, Any]:
        if run.smoke and BENCH_BATCHES[name][1] is None:
            return {"status": "skipped", "reason": "not in a smoke run"}
        out = run.logs / name
        command = [run.python, "-m", "cvae_rosetta", "bench", "--out", str(out), "--overwrite"]
        job = run.job(name, [*command, "--no-progress", *_bench_args(run, name)])
        run_jobs([job], limit)
        result = {"status": job.status(), "file": run.file("bench").name, "jobs": [job.record()]}
        source = out / "bench.json"
        if job.status() != "ok" or not source.is_file():
            result["status"] = job.status() if job.status() != "ok" else "failed"
            return result
        try:
            measured = json.loads(source.read_text())
            result["batch_sizes"] = sorted(int(b) for b in measured["batches"])
            run.add_bench(name, measured)
        except (OSError, ValueError, KeyError) as err:
            result.update(status="failed", error=f"reading {source}: {err!r}")
        return result

    return part


def merge_bench(first: dict[str, Any] | None, second: dict[str, Any]) -> dict[str, Any]:
    """Two ``cvae bench`` results as one: the batch sizes of both (each batch size's figures and
    ratios come from one run, where they were measured side by side), the first run's data
    parallelism, environment and load; the derived figures and goals computed again."""
    if not first:
        return second
    from cvae_rosetta.bench.harness import summarize  # imports no JAX

    merged = json.loads(json.dumps(first))
    merged["batches"].update(second["batches"])
    merged["batches"] = dict(sorted(merged["batches"].items(), key=lambda kv: int(kv[0])))
    merged["settings"]["batch_sizes"] = [int(b) for b in merged["batches"]]
    merged["runs"] = [
        {k: r.get(k) for k in ("command", "started", "duration_s", "load_average")}
        for r in (*first.get("runs", [first]), second)
    ]
    merged["duration_s"] = sum(r["duration_s"] or 0.0 for r in merged["runs"])
    merged["peak_rss_bytes"] = max(first.get("peak_rss_bytes", 0), second.get("peak_rss_bytes", 0))
    return summarize(merged)


# --- the conformance suite ------------------------------------------------------------------------

# pytest's last line, with or without -q: "=== 3 passed, 1 failed in 2.40s ===" or without the =
SUMMARY = re.compile(r"^=*\s*(\d+ [a-z]+\b.*? in [\d.]+s(?: \([\d:]+\))?)\s*=*\s*$", re.MULTILINE)


def suite_modules() -> list[str]:
    """The suite's check modules, ``test_precision`` (float32 state and outputs, the bfloat16
    checks) apart."""
    names = sorted(p.stem for p in SUITE_DIR.glob("test_*.py"))
    return [n for n in names if n != "test_precision"]


def _suite_part(run: Run, limit: float) -> dict[str, Any]:
    # The suite sets float32 matmuls to full precision ("highest") for its own checks; the
    # bfloat16 checks are the module test_precision. The pairwise checks (-m pairwise) run in a
    # session of every implementation at once, as the cross tox environment runs them.
    installed = run.probe["implementations"]
    impls = [REFERENCE] if run.smoke else installed
    package = "cvae_rosetta.conformance"
    base = [
        run.python,
        "-m",
        "pytest",
        "-c",
        str(ROOT / "pyproject.toml"),
        "-p",
        "no:cacheprovider",
    ]
    base += ["-q", "-rfE", "--tb=short", "--durations=5"]
    env = run.env(
        XLA_PYTHON_CLIENT_PREALLOCATE="false",  # several sessions share the device
        JAX_ENABLE_COMPILATION_CACHE=None,
        CVAE_HYPOTHESIS_PROFILE=None,  # the default profile (ci)
        HYPOTHESIS_PROFILE=None,
        CVAE_IMPL=None,
    )
    plan = []
    for impl in impls:
        rest = [f"{package}.{m}" for m in suite_modules()]
        precision = [f"{package}.test_precision"]
        if run.smoke:  # one cheap check from each
            rest += ["-k", "test_protocol_surface"]
            precision += ["-k", "test_matmuls_take_the_compute_dtype"]
        plan.append((f"suite_{impl}", impl, "every check but test_precision's", rest))
        plan.append(
            (f"suite_{impl}_precision", impl, "test_precision: float32 and bfloat16", precision)
        )
    if not run.smoke and len(installed) > 1:
        plan.append(
            (
                "suite_pairwise",
                ",".join(installed),
                "pairs: -m pairwise",
                [package, "-m", "pairwise"],
            )
        )
    jobs, reports = [], {}
    for name, impl, _, args in plan:
        report = run.logs / f"{name}.json"
        report.unlink(missing_ok=True)
        reports[name] = report
        cache = run.logs / "jax-cache" / ("smoke" if run.smoke else name)
        command = [*base, "--pyargs", *args, "--impl", impl, "--conformance-report", str(report)]
        command += ["--compilation-cache", str(cache)]
        cwd = run.logs / name
        cwd.mkdir(parents=True, exist_ok=True)
        jobs.append(run.job(name, command, env=env, cwd=cwd, stop=signal.SIGINT))
    run_jobs(jobs, limit)
    processes = []
    for (name, impl, what, _), job in zip(plan, jobs, strict=True):
        entry = {**job.record(), "impl": impl, "what": what}
        entry["summary"] = _pytest_summary(job.tail(20000))
        try:
            report = json.loads(reports[name].read_text())
            entry["report"] = reports[name].name
            entry["counts"] = report.get("summary", {})
            entry["diagnosis"] = {
                n: i.get("diagnosis") for n, i in report.get("implementations", {}).items()
            }
            entry["backend"] = report.get("backend")
        except (OSError, ValueError):
            entry["counts"] = {}
        if job.status() == "failed" and job.rc == 1:
            entry["status"] = "checks failed"  # pytest ran and some checks failed
        processes.append(entry)
    by_impl = {}
    for impl in impls:
        mine = [p for p in processes if p["impl"] == impl]
        counts: dict[str, int] = {}
        for p in mine:
            for status, n in p["counts"].get(impl, {}).items():
                counts[status] = counts.get(status, 0) + n
        diagnosis = next(
            (p["diagnosis"].get(impl) for p in mine if p.get("diagnosis", {}).get(impl)), None
        )
        by_impl[impl] = {
            "counts": counts,
            "complete": all(p["status"] in ("ok", "checks failed") for p in mine),
            "passed": all(p["status"] == "ok" for p in mine),
            "diagnosis": diagnosis,
        }
    statuses = {p["status"] for p in processes}
    status = (
        "ok"
        if statuses == {"ok"}
        else "checks failed"
        if statuses <= {"ok", "checks failed"}
        else "partial"
        if statuses & {"ok", "checks failed"}
        else "timed out"
        if statuses == {"timed out"}
        else "failed"
    )
    return {
        "status": status,
        "matmul_precision": "highest (set by the suite for its own checks)",
        "hypothesis_profile": "ci (the default)",
        "implementations": by_impl,
        "processes": processes,
    }


def _pytest_summary(text: str) -> str | None:
    found = SUMMARY.findall(text)
    return found[-1].strip() if found else None


# --- the plan -------------------------------------------------------------------------------------

# Limits on one H200 (16 host cores), whose compile times nobody here has measured: every
# figure below is an upper bound from the CPU, where each of these programs compiles in 1 to 2 s
# on two cores (XLA:GPU's compiles of such small programs are of the same order). Reasoning in
# benchmarks/gpu.sh.
PARTS = (
    Part(
        "bench",
        "cvae bench: every path at batch 1 and 4096",
        {"gpu": 90, "smoke": 150},
        _bench_part("bench"),
        minimum_s=40,
    ),
    Part(
        "bf16",
        "step_time.py: float32 against bfloat16",
        {"gpu": 60, "smoke": 120},
        _figures_part("step_time", _bf16_args, "step_time.py"),
    ),
    Part(
        "dispatch",
        "dispatch.py: what a call costs",
        {"gpu": 35, "smoke": 120},
        _figures_part("dispatch", _dispatch_args, "dispatch.py"),
    ),
    Part(
        "data_parallel",
        "data_parallel.py: every mechanism on the devices present",
        {"gpu": 40, "smoke": 120},
        _figures_part("data_parallel", _parallel_args, "data_parallel.py"),
    ),
    Part(
        "roof",
        "roof_gap.py: the step and its parts against a large matmul",
        {"gpu": 35, "smoke": 120},
        _figures_part("roof_gap", _roof_args, "roof_gap.py"),
    ),
    Part(
        "bench_2",
        "cvae bench: every path at batch 8 and 256",
        {"gpu": 70, "smoke": 150},
        _bench_part("bench_2"),
        minimum_s=40,
    ),
    Part(
        "bench_3",
        "cvae bench: every path at batch 64 and 1024",
        {"gpu": 70, "smoke": 150},
        _bench_part("bench_3"),
        minimum_s=40,
    ),
)
SUITE = Part(
    "suite",
    "the conformance suite on the device",
    SUITE_MAX_S,
    _suite_part,
    minimum_s=30,
)


def probe(python: str, env: dict[str, str], logs: Path) -> tuple[dict[str, Any] | None, str]:
    """The device and the versions, from a child process; ``(None, why)`` if JAX did not start."""
    job = Job("preflight", [python, "-c", PROBE], logs / "preflight.log", env, logs)
    run_jobs([job], 90.0)
    lines = [line for line in job.tail(10**6).splitlines() if line.startswith("PROBE ")]
    if job.rc != 0 or not lines:
        last = [line for line in job.tail().splitlines() if line.strip()]
        return None, (last[-1].strip() if last else f"exit status {job.rc}")
    return json.loads(lines[-1][len("PROBE ") :]), ""


def nvidia_smi() -> str | None:
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def cuda_plugin(versions: dict[str, Any]) -> str | None:
    """The CUDA plugin's version: JAX's CUDA 12 wheels, else its CUDA 13 ones (named so)."""
    if versions.get("jax-cuda12-plugin") or not versions.get("jax-cuda13-plugin"):
        return versions.get("jax-cuda12-plugin")
    return f"{versions['jax-cuda13-plugin']} (jax-cuda13-plugin)"


def choose_out(args: argparse.Namespace, smoke: bool) -> Path:
    """``--out``, else ``$GPU_BENCH_OUT``, else ``$OUT``, else ``benchmarks/results`` (a fresh
    temporary folder for a smoke run: its files never belong in the results)."""
    for candidate in (args.out, os.environ.get("GPU_BENCH_OUT"), os.environ.get("OUT")):
        if candidate:
            return Path(candidate).resolve()
    if smoke:
        return Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    return BENCHMARKS / "results"


def parse_limits(texts: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """``["bench=240,bf16=60", "roof=50"]`` as ``{"bench": 240.0, "bf16": 60.0, "roof": 50.0}``;
    ``ValueError`` naming the first item that is not ``PART=SECONDS`` with a known part and a
    positive number."""
    limits: dict[str, float] = {}
    for text in texts:
        for item in filter(None, (i.strip() for i in text.split(","))):
            name, _, value = item.partition("=")
            name = name.strip()
            try:
                seconds = float(value)
            except ValueError:
                seconds = float("nan")
            if name not in names or not seconds > 0:
                raise ValueError(
                    f"expected PART=SECONDS with PART among {', '.join(names)} and SECONDS > 0, "
                    f"got {item!r}"
                )
            limits[name] = seconds
    return limits


def merge_runs(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """The ``bench_gpu.json`` of a run and that of a later run of some of its parts, on the same
    device with the same versions, as one: the later run's parts replace the first's (each marked
    ``"run": N``, the later run's number, with its start, and ``"replaces"``: what the part did
    before), the others kept; ``cvae bench``'s
    figures merged (the later run's batch sizes replacing the same ones of the first);
    ``gpu_run["runs"]`` lists every run (start, end, budget, duration, parts, limits)."""
    old, new = first["gpu_run"], later["gpu_run"]
    for key in ("device", "versions"):
        if old.get(key) != new.get(key):
            raise ValueError(f"the two runs differ in {key}: {old.get(key)} and {new.get(key)}")

    def summary(run: dict[str, Any], number: int) -> dict[str, Any]:
        keys = ("started", "finished", "budget_s", "duration_s", "limits")
        return {
            "run": number,
            **{k: run[k] for k in keys if k in run},
            "parts": [p for p in run.get("parts", {}) if p != "preflight"],
        }

    runs = json.loads(json.dumps(old.get("runs") or [summary(old, 1)]))
    number = len(runs) + 1
    runs.append(summary(new, number))
    record = json.loads(json.dumps(old))
    for name, entry in new.get("parts", {}).items():
        if name != "preflight":
            earlier = record["parts"].get(name)
            record["parts"][name] = {**entry, "run": number, "run_started": new.get("started")}
            if earlier:  # what the part did in the run it replaces, in brief (a part with no
                # "run" of its own is the first run's)
                keys = ("run", "status", "seconds", "limit_s", "reason", "error")
                record["parts"][name]["replaces"] = {
                    "run": 1,
                    **{k: earlier[k] for k in keys if k in earlier},
                }
    record["runs"] = runs
    old_bench = {k: v for k, v in first.items() if k != "gpu_run"}
    new_bench = {k: v for k, v in later.items() if k != "gpu_run"}
    if new_bench.get("batches") and old_bench.get("batches"):
        kept = {b: v for b, v in old_bench["batches"].items() if b not in new_bench["batches"]}
        bench = merge_bench({**old_bench, "batches": kept}, new_bench) if kept else new_bench
    else:
        bench = new_bench if new_bench.get("batches") else old_bench
    return {**bench, "gpu_run": record}


def merge_files(later: Path, into: Path) -> Path:
    """:func:`merge_runs` of the files ``into`` and ``later``, written over ``into``."""
    write_json(into, merge_runs(json.loads(into.read_text()), json.loads(later.read_text())))
    return into


def run_part(run: Run, part: Part, limit: float, started: float) -> None:
    """One part under ``limit`` seconds (skipped below its minimum), its outcome recorded and
    written at once, whatever happens in it."""
    entry: dict[str, Any] = {"what": part.what, "limit_s": round(max(limit, 0.0), 1)}
    if limit < part.minimum_s:
        entry.update(status="skipped", reason=f"{max(limit, 0.0):.0f} s left for it")
    else:
        begun = time.monotonic()
        try:
            entry.update(part.run(run, limit))
        except Exception as err:  # a bug here must not cost the other parts
            entry.update(status="failed", error=f"{type(err).__name__}: {err}")
        entry["seconds"] = round(time.monotonic() - begun, 1)
    with run.lock:
        run.record["parts"][part.name] = entry
        run.record["duration_s"] = round(time.monotonic() - started, 1)
    run.write()
    why = entry.get("reason") or entry.get("error")
    lines = [
        f"[{time.monotonic() - started:5.0f} s] {part.name}: {entry['status']}"
        + (f" in {entry['seconds']:.0f} s" if "seconds" in entry else "")
        + f" (limit {entry['limit_s']:.0f} s)"
        + (f": {why}" if why else "")
    ]
    for impl, found in entry.get("implementations", {}).items():
        counts = ", ".join(f"{n} {s}" for s, n in found["counts"].items() if n)
        lines.append(
            f"    {impl}: {counts or 'no report'}"
            + ("" if found["complete"] else " (not complete)")
        )
    print("\n".join(lines), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-cpu", action="store_true", help="every part on the CPU, toy sizes")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--out", default=None, help="[$GPU_BENCH_OUT, $OUT, benchmarks/results]")
    parser.add_argument("--only", default=None, help="these parts only, comma-separated")
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="PART=SECONDS",
        help="a part's time limit instead of its own, e.g. bench=240 (comma-separated, repeatable)",
    )
    parser.add_argument(
        "--merge",
        default=None,
        metavar="FILE",
        help="run nothing: merge FILE (a later run's bench_gpu.json) into --out's bench_gpu.json",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    mode = "smoke" if args.smoke_cpu else "gpu"
    budget = args.budget if args.budget is not None else BUDGET_S[mode]
    names = [p.name for p in (*PARTS, SUITE)]
    only = [n.strip() for n in args.only.split(",")] if args.only else names
    unknown = [n for n in only if n not in names]
    if unknown:
        print(
            f"gpu.sh: --only: expected names among {', '.join(names)}, got {unknown[0]!r}",
            file=sys.stderr,
        )
        return REFUSED
    try:
        limits = parse_limits(args.limit, names)
    except ValueError as err:
        print(f"gpu.sh: --limit: {err}", file=sys.stderr)
        return REFUSED

    out = choose_out(args, mode == "smoke")
    if args.merge:
        into = out / f"bench_{'smoke' if mode == 'smoke' else 'gpu'}.json"
        try:
            merge_files(Path(args.merge), into)
        except (OSError, ValueError, KeyError) as err:
            print(f"gpu.sh: --merge: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
        print(f"merged {args.merge} into {into}", flush=True)
        return 0
    logs = Path(tempfile.mkdtemp(prefix="gpu-probe-"))
    env = {k: v for k, v in os.environ.items()}
    if mode == "smoke":
        env["JAX_PLATFORMS"] = "cpu"
    found, why = probe(sys.executable, env, logs)
    platform = (found or {}).get("device", {}).get("platform")
    if mode == "gpu" and platform != "gpu":
        seen = (
            f"JAX {found['versions']['jax']} sees {found['device']['count']} "
            f"{platform} device(s) and no GPU"
            if found
            else f"JAX did not start ({why})"
        )
        print(
            f"gpu.sh: no GPU here: {seen}; run it on a machine with an NVIDIA GPU after "
            'pip install ".[all,cuda,test]" (or try --smoke-cpu)'.replace("\n", " "),
            file=sys.stderr,
        )
        return REFUSED
    if found is None:
        print(f"gpu.sh: JAX did not start on the CPU ({why})", file=sys.stderr)
        return 1

    out.mkdir(parents=True, exist_ok=True)
    # the logs beside the files, but never among the results to commit (runs/ is ignored by git)
    logs_in = ROOT / "runs" if out == (BENCHMARKS / "results").resolve() else out
    run_logs = logs_in / ("gpu_logs" if mode == "gpu" else "smoke_logs")
    run_logs.mkdir(parents=True, exist_ok=True)
    (run_logs / "preflight.log").write_text((logs / "preflight.log").read_text(errors="replace"))
    device = found["device"]
    print(
        f"device: {device['kind']} ({device['platform']}, {device['count']} device(s)); "
        f"jax {found['versions']['jax']}, jaxlib {found['versions']['jaxlib']}, "
        f"cuda plugin {cuda_plugin(found['versions'])}; host "
        f"{found['host']['cpu_model']} ({found['host']['cpu_count']} cores); "
        f"implementations {', '.join(found['implementations'])}",
        flush=True,
    )
    print(f"writing {out}/ (logs in {run_logs}/); budget {budget:.0f} s", flush=True)
    run = Run(
        mode=mode,
        out=out,
        logs=run_logs,
        deadline=started + budget,
        python=sys.executable,
        probe=found,
        record={
            "schema": SCHEMA,
            "mode": "gpu" if mode == "gpu" else "smoke-cpu",
            "script": "benchmarks/gpu.sh",
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "budget_s": budget,
            "device": device,
            "nvidia_smi": nvidia_smi(),
            "host": found["host"],
            "versions": found["versions"],
            "implementations": found["implementations"],
            "matmul_precision": found["matmul_precision"],
            **({"limits": limits} if limits else {}),
            "environment_info": found["environment_info"],
            "parts": {
                "preflight": {
                    "what": "the device and the versions",
                    "status": "ok",
                    "seconds": round(time.monotonic() - started, 1),
                }
            },
        },
    )
    run.write()
    chosen = [part for part in (*PARTS, SUITE) if part.name in only]

    def limit_of(part: Part) -> float:
        return limits.get(part.name, part.limit_s[mode])

    if run.smoke:
        # toy sizes on the CPU: the parts side by side, each with its own limit (the time of a
        # smoke run is its programs' compilation, which the cores share)
        with ThreadPoolExecutor(max_workers=SMOKE_WORKERS) as pool:
            for part in chosen:
                limit = min(limit_of(part), run.left() - GRACE_S)
                pool.submit(run_part, run, part, limit, started)
    else:
        for part in chosen:
            # every part but the suite leaves the suite its reserve; the suite takes the rest
            reserve = 0.0 if part is SUITE or SUITE not in chosen else SUITE_RESERVE_S[mode]
            run_part(run, part, min(limit_of(part), run.left() - reserve - GRACE_S), started)
    run.record["duration_s"] = round(time.monotonic() - started, 1)
    run.record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    run.write()
    written = sorted(p.name for p in out.glob(f"*_{'smoke' if run.smoke else 'gpu'}.json"))
    print(f"done in {run.record['duration_s']:.0f} s: {' '.join(written)} in {out}/", flush=True)
    if not run.smoke:
        print(
            "then: python benchmarks/render.py (copy the *_gpu.json files into "
            "benchmarks/results/ first if they were written elsewhere)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
