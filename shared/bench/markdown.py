"""What every page of results is written with: the implementations' names as the pages show
them (the docs build's too), numbers and ratios (each with its interval) as cells, the findings
that rank what differs beyond noise and only that, and a generated table put between the markers
of a page written by hand. The tables themselves are :mod:`cvae_rosetta.app.markdown`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta.bench.results import FAST, differs
from cvae_rosetta.files import write_text
from cvae_rosetta.spec import registry


@functools.cache
def impl_label(impl: str) -> str:
    """``impl``'s name on the pages, its ``ABOUT["label"]``; one not registered here: its name."""
    return found.about.label if (found := registry.info(impl)) else impl


def number(value: float | None, digits: int = 0) -> str:
    """``value`` with thousands separated and ``digits`` decimals (one where none are asked for
    and it is under 100); ``-`` for none."""
    if value is None:
        return "-"
    if digits == 0 and abs(value) < 100:
        digits = 1
    return f"{value:,.{digits}f}"


def megabytes(n: float | None) -> str:
    """Bytes as ``12.3 MB``; ``-`` for none."""
    return "-" if n is None else f"{n / 1e6:,.1f} MB"


def ratio(entry: dict[str, Any] | None, *, short: bool = False) -> str:
    """An interval as a cell: ``1.95x (1.75-2.21)``, ``≈ 1.00x (0.96-1.07)`` within noise, and
    the ratio alone, marked, where the rounds were too few for an interval."""
    if not entry:
        return "-"
    if entry.get("low") is None:
        return f"{entry['ratio']:.2f}x (no interval: {entry['rounds']} rounds)"
    r = entry["ratio"]
    text = f"≈ {r:.2f}x" if entry["within_noise"] else f"{r:.2f}x"
    if short:
        return text
    # a third digit where two would round a bound of an interval without 1.0 to 1.00
    edge = not entry["within_noise"] and 1.0 in (round(entry["low"], 2), round(entry["high"], 2))
    digits = 3 if edge else 2
    return f"{text} ({entry['low']:.{digits}f}–{entry['high']:.{digits}f})"


def path_label(row: dict[str, Any]) -> str:
    name = impl_label(row["impl"])
    return name if row["path"] == FAST else f"{name} `{row['path']}`"


# The idiomatic paths that donate nothing: ``impls/equinox_impl.py``'s ``make_step`` is a bare
# ``@eqx.filter_jit``. NNX's steps (``donate_argnames``) and Keras's train function donate the
# state, as the fast path does.
UNDONATED = frozenset({"eqx.filter_jit"})


def around_the_step(path: str) -> str:
    """What an idiomatic path's call adds to its compiled step, against the fast path's, in words:
    its wrapper's work; the noise, which every path's step takes as an argument, drawn from the
    key outside the compiled step (one more dispatch a call; the fast path draws it inside its
    step); and, for a path of :data:`UNDONATED`, no donation."""
    if path in UNDONATED:
        return "the wrapper's work, a noise draw outside the compiled step and no donation"
    return "the wrapper's work and a noise draw outside the compiled step"


def backend_name(result: dict[str, Any]) -> str:
    env = result["environment"]
    return "CPU" if env.get("backend") == "cpu" else f"{env.get('backend', '?').upper()}"


def listed(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def findings(entries: dict[str, list[tuple[int, dict | None]]], note: dict | None = None) -> str:
    """``label -> [(batch, interval)]`` told as text: those that differ from 1.0 beyond their
    interval, ranked by their largest difference, and the rest said to be within noise (never
    ranked). ``note``: ``label -> {batch: words}`` added to a difference, or ``label -> function``
    of the batch sizes that differ (words about those batch sizes only)."""
    apart, same = [], []
    for label, cells in entries.items():
        if out := [(b, e) for b, e in cells if differs(e)]:
            apart.append((label, out))
        elif any(e for _, e in cells):
            same.append(label)
    parts = []
    for label, cells in sorted(apart, key=lambda x: -max(abs(e["ratio"] - 1) for _, e in x[1])):
        values = sorted(e["ratio"] for _, e in cells)
        low, high = f"{values[0]:.2f}x", f"{values[-1]:.2f}x"
        size = low if low == high else f"{low} to {high}"
        where = ", ".join(str(b) for b, _ in cells)
        where = "every batch size" if len(cells) == len(entries[label]) else f"batch {where}"
        told = (note or {}).get(label, {})
        if callable(told):
            extra = told([b for b, _ in cells])
        else:
            said = {b: w for b, _ in cells if (w := told.get(b))}
            if len(set(said.values())) > 1:  # a different note at each batch size: say which
                said = {b: f"at batch {b}, {w}" for b, w in said.items()}
            extra = "; ".join(dict.fromkeys(said.values()))
        parts.append(f"{label} {size} at {where}" + (f" ({extra})" if extra else ""))
    text = ("Beyond noise: " + "; ".join(parts) + ".") if parts else "No difference beyond noise."
    if same:
        text += f" Within noise at every batch size: {', '.join(same)}."
    return text


def write_between_markers(doc: Path, begin: str, end: str, text: str) -> None:
    """Put ``text`` between the marker lines ``begin`` and ``end`` of the page ``doc`` (a
    generated table in a page written by hand), replacing what stood there; atomically."""
    page = doc.read_text()
    if begin not in page or end not in page:
        raise SystemExit(f"{doc}: no {begin} ... {end} markers to write the table between")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    write_text(doc, f"{head}{begin}\n{text}\n{end}{tail}")
