"""``cvae bench``: what every implementation's training step costs, measured in one process.

For every implementation and each of its paths (the fast path ``jax.jit(impl.train_step,
donate_argnums=0)`` and the idiomatic paths of its ``extras["paths"]``), at every batch size, on
the MNIST-sized model with synthetic data, every timed thing once per round with the rounds
interleaved (the order rotating), so that the ratios pair up round by round
(:func:`cvae_rosetta.bench.results.interval`):

- **compile**: after ``jax.clear_caches()``, ``trace``, ``lower`` and ``compile`` timed apart; an
  idiomatic path's first call, split by JAX's own compile events (``jax.monitoring``);
- **per call**: a Python loop of ``K`` steps over ``K`` device-resident batches; and an *empty
  step* (the same state donated in and handed back, computing nothing): what one call costs;
- **device time**: the same ``K`` steps as one jitted ``lax.scan`` (pure JAX also unrolled);
- **FLOPs, bytes, memory, HLO**: ``cost_analysis``, ``memory_analysis``, the optimized HLO's counts
  and fingerprint of the fast path; the roofline's two rates timed in the same rounds: a square
  matmul and a streaming Adam-like update over buffers the size of the parameters;
- **techniques**: pure JAX's step without donation, with ``optax.flatten``, with optax's own
  clipping or AdamW in place of the shared halves, and with each kernel's gradient computed in the
  kernel's own layout, against its fast path, with bytes, fusions and transposes;
- **data parallelism**: ``Plan(mechanism, n).make_step`` (the step ``cvae train`` runs) for every
  mechanism and device count, against the serial step;
- **bfloat16**: every fast path in bfloat16 against float32 at the ``precision_batches``;
- versions, machine, and what other processes used of the CPU while it ran.

Nothing here imports JAX at module level: settings are checked before JAX starts, so that
``cvae bench`` can arrange its host devices first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta.bench import report as bench_report
from cvae_rosetta.bench.results import (
    FAST,
    PAGE_FILE,
    REFERENCE,
    RESULT_FILE,
    SAME_AS_FAST,
    envelope,
    load_average,
    peak_rss_bytes,
    summarize,
)
from cvae_rosetta.spec.config import DATA_PARALLEL, ModelConfig
from cvae_rosetta.spec.errors import ConfigError, field_error

BATCH_SIZES = (1, 8, 64, 256, 1024)
MECHANISMS = tuple(m for m in DATA_PARALLEL if m != "none")
MIN_STEPS = 8  # steps of a timed round, whatever the batch size
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


# --- settings -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one ``cvae bench`` measures; every field has a flag of the same name."""

    batch_sizes: tuple[int, ...] = BATCH_SIZES
    rounds: int = 10  # timed rounds, interleaved across every path (the intervals' pairs)
    steps: int = 256  # at most this many steps per round (fewer at large batches)
    epoch_examples: int = 16384  # a timed round covers about this many examples
    unrolls: tuple[int, ...] = (1, 2, 8)  # lax.scan unroll values (beyond 1: pure JAX only)
    devices: tuple[int, ...] = (1, 2, 4)  # device counts of the data-parallel cases
    mechanisms: tuple[str, ...] = MECHANISMS
    parallel_batch: int = 256  # global batch of the data-parallel cases
    parallel_impls: tuple[str, ...] | None = None  # None: every benchmarked implementation
    impls: tuple[str, ...] | None = None  # None: every installed implementation
    roof_size: int = 1024  # N of the N x N matmul roof
    precision_batches: tuple[int, ...] = (256,)  # batch sizes of bfloat16 against float32
    technique_batches: tuple[int, ...] = (1, 256)  # batch sizes of pure JAX's step variants
    quick: bool = False
    # the MNIST-sized default; smaller only in tests
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)

    def steps_at(self, batch_size: int) -> int:
        """``K``, the steps of a timed round at ``batch_size``."""
        return max(MIN_STEPS, min(self.steps, self.epoch_examples // batch_size))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["model"] = self.model.to_dict()
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


QUICK = dict(
    batch_sizes=(8, 256),
    rounds=5,
    steps=48,
    epoch_examples=2048,
    unrolls=(1,),
    devices=(2,),
    mechanisms=("sharded", "shard_map"),
    parallel_impls=(REFERENCE,),
    precision_batches=(),
    technique_batches=(),
)


def _ints(flag: str, text: Any) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",")) if isinstance(text, str) else ()
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise field_error(ConfigError, flag, "comma-separated integers >= 1", text)
    return tuple(dict.fromkeys(values))


def _int(flag: str, text: Any) -> int:
    try:
        value = int(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if value is None or value < 1:
        raise field_error(ConfigError, flag, "an integer >= 1", text)
    return value


def _names(flag: str, text: Any, choices: Sequence[str] | None = None) -> tuple[str, ...]:
    expected = (
        f"comma-separated names among {', '.join(choices)}"
        if choices
        else "comma-separated implementation names or module:attribute"
    )
    parts = text.split(",") if isinstance(text, str) else []
    names = tuple(dict.fromkeys(part.strip() for part in parts))
    if not names or any(not n for n in names) or (choices and any(n not in choices for n in names)):
        raise field_error(ConfigError, flag, expected, text)
    return names


# The settings a user may give as text (the flags of ``cvae bench``, without the dashes), each
# with its parser: ``parse(flag, text) -> value`` or ``setting: expected ..., got ...``.
PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "batch_sizes": _ints,
    "rounds": _int,
    "steps": _int,
    "epoch_examples": _int,
    "unrolls": _ints,
    "devices": _ints,
    "mechanisms": lambda f, t: _names(f, t, MECHANISMS),
    "parallel_batch": _int,
    "parallel_impls": _names,
    "impls": _names,
    "roof_size": _int,
    "precision_batches": lambda f, t: () if t == "none" else _ints(f, t),
    "technique_batches": lambda f, t: () if t == "none" else _ints(f, t),
}
SETTING_FLAGS = tuple(PARSERS)


def benchmark(
    settings: Settings,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool = True,
    command: Sequence[str] | None = None,
) -> tuple[Path, dict[str, Any], list[str]]:
    """A whole ``cvae bench``: the implementations and ``out`` checked (a non-empty ``out`` only if
    ``overwrite`` and a previous benchmark's), the devices arranged, every measurement made and
    written into ``out``; the path, the result and the names written."""
    from cvae_rosetta.app import rundir

    impls = resolve_impls(settings)
    path = rundir.check_out_dir(out, overwrite=overwrite, marker=RESULT_FILE, what="benchmark")
    arrange_devices(settings)  # before anything touches a JAX device
    result = run(settings, impls, progress=progress, command=command)
    return path, result, write(path, result, overwrite=overwrite)


def settings_from_flags(
    *, quick: bool = False, model: ModelConfig | None = None, **flags: str | None
) -> Settings:
    """The settings the flags describe (:data:`SETTING_FLAGS`: text as typed, ``None`` where not
    given), refused with ``setting: expected ..., got ...`` where a value does not parse or does
    not fit the others. ``quick`` starts from :data:`QUICK`; given flags override either."""
    values: dict[str, Any] = dict(QUICK) if quick else {}
    if unknown := set(flags) - set(PARSERS):
        raise TypeError(f"settings_from_flags: unknown settings {sorted(unknown)}")
    for name, text in flags.items():
        if text is not None:
            values[name] = PARSERS[name](name, text)
    if "unrolls" in values:  # the per-call overhead needs the plain scan
        values["unrolls"] = tuple(dict.fromkeys((1, *values["unrolls"])))
    settings = Settings(quick=quick, model=model or ModelConfig(), **values)
    if settings.parallel_batch % math.lcm(*settings.devices):
        raise ConfigError(
            f"parallel_batch: expected a multiple of every count in devices "
            f"({', '.join(map(str, settings.devices))}), got {settings.parallel_batch}"
        )
    return settings


def resolve_impls(settings: Settings) -> dict[str, Any]:
    """``name -> implementation``: the ones asked for, every installed one by default, and pure
    JAX always (every figure is also a ratio to it). Loading imports the frameworks, not JAX's
    devices, so this runs before the devices are arranged."""
    from cvae_rosetta.app import frameworks
    from cvae_rosetta.spec import protocol

    names = list(settings.impls or [i.name for i in protocol.known() if i.installed])
    names = [REFERENCE, *(n for n in names if n != REFERENCE)]
    impls = {name: frameworks.load(name) for name in names}
    for name in settings.parallel_impls or ():
        if name not in impls:
            raise ConfigError(
                f"parallel_impls: expected names among the benchmarked implementations "
                f"({', '.join(impls)}), got {name!r}"
            )
    return {getattr(impl, "name", key): impl for key, impl in impls.items()}


def arrange_devices(settings: Settings) -> None:
    """Split the host into ``max(devices)`` CPU devices, before anything touches a JAX device,
    and refuse a device count this machine cannot give."""
    import jax

    from cvae_rosetta.app import parallel

    count = max(settings.devices)
    if count > 1:
        parallel.arrange_cpu_devices(count)
    if jax.device_count() < count:
        raise ConfigError(
            f"devices: expected at most {jax.device_count()} (the {jax.default_backend()} "
            f"devices JAX sees), got {count}"
        )


# --- the machine ----------------------------------------------------------------------------------


class CpuMeter:
    """What the other processes on the machine use while this one runs, in cores: the machine's
    busy CPU time (``/proc/stat``) minus this process's own (``os.times``), per wall second. The
    load average cannot tell, since it counts this process's own threads too."""

    def __init__(self) -> None:
        self.first = self.last = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        except (OSError, ValueError):
            return None
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        own = sum(os.times()[:2])
        return time.monotonic(), busy, own

    @staticmethod
    def _cores(a, b) -> float | None:
        if a is None or b is None or b[0] <= a[0]:
            return None
        return max(0.0, round(((b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0]), 3))

    def lap(self) -> float | None:
        """Other processes' cores since the previous lap."""
        now = self._sample()
        cores, self.last = self._cores(self.last, now), now
        return cores

    def total(self) -> float | None:
        return self._cores(self.first, self._sample())


# --- measuring ------------------------------------------------------------------------------------


class _Events:
    """Sums of JAX's trace, lower and compile durations while the context is open."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys((TRACE_EVENT, LOWER_EVENT, COMPILE_EVENT), 0.0)
        self._open = False

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if self._open and event in self.seconds:
            self.seconds[event] += duration

    @contextlib.contextmanager
    def collect(self) -> Iterator[dict[str, float]]:
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self._open = True
        try:
            yield self.seconds
        finally:
            self._open = False


def _cost(compiled: Any) -> dict[str, float | None]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    return {"flops": cost.get("flops"), "bytes_accessed": cost.get("bytes accessed")}


def _memory(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    return {
        name: int(getattr(stats, name))
        for name in dir(stats)
        if name.endswith("_in_bytes") and isinstance(getattr(stats, name), int)
    }


def program(text: str) -> str:
    """An optimized HLO module as XLA runs it, without what names it: no source tables, metadata,
    instruction or parameter names (renamed in order of appearance). Two steps with the same
    program run the same kernels on the same buffers, whatever framework traced them."""
    body = text[min((text.find(m) for m in ("\n%", "\nENTRY ") if m in text), default=0) :]
    body = re.sub(r",? metadata=\{[^}]*\}", "", body)
    names: dict[str, str] = {}
    body = re.sub(r"%([\w.\-]+)", lambda m: names.setdefault(m[1], f"%{len(names)}"), body)
    return re.sub(r"([(,] ?)[A-Za-z_][\w.]*: ", r"\1p: ", body)


def hlo_stats(text: str) -> dict[str, Any]:
    """Counts over the entry computation of an optimized HLO module: instructions, fusions, library
    fusions (``kind=kCustom``: XNNPACK/YNNPACK/oneDNN), plain dots, copies; the transposes of
    the whole module (fusion bodies included: a weight transposed every step shows there); and
    the fingerprint of its :func:`program`."""
    entry = text.split("\nENTRY ", 1)[-1].split("\n}\n", 1)[0]
    lines = [line for line in entry.splitlines()[1:] if " = " in line]
    return {
        "fingerprint": hashlib.sha256(program(text).encode()).hexdigest()[:16],
        "instructions": len(lines),
        "fusions": sum(" fusion(" in line for line in lines),
        "library_fusions": sum("kind=kCustom" in line for line in lines),
        "plain_dots": sum(" dot(" in line for line in lines),
        "copies": sum(" copy(" in line for line in lines),
        "transposes": text.count(" transpose("),
    }


def aot(jitted: Any, *args: Any) -> tuple[Any, dict[str, float]]:
    """``jax.clear_caches()``, then ``trace``, ``lower`` and ``compile`` timed separately."""
    import jax

    jax.clear_caches()
    t0 = time.perf_counter()
    traced = jitted.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    return compiled, {"trace_s": t1 - t0, "lower_s": t2 - t1, "compile_s": t3 - t2}


def _spread(seconds: Sequence[float], per: int) -> dict[str, Any]:
    values = [s / per * 1e6 for s in seconds]
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": values,
    }


@dataclasses.dataclass
class _Timed:
    """One thing timed in every round: ``run(state) -> (seconds, state)``."""

    key: tuple
    run: Callable[[Any], tuple[float, Any]]
    state: Any
    seconds: list[float] = dataclasses.field(default_factory=list)


def _timer(call: Callable[[Any], tuple[Any, Any]]) -> Callable:
    """``run(state) -> (seconds, state)``: ``call(state) -> (state, outputs)`` timed from a
    settled state to its settled outputs."""
    import jax

    def run(state):
        jax.block_until_ready(state)
        start = time.perf_counter()
        state, outputs = call(state)
        jax.block_until_ready((state, outputs))
        return time.perf_counter() - start, state

    return run


def _loop(step: Callable, batches: Sequence[Any], keys: Sequence[Any]) -> Callable:
    """A :func:`_timer` of ``step`` called once per batch from a Python loop."""

    def call(state):
        metrics = None
        for batch, key in zip(batches, keys, strict=True):
            state, metrics = step(state, batch, key)
        return state, metrics

    return _timer(call)


def _interleave(timed: Sequence[_Timed], rounds: int, tick: Callable[[str], None]) -> None:
    """``rounds`` rounds over every item, the starting item rotating from round to round."""
    for r in range(rounds):
        shift = r % len(timed)
        for item in [*timed[shift:], *timed[:shift]]:
            seconds, item.state = item.run(item.state)
            item.seconds.append(seconds)
            tick(f"round {r + 1}/{rounds}")


def epoch_program(impl: Any, unroll: int, donate: bool = True, step: Any = None) -> Any:
    """``(state, xs [K, B, D], cs [K, B], keys [K]) -> (state, metrics [K])``: ``K`` train steps
    (``impl.train_step``, or ``step``) as one jitted ``lax.scan`` over device-resident batches, the
    state donated."""
    import jax

    from cvae_rosetta.spec.validation import Batch

    step = step or impl.train_step

    def epoch(state, xs, cs, keys):
        def body(state, inputs):
            x, c, key = inputs
            return step(state, Batch(x, c), key)

        return jax.lax.scan(body, state, (xs, cs, keys), unroll=unroll)

    return jax.jit(epoch, donate_argnums=0 if donate else ())


def paths_of(impl: Any) -> dict[str, Callable | None]:
    """``path name -> make(state) -> (step, state)`` of an implementation's idiomatic paths (its
    ``extras["paths"]``), or ``{"idiomatic": None}`` when its idiomatic path is its fast path."""
    extra = getattr(impl, "extras", {}).get("paths") or {}
    return dict(extra) if extra else {SAME_AS_FAST: None}


class _Progress:
    """A bar on a terminal (``files.on_terminal``), else a plain line per stage on stderr."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        from cvae_rosetta.files import on_terminal

        drawn = enabled and on_terminal()
        self.bar = tqdm(total=total, desc="cvae bench", disable=not drawn, dynamic_ncols=True)
        self.stage, self.shown, self.done, self.lines = "", "", 0, enabled and not drawn

    def tick(self, what: str = "") -> None:
        self.bar.set_postfix_str(f"{self.stage} {what}".strip(), refresh=False)
        self.bar.update(1)
        if self.lines and self.stage != self.shown:
            print(f"cvae bench: {self.stage} ({self.done}/{self.bar.total} done)", file=sys.stderr)
        self.shown, self.done = self.stage, self.done + 1


def _work(settings: Settings, impls: dict[str, Any]) -> int:
    """How many progress ticks a run makes."""
    paths = sum(1 + len(paths_of(impl)) for impl in impls.values())  # compile ticks
    # timed per round: each fast path, its empty step and each idiomatic path
    timed = sum(2 + sum(m is not None for m in paths_of(i).values()) for i in impls.values())
    scans = len(impls) + len([u for u in settings.unrolls if u != 1])
    per_batch = paths + scans + (timed + scans) + settings.rounds * (timed + scans + 2)
    cases = len(settings.parallel_impls or impls) * (
        1 + len(settings.mechanisms) * len(settings.devices)
    )
    precision = len(settings.precision_batches) * 2 * len(impls) * (1 + settings.rounds)
    techniques = len(settings.technique_batches) * len(TECHNIQUES) * (1 + 2 * settings.rounds)
    return (
        1
        + len(settings.batch_sizes) * per_batch
        + cases * (1 + settings.rounds)
        + precision
        + techniques
    )


def run(
    settings: Settings,
    impls: dict[str, Any],
    *,
    progress: bool = True,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Measure everything (devices already arranged, see :func:`arrange_devices`) and return the
    result: the dictionary ``bench.json`` holds."""
    import jax

    started = time.time()
    result: dict[str, Any] = {
        **envelope("bench", command),
        "settings": settings.to_dict(),
        "load_average": {"start": load_average(), "during": [], "end": None},
    }
    others = {"cores": None, "phases": {}}
    result["other_processes_cpu"] = others
    meter = CpuMeter()
    bar = _Progress(_work(settings, impls), progress)
    events = _Events()
    jax.monitoring.register_event_duration_secs_listener(events)
    try:
        bar.stage = "warm-up"
        reference = impls[REFERENCE]
        params = reference.to_canonical(reference.init(jax.random.key(0), _config(settings)))
        # one throwaway compile, so that JAX's one-time costs land on no measured path
        _, _, _, (batch,), (key,) = _data(settings, 2, 1)
        state = reference.from_canonical(params, _config(settings))
        compiled, _ = aot(jax.jit(reference.train_step, donate_argnums=0), state, batch, key)
        jax.block_until_ready(compiled(state, batch, key))
        bar.tick()
        result["batches"] = {}
        for turn, b in enumerate(settings.batch_sizes):
            result["load_average"]["during"].append(load_average())
            bar.stage = f"batch {b}"
            meter.lap()
            result["batches"][str(b)] = _measure_batch(
                settings, impls, params, b, turn, events, bar
            )
            others["phases"][f"batch {b}"] = meter.lap()
        bar.stage = "data parallel"
        result["data_parallel"] = _measure_parallel(settings, impls, params, bar)
        others["phases"]["data parallel"] = meter.lap()
        bar.stage = "bfloat16"
        result["precision"] = [
            _measure_precision(settings, impls, params, b, bar) for b in settings.precision_batches
        ]
        others["phases"]["bfloat16"] = meter.lap()
        bar.stage = "techniques"
        result["techniques"] = [
            _measure_techniques(settings, impls[REFERENCE], params, b, bar)
            for b in settings.technique_batches
        ]
        others["phases"]["techniques"] = meter.lap()
        others["cores"] = meter.total()
    finally:
        jax.monitoring.unregister_event_duration_listener(events)
        bar.bar.close()
    result["load_average"]["end"] = load_average()
    result.update(peak_rss_bytes=peak_rss_bytes(), duration_s=time.time() - started)
    summarize(result)
    return result


def _config(settings: Settings):
    from cvae_rosetta.spec.config import Config

    return Config(model=settings.model)


def _data(settings: Settings, batch_size: int, steps: int):
    """``steps`` synthetic batches on the device: ``xs [K, B, D]``, ``cs [K, B]``, keys ``[K]``,
    and the same as lists of ``K`` batches and ``K`` keys, for a Python loop."""
    import jax

    from cvae_rosetta.spec.validation import Batch

    model = settings.model
    kx, kc, kk = jax.random.split(jax.random.key(1), 3)
    xs = jax.random.uniform(kx, (steps, batch_size, model.input_dim))
    cs = jax.random.randint(kc, (steps, batch_size), 0, model.num_classes)
    xs, cs, keys = jax.block_until_ready((xs, cs, jax.random.split(kk, steps)))
    batches = [Batch(xs[i], cs[i]) for i in range(steps)]
    return xs, cs, keys, batches, [keys[i] for i in range(steps)]


def empty_step(impl: Any, state: Any, batch: Any, key: Any) -> Any:
    """A jitted step that computes nothing: ``(state, batch, key) -> (state, zero metrics)`` with
    the state donated and the metrics shaped like ``impl.train_step``'s, so a call moves exactly
    what a step's call moves."""
    import jax
    import jax.numpy as jnp

    _, metrics = jax.eval_shape(impl.train_step, state, batch, key)

    def step(state, batch, key):
        return state, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metrics)

    return jax.jit(step, donate_argnums=0)


def _measure_batch(
    settings: Settings, impls, params, b: int, turn: int, events: _Events, bar: _Progress
) -> dict[str, Any]:
    import jax

    config = _config(settings)
    k = settings.steps_at(b)
    xs, cs, keys, batches, key_list = _data(settings, b, k)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    timed: list[_Timed] = []
    # 0. every state and operand first: eager ops compile small programs of their own, which each
    #    jax.clear_caches() below would throw away, to be compiled again by the next eager op
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

    # 1. every fast path from cold caches, trace, lower and compile apart; keep the executables.
    #    The order rotates from batch size to batch size, so that no path always compiles first.
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
            **_cost(compiled),
            "memory": _memory(compiled),
            "hlo": hlo_stats(compiled.as_text()),
        }
        timed.append(_Timed((name, FAST), _loop(compiled, batches, key_list), state))
        empty = empty_step(impl, empty_states[name], batches[0], key_list[0])
        empty = empty.trace(empty_states[name], batches[0], key_list[0]).lower().compile()
        timed.append(_Timed(("empty", name), _loop(empty, batches, key_list), empty_states[name]))
        bar.tick(f"compile {name}")

    # 2. the epoch as one call, for every implementation (and unroll values for pure JAX)
    scans: dict[tuple[str, int], dict[str, Any]] = {}
    for name, impl in impls.items():
        for unroll in unrolls[name]:
            state = scan_states[(name, unroll)]
            compiled, times = aot(epoch_program(impl, unroll), state, xs, cs, keys)
            memory, text = _memory(compiled), compiled.as_text()
            scans[(name, unroll)] = dict(impl=name, unroll=unroll, steps=k, **times, memory=memory)
            # the whole module's counts: the loop's body and every fusion's included
            scans[(name, unroll)]["hlo"] = {
                "fingerprint": hlo_stats(text)["fingerprint"],
                "instructions": sum(" = " in line for line in text.splitlines()),
                "fusions": text.count(" fusion("),
            }
            call = _timer(lambda state, c=compiled: c(state, xs, cs, keys))
            timed.append(_Timed(("scan", name, unroll), call, state))
            bar.tick(f"compile scan {name} unroll {unroll}")

    # 3. the idiomatic paths last, each from cold caches (only the last one measured keeps its
    #    executable; the others compile again in the warm-up)
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
            timed.append(_Timed((name, path), _loop(step, batches, key_list), objects))
            bar.tick(f"compile {name}:{path}")

    # 4. warm-up: every path, and every program cleared from the caches by a later compile
    for item in timed:
        _, item.state = item.run(item.state)
        bar.tick("warm-up")
    roof_calls = max(3, min(k, 8))
    matmul = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(matmul(*square))
    roof_call = _timer(lambda state: (state, [matmul(*square) for _ in range(roof_calls)]))
    timed.append(_Timed(("roof",), roof_call, None))
    stream_call = _timer(lambda buffers: (_repeat(stream, buffers, roof_calls), ()))
    timed.append(_Timed(("bandwidth",), stream_call, stream_args))

    # 5. the timed rounds
    _interleave(timed, settings.rounds, bar.tick)

    by_key = {item.key: item for item in timed}
    roof = _spread(by_key[("roof",)].seconds, roof_calls)
    stream_us = _spread(by_key[("bandwidth",)].seconds, roof_calls)
    roof_flops = 2.0 * n**3
    for key, row in rows.items():
        row["step_us"] = _spread(by_key[key].seconds, k)
        if row["kind"] == "fast":
            row["empty_step_us"] = _spread(by_key[("empty", row["impl"])].seconds, k)
    out_rows = []
    for name, impl in impls.items():  # each fast path, then its idiomatic paths
        fast = rows[(name, FAST)]
        out_rows.append(fast)
        same = {"path": SAME_AS_FAST, "label": f"{name}:{SAME_AS_FAST}", "kind": "idiomatic"}
        for path, make in paths_of(impl).items():
            row = rows[(name, path)] if make is not None else {**fast, **same, "same_as_fast": True}
            out_rows.append(row)
    for (name, unroll), scan in scans.items():
        scan["call_us"] = _spread(by_key[("scan", name, unroll)].seconds, 1)
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
            "bytes": stream_bytes,
            "call_us": stream_us,  # its GB/s, the fastest round's: results.summarize
        },
        "paths": out_rows,
        "epoch": list(scans.values()),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def streaming_update(params: Any) -> tuple[Any, tuple, float]:
    """The bandwidth half of the roofline: ``(g, m, v, p) -> (g, m', v', p')``, Adam's pass over
    float32 buffers of the parameters' total size (4 reads, 3 writes, elementwise, all donated),
    compiled; its operands; and the bytes its ``cost_analysis`` counts."""
    import jax
    import jax.numpy as jnp

    size = sum(leaf.size for leaf in jax.tree.leaves(params))
    buffers = tuple(jnp.full((size,), 0.5 + i, jnp.float32) for i in range(4))

    def update(g, m, v, p):
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        return g, m, v, p - 1e-3 * m / (jnp.sqrt(v) + 1e-8)

    compiled = jax.jit(update, donate_argnums=(0, 1, 2, 3)).lower(*buffers).compile()
    return compiled, jax.block_until_ready(buffers), _cost(compiled)["bytes_accessed"]


def _repeat(step: Callable, buffers: Any, calls: int) -> Any:
    for _ in range(calls):
        buffers = step(*buffers)
    return buffers


def _measure_parallel(
    settings: Settings, impls: dict[str, Any], params, bar: _Progress
) -> dict[str, Any]:
    """Every mechanism and device count against the serial step, for the chosen implementations;
    the same global batch and key every step."""
    import jax

    from cvae_rosetta.spec import parallel

    config = _config(settings)
    b = settings.parallel_batch
    k = settings.steps_at(b)
    names = tuple(dict.fromkeys((REFERENCE, *(settings.parallel_impls or impls))))
    _, _, _, (batch,), (key,) = _data(settings, b, 1)
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
        state = plan.place_state(impl.from_canonical(params, config))
        start = time.perf_counter()
        state, metrics = step(state, batch, key)
        jax.block_until_ready((state, metrics))
        rows[case] = {**fields, "first_call_s": time.perf_counter() - start}
        timed.append(_Timed(case, _loop(step, [batch] * k, [key] * k), state))
        bar.tick(f"compile {name} {mechanism} x{n}")
    _interleave(timed, settings.rounds, bar.tick)
    for item in timed:
        rows[item.key]["step_us"] = _spread(item.seconds, k)
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


def _measure_precision(
    settings: Settings, impls: dict[str, Any], params, b: int, bar: _Progress
) -> dict[str, Any]:
    """Every fast path with ``compute_dtype`` float32 and bfloat16 at batch ``b`` (parameters and
    Adam in float32 both ways), the two dtypes of all implementations interleaved in every round."""
    import jax

    from cvae_rosetta.spec.config import Config

    k = settings.steps_at(b)
    _, _, _, batches, key_list = _data(settings, b, k)
    timed = []
    for dtype in ("float32", "bfloat16"):
        config = Config(model=dataclasses.replace(settings.model, compute_dtype=dtype))
        for name, impl in impls.items():
            state = impl.from_canonical(params, config)
            step = jax.jit(impl.train_step, donate_argnums=0)
            state, _ = step(state, batches[0], key_list[0])
            timed.append(_Timed((name, dtype), _loop(step, batches, key_list), state))
            bar.tick(f"compile {name} {dtype}")
    _interleave(timed, settings.rounds, bar.tick)
    rows = [
        {"impl": item.key[0], "dtype": item.key[1], "step_us": _spread(item.seconds, k)}
        for item in timed
    ]
    return {"batch_size": b, "steps_per_round": k, "rows": rows}


TECHNIQUES = {
    FAST: "jax.jit(train_step, donate_argnums=0): the fast path",
    "no donation": "jax.jit(train_step): every step allocates a new state",
    "optax.flatten": "the optimiser wrapped in optax.flatten: one vector for the parameters",
    "optax's clipping": "optax.clip_by_global_norm (g / n * c under a select) before the shared "
    "AdamW",
    "optax's AdamW": "optax.adamw (bias corrections dividing every element) after the shared "
    "clipping",
    "kernel layout": "each h @ kernel's gradient written h.T @ g (a jax.custom_vjp), in the "
    "kernel's [in, out] layout: JAX's own rule writes (g.T @ h).T",
}


def kernel_layout_step(impl: Any) -> Callable:
    """``impl``'s step with every ``h @ kernel`` of its loss (a 2-D ``dot_general`` contracting
    ``h``'s last axis with the kernel's first) given a VJP that computes the kernel's gradient as
    ``h.T @ g``. JAX's transpose rule computes it as ``g.T @ h``, ``[out, in]``, and transposes it
    into the kernel's ``[in, out]``; at batch 1 XLA:CPU makes that product an elementwise outer
    product and keeps the transpose inside the optimiser's fusions, which then read the gradient
    across its rows. Equinox's ``[out, in]`` weights need no transpose. The loss is traced once and
    its jaxpr evaluated with those ``dot_general``s swapped (JAX's custom-interpreter pattern), so
    the model's code is the implementation's own."""
    import jax
    from jax import lax
    from jax.extend.core import Literal

    from cvae_rosetta.spec.model import noise

    @jax.custom_vjp
    def matmul(h, kernel):
        return h @ kernel

    def forward(h, kernel):
        return h @ kernel, (h, kernel)

    def backward(saved, g):
        h, kernel = saved
        return g @ kernel.T, h.T @ g

    matmul.defvjp(forward, backward)
    plain = (((1,), (0,)), ((), ()))

    def evaluate(closed, *args):
        names = (*closed.jaxpr.constvars, *closed.jaxpr.invars)
        env = dict(zip(names, (*closed.consts, *args), strict=True))
        read = lambda v: v.val if isinstance(v, Literal) else env[v]
        for eqn in closed.jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if eqn.primitive is lax.dot_general_p and eqn.params["dimension_numbers"] == plain:
                outs = [matmul(*ins)]
            else:
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
                outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in closed.jaxpr.outvars]

    def step(state, batch, key):
        eps = noise(key, batch.x.shape[0], state.config.model.latent_dim)
        loss = lambda params: impl.loss_fn(state.replace(params=params), batch, eps)
        closed, shape = jax.make_jaxpr(loss, return_shape=True)(state.params)
        flat = lambda params: jax.tree.unflatten(
            jax.tree.structure(shape), evaluate(closed, *jax.tree.leaves(params))
        )
        grads, metrics = jax.grad(flat, has_aux=True)(state.params)
        return state.apply_gradients(grads), metrics

    return step


def _technique_states(state: Any) -> dict[str, tuple[Any, bool]]:
    """``technique -> (state, donated)``: pure JAX's state with the optimiser each one uses (the
    optimiser states of optax's own halves have the shared one's structure); the kernel layout's
    state is the fast path's (its step differs, :func:`kernel_layout_step`)."""
    import optax

    from cvae_rosetta.spec import optim

    o = state.config.optim
    ours = optim.adamw(optim.schedule(o), o.weight_decay)
    theirs = optax.adamw(
        o.learning_rate, optim.B1, optim.B2, optim.EPS, weight_decay=o.weight_decay
    )
    flat = optax.flatten(state.tx)
    return {
        FAST: (state, True),
        "no donation": (state, False),
        "optax.flatten": (state.replace(tx=flat, opt_state=flat.init(state.params)), True),
        "optax's clipping": (
            state.replace(tx=optax.chain(optax.clip_by_global_norm(o.clip_norm), ours)),
            True,
        ),
        "optax's AdamW": (
            state.replace(tx=optax.chain(optim.clip_by_global_norm(o.clip_norm), theirs)),
            True,
        ),
        "kernel layout": (state, True),
    }


def _measure_techniques(settings: Settings, impl, params, b: int, bar: _Progress) -> dict:
    """Pure JAX's step written each way of :data:`TECHNIQUES` at batch ``b``, per call and as one
    ``lax.scan``, all interleaved; with each compiled step's bytes, FLOPs and HLO counts."""
    import jax

    k = settings.steps_at(b)
    xs, cs, keys, batches, key_list = _data(settings, b, k)
    base = impl.from_canonical(params, _config(settings))
    rows, timed = {}, []
    copy = lambda state: jax.tree.map(lambda a: a.copy(), state)
    for name, (state, donated) in _technique_states(base).items():
        donate = (0,) if donated else ()
        train_step = kernel_layout_step(impl) if name == "kernel layout" else impl.train_step
        step = jax.jit(train_step, donate_argnums=donate)
        compiled = step.lower(copy(state), batches[0], key_list[0]).compile()
        epoch = epoch_program(impl, 1, donated, train_step)
        rows[name] = {
            "technique": name,
            "what": TECHNIQUES[name],
            **_cost(compiled),
            "hlo": hlo_stats(compiled.as_text()),
        }
        loop, scan = copy(state), copy(state)
        jax.block_until_ready(compiled(copy(state), batches[0], key_list[0]))
        jax.block_until_ready(epoch(copy(state), xs, cs, keys))
        timed.append(_Timed((name, "step_us"), _loop(compiled, batches, key_list), loop))
        call = _timer(lambda s, e=epoch: e(s, xs, cs, keys))
        timed.append(_Timed((name, "scan_us"), call, scan))
        bar.tick(f"compile {name}")
    _interleave(timed, settings.rounds, bar.tick)
    for item in timed:
        rows[item.key[0]][item.key[1]] = _spread(item.seconds, k)
    return {"batch_size": b, "steps_per_round": k, "rows": list(rows.values())}


# --- writing --------------------------------------------------------------------------------------


def write(out: Path, result: dict[str, Any], *, overwrite: bool = False) -> list[str]:
    """``bench.json``, the plots and ``bench.md`` (the same page as ``docs/performance.md``,
    linking the plots beside it) into ``out``, a previous benchmark there removed where
    ``overwrite``; returns the names written."""
    from cvae_rosetta import files
    from cvae_rosetta.app import rundir

    rundir.make_out_dir(out, overwrite=overwrite, marker=RESULT_FILE)
    files.write_json(out / RESULT_FILE, result)
    images = bench_report.plots(result, out)
    page = bench_report.page(result, images, source=RESULT_FILE)
    files.write_text(out / PAGE_FILE, page)
    return [RESULT_FILE, PAGE_FILE, *images.values()]


def describe(result: dict[str, Any]) -> str:
    """A few lines for the terminal: each path's step time and ratio to pure JAX."""
    return bench_report.terminal_summary(result)
