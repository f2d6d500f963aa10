"""How ``cvae bench`` times a thing: once per round, the rounds interleaved with the starting item
rotating, every round's seconds kept (their spread, and the pairs the ratios' intervals are made
of); a compile as ``trace``, ``lower`` and ``compile`` timed apart, or a first call split by JAX's
own compile events; and the progress the rounds report.

Nothing here imports JAX at module level (``cvae bench`` arranges its host devices first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Events:
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


def spread(seconds: Sequence[float], per: int) -> dict[str, Any]:
    """Each round's ``seconds`` for ``per`` calls as µs per call: the median, the fastest and the
    slowest round, and every round."""
    values = [s / per * 1e6 for s in seconds]
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": values,
    }


@dataclasses.dataclass
class Timed:
    """One thing timed in every round: ``run(state) -> (seconds, state)``."""

    key: tuple
    run: Callable[[Any], tuple[float, Any]]
    state: Any
    seconds: list[float] = dataclasses.field(default_factory=list)


def timer(call: Callable[[Any], tuple[Any, Any]]) -> Callable:
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


def timed_loop(step: Callable, batches: Sequence[Any], keys: Sequence[Any]) -> Callable:
    """A :func:`timer` of ``step`` called once per batch from a Python loop."""

    def call(state):
        metrics = None
        for batch, key in zip(batches, keys, strict=True):
            state, metrics = step(state, batch, key)
        return state, metrics

    return timer(call)


def interleave(timed: Sequence[Timed], rounds: int, tick: Callable[[str], None]) -> None:
    """``rounds`` rounds over every item, the starting item rotating from round to round."""
    for r in range(rounds):
        shift = r % len(timed)
        for item in [*timed[shift:], *timed[:shift]]:
            seconds, item.state = item.run(item.state)
            item.seconds.append(seconds)
            tick(f"round {r + 1}/{rounds}")


class ProgressBar:
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
