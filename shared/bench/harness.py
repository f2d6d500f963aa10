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

This module runs a whole benchmark and writes its result. The settings and their flags are
:mod:`cvae_rosetta.bench.settings`'s; how a thing is timed, :mod:`cvae_rosetta.bench.timing`'s;
the programs timed beside the step and what XLA made of them,
:mod:`cvae_rosetta.bench.programs`'s; the measurements, :mod:`cvae_rosetta.bench.measure`'s and
:mod:`cvae_rosetta.bench.techniques`'s.

Nothing here imports JAX at module level: settings are checked before JAX starts, so that
``cvae bench`` can arrange its host devices first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta.bench import report as bench_report
from cvae_rosetta.bench.measure import (
    Subject,
    measure_batch,
    measure_parallel,
    measure_precision,
)
from cvae_rosetta.bench.plots import plots
from cvae_rosetta.bench.programs import config_of, paths_of, synthetic_data
from cvae_rosetta.bench.results import (
    PAGE_FILE,
    REFERENCE,
    RESULT_FILE,
    envelope,
    load_average,
    peak_rss_bytes,
    summarize,
)
from cvae_rosetta.bench.settings import Settings
from cvae_rosetta.bench.techniques import TECHNIQUES, measure_techniques
from cvae_rosetta.bench.timing import Events, ProgressBar, aot
from cvae_rosetta.spec.errors import ConfigError


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

    from cvae_rosetta.app import devices

    count = max(settings.devices)
    if count > 1:
        devices.arrange_cpu_devices(count)
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
    bar = ProgressBar(_work(settings, impls), progress)
    events = Events()
    jax.monitoring.register_event_duration_secs_listener(events)
    try:
        bar.stage = "warm-up"
        reference = impls[REFERENCE]
        params = reference.to_canonical(reference.init(jax.random.key(0), config_of(settings)))
        # one throwaway compile, so that JAX's one-time costs land on no measured path
        _, _, _, (batch,), (key,) = synthetic_data(settings, 2, 1)
        state = reference.from_canonical(params, config_of(settings))
        compiled, _ = aot(jax.jit(reference.train_step, donate_argnums=0), state, batch, key)
        jax.block_until_ready(compiled(state, batch, key))
        bar.tick()
        result["batches"] = {}
        subject = Subject(settings, impls, params)
        for turn, b in enumerate(settings.batch_sizes):
            result["load_average"]["during"].append(load_average())
            bar.stage = f"batch {b}"
            meter.lap()
            result["batches"][str(b)] = measure_batch(subject, b, turn, events, bar)
            others["phases"][f"batch {b}"] = meter.lap()
        bar.stage = "data parallel"
        result["data_parallel"] = measure_parallel(subject, bar)
        others["phases"]["data parallel"] = meter.lap()
        bar.stage = "bfloat16"
        result["precision"] = [
            measure_precision(subject, b, bar) for b in settings.precision_batches
        ]
        others["phases"]["bfloat16"] = meter.lap()
        bar.stage = "techniques"
        result["techniques"] = [
            measure_techniques(settings, impls[REFERENCE], params, b, bar)
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


# --- writing --------------------------------------------------------------------------------------


def write(out: Path, result: dict[str, Any], *, overwrite: bool = False) -> list[str]:
    """``bench.json``, the plots and ``bench.md`` (the same page as ``docs/performance.md``,
    linking the plots beside it) into ``out``, a previous benchmark there removed where
    ``overwrite``; returns the names written."""
    from cvae_rosetta import files
    from cvae_rosetta.app import rundir

    rundir.make_out_dir(out, overwrite=overwrite, marker=RESULT_FILE)
    files.write_json(out / RESULT_FILE, result)
    images = plots(result, out)
    page = bench_report.page(result, images, source=RESULT_FILE)
    files.write_text(out / PAGE_FILE, page)
    return [RESULT_FILE, PAGE_FILE, *images.values()]


def describe(result: dict[str, Any]) -> str:
    """A few lines for the terminal: each path's step time and ratio to pure JAX."""
    return bench_report.terminal_summary(result)
