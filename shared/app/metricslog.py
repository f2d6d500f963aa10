"""``metrics.jsonl``, a run's record of every step and epoch: written a line at a time as the run
goes (:class:`MetricsLog`), read back, and made into the curves its pictures draw."""

from __future__ import annotations

import json
from pathlib import Path

from cvae_rosetta import files
from cvae_rosetta.app.run import Record


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
