"""One implementation trained into one run directory: what `cvae train` and `cvae compare` share.

:func:`train_into` trains a :class:`~cvae_rosetta.app.run.Job` with its metrics (``metrics.jsonl``),
checkpoints and, where asked, TensorBoard event files written as it goes; then, unless a signal
stopped it, what a finished run leaves beside its checkpoints (:attr:`Into.finish`:
:func:`write_outputs` for ``cvae train``, a row of the table for ``cvae compare``). A signal during
those final outputs interrupts them at once: training is done and checkpointed, and a resume
writes them. :func:`follow` is a process of a run of several other than process 0: the same steps
and the same agreed decisions, writing nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app import (
    charts,
    checkpoint,
    evaluate,
    metricslog,
    paramsfile,
    rundir,
    runpictures,
    signals,
)
from cvae_rosetta.app.run import Callbacks, Control, Job, Options, Outcome, Record
from cvae_rosetta.app.trainer import train


def write_outputs(outcome: Outcome, job: Job, options: Options) -> None:
    """The pictures, curves, summary, final parameters and evaluation of a finished run."""
    out, result, config = outcome.workdir, outcome.result, outcome.config
    impl, dataset, keys = job.impl, job.dataset, job.keys
    with files.writing("the pictures", out):
        runpictures.write_pictures(out, impl, result.state, dataset, keys, title=impl.name)
        charts.metric_panels(
            {impl.name: metricslog.curves_of([r for r in result.records if evaluated(r)])},
            out / rundir.CURVES_FILE,
            title=f"{runpictures.run_title(out, impl.name, result.records)} on {dataset.name}",
        )
    outcome.summary = {
        "impl": impl.name,
        **result.final(),
        "compile_seconds": result.compile_seconds,
        "steps_per_second": result.steps_per_second,
    }
    with files.writing("the summary", out / rundir.SUMMARY_FILE):
        files.write_json(out / rundir.SUMMARY_FILE, outcome.summary)
    with files.writing("the final parameters", out / evaluate.PARAMS_FILE):
        paramsfile.save_params(out / evaluate.PARAMS_FILE, impl.to_canonical(result.state))
    with files.writing("the evaluation", out):
        setup = evaluate.EvalSetup(config.train.seed, options.iw_samples)
        outcome.evaluation = evaluate.evaluate(impl, result.state, dataset, setup, out=out)
        files.write_json(out / evaluate.EVALUATION_FILE, {"impl": impl.name, **outcome.evaluation})
    outcome.written = [*rundir.RUN_FILES, *rundir.EVALUATION_FILES]
    outcome.written += [f"{d}/" for d in (rundir.TB_DIR, rundir.PROFILE_DIR) if (out / d).is_dir()]


@dataclass(frozen=True)
class Into:
    """Where and how one implementation's run is written: its directory ``out``, the run's
    ``options``, the signals the caller took (``stop``) and, in a run of several processes, how
    they agree on checkpoints and stops (``agree``:
    :meth:`cvae_rosetta.app.cluster.membership.Cluster.agree`); ``finish(outcome, job, options)``
    writes what a finished run leaves beside its checkpoints."""

    out: Path
    options: Options
    stop: signals.GracefulStop
    agree: Callable[..., tuple[int, ...]] | None = None
    finish: Callable[[Outcome, Job, Options], None] = write_outputs

    def cadence(self) -> signals.Cadence:
        """When the run writes a checkpoint and when it stops (a signal, agreed)."""
        options = self.options
        return signals.Cadence(
            options.checkpoint_every, options.checkpoint_every_seconds, self.stop, self.agree
        )


def evaluated(record: Record) -> bool:
    """A step record, or an epoch record with the test split's metrics (``eval_every``)."""
    return record["event"] != "epoch" or "test_loss" in record


def train_into(job: Job, state: Any, into: Into) -> Outcome:
    """Train with metrics and checkpoints written into ``into.out`` as it goes; then, unless
    stopped, ``into.finish`` (a signal interrupts it at once: training is done and checkpointed,
    and a resume writes it)."""
    out, options = into.out, into.options
    impl, dataset, keys = job.impl, job.dataset, job.keys
    log = metricslog.MetricsLog(out / rundir.METRICS_FILE)
    board = None
    if options.tensorboard:
        from cvae_rosetta.app.tensorboard import TensorBoardLog

        board = TensorBoardLog(out / rundir.TB_DIR, impl, dataset, keys, history=job.history)
    saver = checkpoint.Saver(out, impl, job.config, keys, dataset, keep=options.keep_checkpoints)
    cadence = into.cadence()

    def on_record(record: Record) -> None:
        log(record)
        if board is not None and evaluated(record):  # its epoch scalars need the test metrics
            board(record)

    on_epoch = board.pictures if board is not None else None
    with files.closed_after(log, saver, board):
        result = train(
            job, state, options.control(out, cadence), Callbacks(on_record, saver, on_epoch)
        )
    outcome = Outcome(out, job.label, dataset.name, job.config, result, records=result.records)
    if result.stopped:
        outcome.stopped_by = cadence.stopped_by
        return outcome
    try:
        with into.stop.immediately():
            into.finish(outcome, job, options)
    except signals.Stopped as stopped:
        outcome.stopped_by = stopped.signum
    return outcome


def follow(job: Job, state: Any, into: Into) -> Outcome:
    """A process of a run of several other than process 0: the same steps and the same agreed
    decisions as process 0 (which writes every output into ``into.out`` and says what happens),
    writing nothing."""
    cadence = into.cadence()
    options = into.options
    control = Control(
        decide=cadence, max_steps=options.max_steps, eval_every=options.eval_every, progress=False
    )
    result = train(job, state, control)
    outcome = Outcome(into.out, job.impl.name, job.dataset.name, job.config, result)
    outcome.stopped_by = cadence.stopped_by if result.stopped else 0
    return outcome
