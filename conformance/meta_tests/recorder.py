"""A pytest plugin that turns one session on many implementations into one run of the suite per
implementation (``-p`` in ``runner.command``).

``pytest --pyargs cvae_rosetta.conformance --impl A --impl B ...`` parametrises every check over
every implementation named. With this plugin the session runs them as if each had had its own
``pytest --pyargs cvae_rosetta.conformance --impl NAME``, but imports JAX and compiles the suite's
own eager operations once, not once per implementation:

- the pairwise checks (of two implementations together) are left out, as in a run on one;
- the implementations run one after the other, in the order named, except that the one named by
  ``--meta-reference`` runs last: whatever the others leave behind in the process (they should
  leave nothing: the suite's caches are keyed by the implementation itself) would show up as
  failures of the reference, which must pass everything;
- checks that take no implementation (the checker's own) run with the reference, and are left out
  of a session without one;
- each implementation's checks run in the order of the suite's layers
  (:mod:`cvae_rosetta.conformance.layers`), in the suite's order within a layer: the order the
  conformance plugin runs them in for a user, so the first failure is one of the earliest layer
  that fails, the cause the plugin's diagnosis names;
- with ``--meta-first-failure``, once a check of an implementation has failed while running (not
  while setting up), its remaining checks are not run: ``pytest -x``, per implementation (every
  earlier layer has passed by then). They are recorded as ``stopped`` without going through
  pytest's run of a test at all (no setup, no report, no line of output), only the fixtures the
  last check left behind torn down as its own teardown would have: skipping each through pytest
  cost about 9 ms, some 10,000 times in a run of every broken implementation;
- one process compiles what a session's many implementations need, and on Linux every compiled
  executable holds memory mappings, of which a process may have ``vm.max_map_count`` (65530 by
  default); XLA aborts the process when it runs out. So when, after a check, the process holds
  more than half of them, the plugin calls ``jax.clear_caches()`` (what is compiled again later
  costs time, nothing else);
- ``--meta-record PATH`` gets a JSON-lines record, written as the session goes: the checks
  collected for each implementation (in the suite's order), then every check's outcome, duration,
  layer and failure (with the first line of its message as the plugin's diagnosis shows it),
  collection errors, and the exit status at the end. ``runner`` reads it back into one
  ``SuiteRun`` per implementation.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from cvae_rosetta.conformance import compilation, layers
from cvae_rosetta.conformance.meta_tests.runner import check_id, layer_of_check


class _State:
    """This process's session (a process runs one)."""

    def __init__(self, config: pytest.Config) -> None:
        path = config.getoption("meta_record")
        self.record = Path(path) if path else None
        self.first_failure = bool(config.getoption("meta_first_failure"))
        self.targets = [n.strip() for o in config.getoption("impl") for n in o.split(",")]
        self.targets = [n for n in self.targets if n]
        self.reference = config.getoption("meta_reference")
        if self.reference is not None and self.reference not in self.targets:
            raise pytest.UsageError(f"--meta-reference {self.reference}: not one of the --impl")
        self.items: dict[str, tuple[str | None, str]] = {}  # nodeid -> (target or None, check)
        self.phases: dict[str, list[pytest.TestReport]] = {}  # nodeid -> its reports so far
        self.independent: list[str] = []  # nodeids of the checks that take no implementation
        self.caught: set[str] = set()
        self.mapping_limit = compilation.mapping_limit()
        self.start = time.time()

    def write(self, **event) -> None:
        if self.record is not None:
            with self.record.open("a") as f:
                f.write(json.dumps(event) + "\n")


_SESSION: list[_State] = []


def _keep_within_the_mapping_limit(state: _State) -> None:
    before = compilation.mappings()
    if before is None or before <= state.mapping_limit // 2:
        return
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    state.write(
        event="caches_cleared", mappings_before=before, mappings_after=compilation.mappings()
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cvae-rosetta meta tests")
    group.addoption(
        "--meta-record", metavar="PATH", help="write the JSON-lines record of this session here"
    )
    group.addoption(
        "--meta-first-failure",
        action="store_true",
        help="stop each implementation at its first failing check (-x, per implementation)",
    )
    group.addoption(
        "--meta-reference",
        metavar="NAME",
        help="the implementation (one of --impl) that runs last, with the checks that take none",
    )


def pytest_configure(config: pytest.Config) -> None:
    state = _State(config)
    if state.record is not None:
        state.record.parent.mkdir(parents=True, exist_ok=True)
        state.record.write_text("")
    _SESSION[:] = [state]
    state.write(event="start", targets=state.targets, reference=state.reference)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed and _SESSION:
        error = f"{report.nodeid or '(session)'}: {str(report.longrepr)[-2000:]}"
        _SESSION[0].write(event="collection_error", error=error)


def _target_ids(targets: list[str]) -> dict[int, str]:
    """``id(implementation) -> name``: ``load`` returns the very objects the conformance plugin
    parametrises with (module attributes)."""
    from cvae_rosetta.spec.errors import CvaeError
    from cvae_rosetta.spec.protocol import load

    found = {}
    for target in targets:
        # one that cannot be loaded: the conformance plugin stops the session with a usage error
        with contextlib.suppress(CvaeError):
            found[id(load(target))] = target
    return found


@pytest.hookimpl(trylast=True)  # after the conformance plugin and pytest's own deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = _SESSION[0]
    by_id = _target_ids(state.targets)
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        takes_impl = "impl" in params
        if "impl_pair" in getattr(item, "fixturenames", ()) or (
            not takes_impl and state.reference is None
        ):
            dropped.append(item)
            continue
        target = by_id.get(id(params["impl"])) if takes_impl else None
        if takes_impl and target is None:
            raise pytest.UsageError(f"meta tests: which implementation is {item.nodeid}?")
        # recorded under the reference's name, checks of no implementation keep their parameters
        check = check_id(item.module.__name__, item.name, target)
        state.items[item.nodeid] = (target or state.reference, check)
        if not takes_impl:
            state.independent.append(item.nodeid)
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)

    order = {target: rank for rank, target in enumerate(state.targets)}
    order[state.reference] = len(order)

    def key(indexed: tuple[int, pytest.Item]) -> tuple[int, int, int]:
        index, item = indexed
        target, check = state.items[item.nodeid]
        return order[target], layers.RANK[layer_of_check(check)], index

    items[:] = [item for _, item in sorted(enumerate(kept), key=key)]
    checks: dict[str, list[str]] = {target: [] for target in state.targets}
    for item in kept:  # in the suite's order, not the order they run in
        target, check = state.items[item.nodeid]
        checks[target].append(check)
    independent = [state.items[nodeid][1] for nodeid in state.independent]
    state.write(event="collected", checks=checks, independent=independent)


@pytest.hookimpl(tryfirst=True)  # in place of pytest's own protocol, for a check not run
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    state = _SESSION[0]
    target, check = state.items.get(item.nodeid, (None, ""))
    if target is None or target not in state.caught:
        return None  # pytest runs it
    # what the previous check kept for this one (its module's fixtures, say) and the next one
    # does not need is torn down, as this check's own teardown would have done
    item.session._setupstate.teardown_exact(nextitem)
    state.write(
        event="check",
        target=target,
        check=check,
        outcome="stopped",
        layer=layer_of_check(check),
        seconds=0.0,
    )
    return True


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[-1])
    return str(report.longrepr)


def first_line(message: str) -> str:
    """The failure as the conformance plugin's diagnosis shows it: its message's first meaningful
    line, without ``AssertionError:`` (``plain_message`` of the report, where it has one)."""
    try:
        from cvae_rosetta.conformance.report import plain_message
    except ImportError:
        plain_message = None
    if plain_message is not None:
        return plain_message(message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0].removeprefix("AssertionError: ") if lines else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    state = _SESSION[0] if _SESSION else None
    if state is None or report.nodeid not in state.items:
        return
    target, check = state.items[report.nodeid]
    phases = state.phases.setdefault(report.nodeid, [])
    phases.append(report)
    if state.first_failure and target is not None and report.when == "call" and report.failed:
        state.caught.add(target)
    if report.when != "teardown":
        return
    del state.phases[report.nodeid]
    failed = [r for r in phases if r.failed]
    skipped = [r for r in phases if r.skipped]
    if failed:
        outcome = "failed"
    elif skipped:
        outcome = "skipped"
    else:
        outcome = "passed"
    event = {
        "event": "check",
        "target": target,
        "check": check,
        "outcome": outcome,
        "layer": layer_of_check(check),
        "seconds": round(sum(r.duration for r in phases), 4),
    }
    if failed:
        event |= {
            "when": failed[0].when,
            "message": _message(failed[0])[:2000],
            "first_line": first_line(_message(failed[0])),
            "text": failed[0].longreprtext[-3000:],
        }
    elif outcome == "skipped":
        event["message"] = _message(skipped[0])[:500]
    state.write(**event)
    _keep_within_the_mapping_limit(state)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = _SESSION[0]
    state.write(
        event="finish", exitstatus=int(exitstatus), seconds=round(time.time() - state.start, 2)
    )
