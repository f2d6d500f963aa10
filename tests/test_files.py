"""``cvae_rosetta.files``: atomic writes with the umask's permissions, and every writer using them.

The unit tests check the one implementation; the end-to-end test makes a real run, a conformance
report and an export (and the files ``cvae convert`` and ``cvae sample`` write) under umask 022
and checks that every file is 0o644 and every directory 0o755, as ``open`` and ``mkdir`` make them,
not the private 0o600 / 0o700 of ``tempfile.mkstemp`` / ``mkdtemp``.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cvae_rosetta import files


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_has_the_mode_open_gives_under_the_umask(tmp_path, mask, expected):
    with umask(mask):
        written = files.write_bytes(tmp_path / "a.bin", b"\x00\x01")
        with open(tmp_path / "plain.bin", "w"):
            pass
    assert written == tmp_path / "a.bin"
    assert written.read_bytes() == b"\x00\x01"
    assert mode(written) == expected == mode(tmp_path / "plain.bin")


def test_replacing_a_file_gives_the_umask_mode_and_the_new_content(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    path.chmod(0o600)  # e.g. written by tempfile.mkstemp before
    with umask(0o022):
        files.write_text(path, "new ü")
    assert path.read_text(encoding="utf-8") == "new ü"
    assert mode(path) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_write_json_formats_as_the_writers_did(tmp_path):
    data = {"b": [1, 2.5], "a": {"nan": float("nan")}}
    files.write_json(tmp_path / "default.json", data)
    assert (tmp_path / "default.json").read_text() == json.dumps(data, indent=2) + "\n"
    files.write_json(tmp_path / "report.json", data, sort_keys=True, newline=False)
    assert (tmp_path / "report.json").read_text() == json.dumps(data, indent=2, sort_keys=True)


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failing_write_leaves_the_previous_file_and_no_temporary(tmp_path, error):
    path = tmp_path / "a.json"
    files.write_json(path, {"loss": 1.0})

    def half(handle):
        handle.write(b'{"loss": 2')
        raise error

    with pytest.raises(type(error)):
        files.atomic_write(path, half)
    assert json.loads(path.read_text()) == {"loss": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_unserialisable_json_touches_nothing(tmp_path):
    with pytest.raises(TypeError):
        files.write_json(tmp_path / "a.json", {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_parents_are_created_only_when_asked(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.write_text(tmp_path / "missing" / "a.txt", "x")
    assert list(tmp_path.iterdir()) == []
    with umask(0o022):
        path = files.write_text(tmp_path / "new" / "deeper" / "a.txt", "x", parents=True)
    assert path.read_text() == "x"
    assert mode(tmp_path / "new") == mode(tmp_path / "new" / "deeper") == 0o755


# --- atomic_directory -----------------------------------------------------------------------------


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o755), (0o077, 0o700)])
def test_a_directory_appears_whole_with_the_umask_mode(tmp_path, mask, expected):
    target = tmp_path / "out"
    with umask(mask), files.atomic_directory(target) as work:
        assert work.parent == tmp_path and work.name.startswith(".out.")
        assert not target.exists()
        files.write_text(work / "a.txt", "a")
    assert mode(target) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (target / "a.txt").read_text() == "a"


def test_a_failing_directory_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), files.atomic_directory(tmp_path / "out") as work:
        (work / "a.txt").write_text("half")
        raise RuntimeError("tracing failed")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_replaced_only_if_empty_or_allowed(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with files.atomic_directory(target) as work:  # empty: replaced
        files.write_text(work / "first.txt", "1")
    with pytest.raises(OSError), files.atomic_directory(target) as work:  # not empty: refused
        files.write_text(work / "second.txt", "2")
    assert [p.name for p in target.iterdir()] == ["first.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with files.atomic_directory(target, overwrite=True) as work:
        files.write_text(work / "third.txt", "3")
    assert [p.name for p in target.iterdir()] == ["third.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


# --- every writer, end to end ---------------------------------------------------------------------

TINY = [
    *("--data", "synthetic", "--batch-size", "64", "--latent-dim", "2", "--encoder-dims", "8"),
    *("--decoder-dims", "8", "--iw-samples", "1", "--no-progress", "--epochs", "1"),
]


def wrong_modes(root: Path) -> list[str]:
    """Every file under ``root`` (itself included) not 0o644 and directory not 0o755."""
    wrong = [f"{root}: {mode(root):o}"] if mode(root) != 0o755 else []
    for directory, subdirectories, names in os.walk(root):
        for name in subdirectories:
            if mode(Path(directory, name)) != 0o755:
                wrong.append(f"{Path(directory, name)}/: {mode(Path(directory, name)):o}")
        for name in names:
            if mode(Path(directory, name)) != 0o644:
                wrong.append(f"{Path(directory, name)}: {mode(Path(directory, name)):o}")
    return wrong


def test_every_output_has_the_umask_permissions(tmp_path, capsys):
    from cvae_rosetta.cli import main

    root = tmp_path / "outputs"  # tmp_path itself is 0o700, made by pytest
    run_dir, export_dir = root / "run", root / "export"
    report = root / "conformance" / "conformance-report.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "CVAE_CONFORMANCE_REPORT": str(report)}
    env.pop("CVAE_IMPL", None)
    with umask(0o022):
        root.mkdir()
        # the suite's report, from a real pytest run of two spec checks (in parallel with the rest)
        suite = subprocess.Popen(
            [
                *(sys.executable, "-m", "pytest"),
                *("--pyargs", "cvae_rosetta.conformance.test_surface"),
                *("--impl", "pure_jax", "-p", "no:cacheprovider", "-q"),
                *("-k", "test_protocol_surface or test_canonical_round_trip"),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert main(["train", "--impl", "pure_jax", *TINY, "--out", str(run_dir)]) == 0
            assert main(["convert", "--run", str(run_dir), "--out", str(root / "c.npz")]) == 0
            sample = ["sample", "--run", str(run_dir), "--label", "1", "--n", "2"]
            assert main([*sample, "--out", str(root / "sample.npz")]) == 0
            assert main(["export", "--run", str(run_dir), "--out", str(export_dir)]) == 0
            output, _ = suite.communicate(timeout=300)
        finally:
            suite.kill()
            suite.wait()
    capsys.readouterr()
    assert suite.returncode == 0, output[-3000:]
    for name in ("config.json", "summary.json", "params.npz", "evaluation.json", "latent.png"):
        assert (run_dir / name).is_file(), name
    assert (export_dir / "manifest.json").is_file() and report.is_file()
    assert json.loads(report.read_text())["summary"]["pure_jax"]["passed"] == 2
    assert wrong_modes(root) == []
    assert not list(root.rglob(".*.tmp"))


class _Closes:
    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.closed = error, False

    def close(self) -> None:
        self.closed = True
        if self.error is not None:
            raise self.error


def test_a_failed_block_raises_its_own_failure_though_a_close_fails_after_it():
    """Seen in CI under a full disk: metrics.jsonl's close wrote its buffer again and failed, and
    its bare OSError (no file name) replaced the run's WriteFailed, so the line said 'could not
    write an output file' instead of naming the file and the resume command."""
    full = OSError(28, "No space left on device")
    failing, fine = _Closes(full), _Closes()
    failure = files.WriteFailed(Path("run/tb"), "the TensorBoard events", "No space left")
    with pytest.raises(files.WriteFailed) as raised, files.closed_after(failing, None, fine):
        raise failure
    assert raised.value is failure and failing.closed and fine.closed
    # nothing failed before: the close's failure is raised
    with pytest.raises(OSError) as raised, files.closed_after(_Closes(full)):
        pass
    assert raised.value is full


def test_the_metrics_log_names_its_file_when_its_close_fails_after_a_failed_write(tmp_path):
    from cvae_rosetta.app import metricslog

    log = metricslog.MetricsLog(tmp_path / "metrics.jsonl")
    real = log._file

    class Full:  # a full disk: the buffered record is written again at the close, and fails
        def write(self, text):
            return len(text)

        def flush(self):
            raise OSError(28, "No space left on device")

        close = flush

    log._file = Full()
    with pytest.raises(files.WriteFailed):
        log({"step": 1})
    with pytest.raises(files.WriteFailed, match="metrics.jsonl"):
        log.close()
    real.close()


@pytest.mark.parametrize("to_stderr", [False, True])
def test_native_output_leaves_stdout_to_the_command(to_stderr):
    """What native code writes on file descriptor 1 (gloo's connection lines) leaves stdout:
    to stderr with --verbose, else nowhere; Python's own prints stay on stdout."""
    code = (
        "import os, sys\nfrom cvae_rosetta import files\n"
        f"files.native_stdout(to_stderr={to_stderr})\n"
        "os.write(1, b'[Gloo] Rank 0 is connected to 1 peer ranks.\\n')\nprint('cvae: mine')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "cvae: mine\n", done
    assert done.stderr == ("[Gloo] Rank 0 is connected to 1 peer ranks.\n" if to_stderr else "")
