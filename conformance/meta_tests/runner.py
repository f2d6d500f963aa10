"""Run the conformance suite on one implementation in a subprocess and read what each check did.

The run is the command a user types (``pytest --pyargs conformance --impl TARGET``), in a fresh
interpreter so that a broken implementation cannot leak into the next run, with JUnit XML output:
the standard, stable record of every test case and its outcome.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import conformance

# Per suite run; the full suite takes one to two minutes on two shared CPU cores.
TIMEOUT_S = float(os.environ.get("CVAE_META_TIMEOUT", "900"))
# More pytest arguments for every run (e.g. ``-k "not properties"``); the table needs every check,
# so the default is none.
EXTRA_ARGS = tuple(shlex.split(os.environ.get("CVAE_META_PYTEST_ARGS", "")))
REPOSITORY = Path(conformance.__file__).resolve().parent.parent


@dataclasses.dataclass
class SuiteRun:
    """What one run of the suite did. Check ids are ``module::test[params]``, the implementation's
    own part of the parameter id removed, so runs on different implementations compare."""

    target: str
    returncode: int | None  # None: timed out
    seconds: float
    outcomes: dict[str, str]  # check -> passed, failed or skipped, in the order the suite ran them
    collection_errors: list[str]
    output_tail: str

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
    def valid(self) -> bool:
        """The suite ran to its end: collected everything, no internal or usage error."""
        return self.returncode in (0, 1) and not self.collection_errors and bool(self.outcomes)

    def save(self, path: Path, **extra) -> None:
        data = dataclasses.asdict(self) | extra
        path.write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> SuiteRun:
        data = json.loads(path.read_text())
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


def check_id(classname: str, name: str, target: str) -> str:
    """``conformance.test_spec`` + ``test_x[TARGET-mse-1.0]`` -> ``test_spec::test_x[mse-1.0]``."""
    module = classname.rpartition(".")[2]
    base, bracket, params = name.partition("[")
    if bracket:
        params = params[:-1]
        for variant in (f"{target}-", f"-{target}", target):
            if variant in params:
                params = params.replace(variant, "", 1)
                break
    return f"{module}::{base}" + (f"[{params}]" if params else "")


def parse_junit(path: Path, target: str) -> tuple[dict[str, str], list[str]]:
    """``(outcomes, collection_errors)`` of a JUnit XML file written by pytest."""
    outcomes: dict[str, str] = {}
    collection: list[str] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        kinds = {child.tag for child in case}
        errors = [child for child in case if child.tag == "error"]
        if any("collection failure" in (e.get("message") or "") for e in errors) or not classname:
            collection.append(f"{classname}::{name}" if classname else name)
            continue
        check = check_id(classname, name, target)
        if kinds & {"failure", "error"}:
            outcomes[check] = "failed"  # a teardown error after a pass is a second entry
        elif "skipped" in kinds:
            outcomes.setdefault(check, "skipped")
        else:
            outcomes.setdefault(check, "passed")
    return outcomes, collection


# The suite's modules, cheapest and most telling first: a run that stops at its first failure
# (``-x``) then ends within seconds for most bugs.
ORDERED = (
    "conformance.test_spec",
    "conformance.test_meta_gaps",
    "conformance.test_paths",
    "conformance.test_variants",
    "conformance.test_precision",
    "conformance.test_properties",
)


def command(target: str, junit: Path, extra: tuple[str, ...] = ()) -> list[str]:
    modules = ORDERED if "-x" in extra else ("conformance",)
    return [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        *modules,
        "--impl",
        target,
        "-q",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "-p",
        "conformance.meta_tests.no_shrink",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit2",
        *extra,
    ]


def run_suite(
    target: str, directory: Path, label: str, *, timeout: float = TIMEOUT_S, extra=EXTRA_ARGS
) -> SuiteRun:
    """Run the suite on ``target``; leave ``LABEL.xml`` and ``LABEL.json`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    junit = directory / f"{label}.xml"
    junit.unlink(missing_ok=True)
    env = dict(os.environ)
    for name in ("PYTEST_ADDOPTS", "CVAE_IMPL"):  # the run is exactly the command above
        env.pop(name, None)
    env["CVAE_CONFORMANCE_REPORT"] = str(directory / f"{label}.report.json")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command(target, junit, tuple(extra)),
            cwd=REPOSITORY,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        returncode = None
        partial = err.stdout or ""
        if isinstance(partial, bytes):
            partial = partial.decode(errors="replace")
        output = f"timed out after {timeout} s\n{partial}"
    seconds = time.perf_counter() - start
    if junit.exists():
        outcomes, collection = parse_junit(junit, target)
    else:
        outcomes, collection = {}, ["no JUnit XML written"]
    run = SuiteRun(target, returncode, seconds, outcomes, collection, output[-4000:])
    run.save(directory / f"{label}.json")
    return run
