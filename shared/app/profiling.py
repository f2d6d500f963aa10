"""A run's steps traced with ``jax.profiler`` (``Options.profile_steps``): which steps, checked
against the run's, and the trace started before the first and stopped after the last. JAX is
imported only when a trace starts or stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cvae_rosetta.spec.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ProfileSteps:
    """Steps ``first`` to ``last`` (counted from 1 as in ``metrics.jsonl``, both included) traced
    with ``jax.profiler`` into ``directory`` (``plugins/profile/<time>/*.xplane.pb`` for
    TensorBoard's profile plugin, and ``perfetto_trace.json.gz`` for https://ui.perfetto.dev).
    The device is drained before the first and after the last, so the trace holds exactly them."""

    first: int
    last: int
    directory: Path

    @classmethod
    def parse(cls, value: Any, directory: Path) -> ProfileSteps | None:
        """``"A:B"`` (or ``(A, B)``) as steps ``A..B``; ``None`` for none; refuses anything else
        with the ``profile_steps`` field named."""
        if value is None:
            return None
        text = ":".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
        first, sep, last = text.partition(":")
        if sep and first.strip().isdigit() and last.strip().isdigit():
            a, b = int(first), int(last)
            if 1 <= a <= b:
                return cls(a, b, Path(directory))
        raise ConfigError(
            "profile_steps: expected FIRST:LAST, whole steps with 1 <= FIRST <= LAST (counted "
            f"from 1 as in metrics.jsonl, both traced), got {text!r}"
        )

    def check(self, done: int, total: int) -> None:
        """Refuse steps outside those the run will take: ``done + 1 .. total``."""
        if not (done < self.first and self.last <= total):
            what = "the run's steps" if done == 0 else f"the {total - done} steps the run has left"
            raise ConfigError(
                f"profile_steps: expected steps within {done + 1}:{total} ({what}), got "
                f"'{self.first}:{self.last}'"
            )

    @contextlib.contextmanager
    def around(self, step: int, state: Any) -> Iterator[bool]:
        """Inside the block step ``step`` (counted from 1) is dispatched; it starts the trace
        before the first step and yields whether the step is traced."""
        import jax

        if step == self.first:
            jax.block_until_ready(state)
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
        if not self.first <= step <= self.last:
            yield False
            return
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            yield True

    def stop(self, state: Any = None) -> None:
        """End the trace, after draining the device of ``state``'s computations (none: a run that
        stops early keeps what was traced so far)."""
        import jax

        if state is not None:
            jax.block_until_ready(state)
        jax.profiler.stop_trace()
