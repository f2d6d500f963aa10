"""The register of broken implementations: each one's bug, in definition order, and where it is.

:func:`bug` registers a function's adapter under its name; ``broken`` and ``searched`` define them,
``broken`` is the face the meta tests read (``NAMES``, ``EXPECTED``), and :func:`target` is what
``--impl`` takes for each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from cvae_rosetta.spec.protocol import Adapter

BUGS: dict[str, str] = {}  # name -> the docstring of its bug, in definition order
MODULES: dict[str, str] = {}  # name -> the module that defines it


def bug(build: Callable[[], Adapter]) -> Adapter:
    """Register ``build``'s adapter under the function's name, with its docstring as the bug."""
    doc = " ".join((build.__doc__ or "").split())
    assert doc, f"{build.__name__}: every broken implementation says what it models"
    impl = build()
    # Every optional field back to its default (extras replaced, not merged): a broken
    # implementation offers no capability beyond the protocol. The reference's would be unbroken
    # (its ``grads_fn`` for the data-parallel steps; it has no other step paths) and fail
    # test_parallel for that reason, not for the bug.
    optional = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(Adapter)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    impl = dataclasses.replace(
        impl, **(optional | {"name": f"broken:{build.__name__}", "extras": {"bug": doc}})
    )
    BUGS[build.__name__] = doc
    MODULES[build.__name__] = build.__module__
    return impl


def target(name: str) -> str:
    """What ``--impl`` takes for the broken implementation ``name``: ``module:attribute``."""
    return f"{MODULES[name]}:{name}"
