"""The CVAE in Keras 3 on its JAX backend: functional encoder and decoder, stateless calls.

A Keras model owns ``keras.Variable`` objects, and its training loop (``model.fit``) keeps their
values in a state of lists outside them while it trains: the JAX trainer jits the model's
``train_step(state, data)``, which calls ``model.stateless_call(trainable_variables,
non_trainable_variables, x)`` inside ``jax.value_and_grad`` and then
``optimizer.stateless_apply(optimizer_variables, grads, trainable_variables)``. This file writes its
step that way, as Keras's guide to a custom JAX ``train_step`` does, and the protocol's state holds
those values: the model's trainable ones (``params``) and the optimiser's, with the config as
static metadata. A Keras model is an object with variables, so the compiled model of a config is
built once, eagerly, and cached (``compiled_model``): a config can first reach this file inside
``jax.jit``, and variables created inside a trace would keep its tracers. Every state of that
config shares the model; its parameters' values are never used, only its calls (and, once, its
optimiser's fresh values).

Mixed precision is Keras's dtype policy, given to each layer (``mixed_bfloat16``: float32
variables, bfloat16 computation), never the global one, which would change every Keras model of the
process; a float32 ``Activation`` ends each sub-model, as Keras's mixed-precision guide ends a
model, so the moments and logits come back in float32.

Keras's ``AdamW`` adds epsilon to the square root of the uncorrected second moment (an effective
epsilon ``eps / sqrt(1 - b2^t)``, 31.6 times the spec's at the first step), so the optimiser here
is a subclass whose ``update_step`` is the spec's (optax's). Its learning-rate schedules are Keras's
``CosineDecay``, whose ``decay_steps`` does not count the warm-up where the spec's does. Keras's
kernels are ``[in, out]`` like the canonical ones; the converters only reorder the layers' values.

Keras reads its backend once, at its first import: this module selects JAX (``KERAS_BACKEND``)
before it imports Keras, and refuses to run on any other backend. The file is named ``keras_impl``
so that it does not shadow the ``keras`` package.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.spec.canonical import Canonical
from cvae_rosetta.spec.config import Config, LossConfig, ModelConfig, OptimConfig
from cvae_rosetta.spec.errors import ConfigError, ImplementationNotFound
from cvae_rosetta.spec.losses import Metrics, cvae_loss
from cvae_rosetta.spec.model import noise, reparameterize, split_moments
from cvae_rosetta.spec.optim import B1, B2, EPS
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import Batch

JAX_BACKEND = "'jax' (the keras implementation runs on Keras's JAX backend)"


def _select_jax_backend() -> None:
    """Make Keras's first import load its JAX backend; refuse any other backend in one line."""
    if "keras" in sys.modules:  # imported already: its backend is chosen for the process
        backend = sys.modules["keras"].backend.backend()
        if backend != "jax":
            raise ImplementationNotFound(
                f"keras.backend.backend(): expected {JAX_BACKEND}, got {backend!r} (keras was "
                "imported with it before this implementation)"
            )
        return
    backend = os.environ.setdefault("KERAS_BACKEND", "jax")
    if backend != "jax":
        raise ImplementationNotFound(f"KERAS_BACKEND: expected {JAX_BACKEND}, got {backend!r}")


_select_jax_backend()

import keras  # noqa: E402  (after the backend is selected)
from keras import ops  # noqa: E402

# --8<-- [start:module]
# ``mixed_bfloat16`` keeps the variables in float32 and computes in bfloat16.
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


def dense(units: int, name: str, model: ModelConfig, kernel_initializer, activation=None):
    """``keras.layers.Dense`` with zero biases and the config's dtype policy."""
    return keras.layers.Dense(
        units,
        activation=activation,
        kernel_initializer=kernel_initializer,
        bias_initializer="zeros",
        dtype=keras.DTypePolicy(POLICIES[model.compute_dtype]),
        name=name,
    )


def conditioned(h, c, model: ModelConfig):
    """``concat([h, one_hot(c)])``: how both the encoder and the decoder see the label."""
    policy = keras.DTypePolicy(POLICIES[model.compute_dtype])
    return keras.layers.Concatenate(dtype=policy)([h, ops.one_hot(c, model.num_classes)])


def encoder_of(model: ModelConfig, kernel_initializer) -> keras.Model:
    """q(z | x, c), functional: ``[x, c] -> [mean, logvar]`` concatenated, ``f32[B, 2L]``."""
    x = keras.Input((model.input_dim,), name="x")
    c = keras.Input((), dtype="int32", name="c")
    h = conditioned(x, c, model)
    for i, width in enumerate(model.encoder_dims):
        h = dense(width, f"encoder_{i}", model, kernel_initializer, activation="relu")(h)
    s = dense(2 * model.latent_dim, "latent", model, kernel_initializer)(h)
    s = keras.layers.Activation("linear", dtype="float32", name="moments")(s)
    return keras.Model([x, c], s, name="encoder")


def decoder_of(model: ModelConfig, kernel_initializer) -> keras.Model:
    """p(x | z, c), functional: ``[z, c] ->`` Bernoulli logits ``f32[B, D]``."""
    z = keras.Input((model.latent_dim,), name="z")
    c = keras.Input((), dtype="int32", name="c")
    h = conditioned(z, c, model)
    for i, width in enumerate(model.decoder_dims):
        h = dense(width, f"decoder_{i}", model, kernel_initializer, activation="relu")(h)
    logits = dense(model.input_dim, "output", model, kernel_initializer)(h)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model([z, c], logits, name="decoder")


class CVAE(keras.Model):
    """The encoder and the decoder, and the sample between them: ``(x, c, eps) -> (logits, mean,
    logvar)``, the noise given (SPEC section 3), so a call is a function of its inputs.

    Its kernels are LeCun normal, the spec's initialisation, unless told otherwise."""

    def __init__(
        self, model: ModelConfig, loss: LossConfig, kernel_initializer="lecun_normal", **kwargs
    ):
        super().__init__(**kwargs)
        self.encoder = encoder_of(model, kernel_initializer)
        self.decoder = decoder_of(model, kernel_initializer)
        self.latent_dim = model.latent_dim
        self.loss_config = loss

    def call(self, inputs):
        x, c, eps = inputs
        mean, logvar = split_moments(self.encoder([x, c]), self.latent_dim)
        logits = self.decoder([reparameterize(mean, logvar, eps), c])
        return logits, mean, logvar


class AdamW(keras.optimizers.AdamW):
    """Keras's AdamW with the spec's update, which is optax's.

    The stock ``update_step`` divides by ``sqrt(v) + epsilon`` with ``v`` not bias-corrected, an
    effective epsilon of ``epsilon / sqrt(1 - beta_2^t)`` (31.6 times the spec's at the first step);
    this one divides the bias-corrected moments, ``m_hat / (sqrt(v_hat) + epsilon)``, and updates
    the moments in optax's form. The rest is Keras's: the moments (``build``), the global-norm
    clipping (``global_clipnorm``), the decoupled weight decay, the schedule read at the count of
    steps already taken (``iterations``).
    """

    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        t = ops.cast(self.iterations + 1, variable.dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign(m, ops.add((1 - self.beta_1) * gradient, self.beta_1 * m))
        self.assign(v, ops.add((1 - self.beta_2) * ops.square(gradient), self.beta_2 * v))
        m_hat = ops.divide(m, 1 - ops.power(self.beta_1, t))
        v_hat = ops.divide(v, 1 - ops.power(self.beta_2, t))
        self.assign_sub(variable, lr * ops.divide(m_hat, ops.sqrt(v_hat) + self.epsilon))

    def moments(self) -> tuple[list, list]:
        """Adam's first and second moments, one variable each per model variable, in its order."""
        return self._momentums, self._velocities


def learning_rate(optim: OptimConfig):
    """The config's rate: a float, or Keras's ``CosineDecay`` (SPEC section 5's schedules)."""
    if optim.schedule == "constant":
        return optim.learning_rate
    if optim.decay_steps is None:
        raise ConfigError(
            f"optim.decay_steps: expected the schedule's length in steps with schedule "
            f"{optim.schedule} (OptimConfig.for_run derives it from the run's length), got None"
        )
    alpha = optim.end_learning_rate / optim.learning_rate
    if optim.schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(
            optim.learning_rate, optim.decay_steps, alpha=alpha
        )
    # The spec's decay_steps counts the warm-up (as optax's does); Keras's CosineDecay decays over
    # decay_steps more steps after it.
    return keras.optimizers.schedules.CosineDecay(
        0.0,
        optim.decay_steps - optim.warmup_steps,
        alpha=alpha,
        warmup_target=optim.learning_rate,
        warmup_steps=optim.warmup_steps,
    )


def optimizer_of(optim: OptimConfig) -> AdamW:
    """SPEC section 5: global-norm clipping, then AdamW."""
    return AdamW(
        learning_rate(optim),
        weight_decay=optim.weight_decay,
        beta_1=B1,
        beta_2=B2,
        epsilon=EPS,
        global_clipnorm=optim.clip_norm,
    )


# --8<-- [end:module]


# --8<-- [start:init]
def build_model(config: Config) -> FitCVAE:
    """A new model of the config, compiled with the spec's optimiser, every variable created.

    Its variables' values are never read (every call is given a state's values), so its kernels
    start at zero: drawing LeCun-normal ones would compile a sampler for every new kernel shape."""
    model = FitCVAE(config.model, config.loss, kernel_initializer="zeros", name="cvae")
    model.build(((None, config.model.input_dim), (None,), (None, config.model.latent_dim)))
    model.compile(optimizer=optimizer_of(config.optim))
    model.optimizer.build(model.trainable_variables)
    return model


def dense_layers(model: CVAE) -> list:
    """Every Dense layer in canonical order: encoder, latent, decoder (output last)."""
    layers = [*model.encoder.layers, *model.decoder.layers]
    return [layer for layer in layers if isinstance(layer, keras.layers.Dense)]


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Compiled:
    """The compiled model of a config, and where the state's lists keep its values.

    There is one per config (``compiled_model``), so identity is equality: states of equal configs
    have the same static data, and a jitted step compiles once.
    """

    model: FitCVAE
    slots: tuple[tuple[int, int], ...]  # per Dense layer: its kernel's and bias's index in params
    encoder_params: int  # the first ones in params are the encoder's
    initial_optimizer: tuple[np.ndarray, ...]  # the optimiser's variables, fresh (step 0)
    count: int  # ``iterations``' index among the optimiser's variables
    mu: tuple[int, ...]  # the first moments' indices, in params' order
    nu: tuple[int, ...]  # the second moments'

    def __repr__(self) -> str:
        return f"<the compiled {self.model.name} of {len(self.slots)} Dense layers>"


@functools.cache
def compiled_model(model: ModelConfig, loss: LossConfig, optim: OptimConfig) -> Compiled:
    # Eagerly: a config can first arrive inside jax.jit, and Keras objects built in a trace leak it.
    with jax.ensure_compile_time_eval():
        keras_model = build_model(Config(model=model, loss=loss, optim=optim))
        initial = tuple(np.asarray(v.value) for v in keras_model.optimizer.variables)
    params = {id(v): i for i, v in enumerate(keras_model.trainable_variables)}
    encoder = [params[id(v)] for v in keras_model.encoder.trainable_variables]
    assert encoder == list(range(len(encoder))), "the encoder's variables come first"
    slots = tuple((params[id(d.kernel)], params[id(d.bias)]) for d in dense_layers(keras_model))
    optimizer = {id(v): i for i, v in enumerate(keras_model.optimizer.variables)}
    mu, nu = (tuple(optimizer[id(v)] for v in m) for m in keras_model.optimizer.moments())
    count = optimizer[id(keras_model.optimizer.iterations)]
    return Compiled(keras_model, slots, len(encoder), initial, count, mu, nu)


def compiled_of(config: Config) -> Compiled:
    return compiled_model(config.model, config.loss, config.optim)


def init_params(key: jax.Array, compiled: Compiled) -> list[jax.Array]:
    """LeCun-normal kernels, zero biases, drawn from ``key`` as the pure JAX implementation draws
    them (one key per layer, split from ``key``): the same parameters for the same key."""
    kernel_init = jax.nn.initializers.lecun_normal()
    layers = dense_layers(compiled.model)
    values: list = [None] * len(compiled.model.trainable_variables)
    for layer_key, layer, (k, b) in zip(
        jax.random.split(key, len(layers)), layers, compiled.slots, strict=True
    ):
        values[k] = kernel_init(layer_key, layer.kernel.shape, jnp.float32)
        values[b] = jnp.zeros(layer.bias.shape, jnp.float32)
    return values


# Canonical tree <-> the values of ``model.trainable_variables``: Keras's kernels are already
# [fan_in, fan_out], so each layer's two values only move to their place in the list.
def to_canonical(params: list[jax.Array], compiled: Compiled, model: ModelConfig) -> Canonical:
    layers = [{"kernel": params[k], "bias": params[b]} for k, b in compiled.slots]
    n_enc = len(model.encoder_dims)
    return {"encoder": layers[:n_enc], "latent": layers[n_enc], "decoder": layers[n_enc + 1 :]}


def from_canonical(params: Canonical, compiled: Compiled) -> list[jax.Array]:
    layers = [*params["encoder"], params["latent"], *params["decoder"]]
    values: list = [None] * len(compiled.model.trainable_variables)
    for layer, (k, b) in zip(layers, compiled.slots, strict=True):
        values[k], values[b] = layer["kernel"], layer["bias"]
    return values


class AdamState(NamedTuple):
    """Adam's count and moments, the moments in the structure of ``params``: what a checkpoint
    keeps of the optimiser (``shared/app/trainstate.py``)."""

    count: jax.Array
    mu: list[jax.Array]
    nu: list[jax.Array]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """What Keras's JAX trainer carries from step to step, as a pytree: the values of the model's
    trainable variables and of its optimiser's, in their lists; the compiled model, static."""

    step: jax.Array
    params: list[jax.Array]  # model.trainable_variables' values, in its order
    # model.optimizer.variables' values, in its order: iterations, the learning rate where it is
    # constant (a schedule is a function of iterations), then each parameter's two moments
    optimizer_variables: list[jax.Array]
    compiled: Compiled = dataclasses.field(metadata=dict(static=True))
    config: Config = dataclasses.field(metadata=dict(static=True))

    @property
    def model(self) -> FitCVAE:
        return self.compiled.model

    @property
    def opt_state(self) -> AdamState:
        """The optimiser's ``iterations`` and moments, read from its variables' values."""
        values, compiled = self.optimizer_variables, self.compiled
        return AdamState(
            values[compiled.count],
            [values[i] for i in compiled.mu],
            [values[i] for i in compiled.nu],
        )

    def replace(self, **changes: Any) -> TrainState:
        """A copy with ``step``, ``params`` or ``opt_state`` (an :class:`AdamState`) replaced, the
        last written into the optimiser's variables' values."""
        if "opt_state" in changes:
            count, mu, nu = changes.pop("opt_state")
            values = list(self.optimizer_variables)
            values[self.compiled.count] = count
            for indices, moments in ((self.compiled.mu, mu), (self.compiled.nu, nu)):
                for i, moment in zip(indices, moments, strict=True):
                    values[i] = moment
            changes["optimizer_variables"] = values
        return dataclasses.replace(self, **changes)

    def apply_gradients(self, grads: list[jax.Array]) -> TrainState:
        """One step of the model's optimiser, stateless: returns the new state."""
        params, optimizer_variables = self.model.optimizer.stateless_apply(
            self.optimizer_variables, grads, self.params
        )
        return dataclasses.replace(
            self, step=self.step + 1, params=params, optimizer_variables=optimizer_variables
        )


def create_state(params: list[jax.Array], config: Config) -> TrainState:
    """Step 0 and the optimiser's fresh variables, for the config's compiled model."""
    compiled = compiled_of(config)
    optimizer_variables = [jnp.array(value) for value in compiled.initial_optimizer]
    return TrainState(jnp.zeros((), jnp.int32), list(params), optimizer_variables, compiled, config)


# --8<-- [end:init]


# --8<-- [start:forward]
# The sub-models' own stateless calls, each on its share of the values (the encoder's come first).
def encode(state: TrainState, x: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """q(z | x, c): ``(mean, logvar)``, each ``f32[B, L]``."""
    params = state.params[: state.compiled.encoder_params]
    s, _ = state.model.encoder.stateless_call(params, [], [x, c])
    return split_moments(s, state.config.model.latent_dim)


def decode(state: TrainState, z: jax.Array, c: jax.Array) -> jax.Array:
    """p(x | z, c): Bernoulli logits ``f32[B, D]``."""
    params = state.params[state.compiled.encoder_params :]
    logits, _ = state.model.decoder.stateless_call(params, [], [z, c])
    return logits


# --8<-- [end:forward]


# --8<-- [start:loss]
def loss_fn(model: CVAE, trainable_variables: list, batch: Batch, eps: jax.Array):
    """The loss of the trainable variables' values: ``model.stateless_call``, as Keras's JAX
    trainer calls the model. (The model has no non-trainable variables.)"""
    (logits, mean, logvar), _ = model.stateless_call(
        trainable_variables, [], (batch.x, batch.c, eps)
    )
    return cvae_loss(logits, batch.x, mean, logvar, model.loss_config)


# --8<-- [end:loss]


# --8<-- [start:train_step]
class FitCVAE(CVAE):
    """The model with the step ``model.fit`` runs: Keras's JAX trainer jits ``train_step`` (with
    its state donated) and calls it on each batch, the state being the values of the trainable,
    non-trainable, optimiser and metric variables. ``x`` is ``(x, c, eps)``: the noise comes with
    the data, so a step is a function of its inputs."""

    def train_step(self, state, data):
        trainable_variables, non_trainable, optimizer_variables, metrics_variables = state
        (x, c, eps), _, _ = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
        (_, metrics), grads = grad_fn(self, trainable_variables, Batch(x, c), eps)
        trainable_variables, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables
        )
        # The logs are the batch's metrics (no keras.metrics trackers: their running means
        # would not be the step's), so fit's history keeps each epoch's last batch.
        return metrics, (trainable_variables, non_trainable, optimizer_variables, metrics_variables)


# --8<-- [end:train_step]


# --8<-- [start:fast_path]
# fit's step over a state of this file's own: the same stateless_call inside value_and_grad and
# the same stateless_apply, on the values the protocol's state holds, under a plain ``jax.jit``.
# fit's train function passes through its iterator and a tuple of four lists (metric variables
# included) on every call; the protocol's state is one pytree. It is also the pure,
# donation-safe step the protocol asks for.
def compute_grads(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[list, Metrics]:
    """The gradient with respect to the trainable variables' values (a list like ``params``), and
    the metrics. Data-parallel steps run this on each device's rows."""
    grad_fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
    (_, metrics), grads = grad_fn(state.model, state.params, batch, eps)
    return grads, metrics


def train_step(state: TrainState, batch: Batch, eps: jax.Array) -> tuple[TrainState, Metrics]:
    grads, metrics = compute_grads(state, batch, eps)
    return state.apply_gradients(grads=grads), metrics


# The benchmark compiles ``train_step`` as ``jax.jit(train_step, donate_argnums=0)``; the trainer
# runs its two halves (``compute_grads``, then ``state.apply_gradients``) in its epoch step,
# compiled with the old state donated (``jax.jit``, or ``jax.pmap`` under pmap).
# --8<-- [end:fast_path]


# --8<-- [start:paths]
# Keras's ways of running the step, behind the protocol's ``(state, batch, key)`` call:
# ``label -> make(state) -> (step, carry)``, where ``step(carry, batch, key) -> (carry, metrics)``.
# The conformance suite checks each against ``train_step``; ``cvae bench`` times each beside the
# fast path. The noise of SPEC section 3 for the key goes in with the batch.
def fit_path(state: TrainState):
    """The train function ``model.fit`` calls on each batch (``model.make_train_function()``: the
    jitted ``FitCVAE.train_step``, its state donated), without fit's loop around it (epochs,
    callbacks, the data adapter): ``(step, state)`` with fit's four lists of values."""
    model, latent_dim = state.model, state.config.model.latent_dim
    model.make_train_function()
    metrics_variables = [jnp.array(v.value) for v in model.metrics_variables]  # copies: donated
    carry = (list(state.params), [], list(state.optimizer_variables), metrics_variables)

    def step(carry, batch: Batch, key: jax.Array):
        data = ((batch.x, batch.c, noise(key, batch.x.shape[0], latent_dim)),)
        logs, carry = model.train_function(carry, iter([data]))
        return carry, logs

    return step, carry


def train_on_batch_path(state: TrainState):
    """``model.train_on_batch``: the same train function, the values kept in the model's
    variables between calls (read out and written back on each). A model of its own, holding
    ``state``'s values: ``(step, model)``."""
    model, latent_dim = build_model(state.config), state.config.model.latent_dim
    for variables, values in (
        (model.trainable_variables, state.params),
        (model.optimizer.variables, state.optimizer_variables),
    ):
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)

    def step(model, batch: Batch, key: jax.Array):
        x = (batch.x, batch.c, noise(key, batch.x.shape[0], latent_dim))
        return model, model.train_on_batch(x, return_dict=True)

    return step, model


PATHS = {"model.fit step": fit_path, "model.train_on_batch": train_on_batch_path}
# --8<-- [end:paths]


# --8<-- [start:adapter]
# What the project says of this implementation without importing it (`cvae impls`, install hints,
# the docs' and the benchmark's labels, the order of listings): read from this file's text.
ABOUT = {
    "label": "Keras 3",
    "module": "keras",
    "distribution": "keras",
    "extra": "keras",
    "order": 6,
}
implementation = Adapter(
    name="keras",
    framework=ABOUT["distribution"],
    init_fn=lambda key, config: create_state(init_params(key, compiled_of(config)), config),
    from_canonical_fn=lambda params, config: create_state(
        from_canonical(params, compiled_of(config)), config
    ),
    to_canonical_fn=lambda state: to_canonical(state.params, state.compiled, state.config.model),
    loss_fn=lambda state, batch, eps: loss_fn(state.model, state.params, batch, eps),
    train_step_fn=train_step,
    grads_fn=compute_grads,
    encode_fn=encode,
    decode_fn=decode,
    extras={"paths": PATHS},
)
# --8<-- [end:adapter]
