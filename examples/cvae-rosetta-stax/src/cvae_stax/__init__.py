"""The CVAE of cvae-rosetta's spec, written with ``jax.example_libraries.stax``.

stax is JAX's own minimal neural-network library: a layer is a pair of functions,
``init_fun(rng, input_shape) -> (output_shape, params)`` and ``apply_fun(params, inputs)``, and
``stax.serial`` composes such pairs. There are no modules and no state: the parameters are a plain
list with one entry per layer, ``(W, b)`` for a ``Dense`` (``W`` already ``[fan_in, fan_out]``) and
``()`` for a ``Relu``. That list is this implementation's own layout; the ``init`` section maps it
to the spec's canonical tree and back.

This file is an outside implementation: it ships in its own distribution, ``cvae-rosetta-stax``,
and registers itself under the entry-point group ``cvae_rosetta.impls`` as ``stax``. It uses the
project's public pieces as any outside implementation may (``docs/own_implementation.md``): the
``Adapter``, which validates every input and draws the step noise; the shared loss; the spec's
optimiser by its public name, ``make_optimizer``. Its train state is its own. The sections are the
template's (``template/my_impl.py``); the spec is ``docs/spec.md`` of cvae-rosetta.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.example_libraries import stax

from cvae_rosetta.spec.canonical import Canonical
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, reparameterize, split_moments
from cvae_rosetta.spec.optim import make_optimizer
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import Batch

# {"encoder": [(W, b), (), (W, b), (), ..., (W, b)], "decoder": [...]}: the lists stax.serial
# makes, a Relu's entry being the empty tuple. The encoder's last Dense is the latent layer.
Params = dict[str, list]


# --8<-- [start:module]
@functools.cache  # one pair of functions per config: states of equal configs compile once
def build_model(model: ModelConfig) -> dict[str, tuple]:
    """The encoder and the decoder, each a stax ``(init_fun, apply_fun)`` pair (SPEC section 1).

    Every hidden ``Dense`` is followed by a ``Relu``; the encoder ends in the latent layer of
    ``2 L`` outputs, the decoder in the output layer of ``input_dim`` logits, neither with a ReLU.
    stax's ``Dense`` defaults (Glorot kernels, normal biases) are not the spec's: LeCun-normal
    kernels and zero biases are asked for by name (SPEC section 2).
    """
    dense = functools.partial(
        stax.Dense, W_init=jax.nn.initializers.lecun_normal(), b_init=jax.nn.initializers.zeros
    )

    def mlp(widths: tuple[int, ...], out: int) -> tuple:
        hidden = [layer for width in widths for layer in (dense(width), stax.Relu)]
        return stax.serial(*hidden, dense(out))

    return {
        "encoder": mlp(model.encoder_dims, 2 * model.latent_dim),
        "decoder": mlp(model.decoder_dims, model.input_dim),
    }


# --8<-- [end:module]


# --8<-- [start:init]
def init_params(key: jax.Array, model: ModelConfig) -> Params:
    """Fresh float32 parameters: each half's ``init_fun`` on its input's shape (the label's
    one-hot concatenated to ``x``, or to ``z``)."""
    halves = build_model(model)
    k_enc, k_dec = jax.random.split(key)
    _, encoder = halves["encoder"][0](k_enc, (-1, model.input_dim + model.num_classes))
    _, decoder = halves["decoder"][0](k_dec, (-1, model.latent_dim + model.num_classes))
    return {"encoder": encoder, "decoder": decoder}


def _layers(serial: list) -> list[dict]:
    """The ``Dense`` entries of a ``stax.serial`` list as canonical layers (a Relu's ``()`` has
    no parameters)."""
    return [{"kernel": w, "bias": b} for w, b in (entry for entry in serial if entry)]


def _serial(layers: list[dict]) -> list:
    """Canonical layers as a ``stax.serial`` list: a Relu's ``()`` between every two."""
    serial: list = []
    for i, layer in enumerate(layers):
        if i:
            serial.append(())
        serial.append((layer["kernel"], layer["bias"]))
    return serial


def to_canonical_params(params: Params) -> Canonical:
    """SPEC section 2: stax keeps ``W`` as ``[fan_in, fan_out]``, so this is a renaming."""
    *encoder, latent = _layers(params["encoder"])
    return {"encoder": encoder, "latent": latent, "decoder": _layers(params["decoder"])}


def from_canonical_params(canonical: Canonical) -> Params:
    """The inverse of :func:`to_canonical_params`, exact both ways."""
    return {
        "encoder": _serial([*canonical["encoder"], canonical["latent"]]),
        "decoder": _serial(canonical["decoder"]),
    }


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StaxState:
    """Step, parameters and optimiser state as pytree leaves, the config as static metadata: a
    state is jitted, donated and checkpointed like any pytree, and ``cvae train`` finds the
    ``step``, ``params`` and ``opt_state`` it needs."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState
    config: Config = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def create(cls, params: Params, config: Config) -> StaxState:
        opt_state = make_optimizer(config.optim).init(params)
        return cls(jnp.zeros((), jnp.int32), params, opt_state, config)

    def apply_gradients(self, grads: Params) -> StaxState:
        """One update of the spec's optimiser (SPEC section 5; cached per config, so equal
        configs share one transformation and a jitted step compiles once)."""
        tx = make_optimizer(self.config.optim)
        updates, opt_state = tx.update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        return self.replace(step=self.step + 1, params=params, opt_state=opt_state)

    def replace(self, **changes: Any) -> StaxState:
        return dataclasses.replace(self, **changes)


# --8<-- [end:init]


# --8<-- [start:forward]
def _apply(half: str, params: Params, h: jax.Array, model: ModelConfig) -> jax.Array:
    """One half's ``apply_fun`` in the compute dtype: stax's ``Dense`` computes ``inputs @ W + b``
    in the promoted dtype, so the float32 parameters are cast to that of ``h`` first (SPEC section
    1: bfloat16 activations and matmuls, float32 parameters)."""
    cast = jax.tree.map(lambda p: p.astype(h.dtype), params[half])
    return build_model(model)[half][1](cast, h)


def encode(params: Params, x: jax.Array, c: jax.Array, model: ModelConfig):
    """q(z | x, c): ``(mean, logvar)``, each ``f32[B, L]``."""
    h = condition(x.astype(model.compute_dtype), c, model.num_classes)
    return split_moments(_apply("encoder", params, h, model), model.latent_dim)


def decode(params: Params, z: jax.Array, c: jax.Array, model: ModelConfig) -> jax.Array:
    """p(x | z, c): Bernoulli logits ``f32[B, D]``."""
    h = condition(z.astype(model.compute_dtype), c, model.num_classes)
    return _apply("decoder", params, h, model).astype(jnp.float32)


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(params: Params, batch: Batch, eps: jax.Array, config: Config):
    """The spec's loss (SPEC section 4, reduced in float32) for the noise ``eps``."""
    mean, logvar = encode(params, batch.x, batch.c, config.model)
    z = reparameterize(mean, logvar, eps)
    logits = decode(params, z, batch.c, config.model)
    return cvae_loss(logits, batch.x, mean, logvar, config.loss)


def compute_grads(state: StaxState, batch: Batch, eps: jax.Array) -> tuple[Params, Metrics]:
    """The first half of the step, which data-parallel steps run on each device's rows."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, batch, eps, state.config)
    return grads, metrics


# --8<-- [end:loss]


# --8<-- [start:train_step]
def train_step(state: StaxState, batch: Batch, eps: jax.Array) -> tuple[StaxState, Metrics]:
    grads, metrics = compute_grads(state, batch, eps)
    return state.apply_gradients(grads), metrics


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# Nothing to add: the step is a pure function of arrays, so ``jax.jit(train_step,
# donate_argnums=0)`` is the fast path.
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# stax has no other way to run a step.
PATHS: dict = {}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# Read from this file's text, never imported, once the entry point is installed: the label on the
# pages, the module that must import for it to run, and the distribution whose version `cvae
# impls`, checkpoints and benchmark results record. stax ships inside JAX: both are jax's.
ABOUT = {"label": "JAX stax", "module": "jax", "distribution": "jax"}
implementation = Adapter(
    name="stax",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: StaxState.create(init_params(key, config.model), config),
    from_canonical_fn=lambda params, config: StaxState.create(
        from_canonical_params(params), config
    ),
    to_canonical_fn=lambda state: to_canonical_params(state.params),
    loss_fn=lambda state, batch, eps: loss_fn(state.params, batch, eps, state.config),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=lambda state, x, c: encode(state.params, x, c, state.config.model),
    decode_fn=lambda state, z, c: decode(state.params, z, c, state.config.model),
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
