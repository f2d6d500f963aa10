"""What installing the distribution puts on the import path: one name, ``cvae_rosetta``."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

DIST = "cvae-rosetta"


def installed() -> importlib.metadata.Distribution:
    """The installed distribution: the one with a ``RECORD`` of the files pip installed (a source
    tree's ``*.egg-info``, a by-product of building, may be on the path too and has none)."""
    found = [
        d
        for d in importlib.metadata.distributions()
        if d.metadata["Name"] == DIST and d.read_text("RECORD") is not None
    ]
    assert len(found) == 1, found
    return found[0]


def top_level_names() -> set[str]:
    """The importable names the installed distribution adds, from its own metadata: the first
    part of every file path it installed, or ``top_level.txt``, less the hooks of an editable
    install (a ``.pth`` file and its finder)."""
    dist = installed()
    names = set((dist.read_text("top_level.txt") or "").split())
    for path in dist.files or ():
        first = path.parts[0]
        if first.endswith((".dist-info", ".data")) or path.name.startswith("__editable__"):
            continue
        if len(path.parts) == 1 and path.suffix not in (".py", ".pth"):
            continue
        names.add(first.removesuffix(".py"))
    return {n for n in names if n and not n.startswith("__editable__") and n != ".."}


def test_the_distribution_adds_one_top_level_name():
    assert top_level_names() == {"cvae_rosetta"}


def test_packages_distributions_agree():
    owners = importlib.metadata.packages_distributions()
    ours = {
        name
        for name, dists in owners.items()
        if DIST in dists and not name.startswith("__editable__")
    }
    assert ours <= {"cvae_rosetta"}, ours


def test_every_entry_point_lives_under_the_namespace():
    dist = installed()
    points = list(dist.entry_points)
    assert {p.group for p in points} >= {"console_scripts", "cvae_rosetta.impls", "pytest11"}
    outside = [f"{p.group}: {p.name} = {p.value}" for p in points]
    outside = [line for line in outside if not line.split("= ")[1].startswith("cvae_rosetta.")]
    assert not outside, outside


@pytest.mark.parametrize("name", ["shared", "impls", "conformance"])
def test_the_old_generic_names_are_not_importable(name, tmp_path):
    """Run where no source folder of that name is on the path (a user's own would be theirs)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"No module named '{name}'" in done.stderr


def test_python_dash_m_runs_the_cli(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "cvae_rosetta", "impls"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "pure_jax" in done.stdout
    assert "cvae_rosetta.impls.pure_jax:implementation" in done.stdout
