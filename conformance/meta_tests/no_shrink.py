"""A pytest plugin for the suite's runs on broken implementations (``-p`` in ``runner.command``).

A broken implementation fails most property tests, and hypothesis then shrinks each failing
example, recompiling the model for every smaller shape it tries: minutes per test, to find a
minimal example nobody reads here. This plugin keeps the profile the conformance plugin loaded
(``ci`` or ``thorough``: the same examples, so the same checks fail) without the shrink phase, and
without the example database, so that failures of broken implementations are not replayed into
later runs of the real ones.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)  # after the conformance plugin has loaded its profile
def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import Phase, settings

    phases = [phase for phase in settings.default.phases if phase is not Phase.shrink]
    settings.register_profile("meta_tests", phases=phases, database=None)
    settings.load_profile("meta_tests")
