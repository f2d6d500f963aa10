"""How a command ends: :func:`main` runs the command the arguments name, and says its refusal,
its failure or its stop in one line with an exit status (docs/cli.md), never a traceback but for a
bug.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from cvae_rosetta import files
from cvae_rosetta.app import signals
from cvae_rosetta.cli.checks import check_paths
from cvae_rosetta.cli.jaxstart import check_jax_flags, platform_unavailable
from cvae_rosetta.cli.messages import about_flags, in_flags
from cvae_rosetta.cli.parser import build_parser
from cvae_rosetta.spec.errors import CvaeError

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
        check_paths(args)
        check_jax_flags(args)
        return args.func(args)
    except CvaeError as err:  # files.say: on stderr even after a full disk silenced fd 2
        files.say(f"cvae: error: {in_flags(about_flags(err, args), getattr(args, 'typed', None))}")
        return REFUSED
    except RuntimeError as err:  # JAX refusing --platform when it starts (no such device here)
        if (line := platform_unavailable(err, args)) is None:
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


def _resume_command(run_dir: Path) -> str:
    return f"cvae train --resume {run_dir}"
