"""The ``step`` layer: one ``train_step`` against the float64 gradient fed through the spec's
optimiser (SPEC section 5).

The first check holds the step to its key before any check of the optimiser: a step that draws its
noise from another key than the one it is given (a fixed one, or one split from it) while ``loss``
uses the given key passes every earlier layer, and the optimiser checks would see only an update
that differs from the reference's. It names the key the noise fits, where one does.

The clipping check was added because a deliberately broken implementation passed the rest of the
suite (``conformance/meta_tests``; ``docs/meta_tests.md`` lists which bug each check catches).
Adam's first update ``lr * g / (|g| + eps)`` does not depend on the gradient's scale, so one step
at the usual clip norm cannot see whether the gradient was clipped; a clip norm that brings the
gradient down to Adam's ``eps`` can. Gradients that small also show where epsilon is added:
Keras's and TensorFlow's Adam adds it to the uncorrected ``sqrt(v)``, an effective
``eps / sqrt(1 - b2^t)`` (31.6 times the spec's at the first step), which the usual gradients
hide. A failure names the way of writing the step that reproduces it, searched among the
plausible ones (``hypotheses.search_step``): clipping after Adam or per variable, epsilon elsewhere,
the decay coupled or unscaled, and their combinations.

Every check here runs the step jitted (one compiled program per optimiser setting; run eagerly,
every small operation of the update compiles on its own): they check the step's arithmetic, not its
tracing. That the jitted step is the eager one is a check of the ``jit`` layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance import common, reference
from cvae_rosetta.conformance.assertions import assert_close
from cvae_rosetta.conformance.common import (
    CONFIG,
    MODEL,
    RTOL,
    B,
    as32,
    at_path,
    copy_to_host,
    spec_noise,
    spec_step,
    suite_batch,
    suite_params,
)
from cvae_rosetta.conformance.hypotheses import explain_step, searched_step
from cvae_rosetta.conformance.messages import where_max
from cvae_rosetta.conformance.mistakes import LossInputs, step_noise_mistake
from cvae_rosetta.spec.config import OptimConfig

params, batch = common.params, common.batch  # the suite's parameters and batch


def test_train_step_draws_its_noise_from_the_key_it_is_given(impl, params, batch):
    """Two keys give two steps from one state and batch, and the step's ``metrics["loss"]`` (the
    loss before the update) is the float64 reference's at the noise ``normal(key, (B, L))`` of the
    key it was given (SPEC section 3). Both steps run one compiled program."""
    start = copy_to_host(params)
    keys = {"jax.random.key(13)": jax.random.key(13), "jax.random.key(14)": jax.random.key(14)}
    step = jax.jit(impl.train_step)
    seen = []
    for key in keys.values():
        state, metrics = step(impl.from_canonical(suite_params(42), CONFIG), suite_batch(7), key)
        seen.append(copy_to_host((impl.to_canonical(state), metrics)))
    first, second = (jax.tree.leaves(s) for s in seen)
    a, b = keys
    assert not all(np.array_equal(x, y) for x, y in zip(first, second, strict=True)), (
        f"train_step gives the same parameters and metrics for keys {a} and {b}: the step ignores "
        "the key it is given; the spec draws its noise eps = normal(key, (B, L)) from it"
    )
    key = keys[a]
    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(start, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
    got = float(seen[0][1]["loss"])
    assert_close(
        got,
        ref.loss,
        f'train_step\'s metrics["loss"] for {a}',
        rtol=RTOL,
        against="the float64 reference loss at the noise normal(key, (B, L)) of that key",
        explain=lambda: step_noise_mistake(
            got, LossInputs(start, batch, key, CONFIG), after=seen[0][0]
        ),
    )


def test_clipping_is_applied_before_adam(impl):
    """With ``clip_norm`` 1e-6 the clipped gradient's entries are near Adam's eps (1e-8), so the
    first update ``lr * g / (|g| + eps)`` shrinks where ``|g|`` is small: without the clipping it
    would be ``lr * sign(g)`` everywhere. The update is a smooth function of ``g`` at this scale,
    so every entry is compared."""
    params = copy_to_host(suite_params(42))
    batch = suite_batch(7)
    optim = OptimConfig(clip_norm=1e-6)
    config = CONFIG.replace(optim=optim)
    key = jax.random.key(25)
    state, _ = jax.jit(impl.train_step)(impl.from_canonical(suite_params(42), config), batch, key)
    got = impl.to_canonical(state)

    eps = spec_noise(key, B, MODEL.latent_dim)
    ref = reference.loss_and_grad(params, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
    grads = as32(ref.grads)
    want, _ = spec_step(optim, params, grads)
    without, _ = spec_step(OptimConfig(clip_norm=1e30), params, grads)

    lr = optim.learning_rate
    # the check has teeth: clipping changes the reference's own update by a good part of lr
    gap = max(
        jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), want, without))
    )
    assert gap > 0.3 * lr, (
        f"clipping moves the reference's own first step by only {gap:.3g}, under 0.3 lr: the "
        "check itself cannot tell a clipped step from an unclipped one"
    )
    # where a mistake's update is lr * sign(g), only entries with |g| above float32 noise tell
    masks = jax.tree.map(lambda g: np.abs(g) > 1e-3 * np.abs(g).max(), ref.grads)
    for path, w in jax.tree_util.tree_leaves_with_path(want):
        assert_close(
            at_path(got, path),
            w,
            f"after one step with clip_norm 1e-6, {jax.tree_util.keystr(path)}",
            rtol=0,
            atol=1e-3 * lr,
            against="the reference update (the spec's clipped AdamW)",
            explain=explain_step(got, [(params, ref.grads)], optim, masks, 1e-3 * lr, want),
            searched=searched_step(optim, 1),
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
            explain=explain_step(got, [(start, grads)], optim, masks, atol, want),
            searched=searched_step(optim, 1),
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
