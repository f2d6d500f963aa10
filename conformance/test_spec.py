"""The first conformance checks: every implementation against SPEC sections 1 to 6.

Each test touches only the protocol. Numbers are compared with the float64 NumPy reference of
``cvae_rosetta.conformance.reference``, computed from the same canonical parameters and the same
noise.

Every check gets arrays of its own (the ``params`` and ``batch`` fixtures hand out new buffers for
each check), so an implementation that keeps, donates or deletes what it is given fails the check
that shows it (``test_donated_step_leaves_callers_parameters_intact``) and nothing else. Every
failure's first line says what was seen against what the spec says, and names the mistake where a
known one explains it (``cvae_rosetta.conformance.common``: ``recon is 1/64 of the reference: a
mean over pixels where the spec sums``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import (
    ATOL,
    CONFIG,
    MODEL,
    RTOL,
    Axis,
    B,
    assert_close,
    assert_loss_matches,
    assert_refused,
    assert_trees_close,
    at_path,
    copy_to_host,
    decode_mistake,
    digits,
    encode_mistake,
    fresh,
    optimizer_mistakes,
    spec_noise,
    spec_step,
    step_mistake,
    suite_batch,
    suite_params,
    tree_mismatch,
    where_max,
)
from cvae_rosetta.spec.config import Config, LossConfig, ModelConfig, OptimConfig
from cvae_rosetta.spec.protocol import MEMBERS
from cvae_rosetta.spec.validation import Batch


@pytest.fixture
def params():
    """The suite's canonical parameters, in buffers of this check's own (see ``common.fresh``)."""
    return suite_params(42)


@pytest.fixture
def batch():
    return suite_batch(7)


def test_protocol_surface(impl):
    missing = [m for m in MEMBERS if not hasattr(impl, m)]
    assert not missing, f"the implementation lacks the protocol members {missing} (SPEC section 6)"
    assert isinstance(impl.name, str) and impl.name, (
        f"the implementation's name is {impl.name!r}: the spec wants a non-empty string"
    )
    for member in MEMBERS[1:]:
        assert callable(getattr(impl, member)), (
            f"the protocol member {member!r} is a {type(getattr(impl, member)).__name__}, "
            "not callable"
        )


def test_canonical_round_trip(impl, params):
    kept = copy_to_host(params)
    state = impl.from_canonical(params, CONFIG)
    back = impl.to_canonical(state)
    assert jax.tree.structure(back) == jax.tree.structure(kept), (
        f"to_canonical(from_canonical(params)) has the structure {jax.tree.structure(back)}; "
        f"the canonical tree given has {jax.tree.structure(kept)}"
    )
    for path, leaf in jax.tree_util.tree_leaves_with_path(back):
        want = at_path(kept, path)
        assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype), (
            f"to_canonical(from_canonical(params)){jax.tree_util.keystr(path)} is "
            f"{leaf.dtype}{list(leaf.shape)} where the canonical tree has "
            f"{want.dtype}{list(want.shape)}"
        )
    assert_trees_close(
        back,
        kept,
        "the round trip to_canonical(from_canonical(params))",
        rtol=0.0,
        against="the parameters given",
    )


def test_state_is_a_pytree_of_arrays(impl, params):
    state = impl.from_canonical(params, CONFIG)
    leaves = jax.tree.leaves(state)
    assert leaves, "the state has no array leaves: the spec's state is a pytree of arrays"
    for leaf in leaves:
        assert isinstance(leaf, jax.Array), (
            f"a state leaf is a {type(leaf).__name__}, not a jax.Array: the spec's state is a "
            "pytree of arrays"
        )


def test_init_gives_canonical_shapes_and_dtypes(impl):
    from cvae_rosetta.spec.canonical import shapes

    got = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    expected = shapes(MODEL)
    got_shapes = jax.tree.map(lambda a: tuple(a.shape), got)
    want_shapes = jax.tree.map(tuple, expected, is_leaf=lambda x: isinstance(x, tuple))
    assert got_shapes == want_shapes, (
        f"init's canonical parameters have the shapes {got_shapes}; the spec's are {want_shapes}"
    )
    for path, leaf in jax.tree_util.tree_leaves_with_path(got):
        assert leaf.dtype == jnp.float32, (
            f"init's parameter {jax.tree_util.keystr(path)} is {leaf.dtype}; the spec's are float32"
        )


def test_output_shapes(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    logits = impl.decode(state, mean, batch.c)
    loss, metrics = impl.loss(state, batch, jax.random.key(1))
    expected = {
        "encode's mean": (mean, (B, MODEL.latent_dim)),
        "encode's logvar": (logvar, (B, MODEL.latent_dim)),
        "decode's logits": (logits, (B, MODEL.input_dim)),
        "loss": (loss, ()),
    }
    for what, (value, shape) in expected.items():
        assert np.shape(value) == shape, (
            f"{what} has shape {np.shape(value)}; the spec's is {shape}"
        )
        assert value.dtype == jnp.float32, f"{what} is {value.dtype}; the spec returns float32"
    missing = {"loss", "recon", "kl"} - set(metrics)
    assert not missing, f"the metrics lack {sorted(missing)}; the spec's are loss, recon and kl"
    for name, value in metrics.items():
        assert np.shape(value) == (), (
            f"metrics[{name!r}] has shape {np.shape(value)}; the spec's metrics are scalars"
        )


def _unchanged_rows(a, b) -> np.ndarray:
    """Rows of two outputs that do not differ by more than 1e-4 anywhere."""
    return np.flatnonzero(np.abs(np.asarray(a) - np.asarray(b)).max(axis=1) <= 1e-4)


def test_labels_condition_both_sides(impl, params, batch):
    """Changing only the labels changes the encoder's and the decoder's output, in every row."""
    state = impl.from_canonical(params, CONFIG)
    other = (batch.c + 1) % MODEL.num_classes
    z = jnp.zeros((B, MODEL.latent_dim))
    sides = (
        ("encode", "encoder", impl.encode(state, batch.x, batch.c)[0]),
        ("decode", "decoder", impl.decode(state, z, batch.c)),
    )
    changed = (impl.encode(state, batch.x, other)[0], impl.decode(state, z, other))
    for (call, part, before), after in zip(sides, changed, strict=True):
        same = _unchanged_rows(before, after)
        assert len(same) < B, (
            f"{call}'s output does not change when only c changes: the {part} ignores the label"
        )
        assert not len(same), (
            f"{call}'s output does not change in rows {same.tolist()} of {B} when only c "
            f"changes: the {part} sees the label in some rows only"
        )


def test_encode_decode_match_reference(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    ref_mean, ref_logvar = reference.encode(params, batch.x, batch.c, MODEL.num_classes)

    def encode_hint():
        return encode_mistake(
            impl, state, params, batch.x, batch.c, mean, logvar, MODEL.num_classes
        )

    for what, got, want in (("mean", mean, ref_mean), ("logvar", logvar, ref_logvar)):
        assert_close(got, want, f"encode's {what}", rtol=RTOL, atol=ATOL, explain=encode_hint)
    z = jax.random.normal(jax.random.key(3), (B, MODEL.latent_dim))
    logits = impl.decode(state, z, batch.c)
    assert_close(
        logits,
        reference.decode(params, z, batch.c, MODEL.num_classes),
        "decode's logits",
        rtol=RTOL,
        atol=ATOL,
        explain=lambda: decode_mistake(impl, state, params, z, batch.c, logits, MODEL.num_classes),
    )


@pytest.mark.parametrize(
    "kind,beta", [("bernoulli", 1.0), ("bernoulli", 0.25), ("mse", 1.0), ("mse", 3.0)]
)
def test_loss_matches_reference(impl, params, batch, kind, beta):
    config = CONFIG.replace(loss=LossConfig(kind=kind, beta=beta))
    state = impl.from_canonical(params, config)
    key = jax.random.key(11)
    loss, metrics = impl.loss(state, batch, key)
    assert_loss_matches(loss, metrics, params, batch, key, kind=kind, beta=beta, model=MODEL)


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
        start, batch.x, batch.c, eps, num_classes=MODEL.num_classes, kind=kind
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


def assert_first_step(start, got, grads, optim: OptimConfig, what: str = "after one step"):
    """The parameters after one step against the float64 gradient fed through the spec's
    optimiser (see test_train_step_matches_reference_update)."""
    grads32 = jax.tree.map(lambda g: np.asarray(g, np.float32), grads)
    want, _ = spec_step(optim, start, grads32)
    masks = jax.tree.map(lambda g: np.abs(g) > 1e-3 * np.abs(g).max(), grads)
    atol = 1e-3 * optim.learning_rate
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        p0, p1, w = (np.asarray(at_path(t, path)) for t in (start, got, want))
        reliable = at_path(masks, path)
        name = f"{what}, {jax.tree_util.keystr(path)}"
        assert_close(
            p1[reliable],
            w[reliable],
            name,
            rtol=1e-6,
            atol=atol,
            against="the reference update (the spec's clipped AdamW)",
            explain=lambda: step_mistake(got, optimizer_mistakes(start, grads, optim), masks, atol),
        )
        bound = optim.learning_rate * (1 + 1e-4) + optim.learning_rate * optim.weight_decay * (
            np.abs(p0) + 1e-6
        )
        moved = np.abs(p1 - p0)
        assert np.all(moved <= bound), (
            f"{name} moved by up to {moved.max():.3g}{where_max(moved - bound)}; Adam's first step "
            f"moves an entry by at most lr (1 + weight_decay |p|) = {bound.max():.3g}"
        )
        assert reliable.mean() > 0.5 or g.size < 8, (
            f"{name}: too few entries with a gradient above float32 noise to check "
            f"({reliable.mean():.0%}): the check itself is broken"
        )


@pytest.mark.parametrize(
    "optim", [OptimConfig(), OptimConfig(learning_rate=3e-3, clip_norm=0.5, weight_decay=0.1)]
)
def test_train_step_matches_reference_update(impl, params, batch, optim):
    """One step equals the float64 gradient fed through the spec's optax transformation.

    Adam's first update is ``lr * g / (|g| + eps)`` per entry, so where |g| is at float32 noise
    level its sign is arbitrary: those entries are held to the bound every first Adam step obeys
    instead of to the reference's sign.

    The step runs jitted, as training runs it: one compiled program, where op by op every small
    operation of the update compiles on its own. That the eager step is the jitted one is a check
    of the ``jit`` layer (test_jitted_step_equals_eager_step).
    """
    config = CONFIG.replace(optim=optim)
    key = jax.random.key(13)
    start = copy_to_host(params)
    state, metrics = jax.jit(impl.train_step)(impl.from_canonical(params, config), batch, key)
    got = impl.to_canonical(state)

    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(start, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
    assert_close(float(metrics["loss"]), ref.loss, "the step's metrics['loss']", rtol=RTOL)
    assert_first_step(start, got, ref.grads, optim)


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
    assert_refused(
        lambda: getattr(impl, entry)(state, make(batch), jax.random.key(0)),
        f"{entry} of a batch with {case}",
        message,
    )


def test_bad_encode_and_decode_inputs_are_refused(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    z = jnp.zeros((B, MODEL.latent_dim))
    assert_refused(
        lambda: impl.encode(state, batch.x[:, :5], batch.c),
        "encode of x with 5 features",
        "x: expected 64 features",
    )
    assert_refused(
        lambda: impl.encode(state, batch.x, batch.c.at[3].set(99)),
        "encode of a label 99",
        "c: expected labels in [0, 10)",
    )
    assert_refused(
        lambda: impl.decode(state, jnp.zeros((B, MODEL.latent_dim + 1)), batch.c),
        f"decode of z with {MODEL.latent_dim + 1} columns",
        "z: expected",
    )
    assert_refused(
        lambda: impl.decode(state, z, batch.c[:3]),
        f"decode of {B} rows of z with 3 labels",
        "c: expected 12 labels",
    )


def test_wrong_parameter_trees_are_refused(impl, params):
    wrong_shape = jax.tree.map(lambda a: a, params)
    wrong_shape["latent"]["kernel"] = jnp.zeros((3, 3))
    assert_refused(
        lambda: impl.from_canonical(wrong_shape, CONFIG),
        "from_canonical of a 3 x 3 latent kernel",
        "params['latent']['kernel']: expected shape",
    )
    missing_layer = dict(params, encoder=params["encoder"][:-1])
    assert_refused(
        lambda: impl.from_canonical(missing_layer, CONFIG),
        "from_canonical of an encoder of one layer",
        "params['encoder']: expected a list of 2 layers",
    )
    assert_refused(
        lambda: impl.from_canonical({"encoder": params["encoder"]}, CONFIG),
        "from_canonical of a tree without 'latent' and 'decoder'",
        "params",
    )


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
        what = f"init's layer {i} ({fan_in} -> {fan_out})"
        # the sample variance of n draws has relative standard error ~ sqrt(2 / n) (a bit less for
        # a truncated normal); allow five of them
        assert abs(ratio - 1.0) < 5 * np.sqrt(2.0 / n), (
            f"{what} has kernel variance {ratio:.4g} / fan_in; the spec's LeCun normal has "
            f"1 / fan_in (within {5 * np.sqrt(2.0 / n):.2g})"
        )
        assert abs(kernel.mean()) < 5 / np.sqrt(n * fan_in), (
            f"{what} has kernel mean {kernel.mean():.3g}; the spec's LeCun normal has mean 0 "
            f"(within {5 / np.sqrt(n * fan_in):.2g})"
        )
        # truncated at two standard deviations: no entry beyond 2 / sqrt(fan_in) * 1.14
        limit = 2.0 / 0.87962566103423978 / np.sqrt(fan_in) + 1e-6
        assert np.abs(kernel).max() <= limit, (
            f"{what} has a kernel entry {np.abs(kernel).max():.3g} from 0; the spec's truncated "
            f"normal stops at two standard deviations, {limit:.3g}"
        )
        bias = np.asarray(layer["bias"])
        assert np.all(bias == 0), (
            f"{what} has {int(np.sum(bias != 0))} nonzero biases (largest "
            f"{np.abs(bias).max():.3g}); the spec initialises biases to 0"
        )


def test_init_depends_on_the_key(impl):
    a = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    b = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    c = impl.to_canonical(impl.init(jax.random.key(1), CONFIG))
    assert_trees_close(
        b, a, "init with key 0, twice,", rtol=0.0, against="the first init with that key"
    )
    for path, x in jax.tree_util.tree_leaves_with_path(a):
        if x.ndim == 2:
            assert not np.array_equal(x, at_path(c, path)), (
                f"init with keys 0 and 1 gave the same kernel {jax.tree_util.keystr(path)}: "
                "the key passed in is ignored"
            )


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
