"""The blocks made from the conformance suite's JSON report (the committed one, or the one
``$CVAE_DOCS_CONFORMANCE_REPORT`` names): the compliance matrix, its one-paragraph summary, every
count in them computed, both naming the checks the suite has now and the report lacks, and an
excerpt of the report.

Words: a *check* is one test function of the suite (one row of the matrix); its *cases* are its
parametrisations (loss kinds, partners, mechanisms, ...), each run and reported on its own.
"""

from __future__ import annotations

import ast
import json
import os
import posixpath
import re
from collections import Counter
from pathlib import Path

from markdown_text import capitalized
from repository import DOCS, IMPLEMENTATIONS, ROOT, DocsError

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench.markdown import impl_label

REPORT = DOCS / "data" / "conformance.json"  # the committed report; see docs/conformance.md
REPORT_ENV = "CVAE_DOCS_CONFORMANCE_REPORT"  # another report instead, e.g. one just written
SUITE = ROOT / "conformance"  # the suite's test modules, for the checks a report lacks
MATRIX = "conformance.md#the-compliance-matrix"  # where the whole matrix is


def read_report() -> tuple[dict, str]:
    """The conformance report the pages are made from, and how a page names it: the committed
    one, or the one ``$CVAE_DOCS_CONFORMANCE_REPORT`` points at."""
    given = os.environ.get(REPORT_ENV)
    path = Path(given or REPORT)
    if not path.is_file():
        raise DocsError(
            f"no conformance report at {path} (see 'The compliance matrix' in docs/conformance.md)"
        )
    report = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(report.get("results"), dict) or not report["results"]:
        raise DocsError(f"{path}: the conformance report has no results")
    source = f"`{path.name}` (from `${REPORT_ENV}`)" if given else "`docs/data/conformance.json`"
    return report, source


def _check_of(case: str) -> str:
    """``test_loss.py::test_loss_matches_reference[mse-1.0]`` -> its check, without the case."""
    return re.sub(r"\[.*\]$", "", case).strip(":")


def _failed(outcome: str) -> bool:
    """Anything but a pass, a skip or "not applicable" counts as a failure (an error, say)."""
    return outcome not in ("passed", "not applicable") and not outcome.startswith("skipped")


def outcomes(report: dict) -> tuple[list[str], dict[str, dict[str, Counter]]]:
    """The report's implementations in tab order, and for every check the outcomes of its cases
    per implementation."""
    impls = [key for key in IMPLEMENTATIONS if key in report["results"]]
    impls += sorted(set(report["results"]) - set(impls))
    checks: dict[str, dict[str, Counter]] = {}
    for impl in impls:
        for case, outcome in report["results"][impl].items():
            checks.setdefault(_check_of(case), {}).setdefault(impl, Counter())[outcome] += 1
    return impls, checks


def suite_checks() -> set[str] | None:
    """Every check the suite has now (``FILE::FUNCTION``, ``FILE::CLASS::METHOD`` in a test
    class), read from ``conformance/test_*.py`` without importing it; None without the suite."""
    if not SUITE.is_dir():
        return None
    found = set()
    functions = ast.FunctionDef | ast.AsyncFunctionDef
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, functions) and node.name.startswith("test"):
                found.add(f"{path.name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                found.update(
                    f"{path.name}::{node.name}::{item.name}"
                    for item in node.body
                    if isinstance(item, functions) and item.name.startswith("test")
                )
    return found


def reference_checks(report: dict) -> set[str]:
    """The checks of the suite's own reference a report holds: no rows of the matrix (they take no
    implementation), kept apart under ``report["reference"]``; reports older than that part have
    none."""
    return set((report.get("reference") or {}).get("results") or {})


def suite_drift(checks, reference: set[str] = frozenset()) -> str:
    """A sentence naming the suite's checks that a report lacks and the ones it has that the suite
    no longer has; empty when they agree (or the suite is not here to compare). ``reference``: the
    report's checks of the suite's own reference (:func:`reference_checks`), which it does not
    lack."""
    now = suite_checks()
    if now is None:
        return ""
    missing, gone = sorted(now - set(checks) - set(reference)), sorted(set(checks) - now)
    out = []
    if missing:
        out.append(
            f"The suite has {len(now)} checks now; the report lacks {len(missing)} of them: "
            f"{_check_list(missing)}."
        )
    if gone:
        out.append(
            f"The report holds {_count(len(gone), 'check')} the suite no longer has: "
            f"{_check_list(gone)}."
        )
    return " ".join(out)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)


def _group(impls: list[str], everyone: list[str]) -> str:
    """ "all six", "Flax NNX", "pure JAX, Flax Linen and Haiku"."""
    if impls == everyone and len(everyone) > 1:
        n = len(everyone)
        return f"all {NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else n}"
    labels = [impl_label(i) for i in impls]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _check_list(checks: list[str], limit: int = 6) -> str:
    shown = [_check_name(c) for c in checks[:limit]]
    more = len(checks) - limit
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _report_environment(report: dict, impls: list[str]) -> str:
    """``on the CPU (jax 0.10.2, flax 0.12.8, ..., Python 3.11.7)``."""
    versions = {"jax": report.get("jax", "?")}
    for impl in impls:
        entry = report.get("implementations", {}).get(impl) or {}
        if entry.get("framework"):
            versions.setdefault(entry["framework"], entry.get("version", "?"))
    listed = ", ".join(f"{name} {version}" for name, version in versions.items())
    backend = str(report.get("backend", "?")).upper()
    return f"on the {backend} ({listed}, Python {report.get('python', '?')})"


def conformance_summary(where: str) -> str:
    """One paragraph from the conformance report, every count computed: who passes every check
    that applies, who fails or skips which, what is not applicable to whom, which of the suite's
    checks the report lacks, and a link to the whole matrix."""
    report, source = read_report()
    impls, checks = outcomes(report)
    cases = {i: len(report["results"][i]) for i in impls}
    failed = {i: [c for c in sorted(checks) if _failing(checks[c].get(i))] for i in impls}
    n_failed = {i: sum(_n(checks[c].get(i), _failed) for c in checks) for i in impls}
    skipped = {i: [c for c in sorted(checks) if _n(checks[c].get(i), _skipped)] for i in impls}
    n_skipped = {i: sum(_n(checks[c].get(i), _skipped) for c in checks) for i in impls}
    lo, hi = min(cases.values()), max(cases.values())
    case_counts = _count(lo, "case") if lo == hi else f"{lo} to {hi} cases"
    when = f"report of {str(report.get('created', '?'))[:10]}"
    if os.environ.get(REPORT_ENV):
        when += f", {source},"
    when += f" {_report_environment(report, impls)}"
    clean = [i for i in impls if not n_failed[i] and not n_skipped[i]]
    if clean == impls:
        who = (
            f"{impl_label(impls[0])} passes every check that applies to it"
            if len(impls) == 1
            else f"{capitalized(_group(impls, impls))} implementations pass every check that "
            "applies to them"
        )
        first = (
            f"{who} in the conformance suite's {when}: {_count(len(checks), 'check')}, "
            f"{case_counts} each (a check's cases are its parametrisations)."
        )
    else:
        parts = []
        for i in impls:
            if n_failed[i]:
                part = (
                    f"{impl_label(i)} fails {n_failed[i]} of its {cases[i]} cases, in "
                    f"{_count(len(failed[i]), 'check')} ({_check_list(failed[i])})"
                )
                if n_skipped[i]:
                    part += f", and has {n_skipped[i]} skipped"
                parts.append(part)
            elif n_skipped[i]:
                parts.append(
                    f"{impl_label(i)} passes every case that ran but has {n_skipped[i]} of its "
                    f"{cases[i]} cases skipped, neither passed nor failed, in "
                    f"{_count(len(skipped[i]), 'check')} ({_check_list(skipped[i])})"
                )
        if clean:
            verb = "passes" if len(clean) == 1 else "pass"
            them = "it" if len(clean) == 1 else "them"
            parts.append(f"{_group(clean, impls)} {verb} every check that applies to {them}")
        first = (
            f"In the conformance suite's {when}, its {_count(len(checks), 'check')} ran as "
            f"{case_counts} for each implementation (a check's cases are its parametrisations): "
            + "; ".join(parts)
            + "."
        )
    sentences = [first]
    na = []
    for check in sorted(checks):
        whom = [i for i in impls if checks[check].get(i, Counter())["not applicable"]]
        if whom:
            partly = [
                i
                for i in whom
                if sum(checks[check][i].values()) > checks[check][i]["not applicable"]
            ]
            note = f" (some of its cases for {_group(partly, impls)})" if partly else ""
            na.append(f"{_check_name(check)}, for {_group(whom, impls)}{note}")
    if na:
        sentences.append(
            "Not applicable, neither passed nor failed (a capability the implementation does not "
            "have, or one the run did not: a second device, say): " + "; ".join(na) + "."
        )
    drift = suite_drift(checks, reference_checks(report))
    if drift:
        sentences.append(drift)
    href = posixpath.relpath(MATRIX.partition("#")[0], posixpath.dirname(where) or ".")
    sentences.append(f"The whole matrix: [conformance]({href}#{MATRIX.partition('#')[2]}).")
    return " ".join(sentences) + "\n"


def _skipped(outcome: str) -> bool:
    return outcome.startswith("skipped")


def _n(counts: Counter | None, kind) -> int:
    return sum(n for outcome, n in (counts or {}).items() if kind(outcome))


def _failing(counts: Counter | None) -> bool:
    return _n(counts, _failed) > 0


def conformance_matrix() -> str:
    report, source = read_report()
    impls, checks = outcomes(report)
    versions = ", ".join(
        f"{impl_label(k)} ({report['implementations'][k]['framework']} "
        f"{report['implementations'][k]['version']})"
        for k in impls
        if k in report.get("implementations", {})
    )
    lines = [
        f"From {source}, written {report.get('created', '?')} on {report.get('backend', '?')} "
        f"with jax {report.get('jax', '?')} and Python {report.get('python', '?')}: {versions}. "
        f"{len(checks)} checks, one a row; the last row counts each implementation's cases.",
    ]
    rows = [
        [_check_name(name), *(_cell(checks[name].get(i)) for i in impls)] for name in sorted(checks)
    ]
    summary = report.get("summary", {})
    totals = [
        ", ".join(f"{n} {k}" for k, n in sorted(summary.get(i, {}).items()) if n) or "-"
        for i in impls
    ]
    rows.append(["**all**", *totals])
    header = ["check", *map(impl_label, impls)]
    lines += ["", markdown_table(header, rows, "l" + "c" * len(impls)).rstrip("\n")]
    drift = suite_drift(checks, reference_checks(report))
    if drift:
        lines += ["", drift]
    return "\n".join(lines) + "\n"


def _check_name(check: str) -> str:
    """``test_pairwise.py::test_one_step_agrees`` -> ``pairwise``: one step agrees."""
    file, _, test = check.rpartition("::")
    group = file.removesuffix(".py").removeprefix("test_")
    words = test.removeprefix("test_").replace("_", " ")
    return f"`{group}`: {words}" if group else words


def _cell(outcomes: Counter | None) -> str:
    if not outcomes:
        return "-"
    total = sum(outcomes.values())
    failed = _n(outcomes, _failed)
    if failed:
        return f"✗ {failed}/{total} failed"
    parts = []
    if outcomes["passed"]:
        parts.append("✓" if outcomes["passed"] == total else f"✓ {outcomes['passed']}")
    for kind in ("not applicable", "skipped", "skipped: earlier layer failed"):
        if outcomes[kind]:
            parts.append(kind if outcomes[kind] == total else f"{outcomes[kind]} {kind}")
    return ", ".join(parts)


def report_excerpt() -> str:
    """The report's header fields and the first few checks of its first implementation."""
    report, _ = read_report()
    first = next(iter(report["results"]))
    checks = dict(list(report["results"][first].items())[:4])
    excerpt = {
        **{k: report[k] for k in ("backend", "created", "jax", "python") if k in report},
        "implementations": {first: report.get("implementations", {}).get(first)},
        "results": {first: {**checks, "...": "..."}},
        "summary": {first: report.get("summary", {}).get(first)},
    }
    return "```json\n" + json.dumps(excerpt, indent=2) + "\n```\n"
