"""Run control and what a run prints (issue 32): ``Options.max_steps`` (a run that ends as a
finished run where its step limit falls, and that a resume extends bit for bit), ``log_every`` and
``eval_every``; progress bars only where they can be drawn, plain lines anywhere else; and the
words of the run's lines (singular and plural, a resume with nothing left, a stop that names the
epoch ``metrics.jsonl`` ends at, a full disk's hint that names what works).

The runs are ``tiny_runs``' tiny ones (synthetic data, 8 steps per epoch), from Python and through
``cvae``.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cvae_rosetta import files
from cvae_rosetta.app import checkpoint, metricslog, rundir, train, trainer
from cvae_rosetta.app.run import Position
from cvae_rosetta.app.train import Options, resume, train_and_evaluate
from cvae_rosetta.bench.timing import ProgressBar
from cvae_rosetta.cli import main
from cvae_rosetta.cli.tiny_runs import TINY, TOTAL, assert_same_run, fast_outputs, records, snapshot
from cvae_rosetta.cli.tiny_runs import train as cvae_train
from cvae_rosetta.spec.config import Config, DataConfig, ModelConfig, TrainConfig
from cvae_rosetta.spec.errors import ConfigError

STEPS = 8  # per epoch: 512 synthetic examples, batch 64
CONFIG = Config(  # tiny_runs.TINY as a Config: 4 epochs, TOTAL steps
    data=DataConfig(name="synthetic", batch_size=64),
    model=ModelConfig(latent_dim=2, encoder_dims=(8,), decoder_dims=(8,)),
    train=TrainConfig(epochs=4),
)
QUIET = Options(progress=False, iw_samples=1, tensorboard=False)


def quiet(**changes) -> Options:
    return Options(**{**QUIET.__dict__, **changes})


def epochs(run_dir: Path) -> list[dict]:
    return [r for r in records(run_dir) if r["event"] == "epoch"]


def described(outcome) -> str:
    """``cvae train``'s closing lines of a run made with ``fast_outputs`` (no evaluation)."""
    with fast_outputs():
        return train.describe(outcome)


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / rundir.CONFIG_FILE).read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run of CONFIG."""
    out = tmp_path_factory.mktemp("reference") / "run"
    with fast_outputs():
        train_and_evaluate(CONFIG, out, quiet(checkpoint_every=0))
    return out


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_steps", 0, "an integer >= 1"),
        ("max_steps", -3, "an integer >= 1"),
        ("max_steps", "12", "an integer >= 1"),
        ("max_steps", 2.5, "an integer >= 1"),
        ("max_steps", True, "an integer >= 1"),
        ("log_every", -1, "an integer >= 0"),
        ("log_every", "x", "an integer >= 0"),
        ("eval_every", 0, "an integer >= 1"),
        ("eval_every", 1.0, "an integer >= 1"),
    ],
)
def test_bad_run_control_is_refused_naming_the_field_before_anything(
    tmp_path, monkeypatch, field, value, expected
):
    monkeypatch.setattr(train, "fit_to_data", _never)  # refused before the data is even loaded
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as caught:
        train_and_evaluate(CONFIG, out, quiet(**{field: value}))
    assert str(caught.value) == f"{field}: expected {expected}, got {value!r}"
    assert not out.exists()


def _never(*args, **kwargs):
    raise AssertionError("the options were not checked first")


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--max-steps", "0", "an integer >= 1, got 0"),
        ("--max-steps", "ten", "an integer >= 1, got 'ten'"),
        ("--log-every", "-2", "an integer >= 0, got -2"),
        ("--eval-every", "0", "an integer >= 1, got 0"),
    ],
)
def test_bad_run_control_flags_are_refused_in_one_line(tmp_path, capsys, flag, value, expected):
    out = tmp_path / "run"
    assert main(["train", *TINY, flag, value, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == f"cvae: error: {flag}: expected {expected}"
    assert not out.exists()


# --- max_steps ------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [13, 2 * STEPS], ids=["inside-an-epoch", "at-an-epoch-end"])
def test_max_steps_ends_a_finished_run_that_resumes_to_the_uninterrupted_one(
    reference, tmp_path, capsys, limit
):
    """A run with max_steps ends there as a finished run (final checkpoint, summary, its last
    epoch's record, partial where the limit falls inside the epoch); a resume keeps the limit and
    finds nothing left; one given a larger limit goes on to the end, bit for bit the uninterrupted
    run: the same records and the same final parameters."""
    out = tmp_path / "run"
    with fast_outputs():
        first = train_and_evaluate(CONFIG, out, quiet(max_steps=limit))
    assert not first.stopped and first.result.steps == limit
    assert checkpoint.latest_of_run(out).step == limit
    assert (out / rundir.SUMMARY_FILE).is_file() and (out / "params.npz").is_file()
    assert run_json(out)["max_steps"] == limit
    steps = [r["step"] for r in records(out) if r["event"] == "step"]
    assert steps == list(range(1, limit + 1))
    last = epochs(out)[-1]
    inside = limit % STEPS != 0
    assert last["step"] == limit and last["epoch"] == -(-limit // STEPS)
    assert last.get("partial", False) is inside and "test_loss" in last
    assert first.summary["step"] == limit and first.summary["test_loss"] == last["test_loss"]
    place = "in epoch 2" if inside else "after epoch 2"
    assert f"{limit} steps, ended by max_steps {place} of 4, " in described(first)
    made = records(out)

    with fast_outputs():  # the run's limit is kept: nothing left, the same run again
        again = resume(out, quiet())
    said = capsys.readouterr().out
    assert f"nothing left to train: the run ends at step {limit}, its step limit" in said
    assert again.result.steps == 0 and records(out) == made
    assert "nothing left to train (no step taken)" in described(again)

    with fast_outputs():  # a larger limit goes on, to the end of the epochs
        end = resume(out, quiet(max_steps=10 * TOTAL))
    assert end.result.steps == TOTAL - limit and not end.stopped
    assert run_json(out)["max_steps"] == 10 * TOTAL
    assert_same_run(out, reference)


def test_max_steps_below_the_checkpoint_is_refused_before_anything_changes(tmp_path):
    out = tmp_path / "run"
    with fast_outputs():
        train_and_evaluate(CONFIG, out, quiet(max_steps=13))
    before = (out / rundir.METRICS_FILE).read_bytes(), (out / rundir.CONFIG_FILE).read_bytes()
    with pytest.raises(ConfigError) as caught:
        resume(out, quiet(max_steps=5))
    assert str(caught.value) == (
        "max_steps: expected at least 13 (the steps of the checkpoint the run goes on from), got 5"
    )
    after = (out / rundir.METRICS_FILE).read_bytes(), (out / rundir.CONFIG_FILE).read_bytes()
    assert after == before


def test_max_steps_through_the_command_line(reference, tmp_path, capsys):
    """``cvae train --max-steps`` then ``--resume`` with a larger one: the uninterrupted run."""
    out = tmp_path / "run"
    assert cvae_train(*TINY, "--max-steps", "11", "--out", str(out)) == 0
    assert run_json(out)["max_steps"] == 11 and checkpoint.latest_of_run(out).step == 11
    assert "11 steps, ended by max_steps in epoch 2 of 4" in capsys.readouterr().out
    args = ("--resume", str(out), "--no-progress", "--iw-samples", "1")
    before = snapshot(out)
    assert cvae_train(*args, "--epochs", "1") == 2  # fewer epochs than it is in: refused
    assert capsys.readouterr().err == (
        "cvae: error: --epochs (train.epochs): expected at least 2 (the checkpoint at step 11 "
        "is in epoch 2), got 1\n"
    )
    assert snapshot(out) == before
    assert cvae_train(*args, "--max-steps", str(TOTAL)) == 0
    assert_same_run(out, reference)


# --- eval_every and log_every ---------------------------------------------------------------------


def test_eval_every_evaluates_every_nth_epoch_and_the_last(tmp_path):
    """Today's trainer evaluates the test split after every epoch; with eval_every 3 of 4 epochs,
    after the third and the last only. The whole run's outputs (curves, TensorBoard) are made."""
    out = tmp_path / "run"
    outcome = train_and_evaluate(CONFIG, out, quiet(eval_every=3, tensorboard=True))
    tested = [r["epoch"] for r in epochs(out) if "test_loss" in r]
    assert tested == [3, 4] and len(epochs(out)) == 4
    assert (out / rundir.CURVES_FILE).is_file() and (out / rundir.TB_DIR).is_dir()
    assert outcome.summary["test_loss"] == epochs(out)[-1]["test_loss"]


def test_log_every_prints_a_line_every_n_steps(tmp_path, capsys):
    out = tmp_path / "run"
    config = CONFIG.replace(train=CONFIG.train.replace(epochs=2))
    with fast_outputs():
        train_and_evaluate(config, out, quiet(log_every=5))
    lines = capsys.readouterr().err.strip().splitlines()
    pattern = (
        r"pure_jax: step (\d+)/16, epoch (\d)/2, loss \d+\.\d{3}, \d+ steps/s "
        r"\(since the previous line\)"
    )
    found = [re.fullmatch(pattern, line) for line in lines]
    assert all(found), lines
    assert [(int(m.group(1)), int(m.group(2))) for m in found] == [(5, 1), (10, 2), (15, 2)]


# --- quiet off a terminal -------------------------------------------------------------------------


def pseudo_terminal(columns: int) -> tuple[int, int]:
    """``(parent, child)`` of a new pseudo-terminal ``columns`` wide (Linux makes one 0 wide)."""
    import fcntl
    import struct
    import termios

    parent, child = os.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return parent, child


def test_a_terminal_is_told_from_a_file_and_a_pipe(tmp_path):
    for columns, drawn in ((80, True), (0, False)):  # no columns: as good as no terminal
        parent, child = pseudo_terminal(columns)
        try:
            with open(child, "w", closefd=False) as tty:
                assert trainer.on_terminal(tty) is drawn, columns
        finally:
            os.close(parent)
            os.close(child)
    with open(tmp_path / "err.txt", "w") as file:
        assert not trainer.on_terminal(file)
    assert not trainer.on_terminal(io.StringIO())


@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminal sizes as Linux sets them")
def test_a_terminal_of_no_columns_gets_the_lines_of_a_log(tmp_path):
    """``script -qc`` and some CI "tty" modes give a terminal 0 columns wide: the run prints its
    per-epoch lines there, not a bar of no width that shows nothing until the summary."""
    parent, child = pseudo_terminal(0)
    out = tmp_path / "run"
    argv = ["train", "--data", "synthetic", "--epochs", "2", "--latent-dim", "2"]
    argv += ["--encoder-dims", "8", "--decoder-dims", "8", "--out", str(out)]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cvae_rosetta.cli", *argv],
            stdout=subprocess.DEVNULL, stderr=child, timeout=300,
        )  # fmt: skip
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # the child side is closed and read to its end
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(parent)
    err = b"".join(chunks).decode().replace("\r\n", "\n")
    assert done.returncode == 0, err
    assert "\r" not in err, err  # no bar's frames
    assert re.search(r"^pure_jax: epoch 1/2, ", err, re.M), err
    assert re.search(r"^pure_jax: epoch 2/2, ", err, re.M), err


def test_off_a_terminal_a_run_prints_a_line_per_epoch_and_no_bar(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    config = CONFIG.replace(train=CONFIG.train.replace(epochs=2))
    with fast_outputs():
        train_and_evaluate(config, out, quiet(progress=True))
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2, lines
    for epoch, line in enumerate(lines, 1):
        assert line.startswith(f"pure_jax: epoch {epoch}/2, step {8 * epoch}/16, train loss ")
        assert "test loss " in line
    # on a terminal the bar is drawn, as before
    monkeypatch.setattr(trainer, "on_terminal", lambda stream=None: True)
    with fast_outputs():
        train_and_evaluate(config, tmp_path / "drawn", quiet(progress=True))
    assert "\r" in capsys.readouterr().err


def _cvae_with_stderr_to_a_file(args: list[str], cwd: Path) -> str:
    """``cvae ARGS`` in a new process whose stderr is a file, as ``cvae ... 2> err.txt``; that
    file's text."""
    err = cwd / "err.txt"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with open(err, "w") as file:
        done = subprocess.run(
            [sys.executable, "-m", "cvae_rosetta.cli", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=file,
            timeout=600,
        )
    text = err.read_text()
    assert done.returncode == 0, text[-3000:]
    return text


SMALL = [a for a in TINY if a not in ("--no-progress", "--epochs", "4")]


def test_cvae_train_with_stderr_to_a_file_writes_no_bar_frames(tmp_path):
    text = _cvae_with_stderr_to_a_file(
        ["train", *SMALL, "--epochs", "2", "--out", str(tmp_path / "run")], tmp_path
    )
    assert "\r" not in text
    lines = text.strip().splitlines()
    assert len(lines) <= 2 * 2, lines  # at most a few lines per epoch: here one each
    assert sum(bool(re.match(r"pure_jax: epoch \d/2, ", line)) for line in lines) == 2, lines


@pytest.mark.needs_flax
def test_cvae_compare_with_stderr_to_a_file_writes_no_bar_frames(tmp_path):
    pytest.importorskip("flax")
    args = ["compare", "--impls", "pure_jax,flax_linen", *SMALL, "--epochs", "1"]
    text = _cvae_with_stderr_to_a_file([*args, "--out", str(tmp_path / "cmp")], tmp_path)
    assert "\r" not in text
    lines = text.strip().splitlines()
    assert len(lines) <= 2 * 2, lines  # two implementations of one epoch: one line each
    for name in ("pure_jax", "flax_linen"):
        assert sum(line.startswith(f"{name}: epoch 1/1, ") for line in lines) == 1, lines


def test_the_benchmarks_progress_is_a_line_per_stage_off_a_terminal(capsys, monkeypatch):
    def ticks(bar):
        bar.stage = "warm-up"
        bar.tick()
        bar.stage = "batch 8"
        bar.tick()
        bar.tick("compile pure_jax")
        bar.bar.close()
        return capsys.readouterr().err

    err = ticks(ProgressBar(4, True))
    assert "\r" not in err
    assert err.splitlines() == ["cvae bench: warm-up (0/4 done)", "cvae bench: batch 8 (1/4 done)"]
    assert ticks(ProgressBar(4, False)) == ""  # --no-progress: nothing
    monkeypatch.setattr(files, "on_terminal", lambda stream=None: True)
    err = ticks(ProgressBar(4, True))
    assert "\r" in err and "done)" not in err  # the bar, as before


# --- the words of a run's lines -------------------------------------------------------------------


def test_one_epoch_is_singular_and_a_resume_with_nothing_left_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    config = CONFIG.replace(train=CONFIG.train.replace(epochs=1))
    with fast_outputs():
        outcome = train_and_evaluate(config, out, quiet())
    text = described(outcome)
    assert ": 1 epoch, 8 steps, " in text and "1 epochs" not in text
    assert "data-parallel" not in text  # how a run ran is said only where it was parallel
    train = outcome.config.train.replace(data_parallel="sharded", devices=2)
    parallel = dataclasses.replace(outcome, config=outcome.config.replace(train=train))
    assert ": 1 epoch, 8 steps, data-parallel (sharded) on 2 devices, " in described(parallel)
    outcome.evaluation["iw_samples"] = 1  # what an evaluation with one sample records
    assert "; 1 posterior sample per example)" in described(outcome)
    with fast_outputs():
        again = resume(out, quiet())
    said = capsys.readouterr().out
    assert "at step 8 (the end of epoch 1)" in said
    assert "nothing left to train in 1 epoch (more epochs extend it)" in said
    text = described(again)
    assert "nothing left to train (no step taken)" in text and "steps/s" not in text


@pytest.mark.parametrize(
    ("position", "words"),
    [
        (Position(0, 0, 0), "step 0 (before epoch 1)"),
        (Position(6, 0, 6), "step 6 (6 batches into epoch 1)"),
        (Position(1, 0, 1), "step 1 (1 batch into epoch 1)"),
        (Position(440, 20, 0), "step 440 (the end of epoch 20)"),
        (Position(445, 20, 5), "step 445 (5 batches into epoch 21, after epoch 20)"),
    ],
)
def test_a_position_is_named_by_the_epochs_metrics_holds(position, words):
    assert train.where(position) == words


SIGTERM_AT_SAVE = 2  # the save that sends SIGTERM to its own process


@pytest.mark.parametrize(
    ("every", "stop", "expected"),
    [
        (STEPS, 2 * STEPS, f"step {2 * STEPS} (the end of epoch 2)"),
        (3, 6, "step 6 (6 batches into epoch 1)"),
        (5, 10, "step 10 (2 batches into epoch 2, after epoch 1)"),
    ],
    ids=["at-an-epoch-end", "in-the-first-epoch", "in-a-later-epoch"],
)
def test_the_stop_line_names_the_epoch_metrics_jsonl_ends_at(
    reference, tmp_path, capsys, monkeypatch, every, stop, expected
):
    """Before this change a stop at the end of epoch 2 read "epoch 3, batch 0", while the last
    epoch record in metrics.jsonl was epoch 2. The stopped run still resumes bit for bit."""
    real, calls = checkpoint.Saver.__call__, [0]

    def save(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == SIGTERM_AT_SAVE:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the run: it stops after this save
        return real(self, *args, **kwargs)

    monkeypatch.setattr(checkpoint.Saver, "__call__", save)
    out = tmp_path / "run"
    assert cvae_train(*TINY, "--checkpoint-every", str(every), "--out", str(out)) == 143
    [line] = [line for line in capsys.readouterr().err.splitlines() if " stopped by " in line]
    assert line.startswith(f"cvae: pure_jax stopped by SIGTERM at {expected}, checkpoint written")
    done = [r["epoch"] for r in epochs(out)]
    assert done == list(range(1, stop // STEPS + 1))  # the epochs the line says are complete
    monkeypatch.undo()
    assert cvae_train("--resume", str(out), "--no-progress", "--iw-samples", "1") == 0
    assert_same_run(out, reference)


class _FullDisk:
    """A metrics file that fails as a full disk does on its first record."""

    def __init__(self, file) -> None:
        self._file = file

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str):
        return getattr(self._file, name)


def test_a_full_disk_before_any_checkpoint_names_overwrite_which_then_works(
    tmp_path, capsys, monkeypatch
):
    """Before this change the hint said to "start the run again": the same command is refused
    (--out is not empty) and --resume finds no checkpoint. --overwrite is what works."""
    real = metricslog.MetricsLog.__init__

    def init(self, path):
        real(self, path)
        self._file = _FullDisk(self._file)

    out = tmp_path / "run"
    command = [*TINY, "--checkpoint-every", "0", "--out", str(out)]
    monkeypatch.setattr(metricslog.MetricsLog, "__init__", init)
    assert cvae_train(*command) == 74
    err = capsys.readouterr().err.strip()
    assert err == (
        f"cvae: error: could not write {out / rundir.METRICS_FILE} (metrics.jsonl): No space left "
        "on device; no checkpoint was written, so --resume has nothing to go on from: once the "
        f"disk can be written again, run the same command with --overwrite (it replaces what "
        f"this run wrote in {out})"
    )
    monkeypatch.undo()
    assert cvae_train(*command) == 2  # the same command alone is refused
    assert "not empty" in capsys.readouterr().err
    assert cvae_train(*command, "--overwrite", quiet=True) == 0  # what the hint says works


def test_the_write_failure_hint_fits_what_the_directory_holds(tmp_path):
    def resume_command(run: Path) -> str:
        return f"cvae train --resume {run}"

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / rundir.LOCK_FILE).touch()
    failure = files.WriteFailed(empty / "config.json", "config.json", "No space left on device")
    failure.workdir = empty
    line = train.describe_write_failure(failure, resume_command)
    again = "once the disk can be written again, run the same command"
    assert line.endswith(f"{empty} is empty: {again}")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    failure.workdir = other
    line = train.describe_write_failure(failure, resume_command)
    assert f"remove {other}" in line and "--overwrite" not in line.split("remove")[1]
    failure.workdir = None  # before the run directory was claimed, or another command's output
    line = train.describe_write_failure(failure, resume_command)
    assert f"{again}, adding --overwrite if its output directory" in line


def test_an_init_that_cannot_be_traced_still_starts_a_run():
    """The protocol does not ask ``init`` to be jit-able: one that reads a key's bits in Python
    (not traceable) gets the eager call's state from :func:`train.fresh_state`, not an error."""
    import dataclasses

    import jax
    import numpy as np

    from cvae_rosetta.spec import protocol

    impl = protocol.load("pure_jax")
    calls = []

    def init_in_python(key, config):
        calls.append(int(jax.random.key_data(key)[-1]))  # a Python int: fails under tracing
        return impl.init(key, config)

    untraceable = dataclasses.replace(impl, init_fn=lambda key, config: init_in_python(key, config))
    key = jax.random.key(3)
    state = train.fresh_state(untraceable, key, Config())
    assert calls == [int(jax.random.key_data(key)[-1])]  # the traced call failed before this
    eager, fresh = impl.to_canonical(impl.init(key, Config())), impl.to_canonical(state)
    assert jax.tree.all(jax.tree.map(np.array_equal, eager, fresh))


# --- a finished run -------------------------------------------------------------------------------


def stamps(directory: Path) -> dict[str, int]:
    """Every file's modification time, but the lock file's."""
    return {
        str(p.relative_to(directory)): p.stat().st_mtime_ns
        for p in directory.rglob("*")
        if p.is_file() and p.name != rundir.LOCK_FILE
    }


def test_resuming_a_finished_run_says_so_and_rewrites_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    before, when = snapshot(out), stamps(out)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    said = capsys.readouterr()
    assert said.out == (
        f"pure_jax: {out} is finished: 4 epochs, {TOTAL} steps, every output written after its "
        "last step; nothing to train, nothing rewritten (--epochs above 4 extends it)\n"
    ), said
    assert snapshot(out) == before and stamps(out) == when  # not a byte, not a time
    assert main(["train", "--resume", str(out), "--no-progress", "--epochs", "1"]) == 2
    assert capsys.readouterr().err == (
        "cvae: error: --epochs (train.epochs): expected at least 4 (the run has trained 4 epochs, "
        f"{TOTAL} steps), got 1\n"
    )
    assert snapshot(out) == before and stamps(out) == when

    # outputs a stop cut short (the evaluation older than the summary, a picture missing): the
    # resume writes them again, and trains nothing
    os.utime(out / rundir.EVALUATION_FILE, ns=(1, 1))
    (out / rundir.GENERATED_FILE).unlink()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "nothing left to train in 4 epochs" in said and "is finished" not in said
    assert (out / rundir.GENERATED_FILE).is_file()
    assert stamps(out)[rundir.EVALUATION_FILE] > when[rundir.SUMMARY_FILE]
    assert [r for r in records(out) if r["event"] == "step"][-1]["step"] == TOTAL

    # more epochs: not finished
    assert main(["train", "--resume", str(out), "--no-progress", "--epochs", "5"]) == 0
    assert "is finished" not in capsys.readouterr().out
    assert checkpoint.latest_of_run(out).step == TOTAL + TOTAL // 4


def test_a_finished_run_ended_by_max_steps_says_how_it_goes_on(tmp_path):
    summary = {"impl": "haiku", "step": 13, "epoch": 2, "partial": True}
    outcome = train.Outcome(tmp_path, "haiku", "synthetic", CONFIG, None, summary)
    assert train.describe(outcome) == (
        f"haiku: {tmp_path} is finished: ended by max_steps at step 13, in epoch 2 of "
        f"{CONFIG.train.epochs}, every output written after its last step; nothing to train, "
        "nothing rewritten (a larger max_steps goes on)"
    )
    assert train.exit_status(outcome) == 0
