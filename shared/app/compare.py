"""``cvae compare``: every implementation trained side by side from one canonical initialisation.

The initial parameters are drawn once (by the reference implementation, from the run's init key)
and handed to each implementation through ``from_canonical``; every implementation then sees the
same batches in the same order and the same step keys. Whatever differs at the end is the
frameworks' arithmetic, which the table reports as the largest parameter difference from the
reference.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app import evaluate, frameworks, images
from cvae_rosetta.app.data import Dataset
from cvae_rosetta.app.rundir import (
    MetricsLog,
    curves_of,
    save_config,
    save_params,
    summary_table,
    write_pictures,
)
from cvae_rosetta.app.trainer import RunKeys, train
from cvae_rosetta.spec import canonical, protocol
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

REFERENCE = "pure_jax"

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


@dataclasses.dataclass
class Outcome:
    name: str  # the implementation's name, made unique (its folder and its row)
    row: dict[str, Any]
    records: list[dict[str, Any]]
    params: canonical.Canonical


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
    *,
    given: Collection[str] = (),
    iw_samples: int = evaluate.DEFAULT_IW_SAMPLES,
    progress: bool = True,
    overwrite: bool = False,
) -> tuple[list[dict[str, Any]], Dataset, Path]:
    """A whole ``cvae compare``: every implementation in ``names`` (default: every installed one)
    trained from the same start into ``workdir``; the rows of the table, the data set, the path.

    Everything (the names, the reference, the data, ``workdir``) is checked before anything is
    written; ``given`` as in :func:`cvae_rosetta.app.train.fit_to_data`.
    """
    from cvae_rosetta.app import rundir
    from cvae_rosetta.app.train import fit_to_data, start_devices

    evaluate.check_iw_samples(iw_samples)
    names = list(installed_names() if names is None else names)
    if not names:
        raise ConfigError("impls: expected at least one implementation name, got none")
    for name in [*names, REFERENCE]:
        frameworks.load(name)
    start_devices(config)
    config, dataset = fit_to_data(config, given)
    out = rundir.check_out_dir(workdir, overwrite=overwrite)
    rundir.make_out_dir(out, overwrite=overwrite)
    rows = run(names, config, dataset, out, progress=progress, iw_samples=iw_samples)
    return rows, dataset, out


def run(
    names: list[str],
    config: Config,
    dataset: Dataset,
    out: Path,
    *,
    progress: bool = True,
    iw_samples: int = evaluate.DEFAULT_IW_SAMPLES,
) -> list[dict[str, Any]]:
    """Train each implementation in ``names`` into ``out/<its name>/`` (see :func:`labels`);
    write the combined outputs.

    Each folder is a run of its own (``config.json`` naming the implementation as it was given,
    ``params.npz``), evaluated with one shared classifier into its ``evaluation.json``; the table
    shows the evaluation's headline figures, a row per implementation by its name.
    """
    loaded = [frameworks.load(spec) for spec in names]  # every name resolves before any work
    impls = dict(zip(labels(loaded, names), zip(names, loaded, strict=True), strict=True))
    keys = RunKeys.from_seed(config.train.seed)
    reference = frameworks.load(REFERENCE)
    initial = reference.to_canonical(reference.init(keys.init, config))
    save_config(out, config, command="compare", impls=names, folders=list(impls))
    classifier = evaluate.fit_classifier(dataset)

    outcomes = []
    for name, (spec, impl) in impls.items():
        run_dir = out / name
        run_dir.mkdir()
        log = MetricsLog(run_dir / "metrics.jsonl")
        try:
            result = train(
                impl,
                impl.from_canonical(initial, config),
                config,
                dataset,
                keys,
                on_record=log,
                progress=progress,
                desc=name,
            )
        finally:
            log.close()
        write_pictures(run_dir, impl, result.state, dataset, keys, title=name)
        save_config(run_dir, config, command="compare", impl=spec)
        save_params(run_dir / evaluate.PARAMS_FILE, impl.to_canonical(result.state))
        report = evaluate.evaluate(
            impl,
            result.state,
            dataset,
            config.train.seed,
            iw_samples=iw_samples,
            classifier=classifier,
            out=run_dir,
            title=name,
        )
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
        outcomes.append(Outcome(name, row, result.records, impl.to_canonical(result.state)))

    base = next((o for o in outcomes if impls[o.name][1] is reference), outcomes[0])
    for o in outcomes:
        o.row["max_param_diff"] = max_abs_difference(o.params, base.params)
        o.row["reference"] = base.name
    rows = [o.row for o in outcomes]

    curves = {o.name: curves_of(o.records) for o in outcomes}
    images.comparison_curves(
        curves,
        out / "curves.png",
        reference=base.name,
        title=f"{dataset.name}: {len(rows)} implementations, same initial parameters, same keys",
    )
    combine_samples(out, [o.name for o in outcomes], dataset.name)
    files.write_json(out / "summary.json", {"rows": rows, "reference": base.name})
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
    header = "| " + " | ".join(_cell(h) for _, h, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = [
        "| "
        + " | ".join(
            _cell(fmt.format(r[k]) if r.get(k) is not None else "-") for k, _, fmt in COLUMNS
        )
        + " |"
        for r in rows
    ]
    return "\n".join([header, rule, *body])


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    """``summary.md``: the Markdown table, and :func:`dparam_note` under it when there is one."""
    note = dparam_note(rows)
    return markdown_table(rows) + (f"\n\n{note}" if note else "") + "\n"


def text_table(rows: list[dict[str, Any]]) -> str:
    """The table ``cvae compare`` prints, with :func:`dparam_note` under it when there is one."""
    note = dparam_note(rows)
    return summary_table(rows, COLUMNS) + (f"\n{note}" if note else "")


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
