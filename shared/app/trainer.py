"""The training loop every implementation shares.

Keys follow SPEC section 3: the key of step ``t`` is ``fold_in(run_key, t)``. The data stay on the
device; each epoch is one on-device shuffle and gather, then one compiled call per step that slices
its batch, derives its key and runs the implementation's step on a donated state (its
``grads_fn`` then ``apply_gradients``, which is its ``train_step`` with the gradient in view, where
it has one; its ``train_step`` otherwise). The test split is evaluated after every epoch with a
fixed key, so evaluations are comparable across epochs and across implementations.

A run can start anywhere (:class:`Progress`: step, epoch, batch within the epoch, the epoch's step
metrics so far): the epoch's shuffle is ``fold_in(shuffle_key, epoch)`` and step ``t``'s key is
``fold_in(run_key, t)``, so a run resumed from a checkpoint takes exactly the steps it would have
taken uninterrupted and makes exactly the same records (``shared/app/checkpoint.py``).

A step's record holds its metrics, the learning rate it was taken with (``optim.schedule``) and,
where the step sees the gradient (an implementation with a ``grads_fn``, in every data-parallel
mode: ``parallel.epoch_step``), ``grad_norm``, the global norm of the gradient before clipping.
``profile`` traces chosen steps with ``jax.profiler`` (:class:`ProfileSteps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.app.data import Dataset, EpochBatches, Split, eval_batches
from cvae_rosetta.spec import optim, parallel
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, CvaeError
from cvae_rosetta.spec.protocol import Implementation
from cvae_rosetta.spec.validation import Batch

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


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a run stands: ``step`` steps done; the next is batch ``batch`` of epoch ``epoch``
    (both counted from 0), so ``step == epoch * num_batches + batch``."""

    step: int
    epoch: int
    batch: int


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a run needs besides its train state to go on exactly where it stopped."""

    position: Position
    # [loss, recon, kl] of each step of the current epoch done so far (their means are the
    # epoch record's train metrics); floats of float32 values, exact in JSON
    epoch_metrics: tuple[tuple[float, float, float], ...] = ()
    records: int = 0  # records made so far (metrics.jsonl lines), every step up to position.step
    seconds: float = 0.0  # training seconds so far (the epoch records' "seconds")

    @classmethod
    def start(cls) -> Progress:
        return cls(Position(0, 0, 0))


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
        if state is not None:
            jax.block_until_ready(state)
        jax.profiler.stop_trace()


@dataclasses.dataclass
class TrainResult:
    state: Any
    records: list[Record]  # what metrics.jsonl holds: "step" and "epoch" events
    compile_seconds: float  # trace + lower + compile of the step
    steps_per_second: float  # steady state, compilation and evaluation excluded
    progress: Progress | None = None  # where the run stands now
    stopped: bool = False  # stopped early on request (should_stop), after a checkpoint

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


def check_debug_nans(debug_nans: bool, config: Config) -> None:
    """``debug_nans`` checks the serial step only."""
    if debug_nans and config.train.data_parallel != "none":
        raise ConfigError(
            "debug_nans: expected train.data_parallel none (it checks the serial step), got "
            f"{config.train.data_parallel!r}"
        )


def _raise_first_nan(error, impl, t: int, epoch: int) -> None:
    """Stop on the step whose ``checkify`` error says an operation made a NaN."""
    message = error.get()
    if message:
        # where the operation was traced: the innermost frame outside JAX itself
        lines = str(getattr(error.get_exception(), "traceback_info", "") or "").splitlines()
        here = next((line for line in lines if "/jax/" not in line and line.strip()), None)
        raise TrainingDiverged(
            f"{getattr(impl, 'name', impl)}: debug_nans: at step {t + 1} (epoch {epoch + 1}) "
            + " ".join(message.split()).rstrip(".")
            + (f" at {here.strip()}" if here else "")
        )


def _progress(total: int, desc: str, enabled: bool, initial: int = 0):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="step",
        disable=not enabled,
        leave=True,
        dynamic_ncols=True,
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
    start: Progress | None = None,
    history: Sequence[Record] = (),
    on_checkpoint: Callable[[Any, Progress], None] | None = None,
    decide: Callable[[int, bool], tuple[bool, bool]] | None = None,
    debug_nans: bool = False,
    on_epoch: Callable[[Any, Record], None] | None = None,
    profile: ProfileSteps | None = None,
) -> TrainResult:
    """Train ``state`` for ``config.train.epochs`` epochs of ``dataset.train``.

    ``on_record`` receives every record as it is made (the CLI appends them to ``metrics.jsonl``,
    so a run that is stopped keeps what it had). Raises :class:`TrainingDiverged` naming the step
    and the metric if a step's metrics are not finite.

    Resuming: ``start`` is where ``state`` stands (default: step 0) and ``history`` the records made
    before it (returned in ``TrainResult.records``, not emitted again). Checkpoints:
    ``on_checkpoint(state, progress)`` receives the single-device state at the end and whenever
    ``decide(t, boundary)`` says so; it is asked before the first step, after every step and at
    every epoch's end (``boundary`` true at the first and the last), and again after each
    checkpoint (a signal may come while it is written), and answers ``(write a checkpoint, stop)``
    (a stop writes one first; :class:`cvae_rosetta.app.checkpoint.Cadence`).
    Every step up to ``progress.position.step`` has been recorded by then. A checkpoint due at an
    epoch's last step is made after that epoch's record. In a run of several processes every
    process asks at the same steps, so their answers may be agreed.

    ``debug_nans`` runs every step under ``checkify`` with NaN checks (slower): the first
    operation that produces a NaN is named, with its source line, on the step it happens.

    ``on_epoch(state, record)`` receives the single-device state after each epoch's record (for
    pictures of the model as it trains). ``profile``: steps to trace (:class:`ProfileSteps`).
    """
    batches = EpochBatches(dataset.train, config.data.batch_size, config.data.remainder)
    plan = parallel.Plan.of(config)
    parallel.check_mechanism(plan.mechanism, impl)
    check_debug_nans(debug_nans, config)
    emit = on_record or (lambda record: None)
    records: list[Record] = list(history)
    resumed = start is not None  # from a checkpoint at its own position
    start = start or Progress.start()
    epochs, num_batches = config.train.epochs, batches.num_batches
    first = start.position
    if first.step != first.epoch * num_batches + first.batch or not 0 <= first.batch < num_batches:
        raise CvaeError(
            f"start: expected step = epoch * {num_batches} + batch with batch in [0, "
            f"{num_batches}), got step {first.step}, epoch {first.epoch}, batch {first.batch}"
        )

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
    loaded = min(first.epoch, epochs - 1)
    xs, cs = epoch_data(loaded)
    index = jnp.zeros((), jnp.int32)
    begin = time.perf_counter()
    step = parallel.epoch_step(plan, impl, debug_nans=debug_nans)
    step = step.lower(state, xs, cs, index, keys.train, index)
    step = step.compile()
    compile_seconds = time.perf_counter() - begin
    eval_loss = jax.jit(impl.loss)

    name = desc or getattr(impl, "name", "train")
    bar = _progress(epochs * num_batches, name, progress, first.step)
    t = first.step
    train_seconds = start.seconds
    session_seconds = 0.0
    pending: list[Any] = []  # this epoch's step metrics on the device, not recorded yet
    done = [tuple(m) for m in start.epoch_metrics]  # this epoch's recorded step metrics
    saved_at = [first.step if resumed else None]  # the step of the latest checkpoint

    def flush(epoch: int) -> None:
        """Record the pending steps (after checking that their metrics are finite)."""
        fetched = jax.device_get(pending)
        pending.clear()
        base = t - len(fetched)
        rates = optim.learning_rates(config.optim, np.arange(base + 1, t + 1))
        for j, metrics in enumerate(fetched):
            values = {name: float(metrics[name]) for name in METRICS}
            bad = [f"{name} is {v}" for name, v in values.items() if not math.isfinite(v)]
            if not bad and not metrics.get("finite", True):
                bad = ["the gradient is not finite (the updated parameters are not)"]
            if bad:
                raise TrainingDiverged(
                    f"{getattr(impl, 'name', impl)}: {bad[0]} at step {base + j + 1} "
                    f"(epoch {epoch + 1}); the run stopped there and kept what steps 1 to "
                    f"{base + j} wrote; lower optim.learning_rate or optim.clip_norm, or rerun "
                    "with debug_nans to find the first operation that made it"
                )
            rate = float(rates[j])
            # the norm of the step's gradient, where the step can see it (parallel.epoch_step)
            seen = {"grad_norm": float(metrics["grad_norm"])} if "grad_norm" in metrics else {}
            record(
                {"event": "step", "step": base + j + 1, "epoch": epoch + 1, **values,
                 "learning_rate": rate, **seen}
            )  # fmt: skip
            done.append(tuple(values[name] for name in METRICS))

    def now(epoch: int, batch: int) -> Progress:
        return Progress(Position(t, epoch, batch), tuple(done), len(records), train_seconds)

    def checkpoint(epoch: int, batch: int) -> None:
        if on_checkpoint is not None and saved_at[0] != t:
            on_checkpoint(plan.local_state(state), now(epoch, batch))
            saved_at[0] = t

    def result(position: Progress, stopped: bool = False) -> TrainResult:
        steps = t - first.step
        rate = steps / session_seconds if session_seconds else 0.0
        return TrainResult(
            plan.local_state(state), records, compile_seconds, rate, position, stopped
        )

    decide = decide or (lambda t, boundary: (False, False))
    tracing = False
    try:
        if decide(t, True)[1]:  # stopped while starting: at the checkpoint it starts from
            checkpoint(first.epoch, first.batch)
            return result(start, stopped=True)
        for epoch in range(first.epoch, epochs):
            if epoch != loaded:
                xs, cs = epoch_data(epoch)
            if epoch != first.epoch:
                done = []
            jax.block_until_ready((xs, cs))
            tick = time.perf_counter()
            for i in range(first.batch if epoch == first.epoch else 0, num_batches):
                if profile is None:
                    out = step(state, xs, cs, np.int32(i), keys.train, np.int32(t))
                else:
                    with profile.around(t + 1, state) as tracing:
                        out = step(state, xs, cs, np.int32(i), keys.train, np.int32(t))
                if debug_nans:
                    error, out = out
                    if error.get():
                        flush(epoch)  # the steps before it are kept
                        _raise_first_nan(error, impl, t, epoch)
                state, metrics = out
                pending.append(metrics)
                t += 1
                if tracing and t == profile.last:
                    profile.stop((state, metrics))
                    tracing = False
                # Checked one step behind, so the device is never idle for it: a non-finite step
                # stops the run before the next one is even recorded.
                if len(pending) > 1 and not bool(pending[-2]["finite"]):
                    flush(epoch)
                bar.update(1)
                if i % 10 == 9 or i == num_batches - 1:
                    loss = f"{float(metrics['loss']):.3f}"
                    bar.set_postfix(epoch=epoch + 1, loss=loss, refresh=False)
                if i == num_batches - 1:
                    break
                save, stop = decide(t, False)
                if save:
                    flush(epoch)
                    seconds = time.perf_counter() - tick
                    train_seconds += seconds
                    session_seconds += seconds
                    checkpoint(epoch, i + 1)
                    if stop or decide(t, False)[1]:  # asked before the checkpoint, or during it
                        return result(now(epoch, i + 1), stopped=True)
                    tick = time.perf_counter()
            flush(epoch)
            seconds = time.perf_counter() - tick
            train_seconds += seconds
            session_seconds += seconds
            train_means = {
                f"train_{n}": float(np.mean([m[k] for m in done])) for k, n in enumerate(METRICS)
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
            done = []
            if on_epoch is not None:
                on_epoch(plan.local_state(state), records[-1])
            save, stop = decide(t, True)
            if save or epoch == epochs - 1:
                checkpoint(epoch + 1, 0)
                stop = stop or decide(t, True)[1]  # asked during the checkpoint
            if stop and epoch < epochs - 1:
                return result(now(epoch + 1, 0), stopped=True)
    finally:
        bar.close()
        if tracing:  # stopped inside the traced steps: what was traced so far
            profile.stop()
    end = Position(t, max(first.epoch, epochs), 0)
    return result(Progress(end, (), len(records), train_seconds))
