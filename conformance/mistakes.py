"""The catalogue of known porting mistakes: what a failed check says when one explains what it saw.

Each is tried only once the check has failed, against the float64 reference computed the mistaken
way: a converter that transposes a square kernel, drops the biases or reads the latent layer's
output interleaved, an encoder or a decoder that ignores the label, the latent layer's output split
the other way round, probabilities where the spec returns logits, the sample, a reduction or the
total of the loss written another way, a step that draws its noise from another key, Adam's
epsilon, bias correction, clipping or weight decay taken another way. The mistake that fits is
named in the first line of the failure (``recon is 1/64 of the reference: a mean over pixels where
the spec sums``), which the conformance plugin's diagnosis shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cvae_rosetta.conformance.common import (
    ATOL,
    B2,
    RTOL,
    SPEC_EPS,
    Hints,
    assert_close,
    explain_ratio,
    key_bits,
    loss_axes,
    mismatch,
    spec_noise,
    spec_optimizer,
    spec_step,
)
from cvae_rosetta.spec.config import Config, LossConfig, OptimConfig
from cvae_rosetta.spec.validation import Batch


class Loaded(NamedTuple):
    """An implementation, a state it made with ``from_canonical``, and the canonical parameters it
    made it from: what an explanation of a wrong output calls again and computes the reference
    from."""

    impl: Any
    state: Any
    params: Any


class LossInputs(NamedTuple):
    """What a loss was computed from: canonical parameters, a batch, the key of the noise, and the
    config (its model, and its loss's kind and beta)."""

    params: Any
    batch: Batch
    key: jax.Array
    config: Config


def matches(got: Any, want: Any, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return mismatch(got, want, "", rtol=rtol, atol=atol) is None


def _with_leaf(tree: Any, where, value) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: value if path == where else np.asarray(leaf), tree
    )


def _interleaved_latent(params: Any) -> Any:
    """``params`` with the latent layer's output columns reordered so that its first half is the
    canonical even columns and its second half the odd ones: the spec's split of that tree is an
    interleaved split of the canonical one."""
    latent = params["latent"]
    width = np.shape(latent["bias"])[-1]
    order = np.concatenate([np.arange(0, width, 2), np.arange(1, width, 2)])
    moved = {
        "kernel": np.asarray(latent["kernel"])[:, order],
        "bias": np.asarray(latent["bias"])[order],
    }
    return {**jax.tree.map(np.asarray, params), "latent": moved}


def converter_mistakes(params: Any) -> list[tuple[str, Any]]:
    """The canonical tree as a mistaken converter would hand it to the model: each square kernel
    transposed (a shape check cannot see it), every bias zero, the latent layer's output columns
    taken interleaved (mean the even ones, logvar the odd ones: the shapes are the spec's)."""
    found = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        array = np.asarray(leaf)
        if getattr(path[-1], "key", None) == "kernel" and array.shape[0] == array.shape[-1]:
            found.append(
                (
                    f"the model reads {jax.tree_util.keystr(path)} transposed ([out, in], where "
                    "the spec's kernels are [in, out])",
                    _with_leaf(params, path, array.T),
                )
            )
    no_bias = jax.tree_util.tree_map_with_path(
        lambda path, leaf: np.zeros(np.shape(leaf)) if path[-1].key == "bias" else np.asarray(leaf),
        params,
    )
    found.append(("every bias is zero: the biases given to from_canonical never reach it", no_bias))
    if np.shape(params["latent"]["bias"])[-1] >= 4:  # with one latent dimension, the same split
        found.append(
            (
                "the latent layer's output is split interleaved (mean the even columns, logvar "
                "the odd ones), where the spec takes mean as the first L columns and logvar as "
                "the last L",
                _interleaved_latent(params),
            )
        )
    return found


def _other_labels(c: Any, num_classes: int) -> Any:
    return jnp.asarray((np.asarray(c) + 1) % num_classes, dtype=jnp.asarray(c).dtype)


def _ignores_label(call: Callable[[Any], Any], c: Any, got: Any, num_classes: int) -> bool:
    if num_classes < 2:
        return False
    try:
        other = call(_other_labels(c, num_classes))
    except Exception:  # a mistake elsewhere: no verdict on the label
        return False
    return all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(other), jax.tree.leaves(got), strict=True)
    )


def encode_mistake(loaded: Loaded, x, c, mean, logvar, num_classes: int) -> str | None:
    """What explains ``encode``'s ``(mean, logvar)`` differing from the reference, if anything."""
    from cvae_rosetta.conformance import reference

    impl, state, params = loaded
    ref_mean, ref_logvar = reference.encode(params, x, c, num_classes)
    if matches(mean, ref_logvar) and matches(logvar, ref_mean):
        return (
            "encode returns (logvar, mean): its mean is the reference's logvar and its logvar "
            "the reference's mean (the spec splits the latent layer's output as [mean, logvar])"
        )
    if _ignores_label(lambda other: impl.encode(state, x, other), c, (mean, logvar), num_classes):
        return "encode's output does not change when only c changes: the encoder ignores the label"
    for why, variant in converter_mistakes(params):
        m, lv = reference.encode(variant, x, c, num_classes)
        if matches(mean, m) and matches(logvar, lv):
            return f"encode matches the reference where {why}"
    return None


def decode_mistake(loaded: Loaded, z, c, logits, num_classes: int) -> str | None:
    """What explains ``decode``'s logits differing from the reference, if anything."""
    from cvae_rosetta.conformance import reference

    impl, state, params = loaded
    ref = reference.decode(params, z, c, num_classes)
    if matches(logits, reference.sigmoid(ref)):
        return "decode returns probabilities sigmoid(logits) where the spec returns logits"
    if matches(logits, np.maximum(ref, 0.0)):
        return (
            "decode's output is relu(logits), never negative: a ReLU after the output layer, "
            "which the spec leaves linear"
        )
    if _ignores_label(lambda other: impl.decode(state, z, other), c, logits, num_classes):
        return "decode's output does not change when only c changes: the decoder ignores the label"
    for why, variant in converter_mistakes(params):
        if matches(logits, reference.decode(variant, z, c, num_classes)):
            return f"decode matches the reference where {why}"
    return None


KL_NOTES = {
    2.0: "the KL terms written without their factor 0.5",
    -1.0: "the spec's KL terms 0.5 (exp(logvar) + mean^2 - 1 - logvar) are >= 0",
}


def beta_notes(term: str, beta: float, notes: dict[float, str] | None = None) -> dict[float, str]:
    """``notes`` with the factors beta and 1/beta (``config.loss.beta``) named for ``term``
    (``recon`` or ``kl``): a term reported or computed weighted where the spec's is not, or
    divided by beta. A factor ``notes`` already names keeps both causes."""
    found = dict(notes or {})
    if beta in (0.0, 1.0):
        return found
    weighted = (
        "kl reported weighted, beta * kl, where the spec's metrics report the unweighted term"
        if term == "kl"
        else "recon weighted by beta, where the spec weighs the KL term alone"
    )
    for factor, why in (
        (beta, f"the factor is beta = {beta:g} (config.loss.beta): {weighted}"),
        (1.0 / beta, f"the factor is 1/beta (config.loss.beta = {beta:g}): {term} divided by it"),
    ):
        found[factor] = f"{found[factor]}; or {why}" if factor in found else why
    return found


def recon_mistake(got: float, inputs: LossInputs, *, kl_matches: bool) -> str | None:
    """What explains the reconstruction term differing from the reference's, if anything: the
    sample ``z = mean + exp(0.5 * logvar) * eps`` drawn another way, the other loss kind, a
    reduction the spec does not do."""
    from cvae_rosetta.conformance import reference

    params, batch, key, config = inputs
    kind, beta, model = config.loss.kind, config.loss.beta, config.model
    b = batch.x.shape[0]
    eps = spec_noise(key, b, model.latent_dim)

    def recon(noise, which=kind):
        return reference.loss_and_grad(
            params,
            batch.x,
            batch.c,
            noise,
            num_classes=model.num_classes,
            loss=LossConfig(kind=which, beta=beta),
        )

    ref = recon(eps)
    row = np.asarray(jax.random.normal(key, (model.latent_dim,)))
    samples = (
        (
            eps * np.exp(0.5 * ref.logvar),
            "recon is the reference's at z = mean + exp(logvar) * eps: the sample takes "
            "exp(logvar) as its standard deviation where the spec takes exp(0.5 * logvar)",
        ),
        (
            np.broadcast_to(row, eps.shape),
            "recon is the reference's with the same noise row for every example: eps drawn with "
            "shape (L,) where the spec draws normal(key, (B, L)), a row per example",
        ),
        (np.zeros_like(eps), "recon is the reference's at z = mean: the sample leaves out eps"),
    )
    for noise, why in samples:
        if abs(got - recon(noise).recon) <= 1e-4 * abs(recon(noise).recon):
            return why
    other = "mse" if kind == "bernoulli" else "bernoulli"
    if abs(got - recon(eps, other).recon) <= 1e-4 * abs(recon(eps, other).recon):
        return f"recon is the {other} reconstruction term where config.loss.kind is {kind!r}"
    hints = Hints(axes=loss_axes(kind, "recon", b, model), notes=beta_notes("recon", beta))
    ratio = explain_ratio("recon", got, ref.recon, hints)
    if ratio is not None:
        return ratio
    if kl_matches:
        return (
            f"recon differs from the float64 reference ({got:.7g} against {ref.recon:.7g}) while "
            "kl matches: the sample is not z = mean + exp(0.5 * logvar) * eps with the spec's "
            "noise eps = normal(key, (B, L)), or the reconstruction term is not the spec's"
        )
    return None


def step_noise_mistake(got: float, inputs: LossInputs) -> str:
    """What a step's ``metrics["loss"]`` ``got`` shows where it is not the float64 reference's at
    the spec's noise for the key of ``inputs``: the key whose noise it fits, among those a port
    derives from the given key or makes itself; else that the noise (or the loss) is not the
    spec's."""
    from cvae_rosetta.conformance import reference

    params, batch, key, config = inputs
    model = config.model

    def at(k) -> float:
        eps = spec_noise(k, batch.x.shape[0], model.latent_dim)
        return reference.loss_and_grad(
            params, batch.x, batch.c, eps, num_classes=model.num_classes, loss=config.loss
        ).loss

    others: dict[tuple[int, ...], tuple[str, jax.Array]] = {}  # by the key's bits
    for what, other in (
        ("jax.random.split(key)[0]", jax.random.split(key)[0]),
        ("jax.random.split(key)[1]", jax.random.split(key)[1]),
        ("jax.random.fold_in(key, 0)", jax.random.fold_in(key, 0)),
        ("the fixed key jax.random.key(0) (or PRNGKey(0))", jax.random.key(0)),
    ):
        bits = key_bits(other)  # with threefry_partitionable, fold_in(key, i) is split(key)[i]
        if bits in others:
            first = others[bits][0]
            others[bits] = (f"{first} (the same key as {what})", other)
        else:
            others[bits] = (what, other)
    for what, other in others.values():
        want = at(other)
        if abs(got - want) <= RTOL * abs(want):
            return (
                f"train_step's metrics[\"loss\"] {got:.7g} is the float64 reference's at the "
                f"noise of {what}, not of the key it was given ({at(key):.7g}): the step draws "
                "its noise from that key, where the spec draws eps = normal(key, (B, L)) from the "
                "key it is given"
            )
    return (
        f"train_step's metrics[\"loss\"] {got:.7g} is not the float64 reference's at the noise "
        f"normal(key, (B, L)) of the key it was given ({at(key):.7g}), nor at the noise of "
        "split(key)[0], split(key)[1], fold_in(key, 0) or key(0): the step's noise is not "
        "normal(key, (B, L)) of the key it was given, or its loss is not the spec's"
    )


def total_mistake(loss: float, recon: float, kl: float, beta: float) -> str | None:
    """What explains the total differing from ``recon + beta * kl`` when both terms match."""
    candidates = []
    if beta != 1.0:
        candidates.append(
            (
                recon + kl,
                f"loss is recon + kl: beta = {beta:g} is not applied (the spec's loss is "
                "recon + beta * kl)",
            )
        )
        candidates.append(
            (beta * recon + kl, f"loss is beta * recon + kl: beta = {beta:g} weighs the wrong term")
        )
    candidates += [
        (recon - beta * kl, "loss is recon - beta * kl: the KL term enters with the wrong sign"),
        (recon, "loss is recon alone: the KL term is left out"),
        (beta * kl, "loss is beta * kl alone: the reconstruction term is left out"),
    ]
    for value, why in candidates:
        if abs(loss - value) <= 1e-5 * max(abs(value), 1e-6):
            return f"{why} ({loss:.7g} against the spec's {recon + beta * kl:.7g})"
    return None


def assert_loss_matches(loss, metrics, inputs: LossInputs, *, what: str = "") -> None:
    """The loss and its metrics against the float64 reference at the spec's noise for the key of
    ``inputs``: the terms first (each names its own mistake), then the total and
    ``metrics["loss"]``.

    float32 against float64: relative error ~1e-6 of each sum; where KL terms
    0.5 (e^lv + m^2 - 1 - lv) are small they cancel to an absolute error ~1e-7 each, and an mse
    recon is a mean of squares of differences known to ~u: hence the absolute floors."""
    from cvae_rosetta.conformance import reference

    params, batch, key, config = inputs
    kind, beta, model = config.loss.kind, config.loss.beta, config.model
    b = batch.x.shape[0]
    eps = spec_noise(key, b, model.latent_dim)
    ref = reference.loss_and_grad(
        params, batch.x, batch.c, eps, num_classes=model.num_classes, loss=config.loss
    )
    recon, kl = float(metrics["recon"]), float(metrics["kl"])
    kl_message = mismatch(
        kl,
        ref.kl,
        f"{what}kl",
        rtol=RTOL,
        atol=1e-6,
        hints=Hints(axes=loss_axes(kind, "kl", b, model), notes=beta_notes("kl", beta, KL_NOTES)),
    )
    assert_close(
        recon,
        ref.recon,
        f"{what}recon",
        rtol=RTOL,
        atol=1e-6,
        explain=lambda: recon_mistake(recon, inputs, kl_matches=kl_message is None),
    )
    assert kl_message is None, kl_message
    atol = 1e-6 * (1 + beta)
    total = float(loss)
    assert_close(
        total,
        ref.loss,
        f"{what}loss",
        rtol=RTOL,
        atol=atol,
        explain=lambda: total_mistake(total, recon, kl, beta),
    )
    assert_close(
        float(metrics["loss"]),
        total,
        f'{what}metrics["loss"]',
        rtol=1e-6,
        atol=atol,
        against="the loss returned beside it",
    )


# Keras and TensorFlow write Adam as lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t) and
# theta -= lr_t * m / (sqrt(v) + eps): epsilon on the uncorrected root, which is the spec's update
# with epsilon eps / sqrt(1 - b2^t) (31.6 times eps at the first step, tending to eps later).
UNCORRECTED_EPSILON = (
    "epsilon added to the uncorrected sqrt(v) (Keras's and TensorFlow's Adam): effective epsilon "
    "eps/sqrt(1-b2^t)"
)
KERAS_DEFAULT_EPS = 1e-7  # keras.optimizers.Adam and AdamW's default epsilon


def uncorrected_epsilon(t: int, eps: float = SPEC_EPS) -> float:
    """The epsilon of the spec's update that equals step ``t`` of Adam with ``eps`` added to the
    uncorrected ``sqrt(v)``."""
    return eps / float(np.sqrt(1.0 - B2**t))


def epsilon_mistakes(t: int) -> list[tuple[str, float]]:
    """``(what it shows, the epsilon of the spec's update that takes step t so)``: epsilon on the
    uncorrected root, with the spec's epsilon and with Keras's default."""
    factor = uncorrected_epsilon(t, 1.0)
    spec = (
        f"the step is AdamW's with {UNCORRECTED_EPSILON}, {factor:.3g} times the spec's "
        f"{SPEC_EPS:g} at step {t}; the spec adds eps to the bias-corrected sqrt(v_hat)"
    )
    keras = (
        f"the step is AdamW's with {UNCORRECTED_EPSILON}, and Keras's default epsilon "
        f"{KERAS_DEFAULT_EPS:g} where the spec's is {SPEC_EPS:g} (effective "
        f"{uncorrected_epsilon(t, KERAS_DEFAULT_EPS):.3g} at step {t}); the spec adds eps to the "
        "bias-corrected sqrt(v_hat)"
    )
    return [(spec, uncorrected_epsilon(t)), (keras, uncorrected_epsilon(t, KERAS_DEFAULT_EPS))]


def bias_correction_mistake(t: int) -> str:
    """What step ``t`` of AdamW taken with the raw moments shows; the update ``m / sqrt(v)`` is
    then ``(1 - b1^t) / sqrt(1 - b2^t)`` times the spec's ``m_hat / sqrt(v_hat)`` where eps is
    negligible (3.16 at the first step)."""
    from cvae_rosetta.conformance import reference

    factor = (1 - reference.B1**t) / np.sqrt(1 - reference.B2**t)
    return (
        "the step is AdamW's without bias correction: m and v are used as they are, where the spec "
        f"divides them by (1 - b1^t) and (1 - b2^t) (at step {t} the update is {factor:.3g} times "
        "the spec's)"
    )


def optimizer_mistakes(start: Any, grads: Any, optim: OptimConfig) -> list[tuple[str, Any]]:
    """One first step from ``start`` as plausible mistakes would take it, from the float64
    gradient ``grads``: ``(what it shows, the parameters it reaches)``."""
    from cvae_rosetta.conformance import reference

    grads32 = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), grads)

    def step(tx, g):
        updates, _ = tx.update(g, tx.init(start), start)
        return optax.apply_updates(start, updates)

    adam = optax.adam(optim.learning_rate, b1=0.9, b2=B2, eps=SPEC_EPS)
    l2 = jax.tree.map(lambda g, p: g + optim.weight_decay * p, grads32, start)
    want = step(spec_optimizer(optim), grads32)
    found = [
        ("train_step left the parameters unchanged", start),
        (
            "the step goes up the gradient: every update has the opposite sign of the spec's",
            jax.tree.map(lambda p, w: 2 * p - w, start, want),
        ),
        (
            "the step is AdamW's without clip_by_global_norm: the spec clips the gradient to "
            f"global norm clip_norm = {optim.clip_norm:g} before Adam",
            step(
                optax.adamw(
                    optim.learning_rate,
                    b1=0.9,
                    b2=B2,
                    eps=SPEC_EPS,
                    weight_decay=optim.weight_decay,
                ),
                grads32,
            ),
        ),
    ]
    for why, eps in epsilon_mistakes(1):
        found.append((why, spec_step(optim, start, grads32, eps=eps)[0]))
    raw = reference.adamw_step(start, grads, optim, bias_correction=False).params
    found.append((bias_correction_mistake(1), raw))
    if optim.weight_decay:
        found.append(
            (
                "the step is Adam's on the gradient plus weight_decay * params (an L2 penalty in "
                "the loss): the spec's AdamW decays the parameters apart from the gradient",
                step(optax.chain(optax.clip_by_global_norm(optim.clip_norm), adam), l2),
            )
        )
    return found


def step_mistake(
    got: Any, candidates: list[tuple[str, Any]], masks: Any, atol: float
) -> str | None:
    """The first candidate whose parameters ``got`` reached, on the entries ``masks`` selects."""
    got_leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(got)]
    mask_leaves = jax.tree.leaves(masks)
    for why, tree in candidates:
        if all(
            np.allclose(g[m], np.asarray(c, np.float64)[m], rtol=1e-6, atol=atol)
            for g, c, m in zip(got_leaves, jax.tree.leaves(tree), mask_leaves, strict=True)
        ):
            return why
    return None
