"""What a ``bench.json`` is made of: its file names, its schema, the names its rows use, and the
helpers that read rows and conditions back out of it.

:mod:`cvae_rosetta.bench.harness` writes such a file and :mod:`cvae_rosetta.bench.report` reads
one; both import these names from here, so neither needs the other's.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "cvae-bench/1"
REFERENCE = "pure_jax"  # every figure is also a ratio to this implementation's
RESULT_FILE = "bench.json"
PAGE_FILE = "bench.md"
FAST = "fast"  # the ``path`` of a fast-path row
SAME_AS_FAST = "idiomatic"  # the idiomatic path of an implementation whose fast path it is
OTHERS = 0.25  # other processes using more cores than this during the run mark a loaded machine
LOADED = 1.5  # ... or, where that cannot be measured, a 1-minute load average above this at start


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
    :data:`LOADED` at the start. (The load average is only the fallback: it counts this process's
    own threads from its first moment, and on some virtual machines kernel threads too.)"""
    others = result.get("other_processes_cpu") or {}
    total = others.get("cores")
    if total is not None:
        phases = [c for c in (others.get("phases") or {}).values() if c is not None]
        return total > OTHERS or any(c > 2 * OTHERS for c in phases)
    start = result.get("load_average", {}).get("start")
    return start is not None and start[0] > LOADED
