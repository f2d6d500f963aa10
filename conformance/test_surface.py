"""The ``surface`` layer: the protocol's members, the state as a pytree of arrays, and canonical
round trips (SPEC sections 2 and 6).

Each check touches only the protocol. Every check gets arrays of its own (the ``params`` and
``batch`` fixtures of each module hand out new buffers for each check), so an implementation that
keeps, donates or deletes what it is given fails the check that shows it
(``test_jit.py``'s ``test_donated_step_leaves_callers_parameters_intact``) and nothing else.
"""

from __future__ import annotations

import jax

from cvae_rosetta.conformance import common
from cvae_rosetta.conformance.assertions import assert_trees_close
from cvae_rosetta.conformance.common import CONFIG, at_path, copy_to_host
from cvae_rosetta.spec.protocol import MEMBERS

params = common.params  # the suite's parameters


def test_protocol_surface(impl):
    missing = [m for m in MEMBERS if not hasattr(impl, m)]
    assert not missing, f"the implementation lacks the protocol members {missing} (SPEC section 6)"
    assert isinstance(impl.name, str) and impl.name, (
        f"the implementation's name is {impl.name!r}: the spec wants a non-empty string"
    )
    for member in MEMBERS[1:]:
        assert callable(getattr(impl, member)), (
            f"the protocol member {member!r} is a {type(getattr(impl, member)).__name__}, "
            "not callable"
        )


def test_canonical_round_trip(impl, params):
    kept = copy_to_host(params)
    state = impl.from_canonical(params, CONFIG)
    back = impl.to_canonical(state)
    assert jax.tree.structure(back) == jax.tree.structure(kept), (
        f"to_canonical(from_canonical(params)) has the structure {jax.tree.structure(back)}; "
        f"the canonical tree given has {jax.tree.structure(kept)}"
    )
    for path, leaf in jax.tree_util.tree_leaves_with_path(back):
        want = at_path(kept, path)
        assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype), (
            f"to_canonical(from_canonical(params)){jax.tree_util.keystr(path)} is "
            f"{leaf.dtype}{list(leaf.shape)} where the canonical tree has "
            f"{want.dtype}{list(want.shape)}"
        )
    assert_trees_close(
        back,
        kept,
        "the round trip to_canonical(from_canonical(params))",
        rtol=0.0,
        against="the parameters given",
    )


def test_state_is_a_pytree_of_arrays(impl, params):
    state = impl.from_canonical(params, CONFIG)
    leaves = jax.tree.leaves(state)
    assert leaves, "the state has no array leaves: the spec's state is a pytree of arrays"
    for leaf in leaves:
        assert isinstance(leaf, jax.Array), (
            f"a state leaf is a {type(leaf).__name__}, not a jax.Array: the spec's state is a "
            "pytree of arrays"
        )
