"""The latent size against class-faithful generation: bounds, KL, active units, conditional
accuracy and diversity of one implementation trained at several latent sizes, per data set.

    python benchmarks/latent_tradeoff.py [--out benchmarks/results/latent_tradeoff_cpu.json]
        [--set digits:300] [--set mnist:30:/tmp/mnistdata/mnist]
        [--set fashion_mnist:30:/tmp/mnistdata/fashion] [--latents 2,4,8,16,32]
        [--train-size 8000] [--test-size 2000] [--impl pure_jax] [--seed 0] [--iw-samples 64]
        [--samples-dir docs/img]
    python benchmarks/latent_tradeoff.py --render [--out ...] [--doc docs/evaluation.md]
        [--merge OTHER.json]

Every run is what ``cvae train --data NAME --data-dir DIR --epochs E --latent-dim L`` does, every
other flag at its default: the same initial parameters, batches, keys and training loop
(``cvae_rosetta.app.trainer.train``), then the same evaluation (``cvae_rosetta.app.evaluate.
evaluate``, k = ``--iw-samples``), without the run directory's checkpoints and pictures. The
classifier that judges generated images is fit once per data set and shared by its runs (it is
deterministic, so each run would fit the same one). A data set with more than ``--train-size``
training or ``--test-size`` test examples is cut to its first ones, written as the NPZ file
``cvae train --data-dir`` reads (recorded in the result as the exact command).

Beside the evaluation's figures, each run records the conditional accuracy of mean images decoded
from ``z ~ N(0, t^2 I)`` for a few temperatures ``t < 1`` (the same draws, scaled), which no CLI
flag offers today: how much of the accuracy lost at large latents a shrunken prior would recover.

For each data set with images larger than 8x8 a picture of generated mean images per latent size
is written into ``--samples-dir`` (``latent_tradeoff_NAME.png``). ``--render`` (also done after a
measurement) writes the table between the ``latent-tradeoff`` markers of ``--doc`` and the curve
of accuracy against the bound (``latent_tradeoff.png`` beside the samples) from the result file.
``--merge OTHER.json`` first appends the data sets of another measurement (say, more epochs of one
data set) to the result file, each set keeping the command that measured it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "latent_tradeoff_cpu.json"
DOC = ROOT / "docs" / "evaluation.md"
IMG = ROOT / "docs" / "img"
CURVE_FILE = "latent_tradeoff.png"
BEGIN, END = "<!-- latent-tradeoff:begin -->", "<!-- latent-tradeoff:end -->"
DEFAULT_SETS = (
    "digits:300",
    "mnist:30:/tmp/mnistdata/mnist",
    "fashion_mnist:30:/tmp/mnistdata/fashion",
)
TEMPERATURES = (0.5, 0.75)
SAMPLES_PER_LABEL = 8  # columns of the samples picture
SCHEMA = 1


def parse_set(text: str) -> tuple[str, int, str | None]:
    """``NAME:EPOCHS[:DIR]`` -> (name, epochs, data_dir)."""
    name, _, rest = text.partition(":")
    epochs, _, data_dir = rest.partition(":")
    if not name or not epochs.isdigit() or int(epochs) < 1:
        raise SystemExit(f"--set: expected NAME:EPOCHS[:DIR], got {text!r}")
    return name, int(epochs), data_dir or None


def load_set(name: str, data_dir: str | None, train_size: int, test_size: int, scratch: Path):
    """The data set as ``cvae train`` loads it, cut to its first ``train_size`` / ``test_size``
    examples (written as the NPZ file ``--data-dir`` reads, so the command stays exact); returns
    (dataset, the --data-dir of the command, a note on the cut or None)."""
    import numpy as np

    from cvae_rosetta.app import data
    from cvae_rosetta.spec.config import DataConfig

    full = data.load(DataConfig(name=name, data_dir=data_dir))
    if len(full.train) <= train_size and len(full.test) <= test_size:
        return full, data_dir, None
    folder = scratch / f"{name}-subset"
    folder.mkdir(parents=True, exist_ok=True)
    rows, cols = full.image_shape
    # exact in uint8: the loader divides by 255 again
    as_u8 = lambda x: np.rint(x * 255.0).astype(np.uint8).reshape(-1, rows, cols)
    np.savez(
        folder / data.NPZ_FILES[name],
        x_train=as_u8(full.train.x[:train_size]),
        y_train=full.train.c[:train_size],
        x_test=as_u8(full.test.x[:test_size]),
        y_test=full.test.c[:test_size],
    )
    cut = data.load(DataConfig(name=name, data_dir=str(folder)))
    note = (
        f"the first {len(cut.train):,} of {len(full.train):,} training and the first "
        f"{len(cut.test):,} of {len(full.test):,} test images of {data_dir}, written as "
        f"{data.NPZ_FILES[name]} into the --data-dir of the command"
    )
    return cut, str(folder), note


def one_run(impl, dataset, config, classifier, iw_samples: int) -> tuple[dict[str, Any], Any, Any]:
    """Train and evaluate one configuration: its record, the generated mean images and their
    labels, and the evaluation's account of the classifier."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cvae_rosetta.app import evaluate
    from cvae_rosetta.app.trainer import RunKeys, train

    seed = config.train.seed
    start = time.perf_counter()
    keys = RunKeys.from_seed(seed)
    result = train(impl, impl.init(keys.init, config), config, dataset, keys, progress=False)
    trained = time.perf_counter()
    ev = evaluate.evaluate(
        impl, result.state, dataset, seed, iw_samples=iw_samples, classifier=classifier
    )
    # the evaluation's own draws (EvalKeys.generate), scaled by each temperature
    latent = config.model.latent_dim
    labels = np.repeat(np.arange(dataset.num_classes, dtype=np.int32), evaluate.GENERATED_PER_CLASS)
    z = jax.random.normal(
        evaluate.EvalKeys.from_seed(seed).generate, (labels.shape[0], latent), jnp.float32
    )
    decode = jax.jit(lambda s, z, c: jax.nn.sigmoid(impl.decode(s, z, c).astype(jnp.float32)))
    at_temperature, diversity_at_temperature = {}, {}
    for t in (*TEMPERATURES, 1.0):
        images = np.asarray(decode(result.state, z * t, jnp.asarray(labels)), np.float32)
        if t == 1.0:
            mean_images = images
            continue
        diversity_at_temperature[str(t)] = evaluate.diversity(
            images, labels, dataset.test, dataset.num_classes
        )[0]
        if classifier is not None:
            at_temperature[str(t)] = float(np.mean(classifier.predict(images) == labels))
    acc = ev["conditional_accuracy"]
    per_class = [a for a in acc["mean_images"]["per_class"] if a is not None]
    final = result.final()
    record = {
        "latent_dim": latent,
        "epochs": config.train.epochs,
        "steps": final["step"],
        "neg_elbo": ev["neg_elbo"],
        "neg_iwae": ev["neg_iwae"],
        "recon": ev["recon"],
        "kl": ev["kl"],
        "active_units": ev["active_units"],
        "gen_accuracy": acc["mean_images"]["overall"],
        "gen_accuracy_worst_class": min(per_class) if per_class else None,
        "gen_accuracy_bernoulli": acc["bernoulli_samples"]["overall"],
        "gen_accuracy_at_temperature": at_temperature,
        "diversity": ev["diversity"],
        "diversity_at_temperature": diversity_at_temperature,
        "train_loss": final["train_loss"],
        "train_seconds": round(trained - start, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }
    return record, (mean_images, labels), ev["classifier"]


def samples_picture(name: str, shape, grids: list[tuple[int, Any]], directory: Path) -> str:
    """Generated mean images, ``SAMPLES_PER_LABEL`` per label, one panel per latent size."""
    import numpy as np

    from cvae_rosetta.app import images

    directory.mkdir(parents=True, exist_ok=True)
    file = f"latent_tradeoff_{name}.png"
    with tempfile.TemporaryDirectory() as scratch:
        paths, captions = [], []
        for latent, (mean_images, labels) in grids:
            pick = np.concatenate(
                [np.flatnonzero(labels == c)[:SAMPLES_PER_LABEL] for c in np.unique(labels)]
            )
            path = Path(scratch) / f"{latent}.png"
            images.sample_grid(mean_images[pick], labels[pick], shape, path, scale=2)
            paths.append(path)
            captions.append(f"latent {latent}")
        images.combine_side_by_side(
            paths,
            captions,
            directory / file,
            title=f"{name}: sigmoid(decode(z, c)), z ~ N(0, I), one row per label",
            columns=min(len(paths), 5),
        )
    return file


def command_of(name: str, data_dir: str | None, epochs: int, latent: int, impl: str, seed: int):
    parts = ["cvae", "train", "--impl", impl, "--data", name]
    if data_dir is not None:
        parts += ["--data-dir", data_dir]
    parts += ["--epochs", str(epochs), "--latent-dim", str(latent)]
    if seed:
        parts += ["--seed", str(seed)]
    return shlex.join(parts)


def measure(
    sets: list[tuple[str, int, str | None]],
    latents: list[int],
    *,
    impl_name: str = "pure_jax",
    seed: int = 0,
    iw_samples: int = 64,
    train_size: int = 8000,
    test_size: int = 2000,
    samples_dir: Path | None = IMG,
    out: Path | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """Every (data set, latent size) run; the result is written to ``out`` after each one."""
    from cvae_rosetta.app import evaluate
    from cvae_rosetta.spec import protocol
    from cvae_rosetta.spec.config import Config, DataConfig, ModelConfig, TrainConfig

    impl = protocol.load(impl_name)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "command": shlex.join(["python", "benchmarks/latent_tradeoff.py", *(argv or [])]),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1min_at_start": os.getloadavg()[0],
        },
        "versions": versions(),
        "impl": impl_name,
        "seed": seed,
        "iw_samples": iw_samples,
        "temperatures": list(TEMPERATURES),
        "sets": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        for name, epochs, data_dir in sets:
            dataset, command_dir, cut = load_set(
                name, data_dir, train_size, test_size, Path(scratch)
            )
            started = time.perf_counter()
            classifier = evaluate.fit_classifier(dataset)
            fit_seconds = round(time.perf_counter() - started, 1)
            entry: dict[str, Any] = {
                "data": name,
                "data_dir": data_dir,
                "subset": cut,
                "image_shape": list(dataset.image_shape),
                "train_size": len(dataset.train),
                "test_size": len(dataset.test),
                "epochs": epochs,
                "classifier": None,  # the evaluation's own account of it, from the first run
                "command": result["command"],  # what measured this set
                "runs": [],
            }
            result["sets"].append(entry)
            grids = []
            for latent in latents:
                config = Config(
                    model=ModelConfig(
                        latent_dim=latent,
                        input_dim=dataset.input_dim,
                        num_classes=dataset.num_classes,
                    ),
                    data=DataConfig(name=name, data_dir=command_dir),
                    train=TrainConfig(epochs=epochs, seed=seed),
                )
                record, grid, judge = one_run(impl, dataset, config, classifier, iw_samples)
                if judge is not None:
                    del judge["test_per_class"]
                    entry["classifier"] = {**judge, "fit_seconds": fit_seconds}
                record["command"] = command_of(name, command_dir, epochs, latent, impl_name, seed)
                entry["runs"].append(record)
                grids.append((latent, grid))
                print(
                    f"{name:14} latent {latent:3} {epochs:4} epochs  "
                    f"-elbo {record['neg_elbo']:8.3f}"
                    f"  -iwae {record['neg_iwae']:8.3f}  kl {record['kl']:6.2f}  active "
                    f"{record['active_units']:2}  gen acc {_num(record['gen_accuracy'], 3)}"
                    f"  diversity {record['diversity']:.2f}  {record['seconds']:6.1f} s",
                    flush=True,
                )
                if out is not None:
                    _write(out, result)
            if samples_dir is not None and dataset.image_shape != (8, 8):
                entry["samples_picture"] = samples_picture(
                    name, dataset.image_shape, grids, samples_dir
                )
    result["machine"]["load_average_1min_at_end"] = os.getloadavg()[0]
    if out is not None:
        _write(out, result)
    return result


def merge(out: Path, others: list[Path]) -> dict[str, Any]:
    """``out`` with the data sets of ``others`` appended, each keeping the command that measured
    it; refused where the implementation, seed, k or temperatures differ."""
    result = json.loads(out.read_text())
    for entry in result["sets"]:
        entry.setdefault("command", result["command"])
    for path in others:
        other = json.loads(path.read_text())
        for key in ("schema", "impl", "seed", "iw_samples", "temperatures"):
            if other[key] != result[key]:
                raise SystemExit(
                    f"--merge {path}: {key} is {other[key]!r}, {out} has {result[key]!r}"
                )
        for entry in other["sets"]:
            entry.setdefault("command", other["command"])
            entry.pop("samples_picture", None)  # drawn elsewhere
            same = [i for i, e in enumerate(result["sets"]) if e["data"] == entry["data"]]
            result["sets"].insert(same[-1] + 1 if same else len(result["sets"]), entry)
    _write(out, result)
    return result


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("cvae-rosetta", "jax", "jaxlib", "numpy", "scikit-learn"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def _write(out: Path, result: dict[str, Any]) -> None:
    from cvae_rosetta.files import write_text

    write_text(out, json.dumps(result, indent=2) + "\n", parents=True)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# --- the page -------------------------------------------------------------------------------------

TITLES = {"digits": "bundled digits (8x8)", "mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}


def table(result: dict[str, Any]) -> str:
    temps = result["temperatures"]
    commands = list(dict.fromkeys(e.get("command", result["command"]) for e in result["sets"]))
    lines = [
        f"Measured by {' and '.join(f'`{c}`' for c in commands)} ({result['impl']}, "
        f"seed {result['seed']}, k = "
        f"{result['iw_samples']}, {result['machine']['cpu_count']} CPU cores, JAX "
        f"{result['versions']['jax']}); every row is `cvae train` at its defaults but for the "
        "data, the epochs and `--latent-dim` (the commands are in "
        '`benchmarks/results/latent_tradeoff_cpu.json`). "gen acc": the fraction of generated '
        'mean images the classifier labels as requested, z ~ N(0, I); "at t": the same draws '
        "scaled by t (z ~ N(0, t^2 I), not a CLI option).",
        "",
    ]
    header = (
        "| data | latent | -ELBO | -IWAE | KL | active units | gen acc | worst label | "
        + " | ".join(f"gen acc / diversity at t = {t}" for t in temps)
        + " | diversity | classifier on real test |"
    )
    lines += [header, "|---|" + "---:|" * (9 + len(temps))]
    for entry in result["sets"]:
        title = TITLES.get(entry["data"], entry["data"])
        where = (
            f"{title}, {entry['train_size']:,} train / {entry['test_size']:,} test, "
            f"{entry['epochs']} epoch{'s' if entry['epochs'] != 1 else ''}"
        )
        clf = entry["classifier"]
        for i, run in enumerate(entry["runs"]):
            best_bound = min(r["neg_elbo"] for r in entry["runs"])
            best_acc = max((r["gen_accuracy"] or 0) for r in entry["runs"])
            elbo = f"{run['neg_elbo']:.2f}"
            acc = _num(run["gen_accuracy"], 3)
            temps_cells = [
                f"{_num(run['gen_accuracy_at_temperature'].get(str(t)), 3)} / "
                f"{_num(run['diversity_at_temperature'].get(str(t)), 2)}"
                for t in temps
            ]
            lines.append(
                f"| {where if i == 0 else ''} | {run['latent_dim']} | "
                f"{f'**{elbo}**' if run['neg_elbo'] == best_bound else elbo} | "
                f"{run['neg_iwae']:.2f} | {run['kl']:.2f} | {run['active_units']} of "
                f"{run['latent_dim']} | {f'**{acc}**' if run['gen_accuracy'] == best_acc else acc}"
                f" | {_num(run['gen_accuracy_worst_class'], 2)} | "
                + " | ".join(temps_cells)
                + f" | {run['diversity']:.2f} | "
                + (_num(clf["test_accuracy"], 3) if clf and i == 0 else "")
                + " |"
            )
    lines.append("")
    lines.append(
        "Bold: the best bound and the best conditional accuracy of each data set. A data set's "
        "rows share one classifier, fit on its real training split."
    )
    return "\n".join(lines)


def curve(result: dict[str, Any], path: Path) -> Path:
    """Conditional accuracy against -ELBO, one line per data set through its latent sizes."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cvae_rosetta.files import atomic_write

    sets = result["sets"]
    figure = Figure(figsize=(4.2 * max(len(sets), 1), 3.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, max(len(sets), 1), squeeze=False)[0]
    for ax, entry in zip(axes, sets, strict=False):
        runs = entry["runs"]
        x = [r["neg_elbo"] for r in runs]
        y = [r["gen_accuracy"] or 0.0 for r in runs]
        ax.plot(x, y, "o-", color="tab:blue", label="z ~ N(0, I)")
        for t, style in zip(result["temperatures"], ("s--", "^:"), strict=False):
            yt = [r["gen_accuracy_at_temperature"].get(str(t)) for r in runs]
            if all(v is not None for v in yt):
                ax.plot(
                    x,
                    yt,
                    style,
                    color="tab:orange" if t == 0.75 else "tab:green",
                    alpha=0.8,
                    label=f"z ~ N(0, {t}^2 I)",
                )
        for r in runs:
            ax.annotate(
                f"{r['latent_dim']}",
                (r["neg_elbo"], r["gen_accuracy"] or 0.0),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
            )
        clf = entry["classifier"]
        if clf and clf["test_accuracy"] is not None:
            ax.axhline(
                clf["test_accuracy"], color="grey", lw=0.8, ls="--", label="classifier on real test"
            )
        ax.set_title(
            f"{TITLES.get(entry['data'], entry['data'])}, {entry['epochs']} epochs", fontsize=10
        )
        ax.set_xlabel("test -ELBO (nats; lower is better)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("generated images labelled as requested")
    axes[0].legend(fontsize=7, loc="lower left")
    figure.suptitle(
        "latent size (point labels): class-faithful generation against the bound", fontsize=10
    )
    atomic_write(path, lambda handle: figure.savefig(handle, format="png"), parents=True)
    return path


def render(result: dict[str, Any], doc: Path = DOC, picture: Path | None = None) -> None:
    from cvae_rosetta.bench.report import write_between_markers

    if picture is not None:
        curve(result, picture)
    write_between_markers(doc, BEGIN, END, table(result))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--set",
        action="append",
        dest="sets",
        metavar="NAME:EPOCHS[:DIR]",
        help=f"a data set, its epochs and folder (repeatable) [{' '.join(DEFAULT_SETS)}]",
    )
    parser.add_argument("--latents", default="2,4,8,16,32", help="comma-separated latent sizes")
    parser.add_argument("--impl", default="pure_jax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iw-samples", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument(
        "--samples-dir",
        type=Path,
        default=IMG,
        help="where the samples pictures go (and, with --render, the curve)",
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the page with the markers")
    parser.add_argument("--render", action="store_true", help="only render --out into --doc")
    parser.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="append the data sets of another result file (same impl, seed, k) to --out",
    )
    args = parser.parse_args(argv)
    if not args.render:
        measure(
            [parse_set(s) for s in (args.sets or DEFAULT_SETS)],
            [int(v) for v in args.latents.split(",") if v],
            impl_name=args.impl,
            seed=args.seed,
            iw_samples=args.iw_samples,
            train_size=args.train_size,
            test_size=args.test_size,
            samples_dir=args.samples_dir,
            out=args.out,
            argv=argv,
        )
        print(f"wrote {args.out}")
    if args.merge:
        merge(args.out, args.merge)
    render(json.loads(args.out.read_text()), args.doc, args.samples_dir / CURVE_FILE)
    print(f"rendered {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
