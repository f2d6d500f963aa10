r"""The suite tests itself: it must fail on every broken implementation and pass on the reference.

The per-implementation suite (``pytest --pyargs cvae_rosetta.conformance --impl TARGET``, pairwise
checks left out) runs on the reference and on every broken implementation, all in one pytest session
in a subprocess (see ``runner`` and the ``recorder`` plugin: one run per target, one after the
other, the reference last). The reference must pass every check. A broken implementation counts as
caught only if its run went to its end (nothing left uncollected or unreported, no collection or
usage error) and a check failed *while running* (the test's own assertions on the spec, or the
implementation raising, not an error while setting up) that passed on the reference under the same
harness: a suite that crashes, or a harness that fails everything, proves nothing.

Being caught is not enough: the run must also name the cause. ``broken.EXPECTED`` gives, for each
broken implementation, the earliest layer that must fail (``cvae_rosetta.conformance.layers``) and
a phrase the first line of its cause's message must contain (the cause: the first check to fail in
that layer, which the plugin's diagnosis names), e.g. ``("loss", "kl is twice the reference")``.

Not collected by ``pytest --pyargs cvae_rosetta.conformance``; run it explicitly::

    pytest --pyargs cvae_rosetta.conformance.meta_tests  # every check on every bug: long
    CVAE_META_RESULTS=build/meta pytest --pyargs cvae_rosetta.conformance.meta_tests
    python -m cvae_rosetta.conformance.meta_tests.report --results build/meta \
        --out docs/meta_tests.md

``CVAE_META_FAST=1`` stops each broken implementation's run at its first failing check (what
tox's ``meta`` environment does, to stay within the CI budget); the checks run in the order of the
suite's layers, so that check is the cause the plugin's diagnosis names, and every check of an
earlier layer has passed by then (a bug caught late costs every earlier layer's checks).
``CVAE_META_ONLY=NAME,NAME`` runs those broken implementations only (and the reference), to try a
new one: ``CVAE_META_FAST=1 CVAE_META_ONLY=schedule_ignored pytest --pyargs
cvae_rosetta.conformance.meta_tests``. ``CVAE_META_RESULTS`` keeps each run's JSON summary (the
report reads them) and each session's record and output; ``CVAE_META_WORKERS=2`` runs two
sessions side by side (worth it on two otherwise idle cores); ``CVAE_META_TIMEOUT``
bounds each run in seconds; ``CVAE_META_PYTEST_ARGS`` adds pytest arguments to every session
(``-k ...`` to leave slow checks out; the table is then incomplete).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from cvae_rosetta.conformance.meta_tests import broken
from cvae_rosetta.conformance.meta_tests.report import page_entries
from cvae_rosetta.conformance.meta_tests.runner import SuiteRun, check_id, label_of, run_suites

REFERENCE = "pure_jax"
# CVAE_META_FAST=1 (the `meta` tox environment): each broken implementation's run stops at its first
# failing check. Without it every check runs, which the docs' table of catches needs.
FAST = os.environ.get("CVAE_META_FAST") == "1"
# CVAE_META_ONLY=NAME,NAME: those broken implementations only (and the reference), to try one
# without the whole run.
ONLY = [name for name in os.environ.get("CVAE_META_ONLY", "").split(",") if name.strip()]
assert set(ONLY) <= set(broken.NAMES), f"CVAE_META_ONLY names no broken implementation: {ONLY}"
SELECTED = [name for name in broken.NAMES if not ONLY or name in ONLY]
TARGETS = [REFERENCE, *(broken.target(name) for name in SELECTED)]


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    chosen = os.environ.get("CVAE_META_RESULTS")
    return Path(chosen) if chosen else tmp_path_factory.mktemp("meta_results")


@pytest.fixture(scope="session")
def suite_runs(results_dir) -> dict[str, SuiteRun]:
    """Every target's run, by label (``pure_jax``, then the names of ``broken.NAMES``)."""
    runs = run_suites(TARGETS, results_dir, first_failure=FAST)
    return {label_of(target): run for target, run in runs.items()}


@pytest.fixture(scope="session")
def reference_run(suite_runs) -> SuiteRun:
    return suite_runs[REFERENCE]


def _describe(run: SuiteRun) -> str:
    return (
        f"{run.target}: exit status {run.returncode}, {len(run.passed)} passed, "
        f"{len(run.failed)} failed, {len(run.skipped)} skipped, {len(run.not_run)} not run, "
        f"{len(run.unfinished)} never reported, collection errors {run.collection_errors}\n"
        f"--- output tail ---\n{run.output_tail}"
    )


def test_the_suite_passes_on_the_reference(reference_run):
    assert reference_run.valid, _describe(reference_run)
    assert reference_run.returncode == 0 and not reference_run.failed, _describe(reference_run)
    assert not reference_run.not_run, _describe(reference_run)
    # every check ran, the checker's own (no implementation) included
    assert reference_run.independent, _describe(reference_run)


@pytest.mark.parametrize("name", SELECTED)
def test_the_suite_fails_on_a_broken_implementation(name, suite_runs, reference_run):
    run = suite_runs[name]
    assert run.valid, "the suite did not run to its end: " + _describe(run)
    if not FAST:  # every check that ran on the reference ran here too (skipped ones, e.g. not
        # applicable, may come and go; the checker's own checks ran once, with the reference)
        missing = set(reference_run.passed) - set(run.checks) - set(reference_run.independent)
        assert not missing, f"checks not collected for {name}: {sorted(missing)}"
    assert run.returncode == 1 and run.failed, (
        f"no check caught {name} ({broken.BUGS[name]}): " + _describe(run)
    )
    genuine = [c for c in run.failed_while_running if reference_run.outcomes.get(c) == "passed"]
    assert genuine, (
        f"{name}: no check that passed on the reference failed while running (only errors "
        f"setting up or tearing down: {run.failures}): " + _describe(run)
    )


def test_the_page_of_catches_agrees_with_broken_and_the_reference_run(reference_run):
    """``docs/meta_tests.md`` (regenerated outside CI by its command, a run of every check on every
    bug) lists the bugs ``broken.py`` defines, in its order, and the reference run's count of
    cases is the one this session's reference collected. tox's ``meta`` environment names the page
    (``CVAE_META_PAGE``); a wheel installed elsewhere has no docs to check."""
    page = os.environ.get("CVAE_META_PAGE")
    if not page:
        pytest.skip("CVAE_META_PAGE names no docs/meta_tests.md to check (tox -e meta does)")
    listed, count = page_entries(Path(page).read_text(encoding="utf-8"))
    assert listed == broken.NAMES, (
        f"{page}: expected the bugs of broken.py, {broken.NAMES}, got {listed} (regenerate it: "
        "python -m cvae_rosetta.conformance.meta_tests.report --out docs/meta_tests.md)"
    )
    assert count == len(reference_run.checks), (
        f"{page}: expected a reference run of {len(reference_run.checks)} cases, as this session "
        f"collected, got {count} (regenerate it)"
    )


def test_every_broken_implementation_says_what_it_models():
    assert len(broken.NAMES) >= 10
    for name in broken.NAMES:
        module, _, attribute = broken.target(name).partition(":")
        impl = getattr(importlib.import_module(module), attribute)
        assert impl.bug == broken.BUGS[name] and impl.bug.endswith("."), name


def test_the_pieces_unchanged_are_the_reference():
    """``broken``'s forward pass and loss with nothing swapped compute what the reference does,
    bit for bit, so each broken implementation differs from the reference by its bug alone."""
    import jax
    import numpy as np

    from cvae_rosetta.conformance.common import CONFIG, make_batch, reference_params

    same = broken.pipeline()
    params = reference_params(jax.random.key(0))
    batch, key = make_batch(jax.random.key(1)), jax.random.key(2)
    outputs = []
    for impl in (broken.BASE, same):
        state = impl.from_canonical(params, CONFIG)
        mean, logvar = impl.encode(state, batch.x, batch.c)
        logits = impl.decode(state, mean, batch.c)
        _, metrics = impl.loss(state, batch, key)
        new, _ = impl.train_step(state, batch, key)
        outputs.append((mean, logvar, logits, metrics, impl.to_canonical(new)))
    for a, b in zip(*(jax.tree.leaves(o) for o in outputs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_check_ids_leave_out_the_implementation():
    target = f"{broken.__name__}:kl_missing_half"
    assert (
        check_id("cvae_rosetta.conformance.test_loss", f"test_a[{target}]", target)
        == "test_loss::test_a"
    )
    assert (
        check_id("cvae_rosetta.conformance.test_loss", f"test_b[{target}-mse-1.0]", target)
        == "test_loss::test_b[mse-1.0]"
    )
    assert check_id("cvae_rosetta.conformance.test_x", "test_c[small-pure_jax]", "pure_jax") == (
        "test_x::test_c[small]"
    )


def test_runs_cover_every_module_of_the_suite():
    """The modules a session names leave no per-implementation module out, and name each once."""
    import pkgutil

    import cvae_rosetta.conformance as conformance
    from cvae_rosetta.conformance.meta_tests.runner import modules

    found = {m.name for m in pkgutil.iter_modules(conformance.__path__) if m.name[:5] == "test_"}
    named = [name.rpartition(".")[2] for name in modules()]
    assert len(named) == len(set(named)) and set(named) == found - {"test_pairwise"}


def test_every_check_of_the_suite_has_its_layer():
    """Each check's layer is named by its module in ``layers.MODULES``: none falls back to the
    default silently, so the order runs and diagnoses follow is the one meant."""
    from cvae_rosetta.conformance import layers
    from cvae_rosetta.conformance.meta_tests.runner import modules

    for module in (*modules(), "conformance.test_pairwise"):
        name = module.rpartition(".")[2]
        tests = [
            attribute
            for attribute in vars(importlib.import_module(f"cvae_rosetta.{module}"))
            if attribute.startswith("test_")
        ]
        assert tests, module
        for test in tests:
            assert name in layers.MODULES, f"{name}::{test} has no layer"


@pytest.mark.parametrize("name", SELECTED)
def test_the_diagnosis_names_the_layer_and_the_cause(name, suite_runs):
    """The cause a run names (the first failed check of the earliest layer that failed, see
    ``SuiteRun.diagnosis``) is in the layer ``broken.EXPECTED`` gives, and the first line of its
    message says what that entry says it does."""
    layer, phrase = broken.EXPECTED[name]
    run = suite_runs[name]
    found = run.diagnosis
    assert found is not None, f"{name}: nothing failed: " + _describe(run)
    got, check, line = found
    assert got == layer, (
        f"{name}: the earliest layer that failed is {got!r} ({check}: {line}), expected {layer!r}"
    )
    assert phrase in line, f"{name}: the cause {check} says {line!r}, expected it to say {phrase!r}"


def test_every_broken_implementation_has_an_expected_diagnosis():
    from cvae_rosetta.conformance import layers

    assert set(broken.EXPECTED) == set(broken.NAMES)
    for name, (layer, phrase) in broken.EXPECTED.items():
        assert layer in layers.NAMES and phrase, name


def _record(*checks, exitstatus=1, independent=()):
    """A session's record, as the recorder writes it, for targets ``a`` and ``b``."""
    collected = {"a": [], "b": []}
    for target, check, *_ in checks:
        collected[target].append(check)
    events = [
        {"event": "start", "targets": ["a", "b"], "reference": "a"},
        {"event": "collected", "checks": collected, "independent": list(independent)},
    ]
    for target, check, outcome, *when in checks:
        event = {"event": "check", "target": target, "check": check, "outcome": outcome}
        if outcome == "failed":
            event |= {
                "when": when[0],
                "message": f"AssertionError: {check} failed\nassert 0",
                "first_line": f"{check} failed",
                "text": "assert 0",
            }
        events.append(event | {"seconds": 1.0})
    if exitstatus is not None:
        events.append({"event": "finish", "exitstatus": exitstatus, "seconds": 9.0})
    return events


def test_a_session_record_reads_back_as_one_run_per_target():
    from cvae_rosetta.conformance.meta_tests.runner import runs_from_record

    events = _record(
        ("a", "m::t1", "passed"),
        ("a", "m::ref", "passed"),
        ("b", "m::t1", "failed", "call"),
        ("b", "m::t2", "stopped"),
        ("b", "m::t3", "failed", "setup"),
        independent=["m::ref"],
    )
    runs = runs_from_record(["a", "b"], events, 1, "output")
    a, b = runs["a"], runs["b"]
    assert a.valid and a.returncode == 0 and a.checks == ["m::t1", "m::ref"]
    assert a.independent == ["m::ref"] and a.seconds == 2.0
    assert b.valid and b.returncode == 1 and b.failed == ["m::t1", "m::t3"]
    assert b.failed_while_running == ["m::t1"] and b.not_run == ["m::t2"]
    assert "m::t2" not in b.outcomes and not b.independent
    assert a.diagnosis is None
    # t1 and t3 fall back to the default layer, properties
    assert b.diagnosis == ("properties", "m::t1", "m::t1 failed")


def test_the_diagnosis_is_the_first_failure_of_the_earliest_layer():
    from cvae_rosetta.conformance.meta_tests.runner import runs_from_record

    events = _record(
        ("b", "test_step::test_train_step_matches_reference_update[optim0]", "failed", "call"),
        ("b", "test_loss::test_loss_matches_reference[mse-1.0]", "failed", "call"),
        ("b", "test_loss::test_loss_matches_reference[mse-3.0]", "failed", "call"),
        ("b", "test_properties::test_encode_and_decode_match_reference", "failed", "call"),
    )
    run = runs_from_record(["a", "b"], events, 1, "output")["b"]
    check = "test_loss::test_loss_matches_reference[mse-1.0]"
    assert run.diagnosis == ("loss", check, f"{check} failed")


def test_a_session_that_did_not_end_keeps_only_the_runs_it_finished():
    from cvae_rosetta.conformance.meta_tests.runner import runs_from_record

    # a reported its first check only when the session ended; b, all of its checks
    events = _record(("a", "m::t1", "passed"), ("b", "m::t1", "failed", "call"), exitstatus=None)
    events[1]["checks"]["a"].append("m::t2")
    for returncode in (None, 2, 3, -6):  # timed out, interrupted, internal error, aborted
        runs = runs_from_record(["a", "b"], events, returncode, "Fatal Python error: Aborted")
        a, b = runs["a"], runs["b"]
        assert a.returncode == returncode and a.unfinished == ["m::t2"] and not a.valid
        assert f"exit status {returncode} after m::t1 on b" in a.output_tail
        assert b.valid and b.returncode == 1
    # in a session that ended normally, a target with checks never reported has no valid run
    runs = runs_from_record(["a", "b"], events, 1, "output")
    assert runs["a"].unfinished == ["m::t2"] and not runs["a"].valid and runs["b"].valid
    assert not any(run.valid for run in runs_from_record(["a", "b"], [], 1, "").values())


def test_the_recorder_clears_jax_caches_near_the_mapping_limit(tmp_path, monkeypatch):
    """A session compiles for many implementations in one process; past half the memory mappings
    a process may hold, the recorder drops JAX's compiled executables (XLA aborts at the limit)."""
    import types

    import jax

    from cvae_rosetta.conformance import compilation
    from cvae_rosetta.conformance.meta_tests import recorder

    cleared, events = [], []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))
    maps = tmp_path / "maps"
    monkeypatch.setattr(compilation, "MAPS", maps)
    state = types.SimpleNamespace(mapping_limit=20, write=lambda **event: events.append(event))
    maps.write_text("mapping\n" * 10)
    recorder._keep_within_the_mapping_limit(state)
    assert not cleared and not events
    maps.write_text("mapping\n" * 11)
    recorder._keep_within_the_mapping_limit(state)
    assert cleared == [1] and events[0]["event"] == "caches_cleared"
    monkeypatch.setattr(compilation, "MAPS", tmp_path / "absent")  # not Linux: nothing to watch
    recorder._keep_within_the_mapping_limit(state)
    assert cleared == [1]
