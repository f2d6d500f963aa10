"""The training loop every implementation shares.

Keys follow SPEC section 3: the key of step ``t`` is ``fold_in(run_key, t)``. The data stay on the
device; each epoch is one on-device shuffle and gather, then one compiled call per step that slices
its batch, derives its key and runs the implementation's ``train_step`` on a donated state. The
test split is evaluated after every epoch with a fixed key, so evaluations are comparable across
epochs and across implementations.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shared import parallel
from shared.config import Config
from shared.data import Dataset, EpochBatches, Split, eval_batches
from shared.errors import CvaeError
from shared.protocol import Implementation
from shared.validation import Batch

METRICS = ("loss", "recon", "kl")
Record = dict[str, Any]


class TrainingDiverged(CvaeError):
    """A step produced a non-finite metric."""


@dataclasses.dataclass(frozen=True)
class RunKeys:
    """The keys of a run, all derived from its seed, none reused for two purposes."""

    init: jax.Array
    shuffle: jax.Array
    train: jax.Array  # the run key of SPEC section 3: step t uses fold_in(train, t)
    eval: jax.Array
    sample: jax.Array

    @classmethod
    def from_seed(cls, seed: int) -> RunKeys:
        return cls(*jax.random.split(jax.random.key(seed), 5))


@dataclasses.dataclass
class TrainResult:
    state: Any
    records: list[Record]  # what metrics.jsonl holds: "step" and "epoch" events
    compile_seconds: float  # trace + lower + compile of the step
    steps_per_second: float  # steady state, compilation and evaluation excluded

    def epochs(self) -> list[Record]:
        return [r for r in self.records if r["event"] == "epoch"]

    def final(self) -> Record:
        return self.epochs()[-1]


def evaluate(
    impl: Implementation,
    state: Any,
    split: Split,
    key: jax.Array,
    *,
    batch_size: int = 1024,
    loss: Callable | None = None,
) -> dict[str, float]:
    """Exact means of ``loss``, ``recon`` and ``kl`` over ``split`` (chunks weighted by size)."""
    loss = loss or jax.jit(impl.loss)
    totals = dict.fromkeys(METRICS, 0.0)
    for i, (x, c) in enumerate(eval_batches(split, batch_size)):
        _, metrics = loss(state, Batch(x, c), jax.random.fold_in(key, i))
        for name in METRICS:
            totals[name] += float(metrics[name]) * x.shape[0]
    return {name: total / len(split) for name, total in totals.items()}


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total, desc=desc, unit="step", disable=not enabled, leave=True, dynamic_ncols=True
    )


def train(
    impl: Implementation,
    state: Any,
    config: Config,
    dataset: Dataset,
    keys: RunKeys,
    *,
    on_record: Callable[[Record], None] | None = None,
    progress: bool = True,
    desc: str | None = None,
    eval_batch_size: int = 1024,
) -> TrainResult:
    """Train ``state`` for ``config.train.epochs`` epochs of ``dataset.train``.

    ``on_record`` receives every record as it is made (the CLI appends them to ``metrics.jsonl``,
    so a run that is stopped keeps what it had). Raises :class:`TrainingDiverged` naming the step
    and the metric if a step's metrics are not finite.
    """
    batches = EpochBatches(dataset.train, config.data.batch_size, config.data.remainder)
    plan = parallel.Plan.of(config)
    parallel.check_mechanism(plan.mechanism, impl)
    emit = on_record or (lambda record: None)
    records: list[Record] = []

    def record(event: Record) -> None:
        records.append(event)
        emit(event)

    def epoch_data(number: int):
        """The epoch's shuffled batches, ``[num_batches, B, ...]``, each batch's rows split over
        the plan's devices (across processes, each process places only its own rows)."""
        xs, cs = batches.epoch(jax.random.fold_in(keys.shuffle, number))
        if plan.mechanism == "none":
            return xs, cs
        return plan.place_rows(xs, axis=1), plan.place_rows(cs, axis=1)

    state = plan.place_state(state)
    xs, cs = epoch_data(0)
    index = jnp.zeros((), jnp.int32)
    start = time.perf_counter()
    step = parallel.epoch_step(plan, impl).lower(state, xs, cs, index, keys.train, index)
    step = step.compile()
    compile_seconds = time.perf_counter() - start
    eval_loss = jax.jit(impl.loss)

    total_steps = config.train.epochs * batches.num_batches
    bar = _progress(total_steps, desc or getattr(impl, "name", "train"), progress)
    t = 0
    train_seconds = 0.0
    try:
        for epoch in range(config.train.epochs):
            if epoch:
                xs, cs = epoch_data(epoch)
            jax.block_until_ready((xs, cs))
            tick = time.perf_counter()
            step_metrics = []
            for i in range(batches.num_batches):
                state, metrics = step(state, xs, cs, np.int32(i), keys.train, np.int32(t))
                step_metrics.append(metrics)
                t += 1
                bar.update(1)
                if i % 10 == 9 or i == batches.num_batches - 1:
                    loss = f"{float(metrics['loss']):.3f}"
                    bar.set_postfix(epoch=epoch + 1, loss=loss, refresh=False)
            fetched = jax.device_get(step_metrics)
            train_seconds += time.perf_counter() - tick
            first = t - len(fetched)
            for j, metrics in enumerate(fetched):
                values = {name: float(metrics[name]) for name in METRICS}
                bad = [name for name, v in values.items() if not math.isfinite(v)]
                if bad:
                    raise TrainingDiverged(
                        f"{getattr(impl, 'name', impl)}: {bad[0]} is {values[bad[0]]} at step "
                        f"{first + j} (epoch {epoch + 1}); lower --learning-rate or --clip-norm"
                    )
                record({"event": "step", "step": first + j + 1, "epoch": epoch + 1, **values})
            train_means = {
                f"train_{n}": float(np.mean([float(m[n]) for m in fetched])) for n in METRICS
            }
            test = evaluate(
                impl,
                plan.local_state(state),
                dataset.test,
                keys.eval,
                batch_size=eval_batch_size,
                loss=eval_loss,
            )
            record(
                {
                    "event": "epoch",
                    "epoch": epoch + 1,
                    "step": t,
                    **train_means,
                    **{f"test_{n}": v for n, v in test.items()},
                    "seconds": train_seconds,
                }
            )
    finally:
        bar.close()
    rate = t / train_seconds if train_seconds else 0.0
    return TrainResult(plan.local_state(state), records, compile_seconds, rate)
