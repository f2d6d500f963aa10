"""A run directory: the names of the files ``cvae train`` and ``cvae compare`` write into it, and
how they refuse to clobber.

Everything that could refuse a run (the output directory included) is checked by
:func:`check_out_dir` before any file is written, so bad input never leaves a half-made directory.
A run directory has one writer at a time (:class:`~cvae_rosetta.app.runlock.RunLock`), and a write
the disk refuses ends the run with :class:`~cvae_rosetta.files.WriteFailed`, naming the file and
what was being written (:func:`~cvae_rosetta.files.writing`). What goes into the files is written
by :mod:`~cvae_rosetta.app.metricslog` (``metrics.jsonl``), :mod:`~cvae_rosetta.app.paramsfile`
(``params.npz``) and :mod:`~cvae_rosetta.app.runpictures` (the pictures).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app.run import PROFILE_DIR, TB_DIR
from cvae_rosetta.app.runlock import LOCK_FILE, RunLock
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import OutputError

# The file layout of a run directory, written once: every writer and reader names files by these.
CONFIG_FILE = "config.json"  # the whole resolved config; its presence marks a run directory
METRICS_FILE = "metrics.jsonl"  # one record per step and per epoch, appended as training goes
SAMPLES_FILE = "samples.png"
RECONSTRUCTIONS_FILE = "reconstructions.png"
CURVES_FILE = "curves.png"
SUMMARY_FILE = "summary.json"
PARAMS_FILE = "params.npz"  # the final canonical parameters
EVALUATION_FILE = "evaluation.json"  # what cvae evaluate writes, with the two pictures below
GENERATED_FILE = "generated.png"
LATENT_FILE = "latent.png"
CHECKPOINT_DIR = "checkpoints"
RUN_FILES = (
    CONFIG_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    RECONSTRUCTIONS_FILE,
    CURVES_FILE,
    SUMMARY_FILE,
    PARAMS_FILE,
)
EVALUATION_FILES = (EVALUATION_FILE, GENERATED_FILE, LATENT_FILE)
OUTPUT_FILES = (*RUN_FILES, *EVALUATION_FILES)  # a finished run's, each written after its last step
RUN_MARKER = CONFIG_FILE
# What else a run (cvae train, --resume, evaluate) or a cvae compare writes into its directory:
# everything --overwrite may delete (OWN_NAMES). TB_DIR and PROFILE_DIR are app.run's, LOCK_FILE
# app.runlock's, DAMAGED_DIR app.resuming's (tests/test_pictures.py checks they agree).
DAMAGED_DIR = "checkpoints.damaged"
COMPARE_FILES = (CONFIG_FILE, CURVES_FILE, SAMPLES_FILE, "summary.md", SUMMARY_FILE)
OWN_DIRS = (CHECKPOINT_DIR, DAMAGED_DIR, TB_DIR, PROFILE_DIR)
OWN_NAMES = frozenset((*RUN_FILES, *EVALUATION_FILES, *COMPARE_FILES, LOCK_FILE, *OWN_DIRS))
# files.atomic_write's temporaries and check_out_dir's probes, left behind by a killed command
_TEMPORARY = re.compile(r"\..+\.\d+\.[0-9a-f]{8}\.tmp|\.cvae-probe-.+")


def check_out_dir(
    path: str | os.PathLike[str], *, overwrite: bool, marker: str = RUN_MARKER, what: str = "run"
) -> Path:
    """Refuse an output directory that would lose something or cannot be written.

    A non-empty directory is refused unless ``overwrite``; even then only a previous ``what`` (a
    run directory: one holding ``marker``, ``config.json``) is replaced, never an arbitrary folder,
    and a previous run only while it holds nothing but what runs write (:func:`foreign_entries`:
    anything else is named in the refusal, and nothing is deleted). ``cvae export`` and ``cvae
    bench`` check their ``--out`` with this too, with their own marker.
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputError(f"out: expected a directory, got the existing file {out}")
    if out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir()):
        if not overwrite:
            raise OutputError(
                f"out: expected an empty or new directory, got {out}, which is not empty "
                f"(overwrite=True replaces a previous {what} there)"
            )
        if not (out / marker).is_file():
            raise OutputError(
                f"out: {out} is not empty and holds no {marker}, so it is not a previous "
                f"{what}; refusing to overwrite it"
            )
        if marker == RUN_MARKER:
            _refuse_foreign(out)
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"out: expected a directory path, got {out}, but {ancestor} is a file")
    try:  # a real probe: permissions, read-only file systems and quotas all show here
        tempfile.TemporaryDirectory(dir=ancestor, prefix=".cvae-probe-").cleanup()
    except OSError as err:
        raise OutputError(
            f"out: expected a writable location, got {out} ({ancestor}: {err.strerror})"
        ) from err
    return out


def foreign_entries(out: Path) -> list[str]:
    """What in the run directory ``out`` no ``cvae train`` or ``cvae compare`` wrote, sorted, as
    paths relative to ``out`` (a folder with a trailing ``/``): a name outside :data:`OWN_NAMES`
    and the folders a compare's ``config.json`` lists (whose insides are checked alike), other
    than a temporary of an interrupted write (:func:`cvae_rosetta.files.atomic_write`) or of
    the probe of :func:`check_out_dir`."""
    folders: list[str] = []
    with contextlib.suppress(OSError, ValueError, AttributeError):
        listed = json.loads((out / CONFIG_FILE).read_text()).get("folders", [])
        folders = [f for f in listed if isinstance(f, str) and f and "/" not in f]
    found = []
    for entry in sorted(out.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name in folders and entry.is_dir() and not entry.is_symlink():
            found += [f"{name}/{inner}" for inner in foreign_entries(entry)]
        elif name not in OWN_NAMES and not _TEMPORARY.fullmatch(name):
            found.append(name + ("/" if entry.is_dir() and not entry.is_symlink() else ""))
    return found


def _refuse_foreign(out: Path) -> None:
    """``--overwrite`` replaces a previous run's own files only: anything else a user put there
    is named, and the run refused, before anything is deleted."""
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:10]) + (
            f", ... ({len(foreign) - 10} more)" * (len(foreign) > 10)
        )
        raise OutputError(
            f"out: expected a previous run holding only its own files (overwrite=True deletes "
            f"them), got {out} with {len(foreign)} that no run wrote: {shown}; move them out "
            f"of {out} first"
        )


def make_out_dir(out: Path, *, overwrite: bool, marker: str = RUN_MARKER) -> Path:
    """Create ``out`` (after :func:`check_out_dir`), removing a previous run there (one holding
    ``marker``) if allowed."""
    if overwrite and out.is_dir() and (out / marker).is_file():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def claim_out_dir(out: Path, *, overwrite: bool, command: str) -> RunLock:
    """Create the run directory ``out`` (after :func:`check_out_dir`) and lock it for this process;
    checked again under the lock (another run may have filled it since), then a previous run there
    is removed if ``overwrite``. The caller releases the lock when the run ends."""
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock.acquire(out, command=command, field="out")
    try:
        check_out_dir(out, overwrite=overwrite)
        for entry in out.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except BaseException:
        lock.release()
        raise
    return lock


def save_config(out: Path, config: Config, **extra: Any) -> None:
    """``config.json``: the whole resolved config under ``"config"``, beside what else is given."""
    files.write_json(out / RUN_MARKER, {**extra, "config": config.to_dict()})
