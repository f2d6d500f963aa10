"""The measurements of one ``cvae bench``, each timed in interleaved rounds: at each batch size
every implementation's paths (compiled from cold caches, then timed beside the epoch as one
``lax.scan``, the empty step and the roofline's two rates), data parallelism against the serial
step, and bfloat16 against float32.

Nothing here imports JAX at module level (``cvae bench`` arranges its host devices first).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from cvae_rosetta.bench.programs import (
    config_of,
    cost_analysis,
    empty_step,
    epoch_program,
    hlo_stats,
    memory_analysis,
    paths_of,
    streaming_update,
    synthetic_data,
)
from cvae_rosetta.bench.results import FAST, REFERENCE, SAME_AS_FAST, peak_rss_bytes
from cvae_rosetta.bench.settings import Settings
from cvae_rosetta.bench.timing import (
    COMPILE_EVENT,
    LOWER_EVENT,
    TRACE_EVENT,
    Events,
    ProgressBar,
    Timed,
    aot,
    interleave,
    spread,
    timed_loop,
    timer,
)
from cvae_rosetta.spec.errors import ConfigError


class Subject(NamedTuple):
    """What a run measures: its settings, the implementations by name, and the canonical
    parameters (pure JAX's initialisation) every state is made from."""

    settings: Settings
    impls: dict[str, Any]
    params: Any


# --- one batch size -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Operands:
    """Everything one batch size's compiles and rounds run on, made by :func:`_operands`: ``K``
    (``k``) synthetic batches, each implementation's states, the idiomatic paths' ``(step,
    state)``, and the roofline's operands (an ``n`` x ``n`` matmul's, the streaming update's)."""

    b: int
    k: int
    xs: Any
    cs: Any
    keys: Any
    batches: list
    key_list: list
    states: dict[str, Any]
    empty_states: dict[str, Any]
    made: dict[tuple[str, str], Any]
    unrolls: dict[str, tuple[int, ...]]
    scan_states: dict[tuple[str, int], Any]
    n: int
    square: tuple
    stream: Any
    stream_args: tuple
    stream_bytes: float


def measure_batch(
    subject: Subject, b: int, turn: int, events: Events, bar: ProgressBar
) -> dict[str, Any]:
    """Every path of every implementation at batch size ``b``, in the phases below, in order
    (``turn``: the batch size's place in the run, which rotates the order of the compiles)."""
    settings, impls, _ = subject
    operands = _operands(subject, b)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    timed: list[Timed] = []
    _compile_fast_paths(impls, operands, turn, rows, timed, bar)
    scans = _compile_scans(impls, operands, timed, bar)
    _compile_idiomatic_paths(impls, operands, events, rows, timed, bar)
    roof_calls = _warm_up(operands, timed, bar)
    interleave(timed, settings.rounds, bar.tick)  # 5. the timed rounds
    return _batch_result(impls, operands, rows, scans, timed, roof_calls)


def _operands(subject: Subject, b: int) -> _Operands:
    """0. every state and operand first: eager ops compile small programs of their own, which each
    jax.clear_caches() below would throw away, to be compiled again by the next eager op"""
    import jax

    settings, impls, params = subject
    config = config_of(settings)
    k = settings.steps_at(b)
    xs, cs, keys, batches, key_list = synthetic_data(settings, b, k)
    states = {name: impl.from_canonical(params, config) for name, impl in impls.items()}
    empty_states = {name: impl.from_canonical(params, config) for name, impl in impls.items()}
    made = {
        (name, path): make(impl.from_canonical(params, config))
        for name, impl in impls.items()
        for path, make in paths_of(impl).items()
        if make is not None
    }
    unrolls = {name: settings.unrolls if name == REFERENCE else (1,) for name in impls}
    scan_states = {
        (name, u): impl.from_canonical(params, config)
        for name, impl in impls.items()
        for u in unrolls[name]
    }
    n = settings.roof_size
    ka, kb = jax.random.split(jax.random.key(4))
    square = (jax.random.normal(ka, (n, n)), jax.random.normal(kb, (n, n)))
    stream, stream_args, stream_bytes = streaming_update(params)
    jax.block_until_ready((states, empty_states, scan_states, square))
    return _Operands(
        b=b,
        k=k,
        xs=xs,
        cs=cs,
        keys=keys,
        batches=batches,
        key_list=key_list,
        states=states,
        empty_states=empty_states,
        made=made,
        unrolls=unrolls,
        scan_states=scan_states,
        n=n,
        square=square,
        stream=stream,
        stream_args=stream_args,
        stream_bytes=stream_bytes,
    )


def _compile_fast_paths(
    impls: dict[str, Any], operands: _Operands, turn: int, rows: dict, timed: list, bar: ProgressBar
) -> None:
    """1. every fast path from cold caches, trace, lower and compile apart; keep the executables.
    The order rotates from batch size to batch size, so that no path always compiles first."""
    import jax

    batches, key_list = operands.batches, operands.key_list
    states, empty_states = operands.states, operands.empty_states
    names = list(impls)
    for name in names[turn % len(names) :] + names[: turn % len(names)]:
        impl = impls[name]
        state = states[name]
        jitted = jax.jit(impl.train_step, donate_argnums=0)
        compiled, times = aot(jitted, state, batches[0], key_list[0])
        start = time.perf_counter()
        state, metrics = compiled(state, batches[0], key_list[0])
        jax.block_until_ready((state, metrics))
        times["first_call_s"] = sum(times.values()) + time.perf_counter() - start
        rows[(name, FAST)] = {
            "impl": name,
            "path": FAST,
            "label": name,
            "kind": "fast",
            "timing": "trace, lower and compile of jax.jit(impl.train_step)",
            **times,
            **cost_analysis(compiled),
            "memory": memory_analysis(compiled),
            "hlo": hlo_stats(compiled.as_text()),
        }
        timed.append(Timed((name, FAST), timed_loop(compiled, batches, key_list), state))
        empty = empty_step(impl, empty_states[name], batches[0], key_list[0])
        empty = empty.trace(empty_states[name], batches[0], key_list[0]).lower().compile()
        timed.append(
            Timed(("empty", name), timed_loop(empty, batches, key_list), empty_states[name])
        )
        bar.tick(f"compile {name}")


def _compile_scans(
    impls: dict[str, Any], operands: _Operands, timed: list, bar: ProgressBar
) -> dict[tuple[str, int], dict[str, Any]]:
    """2. the epoch as one call, for every implementation (and unroll values for pure JAX)"""
    xs, cs, keys, k = operands.xs, operands.cs, operands.keys, operands.k
    scans: dict[tuple[str, int], dict[str, Any]] = {}
    for name, impl in impls.items():
        for unroll in operands.unrolls[name]:
            state = operands.scan_states[(name, unroll)]
            compiled, times = aot(epoch_program(impl, unroll), state, xs, cs, keys)
            memory, text = memory_analysis(compiled), compiled.as_text()
            scans[(name, unroll)] = dict(impl=name, unroll=unroll, steps=k, **times, memory=memory)
            # the whole module's counts: the loop's body and every fusion's included
            scans[(name, unroll)]["hlo"] = {
                "fingerprint": hlo_stats(text)["fingerprint"],
                "instructions": sum(" = " in line for line in text.splitlines()),
                "fusions": text.count(" fusion("),
            }
            call = timer(lambda state, c=compiled: c(state, xs, cs, keys))
            timed.append(Timed(("scan", name, unroll), call, state))
            bar.tick(f"compile scan {name} unroll {unroll}")
    return scans


def _compile_idiomatic_paths(
    impls: dict[str, Any],
    operands: _Operands,
    events: Events,
    rows: dict,
    timed: list,
    bar: ProgressBar,
) -> None:
    """3. the idiomatic paths last, each from cold caches (only the last one measured keeps its
    executable; the others compile again in the warm-up)"""
    import jax

    batches, key_list, made = operands.batches, operands.key_list, operands.made
    for name, impl in impls.items():
        for path, make in paths_of(impl).items():
            if make is None:
                bar.tick()
                continue
            step, objects = made[(name, path)]
            jax.clear_caches()
            with events.collect() as seconds:
                start = time.perf_counter()
                objects, metrics = step(objects, batches[0], key_list[0])
                jax.block_until_ready((objects, metrics))
                first = time.perf_counter() - start
            rows[(name, path)] = {
                "impl": name,
                "path": path,
                "label": f"{name}:{path}",
                "kind": "idiomatic",
                "timing": "first call, split by JAX's trace, lower and compile events",
                "trace_s": seconds[TRACE_EVENT],
                "lower_s": seconds[LOWER_EVENT],
                "compile_s": seconds[COMPILE_EVENT],
                "first_call_s": first,
            }
            timed.append(Timed((name, path), timed_loop(step, batches, key_list), objects))
            bar.tick(f"compile {name}:{path}")


def _warm_up(operands: _Operands, timed: list[Timed], bar: ProgressBar) -> int:
    """4. warm-up: every path, and every program cleared from the caches by a later compile; then
    the roofline's two rates joining the rounds. Returns their calls per round."""
    import jax

    k, square = operands.k, operands.square
    stream, stream_args = operands.stream, operands.stream_args
    for item in timed:
        _, item.state = item.run(item.state)
        bar.tick("warm-up")
    roof_calls = max(3, min(k, 8))
    matmul = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(matmul(*square))
    roof_call = timer(lambda state: (state, [matmul(*square) for _ in range(roof_calls)]))
    timed.append(Timed(("roof",), roof_call, None))
    stream_call = timer(lambda buffers: (_repeat(stream, buffers, roof_calls), ()))
    timed.append(Timed(("bandwidth",), stream_call, stream_args))
    return roof_calls


def _batch_result(
    impls: dict[str, Any],
    operands: _Operands,
    rows: dict,
    scans: dict,
    timed: list[Timed],
    roof_calls: int,
) -> dict[str, Any]:
    """The batch size's entry of ``bench.json``: every row with its rounds, each fast path
    followed by its idiomatic paths, the scans, and the roofline's two rates."""
    b, k, n = operands.b, operands.k, operands.n
    by_key = {item.key: item for item in timed}
    roof = spread(by_key[("roof",)].seconds, roof_calls)
    stream_us = spread(by_key[("bandwidth",)].seconds, roof_calls)
    roof_flops = 2.0 * n**3
    for key, row in rows.items():
        row["step_us"] = spread(by_key[key].seconds, k)
        if row["kind"] == "fast":
            row["empty_step_us"] = spread(by_key[("empty", row["impl"])].seconds, k)
    out_rows = []
    for name, impl in impls.items():  # each fast path, then its idiomatic paths
        fast = rows[(name, FAST)]
        out_rows.append(fast)
        same = {"path": SAME_AS_FAST, "label": f"{name}:{SAME_AS_FAST}", "kind": "idiomatic"}
        for path, make in paths_of(impl).items():
            row = rows[(name, path)] if make is not None else {**fast, **same, "same_as_fast": True}
            out_rows.append(row)
    for (name, unroll), scan in scans.items():
        scan["call_us"] = spread(by_key[("scan", name, unroll)].seconds, 1)
    return {
        "batch_size": b,
        "steps_per_round": k,
        "roof": {
            "shape": [n, n, n],
            "flops": roof_flops,
            "call_us": roof,
            "gflops_per_s": roof_flops / roof["median"] / 1e3,
        },
        "bandwidth": {
            "what": "m, v, p = Adam-like update of float32 buffers the size of the parameters",
            "bytes": operands.stream_bytes,
            "call_us": stream_us,  # its GB/s, the fastest round's: results.summarize
        },
        "paths": out_rows,
        "epoch": list(scans.values()),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def _repeat(step: Callable, buffers: Any, calls: int) -> Any:
    for _ in range(calls):
        buffers = step(*buffers)
    return buffers


# --- data parallelism and bfloat16 ----------------------------------------------------------------


def measure_parallel(subject: Subject, bar: ProgressBar) -> dict[str, Any]:
    """Every mechanism and device count against the serial step, for the chosen implementations;
    the same global batch and key every step."""
    import jax

    from cvae_rosetta.app.devices import RunDevices
    from cvae_rosetta.spec import parallel

    settings, impls, params = subject
    config = config_of(settings)
    b = settings.parallel_batch
    k = settings.steps_at(b)
    names = tuple(dict.fromkeys((REFERENCE, *(settings.parallel_impls or impls))))
    _, _, _, (batch,), (key,) = synthetic_data(settings, b, 1)
    plans = {}
    for name in names:
        plans[(name, "none", 1)] = parallel.Plan.create("none")
        for mechanism in settings.mechanisms:
            for n in settings.devices:
                plans[(name, mechanism, n)] = parallel.Plan.create(mechanism, n)
    timed, rows, skipped = [], {}, []
    for case, plan in plans.items():
        name, mechanism, n = case
        impl, fields = impls[name], {"impl": name, "mechanism": mechanism, "devices": n}
        try:
            parallel.check_mechanism(plan.mechanism, impl)
        except ConfigError as err:
            skipped.append({**fields, "reason": str(err)})
            for _ in range(1 + settings.rounds):
                bar.tick()
            continue
        step = plan.make_step(impl)
        state = RunDevices(plan).place_state(impl.from_canonical(params, config))
        start = time.perf_counter()
        state, metrics = step(state, batch, key)
        jax.block_until_ready((state, metrics))
        rows[case] = {**fields, "first_call_s": time.perf_counter() - start}
        timed.append(Timed(case, timed_loop(step, [batch] * k, [key] * k), state))
        bar.tick(f"compile {name} {mechanism} x{n}")
    interleave(timed, settings.rounds, bar.tick)
    for item in timed:
        rows[item.key]["step_us"] = spread(item.seconds, k)
    return {
        "batch_size": b,
        "steps_per_round": k,
        "backend": jax.default_backend(),
        "note": "forced host devices share the machine's cores"
        if jax.default_backend() == "cpu"
        else "",
        "rows": list(rows.values()),
        "skipped": skipped,
    }


def measure_precision(subject: Subject, b: int, bar: ProgressBar) -> dict[str, Any]:
    """Every fast path with ``compute_dtype`` float32 and bfloat16 at batch ``b`` (parameters and
    Adam in float32 both ways), the two dtypes of all implementations interleaved in every round."""
    import jax

    from cvae_rosetta.spec.config import Config

    settings, impls, params = subject
    k = settings.steps_at(b)
    _, _, _, batches, key_list = synthetic_data(settings, b, k)
    timed = []
    for dtype in ("float32", "bfloat16"):
        config = Config(model=dataclasses.replace(settings.model, compute_dtype=dtype))
        for name, impl in impls.items():
            state = impl.from_canonical(params, config)
            step = jax.jit(impl.train_step, donate_argnums=0)
            state, _ = step(state, batches[0], key_list[0])
            timed.append(Timed((name, dtype), timed_loop(step, batches, key_list), state))
            bar.tick(f"compile {name} {dtype}")
    interleave(timed, settings.rounds, bar.tick)
    rows = [
        {"impl": item.key[0], "dtype": item.key[1], "step_us": spread(item.seconds, k)}
        for item in timed
    ]
    return {"batch_size": b, "steps_per_round": k, "rows": rows}
