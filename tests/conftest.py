"""Selection by marker before import.

tox picks the project's tests by marker (``-m docs``, ``-m "not (...)"``; see tox.ini). A module
whose ``pytestmark`` the ``-m`` expression deselects is not even imported here: several of them
skip at import time where their framework or browser is missing, and that skip would otherwise be
reported by every environment that deselects them anyway.

The project's own property tests take their budgets from the suite's hypothesis profiles: ``ci``
unless hypothesis's ``--hypothesis-profile`` or ``CVAE_HYPOTHESIS_PROFILE`` names another. (The
conformance plugin applies its settings to the suite's own checks only, never to a session's other
tests, so the project chooses its own here.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from _pytest.mark.expression import Expression
from hypothesis import settings

from cvae_rosetta.conformance.plugin import PROFILES, profile_settings

for _name in PROFILES:
    settings.register_profile(_name, **profile_settings(_name))

# The cvae commands the tests run (here and in subprocesses) never write into the user's own
# compilation cache (~/.cache/cvae-rosetta/jax): none, unless the environment names one (a folder in
# $CVAE_COMPILATION_CACHE, as every tox environment does, one of its own, or JAX's own
# $JAX_COMPILATION_CACHE_DIR). A test that needs a cold cache names a folder of its own.
if os.environ.get("CVAE_COMPILATION_CACHE", "").strip().lower() in ("", "auto") and not (
    os.environ.get("JAX_COMPILATION_CACHE_DIR")
):
    os.environ["CVAE_COMPILATION_CACHE"] = "off"
# Nor into its data cache (the bundled digits' split, ~/.cache/cvae-rosetta/data), unless the
# environment names one ($CVAE_DATA_CACHE, a folder per tox environment).
os.environ.setdefault("CVAE_DATA_CACHE", "off")


def pytest_configure(config) -> None:
    if config.getoption("hypothesis_profile", None) is None:  # hypothesis's own option wins
        profile = os.environ.get("CVAE_HYPOTHESIS_PROFILE") or os.environ.get("HYPOTHESIS_PROFILE")
        settings.load_profile(profile or "ci")


MODULE_MARK = re.compile(r"^pytestmark = (.+)$", re.MULTILINE)


def module_marks(path: Path) -> set[str]:
    """The marker names of a test module's ``pytestmark = ...`` line, read from its text."""
    found = MODULE_MARK.search(path.read_text(encoding="utf-8"))
    return set(re.findall(r"pytest\.mark\.(\w+)", found.group(1))) if found else set()


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    expression = config.getoption("markexpr")
    if not expression or collection_path.suffix != ".py" or collection_path.name == "conftest.py":
        return None
    marks = module_marks(collection_path)
    if marks and not Expression.compile(expression).evaluate(lambda name, **_: name in marks):
        return True
    return None
