"""Helpers of the tests that start processes (:func:`outputs`), and :func:`benchmark_script`, a
study script of ``benchmarks/`` loaded as a module, for the tests of that script. The tiny runs to
interrupt and resume that the checkpoint and fault tests share with the fault sweep are the
package's (:mod:`cvae_rosetta.cli.tiny_runs`).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_script(name: str):
    """``benchmarks/NAME.py`` loaded as a module of that name."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
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
