"""The commands other than ``train`` and ``compare``: ``impls``, ``evaluate``, ``launch``,
``convert``, ``sample``, ``reconstruct``, ``export`` and ``bench``. Each checks its arguments,
starts JAX where it needs it, makes one call of the application (or of the benchmark) and says
what it wrote.
"""

from __future__ import annotations

import argparse
import sys

from cvae_rosetta.cli.checks import check_impl_names
from cvae_rosetta.cli.flags import resolve_config
from cvae_rosetta.cli.jaxstart import start_jax
from cvae_rosetta.spec.errors import ConfigError


def cmd_impls(args: argparse.Namespace) -> int:
    from cvae_rosetta.app import frameworks

    infos = frameworks.known()
    width = max(len(i.name) for i in infos)
    for i in infos:
        state = f"{i.framework} {i.version}" if i.installed else f"not installed ({i.framework})"
        print(f"{i.name.ljust(width)}  {state}  {i.target}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.run is None:
        raise ConfigError("--run: expected a run directory (of cvae train or compare), got none")
    start_jax(args)
    from cvae_rosetta.app import evaluate

    for result in evaluate.evaluate_run(args.run, iw_samples=args.iw_samples):
        print(f"{result['impl']} ({result['directory']}):")
        print(evaluate.describe(result))
        print(
            f"  wrote {result['directory']}/: {evaluate.EVALUATION_FILE} {evaluate.GRID_FILE} "
            f"{evaluate.LATENT_FILE}"
        )
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from cvae_rosetta.app.cluster.launch import launch

    return launch(
        args.num_processes,
        args.command,
        port=args.port,
        timeout=args.timeout,
        oversubscribe=args.oversubscribe,
        check=lambda command: _check_launched_train(args, command),
    )


def _check_launched_train(args: argparse.Namespace, command: list[str]) -> None:
    """The train command's flags and config, refused here, as typed, before any process starts
    (each would take seconds to start JAX and then refuse them): a new run of several processes
    shares every batch between them, so it needs a data-parallel mechanism that spans them."""
    from cvae_rosetta.app.cluster.membership import DISTRIBUTED_MECHANISMS

    inner = args.parse(command)  # cvae's parser; argparse's refusals: one line, status 2
    if inner.resume is not None:
        return  # the run's own config.json says how it goes on
    try:
        resolved = resolve_config(inner)
    finally:  # a refusal names the train command's flags as typed
        args.typed = getattr(inner, "typed", None)
    mechanism = resolved.config.train.data_parallel
    if mechanism in DISTRIBUTED_MECHANISMS:
        return
    if "train.data_parallel" in resolved.sources:  # typed, or set by --config
        raise ConfigError(
            f"train.data_parallel: expected one of {', '.join(DISTRIBUTED_MECHANISMS)} in a run "
            f"of several processes (each takes a share of every batch), got {mechanism!r}"
        )
    raise ConfigError(
        f"num_processes: expected a train command with --data-parallel "
        f"{' or '.join(DISTRIBUTED_MECHANISMS)} for {args.num_processes} processes (each takes a "
        f"share of every batch), got none (its default)"
    )


def _need_run(args: argparse.Namespace) -> str:
    if args.run is None:
        raise ConfigError("--run: expected a run directory of cvae train, got none")
    if getattr(args, "impl", None) is not None:
        check_impl_names([args.impl])
    return args.run


def cmd_convert(args: argparse.Namespace) -> int:
    run = _need_run(args)
    start_jax(args)
    from cvae_rosetta.app import convert

    out, meta = convert.convert(run, args.out, step=args.step, overwrite=args.overwrite)
    what = (
        "parameters only (the run has no checkpoints)"
        if meta.get("params_only")
        else f"step {meta['step']} (epoch {meta['epoch'] + 1}, batch {meta['batch']})"
    )
    print(f"wrote {out}: canonical checkpoint of {meta['impl']}'s run, {what}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    run = _need_run(args)
    start_jax(args)
    from cvae_rosetta.app import inference

    samples = inference.Samples(args.label, count=args.n, seed=args.seed)
    out, trained, count = inference.sample_run(
        run, args.out, samples, impl=args.impl, overwrite=args.overwrite
    )
    print(f"wrote {out}: {count} samples of label(s) {args.label} from {trained.source}")
    return 0


def cmd_reconstruct(args: argparse.Namespace) -> int:
    run = _need_run(args)
    start_jax(args)
    from cvae_rosetta.app import inference

    out, trained, count = inference.reconstruct_run(
        run, args.out, count=args.n, impl=args.impl, overwrite=args.overwrite
    )
    print(f"wrote {out}: {count} test examples and their reconstructions from {trained.source}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    run = _need_run(args)
    start_jax(args)
    from cvae_rosetta.app import export

    out, manifest = export.export_run(
        run,
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


def cmd_bench(args: argparse.Namespace) -> int:
    from cvae_rosetta.bench import harness as bench
    from cvae_rosetta.bench.settings import SETTING_FLAGS, settings_from_flags

    settings = settings_from_flags(
        quick=args.quick, **{name: getattr(args, name) for name in SETTING_FLAGS}
    )
    for field in ("impls", "parallel_impls"):  # named as the flags are, before JAX starts
        check_impl_names(getattr(settings, field) or (), field)
    start_jax(args, cache_default=False)  # compilation is what it measures
    from cvae_rosetta.app.train import default_out

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
