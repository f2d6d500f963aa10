"""``cvae bench`` on a tiny run, its renderer on a synthetic result file, and its refusals.

No figure is asserted to be fast or slow: the tests check that every implementation and path is
measured, that the file holds every expected key, that every ratio and derived figure is computed
from the file's own numbers, that the page and plots are rendered, and that bad flags are refused
with one line before anything is written.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cvae_rosetta.bench import harness as bench
from cvae_rosetta.bench import results as bench_results
from cvae_rosetta.cli import main
from cvae_rosetta.spec import protocol

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    *("--batch-sizes", "2", "--rounds", "2", "--steps", "8", "--epoch-examples", "16"),
    *("--unrolls", "1", "--devices", "1,2", "--mechanisms", "sharded"),
    *("--parallel-impls", "pure_jax", "--parallel-batch", "2", "--roof-size", "64"),
    "--no-progress",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One real ``cvae bench`` in a fresh process, so that it arranges its own two host devices;
    XLA compiles without optimisation there (no figure is checked, and it halves the time)."""
    out = tmp_path_factory.mktemp("bench") / "out"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
    }
    command = [sys.executable, "-m", "cvae_rosetta.cli", "bench", "--out", str(out), *TINY]
    proc = subprocess.run(
        command, env=env, cwd=out.parent, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}/" in proc.stdout
    return out, json.loads((out / bench_results.RESULT_FILE).read_text())


def expected_labels() -> set[str]:
    labels = set()
    for info in protocol.known():
        if not info.installed:
            continue
        impl = protocol.load(info.name)
        labels.add(info.name)
        labels |= {f"{info.name}:{path}" for path in bench.paths_of(impl)}
    return labels


def test_writes_the_result_file_the_page_and_the_plots(tiny):
    out, _ = tiny
    assert (out / bench_results.RESULT_FILE).is_file()
    page = (out / bench_results.PAGE_FILE).read_text()
    assert page.startswith("# Performance")
    for name in bench_report().PLOTS:
        assert (out / f"bench_{name}.png").is_file(), name
        assert f"(bench_{name}.png)" in page
    assert "### batch 2" in page and "## Goals" in page


def test_every_implementation_and_path_is_measured(tiny):
    _, data = tiny
    assert data["schema"] == bench_results.SCHEMA
    assert list(data["batches"]) == ["2"]
    batch = data["batches"]["2"]
    assert {row["label"] for row in batch["paths"]} == expected_labels()
    for row in batch["paths"]:
        for key in ("trace_s", "lower_s", "compile_s", "first_call_s", "overhead_us"):
            assert isinstance(row[key], float), (row["label"], key)
        assert set(row["step_us"]) == {"median", "min", "max", "rounds"}
        assert len(row["step_us"]["rounds"]) == 2
        assert set(row["vs_pure_jax"]) == set(bench.RATIO_FIELDS)
        if row["kind"] == "fast":
            assert len(row["empty_step_us"]["rounds"]) == 2 and row["empty_step_us"]["min"] > 0
            assert row["flops"] > 0
            assert row["memory"]["temp_size_in_bytes"] >= 0
            assert row["hlo"]["instructions"] > 0
    assert {s["impl"] for s in batch["epoch"]} == {r["impl"] for r in batch["paths"]}
    assert batch["roof"]["gflops_per_s"] > 0 and batch["layer_roof"]["gflops_per_s"] > 0
    env = data["environment"]
    for key in ("versions", "cpu_model", "cpu_count", "xla_flags", "backend"):
        assert key in env
    assert env["versions"]["jax"]
    assert len(data["load_average"]["start"]) == 3 and len(data["load_average"]["end"]) == 3
    assert data["peak_rss_bytes"] > 0
    others = data["other_processes_cpu"]
    assert others["cores"] >= 0 and set(others["phases"]) == {"batch 2", "data parallel"}
    cases = {(r["impl"], r["mechanism"], r["devices"]) for r in data["data_parallel"]["rows"]}
    assert cases == {
        ("pure_jax", "none", 1),
        ("pure_jax", "sharded", 1),
        ("pure_jax", "sharded", 2),
    }
    assert env["device_count"] == 2 and env["xla_flags"] == "--xla_backend_optimization_level=0"
    assert set(data["goals"]) == {"fast_within_ratio", "fast_overhead_us", "roof_fraction"}
    empties = [r["empty_step_us"]["median"] for r in batch["paths"] if r["kind"] == "fast"]
    assert data["goals"]["fast_overhead_us"]["worst"]["us"] == max(empties)


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12)


def test_every_ratio_is_computed_from_its_own_numbers(tiny):
    _, data = tiny
    check_derived(data)


def check_derived(data: dict) -> None:
    for batch in data["batches"].values():
        b, k = batch["batch_size"], batch["steps_per_round"]
        roof = batch["roof"]["gflops_per_s"]
        assert close(roof, batch["roof"]["flops"] / batch["roof"]["call_us"]["median"] / 1e3)
        base = next(r for r in batch["paths"] if r["label"] == "pure_jax")
        scans = {s["impl"]: s for s in batch["epoch"] if s["unroll"] == 1}
        for row in batch["paths"]:
            for field in bench.RATIO_FIELDS:
                value, ref = bench._get(row, field), bench._get(base, field)
                ok = value is not None and ref is not None and ref > 0  # else no ratio
                expected = value / ref if ok else None
                assert close(row["vs_pure_jax"][field], expected), (row["label"], field)
            scan = scans[row["impl"]]
            assert close(scan["step_us"], scan["call_us"]["median"] / k)
            assert close(row["overhead_us"], row["step_us"]["median"] - scan["step_us"])
            fast = next(
                r for r in batch["paths"] if r["impl"] == row["impl"] and r["path"] == "fast"
            )
            assert close(row["gflops_per_s"], fast["flops"] / row["step_us"]["median"] / 1e3)
            assert close(row["roof_fraction"], row["gflops_per_s"] / roof)
            assert close(row["loop_examples_per_s"], b / row["step_us"]["median"] * 1e6)
        for scan in batch["epoch"]:
            assert close(scan["examples_per_s"], b * k / scan["call_us"]["median"] * 1e6)
            ref = next(s for s in batch["epoch"] if s["impl"] == "pure_jax" and s["unroll"] == 1)
            if scan["unroll"] == 1:
                assert close(scan["vs_pure_jax"]["step_us"], scan["step_us"] / ref["step_us"])
    rows = data["data_parallel"]["rows"]
    cell = {(r["impl"], r["mechanism"], r["devices"]): r for r in rows}
    for row in rows:
        serial = cell[(row["impl"], "none", 1)]["step_us"]["median"]
        assert close(row["ratio_to_serial"], row["step_us"]["median"] / serial)
        ref = cell[("pure_jax", row["mechanism"], row["devices"])]["step_us"]["median"]
        assert close(row["vs_pure_jax"]["step_us.median"], row["step_us"]["median"] / ref)


# --- the renderer, on a result file made up here --------------------------------------------------


def bench_report():
    from cvae_rosetta.bench import report as bench_report

    return bench_report


def spread(median: float) -> dict:
    return {"median": median, "min": 0.9 * median, "max": 1.2 * median, "rounds": [median]}


def synthetic(load: float = 0.4) -> dict:
    """A measured result as ``bench.run`` leaves it before :func:`bench.summarize`: pure JAX and
    one other implementation with an idiomatic path of its own, at batch sizes 8 and 256."""
    batches = {}
    for b, us in ((8, 100.0), (256, 1000.0)):
        flops = 1e6 * b
        fast = dict(kind="fast", trace_s=0.2, lower_s=0.1, compile_s=1.0, first_call_s=1.4)
        fast.update(flops=flops, memory={"temp_size_in_bytes": 2**20}, hlo=bench.hlo_stats(""))
        rows = [
            dict(
                impl="pure_jax",
                path="fast",
                label="pure_jax",
                **fast,
                step_us=spread(us),
                empty_step_us=spread(40.0 + b / 256),
            ),
            dict(
                impl="pure_jax",
                path="idiomatic",
                label="pure_jax:idiomatic",
                same_as_fast=True,
                **fast,
                step_us=spread(us),
            ),
            dict(
                impl="other",
                path="fast",
                label="other",
                **fast,
                step_us=spread(us * 1.05),
                empty_step_us=spread(25.0),
            ),
            dict(
                impl="other",
                path="other.jit",
                label="other:other.jit",
                kind="idiomatic",
                trace_s=0.3,
                lower_s=0.1,
                compile_s=1.1,
                first_call_s=1.6,
                step_us=spread(us + 400.0),
            ),
        ]
        epoch = [
            dict(
                impl=i,
                unroll=1,
                steps=16,
                trace_s=0.2,
                lower_s=0.1,
                compile_s=1.5,
                memory={},
                call_us=spread(16 * us * 0.9),
            )
            for i in ("pure_jax", "other")
        ]
        epoch.append(dict(epoch[0], unroll=4, call_us=spread(16 * us * 0.8)))
        batches[str(b)] = {
            "batch_size": b,
            "steps_per_round": 16,
            "roof": {
                "shape": [64, 64, 64],
                "flops": 2 * 64**3,
                "call_us": spread(5.0),
                "gflops_per_s": 2 * 64**3 / 5.0 / 1e3,
            },
            "layer_roof": {
                "shape": [b, 794, 256],
                "flops": 2.0 * b * 794 * 256,
                "call_us": spread(50.0),
                "gflops_per_s": 2.0 * b * 794 * 256 / 5e4,
            },
            "paths": rows,
            "epoch": epoch,
            "peak_rss_bytes": 2**29,
        }
    parallel = [
        dict(impl=i, mechanism=m, devices=n, first_call_s=1.0, step_us=spread(500.0 * n))
        for i in ("pure_jax", "other")
        for m, n in (("none", 1), ("sharded", 2), ("shard_map", 2))
    ]
    return {
        "schema": bench_results.SCHEMA,
        "command": ["cvae", "bench"],
        "settings": bench.Settings(batch_sizes=(8, 256)).to_dict(),
        "environment": {
            "versions": {"python": "3.11", "jax": "0.10.2", "jaxlib": "0.10.2", "flax": None},
            "backend": "cpu",
            "device_kind": "cpu",
            "device_count": 2,
            "cpu_model": "Made-up CPU",
            "cpu_count": 2,
            "usable_cores": 2,
            "platform": "Linux",
            "xla_flags": "",
            "jax_platforms": "",
        },
        "load_average": {"start": [load, 0, 0], "during": [[load, 0, 0]], "end": [load, 0, 0]},
        "started": "2026-01-01 00:00:00",
        "duration_s": 60.0,
        "peak_rss_bytes": 2**29,
        "batches": batches,
        "data_parallel": {
            "batch_size": 256,
            "steps_per_round": 16,
            "backend": "cpu",
            "note": "forced host devices share the machine's cores",
            "rows": parallel,
            "skipped": [],
        },
    }


def roof_gap_result() -> dict:
    """A result of ``benchmarks/roof_gap.py`` with two flag sets."""
    items = ("roof", "step", "epoch", "grads", "update", "matmuls", "split_condition")

    def entry(flags: str, what: str, step_ms: float) -> dict:
        ms = dict.fromkeys(items, step_ms)
        flops = dict.fromkeys(items, 2e9)
        return {
            "flags": flags,
            "what": what,
            "ms": ms,
            "roof_gflops_per_s": 300.0,
            "flops": flops,
            "gflops_per_s": {i: flops[i] / ms[i] / 1e6 for i in items},
            "hlo": {"step": bench.hlo_stats("")},
            "compile_s": {},
            "load_average": [[0.1, 0.2]],
            "profiles": {
                "step": {
                    "wall_ms": step_ms,
                    "thunk_ms": {"loop fusion": 1.0},
                    "top": [
                        {
                            "name": "f",
                            "kind": "loop fusion",
                            "shape": "8",
                            "ms": 1.0,
                            "gflops_per_s": None,
                        }
                    ],
                    "note": "made-up",
                }
            },
        }

    return {
        "jax": "0.10.2",
        "cpu": "Made-up CPU",
        "cpu_count": 2,
        "batch_size": 1024,
        "rounds": 1,
        "steps": 2,
        "passes": 1,
        "roof_size": 64,
        "xla_flags": "",
        "sets": {
            "default": entry("", "defaults", 10.0),
            "fast_math": entry("--xla_cpu_enable_fast_math=true", "made-up", 9.0),
        },
    }


def dispatch_result() -> dict:
    us = {"loop": 500.0, "scan": 450.0, "identity": 40.0, "blocked loop": 600.0}
    return {
        "cpu": "Made-up CPU",
        "cpu_count": 2,
        "rounds": 1,
        "steps": 2,
        "configs": {
            "default": {
                "env": {},
                "what": "defaults",
                "load_average": [0.1, 0.1],
                "batches": {"1": {"pure_jax": {**us, "overhead": 50.0, "leaves": 56}}},
            }
        },
    }


def load_render():
    spec = importlib.util.spec_from_file_location("render", ROOT / "benchmarks" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summarize_derives_ratios_and_goals_from_a_synthetic_file():
    data = bench.summarize(synthetic())
    check_derived(data)
    rows = {r["label"]: r for r in data["batches"]["8"]["paths"]}
    assert math.isclose(rows["other"]["vs_pure_jax"]["step_us.median"], 1.05)
    assert math.isclose(rows["other:other.jit"]["vs_fast"]["extra_us"], 400.0 - 5.0)
    assert data["goals"]["fast_within_ratio"]["met"] is False
    assert data["goals"]["fast_within_ratio"]["worst"]["label"] == "other"
    assert data["goals"]["roof_fraction"]["batch"] == 256
    overhead = data["goals"]["fast_overhead_us"]  # the largest empty step, not the scan figure
    assert overhead["worst"]["label"] == "pure_jax" and overhead["worst"]["batch"] == 256
    assert math.isclose(overhead["worst"]["us"], 41.0) and overhead["met"] is False
    assert overhead["scan_worst"]["batch"] == 8  # the scan-based figure at the smallest batch
    assert bench.summarize(copy.deepcopy(data)) == data  # derived only from measured figures


def test_renderer_writes_the_page_and_plots_from_a_synthetic_file(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    source = results / "bench_cpu.json"
    source.write_text(json.dumps(bench.summarize(synthetic(load=3.0))))
    (results / "data_parallel_cpu.json").write_text(
        json.dumps(
            {
                "jax": "0.10.2",
                "backend": "cpu",
                "device_kind": "cpu",
                "cpu_count": 2,
                "batch_size": 256,
                "rounds": 1,
                "steps": 4,
                "note": "forced host devices share the machine's cores",
                "rows": [
                    dict(
                        impl="pure_jax",
                        mechanism=m,
                        devices=n,
                        median_us=1.0,
                        min_us=1.0,
                        max_us=1.0,
                        ratio_to_serial=1.0,
                    )
                    for m, n in (("none", 1), ("sharded", 2))
                ],
            }
        )
    )
    (results / "roof_gap_cpu.json").write_text(json.dumps(roof_gap_result()))
    (results / "dispatch_cpu.json").write_text(json.dumps(dispatch_result()))
    out = tmp_path / "docs" / "performance.md"
    out.parent.mkdir()
    render = load_render()
    assert render.main(["--bench", str(source), "--results", str(results), "--out", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("# Performance")
    for text in (
        "### batch 8",
        "### batch 256",
        "| other:other.jit |",
        "1.050x",
        "**These figures were taken on a loaded machine**",
        "## Data parallelism: `data_parallel_cpu.json`",
        "forced host devices share the machine's cores",
        "within 1.03x from",
        "## Closing the gap to the roof: `roof_gap_cpu.json`",
        "| fast_math: made-up | `--xla_cpu_enable_fast_math=true` | 9.00 | 0.900x |",
        "## What a call costs: `dispatch_cpu.json`",
        "| pure_jax | 56 | 500 | 450 | 50 | 40 | 600 |",
        # the findings in words, computed from the files' own figures
        "a jitted identity over a fast path's train state (56 leaves) costs 40 to 40 µs",
        "A step in the Python loop costs 50 to 50 µs more than the same step inside one",
        "the fastest set, fast_math (`--xla_cpu_enable_fast_math=true`), the step 10% faster",
        "Its matmuls alone take 10.00 ms",
    ):
        assert text in page, text
    for name in bench_report().PLOTS:
        assert f"(img/bench_{name}.png)" in page
        assert (out.parent / "img" / f"bench_{name}.png").stat().st_size > 1000
    quiet = bench_report().page(bench.summarize(synthetic()), {}, source="x", generated_by="y")
    assert "loaded machine" not in quiet


def nnx_paths_result() -> dict:
    """A ``cvae bench --impls pure_jax,flax_nnx`` result: the other implementation is Flax NNX,
    with its three stateful paths instead of one idiomatic path, each slower than its fast path
    by a fixed time per call."""
    data = json.loads(json.dumps(synthetic(load=3.0)).replace('"other', '"flax_nnx'))
    for batch in data["batches"].values():
        rows = batch["paths"]
        idiomatic = rows.pop()  # flax_nnx's one idiomatic row, replaced by NNX's three
        fast = rows[-1]["step_us"]["median"]
        for path, extra in (
            ("nnx.jit in place", 900.0),
            ("nnx.cached_partial", 300.0),
            ("nnx.jit tree mode", 500.0),
        ):
            label = f"flax_nnx:{path}"
            rows.append(dict(idiomatic, path=path, label=label, step_us=spread(fast + extra)))
    return bench.summarize(data)


def test_renderer_tells_the_nnx_paths_from_their_own_file(tmp_path):
    (tmp_path / "nnx_paths_cpu.json").write_text(json.dumps(nnx_paths_result()))
    page = load_render().render(tmp_path)
    section = page[page.index("## Flax NNX's ways to run the step: `nnx_paths_cpu.json`") :]
    for text in (
        "| pure_jax | 100 (1.000x) | 1000 (1.000x) |",
        "| flax_nnx | 105 (1.050x) | 1050 (1.050x) |",
        "| flax_nnx:nnx.jit tree mode | 605 (6.050x) | 1550 (1.550x) |",
        "**Taken on a loaded machine**",
        # the findings in words, computed from the file's own figures
        "by 900 µs with `nnx.jit` in graph mode, 500 µs in tree mode and 300 µs through",
        "Tree mode's step, against graph mode's: 40% faster (0.602x); against the cached",
        "The order graph mode, tree mode, `nnx.cached_partial`, slowest first, holds",
        "At batch 256 the three are within 1.857x of the fast path",
    ):
        assert text in section, text


def test_a_loaded_machine_is_told_by_other_processes_cpu_time_first():
    data = synthetic(load=3.0)  # no CPU measurement: the load average at the start decides
    assert bench_results.loaded(data)
    data["other_processes_cpu"] = {"cores": 0.01, "phases": {"batch 8": 0.0}}
    assert not bench_results.loaded(data)  # measured: a high load average alone does not count
    data["other_processes_cpu"] = {"cores": 0.1, "phases": {"batch 8": 0.6}}
    assert bench_results.loaded(data)  # one busy phase is enough
    data["other_processes_cpu"] = {"cores": 0.3, "phases": {}}
    assert bench_results.loaded(data)


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--batch-sizes", "0,8"], "--batch-sizes"),
        (["--batch-sizes", "8,a"], "--batch-sizes"),
        (["--rounds", "0"], "--rounds"),
        (["--steps", "many"], "--steps"),
        (["--epoch-examples", "-1"], "--epoch-examples"),
        (["--unrolls", "1,-2"], "--unrolls"),
        (["--devices", "0"], "--devices"),
        (["--mechanisms", "pmap,ring"], "--mechanisms"),
        (["--parallel-batch", "3", "--devices", "1,2"], "--parallel-batch"),
        (["--roof-size", "0"], "--roof-size"),
        (["--impls", "no_such_impl"], "impl"),
        (["--impls", "pure_jax", "--parallel-impls", "no_such"], "--parallel-impls"),
    ],
)
def test_bad_flags_are_refused_with_one_line_and_nothing_written(tmp_path, capsys, args, field):
    out = tmp_path / "out"
    assert main(["bench", "--out", str(out), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"cvae: error: {field}: expected"), err
    assert "got" in err
    assert not out.exists()


def test_a_non_empty_out_is_refused_unless_a_previous_benchmark(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["bench", "--out", str(out), *TINY]) == 2
    assert capsys.readouterr().err.startswith("cvae: error: --out: expected an empty")
    assert main(["bench", "--out", str(out), "--overwrite", *TINY]) == 2
    assert "not a previous benchmark" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# --- the GPU's figures beside the CPU's, from a GPU run made up here ------------------------------


def gpu_run_files(results: Path) -> None:
    """What one ``benchmarks/gpu.sh`` run leaves in ``results``, made up: ``bench_gpu.json`` (the
    CPU's synthetic result with every step 10 times faster, and the run's record) and the
    ``*_gpu.json`` files of its parts."""
    data = synthetic()
    for batch in data["batches"].values():
        for row in batch["paths"]:
            for key in ("step_us", "empty_step_us"):
                if key in row:
                    row[key] = spread(row[key]["median"] / 10)
            row["compile_s"] = 3.0  # the CPU's is 1.0
    data = bench.summarize(data)
    data["gpu_run"] = {
        "schema": "cvae-gpu-run/1",
        "mode": "gpu",
        "started": "2026-01-02 00:00:00",
        "duration_s": 400.0,
        "budget_s": 450.0,
        "device": {"platform": "gpu", "kind": "Made-up GPU", "count": 1, "memory_bytes": 2**37},
        "nvidia_smi": "Made-up GPU, 999.9, 140000 MiB",
        "host": {"cpu_model": "Made-up host", "cpu_count": 16},
        "versions": {"jax": "0.10.2", "jaxlib": "0.10.2", "jax-cuda12-plugin": "0.10.2"},
        "parts": {
            "bench": {"what": "cvae bench", "status": "ok", "seconds": 90.0, "limit_s": 110.0},
            "bf16": {"status": "ok", "file": "step_time_gpu.json"},
            "dispatch": {"status": "ok", "file": "dispatch_gpu.json"},
            "data_parallel": {"status": "ok", "file": "data_parallel_gpu.json"},
            "roof": {"status": "ok", "file": "roof_gap_gpu.json"},
            "suite": {
                "status": "partial",
                "implementations": {
                    "pure_jax": {
                        "counts": {"passed": 164, "failed": 0},
                        "complete": True,
                        "diagnosis": None,
                    },
                    "other": {
                        "counts": {"passed": 40, "failed": 2},
                        "complete": False,
                        "diagnosis": {"layer": "forward", "check": "m::test_made_up"},
                    },
                },
                "processes": [
                    {
                        "name": "suite_pairwise",
                        "impl": "pure_jax,other",
                        "status": "timed out",
                        "summary": "9 passed in 200.0s",
                    }
                ],
            },
        },
    }
    (results / "bench_gpu.json").write_text(json.dumps(data))
    rows = {"pure_jax": 100.0, "other": 120.0}
    (results / "step_time_gpu.json").write_text(
        json.dumps(
            {
                "jax": "0.10.2",
                "backend": "gpu",
                "device_kind": "Made-up GPU",
                "rounds": 5,
                "steps": 100,
                "batches": {
                    f"4096{dtype}": {
                        label: {"median_us": us * scale, "min_us": us, "max_us": us}
                        for label, us in rows.items()
                    }
                    for dtype, scale in (("", 1.0), (" bfloat16", 0.5))
                },
            }
        )
    )
    (results / "dispatch_gpu.json").write_text(
        json.dumps({**dispatch_result(), "backend": "gpu", "device_kind": "Made-up GPU"})
    )
    (results / "roof_gap_gpu.json").write_text(json.dumps(roof_gap_result()))
    (results / "data_parallel_gpu.json").write_text(
        json.dumps(
            {
                "jax": "0.10.2",
                "backend": "gpu",
                "device_kind": "Made-up GPU",
                "cpu_count": 16,
                "batch_size": 256,
                "rounds": 5,
                "steps": 50,
                "note": "",
                "rows": [
                    dict(
                        impl="pure_jax",
                        mechanism=m,
                        devices=1,
                        median_us=us,
                        min_us=us,
                        max_us=us,
                        ratio_to_serial=us / 100.0,
                    )
                    for m, us in (("none", 100.0), ("sharded", 110.0))
                ],
            }
        )
    )


def render_pages(tmp_path: Path, *, gpu: bool) -> tuple[str, str]:
    """``performance.md`` and ``choosing.md`` rendered from the synthetic CPU result (and, if
    ``gpu``, a made-up GPU run) in a folder of their own; nothing under the repository."""
    results, docs = tmp_path / "results", tmp_path / "docs"
    results.mkdir()
    docs.mkdir()
    (results / "bench_cpu.json").write_text(json.dumps(bench.summarize(synthetic())))
    if gpu:
        gpu_run_files(results)
    marked = "# Choosing\n\n<!-- gpu-summary:begin -->\nold\n<!-- gpu-summary:end -->\n\nrest\n"
    (docs / "choosing.md").write_text(marked)
    render = load_render()
    args = ["--bench", str(results / "bench_cpu.json"), "--results", str(results)]
    assert render.main([*args, "--out", str(docs / "performance.md")]) == 0
    return (docs / "performance.md").read_text(), (docs / "choosing.md").read_text()


def test_without_a_gpu_run_the_pages_say_so_and_how_to_measure_one(tmp_path):
    page, choosing = render_pages(tmp_path, gpu=False)
    section = page[page.index("## On a GPU") :]
    assert "**Not measured yet.**" in section and "`benchmarks/gpu.sh`" in section
    assert 'pip install ".[all,cuda,test]"' in section
    assert "**GPU figures are not measured yet**" in choosing and "`benchmarks/gpu.sh`" in choosing
    assert "old" not in choosing and choosing.endswith("<!-- gpu-summary:end -->\n\nrest\n")


def test_a_gpu_run_is_rendered_beside_the_cpu_figures(tmp_path):
    page, choosing = render_pages(tmp_path, gpu=True)
    assert "Not measured yet" not in page
    section = page[page.index("## On a GPU") :]
    for text in (
        "on **Made-up GPU** (1 device(s), 128 GiB usable)",
        "| bench | cvae bench | ok | 90 | 110 |",
        # the suite: counts per implementation, how far each got, its first failure
        "| pure_jax | 164 | 0 | 0 | 0 | yes | - |",
        "| other | 40 | 2 | 0 | 0 | no | layer `forward`: `test_made_up` |",
        "The pairs (`-m pairwise`, pure_jax,other): timed out, 9 passed in 200.0s.",
        # step time on the GPU, and beside the CPU's: ratios and the GPU's speed-up
        "| other | 10 (1.050x) | 105 (1.050x) |",
        "| other | 1.050x → 1.050x, 10.0x | 1.050x → 1.050x, 10.0x |",
        # per-call overhead: the empty step on both, at the smallest batch
        "| other | 2 | 25 |",
        # compile time, GPU and CPU totals at the largest batch both measured
        "| pure_jax | 0.20 | 0.10 | 3.00 | 3.30 | 1.30 |",
        "### Against the matmul roof",
        "### What a call costs, by `benchmarks/dispatch.py`",
        "| pure_jax | 56 | 500 | 450 | 50 | 40 | 600 |",
        "### The step and its parts against the roof, by `benchmarks/roof_gap.py`",
        # bfloat16 against float32
        "| other | 120 / 60, 0.50x |",
        "### Data parallelism: `data_parallel_gpu.json`",
        "(Made-up GPU, 16 host cores)",
        "**One device only**: each mechanism runs on that one device",
        "| pure_jax | 100 | 110 (1.10x) |",
    ):
        assert text in section, text
    # the GPU's files are in the GPU's section only, never among the CPU's
    assert "\n## What a call costs: `dispatch_gpu.json`" not in page
    assert "\n## Data parallelism: `data_parallel_gpu.json`" not in page
    for text in (
        "**On a GPU** (Made-up GPU",
        "| other | 1.050x (CPU 1.050x) | 1.050x (CPU 1.050x) |",
        "costs 2 to 4 µs on the GPU at batch 8, against 25 to 40 µs on the CPU.",
    ):
        assert text in choosing, text


def test_a_roof_xla_counts_no_flops_for_shows_its_own_2n3(tmp_path):
    """On a GPU XLA's cost analysis gives -1 FLOPs for the roof's matmul: its row shows the
    roof's GFLOP/s from 2 N^3, the figure every fraction is against, and says so."""
    results = tmp_path / "results"
    results.mkdir()
    gpu_run_files(results)
    roof = roof_gap_result()
    base = roof["sets"]["default"]
    base["flops"]["roof"] = -1.0
    base["gflops_per_s"]["roof"] = -1.0 / base["ms"]["roof"] / 1e6
    (results / "roof_gap_gpu.json").write_text(json.dumps(roof))
    page = load_render().render_gpu(results / "bench_gpu.json", None, results)
    assert "| the roof: one square matmul | 10.00 | - | 300 | 100% |" in page
    assert "(XLA's cost analysis counts none for it on this device)" in page
    assert "| -0 |" not in page


def test_a_gpu_run_whose_parts_did_not_finish_says_so(tmp_path):
    """A run whose ``cvae bench`` timed out, whose bfloat16 part was stopped part way, on a JAX
    outside the project's range: the pages say each of these, and render what did finish."""
    results = tmp_path / "results"
    results.mkdir()
    gpu_run_files(results)
    data = json.loads((results / "bench_gpu.json").read_text())
    run = {**data["gpu_run"], "versions": {"jax": "99.0", "jax-cuda13-plugin": "99.0"}}
    run["parts"]["bench"] = {"what": "cvae bench", "status": "timed out", "limit_s": 90.0}
    run["parts"]["bf16"] = {
        "status": "partial",
        "file": "step_time_gpu.json",
        "limit_s": 60.0,
        "jobs": [{"name": "step_time", "status": "timed out"}],
    }
    (results / "bench_gpu.json").write_text(json.dumps({"gpu_run": run}))
    render = load_render()
    page = render.render_gpu(results / "bench_gpu.json", None, results)
    for text in (
        "| bench | cvae bench | timed out | - | 90 |",
        "`cvae bench` gave no figures in this run (its part: timed out)",
        "jax-cuda13-plugin 99.0",
        "**jax 99.0 lies outside the project's requirement** (`jax",
        "| other | 120 / 60, 0.50x |",
        "**This part is partial**: its process was stopped at its 60 s limit",
    ):
        assert text in page, text
    assert "### Compile time" not in page
    choosing = render.render_choosing(results / "bench_gpu.json", None)
    assert "`cvae bench` gave no figures there (its part: timed out)" in choosing


def test_a_part_measured_again_by_a_later_run_says_which_run(tmp_path):
    """A ``bench_gpu.json`` whose ``cvae bench`` part came from a second run
    (``benchmarks/gpu.sh --merge``): the conditions name both runs, the part's row its run and
    what the first run's try did."""
    results = tmp_path / "results"
    results.mkdir()
    gpu_run_files(results)
    data = json.loads((results / "bench_gpu.json").read_text())
    run = data["gpu_run"]
    run["parts"]["bench"].update(
        run=2,
        run_started="2026-01-02 01:00:00",
        replaces={"run": 1, "status": "timed out", "seconds": 90.3, "limit_s": 90},
    )
    run["runs"] = [
        {"run": 1, "started": "2026-01-02 00:00:00", "budget_s": 450.0, "duration_s": 400.0},
        {
            "run": 2,
            "started": "2026-01-02 01:00:00",
            "budget_s": 260.0,
            "duration_s": 131.0,
            "limits": {"bench": 240.0},
            "parts": ["bench"],
        },
    ]
    (results / "bench_gpu.json").write_text(json.dumps(data))
    page = load_render().render_gpu(results / "bench_gpu.json", None, results)
    for text in (
        "run 1 started 2026-01-02 00:00:00, 400 s of a 450 s budget. Run 2, started "
        "2026-01-02 01:00:00, 131 s of a 260 s budget (limits bench 240 s), ran bench again",
        "| bench | cvae bench | ok (run 2; run 1: timed out in 90 s) | 90 | 110 |",
        "| bf16 |  | ok |",
    ):
        assert text in page, text


def test_a_smoke_run_is_never_rendered(tmp_path):
    """``*_smoke.json`` files (``benchmarks/gpu.sh --smoke-cpu``) measure nothing: the renderer
    leaves them out, in the CPU's sections and in the GPU's."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "dispatch_smoke.json").write_text(json.dumps(dispatch_result()))
    (results / "bench_smoke.json").write_text(json.dumps({"gpu_run": {}}))
    page = load_render().render(results)
    assert "smoke" not in page and "**Not measured yet.**" in page
