"""TensorBoard event files of a run, written with tensorboardX (no TensorFlow): ``RUN/tb/``.

What ``cvae train`` writes there, every value at its step (the x axis of every chart):

- per step, the step's record of ``metrics.jsonl``: ``train/loss``, ``train/recon``, ``train/kl``,
  ``train/learning_rate`` and ``train/grad_norm`` (the gradient's global norm before clipping;
  absent for an implementation without a ``grads_fn``), one event per step;
- per epoch, at the step it ended: ``epoch/train_loss`` (and ``_recon``, ``_kl``: the epoch's
  means), ``epoch/test_loss`` (and ``_recon``, ``_kl``), ``epoch/steps_per_second`` (steps over
  training seconds since the previous epoch, evaluation excluded), and two images: ``samples``
  (a row of generated images per label) and ``reconstructions`` (test images, each row above
  its reconstructions).

The events are written synchronously on the training thread (tensorboardX's ``SummaryWriter``
would queue them to a thread of its own, where a full disk is silent), so a disk error ends the
run like any other write: :class:`~cvae_rosetta.files.WriteFailed` naming the file. They are
flushed (and fsynced, by tensorboardX) at an epoch's end once :data:`FLUSH_SECONDS` have passed
since the last flush, and at the close. A resumed run opens a new event file that begins
with TensorBoard's purge marker at its first step, so the steps the interrupted run recorded
past its checkpoint are hidden, as ``metrics.jsonl`` is cut back to the checkpoint.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app.data import Dataset
from cvae_rosetta.app.run import METRICS, Record, RunKeys
from cvae_rosetta.spec.model import generate, reconstruct

SAMPLES_PER_CLASS = 8
RECONSTRUCTIONS = 16
COLUMNS = 8  # reconstructions per row pair
FLUSH_SECONDS = 5.0  # flush (tensorboardX fsyncs) at an epoch's end at most this often
CELL = 32  # pixels of an image's longer side in the grids (TensorBoard zooms; PNGs stay small)


class TensorBoardLog:
    """Scalars of every record and pictures of every epoch, into ``directory``.

    ``history``: the records made before (a resumed run), whose last epoch record starts the
    steps-per-second count; with any, the file opens with a purge marker at the next step.
    """

    def __init__(
        self,
        directory: Path,
        impl: Any,
        dataset: Dataset,
        keys: RunKeys,
        *,
        history: Sequence[Record] = (),
    ) -> None:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        self.directory = Path(directory)
        self._event = Event
        self._image_shape = dataset.image_shape
        self._labels = np.repeat(np.arange(dataset.num_classes, dtype=np.int32), SAMPLES_PER_CLASS)
        self._columns = min(COLUMNS, len(dataset.test))
        n = min(RECONSTRUCTIONS, len(dataset.test)) // self._columns * self._columns
        self._test = (jax.numpy.asarray(dataset.test.x[:n]), jax.numpy.asarray(dataset.test.c[:n]))
        labels = jax.numpy.asarray(self._labels)
        self._generate = jax.jit(lambda state: generate(impl, state, keys.sample, labels))
        self._reconstruct = jax.jit(lambda state, x, c: reconstruct(impl, state, x, c))
        epochs = [r for r in history if r["event"] == "epoch"]
        self._last = (epochs[-1]["step"], epochs[-1]["seconds"]) if epochs else (0, 0.0)
        with files.writing("the TensorBoard events", self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
            # the process id keeps a resume within the same second from reopening a file
            self._writer = EventsWriter(
                str(self.directory / "events"), filename_suffix=f".{os.getpid()}"
            )
            self.path = Path(self._writer._file_name)
            if history:
                purge = max(r["step"] for r in history) + 1
                self._write(purge, session_log=SessionLog(status=SessionLog.START))
            self._writer.flush()
        self._flushed = time.monotonic()

    def _write(self, step: int, **fields: Any) -> None:
        with files.writing("the TensorBoard events", self.path):
            self._writer.write_event(self._event(step=step, wall_time=time.time(), **fields))

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        from tensorboardX.summary import Summary

        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._write(step, summary=summary)

    def __call__(self, record: Record) -> None:
        """A record of ``metrics.jsonl``: its scalars at its step."""
        step = record["step"]
        if record["event"] == "step":
            names = [*METRICS, "learning_rate", "grad_norm"]
            self._scalars(step, {f"train/{n}": record[n] for n in names if n in record})
            return
        values = {f"epoch/{k}_{n}": record[f"{k}_{n}"] for k in ("train", "test") for n in METRICS}
        seconds = record["seconds"] - self._last[1]
        if step > self._last[0] and seconds > 0:
            values["epoch/steps_per_second"] = (step - self._last[0]) / seconds
        self._last = (step, record["seconds"])
        self._scalars(step, values)

    def pictures(self, state: Any, record: Record) -> None:
        """The sample and reconstruction grids of the model after an epoch, at its step."""
        from tensorboardX.summary import image

        shape = self._image_shape
        samples = np.asarray(self._generate(state))
        x, c = self._test
        recon = np.asarray(self._reconstruct(state, x, c))
        scale = max(1, round(CELL / max(shape)))
        cols = self._columns
        rows = np.asarray(x).reshape(-1, cols, *shape), recon.reshape(-1, cols, *shape)
        pairs = np.stack(rows, axis=1).reshape(-1, cols, *shape)  # original rows above theirs
        for tag, grid in (
            ("samples", samples.reshape(-1, SAMPLES_PER_CLASS, *shape)),
            ("reconstructions", pairs),
        ):
            summary = image(tag, tile(grid, scale)[None], dataformats="CHW")
            self._write(record["step"], summary=summary)
        if time.monotonic() - self._flushed >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        with files.writing("the TensorBoard events", self.path):
            self._writer.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        with files.writing("the TensorBoard events", self.path):
            self._writer.close()


def tile(cells: np.ndarray, scale: int = 1, gap: int = 1) -> np.ndarray:
    """``[rows, cols, H, W]`` images in [0, 1] as one ``[rows * (H + gap) + gap, ...]`` picture,
    each image ``scale`` times larger, on a white background."""
    cells = np.repeat(np.repeat(np.clip(cells, 0.0, 1.0), scale, axis=2), scale, axis=3)
    rows, cols, h, w = cells.shape
    out = np.ones((rows * (h + gap) + gap, cols * (w + gap) + gap), np.float32)
    for r in range(rows):
        for c in range(cols):
            y, x = gap + r * (h + gap), gap + c * (w + gap)
            out[y : y + h, x : x + w] = cells[r, c]
    return out
