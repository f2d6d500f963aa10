"""docs/meta_tests.md, the generated page of which checks catch which broken implementation, names
the bugs ``broken.py`` defines, in its order, and nothing else. (Its reference run's count of
cases is held to the suite's by tox's ``meta`` environment, which runs the reference anyway:
``test_the_page_of_catches_agrees_with_broken_and_the_reference_run``.)"""

from __future__ import annotations

from pathlib import Path

from cvae_rosetta.conformance.meta_tests import broken
from cvae_rosetta.conformance.meta_tests.report import page_entries

PAGE = Path(__file__).resolve().parent.parent / "docs" / "meta_tests.md"


def test_the_page_lists_the_bugs_broken_defines():
    listed, count = page_entries(PAGE.read_text(encoding="utf-8"))
    assert listed == broken.NAMES, (
        f"docs/meta_tests.md: expected the bugs of broken.py, got {len(listed)} of them; "
        f"missing {sorted(set(broken.NAMES) - set(listed))}, "
        f"extra {sorted(set(listed) - set(broken.NAMES))}"
        " (regenerate: python -m cvae_rosetta.conformance.meta_tests.report --out "
        "docs/meta_tests.md)"
    )
    assert count is not None, "docs/meta_tests.md: expected 'Reference run (`...`): N cases'"


def test_page_entries_reads_what_the_report_writes():
    from cvae_rosetta.conformance.meta_tests.runner import SuiteRun

    outcomes = {"test_a::t1": "passed", "test_a::t2": "skipped"}
    reference = SuiteRun("pure_jax", 0, 1.0, outcomes, [], "")
    caught = SuiteRun("x", 1, 1.0, {"test_a::t1": "failed", "test_a::t2": "skipped"}, [], "")
    caught.failures = {"test_a::t1": {"when": "call", "message": "m", "first_line": "m"}}
    names = broken.NAMES[:2]
    from cvae_rosetta.conformance.meta_tests.report import render

    text, _ = render(reference, {names[0]: caught, names[1]: None})
    assert page_entries(text) == (names, 2)
