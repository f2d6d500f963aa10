"""The CVAE in Flax NNX: a stateful ``nnx.Module`` that holds its own ``nnx.Param`` variables.

NNX modules are ordinary Python objects: ``CVAE(model, rngs=nnx.Rngs(key))`` creates every
parameter eagerly, and the idiomatic step mutates the model and an ``nnx.Optimizer`` in place under
``nnx.jit``. The protocol wants a pure step over a pytree instead, so the fast path uses NNX's
functional API: the model's parameters taken once as a ``State`` of arrays (``nnx.state``) and its
static ``GraphDef`` (``nnx.graphdef``, once per config), the two halves ``nnx.split`` gives, and
``nnx.merge`` them back inside a plain ``jax.jit``-ed step. Both paths are here, in the
sections every implementation shares.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cvae_rosetta.spec.canonical import Canonical, layer_sizes
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import condition, noise, reparameterize, split_moments
from cvae_rosetta.spec.optim import make_optimizer
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import Batch


# --8<-- [start:module]
class CVAE(nnx.Module):
    """Encoder q(z | x, c) and decoder p(x | z, c), each a stack of ``nnx.Linear`` layers."""

    def __init__(self, model: ModelConfig, *, rngs: nnx.Rngs):
        sizes = layer_sizes(model)
        linear = functools.partial(
            nnx.Linear,
            kernel_init=nnx.initializers.lecun_normal(),
            bias_init=nnx.initializers.zeros_init(),
            dtype=jnp.dtype(model.compute_dtype),  # activations and matmuls
            param_dtype=jnp.float32,  # parameters
            rngs=rngs,
        )
        self.encoder = nnx.List([linear(*s) for s in sizes["encoder"]])
        self.latent = linear(*sizes["latent"][0])
        self.decoder = nnx.List([linear(*s) for s in sizes["decoder"]])  # hidden layers, output
        self.num_classes = model.num_classes
        self.latent_dim = model.latent_dim

    def encode(self, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(mean, logvar)``, each ``f32[B, L]``."""
        h = condition(x, c, self.num_classes)
        for layer in self.encoder:
            h = nnx.relu(layer(h))
        return split_moments(self.latent(h), self.latent_dim)

    def decode(self, z: jax.Array, c: jax.Array) -> jax.Array:
        """Bernoulli logits ``f32[B, D]``."""
        *hidden, output = self.decoder
        h = condition(z, c, self.num_classes)
        for layer in hidden:
            h = nnx.relu(layer(h))
        return output(h).astype(jnp.float32)

    def __call__(self, x: jax.Array, c: jax.Array, eps: jax.Array):
        mean, logvar = self.encode(x, c)
        logits = self.decode(reparameterize(mean, logvar, eps), c)
        return logits, mean, logvar


# --8<-- [end:module]


# --8<-- [start:init]
def init_model(key: jax.Array, model: ModelConfig) -> CVAE:
    """LeCun-normal kernels, zero biases: the layers draw their keys from ``nnx.Rngs``."""
    return CVAE(model, rngs=nnx.Rngs(params=key))


@functools.lru_cache
def graphdef_of(model: ModelConfig) -> nnx.GraphDef[CVAE]:
    """The model's static structure, built once per config without allocating any parameter.

    Equal configs give the very same ``GraphDef`` object, so the static part of two states built
    from equal configs compares equal at once and a jitted step compiles once.
    """
    return nnx.graphdef(nnx.eval_shape(lambda: init_model(jax.random.key(0), model)))


# Canonical lists <-> NNX paths: an ``nnx.List`` of layers is keyed 0, 1, ... in the state, so
# ``("encoder", i, "kernel")`` is ``params["encoder"][i]["kernel"]``; kernels are already
# [fan_in, fan_out].
def to_canonical(params: nnx.State) -> Canonical:
    pure = nnx.to_pure_dict(params)
    return {
        "encoder": [pure["encoder"][i] for i in sorted(pure["encoder"])],
        "latent": pure["latent"],
        "decoder": [pure["decoder"][i] for i in sorted(pure["decoder"])],
    }


def from_canonical(params: Canonical) -> nnx.State:
    return nnx.State(
        {
            "encoder": dict(enumerate(params["encoder"])),
            "latent": params["latent"],
            "decoder": dict(enumerate(params["decoder"])),
        }
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """The functional form of (model, optimizer): arrays as leaves, structure as static data."""

    step: jax.Array
    params: nnx.State  # the model's nnx.Param values, as plain arrays
    opt_state: optax.OptState
    graphdef: nnx.GraphDef[CVAE] = dataclasses.field(metadata=dict(static=True))
    config: Config = dataclasses.field(metadata=dict(static=True))

    @property
    def tx(self) -> optax.GradientTransformation:
        return make_optimizer(self.config.optim)

    @property
    def model(self) -> CVAE:
        """The module again: ``nnx.merge`` of the static graph and the parameters."""
        return nnx.merge(self.graphdef, self.params)

    def apply_gradients(self, grads: nnx.State) -> TrainState:
        """One optax update; returns the new state."""
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        return dataclasses.replace(self, step=self.step + 1, params=params, opt_state=opt_state)


def create_state(params: nnx.State, config: Config) -> TrainState:
    """Step 0 and a fresh optimiser state for ``params``, which must be pure (arrays, no Params)."""
    opt_state = make_optimizer(config.optim).init(params)
    step = jnp.zeros((), jnp.int32)
    return TrainState(step, params, opt_state, graphdef_of(config.model), config)


def state_of(model: CVAE, config: Config) -> TrainState:
    """The model split once: its ``nnx.Param`` values, as plain arrays, become the state's leaves,
    and its structure is the state's static ``graphdef``."""
    return create_state(nnx.as_pure(nnx.state(model, nnx.Param)), config)


# --8<-- [end:init]


# --8<-- [start:forward]
# The forward pass is the model's own methods; a functional state is turned back into the model by
# ``nnx.merge`` (``state.model``), which wraps the state's arrays without copying them.
def encode(state: TrainState, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    return state.model.encode(x, c)


def decode(state: TrainState, z: jax.Array, c: jax.Array) -> jax.Array:
    return state.model.decode(z, c)


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(model: CVAE, batch: Batch, eps: jax.Array, config: Config):
    logits, mean, logvar = model(batch.x, batch.c, eps)
    return cvae_loss(logits, batch.x, mean, logvar, config.loss)


# --8<-- [end:loss]


# --8<-- [start:train_step]
@nnx.jit(static_argnames="config", donate_argnames=("model", "optimizer"))
def train_step_in_place(
    model: CVAE, optimizer: nnx.Optimizer[CVAE], batch: Batch, eps: jax.Array, config: Config
) -> Metrics:
    """The NNX way: differentiate with respect to the model, update model and optimizer in place.

    ``optimizer = nnx.Optimizer(model, make_optimizer(config.optim), wrt=nnx.Param)``. Their old
    buffers are donated, so XLA writes the new values over them.
    """
    (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch, eps, config)
    optimizer.update(model, grads)
    return metrics


# The same step in tree mode (``graph=False``): ``nnx.jit`` and ``nnx.value_and_grad`` take the
# model and the optimizer as pytrees of their Variables instead of walking them as object graphs
# (no shared references, no structural changes inside the step); updates to the Variables are
# still written back to the objects.
@nnx.jit(static_argnames="config", donate_argnames=("model", "optimizer"), graph=False)
def train_step_tree_mode(
    model: CVAE, optimizer: nnx.Optimizer[CVAE], batch: Batch, eps: jax.Array, config: Config
) -> Metrics:
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True, graph=False)
    (_, metrics), grads = grad_fn(model, batch, eps, config)
    optimizer.update(model, grads)
    return metrics


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# ``nnx.jit`` walks the model's and the optimizer's object graph in Python on every call;
# ``nnx.cached_partial`` caches that walk but still syncs the objects in and out; tree mode has no
# graph to walk but still flattens the objects and writes their Variables back. Split once instead
# (``state_of``) and write the step over arrays: ``nnx.merge`` rebuilds the model inside the trace,
# so the graph is walked only while tracing and a call costs what a ``jax.jit`` call costs. It is
# also the pure, donation-safe step the protocol asks for.
def compute_grads(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[nnx.State, Metrics]:
    """The gradient with respect to the state's parameters (an ``nnx.State`` like them), and the
    metrics. Data-parallel steps run this on each device's rows."""

    def loss_of(params: nnx.State):
        return loss_fn(nnx.merge(state.graphdef, params), batch, eps, state.config)

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
# The NNX ways of running the step (``train_step_in_place``, and ``train_step_tree_mode`` in tree
# mode), behind the protocol's
# ``(state, batch, key)`` call: ``label -> make(state) -> (step, carry)``, where
# ``step(carry, batch, key) -> (carry, metrics)``. The conformance suite checks each against
# ``train_step``; ``cvae bench`` times each beside the fast path.
def in_place_path(state: TrainState, *, cached: bool = False, tree_mode: bool = False):
    """The stateful step from a protocol state: ``(step, (model, optimizer))``; ``tree_mode`` runs
    ``train_step_tree_mode``, ``cached`` applies ``nnx.cached_partial`` (graph mode only) to the
    two objects. The model wraps ``state``'s parameter buffers, which the first step donates."""
    model, config = state.model, state.config
    optimizer = nnx.Optimizer(model, state.tx, wrt=nnx.Param)
    jitted = train_step_tree_mode if tree_mode else train_step_in_place
    if cached:
        cached_step = nnx.cached_partial(jitted, model, optimizer)
        run = lambda batch, eps: cached_step(batch, eps, config)
    else:
        run = lambda batch, eps: jitted(model, optimizer, batch, eps, config)

    def step(objects, batch: Batch, key: jax.Array):
        return objects, run(batch, noise(key, batch.x.shape[0], config.model.latent_dim))

    return step, (model, optimizer)


PATHS = {
    "nnx.jit in place": in_place_path,
    "nnx.cached_partial": functools.partial(in_place_path, cached=True),
    "nnx.jit tree mode": functools.partial(in_place_path, tree_mode=True),
}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it (`cvae impls`, install hints,
# the docs' and the benchmark's labels, the order of listings): read from this file's text.
ABOUT = {"label": "Flax NNX", "module": "flax", "distribution": "flax", "extra": "flax", "order": 3}
implementation = Adapter(
    name="flax_nnx",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: state_of(init_model(key, config.model), config),
    from_canonical_fn=lambda params, config: create_state(from_canonical(params), config),
    to_canonical_fn=lambda state: to_canonical(state.params),
    loss_fn=lambda state, batch, eps: loss_fn(state.model, batch, eps, state.config),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=encode,
    decode_fn=decode,
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
