"""What the conformance tests share: a small model, inputs, and parameters drawn by the suite.

Everything here comes from the spec alone, never from an implementation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from shared.canonical import layer_sizes
from shared.config import Config, ModelConfig, OptimConfig
from shared.validation import Batch

# A small model of the bundled digits' shape: 64 pixels, 10 labels.
MODEL = ModelConfig(
    input_dim=64, num_classes=10, latent_dim=8, encoder_dims=(32, 16), decoder_dims=(16, 32)
)
CONFIG = Config(model=MODEL)
B = 12

# float32 against float64: relative error of sums of O(100) products is ~1e-6; leave headroom.
RTOL, ATOL = 2e-5, 1e-5


def reference_params(key: jax.Array, model: ModelConfig = MODEL) -> dict:
    """Canonical parameters drawn by the suite itself (never by an implementation)."""
    sizes = layer_sizes(model)
    keys = iter(jax.random.split(key, 2 * sum(len(group) for group in sizes.values())))

    def layer(fan_in, fan_out):
        return {
            "kernel": jax.random.normal(next(keys), (fan_in, fan_out)) / np.sqrt(fan_in),
            # nonzero biases, so a converter that drops or misplaces them is caught
            "bias": 0.1 * jax.random.normal(next(keys), (fan_out,)),
        }

    return {
        "encoder": [layer(*s) for s in sizes["encoder"]],
        "latent": layer(*sizes["latent"][0]),
        "decoder": [layer(*s) for s in sizes["decoder"]],
    }


def make_batch(key: jax.Array, b: int = B, model: ModelConfig = MODEL) -> Batch:
    kx, kc = jax.random.split(key)
    x = jax.random.uniform(kx, (b, model.input_dim))
    x = x.at[0, :3].set(jnp.array([0.0, 1.0, 0.5]))  # exact 0 and 1 pixels
    c = jax.random.randint(kc, (b,), 0, model.num_classes)
    return Batch(x, c)


def spec_noise(key: jax.Array, b: int, latent: int) -> np.ndarray:
    """SPEC section 3: the noise of a step."""
    return np.asarray(jax.random.normal(key, (b, latent)))


def at_path(tree, path):
    """The leaf of ``tree`` at a ``jax.tree_util`` key path."""
    for entry in path:
        tree = tree[getattr(entry, "key", getattr(entry, "idx", None))]
    return tree


def capabilities(impl) -> set[str]:
    """What an implementation offers beyond the protocol of SPEC section 6.

    ``paths``: other ways to run the same train step (``extras["benchmark_paths"]`` of an
    :class:`~shared.protocol.Adapter`). ``data_parallel``: a ``grads_fn`` (the step's gradient
    half), which the per-device data-parallel steps (``pmap``, ``shard_map``) need.
    """
    found = set()
    if getattr(impl, "extras", {}).get("benchmark_paths"):
        found.add("paths")
    if getattr(impl, "grads_fn", None) is not None:
        found.add("data_parallel")
    return found


def require(impl, capability: str) -> None:
    """Report the calling check as not applicable (never as passed) without ``capability``."""
    if capability not in capabilities(impl):
        pytest.skip(f"not applicable: {getattr(impl, 'name', impl)} has no {capability!r}")


def spec_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    """SPEC section 5, built here from the config's fields (not from the shared code)."""
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(
            optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
        ),
    )
