"""The framework-neutral pieces of SPEC sections 1 and 3: conditioning, sampling, noise, keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def condition(h: jax.Array, c: jax.Array, num_classes: int) -> jax.Array:
    """``concat([h, one_hot(c)])``: how both the encoder and the decoder see the label."""
    return jnp.concatenate([h, jax.nn.one_hot(c, num_classes, dtype=h.dtype)], axis=-1)


def split_moments(s: jax.Array, latent_dim: int) -> tuple[jax.Array, jax.Array]:
    """``(mean, logvar)`` from the latent layer's ``[..., 2L]`` output, in float32."""
    s = s.astype(jnp.float32)
    return s[..., :latent_dim], s[..., latent_dim:]


def reparameterize(mean: jax.Array, logvar: jax.Array, eps: jax.Array) -> jax.Array:
    """``z = mean + exp(0.5 * logvar) * eps``."""
    return mean + jnp.exp(0.5 * logvar) * eps


def noise(key: jax.Array, batch_size: int, latent_dim: int) -> jax.Array:
    """The noise of a step or of generation: ``normal(key, (B, L))`` for the global batch."""
    return jax.random.normal(key, (batch_size, latent_dim), dtype=jnp.float32)


def step_key(run_key: jax.Array, step: int | jax.Array) -> jax.Array:
    """The key of training step ``t``: ``fold_in(run_key, t)``."""
    return jax.random.fold_in(run_key, step)


def generate(impl, state, key: jax.Array, labels: jax.Array) -> jax.Array:
    """Images ``sigmoid(decode(z, c))`` for ``z = normal(key, (n, L))``, one per label."""
    labels = jnp.asarray(labels)
    z = noise(key, labels.shape[0], state.config.model.latent_dim)
    return jax.nn.sigmoid(impl.decode(state, z, labels))


def reconstruct(impl, state, x: jax.Array, c: jax.Array) -> jax.Array:
    """The deterministic reconstruction ``sigmoid(decode(mean, c))``."""
    mean, _ = impl.encode(state, x, c)
    return jax.nn.sigmoid(impl.decode(state, mean, c))
