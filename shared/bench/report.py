"""Every published measurement as Markdown and PNG plots: the page ``cvae bench`` writes beside its
``bench.json``, and ``docs/performance.md`` and the decision table of ``docs/choosing.md``, which
``benchmarks/render.py`` renders from the committed result files (one section per machine, never
two machines in one column).

Every number and every ordering on these pages is read from a result file. A ratio is shown with
its interval over paired rounds (:func:`cvae_rosetta.bench.results.interval`); where the interval
holds 1.0 the cell says "≈" and "within noise", and nothing is ranked. Device time (the step
inside one ``lax.scan``) and per-call cost (a Python loop of jitted steps) answer different
questions and are reported apart. Plots are drawn with matplotlib's ``Figure`` and Agg canvas
(never ``pyplot``), written atomically.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta.bench.results import (
    BASE_DISTRIBUTIONS,
    FAST,
    OTHERS,
    REFERENCE,
    SAME_AS_FAST,
    differs,
    fast_row,
    load,
    loaded,
    parameter_count,
    provenance,
    scan_row,
)
from cvae_rosetta.files import write_text
from cvae_rosetta.spec import registry


@functools.cache
def impl_label(impl: str) -> str:
    """``impl``'s name on the pages, its ``ABOUT["label"]``; one not registered here: its name."""
    return found.about.label if (found := registry.info(impl)) else impl


PLOTS = {"step_time": "step time per call and device time against pure JAX"}
# Plots are drawn for the 688 px text column the page shows them in ({ width="688" }): 6.88 in at
# 100 px an inch, so 9 pt text reads as 12.5 px; 200 dpi makes the PNG 1376 px wide, for HiDPI.
DISPLAY_WIDTH, FIGURE_WIDTH, FIGURE_DPI = 688, 6.88, 200  # CSS px, inches, dots per inch
FIGURE_STYLE = {"font.size": 9, "axes.titlesize": 10, "figure.titlesize": 10}  # the rest: 9 pt
DECISION_BEGIN, DECISION_END = "<!-- decision:begin -->", "<!-- decision:end -->"
# The choosing page's decision table, one row per need a reader arrives with: the style (None: the
# one the results name, or any), what is measured for it (the device time against pure JAX and
# the path whose cost matters for that need; the compile time; the GPU's largest batch; data
# parallelism), and the caveat. The figures and the maintenance evidence are generated.
NEEDS = (
    (
        "Learning JAX, or teaching it",
        "pure_jax",
        "device",
        None,
        "You write the layers, the initialisation and the state's bookkeeping yourself: every "
        "line of the model is on the page.",
    ),
    (
        "Research code that changes every day",
        "equinox",
        "compile",
        "eqx.filter_jit",
        "Objects that are pytrees, so every JAX transformation applies as it is; per-example "
        "layers (`jax.vmap` over the batch) and `[out, in]` kernels; flatten the state for "
        "low-overhead loops.",
    ),
    (
        "A production model maintained for years",
        "flax_nnx",
        "device",
        "nnx.jit in place",
        "Objects with PyTorch habits, the API flax's own description presents; flax is still "
        "0.x, so pin a minor version. Split once and step with `jax.jit` in hot loops, as "
        "`impls/flax_nnx.py` does: `nnx.jit` walks the object graph on every call.",
    ),
    (
        "Large batches on one GPU",
        None,
        "gpu",
        None,
        "Every style's fast path runs one compiled step; what differs at large batches is the "
        "program XLA makes of it, named after each ratio.",
    ),
    (
        "Many devices or hosts",
        None,
        "parallel",
        None,
        "The data-parallel step is shared (`--data-parallel`): it takes each style's gradient "
        "function, so the style does not decide it. Several hosts: `cvae launch` or "
        "`--distributed`.",
    ),
    (
        "Keras habits (`fit`, callbacks), or one model for several backends",
        "keras",
        "device",
        "model.fit step",
        "Jit the step yourself with `stateless_call` and `stateless_apply`; the stock `AdamW` "
        "puts epsilon on the uncorrected root, not where optax does.",
    ),
    (
        "An existing Linen codebase",
        "flax_linen",
        "device",
        None,
        "Keep it; flax's description presents NNX and sends Linen to a documentation site of "
        "its own; `nnx.bridge` wraps Linen modules for a gradual move.",
    ),
    (
        "An existing Haiku codebase",
        "haiku",
        "device",
        None,
        "Keep it, pinned with the JAX range Haiku is tested with; not for new code.",
    ),
)


# --- formatting -----------------------------------------------------------------------------------


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table; ``align`` has an ``l`` or ``r`` per column (default: all left)."""
    marks = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if digits == 0 and abs(value) < 100:
        digits = 1
    return f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if abs(value) < 0.1 else f"{100 * value:.0f}%"


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


def _batches(result: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return sorted(((int(b), batch) for b, batch in result["batches"].items()), key=lambda t: t[0])


def _impls(result: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["impl"] for _, batch in _batches(result) for r in batch["paths"]))


def _row(batch: dict[str, Any], label: str) -> dict[str, Any] | None:
    return next((r for r in batch["paths"] if r["label"] == label), None)


def backend_name(result: dict[str, Any]) -> str:
    env = result["environment"]
    return "CPU" if env.get("backend") == "cpu" else f"{env.get('backend', '?').upper()}"


# --- findings: the sentences that rank --------------------------------------------------------


def findings(entries: dict[str, list[tuple[int, dict | None]]], note: dict | None = None) -> str:
    """``label -> [(batch, interval)]`` told as text: those that differ from 1.0 beyond their
    interval, ranked by their largest difference, and the rest said to be within noise (never
    ranked). ``note``: ``label -> {batch: words}`` added to a difference."""
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
        said = {b: w for b, _ in cells if (w := (note or {}).get(label, {}).get(b))}
        if len(set(said.values())) > 1:  # a different note at each batch size: say which is which
            said = {b: f"at batch {b}, {w}" for b, w in said.items()}
        extra = "; ".join(dict.fromkeys(said.values()))
        parts.append(f"{label} {size} at {where}" + (f" ({extra})" if extra else ""))
    text = ("Beyond noise: " + "; ".join(parts) + ".") if parts else "No difference beyond noise."
    if same:
        text += f" Within noise at every batch size: {', '.join(same)}."
    return text


# --- causes: what the compiled programs say -------------------------------------------------------


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f} MB"


SAME_PROGRAM = (
    "the same compiled program as pure JAX's: the machine's variation between rounds, not a "
    "difference of the step"
)


def cause(batch: dict[str, Any], impl: str, model: dict[str, Any]) -> str:
    """Why ``impl``'s step may differ from pure JAX's at one batch size, read from the two fast
    paths' optimized HLO: the same program (equal fingerprints), or what differs (fusions, copies,
    transposes, bytes per step, the bytes also in passes over the float32 parameters)."""
    mine, ref = fast_row(batch, impl), fast_row(batch, REFERENCE)
    a, b = mine.get("hlo") or {}, ref.get("hlo") or {}
    if a.get("fingerprint") and a.get("fingerprint") == b.get("fingerprint"):
        return SAME_PROGRAM
    parts = [
        f"{a[k]} {k} against {b[k]}"
        for k in ("fusions", "copies", "transposes")
        if k in a and k in b and a[k] != b[k]
    ]
    x, y = mine.get("bytes_accessed"), ref.get("bytes_accessed")
    if x and y and abs(x - y) > 0.005 * y:
        passes = (x - y) / (4 * parameter_count(model))
        parts.append(
            f"{_mb(x)} against {_mb(y)} per step ({passes:+.1f} passes over the parameters)"
        )
    if parts:
        return "its compiled program: " + ", ".join(parts)
    if not a.get("fingerprint"):  # a run of the harness before fingerprints
        return "the same counts of fusions, copies and transposes as pure JAX's; no fingerprint"
    return "its compiled program: the same counts as pure JAX's, other instructions"


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def programs(result: dict[str, Any]) -> str:
    """Which fast paths compile to one program (equal fingerprints), batch size by batch size, in
    a sentence; empty where no fingerprint was recorded."""
    told: dict[str, list[int]] = {}
    for b, batch in _batches(result):
        groups: dict[str, list[str]] = {}
        for r in batch["paths"]:
            if r["path"] == FAST and (print_ := (r.get("hlo") or {}).get("fingerprint")):
                groups.setdefault(print_, []).append(impl_label(r["impl"]))
        shared = [f"{_and(g)} compile to one program" for g in groups.values() if len(g) > 1]
        alone = [g[0] for g in groups.values() if len(g) == 1]
        if alone:
            shared.append(f"{_and(alone)} to {'one of its own' if len(alone) == 1 else 'one each'}")
        if groups:
            told.setdefault("; ".join(shared), []).append(b)
    every = len(result["batches"])
    parts = [
        f"{'at every batch size' if len(at) == every else 'at batch ' + _and(list(map(str, at)))}"
        f", {words}"
        for words, at in told.items()
    ]
    text = _and(parts) if parts else ""
    return f"{text[:1].upper()}{text[1:]}." if parts else ""


def causes(result: dict[str, Any], labels: dict[str, str]) -> dict[str, dict[int, str]]:
    """``label -> {batch: cause}`` for :func:`findings`' notes."""
    model = result["settings"]["model"]
    return {
        shown: {b: cause(bt, i, model) for b, bt in _batches(result)} for i, shown in labels.items()
    }


# --- one result's section -------------------------------------------------------------------------


def section(
    result: dict[str, Any], images: dict[str, str], level: int = 2, *, sized: bool = False
) -> list[str]:
    """Everything one result file says, under headings of ``level``; ``sized``: the plots shown at
    :data:`DISPLAY_WIDTH` (attr_list syntax, for the MkDocs site)."""
    h = "#" * level
    return [
        *_conditions(result),
        *_fast(result, images, h, sized),
        *_wrapper_costs(result, h),
        *_overhead(result, h),
        *_compile(result, h),
        *_roof(result, h),
        *_techniques(result, h),
        *_precision(result, h),
        *_parallel(result, h),
    ]


def _part(heading: str, text: str, *body: str) -> list[str]:
    """A part of a section: its heading, its opening paragraph and what follows, as lines."""
    return [heading, "", text, "", *body]


def _conditions(result: dict[str, Any]) -> list[str]:
    env, settings, v = result["environment"], result["settings"], result["environment"]["versions"]
    frameworks = [n for n in v if n not in (*BASE_DISTRIBUTIONS, "python", "cvae-rosetta")]
    libs = ", ".join(f"{n} {v[n]}" for n in [*frameworks, "optax"] if v.get(n))
    model = settings["model"]
    device = f"{env.get('device_kind')}, " if env.get("backend") != "cpu" else ""
    lines = [
        f"- **Machine**: {device}{env['cpu_model']}, {env.get('usable_cores', '?')} usable "
        f"cores; {env['device_count']} JAX device(s); XLA flags `{env['xla_flags'] or '(none)'}`.",
        f"- **Versions**: python {v['python']}, jax {v['jax']}, jaxlib {v['jaxlib']}, {libs}.",
        f"- **When**: started {result.get('started', '?')}, "
        f"{_num(result.get('duration_s'), 0)} s; other processes used "
        f"{_num((result.get('other_processes_cpu') or {}).get('cores'), 2)} cores on average.",
        f"- **Rounds**: {settings['rounds']}, every path timed once per round, interleaved; "
        f"intervals are the order statistics of the per-round ratios that hold their median "
        f"with {_pct(_confidence(result))} confidence.",
        f"- **Model**: {model['input_dim']} inputs, encoder "
        f"{'-'.join(map(str, model['encoder_dims']))}, latent {model['latent_dim']}, "
        f"{model['compute_dtype']}, synthetic data, the same canonical parameters everywhere.",
        "",
    ]
    if outside := _outside_requirement(v.get("jax")):
        lines += [f"**jax {v['jax']} lies outside the project's `{outside}`**.", ""]
    if result.get("schema_read"):
        lines += [
            f"Measured with the harness of schema `{result['schema_read']}`; every ratio and "
            "interval here is derived again from its recorded rounds.",
            "",
        ]
    if loaded(result):
        lines += [
            f"**Taken on a loaded machine** (other processes used more than {OTHERS} cores): "
            "absolute times are slower and noisier; the paired ratios suffer less.",
            "",
        ]
    return lines


def _outside_requirement(version: str | None) -> str | None:
    """The project's own ``jax`` requirement where ``version`` does not meet it, else None."""
    import importlib.metadata

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split(".") if p.isdigit())

    try:
        need = next(r for r in importlib.metadata.requires("cvae-rosetta") or () if r[:4] == "jax<")
    except (importlib.metadata.PackageNotFoundError, StopIteration):
        return None
    have = parts(version or "")
    for bound in need[3:].split(","):
        op, value = ("<", bound[1:]) if bound[0] == "<" else (">=", bound[2:])
        if have and (have >= parts(value) if op == "<" else have < parts(value)):
            return need
    return None


def _confidence(result: dict[str, Any]) -> float | None:
    for _, batch in _batches(result):  # the first batch's
        return fast_row(batch, REFERENCE)["vs_pure_jax"]["step"].get("confidence")
    return None


def _image(images: dict[str, str], name: str, sized: bool = False) -> list[str]:
    width = f'{{ width="{DISPLAY_WIDTH}" }}' if sized else ""
    return [f"![{PLOTS[name]}]({images[name]}){width}", ""] if name in images else []


def _grid(result: dict[str, Any], cell, labels: dict[str, str]) -> str:
    """A table of ``cell(batch, key)``: a row per ``labels`` item (key -> shown), a column per
    batch size."""
    batches = _batches(result)
    rows = [[shown, *(cell(batch, key) for _, batch in batches)] for key, shown in labels.items()]
    return markdown_table(["", *(f"batch {b}" for b, _ in batches)], rows, "l" + "r" * len(batches))


def _compared(result: dict[str, Any], get, labels: dict[str, str], note=None, extra=None) -> list:
    """A table of intervals (``get(batch, key)``, one row per ``labels`` item, one column per
    batch size, ``extra(batch, key)`` added to a cell) and the findings in words under it."""
    entries = {
        shown: [(b, get(batch, key)) for b, batch in _batches(result)]
        for key, shown in labels.items()
    }

    def cell(batch, key):
        entry = get(batch, key)
        return ratio(entry) + (extra(batch, key) if extra and entry else "")

    return [_grid(result, cell, labels), findings(entries, note), ""]


def _fast(result: dict[str, Any], images: dict[str, str], h: str, sized: bool) -> list[str]:
    labels = {i: impl_label(i) for i in _impls(result) if i != REFERENCE}

    def device(batch, impl):
        return (scan_row(batch, impl) or {}).get("vs_pure_jax", {}).get("step")

    def call(batch, impl):
        return fast_row(batch, impl)["vs_pure_jax"]["step"]

    why = causes(result, labels)
    same_device = {
        shown: {
            b: "device time within noise: the difference is in calling the step, not in the step"
            if device(bt, i) and not differs(device(bt, i))
            else why[shown][b]
            for b, bt in _batches(result)
        }
        for i, shown in labels.items()
    }
    return _part(
        f"{h} Fast paths against pure JAX",
        "**Device time**: the implementation's step run K times inside one jitted `lax.scan`, "
        "per step, as a ratio to pure JAX's (interval in brackets). This is what the framework "
        "does to the compiled step.",
        *_compared(result, device, labels, note=why),
        *_unrolls(result),
        "**Per call**: the protocol's `jax.jit(impl.train_step, donate_argnums=0)` called from a "
        "Python loop over K device-resident batches. This adds each call's dispatch, which "
        "decides the small batches.",
        "",
        *_compared(result, call, labels, note=same_device),
        *_image(images, "step_time", sized),
    )


def _unrolls(result: dict[str, Any]) -> list[str]:
    unrolls = {s["unroll"] for _, bt in _batches(result) for s in bt["epoch"] if s["unroll"] > 1}
    if not unrolls:
        return []

    def get(batch, unroll):
        return (scan_row(batch, REFERENCE, unroll) or {}).get("vs_unroll_1")

    labels = {u: f"unroll {u}" for u in sorted(unrolls)}

    def size(batch, unroll):  # the compiled loop's size, where the run recorded it
        a, b = ((scan_row(batch, REFERENCE, u) or {}).get("hlo") for u in (unroll, 1))
        if not (a and b):
            return None
        return (
            f"its compiled loop: {a['instructions']:,} instructions against {b['instructions']:,}"
        )

    why = {labels[u]: {b: size(bt, u) for b, bt in _batches(result)} for u in labels}
    return [
        "Pure JAX's scan with `lax.scan(..., unroll=u)`, per step, against `unroll=1`:",
        "",
        *_compared(result, get, labels, note=why),
    ]


def _vs_fast(batch: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The path ``label``'s time per call against its fast path's, with its interval."""
    return (_row(batch, label) or {}).get("vs_fast", {}).get("step")


def _wrapper_costs(result: dict[str, Any], h: str) -> list[str]:
    rows = {r["label"]: r for _, batch in _batches(result) for r in batch["paths"]}
    # every idiomatic path that is not its implementation's fast path
    labels = {w: path_label(r) for w, r in rows.items() if r["path"] not in (FAST, SAME_AS_FAST)}
    if not labels:
        return []

    def extra(batch, label):
        return f", {_row(batch, label)['vs_fast']['extra_us']:+,.0f} µs"

    def work(label):  # one note for every batch size: the wrapper's extra µs, smallest to largest
        extra = sorted(
            r["vs_fast"]["extra_us"] for _, bt in _batches(result) if (r := _row(bt, label))
        )
        span = f"{extra[0]:+,.0f} to {extra[-1]:+,.0f} µs a call"
        return f"the wrapper's own work around the step, {span}"

    why = {
        shown: dict.fromkeys(dict(_batches(result)), work(label)) for label, shown in labels.items()
    }
    return _part(
        f"{h} The frameworks' own jit wrappers",
        "Per call, each framework's idiomatic step (as its documentation writes it) against the "
        "same implementation's fast path, with the extra time per call (median against median).",
        *_compared(result, _vs_fast, labels, note=why, extra=extra),
    )


def _overhead(result: dict[str, Any], h: str) -> list[str]:
    def cell(batch, label):
        e = fast_row(batch, label).get("empty_step_us")
        return f"{_num(e['median'])} ({_num(e['min'])}–{_num(e['max'])})" if e else "-"

    return _part(
        f"{h} What one call costs",
        "µs per call of an *empty step*: a jitted function that takes the fast path's train state "
        "(donated), the batch and the key and hands back the state and zero metrics, computing "
        "nothing (median, fastest–slowest round).",
        _grid(result, cell, {i: impl_label(i) for i in _impls(result)}),
    )


def _compile(result: dict[str, Any], h: str) -> list[str]:
    batches = _batches(result)
    times = ("trace_s", "lower_s", "compile_s", "first_call_s")
    rows = []
    for r in batches[-1][1]["paths"]:
        if r.get("same_as_fast"):
            continue
        seen = [(_row(bt, r["label"]) or {}) for _, bt in batches]
        cells = [sorted(x[t] for x in seen if x.get(t) is not None) for t in times]
        rows.append([path_label(r), *(_spread_cell(c) for c in cells)])
    b, first = batches[0]
    groups = programs(result)
    fast = [r for r in first["paths"] if r["path"] == FAST and r.get("hlo")]
    ref = (fast_row(first, REFERENCE).get("hlo") or {}).get("fingerprint")
    hlo = [
        [impl_label(r["impl"]), _num((r.get("flops") or 0) / 1e6, 1), _mb(r.get("bytes_accessed"))]
        + [str(r["hlo"].get(count, "-")) for count in ("fusions", "copies", "transposes")]
        + [
            "= pure JAX"
            if ref and r["hlo"].get("fingerprint") == ref
            else r["hlo"].get("fingerprint", "-")
        ]
        for r in fast
    ]
    return _part(
        f"{h} Compile time and what XLA compiled",
        f"Seconds, median over the {len(batches)} batch sizes (fastest–slowest): a fast path's "
        "`trace`, `lower` and `compile` after `jax.clear_caches()`, "
        + (
            "the order of the paths rotating from batch size to batch size so that none always "
            "compiles first"
            if "technique_batches" in result["settings"]
            else "pure JAX first at every batch size (this run's harness did not rotate the order: "
            "pure JAX's slowest compile may hold the process's first-compile costs)"
        )
        + "; a wrapper's first call, split by JAX's own compile events.",
        markdown_table(["path", "trace", "lower", "compile", "first call"], rows, "lrrrr"),
        f"The fast paths' optimized HLO at batch {b}: MFLOP and bytes per step (`cost_analysis`), "
        "fusions, copies, transposes, and the program's fingerprint (a hash of the HLO without "
        "its names and source locations: equal fingerprints are one program, run as the same "
        "kernels on the same buffers).",
        "",
        markdown_table(
            ["fast path", "MFLOP", "bytes", "fusions", "copies", "transposes", "program"],
            hlo,
            "lrrrrrl",
        ),
        *([groups, ""] if groups else []),
    )


def _spread_cell(values: list[float]) -> str:
    """``median (fastest–slowest)`` of sorted ``values``."""
    if len(values) < 2:
        return _num(values[0], 2) if values else "-"
    return f"{_num(statistics.median(values), 2)} ({_num(values[0], 2)}–{_num(values[-1], 2)})"


def _moved(row: dict[str, Any]) -> str:
    """Bytes per step, and their share of the spec's minimum (exact: no interval)."""
    share = row.get("traffic")
    return _mb(row.get("bytes_accessed")) + (f" ({100 * share:.0f}%)" if share else "")


def _percent(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    span = f" ({_pct(entry['low'])}–{_pct(entry['high'])})" if entry.get("low") else ""
    return f"{_pct(entry['ratio'])}{span}"


def _roof(result: dict[str, Any], h: str) -> list[str]:
    batches, n = _batches(result), result["settings"]["roof_size"]
    params = parameter_count(result["settings"]["model"])
    if not all(bt.get("bandwidth") for _, bt in batches):  # measured before the roofline
        rows = [[str(b), _num(bt["roof"]["gflops_per_s"])] for b, bt in batches]
        return _part(
            f"{h} Against the matmul roof",
            f"This run timed a float32 {n}x{n} matmul only, no bandwidth: no roofline.",
            markdown_table(["batch", "roof GFLOP/s"], rows, "rr"),
        )
    impls = {i: impl_label(i) for i in _impls(result)}

    def fraction(batch, impl):
        return _percent((scan_row(batch, impl) or {}).get("bound_fraction"))

    rates = {
        "matmul GFLOP/s": lambda bt: _num(bt["roof"]["peak_gflops_per_s"]),
        "bandwidth GB/s": lambda bt: _num(bt["bandwidth"]["gb_per_s"]),
        "the spec's minimum": lambda bt: _mb(bt["minimum_bytes"]),
    }
    return _part(
        f"{h} Against the roofline",
        "A step takes at least the larger of its FLOPs at the matmul rate and its bytes at the "
        "memory bandwidth (the roofline of Williams, Waterman and Patterson, 2009), FLOPs and "
        "bytes from the `cost_analysis` of its compiled fast path. Both rates are timed in the "
        f"same rounds as the steps: a jitted float32 {n}x{n} matmul, and a streaming Adam-like "
        f"update (4 reads, 3 writes) over float32 buffers of the {params:,} parameters' size, "
        "called from Python (its dispatch counts against it); each rate is its fastest round's, "
        "what the machine showed it can do. The spec's minimum is what any "
        f"step must move: {PASSES_WORDS} and the batch read once; activations are left out, so "
        "it bounds the small batches closely and the large ones loosely.",
        _grid(result, lambda bt, key: rates[key](bt), {k: k for k in rates}),
        "Bytes each fast path moves per step, and their share of the spec's minimum (100 % "
        "is the minimum):",
        "",
        _grid(result, lambda bt, impl: _moved(fast_row(bt, impl)), impls),
        "Device time's share of the roofline's bound: the bound over the step's device time "
        "(100 % is the bound; interval over the rounds):",
        "",
        _grid(result, fraction, impls),
    )


PASSES_WORDS = (
    "11 passes over the float32 parameters (read forward and backward, the gradient written and "
    "read once for the clipping norm, Adam's four reads and three writes)"
)


def _techniques(result: dict[str, Any], h: str) -> list[str]:
    parts = result.get("techniques") or []
    if not parts:
        return []
    rows = []
    for part in parts:
        for r in sorted(part["rows"], key=lambda r: r["technique"] == FAST):  # the fast path last
            fast = r["technique"] == FAST
            times = [
                f"{_num(r[t]['median'])} µs" if fast else ratio(r["vs_fast"][t])
                for t in ("step_us", "scan_us")
            ]
            name = "fast path" if fast else f"`{r['technique']}`"
            counts = [str(r["hlo"].get(k, "-")) for k in ("fusions", "transposes")]
            rows.append([name, str(part["batch_size"]), *times, _moved(r), *counts])
    return _part(
        f"{h} Pure JAX's step, written other ways",
        "Pure JAX's step against its fast path, per call and as one `lax.scan` (device time), with "
        "its bytes per step (and their share of the spec's minimum), fusions and transposes; the "
        "fast path's own times in its row. The docs' page *Making the step fast* reads them style "
        "by style.",
        markdown_table(
            ["written", "batch", "per call", "device time", "bytes", "fusions", "transposes"],
            rows,
            "lrrrrrr",
        ),
    )


def _precision(result: dict[str, Any], h: str) -> list[str]:
    parts = result.get("precision") or []
    if not parts:
        return []
    impls = list(dict.fromkeys(r["impl"] for p in parts for r in p["rows"]))
    bf16 = [{r["impl"]: r for r in p["rows"] if r["dtype"] == "bfloat16"} for p in parts]
    rows = [
        [impl_label(i), *(ratio(b[i]["vs_float32"]) if i in b else "-" for b in bf16)]
        for i in impls
    ]
    header = ["bfloat16 / float32", *(f"batch {p['batch_size']}" for p in parts)]
    return _part(
        f"{h} bfloat16 against float32",
        "Per call, each fast path with `compute_dtype` bfloat16 against the same path in float32 "
        "(parameters and Adam in float32 both ways), the two interleaved.",
        markdown_table(header, rows, "l" + "r" * len(parts)),
    )


def _parallel(result: dict[str, Any], h: str) -> list[str]:
    data = result.get("data_parallel")
    if not data or not data["rows"]:
        return []
    impls = list(dict.fromkeys(r["impl"] for r in data["rows"]))
    cases = sorted(
        {(r["mechanism"], r["devices"]) for r in data["rows"] if r["mechanism"] != "none"}
    )
    cell = {(r["impl"], r["mechanism"], r["devices"]): r for r in data["rows"]}
    rows = [
        [f"{m} x{n}", *(ratio(cell.get((i, m, n), {}).get("vs_serial")) for i in impls)]
        for m, n in cases
    ]
    note = (
        f" **{data['note']}**: this shows what each mechanism costs, not how it scales."
        if data.get("note")
        else ""
    )
    return _part(
        f"{h} Data parallelism",
        f"The step `cvae train --data-parallel` runs, at global batch {data['batch_size']}, as a "
        f"ratio to the same implementation's serial step.{note}",
        markdown_table(["mechanism", *map(impl_label, impls)], rows, "l" + "r" * len(impls)),
    )


# --- pages ----------------------------------------------------------------------------------------


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


def performance_page(parts: Sequence[tuple[str, dict[str, Any], dict[str, str]]]) -> str:
    """``docs/performance.md``: one section per result file ``(source, result, images)``."""
    lines = [
        "# Performance",
        "",
        "Generated by `python benchmarks/render.py` from the result files in "
        "`benchmarks/results/`; each section below is one file, measured on one machine on one "
        "day, and says which. Figures of different machines are never put in one column. "
        "Measure your own machine with `cvae bench --out DIR` (`--quick`: about a minute). "
        "Why the styles differ is read from their compiled programs (the causes after each "
        "difference, the fingerprints, the roofline); [making the step fast](fast_step.md) "
        "takes each way to a faster step in turn.",
        "",
        HOW_TO_READ,
        "",
    ]
    for source, result, images in parts:
        lines += [f"## On the {backend_name(result)}: {provenance(result)}", ""]
        lines += [f"From `{source}`.", "", *section(result, images, level=3, sized=True)]
    return "\n".join(lines).rstrip() + "\n"


def decision(results: Sequence[dict[str, Any]], maintenance: dict | None = None) -> str:
    """The choosing page's table: for each need, the style, what the results say, how its
    framework is maintained (``maintenance``: ``benchmarks/results/maintenance.json``), the
    caveat."""
    rows = []
    for need, impl, kind, wrapper, caveat in NEEDS:
        use = impl_label(impl) if impl else _use(results, kind)
        if kind == "gpu":
            reasons = [_gpu_reason(r) for r in results if backend_name(r) != "CPU"]
            reasons = reasons or ["**GPU**: no GPU run in the results: not measured"]
        elif kind == "parallel":
            reasons = [_parallel_reason(r) for r in results]
        else:
            reasons = [_reason(r, impl, wrapper, kind == "compile") for r in results]
        kept = impl or REFERENCE  # the GPU and data-parallel rows: JAX's own record
        rows.append(
            [
                need,
                use,
                "<br>".join(r for r in reasons if r),
                _maintained(kept, maintenance),
                caveat,
            ]
        )
    header = ["if you need", "use", "measured (per step, against pure JAX)", "maintained", "mind"]
    sources = "; ".join(f"{backend_name(r)}: {provenance(r)}" for r in results)
    note = f"\nMeasured on {sources} ([performance](performance.md)). ≈: within noise.\n"
    if maintenance:
        note += (
            f"\nMaintained: the final releases on {maintenance['registry']} as of "
            f"{maintenance['fetched']} (`benchmarks/maintenance.py`), and what the project's own "
            "description there says of its state, quoted.\n"
        )
    why = [f"{backend_name(r)}: {groups}" for r in results if (groups := programs(r))]
    if why:
        note += f"\nWhy the styles differ, from their compiled programs. {' '.join(why)}\n"
    return markdown_table(header, rows) + note


def _largest(result: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, dict]]:
    """The largest batch size, its batch, and ``impl -> device time against pure JAX`` there."""
    b, batch = _batches(result)[-1]
    device = {
        i: (scan_row(batch, i) or {}).get("vs_pure_jax", {}).get("step") for i in _impls(result)
    }
    device[REFERENCE] = device.get(REFERENCE) or {"ratio": 1.0, "within_noise": True}
    return b, batch, {i: e for i, e in device.items() if e}


def _fastest(result: dict[str, Any]) -> list[str]:
    """The styles whose device time at the largest batch is not beaten beyond noise: pure JAX and
    those within noise of it, unless one is faster beyond noise (then those below 1.0)."""
    _, _, device = _largest(result)
    faster = [i for i, e in device.items() if differs(e) and e["ratio"] < 1]
    return faster or [i for i, e in device.items() if not differs(e)]


def _use(results: Sequence[dict[str, Any]], kind: str) -> str:
    gpu = [r for r in results if backend_name(r) != "CPU"]
    if kind == "gpu" and gpu:
        return _or([impl_label(i) for i in _fastest(gpu[0])])
    return "any of the six" if kind == "parallel" else "not measured"


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _gpu_reason(result: dict[str, Any]) -> str:
    b, batch, device = _largest(result)
    model = result["settings"]["model"]
    apart = [
        f"{impl_label(i)} {ratio(e)} ({cause(batch, i, model)})"
        for i, e in device.items()
        if differs(e)
    ]
    same = [impl_label(i) for i, e in device.items() if not differs(e)]
    missing = [impl_label(i.name) for i in registry.known() if i.builtin and i.name not in device]
    text = f"**{backend_name(result)}**, device time at batch {b:,}: {_and(same)} within noise"
    text += ("; " + "; ".join(apart)) if apart else ""
    text += f"; {_and(missing)} not measured" if missing else ""
    return text + f" ({_rounds(result)})"


def _rounds(result: dict[str, Any]) -> str:
    return f"{result['settings']['rounds']} rounds, {provenance(result)}"


def _parallel_reason(result: dict[str, Any]) -> str:
    data = result.get("data_parallel") or {}
    rows = [r for r in data.get("rows", []) if r["mechanism"] != "none"]
    name = backend_name(result)
    if not rows:
        return f"**{name}**: data parallelism not measured in this run"
    apart = [r for r in rows if differs(r["vs_pure_jax"]["step"])]
    devices = sorted({r["devices"] for r in rows})
    mechanisms = ", ".join(sorted({r["mechanism"] for r in rows}))
    on = f"{_and([str(d) for d in devices])} device{'s' if devices != [1] else ''}"
    text = (
        f"**{name}**, per step against pure JAX under the same mechanism and device count "
        f"({mechanisms} on {on}): within noise in {len(rows) - len(apart)} of {len(rows)} cases"
    )
    if apart:
        text += "; " + "; ".join(
            f"{impl_label(r['impl'])} {r['mechanism']} on {r['devices']} "
            f"{ratio(r['vs_pure_jax']['step'])}"
            for r in apart
        )
    note = data.get("note")
    return text + (f" ({note})" if note else "")


def _maintained(impl: str, maintenance: dict | None) -> str:
    """Release history and the maintainers' own words for ``impl``'s distribution, with source."""
    found = registry.info(impl)
    name = found.about.distribution if found else impl
    record = (maintenance or {}).get("distributions", {}).get(name)
    if not record:
        return f"{name}: no record (`python benchmarks/maintenance.py` fetches one)"
    fetched = maintenance["fetched"]
    year = str(int(fetched[:4]) - 1) + fetched[4:]
    releases = record["releases"]
    recent = [r for r in releases if r["date"] > year]
    latest, first = releases[-1], releases[0]
    text = (
        f"{name}: {len(recent)} release{'' if len(recent) == 1 else 's'} in the year to "
        f"{fetched}, the latest {latest['version']} "
        f"({latest['date']}); {len(releases)} since {first['version']} ({first['date']})"
    )
    said = " ".join(f"“{s}”" for s in record["statements"])
    words = f"its description: {said}" if said else "its description says nothing of its state"
    return f"{text}. [{words}]({record['source']})" if said else f"{text}; {words}"


def _reason(result: dict[str, Any], impl: str, wrapper: str | None, compile: bool = False) -> str:
    batches = _batches(result)
    name = backend_name(result)
    sizes = f"batch {batches[0][0]} to {batches[-1][0]}" if len(batches) > 1 else "batch"
    if impl == REFERENCE:
        empty = [fast_row(bt, REFERENCE).get("empty_step_us") for _, bt in batches]
        empty = [e["median"] for e in empty if e]
        return (
            f"**{name}**: the reference the others are measured against; one call of a jitted "
            f"step costs {_num(min(empty))}–{_num(max(empty))} µs before any work"
            if empty
            else f"**{name}**: the reference"
        )
    device = [
        (b, (scan_row(bt, impl) or {}).get("vs_pure_jax", {}).get("step")) for b, bt in batches
    ]
    if all(e is None for _, e in device):
        return f"**{name}**: not measured in this run"
    apart = [(b, e) for b, e in device if differs(e)]
    model, at = result["settings"]["model"], dict(batches)
    text = f"**{name}**, device time: " + (
        "; ".join(f"{ratio(e)} at batch {b} ({cause(at[b], impl, model)})" for b, e in apart)
        + "; within noise at the others"
        if apart
        else f"within noise of pure JAX at every batch size ({sizes})"
    )
    rows = [(b, _row(bt, f"{impl}:{wrapper}")) for b, bt in batches] if wrapper else []
    rows = [(b, r) for b, r in rows if r]
    if rows:
        (b0, first), (b1, last) = rows[0], rows[-1]
        span = "" if b0 == b1 else f", {ratio(last['vs_fast']['step'])} at {b1}"
        text += (
            f"; `{wrapper}` per call, against the fast path: "
            f"{ratio(first['vs_fast']['step'])} at batch {b0}{span}"
        )
    if compile and (seconds := _to_compiled(batches, impl)):
        text += (
            f"; from the step's code to its compiled program (trace, lower, compile; median over "
            f"the batch sizes): {seconds[0]:.2f} s against pure JAX's {seconds[1]:.2f} s"
        )
    return text


def _to_compiled(batches: list, impl: str) -> tuple[float, float] | None:
    def median(name: str) -> float | None:
        rows = [_row(bt, name) for _, bt in batches]
        times = [
            sum(r[t] for t in ("trace_s", "lower_s", "compile_s"))
            for r in rows
            if r and all(r.get(t) is not None for t in ("trace_s", "lower_s", "compile_s"))
        ]
        return statistics.median(times) if times else None

    mine, ref = median(impl), median(REFERENCE)
    return (mine, ref) if mine is not None and ref is not None else None


# --- making the step fast -------------------------------------------------------------------------

FAST_STEP_FILE = "fast_step.md"  # words written by hand, its tables between fast-step markers


def fast_step_blocks(result: dict[str, Any]) -> dict[str, list[str]]:
    """The tables of ``docs/fast_step.md`` from one result: ``block -> lines`` (empty where the
    result did not measure it)."""
    impls = {i: impl_label(i) for i in _impls(result)}

    def in_scan(batch, impl):
        return (scan_row(batch, impl) or {}).get("vs_loop")

    one = "one dispatch for the K steps instead of one a step"
    dispatch = {shown: {b: one for b, _ in _batches(result)} for shown in impls.values()}

    groups = programs(result)
    blocks = {
        "programs": [groups] if groups else [],
        "scan": [*_compared(result, in_scan, impls, note=dispatch), *_unrolls(result)],
        "techniques": _techniques(result, "#")[4:],
        "precision": _precision(result, "#")[4:],
    }
    for impl in ("flax_nnx", "equinox", "keras"):
        labels = {
            r["label"]: path_label(r)
            for r in _batches(result)[0][1]["paths"]
            if r["impl"] == impl and r["path"] not in (FAST, SAME_AS_FAST)
        }
        blocks[impl] = _compared(result, _vs_fast, labels) if labels else []
    return blocks


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


# --- the terminal ---------------------------------------------------------------------------------


def terminal_summary(result: dict[str, Any]) -> str:
    lines = []
    for b, batch in _batches(result):
        cells = [
            f"{path_label(r)} {_num(r['step_us']['median'])} µs "
            f"({ratio(r['vs_pure_jax']['step'], short=True)})"
            for r in batch["paths"]
            if not r.get("same_as_fast")
        ]
        lines.append(f"batch {b}: " + ", ".join(cells))
    if loaded(result):
        lines.append("  note: the machine was loaded while measuring")
    return "\n".join(lines)


# --- plots ----------------------------------------------------------------------------------------


def figure_png(path: Path, height: float, draw) -> None:
    """``draw(figure)`` on a figure :data:`FIGURE_WIDTH` x ``height`` inches, :data:`FIGURE_STYLE`,
    written to ``path`` as a PNG at :data:`FIGURE_DPI`, atomically."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cvae_rosetta.files import atomic_write

    with matplotlib.rc_context(FIGURE_STYLE):
        figure = Figure(figsize=(FIGURE_WIDTH, height), dpi=FIGURE_DPI, layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure)
        save = lambda handle: figure.savefig(handle, format="png", dpi=FIGURE_DPI)
        atomic_write(path, save, parents=True)


def plots(result: dict[str, Any], directory: Path, prefix: str = "bench_") -> dict[str, str]:
    """Draw every plot (:data:`PLOTS`) into ``directory``; returns ``plot name -> file name``."""
    if not result["batches"]:
        return {}
    file = f"{prefix}step_time.png"
    figure_png(directory / file, 3.5, lambda figure: _plot_step_time(figure, result))  # inches high
    return {"step_time": file}


def _errorbar(axis, xs, entries, i, label):
    ys = [e["ratio"] for e in entries]
    low = [e["ratio"] - (e["low"] if e.get("low") is not None else e["ratio"]) for e in entries]
    high = [(e["high"] if e.get("high") is not None else e["ratio"]) - e["ratio"] for e in entries]
    style = {"color": f"C{i}", "marker": "o", "markersize": 4, "linewidth": 1.3}
    axis.errorbar(xs, ys, yerr=[low, high], label=label, capsize=2.5, **style)


DODGE = 1.1  # the factor between neighbouring implementations' x, so intervals do not overlap


def _plot_step_time(figure, result):
    device, call = figure.subplots(1, 2, sharey=True)
    batches = _batches(result)
    impls = _impls(result)
    for i, impl in enumerate(impls):
        shift = DODGE ** (i - (len(impls) - 1) / 2)
        scans = [(b, scan_row(bt, impl)) for b, bt in batches]
        scans = [(b * shift, s["vs_pure_jax"]["step"]) for b, s in scans if s]
        _errorbar(device, [b for b, _ in scans], [e for _, e in scans], i, impl_label(impl))
        calls = [(b * shift, fast_row(bt, impl)["vs_pure_jax"]["step"]) for b, bt in batches]
        _errorbar(call, [b for b, _ in calls], [e for _, e in calls], i, impl_label(impl))
    for axis, title in ((device, "device time (one lax.scan)"), (call, "per call (Python loop)")):
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        axis.set(xscale="log", xlabel="batch size", title=title)
        axis.set_xticks([b for b, _ in batches], [str(b) for b, _ in batches])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
    device.set(ylabel="ratio to pure JAX, with interval")
    legend = {"loc": "outside lower center", "ncols": min(len(impls), 6), "frameon": False}
    figure.legend(*call.get_legend_handles_labels(), **legend)  # below the panels, off the data
    rounds = result["settings"]["rounds"]
    figure.suptitle(f"{backend_name(result)}: {provenance(result)}; {rounds} rounds")


# --- writing into pages ---------------------------------------------------------------------------


def write_between_markers(doc: Path, begin: str, end: str, text: str) -> None:
    """Put ``text`` between the marker lines ``begin`` and ``end`` of the page ``doc`` (a
    generated table in a page written by hand), replacing what stood there; atomically."""
    page = doc.read_text()
    if begin not in page or end not in page:
        raise SystemExit(f"{doc}: no {begin} ... {end} markers to write the table between")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    write_text(doc, f"{head}{begin}\n{text}\n{end}{tail}")


def render_docs(
    sources: Sequence[tuple[Path, str]], docs: Path, maintenance: Path | None = None
) -> list[Path]:
    """``docs/performance.md``, its plots and the decision table of ``docs/choosing.md`` from
    result files ``(path, plot prefix)`` (from :func:`cvae_rosetta.bench.results.load`), and the
    maintenance record ``maintenance`` (``benchmarks/maintenance.py``'s file) where there is one."""
    parts = []
    for path, prefix in sources:
        result = load(path)
        images = {k: f"img/{v}" for k, v in plots(result, docs / "img", prefix).items()}
        parts.append((f"benchmarks/results/{path.name}", result, images))
    write_text(docs / "performance.md", performance_page(parts))
    record = json.loads(maintenance.read_text()) if maintenance and maintenance.is_file() else None
    table = decision([result for _, result, _ in parts], record).rstrip()
    write_between_markers(docs / "choosing.md", DECISION_BEGIN, DECISION_END, table)
    write_fast_step([result for _, result, _ in parts], docs / FAST_STEP_FILE)
    return [docs / "performance.md", docs / FAST_STEP_FILE, docs / "choosing.md"]
