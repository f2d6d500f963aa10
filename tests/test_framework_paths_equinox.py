"""Equinox's idiomatic step computes what the implementation's protocol step (its fast path) does.

``make_step`` is the step as Equinox's docs write it: ``eqx.filter_jit`` and
``eqx.filter_value_and_grad`` over the model and its optimiser state. The protocol step is the
flattened one of the ``fast_path`` section, under a plain ``jax.jit``. Run in the environments that
install Equinox (``equinox`` and ``cross``); elsewhere the file is skipped.
"""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest

from cvae_rosetta.conformance.common import CONFIG, make_batch, reference_params
from cvae_rosetta.spec import model as shared_model
from cvae_rosetta.spec.optim import make_optimizer

pytestmark = pytest.mark.needs_equinox

eqx = pytest.importorskip("equinox", reason="Equinox is not installed here")
eqx_impl = pytest.importorskip("cvae_rosetta.impls.equinox_impl")


def test_filter_jit_step_equals_the_fast_path_after_three_steps():
    impl = eqx_impl.implementation
    params = reference_params(jax.random.key(0))
    model = impl.from_canonical(params, CONFIG).model
    opt_state = make_optimizer(CONFIG.optim).init(eqx.filter(model, eqx.is_array))
    fast = jax.jit(impl.train_step, donate_argnums=0)
    state = impl.from_canonical(params, CONFIG)
    for t in range(3):
        batch, key = make_batch(jax.random.key(10 + t)), jax.random.key(20 + t)
        eps = shared_model.noise(key, batch.x.shape[0], CONFIG.model.latent_dim)
        model, opt_state, idiomatic_metrics = eqx_impl.make_step(
            model, opt_state, batch, eps, CONFIG
        )
        state, metrics = fast(state, batch, key)
        chex.assert_trees_all_close(idiomatic_metrics, metrics, rtol=1e-6)
    chex.assert_trees_all_close(
        eqx_impl.to_canonical(model), impl.to_canonical(state), rtol=1e-6, atol=1e-7
    )
    chex.assert_trees_all_close(opt_state, state.opt_state, rtol=1e-6, atol=1e-7)
    assert int(state.step) == 3


def test_benchmark_path_is_the_filter_jit_step():
    """The extra path the benchmark times runs ``make_step`` from the protocol's arguments."""
    impl = eqx_impl.implementation
    params = reference_params(jax.random.key(3))
    step, carry = impl.extras["paths"]["eqx.filter_jit"](impl.from_canonical(params, CONFIG))
    state = impl.from_canonical(params, CONFIG)
    batch, key = make_batch(jax.random.key(4)), jax.random.key(5)
    (model, _), metrics = step(carry, batch, key)
    state, expected = jax.jit(impl.train_step)(state, batch, key)
    chex.assert_trees_all_close(metrics, expected, rtol=1e-6)
    chex.assert_trees_all_close(
        eqx_impl.to_canonical(model), impl.to_canonical(state), rtol=1e-6, atol=1e-7
    )


def test_the_module_maps_one_example_and_vmap_batches_it():
    impl = eqx_impl.implementation
    state = impl.from_canonical(reference_params(jax.random.key(1)), CONFIG)
    batch = make_batch(jax.random.key(2))
    model = state.model
    fan_in = CONFIG.model.input_dim + CONFIG.model.num_classes
    assert model.encoder[0].weight.shape == (CONFIG.model.encoder_dims[0], fan_in)  # [out, in]
    mean, logvar = impl.encode(state, batch.x, batch.c)
    s = model.encode(batch.x[0], batch.c[0])  # one example, no batch axis
    # one example against a batch: the same sums in another order, each of up to fan_in products
    # of about 0.1 to 1 (float32 rounding of a few 1e-7 where they cancel)
    np.testing.assert_allclose(s[: CONFIG.model.latent_dim], mean[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s[CONFIG.model.latent_dim :], logvar[0], rtol=1e-6, atol=1e-6)
    logits = impl.decode(state, mean, batch.c)
    np.testing.assert_allclose(model.decode(mean[0], batch.c[0]), logits[0], rtol=1e-6, atol=1e-6)
    images = shared_model.reconstruct(impl, state, batch.x, batch.c)
    assert images.shape == batch.x.shape


def test_states_of_equal_configs_share_one_static_structure():
    from cvae_rosetta.spec.config import Config

    impl = eqx_impl.implementation
    params = reference_params(jax.random.key(6))
    a = impl.from_canonical(params, CONFIG)
    b = impl.from_canonical(params, Config.from_dict(CONFIG.to_dict()))
    assert a.structure is b.structure
    for leaf in jax.tree.leaves(a):
        assert isinstance(leaf, jax.Array)
