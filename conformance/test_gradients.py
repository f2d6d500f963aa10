"""The ``gradients`` layer: d loss / d canonical parameters, through ``from_canonical``, against
the hand-derived float64 gradient of ``cvae_rosetta.conformance.reference`` (SPEC section 4).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from cvae_rosetta.conformance import common, reference
from cvae_rosetta.conformance.assertions import assert_trees_close
from cvae_rosetta.conformance.common import CONFIG, MODEL, B, copy_to_host, spec_noise
from cvae_rosetta.conformance.messages import Axis
from cvae_rosetta.spec.config import LossConfig

params, batch = common.params, common.batch  # the suite's parameters and batch


@pytest.mark.parametrize("kind", ["bernoulli", "mse"])
def test_gradients_match_reference(impl, params, batch, kind):
    """d loss / d canonical parameters, through from_canonical, against the hand-derived float64
    gradient."""
    config = CONFIG.replace(loss=LossConfig(kind=kind))
    key = jax.random.key(12)
    start = copy_to_host(params)

    def loss_of(p, batch, key):
        return impl.loss(impl.from_canonical(p, config), batch, key)[0]

    grads = jax.jit(jax.grad(loss_of))(params, batch, key)  # one program, not one per operation
    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(
        start, batch.x, batch.c, eps, num_classes=MODEL.num_classes, loss=config.loss
    )
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref.grads))
    assert_trees_close(
        grads,
        ref.grads,
        "d loss / d params",
        rtol=1e-4,
        atol=1e-6 * scale,
        axes=(Axis("the batch", B, "mean"),),
    )
