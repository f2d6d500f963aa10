"""What the conformance suite costs a user: wall time and peak memory of whole pytest runs.

Each case is one ``pytest --pyargs cvae_rosetta.conformance`` run in a fresh interpreter, timed
whole (start-up and compilation included), with the plugin's compilation cache in an empty folder
of its own, as a first run has: the default profile on passing implementations (``--passing``),
and single-bug mutants (``--bugs``, of ``meta_tests.broken`` and ``searched``) with
``--first-layer`` until the diagnosis. Each passing case also runs with ``--full-optimization``,
with ``--compilation-cache off``, and with a cache an unmeasured run filled first (a repeated
run). Peak memory is the child's maximum resident set size; figures are medians over
``--rounds``. ``--render`` only writes the table into docs/conformance.md (a measurement does
too).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench import results
from cvae_rosetta.bench.markdown import impl_label, write_between_markers
from cvae_rosetta.conformance.meta_tests import broken
from cvae_rosetta.files import write_json

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "conformance.md"
BEGIN, END = "<!-- suite-cost:begin -->", "<!-- suite-cost:end -->"
# single bugs a porting mistake makes, each caught in a different layer
BUGS = ("encoder_ignores_label", "loss_summed_over_batch", "kl_missing_half")
BUGS += ("optimizer_state_not_advanced", "clipping_after_adam")  # the last: named by the search
GOALS = {"passing_seconds": 40.0, "passing_rss_gb": 1.5, "bug_seconds": 60.0}
PASSING = (  # the runs of a passing implementation: kind, compilation cache, more options
    ("passing, first run", "empty", ()),
    ("passing, first run, fully optimised", "empty", ("--full-optimization",)),
    ("passing, no compilation cache", "off", ()),
    ("passing, compilation cache warm", "warm", ()),
)
CHILD = (  # pytest, then the child's own peak RSS as its last line
    "import resource, sys, pytest; code = pytest.main(sys.argv[1:]); "
    "print('peak-rss-kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(code)"
)
SUMMARY = re.compile(r"\d+ (passed|failed).* in [\d.]+s")


def run_case(target: str, first_layer: bool, cache: str, extra: Sequence[str]) -> dict:
    """One pytest run in a fresh interpreter: exit status, wall seconds, peak RSS of the child.
    ``cache``: "off" (none), "empty" (a folder of its own, as a first run has) or "warm" (a folder
    that an unmeasured run of the same case filled first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "CVAE_"))}
    env["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryDirectory() as folder:
        command = [
            *(sys.executable, "-c", CHILD, "-p", "no:cacheprovider", "-q"),
            *("--pyargs", "cvae_rosetta.conformance", "--impl", target),
            *(["--first-layer"] if first_layer else []),
            *extra,
            *("--compilation-cache", "off" if cache == "off" else folder),  # the plugin's setting
        ]
        for _ in range(2 if cache == "warm" else 1):  # the last one measured
            start = time.perf_counter()
            done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    rss = next((int(line.split()[1]) for line in reversed(lines) if line.startswith("peak-rss")), 0)
    summary = next((line for line in reversed(lines) if SUMMARY.search(line)), "")
    diagnosis = [line for line in lines if line.startswith("cvae-rosetta diagnosis")]
    return {
        "exit": done.returncode,
        "seconds": round(seconds, 2),
        "peak_rss_gb": round(rss / 1024**2, 3),
        "summary": summary.strip("= "),
        "diagnosis": diagnosis[0] if diagnosis else None,
    }


def measure(args: argparse.Namespace, command: list[str]) -> dict:
    result = results.envelope("suite_cost", command, jax_devices=False)  # JAX runs in the children
    result.update(load_average={"start": results.load_average()}, goals=GOALS, cases=[])
    passing = [n for n in args.passing.split(",") if n]
    kept = [p for p in PASSING if p[1] != "warm" or not args.no_cache]  # --no-cache: no warm
    plan = [(name, kind, False, cache, extra) for kind, cache, extra in kept for name in passing]
    bugs = [n for n in args.bugs.split(",") if n]
    plan += [(broken.target(bug), "one bug, --first-layer", True, "empty", ()) for bug in bugs]
    for target, kind, first_layer, cache, extra in plan:
        runs = [run_case(target, first_layer, cache, extra) for _ in range(args.rounds)]
        case = {"target": target, "kind": kind, **runs[-1]}  # the last run's, but for:
        case["seconds"] = statistics.median(r["seconds"] for r in runs)
        case["peak_rss_gb"] = max(r["peak_rss_gb"] for r in runs)
        case["rounds"] = [r["seconds"] for r in runs]
        print(
            f"{kind:32} {target.rpartition(':')[2]:28} {case['seconds']:7.1f} s "
            f"{case['peak_rss_gb']:.2f} GB  exit {case['exit']}  {case['summary']}",
            flush=True,
        )
        result["cases"].append(case)
    result["load_average"]["end"] = results.load_average()
    return result


def implementation(target: str) -> str:
    """A case's implementation as the table names it: a registered one by its label ("pure JAX"),
    a ``module:attribute`` (a single-bug mutant) by its attribute, as code."""
    module, _, name = target.rpartition(":")
    return f"`{name}`" if module else impl_label(target)


def table(result: dict) -> str:
    env, goals = result["environment"], result["goals"]
    rows = []
    for c in result["cases"]:
        outcome = c["summary"] or f"exit {c['exit']}"
        numbers = [f"{c['seconds']:.1f}", f"{c['peak_rss_gb']:.2f}"]
        rows.append([c["kind"], implementation(c["target"]), *numbers, outcome])
    header = ("run", "implementation", "wall s", "peak RSS GB", "result")
    return (
        f"Measured by `python benchmarks/suite_cost.py` on {env['cpu_count']} CPU cores (JAX "
        f"{env['versions']['jax']}); goals: a passing implementation in at most "
        f"{goals['passing_seconds']:.0f} s and {goals['passing_rss_gb']} GB, the diagnosis of a "
        f"single bug in at most {goals['bug_seconds']:.0f} s.\n\n"
        + markdown_table(header, rows, "llrrl").rstrip("\n")
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/suite_cost_cpu.json")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--passing", default="pure_jax", help="comma-separated [pure_jax]")
    parser.add_argument("--bugs", default=",".join(BUGS), help="broken implementations")
    parser.add_argument("--no-cache", action="store_true", help="skip the warm-cache runs")
    parser.add_argument("--render", action="store_true", help="only render --out into the docs")
    args = parser.parse_args(argv)
    if not args.render:
        result = measure(args, ["python", "benchmarks/suite_cost.py", *argv])
        write_json(args.out, result, parents=True)
        print(f"wrote {args.out}")
    write_between_markers(DOC, BEGIN, END, table(results.load(args.out)))
    print(f"rendered {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
