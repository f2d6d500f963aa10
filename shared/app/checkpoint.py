"""Checkpoints: crash-safe, exact to resume, readable by every implementation. The one module that
talks to Orbax.

A checkpoint holds the train state in **canonical** form, so any implementation can continue it:

```
{"step":      i32[],                          # optimiser steps taken
 "params":    canonical parameters,          # SPEC section 2
 "opt_state": {"count": i32[],               # Adam's step count
               "mu":    canonical tree,      # Adam's first moments, shaped like the parameters
               "nu":    canonical tree},     # and second moments
 "run_keys":  u32[5, ...]}                   # key data of the run's keys (run.RunKeys)
```

beside JSON metadata: the position (step, epoch, batch within the epoch), the current epoch's step
metrics, the number of records in ``metrics.jsonl``, the whole config, the implementation that
wrote it, a fingerprint of the data, and the SHA-256 of every array. An implementation's train
state is converted to that form and back by :mod:`cvae_rosetta.app.trainstate`.

On disk, ``RUN/checkpoints/<step>/`` is one Orbax checkpoint (``ocp.Checkpointer``, Orbax's
current API only): the arrays (``arrays/``, OCDBT/Zarr), the metadata (``meta/``, JSON) and,
written by the handler's ``finalize`` just before Orbax's atomic rename commits it,
``cvae_files.json``: the size and SHA-256 of every file in it. A save killed at
any point leaves a temporary directory that is never read and the previous checkpoints intact; a
truncated or altered file is found before anything is read. Only arrays and JSON: no pickle.

Beside it: stopping on a signal and when to write a checkpoint (:mod:`cvae_rosetta.app.signals`),
resuming a run directory (:mod:`cvae_rosetta.app.resuming`) and the canonical checkpoint file of
``cvae convert`` (:mod:`cvae_rosetta.app.convert`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app.paramsfile import flatten, unflatten_params
from cvae_rosetta.app.run import DEFAULT_KEEP, Position, Progress, RunKeys
from cvae_rosetta.app.rundir import CHECKPOINT_DIR
from cvae_rosetta.app.trainstate import canonical_state, check_state_tree
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import CheckpointError, ConfigError, ParameterError

FORMAT = "cvae-rosetta checkpoint"
VERSION = 1
FILES = "cvae_files.json"  # written into every checkpoint just before its commit
ORBAX_FILES = ("_CHECKPOINT_METADATA", "commit_success.txt")  # Orbax writes them at the commit
# A test hook: "N:SECONDS" makes the N-th save of the process sleep for SECONDS just before its
# commit, so a test can kill the process in the middle of a save.
SLOW_SAVE_ENV = "CVAE_CHECKPOINT_SLOW_SAVE"


# --- flat names, checksums ------------------------------------------------------------------------


def unflatten(flat: dict[str, np.ndarray], *, source: str) -> dict[str, Any]:
    """The train-state tree (and ``run_keys``) from the names of
    :func:`~cvae_rosetta.app.paramsfile.flatten`."""
    groups: dict[str, dict[str, np.ndarray]] = {"params": {}, "mu": {}, "nu": {}}
    tree: dict[str, Any] = {"opt_state": {}}
    for name, value in flat.items():
        head, _, rest = name.partition("/")
        if name in ("step", "run_keys"):
            tree[name] = value
        elif name == "opt_state/count":
            tree["opt_state"]["count"] = value
        elif head == "params":
            groups["params"][rest] = value
        elif head == "opt_state" and rest.partition("/")[0] in ("mu", "nu"):
            moment, _, leaf = rest.partition("/")
            groups[moment][leaf] = value
        else:
            raise CheckpointError(f"{source}: unexpected array {name!r}")
    try:
        tree["params"] = unflatten_params(groups["params"], source=f"{source}: params")
        for moment in ("mu", "nu"):
            tree["opt_state"][moment] = unflatten_params(
                groups[moment], source=f"{source}: opt_state/{moment}"
            )
    except ParameterError as err:
        raise CheckpointError(str(err)) from err
    return tree


def array_digest(array: np.ndarray) -> dict[str, Any]:
    array = np.ascontiguousarray(array)
    return {
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "sha256": hashlib.sha256(array.tobytes()).hexdigest(),
    }


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(dataset: Any) -> str:
    """SHA-256 of the data set's arrays: a resumed run must see the very same examples."""
    digest = hashlib.sha256()
    for split in (dataset.train, dataset.test):
        for array in (split.x, split.c):
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def key_data(keys: RunKeys) -> tuple[np.ndarray, str]:
    """The run's keys as ``uint32`` key data, and the name of their PRNG implementation."""
    fields = [getattr(keys, f.name) for f in dataclasses.fields(RunKeys)]
    data = np.stack([np.asarray(jax.random.key_data(k)) for k in fields])
    return data, str(jax.random.key_impl(fields[0]))


def keys_from_data(data: np.ndarray, impl: str) -> RunKeys:
    try:
        return RunKeys(*(jax.random.wrap_key_data(jnp.asarray(k), impl=impl) for k in data))
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"run_keys: expected key data of the {impl!r} PRNG, got {describe_array(data)}: {err}"
        ) from err


def describe_array(array: Any) -> str:
    return f"an array of shape {tuple(np.shape(array))} and dtype {np.asarray(array).dtype}"


# --- one checkpoint -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One checkpoint: the canonical train state and everything the run needs to go on."""

    state: dict[str, Any]  # the canonical train state (step, params, opt_state), host arrays
    keys: RunKeys
    progress: Progress
    config: Config
    impl: str  # the implementation that wrote it
    data: str | None = None  # fingerprint of the data set (data_fingerprint)

    @property
    def step(self) -> int:
        return self.progress.position.step

    def arrays(self) -> dict[str, Any]:
        data, _ = key_data(self.keys)
        return {**self.state, "run_keys": data}

    def metadata(self) -> dict[str, Any]:
        from cvae_rosetta.app import frameworks

        position = self.progress.position
        _, prng = key_data(self.keys)
        framework = frameworks.distribution(self.impl)
        return {
            "format": FORMAT,
            "version": VERSION,
            "step": position.step,
            "epoch": position.epoch,
            "batch": position.batch,
            "epoch_metrics": [list(m) for m in self.progress.epoch_metrics],
            "records": self.progress.records,
            "seconds": self.progress.seconds,
            "impl": self.impl,
            "versions": {
                "jax": jax.__version__,
                **({framework: frameworks.version(framework)} if framework else {}),
            },
            "config": self.config.to_dict(),
            "data_sha256": self.data,
            "prng": prng,
            "arrays": {name: array_digest(a) for name, a in flatten(self.arrays()).items()},
        }


def from_parts(flat: dict[str, np.ndarray], meta: Any, *, source: str) -> Checkpoint:
    """A checkpoint from its arrays (flat names) and metadata, every checksum and field checked."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{source}: expected metadata of format {FORMAT!r}, got {meta!r:.80}")
    if meta.get("version") != VERSION:
        raise CheckpointError(
            f"{source}: expected checkpoint format version {VERSION}, got {meta.get('version')!r}"
        )
    try:
        digests = meta["arrays"]
        if set(digests) != set(flat):
            missing = sorted(set(digests) - set(flat))
            extra = sorted(set(flat) - set(digests))
            raise CheckpointError(
                f"{source}: expected the arrays its metadata lists, got missing {missing} and "
                f"unlisted {extra}"
            )
        for name, array in flat.items():
            if array_digest(array) != digests[name]:
                raise CheckpointError(
                    f"{source}: {name}: expected SHA-256 {digests[name]['sha256'][:12]}... of "
                    f"shape {digests[name]['shape']}, got different contents"
                )
        position = Position(int(meta["step"]), int(meta["epoch"]), int(meta["batch"]))
        epoch_metrics = tuple(tuple(float(v) for v in m) for m in meta["epoch_metrics"])
        progress = Progress(position, epoch_metrics, int(meta["records"]), float(meta["seconds"]))
        config = Config.from_dict(meta["config"])
        impl, prng, data = str(meta["impl"]), str(meta["prng"]), meta.get("data_sha256")
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, ConfigError) as err:
        raise CheckpointError(
            f"{source}: expected complete checkpoint metadata, got {type(err).__name__}: {err}"
        ) from err
    tree = unflatten(flat, source=source)
    if "run_keys" not in tree or "step" not in tree or "count" not in tree["opt_state"]:
        raise CheckpointError(f"{source}: expected step, opt_state/count and run_keys arrays")
    keys = keys_from_data(tree.pop("run_keys"), prng)
    check_state_tree(tree, config)
    if int(tree["step"]) != position.step:
        raise CheckpointError(
            f"{source}: step: expected the metadata's {position.step}, got {int(tree['step'])}"
        )
    return Checkpoint(tree, keys, progress, config, impl, data)


# --- Orbax ----------------------------------------------------------------------------------------

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Orbax's name for a step directory before its commit
DELETING_SUFFIX = ".cvae-deleting"  # an old checkpoint being removed (renamed first, then deleted)
_SAVES = [0]  # saves made by this process (for the SLOW_SAVE_ENV test hook)


def _slow_save() -> tuple[int, float] | None:
    text = os.environ.get(SLOW_SAVE_ENV)
    if not text:
        return None
    number, _, seconds = text.partition(":")
    try:
        return int(number), float(seconds)
    except ValueError:
        raise CheckpointError(f"{SLOW_SAVE_ENV}: expected N:SECONDS, got {text!r}") from None


def _file_table(directory: Path) -> dict[str, dict[str, Any]]:
    table = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and rel not in (FILES, *ORBAX_FILES):
            table[rel] = {"size": path.stat().st_size, "sha256": _file_sha256(path)}
    return table


def _before_commit(directory: Path, step: int) -> None:
    """What the save of ``step`` adds to its temporary ``directory``, every item written and
    finalised, just before Orbax's atomic rename commits it: ``cvae_files.json`` (and, for tests,
    the sleep of :data:`SLOW_SAVE_ENV` first)."""
    slow = _slow_save()
    if slow is not None and slow[0] == _SAVES[0]:
        time.sleep(slow[1])
    table = {"step": step, "files": _file_table(directory)}
    (directory / FILES).write_text(json.dumps(table, indent=1) + "\n")


@functools.cache
def _orbax() -> tuple[Any, type, type]:
    """Orbax (imported on first use: it takes a second or two), the handler of a checkpoint's
    items and the arguments it saves and restores with.

    The handler is Orbax's ``CompositeCheckpointHandler`` (the items ``arrays`` and ``meta``, each
    in its own directory) with its ``finalize`` extended: Orbax's ``Checkpointer`` calls it on the
    temporary step directory once every item is written, then commits the directory by an atomic
    rename, so ``cvae_files.json`` is written inside every committed checkpoint and in none that
    is not. Orbax finds a handler's arguments by their exact class, so the handler has its own
    (``ocp.args.Composite`` as they are).
    """
    import orbax.checkpoint as ocp

    class Items(ocp.CompositeCheckpointHandler):
        saving: int | None = None  # the step of the save in progress

        def finalize(self, directory: Any) -> None:
            super().finalize(directory)
            if self.saving is not None:
                _before_commit(Path(str(directory)), self.saving)

    @ocp.args.register_with_handler(Items, for_save=True, for_restore=True)
    class ItemArgs(ocp.args.Composite):
        pass

    return ocp, Items, ItemArgs


class Checkpoints:
    """The checkpoints of one run directory: ``<step>/`` each, saved and restored by an Orbax
    ``Checkpointer`` (atomic: written under ``<step>.orbax-checkpoint-tmp*`` and renamed).

    ``writable``: after each save only the latest ``keep`` checkpoints are kept, and on opening
    what crashed saves and removals left is removed; otherwise nothing under the directory is
    changed.
    """

    def __init__(self, directory: Path, *, keep: int = DEFAULT_KEEP, writable: bool = False):
        self.directory = Path(directory).absolute()
        self.keep, self.writable = keep, writable
        if writable:
            self.directory.mkdir(parents=True, exist_ok=True)
            for leftover in self._leftovers():
                shutil.rmtree(leftover, ignore_errors=True)

    @functools.cached_property
    def _saving(self) -> tuple[Any, Any, type, Any]:
        """Orbax, the handler, its arguments' class and the ``Checkpointer``: made at the first
        save or restore, so a run's start does not import Orbax before its first step."""
        ocp, items, args = _orbax()
        # In a run of several processes only this one (process 0, the writer) saves: Orbax must
        # not wait for the others at its barriers.
        alone = ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()}
        )
        processes = alone if jax.process_count() > 1 else ocp.options.MultiprocessingOptions()
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        arrays = ocp.handlers.StandardCheckpointHandler(multiprocessing_options=processes)
        meta = ocp.handlers.JsonCheckpointHandler(multiprocessing_options=processes)
        registry.add("arrays", ocp.args.StandardSave, arrays)
        registry.add("arrays", ocp.args.StandardRestore, arrays)
        registry.add("meta", ocp.args.JsonSave, meta)
        registry.add("meta", ocp.args.JsonRestore, meta)
        handler = items(
            handler_registry=registry,
            composite_options=ocp.CompositeOptions(multiprocessing_options=processes),
        )
        return ocp, handler, args, ocp.Checkpointer(handler, multiprocessing_options=processes)

    def _leftovers(self) -> list[Path]:
        return [
            path
            for pattern in (f"*{TMP_SUFFIX}*", f"*{DELETING_SUFFIX}")
            for path in self.directory.glob(pattern)
        ]

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def save(self, checkpoint: Checkpoint) -> None:
        ocp, handler, args, checkpointer = self._saving
        _SAVES[0] += 1
        where = self.directory / str(checkpoint.step)
        if where.exists():
            raise CheckpointError(
                f"checkpoint: expected a step without a checkpoint, got {checkpoint.step}, which "
                f"has one ({where})"
            )
        items = args(
            arrays=ocp.args.StandardSave(checkpoint.arrays()),
            meta=ocp.args.JsonSave(checkpoint.metadata()),
        )
        handler.saving = checkpoint.step
        try:
            checkpointer.save(where, args=items)
        finally:
            handler.saving = None
        self._remove_old()

    def _remove_old(self) -> None:
        """Keep the latest ``keep`` checkpoints (after a commit, so a crash never leaves fewer). A
        checkpoint is renamed before it is deleted, so one half deleted is never taken for one."""
        for step in self.steps()[: -self.keep]:
            doomed = self.directory / f"{step}{DELETING_SUFFIX}"
            os.replace(self.directory / str(step), doomed)
            shutil.rmtree(doomed)

    def discard_unfinished(self, step: int, *, settle: float = 0.1, patience: float = 5.0) -> None:
        """Remove what a failed save of ``step`` left (never read; it would be removed on the
        next start, this frees the space now).

        Writes of the failed save may still be in flight in the checkpoint library's threads and
        add files (or the directory again) while it is removed: it is removed again until it
        stays gone for ``settle`` seconds, for at most ``patience`` seconds.
        """
        deadline = time.monotonic() + patience
        while True:
            leftovers = list(self.directory.glob(f"{step}{TMP_SUFFIX}*"))
            for leftover in leftovers:
                shutil.rmtree(leftover, ignore_errors=True)
            time.sleep(settle)
            if not leftovers and not list(self.directory.glob(f"{step}{TMP_SUFFIX}*")):
                return
            if time.monotonic() > deadline:
                return

    def verify_files(self, step: int) -> None:
        """Every file as ``cvae_files.json`` lists it (size and SHA-256), and no other."""
        where = self.directory / str(step)
        try:
            table = json.loads((where / FILES).read_text())
            expected = table["files"]
            if not isinstance(expected, dict) or table.get("step") != step:
                raise ValueError("not a file table of this step")
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{where / FILES}: expected the file table of the checkpoint, got "
                f"{type(err).__name__}: {err}"
            ) from err
        actual = {}
        for path in sorted(where.rglob("*")):
            rel = path.relative_to(where).as_posix()
            if path.is_file() and rel not in (FILES, *ORBAX_FILES):
                actual[rel] = path
        for rel, entry in expected.items():
            path = actual.get(rel)
            if path is None:
                raise CheckpointError(f"{where}: {rel}: expected this file, got none (missing)")
            size = path.stat().st_size
            if size != entry["size"]:
                raise CheckpointError(
                    f"{where}: {rel}: expected {entry['size']} bytes, got {size} (truncated or "
                    "altered)"
                )
            if _file_sha256(path) != entry["sha256"]:
                raise CheckpointError(
                    f"{where}: {rel}: expected SHA-256 {entry['sha256'][:12]}..., got different "
                    "contents (corrupted)"
                )
        extra = sorted(set(actual) - set(expected))
        if extra:
            raise CheckpointError(
                f"{where}: expected only the files it was saved with, got {extra}"
            )

    def restore(self, step: int) -> Checkpoint:
        """The checkpoint of ``step``, its files and every array checked against their SHA-256."""
        ocp, _, args, checkpointer = self._saving
        self.verify_files(step)
        source = str(self.directory / str(step))
        try:
            restored = checkpointer.restore(
                self.directory / str(step),
                args=args(arrays=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()),
            )
        except Exception as err:  # Orbax and TensorStore raise many kinds; all mean unreadable
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            raise CheckpointError(
                f"{source}: expected a readable checkpoint, got {type(err).__name__}: {first}"
            ) from err
        flat = flatten(jax.tree.map(np.asarray, restored["arrays"]))
        return from_parts(flat, restored["meta"], source=source)

    def latest(self, *, latest_good: bool) -> tuple[Checkpoint, list[tuple[int, str]]]:
        """The newest checkpoint, or with ``latest_good`` the newest intact one, and the damaged
        ones found newer than it, as ``(step, reason)``."""
        steps = self.steps()
        if not steps:
            raise CheckpointError(
                f"checkpoint: expected at least one checkpoint in {self.directory}, got none"
            )
        damaged: list[tuple[int, str]] = []
        for step in reversed(steps):
            try:
                return self.restore(step), damaged
            except CheckpointError as err:
                if not latest_good:
                    raise CheckpointError(
                        f"checkpoint: the latest checkpoint, step {step}, is damaged: {err}; pass "
                        f"latest_good to continue from the newest intact one"
                    ) from err
                damaged.append((step, str(err)))
        listing = "; ".join(f"step {s}: {reason}" for s, reason in damaged)
        raise CheckpointError(f"checkpoint: expected an intact checkpoint, got none ({listing})")

    def close(self) -> None:
        if "_saving" in self.__dict__:  # made (by a save or a restore)
            self._saving[3].close()


def checkpoints_of(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def has_checkpoints(run_dir: Path) -> bool:
    directory = checkpoints_of(run_dir)
    return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def latest_of_run(run_dir: Path, *, step: int | None = None) -> Checkpoint:
    """A run's checkpoint at ``step``, or its newest intact one."""
    checkpoints = Checkpoints(checkpoints_of(run_dir))
    try:
        if step is None:
            found, damaged = checkpoints.latest(latest_good=True)
            for number, reason in damaged:
                print(
                    f"cvae: warning: skipped damaged checkpoint {number}: {reason}", file=sys.stderr
                )
            return found
        if step not in checkpoints.steps():
            raise CheckpointError(
                f"step: expected one of the checkpoints {checkpoints.steps()}, got {step}"
            )
        return checkpoints.restore(step)
    finally:
        checkpoints.close()


# --- what cvae train calls ------------------------------------------------------------------------


class Saver:
    """``on_checkpoint`` for the trainer: the state made canonical and saved with its progress."""

    def __init__(
        self,
        run_dir: Path,
        impl: Any,
        config: Config,
        keys: RunKeys,
        dataset: Any,
        *,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        self.impl, self.config, self.keys = impl, config, keys
        self.data = data_fingerprint(dataset)
        self.checkpoints = Checkpoints(checkpoints_of(run_dir), keep=keep, writable=True)
        self.saved: list[int] = []

    def __call__(self, state: Any, progress: Progress) -> None:
        tree = canonical_state(self.impl, state)
        name = str(getattr(self.impl, "name", self.impl))
        checkpoint = Checkpoint(tree, self.keys, progress, self.config, name, self.data)
        where = self.checkpoints.directory / str(checkpoint.step)
        try:
            with files.writing(f"checkpoint {checkpoint.step}", where), files.stderr_held():
                self.checkpoints.save(checkpoint)
        except files.WriteFailed:
            self.checkpoints.discard_unfinished(checkpoint.step)  # frees what it took
            raise
        self.saved.append(checkpoint.step)

    def close(self) -> None:
        self.checkpoints.close()
