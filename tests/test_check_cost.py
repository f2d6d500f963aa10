"""What the whole check costs (``benchmarks/check_cost.py``): tox's closing lines read back, the
committed record of the last whole run covers every environment of ``tox.ini``, ``env_list`` keeps
two cores busy to the end, and docs/conformance.md shows what the record renders."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import check_cost  # noqa: E402

OUTPUT = """\
lint: OK \u2714 in 0.78 seconds
  lint: OK (0.78=setup[0.05]+cmd[0.52,0.21] seconds)
\x1b[31m  unit: FAIL code 1 (612.40=setup[40.10]+cmd[572.30] seconds)\x1b[39m
  docs: OK (301.00=setup[91.00]+cmd[20.00,190.00] seconds)
\x1b[31m  evaluation failed :( (655.12 seconds)\x1b[39m
"""


def test_tox_closing_lines_are_read_back():
    data = check_cost.parse(OUTPUT)
    assert data["tox_seconds"] == 655.12
    assert data["envs"]["unit"] == {
        "status": "FAIL code 1",
        "seconds": 612.4,
        "setup": 40.1,
        "commands": [572.3],
    }
    assert data["envs"]["docs"]["commands"] == [20.0, 190.0]
    rows = check_cost.table(data).splitlines()
    firsts = [row.split(" | ")[0] for row in rows[2:5]]
    assert firsts == ["| `tox -e unit`", "| `tox -e docs`", "| `tox -e lint`"]
    assert "| tox's wall time | 655 |" in check_cost.table(data)


def test_colours_are_ignored_and_a_run_cut_short_is_refused():
    coloured = "\x1b[32m  lint: OK (1.00=setup[0.50]+cmd[0.50] seconds)\x1b[0m\n"
    with pytest.raises(SystemExit, match="expected tox's closing summary"):
        check_cost.parse(coloured)
    data = check_cost.parse(coloured + "\x1b[32m  congratulations :) (2.00 seconds)\x1b[0m\n")
    assert data["envs"]["lint"]["seconds"] == 1.0 and data["tox_seconds"] == 2.0


def recorded() -> dict:
    return json.loads(check_cost.RESULTS.read_text(encoding="utf-8"))


def test_the_record_is_a_whole_run_of_every_environment():
    data = recorded()
    assert check_cost.missing(data) == [], "benchmarks/results/check_cost.json: record a whole run"
    assert set(data["envs"]) == set(check_cost.env_list())
    assert set(check_cost.purposes()) >= set(check_cost.env_list()), "each needs a description"


def test_env_list_keeps_both_cores_busy_to_the_end():
    """Started in ``env_list``'s order by two workers (``tox -p auto`` on two cores), the record's
    environments end within 5% of the soonest any order could (all the work shared evenly): the
    longest start first, and no core waits alone at the end. Re-order tox.ini's env_list when a
    new record says otherwise."""
    seconds = {env: value["seconds"] for env, value in recorded()["envs"].items()}
    order = check_cost.env_list()
    ends, soonest = check_cost.makespan(order, seconds), check_cost.bound(seconds)
    assert ends <= 1.05 * soonest, (
        f"tox.ini env_list: two cores end after {ends:,.0f} s with the record's times, against "
        f"{soonest:,.0f} s at best; start the longest environments first"
    )


def test_the_schedule_is_the_one_tox_keeps():
    seconds = {"a": 10.0, "b": 6.0, "c": 5.0, "d": 1.0}
    assert check_cost.makespan(["a", "b", "c", "d"], seconds) == 11.0
    assert check_cost.makespan(["d", "c", "b", "a"], seconds) == 15.0
    assert check_cost.bound(seconds) == 11.0 and check_cost.bound({"a": 9.0, "b": 1.0}) == 9.0


def test_the_page_shows_what_the_record_renders():
    text = check_cost.DOC.read_text(encoding="utf-8")
    shown = text.partition(check_cost.BEGIN)[2].partition(check_cost.END)[0]
    assert shown == "\n" + check_cost.block(recorded()), (
        "docs/conformance.md: run python benchmarks/check_cost.py render"
    )


SELECTED_BY_FILE = (
    "environment",
    "needs_flax",
    "needs_equinox",
    "needs_keras",
    "cross",
    "multidevice",
    "faults",
    "suite_runs",
    "docs",
    "outside",
)


def marks(source: str, marker: str) -> bool:
    """Whether a test module's source marks a test with ``marker``: ``pytest.mark.MARKER`` (a
    decorator, ``pytestmark``, ``marks=``), or the marker's name beside ``getattr(pytest.mark``."""
    if re.search(rf"\bmark\.{marker}\b", source):
        return True
    return "getattr(pytest.mark" in source and re.search(rf"[\"']{marker}[\"']", source) is not None


def test_a_marker_tox_selects_by_file_is_in_no_other_test_file():
    """The environments that run one marker's tests name the files that hold them (collecting
    every test module takes about 3 s of a session that runs a few tests): every file of tests/
    that names the marker is among them, in every command that selects it, so that no test of
    it is left out."""
    tox = (ROOT / "tox.ini").read_text(encoding="utf-8").replace("\\\n", " ")
    for marker in SELECTED_BY_FILE:
        naming = {
            path.name
            for path in (ROOT / "tests").glob("test_*.py")
            if path.name != Path(__file__).name and marks(path.read_text(), marker)
        }
        commands = [line for line in tox.splitlines() if f"-m {marker}" in line.split("#")[0]]
        assert commands, marker
        for command in commands:
            given = {word.rpartition("/")[2] for word in command.split() if word.endswith(".py")}
            assert given == naming, (marker, command, naming)
