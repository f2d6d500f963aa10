"""SPEC section 5: the one optimiser every implementation uses, and its learning-rate schedule.

:func:`make_optimizer` is public: ``make_optimizer(config.optim)`` is the spec's optimiser as an
optax transformation, for an implementation or a trainer outside the project (docs/spec.md,
section 5, shows its use).

``optim.schedule`` is ``constant`` (the spec's default, which the conformance suite's checks run
at but for the schedule checks of its later steps),
``cosine`` (from ``learning_rate`` down to ``end_learning_rate`` over ``decay_steps``) or
``warmup_cosine`` (linearly from 0 up to ``learning_rate`` over ``warmup_steps``, then the cosine
down to ``end_learning_rate``; ``decay_steps`` counts the warm-up too, as optax does). The
schedules are optax's own (:func:`schedule`).

A schedule is a function of the optimiser's own step count, and the spec's optimiser keeps exactly
one counter already: Adam's ``count`` (a checkpoint holds it and nothing else beside the moments).
A scheduled optimiser therefore reads the rate from that count instead of adding a
``ScaleByScheduleState`` of its own: its state has the very structure of the constant one, so
every checkpoint, every implementation and every framework's optimiser wrapper takes it unchanged,
and a resumed run continues the schedule bit for bit from the restored count.

Both halves are written as the spec writes them, with optax's building blocks and states. The
clipping is ``g * min(1, clip_norm / n)`` (:func:`clip_by_global_norm`): one scalar factor for every
leaf, where ``optax.clip_by_global_norm`` divides every leaf by the norm. XLA counts an elementwise
division as too expensive to compute twice, so it writes optax's clipped gradient out once and reads
it back in Adam's two moment updates: four passes over the parameters more, fused away here. Adam's
bias corrections are scalar factors too (:func:`scale_by_adam`), where optax writes a division of
both moments by them; compiled, XLA turns a division by a scalar into a multiplication by its
reciprocal, so that half changes a few scalar operations only. docs/fast_step.md measures both
against optax's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cvae_rosetta.spec.config import OptimConfig
from cvae_rosetta.spec.errors import ConfigError

B1, B2, EPS = 0.9, 0.999, 1e-8


@functools.cache
def make_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW, at ``optim``'s learning rate or schedule.

    Cached per (hashable, frozen) config, so two states built from equal configs hold the very same
    transformation object: it travels as static pytree metadata, and equal metadata means a jitted
    step compiles once.
    """
    return optax.chain(
        clip_by_global_norm(optim.clip_norm), adamw(schedule(optim), optim.weight_decay)
    )


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm(max_norm)`` computed as ``g * min(1, max_norm / n)``.

    The same transformation and the same (empty) state as optax's, its result within a rounding of
    optax's ``g / n * max_norm``, but every leaf is multiplied by one scalar: XLA fuses that
    into the consumers of the clipped gradient (Adam's ``mu`` and ``nu``) instead of writing it
    out and reading it back.
    """

    def update(updates, state, params=None):
        del params
        scale = jnp.minimum(1.0, max_norm / optax.tree.norm(updates))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def schedule(optim: OptimConfig) -> Callable[[Any], Any]:
    """The learning rate as an optax schedule of the number of steps already taken."""
    if optim.schedule == "constant":
        return optax.constant_schedule(optim.learning_rate)
    steps = optim.decay_steps
    if steps is None:
        raise ConfigError(
            f"optim.decay_steps: expected the schedule's length in steps with schedule "
            f"{optim.schedule} (OptimConfig.for_run derives it from the run's length), got None"
        )
    if optim.schedule == "cosine":
        alpha = optim.end_learning_rate / optim.learning_rate
        return optax.cosine_decay_schedule(optim.learning_rate, steps, alpha=alpha)
    return optax.warmup_cosine_decay_schedule(
        0.0, optim.learning_rate, optim.warmup_steps, steps, end_value=optim.end_learning_rate
    )


def learning_rates(optim: OptimConfig, steps: Any) -> np.ndarray:
    """The float32 rate each of ``steps`` (1 = the first step) is taken with."""
    counts = np.asarray(steps, np.int32) - 1  # the step count the optimiser has before it
    if optim.schedule == "constant":
        return np.full(counts.shape, optim.learning_rate, np.float32)
    return np.asarray(_jitted_schedule(optim)(counts), np.float32)


@functools.cache
def _jitted_schedule(optim: OptimConfig) -> Callable[[Any], Any]:
    return jax.jit(schedule(optim))


def scale_by_adam() -> optax.GradientTransformation:
    """``optax.scale_by_adam(B1, B2, EPS)``, its state and its update to a rounding, with the bias
    corrections as two scalar factors: ``m * c1 / (sqrt(v * c2) + EPS)``, ``c = 1 / (1 - b^t)``."""
    adam = optax.scale_by_adam(b1=B1, b2=B2, eps=EPS)

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, B1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, B2, 2)
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        c1, c2 = 1 / (1 - B1**t), 1 / (1 - B2**t)
        updates = jax.tree.map(  # in the moments' dtype, as optax's
            lambda m, v: m * c1.astype(m.dtype) / (jnp.sqrt(v * c2.astype(v.dtype)) + EPS), mu, nu
        )
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(adam.init, update)


def adamw(rate: Callable[[Any], Any], weight_decay: float) -> optax.GradientTransformation:
    """``optax.adamw(rate, ...)`` with the rate read from Adam's count (the steps already taken, as
    ``scale_by_schedule`` counts them): the same updates, and the very state of ``optax.adamw``
    (Adam's state and two empty ones), whether the rate is constant or scheduled."""
    adam = scale_by_adam()
    decay = optax.add_decayed_weights(weight_decay)

    def init(params):
        return (adam.init(params), optax.EmptyState(), optax.EmptyState())

    def update(updates, state, params=None):
        adam_state, decay_state, scale_state = state
        step_size = -rate(adam_state.count)
        updates, adam_state = adam.update(updates, adam_state, params)
        updates, decay_state = decay.update(updates, decay_state, params)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, (adam_state, decay_state, scale_state)

    return optax.GradientTransformation(init, update)
