"""The training loop every implementation shares.

Keys follow SPEC section 3: the key of step ``t`` is ``fold_in(run_key, t)``. The data stay on the
device; each epoch is one on-device shuffle and gather, then one compiled call per step that slices
its batch, derives its key and runs the implementation's step on a donated state (its
``grads_fn`` then ``apply_gradients``, which is its ``train_step`` with the gradient in view, where
it has one; its ``train_step`` otherwise). The test split is evaluated after every epoch with a
fixed key, so evaluations are comparable across epochs and across implementations
(``eval_every``: every so many epochs, and always after the last).

:func:`train` takes what is trained (a :class:`~cvae_rosetta.app.run.Job`), how the run is
carried out (a :class:`~cvae_rosetta.app.run.Control`) and what hears of it as it goes
(:class:`~cvae_rosetta.app.run.Callbacks`).

A run can start anywhere (:class:`~cvae_rosetta.app.run.Progress`: step, epoch, batch within the
epoch, the epoch's step metrics so far): the epoch's shuffle is ``fold_in(shuffle_key, epoch)``
and step ``t``'s key is ``fold_in(run_key, t)``, so a run resumed from a checkpoint takes exactly
the steps it would have taken uninterrupted and makes exactly the same records
(``shared/app/checkpoint.py``).

A step's record holds its metrics, the learning rate it was taken with (``optim.schedule``) and,
where the step sees the gradient (any implementation with a ``grads_fn`` or a ``grads`` method and
a state with ``apply_gradients``, in every data-parallel mode it runs: ``devices.RunDevices``),
``grad_norm``, the global norm of the gradient before clipping. ``profile`` traces chosen steps
with ``jax.profiler`` (:class:`~cvae_rosetta.app.profiling.ProfileSteps`).

``max_steps`` ends a run after that many steps in all (a resumed run's included), as a finished
run: where it falls inside an epoch, that epoch's steps so far make a last, partial epoch record
(``"partial": true``), after the run's final checkpoint, so that a resume cuts it away and goes on
exactly as an uninterrupted run. It changes nothing else: the learning-rate schedule still spans
``train.epochs``.

What a run shows as it goes (:class:`_Report`, on stderr): a progress bar where one can be drawn
(:func:`on_terminal`), one plain line per epoch anywhere else, and a line every ``log_every``
steps.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.app.data import EpochBatches, Split, eval_batches
from cvae_rosetta.app.devices import RunDevices
from cvae_rosetta.app.optionchecks import check_debug_nans, check_run_control
from cvae_rosetta.app.run import (
    METRICS,
    Callbacks,
    Control,
    Job,
    Position,
    Progress,
    Record,
    TrainResult,
)
from cvae_rosetta.files import on_terminal
from cvae_rosetta.spec import optim
from cvae_rosetta.spec.errors import CvaeError
from cvae_rosetta.spec.protocol import Implementation
from cvae_rosetta.spec.validation import Batch


class TrainingDiverged(CvaeError):
    """A step produced a non-finite metric."""


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


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 epoch``, ``2 epochs``, ``0 batches`` (with ``plural`` given)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


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


class _Report:
    """What a run shows on stderr as it goes. With ``progress``: a progress bar where one can be
    drawn (:func:`on_terminal`), else one line per epoch; either way (``progress`` or not) a line
    every ``log_every`` steps (0: none), printed above the bar where there is one."""

    def __init__(
        self,
        name: str,
        *,
        total: int,
        epochs: int,
        start: Progress,
        progress: bool,
        log_every: int,
    ) -> None:
        self.name, self.total, self.epochs, self.log_every = name, total, epochs, log_every
        drawn = bool(progress) and on_terminal()
        initial = start.position.step
        self.bar = _progress(total, name, drawn, initial)
        self.drawn, self.lines = drawn, bool(progress) and not drawn
        self.last = (initial, time.perf_counter())  # the step and time of the last step line
        self.since = (initial, start.seconds)  # the step and training seconds of the last epoch

    def step(self, t: int, epoch: int, i: int, num_batches: int, metrics: Any) -> None:
        """Step ``t`` (counted from 1), batch ``i`` of epoch ``epoch`` (from 0), just dispatched."""
        self.bar.update(1)
        if self.drawn and (i % 10 == 9 or i == num_batches - 1):
            loss = f"{float(metrics['loss']):.3f}"
            self.bar.set_postfix(epoch=epoch + 1, loss=loss, refresh=False)
        if self.log_every and t % self.log_every == 0:
            loss = float(metrics["loss"])  # waits for the step
            now = time.perf_counter()
            rate = (t - self.last[0]) / (now - self.last[1]) if now > self.last[1] else 0.0
            self.last = (t, now)
            self._line(
                f"{self.name}: step {t}/{self.total}, epoch {epoch + 1}/{self.epochs}, loss "
                f"{loss:.3f}, {rate:.0f} steps/s (since the previous line)"
            )

    def epoch(self, record: Record, steps: int) -> None:
        """An epoch's record (``steps``: those of a whole epoch), as one line where no bar is
        drawn; its steps/s count training time only, as the record's ``seconds`` do."""
        (step, seconds), self.since = self.since, (record["step"], record["seconds"])
        if not self.lines:
            return
        head = f"{self.name}: epoch {record['epoch']}/{self.epochs}"
        if record.get("partial"):
            done = record["step"] - (record["epoch"] - 1) * steps
            head += f" (partial: {done} of its {counted(steps, 'step')})"
        words = [head, f"step {record['step']}/{self.total}"]
        words.append(f"train loss {record['train_loss']:.3f}")
        if "test_loss" in record:
            words.append(f"test loss {record['test_loss']:.3f}")
        if record["step"] > step and record["seconds"] > seconds:
            words.append(f"{(record['step'] - step) / (record['seconds'] - seconds):.0f} steps/s")
        self._line(", ".join(words))

    def _line(self, text: str) -> None:
        if self.drawn:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


def train(
    job: Job, state: Any, control: Control | None = None, callbacks: Callbacks | None = None
) -> TrainResult:
    """Train ``state`` for ``config.train.epochs`` epochs of ``dataset.train`` (``job``: what
    is trained, from where), or until step ``control.max_steps`` (counted over the whole run,
    resumed or not) where that comes first.

    ``callbacks.on_record`` receives every record as it is made (the CLI appends them to
    ``metrics.jsonl``, so a run that is stopped keeps what it had). Raises
    :class:`TrainingDiverged` naming the step and the metric if a step's metrics are not finite.

    Resuming: ``job.start`` is where ``state`` stands (default: step 0) and ``job.history`` the
    records made before it (returned in ``TrainResult.records``, not emitted again). Checkpoints:
    ``callbacks.on_checkpoint(state, progress)`` receives the single-device state at the end and
    whenever ``control.decide(t, boundary)`` says so; it is asked before the first step, after
    every step and at every epoch's end (``boundary`` true at the first and the last), and again
    after each checkpoint (a signal may come while it is written), and answers ``(write a
    checkpoint, stop)`` (a stop writes one first; :class:`cvae_rosetta.app.signals.Cadence`).
    Every step up to ``progress.position.step`` has been recorded by then. A checkpoint due at an
    epoch's last step is made after that epoch's record. In a run of several processes every
    process asks at the same steps, so their answers may be agreed.

    ``control.debug_nans`` runs every step under ``checkify`` with NaN checks (slower): the first
    operation that produces a NaN is named, with its source line, on the step it happens.

    ``callbacks.on_epoch(state, record)`` receives the single-device state after each epoch's
    record (for pictures of the model as it trains). ``control.profile``: steps to trace
    (:class:`~cvae_rosetta.app.profiling.ProfileSteps`).

    ``control.eval_every``: the test split is evaluated (the epoch record's ``test_*``) every so
    many epochs, and always at the run's end. ``control.progress``: a progress bar where one can be
    drawn (:func:`on_terminal`), a line per epoch elsewhere; ``control.log_every``: a line every so
    many steps too (0: none). Both on stderr, named ``job.label``.
    """
    control, callbacks = control or Control(), callbacks or Callbacks()
    check_run_control(control.max_steps, control.log_every, control.eval_every)
    run = _Training(job, control, callbacks)
    run.begin(state)
    return run.run()


class _Training:
    """One call of :func:`train`, a method per phase: :meth:`begin` (start or resume: the state
    placed, the step compiled), :meth:`run` (the epochs, each :meth:`_epoch`: its steps, its record,
    the checkpoints due; :meth:`_partial_end` where ``max_steps`` falls inside it),
    :meth:`_checkpoint`, :meth:`_stop` (a stop asked for, after a checkpoint) and :meth:`_end`.
    Every key, write and record comes in the same order in every run, so a resumed run repeats the
    records of an uninterrupted one."""

    def __init__(self, job: Job, control: Control, callbacks: Callbacks) -> None:
        """Check the run before anything is placed on a device or compiled."""
        impl, config, dataset, start = job.impl, job.config, job.dataset, job.start
        self.job, self.control = job, control
        self.impl, self.config, self.dataset, self.keys = impl, config, dataset, job.keys
        self.batches = EpochBatches(dataset.train, config.data.batch_size, config.data.remainder)
        self.devices = RunDevices.of(config, impl)
        check_debug_nans(control.debug_nans, config)
        self.debug_nans, self.profile = control.debug_nans, control.profile
        self.eval_batch_size = control.eval_batch_size
        self.emit = callbacks.on_record or (lambda record: None)
        self.on_checkpoint, self.on_epoch = callbacks.on_checkpoint, callbacks.on_epoch
        self.records: list[Record] = list(job.history)
        self.resumed = start is not None  # from a checkpoint at its own position
        self.start = start or Progress.start()
        self.epochs, self.num_batches = config.train.epochs, self.batches.num_batches
        first = self.first = self.start.position
        if (
            first.step != first.epoch * self.num_batches + first.batch
            or not 0 <= first.batch < self.num_batches
        ):
            raise CvaeError(
                f"start: expected step = epoch * {self.num_batches} + batch with batch in [0, "
                f"{self.num_batches}), got step {first.step}, epoch {first.epoch}, batch "
                f"{first.batch}"
            )
        self.decide = control.decide or (lambda t, boundary: (False, False))
        # the run's last step: its epochs' end, or max_steps where that comes first
        self.limit = self.epochs * self.num_batches
        if control.max_steps is not None:
            self.limit = min(self.limit, control.max_steps)
        self.eval_every = control.eval_every

    # --- start or resume --------------------------------------------------------------------------

    def begin(self, state: Any) -> None:
        """Place ``state``, load the first epoch's data, compile the step (timed) and open the
        progress bar, at the run's start or where it resumes."""
        first, impl = self.first, self.impl
        self.state = self.devices.place_state(state)
        self.loaded = min(first.epoch, self.epochs - 1)
        self.xs, self.cs = self._epoch_data(self.loaded)
        index = jnp.zeros((), jnp.int32)
        begin = time.perf_counter()
        step = self.devices.epoch_step(impl, debug_nans=self.debug_nans)
        step = step.lower(self.state, self.xs, self.cs, index, self.keys.train, index)
        self.compiled = step.compile()
        self.compile_seconds = time.perf_counter() - begin
        self.eval_loss = jax.jit(impl.loss)
        self.report = _Report(
            self.job.label,
            total=self.limit,
            epochs=self.epochs,
            start=self.start,
            progress=self.control.progress,
            log_every=self.control.log_every,
        )
        self.t = first.step
        self.train_seconds = self.start.seconds
        self.session_seconds = 0.0
        self.tick = 0.0  # when the training time counted last began
        self.pending: list[Any] = []  # this epoch's step metrics on the device, not recorded yet
        self.done = [tuple(m) for m in self.start.epoch_metrics]  # this epoch's recorded metrics
        self.saved_at = first.step if self.resumed else None  # the step of the latest checkpoint
        self.tracing = False

    def run(self) -> TrainResult:
        """The epochs left, after :meth:`begin`; the result where the run ends or stops."""
        try:
            # stopped while starting: at the checkpoint it starts from
            if self.decide(self.t, True)[1]:
                self._checkpoint(self.first.epoch, self.first.batch)
                return self._result(self.start, stopped=True)
            for epoch in range(self.first.epoch, self.epochs):
                # the run's last step reached; a resume at max_steps inside an epoch makes that
                # epoch's partial record again (its resume cut it away)
                if self.t >= self.limit and not (epoch == self.first.epoch and self.first.batch):
                    break
                stopped = self._epoch(epoch)
                if stopped is not None:
                    return stopped
        finally:
            self.report.close()
            if self.tracing:  # stopped inside the traced steps: what was traced so far
                self.profile.stop()
        return self._end()

    # --- an epoch ---------------------------------------------------------------------------------

    def _epoch_data(self, number: int):
        """The epoch's shuffled batches, ``[num_batches, B, ...]``, each batch's rows split over
        the run's devices (across processes, each process places only its own rows)."""
        xs, cs = self.batches.epoch(jax.random.fold_in(self.keys.shuffle, number))
        return self.devices.place_epoch(xs, cs)

    def _epoch(self, epoch: int) -> TrainResult | None:
        """Epoch ``epoch`` from where the run stands: its steps, its record and the checkpoints
        due; the result if the run stops in it."""
        if epoch != self.loaded:
            self.xs, self.cs = self._epoch_data(epoch)
        if epoch != self.first.epoch:
            self.done = []
        stopped = self._steps(epoch)
        if stopped is not None:
            return stopped
        if self.t < (epoch + 1) * self.num_batches:  # max_steps, inside the epoch
            self._partial_end(epoch)
            return None
        return self._epoch_end(epoch)

    def _steps(self, epoch: int) -> TrainResult | None:
        """The epoch's steps left, and the checkpoints due between them; the result if the run
        stops at one."""
        jax.block_until_ready((self.xs, self.cs))
        self.tick = time.perf_counter()
        for i in range(self.first.batch if epoch == self.first.epoch else 0, self.num_batches):
            if self.t >= self.limit:
                break
            self._step(epoch, i)
            if i == self.num_batches - 1 or self.t >= self.limit:
                break
            save, stop = self.decide(self.t, False)
            if save:
                self._flush(epoch)
                self._count_seconds()
                self._checkpoint(epoch, i + 1)
                if stop or self.decide(self.t, False)[1]:  # asked before the checkpoint, or in it
                    return self._stop(epoch, i + 1)
                self.tick = time.perf_counter()
        return None

    def _step(self, epoch: int, i: int) -> None:
        """Dispatch batch ``i``'s step (its metrics stay on the device) and check the one before."""
        t, step, profile = self.t, self.compiled, self.profile
        if profile is None:
            out = step(self.state, self.xs, self.cs, np.int32(i), self.keys.train, np.int32(t))
        else:
            with profile.around(t + 1, self.state) as self.tracing:
                out = step(self.state, self.xs, self.cs, np.int32(i), self.keys.train, np.int32(t))
        if self.debug_nans:
            error, out = out
            if error.get():
                self._flush(epoch)  # the steps before it are kept
                _raise_first_nan(error, self.impl, t, epoch)
        self.state, metrics = out
        self.pending.append(metrics)
        self.t += 1
        if self.tracing and self.t == profile.last:
            profile.stop((self.state, metrics))
            self.tracing = False
        # Checked one step behind, so the device is never idle for it: a non-finite step
        # stops the run before the next one is even recorded.
        if len(self.pending) > 1 and not bool(self.pending[-2]["finite"]):
            self._flush(epoch)
        self.report.step(self.t, epoch, i, self.num_batches, metrics)

    def _flush(self, epoch: int) -> None:
        """Record the pending steps (after checking that their metrics are finite)."""
        t, impl = self.t, self.impl
        fetched = jax.device_get(self.pending)
        self.pending.clear()
        base = t - len(fetched)
        rates = optim.learning_rates(self.config.optim, np.arange(base + 1, t + 1))
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
            # the norm of the step's gradient, where the step can see it (RunDevices.epoch_step)
            seen = {"grad_norm": float(metrics["grad_norm"])} if "grad_norm" in metrics else {}
            self._record(
                {"event": "step", "step": base + j + 1, "epoch": epoch + 1, **values,
                 "learning_rate": rate, **seen}
            )  # fmt: skip
            self.done.append(tuple(values[name] for name in METRICS))

    def _epoch_end(self, epoch: int) -> TrainResult | None:
        """The epoch's record (train means, the test split evaluated if due), then the checkpoint
        at its end if due (always after the run's last epoch); the result if the run stops
        there."""
        self._flush(epoch)
        self._count_seconds()
        last = epoch == self.epochs - 1 or self.t >= self.limit
        self._epoch_record(epoch, test=last or (epoch + 1) % self.eval_every == 0)
        self.done = []
        save, stop = self.decide(self.t, True)
        if save or last:
            self._checkpoint(epoch + 1, 0)
            stop = stop or self.decide(self.t, True)[1]  # asked during the checkpoint
        if stop and not last:
            return self._stop(epoch + 1, 0)
        return None

    def _partial_end(self, epoch: int) -> None:
        """The run's end at ``max_steps``, inside epoch ``epoch``: the final checkpoint (there, with
        the epoch's steps so far, as a stop makes it), then the epoch's partial record (made after
        the checkpoint, so that a resume cuts it away and makes the epoch's whole record)."""
        self._flush(epoch)
        self._count_seconds()
        self._checkpoint(epoch, self.t - epoch * self.num_batches)
        self._epoch_record(epoch, test=True, partial=True)

    def _epoch_record(self, epoch: int, *, test: bool, partial: bool = False) -> None:
        """The record of epoch ``epoch``'s steps so far (train means; the test split's metrics if
        ``test``), then ``on_epoch`` and the line of the epoch."""
        done = self.done
        record: Record = {"event": "epoch", "epoch": epoch + 1, "step": self.t}
        record.update(
            {f"train_{n}": float(np.mean([m[k] for m in done])) for k, n in enumerate(METRICS)}
        )
        if test:
            metrics = evaluate(
                self.impl,
                self.devices.local_state(self.state),
                self.dataset.test,
                self.keys.eval,
                batch_size=self.eval_batch_size,
                loss=self.eval_loss,
            )
            record.update({f"test_{n}": v for n, v in metrics.items()})
        record["seconds"] = self.train_seconds
        if partial:
            record["partial"] = True
        self._record(record)
        if self.on_epoch is not None:
            self.on_epoch(self.devices.local_state(self.state), record)
        self.report.epoch(record, self.num_batches)

    def _record(self, event: Record) -> None:
        self.records.append(event)
        self.emit(event)

    def _count_seconds(self) -> None:
        """Count the training time since :attr:`tick` (the run's and this session's)."""
        seconds = time.perf_counter() - self.tick
        self.train_seconds += seconds
        self.session_seconds += seconds

    # --- a checkpoint, a stop, the end ------------------------------------------------------------

    def _now(self, epoch: int, batch: int) -> Progress:
        position = Position(self.t, epoch, batch)
        return Progress(position, tuple(self.done), len(self.records), self.train_seconds)

    def _checkpoint(self, epoch: int, batch: int) -> None:
        """``on_checkpoint`` with the single-device state, unless this step has one already."""
        if self.on_checkpoint is not None and self.saved_at != self.t:
            self.on_checkpoint(self.devices.local_state(self.state), self._now(epoch, batch))
            self.saved_at = self.t

    def _stop(self, epoch: int, batch: int) -> TrainResult:
        """Stopped on request, after a checkpoint: next is batch ``batch`` of epoch ``epoch``."""
        return self._result(self._now(epoch, batch), stopped=True)

    def _end(self) -> TrainResult:
        """Every epoch done, or ``max_steps`` reached (or nothing left to do)."""
        return self._result(self._now(*divmod(self.t, self.num_batches)))

    def _result(self, position: Progress, stopped: bool = False) -> TrainResult:
        steps = self.t - self.first.step
        rate = steps / self.session_seconds if self.session_seconds else 0.0
        state = self.devices.local_state(self.state)
        return TrainResult(
            state, self.records, self.compile_seconds, rate, position, stopped, steps=steps
        )
