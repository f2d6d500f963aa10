"""The choosing page's decision table: a row per need a reader arrives with (:data:`NEEDS`), each
with the style to use, what the results measured for it (device time, a wrapper's cost, compile
time, the GPU's largest batch, data parallelism), how its framework is maintained (release
history and the maintainers' own words, from ``benchmarks/maintenance.py``'s record) and the
caveat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import evidence

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench.causes import (
    cause,
    fingerprint,
    programs,
    same_counts_unfingerprinted,
)
from cvae_rosetta.bench.markdown import (
    around_the_step,
    backend_name,
    impl_label,
    listed,
    number,
    ratio,
)
from cvae_rosetta.bench.results import (
    REFERENCE,
    batches_by_size,
    differs,
    fast_row,
    impls_measured,
    jax_outside,
    loaded,
    path_row,
    provenance,
    scan_row,
)
from cvae_rosetta.spec import registry

DECISION_BEGIN, DECISION_END = "<!-- decision:begin -->", "<!-- decision:end -->"
# The choosing page's decision table, one row per need a reader arrives with: the evidence that
# answers the need (its kind), the style (None: the one that evidence chooses; a fixed style for a
# need that names one), the wrapper whose cost per call matters for it, and what to mind (None:
# the chosen style's own, from STYLE_MIND). Speed is said where it differs beyond noise.
NEEDS = (
    ("Learning JAX, or teaching it", None, "learn", None, None),
    ("Research code that changes every day", None, "change", None, None),
    ("A production model maintained for years", None, "versions", None, None),
    (
        "Large batches on one GPU",
        None,
        "gpu",
        None,
        "Every style's fast path runs one compiled step; beside each ratio, what its compiled "
        "program shows against pure JAX's (on a machine that recorded no fingerprint, its counts "
        "only).",
    ),
    (
        "Many devices or hosts",
        None,
        "parallel",
        None,
        "The data-parallel step is shared (`--data-parallel`): it takes each style's gradient "
        "function, so the style does not decide it. Several processes: `cvae launch` on one "
        "machine, `--distributed` across hosts.",
    ),
    (
        "Keras habits (`fit`, callbacks)",
        "keras",
        "device",
        "model.fit step",
        "Jit the step yourself with `stateless_call` and `stateless_apply`; the stock `AdamW` "
        "puts epsilon on the uncorrected root, not where optax does. This implementation runs on "
        "Keras's JAX backend only, and refuses the others.",
    ),
    (
        "An existing Linen codebase",
        "flax_linen",
        "device",
        None,
        "Keep it; flax's description, as quoted beside, tells of Flax NNX as evolved from the "
        "Linen API; `nnx.bridge` wraps Linen modules for a gradual move.",
    ),
    (
        "An existing Haiku codebase",
        "haiku",
        "device",
        None,
        "Keep it, pinned with the JAX range Haiku is tested with; not for new code.",
    ),
)
# What to mind with a style a row's evidence chose (never Haiku: EXISTING_CODE_ONLY).
STYLE_MIND = {
    "pure_jax": "You write the layers, the initialisation and the state's bookkeeping yourself: "
    "every line of the model is on the page.",
    "flax_linen": "Modules declared once and applied to parameters kept apart; flax's description "
    "presents NNX, so expect its documentation to lead there.",
    "flax_nnx": "Objects with PyTorch habits, the API flax's own description presents; flax is "
    "still 0.x, so pin a minor version. Split once and step with `jax.jit` in hot loops, as "
    "`impls/flax_nnx.py` does: `nnx.jit` walks the object graph on every call.",
    "equinox": "Objects that are pytrees, so every JAX transformation applies as it is; "
    "per-example layers (`jax.vmap` over the batch) and `[out, in]` kernels; flatten the state "
    "for low-overhead loops.",
    "keras": "Jit the step yourself with `stateless_call` and `stateless_apply`; this "
    "implementation runs on Keras's JAX backend only.",
}
# What each evidence-chosen row falls back to where its record is missing.
DEFAULT_STYLE = {"learn": "pure_jax", "change": "equinox", "versions": "flax_nnx"}
CHOOSERS = {
    "learn": ("concepts", evidence.fewest_names),
    "change": ("change_cost", evidence.least_change),
    "versions": ("version_matrix", evidence.longest_working),
}
EXISTING_CODE_ONLY = evidence.EXISTING_CODE_ONLY


def decision(
    results: Sequence[dict[str, Any]],
    maintenance: dict | None = None,
    records: dict[str, dict | None] | None = None,
) -> str:
    """The choosing page's table: for each need, the style, the evidence that answers the need
    (``records``: the change-cost, version-matrix and concepts records, by those names) and the
    speed where it differs beyond noise, how its framework is maintained (``maintenance``:
    ``benchmarks/results/maintenance.json``), what to mind."""
    records = records or {}
    same = same_program_everywhere(results)
    machine = variation(fingerprinted_runs(results))
    rows = []
    for need, impl, kind, wrapper, caveat in NEEDS:
        reasons: list[str] = []
        if kind in CHOOSERS:
            name, choose = CHOOSERS[kind]
            chosen, said = choose(records.get(name))
            impl = chosen[0] if chosen else DEFAULT_STYLE[kind]
            use = " or ".join(impl_label(i) for i in chosen or [impl])
            reasons = [said, *(_speed_apart(r, impl, same) for r in results)]
            caveat = STYLE_MIND[impl]
        elif kind == "gpu":
            reasons = [_gpu_reason(r, same, machine) for r in results if backend_name(r) != "CPU"]
            reasons = reasons or ["**GPU**: no GPU run in the results: not measured"]
        elif kind == "parallel":
            reasons = [_parallel_reason(r) for r in results]
        else:
            reasons = [_reason(r, impl, wrapper, same, machine) for r in results]
        if kind not in CHOOSERS:
            use = impl_label(impl) if impl else _use(results, kind, same)
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
    header = ["if you need", "use", "evidence (speed: per step, against pure JAX)", "maintained",
              "mind"]  # fmt: skip
    sources = "; ".join(f"{backend_name(r)}: {provenance(r)}" for r in results)
    note = f"\nSpeed measured on {sources} ([performance](performance.md)). ≈: within noise.\n"
    if maintenance:
        note += (
            f"\nMaintained: the final releases on {maintenance['registry']} as of "
            f"{maintenance['fetched']} (`benchmarks/maintenance.py`), and what the project's own "
            "description there says of its state, quoted where it was searched.\n"
        )
    why = [f"{backend_name(r)}: {groups}" for r in results if (groups := programs(r))]
    if why:
        note += f"\nWhy the styles differ, from their compiled programs. {' '.join(why)}\n"
    return (
        '<div class="decision" markdown>\n\n' + markdown_table(header, rows) + "\n</div>\n" + note
    )


def same_program_everywhere(results: Sequence[dict[str, Any]]) -> set[str]:
    """The styles whose fast path compiled to pure JAX's very program (equal fingerprints) at every
    batch size of every run that recorded fingerprints: on a machine without fingerprints, a
    ratio of theirs beyond noise with the same counts as pure JAX's is the machine's, not the
    step's."""
    same: set[str] | None = None
    for result in results:
        for _, batch in batches_by_size(result):
            ref = fingerprint(batch, REFERENCE)
            if not ref:
                continue
            here = {i for i in impls_measured(result) if fingerprint(batch, i) == ref}
            same = here if same is None else same & here
    return (same or set()) - {REFERENCE}


def _variation(result: dict[str, Any], batch: dict[str, Any], impl: str, same: set[str]) -> bool:
    """``impl``'s difference at ``batch`` is the machine's: its program is pure JAX's on the
    machines that fingerprint it, and here it has the same counts (no fingerprint recorded)."""
    return impl in same and same_counts_unfingerprinted(batch, impl, result["settings"]["model"])


def fingerprinted_runs(results: Sequence[dict[str, Any]]) -> str:
    """The runs that recorded fingerprints, in words: ``the CPU run (AMD EPYC, 2 cores, ...)``;
    empty where none did."""
    runs = [
        f"the {backend_name(r)} run ({provenance(r)})"
        for r in results
        if any(fingerprint(batch, REFERENCE) for _, batch in batches_by_size(r))
    ]
    return listed(runs) if runs else ""


def variation(where: str) -> str:
    """Why a difference is read as the machine's (:func:`_variation`), saying what was seen
    where: pure JAX's program in the runs ``where`` (:func:`fingerprinted_runs`), which recorded
    fingerprints, and only its counts in this run, which recorded none."""
    return (
        "this run recorded no fingerprint: here its program has pure JAX's counts (and it was pure "
        f"JAX's very program, by their fingerprints, at every batch size of {where}, compiled "
        "for another machine): taken for the machine's variation between rounds, not a "
        "difference of the step"
    )


def _largest(result: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, dict]]:
    """The largest batch size, its batch, and ``impl -> device time against pure JAX`` there."""
    b, batch = batches_by_size(result)[-1]
    device = {
        i: (scan_row(batch, i) or {}).get("vs_pure_jax", {}).get("step")
        for i in impls_measured(result)
    }
    device[REFERENCE] = device.get(REFERENCE) or {"ratio": 1.0, "within_noise": True}
    return b, batch, {i: e for i, e in device.items() if e}


def _apart(result: dict[str, Any], batch: dict[str, Any], impl: str, e, same: set[str]) -> bool:
    """A difference of the step: beyond noise, and not the machine's (:func:`_variation`)."""
    return differs(e) and not _variation(result, batch, impl, same)


def _fastest(result: dict[str, Any], same: set[str]) -> list[str]:
    """The styles whose device time at the largest batch is not beaten beyond noise: pure JAX and
    those within noise of it (or whose difference is the machine's), unless one is faster beyond
    noise (then those below 1.0)."""
    _, batch, device = _largest(result)
    faster = [i for i, e in device.items() if _apart(result, batch, i, e, same) and e["ratio"] < 1]
    return faster or [i for i, e in device.items() if not _apart(result, batch, i, e, same)]


def _use(results: Sequence[dict[str, Any]], kind: str, same: set[str]) -> str:
    gpu = [r for r in results if backend_name(r) != "CPU"]
    if kind == "gpu" and gpu:
        return _gpu_use(gpu[0], same)
    return "any of the six" if kind == "parallel" else "not measured"


def _gpu_use(result: dict[str, Any], same: set[str]) -> str:
    """The fastest styles at the GPU's largest batch by device time (:func:`_fastest`), those for
    existing code only said so, and every other measured style with its ratio: none is left out
    unsaid."""
    fastest = _fastest(result, same)
    new = [impl_label(i) for i in fastest if i not in EXISTING_CODE_ONLY]
    old = [impl_label(i) for i in fastest if i in EXISTING_CODE_ONLY]
    _, _, device = _largest(result)
    rest = [
        impl_label(i) if i == REFERENCE else f"{impl_label(i)} {ratio(e)}"
        for i, e in device.items()
        if i not in fastest
    ]
    parts = [_or(new)] if new else []
    if old:
        parts.append(f"{_or(old)} as fast, for an existing codebase")
    if rest:
        parts.append(f"then {', '.join(rest)}")
    return "by device time: " + "; ".join(parts)  # the per-call ratios are the evidence cell's


def _or(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _gpu_reason(result: dict[str, Any], same: set[str], machine: str) -> str:
    """The GPU row's evidence; ``machine``: the words of a difference that is the machine's
    (:func:`variation`)."""
    b, batch, device = _largest(result)
    model = result["settings"]["model"]
    apart = [
        f"{impl_label(i)} {ratio(e)} ({cause(batch, i, model)})"
        for i, e in device.items()
        if _apart(result, batch, i, e, same)
    ]
    machines = [
        f"{impl_label(i)} {ratio(e)} ({machine})"
        for i, e in device.items()
        if differs(e) and _variation(result, batch, i, same)
    ]
    within = [impl_label(i) for i, e in device.items() if not differs(e)]
    missing = [impl_label(i.name) for i in registry.known() if i.builtin and i.name not in device]
    text = f"**{backend_name(result)}**, device time at batch {b:,}: {listed(within)} within noise"
    text += ("; " + "; ".join(machines + apart)) if machines or apart else ""
    text += f"; {listed(missing)} not measured" if missing else ""
    text += _gpu_per_call(result, batch, b, device)
    return text + f" ({_rounds(result)})"


def _gpu_per_call(result: dict[str, Any], batch: dict[str, Any], b: int, device: dict) -> str:
    """The same batch per call (what `cvae train` pays, one call a batch), where a style differs
    from pure JAX beyond noise: its ratio, and whether the machine was loaded."""
    apart = []
    for i in device:
        entry = fast_row(batch, i).get("vs_pure_jax", {}).get("step")
        if i != REFERENCE and differs(entry):
            apart.append(f"{impl_label(i)} {ratio(entry)}")
    if not apart:
        return ""
    loaded_machine = " (a loaded machine)" if loaded(result) else ""
    return f"; per call at {b:,}: {', '.join(apart)}{loaded_machine}"


def _rounds(result: dict[str, Any]) -> str:
    return f"{result['settings']['rounds']} rounds, {provenance(result)}"


def _parallel_reason(result: dict[str, Any]) -> str:
    data = result.get("data_parallel") or {}
    rows = [r for r in data.get("rows", []) if r["mechanism"] != "none"]
    name = backend_name(result)
    if not rows:
        return f"**{name}**: data parallelism not measured in this run"
    devices = sorted({r["devices"] for r in rows})
    mechanisms = ", ".join(sorted({r["mechanism"] for r in rows}))
    on = f"{listed([str(d) for d in devices])} device{'s' if devices != [1] else ''}"
    rows = [r for r in rows if r["impl"] != REFERENCE]  # pure JAX against itself compares nothing
    if not rows:
        return f"**{name}**: only pure JAX measured under data parallelism ({mechanisms} on {on})"
    apart = [r for r in rows if differs(r["vs_pure_jax"]["step"])]
    note = data.get("note")
    text = (
        f"**{name}**, per step against pure JAX under the same mechanism and device count "
        f"({mechanisms} on {on}{f'; {note}' if note else ''}): the other styles within noise in "
        f"{len(rows) - len(apart)} of {len(rows)} cases"
    )
    if apart:
        text += "; " + "; ".join(
            f"{impl_label(r['impl'])} {r['mechanism']} on {r['devices']} "
            f"{ratio(r['vs_pure_jax']['step'])}"
            for r in apart
        )
    return text


def _maintained(impl: str, maintenance: dict | None) -> str:
    """Release history and the maintainers' own words for ``impl``'s distribution, each with its
    source; "not searched" where its description was not searched for a statement of its state
    (``benchmarks/maintenance.py``'s ``STATEMENTS`` names what it looks for)."""
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
        f"[{name}: {len(recent)} release{'' if len(recent) == 1 else 's'} in the year to "
        f"{fetched}, the latest {latest['version']} ({latest['date']}); {len(releases)} since "
        f"{first['version']} ({first['date']})]({record['source']}#history)"
    )
    said = " ".join(f"“{s}”" for s in record["statements"])
    if said:
        return f"{text}. [Its description: {said}]({record['source']})"
    if record.get("searched"):
        return f"{text}; its description, searched, says nothing of its state"
    return f"{text}; its state in its maintainers' words: not searched"


def _reason(
    result: dict[str, Any], impl: str, wrapper: str | None, same: set[str], machine: str
) -> str:
    """A fixed style's evidence, with the cost per call of ``wrapper`` (its path) where one is
    named; ``machine``: the words of a difference that is the machine's (:func:`variation`)."""
    batches = batches_by_size(result)
    name = backend_name(result)
    sizes = (
        f"batch {batches[0][0]} and {batches[-1][0]}, the two measured"
        if len(batches) == 2
        else f"batch {batches[0][0]} to {batches[-1][0]}"
        if len(batches) > 1
        else "batch"
    )
    if impl == REFERENCE:
        empty = [fast_row(bt, REFERENCE).get("empty_step_us") for _, bt in batches]
        empty = [e["median"] for e in empty if e]
        return (
            f"**{name}**: the reference the others are measured against; one call of a jitted "
            f"step costs {number(min(empty))}–{number(max(empty))} µs before any work"
            if empty
            else f"**{name}**: the reference"
        )
    device = [
        (b, (scan_row(bt, impl) or {}).get("vs_pure_jax", {}).get("step")) for b, bt in batches
    ]
    if all(e is None for _, e in device):
        return f"**{name}**: not measured in this run"
    model, at = result["settings"]["model"], dict(batches)
    apart = [(b, e) for b, e in device if differs(e)]
    measured = [b for b, e in device if e is not None]

    def why(b: int) -> str:
        return machine if _variation(result, at[b], impl, same) else cause(at[b], impl, model)

    text = f"**{name}**, device time: " + (
        "; ".join(f"{ratio(e)} at batch {b} ({why(b)})" for b, e in apart)
        + ("; within noise at the others" if len(apart) < len(measured) else "")
        if apart
        else f"within noise of pure JAX at every batch size ({sizes})"
    )
    rows = [(b, path_row(bt, f"{impl}:{wrapper}")) for b, bt in batches] if wrapper else []
    rows = [(b, r) for b, r in rows if r]
    if rows:
        (b0, first), (b1, last) = rows[0], rows[-1]
        span = "" if b0 == b1 else f", {ratio(last['vs_fast']['step'])} at {b1}"
        text += (
            f"; `{wrapper}` per call, against the fast path ({around_the_step(wrapper)}): "
            f"{ratio(first['vs_fast']['step'])} at batch {b0}{span}"
        )
    return text + _outside_the_pin(result, impl)


def _outside_the_pin(result: dict[str, Any], impl: str) -> str:
    """Where the run's JAX lies outside the range this project's extra for ``impl`` pins (Haiku's
    holds JAX below 0.11), a note saying so: the figure is not of a combination that installs."""
    found = registry.info(impl)
    extra = found.about.extra if found else None
    jax_version = (result.get("environment") or {}).get("versions", {}).get("jax")
    pin = jax_outside(jax_version, extra) if extra else None
    if not pin:
        return ""
    return f" (taken on jax {jax_version}, outside the `{extra}` extra's range, {pin})"


def _speed_apart(result: dict[str, Any], impl: str, same: set[str]) -> str:
    """``impl``'s device time against pure JAX where it differs beyond noise (and not by the
    machine's variation), for a row whose evidence is not speed; empty where it never does."""
    if impl == REFERENCE:
        return ""
    batches = batches_by_size(result)
    model = result["settings"]["model"]
    apart = [
        (b, e)
        for b, bt in batches
        if (e := (scan_row(bt, impl) or {}).get("vs_pure_jax", {}).get("step")) is not None
        and _apart(result, bt, impl, e, same)
    ]
    if not apart:
        return ""
    at = dict(batches)
    return (
        f"**{backend_name(result)} speed**, device time: "
        + "; ".join(f"{ratio(e)} at batch {b} ({cause(at[b], impl, model)})" for b, e in apart)
        + "; within noise at the others"
    )
