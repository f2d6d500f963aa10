"""The machine-readable report of a run of the suite, and the diagnosis in it.

Per implementation and per check, its outcome: ``passed``, ``failed``, ``skipped``, ``skipped:
earlier layer failed`` (``--first-layer``) or ``not applicable`` (a check of a capability the
implementation does not have, see :func:`cvae_rosetta.conformance.assertions.require`); every
check's layer, in the order the checks ran, and for a failure what it saw, as a sentence
(:func:`plain_message`); each implementation's diagnosis (:func:`diagnosis`: the first failed
check of the earliest layer that failed, the one to fix first); the outcomes of the checks of the
suite's own reference, which take no implementation; and the versions behind each
implementation. The plugin records the outcomes as the checks run and writes the report
(:func:`contents`) at the end of the session.
"""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

import pytest

from cvae_rosetta.conformance import layers

NOT_APPLICABLE = "not applicable"
EARLIER = "an earlier layer failed"  # the reason of a check skipped by --first-layer: EARLIER: L
SKIPPED_EARLIER = "skipped: earlier layer failed"  # its outcome in the report
NO_MESSAGE = "the check's assertion failed without a message"
STATUSES = ("passed", "failed", "skipped", SKIPPED_EARLIER, NOT_APPLICABLE)
# Whom a case counts for beside an implementation: a check of the suite's own float64 reference
# (one that takes no implementation), or a pair of implementations (counted under both).
REFERENCE = "the suite's own reference"
PAIR = "a pair"


def check_of(item: pytest.Item) -> str:
    """A test item's check: its function's name (``TestClass::name`` in a class), without its
    parameters, from the item, not its node id: a module outside the rootdir has no path in its
    node id."""
    check = getattr(item, "originalname", item.name.split("[")[0])
    if getattr(item, "cls", None) is not None:
        check = f"{item.cls.__name__}::{check}"
    return check


def is_reference_check(item: pytest.Item) -> bool:
    """Whether a check of the suite tests the suite's own reference, not an implementation: one
    that asks for neither the ``impl`` nor the ``impl_pair`` fixture."""
    return not {"impl", "impl_pair"} & set(getattr(item, "fixturenames", ()))


def reference_name(item: pytest.Item) -> str:
    """The report's name of a check of the suite's own reference (``test_properties.py::...``)."""
    return f"{Path(item.path).name}::{check_of(item)}"


def owner_of(item: pytest.Item, impls: dict) -> str:
    """Whom a case of the suite counts for: the name of its implementation, :data:`PAIR` for a
    pairwise case (counted under both), :data:`REFERENCE` for the suite's own reference."""
    if is_reference_check(item):
        return REFERENCE
    names = names_of(item, impls)
    return names[0][0] if len(names) == 1 else PAIR


def names_of(item: pytest.Item, impls: dict) -> list[tuple[str, str]]:
    """``(implementation, check id)`` pairs a test item reports for (``impls``: the
    implementations under test, by name)."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    by_id = {id(obj): name for name, obj in impls.items()}
    check, module = check_of(item), Path(item.path).name
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


_RAISED = re.compile(r"^([A-Za-z_][\w.]*)(?::(.*))?$")


def plain_message(text: str) -> str:
    """What a failure saw, as a sentence: the first meaningful line of its exception's message,
    without ``AssertionError:`` and without pytest's ``assert ...`` introspection (a bare
    ``assert`` gives :data:`NO_MESSAGE`)."""
    lines = [line.strip() for line in str(text).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return NO_MESSAGE
    first, rest = lines[0], lines[1:]
    raised = _RAISED.match(first)  # "SomeError: ..." or a bare "SomeError"
    if raised and (raised.group(2) is not None or raised.group(1)[:1].isupper()):
        kind, said = raised.group(1).rpartition(".")[2], (raised.group(2) or "").strip()
    else:  # the text as it is
        kind, said = "", first
    if kind in ("AssertionError", "Failed", ""):
        if not said and rest and not rest[0].startswith(("assert ", "+", "where ")):
            said = rest[0]  # numpy.testing: "AssertionError: \nNot equal to tolerance ..."
        if not said or said.startswith("assert ") or said == "assert":
            return NO_MESSAGE
    else:  # another exception: what it was raised with
        said = f"raised {kind}" + (f": {said}" if said else "")
    return said if len(said) <= 300 else said[:297] + "..."


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return plain_message(crash.message)
    if isinstance(report.longrepr, tuple):
        return plain_message(str(report.longrepr[-1]))
    return plain_message(str(report.longrepr))


def outcome(report: pytest.TestReport) -> tuple[str, str | None]:
    """A check's outcome from pytest's report of its call (or of a setup that did not pass), and
    for a failure, what it saw (:func:`plain_message`)."""
    message = None
    if report.passed:
        status = "passed"
    elif report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if NOT_APPLICABLE in reason:
            status = NOT_APPLICABLE
        elif reason.startswith(f"Skipped: {EARLIER}") or reason.startswith(EARLIER):
            status = SKIPPED_EARLIER
        else:
            status = "skipped"
    else:
        status, message = "failed", _message(report)
    return status, message


def diagnosis(checks: dict[str, dict]) -> dict | None:
    """The failure to fix first among an implementation's failures (``check -> {"outcome",
    "layer", "message"}`` in the order they ran): the first failed check of the earliest layer
    that failed. The others are counted, not explained: they may follow from it, or be failures
    of their own."""
    failed = [(check, e) for check, e in checks.items() if e["outcome"] == "failed"]
    if not failed:
        return None
    check, entry = min(failed, key=lambda f: layers.RANK[f[1]["layer"]])  # the first of the lowest
    return {
        "layer": entry["layer"],
        "layer_description": layers.describe(entry["layer"]),
        "check": check,
        "message": entry.get("message") or NO_MESSAGE,
        "later_failures": len(failed) - 1,
    }


def diagnosis_line(name: str, found: dict) -> str:
    later = found["later_failures"]
    follow = (
        "the suite stopped there, the rest not run"  # plugin.UNWRITTEN: a part not written yet
        if "raised NotImplementedError" in found["message"]
        else "no later failures"
        if not later
        else "1 later failure (fix this one first: it may follow from it)"
        if later == 1
        else f"{later} later failures (fix this one first: they may follow from it)"
    )
    check = found["check"].rpartition("::")[2]
    return (
        f"cvae-rosetta diagnosis: {name}: layer {found['layer']!r} ({found['layer_description']}): "
        f"{check}: {found['message']}; {follow}"
    )


def counts(outcomes: dict[str, str]) -> str:
    """``"160 passed, 3 not applicable"``: how many cases had each outcome, in the order of
    :data:`STATUSES`, the outcomes none had left out."""
    values = list(outcomes.values())
    return ", ".join(f"{values.count(s)} {s}" for s in STATUSES if s in values)


def summary_lines(results: dict, reference: dict, owners: dict[str, str]) -> list[str]:
    """The terminal summary's counts: a line per implementation (``results``: implementation ->
    case -> outcome), one for the checks of the suite's own reference (``reference``: case ->
    outcome) when any ran, and, where there is more than one line, the total as pytest counts it
    (``owners``: each case's node id -> :func:`owner_of`): a pairwise case is one case for pytest
    but appears under both of its implementations."""
    lines = [f"{name}: {counts(outcomes)}" for name, outcomes in results.items()]
    if reference:
        lines.append(f"{REFERENCE}: {counts(reference)}")
    if len(lines) < 2:
        return lines
    tally = {name: 0 for name in results}
    for owner in owners.values():
        tally[owner] = tally.get(owner, 0) + 1
    pairs, own = tally.pop(PAIR, 0), tally.pop(REFERENCE, 0)
    alone = " alone" if pairs else ""
    parts = [f"{n} of {name}{alone}" for name, n in tally.items() if n]
    if pairs:
        parts.append(f"{pairs} of pairs of implementations (each counted above under both)")
    if own:
        parts.append(f"{own} of {REFERENCE}")
    listed = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    return [*lines, f"{len(owners)} cases of the suite in all, as pytest counts them: {listed}"]


def contents(impls: dict, state) -> dict:
    """The report of a run: ``impls``, the implementations under test by name (an exception for
    one that could not be loaded); ``state``, what the plugin knows of its session: ``results``
    (implementation -> check -> outcome), ``checks`` (implementation -> check -> ``{"outcome",
    "layer", "message"?}``, in the order they ran), ``reference`` (case -> outcome, for the checks
    of the suite's own reference, which take no implementation) and ``first_layer``."""
    import jax

    from cvae_rosetta.spec.protocol import framework_of

    described = {}
    for name, impl in impls.items():
        if isinstance(impl, Exception):
            continue
        framework, version = framework_of(impl)
        described[name] = {
            "name": impl.name,
            "framework": framework,
            "version": version,
            "diagnosis": diagnosis(state.checks.get(name, {})),
        }
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "python": platform.python_version(),
        "first_layer": state.first_layer,
        "layers": [{"name": n, "description": d} for n, d in layers.LAYERS],
        "implementations": described,
        "summary": {
            name: {s: sum(1 for v in checks.values() if v == s) for s in STATUSES}
            for name, checks in state.results.items()
        },
        "results": state.results,
        # the checks of the suite's own float64 reference, which take no implementation: pytest
        # counts their cases beside the implementations'
        "reference": {
            "results": state.reference,
            "summary": {s: sum(1 for v in state.reference.values() if v == s) for s in STATUSES},
        },
        # per implementation, every check in the order it ran, with its layer (a list: the keys
        # of the report are written sorted)
        "checks": {
            name: [{"check": check, **entry} for check, entry in checks.items()]
            for name, checks in state.checks.items()
        },
    }
