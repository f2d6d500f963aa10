"""One result file's tables and findings, in the order its section of a page shows them (the
conditions, the fast paths against pure JAX, the frameworks' jit wrappers, what one call costs,
compile time and what XLA compiled, the roofline, pure JAX's step written other ways, bfloat16,
data parallelism): what ``cvae bench``'s ``bench.md`` shows. The docs build puts the same
sections into the repository's pages, and some tables alone, which are public here for it
(:func:`compared`, :func:`unrolls`, :func:`techniques_table`, :func:`precision_table`, with
:func:`vs_fast`).
"""

from __future__ import annotations

import statistics
from typing import Any

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench.causes import causes, programs
from cvae_rosetta.bench.markdown import (
    around_the_step,
    findings,
    impl_label,
    megabytes,
    number,
    path_label,
    ratio,
)
from cvae_rosetta.bench.plots import DISPLAY_WIDTH, PLOTS
from cvae_rosetta.bench.results import (
    BASE_DISTRIBUTIONS,
    FAST,
    OTHERS,
    REFERENCE,
    SAME_AS_FAST,
    batches_by_size,
    differs,
    fast_row,
    impls_measured,
    jax_outside,
    loaded,
    parameter_count,
    path_row,
    roof_times,
    scan_row,
)


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
        f"{number(result.get('duration_s'), 0)} s; other processes used "
        f"{number((result.get('other_processes_cpu') or {}).get('cores'), 2)} cores on average.",
        f"- **Rounds**: {settings['rounds']}, every path timed once per round, interleaved; "
        f"intervals are the order statistics of the per-round ratios that hold their median "
        f"with {_pct(_confidence(result))} confidence.",
        f"- **Model**: {model['input_dim']} inputs, encoder "
        f"{'-'.join(map(str, model['encoder_dims']))}, latent {model['latent_dim']}, "
        f"{model['compute_dtype']}, synthetic data, the same canonical parameters everywhere.",
        "",
    ]
    if outside := jax_outside(v.get("jax")):
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


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if abs(value) < 0.1 else f"{100 * value:.0f}%"


def _confidence(result: dict[str, Any]) -> float | None:
    for _, batch in batches_by_size(result):  # the first batch's
        return fast_row(batch, REFERENCE)["vs_pure_jax"]["step"].get("confidence")
    return None


def _image(images: dict[str, str], name: str, sized: bool = False) -> list[str]:
    width = f'{{ width="{DISPLAY_WIDTH}" }}' if sized else ""
    return [f"![{PLOTS[name]}]({images[name]}){width}", ""] if name in images else []


def _grid(result: dict[str, Any], cell, labels: dict[str, str]) -> str:
    """A table of ``cell(batch, key)``: a row per ``labels`` item (key -> shown), a column per
    batch size."""
    batches = batches_by_size(result)
    rows = [[shown, *(cell(batch, key) for _, batch in batches)] for key, shown in labels.items()]
    return markdown_table(["", *(f"batch {b}" for b, _ in batches)], rows, "l" + "r" * len(batches))


def compared(result: dict[str, Any], get, labels: dict[str, str], note=None, extra=None) -> list:
    """A table of intervals (``get(batch, key)``, one row per ``labels`` item, one column per
    batch size, ``extra(batch, key)`` added to a cell) and the findings in words under it."""
    entries = {
        shown: [(b, get(batch, key)) for b, batch in batches_by_size(result)]
        for key, shown in labels.items()
    }

    def cell(batch, key):
        entry = get(batch, key)
        return ratio(entry) + (extra(batch, key) if extra and entry else "")

    return [_grid(result, cell, labels), findings(entries, note), ""]


def _fast(result: dict[str, Any], images: dict[str, str], h: str, sized: bool) -> list[str]:
    labels = {i: impl_label(i) for i in impls_measured(result) if i != REFERENCE}

    def device(batch, impl):
        return (scan_row(batch, impl) or {}).get("vs_pure_jax", {}).get("step")

    def call(batch, impl):
        return fast_row(batch, impl)["vs_pure_jax"]["step"]

    why = causes(result, labels)
    same_device = {
        shown: {
            b: why[shown][b]
            if device(bt, i) is None or _same_way(device(bt, i), call(bt, i))
            else _calling(result, bt, i, device(bt, i))
            for b, bt in batches_by_size(result)
        }
        for i, shown in labels.items()
    }
    return _part(
        f"{h} Fast paths against pure JAX",
        "**Device time**: the implementation's step run K times inside one jitted `lax.scan`, "
        "per step, as a ratio to pure JAX's (interval in brackets). This is what the framework "
        "does to the compiled step.",
        *compared(result, device, labels, note=why),
        *unrolls(result),
        "**Per call**: the protocol's step, `jax.jit(impl.train_step, donate_argnums=0)` "
        "compiled ahead of time (`.trace(...).lower().compile()`), its executable called from a "
        "Python loop over K device-resident batches. " + _dispatch_share(result),
        "",
        *compared(result, call, labels, note=same_device),
        *_image(images, "step_time", sized),
    )


def _dispatch_share(result: dict[str, Any]) -> str:
    """What calling adds, as a share of pure JAX's step per call at the smallest and the largest
    batch size: the median *empty step* (below) against the step's median per call."""
    sized = batches_by_size(result)
    said = []
    for b, batch in sized[:1] + sized[1:][-1:]:
        row = fast_row(batch, REFERENCE)
        empty = row.get("empty_step_us")
        if empty:
            call = row["step_us"]["median"]
            said.append(f"{number(empty['median'])} µs of its {number(call)} µs at batch {b}")
    if not said:
        return "This adds what calling the step from Python costs."
    return (
        "This adds what calling the step from Python costs; one call of an empty step (a call "
        f"that computes nothing, below) took, for pure JAX, {' and '.join(said)}."
    )


def _same_way(device: dict | None, call: dict | None) -> bool:
    """Whether the compiled step's difference (its device time beyond noise) can explain the
    per-call one: it goes the same way (both slower, or both faster)."""
    if not (call and differs(device)):
        return False
    return (device["ratio"] - 1) * (call["ratio"] - 1) > 0


def _calling(
    result: dict[str, Any], batch: dict[str, Any], impl: str, device: dict | None = None
) -> str:
    """Why a per-call ratio differs from 1 where the compiled step cannot explain it (its device
    time within noise, or beyond noise the other way): the cost of calling the step (the empty
    step's) where it goes the same way and makes up at least half of the difference of the
    medians; the share it makes up where it goes the same way but less; else neither the step nor
    calling it."""
    step = (
        f"device time {ratio(device)}, the other way"
        if differs(device)
        else "device time within noise"
    )
    own, ref = fast_row(batch, impl), fast_row(batch, REFERENCE)
    empty, base = own.get("empty_step_us"), ref.get("empty_step_us")
    if not (empty and base):
        return f"{step}: not a difference of the compiled step"
    costs = f"an empty step {number(empty['median'])} µs against {number(base['median'])} µs"
    gap = own["step_us"]["median"] - ref["step_us"]["median"]
    extra = empty["median"] - base["median"]
    if gap * extra > 0 and abs(extra) >= abs(gap) / 2:
        return f"{step}, {costs}: the difference is in calling the step"
    machine = " on a loaded machine" if loaded(result) else ""
    rest = f"what is left, this run does not take apart{f' (it ran{machine})' if machine else ''}"
    if gap * extra > 0:
        share = f"{abs(extra) / abs(gap):.0%} of the difference"
        told = f"{number(abs(extra))} of {number(abs(gap))} µs"
        return f"{step} and {costs}: calling it makes up {share} ({told}); {rest}"
    return f"{step} and {costs}: not a difference of the step or of calling it; {rest}"


def unrolls(result: dict[str, Any]) -> list[str]:
    """Pure JAX's scan unrolled against ``unroll=1``, as a table with its findings, where the run
    measured an unroll; none where it did not."""
    measured = {
        s["unroll"] for _, bt in batches_by_size(result) for s in bt["epoch"] if s["unroll"] > 1
    }
    if not measured:
        return []

    def get(batch, unroll):
        return (scan_row(batch, REFERENCE, unroll) or {}).get("vs_unroll_1")

    labels = {u: f"unroll {u}" for u in sorted(measured)}

    def size(batch, unroll):  # the compiled loop's size, where the run recorded it
        a, b = ((scan_row(batch, REFERENCE, u) or {}).get("hlo") for u in (unroll, 1))
        if not (a and b):
            return None
        return (
            f"its compiled loop: {a['instructions']:,} instructions against {b['instructions']:,}"
        )

    why = {labels[u]: {b: size(bt, u) for b, bt in batches_by_size(result)} for u in labels}
    return [
        "Pure JAX's scan with `lax.scan(..., unroll=u)`, per step, against `unroll=1`:",
        "",
        *compared(result, get, labels, note=why),
    ]


def vs_fast(batch: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The path ``label``'s time per call against its fast path's, with its interval."""
    return (path_row(batch, label) or {}).get("vs_fast", {}).get("step")


def _wrapper_costs(result: dict[str, Any], h: str) -> list[str]:
    rows = {r["label"]: r for _, batch in batches_by_size(result) for r in batch["paths"]}
    # every idiomatic path that is not its implementation's fast path
    labels = {w: path_label(r) for w, r in rows.items() if r["path"] not in (FAST, SAME_AS_FAST)}
    if not labels:
        return []

    def extra(batch, label):
        return f", {path_row(batch, label)['vs_fast']['extra_us']:+,.0f} µs"

    def work(label):  # the path's extra µs at the batch sizes named, smallest to largest
        def told(named: list[int]) -> str:
            by_size = dict(batches_by_size(result))
            extra = sorted(path_row(by_size[b], label)["vs_fast"]["extra_us"] for b in named)
            low, high = f"{extra[0]:+,.0f}", f"{extra[-1]:+,.0f}"
            span = low if low == high else f"{low} to {high}"
            return f"{around_the_step(rows[label]['path'])}, {span} µs a call"

        return told

    why = {shown: work(label) for label, shown in labels.items()}
    return _part(
        f"{h} The frameworks' own jit wrappers",
        "Per call, each framework's idiomatic step (as its documentation writes it) against the "
        "same implementation's fast path, with the extra time per call (median against median). "
        "Each idiomatic step takes the noise as an argument, drawn from the key outside its "
        "compiled step (one more dispatch a call), where the fast path draws it inside; the extra "
        "time holds that draw beside the wrapper's own work (and, for a wrapper that donates "
        "nothing, the state's buffers not reused).",
        *compared(result, vs_fast, labels, note=why, extra=extra),
    )


def _overhead(result: dict[str, Any], h: str) -> list[str]:
    def cell(batch, label):
        e = fast_row(batch, label).get("empty_step_us")
        return f"{number(e['median'])} ({number(e['min'])}–{number(e['max'])})" if e else "-"

    return _part(
        f"{h} What one call costs",
        "µs per call of an *empty step*: a jitted function that takes the fast path's train state "
        "(donated), the batch and the key and hands back the state and zero metrics, computing "
        "nothing (median, fastest–slowest round).",
        _grid(result, cell, {i: impl_label(i) for i in impls_measured(result)}),
    )


def _compile(result: dict[str, Any], h: str) -> list[str]:
    batches = batches_by_size(result)
    times = ("trace_s", "lower_s", "compile_s", "first_call_s")
    rows = []
    for r in batches[-1][1]["paths"]:
        if r.get("same_as_fast"):
            continue
        seen = [(path_row(bt, r["label"]) or {}) for _, bt in batches]
        cells = [sorted(x[t] for x in seen if x.get(t) is not None) for t in times]
        rows.append([path_label(r), *(_spread_cell(c) for c in cells)])
    b, first = batches[0]
    groups = programs(result)
    fast = [r for r in first["paths"] if r["path"] == FAST and r.get("hlo")]
    ref = (fast_row(first, REFERENCE).get("hlo") or {}).get("fingerprint")
    hlo = [
        [
            impl_label(r["impl"]),
            number((r.get("flops") or 0) / 1e6, 1),
            megabytes(r.get("bytes_accessed")),
        ]
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
            else "pure JAX first at every batch size (this run's harness did not rotate the order)"
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
        return number(values[0], 2) if values else "-"
    return (
        f"{number(statistics.median(values), 2)} ({number(values[0], 2)}–{number(values[-1], 2)})"
    )


def _moved(row: dict[str, Any]) -> str:
    """Bytes per step, and their share of the spec's minimum (exact: no interval)."""
    share = row.get("traffic")
    return megabytes(row.get("bytes_accessed")) + (f" ({100 * share:.0f}%)" if share else "")


def _matmul_arithmetic(result: dict[str, Any]) -> str:
    """How a GPU run's float32 matmul multiplies: at JAX's default precision (the harness sets
    none), which on a GPU with tensor cores may be TensorFloat-32."""
    if result["environment"].get("backend") != "gpu":
        return ""
    return (
        " at JAX's default precision (`lax.Precision.DEFAULT`, which on a GPU with tensor cores "
        "may multiply float32 inputs in TensorFloat-32)"
    )


def _percent(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    span = f" ({_pct(entry['low'])}–{_pct(entry['high'])})" if entry.get("low") else ""
    return f"{_pct(entry['ratio'])}{span}"


def _roof(result: dict[str, Any], h: str) -> list[str]:
    batches, n = batches_by_size(result), result["settings"]["roof_size"]
    params = parameter_count(result["settings"]["model"])
    if not all(bt.get("bandwidth") for _, bt in batches):  # measured before the roofline
        fastest = {
            b: bt["roof"]["flops"] / min(bt["roof"]["call_us"]["rounds"]) for b, bt in batches
        }
        rows = [[str(b), number(fastest[b] / 1e3), *_compute_side(bt)] for b, bt in batches]
        header = ["batch", "roof GFLOP/s", "pure JAX's FLOPs at that rate", "its device time"]
        return _part(
            f"{h} Against the matmul roof",
            f"This run timed a float32 {n}x{n} matmul{_matmul_arithmetic(result)} only, no "
            "bandwidth: half a roofline. Pure JAX's step takes at least its FLOPs at the matmul's "
            "rate (its fastest round's; the "
            "compute side; the memory side was not measured), against its device time per step:",
            markdown_table(header, rows, "rrrr"),
        )
    impls = {i: impl_label(i) for i in impls_measured(result)}

    def fraction(batch, impl):
        return _percent((scan_row(batch, impl) or {}).get("bound_fraction"))

    rates = {
        "matmul GFLOP/s": lambda bt: number(bt["roof"]["peak_gflops_per_s"]),
        "bandwidth GB/s": lambda bt: number(bt["bandwidth"]["gb_per_s"]),
        "the spec's minimum": lambda bt: megabytes(bt["minimum_bytes"]),
    }
    passes = batches[0][1]["bandwidth"]["bytes"] / (4 * params)
    sides = {
        "compute side (FLOPs at the matmul rate)": lambda bt: _us(_sides(bt)[0]),
        "memory side (bytes at the bandwidth)": lambda bt: _us(_sides(bt)[1]),
        "the bound: the larger side": lambda bt: _binds(bt),
        "device time per step": lambda bt: _us(_device_us(bt)),
    }
    above = sorted(
        {(b, impl_label(i)) for b, bt in batches for i in impls
         if ((scan_row(bt, i) or {}).get("bound_fraction") or {}).get("high", 0) > 1}
    )  # fmt: skip
    return _part(
        f"{h} Against the roofline",
        "A step takes at least the larger of its FLOPs at the matmul rate and its bytes at the "
        "memory bandwidth (the roofline of Williams, Waterman and Patterson, 2009), FLOPs and "
        "bytes from the `cost_analysis` of its compiled fast path. Both rates are timed in the "
        f"same rounds as the steps: a jitted float32 {n}x{n} matmul, and a streaming Adam-like "
        f"update over four float32 buffers of the {params:,} parameters' size, its bytes counted "
        f"by its `cost_analysis` as the steps' are ({passes:.0f} passes over the parameters' "
        "size), called from Python (its dispatch counts against it); each rate is its fastest "
        "round's, what the machine showed it can do. The spec's minimum is what any "
        f"step must move: {PASSES_WORDS} and the batch read once; activations are left out, so "
        "it bounds the small batches closely and the large ones loosely.",
        _grid(result, lambda bt, key: rates[key](bt), {k: k for k in rates}),
        "Pure JAX's fast path against the two sides, in µs per step: which side binds at each "
        "batch size, and the device time the step took:",
        "",
        _grid(result, lambda bt, key: sides[key](bt), {k: k for k in sides}),
        "Bytes each fast path moves per step, and their share of the spec's minimum (100 % "
        "is the minimum):",
        "",
        _grid(result, lambda bt, impl: _moved(fast_row(bt, impl)), impls),
        "Device time's share of the roofline's bound: the bound over the step's device time "
        "(100 % is the bound; interval over the rounds):",
        "",
        _grid(result, fraction, impls),
        *(
            [
                "Above 100 %, a round ran faster than the bound: "
                + "; ".join(f"{name} at batch {b}" for b, name in above)
                + ". The bandwidth is the streaming update's, called from Python several times a "
                "round with each call's dispatch counted, while a step inside the scan pays none, "
                "so the memory side's rate can be understated and the bound overstated there.",
                "",
            ]
            if above
            else []
        ),
    )


def _sides(batch: dict[str, Any]) -> tuple[float, float | None]:
    return roof_times(fast_row(batch, REFERENCE), batch["roof"], batch.get("bandwidth"))


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2g} µs" if value < 1 else f"{number(value)} µs"


def _binds(batch: dict[str, Any]) -> str:
    compute, memory = _sides(batch)
    if memory is None:
        return f"{_us(compute)} (compute)"
    return f"{_us(max(compute, memory))} ({'memory' if memory > compute else 'compute'})"


def _device_us(batch: dict[str, Any]) -> float | None:
    """Pure JAX's device time per step (µs), where the run measured it."""
    return (scan_row(batch, REFERENCE) or {}).get("step_us")


def _compute_side(batch: dict[str, Any]) -> list[str]:
    return [_us(_sides(batch)[0]), _us(_device_us(batch))]


PASSES_WORDS = (
    "11 passes over the float32 parameters (read forward and backward, the gradient written and "
    "read once for the clipping norm, Adam's four reads and three writes)"
)


def _techniques(result: dict[str, Any], h: str) -> list[str]:
    body = techniques_table(result)
    if not body:
        return []
    return _part(
        f"{h} Pure JAX's step, written other ways",
        "Pure JAX's step against its fast path, per call and as one `lax.scan` (device time), with "
        "its bytes per step (and their share of the spec's minimum), fusions and transposes; the "
        "fast path's own times in its row. The docs' page *Making the step fast* explains each row "
        "and the styles it applies to.",
        *body,
    )


def techniques_table(result: dict[str, Any]) -> list[str]:
    """Pure JAX's step written other ways against its fast path, as a table, and where its fast
    path's own times differ from the main tables', why; none where the run did not measure it."""
    parts = result.get("techniques") or []
    if not parts:
        return []
    rows = []
    for part in parts:
        for r in sorted(part["rows"], key=lambda r: r["technique"] == FAST):  # the fast path last
            fast = r["technique"] == FAST
            times = [
                f"{number(r[t]['median'])} µs" if fast else ratio(r["vs_fast"][t])
                for t in ("step_us", "scan_us")
            ]
            name = "fast path" if fast else f"`{r['technique']}`"
            counts = [str(r["hlo"].get(k, "-")) for k in ("fusions", "transposes")]
            rows.append([name, str(part["batch_size"]), *times, _moved(r), *counts])
    return [
        markdown_table(
            ["written", "batch", "per call", "device time", "bytes", "fusions", "transposes"],
            rows,
            "lrrrrrr",
        ),
        *_techniques_phase(result, parts),
    ]


def _techniques_phase(result: dict[str, Any], parts: list[dict[str, Any]]) -> list[str]:
    """Where the fast path's own times in the techniques' table differ from the main tables':
    the two were timed in different phases of the run."""
    sizes = dict(batches_by_size(result))
    pairs = []
    for part in parts:
        fast = next((r for r in part["rows"] if r["technique"] == FAST), None)
        batch = sizes.get(part["batch_size"])
        if not (fast and batch):
            continue
        call, device = fast_row(batch, REFERENCE)["step_us"]["median"], _device_us(batch)
        if device is None:
            continue
        pairs.append(
            f"at batch {part['batch_size']}, {number(fast['step_us']['median'])} µs per call and "
            f"{number(fast['scan_us']['median'])} µs of device time here against {number(call)} µs "
            f"and {number(device)} µs in the run's main tables"
        )
    if not pairs:
        return []
    return [
        "These rows were timed in a phase of the run of their own, after the others: the fast "
        "path's times here differ from the main tables' for the same step by the machine's "
        f"variation between phases ({'; '.join(pairs)}).\n"
    ]


def _precision(result: dict[str, Any], h: str) -> list[str]:
    body = precision_table(result)
    if not body:
        return []
    return _part(
        f"{h} bfloat16 against float32",
        "Per call, each fast path with `compute_dtype` bfloat16 against the same path in float32 "
        "(parameters and Adam in float32 both ways), the two interleaved.",
        *body,
    )


def precision_table(result: dict[str, Any]) -> list[str]:
    """Each fast path in bfloat16 against float32, as a table; none where the run did not
    measure it."""
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
    return [markdown_table(header, rows, "l" + "r" * len(parts))]


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
        "The data-parallel step (`Plan.make_step`, the one the conformance suite checks against "
        "the serial step; `cvae train --data-parallel` runs the trainer's own step, built on the "
        "same plan, which adds the finite check, the gradient's norm and the indexing into the "
        f"epoch's arrays), at global batch {data['batch_size']}, as a ratio to the same "
        f"implementation's serial step.{note}",
        markdown_table(["mechanism", *map(impl_label, impls)], rows, "l" + "r" * len(impls)),
    )
