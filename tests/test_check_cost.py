"""What the whole check costs (``benchmarks/check_cost.py``): tox's closing lines read back, the
committed record of the last whole run covers every environment of ``tox.ini``, ``env_list`` runs
the longest first, and docs/conformance.md shows what the record renders."""

from __future__ import annotations

import json
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
    assert [row.split(" | ")[0] for row in rows[2:5]] == ["| `unit`", "| `docs`", "| `lint`"]
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


def test_env_list_starts_the_longest_first():
    """So that the two cores of ``tox -p auto`` stay busy to the end; lint (under a second) is
    last. Re-order tox.ini's env_list after a new record that changes the order."""
    seconds = recorded()["envs"]
    order = [env for env in check_cost.env_list() if env != "lint"]
    want = sorted(order, key=lambda env: -seconds[env]["seconds"])
    assert order == want, f"tox.ini env_list: expected {want} (the record's longest first)"


def test_the_page_shows_what_the_record_renders():
    text = check_cost.DOC.read_text(encoding="utf-8")
    shown = text.partition(check_cost.BEGIN)[2].partition(check_cost.END)[0]
    assert shown == "\n" + check_cost.block(recorded()), (
        "docs/conformance.md: run python benchmarks/check_cost.py render"
    )
