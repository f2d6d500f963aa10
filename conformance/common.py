"""What the conformance checks share: a small model, inputs, and parameters drawn by the suite;
fresh copies of them for every check; the spec's optimiser; and one compiled probe of an
implementation's forward pass, loss, gradient and step.

Everything here comes from the spec alone, never from an implementation. Failures are worded by
:mod:`cvae_rosetta.conformance.messages` and raised by :mod:`cvae_rosetta.conformance.assertions`,
which also holds :func:`~cvae_rosetta.conformance.assertions.require`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae_rosetta.conformance.strategies import params_from_seed
from cvae_rosetta.spec.config import Config, ModelConfig, OptimConfig
from cvae_rosetta.spec.validation import Batch

# A small model of the bundled digits' shape: 64 pixels, 10 labels.
MODEL = ModelConfig(
    input_dim=64, num_classes=10, latent_dim=8, encoder_dims=(32, 16), decoder_dims=(16, 32)
)
CONFIG = Config(model=MODEL)
B = 12

# float32 against float64: relative error of sums of O(100) products is ~1e-6; leave headroom.
RTOL, ATOL = 2e-5, 1e-5


def digits(batch_size: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray, Batch]:
    """Real handwritten digits for the checks that train: scikit-learn's bundled 8x8 digits scaled
    from 0..16 to [0, 1], the first 1500 shuffled (by ``seed``) into full batches
    ``xs: [n, B, 64]``, ``cs: [n, B]``, and the other 297 as one test batch. The suite reads them
    itself, so it needs nothing of the application's data loading."""
    from sklearn.datasets import load_digits

    x, c = load_digits(return_X_y=True)
    x, c = (x / 16.0).astype(np.float32), c.astype(np.int32)
    train, test = slice(0, 1500), slice(1500, None)
    order = np.random.default_rng(seed).permutation(1500)
    n = 1500 // batch_size
    xs = x[train][order][: n * batch_size].reshape(n, batch_size, -1)
    cs = c[train][order][: n * batch_size].reshape(n, batch_size)
    return xs, cs, Batch(jnp.asarray(x[test]), jnp.asarray(c[test]))


def key_bits(key: jax.Array) -> tuple[int, ...]:
    """A PRNG key's bits, as the seed of a NumPy generator."""
    return tuple(int(word) for word in np.asarray(jax.random.key_data(key)).ravel())


def reference_params(key: jax.Array, model: ModelConfig = MODEL) -> dict:
    """Canonical parameters drawn by the suite itself (never by an implementation): kernels
    ``normal / sqrt(fan_in)``, nonzero biases ``0.1 * normal`` (so a converter that drops or
    misplaces them is caught), drawn with NumPy from the key's bits (in JAX, every new leaf shape
    would compile a sampler)."""
    return params_from_seed(key_bits(key), model)


def make_batch(key: jax.Array, b: int = B, model: ModelConfig = MODEL) -> Batch:
    """Uniform pixels with exact 0 and 1 among them, and uniform labels, drawn with NumPy from the
    key's bits."""
    rng = np.random.default_rng(key_bits(key))
    x = rng.random((b, model.input_dim), dtype=np.float32)
    x[0, :3] = [0.0, 1.0, 0.5]  # exact 0 and 1 pixels
    c = rng.integers(0, model.num_classes, b, dtype=np.int32)
    return Batch(jnp.asarray(x), jnp.asarray(c))


def spec_noise(key: jax.Array, b: int, latent: int) -> np.ndarray:
    """SPEC section 3: the noise of a step."""
    return np.asarray(jax.random.normal(key, (b, latent)))


def at_path(tree, path):
    """The leaf of ``tree`` at a ``jax.tree_util`` key path."""
    for entry in path:
        tree = tree[getattr(entry, "key", getattr(entry, "idx", None))]
    return tree


SPEC_EPS = 1e-8  # Adam's epsilon, added to the bias-corrected root sqrt(v_hat)
B2 = 0.999


def spec_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    """SPEC section 5 at the constant rate, built here from the config's fields (not from the
    shared code)."""
    return _spec_chain(optim.learning_rate, optim.clip_norm, optim.weight_decay)


def _spec_chain(learning_rate, clip_norm, weight_decay, eps=SPEC_EPS):
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(learning_rate, b1=0.9, b2=B2, eps=eps, weight_decay=weight_decay),
    )


class _Settings(NamedTuple):
    """The settings of the spec's optimiser, as the traced values of :func:`_spec_step`."""

    learning_rate: Any
    clip_norm: Any
    weight_decay: Any
    eps: Any


@jax.jit
def _spec_step(params, grads, opt_state, settings: _Settings):
    # the settings are traced values (optax takes them so): one compilation serves every setting
    tx = _spec_chain(*settings)
    opt_state = tx.init(params) if opt_state is None else opt_state
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def spec_step(optim: OptimConfig, params, grads, opt_state=None, *, eps: float = SPEC_EPS):
    """One step of the spec's optimiser at the constant rate on ``params`` with the gradients
    ``grads``, from ``opt_state`` (a fresh state when ``None``): the new parameters and the
    optimiser state. Compiled once for every setting (op by op, optax would compile every small
    operation for every leaf shape). ``eps``: another epsilon, for a mistake's step."""
    settings = (optim.learning_rate, optim.clip_norm, optim.weight_decay, eps)
    return _spec_step(params, grads, opt_state, _Settings(*(np.float32(v) for v in settings)))


# --- arrays of its own ----------------------------------------------------------------------------
# An implementation may keep, donate or delete what it is given (a ``from_canonical`` that keeps
# the caller's arrays lets a donated step delete them). Every check therefore gets arrays of its
# own: the drawn values are kept here and never handed out; each call returns new buffers.


def fresh(tree: Any) -> Any:
    """``tree`` with every array leaf in a new buffer of its own (PRNG keys included)."""

    def copy(leaf):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jnp.array(jax.random.key_data(leaf), copy=True)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        if isinstance(leaf, (jax.Array, np.ndarray)):
            return jnp.array(leaf, copy=True)
        return leaf

    return jax.tree.map(copy, tree)


@functools.cache
def _drawn_params(seed: int, model: ModelConfig) -> dict:
    return reference_params(jax.random.key(seed), model)


@functools.cache
def _drawn_batch(seed: int, b: int, model: ModelConfig) -> Batch:
    return make_batch(jax.random.key(seed), b, model)


def suite_params(seed: int = 42, model: ModelConfig = MODEL) -> dict:
    """``reference_params(key(seed), model)``, in new buffers on every call."""
    return fresh(_drawn_params(seed, model))


def suite_batch(seed: int = 7, b: int = B, model: ModelConfig = MODEL) -> Batch:
    """``make_batch(key(seed), b, model)``, in new buffers on every call."""
    return fresh(_drawn_batch(seed, b, model))


def copy_to_host(tree: Any) -> Any:
    """``tree`` as NumPy arrays of their own (never views of a device buffer): what the caller
    held, to compare with after the implementation had its arrays."""
    return jax.tree.map(lambda leaf: np.array(leaf, copy=True), tree)


@pytest.fixture
def params():
    """The suite's canonical parameters, in buffers of this check's own (see ``common.fresh``):
    a fixture of every layer that checks the spec's numbers, each module taking it as
    ``params = common.params``."""
    return suite_params(42)


@pytest.fixture
def batch():
    """The suite's batch of 12 examples (seed 7), the fixture beside :func:`params`."""
    return suite_batch(7)


def as32(tree):
    return jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), tree)


class Probe(NamedTuple):
    """Everything an implementation computes from canonical parameters, in one compiled program."""

    mean: jax.Array
    logvar: jax.Array
    logits: jax.Array  # decode of the given latents
    loss: jax.Array
    metrics: dict
    grads: Any  # d loss / d canonical parameters, through from_canonical
    stepped_state: Any  # the state after one train_step from the parameters
    stepped: Any  # its canonical parameters
    step_metrics: dict


def _probe(impl, params, batch: Batch, z, key, config: Config) -> Probe:
    state = impl.from_canonical(params, config)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    logits = impl.decode(state, z, batch.c)

    def loss_of(p):
        return impl.loss(impl.from_canonical(p, config), batch, key)

    (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    stepped, step_metrics = impl.train_step(impl.from_canonical(params, config), batch, key)
    canonical = impl.to_canonical(stepped)
    return Probe(mean, logvar, logits, loss, metrics, grads, stepped, canonical, step_metrics)


@functools.cache
def probe(impl) -> Callable[..., Probe]:
    """``probe(impl)(params, batch, z, key, config=...)``: the forward pass, the loss, its
    gradient and one step, jitted (``config`` static). The numerics modules share it, so a setting
    that two of them check (the suite's model in float32 or bfloat16 with the Bernoulli loss) is
    compiled once, and a training run's programs are jitted too."""
    return jax.jit(functools.partial(_probe, impl), static_argnames="config")
