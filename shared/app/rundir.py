"""A run directory: what ``cvae train`` and ``cvae compare`` write, and how they refuse to clobber.

Everything that could refuse a run (the output directory included) is checked by
:func:`check_out_dir` before any file is written, so bad input never leaves a half-made directory.
A run directory has one writer at a time (:class:`RunLock`), and a write the disk refuses ends the
run with :class:`~cvae_rosetta.files.WriteFailed`, naming the file and what was being written
(:func:`~cvae_rosetta.files.writing`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app import images
from cvae_rosetta.app.data import Dataset
from cvae_rosetta.app.run import PROFILE_DIR, TB_DIR, Record, RunKeys
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import OutputError, ParameterError
from cvae_rosetta.spec.model import generate, reconstruct

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
LOCK_FILE = "run.lock"  # flocked by the one process writing the directory; names it (RunLock)
RUN_MARKER = CONFIG_FILE
# What else a run (cvae train, --resume, evaluate) or a cvae compare writes into its directory:
# everything --overwrite may delete (own_entries). TB_DIR and PROFILE_DIR are app.run's,
# DAMAGED_DIR app.resuming's (tests/test_pictures.py checks they agree).
DAMAGED_DIR = "checkpoints.damaged"
COMPARE_FILES = (CONFIG_FILE, CURVES_FILE, SAMPLES_FILE, "summary.md", SUMMARY_FILE)
OWN_DIRS = (CHECKPOINT_DIR, DAMAGED_DIR, TB_DIR, PROFILE_DIR)
OWN_NAMES = frozenset((*RUN_FILES, *EVALUATION_FILES, *COMPARE_FILES, LOCK_FILE, *OWN_DIRS))
# files.atomic_write's temporaries and check_out_dir's probes, left behind by a killed command
_TEMPORARY = re.compile(r"\..+\.\d+\.[0-9a-f]{8}\.tmp|\.cvae-probe-.+")
SAMPLES_PER_CLASS = 8
RECONSTRUCTIONS = 16


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


class MetricsLog:
    """``metrics.jsonl``: one JSON record per line, flushed as it is made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with files.writing(path.name, path):
            self._file = open(path, "a")  # noqa: SIM115 - closed by close()

    def __call__(self, record: Record) -> None:
        with files.writing(self.path.name, self.path):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file; after a failed write its buffer still holds that record, which the close
        tries to write again, and may fail on the same full disk."""
        with files.writing(self.path.name, self.path):
            self._file.close()


def read_metrics(path: Path) -> list[Record]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def curves_of(records: list[Record]) -> dict[str, list[tuple[float, float]]]:
    """Train curves per step and test curves per epoch (at the step the epoch ended)."""
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r["event"] == "step":
            for name in ("loss", "recon", "kl"):
                curves.setdefault(f"train {name}", []).append((r["step"], r[name]))
        elif r["event"] == "epoch":
            for name in ("loss", "recon", "kl"):
                curves.setdefault(f"test {name}", []).append((r["step"], r[f"test_{name}"]))
    return curves


def trained_with(directory: Path, current: str, last_step: int) -> list[tuple[str, int, int]]:
    """Which implementation took which steps of the run in ``directory``, in order: ``(name,
    first step, last step)``, from ``config.json``'s ``resumes`` (each ``--resume`` records the
    step it went on from, its implementation and the checkpoint's). A resume from an earlier
    checkpoint drops the steps after it, as it cuts ``metrics.jsonl`` back; neighbouring parts of
    one implementation are one. ``current``: the implementation now running (the only one of a run
    never resumed, or whose ``config.json`` cannot be read); ``last_step``: the run's last step."""
    try:
        resumes = json.loads((directory / CONFIG_FILE).read_text()).get("resumes", [])
        parts = [(str(resumes[0]["from"]), 0)] if resumes else []
        for resume in resumes:
            step = int(resume["step"])
            parts = [part for part in parts if part[1] < step] + [(str(resume["impl"]), step)]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        parts = []
    if not parts or parts[-1][0] != current:
        parts = [(current, 0)]  # not this run's record after all: the one name known
    ranges: list[tuple[str, int, int]] = []
    for (name, start), (_, end) in zip(parts, [*parts[1:], ("", last_step)], strict=True):
        if end <= start:
            continue
        if ranges and ranges[-1][0] == name:
            ranges[-1] = (name, ranges[-1][1], end)
        else:
            ranges.append((name, start + 1, end))
    return ranges or [(current, 1, last_step)]


def run_title(directory: Path, current: str, records: list[Record]) -> str:
    """The implementations a run was trained with, for a picture's title: ``pure_jax``, or
    ``pure_jax (steps 1-40), then keras (41-80)`` for a run resumed in another framework
    (:func:`trained_with`; ``records``: the run's, to its last step)."""
    last_step = max((int(r.get("step", 0)) for r in records), default=0)
    ranges = trained_with(directory, current, last_step)
    if len(ranges) == 1:
        return ranges[0][0]
    shown = [f"{name} ({first}-{last})" for name, first, last in ranges]
    return f"{shown[0].replace(' (', ' (steps ', 1)}, then " + ", then ".join(shown[1:])


def write_pictures(out: Path, impl, state, dataset: Dataset, keys: RunKeys, *, title: str) -> None:
    """``samples.png`` (a row per label) and ``reconstructions.png`` (test digits beside theirs)."""
    k = dataset.num_classes
    labels = np.repeat(np.arange(k, dtype=np.int32), SAMPLES_PER_CLASS)
    samples = np.asarray(generate(impl, state, keys.sample, labels))
    images.sample_grid(
        samples, labels, dataset.image_shape, out / SAMPLES_FILE, title=f"{title}: samples"
    )
    n = min(RECONSTRUCTIONS, len(dataset.test))
    x, c = jax.numpy.asarray(dataset.test.x[:n]), jax.numpy.asarray(dataset.test.c[:n])
    recon = np.asarray(reconstruct(impl, state, x, c))
    images.reconstruction_grid(
        np.asarray(x),
        recon,
        dataset.image_shape,
        out / RECONSTRUCTIONS_FILE,
        title=f"{title}: reconstructions",
    )


def summary_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table: ``columns`` are ``(key, header, format)``."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        cells.append(
            [(fmt.format(row[key]) if row.get(key) is not None else "-") for key, _, fmt in columns]
        )
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def save_config(out: Path, config: Config, **extra: Any) -> None:
    """``config.json``: the whole resolved config under ``"config"``, beside what else is given."""
    files.write_json(out / RUN_MARKER, {**extra, "config": config.to_dict()})


# --- parameters -----------------------------------------------------------------------------------

PARAM_GROUPS = ("encoder", "latent", "decoder")


def flatten_params(params: Any) -> dict[str, np.ndarray]:
    """A canonical tree as ``{"encoder/0/kernel": array, "latent/bias": array, ...}``."""
    flat = {}
    for group in PARAM_GROUPS:
        node = params[group]
        if isinstance(node, dict):
            layers = [("", node)]
        else:
            layers = [(f"/{i}", n) for i, n in enumerate(node)]
        for index, layer in layers:
            for leaf in ("kernel", "bias"):
                flat[f"{group}{index}/{leaf}"] = np.asarray(layer[leaf])
    return flat


def unflatten_params(flat: dict[str, np.ndarray], *, source: str = "params") -> dict[str, Any]:
    """The inverse of :func:`flatten_params`; refuses a key that is not ``group[/i]/leaf``."""
    layers: dict[str, dict[int, dict[str, np.ndarray]]] = {g: {} for g in PARAM_GROUPS}
    for key, value in flat.items():
        parts = key.split("/")
        ok = len(parts) == 3 and parts[0] in ("encoder", "decoder") and parts[1].isdigit()
        ok = ok or (len(parts) == 2 and parts[0] == "latent")
        if not ok or parts[-1] not in ("kernel", "bias"):
            raise ParameterError(
                f"{source}: expected keys like encoder/0/kernel, latent/bias or decoder/1/bias, "
                f"got {key!r}"
            )
        index = int(parts[1]) if len(parts) == 3 else 0
        layers[parts[0]].setdefault(index, {})[parts[-1]] = value
    tree: dict[str, Any] = {}
    for group, found in layers.items():
        if sorted(found) != list(range(len(found))) or not found:
            raise ParameterError(
                f"{source}: expected {group} layers numbered 0, 1, ..., got "
                f"{sorted(found) or 'none'}"
            )
        ordered = [found[i] for i in range(len(found))]
        tree[group] = ordered[0] if group == "latent" else ordered
    return tree


def save_params(path: Path, params: Any) -> None:
    """``params.npz``: the canonical parameters, flattened, arrays only, written atomically."""
    flat = flatten_params(jax.device_get(params))
    files.atomic_write(path, lambda handle: np.savez(handle, **flat))


def load_params(path: Path) -> dict[str, Any]:
    """The canonical tree in ``params.npz`` (no pickles); check it with ``canonical.check``."""
    import zipfile
    import zlib

    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ParameterError(f"{path}: expected an NPZ archive of named arrays, got one array")
        with npz:
            flat = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        if isinstance(err, ParameterError):
            raise
        raise ParameterError(
            f"{path}: expected an NPZ file of canonical parameters, got {type(err).__name__}: {err}"
        ) from err
    for key, value in flat.items():
        if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
            raise ParameterError(f"{path}: {key}: expected finite values, got NaN or infinity")
    return unflatten_params(flat, source=str(path))


# --- one writer per run directory -----------------------------------------------------------------


class RunLock:
    """The one process writing a run directory: an exclusive ``flock`` on ``RUN/run.lock``, held
    from the first write of ``cvae train`` (or ``--resume``, or ``cvae evaluate``) to its end.

    The file holds the holder's record (pid, host, since when, command) while it is held and is
    removed when released, so a run that ended (finished, refused or stopped) leaves none: the
    holder unlinks it while still holding the lock, and a process that locks a file checks that
    the path still names that very file (else it was released meanwhile, and it locks afresh), so
    two processes never hold two different ``run.lock`` files. The kernel drops the lock of a
    process that dies (SIGKILL leaves the file), so a record left behind by a killed run is taken
    over, with a warning naming it. Where the file system cannot lock files, the record alone
    decides: a record of a live process on this host (or of any other host) refuses.
    """

    ATTEMPTS = 20  # locks of a file released between its open and its flock, before giving up

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path, self._descriptor = path, descriptor

    @classmethod
    def acquire(cls, directory: Path, *, command: str, field: str) -> RunLock:
        """Lock ``directory`` or refuse at once, naming the holder (``field`` leads the message)."""
        path = Path(directory) / LOCK_FILE
        for _ in range(cls.ATTEMPTS):
            with files.writing(LOCK_FILE, path):
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                held = cls._lock(descriptor)
            except BaseException:
                os.close(descriptor)
                raise
            if held is False or _same_file(descriptor, path):
                break
            os.close(descriptor)  # released and removed since it was opened: open it afresh
        else:
            raise OutputError(
                f"{field}: could not lock {path}: it was removed {cls.ATTEMPTS} times"
            )
        return cls._claim(path, descriptor, held, command=command, field=field)

    @classmethod
    def _claim(
        cls, path: Path, descriptor: int, held: bool | None, *, command: str, field: str
    ) -> RunLock:
        """Write this process's record into the lock file ``descriptor`` locked (``held``), or
        refuse naming its holder."""
        directory = path.parent
        try:
            previous = _read_holder(descriptor)
            if held is None and previous and _alive(previous):
                held = False  # no file locks here: the record of a live process refuses
            if held is False:
                raise OutputError(
                    f"{field}: expected a run directory no other process is writing, got "
                    f"{directory}, held by {describe_holder(previous)}"
                )
            if previous:
                state = "no longer running" if _dead_here(previous) else "no longer holding it"
                print(
                    f"cvae: warning: took over {path} from {describe_holder(previous)}, {state}",
                    file=sys.stderr,
                )
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": command,
            }
            with files.writing(LOCK_FILE, path):
                _write_holder(descriptor, json.dumps(record) + "\n")
        except BaseException:
            os.close(descriptor)
            raise
        return cls(path, descriptor)

    @staticmethod
    def _lock(descriptor: int) -> bool | None:
        """True: locked; False: another process holds it; None: this file system cannot lock."""
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as err:
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise
        return True

    def release(self) -> None:
        """Remove the lock file (while holding it: see the class) and drop the lock."""
        if self._descriptor < 0:
            return
        with contextlib.suppress(OSError):  # a full disk cannot refuse a truncation
            os.ftruncate(self._descriptor, 0)
        with contextlib.suppress(OSError):  # gone or not ours to remove: emptied all the same
            if _same_file(self._descriptor, self.path):
                self.path.unlink()
        os.close(self._descriptor)  # drops the flock
        self._descriptor = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _same_file(descriptor: int, path: Path) -> bool:
    """The open file ``descriptor`` is still the one ``path`` names."""
    try:
        opened, named = os.fstat(descriptor), os.stat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def refuse_if_held(directory: Path, *, field: str) -> None:
    """Refuse, naming its holder, a run directory another live process holds (a run still being
    written), without taking the lock: for a reader that checks before it reads."""
    path = Path(directory) / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody holds it
    try:
        holder = _read_holder(descriptor)
        held = RunLock._lock(descriptor)
    finally:
        os.close(descriptor)  # drops the lock this check may have taken
    if held is True or (held is None and not (holder and _alive(holder))):
        return  # nobody holds it (where files cannot be locked, no live process's record)
    raise OutputError(
        f"{field}: expected a run directory no other process is writing, got {directory}, held "
        f"by {describe_holder(holder)}"
    )


def _read_holder(descriptor: int) -> dict[str, Any]:
    try:
        holder = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _write_holder(descriptor: int, text: str) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, text.encode(), 0)
    os.fsync(descriptor)


def _dead_here(holder: dict[str, Any]) -> bool:
    """The holder ran on this host and its process is gone."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, someone else's
    return False


def _alive(holder: dict[str, Any]) -> bool:
    return not _dead_here(holder) and holder.get("pid") != os.getpid()


def describe_holder(holder: dict[str, Any]) -> str:
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since "
        f"{holder.get('since', '?')} ({holder.get('command', '?')})"
    )
