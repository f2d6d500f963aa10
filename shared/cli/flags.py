"""The config flags: :data:`FLAGS`, one flag per config field (``--latent-dim``, ``--loss``,
``--learning-rate``, ...), how they are added to a command's parser, and how they and a
``--config`` file resolve to one :class:`~cvae_rosetta.spec.config.Config` (:func:`resolve_config`),
which ``--print-config`` prints with where each value came from.

Values are handed to the config dataclasses unparsed where they do not parse, so a bad value gets
the same message as anywhere else: the field, what was expected, what was given.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from cvae_rosetta.app import configfile
from cvae_rosetta.spec import config as config_module
from cvae_rosetta.spec.config import SECTIONS, Config
from cvae_rosetta.spec.errors import ConfigError


def number(kind: type) -> Callable[[str], Any]:
    """The parser of a flag's ``int`` or ``float`` value: text that does not parse is handed on as
    typed, for the config (or the function it reaches) to refuse."""

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
    return tuple(number(int)(part) for part in parts)


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
    "--batch-size": ("data", "batch_size", number(int), "examples per step"),
    "--remainder": ("data", "remainder", str, "drop or pad the last partial batch of an epoch"),
    "--epochs": ("train", "epochs", number(int), "passes over the training split"),
    "--seed": ("train", "seed", number(int), "seed of every key of the run"),
    "--data-parallel": (
        "train",
        "data_parallel",
        str,
        "none, pmap, sharded (jit over a sharded batch) or shard_map",
    ),
    "--devices": ("train", "devices", number(int), "devices to split every batch over"),
    "--input-dim": (
        "model",
        "input_dim",
        number(int),
        "features per example (given, it must agree with the data)",
    ),
    "--num-classes": (
        "model",
        "num_classes",
        number(int),
        "number of labels (given, it must agree with the data)",
    ),
    "--latent-dim": ("model", "latent_dim", number(int), "size of z"),
    "--encoder-dims": ("model", "encoder_dims", _dims, "encoder widths, comma-separated"),
    "--decoder-dims": ("model", "decoder_dims", _dims, "decoder hidden widths, comma-separated"),
    "--compute-dtype": ("model", "compute_dtype", str, "float32 or bfloat16"),
    "--loss": ("loss", "kind", str, "bernoulli (negative ELBO in nats) or mse"),
    "--beta": ("loss", "beta", number(float), "weight of the KL term"),
    "--learning-rate": ("optim", "learning_rate", number(float), "AdamW learning rate"),
    "--clip-norm": ("optim", "clip_norm", number(float), "global gradient-norm clip"),
    "--weight-decay": ("optim", "weight_decay", number(float), "AdamW weight decay"),
    "--schedule": (
        "optim",
        "schedule",
        str,
        "learning-rate schedule: constant, cosine (down to --end-learning-rate) or warmup_cosine "
        "(linear warm-up from 0 over --warmup-steps, then the cosine)",
    ),
    "--warmup-steps": ("optim", "warmup_steps", number(int), "steps of warmup_cosine's warm-up"),
    "--decay-steps": (
        "optim",
        "decay_steps",
        number(int),
        "steps of the whole schedule, warm-up included",
    ),
    "--end-learning-rate": (
        "optim",
        "end_learning_rate",
        number(float),
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


def dest(flag: str) -> str:
    """Where argparse keeps a config flag's value: ``--latent-dim`` in ``args.cfg_latent_dim``."""
    return "cfg_" + flag.lstrip("-").replace("-", "_")


def _default(section: str, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


def _metavar(section: str, name: str, parse: Callable[[str], Any]) -> str:
    """``{bernoulli,mse}`` for an enumerated field, else the value's kind: INT, FLOAT, DIMS, DIR."""
    choices = CHOICES.get(f"{section}.{name}")
    return "{" + ",".join(choices) + "}" if choices else getattr(parse, "metavar", "DIR")


def add_config_flags(parser: argparse.ArgumentParser) -> None:
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
            dest=dest(flag),
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
        value = getattr(args, dest(flag))
        if value is not None:
            key = f"{section}.{name}"
            if sources.get(key) == str(path) and values[section][name] != value:
                overridden[key] = values[section][name]  # shown by --print-config
            values[section][name] = value
            sources[key] = flag
    # the flags of the fields a file did not set (typed, or left at their defaults; on a resume,
    # where the run's config.json holds the rest, only those typed), for the refusals of this
    # command (``in_flags``), however late they come
    resuming = getattr(args, "resume", None) is not None
    args.typed = {}
    for flag, (section, name, _, _) in FLAGS.items():
        source = sources.get(f"{section}.{name}")
        if source == flag or (source is None and not resuming):
            args.typed[f"{section}.{name}"] = flag
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
