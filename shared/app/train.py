"""A whole run from Python: :func:`train_and_evaluate` and :func:`resume`.

``cvae train`` is these two calls and nothing else: the CLI parses its flags into a
:class:`~cvae_rosetta.spec.config.Config`, a work directory and :class:`Options`, and calls one of
them. Everything a run does lives here: the checks made before anything is written, the data set,
the devices, the checkpoints, the pictures, the final parameters and the evaluation::

    from cvae_rosetta.app.train import Options, train_and_evaluate
    from cvae_rosetta.spec.config import Config, TrainConfig

    outcome = train_and_evaluate(Config(train=TrainConfig(epochs=5)), "runs/nnx",
                                 Options(impl="flax_nnx"))
    print(outcome.summary["test_loss"], outcome.evaluation["neg_iwae"])

Errors name config fields (``train.data_parallel``) and :class:`Options` fields
(``checkpoint_every``); the CLI shows them as its flags.

Beside ``metrics.jsonl``, a run writes TensorBoard event files into ``RUN/tb/`` (scalars per step
and per epoch, sample and reconstruction grids per epoch; :mod:`cvae_rosetta.app.tensorboard`)
unless ``Options.tensorboard`` is false, and with ``Options.profile_steps`` ``"A:B"`` a
``jax.profiler`` trace of steps A to B into ``RUN/profile/``.

Faults a run survives (docs/checkpoints.md): SIGINT and SIGTERM are handled for the whole call,
start-up and final outputs included (the run stops at a checkpoint; :func:`exit_status` is 130 or
143); the run directory is locked for its one writer (:class:`~cvae_rosetta.app.rundir.RunLock`);
a write the disk refuses raises :class:`~cvae_rosetta.files.WriteFailed` naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app import (
    checkpoint,
    evaluate,
    frameworks,
    images,
    parallel,
    resuming,
    rundir,
    signals,
)
from cvae_rosetta.app.data import Dataset, batches_per_epoch
from cvae_rosetta.app.trainer import (
    ProfileSteps,
    RunKeys,
    TrainResult,
    check_debug_nans,
    train,
)
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

TB_DIR = "tb"  # the TensorBoard event files (cvae_rosetta.app.tensorboard)
PROFILE_DIR = "profile"  # the jax.profiler trace of Options.profile_steps, in the run directory
STOPPED = 128 + signal.SIGINT  # 130: the exit status of a run stopped by Ctrl-C, checkpointed
TERMINATED = 128 + signal.SIGTERM  # 143: the same for SIGTERM (a scheduler's preemption)
RUNS_DIR = Path("runs")  # where a command writes when given no directory (default_out)


@dataclass(frozen=True)
class Options:
    """How a run is carried out, beside what it computes (the :class:`Config`)."""

    impl: str = "pure_jax"  # a built-in name or "module:attribute"
    checkpoint_every: int = checkpoint.DEFAULT_EVERY  # steps between checkpoints; 0: at the end
    checkpoint_every_seconds: float = 0.0  # seconds between checkpoints too; 0: steps only
    keep_checkpoints: int = checkpoint.DEFAULT_KEEP
    iw_samples: int = evaluate.DEFAULT_IW_SAMPLES  # of the importance-weighted bound
    debug_nans: bool = False  # every step under checkify (serial runs only)
    progress: bool = True  # a progress bar
    overwrite: bool = False  # replace a previous run directory (one with a config.json)
    latest_good: bool = False  # resume: skip damaged newest checkpoints
    tensorboard: bool = True  # TensorBoard event files in RUN/tb/
    profile_steps: str | tuple[int, int] | None = None  # "A:B": trace steps A..B into RUN/profile/

    def check(self, config: Config) -> Options:
        """Refuse bad options before anything is read or written."""
        checkpoint.check_options(
            self.checkpoint_every, self.keep_checkpoints, self.checkpoint_every_seconds
        )
        evaluate.check_iw_samples(self.iw_samples)
        check_debug_nans(self.debug_nans, config)
        if not isinstance(self.tensorboard, bool):
            raise ConfigError(f"tensorboard: expected True or False, got {self.tensorboard!r}")
        self.profile(Path("."))
        return self

    def profile(self, workdir: Path) -> ProfileSteps | None:
        """The steps to trace into ``workdir``'s profile directory, if any."""
        return ProfileSteps.parse(self.profile_steps, Path(workdir) / PROFILE_DIR)


@dataclass
class Outcome:
    """What a run did: where, with which implementation, its final figures and files."""

    workdir: Path
    impl: str
    dataset: str
    config: Config
    result: TrainResult
    summary: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    stopped_by: int = 0  # the signal that stopped the run (a checkpoint was written), 0 if none

    @property
    def stopped(self) -> bool:
        """Stopped by a signal, in training or in its final outputs (a checkpoint was written)."""
        return bool(self.stopped_by)


def default_out(name: str) -> Path:
    """Where a command writes when given no directory: ``runs/NAME-YYYYmmdd-HHMMSS`` (``NAME``:
    an implementation's short name, ``compare`` or ``bench``)."""
    return RUNS_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def default_workdir(impl: str) -> Path:
    """The run directory of :func:`train_and_evaluate` when given none: :func:`default_out` of the
    implementation ``impl`` names (a short name or ``module:attribute``, loaded for its name)."""
    return default_out(frameworks.load(impl).name)


def exit_status(outcome: Outcome) -> int:
    """0 for a finished run; 128 + the signal for a stopped one (130 SIGINT, 143 SIGTERM)."""
    return 128 + outcome.stopped_by if outcome.stopped else 0


def fit_to_data(config: Config, given: Collection[str] = ()) -> tuple[Config, Dataset]:
    """Load the data set and fit the model's input and label counts to it. A field named in
    ``given`` (``model.input_dim``, ``model.num_classes``) was set on purpose and must match."""
    from cvae_rosetta.app import data

    dataset = data.load(config.data)
    model = config.model
    for name, actual, what in (
        ("input_dim", dataset.input_dim, "features"),
        ("num_classes", dataset.num_classes, "classes"),
    ):
        if f"model.{name}" in given and getattr(model, name) != actual:
            raise ConfigError(
                f"model.{name}: expected {actual} (the {what} of {dataset.name}), "
                f"got {getattr(model, name)}"
            )
    config = config.replace(
        model=model.replace(input_dim=dataset.input_dim, num_classes=dataset.num_classes)
    )
    data.check_batch_size(dataset, config.data.batch_size)
    # a schedule without decay_steps spans the whole run; config.json records the number
    optim = config.optim.for_run(total_steps(config, dataset))
    return config.replace(optim=optim), dataset


def steps_per_epoch(config: Config, dataset: Dataset) -> int:
    """Batches of one epoch (``data.remainder``: a partial last batch dropped or padded)."""
    return batches_per_epoch(len(dataset.train), config.data.batch_size, config.data.remainder)


def total_steps(config: Config, dataset: Dataset) -> int:
    """The steps of the whole run: ``train.epochs`` epochs."""
    return config.train.epochs * steps_per_epoch(config, dataset)


def start_devices(config: Config, cluster: Any = None) -> None:
    """Arrange host devices (``train.devices`` on a CPU) and join a distributed run, before
    anything touches a JAX device."""
    if cluster is not None:
        cluster.start()
    elif config.train.devices > 1:
        parallel.arrange_cpu_devices(config.train.devices)


def train_and_evaluate(
    config: Config,
    workdir: str | Path,
    options: Options = Options(),
    *,
    given: Collection[str] = (),
    cluster: Any = None,
) -> Outcome:
    """Train ``options.impl`` on ``config`` into the new run directory ``workdir``, then write its
    pictures, parameters, summary and evaluation.

    ``workdir`` must not exist or be empty (or be a previous run with ``options.overwrite``);
    it is checked, like the options, the implementation (that its train state can be checkpointed
    included: :func:`~cvae_rosetta.app.checkpoint.check_checkpointable`) and the data, before
    anything is written.
    ``given``: config fields set on purpose (see :func:`fit_to_data`). ``cluster``: this process's
    place in a ``jax.distributed`` run (:class:`cvae_rosetta.app.distributed.Cluster`); only
    process 0 writes.
    """
    options.check(config)
    if cluster is not None:
        config = cluster.config
    impl = frameworks.load(options.impl)
    writer = cluster is None or cluster.process_id == 0  # the one process that writes outputs
    out = rundir.check_out_dir(workdir, overwrite=options.overwrite) if writer else None
    with signals.GracefulStop() as stop:  # start-up included: it stops at the first step
        start_devices(config, cluster)
        stop.install()  # again, after jax.distributed took SIGTERM
        config, dataset = fit_to_data(config, given)
        profile = options.profile(Path(workdir))
        if profile is not None:
            profile.check(0, total_steps(config, dataset))
        keys = RunKeys.from_seed(config.train.seed)
        state = impl.init(keys.init, config)
        # a run that could not be checkpointed is refused before its first step and its first file
        checkpoint.check_checkpointable(impl, state, config)
        agree = cluster.agree if cluster is not None else None
        if not writer:
            cadence = _cadence(options, stop, agree)
            result = train(impl, state, config, dataset, keys, progress=False, decide=cadence)
            outcome = Outcome(Path(workdir), impl.name, dataset.name, config, result)
            outcome.stopped_by = cadence.stopped_by if result.stopped else 0
            return outcome
        # under jax.distributed only process 0 writes, so only it holds the run directory's lock
        with rundir.claim_out_dir(out, overwrite=options.overwrite, command="train"), _in(out):
            with files.writing(rundir.CONFIG_FILE, out / rundir.CONFIG_FILE):
                rundir.save_config(out, config, command="train", impl=options.impl)
            return _train_into(
                out, impl, state, config, dataset, keys, options, stop=stop, agree=agree
            )


def resume(
    workdir: str | Path,
    options: Options | None = None,
    *,
    changes: Mapping[str, Any] | None = None,
) -> Outcome:
    """Go on with the run in ``workdir`` from its latest checkpoint (bit for bit), with
    ``options.impl`` if given (any implementation: checkpoints are canonical) or the run's own.

    ``changes``: config fields to change, as ``{"train.epochs": 60}``; only ``train.epochs``,
    ``train.data_parallel``, ``train.devices`` and ``data.data_dir`` may change, and any other
    change is refused naming every differing field. ``options.impl`` defaults to the run's own.
    """
    options = options or Options(impl="")
    with signals.GracefulStop() as stop:
        opened = resuming.Resume.open(workdir, latest_good=options.latest_good)
        config = _changed(opened.config, changes or {}, what=f"the run in {opened.directory}")
        options = dataclasses.replace(options, impl=options.impl or opened.run["impl"])
        options.check(config)
        impl = frameworks.load(options.impl)
        lock = rundir.RunLock.acquire(opened.directory, command="train --resume", field="resume")
        with lock, _in(opened.directory):
            return _resume_locked(opened, impl, config, options, changes or {}, stop)


@contextlib.contextmanager
def _in(workdir: Path) -> Iterator[None]:
    """A :class:`~cvae_rosetta.files.WriteFailed` of the block names its run directory."""
    try:
        yield
    except files.WriteFailed as err:
        err.workdir = workdir
        raise


def _resume_locked(
    opened: resuming.Resume,
    impl: Any,
    config: Config,
    options: Options,
    changes: Mapping[str, Any],
    stop: signals.GracefulStop,
) -> Outcome:
    start_devices(config)
    opened.load()  # reads the checkpoint: JAX starts here, on the devices just arranged
    config, dataset = fit_to_data(config, set(changes))
    profile = options.profile(opened.directory)
    if profile is not None:
        profile.check(opened.checkpoint.progress.position.step, total_steps(config, dataset))
    records = opened.check(config, dataset)
    state = checkpoint.implementation_state(impl, opened.checkpoint.state, config)
    checkpoint.canonical_state(impl, state)  # and back, as its next checkpoint will: before writing
    for step, reason in opened.damaged:
        aside = opened.directory / resuming.DAMAGED_DIR
        print(
            f"warning: checkpoint {step} is damaged ({reason}); moved to {aside}", file=sys.stderr
        )
    with files.writing("the resumed run's config.json and metrics.jsonl", opened.directory):
        opened.prepare(records, config, impl.name)
    progress = opened.checkpoint.progress
    position = progress.position
    by = "" if impl.name == opened.checkpoint.impl else f" (written by {opened.checkpoint.impl})"
    print(
        f"{impl.name}: resuming {opened.directory} at step {position.step} (epoch "
        f"{position.epoch + 1}, batch {position.batch}){by}"
    )
    if position.epoch >= config.train.epochs:
        print(f"  nothing left to train in {config.train.epochs} epochs (train.epochs extends it)")
    return _train_into(
        opened.directory,
        impl,
        state,
        config,
        dataset,
        opened.checkpoint.keys,
        options,
        stop=stop,
        start=progress,
        history=records,
    )


def _changed(stored: Config, changes: Mapping[str, Any], *, what: str) -> Config:
    """``stored`` with ``changes`` (``section.field -> value``) applied; a change the checkpoint
    cannot follow (the model, the loss, the optimiser, the data) is refused."""
    data = stored.to_dict()
    for name, value in changes.items():
        section, _, key = name.partition(".")
        if section not in data or key not in data[section]:
            raise ConfigError(f"changes: expected config fields like 'train.epochs', got {name!r}")
        data[section][key] = list(value) if isinstance(value, tuple) else value
    config = Config.from_dict(data)
    resuming.refuse_config_changes(stored, config, what=what)
    return config


def _cadence(options: Options, stop: signals.GracefulStop, agree: Any) -> signals.Cadence:
    return signals.Cadence(
        options.checkpoint_every, options.checkpoint_every_seconds, stop=stop, agree=agree
    )


def _train_into(
    out: Path,
    impl: Any,
    state: Any,
    config: Config,
    dataset: Dataset,
    keys: RunKeys,
    options: Options,
    *,
    stop: signals.GracefulStop,
    agree: Any = None,
    start: Any = None,
    history: Any = (),
) -> Outcome:
    """Train with metrics and checkpoints written as it goes; then, unless stopped, the final
    pictures, parameters, summary and evaluation (a signal interrupts those at once: training is
    done and checkpointed, and ``--resume`` writes them)."""
    log = rundir.MetricsLog(out / rundir.METRICS_FILE)
    board = None
    if options.tensorboard:
        from cvae_rosetta.app.tensorboard import TensorBoardLog

        board = TensorBoardLog(out / TB_DIR, impl, dataset, keys, history=history)
    saver = checkpoint.Saver(out, impl, config, keys, dataset, keep=options.keep_checkpoints)
    cadence = _cadence(options, stop, agree)

    def on_record(record: dict[str, Any]) -> None:
        log(record)
        if board is not None:
            board(record)

    try:
        result = train(
            impl,
            state,
            config,
            dataset,
            keys,
            on_record=on_record,
            progress=options.progress,
            desc=impl.name,
            start=start,
            history=history,
            on_checkpoint=saver,
            decide=cadence,
            debug_nans=options.debug_nans,
            on_epoch=board.pictures if board is not None else None,
            profile=options.profile(out),
        )
    finally:
        log.close()
        saver.close()
        if board is not None:
            board.close()
    outcome = Outcome(out, impl.name, dataset.name, config, result)
    if result.stopped:
        outcome.stopped_by = cadence.stopped_by
        return outcome
    try:
        with stop.immediately():
            _write_outputs(outcome, impl, dataset, keys, options)
    except signals.Stopped as stopped:
        outcome.stopped_by = stopped.signum
    return outcome


def _write_outputs(
    outcome: Outcome, impl: Any, dataset: Dataset, keys: RunKeys, options: Options
) -> None:
    """The pictures, curves, summary, final parameters and evaluation of a finished run."""
    out, result, config = outcome.workdir, outcome.result, outcome.config
    with files.writing("the pictures", out):
        rundir.write_pictures(out, impl, result.state, dataset, keys, title=impl.name)
        images.metric_panels(
            {impl.name: rundir.curves_of(result.records)},
            out / rundir.CURVES_FILE,
            title=f"{impl.name} on {dataset.name}",
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
        rundir.save_params(out / evaluate.PARAMS_FILE, impl.to_canonical(result.state))
    with files.writing("the evaluation", out):
        outcome.evaluation = evaluate.evaluate(
            impl, result.state, dataset, config.train.seed, iw_samples=options.iw_samples, out=out
        )
        files.write_json(out / evaluate.EVALUATION_FILE, {"impl": impl.name, **outcome.evaluation})
    outcome.written = [*rundir.RUN_FILES, *rundir.EVALUATION_FILES]
    outcome.written += [f"{d}/" for d in (TB_DIR, PROFILE_DIR) if (out / d).is_dir()]


def describe(outcome: Outcome) -> str:
    """The lines ``cvae train`` prints at the end of a finished run."""
    final, result, config = outcome.summary, outcome.result, outcome.config
    unit = " in nats" if config.loss.kind == "bernoulli" else ""
    k = outcome.evaluation.get("iw_samples", evaluate.DEFAULT_IW_SAMPLES)
    return "\n".join(
        [
            f"{outcome.impl} on {outcome.dataset}: {config.train.epochs} epochs, "
            f"{final['step']} steps, {result.steps_per_second:.0f} steps/s, first compile "
            f"{result.compile_seconds:.2f} s",
            f"  loss = the training objective (recon + beta * kl, beta {config.loss.beta:g}, one "
            f"posterior sample per example{unit}), last epoch:",
            f"  train loss {final['train_loss']:.3f} (mean over the epoch's steps)   test loss "
            f"{final['test_loss']:.3f} (mean over the test split; recon {final['test_recon']:.3f},"
            f" kl {final['test_kl']:.3f})",
            f"  bounds on the test split's negative log-likelihood (Bernoulli, in nats; final "
            f"parameters; beta 1; {k} posterior samples per example): -elbo = recon + kl averaged"
            f" over the samples; -iwae = the importance-weighted bound, tighter",
            evaluate.describe(outcome.evaluation),
            f"  wrote {outcome.workdir}/: {' '.join(outcome.written)}",
        ]
    )


def describe_stop(outcome: Outcome, resume_command: Callable[[Path], str]) -> str:
    """The line for a run stopped by a signal: where it stopped and how to go on."""
    position = outcome.result.progress.position
    name = signal.Signals(outcome.stopped_by).name
    where = (
        f"step {position.step} (epoch {position.epoch + 1}, batch {position.batch})"
        if outcome.result.stopped
        else f"the last step, {position.step}, before its final outputs were all written"
    )
    return (
        f"{outcome.impl} stopped by {name} at {where}, checkpoint written; go on with: "
        f"{resume_command(outcome.workdir)}"
    )


def describe_write_failure(err: files.WriteFailed, resume_command: Callable[[Path], str]) -> str:
    """The line for a run the disk stopped: which file, what it was, and how to go on."""
    line = f"could not write {err.path} ({err.what}): {err.reason}"
    if err.workdir is not None and checkpoint.has_checkpoints(err.workdir):
        return (
            f"{line}; the checkpoints written before it are intact; once the disk can be written "
            f"again, go on with: {resume_command(err.workdir)}"
        )
    return f"{line}; no checkpoint was written: start the run again once the disk can be written"
