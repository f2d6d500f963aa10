"""A process lost during a run of several processes, and the one line each of the others says.

A process that dies (SIGKILL, a crashed host) breaks the next collective of the others:
:func:`lost_peers` turns that ``jax.errors.JaxRuntimeError`` into one line naming the lost
process, the last checkpoint and the command that goes on from it, and ends the process at once
(the shutdown ``jax.distributed`` runs at exit would wait for the lost process, then abort with a
stack trace). The launcher gives the others :data:`~cvae_rosetta.app.cluster.launch.LOST_GRACE`
seconds to say so and end, and says in one line which process it lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app.cluster.membership import Cluster, Place, resume_command

LOST_STATUS = 2  # the exit status of a process whose run lost another process

# what a collective that lost a process raises says (gloo's, the coordination service's)
_LOST = re.compile(
    r"gloo|connection|peer|heartbeat|unavailable|coordinat|barrier|collective|socket", re.I
)
# the runtime's errors start with their status; some reach Python as another type (the all-gather
# of Cluster.agree raises ValueError("UNKNOWN: Gloo AllGather failed: ... Connection closed by
# peer ..."))
_STATUS = re.compile(r"^(?:UNKNOWN|UNAVAILABLE|INTERNAL|ABORTED|CANCELLED|DEADLINE_EXCEEDED): ")


def is_lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed because a process of the run is gone: a
    ``jax.errors.JaxRuntimeError`` (or another error with the runtime's status) that says so
    (gloo: ``Gloo all-reduce failed: ... Connection reset by peer``)."""
    import jax

    text = str(error)
    runtime = isinstance(error, jax.errors.JaxRuntimeError) or bool(_STATUS.match(text))
    return runtime and bool(_LOST.search(text))


def _reason(error: BaseException) -> str:
    """The first line of the runtime's error, without its status code and source locations."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    text = re.sub(r"^[A-Z_]+: ", "", text)
    text = re.sub(r"\[[\w./-]+\.(?:cc|h|cpp):\d+\] ", "", text)
    return text if len(text) <= 160 else text[:157] + "..."


def latest_checkpoint(run_dir: Path) -> int | None:
    """The step of the newest committed checkpoint of ``run_dir`` (a directory named by its step;
    one being written has a longer name), ``None`` if none."""
    from cvae_rosetta.app.checkpoint import checkpoints_of

    where = checkpoints_of(run_dir)
    steps = [int(p.name) for p in where.iterdir() if p.name.isdigit()] if where.is_dir() else []
    return max(steps, default=None)


def lost_message(place: Place | Cluster, error: BaseException, run_dir: Any) -> str:
    """The line a process says when its run lost another process: which one (the other one of
    two; of more, the launcher names it), why, the last checkpoint and how to go on."""
    others = place.num_processes - 1
    if others == 1:
        who = f"process {1 - place.process_id} of 2"
    else:
        who = f"one of the other {others} processes of {place.num_processes}"
    line = f"lost {who} ({_reason(error)})"
    step = latest_checkpoint(Path(run_dir))
    if step is None:
        return (
            f"{line}; the run stopped before its first checkpoint: start it again (with "
            "--overwrite)"
        )
    from cvae_rosetta.app.checkpoint import checkpoints_of

    where = checkpoints_of(Path(run_dir))
    return (
        f"{line}; the last checkpoint, step {step}, is in {where}; go on with: "
        f"{resume_command(place)(run_dir)}"
    )


def _end_now(status: int) -> None:
    """End the process at once: its output flushed, and neither ``jax.distributed``'s shutdown
    (which waits for every process, the lost one too, then aborts) nor any thread heard from."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@contextlib.contextmanager
def lost_peers(place: Place | Cluster | None, run_dir: Any) -> Iterator[None]:
    """Around the training of a run of several processes (nothing for one of one process): a
    collective that fails because a process is gone (:func:`is_lost_peer`) prints one line on
    stderr (:func:`lost_message`) and ends this process with :data:`LOST_STATUS` at once, once
    the block's own clean-up (its ``finally`` and ``with`` exits) has run."""
    if place is None:
        yield
        return
    try:
        yield
    except Exception as err:
        if not is_lost_peer(err):
            raise
        # the runtime's threads log the lost peer on file descriptor 2 as the process ends:
        # silenced first, so that none of it lands inside the line (a line of theirs once
        # followed this one's text before its newline)
        line = f"cvae: error: {lost_message(place, err, run_dir)}"
        files.silence_stderr()
        files.say(line)
        _end_now(LOST_STATUS)
