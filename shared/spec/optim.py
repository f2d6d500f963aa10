"""SPEC section 5: the one optimiser every implementation uses, and its learning-rate schedule.

``optim.schedule`` is ``constant`` (the spec's default, and what the conformance suite checks),
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
    if optim.schedule == "constant":
        adamw = optax.adamw(
            optim.learning_rate, b1=B1, b2=B2, eps=EPS, weight_decay=optim.weight_decay
        )
    else:
        adamw = _scheduled_adamw(schedule(optim), optim.weight_decay)
    return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adamw)


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


def _scheduled_adamw(
    rate: Callable[[Any], Any], weight_decay: float
) -> optax.GradientTransformation:
    """``optax.adamw(rate, ...)`` with the rate read from Adam's count: the same updates, and the
    same state as the constant ``optax.adamw`` (Adam's state and two empty ones)."""
    adam = optax.scale_by_adam(b1=B1, b2=B2, eps=EPS)
    decay = optax.add_decayed_weights(weight_decay)

    def init(params):
        return (adam.init(params), optax.EmptyState(), optax.EmptyState())

    def update(updates, state, params=None):
        adam_state, decay_state, scale_state = state
        step_size = -rate(adam_state.count)  # steps taken before this one, as scale_by_schedule
        updates, adam_state = adam.update(updates, adam_state, params)
        updates, decay_state = decay.update(updates, decay_state, params)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, (adam_state, decay_state, scale_state)

    return optax.GradientTransformation(init, update)
