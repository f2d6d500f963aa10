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
import contextlib
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


def _cluster(args: argparse.Namespace, config: Config, given: set[str]):
    """The process's place in a ``--distributed`` run (``None`` without it), checked before JAX
    starts; its ``config`` has one device per process unless ``--devices`` was given."""
    if not getattr(args, "distributed", False):
        for flag in ("coordinator", "num_processes", "process_id"):
            if getattr(args, flag, None) is not None:
                raise ConfigError(
                    f"--{flag.replace('_', '-')}: expected only with --distributed, got "
                    f"{getattr(args, flag)!r}"
                )
        return None
    from shared import distributed

    return distributed.Cluster.create(
        args.coordinator,
        args.num_processes,
        args.process_id,
        config,
        devices_given="train.devices" in given,
    )


def _start_devices(config: Config, cluster) -> None:
    """Arrange host devices (``--devices N`` on a CPU) and join a distributed run, before anything
    touches a JAX device."""
    from shared import parallel

    if cluster is not None:
        cluster.start()
    elif config.train.devices > 1:
        parallel.arrange_cpu_devices(config.train.devices)


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
    from shared import checkpoint, evaluate, protocol, run
    from shared.trainer import RunKeys, train

    iw_samples = evaluate.check_iw_samples(args.iw_samples)
    every, keep = checkpoint.check_options(args.checkpoint_every, args.keep_checkpoints)
    config, given = config_from_args(args)
    if args.debug_nans and config.train.data_parallel != "none":
        raise ConfigError(
            "--debug-nans: expected --data-parallel none (it checks the serial step), got "
            f"{config.train.data_parallel!r}"
        )
    resume = _open_resume(args, given)  # None without --resume; checked, nothing written
    if resume is not None:
        config = _resume_config(args, resume.config, given)
    cluster = _cluster(args, config, given)
    if cluster is not None:
        config = cluster.config
    impl = protocol.load(args.impl or (resume.run["impl"] if resume else "pure_jax"))
    writer = cluster is None or cluster.process_id == 0  # the one process that writes outputs
    if writer and resume is None:
        out = run.check_out_dir(args.out or _default_out(impl.name), overwrite=args.overwrite)
    _start_devices(config, cluster)
    if resume is not None:
        resume.load()  # reads the checkpoint: JAX starts here, on the devices just arranged
    config, dataset = resolve(config, given)
    keys = RunKeys.from_seed(config.train.seed)
    if not writer:
        train(impl, impl.init(keys.init, config), config, dataset, keys, progress=False)
        return 0

    if resume is None:
        run.make_out_dir(out, overwrite=args.overwrite)
        run.save_config(out, config, command="train", impl=args.impl or "pure_jax")
        state, start, history = impl.init(keys.init, config), None, []
    else:
        out, keys = resume.directory, resume.checkpoint.keys
        state, start, history = _resume_state(resume, impl, config, dataset)
    log = run.MetricsLog(out / "metrics.jsonl")
    saver = checkpoint.Saver(out, impl, config, keys, dataset, keep=keep)
    # Ctrl-C stops one process gracefully; the others of a distributed run would wait for it
    stopper = checkpoint.GracefulStop() if cluster is None else contextlib.nullcontext(None)
    try:
        with stopper as stop:
            result = train(
                impl,
                state,
                config,
                dataset,
                keys,
                on_record=log,
                progress=not args.no_progress,
                desc=impl.name,
                start=start,
                history=history,
                on_checkpoint=saver,
                checkpoint_every=every,
                should_stop=stop,
                debug_nans=args.debug_nans,
            )
    finally:
        log.close()
        saver.close()
    if result.stopped:
        return _report_stop(out, impl, result)
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
    run.save_params(out / evaluate.PARAMS_FILE, impl.to_canonical(result.state))
    report = evaluate.evaluate(
        impl, result.state, dataset, config.train.seed, iw_samples=iw_samples, out=out
    )
    run.write_json(out / evaluate.EVALUATION_FILE, {"impl": impl.name, **report})
    print(
        f"{impl.name} on {dataset.name}: {config.train.epochs} epochs, {final['step']} steps, "
        f"{result.steps_per_second:.0f} steps/s, first compile {result.compile_seconds:.2f} s"
    )
    print(
        f"  train loss {final['train_loss']:.3f}   test loss {final['test_loss']:.3f} "
        f"(recon {final['test_recon']:.3f}, kl {final['test_kl']:.3f})"
    )
    print(evaluate.describe(report))
    print(
        f"  wrote {out}/: config.json metrics.jsonl samples.png reconstructions.png curves.png "
        f"summary.json {evaluate.PARAMS_FILE} {evaluate.EVALUATION_FILE} {evaluate.GRID_FILE} "
        f"{evaluate.LATENT_FILE}"
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from shared import compare, evaluate, protocol, run

    iw_samples = evaluate.check_iw_samples(args.iw_samples)
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
    _start_devices(config, None)
    config, dataset = resolve(config, given)
    out = run.check_out_dir(args.out or _default_out("compare"), overwrite=args.overwrite)

    run.make_out_dir(out, overwrite=args.overwrite)
    rows = compare.run(
        names, config, dataset, out, progress=not args.no_progress, iw_samples=iw_samples
    )
    print()
    print(
        f"{dataset.name}: {len(names)} implementations, {config.train.epochs} epochs, batch "
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
    from shared import evaluate

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
    from shared import distributed

    if args.port is not None and (not isinstance(args.port, int) or not 0 < args.port < 65536):
        raise ConfigError(f"--port: expected an integer in [1, 65535], got {args.port!r}")
    if args.timeout is not None and not isinstance(args.timeout, float):
        raise ConfigError(f"--timeout: expected a number of seconds, got {args.timeout!r}")
    return distributed.launch(
        args.num_processes, args.command, port=args.port, timeout=args.timeout
    )


def _add_iw_samples(parser: argparse.ArgumentParser) -> None:
    from shared.evaluate import DEFAULT_IW_SAMPLES

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
    from shared.checkpoint import DEFAULT_EVERY, DEFAULT_KEEP

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


def _open_resume(args: argparse.Namespace, given: set[str]):
    """The run ``--resume`` names, its config.json checked (nothing read with JAX, nothing
    written yet), or ``None`` without it."""
    from shared import checkpoint

    if args.resume is None:
        if args.resume_latest_good:
            raise ConfigError(
                "--resume-latest-good: expected only with --resume DIR, got no --resume"
            )
        return None
    for flag, value in (("--out", args.out), ("--overwrite", args.overwrite or None)):
        if value is not None:
            raise ConfigError(
                f"{flag}: expected none with --resume (the run goes on in {args.resume}), got "
                f"{value!r}"
            )
    if getattr(args, "distributed", False):
        raise ConfigError("--resume: expected a run of one process, got --distributed")
    return checkpoint.Resume.open(args.resume, latest_good=args.resume_latest_good)


def _resume_config(args: argparse.Namespace, stored: Config, given: set[str]) -> Config:
    """The run's own config with the flags given explicitly; any change to the model, the loss,
    the optimiser or the data is refused, naming every differing field."""
    from shared import checkpoint

    data = stored.to_dict()
    for flag, (section, name, _, _) in FLAGS.items():
        if f"{section}.{name}" in given:
            value = getattr(args, _dest(flag))
            data[section][name] = list(value) if isinstance(value, tuple) else value
    config = Config.from_dict(data)
    checkpoint.refuse_config_changes(stored, config, what=f"the run in {args.resume}")
    return config


def _resume_state(resume, impl, config: Config, dataset):
    """Check the checkpoint against the data, then write what resuming changes; the state in
    ``impl``, where the run stands and the records before it."""
    from shared import checkpoint

    records = resume.check(config, dataset)
    state = checkpoint.implementation_state(impl, resume.checkpoint.state, config)
    for step, reason in resume.damaged:
        aside = resume.directory / checkpoint.DAMAGED_DIR
        print(
            f"cvae: warning: checkpoint {step} is damaged ({reason}); moved to {aside}",
            file=sys.stderr,
        )
    resume.prepare(records, config, impl.name)
    position = resume.checkpoint.progress.position
    by = "" if impl.name == resume.checkpoint.impl else f" (written by {resume.checkpoint.impl})"
    print(
        f"{impl.name}: resuming {resume.directory} at step {position.step} (epoch "
        f"{position.epoch + 1}, batch {position.batch}){by}"
    )
    if position.epoch >= config.train.epochs:
        print(f"  nothing left to train in {config.train.epochs} epochs (--epochs extends the run)")
    return state, resume.checkpoint.progress, records


def _report_stop(out: Path, impl, result) -> int:
    position = result.progress.position
    print(
        f"cvae: {impl.name} stopped at step {position.step} (epoch {position.epoch + 1}, batch "
        f"{position.batch}), checkpoint written; go on with: cvae train --resume {out}",
        file=sys.stderr,
    )
    return 130


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
    from shared import checkpoint

    out = checkpoint.check_out_file(args.out, suffixes=(".npz",), overwrite=args.overwrite)
    if args.step is not None and (not isinstance(args.step, int) or args.step < 0):
        raise ConfigError(f"--step: expected an integer >= 0, got {args.step!r}")
    meta = checkpoint.convert(_need_run(args), out, step=args.step)
    what = (
        "parameters only (the run has no checkpoints)"
        if meta.get("params_only")
        else f"step {meta['step']} (epoch {meta['epoch'] + 1}, batch {meta['batch']})"
    )
    print(f"wrote {out}: canonical checkpoint of {meta['impl']}'s run, {what}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    from shared import checkpoint, inference

    n = inference.check_count(args.n)
    seed = inference.check_seed(args.seed)
    out = checkpoint.check_out_file(args.out, suffixes=(".png", ".npz"), overwrite=args.overwrite)
    trained = inference.load_trained(_need_run(args), args.impl)
    labels = inference.check_labels(args.label, trained.config.model.num_classes)
    images, c = inference.sample(trained, labels, n, seed)
    inference.write_samples(trained, out, images, c)
    print(f"wrote {out}: {len(c)} samples of label(s) {args.label} from {trained.source}")
    return 0


def cmd_reconstruct(args: argparse.Namespace) -> int:
    from shared import checkpoint, inference

    n = inference.check_count(args.n)
    out = checkpoint.check_out_file(args.out, suffixes=(".png", ".npz"), overwrite=args.overwrite)
    trained = inference.load_trained(_need_run(args), args.impl)
    x, c, recon = inference.reconstruct(trained, n)
    inference.write_reconstructions(trained, out, x, c, recon)
    print(f"wrote {out}: {len(c)} test examples and their reconstructions from {trained.source}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from shared import export, inference

    platforms = export.check_platforms(args.platforms)
    out = export.check_out_dir(args.out, overwrite=args.overwrite)
    trained = inference.load_trained(_need_run(args), args.impl)
    manifest = export.export(trained, out, platforms=platforms, overwrite=args.overwrite)
    names = " ".join(f"{e['file']}" for e in manifest["functions"].values())
    print(
        f"wrote {out}/: {export.MANIFEST} {names} (and .mlir), batch dimension symbolic, for "
        f"{', '.join(platforms)}; load with shared.serving.load({str(out)!r})"
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
    from shared import bench

    text = "measure every implementation's step: compile, step time, overhead, FLOPs, scaling"
    p = sub.add_parser("bench", help=text, description=f"{text} (docs/performance.md)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory [runs/bench-TIME]")
    p.add_argument("--overwrite", action="store_true", help="replace a previous benchmark in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--quick",
        action="store_true",
        help="about a minute: batch sizes 8,256, 3 rounds, fewer steps, pure JAX only in the "
        "data-parallel cases (flags given explicitly still apply)",
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
    ):
        p.add_argument(f"--{name}", default=None, metavar=metavar, help=text)
    p.set_defaults(func=cmd_bench)


def _joined(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))


def cmd_bench(args: argparse.Namespace) -> int:
    from shared import bench

    settings = bench.settings_from_flags(
        quick=args.quick,
        **{
            name: getattr(args, name)
            for name in (
                "batch_sizes",
                "rounds",
                "steps",
                "epoch_examples",
                "unrolls",
                "devices",
                "mechanisms",
                "parallel_batch",
                "parallel_impls",
                "impls",
                "roof_size",
            )
        },
    )
    impls = bench.resolve_impls(settings)
    out = bench.check_out_dir(args.out or _default_out("bench"), overwrite=args.overwrite)
    bench.arrange_devices(settings)  # before anything touches a JAX device
    result = bench.run(
        settings, impls, progress=not args.no_progress, command=["cvae", *sys.argv[1:]]
    )
    written = bench.write(out, result, overwrite=args.overwrite)
    print(bench.describe(result))
    print(f"wrote {out}/: {' '.join(written)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CvaeError as err:
        print(f"cvae: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a disk that fills up or turns read-only while a run writes
        where = err.filename or "an output file"
        print(
            f"cvae: error: could not write {where}: {err.strerror or err}; every file written "
            "before it is complete (each is written to a temporary name, then renamed)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("cvae: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
