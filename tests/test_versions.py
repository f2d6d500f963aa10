"""The supported versions' table: what the last tox run recorded, rendered into docs/versions.md
and the README, and the record's two ends the ends of ``pyproject.toml``'s ranges."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import cvae_rosetta

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs_build"))

import versions as table  # noqa: E402  (docs_build/versions.py)

RECORD = json.loads(table.RESULTS.read_text())


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(found: dict[str, str | None] | None = None) -> list[Requirement]:
    """The base requirements, and those of every extra whose first distribution ``found`` (an
    environment's versions) has installed: Haiku's JAX range binds only where Haiku is. Without
    ``found``, the base requirements alone. The GPU extra is JAX's own range."""
    listed = list(PROJECT["dependencies"])
    for name, extra in PROJECT["optional-dependencies"].items():
        first = Requirement(extra[0])
        if found is not None and name != "cuda" and found.get(first.name):
            listed += extra
    return [Requirement(r) for r in listed if not r.startswith("cvae-rosetta")]


def test_the_pages_are_what_the_committed_record_renders(tmp_path):
    pages = []
    for page in table.PAGES:
        shutil.copy(page, tmp_path / page.name)
        pages.append(tmp_path / page.name)
    table.render(table.RESULTS, tuple(pages))
    for page, rendered in zip(table.PAGES, pages, strict=True):
        assert page.read_text() == rendered.read_text(), f"{page}: docs_build/versions.py render"
    assert table.table(RECORD) in table.PAGES[0].read_text()


def test_the_record_covers_every_environment_tox_runs():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    listed = [e.strip() for e in tox["tox"]["env_list"].replace("\n", " ").split(",")]
    assert list(RECORD["envs"]) == [e for e in listed if e and e != "lint"]
    assert list(RECORD["envs"]) == table.environments()
    assert {"unit", "pure_jax", "newest-pure_jax", "newest-faults"} <= set(RECORD["envs"])


def test_every_recorded_version_is_in_pyproject_s_ranges():
    for env, found in RECORD["envs"].items():
        for requirement in requirements(found):
            version = found.get(requirement.name)
            if version is not None:
                assert requirement.specifier.contains(version, prereleases=True), (
                    f"{env}: {requirement.name} {version} outside {requirement}"
                )


def test_the_two_ends_are_the_oldest_and_a_newer_jax():
    """The environments without a prefix run the lowest JAX the ranges admit; the newest ones a
    later JAX, which Haiku's extra does not admit (so none of them installs Haiku)."""
    lowest = min(
        Version(s.version)
        for r in requirements()
        if r.name == "jax"
        for s in r.specifier
        if s.operator == ">="
    )
    envs = RECORD["envs"]
    oldest = {Version(v["jax"]) for e, v in envs.items() if not e.startswith("newest-")}
    newest = {Version(v["jax"]) for e, v in envs.items() if e.startswith("newest-")}
    assert oldest == {lowest}
    assert min(newest) > lowest
    assert all(v["dm-haiku"] is None for e, v in envs.items() if e.startswith("newest-"))
    assert envs["haiku"]["dm-haiku"] is not None


def test_collect_refuses_a_partial_run(tmp_path):
    table.record("unit", tmp_path)
    others = ", ".join(env for env in table.environments() if env != "unit")
    with pytest.raises(SystemExit, match=f"got none for {re.escape(others)} "):
        table.collect(tmp_path)
    recorded = json.loads((tmp_path / "unit.json").read_text())
    assert recorded["env"] == "unit" and re.fullmatch(r"\d{4}-\d\d-\d\d", recorded["date"])
    assert list(recorded["versions"]) == ["python", *cvae_rosetta.STACK]
