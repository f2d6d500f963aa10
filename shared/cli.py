"""The ``cvae`` command line: ``impls``, ``train``, ``compare``, ``evaluate``, ``launch``, and for
checkpoints and trained models ``convert``, ``sample``, ``reconstruct`` and ``export``; ``bench``
measures every implementation's step.

Every config field has a flag (``--latent-dim``, ``--loss``, ``--learning-rate``, ...). Values are
handed to the config dataclasses unparsed where they do not parse, so a bad value gets the same
message as anywhere else: the field, what was expected, what was given. Every check (config,
implementation, data, batch size, output directory) runs before the first file is written; a
refusal is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.bench.harness import SETTING_FLAGS
from cvae_rosetta.spec.config import SECTIONS, Config
from cvae_rosetta.spec.errors import ConfigError, CvaeError


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
    "--data-parallel": (
        "train",
        "data_parallel",
        str,
        "none, pmap, sharded (jit over a sharded batch) or shard_map",
    ),
    "--devices": ("train", "devices", _number(int), "devices to split every batch over"),
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
    "--schedule": (
        "optim",
        "schedule",
        str,
        "learning-rate schedule: constant, cosine (down to --end-learning-rate) or warmup_cosine "
        "(linear warm-up from 0 over --warmup-steps, then the cosine)",
    ),
    "--warmup-steps": ("optim", "warmup_steps", _number(int), "steps of warmup_cosine's warm-up"),
    "--decay-steps": (
        "optim",
        "decay_steps",
        _number(int),
        "steps of the whole schedule, warm-up included (none: the run's steps)",
    ),
    "--end-learning-rate": (
        "optim",
        "end_learning_rate",
        _number(float),
        "the rate the cosine ends at",
    ),
}


# The application's errors name what a flag sets: a config field (``optim.learning_rate``) or a
# parameter of its functions (``checkpoint_every``). FIELD_FLAGS is the one table from those names
# to the flags: every config field's (from FLAGS), the parameters named like their flags (cvae
# bench's settings among them), and the few named otherwise.
SAME_NAMES = (
    *("checkpoint_every", "checkpoint_every_seconds", "keep_checkpoints", "iw_samples"),
    *("debug_nans", "profile_steps", "tensorboard", "out", "resume", "impls", "platforms"),
    *("seed", "step", "coordinator", "num_processes", "process_id", "port", "timeout"),
    *SETTING_FLAGS,
)
FIELD_FLAGS: dict[str, str] = {
    **{f"{section}.{field}": flag for flag, (section, field, _, _) in FLAGS.items()},
    **{name: "--" + name.replace("_", "-") for name in SAME_NAMES},
    "workdir": "--out",
    "run_dir": "--run",
    "labels": "--label",
    "count": "--n",
    "latest_good": "--resume-latest-good",
    "overwrite=True": "--overwrite",
    "distributed=True": "--distributed",
}
# Inside a message only names no sentence has (``optim.clip_norm``, ``debug_nans``,
# ``overwrite=True``) are shown as flags, never inside a path; a plain word (``seed``) only where it
# starts the message.
_INSIDE = sorted((name for name in FIELD_FLAGS if set(name) & set("._=")), key=len, reverse=True)
_NAMED_INSIDE = re.compile(rf"(?<![\w./-])(?:{'|'.join(map(re.escape, _INSIDE))})(?![\w/])")


def in_flags(message: str) -> str:
    """An error of the application in the terms of this CLI. Config fields that a part of it is
    about (``model.latent_dim: expected ...``) stay as config.json names them; the name the
    message starts with becomes its flag (``--checkpoint-every: ...``); inside, config fields and
    options become flags (``lower --learning-rate``). A name without a flag passes unchanged."""
    *leads, last = message.split(": ")
    shown = [lead if _config_fields(lead) else _NAMED_INSIDE.sub(_flag_of, lead) for lead in leads]
    if leads and leads[0] in FIELD_FLAGS and not _config_fields(leads[0]):
        shown[0] = FIELD_FLAGS[leads[0]]
    return ": ".join([*shown, _NAMED_INSIDE.sub(_flag_of, last)])


def _flag_of(match: re.Match[str]) -> str:
    return FIELD_FLAGS[match.group(0)]


def _config_fields(text: str) -> bool:
    """``model.input_dim``, ``model.encoder_dims[1]``, ``model.input_dim, model.num_classes``."""
    for name in text.split(","):
        section, dot, field = name.strip().partition(".")
        if not (dot and section in SECTIONS and field.split("[")[0].isidentifier()):
            return False
    return True


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


# --- commands -------------------------------------------------------------------------------------


def cmd_impls(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import frameworks

    infos = frameworks.known()
    width = max(len(i.name) for i in infos)
    for i in infos:
        state = f"{i.framework} {i.version}" if i.installed else f"not installed ({i.framework})"
        print(f"{i.name.ljust(width)}  {state}  {i.target}")
    return 0


def _options(args: argparse.Namespace) -> Any:
    from cvae_rosetta.app.train import Options

    return Options(
        impl=args.impl or "",
        checkpoint_every=args.checkpoint_every,
        checkpoint_every_seconds=args.checkpoint_every_seconds,
        keep_checkpoints=args.keep_checkpoints,
        iw_samples=args.iw_samples,
        debug_nans=args.debug_nans,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        latest_good=args.resume_latest_good,
        tensorboard=args.tensorboard,
        profile_steps=args.profile_steps,
    )


def cmd_train(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import distributed, train

    config, given = config_from_args(args)
    options = _options(args)
    if args.resume is not None:
        _check_resume_flags(args)
        changes = {name: value for name, value in _given_values(args, given)}
        outcome = train.resume(args.resume, options, changes=changes)
    else:
        if args.resume_latest_good:
            raise ConfigError(
                "--resume-latest-good: expected only with --resume DIR, got no --resume"
            )
        options = dataclasses.replace(options, impl=options.impl or "pure_jax")
        options.check(config)  # before the cluster is joined
        cluster = distributed.cluster_from(
            config,
            distributed=args.distributed,
            coordinator=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            devices_given="train.devices" in given,
        )
        workdir = args.out or train.default_workdir(options.impl)
        outcome = train.train_and_evaluate(config, workdir, options, given=given, cluster=cluster)
        if cluster is not None and cluster.process_id != 0:
            return train.exit_status(outcome)  # process 0 says what happened
    if outcome.stopped:
        print(f"cvae: {train.describe_stop(outcome, _resume_command)}", file=sys.stderr)
        return train.exit_status(outcome)
    print(train.describe(outcome))
    return 0


def _resume_command(run_dir: Path) -> str:
    return f"cvae train --resume {run_dir}"


def cmd_compare(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import compare, train

    config, given = config_from_args(args)
    names = [n.strip() for n in args.impls.split(",") if n.strip()] if args.impls else None
    rows, dataset, out = compare.compare(
        config,
        args.out or train.default_out("compare"),
        names,
        given=given,
        iw_samples=args.iw_samples,
        progress=not args.no_progress,
        overwrite=args.overwrite,
    )
    print()
    print(
        f"{dataset.name}: {len(rows)} implementations, {config.train.epochs} epochs, batch "
        f"{config.data.batch_size}, same initial parameters and keys "
        f"(max |dparam| against {rows[0]['reference']})"
    )
    print(compare.text_table(rows))
    print(compare.classifier_note(rows))
    print(
        f"wrote {out}/: curves.png samples.png summary.md summary.json and one folder per "
        "implementation"
    )
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import evaluate

    if args.run is None:
        raise ConfigError("--run: expected a run directory (of cvae train or compare), got none")
    for result in evaluate.evaluate_run(args.run, iw_samples=args.iw_samples):
        print(f"{result['impl']} ({result['directory']}):")
        print(evaluate.describe(result))
        print(
            f"  wrote {result['directory']}/: {evaluate.EVALUATION_FILE} {evaluate.GRID_FILE} "
            f"{evaluate.LATENT_FILE}"
        )
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import distributed

    return distributed.launch(
        args.num_processes, args.command, port=args.port, timeout=args.timeout
    )


def _add_iw_samples(parser: argparse.ArgumentParser) -> None:
    from cvae_rosetta.app.evaluate import DEFAULT_IW_SAMPLES

    parser.add_argument(
        "--iw-samples",
        type=_number(int),
        default=DEFAULT_IW_SAMPLES,
        metavar="K",
        help=f"posterior samples per test example of the importance-weighted bound "
        f"[{DEFAULT_IW_SAMPLES}]",
    )


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
                default=None,
                help="a short name (see `cvae impls`) or module:attribute [pure_jax; with "
                "--resume, the run's own]",
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
        _add_iw_samples(p)
        _add_config_flags(p)
        if name == "train":
            p.add_argument(
                "--debug-nans",
                action="store_true",
                help="check every step with checkify and name the first operation that makes a "
                "NaN (slower)",
            )
            p.add_argument(
                "--tensorboard",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="write TensorBoard event files into OUT/tb/: scalars per step and per epoch, "
                "sample and reconstruction grids per epoch (tensorboard --logdir OUT) [on]",
            )
            p.add_argument(
                "--profile-steps",
                default=None,
                metavar="A:B",
                help="trace steps A to B (counted from 1, both included) with jax.profiler into "
                "OUT/profile/, for TensorBoard's profile plugin or Perfetto",
            )
            _add_distributed_flags(p)
            _add_checkpoint_flags(p)
        p.set_defaults(func=func)

    text = "evaluate a trained run: bounds, active units, conditional accuracy, diversity"
    p = sub.add_parser("evaluate", help=text, description=text)
    p.add_argument(
        "--run", default=None, help="a run directory of cvae train (or cvae compare: every impl)"
    )
    _add_iw_samples(p)
    p.set_defaults(func=cmd_evaluate)

    text = "start a --distributed cvae train as several local processes on loopback"
    p = sub.add_parser(
        "launch",
        help=text,
        description=f"{text}: cvae launch --num-processes 2 -- train --data-parallel sharded ...",
    )
    p.add_argument("--num-processes", type=_number(int), default=2, help="processes [2]")
    p.add_argument("--port", type=_number(int), default=None, help="coordinator port [a free one]")
    p.add_argument(
        "--timeout", type=_number(float), default=None, help="stop them all after S seconds"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- train ARGS")
    p.set_defaults(func=cmd_launch)
    _add_model_commands(sub)
    _add_bench_command(sub)
    return parser


def _add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("several processes (jax.distributed; see cvae launch)")
    group.add_argument(
        "--distributed", action="store_true", help="join a multi-process run as one process"
    )
    group.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="process 0's")
    group.add_argument("--num-processes", type=_number(int), default=None, metavar="P")
    group.add_argument("--process-id", type=_number(int), default=None, metavar="I")


# --- checkpoints, resuming, trained models (convert, sample, reconstruct, export) -----------------


def _add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    from cvae_rosetta.app.checkpoint import DEFAULT_EVERY, DEFAULT_KEEP

    group = parser.add_argument_group("checkpoints and resuming (docs/checkpoints.md)")
    group.add_argument(
        "--checkpoint-every",
        type=_number(int),
        default=DEFAULT_EVERY,
        metavar="K",
        help=f"write a checkpoint every K steps, and always at the end (0: only at the end) "
        f"[{DEFAULT_EVERY}]",
    )
    group.add_argument(
        "--checkpoint-every-seconds",
        type=_number(float),
        default=0.0,
        metavar="S",
        help="also write one when S seconds have passed since the previous one, whichever of K "
        "and S comes first (0: steps only) [0]",
    )
    group.add_argument(
        "--keep-checkpoints",
        type=_number(int),
        default=DEFAULT_KEEP,
        metavar="N",
        help=f"keep the latest N checkpoints [{DEFAULT_KEEP}]",
    )
    group.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its latest checkpoint (its own config; --epochs may "
        "extend it; --impl may be another implementation)",
    )
    group.add_argument(
        "--resume-latest-good",
        action="store_true",
        help="with --resume: if the latest checkpoint is damaged, continue from the newest intact "
        "one (damaged ones are moved to DIR/checkpoints.damaged)",
    )


def _check_resume_flags(args: argparse.Namespace) -> None:
    """``--resume DIR`` goes on in DIR: no ``--out``, no ``--overwrite``, one process."""
    for flag, value in (("--out", args.out), ("--overwrite", args.overwrite or None)):
        if value is not None:
            raise ConfigError(
                f"{flag}: expected none with --resume (the run goes on in {args.resume}), got "
                f"{value!r}"
            )
    if getattr(args, "distributed", False):
        raise ConfigError("--resume: expected a run of one process, got --distributed")


def _given_values(args: argparse.Namespace, given: set[str]):
    """``(section.field, value)`` of every config flag given explicitly."""
    for flag, (section, name, _, _) in FLAGS.items():
        if f"{section}.{name}" in given:
            yield f"{section}.{name}", getattr(args, _dest(flag))


def _add_out_file(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--out", default=None, metavar="FILE", help=text)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def _add_run(parser: argparse.ArgumentParser, *, impl: bool = True) -> None:
    parser.add_argument("--run", default=None, metavar="DIR", help="a run directory of cvae train")
    if impl:
        parser.add_argument(
            "--impl", default=None, help="the implementation to load it into [the run's own]"
        )


def _need_run(args: argparse.Namespace) -> str:
    if args.run is None:
        raise ConfigError("--run: expected a run directory of cvae train, got none")
    return args.run


def cmd_convert(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import convert

    out, meta = convert.convert(_need_run(args), args.out, step=args.step, overwrite=args.overwrite)
    what = (
        "parameters only (the run has no checkpoints)"
        if meta.get("params_only")
        else f"step {meta['step']} (epoch {meta['epoch'] + 1}, batch {meta['batch']})"
    )
    print(f"wrote {out}: canonical checkpoint of {meta['impl']}'s run, {what}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import inference

    out, trained, count = inference.sample_run(
        _need_run(args),
        args.out,
        args.label,
        count=args.n,
        seed=args.seed,
        impl=args.impl,
        overwrite=args.overwrite,
    )
    print(f"wrote {out}: {count} samples of label(s) {args.label} from {trained.source}")
    return 0


def cmd_reconstruct(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import inference

    out, trained, count = inference.reconstruct_run(
        _need_run(args), args.out, count=args.n, impl=args.impl, overwrite=args.overwrite
    )
    print(f"wrote {out}: {count} test examples and their reconstructions from {trained.source}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import export

    out, manifest = export.export_run(
        _need_run(args),
        args.out,
        platforms=args.platforms,
        impl=args.impl,
        overwrite=args.overwrite,
    )
    names = " ".join(f"{e['file']}" for e in manifest["functions"].values())
    print(
        f"wrote {out}/: {export.MANIFEST} {names} (and .mlir), batch dimension symbolic, for "
        f"{', '.join(manifest['platforms'])}; load with "
        f"cvae_rosetta.app.serving.load({str(out)!r})"
    )
    return 0


def _add_model_commands(sub: Any) -> None:
    text = "write a run's checkpoint as one canonical NPZ (parameters, optimiser state, metadata)"
    p = sub.add_parser("convert", help=text, description=text)
    _add_run(p, impl=False)
    _add_out_file(p, "the .npz file to write")
    p.add_argument(
        "--step", type=_number(int), default=None, help="which checkpoint [the newest intact one]"
    )
    p.set_defaults(func=cmd_convert)

    text = "generate images of given labels from a trained run"
    p = sub.add_parser("sample", help=text, description=text)
    _add_run(p)
    p.add_argument("--label", default=None, help="a label, or comma-separated labels")
    p.add_argument("--n", type=_number(int), default=16, help="images per label [16]")
    p.add_argument(
        "--seed", type=_number(int), default=None, help="seed of the noise [the run's sample key]"
    )
    _add_out_file(p, "a .png grid, or .npz with images, labels and image_shape")
    p.set_defaults(func=cmd_sample)

    text = "reconstruct test examples of a trained run's data set"
    p = sub.add_parser("reconstruct", help=text, description=text)
    _add_run(p)
    p.add_argument("--n", type=_number(int), default=16, help="test examples [16]")
    _add_out_file(p, "a .png grid, or .npz with x, labels, reconstructions and image_shape")
    p.set_defaults(func=cmd_reconstruct)

    text = "export a trained run's generator, encoder and decoder with jax.export (StableHLO)"
    p = sub.add_parser("export", help=text, description=text)
    _add_run(p)
    p.add_argument("--out", default=None, metavar="DIR", help="the directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in --out")
    p.add_argument(
        "--platforms", default=None, help="comma-separated: cpu, cuda, rocm, tpu [this machine's]"
    )
    p.set_defaults(func=cmd_export)


# --- the benchmark --------------------------------------------------------------------------------


def _add_bench_command(sub: Any) -> None:
    from cvae_rosetta.bench import harness as bench

    text = "measure every implementation's step: compile, step time, overhead, FLOPs, scaling"
    p = sub.add_parser("bench", help=text, description=f"{text} (docs/performance.md)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory [runs/bench-TIME]")
    p.add_argument("--overwrite", action="store_true", help="replace a previous benchmark in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--quick",
        action="store_true",
        help="about a minute: batch sizes 8,256, 5 rounds, fewer steps, pure JAX only in the "
        "data-parallel cases, no bfloat16 (flags given explicitly still apply)",
    )
    default = bench.Settings()
    for name, metavar, text in (
        ("impls", "A,B", "implementations [every installed one; pure_jax always]"),
        ("batch-sizes", "B,B", f"batch sizes [{_joined(default.batch_sizes)}]"),
        ("rounds", "N", f"timed rounds, interleaved across every path [{default.rounds}]"),
        ("steps", "K", f"at most K steps per round [{default.steps}]"),
        (
            "epoch-examples",
            "E",
            f"a round covers about E examples (E / batch steps, at least {bench.MIN_STEPS}) "
            f"[{default.epoch_examples}]",
        ),
        ("unrolls", "U,U", f"lax.scan unroll values of pure JAX [{_joined(default.unrolls)}]"),
        ("devices", "N,N", f"device counts, data parallelism [{_joined(default.devices)}]"),
        ("mechanisms", "M,M", f"data-parallel mechanisms [{_joined(default.mechanisms)}]"),
        ("parallel-batch", "B", f"global batch, data parallelism [{default.parallel_batch}]"),
        ("parallel-impls", "A,B", "implementations, data parallelism [every benchmarked one]"),
        ("roof-size", "N", f"N of the N x N matmul roof [{default.roof_size}]"),
        (
            "precision-batches",
            "B,B",
            "batch sizes of bfloat16 against float32, or none "
            f"[{_joined(default.precision_batches)}]",
        ),
    ):
        p.add_argument(f"--{name}", default=None, metavar=metavar, help=text)
    p.set_defaults(func=cmd_bench)


def _joined(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))


def cmd_bench(args: argparse.Namespace) -> int:
    from cvae_rosetta.app.train import default_out
    from cvae_rosetta.bench import harness as bench

    settings = bench.settings_from_flags(
        quick=args.quick, **{name: getattr(args, name) for name in bench.SETTING_FLAGS}
    )
    out, result, written = bench.benchmark(
        settings,
        args.out or default_out("bench"),
        overwrite=args.overwrite,
        progress=not args.no_progress,
        command=["cvae", *sys.argv[1:]],
    )
    print(bench.describe(result))
    print(f"wrote {out}/: {' '.join(written)}")
    return 0


# exit statuses (docs/cli.md): 0 done; 1 a bug (a traceback); 2 refused input or a failed run;
# 74 the disk refused a write (EX_IOERR); 124 cvae launch timed out; 130 and 143 stopped by SIGINT
# and SIGTERM (128 + the signal)
REFUSED = 2
WRITE_FAILED = 74


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CvaeError as err:
        print(f"cvae: error: {in_flags(str(err))}", file=sys.stderr)
        return REFUSED
    except files.WriteFailed as err:
        from cvae_rosetta.app.train import describe_write_failure

        print(f"cvae: error: {describe_write_failure(err, _resume_command)}", file=sys.stderr)
        files.silence_stderr()  # the failed save's threads may still print as the process ends
        return WRITE_FAILED
    except OSError as err:  # a disk that fills up or turns read-only while a command writes
        where = err.filename or "an output file"
        print(
            f"cvae: error: could not write {where}: {err.strerror or err}; every file written "
            "before it is complete (each is written to a temporary name, then renamed)",
            file=sys.stderr,
        )
        return WRITE_FAILED if files.disk_error(err) else REFUSED
    except KeyboardInterrupt:
        print("cvae: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
