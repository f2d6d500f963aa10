"""The ``jit`` layer: the step jitted, donated and traced as training runs it, isolated from the
caller's arrays, and the same numbers in chex-style variants (SPEC section 6).

The jitted step equals the eager one; a donated step leaves the caller's trees readable (the
parameters given to ``from_canonical``, the canonical tree ``to_canonical`` handed out) and reuses
its buffers; a jitted step traces once for states built from equal (not identical) configs.

chex-style variants of ``loss`` and ``train_step``: eager, jitted, pmapped, fake-pmapped. Every
variant computes the same numbers from the same state, batch and key. The pmap variant runs over
every local device (one on a plain CPU; eight in the ``multidevice`` environment, which forces
eight host devices), each device on its own copy of the arguments, and each device's output must
equal the eager result. ``chex.fake_pmap`` swaps pmap for vmap, the way chex tests code written for
pmap on one device.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance import common, reference
from cvae_rosetta.conformance.assertions import assert_close, assert_trees_close
from cvae_rosetta.conformance.common import (
    CONFIG,
    MODEL,
    B,
    at_path,
    copy_to_host,
    fresh,
    spec_noise,
    suite_batch,
    suite_params,
)
from cvae_rosetta.conformance.messages import tree_mismatch
from cvae_rosetta.spec.config import Config

params, batch = common.params, common.batch  # the suite's parameters and batch


def test_jitted_step_equals_eager_step(impl, params, batch):
    """The same step compiled and op by op. The two round differently, and Adam's first update
    ``lr * g / (|g| + eps)`` turns a rounding difference in a gradient entry at float32 noise level
    (|g| near 1e-6, where eps = 1e-8 still counts) into a visible one: entries whose float64
    gradient is under 1e-3 of their tensor's largest are held to Adam's bound (they move by at most
    lr, so the two steps differ by at most 2 lr), every other entry to float32 rounding."""
    key = jax.random.key(14)
    start = copy_to_host(params)
    eager, m_eager = impl.train_step(impl.from_canonical(params, CONFIG), batch, key)
    jitted, m_jit = jax.jit(impl.train_step)(impl.from_canonical(fresh(start), CONFIG), batch, key)
    eager, jitted = impl.to_canonical(eager), impl.to_canonical(jitted)
    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(start, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
    lr = CONFIG.optim.learning_rate
    for path, g in jax.tree_util.tree_leaves_with_path(ref.grads):
        name = f"the jitted step's parameters{jax.tree_util.keystr(path)}"
        got, want = (np.asarray(at_path(t, path), np.float64) for t in (jitted, eager))
        reliable = np.abs(g) > 1e-3 * np.abs(g).max()
        assert_close(
            got[reliable], want[reliable], name, rtol=1e-6, atol=1e-7, against="the eager step's"
        )
        if reliable.all():
            continue
        assert_close(
            got[~reliable],
            want[~reliable],
            f"{name} (entries of gradients at float32 noise level)",
            rtol=0,
            atol=2 * lr * (1 + 1e-4),
            against="the eager step's",
        )
    assert_trees_close(
        m_jit, m_eager, "the jitted step's metrics", rtol=1e-6, against="the eager step's"
    )


ALIASED = (
    "from_canonical keeps the caller's arrays: a donated step deleted them (copy them, e.g. "
    "jnp.array(x) or jax.tree.map(jnp.copy, params))"
)
VIEWS = (
    "to_canonical hands out the state's own buffers: a donated step deleted them (return "
    "copies, e.g. jax.tree.map(jnp.copy, params))"
)


def _deleted(tree) -> list[str]:
    return [
        jax.tree_util.keystr(path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if isinstance(leaf, jax.Array) and leaf.is_deleted()
    ]


def _assert_intact(tree, before, name: str, prefix: str, cause: str, against: str) -> None:
    """After a donated step: no leaf of ``tree`` deleted, none changed from ``before``; a failure
    names ``cause`` (the first clause of ALIASED or VIEWS)."""
    deleted = _deleted(tree)
    assert not deleted, f"{cause}: {len(deleted)} leaves deleted, e.g. {prefix}{deleted[0]}"
    changed = tree_mismatch(copy_to_host(tree), before, name, rtol=0.0, against=against)
    assert changed is None, (
        f"{cause.split(':')[0]}: a donated step changed them; {changed.splitlines()[0]}"
    )


def test_donated_step_leaves_callers_parameters_intact(impl, params, batch):
    """The caller's arrays outlive a jitted step that donates the state: the parameters given to
    ``from_canonical`` (an implementation copies them, or donation deletes the caller's tree) and
    the canonical tree ``to_canonical`` handed out (copies, not the state's own buffers)."""
    given = copy_to_host(params)
    step = jax.jit(impl.train_step, donate_argnums=0)
    state = impl.from_canonical(params, CONFIG)
    state, _ = step(state, batch, jax.random.key(0))
    jax.block_until_ready(state)
    _assert_intact(params, given, "params", "params", ALIASED, "what the caller passed")

    for t in range(1, 3):
        state, _ = step(state, batch, jax.random.key(t))
    out = impl.to_canonical(state)
    handed_out = copy_to_host(out)
    state, _ = step(state, batch, jax.random.key(9))  # donates the buffers `out` came from
    jax.block_until_ready(state)
    _assert_intact(out, handed_out, "to_canonical's tree", "", VIEWS, "what it was")


def test_step_traces_once_for_equal_configs(impl, params, batch):
    traces = []

    def counted(state, batch, key):
        traces.append(1)
        return impl.train_step(state, batch, key)

    # Traced, not compiled: jit's trace cache answers the question, and each output state (as
    # shapes and dtypes, with its static parts) goes into the next call as a real step's would.
    step = jax.jit(counted)
    state = impl.from_canonical(params, CONFIG)
    for t in range(3):
        state, _ = step.trace(state, batch, jax.random.key(t)).out_info
    # a state rebuilt from an equal (not identical) config must hit the same traced step
    again = impl.from_canonical(suite_params(42), Config.from_dict(CONFIG.to_dict()))
    step.trace(again, suite_batch(99), jax.random.key(5))
    assert len(traces) == 1, (
        f"a jitted train_step traced {len(traces)} times for 4 calls with equal configs and "
        "shapes; the spec's traces once (the state's static parts must compare equal from step "
        "to step and between equal configs)"
    )


def test_donated_step_uses_its_buffers(impl, params, batch):
    import warnings

    step = jax.jit(impl.train_step, donate_argnums=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = impl.from_canonical(params, CONFIG)
        for t in range(3):
            state, metrics = step(state, batch, jax.random.key(t))
        jax.block_until_ready(state)
    messages = [str(w.message) for w in caught if "donat" in str(w.message).lower()]
    assert not messages, (
        f"a donated step could not reuse its buffers: {messages[0].splitlines()[0]} "
        f"({len(messages)} warnings)"
    )
    assert np.isfinite(float(metrics["loss"])), (
        f"three donated steps ended at the loss {float(metrics['loss'])}; the spec's is finite"
    )


# the eager and the jitted variants run on one device however many there are (one_device); the
# pmap variants on every local device
VARIANTS = [
    pytest.param("without_jit", marks=pytest.mark.one_device),
    pytest.param("with_jit", marks=pytest.mark.one_device),
    "with_pmap",
    "with_fake_pmap",
]


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
