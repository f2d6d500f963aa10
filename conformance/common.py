"""What the conformance tests share: a small model, inputs, and parameters drawn by the suite.

Everything here comes from the spec alone, never from an implementation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae_rosetta.spec.canonical import layer_sizes
from cvae_rosetta.spec.config import Config, ModelConfig, OptimConfig
from cvae_rosetta.spec.validation import Batch

# A small model of the bundled digits' shape: 64 pixels, 10 labels.
MODEL = ModelConfig(
    input_dim=64, num_classes=10, latent_dim=8, encoder_dims=(32, 16), decoder_dims=(16, 32)
)
CONFIG = Config(model=MODEL)
B = 12

# float32 against float64: relative error of sums of O(100) products is ~1e-6; leave headroom.
RTOL, ATOL = 2e-5, 1e-5


def digits(batch_size: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray, Batch]:
    """Real handwritten digits for the checks that train: scikit-learn's bundled 8x8 digits scaled
    from 0..16 to [0, 1], the first 1500 shuffled (by ``seed``) into full batches
    ``xs: [n, B, 64]``, ``cs: [n, B]``, and the other 297 as one test batch. The suite reads them
    itself, so it needs nothing of the application's data loading."""
    from sklearn.datasets import load_digits

    x, c = load_digits(return_X_y=True)
    x, c = (x / 16.0).astype(np.float32), c.astype(np.int32)
    train, test = slice(0, 1500), slice(1500, None)
    order = np.random.default_rng(seed).permutation(1500)
    n = 1500 // batch_size
    xs = x[train][order][: n * batch_size].reshape(n, batch_size, -1)
    cs = c[train][order][: n * batch_size].reshape(n, batch_size)
    return xs, cs, Batch(jnp.asarray(x[test]), jnp.asarray(c[test]))


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

    ``paths``: other ways to run the same train step (``extras["paths"]`` of an
    :class:`~cvae_rosetta.spec.protocol.Adapter`). ``data_parallel``: a ``grads_fn`` (the step's
    gradient half), which the per-device data-parallel steps (``pmap``, ``shard_map``) need.
    """
    found = set()
    if getattr(impl, "extras", {}).get("paths"):
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
