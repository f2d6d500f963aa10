"""Variables: a kind of state of one's own, and new values written into a model from outside.

The same layer in each framework, ``Linear(4, 2)``, that also counts its calls in a variable of a
kind of its own, beside its parameters. Then the parameters of another copy (a checkpoint, say) are
written into the model, and one gradient is taken with respect to the parameters alone. Two things
differ between the frameworks:

- a kind of state of one's own: Flax NNX subclasses ``nnx.Variable`` (``class CallCount
  (nnx.Variable)``), and the class is a filter (``nnx.state(model, CallCount)``); Flax Linen names
  a variable collection (``"calls"``); Haiku keeps it in ``state`` (``hk.get_state`` /
  ``hk.set_state``); Equinox marks it with ``eqx.nn.StateIndex`` and keeps the value in an
  ``eqx.nn.State``; Keras 3 has no kinds beyond trainable or not: a non-trainable variable
  (``add_weight(..., trainable=False)``), found in ``model.non_trainable_variables``; pure JAX
  carries a second dict;
- writing values into a model: ``nnx.update(model, state)`` changes the model in place and leaves
  its other variables alone; Keras 3 changes it in place too, ``variable.assign`` over the
  trainable variables (``set_weights`` would write the checkpoint's count as well); elsewhere the
  parameters are a value, so the new tree is built (Linen: a dict merge; Haiku:
  ``hk.data_structures.merge``; Equinox: ``eqx.partition`` and ``eqx.combine``; pure JAX: a dict).

Run it: ``python -m examples.tour.variables``.
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

CALLS = 4  # the model's calls in every run: two, one after the update, one under the gradient


class Observed(NamedTuple):
    expected: jax.Array  # the checkpoint's output
    before_update: jax.Array  # the model's output with its own parameters
    after_update: jax.Array  # the model's output once the checkpoint's parameters are written in
    calls: int  # the model's count of its calls, at the end
    count_leaves: int  # leaves of the counting state, picked out by its kind
    grad_sizes: tuple[int, ...]  # sizes of the gradient's leaves (parameters only)


def mse(prediction: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean((prediction - target) ** 2)


def observe(expected, before_update, after_update, calls, counts, grads) -> Observed:
    """What a run saw: ``counts`` is its counting state, ``grads`` its gradient."""
    sizes = tuple(sorted(leaf.size for leaf in jax.tree.leaves(grads)))
    return Observed(
        expected, before_update, after_update, int(calls), len(jax.tree.leaves(counts)), sizes
    )


# --8<-- [start:pure_jax]
# --8<-- [start:pure_jax_variable]
def pure_jax_init(key: jax.Array) -> tuple[dict, dict]:
    """``(params, counts)``: what is trained, and what only counts."""
    params = {
        "kernel": jax.nn.initializers.lecun_normal()(key, (4, 2)),
        "bias": jnp.zeros(2),
    }
    return params, {"calls": jnp.array(0)}


def pure_jax_apply(params: dict, counts: dict, x: jax.Array) -> tuple[jax.Array, dict]:
    return x @ params["kernel"] + params["bias"], {"calls": counts["calls"] + 1}


# --8<-- [end:pure_jax_variable]


# --8<-- [start:pure_jax_update]
def run_pure_jax(x: jax.Array, y: jax.Array) -> Observed:
    params, counts = pure_jax_init(jax.random.key(0))
    checkpoint, checkpoint_counts = pure_jax_init(jax.random.key(1))
    expected, _ = pure_jax_apply(checkpoint, checkpoint_counts, x)
    for _ in range(2):
        before_update, counts = pure_jax_apply(params, counts, x)
    # "Update": the parameters are a value; the new one is the checkpoint's.
    params = checkpoint
    after_update, counts = pure_jax_apply(params, counts, x)

    def loss(params, counts):
        out, counts = pure_jax_apply(params, counts, x)
        return mse(out, y), counts

    grads, counts = jax.grad(loss, has_aux=True)(params, counts)
    return observe(expected, before_update, after_update, counts["calls"], counts, grads)


# --8<-- [end:pure_jax_update]
# --8<-- [end:pure_jax]


# --8<-- [start:flax_linen]
# --8<-- [start:flax_linen_variable]
class LinenCountingDense(nn.Module):
    @nn.compact
    def __call__(self, x):
        # A collection of its own, "calls", beside "params": its name is its kind.
        calls = self.variable("calls", "count", lambda: jnp.array(0))
        if not self.is_initializing():
            calls.value += 1
        return nn.Dense(2)(x)


# --8<-- [end:flax_linen_variable]


# --8<-- [start:flax_linen_update]
def run_flax_linen(x: jax.Array, y: jax.Array) -> Observed:
    model = LinenCountingDense()
    variables = model.init(jax.random.key(0), x)  # {"params": ..., "calls": {"count": 0}}
    checkpoint = model.init(jax.random.key(1), x)
    expected, _ = model.apply(checkpoint, x, mutable="calls")
    for _ in range(2):
        # "calls" may change, "params" not
        before_update, changed = model.apply(variables, x, mutable="calls")
        variables = {**variables, **changed}
    # "Update": a new dict, the checkpoint's parameters beside the model's own counts.
    variables = {**variables, "params": checkpoint["params"]}
    after_update, changed = model.apply(variables, x, mutable="calls")
    variables = {**variables, **changed}

    def loss(params):
        out, changed = model.apply({**variables, "params": params}, x, mutable="calls")
        return mse(out, y), changed

    grads, changed = jax.grad(loss, has_aux=True)(variables["params"])
    variables = {**variables, **changed}
    calls = variables["calls"]
    return observe(expected, before_update, after_update, calls["count"], calls, grads)


# --8<-- [end:flax_linen_update]
# --8<-- [end:flax_linen]


# --8<-- [start:flax_nnx]
# --8<-- [start:flax_nnx_variable]
class CallCount(nnx.Variable):
    """A kind of state of its own: neither an ``nnx.Param`` nor an ``nnx.BatchStat``."""


class NNXCountingLinear(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 2, rngs=rngs)
        self.calls = CallCount(jnp.array(0))

    def __call__(self, x):
        self.calls[...] += 1
        return self.linear(x)


# --8<-- [end:flax_nnx_variable]


# --8<-- [start:flax_nnx_update]
def run_flax_nnx(x: jax.Array, y: jax.Array) -> Observed:
    model = NNXCountingLinear(rngs=nnx.Rngs(0))
    checkpoint = NNXCountingLinear(rngs=nnx.Rngs(1))
    expected = checkpoint(x)
    for _ in range(2):
        before_update = model(x)
    # Update in place: the checkpoint's nnx.Param values go into the model's variables; its
    # CallCount is not in the state written, so it is left alone.
    nnx.update(model, nnx.state(checkpoint, nnx.Param))
    after_update = model(x)
    # The gradient is taken with respect to nnx.Param (the default); the count still moves.
    grads = nnx.grad(lambda model: mse(model(x), y))(model)
    counts = nnx.state(model, CallCount)  # the class is the filter
    return observe(expected, before_update, after_update, model.calls[...], counts, grads)


# --8<-- [end:flax_nnx_update]
# --8<-- [end:flax_nnx]


# --8<-- [start:haiku]
# --8<-- [start:haiku_variable]
def haiku_counting_linear(x):
    # State, not a parameter: read with get_state, written with set_state.
    calls = hk.get_state("calls", (), jnp.int32, init=jnp.zeros)
    if not hk.running_init():
        hk.set_state("calls", calls + 1)
    return hk.Linear(2)(x)


# --8<-- [end:haiku_variable]


# --8<-- [start:haiku_update]
def run_haiku(x: jax.Array, y: jax.Array) -> Observed:
    model = hk.without_apply_rng(hk.transform_with_state(haiku_counting_linear))
    params, state = model.init(jax.random.key(0), x)  # state: {"~": {"calls": 0}}
    checkpoint, checkpoint_state = model.init(jax.random.key(1), x)
    expected, _ = model.apply(checkpoint, checkpoint_state, x)
    for _ in range(2):
        before_update, state = model.apply(params, state, x)
    # "Update": a new dict, the checkpoint's leaves merged over the model's.
    params = hk.data_structures.merge(params, checkpoint)
    after_update, state = model.apply(params, state, x)

    def loss(params, state):
        out, state = model.apply(params, state, x)
        return mse(out, y), state

    grads, state = jax.grad(loss, has_aux=True)(params, state)
    return observe(expected, before_update, after_update, state["~"]["calls"], state, grads)


# --8<-- [end:haiku_update]
# --8<-- [end:haiku]


# --8<-- [start:equinox]
# --8<-- [start:equinox_variable]
class EqxCountingLinear(eqx.Module):
    linear: eqx.nn.Linear
    calls: eqx.nn.StateIndex  # marks the state; its value lives in an eqx.nn.State

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(4, 2, key=key)
        self.calls = eqx.nn.StateIndex(jnp.array(0))

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        state = state.set(self.calls, state.get(self.calls) + 1)
        return jax.vmap(self.linear)(x), state


# --8<-- [end:equinox_variable]


# --8<-- [start:equinox_update]
def run_equinox(x: jax.Array, y: jax.Array) -> Observed:
    model, state = eqx.nn.make_with_state(EqxCountingLinear)(jax.random.key(0))
    checkpoint, checkpoint_state = eqx.nn.make_with_state(EqxCountingLinear)(jax.random.key(1))
    expected, _ = checkpoint(x, checkpoint_state)
    for _ in range(2):
        before_update, state = model(x, state)
    # "Update": a new model, the checkpoint's floating-point arrays in the model's structure.
    weights, _ = eqx.partition(checkpoint, eqx.is_inexact_array)
    _, rest = eqx.partition(model, eqx.is_inexact_array)
    model = eqx.combine(weights, rest)
    after_update, state = model(x, state)

    def loss(model, state):
        out, state = model(x, state)
        return mse(out, y), state

    grads, state = eqx.filter_grad(loss, has_aux=True)(model, state)  # the model's leaves only
    return observe(expected, before_update, after_update, state.get(model.calls), state, grads)


# --8<-- [end:equinox_update]
# --8<-- [end:equinox]


# --8<-- [start:keras]
# --8<-- [start:keras_variable]
class KerasCountingDense(keras.Layer):
    def __init__(self, seed: int, **kwargs):
        super().__init__(**kwargs)
        init = keras.initializers.GlorotUniform(seed=seed)
        self.dense = keras.layers.Dense(2, kernel_initializer=init)
        # Not trainable: no gradient and no optimiser touch it, like BatchNorm's moving statistics.
        self.calls = self.add_weight(
            shape=(), dtype="int32", initializer="zeros", trainable=False, name="calls"
        )

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, x):
        self.calls.assign_add(1)
        return self.dense(x)


# --8<-- [end:keras_variable]


# --8<-- [start:keras_update]
def run_keras(x: jax.Array, y: jax.Array) -> Observed:
    model, checkpoint = KerasCountingDense(seed=0), KerasCountingDense(seed=1)
    model.build(x.shape)
    checkpoint.build(x.shape)
    expected = checkpoint(x)
    for _ in range(2):
        before_update = model(x)  # a plain call assigns the count in place
    # Update in place, the trainable variables alone: set_weights would copy the count too.
    for variable, value in zip(
        model.trainable_variables, checkpoint.trainable_variables, strict=True
    ):
        variable.assign(value)
    after_update = model(x)
    # The gradient: stateless_call is a pure function of the variables' values, and returns the
    # non-trainable ones' new values, which are written back.
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(trainable, non_trainable):
        out, non_trainable = model.stateless_call(trainable, non_trainable, x)
        return mse(out, y), non_trainable

    grads, non_trainable = jax.grad(loss, has_aux=True)(trainable, non_trainable)
    for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
        variable.assign(value)
    counts = model.non_trainable_variables  # the count is the one non-trainable variable
    return observe(expected, before_update, after_update, model.calls.value, counts, grads)


# --8<-- [end:keras_update]
# --8<-- [end:keras]


RUNS = {
    "pure_jax": run_pure_jax,
    "flax_linen": run_flax_linen,
    "flax_nnx": run_flax_nnx,
    "haiku": run_haiku,
    "equinox": run_equinox,
    "keras": run_keras,
}


def example_inputs() -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(7))
    return jax.random.normal(kx, (16, 4)), jax.random.normal(ky, (16, 2))


def main() -> None:
    x, y = example_inputs()
    for name, run in RUNS.items():
        seen = run(x, y)
        loaded = bool(jnp.allclose(seen.after_update, seen.expected, atol=1e-6))
        print(
            f"{name:>10}: output is the checkpoint's after the update: {loaded}; "
            f"{seen.calls} calls counted ({seen.count_leaves} leaf of counting state); "
            f"gradient leaves of sizes {seen.grad_sizes}"
        )


if __name__ == "__main__":
    main()
