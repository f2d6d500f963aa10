"""Tiny runs to interrupt and resume, for the checkpoint tests (``test_checkpoint.py``) and the
fault-injection suite (``test_faults.py``): ``benchmarks/tiny_runs.py``, which its larger sweep
(``benchmarks/fault_report.py``) uses too, handed on.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

from tiny_runs import *  # noqa: F403  (re-exported to the tests)
