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
import difflib
import functools
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from cvae_rosetta import files
from cvae_rosetta.app import cache, configfile, resources, signals
from cvae_rosetta.bench.harness import SETTING_FLAGS
from cvae_rosetta.spec import config as config_module
from cvae_rosetta.spec.config import SECTIONS, Config
from cvae_rosetta.spec.errors import (
    ConfigError,
    CvaeError,
    DataError,
    ImplementationNotFound,
    field_error,
)


def _number(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            return text  # the config refuses it with its own message

    parse.metavar = kind.__name__.upper()  # type: ignore[attr-defined]  # INT, FLOAT in help
    return parse


def _dims(text: str) -> Any:
    """``"256,128"`` -> ``(256, 128)``; ``""`` -> ``()`` (no hidden layer). A list with an empty
    part (``"256,,64"``, ``"256,"``) is handed on as typed, for the config to refuse."""
    if not text.strip():
        return ()
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        return text
    return tuple(_number(int)(part) for part in parts)


_dims.metavar = "DIMS"  # type: ignore[attr-defined]


# flag -> (section, field, parser, help)
FLAGS: dict[str, tuple[str, str, Callable[[str], Any], str]] = {
    "--data": (
        "data",
        "name",
        str,
        "the data set: digits (bundled), mnist or fashion_mnist (read from --data-dir), "
        "synthetic (generated)",
    ),
    "--data-dir": (
        "data",
        "data_dir",
        str,
        "directory with MNIST-format files (IDX or NPZ), for mnist and fashion_mnist",
    ),
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
    "--input-dim": (
        "model",
        "input_dim",
        _number(int),
        "features per example (given, it must agree with the data)",
    ),
    "--num-classes": (
        "model",
        "num_classes",
        _number(int),
        "number of labels (given, it must agree with the data)",
    ),
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
        "steps of the whole schedule, warm-up included",
    ),
    "--end-learning-rate": (
        "optim",
        "end_learning_rate",
        _number(float),
        "the rate the cosine ends at",
    ),
}


# The enumerated fields' choices, shown in help as {a,b} (the config refuses anything else)
CHOICES: dict[str, tuple[str, ...]] = {
    "data.name": config_module.DATA_SETS,
    "data.remainder": config_module.REMAINDERS,
    "train.data_parallel": config_module.DATA_PARALLEL,
    "model.compute_dtype": config_module.COMPUTE_DTYPES,
    "loss.kind": config_module.LOSS_KINDS,
    "optim.schedule": config_module.SCHEDULES,
}
# fields whose value comes from somewhere else when not given: what help and --print-config say
DECIDED_LATER = {
    "model.input_dim": "from the data",
    "model.num_classes": "from the data",
    "optim.decay_steps": "the run's steps",
}
# the data sets that read --data-dir
READS_DATA_DIR = ("mnist", "fashion_mnist")


# The application's errors name what a flag sets: a config field (``optim.learning_rate``) or a
# parameter of its functions (``checkpoint_every``). FIELD_FLAGS is the one table from those names
# to the flags: every config field's (from FLAGS), the parameters named like their flags (cvae
# bench's settings among them), and the few named otherwise.
SAME_NAMES = (
    *("checkpoint_every", "checkpoint_every_seconds", "keep_checkpoints", "iw_samples"),
    *("debug_nans", "profile_steps", "tensorboard", "out", "resume", "impls", "platforms"),
    *("seed", "step", "coordinator", "num_processes", "process_id", "port", "timeout"),
    *("max_steps", "log_every", "eval_every", "compilation_cache", "platform"),
    *SETTING_FLAGS,
)
FIELD_FLAGS: dict[str, str] = {
    **{f"{section}.{field}": flag for flag, (section, field, _, _) in FLAGS.items()},
    **{name: "--" + name.replace("_", "-") for name in SAME_NAMES},
    "workdir": "--out",
    "config_file": "--config",
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


def in_flags(message: str, typed: Mapping[str, str] | None = None) -> str:
    """An error of the application in the terms of this CLI. A config field the message is about
    is shown as the flag the user typed, the field in brackets (``--latent-dim (model.latent_dim):
    expected ...``); one that came from a file or config.json stays as config.json names it. The
    name the message starts with becomes its flag (``--checkpoint-every: ...``); inside, config
    fields and options become flags (``lower --learning-rate``). ``typed`` maps each config field
    set by a flag to that flag (``Resolved.typed``). A name without a flag passes unchanged."""
    typed = typed or {}
    *leads, last = message.split(": ")
    shown = [
        _as_typed(lead, typed) if _config_fields(lead) else _NAMED_INSIDE.sub(_flag_of, lead)
        for lead in leads
    ]
    if leads and leads[0] in FIELD_FLAGS and not _config_fields(leads[0]):
        shown[0] = FIELD_FLAGS[leads[0]]
    return ": ".join([*shown, _NAMED_INSIDE.sub(_flag_of, last)])


def _flag_of(match: re.Match[str]) -> str:
    return FIELD_FLAGS[match.group(0)]


def _as_typed(fields: str, typed: Mapping[str, str]) -> str:
    """``model.encoder_dims[1]`` as ``--encoder-dims (model.encoder_dims[1])`` where the user typed
    ``--encoder-dims``; unchanged where the value came from a file."""
    names = [name.strip() for name in fields.split(",")]
    flags = [typed.get(name.split("[")[0]) for name in names]
    if not all(flags):
        return fields
    return f"{', '.join(dict.fromkeys(flags))} ({fields})"  # type: ignore[arg-type]


def _config_fields(text: str) -> bool:
    """``model.input_dim``, ``model.encoder_dims[1]``, ``model.input_dim, model.num_classes``."""
    for name in text.split(","):
        section, dot, field = name.strip().partition(".")
        if not (dot and section in SECTIONS and field.split("[")[0].isidentifier()):
            return False
    return True


def _dest(flag: str) -> str:
    return "cfg_" + flag.lstrip("-").replace("-", "_")


def _default(section: str, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


def _metavar(section: str, name: str, parse: Callable[[str], Any]) -> str:
    """``{bernoulli,mse}`` for an enumerated field, else the value's kind: INT, FLOAT, DIMS, DIR."""
    choices = CHOICES.get(f"{section}.{name}")
    return "{" + ",".join(choices) + "}" if choices else getattr(parse, "metavar", "DIR")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "configuration (defaults in brackets; --config FILE sets any of them, flags win)"
    )
    group.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a config file: TOML, JSON (a run's config.json too) or Python defining "
        "get_config(), with config.json's sections and fields (docs/cli.md)",
    )
    group.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config as TOML, each value with where it came from (default, "
        "the file, a flag), and exit",
    )
    for flag, (section, name, parse, text) in FLAGS.items():
        default = _default(section, name)
        shown = DECIDED_LATER.get(f"{section}.{name}")
        if shown is None:
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(
            flag,
            dest=_dest(flag),
            type=parse,
            default=None,
            metavar=_metavar(section, name, parse),
            help=f"{text} [{'none' if shown is None else shown}]",
        )


@dataclasses.dataclass
class Resolved:
    """The config of ``--config`` and the flags, with where each field came from."""

    config: Config
    given: set[str]  # section.field set by the file or a flag
    sources: dict[str, str]  # section.field -> the file or the flag that set it
    overridden: dict[str, Any] = dataclasses.field(default_factory=dict)  # the file's, by a flag


def resolve_config(args: argparse.Namespace) -> Resolved:
    """The config the file (``--config``) and the flags describe (a flag wins over the file); a
    bad value set by the file is refused naming the file too. Imports nothing of JAX."""
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    sources: dict[str, str] = {}
    overridden: dict[str, Any] = {}
    path = getattr(args, "config", None)
    if path is not None:
        for section, fields in configfile.read(path).items():
            values[section].update(fields)
            sources.update({f"{section}.{name}": str(path) for name in fields})
    for flag, (section, name, _, _) in FLAGS.items():
        value = getattr(args, _dest(flag))
        if value is not None:
            key = f"{section}.{name}"
            if sources.get(key) == str(path) and values[section][name] != value:
                overridden[key] = values[section][name]  # shown by --print-config
            values[section][name] = value
            sources[key] = flag
    # the flags typed, for the refusals of this command (``in_flags``), however late they come
    args.typed = {key: source for key, source in sources.items() if source in FLAGS}
    try:
        config = Config(**{s: SECTIONS[s](**values[s]) for s in SECTIONS})
    except ConfigError as err:
        field = str(err).partition(":")[0].split("[")[0]
        if path is not None and sources.get(field) == str(path):
            raise ConfigError(f"{err} (set in {path})") from err
        raise
    return Resolved(config, set(sources), sources, overridden)


def config_from_args(args: argparse.Namespace) -> tuple[Config, set[str]]:
    """The config the flags (and ``--config``) describe, and the ``section.field`` names given
    explicitly."""
    resolved = resolve_config(args)
    return resolved.config, resolved.given


def print_config(resolved: Resolved, command: str) -> int:
    """``--print-config``: the resolved config as TOML with each value's source; no training."""
    header = (
        f"cvae {command}: the resolved config, each value followed by where it came from\n"
        "(default, the --config file, a flag); --config reads this text back."
    )
    shown = dict(resolved.sources)
    for key, value in resolved.overridden.items():  # a flag over the file: both
        text = ",".join(map(str, value)) if isinstance(value, list | tuple) else value
        shown[key] = f"{shown[key]}, over {text!r} in the file"
    print(
        configfile.to_toml(resolved.config.to_dict(), shown, unset=DECIDED_LATER, header=header),
        end="",
    )
    return 0


def _check_data_dir(resolved: Resolved) -> None:
    """``--data-dir`` is read for mnist and fashion_mnist only: with another data set it is
    refused, and for those two a directory that is not there is refused before JAX starts."""
    data = resolved.config.data
    if data.data_dir is None:
        return
    where = resolved.sources.get("data.data_dir", "--data-dir")
    if not data.data_dir.strip():  # '' would be the working directory
        raise field_error(ConfigError, "data.data_dir", "a directory", data.data_dir)
    if data.name not in READS_DATA_DIR:
        raise ConfigError(
            f"data.data_dir: expected no data directory with data.name {data.name} (only "
            f"{' and '.join(READS_DATA_DIR)} read one), got {data.data_dir!r}"
            + ("" if where == "--data-dir" else f" (set in {where})")
        )
    if not Path(data.data_dir).expanduser().is_dir():
        raise field_error(
            DataError,
            "data.data_dir",
            "an existing directory holding the data set's files, which nothing downloads (the "
            "IDX files or the .npz from the data set's own site, or keras.datasets' cache)",
            data.data_dir,
        )


IMPL_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _check_impl_names(names: Sequence[str]) -> None:
    """Each name is registered (``cvae impls``) or reads ``module:attribute``; checked from the
    entry points without importing an implementation (or JAX). Whether it imports is checked
    when it is loaded."""
    from cvae_rosetta.spec import registry

    registered = registry.registered()
    for name in names:
        if name in registered or IMPL_NAME.match(name):
            continue
        if ":" in name or not name:
            raise field_error(ImplementationNotFound, "impl", "a name or 'module:attribute'", name)
        listing = ", ".join(
            f"{i.name} ({'installed' if i.installed else 'not installed'})"
            for i in registry.known()
        )
        raise ImplementationNotFound(
            f"impl: expected a known implementation or 'module:attribute', got {name!r}; "
            f"known implementations: {listing}"
        )


@functools.cache
def _constant(module: str, name: str) -> Any:
    """A module's top-level ``NAME = literal``, read from its source without importing it (the
    application's modules import JAX; the parser, built for every command, must not)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        if isinstance(node, ast.Assign | ast.AnnAssign) and getattr(target, "id", None) == name:
            return ast.literal_eval(node.value)
    raise LookupError(f"{module} has no literal {name}")


# --- JAX: the platform and the compilation cache, set before JAX starts ---------------------------

PLATFORMS = ("cpu", "gpu", "tpu")


def _add_jax_flags(parser: argparse.ArgumentParser, *, cache_default: bool = True) -> None:
    where = f"[{cache.default_folder()}]" if cache_default else "[none: bench measures compiling]"
    group = parser.add_argument_group("JAX")
    group.add_argument(
        "--platform",
        default=None,
        metavar="{" + ",".join(PLATFORMS) + "}",
        help="the platform JAX runs on (sets JAX_PLATFORMS) [JAX's choice]",
    )
    choice = group.add_mutually_exclusive_group()
    choice.add_argument(
        "--compilation-cache",
        default=None,
        metavar="DIR",
        help=f"JAX's persistent compilation cache: compiled programs are kept in DIR and read "
        f"back by the next run that compiles them ('off': none; also "
        f"${cache.ENV}=DIR or off) {where}",
    )
    choice.add_argument(
        "--no-compilation-cache", action="store_true", help="no persistent compilation cache"
    )


def _start_jax(args: argparse.Namespace, *, cache_default: bool = True) -> None:
    """The platform and the compilation cache, once every argument is checked and before the
    command's first compilation (this imports JAX and the application's modules). A SIGINT or
    SIGTERM meanwhile ends the process at once in one line: nothing is written yet, and a stop
    raised inside a native import could not end as cleanly."""
    with signals.ends_at_once("starting", after="nothing written; run the same command"):
        _start_jax_now(args, cache_default=cache_default)
        import cvae_rosetta.app.train  # noqa: F401  (JAX, Optax, the run's modules)


def _start_jax_now(args: argparse.Namespace, *, cache_default: bool) -> None:
    import os

    platform = getattr(args, "platform", None)
    choice = cache.choose(
        getattr(args, "compilation_cache", None),
        off=getattr(args, "no_compilation_cache", False),
        default_on=cache_default,
    )
    if platform is not None:
        os.environ["JAX_PLATFORMS"] = _jax_platform(platform)  # read when JAX starts
        import jax

        jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])  # where it started
        if platform != "cpu" and not getattr(args, "distributed", False):
            _probe_platform(jax, platform)
    _, warning = cache.use(choice)
    if warning:
        print(f"cvae: warning: {warning}", file=sys.stderr)


def _jax_platform(platform: str) -> str:
    """``JAX_PLATFORMS`` for ``--platform``: ``gpu`` is the GPU platform whose JAX plugin is
    installed (``cuda``, else ``rocm``; JAX's own alias ``gpu`` asks for every one of them)."""
    if platform != "gpu":
        return platform
    import importlib.util
    import pkgutil
    from importlib import metadata

    names = {entry.name for entry in metadata.entry_points(group="jax_plugins")}
    spec = importlib.util.find_spec("jax_plugins")
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}
    cuda, rocm = (any(kind in name for name in names) for kind in ("cuda", "rocm"))
    return "rocm" if rocm and not cuda else "cuda"


def _probe_platform(jax: Any, platform: str) -> None:
    """Start JAX's backend now, so that a platform it cannot use is refused before anything is
    written (a CPU needs no probe; a run of several processes joins its cluster first)."""
    try:
        jax.devices()
    except Exception as err:  # RuntimeError, or a bare AssertionError for CUDA without a GPU
        text = " ".join(str(err).split()).split(" (set JAX_PLATFORMS=")[0]
        raise field_error(
            ConfigError,
            "platform",
            f"a platform JAX can use on this machine ({text or f'no {platform} device found'})",
            platform,
        ) from None


def _check_jax_flags(args: argparse.Namespace) -> None:
    platform = getattr(args, "platform", None)
    if platform is not None and platform not in PLATFORMS:
        raise field_error(ConfigError, "platform", f"one of {', '.join(PLATFORMS)}", platform)
    cache.choose(getattr(args, "compilation_cache", None))  # refuses an empty DIR


def _platform_unavailable(err: RuntimeError, args: argparse.Namespace) -> str | None:
    """JAX's refusal of ``--platform`` (no such device or plugin here) as one line, else None."""
    platform = getattr(args, "platform", None)
    text = " ".join(str(err).split())
    if platform is None or "backend" not in text.lower():
        return None
    text = text.split(" (set JAX_PLATFORMS=")[0]
    return f"--platform: expected a platform JAX can use on this machine, got {platform!r} ({text})"


# paths a flag must not leave empty ('' would mean the working directory)
PATH_FLAGS = {
    "out": ("--out", "a path"),
    "run": ("--run", "a run directory"),
    "resume": ("--resume", "a run directory"),
    "config": ("--config", "a config file"),
    "cfg_data_dir": ("--data-dir", "a directory"),
}


def _check_paths(args: argparse.Namespace) -> None:
    for dest, (flag, expected) in PATH_FLAGS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.strip():
            if dest == "out":
                expected = getattr(args, "out_kind", "a directory")
            raise ConfigError(f"{flag}: expected {expected}, got {value!r}")


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
        _check_impl_names([args.impl])
    if args.resume is None:
        _check_data_dir(resolved)
        resources.check_fits(resolved.config)
    return resolved


def cmd_train(args: argparse.Namespace) -> int:
    resolved = _check_train(args)
    if args.print_config:
        return print_config(resolved, "train")
    _start_jax(args)
    from cvae_rosetta.app import distributed, train

    config, given = resolved.config, resolved.given
    options = _options(args)
    if args.resume is not None:
        changes = {name: value for name, value in _given_values(args, given)}
        cluster = _check_resume_flags(args)  # this process's place, if one of several
        with distributed.lost_peers(cluster, args.resume):
            outcome = train.resume(args.resume, options, changes=changes, join=cluster)
    else:
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
        with distributed.lost_peers(cluster, workdir):
            outcome = train.train_and_evaluate(
                config, workdir, options, given=given, cluster=cluster
            )
    if cluster is not None and cluster.process_id != 0:
        return train.exit_status(outcome)  # process 0 says what happened
    if outcome.stopped:
        going_on = distributed.resume_command(cluster)
        print(f"cvae: {train.describe_stop(outcome, going_on)}", file=sys.stderr)
        return train.exit_status(outcome)
    described = train.describe(outcome)
    print(in_flags(described) if outcome.result is None else described)  # a finished run's line
    return 0


def _resume_command(run_dir: Path) -> str:
    return f"cvae train --resume {run_dir}"


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
        _check_impl_names(names)
    _check_data_dir(resolved)
    resources.check_fits(config)
    _start_jax(args)
    from cvae_rosetta.app import compare, evaluate, train

    iw_samples = evaluate.DEFAULT_IW_SAMPLES if args.iw_samples is None else args.iw_samples
    try:
        rows, dataset, out = compare.compare(
            config,
            args.out or train.default_out("compare"),
            names,
            given=given,
            iw_samples=iw_samples,
            progress=not args.no_progress,
            overwrite=args.overwrite,
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
        *((flag, getattr(args, _dest(flag))) for flag in FLAGS),
    ):
        if value is not None:
            raise ConfigError(
                f"{flag}: expected none with --resume (the comparison in {args.resume} keeps its "
                f"own config, implementations and options), got {value!r}"
            )
    _start_jax(args)
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.run is None:
        raise ConfigError("--run: expected a run directory (of cvae train or compare), got none")
    _start_jax(args)
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
    from cvae_rosetta.app import distributed

    return distributed.launch(
        args.num_processes,
        args.command,
        port=args.port,
        timeout=args.timeout,
        oversubscribe=args.oversubscribe,
    )


def _add_run_length_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("how long, and how often it reports")
    group.add_argument(
        "--max-steps",
        type=_number(int),
        default=None,
        metavar="N",
        help="end the run after N steps in all, as a finished run (config.json records it; "
        "--resume keeps it, and --resume with a larger N goes on to N) [the run's epochs]",
    )
    group.add_argument(
        "--log-every",
        type=_number(int),
        default=None,
        metavar="N",
        help="also a line every N steps: step, epoch, loss, steps/s (0: none) [0]",
    )
    group.add_argument(
        "--eval-every",
        type=_number(int),
        default=None,
        metavar="N",
        help="evaluate on the test split every N epochs (and after the last) [1]",
    )


def _add_iw_samples(parser: argparse.ArgumentParser) -> None:
    default = _constant("cvae_rosetta.app.evaluate", "DEFAULT_IW_SAMPLES")
    parser.add_argument(
        "--iw-samples",
        type=_number(int),
        default=default,
        metavar="K",
        help=f"posterior samples per test example of the importance-weighted bound [{default}]",
    )


# --- the parser -----------------------------------------------------------------------------------


class _Version(argparse.Action):
    """``cvae --version``: this package's version and the installed JAX's, then a line for Python
    and each distribution of the stack (``cvae_rosetta.STACK``), read from their metadata (none
    imported)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        import cvae_rosetta

        ours = cvae_rosetta.version_of("cvae-rosetta") or cvae_rosetta.__version__
        jax = cvae_rosetta.version_of("jax")
        print(f"cvae-rosetta {ours}" + (f" (jax {jax})" if jax else " (jax not installed)"))
        stack = cvae_rosetta.installed_versions()
        width = max(map(len, stack))
        for name, found in stack.items():
            shown = "Python" if name == "python" else name
            print(f"  {shown:<{width}}  {found or 'not installed'}")
        sys.stdout.flush()  # a reader gone (``| head -1``) is told here, where main() hears it
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse with the project's voice: a refusal is one line naming the flag (no usage block),
    and a long flag is taken only as typed in full (``--epoch`` is not ``--epochs``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        files.say(f"cvae: error: {self._in_words(message)}")
        self.exit(2)

    def _in_words(self, message: str) -> str:
        """argparse's message in the project's form: ``FLAG: expected X, got Y``."""
        message = re.sub(r"^argument ([^:]+): ", lambda m: f"{m[1].split('/')[0]}: ", message)
        flag = message.split(":")[0]
        if m := re.fullmatch(r"(\S+): not allowed with argument (\S+)", message):
            return f"{m[1]}: expected at most one of {m[2]} and {m[1]}, got both"
        if m := re.fullmatch(r"(.+): invalid choice: (.+) \(choose from (.+)\)", message):
            return f"{m[1]}: expected one of {m[3].replace(chr(39), '')}, got {m[2]}"
        if m := re.fullmatch(r"unrecognized arguments: (\S+).*", message):
            given = m[1].split("=")[0]
            close = difflib.get_close_matches(given, sorted(self._every_flag()), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"{given}: expected a flag of this command{hint}, got an unknown one"
        return message.replace(
            "expected one argument",
            f"expected a value after it (one that starts with '-' is written {flag}=VALUE)",
        )

    def _every_flag(self) -> set[str]:
        """The long flags of this parser and of its commands."""
        flags = {o for a in self._actions for o in a.option_strings if o.startswith("--")}
        for action in self._actions:
            for sub in (getattr(action, "choices", None) or {}).values():
                if isinstance(sub, argparse.ArgumentParser):
                    flags |= {o for a in sub._actions for o in a.option_strings}
        return {f for f in flags if f.startswith("--")}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cvae", description="One conditional VAE in several JAX frameworks, side by side."
    )
    parser.add_argument(
        "--version", action=_Version, help="print the version of cvae-rosetta and JAX, and exit"
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
                "--resume",
                default=None,
                metavar="DIR",
                help="finish the comparison in DIR that a signal stopped (its own config, "
                "implementations and options; the finished ones are kept)",
            )
        p.add_argument(
            "--out",
            default=None,
            metavar="DIR",
            help=f"output directory [runs/{name if name == 'compare' else 'IMPL'}-TIME]",
        )
        p.add_argument("--overwrite", action="store_true", help="replace a previous run in --out")
        p.add_argument(
            "--no-progress",
            action="store_true",
            help="no progress bar, and no line per epoch (the summary at the end stays)",
        )
        _add_iw_samples(p)
        if name == "compare":
            p.set_defaults(iw_samples=None)  # given or not: --resume refuses it
        _add_config_flags(p)
        _add_jax_flags(p)
        if name == "train":
            _add_run_length_flags(p)
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
    _add_jax_flags(p)
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
    p.add_argument(
        "--oversubscribe",
        action="store_true",
        help="start more processes than this machine has cores (or memory) for",
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
    group.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="the address of the coordinator service that process 0 hosts, the same for every "
        "process",
    )
    group.add_argument(
        "--num-processes",
        type=_number(int),
        default=None,
        metavar="P",
        help="how many processes the run has (with --resume: as many as it was written by)",
    )
    group.add_argument(
        "--process-id",
        type=_number(int),
        default=None,
        metavar="I",
        help="this process's number, 0 to P-1 (process 0 writes the run directory)",
    )


# --- checkpoints, resuming, trained models (convert, sample, reconstruct, export) -----------------


def _add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    every = _constant("cvae_rosetta.app.checkpoint", "DEFAULT_EVERY")
    keep = _constant("cvae_rosetta.app.checkpoint", "DEFAULT_KEEP")

    group = parser.add_argument_group("checkpoints and resuming (docs/checkpoints.md)")
    group.add_argument(
        "--checkpoint-every",
        type=_number(int),
        default=every,
        metavar="K",
        help=f"write a checkpoint every K steps, and always at the end (0: only at the end) "
        f"[{every}]",
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
        default=keep,
        metavar="N",
        help=f"keep the latest N checkpoints [{keep}]",
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


def _check_resume_flags(args: argparse.Namespace) -> Any:
    """``--resume DIR`` goes on in DIR: no ``--out``, no ``--overwrite``; with ``--distributed``,
    this process's place among the processes that go on with it (checked against the run later,
    by ``train.resume``), else ``None``."""
    from cvae_rosetta.app import distributed

    for flag, value in (("--out", args.out), ("--overwrite", args.overwrite or None)):
        if value is not None:
            raise ConfigError(
                f"{flag}: expected none with --resume (the run goes on in {args.resume}), got "
                f"{value!r}"
            )
    return distributed.place_from(
        distributed=args.distributed,
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )


def _given_values(args: argparse.Namespace, given: set[str]):
    """``(section.field, value)`` of every config flag given explicitly."""
    for flag, (section, name, _, _) in FLAGS.items():
        if f"{section}.{name}" in given:
            yield f"{section}.{name}", getattr(args, _dest(flag))


def _add_out_file(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--out", default=None, metavar="FILE", help=f"{text} (required)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.set_defaults(out_kind="a file")


def _add_run(parser: argparse.ArgumentParser, *, impl: bool = True) -> None:
    parser.add_argument("--run", default=None, metavar="DIR", help="a run directory of cvae train")
    if impl:
        parser.add_argument(
            "--impl", default=None, help="the implementation to load it into [the run's own]"
        )


def _need_run(args: argparse.Namespace) -> str:
    if args.run is None:
        raise ConfigError("--run: expected a run directory of cvae train, got none")
    if getattr(args, "impl", None) is not None:
        _check_impl_names([args.impl])
    return args.run


def cmd_convert(args: argparse.Namespace) -> int:
    run = _need_run(args)
    _start_jax(args)
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
    _start_jax(args)
    from cvae_rosetta.app import inference

    out, trained, count = inference.sample_run(
        run,
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
    run = _need_run(args)
    _start_jax(args)
    from cvae_rosetta.app import inference

    out, trained, count = inference.reconstruct_run(
        run, args.out, count=args.n, impl=args.impl, overwrite=args.overwrite
    )
    print(f"wrote {out}: {count} test examples and their reconstructions from {trained.source}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    run = _need_run(args)
    _start_jax(args)
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


def _add_model_commands(sub: Any) -> None:
    text = "write a run's checkpoint as one canonical NPZ (parameters, optimiser state, metadata)"
    p = sub.add_parser("convert", help=text, description=text)
    _add_run(p, impl=False)
    _add_out_file(p, "the .npz file to write")
    p.add_argument(
        "--step", type=_number(int), default=None, help="which checkpoint [the newest intact one]"
    )
    _add_jax_flags(p)
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
    _add_jax_flags(p)
    p.set_defaults(func=cmd_sample)

    text = "reconstruct test examples of a trained run's data set"
    p = sub.add_parser("reconstruct", help=text, description=text)
    _add_run(p)
    p.add_argument("--n", type=_number(int), default=16, help="test examples [16]")
    _add_out_file(p, "a .png grid, or .npz with x, labels, reconstructions and image_shape")
    _add_jax_flags(p)
    p.set_defaults(func=cmd_reconstruct)

    text = "export a trained run's generator, encoder and decoder with jax.export (StableHLO)"
    p = sub.add_parser("export", help=text, description=text)
    _add_run(p)
    p.add_argument("--out", default=None, metavar="DIR", help="the directory to write (required)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in --out")
    p.add_argument(
        "--platforms", default=None, help="comma-separated: cpu, cuda, rocm, tpu [this machine's]"
    )
    _add_jax_flags(p)
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
        "data-parallel cases, no bfloat16, no step variants (flags given explicitly still apply)",
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
        (
            "technique-batches",
            "B,B",
            "batch sizes of pure JAX's step variants (no donation, optax.flatten, optax's "
            f"clipping), or none [{_joined(default.technique_batches)}]",
        ),
    ):
        p.add_argument(f"--{name}", default=None, metavar=metavar, help=text)
    _add_jax_flags(p, cache_default=False)
    p.set_defaults(func=cmd_bench)


def _joined(values: Sequence[Any]) -> str:
    return ",".join(map(str, values))


def cmd_bench(args: argparse.Namespace) -> int:
    from cvae_rosetta.bench import harness as bench

    settings = bench.settings_from_flags(
        quick=args.quick, **{name: getattr(args, name) for name in bench.SETTING_FLAGS}
    )
    _start_jax(args, cache_default=False)  # compilation is what it measures
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


# exit statuses (docs/cli.md): 0 done; 1 a bug (a traceback); 2 refused input or a failed run;
# 74 the disk refused a write (EX_IOERR); 124 cvae launch timed out; 130 and 143 stopped by SIGINT
# and SIGTERM (128 + the signal)
REFUSED = 2
WRITE_FAILED = 74


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `cvae --version | head -1`: the reader has gone, nothing to tell it
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's last flush
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    with signals.sigterm_stops_at_once():  # where no run takes it to stop at a checkpoint
        try:
            return _run(args)
        except Exception:  # a stop raised inside an import can surface as that import's error
            if not (signum := signals.pending()):
                raise
            return _stopped(args, signum, files.RUN_AGAIN)


def _run(args: argparse.Namespace) -> int:
    """The command ``args`` names, its refusals, failures and stops as one line and a status."""
    try:
        _check_paths(args)
        _check_jax_flags(args)
        return args.func(args)
    except CvaeError as err:  # files.say: on stderr even after a full disk silenced fd 2
        files.say(f"cvae: error: {in_flags(str(err), getattr(args, 'typed', None))}")
        return REFUSED
    except RuntimeError as err:  # JAX refusing --platform when it starts (no such device here)
        if (line := _platform_unavailable(err, args)) is None:
            raise
        print(f"cvae: error: {line}", file=sys.stderr)
        return REFUSED
    except files.WriteFailed as err:
        from cvae_rosetta.app.train import describe_write_failure

        files.silence_stderr()  # a failed library's threads may print until the process ends
        files.say(f"cvae: error: {describe_write_failure(err, _resume_command)}")
        return WRITE_FAILED
    except OSError as err:  # a disk that fills up or turns read-only while a command writes
        where = err.filename or "an output file"
        if files.disk_error(err):
            files.silence_stderr()
        files.say(
            f"cvae: error: could not write {where}: {err.strerror or err}; every file written "
            "before it is complete (each is written to a temporary name, then renamed)"
        )
        return WRITE_FAILED if files.disk_error(err) else REFUSED
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Stopped) where nothing waits for it
        signum = getattr(err, "signum", signal.SIGINT)
        # a stop while JAX was being imported leaves it half imported: import nothing then
        train = sys.modules.get("cvae_rosetta.app.train")
        workdir = getattr(err, "workdir", None)
        after = train.going_on(workdir, _resume_command) if train else files.RUN_AGAIN
        return _stopped(args, signum, after)


def _stopped(args: argparse.Namespace, signum: int, after: str) -> int:
    """The one line of a command stopped by a signal, and its status."""
    files.silence_stderr()  # one line: no library's thread may print after it
    files.say(
        f"cvae: {args.command} stopped by {signal.Signals(signum).name} before its end, "
        f"nothing half-written; {after}"
    )
    return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
