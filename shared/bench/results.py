"""The one results schema of every measurement the project publishes.

``cvae bench`` writes it (``kind: "bench"``), and so do the studies in ``benchmarks/`` (the suite's
cost, the fault report, the latent-size trade-off: each its own ``kind``): every file opens with
the same envelope (:func:`envelope`: schema, kind, command, when, versions and machine), so that a
page can say where each figure came from and never merge figures of two machines, dates or
versions silently. :mod:`cvae_rosetta.bench.harness` writes bench results and
:mod:`cvae_rosetta.bench.report` renders one for its user; the docs build and the studies' scripts
render every kind into the repository's pages. All import these names from here, and
:func:`summarize` derives every figure a page shows from the measured rounds.

Ratios come with an interval (:func:`interval`) over paired rounds, since every round times every
path once, interleaved. Where the interval holds 1.0 the difference is noise.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cvae_rosetta
from cvae_rosetta.spec import registry

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
BASE_DISTRIBUTIONS = ("jax", "jaxlib", "numpy", "optax")  # recorded first, then the frameworks'


# --- rows -----------------------------------------------------------------------------------------


def fast_row(batch: dict[str, Any], impl: str) -> dict[str, Any]:
    """The fast-path row of ``impl`` in one batch size's results."""
    return next(r for r in batch["paths"] if r["impl"] == impl and r["path"] == FAST)


def scan_row(batch: dict[str, Any], impl: str, unroll: int = 1) -> dict[str, Any] | None:
    """The epoch-as-one-call row of ``impl`` at ``unroll`` in one batch size's results, if any."""
    return next((s for s in batch["epoch"] if s["impl"] == impl and s["unroll"] == unroll), None)


def path_row(batch: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The row of the path ``label`` (``impl`` or ``impl:path``) in one batch size's results, if
    any."""
    return next((r for r in batch["paths"] if r["label"] == label), None)


def batches_by_size(result: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``(batch size, batch)`` for every batch size of a result, the smallest first."""
    return sorted(((int(b), batch) for b, batch in result["batches"].items()), key=lambda t: t[0])


def impls_measured(result: dict[str, Any]) -> list[str]:
    """The implementations a result measured, in the order of its rows."""
    return list(
        dict.fromkeys(r["impl"] for _, batch in batches_by_size(result) for r in batch["paths"])
    )


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
    if n < MIN_ROUNDS:
        return {**out, "low": None, "high": None, "within_noise": None, "confidence": None}
    ks = [k for k in range(1, n // 2 + 1) if _coverage(n, k) >= CONFIDENCE]
    k = max(ks) if ks else 1
    low, high = ratios[k - 1], ratios[n - k]
    within = low <= 1.0 <= high
    return {**out, "low": low, "high": high, "within_noise": within, "confidence": _coverage(n, k)}


def differs(entry: dict[str, Any] | None) -> bool:
    """Whether an :func:`interval` tells a difference from 1.0 (never without an interval)."""
    return bool(entry) and entry.get("within_noise") is False


# --- derived figures ------------------------------------------------------------------------------

PARAMETER_PASSES = 11  # forward and backward reads, the gradient's write and norm, Adam's 4 + 3


def parameter_count(model: dict[str, Any]) -> int:
    """The canonical parameters' count of a model config (``ModelConfig.to_dict()``)."""
    d, k, z = model["input_dim"], model["num_classes"], model["latent_dim"]
    widths = [d + k, *model["encoder_dims"], 2 * z], [z + k, *model["decoder_dims"], d]
    return sum((a + 1) * b for dims in widths for a, b in itertools.pairwise(dims))


def minimum_bytes(model: dict[str, Any], batch_size: int) -> int:
    """The least any step of the spec moves: :data:`PARAMETER_PASSES` passes over the float32
    parameters and the batch (float32 pixels, int32 labels) read once. Activations are left out
    (a program may keep them on chip), so this bounds the small batches closely, the large ones
    loosely."""
    return 4 * (PARAMETER_PASSES * parameter_count(model) + batch_size * (model["input_dim"] + 1))


def roof_times(
    row: dict[str, Any], roof: dict[str, Any], stream: dict[str, Any] | None
) -> tuple[float, float | None]:
    """The two sides of the roofline for a step with ``row``'s FLOPs and bytes (µs): its FLOPs at
    the matmul's rate and its bytes at the streaming update's (``None`` without one), each rate
    its fastest round's (what the machine showed it can do, in the same rounds as the steps)."""
    compute = row["flops"] * min(roof["call_us"]["rounds"]) / roof["flops"]
    if not (stream and row.get("bytes_accessed")):
        return compute, None
    return compute, row["bytes_accessed"] * min(stream["call_us"]["rounds"]) / stream["bytes"]


def _bound(row: dict[str, Any], roof: dict[str, Any], stream: dict[str, Any] | None) -> float:
    """The roofline's least time of a step (µs): the larger of :func:`roof_times`."""
    compute, memory = roof_times(row, roof, stream)
    return compute if memory is None else max(compute, memory)


def ratio(value: Any, base: Any) -> float | None:
    """``value / base`` where both are numbers and ``base > 0``; ``None`` otherwise."""
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (value, base))
    return value / base if ok and base > 0 else None


def _paired(entry: dict[str, Any], base: dict[str, Any] | None, per: float = 1.0):
    """The :func:`interval` of two timed entries' rounds (``entry``'s divided by ``per``)."""
    if base is None:
        return None
    return interval([r / per for r in entry["rounds"]], base["rounds"])


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Add every derived figure (GFLOP/s, fraction of the roof, throughput, ratios to pure JAX, to
    the fast path, to the serial step and to float32 with their intervals over paired rounds) from
    the measured ones, in place. Idempotent: it reads measured figures only."""
    model = result["settings"]["model"]
    for batch in result["batches"].values():
        b, k, roof = batch["batch_size"], batch["steps_per_round"], batch["roof"]
        batch["minimum_bytes"] = minimum_bytes(model, b)
        roof["peak_gflops_per_s"] = roof["flops"] / min(roof["call_us"]["rounds"]) / 1e3
        if stream := batch.get("bandwidth"):
            stream["gb_per_s"] = stream["bytes"] / min(stream["call_us"]["rounds"]) / 1e3
        for scan in batch["epoch"]:
            fast = fast_row(batch, scan["impl"])
            scan["step_us"] = scan["call_us"]["median"] / k
            scan["examples_per_s"] = b * k / scan["call_us"]["median"] * 1e6
            scan["vs_loop"] = _paired(scan["call_us"], fast["step_us"], per=k)
            flops = fast.get("flops")
            scan["gflops_per_s"] = flops / scan["step_us"] / 1e3 if flops else None
            scan["roof_fraction"] = ratio(scan["gflops_per_s"], roof["gflops_per_s"])
            ref = scan_row(batch, REFERENCE, scan["unroll"]) or scan_row(batch, REFERENCE)
            scan["vs_pure_jax"] = {"step": _paired(scan["call_us"], ref["call_us"])}
            plain = scan_row(batch, scan["impl"])
            scan["vs_unroll_1"] = _paired(scan["call_us"], plain["call_us"])
            if flops and len(roof["call_us"]["rounds"]) == len(scan["call_us"]["rounds"]):
                steps = [r / k for r in scan["call_us"]["rounds"]]
                scan["bound_fraction"] = interval([_bound(fast, roof, stream)] * len(steps), steps)
        base = fast_row(batch, REFERENCE)
        for row in batch["paths"]:
            fast, scan = fast_row(batch, row["impl"]), scan_row(batch, row["impl"])
            step = row["step_us"]["median"]
            row["overhead_us"] = step - scan["step_us"] if scan else None
            flops = fast.get("flops")  # the same useful work, whichever path does it
            row["gflops_per_s"] = flops / step / 1e3 if flops else None
            row["roof_fraction"] = ratio(row["gflops_per_s"], roof["gflops_per_s"])
            if flops and len(roof["call_us"]["rounds"]) == len(row["step_us"]["rounds"]):
                # flops / step over the roof's flops / call, paired by round
                share = _paired(roof["call_us"], row["step_us"])
                row["roof_interval"] = {
                    key: v * flops / roof["flops"] if key in ("ratio", "low", "high") and v else v
                    for key, v in share.items()
                }
            row["loop_examples_per_s"] = b / step * 1e6
            row["traffic"] = ratio(fast.get("bytes_accessed"), batch["minimum_bytes"])
            row["vs_fast"] = {
                "extra_us": step - fast["step_us"]["median"],
                "step": _paired(row["step_us"], fast["step_us"]),
            }
            row["vs_pure_jax"] = {"step": _paired(row["step_us"], base["step_us"])}
    rows = (result.get("data_parallel") or {}).get("rows", [])
    cell = {(r["impl"], r["mechanism"], r["devices"]): r["step_us"] for r in rows}
    for row in rows:
        row["vs_serial"] = _paired(row["step_us"], cell.get((row["impl"], "none", 1)))
        ref = cell.get((REFERENCE, row["mechanism"], row["devices"]))
        row["vs_pure_jax"] = {"step": _paired(row["step_us"], ref)}
    for part in result.get("techniques") or ():
        base = next(r for r in part["rows"] if r["technique"] == FAST)
        for row in part["rows"]:
            row["traffic"] = ratio(
                row.get("bytes_accessed"), minimum_bytes(model, part["batch_size"])
            )
            row["vs_fast"] = {t: _paired(row[t], base[t]) for t in ("step_us", "scan_us")}
    for part in result.get("precision") or ():
        cell = {(r["impl"], r["dtype"]): r["step_us"] for r in part["rows"]}
        for row in part["rows"]:
            row["vs_float32"] = _paired(row["step_us"], cell[(row["impl"], "float32")])
    return result


# --- the envelope ---------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
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
    frameworks = [info.about.distribution for info in registry.known()]
    names = dict.fromkeys([*BASE_DISTRIBUTIONS, *frameworks, "cvae-rosetta"])
    return {"python": platform.python_version(), **{d: cvae_rosetta.version_of(d) for d in names}}


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


def envelope(kind: str, command: Sequence[str] | None = None, **environ: Any) -> dict[str, Any]:
    """The fields every result file opens with: ``schema``, ``kind``, ``command``, ``started`` and
    ``environment`` (``environ`` goes to :func:`environment`)."""
    return {
        "schema": SCHEMA,
        "kind": kind,
        "command": list(command) if command is not None else None,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "environment": environment(**environ),
    }


def jax_outside(version: str | None, extra: str | None = None) -> str | None:
    """This project's own ``jax`` requirement (``jax<0.12.1,>=0.10.2``), or its extra ``extra``'s
    (Haiku's ``jax<0.11,>=0.10.2``), where ``version`` does not meet it, as the installed
    metadata says it; else None (met, no such requirement, or no metadata)."""
    import importlib.metadata

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split(".") if p.isdigit())

    try:
        listed = importlib.metadata.requires("cvae-rosetta") or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    condition = f'extra == "{extra}"' if extra else ""
    needs = [
        spec
        for spec, _, marker in (r.partition(";") for r in listed)
        if spec.startswith("jax<") and marker.strip() == condition
    ]
    have = parts(version or "")
    if not (needs and have):
        return None
    for bound in needs[0][3:].split(","):
        op, value = ("<", bound[1:]) if bound[0] == "<" else (">=", bound[2:])
        if have >= parts(value) if op == "<" else have < parts(value):
            return needs[0]
    return None


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
    computed again from its rounds, so that a file of an older schema reads as one of today's."""
    import json

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    schema = data.get("schema")
    if schema in OLD_SCHEMAS and "batches" in data:
        data.update(kind="bench", schema=SCHEMA, schema_read=schema)
    elif schema != SCHEMA:
        raise ValueError(f"{path}: schema: expected {SCHEMA!r}, got {schema!r}")
    if data.get("kind") == "bench":
        summarize(data)
    return data
