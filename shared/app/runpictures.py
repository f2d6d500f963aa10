"""A run's pictures: ``samples.png`` and ``reconstructions.png`` of the trained model, and the
title a run's pictures carry, naming the implementations that trained it."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from cvae_rosetta.app import images
from cvae_rosetta.app.data import Dataset
from cvae_rosetta.app.run import Record, RunKeys
from cvae_rosetta.app.rundir import CONFIG_FILE, RECONSTRUCTIONS_FILE, SAMPLES_FILE
from cvae_rosetta.spec.model import generate, reconstruct

SAMPLES_PER_CLASS = 8
RECONSTRUCTIONS = 16


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
