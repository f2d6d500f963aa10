"""Tiny runs to interrupt and resume, for the checkpoint tests (``test_checkpoint.py``) and the
fault-injection suite (``test_faults.py``): ``benchmarks/tiny_runs.py``, which its larger sweep
(``benchmarks/fault_report.py``) uses too, handed on; and :func:`benchmark_script`, a study script
of ``benchmarks/`` loaded as a module, for the tests of its tables.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))

from tiny_runs import *  # noqa: F403  (re-exported to the tests)


def benchmark_script(name: str):
    """``benchmarks/NAME.py`` loaded as a module of that name."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """stdout and stderr of a process started in a session of its own (``start_new_session``),
    once it ends; after ``timeout`` seconds it is killed with every child of its group, and stderr
    says so."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"timed out after {timeout} s"
    finally:
        if process.poll() is None or _group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return out, err


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
