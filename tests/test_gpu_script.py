"""``benchmarks/gpu.sh``: its refusal without a GPU, its smoke run on the CPU (every part, toy
sizes, the JSON it writes), and the time limits of its driver, ``benchmarks/gpu.py``.

The GPU run itself needs a GPU; the smoke run goes through the same parts, commands and readers,
so that the prepared run cannot rot between the rare times it runs on one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu.sh"
PARTS = ("preflight", "bench", "bf16", "dispatch", "data_parallel", "roof", "bench_2", "bench_3")
PARTS += ("suite",)


def load_gpu():
    spec = importlib.util.spec_from_file_location("gpu_driver", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def script_env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_BENCH_OUT")}
    return {**env, "PYTHON": sys.executable, **changes}


def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    proc = subprocess.run(
        [str(SCRIPT), "--out", str(tmp_path / "out")],
        env=script_env(JAX_PLATFORMS="cpu"),  # no GPU, even on a machine with one
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("gpu.sh: no GPU here: JAX ") and "--smoke-cpu" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One ``benchmarks/gpu.sh --smoke-cpu``: every part on the CPU, pure JAX only."""
    out = tmp_path_factory.mktemp("smoke")
    start = time.monotonic()
    proc = subprocess.run(
        [str(SCRIPT), "--smoke-cpu", "--out", str(out)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "bench_smoke.json").read_text())
    return out, data, proc.stdout, time.monotonic() - start


def part_file(out: Path, data: dict, part: str) -> dict:
    entry = data["gpu_run"]["parts"][part]
    assert entry["file"].endswith("_smoke.json")
    return json.loads((out / entry["file"]).read_text())


@pytest.mark.slow
def test_the_smoke_run_goes_through_every_part_and_records_it(smoke):
    out, data, stdout, seconds = smoke
    run = data["gpu_run"]
    assert run["schema"] == "cvae-gpu-run/1" and run["mode"] == "smoke-cpu"
    assert run["device"]["platform"] == "cpu" and run["device"]["kind"] == "cpu"
    assert run["device"]["count"] == 1
    assert run["versions"]["jax"] and run["versions"]["cvae-rosetta"]
    assert "pure_jax" in run["implementations"]
    assert stdout.startswith("device: cpu (cpu, 1 device(s)); jax ")
    assert set(run["parts"]) == set(PARTS)
    assert run["parts"]["bench_3"]["status"] == "skipped"  # two runs are enough to merge
    for name, entry in run["parts"].items():
        assert entry["status"] == "ok" or name == "bench_3", (name, entry)
        assert entry["seconds"] <= entry.get("limit_s", entry["seconds"]) + 15, (name, entry)
    assert run["duration_s"] <= run["budget_s"] and run["duration_s"] <= seconds
    assert not list(out.glob("*_gpu.json"))  # a smoke run never writes a GPU file


@pytest.mark.slow
def test_the_smoke_run_writes_each_parts_figures(smoke):
    out, data, _, _ = smoke
    # cvae bench: its two runs merged into one result, derived figures and goals computed again
    assert data["schema"] == "cvae-bench/1" and list(data["batches"]) == ["2", "4"]
    assert data["settings"]["batch_sizes"] == [2, 4] and len(data["runs"]) == 2
    for batch in data["batches"].values():
        fast = next(r for r in batch["paths"] if r["label"] == "pure_jax")
        assert fast["step_us"]["median"] > 0 and fast["compile_s"] > 0
        assert fast["empty_step_us"]["median"] > 0 and fast["vs_pure_jax"]["step_us.median"] == 1
    assert data["goals"]["roof_fraction"]["batch"] == 4
    assert {r["mechanism"] for r in data["data_parallel"]["rows"]} == {"none", "sharded"}
    # float32 against bfloat16
    steps = part_file(out, data, "bf16")
    assert steps["device_kind"] == "cpu" and set(steps["batches"]) == {"2", "2 bfloat16"}
    assert steps["batches"]["2 bfloat16"]["pure_jax"]["median_us"] > 0
    # what a call costs
    dispatch = part_file(out, data, "dispatch")
    assert dispatch["backend"] == "cpu" and list(dispatch["configs"]) == ["default"]
    assert dispatch["configs"]["default"]["batches"]["2"]["pure_jax"]["identity"] > 0
    # data parallelism on the devices present
    parallel = part_file(out, data, "data_parallel")
    cases = {(r["mechanism"], r["devices"]) for r in parallel["rows"]}
    assert cases == {("none", 1), ("pmap", 1), ("sharded", 1), ("shard_map", 1)}
    # the roof
    roof = part_file(out, data, "roof")
    assert roof["backend"] == "cpu" and roof["sets"]["default"]["roof_gflops_per_s"] > 0
    assert roof["sets"]["default"]["ms"]["step"] > 0
    # the suite: a check of each session, its report read back
    suite = data["gpu_run"]["parts"]["suite"]
    found = suite["implementations"]["pure_jax"]
    assert found["complete"] and found["passed"] and found["counts"]["passed"] >= 2
    assert found["counts"]["failed"] == 0
    names = {p["name"] for p in suite["processes"]}
    assert names == {"suite_pure_jax", "suite_pure_jax_precision"}
    assert all(p["summary"] and "passed" in p["summary"] for p in suite["processes"])
    assert (out / "smoke_logs" / "suite_pure_jax_precision.json").is_file()


def test_a_part_past_its_limit_is_stopped_and_recorded(tmp_path):
    gpu = load_gpu()
    job = gpu.Job("sleep", ["sleep", "30"], tmp_path / "sleep.log", dict(os.environ), tmp_path)
    quick = gpu.Job("true", ["true"], tmp_path / "true.log", dict(os.environ), tmp_path)
    start = time.monotonic()
    gpu.run_jobs([job, quick], limit=1.0)
    assert time.monotonic() - start < 15
    assert job.status() == "timed out" and job.record()["status"] == "timed out"
    assert quick.status() == "ok" and quick.rc == 0


def test_a_part_without_time_left_is_skipped_and_the_others_still_run(tmp_path):
    gpu = load_gpu()
    run = gpu.Run(
        mode="smoke",
        out=tmp_path,
        logs=tmp_path,
        deadline=time.monotonic() + 100,
        python=sys.executable,
        record={"parts": {}},
        probe={},
    )
    broken = gpu.Part("broken", "raises", {"smoke": 60}, lambda run, limit: 1 / 0)
    late = gpu.Part("late", "too late", {"smoke": 60}, lambda run, limit: {"status": "ok"})
    gpu.run_part(run, broken, 60, time.monotonic())
    gpu.run_part(run, late, 5, time.monotonic())
    parts = json.loads((tmp_path / "bench_smoke.json").read_text())["gpu_run"]["parts"]
    assert parts["broken"]["status"] == "failed" and "ZeroDivisionError" in parts["broken"]["error"]
    assert parts["late"] == {
        "what": "too late",
        "limit_s": 5,
        "status": "skipped",
        "reason": "5 s left for it",
    }


def test_pytests_last_line_is_read_with_and_without_its_rule():
    gpu = load_gpu()
    assert gpu._pytest_summary("x\n1 passed, 156 deselected in 2.40s\n") == (
        "1 passed, 156 deselected in 2.40s"
    )
    text = (
        "!!! KeyboardInterrupt !!!\n===== 12 passed, 1 failed in 100.1s (0:01:40) =====\nreport\n"
    )
    assert gpu._pytest_summary(text) == "12 passed, 1 failed in 100.1s (0:01:40)"
    assert gpu._pytest_summary("collecting ...") is None


def test_limit_replaces_a_parts_limit_and_refuses_what_it_cannot_read(capsys):
    gpu = load_gpu()
    names = [p.name for p in (*gpu.PARTS, gpu.SUITE)]
    assert gpu.parse_limits(["bench=240,bf16=60.5", " roof = 50 "], names) == {
        "bench": 240.0,
        "bf16": 60.5,
        "roof": 50.0,
    }
    assert gpu.parse_limits([], names) == {}
    for bad in ("bench", "bench=0", "bench=-3", "bench=soon", "nope=30"):
        with pytest.raises(ValueError, match="PART=SECONDS"):
            gpu.parse_limits([bad], names)
        # refused before JAX starts, in one line
        assert gpu.main(["--limit", bad]) == gpu.REFUSED
        err = capsys.readouterr().err
        assert err.startswith("gpu.sh: --limit: expected PART=SECONDS") and err.count("\n") == 1


@pytest.mark.slow
def test_a_limit_given_is_the_one_the_part_runs_under(tmp_path):
    command = [str(SCRIPT), "--smoke-cpu", "--only", "dispatch", "--limit", "dispatch=77"]
    proc = subprocess.run(
        [*command, "--out", str(tmp_path)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((tmp_path / "bench_smoke.json").read_text())["gpu_run"]
    assert run["limits"] == {"dispatch": 77.0}
    assert set(run["parts"]) == {"preflight", "dispatch"}
    assert run["parts"]["dispatch"]["limit_s"] == 77 and run["parts"]["dispatch"]["status"] == "ok"


def gpu_file(parts: dict, batches: dict | None = None, **run) -> dict:
    """A made-up ``bench_gpu.json``: ``cvae bench``'s figures at ``batches``, and a record."""
    record = {
        "started": "2026-01-01 00:00:00",
        "budget_s": 450.0,
        "duration_s": 400.0,
        "device": {"kind": "Made-up GPU", "count": 1},
        "versions": {"jax": "0.11.2"},
        "parts": {"preflight": {"status": "ok", "seconds": 3.0}, **parts},
        **run,
    }
    return {**({"batches": batches} if batches else {}), "gpu_run": record}


def test_a_later_run_of_some_parts_is_merged_into_the_first(tmp_path):
    gpu = load_gpu()
    first = gpu_file(
        {
            "bench": {"status": "timed out", "seconds": 90.3, "limit_s": 90, "jobs": [{}]},
            "dispatch": {"status": "ok", "file": "dispatch_gpu.json", "seconds": 25.0},
            "suite": {"status": "partial", "seconds": 160.0},
        }
    )
    later = gpu_file(
        {"bench": {"status": "ok", "seconds": 127.0, "limit_s": 240.0, "batch_sizes": [1, 4096]}},
        {"1": {"paths": []}, "4096": {"paths": []}},
        started="2026-01-01 01:00:00",
        budget_s=260.0,
        duration_s=131.0,
        limits={"bench": 240.0},
    )
    (tmp_path / "bench_gpu.json").write_text(json.dumps(first))
    (tmp_path / "later.json").write_text(json.dumps(later))
    assert gpu.main(["--merge", str(tmp_path / "later.json"), "--out", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert list(merged["batches"]) == ["1", "4096"]  # the later run's figures
    run = merged["gpu_run"]
    assert run["started"] == "2026-01-01 00:00:00" and run["duration_s"] == 400.0
    assert run["parts"]["dispatch"] == first["gpu_run"]["parts"]["dispatch"]  # kept as they were
    assert run["parts"]["suite"] == first["gpu_run"]["parts"]["suite"]
    assert run["parts"]["preflight"] == first["gpu_run"]["parts"]["preflight"]
    bench = run["parts"]["bench"]
    assert bench["status"] == "ok" and bench["seconds"] == 127.0 and bench["run"] == 2
    assert bench["run_started"] == "2026-01-01 01:00:00"
    assert bench["replaces"] == {"run": 1, "status": "timed out", "seconds": 90.3, "limit_s": 90}
    assert [r["run"] for r in run["runs"]] == [1, 2]
    assert run["runs"][0]["parts"] == ["bench", "dispatch", "suite"]
    assert run["runs"][1] == {
        "run": 2,
        "started": "2026-01-01 01:00:00",
        "budget_s": 260.0,
        "duration_s": 131.0,
        "limits": {"bench": 240.0},
        "parts": ["bench"],
    }


def test_a_third_run_names_the_run_whose_outcome_it_replaces():
    gpu = load_gpu()
    first = gpu_file(
        {
            "bench": {"status": "timed out", "seconds": 90.3},
            "roof": {"status": "timed out", "seconds": 35.0, "limit_s": 35},
        }
    )
    second = gpu_file({"bench": {"status": "partial", "seconds": 100.0}})
    third = gpu_file(
        {
            "bench": {"status": "ok", "seconds": 120.0},
            "roof": {"status": "ok", "seconds": 48.0, "limit_s": 75.0},
        },
        started="2026-01-01 02:00:00",
    )
    run = gpu.merge_runs(gpu.merge_runs(first, second), third)["gpu_run"]
    assert [r["run"] for r in run["runs"]] == [1, 2, 3]
    roof = run["parts"]["roof"]  # measured in runs 1 and 3 only: it replaces run 1's outcome
    assert roof["run"] == 3 and roof["status"] == "ok"
    assert roof["replaces"] == {"run": 1, "status": "timed out", "seconds": 35.0, "limit_s": 35}
    bench = run["parts"]["bench"]  # measured in all three: it replaces run 2's
    assert bench["run"] == 3 and bench["replaces"] == {
        "run": 2,
        "status": "partial",
        "seconds": 100.0,
    }


def test_runs_on_another_device_or_versions_are_not_merged(tmp_path, capsys):
    gpu = load_gpu()
    first = gpu_file({"bench": {"status": "timed out"}})
    other = gpu_file({"bench": {"status": "ok"}}, versions={"jax": "0.10.2"})
    with pytest.raises(ValueError, match="differ in versions"):
        gpu.merge_runs(first, other)
    (tmp_path / "bench_gpu.json").write_text(json.dumps(first))
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert gpu.main(["--merge", str(tmp_path / "other.json"), "--out", str(tmp_path)]) == 1
    assert "differ in versions" in capsys.readouterr().err
    assert json.loads((tmp_path / "bench_gpu.json").read_text()) == first  # left as it was
