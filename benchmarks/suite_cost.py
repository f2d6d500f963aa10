"""What the conformance suite costs a user: wall time and peak memory of whole pytest runs.

    python benchmarks/suite_cost.py [--out benchmarks/results/suite_cost_cpu.json] [--rounds 1]
                                    [--passing pure_jax] [--bugs NAME,NAME] [--no-cache]

Each case is one ``pytest --pyargs cvae_rosetta.conformance`` run in a fresh interpreter, timed as
a user would time it (the whole command, start-up and compilation included): the default profile
on passing implementations, and on single-bug mutants (``cvae_rosetta.conformance.meta_tests.
broken``) with ``--first-layer`` (the run stops each implementation at its first failing layer)
until the diagnosis. These run as a first run does, with the plugin's defaults: its persistent
compilation cache in an empty folder of its own (each module reads back what earlier modules
compiled). Each passing case also runs with every program fully optimised
(``--full-optimization``), without any cache (``--compilation-cache off``), and with a cache
filled by an unmeasured run first: what a repeated run on the same machine costs. Peak memory is
the child's maximum resident set size. Figures are medians over ``--rounds``.

``--render`` rewrites the table in docs/conformance.md between its ``suite-cost`` markers from the
result file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "suite_cost_cpu.json"
DOC = ROOT / "docs" / "conformance.md"
BEGIN, END = "<!-- suite-cost:begin -->", "<!-- suite-cost:end -->"
# single bugs a porting mistake makes, each caught in a different layer
BUGS = (
    "encoder_ignores_label",
    "loss_summed_over_batch",
    "kl_missing_half",
    "optimizer_state_not_advanced",
)
BROKEN = "cvae_rosetta.conformance.meta_tests.broken"
GOALS = {"passing_seconds": 40.0, "passing_rss_gb": 1.5, "bug_seconds": 60.0}


def run_case(
    target: str, *, first_layer: bool, cache_dir: str | None, extra: tuple[str, ...] = ()
) -> dict:
    """One pytest run in a fresh interpreter: exit status, wall seconds, peak RSS of the child."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [
            sys.executable,
            "-c",
            # the child's own peak RSS, printed as its last line after pytest returns
            "import resource, sys, pytest; code = pytest.main(sys.argv[1:]); "
            "print('peak-rss-kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); "
            "sys.exit(code)",
            *("-p", "no:cacheprovider", "-q", "--pyargs", "cvae_rosetta.conformance"),
            *("--impl", target),
            *(["--first-layer"] if first_layer else []),
            *extra,
            # the plugin's own setting: cold (off), or the folder a first run filled
            *("--compilation-cache", cache_dir or "off"),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "CVAE_"))}
        env["JAX_PLATFORMS"] = "cpu"
        start = time.perf_counter()
        done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    rss = next((int(line.split()[1]) for line in reversed(lines) if line.startswith("peak-rss")), 0)
    summary = next(
        (line for line in reversed(lines) if re.search(r"\d+ (passed|failed).* in [\d.]+s", line)),
        "",
    )
    diagnosis = [line for line in lines if line.startswith("cvae-rosetta diagnosis")]
    return {
        "exit": done.returncode,
        "seconds": round(seconds, 2),
        "peak_rss_gb": round(rss / 1024**2, 3),
        "summary": summary.strip("= "),
        "diagnosis": diagnosis[0] if diagnosis else None,
    }


def run_with_cache(target: str, *, first_layer: bool, cache: str, extra: tuple = ()) -> dict:
    """``cache``: "off" (none), "empty" (a folder of its own, as a first run has) or "warm" (a
    folder that an unmeasured run of the same case filled first)."""
    if cache == "off":
        return run_case(target, first_layer=first_layer, cache_dir=None, extra=extra)
    with tempfile.TemporaryDirectory() as folder:
        if cache == "warm":
            run_case(target, first_layer=first_layer, cache_dir=folder, extra=extra)
        return run_case(target, first_layer=first_layer, cache_dir=folder, extra=extra)


def measure(passing: list[str], bugs: list[str], rounds: int, use_cache: bool) -> dict:
    import jax

    cases: list[dict] = []
    load_at_start = os.getloadavg()[0]
    full = ("--full-optimization",)
    plan = [(name, "passing, first run", False, "empty", ()) for name in passing]
    plan += [
        (name, "passing, first run, fully optimised", False, "empty", full) for name in passing
    ]
    plan += [(name, "passing, no compilation cache", False, "off", ()) for name in passing]
    if use_cache:
        plan += [(name, "passing, compilation cache warm", False, "warm", ()) for name in passing]
    plan += [(f"{BROKEN}:{bug}", "one bug, --first-layer", True, "empty", ()) for bug in bugs]
    for target, kind, first_layer, cache, extra in plan:
        runs = [
            run_with_cache(target, first_layer=first_layer, cache=cache, extra=extra)
            for _ in range(rounds)
        ]
        case = {
            "target": target,
            "kind": kind,
            "exit": runs[-1]["exit"],
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
            "summary": runs[-1]["summary"],
            "diagnosis": runs[-1]["diagnosis"],
            "rounds": [r["seconds"] for r in runs],
        }
        print(
            f"{kind:32} {target.rpartition(':')[2]:28} {case['seconds']:7.1f} s "
            f"{case['peak_rss_gb']:.2f} GB  exit {case['exit']}  {case['summary']}",
            flush=True,
        )
        cases.append(case)
    return {
        "schema": 1,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_1min_at_start": load_at_start,
            "load_average_1min_at_end": os.getloadavg()[0],
        },
        "versions": {"jax": jax.__version__},
        "goals": GOALS,
        "cases": cases,
    }


def table(result: dict) -> str:
    goals = result["goals"]
    lines = [
        f"Measured by `python benchmarks/suite_cost.py` on {result['machine']['cpu_count']} CPU "
        f"cores (JAX {result['versions']['jax']}); goals: a passing implementation in at most "
        f"{goals['passing_seconds']:.0f} s and {goals['passing_rss_gb']} GB, the diagnosis of a "
        f"single bug in at most {goals['bug_seconds']:.0f} s.",
        "",
        "| run | implementation | wall s | peak RSS GB | result |",
        "|---|---|---:|---:|---|",
    ]
    for case in result["cases"]:
        name = case["target"].rpartition(":")[2] if ":" in case["target"] else case["target"]
        lines.append(
            f"| {case['kind']} | `{name}` | {case['seconds']:.1f} | {case['peak_rss_gb']:.2f} | "
            f"{case['summary'] or 'exit ' + str(case['exit'])} |"
        )
    return "\n".join(lines)


def render(result: dict, doc: Path = DOC) -> None:
    from cvae_rosetta.bench.report import write_between_markers

    write_between_markers(doc, BEGIN, END, table(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--passing", default="pure_jax", help="comma-separated [pure_jax]")
    parser.add_argument("--bugs", default=",".join(BUGS), help="broken implementations")
    parser.add_argument("--no-cache", action="store_true", help="skip the warm-cache runs")
    parser.add_argument("--render", action="store_true", help="only render --out into the docs")
    args = parser.parse_args(argv)
    if not args.render:
        result = measure(
            [n for n in args.passing.split(",") if n],
            [n for n in args.bugs.split(",") if n],
            args.rounds,
            not args.no_cache,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    render(json.loads(args.out.read_text()))
    print(f"rendered {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
