"""The ``loss`` layer: the loss and its terms against the float64 reference, at the spec's noise
for the key (SPEC sections 3 and 4).

Every failure's first line says what was seen against what the spec says, and names the mistake
where a known one explains it (``cvae_rosetta.conformance.mistakes``: ``recon is 1/64 of the
reference: a mean over pixels where the spec sums``).
"""

from __future__ import annotations

import jax
import pytest

from cvae_rosetta.conformance import common
from cvae_rosetta.conformance.common import CONFIG
from cvae_rosetta.conformance.mistakes import LossInputs, assert_loss_matches
from cvae_rosetta.spec.config import LossConfig

params, batch = common.params, common.batch  # the suite's parameters and batch


@pytest.mark.parametrize(
    "kind,beta", [("bernoulli", 1.0), ("bernoulli", 0.25), ("mse", 1.0), ("mse", 3.0)]
)
def test_loss_matches_reference(impl, params, batch, kind, beta):
    config = CONFIG.replace(loss=LossConfig(kind=kind, beta=beta))
    state = impl.from_canonical(params, config)
    key = jax.random.key(11)
    loss, metrics = impl.loss(state, batch, key)
    assert_loss_matches(loss, metrics, LossInputs(params, batch, key, config))


def test_noise_comes_from_the_key_alone(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    a, _ = impl.loss(state, batch, jax.random.key(5))
    b, _ = impl.loss(state, batch, jax.random.key(5))
    c, _ = impl.loss(state, batch, jax.random.key(6))
    assert float(a) == float(b), (
        f"the same key gave the losses {float(a)!r} and {float(b)!r}: the noise depends on "
        "hidden state, where the spec draws it from the key alone"
    )
    assert float(a) != float(c), (
        f"the keys 5 and 6 gave the same loss {float(a)!r}: the key passed in is ignored"
    )
