"""What a failed check of the forward pass, the loss or the step's key says when a mistake explains
what it saw.

Each is tried only once the check has failed, against the float64 reference computed the mistaken
way: an encoder or a decoder that ignores the label, the ways of writing either searched
(:mod:`cvae_rosetta.conformance.forward_hypotheses`: activations, the label's place, the latent
layer's split and activation, the output), a converter that transposes a square kernel or
drops the biases, the sample, a reduction, a slip or beta in a term (:func:`messages.explain_ratio`,
their products), the total of the loss written another way, a step that draws its noise from
another key. The optimiser's ways are searched in :mod:`cvae_rosetta.conformance.hypotheses`. The
mistake that fits is named in the first line of the failure (``recon is 1/64 of the reference: a
mean over pixels where the spec sums``), which the conformance plugin's diagnosis shows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.conformance.assertions import assert_close
from cvae_rosetta.conformance.common import ATOL, RTOL, key_bits, spec_noise
from cvae_rosetta.conformance.forward_hypotheses import fit_forward, search_forward
from cvae_rosetta.conformance.messages import Hints, explain_ratio, loss_axes, mismatch
from cvae_rosetta.spec.config import Config, LossConfig
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


def converter_mistakes(params: Any) -> list[tuple[str, Any]]:
    """The canonical tree as a mistaken converter would hand it to the model: each square kernel
    transposed (a shape check cannot see it), every bias zero (the latent layer's output taken
    interleaved is a way of the encoder's split, searched)."""
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
    """What explains ``encode``'s ``(mean, logvar)`` differing from the reference, if anything:
    the label ignored, a way of writing the encoder searched (``forward_hypotheses``), a mistaken
    converter."""
    from cvae_rosetta.conformance import reference

    impl, state, params = loaded
    if _ignores_label(lambda other: impl.encode(state, x, other), c, (mean, logvar), num_classes):
        return "encode's output does not change when only c changes: the encoder ignores the label"
    found = search_forward("encode", (mean, logvar), params, (x, c, num_classes), matches)
    if found is not None:
        return found
    for why, variant in converter_mistakes(params):
        m, lv = reference.encode(variant, x, c, num_classes)
        if matches(mean, m) and matches(logvar, lv):
            return f"encode matches the reference where {why}"
    return fit_forward("encode", (mean, logvar), params, (x, c, num_classes), matches)


def decode_mistake(loaded: Loaded, z, c, logits, num_classes: int) -> str | None:
    """What explains ``decode``'s logits differing from the reference, if anything: a way of
    writing the decoder searched (``forward_hypotheses``), the label ignored, a mistaken
    converter."""
    from cvae_rosetta.conformance import reference

    impl, state, params = loaded
    found = search_forward("decode", logits, params, (z, c, num_classes), matches)
    if found is not None:
        return found
    if _ignores_label(lambda other: impl.decode(state, z, other), c, logits, num_classes):
        return "decode's output does not change when only c changes: the decoder ignores the label"
    for why, variant in converter_mistakes(params):
        if matches(logits, reference.decode(variant, z, c, num_classes)):
            return f"decode matches the reference where {why}"
    return fit_forward("decode", logits, params, (z, c, num_classes), matches)


SPEC_KL = "0.5 (exp(logvar) + mean^2 - 1 - logvar)"
MSE_HALF = (
    "the squared error without its 1/2, (p - x)^2 (optax.squared_error), where the spec's mse "
    "term is 0.5 (p - x)^2 (optax.l2_loss)"
)
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
    if kind == "bernoulli":  # optax's (logits, labels) given Keras's (y_true, y_pred) order
        x = np.asarray(batch.x, np.float64)
        swapped = float(np.mean(np.sum(np.logaddexp(x, 0.0) - ref.logits * x, axis=1)))
        if abs(got - swapped) <= 1e-4 * abs(swapped):
            return (
                "recon is the Bernoulli loss with its arguments swapped, "
                "sigmoid_binary_cross_entropy(x, logits) (Keras's (y_true, y_pred) order given "
                "to optax's (logits, labels)), where the spec computes it of the logits against x"
            )
    other = "mse" if kind == "bernoulli" else "bernoulli"
    if abs(got - recon(eps, other).recon) <= 1e-4 * abs(recon(eps, other).recon):
        return f"recon is the {other} reconstruction term where config.loss.kind is {kind!r}"
    halves = {2.0: MSE_HALF} if kind == "mse" else {}
    hints = Hints(axes=loss_axes(kind, "recon", b, model), notes=beta_notes("recon", beta, halves))
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


def step_noise_mistake(got: float, inputs: LossInputs, after: Any = None) -> str:
    """What a step's ``metrics["loss"]`` ``got`` shows where it is not the float64 reference's at
    the spec's noise for the key of ``inputs``: the loss at the parameters the step reached
    (``after``, where given: metrics computed after the update); the key whose noise it fits,
    among those a port derives from the given key or makes itself; else that the noise (or the
    loss) is not the spec's."""
    from cvae_rosetta.conformance import reference

    params, batch, key, config = inputs
    model = config.model

    def at(k, where=params) -> float:
        eps = spec_noise(k, batch.x.shape[0], model.latent_dim)
        return reference.loss_and_grad(
            where, batch.x, batch.c, eps, num_classes=model.num_classes, loss=config.loss
        ).loss

    reached = None if after is None else at(key, after)
    if reached is not None and abs(got - reached) <= RTOL * abs(reached):
        return (
            f"train_step's metrics[\"loss\"] {got:.7g} is the float64 reference's at the "
            f"parameters after the update, not before it ({at(key):.7g}): the step's metrics "
            "are computed after applying the gradients, where the spec reports the loss the "
            "gradients came from"
        )

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


def kl_offset_mistake(got: float, want: float, kind: str, latent_dim: int) -> str | None:
    """What explains ``kl`` exceeding the reference by a constant: the KL terms' ``-1`` left out
    (``0.5 (exp(logvar) + mean^2 - logvar)``: 1/2 more per term, so ``L/2`` more per example
    under the Bernoulli loss's sum, 1/2 under the mse loss's mean)."""
    offset = 0.5 * latent_dim if kind == "bernoulli" else 0.5
    if abs((got - want) - offset) <= 1e-5 * max(abs(got), 1.0):
        return (
            f"kl is the reference's plus {offset:g} ({got:.6g} against {want:.6g}): the KL "
            "terms written without their -1 (a constant, but the spec's KL is 0 at the prior), "
            f"1/2 more per term{' summed over latent dimensions' if kind == 'bernoulli' else ''}"
        )
    return None


# The KL written other ways a port plausibly takes, from mean m and logvar lv: each form's terms
KL_FORMS = {
    "the KL written for a log standard deviation, 0.5 (exp(2 logvar) + mean^2 - 1 - 2 logvar) "
    "(logvar read as log sigma)": lambda m, lv: 0.5 * (np.exp(2 * lv) + m**2 - 1 - 2 * lv),
    "the KL terms without mean^2, 0.5 (exp(logvar) - 1 - logvar)": lambda m, lv: (
        0.5 * (np.exp(lv) - 1 - lv)
    ),
    "the KL the other way round, KL(prior || posterior) = 0.5 ((1 + mean^2) exp(-logvar) - 1 + "
    "logvar)": lambda m, lv: 0.5 * ((1 + m**2) * np.exp(-lv) - 1 + lv),
}


def kl_form_mistake(got: float, inputs: LossInputs) -> str | None:
    """What explains ``kl`` as the KL written another way (:data:`KL_FORMS`), reduced as the
    spec reduces it (summed over latent dimensions under the Bernoulli loss, averaged under the
    mse loss's mean; averaged over the batch)."""
    from cvae_rosetta.conformance import reference

    params, batch, _, config = inputs
    mean, logvar = reference.encode(params, batch.x, batch.c, config.model.num_classes)
    for why, terms in KL_FORMS.items():
        with np.errstate(all="ignore"):
            each = terms(np.asarray(mean, np.float64), np.asarray(logvar, np.float64))
        want = each.sum(axis=1).mean() if config.loss.kind == "bernoulli" else each.mean()
        if abs(got - want) <= 1e-5 * max(abs(want), 1e-6):
            return f"kl is {why} ({got:.6g}), where the spec's terms are {SPEC_KL}"
    return None


def total_mistake(
    loss: float, recon: float, kl: float, beta: float, name: str = "loss"
) -> str | None:
    """What explains the total ``name`` differing from ``recon + beta * kl`` when both terms
    match: each term's weight searched (recon's 1, beta or nothing; kl's beta, 1, nothing, or
    either with the wrong sign), the fewest departures first."""
    recon_ways = [(1.0, ""), (beta, "beta weighs recon"), (0.0, "recon left out")]
    kl_ways = [
        (beta, ""),
        (1.0, f"beta = {beta:g} not applied to kl"),
        (0.0, "the KL term left out"),
        (-beta, "the KL term entering with the wrong sign"),
        (-1.0, "the KL term entering with the wrong sign and beta not applied"),
    ]
    fits = []
    for (a, recon_why), (b, kl_why) in itertools.product(recon_ways, kl_ways):
        whys = [why for why in (recon_why, kl_why) if why]
        if (a, b) == (beta, 1.0) and beta != 1.0:
            whys = [f"beta = {beta:g} weighs the wrong term"]
        value = a * recon + b * kl
        if whys and abs(loss - value) <= 1e-5 * max(abs(value), 1e-6):
            fits.append((len(whys), _written(a, b, beta), whys))
    if not fits:
        return None
    _, written, whys = min(fits, key=lambda fit: fit[0])
    return (
        f"{name} is {written}: {', and '.join(whys)} (the spec's is recon + beta * kl; "
        f"{loss:.7g} against {recon + beta * kl:.7g})"
    )


def _written(a: float, b: float, beta: float) -> str:
    """``a * recon + b * kl`` as a formula, with beta by name."""
    terms = []
    for weight, term in ((a, "recon"), (b, "kl")):
        if weight:
            scale = "" if abs(weight) == 1 else "beta * "
            sign = "-" if weight < 0 else "+"
            terms.append(f"{sign} {scale}{term}" if terms else f"{sign.strip('+')}{scale}{term}")
    return " ".join(terms)


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
        hints=Hints(
            axes=loss_axes(kind, "kl", b, model),
            notes=beta_notes("kl", beta, KL_NOTES),
            explain=lambda: (
                kl_offset_mistake(kl, ref.kl, kind, model.latent_dim) or kl_form_mistake(kl, inputs)
            ),
        ),
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
    reported = float(metrics["loss"])
    assert_close(
        reported,
        total,
        f'{what}metrics["loss"]',
        rtol=1e-6,
        atol=atol,
        against="the loss returned beside it",
        explain=lambda: total_mistake(reported, recon, kl, beta, 'metrics["loss"]'),
    )
