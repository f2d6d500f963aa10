"""SPEC section 4: the loss, written once for every implementation.

Every function reduces in float32, whatever the compute dtype of the model that produced its
inputs, so a bfloat16 forward pass still has a float32 loss and float32 gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cvae_rosetta.spec.config import LossConfig

Metrics = dict[str, jax.Array]


def kl_terms(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """``0.5 * (exp(logvar) + mean^2 - 1 - logvar)`` elementwise: KL(q(z|x,c) || N(0, I)) terms."""
    mean = mean.astype(jnp.float32)
    logvar = logvar.astype(jnp.float32)
    return 0.5 * (jnp.exp(logvar) + jnp.square(mean) - 1.0 - logvar)


def bernoulli_recon(logits: jax.Array, x: jax.Array) -> jax.Array:
    """Per-example Bernoulli negative log-likelihood in nats, ``[B]``.

    ``optax.sigmoid_binary_cross_entropy(l, x)`` summed over pixels, written as the same function
    ``softplus(l) - l * x``: one softplus per pixel where optax's form takes two log-sigmoids,
    which is most of the step's elementwise work at large batches (a profile of the CPU step).
    The two agree to float32 rounding; the gradient is ``sigmoid(l) - x`` either way.
    """
    logits = logits.astype(jnp.float32)
    return jnp.sum(jax.nn.softplus(logits) - logits * x.astype(jnp.float32), axis=-1)


def cvae_loss(
    logits: jax.Array, x: jax.Array, mean: jax.Array, logvar: jax.Array, loss: LossConfig
) -> tuple[jax.Array, Metrics]:
    """The scalar loss and its metrics (``loss``, ``recon``, ``kl``: batch means)."""
    if loss.kind == "bernoulli":
        recon = jnp.mean(bernoulli_recon(logits, x))
        kl = jnp.mean(jnp.sum(kl_terms(mean, logvar), axis=-1))
    else:  # "mse", the source guide's definition: means over every element
        squared = jnp.square(jax.nn.sigmoid(logits.astype(jnp.float32)) - x.astype(jnp.float32))
        recon = jnp.mean(0.5 * squared)
        kl = jnp.mean(kl_terms(mean, logvar))
    total = recon + loss.beta * kl
    return total, {"loss": total, "recon": recon, "kl": kl}
