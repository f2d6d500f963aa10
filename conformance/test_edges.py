"""Numbers at the edges: saturated logits and extreme log-variances (SPEC section 4).

The loss written straight from its formula, ``-(x log sigmoid(l) + (1 - x) log(1 - sigmoid(l)))``,
agrees with the spec's ``softplus(l) - l x`` for moderate logits and fails once a logit saturates:
in float32 ``sigmoid(l)`` rounds to 1.0 from ``l`` of about 17 on, so ``log(1 - sigmoid(l))`` is
``log(0)``, the loss is infinite or NaN (``0 * -inf`` for a pixel of exactly 1) and one step makes
the parameters NaN. The log-variance enters through ``exp(logvar)`` and ``exp(0.5 * logvar)``, which
a form that squares or divides can overflow or lose.

So the checks here set, through the canonical parameters, the output layer's bias to +-100 (well
past float32 saturation) and +-1e4 (where ``exp(-l)`` underflows even in float64), or the latent
layer so that ``logvar`` is exactly +-30 for every input (its half of the latent kernel zero, its
bias +-30: a standard deviation of 3.3e6 or 3.1e-7). At each, for both loss kinds and in float32 and
bfloat16 compute, the loss, its metrics and its gradient are finite and equal the float64 reference
of :mod:`cvae_rosetta.conformance.reference` (which is stable there: ``max(l, 0) - l x +
log1p(exp(-|l|))``), and one step from there leaves every parameter finite and within Adam's first
step of where it was.

Cheap by design: the suite's small model, one compilation per implementation, loss kind and compute
dtype (the edges are values, not shapes), every check of a case reading one cached call.

Tolerances. float32: the loss and its terms as in ``test_loss`` (``RTOL``; the terms are sums of
|logit|-sized numbers without cancellation); gradients to ``rtol 1e-4`` per entry with an absolute
floor of 1e-5 of the largest entry of the same leaf (a float32 gradient entry is accurate to about
fan_in u of the magnitudes summed into it, and at the edges one leaf's gradient can be 1e6 times
another's), plus 1e-9 of the largest of all (where a saturated sigmoid leaves a leaf's exact
gradient at 1e-44, float32 has 0 or a subnormal). Measured: within 1.2% of that tolerance.

bfloat16 (``U = 2**-8``): a logit of 100 or 1e4 is rounded by up to U of itself, which moves each
pixel's term by as much, and three layers add about 2 U to the moments and logits; the loss and its
terms are held to ``4 U`` relative, the gradient tree to a relative RMS error of ``32 U`` (as
``test_precision``), each leaf to ``128 U`` of its own RMS or of 1e-3 of the tree's, whichever is
larger (at saturation a leaf's exact gradient can be nearly 0). Near-zero pre-activations switch
ReLUs on or off between bfloat16 and float64, which moves whole entries of the small model's
gradient: measured, for every implementation of this repository, at most 0.76 U for the loss,
13.8 U for the tree and 52 U for a leaf (the second decoder kernel at logvar -30). The spec keeps
float32 parameters whatever the compute dtype: after a bfloat16 step the entries it changed must
not all be bfloat16 numbers (a float32 number is one by chance once in 2**16), and a step that
moved an entry further than Adam's first step can, but within it of the start rounded to bfloat16,
started from parameters kept in bfloat16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import (
    MODEL,
    RTOL,
    B,
    at_path,
    copy_to_host,
    fresh,
    probe,
    spec_noise,
    suite_batch,
    suite_params,
)
from cvae_rosetta.conformance.messages import Hints, loss_axes, mismatch, where_max
from cvae_rosetta.conformance.mistakes import KL_NOTES
from cvae_rosetta.spec.config import Config, LossConfig

# numerics as a training run compiles them: XLA's full optimisation for every program here, except
# on the CPU, where most optimisations off give the same optimised program (plugin.fully_optimized)
pytestmark = pytest.mark.fully_optimized

U = 2.0**-8  # bfloat16's unit roundoff
BF16_LOSS_RTOL = 4 * U
BF16_GRAD_TREE = 32 * U
BF16_GRAD_LEAF = 128 * U

# name -> (what is set, its value)
EDGES = {
    "logits +100": ("logits", 100.0),
    "logits -100": ("logits", -100.0),
    "logits +1e4": ("logits", 1e4),
    "logits -1e4": ("logits", -1e4),
    "logvar +30": ("logvar", 30.0),
    "logvar -30": ("logvar", -30.0),
}
CASES = [
    (dtype, kind, edge)
    for dtype in ("float32", "bfloat16")
    for kind in ("bernoulli", "mse")
    for edge in EDGES
]
IDS = [f"{dtype}-{kind}-{edge.replace(' ', '')}" for dtype, kind, edge in CASES]


def describe(edge: str) -> str:
    what, value = EDGES[edge]
    if what == "logits":
        return f"saturated logits (output bias {value:+g})"
    return f"extreme logvar ({value:+g} for every input)"


def edge_params(edge: str) -> dict:
    """The suite's canonical parameters (NumPy) with one layer set to the edge."""
    params = copy_to_host(suite_params(42))
    what, value = EDGES[edge]
    if what == "logits":
        params["decoder"][-1]["bias"] = np.full(MODEL.input_dim, value, np.float32)
    else:
        latent = MODEL.latent_dim
        params["latent"]["kernel"][:, latent:] = 0.0
        params["latent"]["bias"][latent:] = value
    return params


def config_of(dtype: str, kind: str) -> Config:
    return Config(model=MODEL.replace(compute_dtype=dtype), loss=LossConfig(kind=kind))


@functools.cache
def outcome(impl, dtype: str, kind: str, edge: str) -> tuple:
    """What the implementation computes at the edge, as NumPy arrays (cached: every check of a
    case reads one call; compiled once per implementation, loss kind and compute dtype, and shared
    with ``test_precision`` where its settings are these)."""
    out = probe(impl)(
        fresh(edge_params(edge)),
        suite_batch(7),
        jax.random.normal(jax.random.key(3), (B, MODEL.latent_dim)),
        jax.random.key(11),
        config=config_of(dtype, kind),
    )
    return jax.device_get((out.loss, out.metrics, out.grads, out.stepped, out.step_metrics))


@functools.cache
def expected(kind: str, edge: str) -> reference.Result:
    batch = suite_batch(7)
    eps = spec_noise(jax.random.key(11), B, MODEL.latent_dim)
    return reference.loss_and_grad(
        edge_params(edge),
        batch.x,
        batch.c,
        eps,
        num_classes=MODEL.num_classes,
        loss=LossConfig(kind),
    )


def _why_not_finite(kind: str, edge: str) -> str:
    if EDGES[edge][0] == "logits" and kind == "bernoulli":
        return (
            "; in float32 sigmoid(l) is 1.0 there, so log(1 - sigmoid(l)) is log(0): the spec's "
            "softplus(l) - l * x (or optax.sigmoid_binary_cross_entropy) stays finite"
        )
    if EDGES[edge][0] == "logvar":
        return "; the spec's terms exp(logvar) and exp(0.5 * logvar) are finite there"
    return ""


def _check(message: str | None, got, kind: str, edge: str) -> None:
    if message is None:
        return
    if not np.all(np.isfinite(np.asarray(got, np.float64))):
        first, _, rest = message.partition("\n")
        message = first + _why_not_finite(kind, edge) + (f"\n{rest}" if rest else "")
    raise AssertionError(message)


@pytest.mark.parametrize("dtype,kind,edge", CASES, ids=IDS)
def test_loss_and_metrics_at_the_edges(impl, dtype, kind, edge):
    loss, metrics, _, _, step_metrics = outcome(impl, dtype, kind, edge)
    ref = expected(kind, edge)
    at = f"at {describe(edge)}" + (", in bfloat16" if dtype == "bfloat16" else "")
    rtol = RTOL if dtype == "float32" else BF16_LOSS_RTOL
    axes = {term: loss_axes(kind, term, B, MODEL) for term in ("recon", "kl")}
    for what, got, want, hints in (
        ("recon", metrics["recon"], ref.recon, dict(axes=axes["recon"])),
        ("kl", metrics["kl"], ref.kl, dict(axes=axes["kl"], notes=KL_NOTES)),
        ("loss", loss, ref.loss, {}),
        ('metrics["loss"]', metrics["loss"], ref.loss, {}),
        ('the step\'s metrics["loss"]', step_metrics["loss"], ref.loss, {}),
    ):
        message = mismatch(got, want, f"{what} {at}", rtol=rtol, atol=1e-6, hints=Hints(**hints))
        _check(message, got, kind, edge)


@pytest.mark.parametrize("dtype,kind,edge", CASES, ids=IDS)
def test_gradients_at_the_edges(impl, dtype, kind, edge):
    _, _, grads, _, _ = outcome(impl, dtype, kind, edge)
    ref = expected(kind, edge)
    at = f"at {describe(edge)}" + (", in bfloat16" if dtype == "bfloat16" else "")
    for path, got in jax.tree_util.tree_leaves_with_path(grads):
        g = np.asarray(got, np.float64)
        if not np.all(np.isfinite(g)):
            message = mismatch(
                g, at_path(ref.grads, path), f"d loss / d {jax.tree_util.keystr(path)} {at}", rtol=0
            )
            _check(message, g, kind, edge)
    if dtype == "float32":
        top = max(float(np.max(np.abs(w))) for w in jax.tree.leaves(ref.grads))
        for path, got in jax.tree_util.tree_leaves_with_path(grads):
            want = at_path(ref.grads, path)
            message = mismatch(
                got,
                want,
                f"d loss / d {jax.tree_util.keystr(path)} {at}",
                rtol=1e-4,
                atol=1e-5 * float(np.max(np.abs(want))) + 1e-9 * top,
            )
            _check(message, got, kind, edge)
        return
    pairs = [
        (jax.tree_util.keystr(path), np.asarray(got, np.float64), at_path(ref.grads, path))
        for path, got in jax.tree_util.tree_leaves_with_path(grads)
    ]
    total = np.sqrt(sum(np.sum(w**2) for _, _, w in pairs))
    err = np.sqrt(sum(np.sum((g - w) ** 2) for _, g, w in pairs)) / total
    assert err <= BF16_GRAD_TREE, (
        f"the gradient {at} is off the float64 reference by a relative RMS error of "
        f"{err / U:.1f} U; bfloat16 compute stays within {BF16_GRAD_TREE / U:g} U"
    )
    for name, g, w in pairs:
        rms = max(np.sqrt(np.mean(w**2)), 1e-3 * total / np.sqrt(w.size))
        leaf_err = np.sqrt(np.mean((g - w) ** 2)) / rms
        assert leaf_err <= BF16_GRAD_LEAF, (
            f"d loss / d {name} {at} is off the float64 reference by {leaf_err / U:.1f} U of its "
            f"RMS; bfloat16 compute stays within {BF16_GRAD_LEAF / U:g} U"
        )


@pytest.mark.parametrize("dtype,kind,edge", CASES, ids=IDS)
def test_a_step_from_the_edges_gives_finite_parameters(impl, dtype, kind, edge):
    _, _, _, stepped, _ = outcome(impl, dtype, kind, edge)
    start = edge_params(edge)
    lr = config_of(dtype, kind).optim.learning_rate
    wd = config_of(dtype, kind).optim.weight_decay
    at = f"one step from {describe(edge)}" + (", in bfloat16" if dtype == "bfloat16" else "")
    for path, p1 in jax.tree_util.tree_leaves_with_path(stepped):
        name = jax.tree_util.keystr(path)
        p1 = np.asarray(p1, np.float64)
        bad = ~np.isfinite(p1)
        assert not bad.any(), (
            f"{at} left {int(bad.sum())} of {p1.size} entries of {name} non-finite"
            f"{where_max(bad)}{_why_not_finite(kind, edge)}"
        )
        p0 = np.asarray(at_path(start, path), np.float64)
        kept = "the parameters are kept in the compute dtype, where the spec keeps them float32"
        changed = p1[p1 != p0]
        if dtype == "bfloat16" and changed.size >= 8:
            # a float32 number is a bfloat16 one by chance once in 2**16
            as_bf16 = np.asarray(np.asarray(changed, jnp.bfloat16), np.float64)
            assert not np.all(as_bf16 == changed), (
                f"{at}: every entry of {name} the step changed is a bfloat16 number: {kept}"
            )
        moved = np.abs(p1 - p0)
        bound = lr * (1 + 1e-4) + lr * wd * (np.abs(p0) + 1e-6) + 2**-23 * np.abs(p0)
        if dtype == "bfloat16" and not np.all(moved <= bound):
            from_rounded = np.abs(p1 - np.asarray(np.asarray(p0, jnp.bfloat16), np.float64))
            # the update itself may be rounded to bfloat16 too
            assert not np.all(from_rounded <= bound * (1 + 2 * U)), (
                f"{at} moved {name} by up to {moved.max():.3g}, more than Adam's first step "
                f"(at most {bound.max():.3g}): it started from the parameters rounded to "
                f"bfloat16, so {kept}"
            )
        assert np.all(moved <= bound), (
            f"{at} moved {name} by up to {moved.max():.3g}{where_max(moved - bound)}; Adam's "
            f"first step moves an entry by at most lr (1 + weight_decay |p|) = {bound.max():.3g}"
        )
