"""Render the committed results of ``benchmarks/results/`` into the docs.

    python benchmarks/render.py [--results benchmarks/results] [--docs docs]

``docs/performance.md`` (one section per machine: ``bench_cpu.json``, and ``bench_gpu.json`` where a
GPU run is committed) with its plots, the decision table of ``docs/choosing.md`` (with the
frameworks' release history of ``maintenance.json``) and the blocks of ``docs/fast_step.md``, by
the docs build's ``docs_build/benchmark_pages.py`` (``render_docs``), whose sections are the ones
``cvae bench`` writes into its ``bench.md``; then the studies' tables (the suite's cost, the
fault report, the latent-size trade-off, every implementation at the defaults), each by its own
script's ``--render``. Every page is
generated from the files, never edited by hand; ``tests/test_bench.py`` checks that rendering the
committed files gives the committed pages.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import compare_defaults
import fault_report
import latent_tradeoff
import suite_cost

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs_build"))  # the docs build's modules import each other plainly
import benchmark_pages  # noqa: E402  (docs_build/benchmark_pages.py)

BENCH = (("bench_cpu.json", "bench_"), ("bench_gpu.json", "bench_gpu_"))
MAINTENANCE = "maintenance.json"  # benchmarks/maintenance.py: the decision table's release history
# change_cost.json, version_matrix.json, concepts.json (benchmarks/change_cost.py,
# version_matrix.py, concepts.py): the decision's evidence beyond speed, and their tables
STUDIES = (
    ("suite_cost_cpu.json", suite_cost),
    ("faults_cpu.json", fault_report),
    ("latent_tradeoff_cpu.json", latent_tradeoff),
    ("compare_cpu.json", compare_defaults),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    sources = [(args.results / name, prefix) for name, prefix in BENCH]
    written = benchmark_pages.render_docs(
        [s for s in sources if s[0].is_file()],
        args.docs,
        args.results / MAINTENANCE,
        {name: args.results / f"{name}.json" for name in benchmark_pages.EVIDENCE_TABLES},
    )
    for name, study in STUDIES:
        if (args.results / name).is_file():
            study.main(["--render", "--out", str(args.results / name)])
    print("wrote", " ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
