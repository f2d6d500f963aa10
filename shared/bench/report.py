"""``bench.json`` as a Markdown page and PNG plots: what ``cvae bench`` writes beside its result
file, and what ``benchmarks/render.py`` turns into ``docs/performance.md``.

Every number on the page is read from the result file; the only hand-written text explains how
each framework's fast path avoids the per-call work of its idiomatic one. Plots are drawn with
matplotlib's ``Figure`` and Agg canvas directly (never ``pyplot``), written atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta.bench.results import FAST, LOADED, OTHERS, REFERENCE, fast_row, loaded, scan_row
from cvae_rosetta.files import write_text

GOALS = ("fast_within_ratio", "fast_overhead_us", "roof_fraction")
WITHIN = 1.03  # an idiomatic path "stops mattering" once it is this close to the fast path
PLOTS = {
    "step_time": "step time and ratio to pure JAX",
    "overhead": "per-call overhead",
    "compile": "trace, lower and compile time",
    "roof": "GFLOP/s against the matmul roof",
    "epoch": "the epoch as one call",
    "data_parallel": "data parallelism",
}

# How each framework's fast path gets where pure JAX is (the implementations' own comments, short).
HOW = {
    "pure_jax": "The parameters are a plain pytree and the step a pure function of arrays, so the "
    "idiomatic step is the fast path: `jax.jit(train_step, donate_argnums=0)`.",
    "flax_linen": "`model.apply` is a pure function of the variable dict and Flax's "
    "`TrainState` a pytree (with `apply_fn`, `tx` and the config static), so the idiomatic step "
    "is the fast path.",
    "flax_nnx": "`nnx.jit` walks the model's and the optimizer's object graph in Python on every "
    "call, and `nnx.cached_partial` caches that walk but still syncs the objects in and out; in "
    "tree mode (`nnx.jit(..., graph=False)`) there is no graph to walk, but the objects are still "
    "flattened into their Variables and written back on every call. The "
    "fast path splits the model once (`nnx.split`: a static `GraphDef`, cached per config, and a "
    "`State` of arrays) and `nnx.merge`s it inside the trace, so the graph is walked only while "
    "tracing and a call costs what a `jax.jit` call costs.",
    "haiku": "`hk.multi_transform` gives pure `init` and `apply` functions over a parameter "
    "dict, so the idiomatic step is the fast path.",
    "equinox": "`eqx.filter_jit` partitions its arguments into arrays and the rest in Python on "
    "every call, and flattening an `eqx.Module` goes through Python callbacks. The fast path "
    "holds the leaves of the model and of the optimiser state in flat lists (flattened by "
    "`jax.jit` in C++) with their tree structures and the model's static part as static data "
    "compared by identity, and rebuilds the model (`eqx.combine`) inside the trace only.",
}


# --- formatting -----------------------------------------------------------------------------------


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _gf(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _batches(result: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return sorted(((int(b), batch) for b, batch in result["batches"].items()), key=lambda t: t[0])


def _shown(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The path rows to show: the copies of a fast path standing for its idiomatic path are left
    out (the fast row is labelled instead)."""
    return [r for r in batch["paths"] if not r.get("same_as_fast")]


def _labels(result: dict[str, Any]) -> dict[str, str]:
    """``row label -> label shown``: a fast path that is also its framework's idiomatic path says
    so."""
    labels = {}
    for _, batch in _batches(result):
        same = {r["impl"] for r in batch["paths"] if r.get("same_as_fast")}
        for row in _shown(batch):
            shown = row["label"]
            if row["path"] == FAST:
                shown += " (fast = idiomatic)" if row["impl"] in same else " (fast)"
            labels[row["label"]] = shown
    return labels


# --- the page -------------------------------------------------------------------------------------


def page(
    result: dict[str, Any],
    images: dict[str, str],
    *,
    source: str,
    generated_by: str,
    extra: Sequence[str] = (),
) -> str:
    """The whole page: conditions, goals, tables per batch size, the idiomatic paths' cost, the
    epoch as one call, the roof, data parallelism, then any ``extra`` Markdown sections."""
    parts = [
        "# Performance",
        "",
        f"Generated by `{generated_by}` from `{source}`; every figure below is read from that "
        "file. Rerun `cvae bench --out DIR` to measure this machine (`--quick` takes about a "
        "minute), then `python benchmarks/render.py --bench DIR/bench.json` to regenerate this "
        "page.",
        "",
        *_conditions(result),
        *_goals(result),
        *_summary(result, images),
        *_idiomatic(result, images),
        *_per_batch(result),
        *_compile(result, images),
        *_epoch(result, images),
        *_roof(result, images),
        *_parallel(result, images),
    ]
    for section in extra:
        parts += [section.rstrip(), ""]
    return "\n".join(parts).rstrip() + "\n"


def _conditions(result: dict[str, Any]) -> list[str]:
    env, settings = result["environment"], result["settings"]
    versions = env["versions"]
    frameworks = ", ".join(
        f"{name} {versions[name]}"
        for name in ("flax", "dm-haiku", "equinox", "optax")
        if versions.get(name)
    )
    load = result["load_average"]
    during = [s[0] for s in load.get("during", []) if s]
    model = settings["model"]
    lines = [
        "## How it was measured",
        "",
        f"- Machine: {env['cpu_model']}, {env['cpu_count']} cores ({env['usable_cores']} usable), "
        f"{env['platform']}; JAX backend `{env['backend']}` ({env['device_kind']}, "
        f"{env['device_count']} device(s) in the process).",
        f"- Versions: python {versions['python']}, jax {versions['jax']}, jaxlib "
        f"{versions['jaxlib']}, {frameworks}.",
        f"- XLA flags: `{env['xla_flags'] or '(none)'}`.",
        f"- 1-minute load average: {_load(load.get('start'))} at the start, "
        f"{_load(load.get('end'))} at the end"
        + (f", {min(during):.2f} to {max(during):.2f} during" if during else "")
        + " (it counts the benchmark's own threads from its first moment, and what ran just "
        f"before); other processes used {_others(result)}, measured from their CPU time "
        f"(started {result.get('started', '?')}, {result.get('duration_s', 0):.0f} s).",
        f"- Model: {model['input_dim']} inputs, encoder {_dims(model['encoder_dims'])}, latent "
        f"{model['latent_dim']}, decoder {_dims(model['decoder_dims'])}, "
        f"{model['compute_dtype']}, the shared AdamW with global-norm clipping; synthetic data, "
        "every implementation from the same canonical parameters.",
        f"- {settings['rounds']} rounds interleaved across every path (the starting path rotating "
        f"each round); a round is K steps over K device-resident batches (K = "
        f"min({settings['steps']}, {settings['epoch_examples']} / batch), at least 8); medians "
        "over rounds, warm-up excluded. Per-call overhead is the time of an empty step: a "
        "jitted function that takes the same train state (donated), batch and key and returns "
        "the state and zero metrics, computing nothing, timed in the same rounds; beside it, a "
        "path's step time minus the per-step time of the same K steps as one `lax.scan` of the "
        "implementation's step (at large batches that difference also holds what XLA gains by "
        "scheduling several steps as one program, so it is not dispatch alone). "
        "GFLOP/s count the FLOPs of `compiled.cost_analysis()` of the fast path (the same useful "
        "work for every path of an implementation); the roof is a jitted f32 "
        f"{settings['roof_size']}x{settings['roof_size']} matmul timed in the same rounds. A fast "
        "path is timed through the executable its AOT compile returned, whose call is the same "
        "C++ dispatch as a warm `jax.jit` call. `bench.json` holds every figure's ratio to pure "
        "JAX (`vs_pure_jax`); the tables show the main ones.",
        f"- Peak RSS of the process: {_mb(result.get('peak_rss_bytes'))} MiB.",
        "",
    ]
    if loaded(result):
        lines += [
            f"**These figures were taken on a loaded machine** (other processes used more than "
            f"{OTHERS} of the {env['cpu_count']} cores over the run, or, where that could not be "
            f"measured, a 1-minute load average above {LOADED} at the start): absolute times are "
            "slower and noisier than on an idle machine; the ratios, measured in interleaved "
            "rounds, suffer less.",
            "",
        ]
    return lines


def _others(result: dict[str, Any]) -> str:
    others = result.get("other_processes_cpu") or {}
    if others.get("cores") is None:
        return "an unknown share of the cores"
    phases = [c for c in (others.get("phases") or {}).values() if c is not None]
    most = f", at most {max(phases):.2f} in one phase" if phases else ""
    return f"{others['cores']:.2f} cores on average over the run{most}"


def _load(sample: Sequence[float] | None) -> str:
    return "?" if not sample else f"{sample[0]:.2f}"


def _dims(dims: Sequence[int]) -> str:
    return "-".join(map(str, dims)) if dims else "(none)"


def _goals(result: dict[str, Any]) -> list[str]:
    goals = result.get("goals", {})
    rows = []
    within = goals.get("fast_within_ratio")
    if within and within["worst"]:
        w = within["worst"]
        rows.append(
            [
                f"every fast path within {within['threshold']}x of pure JAX at every batch size",
                f"worst: {w['label']} at batch {w['batch']}, {_x(w['ratio'])}",
                _met(within["met"]),
            ]
        )
    overhead = goals.get("fast_overhead_us")
    if overhead and overhead["worst"]:
        w = overhead["worst"]
        scan = overhead.get("scan_worst")
        beside = (
            f"; step minus scanned step at batch {scan['batch']}: largest {scan['label']}, "
            f"{_us(scan['us'])} ± {_us(scan.get('noise_us'))} µs"
            if scan
            else ""
        )
        rows.append(
            [
                f"per-call overhead of every fast path at most {overhead['threshold']:.0f} µs",
                f"an empty step over the same state: largest {w['label']} at batch {w['batch']}, "
                f"{_us(w['us'])} µs (± {_us(w.get('noise_us'))} µs between rounds){beside}",
                _met(overhead["met"]),
            ]
        )
    roof = goals.get("roof_fraction")
    if roof and roof["best"]:
        rows.append(
            [
                f"the fastest path at batch {roof['batch']} reaching {_pct(roof['threshold'])} "
                "of the matmul roof",
                f"{roof['best']['label']}: {_pct(roof['best']['fraction'])} of "
                f"{_gf(roof['roof_gflops_per_s'])} GFLOP/s",
                _met(roof["met"]),
            ]
        )
    if not rows:
        return []
    return ["## Goals", "", *_table(["goal", "measured", "met"], rows, "lll"), ""]


def _met(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def _image(images: dict[str, str], name: str) -> list[str]:
    return [f"![{PLOTS[name]}]({images[name]})", ""] if name in images else []


def _summary(result: dict[str, Any], images: dict[str, str]) -> list[str]:
    batches = _batches(result)
    labels = _labels(result)
    order = list(dict.fromkeys(r["label"] for _, batch in batches for r in _shown(batch)))
    rows = []
    for label in order:
        cells = []
        for _, batch in batches:
            row = next((r for r in batch["paths"] if r["label"] == label), None)
            cells.append(_x(row["vs_pure_jax"]["step_us.median"]) if row else "-")
        rows.append([labels[label], *cells])
    return [
        "## Step time against pure JAX",
        "",
        "Median step time of every path as a ratio to pure JAX's in the same rounds, by batch "
        "size. A fast path is the protocol's `jax.jit(impl.train_step, donate_argnums=0)`; the "
        "other rows are the steps the frameworks' own documentation writes (they draw the step's "
        "noise eagerly outside their jitted function, one more dispatch per step, which is part "
        "of their cost as measured here).",
        "",
        *_table(["path", *(f"batch {b}" for b, _ in batches)], rows),
        "",
        *_image(images, "step_time"),
    ]


def _idiomatic(result: dict[str, Any], images: dict[str, str]) -> list[str]:
    batches = _batches(result)
    impls = list(dict.fromkeys(r["impl"] for _, batch in batches for r in batch["paths"]))
    lines = [
        "## What the idiomatic paths cost, and how the fast paths get there",
        "",
        "Extra time per call of each idiomatic path over its implementation's fast path (median "
        "against median, same rounds), with the ratio. The Python work of a framework's jit "
        "wrapper is a fixed cost per call, which matters less as the step grows; what grows with "
        "the batch does not shrink that way (these paths draw the step's noise eagerly, outside "
        "their jitted function, and the `eqx.filter_jit` step, written like Equinox's examples, "
        "donates no buffers, so every step allocates a new state). The last column gives the "
        "smallest batch "
        f"size from which the path stays within {WITHIN}x of the fast path (-: at none measured "
        "here).",
        "",
    ]
    rows = []
    for _, batch in batches[:1]:
        for row in batch["paths"]:
            if row["kind"] != "idiomatic" or row.get("same_as_fast"):
                continue
            cells, ratios = [], []
            for b, other in batches:
                match = next(r for r in other["paths"] if r["label"] == row["label"])
                vs = match["vs_fast"]
                extra = vs["extra_us"]
                cells.append(
                    f"{'+' if extra >= 0 else '-'}{_us(abs(extra))} µs ({_x(vs['step_us.median'])})"
                )
                ratios.append((b, vs["step_us.median"]))
            rows.append([row["label"], *cells, _from_batch(ratios)])
    if rows:
        lines += _table(
            ["path", *(f"batch {b}" for b, _ in batches), f"within {WITHIN}x from"], rows
        )
        lines.append("")
    else:
        lines += ["No implementation here has an idiomatic path other than its fast path.", ""]
    for impl in impls:
        text = HOW.get(impl)
        if text is None:
            same = any(
                r.get("same_as_fast") for _, b in batches for r in b["paths"] if r["impl"] == impl
            )
            text = (
                "Its idiomatic path is its fast path."
                if same
                else "See the implementation's own notes."
            )
        lines += [f"- **{impl}**: {text}"]
    lines += [
        "",
        "Per-call overhead, two ways: the time of an empty step over the same state (a call "
        "that computes nothing: what handing this state to a jitted function and back costs, "
        "whatever the batch size), and a path's step time minus the per-step time of the same "
        "steps as one `lax.scan` (the plot; at small batches the same fixed cost, at large ones "
        "also what XLA gains by scheduling several steps as one program).",
        "",
        *_image(images, "overhead"),
    ]
    return lines


def _from_batch(ratios: Sequence[tuple[int, float | None]]) -> str:
    """The smallest batch size from which every larger one is within :data:`WITHIN`."""
    start = None
    for b, r in reversed(ratios):
        if r is None or r > WITHIN:
            break
        start = b
    return "-" if start is None else f"batch {start}"


def _per_batch(result: dict[str, Any]) -> list[str]:
    labels = _labels(result)
    lines = ["## Every figure, by batch size", ""]
    for b, batch in _batches(result):
        roof, layer = batch["roof"], batch["layer_roof"]
        lines += [
            f"### batch {b}",
            "",
            f"K = {batch['steps_per_round']} steps per round. Roof: "
            f"{_gf(roof['gflops_per_s'])} GFLOP/s ({'x'.join(map(str, roof['shape'][:2]))} "
            f"matmul); the widest layer's matmul alone, "
            f"[{layer['shape'][0]}x{layer['shape'][1]}]·[{layer['shape'][1]}x{layer['shape'][2]}]"
            f", reaches {_gf(layer['gflops_per_s'])} GFLOP/s.",
            "",
        ]
        rows = []
        for row in _shown(batch):
            s = row["step_us"]
            rows.append(
                [
                    labels[row["label"]],
                    _us(s["median"]),
                    f"{_us(s['min'])}-{_us(s['max'])}",
                    _x(row["vs_pure_jax"]["step_us.median"]),
                    _us(row["empty_step_us"]["median"]) if row.get("empty_step_us") else "-",
                    _overhead(row),
                    _gf(row["gflops_per_s"]),
                    _pct(row["roof_fraction"]),
                    _rate(row["loop_examples_per_s"]),
                    _rate(row["epoch_examples_per_s"]),
                ]
            )
        lines += _table(
            [
                "path",
                "median µs",
                "fastest-slowest",
                "vs pure JAX",
                "empty step µs",
                "step - scan µs ± noise",
                "GFLOP/s",
                "of roof",
                "loop ex/s",
                "epoch ex/s",
            ],
            rows,
        )
        lines.append("")
        rows = []
        for row in _shown(batch):
            memory, hlo = row.get("memory") or {}, row.get("hlo") or {}
            rows.append(
                [
                    labels[row["label"]],
                    _s(row.get("trace_s")),
                    _s(row.get("lower_s")),
                    _s(row.get("compile_s")),
                    _s(row.get("first_call_s")),
                    _x(row["vs_pure_jax"]["first_call_s"]),
                    _gf(row["flops"] / 1e6) if row.get("flops") else "-",
                    _mb(memory.get("temp_size_in_bytes")),
                    f"{hlo['fusions']} ({hlo['library_fusions']} library, {hlo['plain_dots']} "
                    f"plain dots); {hlo['copies']} copies, {hlo.get('transposes', '?')} "
                    "transposes"
                    if hlo
                    else "-",
                ]
            )
        lines += _table(
            [
                "path",
                "trace s",
                "lower s",
                "compile s",
                "first call s",
                "first call vs pure JAX",
                "MFLOP/step",
                "temp MiB",
                "HLO fusions; copies, transposes",
            ],
            rows,
        )
        lines.append("")
    return lines


def _overhead(row: dict[str, Any]) -> str:
    noise = row.get("overhead_noise_us")
    return _us(row["overhead_us"]) + (f" ±{_us(noise)}" if noise is not None else "")


def _compile(result: dict[str, Any], images: dict[str, str]) -> list[str]:
    if not result["batches"]:
        return []
    return [
        "## Compile time",
        "",
        "Fast paths: `jax.clear_caches()`, then `jax.jit(train_step).trace(...)`, `.lower()` and "
        "`.compile()` timed one by one. Idiomatic paths have no jit object of their own to hand, "
        "so their first call is timed after `jax.clear_caches()` and split by JAX's own trace, "
        "lower and compile events (`jax.monitoring`); the first call also runs the step once. "
        "Compile time hardly depends on the batch size; the plot shows the largest one.",
        "",
        *_image(images, "compile"),
    ]


def _epoch(result: dict[str, Any], images: dict[str, str]) -> list[str]:
    batches = _batches(result)
    rows = []
    impls = list(dict.fromkeys(s["impl"] for _, batch in batches for s in batch["epoch"]))
    for impl in impls:
        cells = []
        for _, batch in batches:
            scan = scan_row(batch, impl)
            loop = fast_row(batch, impl)
            cells.append(
                f"{_rate(loop['loop_examples_per_s'])} → {_rate(scan['examples_per_s'])} "
                f"({scan['speedup_vs_loop']:.2f}x)"
                if scan
                else "-"
            )
        rows.append([impl, *cells])
    lines = [
        "## The epoch as one call",
        "",
        "Examples per second of the fast path's Python loop over K device-resident batches → the "
        "same K steps as one jitted `lax.scan` (one call per epoch), and the speed-up. The scan "
        "removes the per-call dispatch and lets XLA keep the state in place across steps; it "
        "does not change the work of a step.",
        "",
        *_table(["impl", *(f"batch {b}" for b, _ in batches)], rows),
        "",
    ]
    unrolls = sorted({s["unroll"] for _, batch in batches for s in batch["epoch"]})
    if len(unrolls) > 1:
        rows = []
        for u in unrolls:
            cells = []
            for _, batch in batches:
                scan = scan_row(batch, REFERENCE, u)
                cells.append(
                    f"{_us(scan['step_us'])} µs/step, compile {_s(scan['compile_s'])} s"
                    if scan
                    else "-"
                )
            rows.append([str(u), *cells])
        lines += [
            "`lax.scan(..., unroll=u)` of pure JAX's step (per-step time of the scan, and the "
            "compile time of the whole program):",
            "",
            *_table(["unroll", *(f"batch {b}" for b, _ in batches)], rows),
            "",
        ]
    return lines + _image(images, "epoch")


def _roof(result: dict[str, Any], images: dict[str, str]) -> list[str]:
    rows = []
    for b, batch in _batches(result):
        fast = [r for r in batch["paths"] if r["kind"] == "fast" and r["gflops_per_s"]]
        best = max(fast, key=lambda r: r["gflops_per_s"], default=None)
        scans = [s for s in batch["epoch"] if s.get("gflops_per_s")]
        scan = max(scans, key=lambda s: s["gflops_per_s"], default=None)
        rows.append(
            [
                str(b),
                _gf(batch["roof"]["gflops_per_s"]),
                _gf(batch["layer_roof"]["gflops_per_s"]),
                f"{best['label']}: {_gf(best['gflops_per_s'])} ({_pct(best['roof_fraction'])})"
                if best
                else "-",
                f"{scan['impl']} unroll {scan['unroll']}: {_gf(scan['gflops_per_s'])} "
                f"({_pct(scan['roof_fraction'])})"
                if scan
                else "-",
            ]
        )
    return [
        "## Against the matmul roof",
        "",
        "GFLOP/s of the best fast path (Python loop) and of the best epoch-as-one-call program, "
        "with their fraction of the square-matmul roof measured in the same rounds, and what the "
        "model's widest layer reaches as a matmul alone at that batch size.",
        "",
        *_table(
            ["batch", "roof GFLOP/s", "widest layer GFLOP/s", "best fast path", "best epoch call"],
            rows,
        ),
        "",
        *_image(images, "roof"),
    ]


def _parallel(result: dict[str, Any], images: dict[str, str]) -> list[str]:
    data = result.get("data_parallel")
    if not data or not data["rows"]:
        return []
    rows = data["rows"]
    columns = sorted(
        {(r["mechanism"], r["devices"]) for r in rows if r["mechanism"] != "none"},
        key=lambda c: (c[0], c[1]),
    )
    table = []
    for impl in dict.fromkeys(r["impl"] for r in rows):
        cell = {(r["mechanism"], r["devices"]): r for r in rows if r["impl"] == impl}
        serial = cell.get(("none", 1))
        table.append(
            [
                impl,
                _us(serial["step_us"]["median"]) if serial else "-",
                *(
                    f"{_us(cell[c]['step_us']['median'])} ({cell[c]['ratio_to_serial']:.2f}x)"
                    if c in cell and cell[c].get("ratio_to_serial")
                    else "-"
                    for c in columns
                ),
            ]
        )
    ref = [r for r in rows if r["impl"] != REFERENCE and r["vs_pure_jax"]["step_us.median"]]
    spread = [r["vs_pure_jax"]["step_us.median"] for r in ref]
    note = data.get("note")
    return [
        "## Data parallelism",
        "",
        f"`cvae_rosetta.spec.parallel.Plan(mechanism, n).make_step(impl)` (the step `cvae train "
        f"--data-parallel` runs) at global batch {data['batch_size']}, "
        f"{data['steps_per_round']} steps per round, rounds interleaved; each cell is the median "
        "step time in µs and its ratio to the same implementation's serial step (the `pmap` "
        "step checks every batch's values on the host before it splits the batch, as in "
        "`cvae train`)."
        + (
            f" **Note: {note}** (the process splits the host into forced XLA host devices before "
            "JAX starts), so these figures show what each mechanism costs, not how it scales."
            if note
            else ""
        ),
        "",
        *_table(
            ["impl", "serial µs", *(f"{m} x{n}" for m, n in columns)],
            table,
        ),
        "",
        (
            f"Against pure JAX in the same case, the other implementations range from "
            f"{min(spread):.3f}x to {max(spread):.3f}x."
            if spread
            else ""
        ),
        "",
        *_image(images, "data_parallel"),
    ]


# --- the terminal ---------------------------------------------------------------------------------


def terminal_summary(result: dict[str, Any]) -> str:
    lines = []
    for b, batch in _batches(result):
        cells = []
        for row in _shown(batch):
            cells.append(
                f"{row['label']} {_us(row['step_us']['median'])} µs "
                f"({_x(row['vs_pure_jax']['step_us.median'])})"
            )
        lines.append(f"batch {b}: " + ", ".join(cells))
    goals = result.get("goals", {})
    within, overhead, roof = (goals.get(k) for k in GOALS)
    if within and within["worst"]:
        w = within["worst"]
        lines.append(
            f"  every fast path within {within['threshold']}x of pure JAX: "
            f"{_met(within['met']).strip('*')} (worst {w['label']} at batch {w['batch']}, "
            f"{_x(w['ratio'])})"
        )
    if overhead and overhead["worst"]:
        w = overhead["worst"]
        lines.append(
            f"  fast-path overhead at most {overhead['threshold']:.0f} µs: "
            f"{_met(overhead['met']).strip('*')} (an empty step over the same state: largest "
            f"{w['label']} at batch {w['batch']}, {_us(w['us'])} µs)"
        )
    if roof and roof["best"]:
        lines.append(
            f"  {_pct(roof['threshold'])} of the roof at batch {roof['batch']}: "
            f"{_met(roof['met']).strip('*')} ({roof['best']['label']}, "
            f"{_pct(roof['best']['fraction'])} of {_gf(roof['roof_gflops_per_s'])} GFLOP/s)"
        )
    if loaded(result):
        lines.append(f"  note: the machine was loaded (other processes: {_others(result)})")
    return "\n".join(lines)


# --- plots ----------------------------------------------------------------------------------------


def plots(result: dict[str, Any], directory: Path, prefix: str = "bench_") -> dict[str, str]:
    """Draw every plot into ``directory``; returns ``plot name -> file name``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cvae_rosetta.files import atomic_write

    written = {}
    batches = _batches(result)
    if not batches:
        return written
    drawers = {
        "step_time": _plot_step_time,
        "overhead": _plot_overhead,
        "compile": _plot_compile,
        "roof": _plot_roof,
        "epoch": _plot_epoch,
        "data_parallel": _plot_parallel,
    }
    for name, draw in drawers.items():
        figure = Figure(figsize=(10, 4.2), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        if draw(figure, result) is False:
            continue
        file = f"{prefix}{name}.png"
        atomic_write(
            directory / file, lambda handle, f=figure: f.savefig(handle, format="png"), parents=True
        )
        written[name] = file
    return written


def _series(result: dict[str, Any]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    out: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for b, batch in _batches(result):
        for row in _shown(batch):
            out.setdefault(row["label"], []).append((b, row))
    return out


def _style(label: str) -> dict[str, Any]:
    return {"linestyle": "-" if ":" not in label else "--", "marker": "o", "markersize": 4}


def _plot_step_time(figure, result):
    left, right = figure.subplots(1, 2)
    for label, points in _series(result).items():
        xs = [b for b, _ in points]
        left.plot(xs, [r["step_us"]["median"] for _, r in points], label=label, **_style(label))
        right.plot(xs, [r["vs_pure_jax"]["step_us.median"] for _, r in points], **_style(label))
    left.set(
        xscale="log",
        yscale="log",
        xlabel="batch size",
        ylabel="median step time (µs)",
        title="step time",
    )
    right.axhline(1.03, color="grey", linewidth=0.8, linestyle=":")
    right.set(
        xscale="log",
        xlabel="batch size",
        ylabel="ratio to pure JAX",
        title="ratio to pure JAX (dotted: 1.03)",
    )
    left.legend(fontsize=7)


def _plot_overhead(figure, result):
    empty, axis = figure.subplots(1, 2, width_ratios=(2, 3))
    for label, points in _series(result).items():
        points = [(b, r) for b, r in points if r.get("empty_step_us")]
        if points:
            empty.plot(
                [b for b, _ in points],
                [r["empty_step_us"]["median"] for _, r in points],
                label=label,
                **_style(label),
            )
    empty.axhline(30, color="grey", linewidth=0.8, linestyle=":")
    empty.set_xscale("log")
    empty.set_ylim(bottom=0)
    empty.set(xlabel="batch size", ylabel="µs per call", title="an empty step over the same state")
    empty.legend(fontsize=7)
    for i, (label, points) in enumerate(_series(result).items()):
        points = [(b, r) for b, r in points if r["overhead_us"] is not None]
        shift = 1.0 + 0.03 * (i - 3)  # side by side, so that the error bars do not overlap
        axis.errorbar(
            [b * shift for b, _ in points],
            [r["overhead_us"] for _, r in points],
            yerr=[r.get("overhead_noise_us") or 0.0 for _, r in points],
            label=label,
            capsize=2,
            **_style(label),
        )
    axis.axhline(30, color="grey", linewidth=0.8, linestyle=":")
    axis.axhline(0, color="black", linewidth=0.5)
    axis.set_xscale("log")
    axis.set_yscale("symlog", linthresh=30, linscale=1.0)
    axis.set(
        xlabel="batch size",
        ylabel="step time - scan step time (µs)",
        title="step minus scanned step, with half the rounds' spread (dotted: 30 µs)",
    )
    axis.legend(fontsize=7)


def _plot_compile(figure, result):
    b, batch = _batches(result)[-1]
    rows = _shown(batch)
    axis = figure.subplots()
    labels = [r["label"] for r in rows]
    bottom = [0.0] * len(rows)
    for field, colour in (("trace_s", "C0"), ("lower_s", "C1"), ("compile_s", "C2")):
        values = [r.get(field) or 0.0 for r in rows]
        axis.barh(labels, values, left=bottom, color=colour, label=field[:-2])
        bottom = [x + y for x, y in zip(bottom, values, strict=True)]
    axis.invert_yaxis()
    axis.set(xlabel="seconds", title=f"trace, lower and compile at batch {b}")
    axis.legend(fontsize=8)


def _plot_roof(figure, result):
    axis = figure.subplots()
    batches = _batches(result)
    xs = [b for b, _ in batches]
    axis.plot(
        xs,
        [batch["roof"]["gflops_per_s"] for _, batch in batches],
        color="black",
        label="square matmul roof",
    )
    axis.plot(
        xs,
        [batch["layer_roof"]["gflops_per_s"] for _, batch in batches],
        color="grey",
        linestyle=":",
        label="widest layer as a matmul",
    )
    for label, points in _series(result).items():
        if ":" in label:
            continue
        axis.plot(
            [b for b, _ in points],
            [r["gflops_per_s"] for _, r in points],
            label=label,
            **_style(label),
        )
    scans = [(b, scan_row(batch, REFERENCE)) for b, batch in batches]
    axis.plot(
        [b for b, s in scans if s],
        [s["gflops_per_s"] for _, s in scans if s],
        linestyle="-.",
        marker="s",
        markersize=4,
        label=f"{REFERENCE} epoch as one call",
    )
    axis.set(
        xscale="log",
        yscale="log",
        xlabel="batch size",
        ylabel="GFLOP/s",
        title="useful GFLOP/s against the matmul roof",
    )
    axis.legend(fontsize=7)


def _plot_epoch(figure, result):
    axis = figure.subplots()
    batches = _batches(result)
    impls = list(dict.fromkeys(s["impl"] for _, batch in batches for s in batch["epoch"]))
    for i, impl in enumerate(impls):
        loop = [(b, fast_row(batch, impl)["loop_examples_per_s"]) for b, batch in batches]
        scan = [(b, scan_row(batch, impl)) for b, batch in batches]
        axis.plot(
            *zip(*loop, strict=True), color=f"C{i}", marker="o", markersize=4, label=f"{impl} loop"
        )
        axis.plot(
            [b for b, s in scan if s],
            [s["examples_per_s"] for _, s in scan if s],
            color=f"C{i}",
            linestyle="--",
            marker="s",
            markersize=4,
            label=f"{impl} epoch as one call",
        )
    axis.set(
        xscale="log",
        yscale="log",
        xlabel="batch size",
        ylabel="examples / s",
        title="Python loop (solid) against the epoch as one lax.scan (dashed)",
    )
    axis.legend(fontsize=7, ncol=2)


def _plot_parallel(figure, result):
    data = result.get("data_parallel")
    if not data or not data["rows"]:
        return False
    mechanisms = list(
        dict.fromkeys(r["mechanism"] for r in data["rows"] if r["mechanism"] != "none")
    )
    if not mechanisms:
        return False
    axes = figure.subplots(1, len(mechanisms), sharey=True, squeeze=False)[0]
    impls = list(dict.fromkeys(r["impl"] for r in data["rows"]))
    for axis, mechanism in zip(axes, mechanisms, strict=True):
        for i, impl in enumerate(impls):
            points = sorted(
                (r["devices"], r["ratio_to_serial"])
                for r in data["rows"]
                if r["impl"] == impl and r["mechanism"] == mechanism and r["ratio_to_serial"]
            )
            if points:
                axis.plot(
                    *zip(*points, strict=True), color=f"C{i}", marker="o", markersize=4, label=impl
                )
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        axis.set(xlabel="devices", title=mechanism)
    axes[0].set(ylabel="step time / serial step time")
    axes[0].legend(fontsize=7)
    if data.get("note"):
        figure.suptitle(f"global batch {data['batch_size']}; {data['note']}", fontsize=9)


def write_between_markers(doc: Path, begin: str, end: str, text: str) -> None:
    """Put ``text`` between the marker lines ``begin`` and ``end`` of the page ``doc`` (a
    generated table in a page written by hand), replacing what stood there; the page is rewritten
    atomically."""
    page = doc.read_text()
    if begin not in page or end not in page:
        raise SystemExit(f"{doc}: no {begin} ... {end} markers to write the table between")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    write_text(doc, f"{head}{begin}\n{text}\n{end}{tail}")
