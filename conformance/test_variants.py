"""chex-style variants of ``loss`` and ``train_step``: eager, jitted, pmapped, fake-pmapped.

Every variant computes the same numbers from the same state, batch and key. The pmap variant runs
over every local device (one on a plain CPU; eight in the ``multidevice`` environment, which forces
eight host devices), each device on its own copy of the arguments, and each device's output must
equal the eager result. ``chex.fake_pmap`` swaps pmap for vmap, the way chex tests code written for
pmap on one device.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import pytest

from cvae_rosetta.conformance.common import CONFIG, make_batch, reference_params

VARIANTS = ["without_jit", "with_jit", "with_pmap", "with_fake_pmap"]


def _replicate(tree, n: int):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *x.shape)), tree)


def run_variant(variant: str, fn, *args):
    """``fn(*args)`` under ``variant``; for the pmap variants, the output of every device."""
    if variant == "without_jit":
        with chex.fake_jit():
            return [fn(*args)]
    if variant == "with_jit":
        return [jax.jit(fn)(*args)]
    n = jax.local_device_count()
    if variant == "with_pmap":
        out = jax.pmap(fn)(*_replicate(args, n))
    else:
        with chex.fake_pmap(jit_result=True):
            out = jax.pmap(fn)(*_replicate(args, n))
    out = jax.device_get(out)  # every device's row, compared on the host
    return [jax.tree.map(lambda x, i=i: x[i], out) for i in range(n)]


@pytest.fixture(scope="module")
def inputs():
    params = reference_params(jax.random.key(61))
    return params, make_batch(jax.random.key(62)), jax.random.key(63)


@pytest.fixture(scope="module")
def jitted(impl, inputs):
    """The jitted results every variant is compared with, computed once per implementation."""
    params, batch, key = inputs
    state = impl.from_canonical(params, CONFIG)
    loss = jax.jit(impl.loss)(state, batch, key)
    new_state, metrics = jax.jit(impl.train_step)(state, batch, key)
    return loss, (impl.to_canonical(new_state), metrics)


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_is_the_same_in_every_variant(impl, inputs, jitted, variant):
    params, batch, key = inputs
    state = impl.from_canonical(params, CONFIG)
    want = jitted[0]
    for got in run_variant(variant, impl.loss, state, batch, key):
        chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_train_step_is_the_same_in_every_variant(impl, inputs, jitted, variant):
    params, batch, key = inputs
    want, want_metrics = jitted[1]
    state = impl.from_canonical(params, CONFIG)
    for got_state, got_metrics in run_variant(variant, impl.train_step, state, batch, key):
        chex.assert_trees_all_close(got_metrics, want_metrics, rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(impl.to_canonical(got_state), want, rtol=1e-6, atol=1e-7)
