"""The CVAE in Equinox: the model is an ``eqx.Module``, a pytree that holds its own parameters.

An Equinox layer maps one example (``eqx.nn.Linear`` takes ``x: f32[in]`` and stores its weight as
``[out, in]``), so the model is written for one example and ``jax.vmap`` maps it over the batch.
The idiomatic step passes the model and its optimiser state through ``eqx.filter_jit`` and
``eqx.filter_value_and_grad``, which trace the arrays and hold everything else static, on every
call. The protocol's state does that split once: it holds the leaves of the model's arrays
(``eqx.partition(model, eqx.is_array)``) and of the optimiser state in flat lists, as the
low-overhead training loop of Equinox's docs does, with the tree structures and the model's static
part as static metadata; its plain ``jax.jit`` step rebuilds the model (``eqx.combine``) inside
the trace. Equinox has no precision policy: mixed precision is a cast of the model and the inputs
in the forward pass. The converters transpose the kernels. The file is named ``equinox_impl`` so
that it does not shadow the ``equinox`` package.
"""

from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from cvae_rosetta.spec.canonical import Canonical, layer_sizes
from cvae_rosetta.spec.config import Config, ModelConfig, OptimConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, noise, reparameterize, split_moments
from cvae_rosetta.spec.optim import make_optimizer
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import Batch

# --8<-- [start:module]
# ``eqx.nn.Linear`` draws its weight and bias uniformly from +-1/sqrt(fan_in). The spec's LeCun
# normal and zero bias replace them by model surgery with ``eqx.tree_at``, the way the Equinox docs
# write a custom initialisation. The weight is [out, in]: fan_in is its last axis, not the
# initialiser's default second-to-last.
lecun_normal = jax.nn.initializers.lecun_normal(in_axis=-1, out_axis=-2)


def linear(fan_in: int, fan_out: int, *, key: jax.Array) -> eqx.nn.Linear:
    """``eqx.nn.Linear(fan_in, fan_out)`` with a LeCun-normal weight and a zero bias."""
    layer_key, weight_key = jax.random.split(key)
    layer = eqx.nn.Linear(fan_in, fan_out, key=layer_key)
    weight = lecun_normal(weight_key, layer.weight.shape, jnp.float32)
    bias = jnp.zeros_like(layer.bias)
    return eqx.tree_at(lambda m: (m.weight, m.bias), layer, (weight, bias))


class CVAE(eqx.Module):
    """Encoder q(z | x, c) and decoder p(x | z, c) of ONE example; ``jax.vmap`` batches them."""

    encoder: tuple[eqx.nn.Linear, ...]
    latent: eqx.nn.Linear
    decoder: tuple[eqx.nn.Linear, ...]  # hidden layers, then the output layer
    num_classes: int = eqx.field(static=True)
    latent_dim: int = eqx.field(static=True)
    compute_dtype: str = eqx.field(static=True)

    def __init__(self, model: ModelConfig, *, key: jax.Array):
        sizes = layer_sizes(model)
        keys = iter(jax.random.split(key, sum(len(group) for group in sizes.values())))
        self.encoder = tuple(linear(*s, key=next(keys)) for s in sizes["encoder"])
        self.latent = linear(*sizes["latent"][0], key=next(keys))
        self.decoder = tuple(linear(*s, key=next(keys)) for s in sizes["decoder"])
        self.num_classes = model.num_classes
        self.latent_dim = model.latent_dim
        self.compute_dtype = model.compute_dtype

    def encode(self, x: jax.Array, c: jax.Array) -> jax.Array:
        """The latent layer's output ``[2L]`` for one example: mean, then logvar."""
        h = condition(x.astype(self.compute_dtype), c, self.num_classes)
        for layer in self.encoder:
            h = jax.nn.relu(layer(h))
        return self.latent(h)

    def decode(self, z: jax.Array, c: jax.Array) -> jax.Array:
        """Bernoulli logits ``f32[D]`` for one example."""
        *hidden, output = self.decoder
        h = condition(z.astype(self.compute_dtype), c, self.num_classes)
        for layer in hidden:
            h = jax.nn.relu(layer(h))
        return output(h).astype(jnp.float32)


def in_compute_dtype(model: CVAE) -> CVAE:
    """The model with its floating-point arrays cast to the compute dtype (a no-op for float32).

    A cast is differentiable, so the gradient with respect to the float32 parameters stays float32.
    """
    dtype = jnp.dtype(model.compute_dtype)
    return jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, model)


# --8<-- [end:module]


# --8<-- [start:init]
def init_model(key: jax.Array, model: ModelConfig) -> CVAE:
    """LeCun-normal kernels, zero biases; one key per layer, split from ``key``."""
    return CVAE(model, key=key)


@functools.cache
def abstract_model(model: ModelConfig) -> CVAE:
    """The model with a ``jax.ShapeDtypeStruct`` for every array: structure only, no allocation."""
    return eqx.filter_eval_shape(init_model, jax.random.key(0), model)


def layers_of(model: CVAE) -> list[eqx.nn.Linear]:
    """Every layer in canonical order: encoder, latent, decoder (output last)."""
    return [*model.encoder, model.latent, *model.decoder]


# Canonical kernels are [fan_in, fan_out] and Equinox weights [fan_out, fan_in]: both converters
# transpose. ``params`` may be the whole model or its array part; both have the same layers.
def to_canonical(params: CVAE) -> Canonical:
    layers = [{"kernel": layer.weight.T, "bias": layer.bias} for layer in layers_of(params)]
    n_enc = len(params.encoder)
    return {"encoder": layers[:n_enc], "latent": layers[n_enc], "decoder": layers[n_enc + 1 :]}


def from_canonical(params: Canonical, model: ModelConfig) -> CVAE:
    layers = [*params["encoder"], params["latent"], *params["decoder"]]
    arrays = [a for layer in layers for a in (layer["kernel"].T, layer["bias"])]
    where = lambda m: [a for layer in layers_of(m) for a in (layer.weight, layer.bias)]
    return eqx.tree_at(where, abstract_model(model), arrays)


@dataclasses.dataclass(frozen=True, eq=False)
class Structure:
    """What rebuilds (model, opt_state) from a state's flat leaves: the tree structures of the
    model's arrays and of the optimiser state, and the model's non-array part.

    There is one per config (``structure_of``), so identity is equality: two states built from
    equal configs have the same static data and a jitted step compiles once, and comparing or
    hashing it on each call costs nothing (hashing an ``eqx.Module`` walks all its fields).
    """

    params: jax.tree_util.PyTreeDef
    opt_state: jax.tree_util.PyTreeDef
    static: CVAE  # the non-array part of ``eqx.partition(model, eqx.is_array)``


@functools.cache
def structure_of(model: ModelConfig, optim: OptimConfig) -> Structure:
    params, static = eqx.partition(
        abstract_model(model), lambda leaf: isinstance(leaf, jax.ShapeDtypeStruct)
    )
    opt_state = jax.eval_shape(make_optimizer(optim).init, params)
    return Structure(jax.tree.structure(params), jax.tree.structure(opt_state), static)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """(model, opt_state) flattened once, as in Equinox's low-overhead training loops: their leaves
    are the state's leaves, in plain lists, and how to rebuild them is static data."""

    step: jax.Array
    flat_params: list[jax.Array]  # the leaves of the model's arrays
    flat_opt_state: list[jax.Array]  # the leaves of the optimiser state
    structure: Structure = dataclasses.field(metadata=dict(static=True))
    config: Config = dataclasses.field(metadata=dict(static=True))

    @property
    def tx(self) -> optax.GradientTransformation:
        return make_optimizer(self.config.optim)

    @property
    def params(self) -> CVAE:
        """The model's arrays, as a model with None wherever it holds anything else."""
        return jax.tree.unflatten(self.structure.params, self.flat_params)

    @property
    def opt_state(self) -> optax.OptState:
        return jax.tree.unflatten(self.structure.opt_state, self.flat_opt_state)

    @property
    def model(self) -> CVAE:
        """The module again: ``eqx.combine`` of its arrays and its static part (no copies)."""
        return eqx.combine(self.params, self.structure.static)

    def replace(self, **changes) -> TrainState:
        """A copy with ``step``, ``params`` (a model of arrays, like ``self.params``) or
        ``opt_state`` replaced, as Flax's ``TrainState.replace``: new trees are flattened into the
        leaf lists, refused if their structure is not the config's."""
        if "params" in changes:
            changes["flat_params"] = self.structure.params.flatten_up_to(changes.pop("params"))
        if "opt_state" in changes:
            opt_state = changes.pop("opt_state")
            changes["flat_opt_state"] = self.structure.opt_state.flatten_up_to(opt_state)
        return dataclasses.replace(self, **changes)

    def apply_gradients(self, grads: CVAE) -> TrainState:
        """One optax update; returns the new state."""
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        params = eqx.apply_updates(self.params, updates)
        return dataclasses.replace(
            self,
            step=self.step + 1,
            flat_params=jax.tree.leaves(params),
            flat_opt_state=jax.tree.leaves(opt_state),
        )


def state_of(model: CVAE, config: Config) -> TrainState:
    """Step 0 and a fresh optimiser state: the model partitioned into its arrays, whose leaves the
    state holds, and its static part, the one cached for the config."""
    structure = structure_of(config.model, config.optim)
    params, _ = eqx.partition(model, eqx.is_array)
    opt_state = make_optimizer(config.optim).init(params)
    return TrainState(
        jnp.zeros((), jnp.int32),
        structure.params.flatten_up_to(params),  # refuses a model of another structure
        structure.opt_state.flatten_up_to(opt_state),
        structure,
        config,
    )


# --8<-- [end:init]


# --8<-- [start:forward]
# The module is written for one example; ``jax.vmap`` maps its methods over the batch. The latent
# layer's batched output is split into (mean, logvar) in float32.
def encode(model: CVAE, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """q(z | x, c): ``(mean, logvar)``, each ``f32[B, L]``."""
    s = jax.vmap(in_compute_dtype(model).encode)(x, c)
    return split_moments(s, model.latent_dim)


def decode(model: CVAE, z: jax.Array, c: jax.Array) -> jax.Array:
    """p(x | z, c): Bernoulli logits ``f32[B, D]``."""
    return jax.vmap(in_compute_dtype(model).decode)(z, c)


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(model: CVAE, batch: Batch, eps: jax.Array, config: Config):
    mean, logvar = encode(model, batch.x, batch.c)
    logits = decode(model, reparameterize(mean, logvar, eps), batch.c)
    return cvae_loss(logits, batch.x, mean, logvar, config.loss)


# --8<-- [end:loss]


# --8<-- [start:train_step]
@eqx.filter_jit
def make_step(
    model: CVAE, opt_state: optax.OptState, batch: Batch, eps: jax.Array, config: Config
) -> tuple[CVAE, optax.OptState, Metrics]:
    """The Equinox way: differentiate with respect to the model's arrays, return the new model.

    ``opt_state = make_optimizer(config.optim).init(eqx.filter(model, eqx.is_array))``.
    ``filter_jit`` traces every array of its arguments and holds the rest (the config, the model's
    static fields) static.
    """
    grad_fn = eqx.filter_value_and_grad(loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(model, batch, eps, config)
    tx = make_optimizer(config.optim)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    return model, opt_state, metrics


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# ``eqx.filter_jit`` partitions its arguments into arrays and the rest on every call, in Python;
# even a plain ``jax.jit`` over (model, opt_state) flattens and rebuilds every ``eqx.Module`` in
# them through Python callbacks. The state does both once (``state_of``): it holds the leaves in
# plain lists, which ``jax.jit`` flattens in C++, and the step rebuilds the model inside the trace
# only (``state.params`` unflattens, ``eqx.combine`` adds the static part). It is also the pure,
# donation-safe step the protocol asks for.
def compute_grads(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[CVAE, Metrics]:
    """The gradient with respect to the model's arrays (a ``CVAE`` with arrays where the model has
    them), and the metrics. Data-parallel steps run this on each device's rows."""

    def loss_of(params: CVAE):
        return loss_fn(eqx.combine(params, state.structure.static), batch, eps, state.config)

    (_, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
    return grads, metrics


def train_step(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[TrainState, Metrics]:
    grads, metrics = compute_grads(state, batch, eps)
    return state.apply_gradients(grads), metrics


# The benchmark compiles ``train_step`` as ``jax.jit(train_step, donate_argnums=0)``; the trainer
# runs its two halves (``compute_grads``, then ``state.apply_gradients``) in its epoch step,
# compiled with the old state donated (``jax.jit``, or ``jax.pmap`` under pmap).
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# The Equinox way of running the step (``make_step``), behind the protocol's
# ``(state, batch, key)`` call: ``label -> make(state) -> (step, carry)``, where
# ``step(carry, batch, key) -> (carry, metrics)``. The conformance suite checks it against
# ``train_step``; ``cvae bench`` times it beside the fast path.
def filter_jit_path(state: TrainState):
    """The ``filter_jit`` step from a protocol state: ``(step, (model, opt_state))``, the model
    rebuilt from ``state``'s arrays."""
    config = state.config

    def step(carry, batch: Batch, key: jax.Array):
        model, opt_state = carry
        eps = noise(key, batch.x.shape[0], config.model.latent_dim)
        model, opt_state, metrics = make_step(model, opt_state, batch, eps, config)
        return (model, opt_state), metrics

    return step, (state.model, state.opt_state)


PATHS = {"eqx.filter_jit": filter_jit_path}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it (`cvae impls`, install hints,
# the docs' and the benchmark's labels, the order of listings): read from this file's text.
ABOUT = {
    "label": "Equinox",
    "module": "equinox",
    "distribution": "equinox",
    "extra": "equinox",
    "order": 5,
}
implementation = Adapter(
    name="equinox",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: state_of(init_model(key, config.model), config),
    from_canonical_fn=lambda params, config: state_of(from_canonical(params, config.model), config),
    to_canonical_fn=lambda state: to_canonical(state.params),
    loss_fn=lambda state, batch, eps: loss_fn(state.model, batch, eps, state.config),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=lambda state, x, c: encode(state.model, x, c),
    decode_fn=lambda state, z, c: decode(state.model, z, c),
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
