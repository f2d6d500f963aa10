"""The conformance plugin (``conformance/plugin.py``): inert in sessions that do not ask for the
suite, the suite's settings confined to its own checks, the checks in layer order, and the
diagnosis of a failing run.

The plugin is a ``pytest11`` entry point, so every pytest session of an environment with the
package installed loads it. The sessions here run in subprocesses of this interpreter, from
temporary project folders of their own (outside the repository), as a user's sessions do.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cvae_rosetta.conformance import layers
from cvae_rosetta.conformance.plugin import SUITE
from cvae_rosetta.conformance.report import (
    NO_MESSAGE,
    PAIR,
    REFERENCE,
    SKIPPED_EARLIER,
    diagnosis,
    diagnosis_line,
    plain_message,
    summary_lines,
)

pytestmark = pytest.mark.suite_runs

# a line of -v: "::test_name[params] PASSED [  3%]" (a module outside the rootdir has no path in
# its node id: a check's layer is found from its name, see suite_checks)
VERBOSE = re.compile(r"^\S*::(test_\w+)(?:\[.*?\])? (?:PASSED|FAILED|SKIPPED|ERROR)", re.M)
BROKEN = "cvae_rosetta.conformance.meta_tests.broken:loss_summed_over_batch"
# the modules of the layers from the surface to training, but for properties, edges and precision
UP_TO_TRAINING = (
    "test_surface",
    "test_shapes",
    "test_forward",
    "test_loss",
    "test_gradients",
    "test_step",
    "test_later_steps",
    "test_jit",
    "test_bad_input",
    "test_training",
)


def run_pytest(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m pytest *args`` from ``root``, with ``root`` on the path and nothing of this
    session's own choices (``CVAE_*``, ``PYTEST_ADDOPTS``) in its environment."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CVAE_") and k != "PYTEST_ADDOPTS"
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def suite_checks() -> dict[str, str]:
    """Every check of the suite (its function's name) -> its module's name (``test_loss``)."""
    found = {}
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[node.name] = path.stem
    return found


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text).lstrip())


# A project of the user's own: its own hypothesis profile, named "ci" like the suite's, and a
# fixture named "impl" like the suite's.
USER_CONFTEST = """
    import pytest
    from hypothesis import settings

    settings.register_profile("ci", max_examples=7)
    settings.load_profile("ci")


    @pytest.fixture
    def impl():
        return "mine"
"""


# --- inert unless asked ---------------------------------------------------------------------------


def test_a_session_that_does_not_ask_for_the_suite_is_left_alone(tmp_path):
    write(
        tmp_path,
        {
            "conftest.py": USER_CONFTEST,
            "test_mine.py": """
                import sys
                from pathlib import Path

                from hypothesis import given, settings, strategies as st

                FRAMEWORKS = {"jax", "jaxlib", "flax", "haiku", "equinox", "keras", "optax"}


                def test_nothing_is_imported_and_the_fixture_is_mine(impl):
                    assert impl == "mine"
                    imported = [
                        m
                        for m in sys.modules
                        if m.split(".")[0] in FRAMEWORKS or m.startswith("cvae_rosetta.impls")
                    ]
                    assert "jax" not in sys.modules and "flax" not in sys.modules, imported
                    assert not imported, imported


                @given(st.integers())
                def test_my_profile_is_the_current_one(x):
                    assert settings.get_current_profile_name() == "ci"
                    assert settings.default.max_examples == 7


                def test_jax_is_as_jax_left_it():
                    import jax

                    assert jax.config.jax_default_matmul_precision is None


                def test_no_report_so_far():
                    assert not Path("conformance-report.json").exists()
            """,
        },
    )
    result = run_pytest(tmp_path, "-v", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "4 passed" in output, output[-3000:]
    plugins = next((line for line in output.splitlines() if line.startswith("plugins:")), "")
    assert "cvae-rosetta" in plugins, output[-3000:]  # loaded, and silent:
    for line in output.splitlines():
        assert not line.startswith(("cvae-rosetta", "  impl ")), output[-3000:]
    assert "cvae-rosetta conformance" not in output, output[-3000:]
    assert not (tmp_path / "conformance-report.json").exists()


PROBE = """
    '''Records what each test saw: the matmul precision and XLA's optimisation setting while it
    ran and after it, and the hypothesis settings of the suite's property tests (which it then
    skips: that is all they are needed for here).'''
    import json
    import os

    import pytest

    SEEN = []


    @pytest.fixture(autouse=True)
    def _precision_during(request):
        import jax

        precision = jax.config.jax_default_matmul_precision
        light = jax.config.values["jax_disable_most_optimizations"]
        SEEN.append({"test": request.node.nodeid, "during": precision, "light": light})
        yield


    def pytest_runtest_logreport(report):
        if report.when == "teardown":
            import jax

            after = jax.config.jax_default_matmul_precision
            light = jax.config.values["jax_disable_most_optimizations"]
            SEEN.append({"test": report.nodeid, "after": after, "light_after": light})


    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(item):
        if getattr(item.obj, "is_hypothesis_test", False) and "conformance" in str(item.path):
            used = item.obj._hypothesis_internal_use_settings
            SEEN.append({"test": item.nodeid, "max_examples": used.max_examples})
            pytest.skip("probe: its settings are all this session needs of it")


    def pytest_sessionfinish(session):
        with open("probe.json", "w") as f:
            json.dump(SEEN, f)
"""


def test_asked_with_impl_the_suite_runs_with_its_settings_confined_to_its_checks(tmp_path):
    write(
        tmp_path,
        {
            "conftest.py": textwrap.dedent(USER_CONFTEST)
            + textwrap.dedent("""
                import jax

                jax.config.update("jax_default_matmul_precision", "tensorfloat32")
            """),
            "probe.py": PROBE,
            "test_mine.py": """
                import jax
                from hypothesis import given, settings, strategies as st


                def test_mine_after_the_suite(impl):
                    assert impl == "mine"
                    assert jax.config.jax_default_matmul_precision == "tensorfloat32"


                @given(st.integers())
                def test_my_profile_still_applies_to_mine(x):
                    assert settings.get_current_profile_name() == "ci"
                    assert settings.default.max_examples == 7
            """,
        },
    )
    checks = ("test_surface::test_protocol_surface", "test_surface::test_canonical_round_trip")
    result = run_pytest(
        tmp_path,
        *("-p", "probe", "--impl", "pure_jax", "--pyargs"),
        *(f"cvae_rosetta.conformance.{c}" for c in checks),
        "cvae_rosetta.conformance.test_properties::test_encode_and_decode_match_reference",
        # a module marked fully_optimized (its checks trace only, so this stays quick)
        "cvae_rosetta.conformance.test_precision::test_matmuls_take_the_compute_dtype",
        "test_mine.py",
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "cvae-rosetta conformance: jax" in output, output[-3000:]
    assert "impl pure_jax: pure_jax from cvae_rosetta.impls.pure_jax" in output, output[-3000:]

    report = json.loads((tmp_path / "conformance-report.json").read_text())
    assert report["results"]["pure_jax"] == {
        "test_surface.py::test_protocol_surface": "passed",
        "test_surface.py::test_canonical_round_trip": "passed",
        "test_properties.py::test_encode_and_decode_match_reference": "skipped",
        "test_precision.py::test_matmuls_take_the_compute_dtype[small]": "passed",
        "test_precision.py::test_matmuls_take_the_compute_dtype[784]": "passed",
    }
    assert report["implementations"]["pure_jax"]["diagnosis"] is None
    assert [c["layer"] for c in report["checks"]["pure_jax"]] == [
        "surface",
        "surface",
        "properties",
        "precision",
        "precision",
    ]

    seen = json.loads((tmp_path / "probe.json").read_text())
    suite = [s for s in seen if "test_protocol_surface" in s["test"] or "round_trip" in s["test"]]
    assert {s["during"] for s in suite if "during" in s} == {"highest"}, seen
    assert {s["after"] for s in suite if "after" in s} == {"tensorfloat32"}, seen
    # XLA's optimisation: mostly off for the suite's checks, the fully_optimized module's too on
    # the CPU (the same optimised program: tests/test_optimization.py), and the user's setting
    # (JAX's default, full) around and after every one of them
    assert {s["light"] for s in suite if "light" in s} == {True}, seen
    numerics = [s for s in seen if "test_matmuls_take_the_compute_dtype" in s["test"]]
    assert len(numerics) == 4 and {s["light"] for s in numerics if "light" in s} == {True}, seen
    assert {s["light_after"] for s in seen if "light_after" in s} == {False}, seen
    mine = [s for s in seen if "test_mine.py" in s["test"]]
    assert {s.get("during", s.get("after")) for s in mine} == {"tensorfloat32"}, seen
    assert {s.get("light", s.get("light_after")) for s in mine} == {False}, seen
    # the suite's property test ran with the suite's ci settings, the user's "ci" profile intact
    assert [s["max_examples"] for s in seen if "max_examples" in s] == [10], seen


# Counts JAX's persistent-cache hits and records the cache setting during the session and after it.
CACHE_PROBE = """
    import json

    import jax
    import jax.monitoring

    HITS = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: HITS.append(event) if event.endswith("cache_hits") else None
    )


    def pytest_runtest_logreport(report):
        if report.when == "call":
            HITS.append("dir:" + str(jax.config.jax_compilation_cache_dir))


    def pytest_unconfigure(config):
        with open("cache.json", "w") as f:
            json.dump({"events": HITS, "after": jax.config.jax_compilation_cache_dir}, f)
"""


def test_a_repeated_run_reads_its_programs_from_the_compilation_cache(tmp_path):
    """``--compilation-cache DIR``: the first run writes JAX's persistent cache there, the second
    reads it; ``off`` uses none; JAX's own setting is back after the session."""
    write(tmp_path, {"cacheprobe.py": CACHE_PROBE})
    check = "cvae_rosetta.conformance.test_jit::test_step_traces_once_for_equal_configs"
    folder = tmp_path / "jax-cache"

    def run(choice: str) -> dict:
        result = run_pytest(
            tmp_path,
            "-p",
            "cacheprobe",
            "--impl",
            "pure_jax",
            "--compilation-cache",
            choice,
            "--pyargs",
            check,
        )
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        seen = json.loads((tmp_path / "cache.json").read_text())
        seen["output"] = result.stdout
        return seen

    first = run(str(folder))
    written = sorted(p.name for p in folder.iterdir())
    assert written, "the first run wrote nothing into the compilation cache"
    assert f"compilation cache: {folder}" in first["output"], first["output"][-2000:]
    assert "dir:" + str(folder) in first["events"], first["events"]
    assert first["after"] is None, "JAX's cache setting was not restored after the session"

    second = run(str(folder))
    hits = [e for e in second["events"] if e.endswith("cache_hits")]
    assert hits, f"the second run read nothing from the cache: {second['events']}"

    off = run("off")
    assert "dir:None" in off["events"] and "compilation cache:" not in off["output"], off
    assert not [e for e in off["events"] if e.endswith("cache_hits")], off["events"]


def test_the_conformance_report_feeds_the_docs_matrix(tmp_path, monkeypatch):
    """The report keeps the fields the docs build reads (``docs_build/conformance_report.py``)."""
    root = Path(__file__).resolve().parent.parent
    docs_build = root / "docs_build"
    if not (docs_build / "conformance_report.py").is_file():
        pytest.skip("no docs_build/conformance_report.py next to the tests")
    import importlib

    result = run_pytest(
        tmp_path,
        *("--impl", "pure_jax", "--pyargs", "cvae_rosetta.conformance.test_surface"),
        *("-k", "test_protocol_surface or test_canonical_round_trip"),
        timeout=180,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    monkeypatch.syspath_prepend(str(docs_build))  # its modules import each other plainly
    docs_report = importlib.import_module("conformance_report")
    monkeypatch.setenv(docs_report.REPORT_ENV, str(tmp_path / "conformance-report.json"))
    matrix = docs_report.conformance_matrix()
    assert "`surface`: protocol surface | ✓ |" in matrix, matrix
    assert "| **all** | 2 passed |" in matrix, matrix


# --- what the terminal shows ----------------------------------------------------------------------

IMPL_LINE = "impl pure_jax: pure_jax from cvae_rosetta.impls.pure_jax (jax "
REFERENCE_CHECK = "test_properties.py::test_reference_gradient_matches_central_differences"


def test_quiet_names_the_implementation_and_counts_as_pytest_does(tmp_path):
    """Under ``-q`` pytest shows no report header: the line naming the implementation under test,
    its module and version, is in the suite's summary instead, once. The check of the suite's own
    reference (it takes no implementation) is counted apart, and the total is pytest's."""
    checks = ("test_surface::test_protocol_surface", REFERENCE_CHECK.replace(".py", ""))
    quiet = run_pytest(
        tmp_path,
        *("-q", "--impl", "pure_jax", "--pyargs"),
        *(f"cvae_rosetta.conformance.{c}" for c in checks),
    )
    output = quiet.stdout + quiet.stderr
    assert quiet.returncode == 0, output[-3000:]
    lines = output.splitlines()
    assert sum(line.startswith(IMPL_LINE) for line in lines) == 1, output[-3000:]
    assert "pure_jax: 1 passed" in lines, output[-3000:]
    assert f"{REFERENCE}: 1 passed" in lines, output[-3000:]
    total = (
        f"2 cases of the suite in all, as pytest counts them: 1 of pure_jax and 1 of {REFERENCE}"
    )
    assert total in lines, output[-3000:]
    assert re.search(r"^2 passed in ", output, re.M), output[-3000:]
    report = json.loads((tmp_path / "conformance-report.json").read_text())
    assert report["reference"]["results"] == {REFERENCE_CHECK: "passed"}
    assert report["reference"]["summary"]["passed"] == 1
    assert report["results"] == {"pure_jax": {"test_surface.py::test_protocol_surface": "passed"}}

    # at the normal verbosity, the header names it and the summary does not again
    normal = run_pytest(
        tmp_path, *("--impl", "pure_jax", "--pyargs", f"cvae_rosetta.conformance.{checks[0]}")
    )
    output = normal.stdout + normal.stderr
    assert normal.returncode == 0, output[-3000:]
    named = [line.strip() for line in output.splitlines() if IMPL_LINE in line]
    assert len(named) == 1 and named[0].startswith(IMPL_LINE), output[-3000:]
    assert output.index(IMPL_LINE) < output.index("cvae-rosetta conformance ==="), output[-3000:]
    assert "pure_jax: 1 passed" in output.splitlines(), output[-3000:]
    assert "cases of the suite in all" not in output, output[-3000:]  # one line: nothing to add


def test_an_implementation_that_cannot_be_loaded_stops_the_session_in_one_usage_error(tmp_path):
    """``--impl`` naming a module that does not exist: the session stops before collecting
    anything with pytest's usage error (status 4) saying why, in one line naming the field, what
    was expected and what was given: not an error while collecting each of the suite's 14 modules
    (status 2, a traceback each), as it did."""
    result = run_pytest(tmp_path, "--impl", "nosuchpackage.module:impl", "--pyargs",
                        "cvae_rosetta.conformance")  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 4, output[-3000:]
    [error] = [line for line in output.splitlines() if line.startswith("ERROR: ")]
    assert error.startswith(
        "ERROR: cannot load the implementation(s) under test: nosuchpackage.module:impl: impl: "
        "expected an importable module 'nosuchpackage.module', got "
    ), error
    assert "errors during collection" not in output and "Traceback" not in output, output[-3000:]


def test_the_summary_counts_each_pairwise_case_once_in_its_total():
    """Two implementations and their pairwise cases: each implementation's line counts the cases
    of its pairs too; the total counts each once, as pytest does."""
    results = {
        "a": {"t::x": "passed", "t::y": "not applicable", "p::z[with b]": "passed"},
        "b": {"t::x": "failed", "t::y": "passed", "p::z[with a]": "passed"},
    }
    owners = {"t::x[a]": "a", "t::y[a]": "a", "t::x[b]": "b", "t::y[b]": "b", "p::z[a-b]": PAIR}
    assert summary_lines(results, {}, owners) == [
        "a: 2 passed, 1 not applicable",
        "b: 2 passed, 1 failed",
        "5 cases of the suite in all, as pytest counts them: 2 of a alone, 2 of b alone and 1 "
        "of pairs of implementations (each counted above under both)",
    ]
    assert summary_lines({"a": {"t::x": "passed"}}, {}, {"t::x[a]": "a"}) == ["a: 1 passed"]
    owners = {"t::x[a]": "a", "r": REFERENCE}
    assert summary_lines({"a": {"t::x": "passed"}}, {"r": "failed"}, owners) == [
        "a: 1 passed",
        f"{REFERENCE}: 1 failed",
        f"2 cases of the suite in all, as pytest counts them: 1 of a and 1 of {REFERENCE}",
    ]


# --- layers and the diagnosis ---------------------------------------------------------------------


def test_first_layer_diagnoses_a_broken_loss_and_skips_the_later_layers(tmp_path):
    """A loss summed over the batch: surface, shapes and forward pass, the loss fails (its two
    Bernoulli cases), and with --first-layer nothing after the loss layer runs."""
    result = run_pytest(
        tmp_path,
        *("--impl", BROKEN, "--first-layer", "-v", "-rs"),
        # the modules in the order of their names, not of their layers
        "--pyargs",
        *(f"cvae_rosetta.conformance.{name}" for name in sorted(UP_TO_TRAINING)),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    line = (
        f"cvae-rosetta diagnosis: {BROKEN}: layer 'loss' "
        f"({layers.describe('loss')}): test_loss_matches_reference[bernoulli-1.0]: "
    )
    assert line in output, output[-3000:]
    assert "; 1 later failure (fix this one first: it may follow from it)" in output, output[-3000:]
    assert "an earlier layer failed: loss" in output, output[-3000:]

    report = json.loads((tmp_path / "conformance-report.json").read_text())
    found = report["implementations"][BROKEN]["diagnosis"]
    assert found["layer"] == "loss" and found["layer_description"] == layers.describe("loss")
    assert found["check"] == "test_loss.py::test_loss_matches_reference[bernoulli-1.0]"
    assert found["later_failures"] == 1 and found["message"], found
    assert report["first_layer"] is True

    checks = report["checks"][BROKEN]
    ranks = [layers.RANK[c["layer"]] for c in checks]
    assert ranks == sorted(ranks), [(c["check"], c["layer"]) for c in checks]  # layer order
    names = [c["check"] for c in checks]
    # the modules' checks in the order of their layers, not of the modules' names: the clipping
    # check (step) runs between the gradients' and the jit checks
    clipping = names.index("test_step.py::test_clipping_is_applied_before_adam")
    assert names.index("test_gradients.py::test_gradients_match_reference[mse]") < clipping
    assert clipping < names.index("test_jit.py::test_jitted_step_equals_eager_step")
    for check in checks:
        rank = layers.RANK[check["layer"]]
        if rank <= layers.RANK["forward"]:
            assert check["outcome"] == "passed", check
        elif rank > layers.RANK["loss"]:
            assert check["outcome"] == SKIPPED_EARLIER, check
    assert {c["outcome"] for c in checks if c["layer"] == "loss"} == {"passed", "failed"}
    summary = report["summary"][BROKEN]
    assert summary["failed"] == 2 and summary[SKIPPED_EARLIER] > 30, summary
    # -v lists them in the order they ran: the same order
    ran = VERBOSE.findall(output)
    assert len(ran) == len(checks), ran
    modules = suite_checks()
    assert all(name in modules for name in ran), ran
    ran_ranks = [layers.RANK[layers.layer_of(modules[name])] for name in ran]
    assert ran_ranks == sorted(ran_ranks), ran


# --- the pieces, without a session ----------------------------------------------------------------


@pytest.mark.parametrize(
    "message,expected",
    [
        (
            "AssertionError: decode's output does not change when only c changes: the decoder "
            "ignores the label\nassert np.False_\n +  where np.False_ = all(...)",
            "decode's output does not change when only c changes: the decoder ignores the label",
        ),
        ("AssertionError: assert np.False_\n +  where np.False_ = ...", NO_MESSAGE),
        ("assert 3 == 4", NO_MESSAGE),
        ("AssertionError", NO_MESSAGE),
        ("", NO_MESSAGE),
        (
            "AssertionError: \nNot equal to tolerance rtol=2e-05, atol=0\n\nMismatched elements",
            "Not equal to tolerance rtol=2e-05, atol=0",
        ),
        ("Failed: the step retraced", "the step retraced"),
        ("NotImplementedError", "raised NotImplementedError"),
        ("TypeError: bad operand\nmore", "raised TypeError: bad operand"),
    ],
)
def test_plain_message(message, expected):
    assert plain_message(message) == expected


def test_diagnosis_names_the_first_failure_of_the_earliest_layer():
    checks = {
        "test_surface.py::a": {"outcome": "passed", "layer": "surface"},
        "test_properties.py::p": {"outcome": "failed", "layer": "properties", "message": "p"},
        "test_forward.py::f1": {"outcome": "failed", "layer": "forward", "message": "first"},
        "test_forward.py::f2": {"outcome": "failed", "layer": "forward", "message": "second"},
        "test_gradients.py::g": {"outcome": "failed", "layer": "gradients", "message": "g"},
    }
    found = diagnosis(checks)
    assert found == {
        "layer": "forward",
        "layer_description": layers.describe("forward"),
        "check": "test_forward.py::f1",
        "message": "first",
        "later_failures": 3,
    }
    assert diagnosis_line("mypkg:impl", found) == (
        "cvae-rosetta diagnosis: mypkg:impl: layer 'forward' "
        "(encode and decode against the float64 reference): f1: first; "
        "3 later failures (fix this one first: they may follow from it)"
    )
    assert diagnosis({"test_surface.py::a": {"outcome": "passed", "layer": "surface"}}) is None


def test_every_check_of_the_suite_has_a_layer():
    """Each module of the suite has a layer in ``layers.MODULES``, and each layer its module."""
    for path in sorted(SUITE.glob("test_*.py")):
        assert path.stem in layers.MODULES, f"{path.name} has no layer in layers.MODULES"
    missing = sorted(set(layers.MODULES) - {path.stem for path in SUITE.glob("test_*.py")})
    assert not missing, f"layers.MODULES names modules the suite does not have: {missing}"
    assert set(layers.MODULES.values()) <= set(layers.NAMES)
    assert len(set(layers.NAMES)) == len(layers.NAMES)


def test_the_docs_list_the_layers_as_layers_py_has_them():
    docs = Path(__file__).resolve().parent.parent / "docs" / "conformance.md"
    if not docs.is_file():
        pytest.skip("no docs/conformance.md next to the tests")
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|$", docs.read_text(encoding="utf-8"), re.M)
    assert tuple(rows) == layers.LAYERS, rows
