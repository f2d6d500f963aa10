"""Other paths an implementation offers for its train step compute what the protocol step does.

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
    require,
    suite_batch,
    suite_params,
)

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
