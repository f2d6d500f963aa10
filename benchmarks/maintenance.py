"""How each style's framework is maintained, from the package registry: the evidence the decision
table of docs/choosing.md gives beside its measured figures.

    python benchmarks/maintenance.py [--out benchmarks/results/maintenance.json] [--render]

For every distribution a built-in implementation names (``ABOUT["distribution"]``), PyPI's JSON
API (``https://pypi.org/pypi/NAME/json``) gives every release with its upload date; kept are the
final releases that are not yanked. Its project description (the README it was released with) is
searched for what the maintainers say of the project's state (:data:`STATEMENTS`): each sentence
found is kept word for word, with the release and address it was read from, and a distribution
whose description says nothing of it is recorded as saying nothing. The fetch date is in the file:
the figures are what the registry said that day, and ``--render`` (or ``benchmarks/render.py``)
puts them into the decision table without fetching again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import urllib.request
from pathlib import Path

import render

from cvae_rosetta.files import write_json
from cvae_rosetta.spec import registry

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "maintenance.json"
URL = "https://pypi.org/pypi/{name}/json"
# What a maintainer's statement about the project's state starts with, per distribution: the
# sentence that matches is kept whole (Markdown links and emphasis removed). A distribution with
# none listed, or whose description no longer matches, is recorded as saying nothing.
STATEMENTS = {
    "dm-haiku": (r"As of July 2023", r"Haiku will remain best-effort supported"),
    "flax": (r"Flax NNX evolved from",),
}
FINAL = re.compile(r"^\d+(\.\d+)*$")


def fetch(name: str) -> dict:
    with urllib.request.urlopen(URL.format(name=name), timeout=30) as response:
        return json.load(response)


def plain(markdown: str) -> str:
    """Markdown without links' targets, emphasis, quote marks and line breaks."""
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", markdown)
    text = re.sub(r"\[([^\]]+)\]", r"\1", text)
    text = re.sub(r"^\s*>\s?", "", text, flags=re.MULTILINE)
    text = re.sub(r"[*_]{1,2}|📣", "", text)
    return re.sub(r"\s+", " ", text).strip()


def statements(name: str, description: str) -> list[str]:
    text = plain(description)
    found = []
    for start in STATEMENTS.get(name, ()):
        m = re.search(re.escape(start) + r".*?[.:](?=\s|$)", text)
        if m:
            found.append(m[0])
    return found


def record(name: str, data: dict) -> dict:
    releases = []
    for version, files in data["releases"].items():
        kept = [f for f in files if not f.get("yanked")]
        if kept and FINAL.match(version):
            releases.append({"version": version, "date": min(f["upload_time"] for f in kept)[:10]})
    releases.sort(key=lambda r: r["date"])
    latest = data["info"]["version"]
    return {
        "distribution": name,
        "releases": releases,
        "statements": statements(name, data["info"].get("description") or ""),
        "searched": bool(STATEMENTS.get(name)),
        "source": f"https://pypi.org/project/{name}/{latest}/",
    }


def measure() -> dict:
    names = sorted({i.about.distribution for i in registry.known() if i.builtin})
    return {
        "fetched": datetime.date.today().isoformat(),
        "registry": "https://pypi.org",
        "distributions": {name: record(name, fetch(name)) for name in names},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--render", action="store_true", help="only render --out into the docs")
    args = parser.parse_args(argv)
    if not args.render:
        write_json(args.out, measure())
    return render.main(["--results", str(args.out.parent)])


if __name__ == "__main__":
    sys.exit(main())
