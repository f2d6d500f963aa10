"""SPEC section 5: the one optimiser every implementation uses."""

from __future__ import annotations

import functools

import optax

from cvae_rosetta.spec.config import OptimConfig


@functools.cache
def make_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW.

    Cached per (hashable, frozen) config, so two states built from equal configs hold the very same
    transformation object: it travels as static pytree metadata, and equal metadata means a jitted
    step compiles once.
    """
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(
            optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
        ),
    )
