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

from cvae_rosetta.conformance.common import (
    CONFIG,
    assert_trees_close,
    copy_to_host,
    suite_batch,
    suite_params,
)

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


@pytest.fixture
def inputs():
    """Parameters, batch and key in buffers of this check's own."""
    return suite_params(61), suite_batch(62), jax.random.key(63)


@pytest.fixture(scope="module")
def jitted(impl):
    """The jitted results every variant is compared with, computed once per implementation (kept
    as NumPy arrays: nothing a check does can delete them)."""
    params, batch, key = suite_params(61), suite_batch(62), jax.random.key(63)
    state = impl.from_canonical(params, CONFIG)
    loss = jax.jit(impl.loss)(state, batch, key)
    new_state, metrics = jax.jit(impl.train_step)(state, batch, key)
    return copy_to_host(loss), copy_to_host((impl.to_canonical(new_state), metrics))


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_is_the_same_in_every_variant(impl, inputs, jitted, variant):
    params, batch, key = inputs
    state = impl.from_canonical(params, CONFIG)
    want = jitted[0]
    for device, got in enumerate(run_variant(variant, impl.loss, state, batch, key)):
        assert_trees_close(
            got,
            want,
            f"loss and metrics {variant}" + (f" on device {device}" if device else ""),
            rtol=1e-6,
            atol=1e-6,
            against="the jitted call's",
        )


@pytest.mark.parametrize("variant", VARIANTS)
def test_train_step_is_the_same_in_every_variant(impl, inputs, jitted, variant):
    params, batch, key = inputs
    want, want_metrics = jitted[1]
    state = impl.from_canonical(params, CONFIG)
    outputs = run_variant(variant, impl.train_step, state, batch, key)
    for device, (got_state, got_metrics) in enumerate(outputs):
        on = f"{variant}" + (f" on device {device}" if device else "")
        assert_trees_close(
            got_metrics,
            want_metrics,
            f"the step's metrics {on}",
            rtol=1e-6,
            atol=1e-6,
            against="the jitted step's",
        )
        assert_trees_close(
            impl.to_canonical(got_state),
            want,
            f"the parameters after a step {on}",
            rtol=1e-6,
            atol=1e-7,
            against="the jitted step's",
        )
