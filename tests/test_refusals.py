"""Every refusal in docs/cli.md's table, run again: the flag as typed, one line, status 2.

``docs_build/refusals.py`` holds the cases: commands as a user types them, each with the words its
line must start with. Each runs as its own process in a scratch folder. The checks are the
promise the CLI makes of a refusal: exit status 2, exactly one line on standard error, nothing on
standard output, no usage block, no traceback, nothing written; the line names the flag as typed
(the config field it sets in brackets, where it sets one). The table in docs/cli.md must be the one
the cases print now, word for word.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs_build"))

import refusals  # noqa: E402  (docs_build/refusals.py)


@pytest.fixture(scope="module")
def seen() -> list[refusals.Seen]:
    return refusals.run_all()


def test_every_case_is_one_line_naming_the_flag_as_typed(seen):
    problems = []
    for s in seen:
        want = f"cvae: error: {s.case.names}"
        if s.status != 2:
            problems.append(f"cvae {s.case.command}: status {s.status}, expected 2")
        if len(s.stderr.splitlines()) != 1 or s.stdout:
            problems.append(f"cvae {s.case.command}: printed more than one line: {s.stderr!r}")
        if not s.line.startswith(want):
            problems.append(f"cvae {s.case.command}: {s.line!r} does not start with {want!r}")
        if "usage:" in s.stderr or "Traceback" in s.stderr:
            problems.append(f"cvae {s.case.command}: a usage block or traceback: {s.stderr!r}")
        if s.written:
            problems.append(f"cvae {s.case.command}: wrote {', '.join(s.written)}")
    assert not problems, "\n".join(problems)


def test_the_table_in_docs_cli_md_is_what_the_cases_print(seen):
    assert refusals.masked(refusals.committed()) == refusals.masked(refusals.block(seen)), (
        "docs/cli.md's table of refusals is out of date: python docs_build/refusals.py"
    )


def test_the_inputs_a_careless_user_types_are_among_the_cases():
    commands = {case.command for case in refusals.CASES}
    for command in (
        "train --epochs 0",
        "train --devices 2",
        "train --max-steps 0",
        "train --decoder-dims -1,5",
        "train --compilation-cache x --no-compilation-cache",
        "train --epoch 3",
        "compare --impls ''",
        "train --config exits.py",
        "train --data mnist --data-dir damaged",
        "train --latent-dim 100000000",
        "launch --num-processes 1000 -- train",
        "train --epochs 99999999999999999999999",
    ):
        assert command in commands, command


def test_the_checks_see_another_flag_and_another_word():
    """The checks have teeth: a case whose line names another flag, and the masking of machine
    figures never hides a changed word."""
    case = refusals.Case("train --epochs 0", "--seed (train.seed)")
    got = refusals.run(case)
    assert got.status == 2 and not got.line.startswith(f"cvae: error: {case.names}")
    two, sixteen = refusals.masked("at most 2 cores"), refusals.masked("at most 16 cores")
    assert two == sixteen and two != refusals.masked("at least 2 cores")
