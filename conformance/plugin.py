"""The pytest plugin behind the suite (registered under the ``pytest11`` entry point).

It adds ``--impl`` (repeatable; names or ``module:attribute``, default: the ``CVAE_IMPL``
environment variable, else every installed implementation), prints which implementations run and
the versions behind them in the report header, parametrises every test that asks for the ``impl``
(or ``impl_pair``) fixture, pins float32 matmuls to full precision, and registers the hypothesis
profiles: ``ci`` (small and derandomised, the default) and ``thorough`` (``--thorough``,
``--hypothesis-profile thorough``, or ``CVAE_HYPOTHESIS_PROFILE=thorough``).

Every run writes a machine-readable report (``--conformance-report``, default
``conformance-report.json`` in the working directory): per implementation and per check,
``passed``, ``failed``, ``skipped`` or ``not applicable`` (a check of a capability the
implementation does not have, see :func:`cvae_rosetta.conformance.common.require`), with the
versions behind each implementation.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import pytest

from cvae_rosetta.files import write_json

_IMPLS_KEY = pytest.StashKey[dict]()
_RESULTS_KEY = pytest.StashKey[dict]()
NOT_APPLICABLE = "not applicable"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cvae-rosetta")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        metavar="NAME",
        help="implementation to test: a short name or module:attribute (repeatable; "
        "default: $CVAE_IMPL, comma-separated, else every installed one)",
    )
    group.addoption(
        "--thorough",
        action="store_true",
        help="run the property tests with the thorough hypothesis profile (300 examples each)",
    )
    group.addoption(
        "--conformance-report",
        default=os.environ.get("CVAE_CONFORMANCE_REPORT", "conformance-report.json"),
        metavar="PATH",
        help="where to write the JSON report of this run [conformance-report.json]",
    )


def _requested(config: pytest.Config) -> list[str]:
    names = [n for opt in config.getoption("impl") for n in opt.split(",") if n.strip()]
    if not names:
        names = [n for n in os.environ.get("CVAE_IMPL", "").split(",") if n.strip()]
    if not names:
        from cvae_rosetta.spec.protocol import known

        names = [info.name for info in known() if info.installed]
    return [n.strip() for n in names]


def pytest_configure(config: pytest.Config) -> None:
    import jax

    # Float32 matmuls at full precision (no TF32 or bf16 passes on accelerators), so the suite's
    # tolerances are those of float32 arithmetic wherever it runs.
    jax.config.update("jax_default_matmul_precision", "highest")

    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        max_examples=10,
        derandomize=True,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    settings.register_profile(
        "thorough",
        max_examples=300,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    if config.getoption("thorough"):
        settings.load_profile("thorough")
    elif config.getoption("hypothesis_profile", None) is None:  # hypothesis's own option wins
        profile = os.environ.get("CVAE_HYPOTHESIS_PROFILE") or os.environ.get("HYPOTHESIS_PROFILE")
        settings.load_profile(profile or "ci")
    config.stash[_RESULTS_KEY] = {}
    config.addinivalue_line("markers", "pairwise: a check of two implementations together")


def _impls(config: pytest.Config) -> dict:
    """The implementations under test, loaded once, on first need."""
    if _IMPLS_KEY not in config.stash:
        from cvae_rosetta.spec.errors import CvaeError
        from cvae_rosetta.spec.protocol import load

        impls = {}
        for name in _requested(config):
            try:
                impls[name] = load(name)
            except CvaeError as err:
                impls[name] = err
        config.stash[_IMPLS_KEY] = impls
    return config.stash[_IMPLS_KEY]


def _loaded(config: pytest.Config) -> dict:
    impls = _impls(config)
    failed = [f"{name}: {err}" for name, err in impls.items() if isinstance(err, Exception)]
    if failed:
        raise pytest.UsageError(
            "cannot load the implementation(s) under test: " + "; ".join(failed)
        )
    return impls


def pytest_report_header(config: pytest.Config) -> list[str]:
    import jax

    from cvae_rosetta.spec.protocol import framework_of

    impls = _impls(config)
    lines = [
        f"cvae-rosetta conformance: jax {jax.__version__} on "
        f"{jax.default_backend()} ({jax.device_count()} device(s)), "
        f"python {platform.python_version()}"
    ]
    for name, impl in impls.items():
        if isinstance(impl, Exception):
            lines.append(f"  impl {name}: CANNOT LOAD: {impl}")
            continue
        framework, version = framework_of(impl)
        module = getattr(type(impl), "__module__", "?")
        if type(impl).__name__ == "Adapter":
            module = getattr(impl.init_fn, "__module__", module)
        lines.append(f"  impl {name}: {impl.name} from {module} ({framework} {version})")
    if not impls:
        lines.append("  no implementation installed")
    elif len(impls) < 2:
        lines.append("  pairwise checks (test_cross.py): need two implementations, not collected")
    return lines


def _named_explicitly(path: Path, config: pytest.Config) -> bool:
    """Whether an argument of this run is ``path`` or lies inside it (a path or, with
    ``--pyargs``, a dotted module name)."""
    here = Path(config.invocation_params.dir)
    # .../conformance/meta_tests -> cvae_rosetta.conformance.meta_tests
    dotted = ".".join(("cvae_rosetta", *path.parts[-2:]))
    for arg in config.args:
        arg = arg.split("::")[0]
        candidate = (here / arg).resolve()
        if candidate == path or path in candidate.parents:
            return True
        if arg == dotted or arg.startswith(dotted + "."):
            return True
    return False


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """What a plain ``pytest --pyargs cvae_rosetta.conformance`` leaves out.

    The pairwise checks need two implementations; with one they are not collected at all. The
    meta tests (``conformance/meta_tests``: the suite run on deliberately broken implementations)
    are collected only when a path inside that folder is given explicitly: they test the suite,
    not the implementation under test, and they run it in subprocesses.
    """
    if collection_path.parent.name != "conformance":
        return None
    if collection_path.name == "test_cross.py":
        return len(_impls(config)) < 2 or None
    if collection_path.name == "meta_tests" and collection_path.is_dir():
        return not _named_explicitly(Path(collection_path).resolve(), config) or None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Checks of a pair of implementations carry the ``pairwise`` marker (``-m pairwise``); with
    fewer than two implementations under test they are deselected, since they cannot apply."""
    single = len(_impls(config)) < 2
    kept, dropped = [], []
    for item in items:
        pairwise = "impl_pair" in getattr(item, "fixturenames", ())
        if pairwise:
            item.add_marker(pytest.mark.pairwise)
        (dropped if pairwise and single else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not {"impl", "impl_pair"} & set(metafunc.fixturenames):
        return
    impls = _loaded(metafunc.config)
    if "impl" in metafunc.fixturenames:
        metafunc.parametrize("impl", list(impls.values()), ids=list(impls), scope="module")
    if "impl_pair" in metafunc.fixturenames:
        pairs = [(a, b) for i, a in enumerate(impls) for b in list(impls)[i + 1 :]]
        metafunc.parametrize(
            "impl_pair",
            [(impls[a], impls[b]) for a, b in pairs],
            ids=[f"{a}-{b}" for a, b in pairs],
            scope="module",
        )


# --- the machine-readable report ------------------------------------------------------------------


def _names_of(item: pytest.Item) -> list[tuple[str, str]]:
    """``(implementation, check id)`` pairs a test item reports for."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    impls = item.config.stash.get(_IMPLS_KEY, {})
    by_id = {id(obj): name for name, obj in impls.items()}
    check = item.nodeid.split("::", 1)[-1].split("[")[0]
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    pairs = []
    if "impl" in callspec.params:
        name = by_id.get(id(callspec.params["impl"]))
        rest = [p for p in callspec.id.split("-") if p != name] if name else []
        pairs.append((name, f"{module}::{check}" + (f"[{'-'.join(rest)}]" if rest else "")))
    # with one implementation, the pairwise parametrisation is empty: pytest's NOTSET, skipped
    if isinstance(callspec.params.get("impl_pair"), tuple):
        a, b = (by_id.get(id(obj)) for obj in callspec.params["impl_pair"])
        extra = callspec.id.replace(f"{a}-{b}", "").strip("-")
        suffix = f"-{extra}" if extra else ""
        pairs.append((a, f"{module}::{check}[with {b}{suffix}]"))
        pairs.append((b, f"{module}::{check}[with {a}{suffix}]"))
    return [(n, c) for n, c in pairs if n]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    results = item.config.stash.get(_RESULTS_KEY, None)
    if results is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if report.passed:
            status = "passed"
        elif report.skipped:
            reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
            status = NOT_APPLICABLE if NOT_APPLICABLE in reason else "skipped"
        else:
            status = "failed"
        for name, check in _names_of(item):
            results.setdefault(name, {})[check] = status


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    results = config.stash.get(_RESULTS_KEY, None)
    if not results:
        return
    import jax

    from cvae_rosetta.spec.protocol import framework_of

    impls = {}
    for name, impl in config.stash.get(_IMPLS_KEY, {}).items():
        if isinstance(impl, Exception):
            continue
        framework, version = framework_of(impl)
        impls[name] = {"name": impl.name, "framework": framework, "version": version}
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "python": platform.python_version(),
        "implementations": impls,
        "summary": {
            name: {s: sum(1 for v in checks.values() if v == s) for s in _STATUSES}
            for name, checks in results.items()
        },
        "results": results,
    }
    path = Path(config.getoption("conformance_report")).expanduser()
    write_json(path, report, sort_keys=True, newline=False, parents=True)
    config.stash[_RESULTS_KEY] = {"_written": str(path), **results}


_STATUSES = ("passed", "failed", "skipped", NOT_APPLICABLE)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS_KEY, None)
    if not results or "_written" not in results:
        return
    terminalreporter.section("cvae-rosetta conformance")
    for name, checks in results.items():
        if name == "_written":
            continue
        counts = ", ".join(
            f"{sum(1 for v in checks.values() if v == s)} {s}"
            for s in _STATUSES
            if any(v == s for v in checks.values())
        )
        terminalreporter.write_line(f"{name}: {counts}")
    terminalreporter.write_line(f"report: {results['_written']}")
