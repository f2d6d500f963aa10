"""Model surgery: replace a layer (a trained one, in practice; freshly initialised here) by a LoRA
layer around it, then train only the adapter.

The same two-layer network in each framework, ``Linear(4, 8) -> ReLU -> Linear(8, 2)``. Its first
layer becomes ``x @ (W + A @ B) + b`` with ``A: [4, 2]`` drawn at random and ``B: [2, 8]`` zero,
so the output is unchanged until the adapter is trained; then one SGD step on the adapter alone
moves the output and leaves ``W`` as it was. How the layer is replaced is where the frameworks
differ:

- Flax NNX: in place, ``model.hidden = nnx.LoRA(..., base_module=model.hidden)``: a module is an
  object, its attribute can be reassigned; ``nnx.Optimizer(..., wrt=nnx.LoRAParam)`` trains only
  the adapter's variables;
- Flax Linen and Haiku: the module only describes the computation, so the description changes
  (another layer class) and the parameter tree is edited to match: the old leaves are kept, the
  new ones added (Linen: a dict merge, freezing with ``optax.multi_transform``; Haiku:
  ``hk.data_structures.merge`` and ``partition``);
- Equinox: ``eqx.tree_at`` returns a new model with the layer replaced (modules are immutable
  pytrees); a filter spec picks the leaves to differentiate;
- Keras 3: nothing is replaced: ``Dense.enable_lora(rank)`` adds ``lora_kernel_a`` (He-uniform)
  and ``lora_kernel_b`` (zeros) to the built layer in place and marks its kernel non-trainable; the
  other variables are frozen with ``trainable = False``, and ``compile`` + ``train_on_batch`` takes
  one step on what is left trainable. Replacing a layer by another class would mean rebuilding the
  model (``keras.models.clone_model(..., clone_function=...)``);
- pure JAX: a dict edit, and a forward function that knows what a LoRA layer's dict holds.

Run it: ``python -m examples.tour.surgery``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import haiku as hk
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx, traverse_util

# Keras 3 picks its backend once, at its first import: JAX here (another one set is an error).
os.environ.setdefault("KERAS_BACKEND", "jax")
import keras

if keras.config.backend() != "jax":
    raise ImportError(f"the tour runs Keras on JAX, not on {keras.config.backend()!r}")

RANK = 2
LEARNING_RATE = 0.1


class Observed(NamedTuple):
    before: jax.Array  # the output before surgery
    after_surgery: jax.Array  # ... right after it (equal: B starts at zero)
    after_step: jax.Array  # ... after one SGD step on the adapter alone
    kernel_before: jax.Array  # the replaced layer's original kernel
    kernel_after: jax.Array  # ... after the step (unchanged: frozen)
    adapter_shapes: tuple[tuple[int, ...], ...]  # the shapes of A and B (in the framework's layout)


def mse(prediction: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.mean((prediction - target) ** 2)


# --8<-- [start:pure_jax]
def pure_jax_dense(layer: dict, x: jax.Array) -> jax.Array:
    kernel = layer["kernel"]
    if "lora_a" in layer:  # the forward pass has to know every kind of layer dict it may meet
        kernel = kernel + layer["lora_a"] @ layer["lora_b"]
    return x @ kernel + layer["bias"]


def pure_jax_mlp(params: dict, x: jax.Array) -> jax.Array:
    return pure_jax_dense(params["out"], jax.nn.relu(pure_jax_dense(params["hidden"], x)))


def run_pure_jax(x: jax.Array, y: jax.Array) -> Observed:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    dense = lambda k, n_in, n_out: {
        "kernel": jax.nn.initializers.lecun_normal()(k, (n_in, n_out)),
        "bias": jnp.zeros(n_out),
    }
    params = {"hidden": dense(k1, 4, 8), "out": dense(k2, 8, 2)}
    before = pure_jax_mlp(params, x)
    # Surgery: a new dict for the layer, the old leaves plus the adapter's.
    adapter = {"lora_a": jax.random.normal(k3, (4, RANK)) / RANK, "lora_b": jnp.zeros((RANK, 8))}
    params = {**params, "hidden": {**params["hidden"], **adapter}}
    after_surgery = pure_jax_mlp(params, x)

    def loss(adapter, params):
        merged = {**params, "hidden": {**params["hidden"], **adapter}}
        return mse(pure_jax_mlp(merged, x), y)

    grads = jax.grad(loss)(adapter, params)  # with respect to the adapter only
    adapter = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, adapter, grads)
    params = {**params, "hidden": {**params["hidden"], **adapter}}
    return Observed(
        before, after_surgery, pure_jax_mlp(params, x), dense(k1, 4, 8)["kernel"],
        params["hidden"]["kernel"], (adapter["lora_a"].shape, adapter["lora_b"].shape),
    )  # fmt: skip


# --8<-- [end:pure_jax]


# --8<-- [start:flax_linen]
class LoRADense(nn.Module):
    """``nn.Dense``'s parameters (same names) plus a low-rank update ``lora_a @ lora_b``."""

    features: int
    rank: int = RANK

    @nn.compact
    def __call__(self, x):
        n_in = x.shape[-1]
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (n_in, self.features))
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,))
        a = self.param("lora_a", nn.initializers.normal(1 / self.rank), (n_in, self.rank))
        b = self.param("lora_b", nn.initializers.zeros_init(), (self.rank, self.features))
        return x @ (kernel + a @ b) + bias


class LinenMLP(nn.Module):
    hidden_layer: Callable[..., nn.Module] = nn.Dense  # which layer class: part of the description

    @nn.compact
    def __call__(self, x):
        h = nn.relu(self.hidden_layer(8, name="hidden")(x))
        return nn.Dense(2, name="out")(h)


def run_flax_linen(x: jax.Array, y: jax.Array) -> Observed:
    model = LinenMLP()
    params = model.init(jax.random.key(0), x)["params"]
    before = model.apply({"params": params}, x)
    # Surgery: a new description, then its parameter tree with the old leaves put back.
    lora_model = model.clone(hidden_layer=LoRADense)
    fresh = lora_model.init(jax.random.key(1), x)["params"]
    lora_params = {**fresh, "hidden": {**fresh["hidden"], **params["hidden"]}, "out": params["out"]}
    after_surgery = lora_model.apply({"params": lora_params}, x)
    # Freeze everything but the adapter: label every leaf, zero the updates of the frozen ones.
    labels = traverse_util.path_aware_map(
        lambda path, _: "train" if path[-1].startswith("lora") else "freeze", lora_params
    )
    tx = optax.multi_transform(
        {"train": optax.sgd(LEARNING_RATE), "freeze": optax.set_to_zero()}, labels
    )
    loss = lambda p: mse(lora_model.apply({"params": p}, x), y)
    updates, _ = tx.update(jax.grad(loss)(lora_params), tx.init(lora_params), lora_params)
    lora_params = optax.apply_updates(lora_params, updates)
    hidden = lora_params["hidden"]
    return Observed(
        before, after_surgery, lora_model.apply({"params": lora_params}, x),
        params["hidden"]["kernel"], hidden["kernel"],
        (hidden["lora_a"].shape, hidden["lora_b"].shape),
    )  # fmt: skip


# --8<-- [end:flax_linen]


# --8<-- [start:flax_nnx]
class NNXMLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def run_flax_nnx(x: jax.Array, y: jax.Array) -> Observed:
    model = NNXMLP(rngs=nnx.Rngs(0))
    before = model(x)
    kernel_before = model.hidden.kernel[...]
    # Surgery, in place: the attribute now holds a LoRA layer that wraps the old one.
    model.hidden = nnx.LoRA(4, RANK, 8, base_module=model.hidden, rngs=nnx.Rngs(1))
    after_surgery = model(x)
    # Only the adapter's variables (nnx.LoRAParam) are differentiated and updated.
    optimizer = nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.LoRAParam)
    loss = lambda model: mse(model(x), y)
    grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
    optimizer.update(model, grads)
    return Observed(
        before, after_surgery, model(x), kernel_before, model.hidden.base_module.kernel[...],
        (model.hidden.lora_a.shape, model.hidden.lora_b.shape),
    )  # fmt: skip


# --8<-- [end:flax_nnx]


# --8<-- [start:haiku]
class LoRALinear(hk.Module):
    """``hk.Linear``'s parameters (same names) plus a low-rank update ``lora_a @ lora_b``."""

    def __init__(self, output_size: int, rank: int = RANK, name: str | None = None):
        super().__init__(name=name)
        self.output_size, self.rank = output_size, rank

    def __call__(self, x):
        n_in = x.shape[-1]
        w = hk.get_parameter("w", (n_in, self.output_size), init=hk.initializers.VarianceScaling())
        b = hk.get_parameter("b", (self.output_size,), init=jnp.zeros)
        a_init = hk.initializers.RandomNormal(1 / self.rank)
        a = hk.get_parameter("lora_a", (n_in, self.rank), init=a_init)
        lora_b = hk.get_parameter("lora_b", (self.rank, self.output_size), init=jnp.zeros)
        return x @ (w + a @ lora_b) + b


def haiku_mlp(x, hidden_layer=hk.Linear):
    h = jax.nn.relu(hidden_layer(8, name="hidden")(x))
    return hk.Linear(2, name="out")(h)


def run_haiku(x: jax.Array, y: jax.Array) -> Observed:
    model = hk.without_apply_rng(hk.transform(haiku_mlp))
    params = model.init(jax.random.key(0), x)  # {"hidden": {"w", "b"}, "out": {"w", "b"}}
    before = model.apply(params, x)
    # Surgery: another function, and its parameters with the old leaves merged over the new.
    lora_model = hk.without_apply_rng(hk.transform(lambda x: haiku_mlp(x, LoRALinear)))
    lora_params = hk.data_structures.merge(lora_model.init(jax.random.key(1), x), params)
    after_surgery = lora_model.apply(lora_params, x)
    # Split the adapter from the rest; differentiate with respect to the adapter alone.
    adapter, frozen = hk.data_structures.partition(
        lambda module, name, value: name.startswith("lora"), lora_params
    )
    loss = lambda adapter: mse(lora_model.apply(hk.data_structures.merge(frozen, adapter), x), y)
    grads = jax.grad(loss)(adapter)
    adapter = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, adapter, grads)
    lora_params = hk.data_structures.merge(frozen, adapter)
    hidden = lora_params["hidden"]
    return Observed(
        before, after_surgery, lora_model.apply(lora_params, x), params["hidden"]["w"],
        hidden["w"], (hidden["lora_a"].shape, hidden["lora_b"].shape),
    )  # fmt: skip


# --8<-- [end:haiku]


# --8<-- [start:equinox]
class EqxLoRALinear(eqx.Module):
    """A linear layer plus a low-rank update; Equinox's layout: ``a: [rank, in]``, ``b: [out,
    rank]``."""

    base: eqx.nn.Linear
    a: jax.Array
    b: jax.Array

    def __init__(self, base: eqx.nn.Linear, rank: int = RANK, *, key: jax.Array):
        self.base = base
        self.a = jax.random.normal(key, (rank, base.in_features)) / rank
        self.b = jnp.zeros((base.out_features, rank))

    def __call__(self, x):
        return self.base(x) + self.b @ (self.a @ x)


class EqxMLP(eqx.Module):
    hidden: eqx.Module
    out: eqx.nn.Linear

    def __init__(self, key: jax.Array):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(4, 8, key=k1)
        self.out = eqx.nn.Linear(8, 2, key=k2)

    def __call__(self, x):  # one example; jax.vmap maps it over a batch
        return self.out(jax.nn.relu(self.hidden(x)))


def run_equinox(x: jax.Array, y: jax.Array) -> Observed:
    model = EqxMLP(jax.random.key(0))
    before = jax.vmap(model)(x)
    # Surgery: tree_at returns a new model with that one node replaced.
    lora = EqxLoRALinear(model.hidden, key=jax.random.key(1))
    model = eqx.tree_at(lambda m: m.hidden, model, lora)
    after_surgery = jax.vmap(model)(x)
    # A filter spec: True on the leaves to train, False elsewhere; partition splits the model.
    spec = jax.tree.map(lambda _: False, model)
    spec = eqx.tree_at(lambda m: (m.hidden.a, m.hidden.b), spec, replace=(True, True))
    trainable, frozen = eqx.partition(model, spec)
    loss = lambda trainable: mse(jax.vmap(eqx.combine(trainable, frozen))(x), y)
    grads = eqx.filter_grad(loss)(trainable)
    trainable = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, trainable, grads)
    model = eqx.combine(trainable, frozen)
    return Observed(
        before, after_surgery, jax.vmap(model)(x), lora.base.weight, model.hidden.base.weight,
        (model.hidden.a.shape, model.hidden.b.shape),
    )  # fmt: skip


# --8<-- [end:equinox]


# --8<-- [start:keras]
def run_keras(x: jax.Array, y: jax.Array) -> Observed:
    init = lambda seed: keras.initializers.GlorotUniform(seed=seed)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu", kernel_initializer=init(0), name="hidden"),
            keras.layers.Dense(2, kernel_initializer=init(1), name="out"),
        ]
    )
    before = model(x)
    hidden = model.get_layer("hidden")
    # The variable itself: once LoRA is on, the property hidden.kernel returns W + A @ B.
    kernel = next(v for v in hidden.weights if v.name == "kernel")
    kernel_before = keras.ops.copy(kernel.value)  # Keras donates the old buffers to its train step
    # Surgery, in place: lora_kernel_a [4, 2] (He-uniform) and lora_kernel_b [2, 8] (zeros) join
    # the layer, and its kernel becomes non-trainable.
    hidden.enable_lora(RANK)
    after_surgery = model(x)
    # enable_lora freezes the kernel alone: freeze the bias and the other layer as well.
    hidden.bias.trainable = False
    model.get_layer("out").trainable = False
    # One SGD step; fit and train_on_batch update model.trainable_variables, the adapter alone.
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss="mse")
    model.train_on_batch(x, y)
    return Observed(
        before, after_surgery, model(x), kernel_before, kernel.value,
        (hidden.lora_kernel_a.shape, hidden.lora_kernel_b.shape),
    )  # fmt: skip


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
        same = bool(jnp.allclose(seen.before, seen.after_surgery, atol=1e-6))
        frozen = bool(jnp.array_equal(seen.kernel_before, seen.kernel_after))
        moved = float(jnp.abs(seen.after_step - seen.before).max())
        print(
            f"{name:>10}: output unchanged by surgery: {same}; adapter {seen.adapter_shapes}; "
            f"one step moved the output by up to {moved:.4f}, base kernel untouched: {frozen}"
        )


if __name__ == "__main__":
    main()
