"""A template for your own implementation of the CVAE (``template/README.md`` says how to use it).

Copy this file into a package of yours, replace every ``raise NotImplementedError(...)`` with your
framework's code, and point the conformance suite at it::

    pytest --pyargs cvae_rosetta.conformance --impl mypackage.my_impl:implementation

The file has the sections every implementation in ``impls/`` has, in the same order, between
``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` lines: module, init, forward, loss,
train_step, fast_path, paths, adapter. What you write is the framework code of the first three (the
model, its parameters, its forward pass). The rest is written for you on top of them with the
project's shared code (``shared/``): the loss, the optimiser, the train state, and the ``Adapter``
that turns your functions into the protocol the suite and ``cvae train`` use. It checks every
input's structure, shapes and dtypes (its values where a call is not traced) and draws the step
noise, so your functions never get a key, nor a batch of the wrong structure, shape or dtype.

The contract is the spec (``docs/spec.md``); the sections below quote what they need of it.
``impls/pure_jax.py`` is a complete example of every section.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp  # noqa: F401  (for the code you write below)

from cvae_rosetta.spec.canonical import Canonical, layer_sizes  # noqa: F401  (layer_sizes: for init_params)
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, reparameterize, split_moments  # noqa: F401  (for forward)
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.state import TrainState
from cvae_rosetta.spec.validation import Batch

# Your framework's parameters: whatever pytree of float32 arrays it keeps them in (a variable dict,
# a Haiku params dict, the array leaves of a module...). The code below never looks inside.
Params = Any


# --8<-- [start:module]
@functools.cache  # one model object per config: states built from equal configs compile once
def build_model(model: ModelConfig) -> Any:
    """Your framework's CVAE for this config: a module instance, transformed functions, or whatever
    object ``encode`` and ``decode`` below apply to the parameters.

    SPEC section 1. The encoder is ``len(model.encoder_dims)`` dense layers of those widths, each
    followed by a ReLU, then a latent layer to ``2 * model.latent_dim`` (no ReLU). The decoder is
    ``len(model.decoder_dims)`` dense layers with a ReLU each, then an output layer to
    ``model.input_dim`` (no ReLU). Both halves see the label as a one-hot vector concatenated to
    their input (``cvae_rosetta.spec.model.condition``);
    ``cvae_rosetta.spec.canonical.layer_sizes(model)`` lists every layer's ``(fan_in, fan_out)``.

    Mixed precision: ``model.compute_dtype`` is ``"float32"`` or ``"bfloat16"``. Keep parameters in
    float32 and compute activations and matmuls in the compute dtype (Flax: ``dtype=`` with
    ``param_dtype=float32``; Haiku: a jmp policy; plain JAX: cast inputs and weights with
    ``.astype``). ``conformance/test_precision.py`` checks it.
    """
    raise NotImplementedError(
        "my_impl.build_model: define your framework's CVAE for `model` (section 'module')"
    )


# --8<-- [end:module]


# --8<-- [start:init]
def init_params(key: jax.Array, model: ModelConfig) -> Params:
    """Fresh parameters for ``build_model(model)``, all float32.

    SPEC section 2: every kernel truncated-normal with variance 1/fan_in (LeCun normal:
    ``jax.nn.initializers.lecun_normal()``; check what your framework's default is), every bias
    zero. Use only ``key`` for randomness, splitting it as your framework does.
    """
    raise NotImplementedError(
        "my_impl.init_params: create your framework's parameters from `key` (section 'init')"
    )


def to_canonical_params(params: Params, model: ModelConfig) -> Canonical:
    """Your parameters as the canonical tree of SPEC section 2::

        {"encoder": [{"kernel": f32[in, out], "bias": f32[out]}, ...],  # one per encoder width
         "latent":  {"kernel": f32[encoder_dims[-1], 2 L], "bias": f32[2 L]},
         "decoder": [{"kernel": ..., "bias": ...}, ...]}  # each decoder width, then the output

    Usually a renaming; transpose kernels your framework stores as ``[out, in]``.
    """
    raise NotImplementedError(
        "my_impl.to_canonical_params: map your parameters to the canonical tree (section 'init')"
    )


def from_canonical_params(canonical: Canonical, model: ModelConfig) -> Params:
    """The inverse of ``to_canonical_params``: the suite sets its own parameters through it, and
    ``to_canonical_params(from_canonical_params(p, model), model)`` must equal ``p`` exactly."""
    raise NotImplementedError(
        "my_impl.from_canonical_params: map the canonical tree to your parameters (section 'init')"
    )


def create_state(params: Params, config: Config) -> TrainState:
    """Step 0 and a fresh optimiser state (the shared optax chain of SPEC section 5).

    ``cvae_rosetta.spec.state.TrainState`` suits any pytree of parameters. A framework with its own
    train state (Flax's ``TrainState``) may use that instead, as long as the config travels in it
    as static pytree metadata and ``state.config`` is the run's config.
    """
    return TrainState.create(params, config)


# --8<-- [end:init]


# --8<-- [start:forward]
def encode(params: Params, x: jax.Array, c: jax.Array, model: ModelConfig):
    """q(z | x, c): ``(mean, logvar)``, each ``f32[B, latent_dim]``.

    ``x`` is ``f32[B, input_dim]``, ``c`` is ``int[B]``; both are already validated. The latent
    layer's output ``s: [B, 2 L]`` splits as ``mean = s[:, :L]``, ``logvar = s[:, L:]``
    (``cvae_rosetta.spec.model.split_moments`` does that and casts them to float32).
    """
    raise NotImplementedError(
        "my_impl.encode: apply your model's encoder to (x, c) (section 'forward')"
    )


def decode(params: Params, z: jax.Array, c: jax.Array, model: ModelConfig) -> jax.Array:
    """p(x | z, c): Bernoulli logits ``f32[B, input_dim]`` (cast them to float32 at the end when
    computing in bfloat16); the reconstruction is ``sigmoid(logits)``."""
    raise NotImplementedError(
        "my_impl.decode: apply your model's decoder to (z, c) (section 'forward')"
    )


# --8<-- [end:forward]


# --8<-- [start:loss]
# Written for you: the spec's loss (SPEC section 4, cvae_rosetta.spec.losses, reduced in float32) of
# your forward pass. ``eps`` is the step's noise, drawn by the Adapter from the caller's key. If
# your framework runs the whole forward pass as one call (Linen's ``apply``), call that here
# instead.
def loss_fn(params: Params, batch: Batch, eps: jax.Array, config: Config):
    """``(loss, metrics)`` for the noise ``eps``."""
    mean, logvar = encode(params, batch.x, batch.c, config.model)
    z = reparameterize(mean, logvar, eps)
    logits = decode(params, z, batch.c, config.model)
    return cvae_loss(logits, batch.x, mean, logvar, config.loss)


# --8<-- [end:loss]


# --8<-- [start:train_step]
# Written for you: one gradient of one batch's loss and one update (SPEC section 5). It must stay a
# pure function of the state (jit-able, donation-safe). A framework whose model object holds its
# parameters (Flax NNX, Equinox) differentiates with respect to their array part only.
# It is cut in two at the gradient, so that data-parallel steps (shared/spec/parallel.py) can
# average each device's `compute_grads` over the devices before the one update.
def compute_grads(state: TrainState, batch: Batch, eps: jax.Array):
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, batch, eps, state.config)
    return grads, metrics


def train_step(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[TrainState, Metrics]:
    grads, metrics = compute_grads(state, batch, eps)
    return state.apply_gradients(grads), metrics


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# What your framework needs to run the step at full speed. For a pure step, nothing: the benchmark
# compiles it as ``jax.jit(train_step, donate_argnums=0)`` and the trainer inside its epoch step
# under ``jax.jit(..., donate_argnums=0)``, donating the old state so that XLA updates its buffers
# in place. A framework whose idiomatic step is slower (a stateful step, a filtered jit) writes
# the pure, donation-safe step here instead, as ``impls/flax_nnx.py`` and ``impls/equinox_impl.py``
# do.
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# Other ways to run the same step, if your framework has a more idiomatic one than the fast path:
# ``label -> make(state) -> (step, carry)``, where ``step(carry, batch, key) -> (carry, metrics)``
# (``impls/flax_nnx.py`` has three). The conformance suite checks each against ``train_step``. With
# none, the idiomatic step is the fast path, so there is no other path to measure.
PATHS: dict = {}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it, once it is registered under
# the entry-point group `cvae_rosetta.impls` (`cvae impls`, the docs' and the benchmark's labels):
# read from this file's text. Optional, each key too: its label on the pages, the module its
# framework imports as (whether it is installed), that framework's distribution (whose version is
# listed and recorded: "flax", "dm-haiku", ...).
ABOUT = {"label": "my CVAE", "module": "jax", "distribution": "jax"}
# The protocol (SPEC section 6), wired to the functions above: nothing to change but the name and
# ABOUT. The suite and `cvae train` load it as "mypackage.my_impl:implementation".
implementation = Adapter(
    name="my_impl",  # a short identifier, printed in the suite's report and by `cvae train`
    framework=ABOUT["distribution"],  # the distribution whose version the report prints
    init_fn=lambda key, config: create_state(init_params(key, config.model), config),
    from_canonical_fn=lambda params, config: create_state(
        from_canonical_params(params, config.model), config
    ),
    to_canonical_fn=lambda state: to_canonical_params(state.params, state.config.model),
    loss_fn=lambda state, batch, eps: loss_fn(state.params, batch, eps, state.config),
    train_step_fn=train_step,
    grads_fn=compute_grads,  # optional: without it, pmap and shard_map are not applicable
    encode_fn=lambda state, x, c: encode(state.params, x, c, state.config.model),
    decode_fn=lambda state, z, c: decode(state.params, z, c, state.config.model),
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
