"""The ``training`` layer: several steps. Forty steps on the bundled digits lower the held-out
loss, and every other path an implementation offers for its train step computes what the protocol
step does.

An implementation may expose, beside its pure protocol step, the way its framework writes the step
(NNX's in-place ``nnx.jit`` step, Equinox's ``filter_jit``) or faster variants. Each is checked
against ``train_step`` through the metrics of consecutive steps: the metrics of step t+1 are a
function of the parameters after step t, so agreeing metrics over several steps mean agreeing
updates. An implementation without such paths reports these checks as not applicable.
"""

from __future__ import annotations

import jax

from cvae_rosetta.conformance.common import (
    CONFIG,
    assert_close,
    digits,
    require,
    suite_batch,
    suite_params,
)
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.validation import Batch

STEPS = 4


def test_every_path_follows_the_protocol_step(impl):
    require(impl, "paths")
    batches = [suite_batch(40 + t) for t in range(STEPS)]
    keys = [jax.random.key(50 + t) for t in range(STEPS)]
    step = jax.jit(impl.train_step)
    state = impl.from_canonical(suite_params(31), CONFIG)
    expected = []
    for batch, key in zip(batches, keys, strict=True):
        state, metrics = step(state, batch, key)
        expected.append({k: float(v) for k, v in metrics.items()})
    for label, make in impl.extras["paths"].items():
        path_step, carry = make(impl.from_canonical(suite_params(31), CONFIG))
        for t, (batch, key) in enumerate(zip(batches, keys, strict=True)):
            carry, metrics = path_step(carry, batch, key)
            for name, want in expected[t].items():
                assert_close(
                    float(metrics[name]),
                    want,
                    f"the path {label!r}'s {name} at step {t}",
                    rtol=1e-5,
                    against="train_step's",
                )


def test_a_few_dozen_steps_lower_the_loss_on_digits(impl):
    config = Config(model=ModelConfig(input_dim=64, num_classes=10, latent_dim=8))
    state = impl.from_canonical(suite_params(0, config.model), config)
    xs, cs, fixed = digits(64, seed=0)
    step = jax.jit(impl.train_step, donate_argnums=0)
    loss = jax.jit(impl.loss)  # as training evaluates it: one program for both calls
    before = float(loss(state, fixed, jax.random.key(1))[0])
    for t in range(40):
        state, _ = step(state, Batch(xs[t % len(xs)], cs[t % len(cs)]), jax.random.key(t))
    after = float(loss(state, fixed, jax.random.key(1))[0])
    assert after < 0.8 * before, (
        f"40 steps on the digits took the held-out loss from {before:.4g} to {after:.4g}; the "
        f"spec's model gets below 0.8 times the start ({0.8 * before:.4g})"
    )
