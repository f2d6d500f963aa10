"""Properties of every implementation, over drawn models, batches, parameters and keys.

The examples come from ``cvae_rosetta.conformance.strategies`` (the spec alone, never an
implementation); how many, and whether they are derandomised, is the hypothesis profile's business
(``ci`` or ``thorough``, registered by the plugin). Each test touches only the protocol, and
numbers are compared with the float64 reference of ``cvae_rosetta.conformance.reference`` from the
same canonical parameters and the same noise ``eps = normal(key, (B, L))``.

Every drawn shape costs a compilation, whatever the call style: dispatching a call op by op
compiles each operation for the new shapes, and measured about three times slower than compiling
the call once. So the numerical checks run the protocol's calls under ``jax.jit`` (the value checks
of SPEC section 7 then cannot run, which is fine: the inputs here are valid); the drawn refusals,
checks of the ``bad_input`` layer (``test_bad_input.py``), run eagerly, where the value checks do
run.

Tolerances are float32 against float64, with the float32 argument next to each; where a gradient
enters (gradients, the Adam step) the example is discarded if a ReLU input lies so close to its
kink that float32 rounding can put it on the other side (see :func:`relu_inputs`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.assertions import assert_close, assert_trees_close
from cvae_rosetta.conformance.common import ATOL, RTOL, at_path, fresh, spec_noise
from cvae_rosetta.conformance.hypotheses import explain_step, searched_step
from cvae_rosetta.conformance.messages import Axis, loss_axes, where_max
from cvae_rosetta.conformance.mistakes import (
    KL_NOTES,
    Loaded,
    LossInputs,
    assert_loss_matches,
    beta_notes,
    decode_mistake,
    encode_mistake,
    total_mistake,
)
from cvae_rosetta.conformance.strategies import (
    Case,
    canonical_params,
    cases,
    keys,
    labels,
    latents,
    loss_configs,
    optim_configs,
    shared_models,
)
from cvae_rosetta.conformance.strategies import batches as batches_for
from cvae_rosetta.spec.canonical import layer_sizes
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.model import generate, reconstruct
from cvae_rosetta.spec.validation import Batch

U = 2.0**-24  # float32 unit roundoff
TINY_STEP = 1e-6  # central differences in float64


# --- helpers --------------------------------------------------------------------------------------

_COMPILED: dict = {}


def compiled(impl, probe):
    """``probe(impl, ...)`` under ``jax.jit`` with ``config`` static, one per implementation.

    A probe runs ``from_canonical`` and the calls a check needs in one compilation (and returns the
    spec's noise ``normal(key, (B, L))`` where the check needs it), so a drawn shape costs one
    compilation, not one per call.
    """
    key = (id(impl), probe.__name__)
    if key not in _COMPILED:
        _COMPILED[key] = jax.jit(functools.partial(probe, impl), static_argnames="config")
    fn = _COMPILED[key]

    def call(*args, config):
        try:
            return fn(*args, config=config)
        except Exception as err:  # an exception of the implementation's: which model it was
            said = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise AssertionError(
                f"the implementation raised {type(err).__name__} for {describe_model(config.model)}"
                f" (the spec's model takes any sizes): {said[:200]}"
            ) from err

    return call


def describe_model(model) -> str:
    return (
        f"a model of {model.input_dim} pixels, {model.num_classes} labels, latent dimension "
        f"{model.latent_dim}, encoder widths {list(model.encoder_dims)} and decoder widths "
        f"{list(model.decoder_dims)}"
    )


def forward_probe(impl, params, x, c, z, config):
    state = impl.from_canonical(params, config)
    return impl.encode(state, x, c), impl.decode(state, z, c)


def reference_probe(impl, params, batch, key, config):
    """``eps``; ``(loss, metrics)`` and d loss / d canonical params, through ``from_canonical``;
    the canonical parameters after one train step, and that step's metrics. (One compilation for
    both: XLA shares the step's gradient with the other one.)"""

    def loss_of(p):
        return impl.loss(impl.from_canonical(p, config), batch, key)

    eps = jax.random.normal(key, (batch.x.shape[0], config.model.latent_dim))
    loss_metrics, grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    state, step_metrics = impl.train_step(impl.from_canonical(params, config), batch, key)
    return eps, loss_metrics, grads, impl.to_canonical(state), step_metrics


def kl_probe(impl, params, prior_params, batch, key, config):
    """The loss at ``params``; encode and the loss at ``prior_params``."""
    prior = impl.from_canonical(prior_params, config)
    return (
        impl.loss(impl.from_canonical(params, config), batch, key),
        impl.encode(prior, batch.x, batch.c),
        impl.loss(prior, batch, key),
    )


class Permuted(NamedTuple):
    """A batch, and the same rows in another order."""

    batch: Batch
    shuffled: Batch


def permutation_probe(impl, params, quiet_params, batches: Permuted, key, config):
    batch, shuffled = batches
    state = impl.from_canonical(params, config)
    quiet = impl.from_canonical(quiet_params, config)
    eps = jax.random.normal(key, (batch.x.shape[0], config.model.latent_dim))
    return (
        eps,
        impl.loss(state, shuffled, key),
        impl.loss(quiet, batch, key),
        impl.loss(quiet, shuffled, key),
    )


def mse_probe(impl, params, batch, key, config):
    """The pieces of the loss as the protocol shows them: encode, the spec's z, decode, loss."""
    state = impl.from_canonical(params, config)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    eps = jax.random.normal(key, mean.shape)
    logits = impl.decode(state, mean + jnp.exp(0.5 * logvar) * eps, batch.c)
    return mean, logvar, logits, impl.loss(state, batch, key)


def state_probe(impl, params, config):
    return impl.from_canonical(params, config)


def reference_of(case: Case, eps, batch: Batch | None = None, params=None) -> reference.Result:
    """The float64 reference for ``case`` (or another batch or parameters) at noise ``eps``."""
    batch = case.batch if batch is None else batch
    return reference.loss_and_grad(
        case.params if params is None else params,
        batch.x,
        batch.c,
        eps,
        num_classes=case.model.num_classes,
        loss=case.config.loss,
    )


def relu_inputs(params, x, c, eps, num_classes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every ReLU input of the forward pass in float64, with the sum of the magnitudes of its
    terms (``|h| @ |W| + |b|``), layer by layer: encoder layers, then decoder hidden layers.

    A float32 dot product is within ~ fan_in * u of that sum of magnitudes (fan_in <= 40 here, so
    ~2.4e-6 of it); an input within 1e-4 of it from zero may therefore sit on either side of the
    kink in float32, where the derivative jumps, and no tolerance is right for it.
    """
    p = reference.as64(params)
    y = reference.one_hot(c, num_classes)
    out = []

    def layer(h, lay):
        a = h @ lay["kernel"] + lay["bias"]
        out.append((a, np.abs(h) @ np.abs(lay["kernel"]) + np.abs(lay["bias"])))
        return np.maximum(a, 0.0)

    h = np.concatenate([np.asarray(x, np.float64), y], axis=1)
    for lay in p["encoder"]:
        h = layer(h, lay)
    s = h @ p["latent"]["kernel"] + p["latent"]["bias"]
    latent = s.shape[1] // 2
    z = s[:, :latent] + np.exp(0.5 * s[:, latent:]) * np.asarray(eps, np.float64)
    h = np.concatenate([z, y], axis=1)
    for lay in p["decoder"][:-1]:
        h = layer(h, lay)
    return out


def assume_clear_of_kinks(case: Case, eps) -> None:
    for a, size in relu_inputs(
        case.params, case.batch.x, case.batch.c, eps, case.model.num_classes
    ):
        assume(np.all(np.abs(a) >= 1e-4 * size))


def with_latent(params, kernel: np.ndarray, bias: np.ndarray):
    # NumPy, then one transfer: nothing is compiled for the new shapes
    latent = {"kernel": jnp.asarray(kernel, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)}
    return {**params, "latent": latent}


def with_zero_latent(params):
    """The latent layer's kernel and bias zero: mean = logvar = 0 for any input."""
    lat = params["latent"]
    return with_latent(params, np.zeros(lat["kernel"].shape), np.zeros(lat["bias"].shape))


def with_negligible_noise(params, latent_dim: int, logvar: float = -80.0):
    """logvar = -80 for every input (its half of the latent layer zeroed, its bias -80): the noise
    enters z as exp(-40) * eps ~ 4e-18 * eps, far below float32 resolution of anything else."""
    kernel = np.array(params["latent"]["kernel"])
    bias = np.array(params["latent"]["bias"])
    kernel[:, latent_dim:] = 0.0
    bias[latent_dim:] = logvar
    return with_latent(params, kernel, bias)


# --- agreement with the float64 reference ---------------------------------------------------------


@settings(report_multiple_bugs=False)
@given(case=cases(), data=st.data())
def test_encode_and_decode_match_reference(impl, case, data):
    z = data.draw(latents(case.model, case.b), label="z")
    (mean, logvar), logits = compiled(impl, forward_probe)(
        case.params, *case.batch, z, config=case.config
    )
    ref_mean, ref_logvar = reference.encode(case.params, *case.batch, case.model.num_classes)
    num_classes = case.model.num_classes

    def state():
        return impl.from_canonical(fresh(case.params), case.config)

    def encode_hint():
        x, c = case.batch
        return encode_mistake(Loaded(impl, state(), case.params), x, c, mean, logvar, num_classes)

    for what, got, want in (("mean", mean, ref_mean), ("logvar", logvar, ref_logvar)):
        assert_close(got, want, f"encode's {what}", rtol=RTOL, atol=ATOL, explain=encode_hint)
    assert_close(
        logits,
        reference.decode(case.params, z, case.batch.c, num_classes),
        "decode's logits",
        rtol=RTOL,
        atol=ATOL,
        explain=lambda: decode_mistake(
            Loaded(impl, state(), case.params), z, case.batch.c, logits, num_classes
        ),
    )
    for what, value, shape in [
        ("encode's mean", mean, (case.b, case.model.latent_dim)),
        ("decode's logits", logits, case.batch.x.shape),
    ]:
        assert value.shape == shape and value.dtype == jnp.float32, (
            f"{what} is {value.dtype}{list(value.shape)}; the spec's is float32{list(shape)}"
        )


def first_adamw_step(params, grads, optim):
    """SPEC section 5 from a fresh optimiser state, in float64: clip to the global norm (optax
    scales by clip_norm / norm when norm exceeds it), then AdamW's first step, whose
    bias-corrected moments are exactly g and g^2: ``p - lr (g / (|g| + eps) + wd p)``."""
    norm = np.sqrt(sum(float(np.sum(g**2)) for g in jax.tree.leaves(grads)))
    factor = 1.0 if norm < optim.clip_norm else optim.clip_norm / norm
    lr, wd = optim.learning_rate, optim.weight_decay

    def update(p, g):
        g = factor * g
        return p - lr * (g / (np.abs(g) + 1e-8) + wd * p)

    return jax.tree.map(update, reference.as64(params), grads)


@settings(report_multiple_bugs=False)
@given(case=cases(losses=loss_configs(), optims=optim_configs()))
def test_loss_gradients_and_train_step_match_reference(impl, case):
    """From the same canonical parameters and noise as the float64 reference:

    - the loss and its metrics, for both kinds and any beta >= 0;
    - d loss / d canonical parameters, through ``from_canonical`` (as
      ``test_gradients.test_gradients_match_reference``);
    - one train step: the reference gradient through the spec's optimiser (drawn settings).

    Adam's first update is ``lr * g / (|g| + eps)`` per entry, so its sign is that of g: where |g|
    is at float32 noise level the sign is arbitrary. An entry counts as reliable when |g| exceeds
    1e-3 of its leaf's largest entry and 1e-4 of the largest of all (float32 gradient entries are
    accurate to ~fan_in * u ~ 1e-5 of the magnitudes summed into them, which the largest gradients
    bound); the others are held to the bound every first AdamW step obeys.
    """
    eps, (loss, metrics), grads, stepped, step_metrics = compiled(impl, reference_probe)(
        case.params, case.batch, case.key, config=case.config
    )
    ref = reference_of(case, eps)
    inputs = LossInputs(case.params, case.batch, case.key, case.config)
    for what, (total, terms) in (("", (loss, metrics)), ("the step's ", (None, step_metrics))):
        assert_loss_matches(terms["loss"] if total is None else total, terms, inputs, what=what)

    assume_clear_of_kinks(case, eps)
    top = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref.grads))
    assert_trees_close(
        grads,
        ref.grads,
        "d loss / d params",
        rtol=1e-4,
        atol=1e-6 * top,
        axes=(Axis("the batch", case.b, "mean"),),
    )

    optim = case.config.optim
    want = first_adamw_step(case.params, ref.grads, optim)
    lr, wd = optim.learning_rate, optim.weight_decay
    masks = jax.tree.map(
        lambda g: (np.abs(g) > 1e-3 * np.abs(g).max()) & (np.abs(g) > 1e-4 * top), ref.grads
    )
    for path, reliable in jax.tree_util.tree_leaves_with_path(masks):
        name = f"after one step, {jax.tree_util.keystr(path)}"
        p0, p1, w = (np.asarray(at_path(t, path), np.float64) for t in (case.params, stepped, want))
        bad = ~np.isfinite(p1)
        assert not bad.any(), f"{name} has {int(bad.sum())} non-finite entries{where_max(bad)}"
        assert_close(
            p1[reliable],
            w[reliable],
            name,
            rtol=1e-6,
            atol=1e-3 * lr,
            against="the reference update (the spec's clipped AdamW)",
            explain=explain_step(
                stepped, [(case.params, ref.grads)], optim, masks, 1e-3 * lr, want
            ),
            searched=searched_step(optim, 1),
        )
        # |g / (|g| + eps)| < 1; the slack is float32 rounding of p1 and of the update
        bound = lr * (1 + 1e-4) + lr * wd * (np.abs(p0) + 1e-6) + 2 * U * np.abs(p0)
        moved = np.abs(p1 - p0)
        assert np.all(moved <= bound), (
            f"{name} moved by up to {moved.max():.3g}{where_max(moved - bound)}; Adam's first step "
            f"moves an entry by at most lr (1 + weight_decay |p|) = {bound.max():.3g}"
        )


# --- properties of the loss -----------------------------------------------------------------------


@settings(report_multiple_bugs=False)
@given(case=cases(losses=loss_configs()))
def test_kl_is_nonnegative_and_exactly_zero_at_the_prior(impl, case):
    """KL(q || N(0, I)) >= 0, a Bernoulli negative log-likelihood >= 0, and the KL is exactly 0
    where q is the prior.

    Each KL term 0.5 (e^lv + m^2 - 1 - lv) is >= 0 and exactly 0 only at m = lv = 0; near there
    float32 cancellation leaves an error of a few u per term, so the KL may be as low as -4u per
    term summed (L of them per example for bernoulli, their mean for mse) and no lower. The
    Bernoulli terms are relu(l) - l x + log1p(e^-|l|) (or -x log s - (1 - x) log(1 - s)), each
    rounded to a value >= 0 for x in [0, 1]: their sum is >= 0 exactly.

    With the latent layer zero, mean = logvar = 0 for every input: every KL term is
    0.5 (1 + 0 - 1 - 0), which float32 computes exactly, so the KL is exactly 0.0 and the loss
    exactly the reconstruction term.
    """
    (loss, metrics), (mean, logvar), (prior_loss, prior_metrics) = compiled(impl, kl_probe)(
        case.params, with_zero_latent(case.params), case.batch, case.key, config=case.config
    )
    terms = case.model.latent_dim if case.config.loss.kind == "bernoulli" else 1
    kl, recon = float(metrics["kl"]), float(metrics["recon"])
    assert kl >= -4 * U * terms, (
        f"kl is {kl!r}; KL(q || N(0, I)) is >= 0 (to float32 rounding, {-4 * U * terms:.3g})"
    )
    assert recon >= 0.0, f"recon is {recon!r}; a Bernoulli or squared-error term is >= 0"
    assert float(loss) >= -4 * U * terms * case.config.loss.beta, (
        f"the loss is {float(loss)!r}; recon + beta kl is >= 0"
    )

    assert np.all(np.asarray(mean) == 0.0) and np.all(np.asarray(logvar) == 0.0), (
        "with the latent layer zero, encode gives mean and logvar up to "
        f"{max(np.abs(np.asarray(mean)).max(), np.abs(np.asarray(logvar)).max()):.3g}; the spec's "
        "are exactly 0"
    )
    assert float(prior_metrics["kl"]) == 0.0, (
        f"kl at the prior (mean = logvar = 0) is {float(prior_metrics['kl'])!r}; the spec's "
        "0.5 (exp(0) + 0 - 1 - 0) is exactly 0"
    )
    assert float(prior_loss) == float(prior_metrics["recon"]), (
        f"the loss at the prior is {float(prior_loss)!r}, not recon "
        f"{float(prior_metrics['recon'])!r} (the KL term there is exactly 0)"
    )


@settings(report_multiple_bugs=False)
@given(case=cases(losses=loss_configs()), data=st.data())
def test_loss_is_invariant_under_permuting_the_batch(impl, case, data):
    """The loss is a mean over examples: permuting the rows, with the noise permuted alike,
    changes nothing.

    The protocol takes a key, and row i of a batch always gets row i of ``normal(key, (B, L))``,
    so the noise cannot be permuted through it. Three checks make the property instead:
    1. the float64 reference is invariant under permuting rows and noise together;
    2. the implementation, on the permuted batch, agrees with the reference at that batch's spec
       noise (so by 1 it computes the permuted-noise loss of the original batch);
    3. with the noise made negligible (logvar = -80: z moves by ~4e-18 eps) the implementation's
       own loss and metrics on the permuted batch equal those on the original one, to float32
       reordering: the n = B (D + L) summed terms in another order (n u), and every dot product
       that may run in another order for a row at another position (fan_in u per layer).
    """
    perm = np.asarray(data.draw(st.permutations(range(case.b)), label="permutation"))
    x, c = (np.asarray(a) for a in case.batch)
    shuffled = Batch(jnp.asarray(x[perm]), jnp.asarray(c[perm]))
    quiet_params = with_negligible_noise(case.params, case.model.latent_dim)
    eps, (got, _), (_, before), (_, after) = compiled(impl, permutation_probe)(
        case.params, quiet_params, Permuted(case.batch, shuffled), case.key, config=case.config
    )
    eps = np.asarray(eps, np.float64)

    ref = reference_of(case, eps)
    ref_perm = reference_of(case, eps[perm], batch=shuffled)
    for name in ("loss", "recon", "kl"):
        assert_close(
            getattr(ref_perm, name),
            getattr(ref, name),
            f"the reference's {name} on the permuted batch and noise",
            rtol=1e-12,
            against="on the original (the checker itself is wrong)",
        )

    want = reference_of(case, eps, batch=shuffled).loss
    beta = case.config.loss.beta
    assert_close(
        float(got), want, "the loss on the permuted batch", rtol=RTOL, atol=1e-6 * (1 + beta)
    )

    model = case.model
    fan_ins = sum(fan_in for group in layer_sizes(model).values() for fan_in, _ in group)
    rtol = 2 * U * (case.b * (model.input_dim + model.latent_dim) + fan_ins)
    for name in ("loss", "recon", "kl"):
        assert_close(
            float(after[name]),
            float(before[name]),
            f"{name} on the permuted batch, noise negligible,",
            rtol=rtol,
            against="on the original batch (the spec's loss is a mean over rows)",
        )


@settings(report_multiple_bugs=False)
@given(case=cases(losses=loss_configs(kinds=("mse",))))
def test_mse_loss_is_the_guides_definition(impl, case):
    """``recon = mean_ij 0.5 (sigmoid(logits) - x)^2`` and ``kl = -0.5 mean(1 + logvar - mean^2 -
    exp(logvar))`` (the source guide's formula, means over every element, not sums), from the
    implementation's own encode and decode at the spec's z, and ``loss = recon + beta kl``."""
    mean, logvar, logits, (loss, metrics) = compiled(impl, mse_probe)(
        case.params, case.batch, case.key, config=case.config
    )
    mean, logvar, logits = (np.asarray(a, np.float64) for a in (mean, logvar, logits))
    x = np.asarray(case.batch.x, np.float64)
    recon = np.mean(0.5 * (reference.sigmoid(logits) - x) ** 2)
    kl = -0.5 * np.mean(1 + logvar - mean**2 - np.exp(logvar))
    beta = case.config.loss.beta
    # float32: each element's recon to ~u (|s - x| <= 1), the KL as in assert_metrics_match
    guide = "the guide's mse definition from the implementation's own encode and decode"
    b = case.b
    assert_close(
        float(metrics["recon"]),
        recon,
        "recon",
        rtol=RTOL,
        atol=1e-6,
        against=guide,
        axes=loss_axes("mse", "recon", b, case.model),
    )
    assert_close(
        float(metrics["kl"]),
        kl,
        "kl",
        rtol=RTOL,
        atol=1e-6,
        against=guide,
        axes=loss_axes("mse", "kl", b, case.model),
        notes=beta_notes("kl", beta, KL_NOTES),
    )
    assert_close(
        float(loss),
        recon + beta * kl,
        "the loss",
        rtol=RTOL,
        atol=1e-6 * (1 + beta),
        against=guide,
        explain=lambda: total_mistake(float(loss), recon, kl, beta),
    )
    assert_close(
        float(metrics["loss"]),
        float(metrics["recon"]) + beta * float(metrics["kl"]),
        'metrics["loss"]',
        rtol=4 * U,
        against="its own recon + beta * kl",
    )


# --- the reference's own gradient against finite differences -------------------------------------


@settings(report_multiple_bugs=False)
@given(case=cases(losses=loss_configs()), data=st.data())
def test_reference_gradient_matches_central_differences(case, data):
    """The hand-derived float64 gradient of ``cvae_rosetta.conformance.reference`` against central
    differences of its loss (step 1e-6) on a drawn handful of entries: the implementations are held
    to that gradient above, so this checks the checker. Examples where a step crosses a ReLU kink
    are discarded (the derivative is not defined there).

    float64: rounding of each loss evaluation ~1e-14 |f|, over a 2e-6 step ~5e-9 |f|; truncation
    h^2 f''' / 6 ~1e-12 f'''. Hence 1e-7 max(1, |f|), with room to spare.
    """
    eps = spec_noise(case.key, case.b, case.model.latent_dim)
    base = reference.as64(case.params)
    ref = reference_of(case, eps, params=base)
    leaves, treedef = jax.tree.flatten(base)
    picks = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(leaves) - 1), st.integers(0, 2**16)),
            min_size=1,
            max_size=6,
        ),
        label="entries (leaf, index)",
    )
    grads = jax.tree.leaves(ref.grads)
    signs = [np.sign(a) for a, _ in relu_inputs(base, *case.batch, eps, case.model.num_classes)]
    for leaf, index in picks:
        index = index % leaves[leaf].size
        values = []
        for step in (TINY_STEP, -TINY_STEP):
            moved = [np.array(v, copy=True) for v in leaves]
            moved[leaf].flat[index] += step
            params = jax.tree.unflatten(treedef, moved)
            now = [
                np.sign(a) for a, _ in relu_inputs(params, *case.batch, eps, case.model.num_classes)
            ]
            assume(all(np.array_equal(s, t) for s, t in zip(signs, now, strict=True)))
            values.append(reference_of(case, eps, params=params).loss)
        fd = (values[0] - values[1]) / (2 * TINY_STEP)
        exact = grads[leaf].flat[index]
        note(f"leaf {leaf} entry {index}: central difference {fd!r}, hand-derived {exact!r}")
        assert abs(fd - exact) <= 1e-7 * max(1.0, abs(ref.loss)) + 1e-6 * abs(exact), (
            f"the reference's own gradient, leaf {leaf} entry {index}, is {exact!r} where central "
            f"differences of its loss give {fd!r}: the checker is wrong"
        )


# --- generation and reconstruction ----------------------------------------------------------------


@settings(report_multiple_bugs=False)
@given(
    model=shared_models,
    params=shared_models.flatmap(
        lambda m: canonical_params(m, scales=st.sampled_from([1.0, 30.0]))
    ),
    labels=shared_models.flatmap(labels),
    batch=shared_models.flatmap(batches_for),
    key=keys(),
)
def test_generated_images_lie_in_the_unit_interval_and_reconstruction_is_deterministic(
    impl, model, params, labels, batch, key
):
    """Large parameters (scale 30) saturate the sigmoid: exact 0.0 and 1.0 are still in [0, 1]."""
    state = compiled(impl, state_probe)(params, config=Config(model=model))
    images = np.asarray(generate(impl, state, key, labels))
    want = (labels.shape[0], model.input_dim)
    assert images.shape == want, f"generated images have shape {images.shape}; expected {want}"
    assert_in_unit_interval(images, "generated images")
    assert_close(
        np.asarray(generate(impl, state, key, labels)),
        images,
        "generated images, the same key again,",
        rtol=0.0,
        against="the first ones",
    )

    first = np.asarray(reconstruct(impl, state, *batch))
    second = np.asarray(reconstruct(impl, state, *batch))
    assert first.shape == batch.x.shape, (
        f"reconstructions have shape {first.shape}; the batch has {batch.x.shape}"
    )
    assert_close(second, first, "a second reconstruction", rtol=0.0, against="the first")
    assert_in_unit_interval(first, "reconstructions")


def assert_in_unit_interval(images: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(images)
    assert not bad.any(), (
        f"{what} have {int(bad.sum())} non-finite pixels{where_max(bad)}; sigmoid(decode(z, c)) "
        "is in [0, 1]"
    )
    assert images.min() >= 0.0 and images.max() <= 1.0, (
        f"{what} range over [{images.min()!r}, {images.max()!r}]; sigmoid(decode(z, c)) is in "
        "[0, 1]"
    )
