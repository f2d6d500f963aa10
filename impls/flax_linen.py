"""The CVAE in Flax Linen: a stateless ``nn.Module`` and a variable dict, trained from a TrainState.

A Linen module only describes the computation; its parameters live outside it, in the variable dict
``{"params": ...}`` that ``model.init`` returns and ``model.apply`` takes. ``setup`` declares the
layers, so ``encode`` and ``decode`` are separate methods, reached through ``apply(...,
method=...)``. The state is Flax's own ``TrainState``, extended with the run's config; the
converters rename Linen's modules (``encoder_0``, ``latent``, ``decoder_0``, ...) to the canonical
lists and back.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct
from flax.training import train_state
from flax.typing import Dtype

from cvae_rosetta.spec.canonical import Canonical
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, reparameterize, split_moments
from cvae_rosetta.spec.optim import make_optimizer
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import Batch


# --8<-- [start:module]
def dense(features: int, dtype: Dtype, **kwargs) -> nn.Dense:
    """``nn.Dense`` as the spec initialises it (LeCun-normal kernel, zero bias), float32 params."""
    return nn.Dense(
        features,
        dtype=dtype,
        param_dtype=jnp.float32,
        kernel_init=nn.initializers.lecun_normal(),
        bias_init=nn.initializers.zeros_init(),
        **kwargs,
    )


class CVAE(nn.Module):
    input_dim: int
    num_classes: int
    latent_dim: int
    encoder_dims: tuple[int, ...]
    decoder_dims: tuple[int, ...]
    dtype: Dtype = jnp.float32  # of the computation; the parameters are float32 whatever it is

    def setup(self):
        # Lists of submodules are named after the attribute: encoder_0, encoder_1, ...
        self.encoder = [dense(width, self.dtype) for width in self.encoder_dims]
        self.latent = dense(2 * self.latent_dim, self.dtype)
        self.decoder = [dense(width, self.dtype) for width in (*self.decoder_dims, self.input_dim)]

    def encode(self, x, c):
        """q(z | x, c): ``(mean, logvar)``, each ``f32[B, L]``."""
        h = condition(x, c, self.num_classes)
        for layer in self.encoder:
            h = nn.relu(layer(h))
        return split_moments(self.latent(h), self.latent_dim)

    def decode(self, z, c):
        """p(x | z, c): Bernoulli logits ``f32[B, D]``."""
        *hidden, output = self.decoder
        h = condition(z, c, self.num_classes)
        for layer in hidden:
            h = nn.relu(layer(h))
        return output(h).astype(jnp.float32)

    def __call__(self, x, c, eps):
        """``(logits, mean, logvar)`` for the noise ``eps``."""
        mean, logvar = self.encode(x, c)
        return self.decode(reparameterize(mean, logvar, eps), c), mean, logvar


# nn.compact version, for comparison: each layer is declared inline, where it is used. Linen would
# name them Dense_0, Dense_1, ... in call order; the explicit names give the very parameter tree of
# CVAE, so the same variables apply to either class (and, as Linen derives each layer's key from its
# name, the same key initialises both to the same values). Only one method of a module may be
# compact, and its submodules exist only inside it, so this class has no separate encode and decode
# to reach through `method=`; the adapter therefore uses CVAE.
class CompactCVAE(nn.Module):
    input_dim: int
    num_classes: int
    latent_dim: int
    encoder_dims: tuple[int, ...]
    decoder_dims: tuple[int, ...]
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x, c, eps):
        h = condition(x, c, self.num_classes)
        for i, width in enumerate(self.encoder_dims):
            h = nn.relu(dense(width, self.dtype, name=f"encoder_{i}")(h))
        s = dense(2 * self.latent_dim, self.dtype, name="latent")(h)
        mean, logvar = split_moments(s, self.latent_dim)
        h = condition(reparameterize(mean, logvar, eps), c, self.num_classes)
        for i, width in enumerate(self.decoder_dims):
            h = nn.relu(dense(width, self.dtype, name=f"decoder_{i}")(h))
        output = dense(self.input_dim, self.dtype, name=f"decoder_{len(self.decoder_dims)}")
        return output(h).astype(jnp.float32), mean, logvar


@functools.cache
def build_model(model: ModelConfig) -> CVAE:
    """One module per config. ``state.apply_fn`` is the bound method ``module.apply``, and bound
    methods compare equal only on the same module object: sharing it lets a jitted step compile once
    for states built from equal configs."""
    return CVAE(
        input_dim=model.input_dim,
        num_classes=model.num_classes,
        latent_dim=model.latent_dim,
        encoder_dims=model.encoder_dims,
        decoder_dims=model.decoder_dims,
        dtype=jnp.dtype(model.compute_dtype),
    )


# --8<-- [end:module]


# --8<-- [start:init]
class TrainState(train_state.TrainState):
    """Flax's TrainState (``step``, ``params``, ``opt_state``; ``apply_fn`` and ``tx`` static), plus
    the run's config as static metadata."""

    config: Config = struct.field(pytree_node=False)


def init_params(key: jax.Array, model: ModelConfig) -> dict:
    """The ``params`` collection of ``model.init`` on a dummy batch of one row."""
    x = jnp.zeros((1, model.input_dim), jnp.float32)
    c = jnp.zeros((1,), jnp.int32)
    eps = jnp.zeros((1, model.latent_dim), jnp.float32)
    variables = build_model(model).init(key, x, c, eps)
    return variables["params"]


def create_state(params: dict, config: Config) -> TrainState:
    state = TrainState.create(
        apply_fn=build_model(config.model).apply,
        params=params,
        tx=make_optimizer(config.optim),
        config=config,
    )
    # Flax counts from the Python int 0; an array keeps every leaf of the state a jax.Array.
    return state.replace(step=jnp.zeros((), jnp.int32))


# Linen names the modules, nn.Dense names its leaves as the canonical tree does (kernel [in, out]).
def from_canonical_params(params: Canonical) -> dict:
    """Canonical tree -> Linen ``params``: ``encoder[i]`` is ``encoder_{i}``, and so on."""
    return {
        **{f"encoder_{i}": _layer(layer) for i, layer in enumerate(params["encoder"])},
        "latent": _layer(params["latent"]),
        **{f"decoder_{i}": _layer(layer) for i, layer in enumerate(params["decoder"])},
    }


def to_canonical_params(params: dict, model: ModelConfig) -> Canonical:
    """Linen ``params`` -> canonical tree."""
    return {
        "encoder": [_layer(params[f"encoder_{i}"]) for i in range(len(model.encoder_dims))],
        "latent": _layer(params["latent"]),
        "decoder": [_layer(params[f"decoder_{i}"]) for i in range(len(model.decoder_dims) + 1)],
    }


def _layer(layer: dict) -> dict:
    return {"kernel": layer["kernel"], "bias": layer["bias"]}


# --8<-- [end:init]


# --8<-- [start:forward]
def encode(state: TrainState, x: jax.Array, c: jax.Array):
    return state.apply_fn({"params": state.params}, x, c, method=CVAE.encode)


def decode(state: TrainState, z: jax.Array, c: jax.Array) -> jax.Array:
    return state.apply_fn({"params": state.params}, z, c, method=CVAE.decode)


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(params: dict, state: TrainState, batch: Batch, eps: jax.Array):
    """The loss at ``params``; everything else (``apply_fn``, the loss config) comes from
    ``state``."""
    logits, mean, logvar = state.apply_fn({"params": params}, batch.x, batch.c, eps)
    return cvae_loss(logits, batch.x, mean, logvar, state.config.loss)


def compute_grads(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[dict, Metrics]:
    """The gradient of the batch's loss with respect to ``state.params``, and its metrics: one
    reverse-mode pass. Data-parallel steps run this on each device's rows."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, state, batch, eps)
    return grads, metrics


# --8<-- [end:loss]


# --8<-- [start:train_step]
def train_step(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[TrainState, Metrics]:
    grads, metrics = compute_grads(state, batch, eps)
    return state.apply_gradients(grads=grads), metrics


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# Nothing to add: Linen's step is already functional (``apply`` is a pure function of the variable
# dict, the TrainState a pytree with static ``apply_fn``, ``tx`` and ``config``). As for pure JAX,
# the benchmark compiles it as ``jax.jit(train_step, donate_argnums=0)``; the trainer runs its two
# halves (``compute_grads``, then ``state.apply_gradients``) in its epoch step, compiled with the
# old state donated (``jax.jit``, or ``jax.pmap`` under pmap), so XLA updates its buffers in
# place.
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# The idiomatic step is the fast path, so there is no other path to measure.
PATHS: dict = {}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it (`cvae impls`, install hints,
# the docs' and the benchmark's labels, the order of listings): read from this file's text.
ABOUT = {
    "label": "Flax Linen",
    "module": "flax",
    "distribution": "flax",
    "extra": "flax",
    "order": 2,
}
implementation = Adapter(
    name="flax_linen",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: create_state(init_params(key, config.model), config),
    from_canonical_fn=lambda params, config: create_state(from_canonical_params(params), config),
    to_canonical_fn=lambda state: to_canonical_params(state.params, state.config.model),
    loss_fn=lambda state, batch, eps: loss_fn(state.params, state, batch, eps),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=encode,
    decode_fn=decode,
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
