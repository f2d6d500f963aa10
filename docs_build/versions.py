"""The versions each tox environment ran with: recorded by tox, collected, and rendered as the
table of docs/versions.md and the README.

    python docs_build/versions.py record ENV DIR      # tox runs it after each environment
    python docs_build/versions.py collect [--from .tox/versions] [--render]
    python docs_build/versions.py render

``record`` writes ``DIR/ENV.json``: the environment's Python and the version of every distribution
of ``cvae_rosetta.STACK`` installed in it (read from their metadata, nothing imported),
with the date. ``collect`` gathers those files into ``benchmarks/results/versions.json`` (the
committed record of the last tox run), refusing a set that lacks an environment of tox.ini's list;
``render`` writes the table between the markers of the pages. ``tests/test_versions.py`` checks
that the committed pages are what the committed record renders, and that the record's two ends
are the ends of ``pyproject.toml``'s ranges.
"""

from __future__ import annotations

import argparse
import configparser
import datetime
import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# cvae_rosetta's STACK and installed_versions() from the source tree (the package's __init__, which
# imports nothing): what an environment has installed is read the same way whatever version of
# the package it holds
PACKAGE = runpy.run_path(str(ROOT / "shared" / "__init__.py"))
# the frameworks' rows, by what the docs call them
LABELS = {"flax": "Flax", "dm-haiku": "Haiku", "equinox": "Equinox", "keras": "Keras 3"}
RESULTS = ROOT / "benchmarks" / "results" / "versions.json"
PAGES = (ROOT / "docs" / "versions.md", ROOT / "README.md")
BEGIN, END = "<!-- versions:begin -->", "<!-- versions:end -->"


def environments() -> list[str]:
    """tox.ini's environments, in its order, but lint (which runs none of the project's Python)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    listed = [name.strip() for name in tox["tox"]["env_list"].replace("\n", " ").split(",")]
    return [name for name in listed if name and name != "lint"]


def record(env: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{env}.json"
    today = datetime.date.today().isoformat()
    found = PACKAGE["installed_versions"]()
    path.write_text(json.dumps({"env": env, "date": today, "versions": found}, indent=1))
    return path


def collect(source: Path) -> dict:
    """The record of a whole tox run from its per-environment files; every shown environment
    must be there (a partial run is not the last tox run)."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(source.glob("*.json"))}
    shown = environments()
    missing = [env for env in shown if env not in found]
    if missing:
        raise SystemExit(
            f"{source}: expected a file for every environment of the table, got none for "
            f"{', '.join(missing)} (run the whole of tox first)"
        )
    dates = sorted(found[env]["date"] for env in shown)
    return {"date": dates[-1], "envs": {env: found[env]["versions"] for env in shown}}


def table(data: dict) -> str:
    """The Markdown table: a row per distribution, a column per end (the oldest: the environments
    without a prefix; the newest), each cell the version every environment of that end ran with
    (a framework's own environments only have it), or the versions where they differ."""
    envs = data["envs"]
    ends = {
        "oldest JAX (Python 3.11)": [e for e in envs if not e.startswith("newest-")],
        "newest (Python 3.12)": [e for e in envs if e.startswith("newest-")],
    }
    header = ["", *ends]
    rows = []
    for name in ("python", *PACKAGE["STACK"]):
        cells = []
        for members in ends.values():
            seen = sorted({envs[e][name] for e in members if envs[e].get(name)}, key=_order)
            cells.append(", ".join(seen) if seen else "not installed")
        label = "Python" if name == "python" else f"`{name}`"
        rows.append([f"{LABELS[name]} ({label})" if name in LABELS else label, *cells])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    runs = ", ".join(f"`{e}`" for e in envs)
    return f"Tested by tox on {data['date']}, in the environments {runs}:\n\n" + "\n".join(lines)


def _order(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.replace("-", ".").split("."))


def render(results: Path = RESULTS, pages: tuple[Path, ...] = PAGES) -> None:
    text = table(json.loads(results.read_text()))
    for page in pages:
        content = page.read_text()
        if BEGIN not in content or END not in content:
            raise SystemExit(f"{page}: no {BEGIN} ... {END} markers to write the table between")
        head, rest = content.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        page.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record", help="write ENV.json into DIR: this environment's versions")
    p.add_argument("env")
    p.add_argument("directory", type=Path)
    p = sub.add_parser("collect", help="gather a tox run's files into the committed record")
    p.add_argument("--from", dest="source", type=Path, default=ROOT / ".tox" / "versions")
    p.add_argument("--render", action="store_true", help="and render the pages")
    sub.add_parser("render", help="the pages' table from the committed record")
    args = parser.parse_args(argv)
    if args.command == "record":
        print("recorded", record(args.env, args.directory))
    elif args.command == "collect":
        RESULTS.write_text(json.dumps(collect(args.source), indent=1) + "\n")
        print("wrote", RESULTS)
        if args.render:
            render()
    else:
        render()
    return 0


if __name__ == "__main__":
    sys.exit(main())
