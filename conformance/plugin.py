"""The pytest plugin behind the suite (registered under the ``pytest11`` entry point).

It adds ``--impl`` (repeatable; names or ``module:attribute``, default: the ``CVAE_IMPL``
environment variable, else every installed implementation), prints which implementations run and
the versions behind them in the report header, parametrises every test that asks for the ``impl``
fixture, pins float32 matmuls to full precision, and registers the hypothesis profiles: ``ci``
(small and derandomised, the default) and ``thorough`` (``--hypothesis-profile thorough`` or
``CVAE_HYPOTHESIS_PROFILE=thorough``).
"""

from __future__ import annotations

import os
import platform

import pytest

_IMPLS_KEY = pytest.StashKey[dict]()


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


def _requested(config: pytest.Config) -> list[str]:
    names = [n for opt in config.getoption("impl") for n in opt.split(",") if n.strip()]
    if not names:
        names = [n for n in os.environ.get("CVAE_IMPL", "").split(",") if n.strip()]
    if not names:
        from shared.protocol import known

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
    settings.load_profile(os.environ.get("CVAE_HYPOTHESIS_PROFILE", "ci"))


def _impls(config: pytest.Config) -> dict:
    """The implementations under test, loaded once, on first need."""
    if _IMPLS_KEY not in config.stash:
        from shared.errors import CvaeError
        from shared.protocol import load

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

    from shared.protocol import framework_of

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


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """The pairwise checks need two implementations; with one they are not collected at all."""
    if collection_path.name == "test_cross.py" and collection_path.parent.name == "conformance":
        return len(_impls(config)) < 2 or None
    return None


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
