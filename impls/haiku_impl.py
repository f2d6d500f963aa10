"""The CVAE in Haiku: ``hk.Module``s turned into pure functions by ``hk.multi_transform``.

The model is one ``CVAE`` module holding two ``hk.nets.MLP``s; its ``encode`` and ``decode`` methods
and the full forward pass share those modules and become three pure ``apply`` functions of one
parameter dict, ``{"cvae/~/encoder/~/linear_0": {"w": ..., "b": ...}, ...}``. Haiku's ``w`` is
already ``[fan_in, fan_out]``, so the converters only rename. Mixed precision is Haiku's own: a
``jmp`` policy pushed for the ``CVAE`` class (jmp is a dependency of dm-haiku). The file is named
``haiku_impl`` so that it does not shadow the ``haiku`` package.
"""

from __future__ import annotations

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import jmp

from cvae_rosetta.spec.canonical import Canonical
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, reparameterize, split_moments
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.state import TrainState
from cvae_rosetta.spec.validation import Batch

# --8<-- [start:module]
# LeCun normal: Haiku's VarianceScaling divides the truncated normal's stddev by its truncation
# factor, so the variance is exactly 1/fan_in (hk.Linear's default TruncatedNormal is not).
LECUN_NORMAL = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")


class CVAE(hk.Module):
    """Encoder and decoder MLPs, each conditioned on the label by concatenation."""

    def __init__(self, model: ModelConfig, name: str | None = None):
        super().__init__(name=name)
        self.num_classes = model.num_classes
        self.latent_dim = model.latent_dim
        # The encoder's last layer is the latent layer; an MLP's last layer has no ReLU.
        self.encoder = hk.nets.MLP(
            [*model.encoder_dims, 2 * model.latent_dim], w_init=LECUN_NORMAL, name="encoder"
        )
        self.decoder = hk.nets.MLP(
            [*model.decoder_dims, model.input_dim], w_init=LECUN_NORMAL, name="decoder"
        )

    def encode(self, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        """q(z | x, c): ``(mean, logvar)``."""
        s = self.encoder(condition(x, c, self.num_classes))
        return split_moments(s, self.latent_dim)

    def decode(self, z: jax.Array, c: jax.Array) -> jax.Array:
        """p(x | z, c): Bernoulli logits."""
        return self.decoder(condition(z, c, self.num_classes))


@functools.lru_cache
def transformed(model: ModelConfig) -> hk.MultiTransformed:
    """Pure ``init`` and ``apply = (forward, encode, decode)``, built once per model config."""

    def f():
        cvae = CVAE(model)

        def forward(x, c, eps):
            mean, logvar = cvae.encode(x, c)
            z = reparameterize(mean, logvar, eps)
            return cvae.decode(z, c), mean, logvar

        return forward, (forward, cvae.encode, cvae.decode)

    # The noise arrives as an argument, so apply needs no RNG key.
    return hk.without_apply_rng(hk.multi_transform(f))


def mixed_precision(model: ModelConfig):
    """The compute dtype as a jmp policy on ``CVAE``: float32 parameters and outputs."""
    policy = jmp.get_policy(f"params=float32,compute={model.compute_dtype},output=float32")
    return hk.mixed_precision.push_policy(CVAE, policy)


# --8<-- [end:module]


# --8<-- [start:init]
def init_params(key: jax.Array, model: ModelConfig) -> hk.Params:
    """Haiku builds the parameters by tracing the forward pass on a dummy batch."""
    x = jnp.zeros((1, model.input_dim), jnp.float32)
    c = jnp.zeros((1,), jnp.int32)
    eps = jnp.zeros((1, model.latent_dim), jnp.float32)
    with mixed_precision(model):
        return transformed(model).init(key, x, c, eps)


def to_canonical(params: hk.Params, model: ModelConfig) -> Canonical:
    def layer(group: str, i: int) -> dict:
        p = params[f"cvae/~/{group}/~/linear_{i}"]
        return {"kernel": p["w"], "bias": p["b"]}

    n_enc, n_dec = len(model.encoder_dims), len(model.decoder_dims) + 1
    return {
        "encoder": [layer("encoder", i) for i in range(n_enc)],
        "latent": layer("encoder", n_enc),
        "decoder": [layer("decoder", i) for i in range(n_dec)],
    }


def from_canonical(canonical: Canonical) -> hk.Params:
    encoder = [*canonical["encoder"], canonical["latent"]]
    params = {}
    for group, layers in (("encoder", encoder), ("decoder", canonical["decoder"])):
        for i, layer in enumerate(layers):
            params[f"cvae/~/{group}/~/linear_{i}"] = {"w": layer["kernel"], "b": layer["bias"]}
    return params


def create_state(params: hk.Params, config: Config) -> TrainState:
    return TrainState.create(params, config)


# --8<-- [end:init]


# --8<-- [start:forward]
def encode(params: hk.Params, x: jax.Array, c: jax.Array, model: ModelConfig):
    """``(mean, logvar)``, each ``f32[B, L]``."""
    _, encode_apply, _ = transformed(model).apply
    with mixed_precision(model):
        return encode_apply(params, x, c)


def decode(params: hk.Params, z: jax.Array, c: jax.Array, model: ModelConfig) -> jax.Array:
    """Bernoulli logits ``f32[B, D]``."""
    _, _, decode_apply = transformed(model).apply
    with mixed_precision(model):
        return decode_apply(params, z, c)


def forward(params: hk.Params, batch: Batch, eps: jax.Array, model: ModelConfig):
    """``(logits, mean, logvar)`` of the full pass, through the sampled ``z``."""
    forward_apply, _, _ = transformed(model).apply
    with mixed_precision(model):
        return forward_apply(params, batch.x, batch.c, eps)


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(params: hk.Params, batch: Batch, eps: jax.Array, config: Config):
    logits, mean, logvar = forward(params, batch, eps, config.model)
    return cvae_loss(logits, batch.x, mean, logvar, config.loss)


def compute_grads(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[hk.Params, Metrics]:
    """The gradient of the batch's loss with respect to the parameter dict, and its metrics: one
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
# Nothing to add: Haiku's apply is already a pure function of the parameter dict, so the idiomatic
# step is the fast one. The benchmark compiles it as ``jax.jit(train_step, donate_argnums=0)``; the
# trainer runs its two halves (``compute_grads``, then ``state.apply_gradients``) in its epoch
# step, compiled with the old state donated (``jax.jit``, or ``jax.pmap`` under pmap), so XLA
# updates its buffers in place.
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# The idiomatic step is the fast path, so there is no other path to measure.
PATHS: dict = {}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it (`cvae impls`, install hints,
# the docs' and the benchmark's labels, the order of listings): read from this file's text.
ABOUT = {
    "label": "Haiku",
    "module": "haiku",
    "distribution": "dm-haiku",
    "extra": "haiku",
    "order": 4,
}
implementation = Adapter(
    name="haiku",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: create_state(init_params(key, config.model), config),
    from_canonical_fn=lambda params, config: create_state(from_canonical(params), config),
    to_canonical_fn=lambda state: to_canonical(state.params, state.config.model),
    loss_fn=lambda state, batch, eps: loss_fn(state.params, batch, eps, state.config),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=lambda state, x, c: encode(state.params, x, c, state.config.model),
    decode_fn=lambda state, z, c: decode(state.params, z, c, state.config.model),
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
