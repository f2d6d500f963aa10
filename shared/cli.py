"""The ``cvae`` command line: ``impls``, ``train`` and ``compare``.

Every config field has a flag (``--latent-dim``, ``--loss``, ``--learning-rate``, ...). Values are
handed to the config dataclasses unparsed where they do not parse, so a bad value gets the same
message as anywhere else: the field, what was expected, what was given. Every check (config,
implementation, data, batch size, output directory) runs before the first file is written; a
refusal is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.config import SECTIONS, Config
from shared.errors import ConfigError, CvaeError


def _number(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            return text  # the config refuses it with its own message

    return parse


def _dims(text: str) -> Any:
    return tuple(_number(int)(part.strip()) for part in text.split(",") if part.strip())


# flag -> (section, field, parser, help)
FLAGS: dict[str, tuple[str, str, Callable[[str], Any], str]] = {
    "--data": ("data", "name", str, "digits (bundled), mnist, fashion_mnist or synthetic"),
    "--data-dir": ("data", "data_dir", str, "directory with MNIST-format files (IDX or NPZ)"),
    "--batch-size": ("data", "batch_size", _number(int), "examples per step"),
    "--remainder": ("data", "remainder", str, "drop or pad the last partial batch of an epoch"),
    "--epochs": ("train", "epochs", _number(int), "passes over the training split"),
    "--seed": ("train", "seed", _number(int), "seed of every key of the run"),
    "--input-dim": ("model", "input_dim", _number(int), "features per example (from the data)"),
    "--num-classes": ("model", "num_classes", _number(int), "number of labels (from the data)"),
    "--latent-dim": ("model", "latent_dim", _number(int), "size of z"),
    "--encoder-dims": ("model", "encoder_dims", _dims, "encoder widths, comma-separated"),
    "--decoder-dims": ("model", "decoder_dims", _dims, "decoder hidden widths, comma-separated"),
    "--compute-dtype": ("model", "compute_dtype", str, "float32 or bfloat16"),
    "--loss": ("loss", "kind", str, "bernoulli (negative ELBO in nats) or mse"),
    "--beta": ("loss", "beta", _number(float), "weight of the KL term"),
    "--learning-rate": ("optim", "learning_rate", _number(float), "AdamW learning rate"),
    "--clip-norm": ("optim", "clip_norm", _number(float), "global gradient-norm clip"),
    "--weight-decay": ("optim", "weight_decay", _number(float), "AdamW weight decay"),
}


def _dest(flag: str) -> str:
    return "cfg_" + flag.lstrip("-").replace("-", "_")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration (defaults in brackets)")
    for flag, (section, name, parse, text) in FLAGS.items():
        default = next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(
            flag, dest=_dest(flag), type=parse, default=None, metavar="V", help=f"{text} [{shown}]"
        )


def config_from_args(args: argparse.Namespace) -> tuple[Config, set[str]]:
    """The config the flags describe, and the set of ``section.field`` names given explicitly."""
    changes: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    given = set()
    for flag, (section, name, _, _) in FLAGS.items():
        value = getattr(args, _dest(flag))
        if value is not None:
            changes[section][name] = value
            given.add(f"{section}.{name}")
    return Config(**{s: SECTIONS[s](**changes[s]) for s in SECTIONS}), given


def resolve(config: Config, given: set[str]):
    """Load the data set and fit the model's input and label counts to it."""
    from shared import data

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
    return config, dataset


def _default_out(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


# --- commands -------------------------------------------------------------------------------------


def cmd_impls(args: argparse.Namespace) -> int:
    from shared import protocol

    infos = protocol.known()
    width = max(len(i.name) for i in infos)
    for i in infos:
        state = f"{i.framework} {i.version}" if i.installed else f"not installed ({i.framework})"
        print(f"{i.name.ljust(width)}  {state}  {i.target}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from shared import protocol, run
    from shared.trainer import RunKeys, train

    config, given = config_from_args(args)
    impl = protocol.load(args.impl)
    config, dataset = resolve(config, given)
    out = run.check_out_dir(args.out or _default_out(impl.name), overwrite=args.overwrite)

    run.make_out_dir(out, overwrite=args.overwrite)
    run.save_config(out, config, command="train", impl=args.impl)
    keys = RunKeys.from_seed(config.train.seed)
    log = run.MetricsLog(out / "metrics.jsonl")
    try:
        result = train(
            impl,
            impl.init(keys.init, config),
            config,
            dataset,
            keys,
            on_record=log,
            progress=not args.no_progress,
            desc=impl.name,
        )
    finally:
        log.close()
    run.write_pictures(out, impl, result.state, dataset, keys, title=impl.name)
    from shared import images

    images.metric_panels(
        {impl.name: run.curves_of(result.records)},
        out / "curves.png",
        title=f"{impl.name} on {dataset.name}",
    )
    final = result.final()
    summary = {
        "impl": impl.name,
        **final,
        "compile_seconds": result.compile_seconds,
        "steps_per_second": result.steps_per_second,
    }
    run.write_json(out / "summary.json", summary)
    print(
        f"{impl.name} on {dataset.name}: {config.train.epochs} epochs, {final['step']} steps, "
        f"{result.steps_per_second:.0f} steps/s, first compile {result.compile_seconds:.2f} s"
    )
    print(
        f"  train loss {final['train_loss']:.3f}   test loss {final['test_loss']:.3f} "
        f"(recon {final['test_recon']:.3f}, kl {final['test_kl']:.3f})"
    )
    print(
        f"  wrote {out}/: config.json metrics.jsonl samples.png reconstructions.png curves.png "
        "summary.json"
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from shared import compare, protocol, run

    config, given = config_from_args(args)
    names = (
        [n.strip() for n in args.impls.split(",") if n.strip()]
        if args.impls
        else (compare.installed_names())
    )
    if not names:
        raise ConfigError("--impls: expected at least one implementation name, got none")
    for name in names:
        protocol.load(name)
    protocol.load(compare.REFERENCE)
    config, dataset = resolve(config, given)
    out = run.check_out_dir(args.out or _default_out("compare"), overwrite=args.overwrite)

    run.make_out_dir(out, overwrite=args.overwrite)
    rows = compare.run(names, config, dataset, out, progress=not args.no_progress)
    print()
    print(
        f"{dataset.name}: {len(names)} implementations, {config.train.epochs} epochs, batch "
        f"{config.data.batch_size}, same initial parameters and keys "
        f"(max |dparam| against {rows[0]['reference']})"
    )
    print(compare.text_table(rows))
    print(
        f"wrote {out}/: curves.png samples.png summary.md summary.json and one folder per "
        "implementation"
    )
    return 0


# --- the parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cvae", description="One conditional VAE in several JAX frameworks, side by side."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("impls", help="list every known implementation, installed or not")
    p.set_defaults(func=cmd_impls)

    for name, func, text in (
        ("train", cmd_train, "train one implementation"),
        ("compare", cmd_compare, "train every implementation from the same initial parameters"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        if name == "train":
            p.add_argument(
                "--impl",
                default="pure_jax",
                help="a short name (see `cvae impls`) or module:attribute [pure_jax]",
            )
        else:
            p.add_argument(
                "--impls",
                default=None,
                help="comma-separated names or module:attribute [every installed one]",
            )
        p.add_argument(
            "--out",
            default=None,
            help=f"output directory [runs/{name if name == 'compare' else 'IMPL'}-TIME]",
        )
        p.add_argument("--overwrite", action="store_true", help="replace a previous run in --out")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        _add_config_flags(p)
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CvaeError as err:
        print(f"cvae: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cvae: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
