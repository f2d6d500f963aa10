"""``cvae train`` and ``cvae compare``: every check of their arguments that needs no JAX (the
config, the implementations, the data directory, the flags ``--resume`` takes), the run's
``Options`` their flags make, the call of the application that trains, and what they print.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path
from typing import Any

from cvae_rosetta.app import resources
from cvae_rosetta.app.run import DEFAULT_IW_SAMPLES
from cvae_rosetta.cli.checks import check_data_dir, check_impl_names
from cvae_rosetta.cli.flags import FLAGS, Resolved, dest, print_config, resolve_config
from cvae_rosetta.cli.jaxstart import start_jax
from cvae_rosetta.cli.messages import in_flags
from cvae_rosetta.spec.errors import ConfigError


def _options(args: argparse.Namespace) -> Any:
    from cvae_rosetta.app.run import Options

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
        **_run_length_options(args, Options),
    )


# --max-steps, --log-every, --eval-every: Options fields, checked by Options.check
RUN_LENGTH = ("max_steps", "log_every", "eval_every")


def _run_length_options(args: argparse.Namespace, options: type) -> dict[str, Any]:
    """The given ones of ``--max-steps``, ``--log-every`` and ``--eval-every`` (``Options``'
    defaults stand for the others); refused where this ``Options`` has no such field."""
    fields = {f.name for f in dataclasses.fields(options)}
    given = {name: getattr(args, name, None) for name in RUN_LENGTH}
    given = {name: value for name, value in given.items() if value is not None}
    for name in given:
        if name not in fields:
            raise ConfigError(f"{name}: expected an option this trainer has, got {given[name]!r}")
    return given


def _check_train(args: argparse.Namespace) -> Resolved:
    """Every check of ``cvae train``'s arguments that needs no JAX: the config (file and flags),
    the implementation's name, the data directory, the flags ``--resume`` takes."""
    if args.resume is not None:
        for flag, value in (("--config", args.config), ("--print-config", args.print_config)):
            if value:
                raise ConfigError(
                    f"{flag}: expected none with --resume (the run keeps its own config.json), "
                    f"got {value!r}"
                )
    resolved = resolve_config(args)
    if args.print_config:
        return resolved
    if args.resume is not None:
        _check_resume_flags(args)
    elif args.resume_latest_good:
        raise ConfigError("--resume-latest-good: expected only with --resume DIR, got no --resume")
    if args.impl is not None:
        check_impl_names([args.impl])
    if args.resume is None:
        check_data_dir(resolved)
        resources.check_fits(resolved.config)
    return resolved


def cmd_train(args: argparse.Namespace) -> int:
    resolved = _check_train(args)
    if args.print_config:
        print_config(resolved, "train")
        if args.distributed:  # where this process would stand, found or given
            print(f"# --distributed: {_place(args).describe()}")
        return 0
    start_jax(args)
    from cvae_rosetta.app import train
    from cvae_rosetta.app.cluster import lost, membership

    config, given = resolved.config, resolved.given
    options = _options(args)
    if args.resume is not None:
        changes = {name: value for name, value in _given_values(args, given)}
        cluster = _check_resume_flags(args)  # this process's place, if one of several
        _say_where(cluster, args.verbose)
        with lost.lost_peers(cluster, args.resume):
            outcome = train.resume(args.resume, options, changes=changes, join=cluster)
    else:
        options = dataclasses.replace(options, impl=options.impl or "pure_jax")
        options.check(config)  # before the cluster is joined
        cluster = membership.cluster_from(
            config,
            distributed=args.distributed,
            coordinator=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            devices_given="train.devices" in given,
        )
        workdir = args.out or train.default_workdir(options.impl)
        _say_where(cluster, args.verbose)
        with lost.lost_peers(cluster, workdir):
            outcome = train.train_and_evaluate(
                config, workdir, options, given=given, cluster=cluster
            )
    if cluster is not None and cluster.process_id != 0:  # process 0 says what happened
        print(_other_process_line(cluster, outcome), file=sys.stderr if outcome.stopped else None)
        return train.exit_status(outcome)
    if outcome.stopped:
        going_on = membership.resume_command(cluster)
        print(f"cvae: {train.describe_stop(outcome, going_on)}", file=sys.stderr)
        return train.exit_status(outcome)
    described = train.describe(outcome)
    print(in_flags(described) if outcome.result is None else described)  # a finished run's line
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    if args.resume is not None:
        return _resume_compare(args)
    resolved = resolve_config(args)
    if args.print_config:
        return print_config(resolved, "compare")
    config, given = resolved.config, resolved.given
    names = [n.strip() for n in args.impls.split(",") if n.strip()] if args.impls else None
    if args.impls is not None and not names:
        raise ConfigError(
            f"--impls: expected implementations separated by commas (leave the flag out for all "
            f"of them), got {args.impls!r}"
        )
    if names:
        check_impl_names(names, "impls")
    check_data_dir(resolved)
    resources.check_fits(config)
    start_jax(args)
    from cvae_rosetta.app import compare, train
    from cvae_rosetta.app.run import Options

    iw_samples = DEFAULT_IW_SAMPLES if args.iw_samples is None else args.iw_samples
    options = Options(
        iw_samples=iw_samples, progress=not args.no_progress, overwrite=args.overwrite
    )
    try:
        rows, dataset, out = compare.compare(
            config, args.out or train.default_out("compare"), names, options, given=given
        )
    except compare.Stopped as stopped:
        print(f"cvae: {stopped.describe()}", file=sys.stderr)
        return 128 + stopped.signum
    _print_comparison(rows, dataset, out, config)
    return 0


def _resume_compare(args: argparse.Namespace) -> int:
    """``cvae compare --resume DIR``: the comparison's own config, implementations and options."""
    for flag, value in (
        *(("--config", args.config), ("--print-config", args.print_config or None)),
        *(("--impls", args.impls), ("--out", args.out), ("--overwrite", args.overwrite or None)),
        ("--iw-samples", args.iw_samples),
        *((flag, getattr(args, dest(flag))) for flag in FLAGS),
    ):
        if value is not None:
            raise ConfigError(
                f"{flag}: expected none with --resume (the comparison in {args.resume} keeps its "
                f"own config, implementations and options), got {value!r}"
            )
    start_jax(args)
    from cvae_rosetta.app import compare

    try:
        rows, dataset, out, config = compare.resume(args.resume, progress=not args.no_progress)
    except compare.Stopped as stopped:
        print(f"cvae: {stopped.describe()}", file=sys.stderr)
        return 128 + stopped.signum
    if rows is None:
        print(f"{out}: the comparison is complete (summary.json is written): nothing left to do")
        return 0
    _print_comparison(rows, dataset, out, config)
    return 0


def _print_comparison(rows: list[dict[str, Any]], dataset: Any, out: Path, config: Any) -> None:
    from cvae_rosetta.app import compare
    from cvae_rosetta.app.trainer import counted

    print()
    impls, epochs = counted(len(rows), "implementation"), counted(config.train.epochs, "epoch")
    print(
        f"{dataset.name}: {impls}, {epochs}, batch "
        f"{config.data.batch_size}, same initial parameters and keys "
        f"(max |dparam| against {rows[0]['reference']})"
    )
    print(compare.text_table(rows))
    print(compare.classifier_note(rows))
    print(
        f"wrote {out}/: curves.png samples.png summary.md summary.json and one folder per "
        "implementation"
    )


def _check_resume_flags(args: argparse.Namespace) -> Any:
    """``--resume DIR`` goes on in DIR: no ``--out``, no ``--overwrite``; with ``--distributed``,
    this process's place among the processes that go on with it (checked against the run later,
    by ``train.resume``), else ``None``."""

    for flag, value in (("--out", args.out), ("--overwrite", args.overwrite or None)):
        if value is not None:
            raise ConfigError(
                f"{flag}: expected none with --resume (the run goes on in {args.resume}), got "
                f"{value!r}"
            )
    return _place(args)


def _place(args: argparse.Namespace) -> Any:
    """This process's place among several (``None`` without ``--distributed``): the flags given,
    the rest from a scheduler's environment."""
    from cvae_rosetta.app.cluster import membership

    return membership.place_from(
        distributed=args.distributed,
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )


def _say_where(place: Any, verbose: bool) -> None:
    """The run's first line where a scheduler placed this process: which, and what it gave.
    In a run of several processes, what native libraries print on file descriptor 1 (gloo's
    connection lines as the processes connect) is kept off stdout, which holds the command's own
    lines: on stderr with ``--verbose``, else nowhere (:func:`cvae_rosetta.files.native_stdout`)."""
    from cvae_rosetta import files

    if place is not None:
        files.native_stdout(to_stderr=verbose)
    if place is not None and place.scheduler:
        print(f"cvae: joining the run as {place.describe()}", file=sys.stderr, flush=True)


def _other_process_line(cluster: Any, outcome: Any) -> str:
    """The one line of a process other than process 0 as it ends: with the others, where."""
    where = f"process {cluster.process_id} of {cluster.num_processes}"
    if outcome.stopped:
        name = signal.Signals(outcome.stopped_by).name
        going_on = "process 0 says where and how to go on"
        return f"cvae: {where} ended with the others ({name}); {going_on}"
    return f"cvae: {where} done; process 0 wrote the run's outputs in {outcome.workdir}"


def _given_values(args: argparse.Namespace, given: set[str]):
    """``(section.field, value)`` of every config flag given explicitly."""
    for flag, (section, name, _, _) in FLAGS.items():
        if f"{section}.{name}" in given:
            yield f"{section}.{name}", getattr(args, dest(flag))
