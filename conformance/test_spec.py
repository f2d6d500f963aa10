"""The first conformance checks: every implementation against SPEC sections 1 to 6.

Each test touches only the protocol. Numbers are compared with the float64 NumPy reference of
``cvae_rosetta.conformance.reference``, computed from the same canonical parameters and the same
noise.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import (
    ATOL,
    CONFIG,
    MODEL,
    RTOL,
    B,
    at_path,
    digits,
    make_batch,
    reference_params,
    spec_noise,
    spec_optimizer,
)
from cvae_rosetta.spec.config import Config, LossConfig, ModelConfig, OptimConfig
from cvae_rosetta.spec.protocol import MEMBERS
from cvae_rosetta.spec.validation import Batch


@pytest.fixture(scope="module")
def params():
    return reference_params(jax.random.key(42))


@pytest.fixture(scope="module")
def batch():
    return make_batch(jax.random.key(7))


def test_protocol_surface(impl):
    missing = [m for m in MEMBERS if not hasattr(impl, m)]
    assert not missing, f"missing protocol members: {missing}"
    assert isinstance(impl.name, str) and impl.name
    for member in MEMBERS[1:]:
        assert callable(getattr(impl, member)), member


def test_canonical_round_trip(impl, params):
    state = impl.from_canonical(params, CONFIG)
    back = impl.to_canonical(state)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    chex.assert_trees_all_equal_shapes_and_dtypes(back, params)
    chex.assert_trees_all_equal(back, params)


def test_state_is_a_pytree_of_arrays(impl, params):
    state = impl.from_canonical(params, CONFIG)
    leaves = jax.tree.leaves(state)
    assert leaves, "the state has no array leaves"
    for leaf in leaves:
        assert isinstance(leaf, jax.Array), f"state leaf {type(leaf).__name__} is not an array"


def test_init_gives_canonical_shapes_and_dtypes(impl):
    from cvae_rosetta.spec.canonical import shapes

    got = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    expected = shapes(MODEL)
    assert jax.tree.map(lambda a: tuple(a.shape), got) == jax.tree.map(
        tuple, expected, is_leaf=lambda x: isinstance(x, tuple)
    )
    for leaf in jax.tree.leaves(got):
        assert leaf.dtype == jnp.float32


def test_output_shapes(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    chex.assert_shape([mean, logvar], (B, MODEL.latent_dim))
    logits = impl.decode(state, mean, batch.c)
    chex.assert_shape(logits, (B, MODEL.input_dim))
    loss, metrics = impl.loss(state, batch, jax.random.key(1))
    chex.assert_shape(loss, ())
    assert set(metrics) >= {"loss", "recon", "kl"}
    for value in metrics.values():
        chex.assert_shape(value, ())
    for value in (mean, logvar, logits, loss):
        assert value.dtype == jnp.float32


def test_encode_decode_match_reference(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    ref_mean, ref_logvar = reference.encode(params, batch.x, batch.c, MODEL.num_classes)
    np.testing.assert_allclose(mean, ref_mean, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(logvar, ref_logvar, rtol=RTOL, atol=ATOL)
    z = jax.random.normal(jax.random.key(3), (B, MODEL.latent_dim))
    logits = impl.decode(state, z, batch.c)
    ref_logits = reference.decode(params, z, batch.c, MODEL.num_classes)
    np.testing.assert_allclose(logits, ref_logits, rtol=RTOL, atol=ATOL)


def test_labels_condition_both_sides(impl, params, batch):
    """Changing only the labels changes the encoder's and the decoder's output."""
    state = impl.from_canonical(params, CONFIG)
    other = (batch.c + 1) % MODEL.num_classes
    mean_a, _ = impl.encode(state, batch.x, batch.c)
    mean_b, _ = impl.encode(state, batch.x, other)
    assert np.all(np.abs(np.asarray(mean_a) - np.asarray(mean_b)).max(axis=1) > 1e-4)
    z = jnp.zeros((B, MODEL.latent_dim))
    out_a, out_b = impl.decode(state, z, batch.c), impl.decode(state, z, other)
    assert np.all(np.abs(np.asarray(out_a) - np.asarray(out_b)).max(axis=1) > 1e-4)


@pytest.mark.parametrize(
    "kind,beta", [("bernoulli", 1.0), ("bernoulli", 0.25), ("mse", 1.0), ("mse", 3.0)]
)
def test_loss_matches_reference(impl, params, batch, kind, beta):
    config = CONFIG.replace(loss=LossConfig(kind=kind, beta=beta))
    state = impl.from_canonical(params, config)
    key = jax.random.key(11)
    loss, metrics = impl.loss(state, batch, key)
    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(
        params, batch.x, batch.c, eps, num_classes=MODEL.num_classes, kind=kind, beta=beta
    )
    np.testing.assert_allclose(float(loss), ref.loss, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["loss"]), ref.loss, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["recon"]), ref.recon, rtol=RTOL)
    np.testing.assert_allclose(float(metrics["kl"]), ref.kl, rtol=RTOL, atol=1e-6)


def test_noise_comes_from_the_key_alone(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    a, _ = impl.loss(state, batch, jax.random.key(5))
    b, _ = impl.loss(state, batch, jax.random.key(5))
    c, _ = impl.loss(state, batch, jax.random.key(6))
    assert float(a) == float(b), "same key, different loss: hidden RNG state"
    assert float(a) != float(c), "different keys, same loss: the key is ignored"


@pytest.mark.parametrize("kind", ["bernoulli", "mse"])
def test_gradients_match_reference(impl, params, batch, kind):
    """d loss / d canonical parameters, through from_canonical, against the hand-derived float64
    gradient."""
    config = CONFIG.replace(loss=LossConfig(kind=kind))
    key = jax.random.key(12)

    def loss_of(p):
        return impl.loss(impl.from_canonical(p, config), batch, key)[0]

    grads = jax.grad(loss_of)(params)
    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(
        params, batch.x, batch.c, eps, num_classes=MODEL.num_classes, kind=kind
    )
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref.grads))
    for path, got in jax.tree_util.tree_leaves_with_path(grads):
        want = at_path(ref.grads, path)
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-6 * scale, err_msg=jax.tree_util.keystr(path)
        )


@pytest.mark.parametrize(
    "optim", [OptimConfig(), OptimConfig(learning_rate=3e-3, clip_norm=0.5, weight_decay=0.1)]
)
def test_train_step_matches_reference_update(impl, params, batch, optim):
    """One step equals the float64 gradient fed through the spec's optax transformation.

    Adam's first update is ``lr * g / (|g| + eps)`` per entry, so where |g| is at float32 noise
    level its sign is arbitrary: those entries are held to the bound every first Adam step obeys
    instead of to the reference's sign.
    """
    config = CONFIG.replace(optim=optim)
    key = jax.random.key(13)
    state, metrics = impl.train_step(impl.from_canonical(params, config), batch, key)
    got = impl.to_canonical(state)

    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(params, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
    tx = spec_optimizer(optim)
    grads32 = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), ref.grads)
    updates, _ = tx.update(grads32, tx.init(params), params)
    want = optax.apply_updates(params, updates)
    np.testing.assert_allclose(float(metrics["loss"]), ref.loss, rtol=RTOL)

    for path, g in jax.tree_util.tree_leaves_with_path(ref.grads):
        p0, p1, w = (np.asarray(at_path(t, path)) for t in (params, got, want))
        reliable = np.abs(g) > 1e-3 * np.abs(g).max()
        np.testing.assert_allclose(
            p1[reliable],
            w[reliable],
            rtol=1e-6,
            atol=1e-3 * optim.learning_rate,
            err_msg=jax.tree_util.keystr(path),
        )
        bound = optim.learning_rate * (1 + 1e-4) + optim.learning_rate * optim.weight_decay * (
            np.abs(p0) + 1e-6
        )
        assert np.all(np.abs(p1 - p0) <= bound), jax.tree_util.keystr(path)
        assert reliable.mean() > 0.5 or g.size < 8, "too few reliable entries to test this leaf"


def test_jitted_step_equals_eager_step(impl, params, batch):
    key = jax.random.key(14)
    eager, m_eager = impl.train_step(impl.from_canonical(params, CONFIG), batch, key)
    jitted, m_jit = jax.jit(impl.train_step)(impl.from_canonical(params, CONFIG), batch, key)
    chex.assert_trees_all_close(
        impl.to_canonical(eager), impl.to_canonical(jitted), rtol=1e-6, atol=1e-7
    )
    chex.assert_trees_all_close(m_eager, m_jit, rtol=1e-6)


def test_donated_step_leaves_callers_parameters_intact(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    step = jax.jit(impl.train_step, donate_argnums=0)
    for t in range(3):
        state, _ = step(state, batch, jax.random.key(t))
    out = impl.to_canonical(state)
    state, _ = step(state, batch, jax.random.key(9))  # donates the buffers `out` came from
    for leaf in jax.tree.leaves(out) + jax.tree.leaves(params):
        assert np.isfinite(np.asarray(leaf)).all()  # still readable: not a donated buffer


def test_a_few_dozen_steps_lower_the_loss_on_digits(impl):
    config = Config(model=ModelConfig(input_dim=64, num_classes=10, latent_dim=8))
    state = impl.from_canonical(reference_params(jax.random.key(0), config.model), config)
    xs, cs, fixed = digits(64, seed=0)
    step = jax.jit(impl.train_step, donate_argnums=0)
    before = float(impl.loss(state, fixed, jax.random.key(1))[0])
    for t in range(40):
        state, _ = step(state, Batch(xs[t % len(xs)], cs[t % len(cs)]), jax.random.key(t))
    after = float(impl.loss(state, fixed, jax.random.key(1))[0])
    assert after < 0.8 * before, (before, after)


# --- bad input through the protocol (SPEC section 7) ----------------------------------------------

BAD_BATCHES = {
    "x rank 1": (lambda b: Batch(b.x[0], b.c), "batch.x: expected rank 2"),
    "x features": (lambda b: Batch(b.x[:, :10], b.c), "batch.x: expected 64 features"),
    "x NaN": (lambda b: Batch(b.x.at[2, 3].set(jnp.nan), b.c), "batch.x: expected finite"),
    "x Inf": (lambda b: Batch(b.x.at[0, 0].set(jnp.inf), b.c), "batch.x: expected finite"),
    "x above 1": (
        lambda b: Batch(b.x.at[1, 1].set(1.5), b.c),
        "batch.x: expected values in [0, 1]",
    ),
    "x below 0": (lambda b: Batch(b.x.at[1, 1].set(-0.1), b.c), "batch.x: expected values in"),
    "x integer": (
        lambda b: Batch(jnp.zeros(b.x.shape, jnp.int32), b.c),
        "batch.x: expected a floating",
    ),
    "c float": (lambda b: Batch(b.x, b.c.astype(jnp.float32)), "batch.c: expected an integer"),
    "c too large": (lambda b: Batch(b.x, b.c.at[0].set(10)), "batch.c: expected labels in [0, 10)"),
    "c negative": (lambda b: Batch(b.x, b.c.at[0].set(-1)), "batch.c: expected labels in [0, 10)"),
    "c length": (lambda b: Batch(b.x, b.c[:-1]), "batch.c: expected 12 labels"),
    "c rank 2": (lambda b: Batch(b.x, b.c[:, None]), "batch.c: expected rank 1"),
    "empty": (lambda b: Batch(b.x[:0], b.c[:0]), "batch.x: expected at least one row"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
@pytest.mark.parametrize("entry", ["loss", "train_step"])
def test_bad_batches_are_refused(impl, params, batch, case, entry):
    state = impl.from_canonical(params, CONFIG)
    make, message = BAD_BATCHES[case]
    with pytest.raises(
        ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        getattr(impl, entry)(state, make(batch), jax.random.key(0))


def test_bad_encode_and_decode_inputs_are_refused(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    with pytest.raises(ValueError, match="x: expected 64 features"):
        impl.encode(state, batch.x[:, :5], batch.c)
    with pytest.raises(ValueError, match=r"c: expected labels in \[0, 10\)"):
        impl.encode(state, batch.x, batch.c.at[3].set(99))
    with pytest.raises(ValueError, match="z: expected"):
        impl.decode(state, jnp.zeros((B, MODEL.latent_dim + 1)), batch.c)
    with pytest.raises(ValueError, match="c: expected 12 labels"):
        impl.decode(state, jnp.zeros((B, MODEL.latent_dim)), batch.c[:3])


def test_wrong_parameter_trees_are_refused(impl, params):
    wrong_shape = jax.tree.map(lambda a: a, params)
    wrong_shape["latent"]["kernel"] = jnp.zeros((3, 3))
    with pytest.raises(ValueError, match=r"params\['latent'\]\['kernel'\]: expected shape"):
        impl.from_canonical(wrong_shape, CONFIG)
    missing_layer = dict(params, encoder=params["encoder"][:-1])
    with pytest.raises(ValueError, match=r"params\['encoder'\]: expected a list of 2 layers"):
        impl.from_canonical(missing_layer, CONFIG)
    with pytest.raises(ValueError):
        impl.from_canonical({"encoder": params["encoder"]}, CONFIG)


# --- initialisation, tracing and donation ---------------------------------------------------------

INIT_MODEL = ModelConfig(input_dim=784, num_classes=10, latent_dim=32)


def test_init_is_lecun_normal_with_zero_biases(impl):
    """Kernel variance 1/fan_in (truncated normal, corrected), within sampling error; biases 0."""
    from cvae_rosetta.spec.canonical import layer_sizes

    params = impl.to_canonical(impl.init(jax.random.key(3), Config(model=INIT_MODEL)))
    sizes = layer_sizes(INIT_MODEL)
    layers = [*params["encoder"], params["latent"], *params["decoder"]]
    fans = [*sizes["encoder"], *sizes["latent"], *sizes["decoder"]]
    for i, (layer, (fan_in, fan_out)) in enumerate(zip(layers, fans, strict=True)):
        kernel = np.asarray(layer["kernel"], np.float64)
        n = kernel.size
        ratio = kernel.var() * fan_in
        # the sample variance of n draws has relative standard error ~ sqrt(2 / n) (a bit less for
        # a truncated normal); allow five of them
        assert abs(ratio - 1.0) < 5 * np.sqrt(2.0 / n), f"layer {i}: variance x fan_in = {ratio}"
        assert abs(kernel.mean()) < 5 / np.sqrt(n * fan_in), f"layer {i}: mean {kernel.mean()}"
        # truncated at two standard deviations: no entry beyond 2 / sqrt(fan_in) * 1.14
        assert np.abs(kernel).max() <= 2.0 / 0.87962566103423978 / np.sqrt(fan_in) + 1e-6
        np.testing.assert_array_equal(layer["bias"], np.zeros(fan_out))


def test_init_depends_on_the_key(impl):
    a = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    b = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    c = impl.to_canonical(impl.init(jax.random.key(1), CONFIG))
    chex.assert_trees_all_equal(a, b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c), strict=True):
        if x.ndim == 2:
            assert not np.array_equal(x, y), "different keys gave the same kernel"


def test_step_traces_once_for_equal_configs(impl, params, batch):
    traces = []

    def counted(state, batch, key):
        traces.append(1)
        return impl.train_step(state, batch, key)

    step = jax.jit(counted)
    state = impl.from_canonical(params, CONFIG)
    for t in range(3):
        state, _ = step(state, batch, jax.random.key(t))
    # a state rebuilt from an equal (not identical) config must hit the same compiled step
    again = impl.from_canonical(params, Config.from_dict(CONFIG.to_dict()))
    step(again, make_batch(jax.random.key(99)), jax.random.key(5))
    assert len(traces) == 1, f"traced {len(traces)} times"


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
    assert not messages, messages
    assert np.isfinite(float(metrics["loss"]))
