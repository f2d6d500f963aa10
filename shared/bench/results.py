"""The one results schema of every measurement the project publishes.

``cvae bench`` writes it (``kind: "bench"``), and so do the studies in ``benchmarks/`` (the suite's
cost, the fault report, the latent-size trade-off: each its own ``kind``): every file opens with
the same envelope (:func:`envelope`: schema, kind, command, when, versions and machine), so that a
page can say where each figure came from and never merge figures of two machines, dates or
versions silently. :mod:`cvae_rosetta.bench.harness` writes bench results, and
:mod:`cvae_rosetta.bench.report` renders every kind; both import these names from here.

Ratios come with an interval (:func:`interval`) over paired rounds, since every round times every
path once, interleaved. Where the interval holds 1.0 the difference is noise.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SCHEMA = "cvae-bench/2"
OLD_SCHEMAS = ("cvae-bench/1",)  # read by re-deriving every figure from the measured rounds
REFERENCE = "pure_jax"  # every figure is also a ratio to this implementation's
RESULT_FILE = "bench.json"
PAGE_FILE = "bench.md"
FAST = "fast"  # the ``path`` of a fast-path row
SAME_AS_FAST = "idiomatic"  # the idiomatic path of an implementation whose fast path it is
OTHERS = 0.25  # other processes using more cores than this during the run mark a loaded machine
LOADED = 1.5  # ... or, where that cannot be measured, a 1-minute load average above this at start
CONFIDENCE = 0.95  # of every interval, where the rounds allow it
MIN_ROUNDS = 5  # fewer paired rounds than this give a ratio without an interval
DISTRIBUTIONS = ("jax", "jaxlib", "numpy", "optax", "flax", "dm-haiku", "equinox", "cvae-rosetta")


# --- rows -----------------------------------------------------------------------------------------


def fast_row(batch: dict[str, Any], impl: str) -> dict[str, Any]:
    """The fast-path row of ``impl`` in one batch size's results."""
    return next(r for r in batch["paths"] if r["impl"] == impl and r["path"] == FAST)


def scan_row(batch: dict[str, Any], impl: str, unroll: int = 1) -> dict[str, Any] | None:
    """The epoch-as-one-call row of ``impl`` at ``unroll`` in one batch size's results, if any."""
    return next((s for s in batch["epoch"] if s["impl"] == impl and s["unroll"] == unroll), None)


def loaded(result: dict[str, Any]) -> bool:
    """Whether other work shared the machine: other processes using more than :data:`OTHERS`
    cores over the run (or twice that over one of its phases), measured from ``/proc/stat`` less
    this process's own CPU time; where that cannot be measured, a 1-minute load average above
    :data:`LOADED` at the start (it counts this process's own threads too, so only as fallback)."""
    others = result.get("other_processes_cpu") or {}
    total = others.get("cores")
    if total is not None:
        phases = [c for c in (others.get("phases") or {}).values() if c is not None]
        return total > OTHERS or any(c > 2 * OTHERS for c in phases)
    start = result.get("load_average", {}).get("start")
    return start is not None and start[0] > LOADED


# --- intervals ------------------------------------------------------------------------------------


def _coverage(n: int, k: int) -> float:
    """How often the ``k``-th smallest and ``k``-th largest of ``n`` values hold their median."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


def interval(values: Sequence[float], bases: Sequence[float]) -> dict[str, Any]:
    """The median over paired rounds of ``value / base`` (round ``i`` of both was timed in the same
    interleaved round, so drift cancels) with a distribution-free interval: the order statistics
    of the per-round ratios that hold their median with at least :data:`CONFIDENCE` (the sign
    test's interval; it assumes nothing about the shape of the noise, and a slow round widens it
    instead of moving it). Five rounds give at most 94 %, which is what they are reported with;
    fewer give the ratio alone. ``within_noise``: the interval holds 1.0."""
    if len(values) != len(bases) or not values or any(b <= 0 for b in bases):
        raise ValueError(f"rounds: expected two equally long lists of times, got {values}, {bases}")
    ratios = sorted(v / b for v, b in zip(values, bases, strict=True))
    n = len(ratios)
    out: dict[str, Any] = {"ratio": statistics.median(ratios), "rounds": n}
    ks = [k for k in range(1, n // 2 + 1) if _coverage(n, k) >= CONFIDENCE]
    k = max(ks) if ks else 1
    if n < MIN_ROUNDS:
        return {**out, "low": None, "high": None, "within_noise": None, "confidence": None}
    low, high = ratios[k - 1], ratios[n - k]
    return {
        **out,
        "low": low,
        "high": high,
        "within_noise": low <= 1.0 <= high,
        "confidence": _coverage(n, k),
    }


def differs(entry: dict[str, Any] | None) -> bool:
    """Whether an :func:`interval` tells a difference from 1.0 (never without an interval)."""
    return bool(entry) and entry.get("within_noise") is False


# --- the envelope ---------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def versions() -> dict[str, str | None]:
    """Python's and every measured distribution's version (``None``: not installed)."""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), **{d: version(d) for d in DISTRIBUTIONS}}


def environment(*, jax_devices: bool = True) -> dict[str, Any]:
    """Versions and machine; with ``jax_devices`` also JAX's backend and devices (JAX imported)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    out: dict[str, Any] = {
        "versions": versions(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
    }
    if jax_devices:
        import jax

        out["backend"] = jax.default_backend()
        out["device_kind"] = jax.devices()[0].device_kind
        out["device_count"] = jax.device_count()
    return out


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")


def envelope(kind: str, command: Sequence[str] | None = None, **environ: Any) -> dict[str, Any]:
    """The fields every result file opens with: ``schema``, ``kind``, ``command``, ``started`` and
    ``environment`` (``environ`` goes to :func:`environment`)."""
    return {
        "schema": SCHEMA,
        "kind": kind,
        "command": list(command) if command is not None else None,
        "started": now(),
        "environment": environment(**environ),
    }


def provenance(result: dict[str, Any]) -> str:
    """One line that tells one result file from another: device, date, JAX version."""
    env = result.get("environment") or {}
    if env.get("backend") in (None, "cpu"):
        device = f"{env.get('cpu_model') or 'CPU'}, {env.get('usable_cores') or '?'} cores"
    else:
        device = env.get("device_kind") or env["backend"]
    when = str(result.get("started") or "date not recorded")[:10]
    return f"{device}, {when}, jax {(env.get('versions') or {}).get('jax') or '?'}"


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A result file, read. A ``bench`` result has every derived figure (intervals included)
    computed again from its measured rounds, so that a file of an older schema reads as one of
    today's."""
    import json

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    schema = data.get("schema")
    if schema in OLD_SCHEMAS and "batches" in data:
        data.update(kind="bench", schema=SCHEMA, schema_read=schema)
    elif schema != SCHEMA:
        raise ValueError(f"{path}: schema: expected {SCHEMA!r}, got {schema!r}")
    if data.get("kind") == "bench":
        from cvae_rosetta.bench.harness import summarize  # imports no JAX

        summarize(data)
    return data
