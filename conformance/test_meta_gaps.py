"""Checks added because a deliberately broken implementation passed the rest of the suite.

Each closes a gap that ``conformance/meta_tests`` found (``docs/meta_tests.md`` lists which bug
each one catches). Like every conformance check, they touch only the protocol and compare with the
float64 NumPy reference of ``cvae_rosetta.conformance.reference``.

- Clipping: Adam's first update ``lr * g / (|g| + eps)`` does not depend on the gradient's scale,
  so one step at the usual clip norm cannot see whether the gradient was clipped; a clip norm that
  brings the gradient down to Adam's ``eps`` can. Gradients that small also show where epsilon is
  added: Keras's and TensorFlow's Adam adds it to the uncorrected ``sqrt(v)``, an effective
  ``eps / sqrt(1 - b2^t)`` (31.6 times the spec's at the first step), which the usual gradients
  hide; the failure then names it (``common.epsilon_mistakes``).
- Later steps: the first step of a fresh Adam equals the first step of an Adam whose state never
  advances; only the second and later steps tell them apart.

Both check the optimiser's arithmetic, not the step's tracing, so they run the step jitted (one
compiled program per optimiser setting; run eagerly, every small operation of the update compiles
on its own). That the jitted step is the eager one is a check of the ``jit`` layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import (
    CONFIG,
    MODEL,
    B,
    assert_close,
    at_path,
    copy_to_host,
    epsilon_mistakes,
    optimizer_mistakes,
    spec_noise,
    spec_step,
    step_mistake,
    suite_batch,
    suite_params,
    where_max,
)
from cvae_rosetta.spec.config import OptimConfig


def as32(tree):
    return jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), tree)


# --- clipping -------------------------------------------------------------------------------------


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
            explain=lambda: step_mistake(
                got, optimizer_mistakes(params, ref.grads, optim), masks, 1e-3 * lr
            ),
        )


# --- later steps ----------------------------------------------------------------------------------

STEPS = 3


def adam_bound(t: int, b1: float = 0.9, b2: float = 0.999) -> float:
    """The largest ``|m_hat / sqrt(v_hat)|`` of Adam's step ``t`` over all gradient histories
    (Cauchy-Schwarz on the two moving averages); 1 at the first step."""
    ratio = sum((b1 * b1 / b2) ** k for k in range(t))
    return np.sqrt(1 - b2**t) / (1 - b1**t) * (1 - b1) / np.sqrt(1 - b2) * np.sqrt(ratio)


@pytest.mark.parametrize(
    "optim", [OptimConfig(), OptimConfig(learning_rate=3e-3, clip_norm=0.5, weight_decay=0.1)]
)
def test_later_steps_follow_the_reference_optimizer(impl, optim):
    """Three steps on three batches: each step, from the parameters the implementation reached,
    equals the reference gradient there fed through the spec's optimiser, whose state the check
    carries along. Entries whose gradients have been at float32 noise level on every step so far
    are held only to Adam's bound on an update's size."""
    config = CONFIG.replace(optim=optim)
    lr = optim.learning_rate
    params = copy_to_host(suite_params(42))
    state = impl.from_canonical(suite_params(42), config)
    step = jax.jit(impl.train_step)
    ref_state = None  # the spec's optimiser's, carried along (fresh at the first step)
    squares = jax.tree.map(lambda p: np.zeros(p.shape), params)  # sum of squared clipped grads
    for t in range(STEPS):
        batch, key = suite_batch(60 + t), jax.random.key(70 + t)
        before = copy_to_host(impl.to_canonical(state))
        state, _ = step(state, batch, key)
        got = impl.to_canonical(state)

        eps = spec_noise(key, B, MODEL.latent_dim)
        ref = reference.loss_and_grad(before, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
        norm = np.sqrt(sum(np.sum(g**2) for g in jax.tree.leaves(ref.grads)))
        clip = min(1.0, optim.clip_norm / norm)
        squares = jax.tree.map(lambda s, g, c=clip: s + (c * g) ** 2, squares, ref.grads)
        grads = as32(ref.grads)
        carried = ref_state  # the reference optimiser's state before this step
        want, ref_state = spec_step(optim, before, grads, carried)
        restarted, _ = spec_step(optim, before, grads)
        if t > 0:
            # the check has teeth: an Adam restarted at every step would move elsewhere
            gaps = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)), want, restarted)
            moved = np.mean(np.concatenate([g.ravel() for g in jax.tree.leaves(gaps)]) > 0.1 * lr)
            assert moved > 0.1, (
                f"step {t + 1}: a restarted Adam moves only {moved:.0%} of the entries elsewhere "
                "than the reference: the check itself cannot tell them apart"
            )

        masks = jax.tree.map(lambda s: np.sqrt(s) > 1e-3 * np.sqrt(s).max(), squares)
        mistakes = [
            (
                f"step {t + 1} is a fresh Adam's first step from where the implementation was: the "
                "optimiser state does not advance (the spec's Adam carries its moments and count)",
                restarted,
            ),
            *(
                (why, spec_step(optim, before, grads, carried, eps=eps)[0])
                for why, eps in epsilon_mistakes(t + 1)
            ),
        ]
        for path, reliable in jax.tree_util.tree_leaves_with_path(masks):
            p0, p1, w = (np.asarray(at_path(tree, path)) for tree in (before, got, want))
            name = f"after step {t + 1}, {jax.tree_util.keystr(path)}"
            assert_close(
                p1[reliable],
                w[reliable],
                name,
                rtol=1e-6,
                atol=1e-3 * lr,
                against="the reference optimiser's",
                explain=lambda got=got, mistakes=mistakes, masks=masks: step_mistake(
                    got, mistakes, masks, 1e-3 * lr
                ),
            )
            bound = lr * adam_bound(t + 1) * (1 + 1e-4)
            bound = bound + lr * optim.weight_decay * (np.abs(p0) + 1e-6)
            moved = np.abs(p1 - p0)
            assert np.all(moved <= bound), (
                f"{name} moved by up to {moved.max():.3g}{where_max(moved - bound)}; Adam's step "
                f"{t + 1} moves an entry by at most {bound.max():.3g}"
            )
