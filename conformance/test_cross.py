"""Every pair of implementations under test, from the same canonical parameters and keys.

The pairs come from the implementations the run was given (``--impl``, ``CVAE_IMPL``, or every
installed one), so the ``cross`` tox environment, which installs every framework, checks every
pair; ``pure_jax`` is one of them there, which makes each implementation also agree with the
reference directly.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance.common import CONFIG, MODEL, digits, make_batch, reference_params
from cvae_rosetta.spec.config import Config, LossConfig, ModelConfig
from cvae_rosetta.spec.validation import Batch

# Two float32 computations of the same thing, each within ~1e-6 relative of the exact value.
RTOL, ATOL = 2e-5, 2e-6


@pytest.fixture(scope="module")
def params():
    return reference_params(jax.random.key(2024))


@pytest.fixture(scope="module")
def batch():
    return make_batch(jax.random.key(77))


def test_forward_agrees(impl_pair, params, batch):
    a, b = impl_pair
    sa, sb = a.from_canonical(params, CONFIG), b.from_canonical(params, CONFIG)
    chex.assert_trees_all_close(
        a.encode(sa, batch.x, batch.c), b.encode(sb, batch.x, batch.c), rtol=RTOL, atol=ATOL
    )
    z = jax.random.normal(jax.random.key(1), (batch.x.shape[0], MODEL.latent_dim))
    chex.assert_trees_all_close(
        a.decode(sa, z, batch.c), b.decode(sb, z, batch.c), rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("kind", ["bernoulli", "mse"])
def test_loss_metrics_and_gradients_agree(impl_pair, params, batch, kind):
    config = CONFIG.replace(loss=LossConfig(kind=kind, beta=0.7))
    key = jax.random.key(3)
    results = []
    for impl in impl_pair:

        def loss_of(p, impl=impl):
            return impl.loss(impl.from_canonical(p, config), batch, key)

        (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        results.append((loss, metrics, grads))
    (la, ma, ga), (lb, mb, gb) = results
    chex.assert_trees_all_close(la, lb, rtol=RTOL)
    chex.assert_trees_all_close(ma, mb, rtol=RTOL, atol=ATOL)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ga))
    chex.assert_trees_all_close(ga, gb, rtol=1e-4, atol=1e-6 * scale)


def test_one_step_agrees(impl_pair, params, batch):
    key = jax.random.key(4)
    out = []
    for impl in impl_pair:
        state, metrics = impl.train_step(impl.from_canonical(params, CONFIG), batch, key)
        out.append((impl.to_canonical(state), metrics))
    (pa, ma), (pb, mb) = out
    chex.assert_trees_all_close(ma, mb, rtol=RTOL, atol=ATOL)
    # Adam's first update has size lr for every entry with a non-negligible gradient, so two correct
    # implementations agree to float32 rounding of the parameters except where a gradient entry is
    # at float32 noise level (see docs/conformance.md); those are bounded by 2 lr.
    lr = CONFIG.optim.learning_rate
    diffs = jax.tree.map(lambda x, y: np.abs(np.asarray(x) - np.asarray(y)), pa, pb)
    flat = np.concatenate([d.ravel() for d in jax.tree.leaves(diffs)])
    assert flat.max() <= 2 * lr * (1 + 1e-4)
    assert np.mean(flat > 1e-6) < 1e-3, f"{np.mean(flat > 1e-6):.2%} of entries differ by > 1e-6"


def test_twenty_steps_on_digits_end_at_the_same_parameters(impl_pair):
    config = Config(model=ModelConfig(input_dim=64, num_classes=10, latent_dim=8))
    start = reference_params(jax.random.key(5), config.model)
    xs, cs, _ = digits(64, seed=6)
    finals, losses = [], []
    for impl in impl_pair:
        step = jax.jit(impl.train_step, donate_argnums=0)
        state = impl.from_canonical(start, config)
        trajectory = []
        for t in range(20):
            state, metrics = step(
                state, Batch(xs[t], cs[t]), jax.random.fold_in(jax.random.key(7), t)
            )
            trajectory.append(float(metrics["loss"]))
        finals.append(impl.to_canonical(state))
        losses.append(trajectory)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
    diffs = jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), finals[0], finals[1]
    )
    # 20 steps of size <= lr: entries may drift apart only where gradients sit at noise level
    assert max(jax.tree.leaves(diffs)) < 20 * config.optim.learning_rate
    chex.assert_trees_all_close(finals[0], finals[1], rtol=1e-3, atol=5e-4)
