"""``cvae compare``: every implementation trained side by side from one canonical initialisation.

The initial parameters are drawn once (by the reference implementation, from the run's init key)
and handed to each implementation through ``from_canonical``; every implementation then sees the
same batches in the same order and the same step keys. Whatever differs at the end is the
frameworks' arithmetic, which the table reports as the largest parameter difference from the
reference.

SIGINT and SIGTERM stop a comparison with :class:`Stopped` (the implementation training stops once
a checkpoint is written; one whose final outputs are being written has its final checkpoint);
:func:`resume` finishes it, keeping the implementations that have their row (``summary.json`` in
their folder), so that its table equals an uninterrupted comparison's but for the timings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import shutil
import signal
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app import (
    charts,
    checkpoint,
    evaluate,
    frameworks,
    images,
    markdown,
    resuming,
    rundir,
    signals,
    trainstate,
)
from cvae_rosetta.app.data import Dataset
from cvae_rosetta.app.metricslog import curves_of, read_metrics
from cvae_rosetta.app.optionchecks import check_iw_samples
from cvae_rosetta.app.paramsfile import flatten_params, load_params, save_params
from cvae_rosetta.app.run import (
    DEFAULT_IW_SAMPLES,
    Job,
    Options,
    Outcome,
    RunKeys,
)
from cvae_rosetta.app.rundir import METRICS_FILE, save_config
from cvae_rosetta.app.runlock import RunLock
from cvae_rosetta.app.runner import Into, train_into
from cvae_rosetta.app.runpictures import write_pictures
from cvae_rosetta.spec import canonical, protocol
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import CheckpointError, ConfigError

REFERENCE = "pure_jax"
ROW_FILE = rundir.SUMMARY_FILE  # in each implementation's folder: its row, written last

COLUMNS = [
    ("impl", "impl", "{}"),
    ("train_loss", "train loss", "{:.3f}"),
    ("test_loss", "test loss", "{:.3f}"),
    ("test_recon", "test recon", "{:.3f}"),
    ("test_kl", "test kl", "{:.3f}"),
    ("neg_iwae", "test -iwae", "{:.3f}"),
    ("active", "active", "{}"),  # active latent units out of the latent size, "2/32"
    ("gen_accuracy", "gen acc", "{:.3f}"),
    ("diversity", "diversity", "{:.2f}"),
    ("steps_per_second", "steps/s", "{:.0f}"),
    ("compile_seconds", "compile s", "{:.2f}"),
    ("max_param_diff", "max |dparam|", "{:.2e}"),
]


def labels(impls: Sequence[Any], specs: Sequence[str]) -> list[str]:
    """Each implementation's row and folder name: its ``name`` (the spec it was given when it has
    none), with what a folder name cannot hold replaced by ``_``; a name taken by an earlier
    entry gets ``-2``, ``-3``, ... (two entries that share a name are both run and both shown)."""
    taken: list[str] = []
    for impl, spec in zip(impls, specs, strict=True):
        name = getattr(impl, "name", None)
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", name if isinstance(name, str) and name else spec)
        base = base if base.strip(".") else "impl"
        label, n = base, 1
        while label in taken:
            n += 1
            label = f"{base}-{n}"
        taken.append(label)
    return taken


def installed_names() -> list[str]:
    return [info.name for info in protocol.known() if info.installed]


def compare(
    config: Config,
    workdir: str | Path,
    names: Sequence[str] | None = None,
    options: Options = Options(),
    *,
    given: Collection[str] = (),
) -> tuple[list[dict[str, Any]], Dataset, Path]:
    """A whole ``cvae compare``: every implementation in ``names`` (default: every installed one)
    trained from the same start into ``workdir``; the rows of the table, the data set, the path.
    ``options``: ``iw_samples``, ``progress`` and ``overwrite`` (of ``workdir``); each
    implementation's run has a checkpoint at its end only, and no TensorBoard files.

    Everything (the names, the reference, the data, ``workdir``) is checked before anything is
    written; ``given`` as in :func:`cvae_rosetta.app.train.fit_to_data`.
    """
    from cvae_rosetta.app.train import fit_to_data, start_devices

    check_iw_samples(options.iw_samples)
    names = list(installed_names() if names is None else names)
    if not names:
        raise ConfigError("impls: expected at least one implementation name, got none")
    for name in [*names, REFERENCE]:
        frameworks.load(name)
    with signals.GracefulStop() as stop:  # start-up included: it stops before the first one
        start_devices(config)
        config, dataset = fit_to_data(config, given)
        out = rundir.check_out_dir(workdir, overwrite=options.overwrite)
        rundir.make_out_dir(out, overwrite=options.overwrite)
        comparison = Comparison(names, config, dataset, out, _each(options))
        rows = run(comparison, stop)
    return rows, dataset, out


def _each(options: Options) -> Options:
    """How each implementation's run in a comparison is carried out: as ``options`` say for
    ``iw_samples`` and ``progress``; one checkpoint, at its end (or at a stop); no TensorBoard."""
    return Options(
        checkpoint_every=0,
        keep_checkpoints=1,
        iw_samples=options.iw_samples,
        progress=options.progress,
        tensorboard=False,
    )


@dataclasses.dataclass(frozen=True)
class Comparison:
    """A comparison about to run: the implementations as given (``names``), the config and data
    set they all train on, its directory ``out``, how each implementation's run is carried out
    (``options``) and whether it goes on from a stop (``resume``)."""

    names: list[str]
    config: Config
    dataset: Dataset
    out: Path
    options: Options
    resume: bool = False


class Stopped(KeyboardInterrupt):
    """A comparison stopped by a signal: what finished, what was stopped (and at which step its
    checkpoint is), and how to go on (``cvae compare --resume DIR``)."""

    def __init__(
        self, signum: int, out: Path, finished: list[str], stopped: str | None, at: str, left: list
    ) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.out, self.finished, self.stopped = signum, out, finished, stopped
        self.at, self.left = at, left

    def describe(self) -> str:
        """The one line ``cvae compare`` prints when stopped."""
        name = signal.Signals(self.signum).name
        parts = [f"finished: {', '.join(self.finished) or 'none'}"]
        if self.stopped is not None:
            parts.append(f"{self.stopped} stopped at {self.at}")
        if self.left:
            parts.append(f"not started: {', '.join(self.left)}")
        return (
            f"compare stopped by {name} ({'; '.join(parts)}); go on with: "
            f"cvae compare --resume {self.out}"
        )


def resume(
    workdir: str | Path, *, progress: bool = True
) -> tuple[list[dict[str, Any]] | None, Dataset | None, Path, Config]:
    """Finish the comparison in ``workdir`` that a signal stopped: each implementation without its
    row goes on from its checkpoint (bit for bit) or starts from the shared initial parameters;
    then the combined outputs. The config, the implementations and ``iw_samples`` are the
    comparison's own (its ``config.json``). ``None`` rows: it was complete, nothing was changed."""
    from cvae_rosetta.app.train import fit_to_data, start_devices

    out, record, config = read_comparison(workdir)
    if (out / "summary.json").is_file():
        return None, None, out, config
    names = list(record["impls"])
    for name in [*names, REFERENCE]:
        frameworks.load(name)
    iw_samples = record.get("iw_samples", DEFAULT_IW_SAMPLES)
    lock = RunLock.acquire(out, command="compare --resume", field="resume")
    with lock, signals.GracefulStop() as stop:
        start_devices(config)
        config, dataset = fit_to_data(config)
        options = _each(Options(iw_samples=iw_samples, progress=progress))
        rows = run(Comparison(names, config, dataset, out, options, resume=True), stop)
    return rows, dataset, out, config


def read_comparison(workdir: str | Path) -> tuple[Path, dict[str, Any], Config]:
    """A ``cvae compare`` directory: its path, its ``config.json`` and its config."""
    path = Path(workdir).expanduser()
    marker = path / rundir.CONFIG_FILE
    try:
        record = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        got = "no config.json" if isinstance(err, FileNotFoundError) else type(err).__name__
        raise CheckpointError(
            f"resume: expected a cvae compare directory holding config.json, got {path} ({got})"
        ) from None
    impls = record.get("impls") if isinstance(record, dict) else None
    if not isinstance(impls, list) or record.get("command") != "compare" or "config" not in record:
        raise CheckpointError(
            f"resume: expected a cvae compare directory (its config.json naming its "
            f"implementations), got {path} (for a cvae train run: cvae train --resume)"
        )
    return path, record, resuming.stored_config(record, marker)


def run(comparison: Comparison, stop: signals.GracefulStop | None = None) -> list[dict[str, Any]]:
    """Train each implementation of ``comparison`` into ``out/<its name>/`` (see :func:`labels`);
    write the combined outputs.

    Each folder is a run of its own (``config.json`` naming the implementation as it was given,
    a checkpoint at its end, ``params.npz``), evaluated with one shared classifier into its
    ``evaluation.json``; its row (``summary.json``) is written last. The table shows the
    evaluation's headline figures, a row per implementation by its name.

    SIGINT and SIGTERM stop it with :class:`Stopped` (a training implementation once its
    checkpoint is written); ``comparison.resume``: keep the folders that hold their row, go on
    from the checkpoint of those that have one, start the others afresh. ``stop``: the caller's,
    if it took the signals already.
    """
    names, config, dataset, out = (
        comparison.names,
        comparison.config,
        comparison.dataset,
        (comparison.out),
    )
    loaded = [frameworks.load(spec) for spec in names]  # every name resolves before any work
    impls = dict(zip(labels(loaded, names), zip(names, loaded, strict=True), strict=True))
    with contextlib.nullcontext(stop) if stop is not None else signals.GracefulStop() as stop:
        keys = RunKeys.from_seed(config.train.seed)
        reference = frameworks.load(REFERENCE)
        initial = reference.to_canonical(reference.init(keys.init, config))
        if not comparison.resume:
            save_config(
                out, config, command="compare", impls=names, folders=list(impls),
                iw_samples=comparison.options.iw_samples,
            )  # fmt: skip
        classifier = evaluate.fit_classifier(dataset)

        outcomes: list[Outcome] = []
        for name, (spec, impl) in impls.items():
            run_dir = out / name
            if comparison.resume and (run_dir / ROW_FILE).is_file():
                outcomes.append(finished_outcome(run_dir, name, config, dataset))
                continue
            if stop():
                raise _stopped(stop(), out, outcomes, impls, None, "")
            job, state = _begin(comparison, name, spec, impl, initial, keys)
            finish = functools.partial(_finish_one, spec=spec, classifier=classifier)
            outcome = train_into(job, state, Into(run_dir, comparison.options, stop, None, finish))
            position = outcome.result.progress.position
            if outcome.result.stopped:
                at = f"{_where(position)}, checkpoint written"
                raise _stopped(outcome.stopped_by, out, outcomes, impls, name, at)
            if outcome.stopped:
                at = (
                    f"the last step, {position.step}, before its final outputs were all written "
                    "(checkpoint written)"
                )
                raise _stopped(outcome.stopped_by, out, outcomes, impls, name, at)
            outcomes.append(outcome)

        try:
            with stop.immediately():
                return _write_combined(outcomes, impls, reference, out, dataset)
        except signals.Stopped as err:
            done = [o.impl for o in outcomes]
            raise Stopped(err.signum, out, done, None, "", []) from None


def _where(position: Any) -> str:
    from cvae_rosetta.app.train import where

    return where(position)


def _stopped(
    signum: int, out: Path, outcomes: list[Outcome], impls: dict, name: str | None, at: str
) -> Stopped:
    done = [o.impl for o in outcomes]
    left = [n for n in impls if n not in done and n != name]
    return Stopped(signum, out, done, name, at, left)


def _begin(
    comparison: Comparison,
    name: str,
    spec: str,
    impl: Any,
    initial: canonical.Canonical,
    keys: RunKeys,
) -> tuple[Job, Any]:
    """What implementation ``name`` (``spec`` as given) trains, and its state: from its checkpoint
    (a resume of a folder that has one), else from the shared initial parameters in a fresh
    folder."""
    config, dataset = comparison.config, comparison.dataset
    run_dir = comparison.out / name
    if comparison.resume and checkpoint.has_checkpoints(run_dir):
        opened = resuming.Resume.open(run_dir, latest_good=False)
        opened.load()
        records = opened.check(config, dataset)
        state = trainstate.implementation_state(impl, opened.checkpoint.state, config)
        opened.prepare(records, config, spec)
        progress = opened.checkpoint.progress
        return Job(impl, config, dataset, opened.checkpoint.keys, progress, records, name), state
    if run_dir.exists():  # a folder stopped before its first checkpoint: nothing to keep
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    save_config(run_dir, config, command="compare", impl=spec)
    return Job(impl, config, dataset, keys, name=name), impl.from_canonical(initial, config)


def _finish_one(
    outcome: Outcome, job: Job, options: Options, *, spec: str, classifier: Any
) -> None:
    """An implementation's pictures, parameters, evaluation and row (``summary.json``, last)."""
    run_dir, name, result, config = outcome.workdir, outcome.impl, outcome.result, job.config
    impl, dataset = job.impl, job.dataset
    write_pictures(run_dir, impl, result.state, dataset, job.keys, title=name)
    params = impl.to_canonical(result.state)
    save_params(run_dir / evaluate.PARAMS_FILE, params)
    setup = evaluate.EvalSetup(config.train.seed, options.iw_samples, classifier)
    report = evaluate.evaluate(impl, result.state, dataset, setup, out=run_dir, title=name)
    files.write_json(run_dir / evaluate.EVALUATION_FILE, {"impl": name, **report})
    final = result.final()
    row = {
        "impl": name,
        "target": spec,
        "train_loss": final["train_loss"],
        **{k: final[k] for k in ("test_loss", "test_recon", "test_kl")},
        "steps_per_second": result.steps_per_second,
        "compile_seconds": result.compile_seconds,
        **evaluate.headline(report),
    }
    if row.get("active_units") is not None:
        row["active"] = f"{row['active_units']}/{config.model.latent_dim}"
        row["active"] += " collapsed" if row["posterior_collapse"] else ""
    files.write_json(run_dir / ROW_FILE, row)
    outcome.summary, outcome.evaluation = row, report
    outcome.params = flatten_params(params)


def finished_outcome(run_dir: Path, name: str, config: Config, dataset: Dataset) -> Outcome:
    """An implementation a stopped comparison finished, as its folder holds it."""
    row = json.loads((run_dir / ROW_FILE).read_text())
    records = read_metrics(run_dir / METRICS_FILE)
    params = flatten_params(load_params(run_dir / evaluate.PARAMS_FILE))
    return Outcome(run_dir, name, dataset.name, config, None, row, records=records, params=params)


def _write_combined(
    outcomes: list[Outcome], impls: dict, reference: Any, out: Path, dataset: Dataset
) -> list[dict[str, Any]]:
    base = next((o for o in outcomes if impls[o.impl][1] is reference), outcomes[0])
    for o in outcomes:
        o.summary["max_param_diff"] = max_abs_difference(o.params, base.params)
        o.summary["reference"] = base.impl
    rows = [o.summary for o in outcomes]

    curves = {o.impl: curves_of(o.records) for o in outcomes}
    charts.comparison_curves(
        curves,
        out / "curves.png",
        reference=base.impl,
        title=f"{dataset.name}: {len(rows)} implementations, same initial parameters, same keys",
    )
    combine_samples(out, [o.impl for o in outcomes], dataset.name)
    files.write_json(out / "summary.json", {"rows": rows, "reference": base.impl})
    files.write_text(out / "summary.md", summary_markdown(rows))
    return rows


def combine_samples(out: Path, names: Sequence[str], dataset: str) -> Path:
    """``out/samples.png``: each implementation's ``samples.png`` (its folder ``out/<name>/``),
    titled ``<name>: samples`` by itself and given no second caption, in rows with none empty."""
    return images.combine_side_by_side(
        [out / name / "samples.png" for name in names],
        None,
        out / "samples.png",
        title=f"{dataset}: samples of {len(names)} implementations, same keys (a row per label)",
    )


def max_abs_difference(a: canonical.Canonical, b: canonical.Canonical) -> float:
    """The largest absolute difference between two canonical trees of the same structure."""
    diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)
    return max(jax.tree.leaves(diffs), default=0.0)


def _cell(text: str) -> str:
    """Text as one Markdown table cell: a pipe escaped, so it does not end the cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The summary's rows as a Markdown table, :data:`COLUMNS` its columns, every cell escaped;
    no newline after its last row."""
    header = [_cell(h) for _, h, _ in COLUMNS]
    body = [
        [_cell(fmt.format(r[k]) if r.get(k) is not None else "-") for k, _, fmt in COLUMNS]
        for r in rows
    ]
    return markdown.markdown_table(header, body).rstrip("\n")


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    """``summary.md``: the Markdown table, and the :func:`notes` under it."""
    return markdown_table(rows) + "".join(f"\n\n{note}" for note in notes(rows)) + "\n"


def summary_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table: ``columns`` are ``(key, header, format)``."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append(
            [(fmt.format(row[key]) if row.get(key) is not None else "-") for key, _, fmt in columns]
        )
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def text_table(rows: list[dict[str, Any]]) -> str:
    """The table ``cvae compare`` prints, with the :func:`notes` under it."""
    return summary_table(rows, COLUMNS) + "".join(f"\n{note}" for note in notes(rows))


def notes(rows: list[dict[str, Any]]) -> list[str]:
    """The lines under the table: :func:`collapse_rows_note` and :func:`dparam_note`, those that
    have something to say."""
    return [n for n in (collapse_rows_note(rows), dparam_note(rows)) if n]


def collapse_rows_note(rows: list[dict[str, Any]]) -> str | None:
    """The line naming the rows whose latent code is unused (``active`` marked ``collapsed``);
    ``None`` when there is none."""
    collapsed = [r["impl"] for r in rows if r.get("posterior_collapse")]
    if not collapsed:
        return None
    return (
        f"posterior collapse in {', '.join(collapsed)}: the latent code is unused (no active unit "
        f"or kl below {evaluate.COLLAPSE_KL:g} nats per example): {evaluate.COLLAPSE_MEANING}"
    )


BIT_IDENTICAL = 0.0
"""The ``max |dparam|`` of an implementation that ends bit for bit where the reference ends."""
WHY_DRIFT = {
    "equinox": "Equinox: kernels stored [out, in], a one-example model vmapped over the batch",
    "keras": "Keras 3: its own ops",
}
"""Why a built-in's arithmetic differs from the reference's in the last bits, by row name."""


def dparam_note(rows: list[dict[str, Any]]) -> str | None:
    """The footnote on ``max |dparam|`` when some row is above :data:`BIT_IDENTICAL`: which rows,
    why (arithmetic that differs in the last bits, which over many steps drifts apart), how far
    their test losses are from the reference's, and that docs/evaluation.md says more; ``None``
    when every row ends bit for bit where the reference does."""
    drifted = [r for r in rows if (r.get("max_param_diff") or 0.0) > BIT_IDENTICAL]
    if not drifted:
        return None
    reference = drifted[0].get("reference") or REFERENCE
    base = next((r for r in rows if r.get("impl") == reference), None)
    names = [f"{r['impl']} {r['max_param_diff']:.2e}" for r in drifted]
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    why = [WHY_DRIFT[r["impl"]] for r in drifted if r["impl"] in WHY_DRIFT]
    losses = ""
    if base is not None and all(r.get("test_loss") is not None for r in [base, *drifted]):
        gap = max(abs(r["test_loss"] - base["test_loss"]) for r in drifted)
        losses = f"; test losses within {gap:.1e} nats of {reference}'s"
    return (
        f"max |dparam|: {listed} {'are' if len(names) > 1 else 'is'} not bit-identical to "
        f"{reference}: arithmetic that differs in the last bits"
        f"{' (' + '; '.join(why) + ')' if why else ''} drifts apart over many steps{losses}. "
        f"See docs/evaluation.md (Measured: every implementation at the defaults)."
    )


def classifier_note(rows: list[dict[str, Any]]) -> str:
    """What ``gen acc`` is measured against."""
    accuracy = rows[0].get("classifier_accuracy") if rows else None
    if accuracy is None:
        return "gen acc: no classifier (the training split has fewer than two classes)"
    return (
        "gen acc: generated mean images sigmoid(decode(z, c)) that an RBF SVC fit on the real "
        f"training split labels c; the SVC scores {accuracy:.3f} on the real test split. "
        "diversity: generated over real within-class spread. test -iwae: importance-weighted "
        "bound (docs/evaluation.md)"
    )
