"""Data parallelism end to end through the CLI: several devices, and several processes on loopback.

Each run is a real ``cvae`` subprocess that arranges its own host devices (``--devices``) or starts
its own processes (``cvae launch``), so these tests need no forced devices in the test process;
they run in ``tox -e multidevice`` because they take a minute or two. Every subprocess is bounded in
time and stopped, with all of its children, however the test ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from run_helpers import outputs

pytestmark = pytest.mark.multidevice

# 11 steps of 128 digits; a smaller model keeps the compiles short
RUN = ["--impl", "pure_jax", "--epochs", "1", "--batch-size", "128", "--latent-dim", "4"]
RUN += ["--no-progress", "--iw-samples", "2"]
TIMEOUT = 300
# Serial and parallel steps sum in a different order; eleven Adam steps stay within float32 noise.
RTOL, ATOL = 1e-4, 1e-5


def cvae(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``cvae ARGS`` in its own process group, killed with all its children on a timeout."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cvae_rosetta.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = outputs(proc, timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def steps(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "step"]


def assert_same_training(got: Path, want: Path) -> None:
    a, b = np.load(got / "params.npz"), np.load(want / "params.npz")
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=RTOL, atol=ATOL, err_msg=name)
    names = ("loss", "kl", "grad_norm")  # the gradient's norm: of the average over the devices
    for r, s in zip(steps(got), steps(want), strict=True):
        assert r["step"] == s["step"]
        np.testing.assert_allclose(
            [r[n] for n in names], [s[n] for n in names], rtol=RTOL, err_msg=f"step {r['step']}"
        )


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serial") / "run"
    done = cvae("train", *RUN, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("mechanism", ["pmap", "sharded", "shard_map"])
def test_a_data_parallel_run_trains_like_the_serial_run(tmp_path, serial, mechanism):
    out = tmp_path / "run"
    done = cvae("train", *RUN, "--data-parallel", mechanism, "--devices", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())["config"]["train"]
    assert (config["data_parallel"], config["devices"]) == (mechanism, 4)
    assert_same_training(out, serial)


@pytest.mark.parametrize("mechanism", ["sharded", "shard_map"])
def test_two_processes_train_like_one(tmp_path, serial, mechanism):
    """Two processes of two devices each on loopback: the same parameters and metrics as the
    serial run, and only process 0 writes (the folder holds what a one-process run holds)."""
    out = tmp_path / "run"
    args = ["--data-parallel", mechanism, "--devices", "4", "--out", str(out)]
    done = cvae("launch", "--num-processes", "2", "--timeout", str(TIMEOUT - 30), "--", "train",
                *RUN, *args)  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "config.json").read_text())["config"]["train"]
    assert (config["data_parallel"], config["devices"]) == (mechanism, 4)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in serial.iterdir())
    assert_same_training(out, serial)


def test_the_launcher_stops_every_process_when_one_fails(tmp_path):
    """Process 0 refuses its output folder; process 1 would wait for it for minutes. The launcher
    returns process 0's status at once and leaves no process behind."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "precious.txt").write_text("keep me")
    start = time.monotonic()
    done = cvae("launch", "--num-processes", "2", "--port", "29517", "--", "train", *RUN,
                "--data-parallel", "sharded", "--out", str(taken), timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--out: expected an empty or new directory" in done.stderr
    assert time.monotonic() - start < 90
    assert (taken / "precious.txt").read_text() == "keep me"
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "127.0.0.1:29517" not in ps


def test_the_launcher_times_out_and_cleans_up(tmp_path):
    start = time.monotonic()
    done = cvae("launch", "--num-processes", "2", "--port", "29518", "--timeout", "3", "--",
                "train", *RUN, "--data-parallel", "sharded", "--epochs", "200",
                "--out", str(tmp_path / "run"), timeout=120)  # fmt: skip
    assert done.returncode == 124, done.stderr
    assert "timed out after 3 s" in done.stderr
    assert time.monotonic() - start < 60
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "127.0.0.1:29518" not in ps
