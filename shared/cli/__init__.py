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
- :mod:`~cvae_rosetta.cli.exits`: :func:`main`, and how a command ends (its exit status).
"""

from cvae_rosetta.cli.exits import main
from cvae_rosetta.cli.parser import build_parser

__all__ = ["build_parser", "main"]
