"""A CVAE that meets the protocol directly: its own model, loss, validation and train state.

The second way to bring your own implementation (``docs/own_implementation.md``): where
``template/my_impl.py`` fills in the framework's parts and lets the project's ``Adapter``, shared
loss and validation do the rest, this file implements the eight protocol members itself and imports
nothing from ``cvae_rosetta``. All it needs of the project is the config object it is handed, read
by attribute (``config.model``, ``config.loss``, ``config.optim``), and the batch, read as
``batch.x`` and ``batch.c``. It is plain JAX and optax, written in the style of Flax's VAE example
(``examples/vae`` of google/flax: an encoder with separate mean and log-variance heads,
``reparameterize``, per-example losses under ``jax.vmap``, a train state with ``apply_gradients``).

Copy it into a package of yours and point the conformance suite at it::

    pytest --pyargs cvae_rosetta.conformance --impl mypackage.raw_impl:implementation

What the spec (``docs/spec.md``) asks for, and where this file does it:

- ``model``: SPEC sections 1 to 3, the layers, conditioning by concatenation, the compute dtype,
  the initialisation and the noise. Its parameters are not the canonical tree: the latent layer is
  two heads, ``fc_mean`` and ``fc_logvar``.
- ``canonical``: SPEC section 2, the canonical tree, with the two heads concatenated into its
  latent layer (and split again on the way in): an exact round trip, in fresh buffers.
- ``validation``: SPEC section 7 and the error grammar (``<field>: expected <what>, got <actual>``,
  raised as ``ValueError`` subclasses), written here from the spec, not imported.
- ``loss``: SPEC section 4, in a numerically stable form.
- ``state``: SPEC section 5, a train state of its own: a pytree of arrays with the config as static
  metadata, so it can be jitted, donated and checkpointed.
- ``protocol``: SPEC section 6, the eight members, each noise drawn from the caller's key
  (SPEC section 3).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Parameters: {"encoder": {"hidden": [layer, ...], "fc_mean": layer, "fc_logvar": layer},
#              "decoder": {"hidden": [layer, ...], "fc_out": layer}},
# a layer being {"kernel": f32[in, out], "bias": f32[out]}.
Params = dict[str, Any]
Metrics = dict[str, jax.Array]


# --8<-- [start:model]
def dense(layer: dict, h: jax.Array) -> jax.Array:
    """``h @ kernel + bias`` in the dtype of ``h`` (the compute dtype); parameters stay float32."""
    return h @ layer["kernel"].astype(h.dtype) + layer["bias"].astype(h.dtype)


def with_label(h: jax.Array, c: jax.Array, num_classes: int) -> jax.Array:
    """Conditioning: the one-hot label concatenated to the input, in the input's dtype."""
    return jnp.concatenate([h, jax.nn.one_hot(c, num_classes, dtype=h.dtype)], axis=-1)


def encoder(params: Params, x: jax.Array, c: jax.Array, model: Any):
    """q(z | x, c): hidden dense + ReLU layers, then two heads, ``(mean, logvar)`` in float32."""
    h = with_label(x.astype(model.compute_dtype), c, model.num_classes)
    for layer in params["encoder"]["hidden"]:
        h = jax.nn.relu(dense(layer, h))
    mean = dense(params["encoder"]["fc_mean"], h)
    logvar = dense(params["encoder"]["fc_logvar"], h)
    return mean.astype(jnp.float32), logvar.astype(jnp.float32)


def decoder(params: Params, z: jax.Array, c: jax.Array, model: Any) -> jax.Array:
    """p(x | z, c): hidden dense + ReLU layers, then the output layer's logits in float32."""
    h = with_label(z.astype(model.compute_dtype), c, model.num_classes)
    for layer in params["decoder"]["hidden"]:
        h = jax.nn.relu(dense(layer, h))
    return dense(params["decoder"]["fc_out"], h).astype(jnp.float32)


def reparameterize(key: jax.Array, mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """``z = mean + exp(logvar / 2) * eps``, ``eps = normal(key, (B, L))``: SPEC section 3's noise,
    one draw for the whole batch, from the caller's key and nothing else."""
    eps = jax.random.normal(key, logvar.shape, jnp.float32)
    return mean + jnp.exp(0.5 * logvar) * eps


def init_params(key: jax.Array, model: Any) -> Params:
    """LeCun-normal kernels (truncated normal, variance 1 / fan_in), zero biases. Each head is
    ``[fan_in, L]`` with that variance, so the two together are the canonical latent layer's
    ``[fan_in, 2 L]`` distribution."""
    kernel_init = jax.nn.initializers.lecun_normal()
    enc = [model.input_dim + model.num_classes, *model.encoder_dims]
    dec = [model.latent_dim + model.num_classes, *model.decoder_dims]
    sizes = [*itertools.pairwise(enc), (enc[-1], model.latent_dim), (enc[-1], model.latent_dim)]
    sizes += [*itertools.pairwise(dec), (dec[-1], model.input_dim)]
    keys = iter(jax.random.split(key, len(sizes)))
    layers = [
        {
            "kernel": kernel_init(next(keys), (fan_in, fan_out), jnp.float32),
            "bias": jnp.zeros((fan_out,), jnp.float32),
        }
        for fan_in, fan_out in sizes
    ]
    n = len(model.encoder_dims)
    return {
        "encoder": {"hidden": layers[:n], "fc_mean": layers[n], "fc_logvar": layers[n + 1]},
        "decoder": {"hidden": layers[n + 2 : -1], "fc_out": layers[-1]},
    }


# --8<-- [end:model]


# --8<-- [start:canonical]
def _copied(array: Any) -> jax.Array:
    # fresh buffers both ways, so donating a state never invalidates a tree its caller holds
    return jnp.array(array, dtype=jnp.float32, copy=True)


def _layer(layer: dict) -> dict:
    return {"kernel": _copied(layer["kernel"]), "bias": _copied(layer["bias"])}


def to_canonical_params(params: Params) -> dict:
    """The canonical tree of SPEC section 2: the two heads side by side as one latent layer
    (``mean`` the first L outputs, ``logvar`` the last L)."""
    heads = (params["encoder"]["fc_mean"], params["encoder"]["fc_logvar"])
    return {
        "encoder": [_layer(layer) for layer in params["encoder"]["hidden"]],
        "latent": {
            "kernel": jnp.concatenate([h["kernel"] for h in heads], axis=1).astype(jnp.float32),
            "bias": jnp.concatenate([h["bias"] for h in heads], axis=0).astype(jnp.float32),
        },
        "decoder": [_layer(layer) for layer in params["decoder"]["hidden"]]
        + [_layer(params["decoder"]["fc_out"])],
    }


def from_canonical_params(canonical: dict, latent_dim: int) -> Params:
    """The inverse of :func:`to_canonical_params`: an exact round trip."""
    kernel, bias = canonical["latent"]["kernel"], canonical["latent"]["bias"]
    *hidden, out = canonical["decoder"]
    return {
        "encoder": {
            "hidden": [_layer(layer) for layer in canonical["encoder"]],
            "fc_mean": _layer({"kernel": kernel[:, :latent_dim], "bias": bias[:latent_dim]}),
            "fc_logvar": _layer({"kernel": kernel[:, latent_dim:], "bias": bias[latent_dim:]}),
        },
        "decoder": {"hidden": [_layer(layer) for layer in hidden], "fc_out": _layer(out)},
    }


# --8<-- [end:canonical]


# --8<-- [start:validation]
# SPEC section 7 and the error grammar of docs/spec.md: one line,
# "<field>: expected <what>, got <actual>", raised as a ValueError subclass.


class BadInput(ValueError):
    """An array handed to loss, train_step, encode or decode that the spec does not allow."""


class BadParameters(ValueError):
    """A parameter tree handed to from_canonical that is not canonical for the config."""


def _shape_and_dtype(array: Any, field: str, shape: str) -> tuple[tuple[int, ...], Any]:
    if not (hasattr(array, "shape") and hasattr(array, "dtype")):
        raise BadInput(f"{field}: expected an array of shape {shape}, got {type(array).__name__}")
    return tuple(array.shape), array.dtype


def _concrete(array: Any) -> bool:
    """Values can be read only outside tracing (under jit the arrays are tracers)."""
    return not isinstance(array, jax.core.Tracer)


def _finite(array: Any, field: str) -> np.ndarray:
    values = np.asarray(array, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        where = tuple(int(i) for i in bad[0])
        raise BadInput(
            f"{field}: expected finite values, got {float(values[where])!r} at "
            f"[{', '.join(map(str, where))}] ({len(bad)} non-finite)"
        )
    return values


def check_pixels(x: Any, input_dim: int, field: str) -> None:
    """``x``: a float array ``[B, input_dim]``, B >= 1, finite, every value in [0, 1]."""
    shape, dtype = _shape_and_dtype(x, field, f"[B, {input_dim}]")
    if len(shape) != 2:
        raise BadInput(f"{field}: expected rank 2 (shape [B, {input_dim}]), got shape {shape}")
    if shape[0] < 1:
        raise BadInput(f"{field}: expected at least one row, got shape {shape}")
    if shape[1] != input_dim:
        raise BadInput(f"{field}: expected {input_dim} features per row, got shape {shape}")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise BadInput(f"{field}: expected a floating-point dtype, got dtype {dtype}")
    if _concrete(x):
        values = _finite(x, field)
        outside = np.argwhere((values < 0) | (values > 1))
        if len(outside):
            row, col = (int(i) for i in outside[0])
            raise BadInput(
                f"{field}: expected values in [0, 1], got {float(values[row, col])!r} at "
                f"[{row}, {col}] ({len(outside)} outside)"
            )


def check_labels(c: Any, num_classes: int, rows: int, field: str, of: str) -> None:
    """``c``: an integer array ``[B]``, one label per row of ``of``, each in [0, num_classes)."""
    shape, dtype = _shape_and_dtype(c, field, "[B]")
    if len(shape) != 1:
        raise BadInput(f"{field}: expected rank 1 (shape [B]), got shape {shape}")
    if shape[0] != rows:
        raise BadInput(f"{field}: expected {rows} labels (one per row of {of}), got {shape[0]}")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise BadInput(f"{field}: expected an integer dtype, got dtype {dtype}")
    if _concrete(c):
        values = np.asarray(c)
        outside = np.argwhere((values < 0) | (values >= num_classes))
        if len(outside):
            i = int(outside[0][0])
            raise BadInput(
                f"{field}: expected labels in [0, {num_classes}), got {int(values[i])} at [{i}]"
            )


def check_latent(z: Any, latent_dim: int, field: str = "z") -> None:
    """``z``: a finite float array ``[B, latent_dim]``, B >= 1."""
    shape, dtype = _shape_and_dtype(z, field, f"[B, {latent_dim}]")
    if len(shape) != 2:
        raise BadInput(f"{field}: expected rank 2 (shape [B, {latent_dim}]), got shape {shape}")
    if shape[0] < 1:
        raise BadInput(f"{field}: expected at least one row (B >= 1), got shape {shape}")
    if shape[1] != latent_dim:
        raise BadInput(
            f"{field}: expected {latent_dim} values per row (shape [B, {latent_dim}]), "
            f"got shape {shape}"
        )
    if not jnp.issubdtype(dtype, jnp.floating):
        raise BadInput(f"{field}: expected a floating-point dtype, got dtype {dtype}")
    if _concrete(z):
        _finite(z, field)


def check_batch(batch: Any, model: Any) -> None:
    """A batch for loss and train_step: its fields are named ``batch.x`` and ``batch.c``."""
    if not (hasattr(batch, "x") and hasattr(batch, "c")):
        raise BadInput(f"batch: expected fields x and c, got {type(batch).__name__}")
    check_pixels(batch.x, model.input_dim, "batch.x")
    check_labels(batch.c, model.num_classes, batch.x.shape[0], "batch.c", "batch.x")


def canonical_shapes(model: Any) -> dict:
    """The canonical tree of SPEC section 2 with each leaf replaced by its shape."""
    enc = [model.input_dim + model.num_classes, *model.encoder_dims]
    dec = [model.latent_dim + model.num_classes, *model.decoder_dims, model.input_dim]

    def layer(fan_in: int, fan_out: int) -> dict:
        return {"kernel": (fan_in, fan_out), "bias": (fan_out,)}

    return {
        "encoder": [layer(a, b) for a, b in itertools.pairwise(enc)],
        "latent": layer(enc[-1], 2 * model.latent_dim),
        "decoder": [layer(a, b) for a, b in itertools.pairwise(dec)],
    }


def check_canonical(tree: Any, expected: Any, path: str = "params") -> None:
    """Walk ``tree`` along ``expected`` and refuse the first place where they differ, named by
    its path as Python writes the indexing: ``params['decoder'][1]['bias']``."""
    if isinstance(expected, list):
        if not isinstance(tree, (list, tuple)):
            raise BadParameters(
                f"{path}: expected a list of {len(expected)} layers, got {type(tree).__name__}"
            )
        if len(tree) != len(expected):
            raise BadParameters(
                f"{path}: expected a list of {len(expected)} layers, got {len(tree)} layers"
            )
        for i, (sub, want) in enumerate(zip(tree, expected, strict=True)):
            check_canonical(sub, want, f"{path}[{i}]")
        return
    if isinstance(expected, tuple):  # a leaf, by its shape
        if not (hasattr(tree, "shape") and hasattr(tree, "dtype")):
            raise BadParameters(f"{path}: expected shape {expected}, got {type(tree).__name__}")
        if tuple(tree.shape) != expected:
            raise BadParameters(f"{path}: expected shape {expected}, got shape {tuple(tree.shape)}")
        if np.dtype(tree.dtype) != np.float32:
            raise BadParameters(f"{path}: expected dtype float32, got dtype {tree.dtype}")
        return
    if not isinstance(tree, dict) or set(tree) != set(expected):
        got = sorted(map(str, tree)) if isinstance(tree, dict) else type(tree).__name__
        raise BadParameters(f"{path}: expected keys {sorted(expected)}, got keys {got}")
    for key, want in expected.items():
        check_canonical(tree[key], want, f"{path}[{key!r}]")


def check_config(config: Any) -> Any:
    if not all(hasattr(config, section) for section in ("model", "loss", "optim")):
        raise BadInput(
            f"config: expected a config with model, loss and optim sections, "
            f"got {type(config).__name__}"
        )
    return config


# --8<-- [end:validation]


# --8<-- [start:loss]
@jax.vmap
def kl_divergence(mean: jax.Array, logvar: jax.Array) -> jax.Array:
    """KL(N(mean, exp(logvar)) || N(0, I)) per example: ``sum (e^lv - 1 - lv + m^2) / 2``, with
    ``expm1`` so that the terms near the prior do not lose their digits to ``e^lv - 1``."""
    return 0.5 * jnp.sum(jnp.expm1(logvar) - logvar + jnp.square(mean))


@jax.vmap
def binary_cross_entropy_with_logits(logits: jax.Array, x: jax.Array) -> jax.Array:
    """Per-example Bernoulli negative log-likelihood in nats, summed over pixels, as
    ``max(l, 0) - l x + log1p(exp(-|l|))``: finite and exact for saturated logits, where
    ``log(sigmoid(l))`` and ``log(1 - sigmoid(l))`` underflow to -inf."""
    return jnp.sum(jnp.maximum(logits, 0.0) - logits * x + jnp.log1p(jnp.exp(-jnp.abs(logits))))


def compute_metrics(logits, x, mean, logvar, loss_config) -> tuple[jax.Array, Metrics]:
    """SPEC section 4, reduced in float32 whatever the compute dtype: ``(loss, metrics)``."""
    logits, x = logits.astype(jnp.float32), x.astype(jnp.float32)
    mean, logvar = mean.astype(jnp.float32), logvar.astype(jnp.float32)
    if loss_config.kind == "bernoulli":
        recon = jnp.mean(binary_cross_entropy_with_logits(logits, x))
        kl = jnp.mean(kl_divergence(mean, logvar))
    elif loss_config.kind == "mse":  # the source guide's: means over every element
        recon = jnp.mean(0.5 * jnp.square(jax.nn.sigmoid(logits) - x))
        kl = jnp.mean(0.5 * (jnp.expm1(logvar) - logvar + jnp.square(mean)))
    else:
        raise ValueError(f"loss.kind: expected bernoulli or mse, got {loss_config.kind!r}")
    loss = recon + loss_config.beta * kl
    return loss, {"loss": loss, "recon": recon, "kl": kl}


def loss_fn(params: Params, batch: Any, key: jax.Array, config: Any):
    mean, logvar = encoder(params, batch.x, batch.c, config.model)
    z = reparameterize(key, mean, logvar)
    logits = decoder(params, z, batch.c, config.model)
    return compute_metrics(logits, batch.x, mean, logvar, config.loss)


# --8<-- [end:loss]


# --8<-- [start:state]
@functools.cache  # one transformation per (hashable) optimiser config: equal configs compile once
def optimizer(optim: Any) -> optax.GradientTransformation:
    """SPEC section 5: clip to the global norm, then AdamW, at the constant rate only. A schedule
    is refused before anything is computed (the suite reports its schedule check as not
    applicable) rather than silently trained at the constant rate."""
    if optim.schedule != "constant":
        raise ValueError(
            f"optim.schedule: expected constant (this implementation has no learning-rate "
            f"schedules), got {optim.schedule}"
        )
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(
            optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
        ),
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Step, parameters and optimiser state are the pytree's leaves; the config is static metadata
    (hashable, compared by value), so a state jits, donates and shards like any pytree and a state
    rebuilt from an equal config hits the same compiled step. ``state.config`` is the config the
    state was made with."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState
    config: Any = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def create(cls, params: Params, config: Any) -> TrainState:
        opt_state = optimizer(config.optim).init(params)
        return cls(jnp.zeros((), jnp.int32), params, opt_state, config)

    def apply_gradients(self, grads: Params) -> TrainState:
        updates, opt_state = optimizer(self.config.optim).update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        return self.replace(step=self.step + 1, params=params, opt_state=opt_state)

    def replace(self, **changes: Any) -> TrainState:
        return dataclasses.replace(self, **changes)


def train_step(state: TrainState, batch: Any, key: jax.Array) -> tuple[TrainState, Metrics]:
    """One gradient of one batch's loss and one update; pure, so it jits and donates."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, batch, key, state.config)
    return state.apply_gradients(grads), metrics


# --8<-- [end:state]


# --8<-- [start:protocol]
# What the project says of this implementation without importing it, once registered under the
# entry-point group `cvae_rosetta.impls` (optional, each key too): its label on the pages, the
# module it needs, the distribution whose version is listed and recorded. Read from this file's
# text.
ABOUT = {"label": "raw JAX", "module": "jax", "distribution": "jax"}


class RawCVAE:
    """The protocol of SPEC section 6, member by member. Every entry validates its input first
    (shapes and dtypes always, values on concrete arrays), then computes."""

    name = "raw_jax"
    framework = ABOUT["distribution"]  # the distribution whose version the report header prints

    def init(self, key: jax.Array, config: Any) -> TrainState:
        config = check_config(config)
        return TrainState.create(init_params(key, config.model), config)

    def from_canonical(self, params: dict, config: Any) -> TrainState:
        config = check_config(config)
        check_canonical(params, canonical_shapes(config.model))
        return TrainState.create(from_canonical_params(params, config.model.latent_dim), config)

    def to_canonical(self, state: TrainState) -> dict:
        return to_canonical_params(state.params)

    def loss(self, state: TrainState, batch: Any, key: jax.Array) -> tuple[jax.Array, Metrics]:
        check_batch(batch, state.config.model)
        return loss_fn(state.params, batch, key, state.config)

    def train_step(
        self, state: TrainState, batch: Any, key: jax.Array
    ) -> tuple[TrainState, Metrics]:
        check_batch(batch, state.config.model)
        return train_step(state, batch, key)

    def encode(self, state: TrainState, x: jax.Array, c: jax.Array):
        model = state.config.model
        check_pixels(x, model.input_dim, "x")
        check_labels(c, model.num_classes, x.shape[0], "c", "x")
        return encoder(state.params, x, c, model)

    def decode(self, state: TrainState, z: jax.Array, c: jax.Array) -> jax.Array:
        model = state.config.model
        check_latent(z, model.latent_dim)
        check_labels(c, model.num_classes, z.shape[0], "c", "z")
        return decoder(state.params, z, c, model)


implementation = RawCVAE()
# --8<-- [end:protocol]
