"""The generated blocks of ``docs/fast_step.md``, a page whose words are written by hand: the
ranked ways to a faster step (:mod:`checklist`), which fast paths compile to one program, the scan
against the loop, pure JAX's step written other ways, bfloat16, and each framework's own jit
wrappers, each from every committed result that measured it, under the line that names its
machine. The tables are the ones ``cvae bench``'s page shows
(:mod:`cvae_rosetta.bench.sections`'s); ``benchmarks/render.py`` writes them
(:mod:`benchmark_pages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checklist import checklist

from cvae_rosetta.bench.causes import programs
from cvae_rosetta.bench.markdown import (
    backend_name,
    impl_label,
    number,
    path_label,
    write_between_markers,
)
from cvae_rosetta.bench.results import (
    FAST,
    SAME_AS_FAST,
    batches_by_size,
    fast_row,
    impls_measured,
    provenance,
    scan_row,
)
from cvae_rosetta.bench.sections import (
    compared,
    precision_table,
    techniques_table,
    unrolls,
    vs_fast,
)

FAST_STEP_FILE = "fast_step.md"  # words written by hand, its tables between fast-step markers


def fast_step_blocks(result: dict[str, Any]) -> dict[str, list[str]]:
    """The tables of ``docs/fast_step.md`` from one result: ``block -> lines`` (empty where the
    result did not measure it)."""
    impls = {i: impl_label(i) for i in impls_measured(result)}

    def in_scan(batch, impl):
        return (scan_row(batch, impl) or {}).get("vs_loop")

    dispatch = {shown: _dispatch_note(result, impl) for impl, shown in impls.items()}

    groups = programs(result)
    blocks = {
        "checklist": checklist(result),
        "programs": [groups] if groups else [],
        "scan": [*compared(result, in_scan, impls, note=dispatch), *unrolls(result)],
        "techniques": techniques_table(result),
        "precision": precision_table(result),
    }
    for impl in ("flax_nnx", "equinox", "keras"):
        labels = {
            r["label"]: path_label(r)
            for r in batches_by_size(result)[0][1]["paths"]
            if r["impl"] == impl and r["path"] not in (FAST, SAME_AS_FAST)
        }
        blocks[impl] = compared(result, vs_fast, labels) if labels else []
    return blocks


def _dispatch_note(result: dict[str, Any], impl: str):
    """What the scan's gain over the loop is put down to, at the batch sizes where it is beyond
    noise: one dispatch for the K steps instead of one a step, weighed by the time one call of an
    empty step takes (what a dispatch costs) against the time the scan saves a step (the fast
    path's ``overhead_us``, step − scan). Where the call is less than the saving, the rest is said
    to be not taken apart."""
    sized = dict(batches_by_size(result))

    def told(batch_sizes: list[int]) -> str:
        one = "fewer dispatches, one for the K steps instead of one a step"
        parts, rest = [], False
        for b in batch_sizes:
            call = fast_row(sized[b], impl)
            empty = (call.get("empty_step_us") or {}).get("median")
            saved = call.get("overhead_us")
            if empty is None or saved is None or saved <= 0:
                return one
            rest = rest or empty < saved
            if empty < saved:
                parts.append(f"{100 * empty / saved:.0f}% of the {number(saved)} µs")
            else:
                parts.append(f"no less than the {number(saved)} µs ({number(empty)} µs)")
            parts[-1] += f" saved a step at batch {b}"
        said = f"{one}: an empty step's call is {', '.join(parts)}"
        return said + ("; the rest is not taken apart here" if rest else "")

    return told


def write_fast_step(results: Sequence[dict[str, Any]], doc: Path) -> None:
    """Each block of ``doc`` (``<!-- fast-step:NAME:begin -->`` ... ``end``) filled with its
    table from every result that measured it, each under the line that names its machine."""
    blocks = [fast_step_blocks(result) for result in results]
    for name in blocks[0] if blocks else ():
        parts = [
            f"On the {backend_name(result)} ({provenance(result)}):\n\n" + "\n".join(b[name])
            for result, b in zip(results, blocks, strict=True)
            if b[name]
        ]
        text = "\n".join(parts).rstrip() or "Not measured in the committed results."
        begin, end = f"<!-- fast-step:{name}:begin -->", f"<!-- fast-step:{name}:end -->"
        write_between_markers(doc, begin, end, text)
