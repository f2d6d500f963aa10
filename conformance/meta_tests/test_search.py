"""The search of hypotheses on made-up outcomes: two departures named together, a config value
named as that value, true sentences where nothing fits.

Each outcome is computed here the way a port would compute it (optax in float32, the reference
with its pieces changed), never by the search's own code, so a search that names the wrong cause,
or only one of two, fails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import (
    MODEL,
    B,
    as32,
    copy_to_host,
    spec_noise,
    spec_step,
    suite_batch,
    suite_params,
)
from cvae_rosetta.conformance.forward_hypotheses import fit_forward, search_forward
from cvae_rosetta.conformance.hypotheses import (
    explain_step,
    fit_constant,
    hypotheses,
    optimiser_parts,
    search_step,
)
from cvae_rosetta.conformance.messages import Axis, Hints, explain_ratio
from cvae_rosetta.conformance.mistakes import KL_NOTES, beta_notes, matches
from cvae_rosetta.spec.config import OptimConfig


@pytest.fixture(scope="module")
def first_step():
    """The suite's parameters, the float64 gradient at its batch, and the masks of the entries
    whose gradient is above float32 noise."""
    params = copy_to_host(suite_params(42))
    batch, key = suite_batch(7), jax.random.key(13)
    eps = spec_noise(key, B, MODEL.latent_dim)
    grads = reference.loss_and_grad(
        params, batch.x, batch.c, eps, num_classes=MODEL.num_classes
    ).grads
    masks = jax.tree.map(lambda g: np.abs(g) > 1e-3 * np.abs(g).max(), grads)
    return params, grads, masks


def _port(tx: optax.GradientTransformation, params, grads):
    """One float32 step of ``tx`` as a port takes it."""
    params32, grads32 = as32(params), as32(grads)
    updates, _ = tx.update(grads32, tx.init(params32), params32)
    return copy_to_host(optax.apply_updates(params32, updates))


def _clip_each_leaf(clip_norm):
    def update(updates, state, params=None):
        del params
        return jax.tree.map(
            lambda g: g * jnp.minimum(1.0, clip_norm / jnp.linalg.norm(g)), updates
        ), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def test_two_departures_in_one_part_are_named_together(first_step):
    """Per-variable clipping after Adam: the search names both, never one of them alone."""
    params, grads, masks = first_step
    optim = OptimConfig(clip_norm=1e-6)
    adamw = optax.adamw(optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0001)
    got = _port(optax.chain(adamw, _clip_each_leaf(optim.clip_norm)), params, grads)
    said = search_step(got, [(params, grads)], optim, masks, 1e-3 * optim.learning_rate)
    assert said is not None and "after Adam" in said and "per leaf" in said, said
    alone = _port(optax.chain(adamw, optax.clip_by_global_norm(optim.clip_norm)), params, grads)
    said = search_step(alone, [(params, grads)], optim, masks, 1e-3 * optim.learning_rate)
    assert said is not None and "after Adam" in said and "per leaf" not in said, said


def test_parameters_that_moved_below_the_tolerance_are_not_called_unchanged(first_step):
    """A step that moves every entry by less than the check's tolerance (here by a made-up amount
    no hypothesis makes) is said to have moved, by how much, against what the spec's step
    moves; a step that moved nothing is said to be unchanged."""
    params, grads, masks = first_step
    optim = OptimConfig()
    want, _ = spec_step(optim, params, as32(grads))
    atol = 1e-3 * optim.learning_rate
    nudged = jax.tree.map(lambda p: np.float32(p) + np.float32(3e-7) * np.sign(p), params)
    said = explain_step(nudged, [(params, grads)], optim, masks, atol, want)()
    assert said.startswith("train_step moved ") and "under the check's tolerance" in said, said
    assert "unchanged" not in said
    still = explain_step(params, [(params, grads)], optim, masks, atol, want)()
    assert still == "train_step left the parameters unchanged"


def test_the_search_names_nothing_for_the_spec_step(first_step):
    """The spec's own step, in float32 as an implementation takes it, fits no departure."""
    params, grads, masks = first_step
    for optim in (OptimConfig(), OptimConfig(clip_norm=1e-6, weight_decay=0.1)):
        got, _ = spec_step(optim, params, as32(grads))
        assert search_step(copy_to_host(got), [(params, grads)], optim, masks, 1e-6) is None


def test_hypotheses_hold_every_way_alone_and_every_pair():
    """Every alternative of every part is tried alone, and with each alternative of every other
    part; the spec's own way first."""
    parts = optimiser_parts(OptimConfig(), 1)
    found = hypotheses(parts)
    assert not found[0].departures
    singles = {h.departures for h in found if len(h.departures) == 1}
    assert singles == {((part.name, way),) for part in parts for way in part.alternatives}
    pairs = sum(
        len(a.alternatives) * len(b.alternatives)
        for i, a in enumerate(parts)
        for b in parts[i + 1 :]
    )
    assert sum(len(h.departures) == 2 for h in found) == pairs


def test_a_ratio_equal_to_beta_is_named_as_beta():
    kl_axes = (Axis("latent dimensions", 8, "sum"), Axis("the batch", 12, "mean"))
    said = explain_ratio("kl", 0.25 * 1.4, 1.4, Hints(axes=kl_axes, notes=beta_notes("kl", 0.25)))
    assert said is not None and "beta = 0.25 (config.loss.beta)" in said, said
    said = explain_ratio("kl", 4 * 1.4, 1.4, Hints(axes=kl_axes, notes=beta_notes("kl", 0.25)))
    assert said is not None and "1/beta" in said, said


def test_products_of_factors_are_named_factor_by_factor():
    """A mean over latent dimensions (1/8) and the missing 0.5 (2): 1/4, both named; with beta
    0.25 among the factors, the one factor beta is named instead (the fewest factors win); a
    ratio no product makes names nothing."""
    kl_axes = (Axis("latent dimensions", 8, "sum"), Axis("the batch", 12, "mean"))
    said = explain_ratio("kl", 0.35, 1.4, Hints(axes=kl_axes, notes=KL_NOTES))
    assert "a mean over latent dimensions" in said and "without their factor 0.5" in said, said
    notes = beta_notes("kl", 0.25, KL_NOTES)
    both = explain_ratio("kl", 0.35, 1.4, Hints(axes=kl_axes, notes=notes))
    assert "beta = 0.25" in both and "a mean over latent dimensions" not in both, both
    assert explain_ratio("kl", 0.37, 1.4, Hints(axes=kl_axes, notes=KL_NOTES)) is None


def test_two_forward_departures_are_named_together():
    """tanh and the label before the input, computed from the pieces a port would use."""
    params = copy_to_host(suite_params(42))
    batch = suite_batch(7)
    x, c = np.asarray(batch.x, np.float64), np.asarray(batch.c)
    h = np.concatenate([reference.one_hot(c, MODEL.num_classes), x], axis=1)
    for layer in params["encoder"]:
        h = np.tanh(h @ layer["kernel"] + layer["bias"])
    s = h @ params["latent"]["kernel"] + params["latent"]["bias"]
    got = (s[:, : MODEL.latent_dim], s[:, MODEL.latent_dim :])
    said = search_forward("encode", got, params, (x, c, MODEL.num_classes), matches)
    assert said is not None and "tanh" in said and "[one_hot(c), x]" in said, said


def test_a_changed_constant_is_fitted_and_said_in_its_fewest_digits(first_step):
    """optax's AdamW with b2 = 0.98 over three steps (b2 is invisible at the first): no way of
    writing AdamW reproduces it, the spec's with b2 fitted does, said as 0.98; with the spec's
    b2 nothing is fitted."""
    params, _, _ = first_step
    batch, key = suite_batch(7), jax.random.key(13)
    eps = spec_noise(key, B, MODEL.latent_dim)
    optim = OptimConfig()
    for b2, expected in ((0.98, "b2 = 0.98 (the spec's 0.999)"), (0.999, None)):
        tx = optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.adamw(optim.learning_rate, b1=0.9, b2=b2, eps=1e-8, weight_decay=0.0),
        )
        p, state, history = params, tx.init(as32(params)), []
        for _ in range(3):
            grads = copy_to_host(
                reference.loss_and_grad(
                    p, batch.x, batch.c, eps, num_classes=MODEL.num_classes
                ).grads
            )
            history.append((p, grads))
            updates, state = tx.update(as32(grads), state, as32(p))
            p = copy_to_host(optax.apply_updates(as32(p), updates))
        masks = jax.tree.map(lambda g: np.abs(g) > 1e-3 * np.abs(g).max(), grads)
        atol = 1e-3 * optim.learning_rate
        assert search_step(p, history, optim, masks, atol) is None
        said = fit_constant(p, history, optim, masks, atol)
        assert (said is None) if expected is None else (expected in said), said


def test_an_input_mapped_again_is_fitted():
    """The encoder fed MNIST's normalisation (x - 0.1307) / 0.3081, computed as a port would:
    no way searched reproduces it, the fitted map does and names both constants."""
    params = copy_to_host(suite_params(42))
    batch = suite_batch(7)
    x, c = np.asarray(batch.x, np.float64), np.asarray(batch.c)
    h = np.concatenate([(x - 0.1307) / 0.3081, reference.one_hot(c, MODEL.num_classes)], axis=1)
    for layer in params["encoder"]:
        h = np.maximum(h @ layer["kernel"] + layer["bias"], 0.0)
    s = (h @ params["latent"]["kernel"] + params["latent"]["bias"]).astype(np.float32)
    got = (s[:, : MODEL.latent_dim], s[:, MODEL.latent_dim :])
    given = (x, c, MODEL.num_classes)
    assert search_forward("encode", got, params, given, matches) is None
    said = fit_forward("encode", got, params, given, matches)
    assert said is not None and "(x - 0.1307) / 0.3081" in said, said
