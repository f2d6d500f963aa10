"""What ``cvae bench`` writes for its user beside its ``bench.json``: ``bench.md``, every
measurement of one result as Markdown with its plots, and the few lines the terminal shows.

Every number and every ordering on the page is read from the result. A ratio is shown with its
interval over paired rounds (:func:`cvae_rosetta.bench.results.interval`); where the interval
holds 1.0 the cell says "≈" and "within noise", and nothing is ranked. Device time (the step
inside one ``lax.scan``) and per-call cost (a Python loop of jitted steps) answer different
questions and are reported apart. Plots are drawn with matplotlib's ``Figure`` and Agg canvas
(never ``pyplot``), written atomically.

The page is put together here from the parts that make it: a result's tables and findings are
:mod:`cvae_rosetta.bench.sections`'s, the causes named after each difference
:mod:`cvae_rosetta.bench.causes`'s, the plots :mod:`cvae_rosetta.bench.plots`'s, and the cells
and findings they are written with :mod:`cvae_rosetta.bench.markdown`'s. The docs build puts the
same sections, one per committed result, into the repository's pages (``benchmarks/render.py``).
"""

from __future__ import annotations

from typing import Any

from cvae_rosetta.bench.markdown import backend_name, number, path_label, ratio
from cvae_rosetta.bench.results import batches_by_size, loaded
from cvae_rosetta.bench.sections import section

HOW_TO_READ = (
    "How to read it: every ratio has its interval in brackets; **≈** marks a ratio whose interval "
    "holds 1.0: within noise, no difference measured, nothing ranked. *Device time* (the step "
    "inside one `lax.scan`) and *per call* (a Python loop of jitted calls) are reported apart: the "
    "first is what a framework does to the compiled step, the second adds what calling it from "
    "Python costs."
)


def page(result: dict[str, Any], images: dict[str, str], *, source: str) -> str:
    """``bench.md``: one result's page."""
    head = [f"# Benchmark: {backend_name(result)}", "", f"From `{source}`.", "", HOW_TO_READ, ""]
    return "\n".join([*head, *section(result, images)]).rstrip() + "\n"


def terminal_summary(result: dict[str, Any]) -> str:
    lines = []
    for b, batch in batches_by_size(result):
        cells = [
            f"{path_label(r)} {number(r['step_us']['median'])} µs "
            f"({ratio(r['vs_pure_jax']['step'], short=True)})"
            for r in batch["paths"]
            if not r.get("same_as_fast")
        ]
        lines.append(f"batch {b}: " + ", ".join(cells))
    if loaded(result):
        lines.append("  note: the machine was loaded while measuring")
    return "\n".join(lines)
