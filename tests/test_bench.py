"""``cvae bench`` on a tiny run, its renderer on a synthetic result file, and its refusals.

No figure is asserted to be fast or slow: the tests check that every implementation and path is
measured, that the file holds every expected key, that every ratio and derived figure is computed
from the file's own numbers, that the page and plots are rendered, and that bad flags are refused
with one line before anything is written.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from cvae_rosetta.bench import report
from cvae_rosetta.bench import results as bench_results
from cvae_rosetta.bench.causes import SAME_PROGRAM
from cvae_rosetta.bench.plots import PLOTS, plots
from cvae_rosetta.bench.programs import hlo_stats, paths_of
from cvae_rosetta.bench.results import parameter_count, summarize
from cvae_rosetta.bench.settings import Settings
from cvae_rosetta.bench.techniques import TECHNIQUES, kernel_layout_step
from cvae_rosetta.cli import main
from cvae_rosetta.spec import protocol

pytestmark = pytest.mark.suite_runs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs_build"))  # the docs build renders the repository's pages
import benchmark_pages  # noqa: E402  (docs_build/benchmark_pages.py)
import decision as decision_table  # noqa: E402  (docs_build/decision.py)
from decision import DECISION_BEGIN, DECISION_END, decision  # noqa: E402

TINY = [
    *("--batch-sizes", "2", "--rounds", "5", "--steps", "8", "--epoch-examples", "16"),
    *("--unrolls", "1", "--devices", "1,2", "--mechanisms", "sharded"),
    *("--parallel-impls", "pure_jax", "--parallel-batch", "2", "--roof-size", "64"),
    *("--precision-batches", "2", "--technique-batches", "2"),
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
        labels |= {f"{info.name}:{path}" for path in paths_of(impl)}
    return labels


def test_writes_the_result_file_the_page_and_the_plots(tiny):
    out, _ = tiny
    assert (out / bench_results.RESULT_FILE).is_file()
    page = (out / bench_results.PAGE_FILE).read_text()
    assert page.startswith("# Benchmark: CPU")
    for name in PLOTS:
        assert (out / f"bench_{name}.png").is_file(), name
        assert f"(bench_{name}.png)" in page
    for heading in ("## Fast paths against pure JAX", "## bfloat16 against float32"):
        assert heading in page


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
        assert len(row["step_us"]["rounds"]) == 5
        assert set(row["vs_pure_jax"]) == {"step"}
        assert row["vs_pure_jax"]["step"]["low"] is not None  # five rounds give an interval
        if row["kind"] == "fast":
            assert len(row["empty_step_us"]["rounds"]) == 5 and row["empty_step_us"]["min"] > 0
            assert row["flops"] > 0
            assert row["memory"]["temp_size_in_bytes"] >= 0
            assert row["hlo"]["instructions"] > 0
    assert {s["impl"] for s in batch["epoch"]} == {r["impl"] for r in batch["paths"]}
    assert batch["roof"]["gflops_per_s"] > 0
    assert batch["bandwidth"]["gb_per_s"] > 0 and len(batch["bandwidth"]["call_us"]["rounds"]) == 5
    fingerprints = {
        r["impl"]: r["hlo"]["fingerprint"] for r in batch["paths"] if r["kind"] == "fast"
    }
    assert all(len(f) == 16 for f in fingerprints.values())
    if "flax_linen" in fingerprints:  # the same program as pure JAX's, whatever traced it
        assert fingerprints["flax_linen"] == fingerprints["pure_jax"]
    (techniques,) = data["techniques"]
    assert [r["technique"] for r in techniques["rows"]] == list(TECHNIQUES)
    for row in techniques["rows"]:
        assert len(row["step_us"]["rounds"]) == len(row["scan_us"]["rounds"]) == 5
        assert row["bytes_accessed"] > 0 and row["vs_fast"]["scan_us"]["low"] is not None
    env = data["environment"]
    for key in ("versions", "cpu_model", "cpu_count", "xla_flags", "backend"):
        assert key in env
    assert env["versions"]["jax"]
    assert len(data["load_average"]["start"]) == 3 and len(data["load_average"]["end"]) == 3
    assert data["peak_rss_bytes"] > 0
    others = data["other_processes_cpu"]
    assert others["cores"] >= 0
    assert set(others["phases"]) == {"batch 2", "data parallel", "bfloat16", "techniques"}
    assert {(r["impl"], r["dtype"]) for r in data["precision"][0]["rows"]} == {
        (i, d) for i in {r["impl"] for r in batch["paths"]} for d in ("float32", "bfloat16")
    }
    cases = {(r["impl"], r["mechanism"], r["devices"]) for r in data["data_parallel"]["rows"]}
    assert cases == {
        ("pure_jax", "none", 1),
        ("pure_jax", "sharded", 1),
        ("pure_jax", "sharded", 2),
    }
    assert env["device_count"] == 2 and env["xla_flags"] == "--xla_backend_optimization_level=0"


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
            scan = scans[row["impl"]]
            assert close(scan["step_us"], scan["call_us"]["median"] / k)
            assert close(row["overhead_us"], row["step_us"]["median"] - scan["step_us"])
            fast = next(
                r for r in batch["paths"] if r["impl"] == row["impl"] and r["path"] == "fast"
            )
            assert close(row["gflops_per_s"], fast["flops"] / row["step_us"]["median"] / 1e3)
            assert close(row["roof_fraction"], row["gflops_per_s"] / roof)
            assert close(row["loop_examples_per_s"], b / row["step_us"]["median"] * 1e6)
            pairs = zip(row["step_us"]["rounds"], base["step_us"]["rounds"], strict=True)
            per_round = sorted(a / r for a, r in pairs)
            step = row["vs_pure_jax"]["step"]
            assert close(step["ratio"], statistics.median(per_round))
            assert step["low"] in per_round and step["high"] in per_round
            assert step["within_noise"] == (step["low"] <= 1.0 <= step["high"])
        for scan in batch["epoch"]:
            assert close(scan["examples_per_s"], b * k / scan["call_us"]["median"] * 1e6)
            ref = next(s for s in batch["epoch"] if s["impl"] == "pure_jax" and s["unroll"] == 1)
            if scan["unroll"] == 1:
                pairs = zip(scan["call_us"]["rounds"], ref["call_us"]["rounds"], strict=True)
                ratio = statistics.median(a / r for a, r in pairs)
                assert close(scan["vs_pure_jax"]["step"]["ratio"], ratio)
    rows = data["data_parallel"]["rows"]
    cell = {(r["impl"], r["mechanism"], r["devices"]): r for r in rows}
    for row in rows:
        serial = cell[(row["impl"], "none", 1)]["step_us"]
        pairs = zip(row["step_us"]["rounds"], serial["rounds"], strict=True)
        assert close(row["vs_serial"]["ratio"], statistics.median(a / s for a, s in pairs))


def get(row: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(row, dict) or part not in row:
            return None
        row = row[part]
    return row


# --- the renderer, on a result file made up here --------------------------------------------------


ROUND_NOISE = (1.0, 1.04, 0.97, 1.02, 0.99, 1.03, 0.98, 1.01, 0.96, 1.0)  # +-4 % round to round


def spread(median: float, factors=ROUND_NOISE) -> dict:
    rounds = [median * f for f in factors]
    return {"median": median, "min": min(rounds), "max": max(rounds), "rounds": rounds}


def synthetic(load: float = 0.4, other: float = 1.05, noise=(1.0,) * 10) -> dict:
    """A measured result as ``harness.run`` leaves it before :func:`summarize`: pure JAX and
    one other implementation (``other`` times pure JAX's step, its rounds' noise ``noise`` against
    pure JAX's own) with an idiomatic path of its own, at batch sizes 8 and 256."""
    batches = {}
    for b, us in ((8, 100.0), (256, 1000.0)):
        flops = 1e6 * b
        fast = dict(kind="fast", trace_s=0.2, lower_s=0.1, compile_s=1.0, first_call_s=1.4)
        fast.update(flops=flops, memory={"temp_size_in_bytes": 2**20}, hlo=hlo_stats(""))
        fast["bytes_accessed"] = 25e6 + 1e4 * b
        base = spread(us)
        mine_noise = [a * n for a, n in zip(ROUND_NOISE, noise, strict=True)]
        mine = spread(us * other, mine_noise)
        rows = [
            dict(impl="pure_jax", path="fast", label="pure_jax", **fast, step_us=base),
            dict(
                impl="pure_jax",
                path="idiomatic",
                label="pure_jax:idiomatic",
                same_as_fast=True,
                **fast,
                step_us=base,
            ),
            dict(impl="other", path="fast", label="other", **fast, step_us=mine),
            dict(
                impl="other",
                path="other.jit",
                label="other:other.jit",
                kind="idiomatic",
                trace_s=0.3,
                lower_s=0.1,
                compile_s=1.1,
                first_call_s=1.6,
                step_us=spread(us * other + 400.0),
            ),
        ]
        rows[0]["empty_step_us"] = spread(40.0 + b / 256)
        rows[2]["empty_step_us"] = spread(25.0)
        epoch = [
            dict(impl=i, unroll=1, steps=16, trace_s=0.2, lower_s=0.1, compile_s=1.5, memory={})
            for i in ("pure_jax", "other")
        ]
        epoch[0]["call_us"] = spread(16 * us * 0.9)
        epoch[1]["call_us"] = spread(16 * us * 0.9 * other, mine_noise)
        epoch.append(dict(epoch[0], unroll=4, call_us=spread(16 * us * 0.8)))
        batches[str(b)] = {
            "batch_size": b,
            "steps_per_round": 16,
            "roof": {"shape": [64, 64, 64], "flops": 2 * 64**3, "call_us": spread(5.0)},
            "bandwidth": {"what": "made up", "bytes": 20e6, "call_us": spread(400.0)},
            "paths": rows,
            "epoch": epoch,
            "peak_rss_bytes": 2**29,
        }
        roof = batches[str(b)]["roof"]
        roof["gflops_per_s"] = roof["flops"] / 5.0 / 1e3
    parallel = [
        dict(impl=i, mechanism=m, devices=n, first_call_s=1.0, step_us=spread(500.0 * n))
        for i in ("pure_jax", "other")
        for m, n in (("none", 1), ("sharded", 2), ("shard_map", 2))
    ]
    precision = [
        dict(impl=i, dtype=d, step_us=spread(1000.0 * (0.6 if d == "bfloat16" else 1.0)))
        for d in ("float32", "bfloat16")
        for i in ("pure_jax", "other")
    ]
    techniques = [
        dict(technique=t, what=t, flops=1e6, bytes_accessed=25e6 * f, hlo=hlo_stats(""))
        | dict(step_us=spread(500.0 * f), scan_us=spread(400.0 * f))
        for t, f in (("fast", 1.0), ("no donation", 1.2), ("optax's clipping", 1.3))
    ]
    return {
        "schema": bench_results.SCHEMA,
        "kind": "bench",
        "command": ["cvae", "bench"],
        "settings": Settings(batch_sizes=(8, 256)).to_dict(),
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
        "precision": [{"batch_size": 256, "steps_per_round": 16, "rows": precision}],
        "techniques": [{"batch_size": 256, "steps_per_round": 16, "rows": techniques}],
    }


def test_summarize_derives_ratios_from_a_synthetic_file():
    data = summarize(synthetic())
    check_derived(data)
    rows = {r["label"]: r for r in data["batches"]["8"]["paths"]}
    assert math.isclose(rows["other"]["vs_pure_jax"]["step"]["ratio"], 1.05)
    assert math.isclose(rows["other:other.jit"]["vs_fast"]["extra_us"], 400.0)
    assert rows["other"]["vs_pure_jax"]["step"]["within_noise"] is False  # 1.05x every round
    unrolled = bench_results.scan_row(data["batches"]["8"], "pure_jax", 4)
    assert math.isclose(unrolled["vs_unroll_1"]["ratio"], 0.8 / 0.9)
    bf16 = {r["impl"]: r for r in data["precision"][0]["rows"] if r["dtype"] == "bfloat16"}
    assert math.isclose(bf16["other"]["vs_float32"]["ratio"], 0.6)
    assert summarize(copy.deepcopy(data)) == data  # derived only from measured figures


def test_the_kernel_layout_technique_is_pure_jax_s_step_with_its_matmuls_swapped():
    """The *kernel layout* row times pure JAX's own step: the same update (to a rounding), its
    program evaluated with every ``h @ kernel`` given the custom VJP, and nothing else changed."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from cvae_rosetta.spec.config import Config, ModelConfig
    from cvae_rosetta.spec.validation import Batch

    impl = protocol.load("pure_jax")
    config = Config(
        model=ModelConfig(input_dim=12, encoder_dims=(8, 6), latent_dim=3, decoder_dims=(5,))
    )
    state = impl.init(jax.random.key(0), config)
    x = jax.random.uniform(jax.random.key(1), (4, 12))
    batch, key = Batch(x, jnp.arange(4) % 10), jax.random.key(2)
    step = kernel_layout_step(impl)
    expected, expected_metrics = jax.jit(impl.train_step)(state, batch, key)
    got, metrics = jax.jit(step)(state, batch, key)
    for a, b in zip(
        jax.tree.leaves((expected.params, expected.opt_state, expected_metrics)),
        jax.tree.leaves((got.params, got.opt_state, metrics)),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    programs = [str(jax.make_jaxpr(f)(state, batch, key)) for f in (impl.train_step, step)]
    assert programs[0] != programs[1], "the technique's step is the plain step: nothing swapped"


# --- intervals and what the pages say about them --------------------------------------------------


def test_the_interval_holds_the_median_of_the_paired_ratios():
    ten = bench_results.interval([1.0 + i / 100 for i in range(10)], [1.0] * 10)
    assert math.isclose(ten["ratio"], 1.045) and ten["rounds"] == 10
    # ten rounds: the 2nd smallest and 2nd largest (97.9 %); five: the extremes (93.8 %)
    assert (ten["low"], ten["high"]) == (1.01, 1.08) and ten["confidence"] > 0.95
    assert ten["within_noise"] is False
    five = bench_results.interval([0.9, 1.1, 1.0, 1.05, 0.95], [1.0] * 5)
    assert (five["low"], five["high"], five["within_noise"]) == (0.9, 1.1, True)
    few = bench_results.interval([1.0, 2.0], [1.0, 1.0])
    assert few["low"] is None and few["within_noise"] is None
    # drift that hits both alike cancels: the pairs, not the pooled rounds, decide
    drift = [1.0, 2.0, 4.0, 8.0, 16.0]
    paired = bench_results.interval([1.02 * d for d in drift], drift)
    assert math.isclose(paired["low"], 1.02) and paired["within_noise"] is False
    with pytest.raises(ValueError, match="rounds: expected"):
        bench_results.interval([1.0], [1.0, 2.0])


def pages(result: dict, tmp_path: Path) -> tuple[str, str]:
    """The performance page and the decision table rendered from ``result`` alone."""
    source = tmp_path / "bench_cpu.json"
    source.write_text(json.dumps(result))
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "choosing.md").write_text(f"# x\n\n{DECISION_BEGIN}\n{DECISION_END}\n")
    (docs / "fast_step.md").write_text((ROOT / "docs" / "fast_step.md").read_text())
    benchmark_pages.render_docs([(source, "bench_")], docs)
    return (docs / "performance.md").read_text(), (docs / "choosing.md").read_text()


def test_the_decision_table_has_a_row_per_need_with_its_evidence_and_its_gaps():
    """Rows by what a reader arrives with; each says its measured reason, how its framework is
    maintained (release history and the maintainers' words, with the source) or that there is
    no record, and what was not measured (here: no GPU run)."""
    result = summarize(synthetic())
    maintenance = {
        "fetched": "2026-12-05",
        "registry": "https://pypi.org",
        "distributions": {
            "dm-haiku": {
                "releases": [
                    {"version": "0.0.1", "date": "2020-06-04"},
                    {"version": "0.0.17", "date": "2026-07-27"},
                ],
                "statements": ["The project will enter maintenance mode."],
                "source": "https://pypi.org/project/dm-haiku/0.0.17/",
            }
        },
    }
    table = decision([result], maintenance)
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| if you need")
    }
    for need in ("Research code", "A production model maintained for years",
                 "Large batches on one GPU", "Keras habits", "Many devices or hosts"):  # fmt: skip
        assert any(key.startswith(need) for key in rows), (need, list(rows))
    haiku = rows["An existing Haiku codebase"]
    assert "dm-haiku: 1 release in the year to 2026-12-05, the latest 0.0.17 (2026-07-27)" in haiku
    assert "“The project will enter maintenance mode.”](https://pypi.org/project/dm-haiku" in haiku
    assert "flax: no record" in rows["An existing Linen codebase"]
    # what to mind says of flax's description only what its record quotes (the one sentence)
    linen = rows["An existing Linen codebase"].split(" | ")[-1]
    assert "tells of Flax NNX as evolved from the Linen API" in linen, linen
    assert "documentation site" not in linen, linen
    gpu = next(v for k, v in rows.items() if k.startswith("Large batches"))
    assert "no GPU run in the results: not measured" in gpu and "| not measured |" in gpu
    assert "no record" in decision([result], None)


def gpu_result(ratios: dict[str, float]) -> dict:
    """A summarized GPU result of pure JAX and the styles of ``ratios`` (each that many times
    pure JAX's step, device time and per call, every round alike: beyond noise unless 1.0)."""
    data = synthetic(other=1.0)
    data["environment"] |= {"backend": "gpu", "device_kind": "Made-up GPU"}
    for batch in data["batches"].values():
        paths = [r for r in batch["paths"] if r["impl"] == "pure_jax"]
        epoch = [e for e in batch["epoch"] if e["impl"] == "pure_jax"]
        for impl, factor in ratios.items():
            fast = next(r for r in paths if r["path"] == "fast")
            us = fast["step_us"]["median"] * factor
            paths.append(dict(fast, impl=impl, label=impl, step_us=spread(us)))
            scan = dict(epoch[0], impl=impl, call_us=spread(epoch[0]["call_us"]["median"] * factor))
            epoch.append(scan)
        batch["paths"], batch["epoch"] = paths, epoch
    return summarize(data)


def test_the_gpu_row_names_every_style_it_does_not_recommend_and_why():
    """Haiku as fast as pure JAX is named for existing code only (its own row: not for new code);
    a style 5% slower beyond noise is named with its ratio, not left out unsaid."""
    table = decision([gpu_result({"haiku": 1.0, "flax_nnx": 1.05, "flax_linen": 1.0})], None)
    row = next(line for line in table.splitlines() if line.startswith("| Large batches"))
    use = row.split(" | ")[1]
    assert use.startswith(
        "by device time: pure JAX or Flax Linen; Haiku as fast, for an existing codebase;"
    ), use
    assert "then Flax NNX 1.05x (" in use, use


def test_the_gpu_row_tells_a_per_call_difference_the_device_time_does_not_show():
    """Equinox's compiled step as fast as pure JAX's (device time 1.0x) but its calls 0.80x of
    pure JAX's beyond noise (what `cvae train` pays, one call a batch), on a machine where other
    processes used 1.4 cores: the row's evidence says the per-call ratio at the largest batch and
    that the machine was loaded; where every style's calls are as fast as pure JAX's, it says
    nothing of them."""
    data = synthetic(other=1.0)
    data["environment"] |= {"backend": "gpu", "device_kind": "Made-up GPU"}
    data["other_processes_cpu"] = {"cores": 1.4, "phases": {}}
    for batch in data["batches"].values():
        paths = [r for r in batch["paths"] if r["impl"] == "pure_jax"]
        epoch = [e for e in batch["epoch"] if e["impl"] == "pure_jax"]
        fast = next(r for r in paths if r["path"] == "fast")
        paths.append(dict(fast, impl="equinox", label="equinox", step_us=spread(
            fast["step_us"]["median"] * 0.8)))  # fmt: skip
        epoch.append(dict(epoch[0], impl="equinox"))
        batch["paths"], batch["epoch"] = paths, epoch
    table = decision([summarize(data)], None)
    row = next(line for line in table.splitlines() if line.startswith("| Large batches"))
    assert "Equinox within noise" in row or "and Equinox within noise" in row, row
    assert ("; per call at 256: Equinox 0.80x (0.80–0.80) (a loaded machine)") in row, row
    table = decision([gpu_result({"haiku": 1.0})], None)
    row = next(line for line in table.splitlines() if line.startswith("| Large batches"))
    assert "per call at batch" not in row, row


def test_what_calling_adds_is_said_from_the_empty_step_at_both_ends(tmp_path):
    """Made-up: pure JAX's empty step 40 µs (batch 8) and 41 µs (batch 256) against its step's
    100 µs and 1,000 µs per call. The per-call paragraph says both, not that dispatch "decides
    the small batches" whatever the figures."""
    performance, _ = pages(summarize(synthetic()), tmp_path)
    assert (
        "This adds what calling the step from Python costs; one call of an empty step (a call "
        "that computes nothing, below) took, for pure JAX, 40.0 µs of its 100 µs at batch 8 and "
        "41.0 µs of its 1,000 µs at batch 256."
    ) in performance


def test_a_figure_taken_outside_an_extras_jax_range_says_so():
    """Haiku's extra holds JAX below 0.11 (pyproject.toml): a made-up GPU run of Haiku on jax
    0.11.2 gets its Haiku row's figures said to be taken outside that range; the same run on jax
    0.10.2 gets no such note, and neither does a style whose extra pins no JAX."""
    data = gpu_result({"haiku": 1.0, "flax_linen": 1.0})

    def row(table: str, need: str) -> str:
        return next(line for line in table.splitlines() if line.startswith(f"| {need}"))

    data["environment"]["versions"]["jax"] = "0.11.2"
    table = decision([data], None)
    haiku = row(table, "An existing Haiku codebase")
    assert "(taken on jax 0.11.2, outside the `haiku` extra's range, jax<0.11,>=0.10.2)" in haiku
    assert "outside the" not in row(table, "An existing Linen codebase")
    data["environment"]["versions"]["jax"] = "0.10.2"
    assert "outside the" not in row(decision([data], None), "An existing Haiku codebase")


def test_a_run_on_a_jax_outside_the_projects_range_says_so(tmp_path):
    """The run's conditions name the project's own jax requirement (its metadata's, the same
    reading the Haiku note above uses) where the run's JAX lies outside it, and only there."""
    import importlib.metadata

    requires = importlib.metadata.requires("cvae-rosetta")
    [base] = [r for r in requires if r.startswith("jax<") and ";" not in r]
    data = synthetic()
    data["environment"]["versions"]["jax"] = "99.0"
    performance, _ = pages(summarize(data), tmp_path)
    assert f"**jax 99.0 lies outside the project's `{base}`**." in performance
    data["environment"]["versions"]["jax"] = "0.10.2"
    performance, _ = pages(summarize(data), tmp_path)
    assert "lies outside the project's" not in performance


def test_a_difference_inside_the_noise_is_called_so_and_not_ranked(tmp_path):
    # 1 % slower, with rounds that scatter by +-6 % against pure JAX's own
    noisy = (1.06, 0.95, 1.04, 0.94, 1.05, 0.97, 1.03, 0.96, 1.02, 1.0)
    performance, _ = pages(synthetic(other=1.01, noise=noisy), tmp_path)
    assert "Beyond noise: other 1." not in performance
    assert "Within noise at every batch size: other." in performance
    assert re.search(r"≈ 1\.0\dx \(", performance)
    assert "No difference beyond noise." in performance


def test_a_clear_difference_is_ranked(tmp_path):
    performance, _ = pages(synthetic(other=1.5), tmp_path)
    same = SAME_PROGRAM  # equal fingerprints (both made up empty)
    assert f"Beyond noise: other 1.50x at every batch size ({same})." in performance
    assert "| other | 1.50x (" in performance and "≈ 1.50x" not in performance
    # two wrappers' differences are ranked by size, largest first
    data = synthetic(other=1.5)
    for batch in data["batches"].values():
        row = dict(batch["paths"][-1], path="small.jit", label="other:small.jit")
        row["step_us"] = spread(batch["paths"][2]["step_us"]["median"] * 1.2)
        batch["paths"].append(row)
    performance, _ = pages(data, tmp_path)
    big = performance.index("other `other.jit` ")
    small = performance.index("other `small.jit` ", performance.index("Beyond noise: other `"))
    assert big < small


def test_a_wrapper_s_extra_time_is_said_for_the_batch_sizes_it_names(tmp_path):
    """The wrapper differs beyond noise at batch 8 only (+400 µs a call); at 256 it is within
    noise (+10 µs, rounds scattered): the sentence names batch 8 and its +400 µs alone, not a
    range over every batch size (+10 to +400, as it once did)."""
    data = synthetic(other=1.0)
    noisy = (1.06, 0.95, 1.04, 0.94, 1.05, 0.97, 1.03, 0.96, 1.02, 1.0)
    wrapper = data["batches"]["256"]["paths"][-1]
    wrapper["step_us"] = spread(
        1000.0 + 10.0, [a * n for a, n in zip(ROUND_NOISE, noisy, strict=True)]
    )
    performance, _ = pages(data, tmp_path)
    found = re.search(r"Beyond noise: other `other\.jit` \S+ at batch 8 \(([^)]*)\)", performance)
    assert found, performance
    assert found.group(1) == AROUND + ", +400 µs a call", found[0]
    assert "Within noise" not in found[0]


# What an idiomatic path's extra time holds beside its wrapper's work (every idiomatic step is
# called with its noise drawn outside the compiled step; ``eqx.filter_jit`` donates nothing).
AROUND = "the wrapper's work and a noise draw outside the compiled step"


def renamed(data: dict, impl: str, path: str) -> dict:
    """``data`` with its other implementation named ``impl`` and its idiomatic path ``path``."""
    data = copy.deepcopy(data)
    for batch in data["batches"].values():
        for row in batch["paths"]:
            if row["impl"] == "other":
                row["impl"] = impl
                row["label"] = impl if row["path"] == "fast" else f"{impl}:{path}"
                row["path"] = row["path"] if row["path"] == "fast" else path
        for scan in batch["epoch"]:
            scan["impl"] = impl if scan["impl"] == "other" else scan["impl"]
    for row in data["data_parallel"]["rows"] + data["precision"][0]["rows"]:
        row["impl"] = impl if row["impl"] == "other" else row["impl"]
    return data


def test_a_wrapper_s_extra_time_is_not_put_on_the_wrapper_alone(tmp_path):
    """The made-up `eqx.filter_jit` path is 400 µs a call slower than its fast path. That time
    holds the noise its step is called with, drawn outside the compiled step, and no donation:
    the finding, the checklist and the choosing page say so, where they once put it all on "the
    wrapper's own work around the step" (and the checklist on the wrapper alone)."""
    data = renamed(synthetic(other=1.05), "equinox", "eqx.filter_jit")
    performance, _ = pages(summarize(data), tmp_path)
    assert (
        "Equinox `eqx.filter_jit` 1.38x to 4.81x at every batch size (the wrapper's work, a noise "
        "draw outside the compiled step and no donation, +400 µs a call)"
    ) in performance
    assert "the wrapper's own work around the step" not in performance
    page = (tmp_path / "docs" / "fast_step.md").read_text()
    assert (
        "1. Step with `jax.jit` over a pure state, the noise drawn inside the step, not the "
        "framework's own jit wrapper with the noise drawn outside it, which donates nothing: up "
        "to 4.81x per call (Equinox `eqx.filter_jit`, batch 8)"
    ) in page
    # a wrapper that donates (Keras's train function): the draw alone, in its row of the table
    data = renamed(synthetic(other=1.05), "keras", "model.fit step")
    performance, choosing = pages(summarize(data), tmp_path)
    assert f"Keras 3 `model.fit step` 1.38x to 4.81x at every batch size ({AROUND}, +400" in (
        performance
    )
    keras = next(line for line in choosing.splitlines() if line.startswith("| Keras habits"))
    assert f"`model.fit step` per call, against the fast path ({AROUND}): 4.81x (" in keras, keras


def test_the_per_call_and_data_parallel_timings_name_what_was_timed(tmp_path):
    """The loop calls the executable the fast path compiled ahead of time, and the data-parallel
    table times ``Plan.make_step``, not the trainer's step of ``cvae train --data-parallel``."""
    performance, _ = pages(summarize(synthetic()), tmp_path)
    assert (
        "**Per call**: the protocol's step, `jax.jit(impl.train_step, donate_argnums=0)` compiled "
        "ahead of time (`.trace(...).lower().compile()`), its executable called from a Python loop"
    ) in performance
    assert "The data-parallel step (`Plan.make_step`, the one the conformance suite" in performance
    assert "The step `cvae train --data-parallel` runs" not in performance


def test_a_ratio_taken_for_the_machine_s_says_what_each_run_showed():
    """Flax NNX compiles to pure JAX's program at every batch of a made-up CPU run (equal
    fingerprints); a GPU run that recorded no fingerprint has it 1.05x pure JAX's, with pure JAX's
    counts. The GPU row names the run whose fingerprints showed the program and says the GPU run
    showed the counts only (it once said "the same program as pure JAX's where fingerprinted, the
    same counts here", as if the GPU run had shown the program)."""
    cpu = summarize(with_programs(synthetic(other=1.0), "flax_nnx", {}, 30.7e6))
    gpu = gpu_result({"flax_nnx": 1.05})
    for batch in gpu["batches"].values():
        for row in batch["paths"]:
            (row.get("hlo") or {}).pop("fingerprint", None)
    row = next(
        line for line in decision([cpu, gpu]).splitlines() if line.startswith("| Large batches")
    )
    said = (
        "(this run recorded no fingerprint: here its program has pure JAX's counts (and it was "
        "pure JAX's very program, by their fingerprints, at every batch size of the CPU run "
        "(Made-up CPU, 2 cores, 2026-01-01, jax 0.10.2), compiled for another machine): taken "
        "for the machine's variation between rounds, not a difference of the step)"
    )
    assert re.search(r"Flax NNX 1\.05x \([^)]*\) " + re.escape(said), row), row
    assert "where fingerprinted" not in row


def test_the_data_parallel_note_is_said_of_every_case_not_of_the_last_difference():
    """The run's note on data parallelism (forced host devices share the cores) stands beside what
    was measured, not after the last difference beyond noise as if it were that case's cause."""
    data = synthetic()
    for row in data["data_parallel"]["rows"]:
        if (row["impl"], row["mechanism"]) == ("other", "sharded"):
            row["step_us"] = spread(500.0 * 2 * 0.9)
    [row] = [r for r in decision([summarize(data)]).splitlines() if r.startswith("| Many devices")]
    assert (
        "(shard_map, sharded on 2 devices; forced host devices share the machine's cores): "
        "the other styles within noise in 1 of 2 cases; other sharded on 2 0.90x (0.90–0.90)"
    ) in row, row
    assert "0.90x (0.90–0.90) (forced" not in row


def with_programs(data: dict, impl: str, hlo: dict, bytes_accessed: float) -> dict:
    """``data`` with ``impl``'s fast path given this compiled program, and pure JAX's a program
    of 116 fusions, 10 copies, 21 transposes and 30.7 MB per step."""
    data = copy.deepcopy(data)
    for batch in data["batches"].values():
        for row in batch["paths"]:
            row["impl"] = impl if row["impl"] == "other" else row["impl"]
            row["label"] = row["label"].replace("other", impl)
            if row["path"] == "fast":
                ref = row["impl"] == "pure_jax"
                counts = dict(fingerprint="a1", fusions=116, copies=10, transposes=21)
                row["hlo"] = counts if ref else {**counts, **hlo}
                row["bytes_accessed"] = 30.7e6 if ref else bytes_accessed
        for scan in batch["epoch"]:
            scan["impl"] = impl if scan["impl"] == "other" else scan["impl"]
    return data


def test_every_difference_beyond_noise_carries_its_cause(tmp_path):
    """The pages name why two styles differ, from their compiled programs: one program (equal
    fingerprints), or the fusions, copies, transposes and bytes that differ."""
    other = dict(fingerprint="b2", fusions=109, transposes=0)
    data = with_programs(synthetic(other=0.8), "equinox", other, 22.8e6)
    performance, choosing = pages(data, tmp_path)
    cause = (
        "its compiled one-step program: 109 fusions against 116, 0 transposes against 21, 22.8 MB "
        "against 30.7 MB per step (-4.0 passes over the parameters)"
    )
    assert f"Beyond noise: Equinox 0.80x at every batch size ({cause})." in performance
    assert f"0.80x (0.80–0.80) at batch 8 ({cause})" in choosing  # the decision table
    assert "| Equinox | 8.0 | 22.8 MB | 109 | 10 | 0 | b2 |" in performance
    data = with_programs(synthetic(other=0.8), "equinox", dict(fingerprint="a1"), 30.7e6)
    performance, choosing = pages(data, tmp_path)
    same = SAME_PROGRAM
    assert f"Beyond noise: Equinox 0.80x at every batch size ({same})." in performance
    assert f"at batch 8 ({same})" in choosing
    assert "| Equinox | 8.0 | 30.7 MB | 116 | 10 | 21 | = pure JAX |" in performance


def test_the_roofline_is_the_larger_of_the_two_bounds(tmp_path):
    """Per round: FLOPs at the matmul rate against bytes at the streaming rate, the larger one
    over the step; bytes beside the spec's minimum, computed from the config."""
    data = summarize(synthetic())
    model = data["settings"]["model"]
    assert bench_results.parameter_count(model) == 488_848
    assert bench_results.minimum_bytes(model, 8) == 4 * (11 * 488_848 + 8 * 785)
    batch = data["batches"]["8"]
    scan = bench_results.scan_row(batch, "pure_jax")
    fastest = min(ROUND_NOISE)  # each rate is its fastest round's
    memory = 25.08e6 / 20e6 * 400.0 * fastest  # µs: bytes at the streaming rate
    compute = 8e6 / (2 * 64**3) * 5.0 * fastest  # µs: FLOPs at the matmul rate
    assert memory > compute
    steps = [r / 16 for r in scan["call_us"]["rounds"]]
    assert math.isclose(
        scan["bound_fraction"]["ratio"], statistics.median(memory / s for s in steps)
    )
    assert math.isclose(batch["bandwidth"]["gb_per_s"], 20e6 / (400.0 * fastest) / 1e3)
    performance, _ = pages(data, tmp_path)
    assert "| bandwidth GB/s | 52.1 | 52.1 |" in performance
    assert "| pure JAX | 25.1 MB (116%) | 27.6 MB (" in performance
    assert "`no donation` | 256 | 1.20x (1.20–1.20) | 1.20x (1.20–1.20) | 30.0 MB (" in performance
    fast_step = (tmp_path / "docs" / "fast_step.md").read_text()
    assert "`no donation` | 256 | 1.20x (1.20–1.20) | 1.20x (1.20–1.20) | 30.0 MB (" in fast_step
    assert "<!-- fast-step:techniques:begin -->\nOn the CPU (Made-up CPU, 2 cores, 2026-01-01" in (
        fast_step
    )


def test_the_roofline_says_which_side_binds_at_each_batch(tmp_path):
    """Made-up rates: a 64x64x64 matmul in 4.8 µs, the streaming update's 20 MB in 384 µs (the
    fastest rounds). Batch 8 (8 MFLOP, 25.08 MB) is bound by memory at 482 µs; batch 256 (256
    MFLOP, 27.56 MB) by compute at 2,344 µs; the bandwidth program's bytes are counted as passes
    over the parameters."""
    performance, _ = pages(summarize(synthetic()), tmp_path)
    row = next(line for line in performance.splitlines() if line.startswith("| the bound:"))
    assert row == "| the bound: the larger side | 482 µs (memory) | 2,344 µs (compute) |", row
    params = parameter_count(Settings().to_dict()["model"])
    assert f"({20e6 / (4 * params):.0f} passes over the parameters' size)" in performance


def test_the_fast_step_checklist_ranks_what_each_way_gave(tmp_path):
    """Made-up gains: the wrapper 4.81x at batch 8, optax's clipping 1.30x and no donation 1.20x
    (batch 256, the techniques' batch): ranked largest first, each with its batch size."""
    pages(summarize(synthetic(other=1.05)), tmp_path)
    page = (tmp_path / "docs" / "fast_step.md").read_text()
    block = page.split("<!-- fast-step:checklist:begin -->")[1].split("<!-- fast-step:checklist")[0]
    items = [line for line in block.splitlines() if re.match(r"\d+\. ", line)]
    assert [re.search(r": ([^:]*)$", line)[1] for line in items] == [
        "up to 4.81x per call (other `other.jit`, batch 8)",
        "1.30x per call (batch 256)",
        "1.20x per call (batch 256)",
    ], items
    assert items[1].startswith("2. Clip by one scalar factor") and "Donate" in items[2], items


def test_ranks_whose_intervals_overlap_are_said_to_be_in_no_measured_order(tmp_path):
    """Made-up rounds: no donation 1.20x and optax's clipping 1.25x per call, each round +-10 %
    (both beyond noise, their intervals overlapping); the wrapper's 4.81x stands apart. The
    checklist ranks all three and says that the order of ranks 2 and 3 is not measured; with the
    rounds all alike (the test above), nothing overlaps and nothing is said."""
    data = synthetic(other=1.05)
    jitter = (1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.1, 0.9, 1.05, 0.95)
    for row in data["techniques"][0]["rows"]:
        factor = {"no donation": 1.2, "optax's clipping": 1.25}.get(row["technique"])
        if factor:
            noisy = [a * j for a, j in zip(ROUND_NOISE, jitter, strict=True)]
            row["step_us"] = spread(500.0 * factor, noisy)
    pages(summarize(data), tmp_path)
    page = (tmp_path / "docs" / "fast_step.md").read_text()
    block = page.split("<!-- fast-step:checklist:begin -->")[1].split("<!-- fast-step:checklist")[0]
    items = [line for line in block.splitlines() if re.match(r"\d+\. ", line)]
    assert len(items) == 3 and "4.81x" in items[0] and "Clip" in items[1], items
    said = re.search(r"Ranks 2 and 3 are each a gain beyond noise, but their intervals overlap "
                     r"\((\d\.\d\d)–(\d\.\d\d), (\d\.\d\d)–(\d\.\d\d)\): their order is "
                     r"not measured\.", block)  # fmt: skip
    assert said, block
    low_second, high_third = float(said[1]), float(said[4])
    assert 1 < low_second <= high_third, said.groups()
    pages(summarize(synthetic(other=1.05)), tmp_path)
    page = (tmp_path / "docs" / "fast_step.md").read_text()
    assert "their order is not measured" not in page


def test_a_gain_in_device_time_alone_is_told_under_the_checklist(tmp_path):
    """A way of writing the step within noise per call but slower as one compiled step
    (``optax.flatten``: 1.36x device time, 65 MB moved against 25 MB) is said so beside the
    ways that gave no gain per call."""
    data = synthetic()
    data["techniques"][0]["rows"].append(
        dict(technique="optax.flatten", what="x", flops=1e6, bytes_accessed=65e6)
        | dict(hlo=hlo_stats(""), step_us=spread(500.0), scan_us=spread(400.0 * 1.36))
    )
    pages(summarize(data), tmp_path)
    page = (tmp_path / "docs" / "fast_step.md").read_text()
    block = page.split("<!-- fast-step:checklist:begin -->")[1].split("<!-- fast-step:checklist")[0]
    assert "No gain per call beyond noise at the batch sizes measured: keep the parameters" in block
    assert (
        "Within noise per call, but not in the compiled step: `optax.flatten` 1.36x (1.36–1.36) "
        "device time, 65.0 MB moved against 25.0 MB at batch 256."
    ) in block


def test_the_scan_s_gain_is_weighed_against_what_a_dispatch_costs(tmp_path):
    """The scan's gain over the loop is put on the dispatch it saves only as far as one call of an
    empty step accounts for it: pure JAX saves 10 µs a step at batch 8 (an empty call: 40 µs) and
    100 µs at batch 256 (41 µs); the other style 10.5 µs and 105 µs (25 µs)."""
    pages(summarize(synthetic()), tmp_path)
    page = (tmp_path / "docs" / "fast_step.md").read_text()
    block = page.split("<!-- fast-step:scan:begin -->")[1].split("<!-- fast-step:scan:end")[0]
    one = "fewer dispatches, one for the K steps instead of one a step: an empty step's call is"
    rest = "the rest is not taken apart here"
    assert (
        f"pure JAX 0.90x at every batch size ({one} no less than the 10.0 µs (40.0 µs) saved a "
        f"step at batch 8, 41% of the 100 µs saved a step at batch 256; {rest})"
    ) in block
    assert f"24% of the 105 µs saved a step at batch 256; {rest})" in block


def test_the_techniques_table_says_its_fast_path_was_timed_in_a_phase_of_its_own(tmp_path):
    """The techniques' fast path (500 µs per call, 400 µs device time) beside the main tables'
    pure JAX at the same batch (1,000 µs per call, 900 µs device time)."""
    performance, _ = pages(summarize(synthetic()), tmp_path)
    assert (
        "These rows were timed in a phase of the run of their own, after the others: the fast "
        "path's times here differ from the main tables' for the same step by the machine's "
        "variation between phases (at batch 256, 500 µs per call and 400 µs of device time here "
        "against 1,000 µs and 900 µs in the run's main tables)."
    ) in performance


def test_a_per_call_difference_with_the_same_device_time_names_its_cause_or_none(tmp_path):
    """Device time the same, per call 0.80x: at batch 8 the empty step (25 µs against 40 µs)
    makes up the 20 µs, so calling the step is the cause; at batch 256 it makes up 16 of 200 µs,
    so calling it makes up 8% and the rest is not put on the step or on calling it; with the
    empty step the other way (55 µs against 41 µs) neither is."""
    data = synthetic(other=0.8)
    for batch in data["batches"].values():
        batch["epoch"][1]["call_us"] = copy.deepcopy(batch["epoch"][0]["call_us"])
    performance, _ = pages(summarize(data), tmp_path)
    assert (
        "at batch 8, device time within noise, an empty step 25.0 µs against 40.0 µs: the "
        "difference is in calling the step"
    ) in performance
    assert (
        "at batch 256, device time within noise and an empty step 25.0 µs against 41.0 µs: calling "
        "it makes up 8% of the difference (16.0 of 200 µs); what is left, this run does not take "
        "apart"
    ) in performance
    for batch in data["batches"].values():  # the empty step the other way round
        batch["paths"][2]["empty_step_us"] = spread(55.0)
    performance, _ = pages(summarize(data), tmp_path)
    assert (
        "at batch 256, device time within noise and an empty step 55.0 µs against 41.0 µs: not a "
        "difference of the step or of calling it; what is left, this run does not take apart"
    ) in performance


def test_a_per_call_difference_against_its_device_time_is_not_put_on_the_program(tmp_path):
    """Per call 0.80x, device time 1.20x (the compiled step slower, its call faster): what differs
    in the compiled program cannot be why the call is faster, so the note says the device time
    went the other way and weighs the cost of calling the step instead (before this change it
    named the program's differences for both)."""
    data = synthetic(other=0.8)
    for batch in data["batches"].values():  # the compiled step 1.2 times pure JAX's
        batch["epoch"][1]["call_us"] = spread(batch["epoch"][0]["call_us"]["median"] * 1.2)
    performance, _ = pages(summarize(data), tmp_path)
    per_call = performance[performance.index("**Per call**") :]
    assert re.search(r"device time 1\.20x \([^)]*\), the other way", per_call), per_call[:2000]
    assert "its compiled one-step program" not in per_call.partition("\n\n**")[0]


def test_every_ratio_on_the_pages_carries_an_interval(tmp_path):
    committed = [ROOT / "docs" / "performance.md", ROOT / "docs" / "choosing.md"]
    made_up = pages(summarize(synthetic()), tmp_path)
    for text in [*made_up, *(p.read_text() for p in committed)]:
        for match in re.finditer(r"(\d+\.\d+)x(?! to )", text):
            after = text[match.end() : match.end() + 40]
            before = text[max(0, match.start() - 80) : match.start()]
            ranged = re.match(r" \(\d+\.\d+–\d+\.\d+\)", after) or "no interval" in after
            # the findings' sentences name ranges of ratios given with intervals in the table
            paragraph = text[text.rfind("\n\n", 0, match.start()) + 1 : match.start()]
            told = "Beyond noise" in paragraph
            assert ranged or (told and " at " in after[:20] + before[-20:]), text[
                match.start() - 60 : match.end() + 40
            ]


def test_the_committed_pages_are_what_the_committed_results_render(tmp_path):
    """Every figure on performance.md and the decision table is generated: rendering the
    committed result files again gives the committed pages, word for word."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("choosing.md", "performance.md", "fast_step.md"):
        (docs / name).write_text((ROOT / "docs" / name).read_text())
    sources = [
        (ROOT / "benchmarks" / "results" / name, prefix)
        for name, prefix in (("bench_cpu.json", "bench_"), ("bench_gpu.json", "bench_gpu_"))
    ]
    results = ROOT / "benchmarks" / "results"
    records = {name: results / f"{name}.json" for name in benchmark_pages.EVIDENCE_TABLES}
    benchmark_pages.render_docs(
        [s for s in sources if s[0].is_file()], docs, results / "maintenance.json", records
    )
    for name in ("choosing.md", "performance.md", "fast_step.md"):
        assert (docs / name).read_text() == (ROOT / "docs" / name).read_text(), name


# Every figure the pages read, per result: the schema's contract with the renderer.
NEEDED = {
    "batch": ("batch_size", "steps_per_round", "roof.gflops_per_s", "roof.call_us.rounds"),
    "path": (
        "impl",
        "path",
        "label",
        "step_us.rounds",
        "vs_pure_jax.step.ratio",
        "vs_fast.step.ratio",
        "trace_s",
        "lower_s",
        "compile_s",
        "first_call_s",
        "gflops_per_s",
    ),
    "fast": ("empty_step_us.median", "flops", "hlo.fusions", "hlo.transposes", "roof_interval"),
    # what the roofline and the causes read: results of the harness of today
    "roofline": ("bandwidth.gb_per_s", "minimum_bytes"),
    "program": ("bytes_accessed", "traffic", "hlo.fingerprint"),
    "scan": ("impl", "unroll", "call_us.rounds", "vs_pure_jax.step.ratio", "roof_fraction"),
    "result": (
        "schema",
        "kind",
        "started",
        "settings.rounds",
        "settings.roof_size",
        "settings.model",
        "environment.versions.jax",
        "environment.cpu_model",
        "environment.device_count",
        "environment.backend",
        "data_parallel.rows",
    ),
}


def missing(result: dict, today: bool = True) -> list[str]:
    gaps = [f for f in NEEDED["result"] if get(result, f) is None]
    for b, batch in result["batches"].items():
        batch_fields = NEEDED["batch"] + (NEEDED["roofline"] if today else ())
        gaps += [f"{b}.{f}" for f in batch_fields if get(batch, f) is None]
        fast_fields = NEEDED["fast"] + (NEEDED["program"] if today else ())
        for row in batch["paths"]:
            fields = NEEDED["path"] + (fast_fields if row["path"] == "fast" else ())
            gaps += [f"{row['label']}.{f}" for f in fields if get(row, f) is None]
        for scan in batch["epoch"]:
            gaps += [f"scan.{f}" for f in NEEDED["scan"] if get(scan, f) is None]
    return gaps


@pytest.mark.parametrize("name", ["bench_cpu.json", "bench_gpu.json"])
def test_the_committed_results_hold_every_figure_the_pages_need(name):
    result = bench_results.load(ROOT / "benchmarks" / "results" / name)
    # the GPU's file predates the roofline (no device was lent since): the pages say so
    assert missing(result, today=name == "bench_cpu.json") == []
    assert bench_results.provenance(result)
    if name == "bench_cpu.json":  # the harness of today wrote it
        assert result.get("schema_read") is None and result["precision"] and result["techniques"]
        assert result["settings"]["rounds"] >= 10


def test_the_tiny_run_holds_every_figure_the_pages_need(tiny):
    _, data = tiny
    assert missing(data) == []


def test_a_loaded_machine_is_told_by_other_processes_cpu_time_first():
    data = synthetic(load=3.0)  # no CPU measurement: the load average at the start decides
    assert bench_results.loaded(data)
    data["other_processes_cpu"] = {"cores": 0.01, "phases": {"batch 8": 0.0}}
    assert not bench_results.loaded(data)  # measured: a high load average alone does not count
    data["other_processes_cpu"] = {"cores": 0.1, "phases": {"batch 8": 0.6}}
    assert bench_results.loaded(data)  # one busy phase is enough
    data["other_processes_cpu"] = {"cores": 0.3, "phases": {}}
    assert bench_results.loaded(data)


def test_the_page_of_a_run_holds_its_plots_and_says_when_the_machine_was_loaded(tmp_path):
    data = summarize(synthetic(load=3.0))
    images = plots(data, tmp_path)
    assert set(images) == set(PLOTS)
    for file in images.values():
        assert (tmp_path / file).stat().st_size > 1000
    page = report.page(data, images, source="bench.json")
    assert "**Taken on a loaded machine**" in page
    assert "bfloat16 against float32" in page and "| other | 0.60x (" in page
    assert "loaded machine" not in report.page(summarize(synthetic()), {}, source="x")


def test_an_old_schema_is_read_by_deriving_its_figures_again(tmp_path):
    data = synthetic()
    data["schema"] = "cvae-bench/1"
    del data["kind"], data["precision"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    loaded = bench_results.load(path)
    assert loaded["schema"] == bench_results.SCHEMA and loaded["schema_read"] == "cvae-bench/1"
    assert loaded["batches"]["8"]["paths"][2]["vs_pure_jax"]["step"]["ratio"] > 1
    path.write_text(json.dumps({"schema": "something/9"}))
    with pytest.raises(ValueError, match="schema: expected"):
        bench_results.load(path)


# --- the measurement code itself ------------------------------------------------------------------


MEASUREMENT = [
    *sorted((ROOT / "benchmarks").glob("*.py")),
    *sorted((ROOT / "benchmarks").glob("*.sh")),
    *sorted((ROOT / "shared" / "bench").glob("*.py")),
]


# The one ``sys.path`` edit a script of ``benchmarks/`` may make: ``benchmarks/render.py`` reaches
# the docs build (``docs_build/``, which renders the repository's pages from the results).
DOCS_BUILD_PATH = 'sys.path.insert(0, str(ROOT / "docs_build"))'


def test_measurement_code_stands_on_the_package_alone():
    """What measures (``benchmarks/`` and ``shared/bench/``) imports the installed package, never
    the tests' helpers, and edits no ``sys.path`` to reach them (a script of ``benchmarks/`` may
    put the docs build's folder on it, :data:`DOCS_BUILD_PATH`; the package never)."""
    for path in MEASUREMENT:
        text = path.read_text()
        if path.parent.name == "benchmarks":
            text = text.replace(DOCS_BUILD_PATH, "")
        assert "sys.path" not in text, path
        assert not re.search(r"^\s*(from|import) (tests|run_helpers|conftest)\b", text, re.M), path


def test_the_gpu_script_refuses_without_a_gpu_in_one_line(tmp_path):
    script = ROOT / "benchmarks" / "gpu.sh"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
    proc = subprocess.run(
        [str(script), "bench", "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout.count("\n") == 1 and "expected a GPU that JAX sees, got backend cpu" in (
        proc.stdout
    )
    assert not list((tmp_path / "out").iterdir())
    proc = subprocess.run([str(script), "bogus"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "expected a part (bench, suite or smoke), got 'bogus'" in (
        proc.stdout
    )


def test_the_gpu_script_smoke_run_writes_a_bench_result_and_a_suite_report(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        [str(ROOT / "benchmarks" / "gpu.sh"), "smoke", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = bench_results.load(tmp_path / "bench.json")
    assert result["environment"]["backend"] == "cpu" and list(result["batches"]) == ["2"]
    assert result["precision"][0]["batch_size"] == 2
    report = json.loads((tmp_path / "conformance-pure_jax.json").read_text())
    assert report["summary"]["pure_jax"]["passed"] > 0, report["summary"]


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
        (["--impls", "no_such_impl"], "--impls"),
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


def test_a_half_roofline_shows_the_rate_its_bound_is_computed_at(tmp_path):
    """A run without the bandwidth program (the half roofline): the rate beside the compute side
    is the matmul's fastest round, the one the bound is computed at, not its median round's
    (before this change the column showed the median while the bound used the fastest)."""
    data = synthetic()
    for batch in data["batches"].values():
        batch.pop("bandwidth")
    performance, _ = pages(summarize(data), tmp_path)
    part = performance[performance.index("Against the matmul roof") :]
    from cvae_rosetta.bench.markdown import number

    roof = next(bt for bt in data["batches"].values() if bt["batch_size"] == 8)["roof"]
    fastest = number(roof["flops"] / min(roof["call_us"]["rounds"]) / 1e3)
    median = number(roof["flops"] / roof["call_us"]["median"] / 1e3)
    assert fastest != median and f"| 8 | {fastest} |" in part, part[:800]
    assert f"| 8 | {median} |" not in part
    # a CPU's float32 matmul is float32 arithmetic; a GPU run's, at JAX's default precision, may
    # be TensorFloat-32, and its rate says nothing of float32 alone unless the page says so
    assert "This run timed a float32 1024x1024 matmul only" in part, part[:300]
    data["environment"] |= {"backend": "gpu", "device_kind": "Made-up GPU"}
    performance, _ = pages(summarize(data), tmp_path)
    assert (
        "This run timed a float32 1024x1024 matmul at JAX's default precision "
        "(`lax.Precision.DEFAULT`, which on a GPU with tensor cores may multiply float32 inputs "
        "in TensorFloat-32) only"
    ) in performance


def test_a_run_of_two_batch_sizes_is_not_said_as_a_range():
    """A run that measured two batch sizes (the GPU's 1 and 4096, here 8 and 256): a style within
    noise at both is said at those two, not at "batch 8 to 256", which reads as a sweep."""
    said = decision_table._reason(summarize(synthetic(other=1.0)), "other", None, set(), "")
    assert "within noise of pure JAX at every batch size (batch 8 and 256, the two measured)" in (
        said
    ), said
