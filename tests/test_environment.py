"""Each framework environment holds its own framework and no other (run by tox, per environment).

tox sets ``CVAE_EXPECT_FRAMEWORKS`` to the frameworks an environment installs; this file is run
only there, so a missing variable is an error, not a skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from cvae_rosetta.spec import registry

pytestmark = pytest.mark.environment

# the module each built-in implementation needs (its ABOUT's), by the name tox's variable uses
FRAMEWORKS = sorted({info.module for info in registry.known() if info.builtin})


def expected() -> set[str]:
    value = os.environ.get("CVAE_EXPECT_FRAMEWORKS")
    assert value, "CVAE_EXPECT_FRAMEWORKS is not set: run this file through tox"
    names = {n.strip() for n in value.split(",") if n.strip()}
    assert names <= set(FRAMEWORKS), names
    return names


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_only_the_environments_frameworks_are_importable(framework):
    importable = importlib.util.find_spec(framework) is not None
    if framework in expected():
        assert importable, f"{framework} should be installed in this environment"
    else:
        assert not importable, f"{framework} is importable here, but this environment is not its"


def test_the_loader_reports_the_same():
    from cvae_rosetta.spec.protocol import known

    frameworks = expected()
    for info in known():
        if info.builtin:
            assert info.installed == (info.module in frameworks), info
