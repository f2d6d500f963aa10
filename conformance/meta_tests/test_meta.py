"""The suite tests itself: it must fail on every broken implementation and pass on the reference.

Each case runs the whole per-implementation suite (``pytest --pyargs conformance --impl TARGET``)
in a subprocess, one at a time, and reads its JUnit XML. A broken implementation counts as caught
only if the run went to its end (every check of the reference's run collected, no collection or
usage error) and at least one check failed: a suite that crashes at import proves nothing.

Not collected by ``pytest --pyargs conformance``; run it explicitly::

    pytest conformance/meta_tests     # 1 to 2 minutes a case on two CPU cores, ~35 minutes in all
    CVAE_META_RESULTS=build/meta pytest conformance/meta_tests
    python -m conformance.meta_tests.report --results build/meta --out docs/meta_tests.md

``CVAE_META_FAST=1`` stops each broken implementation's run at its first failure (what tox's
``meta`` environment does, to stay within the CI budget). ``CVAE_META_RESULTS`` keeps each run's
JUnit XML and JSON summary (the report reads them); ``CVAE_META_TIMEOUT`` bounds each run in
seconds; ``CVAE_META_PYTEST_ARGS`` adds pytest arguments to every run (``-k ...`` to leave slow
checks out; the table is then incomplete).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.meta_tests import broken
from conformance.meta_tests.runner import SuiteRun, check_id, run_suite

REFERENCE = "pure_jax"
# CVAE_META_FAST=1 (the `meta` tox environment): each broken implementation's run stops at its first
# failing check. Without it every check runs, which the docs' table of catches needs.
FAST = os.environ.get("CVAE_META_FAST") == "1"


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    chosen = os.environ.get("CVAE_META_RESULTS")
    return Path(chosen) if chosen else tmp_path_factory.mktemp("meta_results")


@pytest.fixture(scope="session")
def reference_run(results_dir) -> SuiteRun:
    return run_suite(REFERENCE, results_dir, REFERENCE)


def _describe(run: SuiteRun) -> str:
    return (
        f"{run.target}: exit status {run.returncode}, {len(run.passed)} passed, "
        f"{len(run.failed)} failed, {len(run.skipped)} skipped, "
        f"collection errors {run.collection_errors}\n--- output tail ---\n{run.output_tail}"
    )


def test_the_suite_passes_on_the_reference(reference_run):
    assert reference_run.valid, _describe(reference_run)
    assert reference_run.returncode == 0 and not reference_run.failed, _describe(reference_run)


@pytest.mark.parametrize("name", broken.NAMES)
def test_the_suite_fails_on_a_broken_implementation(name, results_dir, reference_run):
    if FAST:  # stop at the first check that fails: enough to show that the bug is caught
        run = run_suite(f"{broken.__name__}:{name}", results_dir, name, extra=("-x",))
        assert run.valid, "the suite did not run: " + _describe(run)
    else:
        run = run_suite(f"{broken.__name__}:{name}", results_dir, name)
        assert run.valid, "the suite did not run to its end: " + _describe(run)
        # every check that ran on the reference ran here too (skipped ones, e.g. not applicable,
        # may come and go)
        missing = set(reference_run.passed) - set(run.checks)
        assert not missing, f"checks not collected for {name}: {sorted(missing)}"
    assert run.returncode == 1 and run.failed, (
        f"no check caught {name} ({broken.BUGS[name]}): " + _describe(run)
    )


def test_every_broken_implementation_says_what_it_models():
    assert len(broken.NAMES) >= 10
    for name in broken.NAMES:
        impl = getattr(broken, name)
        assert impl.bug == broken.BUGS[name] and impl.bug.endswith("."), name


def test_check_ids_leave_out_the_implementation():
    target = f"{broken.__name__}:kl_missing_half"
    assert check_id("conformance.test_spec", f"test_a[{target}]", target) == "test_spec::test_a"
    assert (
        check_id("conformance.test_spec", f"test_b[{target}-mse-1.0]", target)
        == "test_spec::test_b[mse-1.0]"
    )
    assert check_id("conformance.test_x", "test_c[small-pure_jax]", "pure_jax") == (
        "test_x::test_c[small]"
    )


def test_fast_runs_cover_every_module_of_the_suite():
    """The ordered module list of ``-x`` runs leaves no per-implementation module out."""
    import pkgutil

    import conformance
    from conformance.meta_tests.runner import ORDERED

    modules = {m.name for m in pkgutil.iter_modules(conformance.__path__) if m.name[:5] == "test_"}
    assert modules - {"test_cross"} == {name.rpartition(".")[2] for name in ORDERED}
