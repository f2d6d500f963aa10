"""Why a style's step may differ from pure JAX's, read from the two fast paths' optimized HLO:
the same compiled program (equal fingerprints), or the fusions, copies, transposes and bytes per
step that differ; and which fast paths compile to one program, batch size by batch size.
"""

from __future__ import annotations

from typing import Any

from cvae_rosetta.bench.markdown import impl_label, listed, megabytes
from cvae_rosetta.bench.results import (
    FAST,
    REFERENCE,
    batches_by_size,
    fast_row,
    parameter_count,
)

SAME_PROGRAM = (
    "the same compiled program as pure JAX's: the machine's variation between rounds, not a "
    "difference of the step"
)


# What a fast path's optimized HLO is compared by, and its words: its fusions, the library calls
# among them (a matmul handed to cuBLAS or oneDNN), its copies and its transposes.
COUNTED = {
    "fusions": "fusions",
    "library_fusions": "library calls",
    "copies": "copies",
    "transposes": "transposes",
}


def _differences(batch: dict[str, Any], impl: str, model: dict[str, Any]) -> list[str]:
    """What differs between ``impl``'s fast path's optimized HLO and pure JAX's at one batch size:
    the counts of :data:`COUNTED`, and the bytes per step (also as passes over the float32
    parameters)."""
    mine, ref = fast_row(batch, impl), fast_row(batch, REFERENCE)
    a, b = mine.get("hlo") or {}, ref.get("hlo") or {}
    parts = [
        f"{a[k]} {COUNTED[k]} against {b[k]}" for k in COUNTED if k in a and k in b and a[k] != b[k]
    ]
    x, y = mine.get("bytes_accessed"), ref.get("bytes_accessed")
    if x and y and abs(x - y) > 0.005 * y:
        passes = (x - y) / (4 * parameter_count(model))
        parts.append(
            f"{megabytes(x)} against {megabytes(y)} per step "
            f"({passes:+.1f} passes over the parameters)"
        )
    return parts


def fingerprint(batch: dict[str, Any], impl: str) -> str | None:
    """The fingerprint of ``impl``'s fast path at one batch size (None: not recorded)."""
    return (fast_row(batch, impl).get("hlo") or {}).get("fingerprint")


def same_counts_unfingerprinted(batch: dict[str, Any], impl: str, model: dict[str, Any]) -> bool:
    """A run that recorded no fingerprint, where ``impl``'s program has pure JAX's counts and
    bytes: as like it as the record can tell."""
    return not fingerprint(batch, impl) and not _differences(batch, impl, model)


def cause(batch: dict[str, Any], impl: str, model: dict[str, Any]) -> str:
    """Why ``impl``'s step may differ from pure JAX's at one batch size, read from the two fast
    paths' optimized HLO: the same program (equal fingerprints), or what differs (fusions, library
    calls, copies, transposes, bytes per step, the bytes also in passes over the float32
    parameters)."""
    mine = fingerprint(batch, impl)
    if mine and mine == fingerprint(batch, REFERENCE):
        return SAME_PROGRAM
    if parts := _differences(batch, impl, model):
        return "its compiled one-step program: " + ", ".join(parts)
    if not mine:  # a run of the harness before fingerprints
        return (
            "the same counts of fusions, library calls, copies and transposes as pure JAX's; no "
            "fingerprint"
        )
    return "its compiled one-step program: the same counts as pure JAX's, other instructions"


def programs(result: dict[str, Any]) -> str:
    """Which fast paths compile to one program (equal fingerprints), batch size by batch size, in
    a sentence; empty where no fingerprint was recorded."""
    told: dict[str, list[int]] = {}
    for b, batch in batches_by_size(result):
        groups: dict[str, list[str]] = {}
        for r in batch["paths"]:
            if r["path"] == FAST and (print_ := (r.get("hlo") or {}).get("fingerprint")):
                groups.setdefault(print_, []).append(impl_label(r["impl"]))
        shared = [f"{listed(g)} compile to one program" for g in groups.values() if len(g) > 1]
        alone = [g[0] for g in groups.values() if len(g) == 1]
        if alone:
            shared.append(
                f"{listed(alone)} to {'one of its own' if len(alone) == 1 else 'one each'}"
            )
        if groups:
            told.setdefault("; ".join(shared), []).append(b)
    every = len(result["batches"])
    parts = [
        f"{'at every batch size' if len(at) == every else 'at batch ' + listed(list(map(str, at)))}"
        f", {words}"
        for words, at in told.items()
    ]
    text = listed(parts) if parts else ""
    return f"{text[:1].upper()}{text[1:]}." if parts else ""


def causes(result: dict[str, Any], labels: dict[str, str]) -> dict[str, dict[int, str]]:
    """``label -> {batch: cause}`` for :func:`findings`' notes."""
    model = result["settings"]["model"]
    return {
        shown: {b: cause(bt, i, model) for b, bt in batches_by_size(result)}
        for i, shown in labels.items()
    }
