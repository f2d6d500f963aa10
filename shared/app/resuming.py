"""Resuming a run directory: its ``config.json`` read (:func:`read_run`), the config changes a
resumed run may make (:data:`RESUMABLE_CHANGES`), and :class:`Resume`: the run's newest (or newest
intact) checkpoint loaded and checked against the config and the data, then the run directory made
ready to go on (damaged newer checkpoints moved aside, ``metrics.jsonl`` cut back to the
checkpoint's records). The checkpoints themselves are :mod:`cvae_rosetta.app.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from cvae_rosetta import files
from cvae_rosetta.app import rundir
from cvae_rosetta.app.checkpoint import Checkpoint, Checkpoints, checkpoints_of, data_fingerprint
from cvae_rosetta.app.data import batches_per_epoch
from cvae_rosetta.app.run import Record
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import CheckpointError, ConfigError, OutputError

DAMAGED_DIR = "checkpoints.damaged"  # where --resume-latest-good moves newer damaged checkpoints
# On --resume, only these config fields may differ from the run's own.
RESUMABLE_CHANGES = ("train.epochs", "data.data_dir", "train.data_parallel", "train.devices")

_RESUMABLE = f"{', '.join(RESUMABLE_CHANGES[:-1])} and {RESUMABLE_CHANGES[-1]}"


def config_differences(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """``(section.field, old value, new value)`` for every field that differs."""
    a, b = old.to_dict(), new.to_dict()
    return [
        (f"{section}.{name}", a[section][name], b[section][name])
        for section in a
        for name in a[section]
        if a[section][name] != b[section][name]
    ]


def refuse_config_changes(old: Config, new: Config, *, what: str) -> None:
    """Refuse, naming every field, changes to anything but :data:`RESUMABLE_CHANGES`."""
    bad = [d for d in config_differences(old, new) if d[0] not in RESUMABLE_CHANGES]
    if bad:
        fields = ", ".join(name for name, _, _ in bad)
        expected = ", ".join(f"{name}={a!r}" for name, a, _ in bad)
        given = ", ".join(f"{name}={b!r}" for name, _, b in bad)
        raise ConfigError(
            f"{fields}: expected the values of {what} ({expected}; only {_RESUMABLE} may "
            f"change on resume), got {given}"
        )


def read_run(directory: Any, *, flag: str = "run_dir") -> tuple[Path, dict[str, Any], Config]:
    """A ``cvae train`` run directory: its path, its ``config.json`` and its config."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        state = "is a file" if path.exists() else "does not exist"
        raise CheckpointError(
            f"{flag}: expected a run directory of cvae train, got {path}, which {state}"
        )
    marker = path / rundir.CONFIG_FILE
    try:
        data = json.loads(marker.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{flag}: expected a run directory holding config.json, got {path}, which holds none"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"{marker}: expected the JSON cvae train writes, got {type(err).__name__}: {err}"
        ) from err
    if not isinstance(data, dict) or not isinstance(data.get("impl"), str) or "config" not in data:
        hint = (
            " (a cvae compare directory: pick one implementation's folder)"
            if isinstance(data, dict) and "impls" in data
            else ""
        )
        raise CheckpointError(
            f"{flag}: expected {marker} to name its implementation and config{hint}, it does not"
        )
    return path, data, stored_config(data, marker)


def stored_config(data: dict[str, Any], marker: Path) -> Config:
    """The config a run's ``config.json`` (``marker``, read into ``data``) holds; a bad one is
    refused naming the file."""
    try:
        return Config.from_dict(data["config"])
    except ConfigError as err:
        raise ConfigError(f"{marker}: {err}") from err


@dataclasses.dataclass
class Resume:
    """A run directory about to be continued from its checkpoint (checked, nothing written yet).

    :meth:`open` reads ``config.json`` only, so the devices can still be arranged before JAX
    starts; :meth:`load` then reads the newest checkpoint (or the newest intact one).
    """

    directory: Path
    run: dict[str, Any]  # config.json
    config: Config  # the run's own config
    latest_good: bool = False
    loaded: Checkpoint | None = None
    damaged: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @classmethod
    def open(cls, directory: Any, *, latest_good: bool) -> Resume:
        path, data, config = read_run(directory, flag="resume")
        if not checkpoints_of(path).is_dir():
            raise CheckpointError(
                f"resume: expected {checkpoints_of(path)} (cvae train writes checkpoints there), "
                "got no such directory"
            )
        for where in (path, checkpoints_of(path)):
            try:  # a real probe, as for --out: the run goes on writing here
                tempfile.TemporaryDirectory(dir=where, prefix=".cvae-probe-").cleanup()
            except OSError as err:
                raise OutputError(
                    f"resume: expected a writable run directory, got {where} ({err.strerror})"
                ) from err
        return cls(path, data, config, latest_good)

    def load(self) -> Checkpoint:
        checkpoints = Checkpoints(checkpoints_of(self.directory))
        try:
            self.loaded, self.damaged = checkpoints.latest(latest_good=self.latest_good)
        finally:
            checkpoints.close()
        where = f"the run in {self.directory / 'config.json'}"
        refuse_config_changes(self.config, self.loaded.config, what=where)
        return self.loaded

    def finished(self, config: Config, max_steps: int | None) -> dict[str, Any] | None:
        """The run's ``summary.json`` where nothing is left to do: its newest checkpoint is where
        ``config`` (and ``max_steps``) end it, and every output was written after that step (the
        summary of that step, an evaluation no older than the summary). None where steps are left,
        or outputs a stop cut short, which the resume then writes. Reads no checkpoint."""
        from cvae_rosetta.app import rundir  # JAX: by the time a resume asks, it has started

        directory = self.directory
        if not all((directory / name).is_file() for name in rundir.OUTPUT_FILES):
            return None
        try:
            summary = json.loads((directory / rundir.SUMMARY_FILE).read_text())
            step, epoch = summary["step"], summary["epoch"]
        except (OSError, ValueError, TypeError, KeyError):
            return None  # a summary this run did not write: the resume writes its own
        steps = Checkpoints(checkpoints_of(directory)).steps()
        if not steps or steps[-1] != step:
            return None
        evaluated = (directory / rundir.EVALUATION_FILE).stat().st_mtime_ns
        if evaluated < (directory / rundir.SUMMARY_FILE).stat().st_mtime_ns:
            return None  # the evaluation of an earlier end: this one's was cut short
        if epoch > config.train.epochs:  # a partial epoch is the one in progress, counted from 1
            trained = f"the checkpoint at step {step} is in epoch {epoch}"
            if not summary.get("partial"):
                trained = f"the run has trained {epoch} epoch{'s' * (epoch > 1)}, {step} steps"
            raise ConfigError(
                f"train.epochs: expected at least {epoch} ({trained}), got {config.train.epochs}"
            )
        ended = epoch >= config.train.epochs and not summary.get("partial")
        if not ended and (max_steps is None or step < max_steps):
            return None
        return summary

    @property
    def checkpoint(self) -> Checkpoint:
        return self.loaded if self.loaded is not None else self.load()

    def check(self, config: Config, dataset: Any) -> list[Record]:
        """Refuse a config or data set the checkpoint does not fit; the records it was made after
        (the first ``progress.records`` of ``metrics.jsonl``)."""
        refuse_config_changes(self.config, config, what=f"the run in {self.directory}")
        num_batches = batches_per_epoch(
            len(dataset.train), config.data.batch_size, config.data.remainder
        )
        position = self.checkpoint.progress.position
        step = self.checkpoint.step
        if position.epoch > config.train.epochs or (
            position.epoch == config.train.epochs and position.batch
        ):
            raise ConfigError(
                f"train.epochs: expected at least {position.epoch + bool(position.batch)} (the "
                f"checkpoint at step {step} is in epoch {position.epoch + 1}), got "
                f"{config.train.epochs}"
            )
        if position.step != position.epoch * num_batches + position.batch:
            raise CheckpointError(
                f"checkpoint: expected step {step} to be batch {position.batch} of epoch "
                f"{position.epoch + 1} of {num_batches} batches, it is not (the data changed)"
            )
        data = data_fingerprint(dataset)
        if self.checkpoint.data is not None and data != self.checkpoint.data:
            raise CheckpointError(
                f"data: expected the data set the run was trained on (SHA-256 "
                f"{self.checkpoint.data[:12]}...), got different data (SHA-256 {data[:12]}...)"
            )
        return self._records()

    def _records(self) -> list[Record]:
        path = self.directory / rundir.METRICS_FILE
        wanted = self.checkpoint.progress.records
        records = []
        try:
            with open(path) as f:
                for line in f:
                    if len(records) == wanted:
                        break
                    records.append(json.loads(line))
        except FileNotFoundError:
            records = []
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(
                f"{path}: expected the {wanted} records the checkpoint at step "
                f"{self.checkpoint.step} was made after, got {type(err).__name__}: {err}"
            ) from err
        steps = [r.get("step") for r in records if isinstance(r, dict) and r.get("event") == "step"]
        if len(records) != wanted or steps != list(range(1, self.checkpoint.step + 1)):
            raise CheckpointError(
                f"{path}: expected the {wanted} records the checkpoint at step "
                f"{self.checkpoint.step} was made after (steps 1 to {self.checkpoint.step}), got "
                f"{len(records)} records and {len(steps)} steps"
            )
        return records

    def prepare(self, records: list[Record], config: Config, impl_name: str) -> None:
        """Write what resuming changes: damaged newer checkpoints moved aside (never deleted),
        ``metrics.jsonl`` cut back to the checkpoint's records, ``config.json`` updated."""
        for step, _ in self.damaged:
            aside = self.directory / DAMAGED_DIR
            aside.mkdir(exist_ok=True)
            target = aside / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
            shutil.move(str(checkpoints_of(self.directory) / str(step)), str(target))
        path = self.directory / rundir.METRICS_FILE
        files.write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        resumes = list(self.run.get("resumes", []))
        resumes.append(
            {"step": self.checkpoint.step, "impl": impl_name, "from": self.checkpoint.impl}
        )
        data = {**self.run, "impl": impl_name, "config": config.to_dict(), "resumes": resumes}
        files.write_json(self.directory / rundir.CONFIG_FILE, data)
