"""The blocks a page asks for by name (``<!-- generated: NAME -->``), each made now: from the
sources (the lines-of-code tables, the compare page's body), from the conformance suite's report
or from the committed benchmark results."""

from __future__ import annotations

import re

from compare_page import compare_files
from conformance_report import conformance_matrix, conformance_summary, report_excerpt
from jit_overhead import jit_overhead
from lines_of_code import loc_table, tour_loc_table
from repository import DocsError

GENERATED = re.compile(r"^<!-- generated: (?P<name>[-\w]+) -->[ \t]*$", re.MULTILINE)


def generated(name: str, where: str) -> str:
    makers = {
        "loc-table": loc_table,
        "tour-loc-table": tour_loc_table,
        "conformance-matrix": conformance_matrix,
        "conformance-summary": lambda: conformance_summary(where),
        "report-excerpt": report_excerpt,
        "jit-overhead": jit_overhead,
        "compare-files": compare_files,
    }
    if name not in makers:
        raise DocsError(f"unknown generated block {name!r} (known: {', '.join(makers)})")
    return makers[name]()
