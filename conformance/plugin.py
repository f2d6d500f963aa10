"""The pytest plugin behind the suite (registered under the ``pytest11`` entry point).

Being an entry point, it loads into every pytest session of an environment that has the package
installed, so it does nothing at all unless the session asks for the suite: ``--impl`` given,
``CVAE_IMPL`` set, a path inside the suite's folder or a ``cvae_rosetta.conformance`` module named
on the command line, or (decided while collecting) a test module of the suite's own collected.
Otherwise it imports neither JAX nor any framework or implementation, prints no header, writes no
report, parametrises nothing, and leaves JAX's configuration and hypothesis's profile as they are.

Asked, it adds ``--impl`` (repeatable; names or ``module:attribute``, default: the ``CVAE_IMPL``
environment variable, else every installed implementation), prints which implementations run and
the versions behind them in the report header (in the terminal summary instead where pytest hides
the header: ``-q``, ``--no-header``), and parametrises every check of the suite that asks for the
``impl`` (or ``impl_pair``) fixture. The terminal summary counts the cases of each implementation's
checks, and apart those of the checks of the suite's own reference, which take no implementation,
with the total as pytest counts it. For the suite's own tests only it pins float32
matmuls to full precision (restoring the previous setting after each) and applies the suite's
hypothesis settings: ``ci`` (small and derandomised, the default) or ``thorough`` (``--thorough``,
``CVAE_HYPOTHESIS_PROFILE=thorough``), or the profile of hypothesis's own ``--hypothesis-profile``.

The checks run in the order of the suite's layers (:mod:`cvae_rosetta.conformance.layers`), and a
run with failures ends with a diagnosis per implementation: the earliest layer that failed, the
check that failed there and what it saw, and how many later failures there are (they may
follow from it, so it is the one to fix first). With
``--first-layer`` (or ``CVAE_FIRST_LAYER=1``), once an implementation fails a check of some layer,
its checks of later layers are skipped.

Asked, it also points JAX's persistent compilation cache at pytest's cache folder
(``.pytest_cache/d/cvae_rosetta_jax``) for the session, unless ``JAX_COMPILATION_CACHE_DIR`` is
set, pytest's cache is off (``-p no:cacheprovider``) or ``--compilation-cache`` says otherwise (a
folder, or ``off``): the suite's time is compilation, and a repeated run reads back every program
that did not change. The previous settings are restored at
the end of the session. Once the last check of a module of the suite has run, it drops JAX's
in-memory caches of compiled programs, which otherwise hold most of a run's memory (how the suite
compiles: :mod:`cvae_rosetta.conformance.compilation`).

A run of the suite's checks writes a machine-readable report (``--conformance-report``, default
``conformance-report.json`` in the working directory): per implementation and per check,
``passed``, ``failed``, ``skipped``, ``skipped: earlier layer failed`` or ``not applicable`` (a
check of a capability the implementation does not have, see
:func:`cvae_rosetta.conformance.assertions.require`), every check's layer, each implementation's
diagnosis, and the versions behind each implementation (:mod:`cvae_rosetta.conformance.report`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
from pathlib import Path

import pytest

from cvae_rosetta.conformance import layers
from cvae_rosetta.conformance.compilation import (
    CACHE_SETTINGS,
    FULLY_OPTIMIZED,
    OPTIMIZATIONS,
    SAME_PROGRAM_BACKENDS,
    cache_dir,
    fully_optimized,
    near_the_mapping_limit,
    release_compiled_programs,
)
from cvae_rosetta.conformance.report import (
    EARLIER,
    contents,
    diagnosis,
    diagnosis_line,
    is_reference_check,
    names_of,
    outcome,
    owner_of,
    reference_name,
    summary_lines,
)
from cvae_rosetta.files import write_json

# The installed suite: this plugin's own folder (``cvae_rosetta/conformance``).
SUITE = Path(__file__).resolve().parent
PACKAGE = "cvae_rosetta.conformance"

_IMPLS_KEY = pytest.StashKey[dict]()
_STATE_KEY = pytest.StashKey["_State"]()
PRECISION = "jax_default_matmul_precision"
# The suite's hypothesis settings (keyword arguments of ``hypothesis.settings``), applied to its own
# property tests only, over whatever settings they would otherwise have.
_HEALTH = ("too_slow", "function_scoped_fixture")
PROFILES: dict[str, dict] = {
    "ci": dict(max_examples=10, derandomize=True, deadline=None, print_blob=True),
    "thorough": dict(max_examples=300, derandomize=False, deadline=None, print_blob=True),
}


def profile_settings(name: str) -> dict:
    """``PROFILES[name]`` with its health checks (hypothesis imported only here)."""
    from hypothesis import HealthCheck

    return {**PROFILES[name], "suppress_health_check": [getattr(HealthCheck, h) for h in _HEALTH]}


class _State:
    """What the plugin knows of its session."""

    def __init__(self, config: pytest.Config) -> None:
        self.asked = _asked(config)  # before collection: header, profiles registered
        self.active = False  # asked, or a test module of the suite is being collected
        self.first_layer = bool(config.getoption("first_layer")) or _env_flag("CVAE_FIRST_LAYER")
        self.full_optimization = (
            bool(config.getoption("full_optimization"))
            or _env_flag("CVAE_FULL_OPTIMIZATION")
            or _profile_name(config) == "thorough"
        )
        # implementation -> check -> outcome (the report's ``results``)
        self.results: dict[str, dict[str, str]] = {}
        # implementation -> check -> {"outcome", "layer", "message"?}, in the order they ran
        self.checks: dict[str, dict[str, dict]] = {}
        # the checks of the suite's own reference, which take no implementation: check -> outcome
        self.reference: dict[str, str] = {}
        self.owners: dict[str, str] = {}  # every case's node id -> whom it counts for (owner_of)
        self.failed_rank: dict[str, int] = {}  # implementation -> its earliest failing layer
        self.written: str | None = None
        self.cache_dir: str | None = None  # JAX's persistent compilation cache, where used
        self.cache_before: dict = {}  # JAX's settings of it before the session
        self.last_of_module: set | None = None  # see _last_of_their_module


def _profile_name(config: pytest.Config) -> str:
    """The hypothesis profile the suite's property tests run under: hypothesis's own
    ``--hypothesis-profile``, else ``--thorough``, else the environment, else ``ci``."""
    named = config.getoption("hypothesis_profile", None)
    name = named or ("thorough" if config.getoption("thorough") else None)
    name = name or os.environ.get("CVAE_HYPOTHESIS_PROFILE") or os.environ.get("HYPOTHESIS_PROFILE")
    return name or "ci"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _state(config: pytest.Config) -> _State | None:
    return config.stash.get(_STATE_KEY, None)


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
        "--first-layer",
        action="store_true",
        help="once an implementation fails a check, skip its checks of later layers "
        "(also $CVAE_FIRST_LAYER=1)",
    )
    group.addoption(
        "--full-optimization",
        action="store_true",
        help="compile every program of the suite with XLA's full optimisation, as a training run "
        "does (by default most optimisations are off, and programs compile about twice as fast; "
        "off the CPU, the numerics modules compile fully optimised; also "
        "$CVAE_FULL_OPTIMIZATION=1 and --thorough)",
    )
    group.addoption(
        "--compilation-cache",
        default=os.environ.get("CVAE_COMPILATION_CACHE", "auto"),
        metavar="DIR|off",
        help="JAX's persistent compilation cache for the suite's session: a folder, 'off', or "
        "'auto' (pytest's cache folder, unless JAX already has a cache configured) "
        "[$CVAE_COMPILATION_CACHE or auto]",
    )
    group.addoption(
        "--conformance-report",
        default=os.environ.get("CVAE_CONFORMANCE_REPORT", "conformance-report.json"),
        metavar="PATH",
        help="where to write the JSON report of this run [conformance-report.json]",
    )


# --- whether the session asks for the suite -------------------------------------------------------


def _in_suite(path) -> bool:
    """Whether ``path`` is the suite's folder or lies inside it."""
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError):
        return False
    return path == SUITE or SUITE in path.parents


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _asked(config: pytest.Config) -> bool:
    """Asked before collection: ``--impl``, ``CVAE_IMPL``, or an argument naming the suite (a path
    inside its folder or, with ``--pyargs``, one of its modules)."""
    if any(n.strip() for opt in config.getoption("impl") for n in opt.split(",")):
        return True
    if os.environ.get("CVAE_IMPL", "").strip(" ,"):
        return True
    here = Path(config.invocation_params.dir)
    for arg in config.args:
        arg = str(arg).split("::")[0]
        if arg == PACKAGE or arg.startswith(PACKAGE + "."):
            return True
        if _in_suite(here / arg):
            return True
        # with --pyargs, a module named from a folder above the suite's (conformance.test_loss)
        module = here.joinpath(*arg.split(".")[:-1], arg.rpartition(".")[2] + ".py")
        if config.option.pyargs and _DOTTED.fullmatch(arg) and _in_suite(module):
            return True
    return False


def _activate(config: pytest.Config) -> None:
    state = _state(config)
    if state is None or state.active:
        return
    state.active = True
    config.addinivalue_line("markers", "pairwise: a check of two implementations together")
    config.addinivalue_line(
        "markers",
        "one_device: a case that runs on one device whatever the devices JAX sees (a run on "
        "several forced host devices deselects it with -m 'not one_device': the implementation's "
        "own run on one device has run it)",
    )
    config.addinivalue_line(
        "markers",
        f"{FULLY_OPTIMIZED}: a check whose programs XLA compiles with its full optimisation, as a "
        "training run's, where most optimisations off would change the optimised program (every "
        "backend but the CPU): numerics at the edges and in bfloat16",
    )


@pytest.hookimpl(tryfirst=True)  # before hypothesis loads --hypothesis-profile (ci, thorough)
def pytest_configure(config: pytest.Config) -> None:
    state = config.stash[_STATE_KEY] = _State(config)
    if not state.asked:
        return
    _activate(config)
    try:
        from hypothesis import settings
    except ImportError:
        return
    for name in PROFILES:  # never over a profile of that name the session already has
        try:
            settings.get_profile(name)
        except Exception:
            settings.register_profile(name, **profile_settings(name))


# --- JAX's persistent compilation cache -----------------------------------------------------------
# For the session, with JAX's settings of it put back at its end (why and where: compilation.py).


def _use_compilation_cache(config: pytest.Config, state: _State) -> None:
    folder = cache_dir(config)
    if folder is None:
        return
    import jax

    state.cache_before = {name: getattr(jax.config, name) for name in CACHE_SETTINGS}
    for name, value in CACHE_SETTINGS.items():
        jax.config.update(name, folder if value is None else value)
    state.cache_dir = folder


def pytest_sessionstart(session: pytest.Session) -> None:
    # after pytest_configure, where pytest's own cache (config.cache) is set up
    state = _state(session.config)
    if state is not None and state.asked:
        _use_compilation_cache(session.config, state)
        # an implementation that cannot be loaded stops the session here, before any module is
        # collected: pytest's usage error (status 4) says why, once, not an error per module
        _loaded(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is None or not state.cache_before:
        return
    import jax

    for name, value in state.cache_before.items():
        jax.config.update(name, value)


def _requested(config: pytest.Config) -> list[str]:
    names = [n for opt in config.getoption("impl") for n in opt.split(",") if n.strip()]
    if not names:
        names = [n for n in os.environ.get("CVAE_IMPL", "").split(",") if n.strip()]
    if not names:
        from cvae_rosetta.spec.protocol import known

        names = [info.name for info in known() if info.installed]
    return [n.strip() for n in names]


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


def _impl_line(name: str, impl) -> str:
    """The header's line naming an implementation under test, its module and its framework's
    version."""
    if isinstance(impl, Exception):
        return f"impl {name}: CANNOT LOAD: {impl}"
    from cvae_rosetta.spec.protocol import framework_of

    framework, version = framework_of(impl)
    module = getattr(type(impl), "__module__", "?")
    if type(impl).__name__ == "Adapter":
        module = getattr(impl.init_fn, "__module__", module)
    return f"impl {name}: {impl.name} from {module} ({framework} {version})"


def _header_hidden(config: pytest.Config) -> bool:
    """Whether pytest leaves out the report header (``-q``, ``--no-header``), and with it the
    lines naming the implementations under test."""
    return config.option.verbose < 0 or bool(getattr(config.option, "no_header", False))


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = _state(config)
    if state is None or not state.asked:
        return None
    import jax

    impls = _impls(config)
    lines = [
        f"cvae-rosetta conformance: jax {jax.__version__} on "
        f"{jax.default_backend()} ({jax.device_count()} device(s)), "
        f"python {platform.python_version()}"
    ]
    lines += [f"  {_impl_line(name, impl)}" for name, impl in impls.items()]
    if not impls:
        lines.append("  no implementation installed")
    elif len(impls) < 2:
        lines.append(
            "  pairwise checks (test_pairwise.py): need two implementations, not collected"
        )
    if state.first_layer:
        lines.append("  --first-layer: checks of later layers skipped after a failure")
    if state.cache_dir:
        lines.append(f"  compilation cache: {state.cache_dir} (--compilation-cache off: none)")
    if state.full_optimization:
        lines.append("  XLA: full optimisation for every check")
    elif jax.default_backend() in SAME_PROGRAM_BACKENDS:
        lines.append(
            f"  XLA: most optimisations off for every check ({jax.default_backend()}: the same "
            "optimised program, its code generated without LLVM's optimisation; "
            "--full-optimization: all)"
        )
    else:
        lines.append(
            f"  XLA: full optimisation for the {FULLY_OPTIMIZED} checks, most of it off for the "
            "others (--full-optimization: all)"
        )
    return lines


# --- collection -----------------------------------------------------------------------------------


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
    path = Path(collection_path)
    if not _in_suite(path.parent):
        return None
    _activate(config)  # collecting inside the suite: it is asked for
    if path.parent.resolve() != SUITE:
        return None
    if path.name == "test_pairwise.py":
        return len(_impls(config)) < 2 or None
    if path.name == "meta_tests" and path.is_dir():
        return not _named_explicitly(path.resolve(), config) or None
    return None


def pytest_collect_file(file_path, parent) -> None:
    if _in_suite(file_path):  # a module of the suite named directly on the command line
        _activate(parent.config)


def _is_suite_item(item: pytest.Item) -> bool:
    return _in_suite(item.path)


def _is_check(item: pytest.Item) -> bool:
    """A check of the suite (a test in one of its own modules, not in its meta tests)."""
    return Path(item.path).resolve().parent == SUITE


def _layer(item: pytest.Item) -> str:
    return layers.layer_of(Path(item.path).stem)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the suite's checks by layer, and mark (or, with fewer than two implementations under
    test, deselect) the checks of a pair of implementations (``-m pairwise``)."""
    state = _state(config)
    if state is None or not state.active or not any(_is_suite_item(i) for i in items):
        return
    single = len(_impls(config)) < 2
    kept, dropped = [], []
    for item in items:
        pairwise = _is_suite_item(item) and "impl_pair" in getattr(item, "fixturenames", ())
        if pairwise:
            item.add_marker("pairwise")
        (dropped if pairwise and single else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    # a stable sort of the checks among the places they hold: other tests stay where they are
    places = [i for i, item in enumerate(items) if _is_check(item)]
    ordered = sorted((items[i] for i in places), key=lambda item: layers.RANK[_layer(item)])
    for place, item in zip(places, ordered, strict=True):
        items[place] = item
    _apply_suite_settings(config, [item for item in items if _is_suite_item(item)])


def _apply_suite_settings(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite's hypothesis settings over those each of its property tests would otherwise have
    (whatever profile was current when its module was imported): the user's own tests keep
    theirs, and a profile named with hypothesis's own ``--hypothesis-profile`` applies as it is.
    Under ``ci`` the property tests draw their static settings from the pool of
    :mod:`cvae_rosetta.conformance.strategies` (so each compiles at most three times); under any
    other profile they draw them freely."""
    tests = []
    for item in items:
        test = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if getattr(test, "is_hypothesis_test", False) and test not in tests:
            tests.append(test)
    if not tests:
        return
    from hypothesis import settings

    from cvae_rosetta.conformance import strategies

    named = config.getoption("hypothesis_profile", None)
    name = _profile_name(config)
    # static settings (shapes, loss, optimiser) from the pool under ci, drawn freely otherwise
    strategies.draw_settings_from_pool(name == "ci")
    if named is not None:
        return
    chosen = None  # a profile of the user's own, named by the environment: as it is
    if name not in PROFILES:
        try:
            chosen = settings.get_profile(name)
        except Exception as err:
            raise pytest.UsageError(f"hypothesis profile {name!r}: {err}") from None
    for test in tests:
        original = test.__dict__.setdefault(
            "_cvae_rosetta_settings", test._hypothesis_internal_use_settings
        )
        test._hypothesis_internal_use_settings = chosen or settings(
            original, **profile_settings(name)
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not {"impl", "impl_pair"} & set(metafunc.fixturenames):
        return
    if not _in_suite(metafunc.definition.path):  # a fixture of that name elsewhere is not ours
        return
    _activate(metafunc.config)
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


# --- running the suite's tests --------------------------------------------------------------------


@contextlib.contextmanager
def _jax_settings(item: pytest.Item):
    """JAX's settings for the suite's own tests, the previous ones back afterwards:

    - float32 matmuls at full precision (no TF32 or bfloat16 passes on accelerators), so the
      suite's tolerances are those of float32 arithmetic wherever it runs;
    - XLA's optimisation: most of it off, except under --full-optimization and, off the CPU,
      for checks marked ``fully_optimized`` (see :func:`fully_optimized`). Off, a program compiles
      in about half the time; on the CPU it is the same optimised program, its code generated by
      LLVM without optimisation, which rounds within the float32 tolerances the checks allow.
      Programs compiled either way are kept apart in every cache."""
    state = _state(item.config)
    if state is None or not state.active or not _is_suite_item(item):
        yield
        return
    import jax

    values = getattr(jax.config, "values", {})
    wanted = {
        PRECISION: "highest",
        OPTIMIZATIONS: not fully_optimized(
            marked=item.get_closest_marker(FULLY_OPTIMIZED) is not None,
            everything=state.full_optimization,
            backend=jax.default_backend(),
        ),
    }
    before = {
        name: values[name] if name in values else getattr(jax.config, name) for name in wanted
    }
    for name, value in wanted.items():
        jax.config.update(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)


def _earlier_failure(item: pytest.Item, state: _State) -> str | None:
    """With --first-layer: the earliest layer before ``item``'s in which one of its
    implementations failed."""
    if not state.first_layer or not state.active or not _is_check(item):
        return None
    rank = layers.RANK[_layer(item)]
    failed = [state.failed_rank.get(name, rank) for name, _ in _names_of(item)]
    earliest = min(failed, default=rank)
    return layers.NAMES[earliest] if earliest < rank else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    state = _state(item.config)
    if state is not None:
        earlier = _earlier_failure(item, state)
        if earlier is not None:  # before any fixture is set up, reported at the check's line
            raise pytest.skip.Exception(f"{EARLIER}: {earlier}", _use_item_location=True)
    with _jax_settings(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _jax_settings(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    with _jax_settings(item):
        result = yield
    state = _state(item.config)
    if state is None or not state.active:
        return result
    if item in _last_of_their_module(item.session, state) or near_the_mapping_limit():
        release_compiled_programs()
    return result


def _last_of_their_module(session: pytest.Session, state: _State) -> set[pytest.Item]:
    """The suite's items that are the last of their module in the session's final order."""
    if state.last_of_module is None:
        last = {}
        for item in session.items:
            if _is_suite_item(item):
                last[getattr(item, "module", None)] = item
        state.last_of_module = set(last.values())
    return state.last_of_module


# --- the machine-readable report (cvae_rosetta.conformance.report) --------------------------------


def _names_of(item: pytest.Item) -> list[tuple[str, str]]:
    return names_of(item, item.config.stash.get(_IMPLS_KEY, {}))


UNWRITTEN = (
    "the implementation is not written there yet (it raises NotImplementedError): fill that part "
    "in (docs/own_implementation.md) and run the suite again; the suite stops here, since every "
    "later check would fail on the same line"
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        # a template not filled in: one short failure and the end of the session, not thousands
        # of lines of the same traceback in every check
        report.longrepr = f"{call.excinfo.exconly()}\n{UNWRITTEN}"
        item.session.shouldstop = "an implementation that raises NotImplementedError"
    state = _state(item.config)
    if state is None or not state.active or not _is_check(item):
        return report
    if report.when == "call" or (report.when == "setup" and not report.passed):
        status, message = outcome(report)
        state.owners[item.nodeid] = owner_of(item, item.config.stash.get(_IMPLS_KEY, {}))
        if is_reference_check(item):
            state.reference[reference_name(item)] = status
        layer = _layer(item)
        for name, check in _names_of(item):
            state.results.setdefault(name, {})[check] = status
            entry = {"outcome": status, "layer": layer}
            if message is not None:
                entry["message"] = message
            checks = state.checks.setdefault(name, {})
            checks.pop(check, None)  # in the order they ran
            checks[check] = entry
            if status == "failed":
                rank = layers.RANK[layer]
                state.failed_rank[name] = min(state.failed_rank.get(name, rank), rank)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = _state(config)
    if state is None or not state.owners:  # none of the suite's checks ran
        return
    report = contents(config.stash.get(_IMPLS_KEY, {}), state)
    path = Path(config.getoption("conformance_report")).expanduser()
    write_json(path, report, sort_keys=True, newline=False, parents=True)
    state.written = str(path)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if state is None or state.written is None:
        return
    terminalreporter.section("cvae-rosetta conformance")
    if _header_hidden(config):  # the header's lines naming the implementations, once
        for name, impl in config.stash.get(_IMPLS_KEY, {}).items():
            terminalreporter.write_line(_impl_line(name, impl))
    for line in summary_lines(state.results, state.reference, state.owners):
        terminalreporter.write_line(line)
    for name, checks in state.checks.items():
        found = diagnosis(checks)
        if found is not None:
            terminalreporter.write_line(diagnosis_line(name, found), red=True, bold=True)
    terminalreporter.write_line(f"report: {state.written}")
