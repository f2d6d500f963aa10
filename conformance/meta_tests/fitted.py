"""Broken implementations whose causes the suite names by a fitted constant.

Each is the reference with one constant a port changed (a rate, a moment's decay, epsilon, the
weight decay, the input's scale, a leaky ReLU's slope), where no way of writing the layer the
search of hypotheses holds reproduces it: the spec's computation with that constant fitted
(``hypotheses.fit_constant``, ``forward_hypotheses.fit_forward``) does, and the diagnosis says the
value. Registered after ``searched``'s; ``broken.EXPECTED`` holds each to its diagnosis.
"""

from __future__ import annotations

import functools

import jax
import optax

from cvae_rosetta.conformance.meta_tests.pieces import (
    activated,
    adamw_with,
    pipeline,
    prepared,
    with_optimizer,
)
from cvae_rosetta.conformance.meta_tests.registry import bug


@bug
def adam_b2_of_transformers():
    """``b2 = 0.98``, a transformer training habit, where the spec's is 0.999: the first step is
    the spec's (bias correction), the later ones are not."""
    return with_optimizer(lambda optim: adamw_with(optim, b2=0.98))


@bug
def adam_b1_changed():
    """``b1 = 0.5`` (a GAN habit) where the spec's is 0.9."""
    return with_optimizer(lambda optim: adamw_with(optim, b1=0.5))


@bug
def adam_epsilon_changed():
    """``eps = 1e-6``, a value some ports raise epsilon to, where the spec's is 1e-8."""
    return with_optimizer(lambda optim: adamw_with(optim, eps=1e-6))


@bug
def weight_decay_hardcoded():
    """``weight_decay=0.01`` (``torch.optim.AdamW``'s default) written as a number, where the spec
    reads ``optim.weight_decay``."""
    return with_optimizer(lambda optim: adamw_with(optim, weight_decay=0.01))


@bug
def learning_rate_hardcoded():
    """``optax.adamw(3e-4, ...)``, a tutorial's rate written as a number, where the spec reads
    ``optim.learning_rate``."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.adamw(3e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay),
        )
    )


@bug
def input_normalised_again():
    """The encoder fed ``(x - 0.1307) / 0.3081`` (MNIST's mean and deviation, a data pipeline
    habit) where the spec feeds x in [0, 1] as it is."""
    return pipeline(encode=prepared(lambda x: (x - 0.1307) / 0.3081))


@bug
def leaky_relu_of_gans():
    """Leaky ReLU of slope 0.2 (``jax.nn.leaky_relu(h, 0.2)``, a GAN habit) where the spec's
    hidden activation is ReLU."""
    return activated(functools.partial(jax.nn.leaky_relu, negative_slope=0.2))


# What the suite's diagnosis must say of each (``broken.EXPECTED`` holds them with the others').
EXPECTED: dict[str, tuple[str, str]] = {
    "adam_b2_of_transformers": ("later_steps", "with b2 = 0.98 (the spec's 0.999)"),
    "adam_b1_changed": ("later_steps", "with b1 = 0.5 (the spec's 0.9)"),
    "adam_epsilon_changed": ("step", "with eps = 1e-06 (the spec's 1e-08)"),
    "weight_decay_hardcoded": ("step", "weight decay 0.01 (optim.weight_decay = 0"),
    "learning_rate_hardcoded": ("step", "a learning rate 0.3 times the spec's"),
    "input_normalised_again": ("forward", "((x - 0.1307) / 0.3081)"),
    "leaky_relu_of_gans": ("forward", "a leaky ReLU of slope 0.2"),
}
