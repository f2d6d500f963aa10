"""Every implementation at the defaults: one ``cvae compare`` on the bundled digits, timed, and
what its evaluations measured, recorded for the table of docs/evaluation.md.

    python benchmarks/compare_defaults.py [--out benchmarks/results/compare_cpu.json]
    python benchmarks/compare_defaults.py --render   # only write the table into --doc

The run is the command a user types (``cvae compare``, no flags: every installed implementation,
the defaults), in a scratch folder, its wall time measured around the whole process (imports,
compilation, training, evaluation, pictures) with the machine's load average before and after.
The result keeps each implementation's row (``summary.json``) and evaluation (``evaluation.json``);
``--render`` writes the table and the sentences whose figures come from it between the page's
markers, so no figure of that section is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench import results
from cvae_rosetta.bench.markdown import impl_label, write_between_markers
from cvae_rosetta.files import write_json

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "evaluation.md"
BEGIN, END = "<!-- compare-defaults:begin -->", "<!-- compare-defaults:end -->"


def measure(out: Path, command: list[str]) -> dict[str, Any]:
    """Run ``cvae compare`` in a scratch folder and record what it measured."""
    result = results.envelope("compare_defaults", command, jax_devices=False)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "compare"
        start_load = results.load_average()
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "cvae_rosetta", "compare", "--out", str(folder)], check=True
        )
        seconds = time.perf_counter() - started
        summary = json.loads((folder / "summary.json").read_text())
        evaluations = {
            row["impl"]: json.loads((folder / row["impl"] / "evaluation.json").read_text())
            for row in summary["rows"]
        }
    result |= {
        "seconds": round(seconds, 1),
        "load_average": {"start": start_load, "end": results.load_average()},
        "rows": summary["rows"],
        "evaluations": evaluations,
    }
    write_json(out, result)
    return result


def _row(row: dict[str, Any], ev: dict[str, Any]) -> list[str]:
    accuracy = ev["conditional_accuracy"]
    return [
        impl_label(row["impl"]),
        f"{ev['neg_elbo']:.3f}",
        f"{ev['neg_iwae']:.3f}",
        f"{ev['recon']:.3f}",
        f"{ev['kl']:.3f}",
        f"{ev['active_units']} of {ev['latent_dim']}",
        f"{accuracy['mean_images']['overall']:.3f}",
        f"{accuracy['bernoulli_samples']['overall']:.3f}",
        f"{ev['classifier']['test_accuracy']:.3f}",
        f"{ev['diversity']:.2f}",
    ]


def section(result: dict[str, Any]) -> str:
    """The opening sentence, the table and the figures said under it, from ``result`` alone."""
    rows, evaluations = result["rows"], result["evaluations"]
    env = result["environment"]
    load = (result.get("load_average") or {}).get("start") or [None]
    busy = f", load average {load[0]:.1f} at the start" if load[0] is not None else ""
    names = [impl_label(row["impl"]) for row in rows]
    header = ["impl", "-ELBO", "-IWAE (k=64)", "recon", "KL", "active units"]
    header += ["gen acc, mean images", "gen acc, Bernoulli samples", "classifier on real test"]
    table = markdown_table(
        [*header, "diversity"],
        [_row(row, evaluations[row["impl"]]) for row in rows],
        "l" + "r" * 9,
    )
    reference = rows[0]["reference"]
    same = [impl_label(r["impl"]) for r in rows[1:] if r["max_param_diff"] == 0.0]
    drift = [
        f"{impl_label(r['impl'])} {r['max_param_diff']:.2f}"
        for r in rows[1:]
        if r["max_param_diff"] != 0.0
    ]
    elbos = [ev["neg_elbo"] for ev in evaluations.values()]
    tighter = [ev["neg_elbo"] - ev["neg_iwae"] for ev in evaluations.values()]
    ref = evaluations[reference]
    means = [ev["conditional_accuracy"]["mean_images"]["overall"] for ev in evaluations.values()]
    real = [ev["classifier"]["test_accuracy"] for ev in evaluations.values()]
    per_class = ref["diversity_per_class"]
    low, high = min(per_class), max(per_class)
    opening = (
        f"`cvae compare` with no flags ({', '.join(names)}): {result['seconds']:.0f} s for the "
        f"whole command on {env.get('cpu_count')} cores ({env.get('cpu_model') or 'CPU'}{busy}), "
        f"{(result.get('started') or '')[:10]}, jax {env['versions'].get('jax')}:"
    )
    labelled = f"{min(means):.3f}" + (f" to {max(means):.3f}" if max(means) > min(means) else "")
    lines = [
        textwrap.fill(opening, 100, break_on_hyphens=False),
        "",
        table,
        f"- Bit-identical to {impl_label(reference)} after the run (largest parameter "
        f"difference 0): {', '.join(same) or 'none'}. Largest parameter difference of the others: "
        f"{', '.join(drift) or 'none'}; every implementation's test -ELBO lies within "
        f"{max(elbos) - min(elbos):.2g} nats of the others'.",
        f"- {impl_label(reference)}'s diversity ranges from {low:.2f} (label "
        f"{per_class.index(low)}) to {high:.2f} (label {per_class.index(high)}) of the real "
        "digits' spread.",
        f"- The importance-weighted bound is {min(tighter):.2f} to {max(tighter):.2f} nats "
        f"tighter than the ELBO at k = {ref['iw_samples']}.",
        f"- Generated mean images labelled as their label: {labelled} of them, against the "
        f"classifier's {min(real):.3f} on real test digits.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out = ROOT / "benchmarks" / "results" / "compare_cpu.json"
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--doc", type=Path, default=DOC, help="the page with the markers")
    parser.add_argument("--render", action="store_true", help="only render --out into --doc")
    args = parser.parse_args(argv)
    if not args.render:
        measure(args.out, ["python", "benchmarks/compare_defaults.py", *argv])
        print(f"wrote {args.out}")
    write_between_markers(args.doc, BEGIN, END, section(results.load(args.out)))
    print(f"rendered {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
