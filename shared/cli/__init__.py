"""The ``cvae`` command line: ``impls``, ``train``, ``compare``, ``evaluate``, ``launch``, and for
checkpoints and trained models ``convert``, ``sample``, ``reconstruct`` and ``export``; ``bench``
measures every implementation's step.

Every config field has a flag (``--latent-dim``, ``--loss``, ``--learning-rate``, ...). Values are
handed to the config dataclasses unparsed where they do not parse, so a bad value gets the same
message as anywhere else: the field, what was expected, what was given. Every check (config,
implementation, data, batch size, output directory) runs before the first file is written; a
refusal is one line on stderr and exit status 2, never a traceback.

- :mod:`~cvae_rosetta.cli.flags`: the config flags, and the config they and ``--config`` resolve to;
- :mod:`~cvae_rosetta.cli.messages`: the application's errors in terms of the flags;
- :mod:`~cvae_rosetta.cli.checks`: the checks that need no JAX;
- :mod:`~cvae_rosetta.cli.jaxstart`: the platform and the compilation cache, and JAX's start-up;
- :mod:`~cvae_rosetta.cli.parser`: the parser of ``cvae`` and of each command;
- :mod:`~cvae_rosetta.cli.training`: ``cvae train`` and ``cvae compare``;
- :mod:`~cvae_rosetta.cli.commands`: every other command;
- :mod:`~cvae_rosetta.cli.exits`: :func:`main`, and how a command ends (its exit status);
- :mod:`~cvae_rosetta.cli.tiny_runs`: tiny runs of the command to interrupt and resume, for the
  fault tests and the fault sweep (``benchmarks/fault_report.py``); the command never imports it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """:func:`cvae_rosetta.cli.exits.main`, with a stop while the CLI itself is imported (a
    quarter of a second: argparse, NumPy, the config) told in one line like any other stop
    (status 128 + the signal) rather than Python's silent SIGTERM or KeyboardInterrupt traceback.
    Only a signal before Python runs this function still ends the process without a line."""
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        from cvae_rosetta.cli import exits
    except KeyboardInterrupt:
        caught.append(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if caught:
        name = signal.Signals(caught[0]).name
        print(f"cvae: stopped by {name} while starting, nothing written; run the same command",
              file=sys.stderr)  # fmt: skip
        return 128 + caught[0]
    return exits.main(argv)


def __getattr__(name: str) -> Any:
    if name == "build_parser":  # imported on first use, after main's handler is in place
        from cvae_rosetta.cli.parser import build_parser

        return build_parser
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
