"""The latent size against class-faithful generation: bounds, KL, active units, conditional
accuracy and diversity of one implementation trained at several latent sizes (``--latents``), per
data set (``--set NAME:EPOCHS[:DIR]``, repeatable).

Every run is the config ``cvae train --data NAME --epochs E --latent-dim L`` makes (every other
flag at its default), trained and evaluated without a run directory; one classifier per data set
judges its runs. A data set larger than ``--train-size`` / ``--test-size`` is cut to its first
examples, written as the NPZ file ``--data-dir`` reads, so each recorded command is exact. Each
run also records the accuracy of images decoded from ``z ~ N(0, t^2 I)`` for a few ``t < 1`` (the
same draws, scaled; no CLI flag offers it). Data sets larger than 8x8 get a picture of generated
images per latent size in ``--samples-dir``. ``--render`` only writes the table into ``--doc`` and
the curve of accuracy against the bound beside the samples (a measurement does too); ``--merge``
first appends another result file's data sets, each keeping its command.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench import plots, results
from cvae_rosetta.bench.markdown import write_between_markers
from cvae_rosetta.files import write_json

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "evaluation.md"
CURVE_FILE = "latent_tradeoff.png"
BEGIN, END = "<!-- latent-tradeoff:begin -->", "<!-- latent-tradeoff:end -->"
DEFAULT_SETS = ("digits:300", "mnist:30:/tmp/mnistdata/mnist")
DEFAULT_SETS += ("fashion_mnist:30:/tmp/mnistdata/fashion",)
TEMPERATURES = (0.5, 0.75)
SAMPLES_PER_LABEL = 8  # columns of the samples picture
TITLES = {"digits": "bundled digits (8x8)", "mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}


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
    from cvae_rosetta.app import data
    from cvae_rosetta.spec.config import DataConfig

    full = data.load(DataConfig(name=name, data_dir=data_dir))
    if len(full.train) <= train_size and len(full.test) <= test_size:
        return full, data_dir, None
    (folder := scratch / f"{name}-subset").mkdir(parents=True, exist_ok=True)
    # exact in uint8: the loader divides by 255 again
    as_u8 = lambda x: np.rint(x * 255.0).astype(np.uint8).reshape(-1, *full.image_shape)
    arrays = [as_u8(full.train.x[:train_size]), full.train.c[:train_size]]
    arrays += [as_u8(full.test.x[:test_size]), full.test.c[:test_size]]
    np.savez(folder / data.NPZ_FILES[name], **dict(zip(data.NPZ_KEYS, arrays, strict=True)))
    cut = data.load(DataConfig(name=name, data_dir=str(folder)))
    note = (
        f"the first {len(cut.train):,} of {len(full.train):,} training and the first "
        f"{len(cut.test):,} of {len(full.test):,} test images of {data_dir}, written as "
        f"{data.NPZ_FILES[name]} into the --data-dir of the command"
    )
    return cut, str(folder), note


def one_run(impl, dataset, config, classifier, iw_samples: int) -> tuple[dict[str, Any], Any, Any]:
    """Train and evaluate one configuration (``cvae_rosetta.app.trainer.train``, then
    ``cvae_rosetta.app.evaluate.evaluate``): its record, the first ``SAMPLES_PER_LABEL`` generated
    mean images of each label with their labels, and the evaluation's account of the classifier."""
    import jax
    import jax.numpy as jnp

    from cvae_rosetta.app import evaluate
    from cvae_rosetta.app.run import Control, Job, RunKeys
    from cvae_rosetta.app.trainer import train

    seed, latent = config.train.seed, config.model.latent_dim
    start = time.perf_counter()
    keys = RunKeys.from_seed(seed)
    job = Job(impl, config, dataset, keys)
    result = train(job, impl.init(keys.init, config), Control(progress=False))
    trained = time.perf_counter()
    ev = evaluate.evaluate(
        impl, result.state, dataset, evaluate.EvalSetup(seed, iw_samples, classifier)
    )
    # the evaluation's own draws (EvalKeys.generate), scaled by each temperature
    labels = np.repeat(np.arange(dataset.num_classes, dtype=np.int32), evaluate.GENERATED_PER_CLASS)
    generate = evaluate.EvalKeys.from_seed(seed).generate
    z = jax.random.normal(generate, (labels.shape[0], latent), jnp.float32)
    decode = evaluate._make_decode(impl)  # sigmoid(decode(z, c)), as the evaluation's own
    mean = lambda t: np.asarray(decode(result.state, z * t, jnp.asarray(labels)), np.float32)
    accuracy, diversity = {}, {}
    for t in TEMPERATURES:
        images = mean(t)
        diversity[str(t)] = evaluate.diversity(images, labels, dataset.test, dataset.num_classes)[0]
        if classifier is not None:
            accuracy[str(t)] = float(np.mean(classifier.predict(images) == labels))
    acc = ev["conditional_accuracy"]
    per_class = [a for a in acc["mean_images"]["per_class"] if a is not None]
    final = result.final()
    record = {
        "latent_dim": latent,
        "epochs": config.train.epochs,
        "steps": final["step"],
        **{key: ev[key] for key in ("neg_elbo", "neg_iwae", "recon", "kl", "active_units")},
        "gen_accuracy": acc["mean_images"]["overall"],
        "gen_accuracy_worst_class": min(per_class) if per_class else None,
        "gen_accuracy_bernoulli": acc["bernoulli_samples"]["overall"],
        "gen_accuracy_at_temperature": accuracy,
        "diversity": ev["diversity"],
        "diversity_at_temperature": diversity,
        "train_loss": final["train_loss"],
        "train_seconds": round(trained - start, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }
    keep = np.arange(labels.size) % evaluate.GENERATED_PER_CLASS < SAMPLES_PER_LABEL  # per label
    return record, (mean(1.0)[keep], labels[keep]), ev["classifier"]


COLUMNS = 3  # panels per row of a picture (samples, curve), which is shown 688 px wide
MOSAIC_GAP = 2  # pixels of mid-grey between the images of a samples panel


def samples_picture(name: str, shape, grids: list[tuple[int, Any]], directory: Path) -> str:
    """Generated mean images, ``SAMPLES_PER_LABEL`` per label (one row per label), one panel per
    latent size, :data:`COLUMNS` panels to a row; drawn for the docs' text column
    (``plots.figure_png``), each image's pixels kept square and unsmoothed."""
    h, w = shape
    columns = min(COLUMNS, len(grids))
    rows = math.ceil(len(grids) / columns)
    mosaics = [(latent, *_mosaic(x, c, h, w)) for latent, (x, c) in grids]
    # the panels' height from their width: the mosaics' aspect, with room for the titles
    tall, wide = mosaics[0][1].shape
    panel = (plots.FIGURE_WIDTH - 0.35) / columns * tall / wide

    def draw(figure):
        axes = list(figure.subplots(rows, columns, squeeze=False).flat)
        for i, (ax, (latent, mosaic, labels)) in enumerate(zip(axes, mosaics, strict=False)):
            ax.imshow(mosaic, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_title(f"latent {latent}", fontsize=9.5, pad=3)
            ax.set_xticks([])
            ax.set_yticks(MOSAIC_GAP + (h - 1) / 2 + np.arange(len(labels)) * (h + MOSAIC_GAP))
            ax.set_yticklabels([str(v) for v in labels] if i % columns == 0 else [])
            ax.tick_params(length=0, pad=2)
            ax.spines[:].set_visible(False)
        for ax in axes[len(mosaics) :]:
            ax.set_axis_off()
        what = f"z ~ N(0, I); one row per label c, {SAMPLES_PER_LABEL} draws each"
        figure.suptitle(f"{TITLES.get(name, name)}: sigmoid(decode(z, c)), {what}")

    file = f"latent_tradeoff_{name}.png"
    plots.figure_png(directory / file, rows * (panel + 0.38) + 0.35, draw)
    return file


def _mosaic(x: np.ndarray, labels: np.ndarray, h: int, w: int) -> tuple[np.ndarray, list[int]]:
    """The images ``x`` (``[N, h*w]``, in [0, 1]) as one array: a row per distinct label, in
    increasing order, its images in their given order, :data:`MOSAIC_GAP` mid-grey pixels apart;
    returns the array and the rows' labels."""
    order, gap = [int(v) for v in np.unique(labels)], MOSAIC_GAP
    per_row = max(int(np.sum(labels == v)) for v in order)
    mosaic = np.full((gap + len(order) * (h + gap), gap + per_row * (w + gap)), 0.5, np.float32)
    for r, value in enumerate(order):
        for c, image in enumerate(x[labels == value]):
            top, left = gap + r * (h + gap), gap + c * (w + gap)
            mosaic[top : top + h, left : left + w] = np.clip(image.reshape(h, w), 0.0, 1.0)
    return mosaic, order


def measure(args: argparse.Namespace, command: list[str]) -> None:
    """Every (data set, latent size) run; the result is written to ``--out`` after each one."""
    from cvae_rosetta import cli
    from cvae_rosetta.app import evaluate
    from cvae_rosetta.app.train import fit_to_data
    from cvae_rosetta.cli.flags import config_from_args
    from cvae_rosetta.spec import protocol

    impl = protocol.load(args.impl)
    result = results.envelope("latent_tradeoff", command)
    # the classifier that judges generated images is scikit-learn's
    result["environment"]["versions"]["scikit-learn"] = importlib.metadata.version("scikit-learn")
    result.update(load_average={"start": results.load_average()}, impl=args.impl, seed=args.seed)
    result.update(iw_samples=args.iw_samples, temperatures=list(TEMPERATURES), sets=[])
    with tempfile.TemporaryDirectory() as scratch:
        for name, epochs, data_dir in [parse_set(s) for s in args.set or DEFAULT_SETS]:
            sizes = (args.train_size, args.test_size)
            dataset, command_dir, cut = load_set(name, data_dir, *sizes, Path(scratch))
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
                "command": shlex.join(command),  # what measured this set
                "runs": [],
            }
            result["sets"].append(entry)
            grids = []
            for latent in [int(v) for v in args.latents.split(",") if v]:
                # the run's command, and the config cvae train makes of it
                run_command = ["cvae", "train", "--impl", args.impl, "--data", name]
                run_command += ["--data-dir", command_dir] if command_dir is not None else []
                run_command += ["--epochs", str(epochs), "--latent-dim", str(latent)]
                run_command += ["--seed", str(args.seed)] if args.seed else []
                flags = cli.build_parser().parse_args(run_command[1:])
                config, dataset = fit_to_data(*config_from_args(flags))
                run, grid, judge = one_run(impl, dataset, config, classifier, args.iw_samples)
                if judge is not None:
                    del judge["test_per_class"]
                    entry["classifier"] = {**judge, "fit_seconds": fit_seconds}
                entry["runs"].append(run | {"command": shlex.join(run_command)})
                grids.append((latent, grid))
                shown = ("neg_elbo", "neg_iwae", "kl", "active_units", "gen_accuracy", "diversity")
                print(
                    f"{name} {epochs} epochs, latent {latent}:", *(f"{k} {run[k]}" for k in shown)
                )
                write_json(args.out, result, parents=True)
            if dataset.image_shape != (8, 8):
                picture = samples_picture(name, dataset.image_shape, grids, args.samples_dir)
                entry["samples_picture"] = picture
    result["load_average"]["end"] = results.load_average()
    write_json(args.out, result, parents=True)


def merge(out: Path, others: list[Path]) -> dict[str, Any]:
    """``out`` with the data sets of ``others`` appended, each keeping the command that measured
    it; refused where the implementation, seed, k or temperatures differ."""
    result = results.load(out)
    for path in others:
        other = results.load(path)
        for key in ("kind", "impl", "seed", "iw_samples", "temperatures"):
            if other[key] != result[key]:
                raise SystemExit(
                    f"--merge {path}: {key} is {other[key]!r}, {out} has {result[key]!r}"
                )
        for entry in other["sets"]:
            entry.setdefault("command", shlex.join(other["command"]))
            entry.pop("samples_picture", None)  # drawn elsewhere
            same = [i for i, e in enumerate(result["sets"]) if e["data"] == entry["data"]]
            result["sets"].insert(same[-1] + 1 if same else len(result["sets"]), entry)
    write_json(out, result, parents=True)
    return result


def table(result: dict[str, Any]) -> str:
    temps, env = result["temperatures"], result["environment"]
    num = lambda value, digits: "-" if value is None else f"{value:.{digits}f}"
    commands = dict.fromkeys(e["command"] for e in result["sets"])  # each set keeps its own
    intro = (
        f"Measured by {' and '.join(f'`{c}`' for c in commands)} ({result['impl']}, "
        f"seed {result['seed']}, k = {result['iw_samples']}, {env['cpu_count']} CPU cores, JAX "
        f"{env['versions']['jax']}); every row is `cvae train` at its defaults but for the "
        "data, the epochs and `--latent-dim` (the commands are in "
        '`benchmarks/results/latent_tradeoff_cpu.json`). "gen acc": the fraction of generated '
        'mean images the classifier labels as requested, z ~ N(0, I); "at t": the same draws '
        "scaled by t (z ~ N(0, t^2 I), not a CLI option)."
    )
    header = ["data", "latent", "-ELBO", "-IWAE", "KL", "active units", "gen acc", "worst label"]
    header += [f"gen acc / diversity at t = {t}" for t in temps]
    header += ["diversity", "classifier on real test"]
    rows = []
    bold = lambda text, best: f"**{text}**" if best else text
    for entry in result["sets"]:
        runs, clf, epochs = entry["runs"], entry["classifier"], entry["epochs"]
        best_bound = min(r["neg_elbo"] for r in runs)
        best_acc = max((r["gen_accuracy"] or 0) for r in runs)
        where = f"{TITLES.get(entry['data'], entry['data'])}, {entry['train_size']:,} train / "
        where += f"{entry['test_size']:,} test, {epochs} epoch{'s' if epochs != 1 else ''}"
        for i, run in enumerate(runs):
            cells = [where if i == 0 else "", str(run["latent_dim"])]
            cells += [bold(f"{run['neg_elbo']:.2f}", run["neg_elbo"] == best_bound)]
            cells += [f"{run['neg_iwae']:.2f}", f"{run['kl']:.2f}"]
            cells += [f"{run['active_units']} of {run['latent_dim']}"]
            cells += [bold(num(run["gen_accuracy"], 3), run["gen_accuracy"] == best_acc)]
            cells += [num(run["gen_accuracy_worst_class"], 2)]
            cells += [
                f"{num(run['gen_accuracy_at_temperature'].get(str(t)), 3)} / "
                f"{num(run['diversity_at_temperature'].get(str(t)), 2)}"
                for t in temps
            ]
            cells += [f"{run['diversity']:.2f}"]
            cells += [num(clf["test_accuracy"], 3) if clf and i == 0 else ""]
            rows.append(cells)
    return (
        f"{intro}\n\n{markdown_table(header, rows, 'l' + 'r' * (len(header) - 1))}\n"
        "Bold: the best bound and the best conditional accuracy of each data set. A data set's "
        "rows share one classifier, fit on its real training split."
    )


def curve(result: dict[str, Any], path: Path) -> None:
    """Conditional accuracy against -ELBO, one panel per data set through its latent sizes,
    :data:`COLUMNS` to a row, and the legend in the slot after the last panel, never over the
    data. Drawn for the docs' text column (``plots.figure_png``)."""
    from matplotlib.ticker import MaxNLocator

    sets = result["sets"]
    slots = len(sets) + 1  # the last one for the legend
    columns = min(COLUMNS, slots)
    rows = math.ceil(slots / columns)

    def draw(figure):
        axes = list(figure.subplots(rows, columns, squeeze=False, sharey=True).flat)
        for ax, entry in zip(axes, sets, strict=False):
            runs = entry["runs"]
            x = [r["neg_elbo"] for r in runs]
            y = [r["gen_accuracy"] or 0.0 for r in runs]
            ax.plot(x, y, "o-", color="tab:blue", markersize=4, label="z ~ N(0, I)")
            for t, style in zip(result["temperatures"], ("s--", "^:"), strict=False):
                yt = [r["gen_accuracy_at_temperature"].get(str(t)) for r in runs]
                color = "tab:orange" if t == 0.75 else "tab:green"
                if all(v is not None for v in yt):
                    label = f"z ~ N(0, {t}² I)"
                    ax.plot(x, yt, style, color=color, markersize=4, alpha=0.8, label=label)
            for r, px, py, offset in zip(runs, x, y, _label_offsets(x, y), strict=True):
                at = dict(textcoords="offset points", xytext=offset, fontsize=8)
                ax.annotate(str(r["latent_dim"]), (px, py), **at)
            if (clf := entry["classifier"]) and clf["test_accuracy"] is not None:
                label = "classifier on real test"
                ax.axhline(clf["test_accuracy"], color="grey", lw=0.8, ls="--", label=label)
            epochs = f"{entry['epochs']} epoch{'s' if entry['epochs'] != 1 else ''}"
            ax.set_title(f"{TITLES.get(entry['data'], entry['data'])}, {epochs}", fontsize=9.5)
            ax.xaxis.set_major_locator(MaxNLocator(4))
            ax.set_ylim(0, 1.05)
            ax.margins(x=0.1)
            ax.grid(alpha=0.3)
        spare = axes[len(sets) :]
        for ax in spare:
            ax.set_axis_off()
        title = "latent size: the number\nby each point"
        if sets:  # the legend in the slot after the last panel
            handles = axes[0].get_legend_handles_labels()
            spare[0].legend(*handles, loc="center", frameon=False, title=title)
        figure.supxlabel("test -ELBO (nats; lower is better)")
        figure.supylabel("generated images labelled as requested")
        figure.suptitle("class-faithful generation against the bound, per latent size")

    plots.figure_png(path, 2.35 * rows + 0.6, draw)


LABEL_PLACES = ((3, 3), (3, -10), (-11, 3), (-11, -10), (3, -21))  # points of offset


def _label_offsets(x, y) -> list[tuple[int, int]]:
    """Each point's label's offset: the first of :data:`LABEL_PLACES` (above only off the top) clear
    of the labels placed before, so that neighbours' do not overlap (a panel: ~150 points)."""
    low = min(x, default=0.0)
    span, placed, offsets = (max(x, default=0.0) - low) or 1.0, [], []
    for px, py in zip(x, y, strict=True):
        places = [p for p in LABEL_PLACES if p[1] < 0 or py < 0.9]
        at = [((px - low) / span * 0.8 + dx / 150, py + dy / 150) for dx, dy in places]
        clear = lambda a: all(abs(a[0] - b[0]) > 0.09 or abs(a[1] - b[1]) > 0.07 for b in placed)
        choice = next((i for i, a in enumerate(at) if clear(a)), 0)
        offsets.append(places[choice])
        placed.append(at[choice])
    return offsets


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out = ROOT / "benchmarks/results/latent_tradeoff_cpu.json"
    parser.add_argument("--out", type=Path, default=out)
    sets = f"a data set, its epochs and folder (repeatable) [{' '.join(DEFAULT_SETS)}]"
    parser.add_argument("--set", action="append", metavar="NAME:EPOCHS[:DIR]", help=sets)
    parser.add_argument("--latents", default="2,4,8,16,32", help="comma-separated latent sizes")
    parser.add_argument("--impl", default="pure_jax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iw-samples", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--test-size", type=int, default=2000)
    where = "where the samples pictures go (and, with --render, the curve)"
    parser.add_argument("--samples-dir", type=Path, default=ROOT / "docs" / "img", help=where)
    parser.add_argument("--doc", type=Path, default=DOC, help="the page with the markers")
    parser.add_argument("--render", action="store_true", help="only render --out into --doc")
    merge_help = "append the data sets of another result file (same impl, seed, k) to --out"
    parser.add_argument(
        "--merge", type=Path, action="append", default=[], metavar="FILE", help=merge_help
    )
    args = parser.parse_args(argv)
    if not args.render:
        measure(args, ["python", "benchmarks/latent_tradeoff.py", *argv])
        print(f"wrote {args.out}")
    result = merge(args.out, args.merge) if args.merge else results.load(args.out)
    curve(result, args.samples_dir / CURVE_FILE)
    write_between_markers(args.doc, BEGIN, END, table(result))
    print(f"rendered {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
