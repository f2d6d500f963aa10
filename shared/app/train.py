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

:class:`Options` and :class:`Outcome` are the run's plain data
(:mod:`cvae_rosetta.app.run`), importable from here as above; training one implementation into
its run directory is :func:`cvae_rosetta.app.runner.train_into`, which ``cvae compare`` shares.

Errors name config fields (``train.data_parallel``) and :class:`Options` fields
(``checkpoint_every``); the CLI shows them as its flags.

Beside ``metrics.jsonl``, a run writes TensorBoard event files into ``RUN/tb/`` (scalars per step
and per epoch, sample and reconstruction grids per epoch; :mod:`cvae_rosetta.app.tensorboard`)
unless ``Options.tensorboard`` is false, and with ``Options.profile_steps`` ``"A:B"`` a
``jax.profiler`` trace of steps A to B into ``RUN/profile/``.

Run control: ``Options.max_steps`` ends the run after that many steps in all, as a finished run
(final checkpoint, pictures, summary, evaluation); ``config.json`` records it and a resume keeps
it unless given another. ``Options.eval_every`` evaluates the test split every so many epochs
(always after the last); ``Options.log_every`` prints a line every so many steps.

Faults a run survives (docs/checkpoints.md): SIGINT and SIGTERM are handled for the whole call,
start-up and final outputs included (the run stops at a checkpoint; :func:`exit_status` is 130 or
143); the run directory is locked for its one writer (:class:`~cvae_rosetta.app.runlock.RunLock`);
a write the disk refuses raises :class:`~cvae_rosetta.files.WriteFailed` naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app import (
    checkpoint,
    devices,
    evaluate,
    frameworks,
    resources,
    resuming,
    rundir,
    runlock,
    signals,
    trainstate,
)
from cvae_rosetta.app.cluster.membership import PROCESSES_KEY
from cvae_rosetta.app.data import Dataset, batches_per_epoch
from cvae_rosetta.app.optionchecks import check_run_control
from cvae_rosetta.app.run import Job, Options, Outcome, RunKeys
from cvae_rosetta.app.runner import Into, follow, train_into
from cvae_rosetta.app.trainer import counted
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

RUNS_DIR = Path("runs")  # where a command writes when given no directory (default_out)
MAX_STEPS = "max_steps"  # config.json's key of Options.max_steps, where it was given


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
    resources.check_steps(config.train.epochs, steps_per_epoch(config, dataset))
    # a schedule without decay_steps spans the whole run; config.json records the number
    optim = config.optim.for_run(total_steps(config, dataset))
    return config.replace(optim=optim), dataset


def steps_per_epoch(config: Config, dataset: Dataset) -> int:
    """Batches of one epoch (``data.remainder``: a partial last batch dropped or padded)."""
    return batches_per_epoch(len(dataset.train), config.data.batch_size, config.data.remainder)


def total_steps(config: Config, dataset: Dataset) -> int:
    """The steps of the whole run: ``train.epochs`` epochs."""
    return config.train.epochs * steps_per_epoch(config, dataset)


def last_step(config: Config, dataset: Dataset, max_steps: int | None) -> int:
    """The step a run ends at: its epochs' end, or ``max_steps`` where that comes first."""
    total = total_steps(config, dataset)
    return total if max_steps is None else min(total, max_steps)


def start_devices(config: Config, cluster: Any = None) -> None:
    """Arrange host devices (``train.devices`` on a CPU) and join a distributed run, before
    anything touches a JAX device."""
    if cluster is not None:
        others = cluster.num_processes - 1
        with signals.ends_at_once(
            f"joining the other {others} process{'es' if others != 1 else ''} of the run"
        ):
            cluster.start()
    elif config.train.devices > 1:
        devices.arrange_cpu_devices(config.train.devices)


def fresh_state(impl: Any, key: Any, config: Config) -> Any:
    """``impl.init(key, config)`` as one jitted program rather than an eager program per
    operation (about sixty): the compilation cache keeps it, so a second run starts sooner. The
    same bits as the eager call (checked for every implementation by the tests); an ``init`` that
    cannot be traced, which the protocol allows, runs eagerly."""
    import jax

    try:
        return jax.jit(impl.init, static_argnums=1)(key, config)
    except (jax.errors.JAXTypeError, TypeError):  # not traceable (or not arrays only): eagerly
        return impl.init(key, config)


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
    included: :func:`~cvae_rosetta.app.trainstate.check_checkpointable`) and the data, before
    anything is written.
    ``given``: config fields set on purpose (see :func:`fit_to_data`). ``cluster``: this process's
    place in a ``jax.distributed`` run (:class:`cvae_rosetta.app.cluster.membership.Cluster`);
    only process 0 writes.
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
        if cluster is not None:  # one folder for every process, before anything is written
            cluster.check_shared(Path(workdir))
        config, dataset = fit_to_data(config, given)
        profile = options.profile(Path(workdir))
        if profile is not None:
            profile.check(0, last_step(config, dataset, options.max_steps))
        keys = RunKeys.from_seed(config.train.seed)
        state = fresh_state(impl, keys.init, config)
        # a run that could not be checkpointed is refused before its first step and its first file
        trainstate.check_checkpointable(impl, state, config)
        job = Job(impl, config, dataset, keys)
        into = Into(Path(workdir), options, stop, cluster.agree if cluster is not None else None)
        if not writer:
            return follow(job, state, into)
        # under jax.distributed only process 0 writes, so only it holds the run directory's lock
        with rundir.claim_out_dir(out, overwrite=options.overwrite, command="train"), _in(out):
            with files.writing(rundir.CONFIG_FILE, out / rundir.CONFIG_FILE):
                limit = {} if options.max_steps is None else {MAX_STEPS: options.max_steps}
                if cluster is not None:  # the processes a resume goes on as
                    limit[PROCESSES_KEY] = cluster.num_processes
                rundir.save_config(out, config, command="train", impl=options.impl, **limit)
            return train_into(job, state, dataclasses.replace(into, out=out))


def resume(
    workdir: str | Path,
    options: Options | None = None,
    *,
    changes: Mapping[str, Any] | None = None,
    join: Any = None,
) -> Outcome:
    """Go on with the run in ``workdir`` from its latest checkpoint (bit for bit), with
    ``options.impl`` if given (any implementation: checkpoints are canonical) or the run's own.
    ``join``: this process's place in a run of several processes
    (:class:`cvae_rosetta.app.cluster.membership.Place`), which goes on as the same number of
    processes it was written by, each reading the checkpoint process 0 wrote; only process 0
    writes.

    ``changes``: config fields to change, as ``{"train.epochs": 60}``; only those of
    :data:`cvae_rosetta.app.resuming.RESUMABLE_CHANGES` may change, and any other change is
    refused naming every differing field. ``options.impl`` defaults to the run's own,
    ``options.max_steps`` to the one the run's ``config.json`` records (a given one is recorded
    instead); it may not be below the checkpoint's step.
    """
    options = options or Options(impl="")
    with signals.GracefulStop() as stop:
        opened = resuming.Resume.open(workdir, latest_good=options.latest_good)
        config = _changed(opened.config, changes or {}, what=f"the run in {opened.directory}")
        options = dataclasses.replace(options, impl=options.impl or opened.run["impl"])
        options.check(config)
        options = _kept_max_steps(opened, options)
        if join is not None and (done := _finished(opened, config, options)) is not None:
            return done  # every process alike, before any joins the others
        impl = frameworks.load(options.impl)
        cluster = None if join is None else join.resuming(opened.run, config, opened.directory)
        agree = cluster.agree if cluster is not None else None
        into = Into(opened.directory, options, stop, agree)
        given = set(changes or {})
        if cluster is not None and cluster.process_id:  # only process 0 locks and writes
            return _resume_locked(opened, impl, config, into, given, cluster)
        lock = runlock.RunLock.acquire(opened.directory, command="train --resume", field="resume")
        with lock, _in(opened.directory):
            if cluster is None and (done := _finished(opened, config, options)) is not None:
                return done  # under the lock: no other process is extending it
            return _resume_locked(opened, impl, config, into, given, cluster)


def _finished(opened: resuming.Resume, config: Config, options: Options) -> Outcome | None:
    """The outcome of resuming a run that is finished, every output written: nothing to train
    and nothing to rewrite (no ``result``); None where the resume has something to do."""
    summary = opened.finished(config, options.max_steps)
    if summary is None:
        return None
    return Outcome(opened.directory, opened.run["impl"], config.data.name, config, None, summary)


def _kept_max_steps(opened: resuming.Resume, options: Options) -> Options:
    """``options`` with the run's ``max_steps`` unless one is given, which the run then records
    (``config.json`` is written when the resume is ready to go on)."""
    if options.max_steps is not None:
        opened.run[MAX_STEPS] = options.max_steps
        return options
    stored = opened.run.get(MAX_STEPS)
    try:
        check_run_control(max_steps=stored)
    except ConfigError as err:
        raise ConfigError(f"{opened.directory / rundir.CONFIG_FILE}: {err}") from None
    return dataclasses.replace(options, max_steps=stored)


@contextlib.contextmanager
def _in(workdir: Path) -> Iterator[None]:
    """A :class:`~cvae_rosetta.files.WriteFailed` of the block, or a stop at once (a second
    Ctrl-C), names its run directory (``workdir``), for the line that says how to go on."""
    try:
        yield
    except (files.WriteFailed, KeyboardInterrupt) as err:
        err.workdir = workdir
        raise


def _resume_locked(
    opened: resuming.Resume,
    impl: Any,
    config: Config,
    into: Into,
    given: Collection[str],
    cluster: Any = None,
) -> Outcome:
    """Go on with ``opened`` (``config``: its own with the changes asked for, ``given`` naming
    them) as ``impl``, written into it as ``into`` says; every process of a run of several, each
    as its place in ``cluster`` makes it."""
    options = into.options
    start_devices(config, cluster)
    if cluster is not None:
        into.stop.install()  # again, after jax.distributed took SIGTERM
        cluster.check_shared(opened.directory)  # one run directory for every process
    opened.load()  # reads the checkpoint: JAX starts here, on the devices just arranged
    config, dataset = fit_to_data(config, given)
    done = opened.checkpoint.progress.position.step
    if options.max_steps is not None and options.max_steps < done:
        raise ConfigError(
            f"max_steps: expected at least {done} (the steps of the checkpoint the run goes on "
            f"from), got {options.max_steps}"
        )
    profile = options.profile(opened.directory)
    if profile is not None:
        profile.check(done, last_step(config, dataset, options.max_steps))
    records = opened.check(config, dataset)
    state = trainstate.implementation_state(impl, opened.checkpoint.state, config)
    trainstate.canonical_state(impl, state)  # and back, as its next checkpoint will: before writing
    progress = opened.checkpoint.progress
    job = Job(impl, config, dataset, opened.checkpoint.keys, progress, records)
    if cluster is not None and cluster.process_id:  # process 0 writes and says what happens
        return follow(job, state, into)
    if cluster is not None:  # config.json: the processes the run goes on as (none: one)
        opened.run[PROCESSES_KEY] = cluster.num_processes
    else:
        opened.run.pop(PROCESSES_KEY, None)
    for step, reason in opened.damaged:
        aside = opened.directory / resuming.DAMAGED_DIR
        print(
            f"warning: checkpoint {step} is damaged ({reason}); moved to {aside}", file=sys.stderr
        )
    with files.writing("the resumed run's config.json and metrics.jsonl", opened.directory):
        opened.prepare(records, config, impl.name)
    position = progress.position
    by = "" if impl.name == opened.checkpoint.impl else f" (written by {opened.checkpoint.impl})"
    print(f"{impl.name}: resuming {opened.directory} at {where(position)}{by}")
    if position.epoch >= config.train.epochs:
        print(
            f"  nothing left to train in {counted(config.train.epochs, 'epoch')} (more epochs "
            "extend it)"
        )
    elif options.max_steps is not None and position.step >= options.max_steps:
        print(
            f"  nothing left to train: the run ends at step {options.max_steps}, its step limit "
            "(a larger one goes on)"
        )
    return train_into(job, state, into)


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


def describe(outcome: Outcome) -> str:
    """The lines ``cvae train`` prints at the end of a finished run."""
    if outcome.result is None:
        return describe_finished(outcome)
    final, result, config = outcome.summary, outcome.result, outcome.config
    unit = " in nats" if config.loss.kind == "bernoulli" else ""
    k = outcome.evaluation.get("iw_samples", evaluate.DEFAULT_IW_SAMPLES)
    epochs, partial = config.train.epochs, bool(final.get("partial"))
    if partial or final["epoch"] < epochs:  # ended by max_steps
        place = f"{'in' if partial else 'after'} epoch {final['epoch']} of {epochs}"
        length = f"{counted(final['step'], 'step')}, ended by max_steps {place}"
    else:
        length = f"{counted(epochs, 'epoch')}, {counted(final['step'], 'step')}"
    speed = (
        f"{result.steps_per_second:.0f} steps/s"
        if result.steps
        else "nothing left to train (no step taken)"
    )
    train = config.train
    if train.data_parallel != "none":  # how it ran is part of what it did
        length += f", data-parallel ({train.data_parallel}) on {counted(train.devices, 'device')}"
    return "\n".join(
        [
            f"{outcome.impl} on {outcome.dataset}: {length}, {speed}, first compile "
            f"{result.compile_seconds:.2f} s",
            f"  loss = the training objective (recon + beta * kl, beta {config.loss.beta:g}, one "
            f"posterior sample per example{unit}), last epoch{' (partial)' if partial else ''}:",
            f"  train loss {final['train_loss']:.3f} (mean over the epoch's steps)   test loss "
            f"{final['test_loss']:.3f} (mean over the test split; recon {final['test_recon']:.3f},"
            f" kl {final['test_kl']:.3f})",
            f"  bounds on the test split's negative log-likelihood (Bernoulli, in nats; final "
            f"parameters; beta 1; {counted(k, 'posterior sample')} per example): -elbo = recon + kl"
            " averaged over the samples; -iwae = the importance-weighted bound, tighter",
            evaluate.describe(outcome.evaluation),
            f"  wrote {outcome.workdir}/: {' '.join(outcome.written)}",
        ]
    )


def describe_finished(outcome: Outcome) -> str:
    """What a resume of a finished run says: that it is finished, how to extend it, and that it
    wrote nothing."""
    final, config = outcome.summary, outcome.config
    epochs, step = config.train.epochs, final["step"]
    if final["epoch"] < epochs or final.get("partial"):
        length = f"ended by max_steps at step {step}, in epoch {final['epoch']} of {epochs}"
        extend = "a larger max_steps goes on"
    else:
        length = f"{counted(epochs, 'epoch')}, {counted(step, 'step')}"
        extend = f"train.epochs above {epochs} extends it"
    return (
        f"{outcome.impl}: {outcome.workdir} is finished: {length}, every output written after its "
        f"last step; nothing to train, nothing rewritten ({extend})"
    )


def describe_stop(outcome: Outcome, resume_command: Callable[[Path], str]) -> str:
    """The line for a run stopped by a signal: where it stopped and how to go on."""
    position = outcome.result.progress.position
    name = signal.Signals(outcome.stopped_by).name
    at = (
        where(position)
        if outcome.result.stopped
        else f"the last step, {position.step}, before its final outputs were all written"
    )
    return (
        f"{outcome.impl} stopped by {name} at {at}, checkpoint written; go on with: "
        f"{resume_command(outcome.workdir)}"
    )


def where(position: Any) -> str:
    """A run's position (a :class:`~cvae_rosetta.app.trainer.Position`) in the terms of its
    ``metrics.jsonl``, whose last epoch record is the last complete epoch: ``step 440 (the end of
    epoch 20)``, ``step 445 (5 batches into epoch 21, after epoch 20)``, ``step 0 (before epoch
    1)``."""
    step, epoch, batch = position.step, position.epoch, position.batch
    if batch:
        after = f", after epoch {epoch}" if epoch else ""
        return f"step {step} ({counted(batch, 'batch', 'batches')} into epoch {epoch + 1}{after})"
    return f"step {step} (the end of epoch {epoch})" if epoch else f"step {step} (before epoch 1)"


def describe_write_failure(err: files.WriteFailed, resume_command: Callable[[Path], str]) -> str:
    """The line for a run the disk stopped: which file, what it was, and how to go on."""
    line = f"could not write {err.path} ({err.what}): {err.reason}"
    return (
        f"{line}; {going_on(err.workdir, resume_command, 'once the disk can be written again, ')}"
    )


def going_on(workdir: Path | None, resume_command: Callable[[Path], str], when: str = "") -> str:
    """How to go on after a command stopped before its end, by what ``workdir`` (its run
    directory, None before one was claimed or for another command's output) holds."""
    if workdir is not None and checkpoint.has_checkpoints(workdir):
        return (
            f"the checkpoints written before it are intact; {when}go on with: "
            f"{resume_command(workdir)}"
        )
    again = f"{when}run the same command"
    if workdir is None:
        return f"{when}{files.RUN_AGAIN}"
    left = [p.name for p in Path(workdir).iterdir()] if Path(workdir).is_dir() else []
    if not [name for name in left if name != rundir.LOCK_FILE]:
        return f"no checkpoint was written and {workdir} is empty: {again}"
    if (Path(workdir) / rundir.CONFIG_FILE).is_file():
        return (
            f"no checkpoint was written, so --resume has nothing to go on from: {again} with "
            f"--overwrite (it replaces what this run wrote in {workdir})"
        )
    return (
        f"no checkpoint was written: remove {workdir} (it holds no run to resume or replace), "
        f"then {again}"
    )
