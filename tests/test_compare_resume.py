"""``cvae compare`` stopped by a signal (``shared/app/compare.py``): one line naming what finished,
what was stopped and where, status 143 or 130; ``cvae compare --resume DIR`` then finishes it, its
table equal to an uninterrupted comparison's (but the timings), and a finished one is left as is.

The subprocess is slowed after each training record of one implementation (its metrics.jsonl), so
the signal lands while that implementation trains, at a step the test waits for."""

from __future__ import annotations

import contextlib
import io
import json
import signal
from pathlib import Path

import pytest

from cvae_rosetta.cli import main
from cvae_rosetta.cli.tiny_runs import kill, snapshot, start, wait_for

# The comparison of pure JAX and Flax Linen: run by the flax environment, which installs Flax.
pytestmark = pytest.mark.needs_flax

IMPLS = "pure_jax,flax_linen"
TINY = [
    *("--data", "synthetic", "--batch-size", "64", "--latent-dim", "2", "--encoder-dims", "8"),
    *("--decoder-dims", "8", "--iw-samples", "1", "--no-progress", "--epochs", "2"),
]
TIMINGS = ("steps_per_second", "compile_seconds")
SLOWED = """
import time
from cvae_rosetta.app import metricslog
_write = metricslog.MetricsLog.__call__
def _slowed(self, record):
    _write(self, record)
    if self.path.parent.name == {name!r}:
        time.sleep(0.25)
metricslog.MetricsLog.__call__ = _slowed
"""


def compare_args(out: Path) -> list[str]:
    return ["compare", "--impls", IMPLS, *TINY, "--out", str(out)]


def run_cli(*args: str) -> tuple[int, str]:
    """``cvae ARGS`` in this process: its status and stdout."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(list(args))
    return status, stdout.getvalue()


def table(out: Path) -> list[dict]:
    """summary.json's rows without the timings (the only figures that may differ)."""
    rows = json.loads((out / "summary.json").read_text())["rows"]
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in rows]


def steps_of(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((r["step"] for r in lines if r.get("event") == "step"), default=0)


def stop_while_training(out: Path, name: str, sig: int) -> tuple[int, str]:
    """``cvae compare`` in a new process, sent ``sig`` once ``name`` has trained 3 steps."""
    process = start(compare_args(out), out.parent, driver=SLOWED.format(name=name))
    wait_for(process, lambda: steps_of(out / name) >= 3, f"{name} at step 3")
    return kill(process, sig)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "cmp"
    status, _ = run_cli(*compare_args(out))
    assert status == 0
    return out


def one_stop_line(stderr: str) -> str:
    """The one line a stopped comparison prints: nothing else on stderr (before this change the
    notice that it was stopping came first, off a terminal too)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and " stopped by " in lines[0], stderr
    return lines[0]


def test_sigterm_in_the_second_implementation_then_resume_equals_an_uninterrupted_one(
    tmp_path, uninterrupted
):
    out = tmp_path / "cmp"
    status, stderr = stop_while_training(out, "flax_linen", signal.SIGTERM)
    assert status == 143, stderr
    line = one_stop_line(stderr)
    assert "compare stopped by SIGTERM" in line and "finished: pure_jax" in line, line
    assert "flax_linen stopped at step " in line and "checkpoint written" in line, line
    assert line.endswith(f"go on with: cvae compare --resume {out}"), line
    assert not (out / "summary.json").exists()
    assert (out / "pure_jax" / "summary.json").is_file()
    assert not (out / "flax_linen" / "summary.json").exists()
    kept = snapshot(out / "pure_jax")

    stopped_at = int(line.split("flax_linen stopped at step ")[1].split()[0])
    assert 0 < stopped_at < 16, line  # inside its training: 2 epochs of 8 steps
    status, stdout = run_cli("compare", "--resume", str(out), "--no-progress")
    assert status == 0
    assert "max |dparam|" in stdout
    resumes = json.loads((out / "flax_linen" / "config.json").read_text())["resumes"]
    assert [r["step"] for r in resumes] == [stopped_at]  # from its checkpoint, not afresh
    assert table(out) == table(uninterrupted)
    for name in ("pure_jax", "flax_linen"):
        mine = json.loads((out / name / "evaluation.json").read_text())
        theirs = json.loads((uninterrupted / name / "evaluation.json").read_text())
        assert mine == theirs, name
    assert snapshot(out / "pure_jax") == kept  # the finished one is left as it is
    assert all((out / f).is_file() for f in ("curves.png", "samples.png", "summary.md"))

    # a finished comparison: nothing left, nothing changed
    before = snapshot(out)
    status, stdout = run_cli("compare", "--resume", str(out), "--no-progress")
    assert status == 0 and "nothing left to do" in stdout, stdout
    assert snapshot(out) == before


def test_sigint_in_the_first_implementation_is_130_and_resume_finishes_it(tmp_path, uninterrupted):
    out = tmp_path / "cmp"
    status, stderr = stop_while_training(out, "pure_jax", signal.SIGINT)
    assert status == 130, stderr
    line = one_stop_line(stderr)
    assert "compare stopped by SIGINT" in line and "finished: none" in line, line
    assert "pure_jax stopped at step " in line and "not started: flax_linen" in line, line
    status, _ = run_cli("compare", "--resume", str(out), "--no-progress")
    assert status == 0
    assert table(out) == table(uninterrupted)


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--epochs", "3"], "--epochs"),
        (["--impls", "pure_jax"], "--impls"),
        (["--out", "elsewhere"], "--out"),
        (["--overwrite"], "--overwrite"),
        (["--iw-samples", "4"], "--iw-samples"),
    ],
)
def test_resume_refuses_what_the_comparison_keeps(tmp_path, capsys, extra, flag):
    out = tmp_path / "cmp"
    out.mkdir()
    assert main(["compare", "--resume", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cvae: error: {flag}: expected none with --resume")
    assert list(out.iterdir()) == []


def test_resume_refuses_what_is_no_comparison(tmp_path, capsys):
    train_run = tmp_path / "run"
    train_run.mkdir()
    (train_run / "config.json").write_text(json.dumps({"impl": "pure_jax", "config": {}}))
    (not_a_record := tmp_path / "list").mkdir()  # before this change: AttributeError, a traceback
    (not_a_record / "config.json").write_text("[1, 2]")
    for where in (tmp_path / "missing", train_run, not_a_record):
        assert main(["compare", "--resume", str(where)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "expected a cvae compare directory" in err[0], err


IN_EVALUATION = """
import time
from pathlib import Path
from cvae_rosetta.app import evaluate
_evaluate = evaluate.evaluate
def _slowed(*args, **kwargs):
    if kwargs.get("title") == "flax_linen":
        Path(kwargs["out"], "evaluating").touch()
        time.sleep(600)
    return _evaluate(*args, **kwargs)
evaluate.evaluate = _slowed
"""


def test_sigterm_in_an_implementations_final_outputs_keeps_its_checkpoint(tmp_path, uninterrupted):
    out = tmp_path / "cmp"
    process = start(compare_args(out), tmp_path, driver=IN_EVALUATION)
    marker = out / "flax_linen" / "evaluating"
    wait_for(process, marker.is_file, "flax_linen's evaluation")
    status, stderr = kill(process, signal.SIGTERM)
    assert status == 143, stderr
    line = one_stop_line(stderr)
    assert "flax_linen stopped at the last step, 16, before its final outputs" in line, line
    assert not (out / "flax_linen" / "summary.json").exists()
    marker.unlink()  # what the slowed evaluation left; no run writes it
    status, _ = run_cli("compare", "--resume", str(out), "--no-progress")
    assert status == 0
    assert table(out) == table(uninterrupted)
