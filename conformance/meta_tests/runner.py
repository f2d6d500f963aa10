"""Run the conformance suite on implementations in a subprocess and read what each check did.

A run is the command a user types (``pytest --pyargs cvae_rosetta.conformance --impl TARGET``, the
suite's modules named one by one, pairwise checks left out), in a fresh interpreter so that nothing
of the meta tests' own process leaks into it. One such session runs the suite on many targets at
once (``--impl A --impl B ...``): the :mod:`~cvae_rosetta.conformance.meta_tests.recorder` plugin
runs them one after the other, each one's checks as a run of its own would (and, with
``first_failure``, stops each at its first failing check, like ``-x``), and records every check's
outcome per target, which this module reads back into one :class:`SuiteRun` per target. One session
instead of one per target imports JAX once and compiles the suite's own eager operations once, not
once per target: most of what a run stopped at its first failing check used to cost.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import cvae_rosetta.conformance as conformance
from cvae_rosetta import files
from cvae_rosetta.conformance import layers

# Per target of a session (a session's bound is this times its number of targets); the whole suite
# takes one to two minutes on two shared CPU cores.
TIMEOUT_S = float(os.environ.get("CVAE_META_TIMEOUT", "900"))
# More pytest arguments for every session (e.g. ``-k "not properties"``); the table needs every
# check, so the default is none. (Not ``-x``: it would stop the whole session, not one target.)
EXTRA_ARGS = tuple(shlex.split(os.environ.get("CVAE_META_PYTEST_ARGS", "")))
# How many sessions run side by side (the targets dealt out between them, see ``run_suites``).
WORKERS = int(os.environ.get("CVAE_META_WORKERS", "1"))
REPOSITORY = Path(conformance.__file__).resolve().parent.parent


@dataclasses.dataclass
class SuiteRun:
    """What one run of the suite on one target did. Check ids are ``module::test[params]``, the
    implementation's own part of the parameter id removed, so runs on different implementations
    compare."""

    target: str
    returncode: int | None  # None: timed out; 0 or 1 as ``pytest --impl TARGET`` would exit
    seconds: float  # the target's checks, setup and teardown included
    outcomes: dict[str, str]  # check -> passed, failed or skipped, in the suite's order
    collection_errors: list[str]
    output_tail: str
    # check -> {"when": setup, call or teardown, "message": the exception's message,
    # "first_line": its first line as the plugin's diagnosis shows it}
    failures: dict[str, dict] = dataclasses.field(default_factory=dict)
    not_run: list[str] = dataclasses.field(default_factory=list)  # stopped after a failure
    unfinished: list[str] = dataclasses.field(default_factory=list)  # collected, never reported
    independent: list[str] = dataclasses.field(default_factory=list)  # checks of no implementation

    def _with(self, outcome: str) -> list[str]:
        return [check for check, got in self.outcomes.items() if got == outcome]

    @property
    def passed(self) -> list[str]:
        return self._with("passed")

    @property
    def failed(self) -> list[str]:
        """Checks with a failure, or an error while setting up, running or tearing down."""
        return self._with("failed")

    @property
    def skipped(self) -> list[str]:
        return self._with("skipped")

    @property
    def checks(self) -> list[str]:
        return list(self.outcomes)

    @property
    def failed_while_running(self) -> list[str]:
        """Checks whose test itself failed (an assertion, or the implementation raising), not an
        error while setting up or tearing down."""
        return [c for c in self.failed if self.failures.get(c, {}).get("when") == "call"]

    @property
    def diagnosis(self) -> tuple[str, str, str] | None:
        """``(layer, check, first line of its message)`` of the cause, as the plugin names it: the
        first failed check (in the suite's order, which within a layer is the order they ran) of
        the earliest layer that failed; None when nothing failed."""
        if not self.failed:
            return None
        check = min(self.failed, key=lambda c: layers.RANK[layer_of_check(c)])
        return layer_of_check(check), check, self.failures.get(check, {}).get("first_line", "")

    @property
    def valid(self) -> bool:
        """The run went to its end: collected everything, no internal or usage error, every
        collected check reported (or left out after a failure, when stopping at the first)."""
        return (
            self.returncode in (0, 1)
            and not self.collection_errors
            and not self.unfinished
            and bool(self.outcomes)
        )

    def save(self, path: Path, **extra) -> None:
        data = dataclasses.asdict(self) | extra
        files.write_json(path, data, indent=1)

    @classmethod
    def load(cls, path: Path) -> SuiteRun:
        data = json.loads(path.read_text())
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def check_id(classname: str, name: str, target: str | None) -> str:
    """``cvae_rosetta.conformance.test_loss`` + ``test_x[TARGET-mse-1.0]`` ->
    ``test_loss::test_x[mse-1.0]`` (``target`` None: a check that takes no implementation,
    parameters kept as they are)."""
    module = classname.rpartition(".")[2]
    base, bracket, params = name.partition("[")
    if bracket:
        params = params[:-1]
        for variant in (f"{target}-", f"-{target}", target) if target else ():
            if variant in params:
                params = params.replace(variant, "", 1)
                break
    return f"{module}::{base}" + (f"[{params}]" if params else "")


def layer_of_check(check: str) -> str:
    """The layer of a check id (``test_loss::test_x[mse-1.0]``)."""
    return layers.layer_of(check.partition("::")[0])


def label_of(target: str) -> str:
    """``cvae_rosetta.conformance.meta_tests.broken:kl_missing_half`` -> ``kl_missing_half``."""
    return target.rpartition(":")[2]


def modules() -> tuple[str, ...]:
    """Every per-implementation module of the suite (``test_pairwise``, of pairs, is not one), in
    the order of their layers (``layers.MODULES``), the order in which a user's run runs their
    checks."""
    return tuple(f"conformance.{m}" for m, layer in layers.MODULES.items() if layer != "pairwise")


def command(
    targets: list[str],
    record: Path,
    extra: tuple[str, ...] = (),
    *,
    first_failure: bool = False,
    reference: str | None = None,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        *modules(),
        *(f"--impl={target}" for target in targets),
        "-q",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "-p",
        "cvae_rosetta.conformance.meta_tests.no_shrink",
        "-p",
        "cvae_rosetta.conformance.meta_tests.recorder",
        f"--meta-record={record}",
        *(["--meta-first-failure"] if first_failure else []),
        *([f"--meta-reference={reference}"] if reference else []),
        *extra,
    ]


def read_record(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a timeout
            break
    return events


def runs_from_record(
    targets: list[str], events: list[dict], returncode: int | None, output: str
) -> dict[str, SuiteRun]:
    """One :class:`SuiteRun` per target of a session, from its record and exit status (``None``:
    timed out). In a session that did not end with 0 or 1, a target whose every check was
    reported before the end keeps its run; the others get the session's exit status (no valid
    run). The checks that take no implementation are the reference's (the record names it)."""
    collected: dict[str, list[str]] = {target: [] for target in targets}
    independent: list[str] = []
    reference = None
    errors: list[str] = []
    checks: dict[str | None, dict[str, dict]] = {}
    for event in events:
        kind = event.get("event")
        if kind == "start":
            reference = event.get("reference")
        elif kind == "collected":
            collected |= event["checks"]
            independent = event["independent"]
        elif kind == "collection_error":
            errors.append(event["error"])
        elif kind == "check":
            checks.setdefault(event["target"], {})[event["check"]] = event
    if not events:
        errors.append("the session wrote no record")
    elif not any(event.get("event") == "collected" for event in events):
        errors.append("the session collected nothing")
    session_ok = returncode in (0, 1)
    if not session_ok:
        last = next((e for e in reversed(events) if e.get("event") == "check"), None)
        crash = output.find("Fatal Python error")
        output = "".join(
            [
                f"the session ended with exit status {returncode}",
                f" after {last['check']} on {last['target']}" if last else "",
                "\n",
                output[crash : crash + 2000] if crash >= 0 else output[-3000:],
            ]
        )
    runs = {}
    for target in targets:
        own = checks.get(target, {})
        expected = collected.get(target, [])
        ordered = [c for c in expected if c in own] + [c for c in own if c not in expected]
        outcomes = {c: own[c]["outcome"] for c in ordered if own[c]["outcome"] != "stopped"}
        failures = {
            c: {
                "when": e.get("when"),
                "message": e.get("message", ""),
                "first_line": e.get("first_line", ""),
            }
            for c, e in own.items()
            if e["outcome"] == "failed"
        }
        texts = [f"{c} ({e['when']}):\n{e['text']}" for c, e in own.items() if "text" in e]
        tail = "\n\n".join(texts) if texts else ""
        if not session_ok or not texts:
            tail = f"{tail}\n--- session output ---\n{output[-3000:]}"
        finished = bool(expected) and all(c in own for c in expected)
        code = int(any(o == "failed" for o in outcomes.values()))
        if not (session_ok or finished):
            code = returncode
        runs[target] = SuiteRun(
            target=target,
            returncode=code,
            seconds=round(sum(e["seconds"] for e in own.values()), 2),
            outcomes=outcomes,
            collection_errors=list(errors),
            output_tail=tail[-4000:],
            failures=failures,
            not_run=[c for c, e in own.items() if e["outcome"] == "stopped"],
            unfinished=[c for c in expected if c not in own],
            independent=independent if target == reference else [],
        )
    return runs


def _environment(report: Path) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTEST_ADDOPTS", "CVAE_IMPL"):  # the run is exactly the command above
        env.pop(name, None)
    env["CVAE_CONFORMANCE_REPORT"] = str(report)
    return env


@dataclasses.dataclass(frozen=True)
class Options:
    """How each session of :func:`run_suites` runs: whether it stops each target at its first
    failing check, how long a target may take (the session's bound is this times its number of
    targets), and more pytest arguments."""

    first_failure: bool
    timeout: float
    extra: tuple[str, ...]


def _sessions(
    groups: list[list[str]], directory: Path, names: list[str], reference: str, options: Options
) -> dict[str, SuiteRun]:
    """Run one session per group, side by side; ``reference`` is the reference in the group that
    holds it."""
    first_failure, timeout, extra = options.first_failure, options.timeout, options.extra
    sessions = []
    for name, group in zip(names, groups, strict=True):
        record = directory / f"{name}.jsonl"
        record.unlink(missing_ok=True)
        log = (directory / f"{name}.log").open("w")
        own = reference if reference in group else None
        cmd = command(group, record, extra, first_failure=first_failure, reference=own)
        env = _environment(directory / f"{name}.report.json")
        proc = subprocess.Popen(
            cmd, cwd=REPOSITORY, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        sessions.append((group, record, log, proc, time.perf_counter() + timeout * len(group)))
    runs: dict[str, SuiteRun] = {}
    for group, record, log, proc, deadline in sessions:
        try:
            returncode = proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            returncode = None
        log.close()
        output = Path(log.name).read_text(errors="replace")
        if returncode is None:
            output = f"{output}\ntimed out after {timeout * len(group):.0f} s"
        runs |= runs_from_record(group, read_record(record), returncode, output)
    return runs


def run_suites(
    targets: list[str],
    directory: Path,
    *,
    first_failure: bool = False,
    timeout: float = TIMEOUT_S,
    extra=EXTRA_ARGS,
    workers: int = WORKERS,
) -> dict[str, SuiteRun]:
    """Run the suite on every target; leave each target's ``LABEL.json`` (see :func:`label_of`) and
    each session's record, output and conformance report in ``directory``. ``first_failure``: stop
    each target at its first failing check.

    ``targets[0]`` is the reference: it runs last in its session, with the checks that take no
    implementation. With ``workers`` > 1, that many sessions run side by side: the targets dealt
    out in turn, or, when stopping at the first failure (where the reference, which fails nothing,
    costs more than all the others together), the reference alone and the others dealt out.

    A session that crashes takes with it only the runs it had not finished: those run again, once,
    each in a fresh session of its own (a target that crashes that one too has no valid run)."""
    directory.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(workers, len(targets)))
    if workers == 1:
        groups = [list(targets)]
    elif first_failure:
        groups = [[targets[0]], *(targets[1 + i :: workers - 1] for i in range(workers - 1))]
    else:
        groups = [targets[i::workers] for i in range(workers)]
    options = Options(first_failure, timeout, tuple(extra))
    names = [f"session-{i}" for i in range(len(groups))]
    runs = _sessions(groups, directory, names, targets[0], options)
    crashed = [t for t in targets if runs[t].returncode not in (0, 1, None)]
    for i in range(0, len(crashed), workers):  # each alone, ``workers`` at a time
        again = crashed[i : i + workers]
        names = [f"session-again-{label_of(t)}" for t in again]
        runs |= _sessions([[t] for t in again], directory, names, targets[0], options)
    for target in targets:
        runs[target].save(directory / f"{label_of(target)}.json")
    return {target: runs[target] for target in targets}
