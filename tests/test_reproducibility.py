"""The same seed, implementation, data and config give the same run, bit for bit, via the CLI."""

from __future__ import annotations

import re

import numpy as np

from cvae_rosetta.cli import main

SMALL = [
    *("--impl", "pure_jax", "--data", "synthetic", "--epochs", "2", "--batch-size", "32"),
    *("--latent-dim", "2", "--encoder-dims", "16,8", "--decoder-dims", "8", "--iw-samples", "4"),
    "--no-progress",
]
# The one field of metrics.jsonl that is not a result: the wall-clock seconds of each epoch.
SECONDS = re.compile(r'"seconds": [0-9.e+-]+')


def test_a_rerun_is_bit_identical(tmp_path):
    runs = {name: tmp_path / name for name in ("a", "b")}
    for out in runs.values():
        assert main(["train", "--out", str(out), *SMALL]) == 0

    a, b = (SECONDS.sub('"seconds": T', (runs[n] / "metrics.jsonl").read_text()) for n in "ab")
    assert a.count('"event": "step"') == 2 * (512 // 32)
    assert a == b  # every other byte of every record, every float in full

    for name in ("evaluation.json", "config.json"):
        assert (runs["a"] / name).read_bytes() == (runs["b"] / name).read_bytes(), name
    with (
        np.load(runs["a"] / "params.npz", allow_pickle=False) as pa,
        np.load(runs["b"] / "params.npz", allow_pickle=False) as pb,
    ):
        assert pa.files == pb.files
        for key in pa.files:
            assert pa[key].tobytes() == pb[key].tobytes(), key
