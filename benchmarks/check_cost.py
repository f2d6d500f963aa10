"""What the whole check costs: each tox environment's wall time in a real ``tox -p auto``.

tox ends a run with a line per environment, ``  NAME: OK (SECONDS=setup[S]+cmd[C1,C2] seconds)``,
and the run's own wall time (``congratulations :) (SECONDS seconds)``). This script reads them from
the run's output:

    python benchmarks/check_cost.py table LOG     # print the table, longest first
    python benchmarks/check_cost.py record LOG    # keep it, and render the docs
    python benchmarks/check_cost.py render        # the docs from the kept file

``.ci/run`` keeps its run's output in ``.tox/ci-output.log``, its own whole time (installs
included) on the last line, which ``record`` reads (``--ci-seconds`` for a log without it).

``.ci/run`` prints the table at the end of every CI run. ``record`` writes
``benchmarks/results/check_cost.json`` (the committed record of the last whole run, on a fresh
clone, installs included) and puts the table between the markers of docs/conformance.md;
``tests/test_check_cost.py`` checks that the page is what the record renders and that the record
names every environment of ``tox.ini``. ``table`` needs nothing but Python itself (``.ci/run``'s
environment has tox alone).
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "check_cost.json"
DOC = ROOT / "docs" / "conformance.md"
BEGIN, END = "<!-- check-cost:begin -->", "<!-- check-cost:end -->"
REFERENCE = re.compile(r"\{\[([\w:.-]+)\]description\}")  # tox's {[testenv:NAME]description}
CI_LINE = re.compile(r"^tests finished in (?P<seconds>\d+) s")  # .ci/run's last line
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ENV_LINE = re.compile(
    r"^  (?P<env>[\w.-]+): (?P<status>OK|FAIL code -?\d+|SKIP[^(]*|[A-Z][^(]*?) "
    r"\((?P<seconds>[\d.]+)(?:=setup\[(?P<setup>[\d.]+)\]\+cmd\[(?P<cmd>[\d.,]*)\])? seconds\)$"
)
TOTAL_LINE = re.compile(
    r"^  (congratulations :\)|evaluation failed :\() \((?P<seconds>[\d.]+) seconds\)$"
)


def parse(text: str) -> dict:
    """Every environment's status and seconds (``setup``: creating it and installing into it;
    ``commands``: each command's), and tox's own wall time, from a tox run's output. Refuses an
    output without tox's closing lines (a run cut short)."""
    envs: dict[str, dict] = {}
    total = ci = None
    for raw in text.splitlines():
        line = ANSI.sub("", raw).rstrip()
        if match := ENV_LINE.match(line):
            cmd = match["cmd"]
            envs[match["env"]] = {
                "status": match["status"].strip(),
                "seconds": float(match["seconds"]),
                "setup": None if match["setup"] is None else float(match["setup"]),
                "commands": [float(c) for c in cmd.split(",") if c] if cmd else [],
            }
        elif match := TOTAL_LINE.match(line):
            total = float(match["seconds"])
        elif match := CI_LINE.match(line):
            ci = float(match["seconds"])
    if not envs or total is None:
        raise SystemExit(
            "check_cost: expected tox's closing summary (a line per environment, then "
            "'congratulations' or 'evaluation failed' with the run's seconds), got none"
        )
    return {"tox_seconds": total, "ci_seconds": ci, "envs": envs}


def purposes() -> dict[str, str]:
    """Each environment's one-line ``description`` in tox.ini (its purpose)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    found = {}
    for section in tox.sections():
        if section.startswith("testenv:") and "description" in tox[section]:
            text = " ".join(tox[section]["description"].split())
            found[section.removeprefix("testenv:")] = REFERENCE.sub(
                lambda m: " ".join(tox[m[1]]["description"].split()), text
            )
    return found


def env_list() -> list[str]:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    listed = tox["tox"]["env_list"].replace("\n", " ").split(",")
    return [name.strip() for name in listed if name.strip()]


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def table(data: dict, *, with_purpose: bool = False) -> str:
    """The Markdown table, longest environment first, then the sum of the environments and tox's
    wall time (``-p auto`` runs as many at once as there are cores)."""
    described = purposes() if with_purpose else {}
    envs = sorted(data["envs"].items(), key=lambda item: -item[1]["seconds"])
    header = [
        "environment",
        *(["what it proves"] if with_purpose else []),
        "wall s",
        "setup s",
        "result",
    ]
    rows = []
    for name, env in envs:
        purpose = [described.get(name, "")] if with_purpose else []
        rows.append(
            [
                f"`tox -e {name}`",
                *purpose,
                seconds(env["seconds"]),
                seconds(env["setup"]),
                env["status"],
            ]
        )
    blank = [""] if with_purpose else []
    total = sum(env["seconds"] for env in data["envs"].values())
    rows.append(["sum of the environments", *blank, seconds(total), "", ""])
    rows.append(["tox's wall time", *blank, seconds(data["tox_seconds"]), "", ""])
    if data.get("ci_seconds") is not None:
        rows.append(["`.ci/run`, installs included", *blank, seconds(data["ci_seconds"]), "", ""])
    marks = ["---", *(["---"] if with_purpose else []), "---:", "---:", "---"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def block(data: dict) -> str:
    """What goes between the page's markers."""
    return (
        "Measured by `python benchmarks/check_cost.py record .tox/ci-output.log` from "
        f"`bash .ci/run` on a fresh clone ({data['cores']} CPU cores, {data['date']}); setup is "
        f"creating the environment and installing into it.\n\n{table(data, with_purpose=True)}"
    )


def render(data: dict) -> None:
    """The record's table between the page's markers (as the other result pages are written;
    imported here, so that ``table`` needs nothing installed)."""
    from cvae_rosetta.bench.markdown import write_between_markers

    write_between_markers(DOC, BEGIN, END, block(data).rstrip("\n"))


def makespan(order: list[str], seconds: dict[str, float], workers: int = 2) -> float:
    """When the last of ``order`` ends if ``workers`` run them, each taking the next as soon as
    it is free (as ``tox -p`` starts ``env_list``), with the measured ``seconds``."""
    free = [0.0] * workers
    for env in order:
        free.sort()
        free[0] += seconds[env]
    return max(free)


def bound(seconds: dict[str, float], workers: int = 2) -> float:
    """No order ends sooner: all of the work shared evenly, or the longest environment alone."""
    return max(sum(seconds.values()) / workers, max(seconds.values()))


def missing(data: dict) -> list[str]:
    """tox.ini's environments the record has no line for."""
    return [env for env in env_list() if env not in data["envs"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("table", help="print a run's table, longest environment first")
    show.add_argument("log", type=Path, help="the output of tox -p auto")
    keep = sub.add_parser("record", help="keep a whole run's table and render the docs")
    keep.add_argument("log", type=Path, help="the output of tox -p auto (every environment)")
    keep.add_argument(
        "--ci-seconds", type=float, default=None, help=".ci/run's whole time (default: its line)"
    )
    sub.add_parser("render", help="render the kept record into docs/conformance.md")
    args = parser.parse_args(argv)
    if args.command == "render":
        render(json.loads(RESULTS.read_text()))
        return 0
    data = parse(args.log.read_text(encoding="utf-8", errors="replace"))
    if args.command == "table":
        print(table(data), end="")
        return 0
    if absent := missing(data):
        raise SystemExit(
            f"{args.log}: expected a line for every environment of tox.ini, got none for "
            f"{', '.join(absent)} (record a whole run)"
        )
    from cvae_rosetta.files import write_json

    logged = data.pop("ci_seconds")  # .ci/run's own line; --ci-seconds wins over it
    data = {
        "date": datetime.date.today().isoformat(),
        "cores": os.cpu_count(),
        "ci_seconds": logged if args.ci_seconds is None else args.ci_seconds,
        **data,
    }
    write_json(RESULTS, data, indent=1)
    render(data)
    seconds = {env: value["seconds"] for env, value in data["envs"].items()}
    print(
        f"wrote {RESULTS.relative_to(ROOT)} and {DOC.relative_to(ROOT)}; tox.ini's env_list "
        f"ends after {makespan(env_list(), seconds):,.0f} s on two cores with these times, "
        f"no order before {bound(seconds):,.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
