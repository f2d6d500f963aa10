"""Stateful layers: BatchNorm's running statistics and Dropout's randomness, in every framework.

The same small network in each: ``Linear(4, 8) -> BatchNorm -> ReLU -> Dropout(0.5) ->
Linear(8, 2)``. Each ``run_*`` function does the same four things and returns what it saw
(:class:`Observed`): one training call with a dropout key, the same call again from the same
starting point with the same key and with another key, and an evaluation call after the training
call. What differs is where the running statistics live between calls and how the key gets in:

- Flax NNX: the module holds them (``nnx.BatchStat`` variables, an ``nnx.Rngs`` stream) and a call
  updates them in place, also under ``nnx.jit``;
- Flax Linen: the ``batch_stats`` collection is declared ``mutable`` in ``apply``, which returns
  the new collection beside the output; the key comes in through ``rngs={"dropout": key}``;
- Haiku: ``hk.transform_with_state`` gives ``init -> (params, state)`` and
  ``apply(params, state, key, ...) -> (out, new_state)``; ``hk.next_rng_key()`` inside;
- Equinox: ``eqx.nn.make_with_state`` gives ``(model, state)``; the layer is written for one
  example, ``jax.vmap`` names the batch axis BatchNorm averages over; keys are arguments;
- Keras 3: the layer objects hold them as non-trainable variables (BatchNorm's moving statistics,
  Dropout's ``keras.random.SeedGenerator`` state); ``training=`` picks the mode. A plain call
  updates them in place; ``model.stateless_call(trainable, non_trainable, x, training=True)`` is
  the pure form JAX needs, returning the new non-trainable values, which the caller assigns back.
  Seeds are integers, fixed when the layer is built: the key is turned into one;
- pure JAX: all of it by hand, which is what the others automate.

Run it: ``python -m examples.tour.stateful_layers``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import equinox as eqx
import haiku as hk
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

# Keras 3 picks its backend once, at its first import: JAX here (another one set is an error).
os.environ.setdefault("KERAS_BACKEND", "jax")
import keras

if keras.config.backend() != "jax":
    raise ImportError(f"the tour runs Keras on JAX, not on {keras.config.backend()!r}")

MOMENTUM = 0.9  # running = MOMENTUM * running + (1 - MOMENTUM) * batch (Haiku then debiases)
RATE = 0.5  # the dropout rate


class Observed(NamedTuple):
    train: jax.Array  # training-mode output, dropout key 1
    train_same_key: jax.Array  # the same call from the same starting point, key 1 again
    train_other_key: jax.Array  # ... with key 2
    mean_before: jax.Array  # BatchNorm's running mean before the training call
    mean_after: jax.Array  # ... after it
    eval_batch: jax.Array  # evaluation-mode output for the batch, after the training call
    eval_first: jax.Array  # ... for its first row alone
    mean_after_eval: jax.Array  # the running mean after the evaluation calls


# --8<-- [start:pure_jax]
# --8<-- [start:pure_jax_model]
def pure_jax_init(key: jax.Array) -> tuple[dict, dict]:
    """Parameters and running statistics: two separate trees the caller carries."""
    k1, k2 = jax.random.split(key)
    dense = lambda k, n_in, n_out: {
        "kernel": jax.nn.initializers.lecun_normal()(k, (n_in, n_out)),
        "bias": jnp.zeros(n_out),
    }
    params = {
        "hidden": dense(k1, 4, 8),
        "norm": {"scale": jnp.ones(8), "offset": jnp.zeros(8)},
        "out": dense(k2, 8, 2),
    }
    stats = {"mean": jnp.zeros(8), "var": jnp.ones(8)}
    return params, stats


def pure_jax_net(params, stats, x, *, train: bool, key=None):
    """``(output, new_stats)``: batch statistics (and an update) in training, running ones after."""
    h = x @ params["hidden"]["kernel"] + params["hidden"]["bias"]
    if train:
        mean, var = h.mean(axis=0), h.var(axis=0)
        stats = jax.tree.map(
            lambda run, new: MOMENTUM * run + (1 - MOMENTUM) * new,
            stats,
            {"mean": mean, "var": var},
        )
    else:
        mean, var = stats["mean"], stats["var"]
    h = (h - mean) / jnp.sqrt(var + 1e-5) * params["norm"]["scale"] + params["norm"]["offset"]
    h = jax.nn.relu(h)
    if train:  # inverted dropout: keep with probability 1 - RATE, scale up what is kept
        keep = jax.random.bernoulli(key, 1 - RATE, h.shape)
        h = jnp.where(keep, h / (1 - RATE), 0.0)
    return h @ params["out"]["kernel"] + params["out"]["bias"], stats


# --8<-- [end:pure_jax_model]


# --8<-- [start:pure_jax_run]
def run_pure_jax(x: jax.Array, key1: jax.Array, key2: jax.Array) -> Observed:
    params, stats = pure_jax_init(jax.random.key(0))
    train, new_stats = pure_jax_net(params, stats, x, train=True, key=key1)
    same, _ = pure_jax_net(params, stats, x, train=True, key=key1)
    other, _ = pure_jax_net(params, stats, x, train=True, key=key2)
    eval_batch, _ = pure_jax_net(params, new_stats, x, train=False)
    eval_first, after_eval = pure_jax_net(params, new_stats, x[:1], train=False)
    return Observed(
        train, same, other, stats["mean"], new_stats["mean"], eval_batch, eval_first,
        after_eval["mean"],
    )  # fmt: skip


# --8<-- [end:pure_jax_run]
# --8<-- [end:pure_jax]


# --8<-- [start:flax_linen]
# --8<-- [start:flax_linen_model]
class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, *, train: bool):
        h = nn.Dense(8)(x)
        h = nn.BatchNorm(use_running_average=not train, momentum=MOMENTUM)(h)
        h = nn.Dropout(RATE, deterministic=not train)(nn.relu(h))
        return nn.Dense(2)(h)


# --8<-- [end:flax_linen_model]


# --8<-- [start:flax_linen_run]
def run_flax_linen(x: jax.Array, key1: jax.Array, key2: jax.Array) -> Observed:
    model = LinenNet()
    variables = model.init(jax.random.key(0), x, train=False)  # {"params", "batch_stats"}

    def train_call(key):
        # batch_stats may change, so it is declared mutable; apply returns its new value.
        return model.apply(variables, x, train=True, rngs={"dropout": key}, mutable=["batch_stats"])

    train, updates = train_call(key1)
    same, _ = train_call(key1)
    other, _ = train_call(key2)
    trained = {**variables, **updates}  # the caller puts the new statistics back
    eval_batch = model.apply(trained, x, train=False)  # nothing mutable, no key needed
    eval_first = model.apply(trained, x[:1], train=False)
    return Observed(
        train, same, other, variables["batch_stats"]["BatchNorm_0"]["mean"],
        trained["batch_stats"]["BatchNorm_0"]["mean"], eval_batch, eval_first,
        trained["batch_stats"]["BatchNorm_0"]["mean"],
    )  # fmt: skip


# --8<-- [end:flax_linen_run]
# --8<-- [end:flax_linen]


# --8<-- [start:flax_nnx]
# --8<-- [start:flax_nnx_model]
class NNXNet(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, momentum=MOMENTUM, rngs=rngs)
        self.dropout = nnx.Dropout(RATE, rngs=rngs)  # keeps its own fork of the "dropout" stream
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.norm(self.hidden(x)))
        return self.out(self.dropout(h))


@nnx.jit
def nnx_forward(model: NNXNet, x):
    return model(x)  # updates to the model's state inside nnx.jit reach the caller's object


# --8<-- [end:flax_nnx_model]


# --8<-- [start:flax_nnx_run]
def run_flax_nnx(x: jax.Array, key1: jax.Array, key2: jax.Array) -> Observed:
    # The model holds its parameters, its running statistics and its RNG streams.
    fresh = lambda key: NNXNet(rngs=nnx.Rngs(params=0, dropout=key))
    model = fresh(key1)
    mean_before = model.norm.mean[...]
    model.train()  # Dropout drops, BatchNorm uses and updates batch statistics
    train = nnx_forward(model, x)  # model.norm.mean changed in place
    mean_after = model.norm.mean[...]
    same = nnx_forward(fresh(key1), x)  # same key, same masks: the stream is part of the state
    other = nnx_forward(fresh(key2), x)
    model.eval()  # Dropout is the identity, BatchNorm uses the running statistics
    eval_batch = nnx_forward(model, x)
    eval_first = nnx_forward(model, x[:1])
    return Observed(
        train, same, other, mean_before, mean_after, eval_batch, eval_first, model.norm.mean[...]
    )


# --8<-- [end:flax_nnx_run]
# --8<-- [end:flax_nnx]


# --8<-- [start:haiku]
# --8<-- [start:haiku_model]
def haiku_net(x, is_training: bool):
    h = hk.Linear(8)(x)
    h = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=MOMENTUM)(h, is_training)
    h = jax.nn.relu(h)
    if is_training:
        h = hk.dropout(hk.next_rng_key(), RATE, h)
    return hk.Linear(2)(h)


# init(key, ...) -> (params, state); apply(params, state, key, ...) -> (out, new_state)
haiku_model = hk.transform_with_state(haiku_net)


# --8<-- [end:haiku_model]


# --8<-- [start:haiku_run]
def run_haiku(x: jax.Array, key1: jax.Array, key2: jax.Array) -> Observed:
    # init runs the function once, in training mode (the moving averages are created there), on
    # a dummy batch of zeros: the running mean it leaves is zero.
    params, state = haiku_model.init(jax.random.key(0), jnp.zeros_like(x), is_training=True)
    running_mean = lambda s: s["batch_norm/~/mean_ema"]["average"]
    train, new_state = haiku_model.apply(params, state, key1, x, is_training=True)
    same, _ = haiku_model.apply(params, state, key1, x, is_training=True)
    other, _ = haiku_model.apply(params, state, key2, x, is_training=True)
    eval_batch, _ = haiku_model.apply(params, new_state, None, x, is_training=False)
    eval_first, after_eval = haiku_model.apply(params, new_state, None, x[:1], is_training=False)
    return Observed(
        train, same, other, running_mean(state), running_mean(new_state), eval_batch, eval_first,
        running_mean(after_eval),
    )  # fmt: skip


# --8<-- [end:haiku_run]
# --8<-- [end:haiku]


# --8<-- [start:equinox]
# --8<-- [start:equinox_model]
class EqxNet(eqx.Module):
    hidden: eqx.nn.Linear
    norm: eqx.nn.BatchNorm
    dropout: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(4, 8, key=k1)
        self.norm = eqx.nn.BatchNorm(8, axis_name="batch", momentum=MOMENTUM, mode="batch")
        self.dropout = eqx.nn.Dropout(RATE)
        self.out = eqx.nn.Linear(8, 2, key=k2)

    def __call__(self, x, state: eqx.nn.State, *, key=None):
        """One example: ``x: f32[4] -> (f32[2], new_state)``."""
        h, state = self.norm(self.hidden(x), state)
        h = self.dropout(jax.nn.relu(h), key=key)
        return self.out(h), state


def eqx_batched(model: EqxNet, x, state, key=None):
    """Map the one-example model over the batch; BatchNorm averages over the axis named "batch".
    Every example gets its own dropout key; the state is shared, so it is not mapped."""
    keys = None if key is None else jax.random.split(key, x.shape[0])
    call = lambda x, state, key: model(x, state, key=key)
    return jax.vmap(call, axis_name="batch", in_axes=(0, None, 0), out_axes=(0, None))(
        x, state, keys
    )


# --8<-- [end:equinox_model]


# --8<-- [start:equinox_run]
def run_equinox(x: jax.Array, key1: jax.Array, key2: jax.Array) -> Observed:
    model, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    running_mean = lambda s: s.get(model.norm.batch_state_index)[0]
    train, new_state = eqx_batched(model, x, state, key1)
    same, _ = eqx_batched(model, x, state, key1)
    other, _ = eqx_batched(model, x, state, key2)
    inference = eqx.nn.inference_mode(model)  # a copy with Dropout and BatchNorm switched
    eval_batch, _ = eqx_batched(inference, x, new_state)
    eval_first, after_eval = eqx_batched(inference, x[:1], new_state)
    return Observed(
        train, same, other, running_mean(state), running_mean(new_state), eval_batch, eval_first,
        running_mean(after_eval),
    )  # fmt: skip


# --8<-- [end:equinox_run]
# --8<-- [end:equinox]


# --8<-- [start:keras]
# --8<-- [start:keras_model]
def keras_net(dropout_seed: int) -> keras.Sequential:
    """Seeded initialisers, so every copy starts with the same weights; Dropout's own seed
    generator starts from ``dropout_seed``."""
    init = lambda: keras.initializers.GlorotUniform(seed=0)
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, kernel_initializer=init()),
            keras.layers.BatchNormalization(momentum=MOMENTUM, name="norm"),
            keras.layers.ReLU(),
            keras.layers.Dropout(RATE, seed=dropout_seed),  # holds a keras.random.SeedGenerator
            keras.layers.Dense(2, kernel_initializer=init()),
        ]
    )


def keras_train_call(model: keras.Sequential, x):
    """One training call as a pure function of the variables' values: the output and the new
    non-trainable values (moving statistics, seed state). The model's variables stay as they
    were."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    return model.stateless_call(trainable, non_trainable, x, training=True)


# --8<-- [end:keras_model]


# --8<-- [start:keras_run]
def run_keras(x: jax.Array, key1: jax.Array, key2: jax.Array) -> Observed:
    seed = lambda key: int(jax.random.randint(key, (), 0, 2**31 - 1))  # Keras seeds are integers
    model = keras_net(seed(key1))
    norm = model.get_layer("norm")
    mean_before = norm.moving_mean.value
    train, new_values = keras_train_call(model, x)
    same, _ = keras_train_call(model, x)  # the same seed state as before: the same mask
    other, _ = keras_train_call(keras_net(seed(key2)), x)
    for variable, value in zip(model.non_trainable_variables, new_values, strict=True):
        variable.assign(value)  # the caller writes the new statistics (and seed state) back
    mean_after = norm.moving_mean.value
    # A plain call changes the variables in place; training=False leaves the statistics alone.
    eval_batch = model(x, training=False)
    eval_first = model(x[:1], training=False)
    return Observed(
        train, same, other, mean_before, mean_after, eval_batch, eval_first, norm.moving_mean.value
    )


# --8<-- [end:keras_run]
# --8<-- [end:keras]


RUNS = {
    "pure_jax": run_pure_jax,
    "flax_linen": run_flax_linen,
    "flax_nnx": run_flax_nnx,
    "haiku": run_haiku,
    "equinox": run_equinox,
    "keras": run_keras,
}


def example_inputs() -> tuple[jax.Array, jax.Array, jax.Array]:
    """A batch of 16 rows whose features have mean 3, and two dropout keys."""
    x = 3.0 + jax.random.normal(jax.random.key(42), (16, 4))
    return x, jax.random.key(1), jax.random.key(2)


def main() -> None:
    x, key1, key2 = example_inputs()
    for name, run in RUNS.items():
        seen = run(x, key1, key2)
        moved = float(jnp.abs(seen.mean_after - seen.mean_before).max())
        row_alone = bool(jnp.allclose(seen.eval_batch[0], seen.eval_first[0], atol=1e-5))
        print(
            f"{name:>10}: running mean moved by up to {moved:.3f} in one training call; "
            f"same key, same output: {bool(jnp.allclose(seen.train, seen.train_same_key))}; "
            f"evaluation of a row ignores the rest of the batch: {row_alone}"
        )


if __name__ == "__main__":
    main()
