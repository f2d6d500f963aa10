"""Inspecting a model: its parameters as a table, their count, and a readable printout.

The same network in each framework, ``Linear(4, 8) -> ReLU -> Linear(8, 2)``: 4 * 8 + 8 + 8 * 2 + 2
= 58 parameters. Each ``run_*`` function returns the count, computed the framework's way, and the
summary the framework prints:

- Flax NNX: ``nnx.tabulate(model, x)`` (a table of every submodule's inputs, outputs and
  parameters) and ``nnx.display(model)`` (Treescope in a notebook, ``print`` elsewhere); the count
  is over ``nnx.state(model, nnx.Param)``;
- Flax Linen: ``model.tabulate(key, x)`` (the same table; it runs ``init`` to find the shapes);
- Haiku: ``hk.experimental.tabulate(transformed)(x)``, and ``hk.data_structures.tree_size``;
- Equinox: ``eqx.tree_pformat(model)``: the model is a pytree and prints as one; the count is over
  ``eqx.filter(model, eqx.is_array)``;
- Keras 3: ``model.summary()`` (a table of layers, output shapes and parameter counts, split into
  trainable and not) and ``model.count_params()``; the summary shows no weight shapes, so a line
  per variable (``v.path``, ``v.shape``) is added;
- pure JAX: the parameters are a pytree: ``jax.tree_util.tree_flatten_with_path`` gives a line per
  leaf.

Run it: ``python -m examples.tour.inspect_model``.
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

PARAMETERS = 4 * 8 + 8 + 8 * 2 + 2
PLAIN = {"force_terminal": False, "no_color": True, "width": 100}  # rich's console: no colours


class Observed(NamedTuple):
    count: int  # the number of parameters, counted the framework's way
    summary: str  # what the framework prints for the model


# --8<-- [start:pure_jax]
def run_pure_jax(x: jax.Array) -> Observed:
    k1, k2 = jax.random.split(jax.random.key(0))
    init = jax.nn.initializers.lecun_normal()
    params = {
        "hidden": {"kernel": init(k1, (4, 8)), "bias": jnp.zeros(8)},
        "out": {"kernel": init(k2, (8, 2)), "bias": jnp.zeros(2)},
    }
    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    lines = [
        f"{jax.tree_util.keystr(path)}: {leaf.dtype}{list(leaf.shape)}" for path, leaf in leaves
    ]
    count = sum(leaf.size for _, leaf in leaves)
    return Observed(count, "\n".join(lines))


# --8<-- [end:pure_jax]


# --8<-- [start:flax_linen]
class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(8, name="hidden")(x))
        return nn.Dense(2, name="out")(h)


def run_flax_linen(x: jax.Array) -> Observed:
    model = LinenMLP()
    table = model.tabulate(jax.random.key(0), x, console_kwargs=PLAIN)  # runs init to get shapes
    params = model.init(jax.random.key(0), x)["params"]
    count = sum(leaf.size for leaf in jax.tree.leaves(params))
    return Observed(count, table)


# --8<-- [end:flax_linen]


# --8<-- [start:flax_nnx]
class NNXMLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def run_flax_nnx(x: jax.Array) -> Observed:
    model = NNXMLP(rngs=nnx.Rngs(0))
    nnx.display(model)  # Treescope's interactive view in a notebook; print(model) elsewhere
    table = nnx.tabulate(model, x, console_kwargs=PLAIN)  # calls the model on x, records shapes
    count = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return Observed(count, table)


# --8<-- [end:flax_nnx]


# --8<-- [start:haiku]
def haiku_mlp(x):
    h = jax.nn.relu(hk.Linear(8, name="hidden")(x))
    return hk.Linear(2, name="out")(h)


def run_haiku(x: jax.Array) -> Observed:
    model = hk.without_apply_rng(hk.transform(haiku_mlp))
    table = hk.experimental.tabulate(model)(x)  # traces the function on x's shape
    params = model.init(jax.random.key(0), x)
    return Observed(hk.data_structures.tree_size(params), table)


# --8<-- [end:haiku]


# --8<-- [start:equinox]
class EqxMLP(eqx.Module):
    hidden: eqx.nn.Linear
    out: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(4, 8, key=k1)
        self.out = eqx.nn.Linear(8, 2, key=k2)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


def run_equinox(x: jax.Array) -> Observed:
    model = EqxMLP(jax.random.key(0))
    text = eqx.tree_pformat(model)  # arrays shown as f32[8,4]; short_arrays=False prints values
    count = sum(leaf.size for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    return Observed(count, text)


# --8<-- [end:equinox]


# --8<-- [start:keras]
def run_keras(x: jax.Array) -> Observed:
    model = keras.Sequential(
        [
            keras.Input(x.shape[1:]),  # with the input's shape the model is built at once
            keras.layers.Dense(8, activation="relu", name="hidden"),
            keras.layers.Dense(2, name="out"),
        ],
        name="mlp",
    )
    lines = []
    model.summary(print_fn=lines.append)  # a print_fn gets the table as plain text, no colours
    lines += [f"{v.path}: {v.dtype}{v.shape}" for v in model.weights]  # mlp/hidden/kernel: ...
    return Observed(model.count_params(), "\n".join(lines))


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
    return jnp.ones((1, 4))


def main() -> None:
    x = example_inputs()
    for name, run in RUNS.items():
        seen = run(x)
        print(f"--- {name}: {seen.count} parameters (expected {PARAMETERS}) ---")
        print(seen.summary)


if __name__ == "__main__":
    main()
