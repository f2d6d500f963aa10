"""The CVAE in plain JAX: parameters are an explicit pytree, the model is a set of functions.

This is the reference implementation. Its parameter tree *is* the canonical tree of the spec, so its
converters are the identity; `cvae compare`, the benchmark and the suite's pairwise checks measure
the others against it (the suite's own checks use its float64 reference). The file sets
the shape every implementation follows: the same sections, in the same order, each between
``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` markers that the docs pull code from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cvae_rosetta.spec.canonical import Canonical, layer_sizes
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, reparameterize, split_moments
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.state import TrainState
from cvae_rosetta.spec.validation import Batch

# --8<-- [start:module]
# A layer is a dict {"kernel": f32[in, out], "bias": f32[out]}; the model is the canonical tree
# {"encoder": [layer, ...], "latent": layer, "decoder": [layer, ..., output layer]}.
Params = Canonical


def dense(layer: dict, h: jax.Array) -> jax.Array:
    """``h @ kernel + bias``, computed in the dtype of ``h`` (the compute dtype)."""
    return h @ layer["kernel"].astype(h.dtype) + layer["bias"].astype(h.dtype)


def mlp(layers: list[dict], h: jax.Array) -> jax.Array:
    """Dense layers, each followed by a ReLU."""
    for layer in layers:
        h = jax.nn.relu(dense(layer, h))
    return h


# --8<-- [end:module]


# --8<-- [start:init]
def init_params(key: jax.Array, model: ModelConfig) -> Params:
    """LeCun-normal kernels (truncated normal, variance 1/fan_in), zero biases."""
    kernel_init = jax.nn.initializers.lecun_normal()
    sizes = layer_sizes(model)
    keys = iter(jax.random.split(key, sum(len(group) for group in sizes.values())))

    def layer(fan_in: int, fan_out: int) -> dict:
        return {
            "kernel": kernel_init(next(keys), (fan_in, fan_out), jnp.float32),
            "bias": jnp.zeros((fan_out,), jnp.float32),
        }

    return {
        "encoder": [layer(*s) for s in sizes["encoder"]],
        "latent": layer(*sizes["latent"][0]),
        "decoder": [layer(*s) for s in sizes["decoder"]],
    }


def create_state(params: Params, config: Config) -> TrainState:
    return TrainState.create(params, config)


# --8<-- [end:init]


# --8<-- [start:forward]
def encode(params: Params, x: jax.Array, c: jax.Array, model: ModelConfig):
    """q(z | x, c): ``(mean, logvar)``, each ``f32[B, L]``."""
    h = condition(x.astype(model.compute_dtype), c, model.num_classes)
    s = dense(params["latent"], mlp(params["encoder"], h))
    return split_moments(s, model.latent_dim)


def decode(params: Params, z: jax.Array, c: jax.Array, model: ModelConfig) -> jax.Array:
    """p(x | z, c): Bernoulli logits ``f32[B, D]``."""
    *hidden, output = params["decoder"]
    h = condition(z.astype(model.compute_dtype), c, model.num_classes)
    return dense(output, mlp(hidden, h)).astype(jnp.float32)


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(params: Params, batch: Batch, eps: jax.Array, config: Config):
    mean, logvar = encode(params, batch.x, batch.c, config.model)
    z = reparameterize(mean, logvar, eps)
    logits = decode(params, z, batch.c, config.model)
    return cvae_loss(logits, batch.x, mean, logvar, config.loss)


def compute_grads(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[Params, Metrics]:
    """The gradient of the batch's loss with respect to the parameters, and its metrics: one
    reverse-mode pass. Data-parallel steps run this on each device's rows."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, batch, eps, state.config)
    return grads, metrics


# --8<-- [end:loss]


# --8<-- [start:train_step]
def train_step(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[TrainState, Metrics]:
    grads, metrics = compute_grads(state, batch, eps)
    return state.apply_gradients(grads), metrics


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# Nothing to add: the step above is already a pure function of arrays, so the idiomatic path is the
# fast one. The benchmark compiles it as ``jax.jit(train_step, donate_argnums=0)``; the trainer runs
# its two halves (``compute_grads``, then ``state.apply_gradients``) in its epoch step, compiled
# with the old state donated (``jax.jit``, or ``jax.pmap`` under pmap), so XLA updates its buffers
# in place.
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# The idiomatic step is the fast path, so there is no other path to measure.
PATHS: dict = {}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it (`cvae impls`, install hints,
# the docs' and the benchmark's labels, the order of listings): read from this file's text.
ABOUT = {"label": "pure JAX", "module": "jax", "distribution": "jax", "extra": None, "order": 1}
implementation = Adapter(
    name="pure_jax",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: create_state(init_params(key, config.model), config),
    from_canonical_fn=create_state,
    to_canonical_fn=lambda state: state.params,
    loss_fn=lambda state, batch, eps: loss_fn(state.params, batch, eps, state.config),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=lambda state, x, c: encode(state.params, x, c, state.config.model),
    decode_fn=lambda state, z, c: decode(state.params, z, c, state.config.model),
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
