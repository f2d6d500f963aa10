"""The ranked ways to a faster step that open ``docs/fast_step.md``: for each way of writing the
step the benchmark measured against its fast path (and the frameworks' own jit wrappers), the
largest gain per call it gave beyond noise, ranked, with the ranks whose intervals overlap said
to be in no measured order, and the ways that gave nothing per call, with what they cost as one
compiled step.
"""

from __future__ import annotations

from typing import Any

from cvae_rosetta.bench.markdown import UNDONATED, megabytes, path_label, ratio
from cvae_rosetta.bench.results import FAST, SAME_AS_FAST, batches_by_size, differs

# What to write, for each way of writing the step the benchmark measures against the fast path:
# True where the fast path is the advised form (the technique is what to avoid), False where the
# technique itself is.
ADVICE = {
    "no donation": ("Donate the state (`jax.jit(train_step, donate_argnums=0)`)", True),
    "optax's clipping": (
        "Clip by one scalar factor, `g * min(1, c / n)`, not `optax.clip_by_global_norm`",
        True,
    ),
    "optax.flatten": ("Keep the parameters a tree, not `optax.flatten`", True),
    "optax's AdamW": ("Bias corrections as scalar factors, not `optax.adamw`", True),
    "kernel layout": ("The kernels' gradient in their own layout, `h.T @ g` (below)", False),
}


def checklist(result: dict[str, Any]) -> list[str]:
    """The ways to a faster step, ranked by the largest gain per call each gave in ``result``
    (beyond noise), each with its gain and batch size; those that gave none beyond noise after
    them. The frameworks' own jit wrappers against their fast path are one way among them,
    counted at their largest gain."""
    gains: list[tuple[float, tuple[float, float], str]] = []  # (gain, its interval, words)
    none: list[str] = []
    wrappers = []
    for b, batch in batches_by_size(result):
        for row in batch["paths"]:
            entry = (row.get("vs_fast") or {}).get("step")
            if row["path"] not in (FAST, SAME_AS_FAST) and entry and differs(entry):
                wrappers.append((entry["ratio"], b, path_label(row), row["path"], entry))
    if wrappers:
        top, b, label, path, entry = max(wrappers, key=lambda w: w[0])
        undonated = ", which donates nothing" if path in UNDONATED else ""
        gains.append(
            (top, (entry["low"], entry["high"]),
             f"Step with `jax.jit` over a pure state, the noise drawn inside the step, not "
             f"the framework's own jit wrapper with the noise drawn outside it{undonated}: "
             f"up to {top:.2f}x per call ({label}, batch {b})")
        )  # fmt: skip
    best: dict[str, tuple[float, tuple[float, float], int] | None] = {}
    for part in result.get("techniques") or []:
        for r in part["rows"]:
            if r["technique"] not in ADVICE:
                continue
            words, fast_is_advised = ADVICE[r["technique"]]
            entry = r["vs_fast"]["step_us"]
            if fast_is_advised:
                gain, interval = entry["ratio"], (entry["low"], entry["high"])
            else:  # the gain is the inverse ratio, its interval the inverted bounds
                gain, interval = 1 / entry["ratio"], (1 / entry["high"], 1 / entry["low"])
            best.setdefault(words, None)
            if differs(entry) and gain > 1 and gain > (best[words] or (0,))[0]:
                best[words] = (gain, interval, part["batch_size"])
    for words, found in best.items():
        if found:
            gain, interval, b = found
            gains.append((gain, interval, f"{words}: {gain:.2f}x per call (batch {b})"))
        else:
            none.append(words)
    if not gains and not none:
        return []
    ranked = sorted(gains, key=lambda g: g[0], reverse=True)
    lines = [f"{n}. {words}" for n, (_, _, words) in enumerate(ranked, 1)]
    lines += _overlapping_ranks([interval for _, interval, _ in ranked])
    if none:
        said = "; ".join(words[0].lower() + words[1:] for words in none)
        lines += ["", f"No gain per call beyond noise at the batch sizes measured: {said}."]
        inside = _device_costs(result)
        if costs := [inside[words] for words in none if words in inside]:
            said = "; ".join(costs)
            lines[-1] += f" Within noise per call, but not in the compiled step: {said}."
    return [*lines, ""]


def _overlapping_ranks(intervals: list[tuple[float, float]]) -> list[str]:
    """For each run of neighbouring ranks whose intervals overlap (each gain beyond noise, their
    order not), a line saying so: ``["", "Ranks 2 to 4 ..."]``, or none."""
    runs: list[list[int]] = []
    for n in range(1, len(intervals)):
        (low, _), (_, high) = intervals[n - 1], intervals[n]
        if high >= low:  # the lower-ranked one's interval reaches the higher-ranked one's
            if runs and runs[-1][-1] == n - 1:
                runs[-1].append(n)
            else:
                runs.append([n - 1, n])
    said = []
    for run in runs:
        shown = ", ".join(f"{intervals[i][0]:.2f}–{intervals[i][1]:.2f}" for i in run)
        which = "and" if len(run) == 2 else "to"
        said.append(
            f"Ranks {run[0] + 1} {which} {run[-1] + 1} are each a gain beyond noise, but their "
            f"intervals overlap ({shown}): their order is not measured."
        )
    return ["", " ".join(said)] if said else []


def _device_costs(result: dict[str, Any]) -> dict[str, str]:
    """For each advised form (:data:`ADVICE`), what the other way cost beyond noise as one
    compiled step (device time, and the bytes it moved against the fast path's), at the batch
    size where it cost most: ``words -> text``."""
    worst: dict[str, tuple[float, str]] = {}
    for part in result.get("techniques") or []:
        fast = next((r for r in part["rows"] if r["technique"] == FAST), None)
        for r in part["rows"]:
            words, fast_is_advised = ADVICE.get(r["technique"], ("", False))
            device = r["vs_fast"].get("scan_us")
            if not (fast_is_advised and device and differs(device) and device["ratio"] > 1):
                continue
            said = f"`{r['technique']}` {ratio(device)} device time"
            if fast and fast.get("bytes_accessed") and r.get("bytes_accessed"):
                moved = (megabytes(r["bytes_accessed"]), megabytes(fast["bytes_accessed"]))
                said += f", {moved[0]} moved against {moved[1]}"
            if device["ratio"] > worst.get(words, (0.0, ""))[0]:
                worst[words] = (device["ratio"], f"{said} at batch {part['batch_size']}")
    return {words: text for words, (_, text) in worst.items()}
