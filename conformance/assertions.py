"""What a conformance check asserts and requires: each assertion fails with the message of
:mod:`cvae_rosetta.conformance.messages` (its first line a plain sentence), and :func:`require`
reports a check of a capability beyond the protocol as not applicable (never as passed) for an
implementation without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cvae_rosetta.conformance.messages import Hints, mismatch, refusal, tree_mismatch


def capabilities(impl) -> set[str]:
    """What an implementation offers beyond the protocol of SPEC section 6.

    ``paths``: other ways to run the same train step (``extras["paths"]`` of an
    :class:`~cvae_rosetta.spec.protocol.Adapter`). ``data_parallel``: a ``grads_fn`` (the step's
    gradient half), which the per-device data-parallel steps (``pmap``, ``shard_map``) need.
    """
    found = set()
    if getattr(impl, "extras", {}).get("paths"):
        found.add("paths")
    if getattr(impl, "grads_fn", None) is not None:
        found.add("data_parallel")
    return found


def require(impl, capability: str) -> None:
    """Report the calling check as not applicable (never as passed) without ``capability``."""
    if capability not in capabilities(impl):
        pytest.skip(f"not applicable: {getattr(impl, 'name', impl)} has no {capability!r}")


def assert_close(got: Any, want: Any, what: str, *, rtol: float, atol: float = 0.0, **hints):
    """Fail with :func:`mismatch`'s message unless ``got`` equals ``want`` within tolerance
    (``hints``: the fields of :class:`Hints`)."""
    message = mismatch(got, want, what, rtol=rtol, atol=atol, hints=Hints(**hints))
    if message is not None:
        raise AssertionError(message)


def assert_trees_close(got: Any, want: Any, what: str, *, rtol: float, atol: float = 0.0, **kw):
    message = tree_mismatch(got, want, what, rtol=rtol, atol=atol, **kw)
    if message is not None:
        raise AssertionError(message)


def refused_with(call: Callable[[], Any], what: str, expected: str = "") -> str:
    """The message of the ``ValueError`` ``call()`` raises; an ``AssertionError`` saying what
    happened instead when it raises something else or nothing (``expected``: what the spec's
    message says, for that one)."""
    saying = f" saying {expected!r}" if expected else ""
    try:
        call()
    except ValueError as err:
        return str(err)
    except Exception as err:
        raise AssertionError(
            f"{what}: raised {type(err).__name__} where the spec raises ValueError{saying}: "
            f"{str(err).strip()[:200]!r}"
        ) from err
    raise AssertionError(f"{what}: accepted, where the spec refuses it with a ValueError{saying}")


def assert_refused(call: Callable[[], Any], what: str, expected: str) -> None:
    message = refusal(call, what, expected)
    if message is not None:
        raise AssertionError(message)
