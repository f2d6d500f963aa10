"""Every pair of implementations under test, from the same canonical parameters and keys.

The pairs come from the implementations the run was given (``--impl``, ``CVAE_IMPL``, or every
installed one), so the ``cross`` tox environment, which installs every framework, checks every
pair; ``pure_jax`` is one of them there, which makes each implementation also agree with the
reference directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance.assertions import assert_close, assert_trees_close
from cvae_rosetta.conformance.common import CONFIG, MODEL, digits, suite_batch, suite_params
from cvae_rosetta.spec.config import Config, LossConfig, ModelConfig
from cvae_rosetta.spec.validation import Batch

# Two float32 computations of the same thing, each within ~1e-6 relative of the exact value.
RTOL, ATOL = 2e-5, 2e-6


@pytest.fixture
def params():
    """Canonical parameters in buffers of this check's own."""
    return suite_params(2024)


@pytest.fixture
def batch():
    return suite_batch(77)


def test_forward_agrees(impl_pair, params, batch):
    a, b = impl_pair
    sa, sb = a.from_canonical(params, CONFIG), b.from_canonical(params, CONFIG)
    assert_trees_close(
        a.encode(sa, batch.x, batch.c),
        b.encode(sb, batch.x, batch.c),
        f"{a.name}'s encode (mean, logvar)",
        rtol=RTOL,
        atol=ATOL,
        against=f"{b.name}'s",
    )
    z = jax.random.normal(jax.random.key(1), (batch.x.shape[0], MODEL.latent_dim))
    assert_close(
        a.decode(sa, z, batch.c),
        b.decode(sb, z, batch.c),
        f"{a.name}'s decode",
        rtol=RTOL,
        atol=ATOL,
        against=f"{b.name}'s",
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
    a, b = impl_pair
    theirs = f"{b.name}'s"
    assert_close(la, lb, f"{a.name}'s {kind} loss", rtol=RTOL, against=theirs)
    assert_trees_close(ma, mb, f"{a.name}'s metrics", rtol=RTOL, atol=ATOL, against=theirs)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ga))
    assert_trees_close(
        ga, gb, f"{a.name}'s d loss / d params", rtol=1e-4, atol=1e-6 * scale, against=theirs
    )


def test_one_step_agrees(impl_pair, params, batch):
    key = jax.random.key(4)
    out = []
    for impl in impl_pair:
        state, metrics = impl.train_step(impl.from_canonical(params, CONFIG), batch, key)
        out.append((impl.to_canonical(state), metrics))
    (pa, ma), (pb, mb) = out
    a, b = impl_pair
    assert_trees_close(
        ma, mb, f"{a.name}'s step metrics", rtol=RTOL, atol=ATOL, against=f"{b.name}'s"
    )
    # Adam's first update has size lr for every entry with a non-negligible gradient, so two correct
    # implementations agree to float32 rounding of the parameters except where a gradient entry is
    # at float32 noise level (see docs/conformance.md); those are bounded by 2 lr.
    lr = CONFIG.optim.learning_rate
    diffs = jax.tree.map(lambda x, y: np.abs(np.asarray(x) - np.asarray(y)), pa, pb)
    flat = np.concatenate([d.ravel() for d in jax.tree.leaves(diffs)])
    assert flat.max() <= 2 * lr * (1 + 1e-4), (
        f"after one step {a.name} and {b.name} differ by up to {flat.max():.3g}; two first Adam "
        f"steps differ by at most 2 lr = {2 * lr:g}"
    )
    assert np.mean(flat > 1e-6) < 1e-3, (
        f"after one step {np.mean(flat > 1e-6):.2%} of the parameters of {a.name} and {b.name} "
        "differ by more than 1e-6; at most 0.1% (gradients at float32 noise level) may"
    )


def test_twenty_steps_on_digits_end_at_the_same_parameters(impl_pair):
    config = Config(model=ModelConfig(input_dim=64, num_classes=10, latent_dim=8))
    a, b = impl_pair
    xs, cs, _ = digits(64, seed=6)
    finals, losses = [], []
    for impl in impl_pair:
        step = jax.jit(impl.train_step, donate_argnums=0)
        state = impl.from_canonical(suite_params(5, config.model), config)
        trajectory = []
        for t in range(20):
            state, metrics = step(
                state, Batch(xs[t], cs[t]), jax.random.fold_in(jax.random.key(7), t)
            )
            trajectory.append(float(metrics["loss"]))
        finals.append(impl.to_canonical(state))
        losses.append(trajectory)
    assert_close(
        np.array(losses[0]),
        np.array(losses[1]),
        f"{a.name}'s losses over 20 steps",
        rtol=1e-4,
        against=f"{b.name}'s",
    )
    diffs = jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), finals[0], finals[1]
    )
    # 20 steps of size <= lr: entries may drift apart only where gradients sit at noise level
    assert max(jax.tree.leaves(diffs)) < 20 * config.optim.learning_rate, (
        f"after 20 steps {a.name} and {b.name} differ by up to {max(jax.tree.leaves(diffs)):.3g}; "
        f"20 Adam steps can drift apart by less than 20 lr = {20 * config.optim.learning_rate:g}"
    )
    assert_trees_close(
        finals[0],
        finals[1],
        f"{a.name}'s parameters after 20 steps",
        rtol=1e-3,
        atol=5e-4,
        against=f"{b.name}'s",
    )
