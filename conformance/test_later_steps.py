"""The ``later_steps`` layer: the second and later steps against the float64 reference optimiser,
its state carried along, at the constant rate and under the learning-rate schedules (SPEC section
5).

The first check was added because a deliberately broken implementation passed the rest of the
suite (``conformance/meta_tests``; ``docs/meta_tests.md`` lists which bug each check catches): the
first step of a fresh Adam equals the first step of an Adam whose state never advances; only the
second and later steps tell them apart. Its failure names the mistake that explains it, where one
does: the state that does not advance, epsilon added to the uncorrected root, the moments used
without bias correction.

The learning-rate schedules (``optim.schedule``): every other optimiser check runs at the constant
rate, so an implementation that never reads ``optim.schedule`` passes them and trains at the wrong
rate under ``cvae train --schedule warmup_cosine``. Here a ``warmup_cosine`` and a ``cosine``
config short enough to be walked end to end within a few steps (the warm-up from 0, the peak, the
cosine tail and the floor at ``end_learning_rate``) are stepped with the implementation's
``train_step``; after every step its parameters must equal one step of the float64 reference
optimiser (``reference.adamw_step``, the schedules written from their formulas, no optax) from
where the implementation was, with the reference's Adam state carried along. The rate of step
``t`` is the schedule's at count ``t - 1``, the number of steps already taken.

A failure names the schedule, the step and its phase, and, where the parameters moved as the
reference's update at another rate would move them, that rate and the mistake it shows (the
constant rate: the schedule is ignored; the count read after the step; the cosine spanning
``decay_steps`` after the warm-up; the floor left out).

Schedules are a capability an implementation may decline: one that refuses a scheduled config with
a ``ConfigError`` (or a ``ValueError`` naming ``optim.schedule``) from ``from_canonical`` or its
first ``train_step``, before computing anything, reports the schedule check as not applicable.

Both checks run the step jitted, one program per config, as the other optimiser checks do.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
import pytest

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.assertions import assert_close
from cvae_rosetta.conformance.common import (
    CONFIG,
    MODEL,
    B,
    as32,
    at_path,
    copy_to_host,
    spec_noise,
    spec_step,
    suite_batch,
    suite_params,
)
from cvae_rosetta.conformance.hypotheses import (
    explain_step,
    fit_constant,
    search_step,
    searched_step,
)
from cvae_rosetta.conformance.messages import Hints, mismatch, where_max
from cvae_rosetta.spec.config import OptimConfig
from cvae_rosetta.spec.errors import ConfigError

LATER_STEPS = 3


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
    history = []  # (the parameters before each step, the float64 gradient there)
    for t in range(LATER_STEPS):
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
        history.append((before, ref.grads))
        explain = explain_step(got, list(history), optim, masks, 1e-3 * lr, want)
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
                explain=explain,
                searched=searched_step(optim, t + 1),
            )
            bound = lr * adam_bound(t + 1) * (1 + 1e-4)
            bound = bound + lr * optim.weight_decay * (np.abs(p0) + 1e-6)
            moved = np.abs(p1 - p0)
            assert np.all(moved <= bound), (
                f"{name} moved by up to {moved.max():.3g}{where_max(moved - bound)}; Adam's step "
                f"{t + 1} moves an entry by at most {bound.max():.3g}"
            )


# warm-up from 0 over steps 1-2, the peak at step 3, the cosine at steps 4-5, the floor from step 6
WARMUP_COSINE = OptimConfig(
    schedule="warmup_cosine",
    learning_rate=3e-3,
    warmup_steps=2,
    decay_steps=5,
    end_learning_rate=3e-4,
    weight_decay=0.1,
)
# the peak at step 1, the cosine at steps 2-3, the floor from step 4
COSINE = OptimConfig(
    schedule="cosine", learning_rate=3e-3, decay_steps=3, end_learning_rate=3e-4, clip_norm=0.5
)
STEPS = {"warmup_cosine": 7, "cosine": 5}


def settings(optim: OptimConfig) -> str:
    fields = ["learning_rate", "warmup_steps", "decay_steps", "end_learning_rate"]
    if optim.schedule == "cosine":
        fields.remove("warmup_steps")
    return ", ".join(f"{name} {getattr(optim, name):g}" for name in fields)


def phase(optim: OptimConfig, count: int) -> str:
    """Where in its schedule the step after ``count`` steps is."""
    warmup = optim.warmup_steps if optim.schedule == "warmup_cosine" else 0
    if count < warmup:
        return "warm-up"
    if count == warmup:
        return "peak"
    if count < optim.decay_steps:
        return "cosine"
    return "floor at end_learning_rate"


def rate_mistakes(optim: OptimConfig, count: int) -> list[tuple[float, str]]:
    """``(rate, what taking the step at that rate shows)`` for the step after ``count`` steps."""
    lr = optim.learning_rate
    found = [
        (
            lr,
            f"as if the learning rate were constant at {lr:g} (optim.learning_rate): the schedule "
            "is ignored",
        ),
        (
            reference.learning_rate(optim, count + 1),
            "as if the rate were read at count t, once the step is counted, where the spec reads "
            "it at count t - 1, the steps already taken (Adam's count before the step)",
        ),
        (
            reference.learning_rate(optim.replace(end_learning_rate=0.0), count),
            "as if the cosine ended at 0: optim.end_learning_rate is ignored",
        ),
    ]
    if optim.schedule == "warmup_cosine":
        longer = optim.replace(decay_steps=optim.decay_steps + optim.warmup_steps)
        found.append(
            (
                reference.learning_rate(longer, count),
                "as if the cosine spanned decay_steps after the warm-up (Keras's CosineDecay) "
                "where the spec's decay_steps counts the warm-up (optax's)",
            )
        )
    return found


def rate_mistake(
    optim: OptimConfig, count: int, before, got, step: reference.Step, masks
) -> str | None:
    """The rate the implementation's step was taken at, where its parameters moved along the
    reference's direction (``before - rate * direction``), and the mistake that rate shows."""
    moved, direction = [], []
    for path, reliable in jax.tree_util.tree_leaves_with_path(masks):
        p0, p1 = (np.asarray(at_path(t, path), np.float64) for t in (before, got))
        moved.append((p0 - p1)[reliable])
        direction.append(np.asarray(at_path(step.direction, path))[reliable])
    moved, direction = np.concatenate(moved), np.concatenate(direction)
    den = float(direction @ direction)
    if den == 0.0:
        return None
    rate = float(moved @ direction) / den
    residual = np.linalg.norm(moved - rate * direction)
    if residual > 1e-3 * max(abs(rate), 1e-3 * optim.learning_rate) * np.sqrt(den):
        return None  # not a step along the reference's direction: another mistake
    close = 2e-3 * optim.learning_rate
    for candidate, why in rate_mistakes(optim, count):
        if abs(candidate - step.rate) > 5 * close and abs(rate - candidate) <= close:
            return why
    if abs(rate - step.rate) <= close:
        return None
    return f"as if the learning rate were {rate:.4g} at this step"


def _refused(err: Exception) -> bool:
    return isinstance(err, ConfigError) or (
        isinstance(err, ValueError) and "optim.schedule" in str(err)
    )


def _not_applicable(impl, optim: OptimConfig, err: Exception) -> None:
    said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    pytest.skip(
        f"not applicable: {getattr(impl, 'name', impl)} refuses optim.schedule="
        f"{optim.schedule!r}: {said}"
    )


class ScheduledStep(NamedTuple):
    """One step of the schedule check, for the explanation of its failure: its number ``t``, the
    parameters before and after it, the reference optimiser's step from ``before``, the entries
    held to the reference, where the step is, every step's parameters and float64 gradient so far,
    and the tolerance of an update."""

    t: int
    before: Any
    got: Any
    want: reference.Step
    masks: Any
    where: str
    history: tuple[tuple[Any, Any], ...]  # (the parameters before each step, the gradient there)
    atol: float


@pytest.mark.parametrize("optim", [WARMUP_COSINE, COSINE], ids=lambda o: o.schedule)
def test_train_step_follows_the_learning_rate_schedule(impl, optim):
    """Each step of a scheduled config, from the parameters the implementation reached, equals
    one step of the float64 reference optimiser there at the schedule's rate, with the
    reference's Adam state carried along. Entries whose gradients have been at float32 noise level
    on every step so far are held only to Adam's bound on an update's size."""
    # the check has teeth: its steps walk the warm-up, the peak, the cosine and the floor
    counts = range(STEPS[optim.schedule])
    phases = {phase(optim, count) for count in counts}
    assert phases >= {"peak", "cosine", "floor at end_learning_rate"}, phases
    assert optim.schedule != "warmup_cosine" or "warm-up" in phases, phases
    rates = [reference.learning_rate(optim, count) for count in counts]
    assert len(set(np.round(rates, 12))) >= 4, rates
    assert np.isclose(rates[-1], optim.end_learning_rate, rtol=1e-12), rates

    config = CONFIG.replace(optim=optim)
    name = f"with optim.schedule={optim.schedule!r}"
    detail = f"the schedule: {settings(optim)}; the rate of step t is its value at count t - 1"
    try:
        state = impl.from_canonical(suite_params(42), config)
    except Exception as err:
        if _refused(err):
            _not_applicable(impl, optim, err)
        raise
    step = jax.jit(impl.train_step)
    ref_state = None  # the reference optimiser's, carried along (fresh at the first step)
    squares = jax.tree.map(lambda p: np.zeros(p.shape), copy_to_host(suite_params(42)))
    history = []  # (the parameters before each step, the float64 gradient there)
    for t in range(1, STEPS[optim.schedule] + 1):
        batch, key = suite_batch(80 + t), jax.random.key(90 + t)
        before = copy_to_host(impl.to_canonical(state))
        try:
            state, _ = step(state, batch, key)
        except Exception as err:
            if t == 1 and _refused(err):
                _not_applicable(impl, optim, err)
            raise
        got = impl.to_canonical(state)

        eps = spec_noise(key, B, MODEL.latent_dim)
        ref = reference.loss_and_grad(before, batch.x, batch.c, eps, num_classes=MODEL.num_classes)
        want = reference.adamw_step(before, ref.grads, optim, ref_state)
        ref_state = want.state
        squares = jax.tree.map(
            lambda s, g, c=want.clip_scale: s + (c * np.asarray(g)) ** 2, squares, ref.grads
        )
        masks = jax.tree.map(lambda s: np.sqrt(s) > 1e-3 * np.sqrt(s).max(), squares)
        rate = want.rate
        where = f"{name}, the parameters after step {t} ({phase(optim, t - 1)}, rate {rate:.4g})"
        atol = 1e-3 * max(rate, 1e-3 * optim.learning_rate)

        history.append((before, ref.grads))
        seen = ScheduledStep(t, before, got, want, masks, where, tuple(history), atol)

        def explain(seen=seen):
            t, before, got, want, masks, where, history, atol = seen
            why = search_step(got, history, optim, masks, atol)
            if why is not None:
                return f"{where}: {why}"
            why = rate_mistake(optim, t - 1, before, got, want, masks)
            if why is not None:
                return f"{where} differ from the float64 reference {why}"
            why = fit_constant(got, history, optim, masks, atol)
            return None if why is None else f"{where}: {why}"

        for path, reliable in jax.tree_util.tree_leaves_with_path(masks):
            p0, p1, w = (np.asarray(at_path(tree, path)) for tree in (before, got, want.params))
            leaf = f"{where}, {jax.tree_util.keystr(path)}"
            message = mismatch(
                p1[reliable],
                w[reliable],
                leaf,
                rtol=1e-6,
                atol=atol,
                hints=Hints(
                    against="the float64 reference optimiser's",
                    explain=explain,
                    searched=searched_step(optim, t),
                ),
            )
            assert message is None, f"{message}\n{detail}"
            bound = rate * adam_bound(t) * (1 + 1e-4)
            bound = bound + rate * optim.weight_decay * (np.abs(p0) + 1e-6) + atol
            moved = np.abs(p1 - p0)
            assert np.all(moved <= bound), (
                f"{leaf} moved by up to {moved.max():.3g}{where_max(moved - bound)}; Adam's step "
                f"{t} at the schedule's rate {rate:.4g} moves an entry by at most {bound.max():.3g}"
                f"\n{detail}"
            )
