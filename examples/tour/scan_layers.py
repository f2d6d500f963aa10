"""Scan over layers: a stack of identical blocks held as one set of stacked parameters.

``LAYERS`` blocks ``x -> tanh(x @ W + b)`` of width 8, each with its own parameters, stored with a
leading layer axis (every kernel leaf is ``[LAYERS, 8, 8]``) and applied by one ``scan``: XLA
compiles the block once instead of once per layer, which is what keeps compile times flat for deep
stacks. Each ``run_*`` function checks the scan against a plain Python loop over the layers'
slices of the same parameters. How the stack is made and scanned:

- Flax NNX: ``nnx.vmap`` over a constructor (with ``nnx.split_rngs`` so every layer draws its own
  keys) builds one module whose variables are stacked; ``nnx.scan`` with ``nnx.Carry`` runs it;
- Flax Linen: ``nn.scan`` lifts the block class, with ``variable_axes={"params": 0}`` (stack the
  parameters) and ``split_rngs={"params": True}`` (a key per layer);
- Haiku: ``hk.layer_stack(LAYERS)`` around a function of ``x``; the parameters get a leading axis;
- Equinox: ``eqx.filter_vmap`` over the constructor stacks the layers' arrays, and ``jax.lax.scan``
  runs over the array part while ``eqx.combine`` puts the static part back in every iteration;
- Keras 3: no lifted scan or vmap over layers, and no layer that stacks its sublayers' weights.
  Here ``LAYERS`` Dense layers are built, each with its own seed, their weights' values stacked
  with ``keras.ops.stack``, and ``keras.ops.scan`` (``jax.lax.scan`` on this backend) calls one
  layer's ``stateless_call`` with each layer's slice. The stacked values live outside any layer: to
  train them, a custom layer would hold them (``add_weight`` with the layer axis) and scan in
  ``call``;
- pure JAX: ``jax.vmap`` over an init function, ``jax.lax.scan`` over the stacked dict.

Run it: ``python -m examples.tour.scan_layers``.
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

LAYERS = 3
WIDTH = 8


class Observed(NamedTuple):
    scanned: jax.Array  # the stack applied by scan
    looped: jax.Array  # the same parameters applied one layer at a time in Python
    leading: set[int]  # the leading dimension of every parameter leaf
    distinct: bool  # whether the layers' kernels differ (each layer drew its own keys)


def slice_layer(tree, i: int):
    """Layer ``i``'s parameters: index every stacked leaf."""
    return jax.tree.map(lambda a: a[i], tree)


def observe(scanned, looped, stacked_kernels, leaves) -> Observed:
    distinct = not bool(jnp.allclose(stacked_kernels[0], stacked_kernels[1]))
    return Observed(scanned, looped, {leaf.shape[0] for leaf in leaves}, distinct)


# --8<-- [start:pure_jax]
def pure_jax_block_init(key: jax.Array) -> dict:
    kernel = jax.nn.initializers.lecun_normal()(key, (WIDTH, WIDTH))
    return {"kernel": kernel, "bias": jnp.zeros(WIDTH)}


def pure_jax_block(layer: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ layer["kernel"] + layer["bias"])


def run_pure_jax(x: jax.Array) -> Observed:
    keys = jax.random.split(jax.random.key(0), LAYERS)
    stack = jax.vmap(pure_jax_block_init)(keys)  # {"kernel": [L, 8, 8], "bias": [L, 8]}
    step = lambda h, layer: (pure_jax_block(layer, h), None)
    scanned, _ = jax.lax.scan(step, x, stack)
    looped = x
    for i in range(LAYERS):
        looped = pure_jax_block(slice_layer(stack, i), looped)
    return observe(scanned, looped, stack["kernel"], jax.tree.leaves(stack))


# --8<-- [end:pure_jax]


# --8<-- [start:flax_linen]
class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x, _):  # nn.scan's body: (carry, per-layer input) -> (carry, output)
        return jnp.tanh(nn.Dense(WIDTH)(x)), None


# One module whose parameters have a leading layer axis; each layer initialised with its own key.
LinenStack = nn.scan(
    LinenBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=LAYERS
)


def run_flax_linen(x: jax.Array) -> Observed:
    stack = LinenStack()
    params = stack.init(jax.random.key(0), x, None)["params"]  # {"Dense_0": {"kernel": [L, 8, 8]}}
    scanned, _ = stack.apply({"params": params}, x, None)
    looped = x
    for i in range(LAYERS):
        looped, _ = LinenBlock().apply({"params": slice_layer(params, i)}, looped, None)
    return observe(scanned, looped, params["Dense_0"]["kernel"], jax.tree.leaves(params))


# --8<-- [end:flax_linen]


# --8<-- [start:flax_nnx]
class NNXBlock(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.linear(x))


@nnx.split_rngs(splits=LAYERS)  # LAYERS keys from the Rngs, one per layer
@nnx.vmap(in_axes=(0,), out_axes=0)  # ... and one constructor call per key: stacked variables
def nnx_stack(rngs: nnx.Rngs) -> NNXBlock:
    return NNXBlock(rngs=rngs)


@nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)  # x is carried, the stack is scanned
def nnx_forward(x, block: NNXBlock):
    return block(x)


def run_flax_nnx(x: jax.Array) -> Observed:
    stack = nnx_stack(nnx.Rngs(0))  # stack.linear.kernel: [L, 8, 8]
    scanned = nnx_forward(x, stack)
    graphdef, params = nnx.split(stack)
    looped = x
    for i in range(LAYERS):
        looped = nnx.merge(graphdef, slice_layer(params, i))(looped)
    leaves = jax.tree.leaves(nnx.state(stack, nnx.Param))
    return observe(scanned, looped, stack.linear.kernel[...], leaves)


# --8<-- [end:flax_nnx]


# --8<-- [start:haiku]
def haiku_block(x):
    return jnp.tanh(hk.Linear(WIDTH, name="linear")(x))


haiku_stack = hk.without_apply_rng(hk.transform(lambda x: hk.layer_stack(LAYERS)(haiku_block)(x)))
haiku_one = hk.without_apply_rng(hk.transform(haiku_block))  # a single block, for the loop


def run_haiku(x: jax.Array) -> Observed:
    params = haiku_stack.init(jax.random.key(0), x)
    # {"__layer_stack_no_per_layer/linear": {"w": [L, 8, 8], "b": [L, 8]}}
    (stacked,) = params.values()
    scanned = haiku_stack.apply(params, x)
    looped = x
    for i in range(LAYERS):
        looped = haiku_one.apply({"linear": slice_layer(stacked, i)}, looped)
    return observe(scanned, looped, stacked["w"], jax.tree.leaves(params))


# --8<-- [end:haiku]


# --8<-- [start:equinox]
class EqxBlock(eqx.Module):
    linear: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        self.linear = eqx.nn.Linear(WIDTH, WIDTH, key=key)

    def __call__(self, x):  # one example
        return jnp.tanh(self.linear(x))


def run_equinox(x: jax.Array) -> Observed:
    keys = jax.random.split(jax.random.key(0), LAYERS)
    stack = eqx.filter_vmap(EqxBlock)(keys)  # one EqxBlock whose arrays have a leading axis
    arrays, static = eqx.partition(stack, eqx.is_array)

    def step(h, layer_arrays):
        block = eqx.combine(layer_arrays, static)  # this layer's arrays + the shared static part
        return jax.vmap(block)(h), None

    scanned, _ = jax.lax.scan(step, x, arrays)
    looped = x
    for i in range(LAYERS):
        looped = jax.vmap(eqx.combine(slice_layer(arrays, i), static))(looped)
    return observe(scanned, looped, stack.linear.weight, jax.tree.leaves(arrays))


# --8<-- [end:equinox]


# --8<-- [start:keras]
def run_keras(x: jax.Array) -> Observed:
    init = lambda seed: keras.initializers.GlorotUniform(seed=seed)
    layers = [
        keras.layers.Dense(WIDTH, activation="tanh", kernel_initializer=init(i))
        for i in range(LAYERS)
    ]
    for layer in layers:
        layer.build((None, WIDTH))
    # The layers' weight values, stacked by hand: [kernel [L, 8, 8], bias [L, 8]].
    per_layer = [[v.value for v in layer.trainable_variables] for layer in layers]
    stack = [keras.ops.stack(values) for values in zip(*per_layer, strict=True)]
    block = layers[0]  # any of them: the function; scan hands it each layer's weights in turn

    def step(h, weights):
        out, _ = block.stateless_call(weights, [], h)  # these values instead of its own variables
        return out, None

    scanned, _ = keras.ops.scan(step, x, stack)
    looped = x
    for layer in layers:  # the layers themselves, each with its own variables
        looped = layer(looped)
    return observe(scanned, looped, stack[0], stack)


# --8<-- [end:keras]


RUNS = {
    "pure_jax": run_pure_jax,
    "flax_linen": run_flax_linen,
    "flax_nnx": run_flax_nnx,
    "haiku": run_haiku,
    "equinox": run_equinox,
    "keras": run_keras,
}


def example_inputs() -> jax.Array:
    return jax.random.normal(jax.random.key(3), (5, WIDTH))


def main() -> None:
    x = example_inputs()
    for name, run in RUNS.items():
        seen = run(x)
        same = bool(jnp.allclose(seen.scanned, seen.looped, atol=1e-6))
        print(
            f"{name:>10}: every parameter leaf has leading axis {sorted(seen.leading)}; layers "
            f"differ: {seen.distinct}; scan equals the Python loop: {same}"
        )


if __name__ == "__main__":
    main()
