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

    from shared.errors import CvaeError
    from shared.protocol import load

    impls = {}
    for name in _requested(config):
        try:
            impls[name] = load(name)
        except CvaeError as err:
            raise pytest.UsageError(str(err)) from err
    config.stash[_IMPLS_KEY] = impls


def pytest_report_header(config: pytest.Config) -> list[str]:
    import jax

    from shared.protocol import framework_of

    impls = config.stash.get(_IMPLS_KEY, {})
    lines = [
        f"cvae-rosetta conformance: jax {jax.__version__} on "
        f"{jax.default_backend()} ({jax.device_count()} device(s)), "
        f"python {platform.python_version()}"
    ]
    for name, impl in impls.items():
        framework, version = framework_of(impl)
        module = getattr(type(impl), "__module__", "?")
        if type(impl).__name__ == "Adapter":
            module = getattr(impl.init_fn, "__module__", module)
        lines.append(f"  impl {name}: {impl.name} from {module} ({framework} {version})")
    if not impls:
        lines.append("  no implementation installed")
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    impls = metafunc.config.stash.get(_IMPLS_KEY, {})
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
