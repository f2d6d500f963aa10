"""The application's errors in the terms of this CLI: :data:`FIELD_FLAGS`, the one table from
the names an error starts with or mentions (config fields, the parameters of the application's
functions) to the flags that set them, and :func:`in_flags`, which rewrites a message with it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path

from cvae_rosetta.bench.settings import SETTING_FLAGS
from cvae_rosetta.cli.flags import FLAGS
from cvae_rosetta.spec.config import SECTIONS
from cvae_rosetta.spec.errors import DataError

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
    "impl": "--impl",
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
    a file did not set (typed, or at its default) to its flag (``args.typed``). A name without a
    flag passes unchanged."""
    typed = typed or {}
    *leads, last = message.split(": ")
    shown = [
        _as_typed(lead, typed) if _config_fields(lead) else _NAMED_INSIDE.sub(_flag_of, lead)
        for lead in leads
    ]
    if leads and leads[0] in FIELD_FLAGS and not _config_fields(leads[0]):
        shown[0] = FIELD_FLAGS[leads[0]]
    return ": ".join([*shown, _NAMED_INSIDE.sub(_flag_of, last)])


def about_flags(err: Exception, args: argparse.Namespace) -> str:
    """``err``'s message, led by the flag it follows from where it names none: a data file that
    ``--data-dir`` pointed to (``damaged/mnist.npz: expected a readable NPZ file ...``) is
    refused as ``data.data_dir: damaged/mnist.npz: ...``, which :func:`in_flags` shows as the flag
    typed."""
    text = str(err)
    data_dir = getattr(args, "cfg_data_dir", None)
    lead = text.partition(": ")[0]
    if isinstance(err, DataError) and data_dir and Path(lead).is_relative_to(data_dir):
        return f"data.data_dir: {text}"
    return text


def _flag_of(match: re.Match[str]) -> str:
    return FIELD_FLAGS[match.group(0)]


def _as_typed(fields: str, typed: Mapping[str, str]) -> str:
    """``model.encoder_dims[1]`` as ``--encoder-dims (model.encoder_dims[1])`` where the user typed
    ``--encoder-dims`` or left it at its default; unchanged where a value came from a file."""
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
