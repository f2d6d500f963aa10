"""The idiomatic paths that sit beside each implementation's protocol step compute the same thing.

Run in the environments that install the framework (``flax_nnx`` and ``cross``); the ``unit``
environment has no framework and does not collect this file.
"""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest

from cvae_rosetta.conformance.common import CONFIG, make_batch, reference_params
from cvae_rosetta.spec import model as shared_model

pytestmark = pytest.mark.needs_flax

nnx_impl = pytest.importorskip("cvae_rosetta.impls.flax_nnx", reason="Flax is not installed here")


@pytest.mark.parametrize("label", ["nnx.jit in place", "nnx.cached_partial", "nnx.jit tree mode"])
def test_nnx_in_place_step_equals_the_functional_fast_path(label):
    """``nnx.jit`` + ``optimizer.update(model, grads)`` in place (graph mode, cached, tree mode),
    against split/merge + jax.jit."""
    from flax import nnx

    impl = nnx_impl.implementation
    params = reference_params(jax.random.key(0))
    make = impl.extras["paths"][label]
    step, objects = make(impl.from_canonical(params, CONFIG))
    functional = jax.jit(impl.train_step)
    state = impl.from_canonical(params, CONFIG)
    for t in range(3):
        batch, key = make_batch(jax.random.key(10 + t)), jax.random.key(20 + t)
        objects, in_place_metrics = step(objects, batch, key)
        state, metrics = functional(state, batch, key)
        chex.assert_trees_all_close(in_place_metrics, metrics, rtol=1e-6)
    model, optimizer = objects
    in_place = nnx_impl.to_canonical(nnx.as_pure(nnx.state(model, nnx.Param)))
    chex.assert_trees_all_close(in_place, impl.to_canonical(state), rtol=1e-6, atol=1e-7)
    assert int(optimizer.step[...]) == 3 == int(state.step)


def test_nnx_module_methods_are_the_forward_pass():
    impl = nnx_impl.implementation
    params = reference_params(jax.random.key(1))
    state = impl.from_canonical(params, CONFIG)
    batch = make_batch(jax.random.key(2))
    model = state.model
    mean, _ = model.encode(batch.x, batch.c)
    np.testing.assert_array_equal(mean, impl.encode(state, batch.x, batch.c)[0])
    images = shared_model.reconstruct(impl, state, batch.x, batch.c)
    assert images.shape == batch.x.shape


def test_linen_compact_form_has_the_setup_forms_variables_and_outputs():
    """``impls/flax_linen.py``'s ``CompactCVAE`` (each layer declared inline under ``@nn.compact``,
    shown on the modules page beside ``CVAE``, whose ``setup`` declares them): the same key gives
    the very same variables, names and values, and either module given them computes the same
    outputs, as the page and the class's comment say."""
    linen = pytest.importorskip("cvae_rosetta.impls.flax_linen", reason="Flax is not installed")
    model = CONFIG.model
    fields = {
        "input_dim": model.input_dim,
        "num_classes": model.num_classes,
        "latent_dim": model.latent_dim,
        "encoder_dims": model.encoder_dims,
        "decoder_dims": model.decoder_dims,
    }
    setup_form, compact_form = linen.CVAE(**fields), linen.CompactCVAE(**fields)
    batch = make_batch(jax.random.key(3))
    eps = jax.random.normal(jax.random.key(4), (batch.x.shape[0], model.latent_dim))
    variables = setup_form.init(jax.random.key(5), batch.x, batch.c, eps)
    chex.assert_trees_all_equal(
        compact_form.init(jax.random.key(5), batch.x, batch.c, eps), variables
    )
    chex.assert_trees_all_equal(
        compact_form.apply(variables, batch.x, batch.c, eps),
        setup_form.apply(variables, batch.x, batch.c, eps),
    )
