"""Hypothesis strategies for the property checks, derived from the spec alone.

Nothing here asks an implementation for anything: configurations follow SPEC section 1, batches
section 7, parameters the canonical tree of section 2 (drawn by the suite, with NumPy, from a
seed), keys come from integer seeds. The strategies for *bad* input draw a valid value first and
break it in one place, so the error the spec requires is known in advance: each returns what to
pass, which field the error must name, what it must say was expected, and how it may name the value
it was given.

The model sizes are small on purpose: every drawn shape costs a compilation, and a property is about
the arithmetic, not the width. They include the edge sizes (one label, one latent dimension, one
feature, one row, layers of width 1), and pixels include exact 0.0 and 1.0.

Everything a compiled program depends on (the model, the number of rows, the loss and the
optimiser settings, which are static) is drawn in one of two ways. Under the suite's ``ci``
profile, from a pool of three :class:`Setting` (the edge sizes; a typical small model; a deep and
uneven one), one per example, shared by every argument of it: a check then compiles its program at
most three times, however many examples it runs. Under any other profile (``thorough``, a user's
own) each is drawn freely, within the bounds above. The values (parameters, pixels, labels, keys,
latents, permutations, the broken inputs) are drawn freely under both. The plugin chooses, through
:func:`draw_settings_from_pool`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cvae_rosetta.spec.canonical import Canonical, layer_sizes
from cvae_rosetta.spec.config import LOSS_KINDS, Config, LossConfig, ModelConfig, OptimConfig
from cvae_rosetta.spec.validation import Batch

MAX_INPUT_DIM = 24
MAX_CLASSES = 6
MAX_LATENT = 5
MAX_WIDTH = 16
MAX_BATCH = 9

F32 = np.float32
_TINY = float(np.finfo(F32).smallest_subnormal)
_ABOVE_ONE = float(np.nextafter(F32(1.0), F32(2.0)))

seeds = st.integers(0, 2**32 - 1)


def keys() -> st.SearchStrategy[jax.Array]:
    """PRNG keys, from integer seeds."""
    return seeds.map(jax.random.key)


# --- the pool of static settings (under the ``ci`` profile) ---------------------------------------


@dataclasses.dataclass(frozen=True)
class Setting:
    """Everything a compiled program of a check depends on, besides the probe: the model, the rows
    of a batch, beta for each loss kind (``kind`` where a check takes either), the optimiser."""

    name: str
    model: ModelConfig
    b: int
    kind: str
    betas: dict[str, float] = dataclasses.field(hash=False)
    optim: OptimConfig


POOL: tuple[Setting, ...] = (
    # one feature, one label, one latent dimension, a layer of width 1, no decoder hidden layer,
    # one row; the norm clipped on every step
    Setting(
        "edges",
        ModelConfig(input_dim=1, num_classes=1, latent_dim=1, encoder_dims=(1,), decoder_dims=()),
        b=1,
        kind="bernoulli",
        betas={"bernoulli": 1.0, "mse": 0.0},
        optim=OptimConfig(learning_rate=1e-3, clip_norm=0.05, weight_decay=0.0),
    ),
    # every bound reached: 24 pixels, 6 labels, latent 5, width 16, 9 rows; never clipped
    Setting(
        "typical",
        ModelConfig(
            input_dim=MAX_INPUT_DIM,
            num_classes=MAX_CLASSES,
            latent_dim=MAX_LATENT,
            encoder_dims=(MAX_WIDTH, 8),
            decoder_dims=(8, MAX_WIDTH),
        ),
        b=MAX_BATCH,
        kind="mse",
        betas={"bernoulli": 0.0, "mse": 1.0},
        optim=OptimConfig(learning_rate=1e-2, clip_norm=1e3, weight_decay=0.1),
    ),
    # four encoder layers and three decoder hidden layers of uneven widths, beta other than 0 and 1
    Setting(
        "deep",
        ModelConfig(
            input_dim=13,
            num_classes=3,
            latent_dim=2,
            encoder_dims=(7, 1, 12, 5),
            decoder_dims=(3, 16, 9),
        ),
        b=5,
        kind="bernoulli",
        betas={"bernoulli": 2.5, "mse": 0.5},
        optim=OptimConfig(learning_rate=3e-3, clip_norm=0.5, weight_decay=0.5),
    ),
)

_FROM_POOL = [True]


def draw_settings_from_pool(pool: bool) -> None:
    """Draw static settings from :data:`POOL` (``True``, the ``ci`` profile) or freely."""
    _FROM_POOL[0] = pool


# One setting per example, the same for every argument that draws from it.
_setting = st.shared(st.sampled_from(POOL), key="cvae_rosetta.conformance.strategies.setting")


@st.composite
def batch_sizes(draw) -> int:
    """Rows of a batch: the example's setting's, or 1 to 9."""
    return draw(_setting).b if _FROM_POOL[0] else draw(st.integers(1, MAX_BATCH))


# --- configurations (SPEC sections 1, 4, 5) -------------------------------------------------------


def widths(min_size: int, max_size: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.integers(1, MAX_WIDTH), min_size=min_size, max_size=max_size).map(tuple)


@st.composite
def model_configs(draw) -> ModelConfig:
    """Small models: 1 to 4 encoder layers, 0 to 3 decoder hidden layers, widths 1 to 16 (or the
    example's setting's)."""
    if _FROM_POOL[0]:
        return draw(_setting).model
    return ModelConfig(
        input_dim=draw(st.integers(1, MAX_INPUT_DIM)),
        num_classes=draw(st.integers(1, MAX_CLASSES)),
        latent_dim=draw(st.integers(1, MAX_LATENT)),
        encoder_dims=draw(widths(1, 4)),
        decoder_dims=draw(widths(0, 3)),
    )


def betas() -> st.SearchStrategy[float]:
    """beta >= 0, with the values that matter (0: no KL at all; 1: the ELBO) drawn often."""
    return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 4.0))


@st.composite
def loss_configs(draw, kinds: tuple[str, ...] = LOSS_KINDS) -> LossConfig:
    if _FROM_POOL[0]:
        setting = draw(_setting)
        kind = setting.kind if setting.kind in kinds else kinds[0]
        return LossConfig(kind=kind, beta=setting.betas[kind])
    return LossConfig(kind=draw(st.sampled_from(kinds)), beta=draw(betas()))


@st.composite
def optim_configs(draw) -> OptimConfig:
    if _FROM_POOL[0]:
        return draw(_setting).optim
    return OptimConfig(
        learning_rate=draw(st.sampled_from([1e-4, 1e-3, 3e-3, 1e-2])),
        # small norms clip every step, large ones never do
        clip_norm=draw(st.sampled_from([0.05, 0.5, 1.0, 1e3])),
        weight_decay=draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])),
    )


# One model for every argument of a test that draws from it (``st.shared`` with this key), e.g.
# ``@given(model=shared_models, params=shared_models.flatmap(canonical_params))``.
shared_models = st.shared(model_configs(), key="cvae_rosetta.conformance.strategies.model")


# --- valid inputs (SPEC section 7) ----------------------------------------------------------------


def pixels() -> st.SearchStrategy[float]:
    """Values in [0, 1], the exact ends drawn often (log(0) and log(1 - 1) lurk there)."""
    return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0, width=32))


def pixel_arrays(rows: int, cols: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(F32, (rows, cols), elements=pixels())


def label_arrays(num_classes: int, n: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.int32, (n,), elements=st.integers(0, num_classes - 1))


@st.composite
def labels(draw, model: ModelConfig, n: int | None = None) -> jax.Array:
    """``int32[n]`` labels across ``[0, num_classes)``; n drawn from 1 to 9 unless given."""
    if n is None:
        n = draw(batch_sizes())
    return jnp.asarray(draw(label_arrays(model.num_classes, n)))


@st.composite
def batches(draw, model: ModelConfig, b: int | None = None) -> Batch:
    """A valid batch for ``model``: B rows (drawn from 1 to 9 unless given)."""
    if b is None:
        b = draw(batch_sizes())
    x = draw(pixel_arrays(b, model.input_dim))
    c = draw(label_arrays(model.num_classes, b))
    return Batch(jnp.asarray(x), jnp.asarray(c))


@st.composite
def latents(draw, model: ModelConfig, b: int) -> jax.Array:
    """``f32[b, latent_dim]`` points in latent space, a few standard deviations around 0."""
    z = draw(hnp.arrays(F32, (b, model.latent_dim), elements=st.floats(-4.0, 4.0, width=32)))
    return jnp.asarray(z)


# --- canonical parameters (SPEC section 2), drawn by the suite -----------------------------------


def params_from_seed(
    seed: int | tuple[int, ...], model: ModelConfig, scale: float = 1.0
) -> Canonical:
    """Kernels ``scale * normal / sqrt(fan_in)``, biases ``0.1 * scale * normal`` (nonzero, so a
    converter that drops or misplaces them is caught). NumPy, not ``jax.random``: drawing in JAX
    would compile a sampler for every new leaf shape."""
    rng = np.random.default_rng(seed)
    sizes = layer_sizes(model)

    def layer(fan_in: int, fan_out: int) -> dict:
        kernel = scale * rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)
        bias = 0.1 * scale * rng.standard_normal(fan_out)
        return {"kernel": jnp.asarray(kernel, jnp.float32), "bias": jnp.asarray(bias, jnp.float32)}

    return {
        "encoder": [layer(*s) for s in sizes["encoder"]],
        "latent": layer(*sizes["latent"][0]),
        "decoder": [layer(*s) for s in sizes["decoder"]],
    }


@st.composite
def canonical_params(
    draw, model: ModelConfig, scales: st.SearchStrategy[float] | None = None
) -> Canonical:
    """Canonical parameters for ``model`` from a drawn seed (and a drawn scale, if given)."""
    scale = 1.0 if scales is None else draw(scales)
    return params_from_seed(draw(seeds), model, scale)


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn situation: a config, canonical parameters, a batch and the seed of the call key."""

    config: Config
    params: Canonical = dataclasses.field(repr=False)
    batch: Batch
    seed: int
    params_seed: int

    @property
    def model(self) -> ModelConfig:
        return self.config.model

    @property
    def key(self) -> jax.Array:
        return jax.random.key(self.seed)

    @property
    def b(self) -> int:
        return int(self.batch.x.shape[0])


@st.composite
def cases(
    draw,
    models: st.SearchStrategy[ModelConfig] | None = None,
    losses: st.SearchStrategy[LossConfig] | None = None,
    optims: st.SearchStrategy[OptimConfig] | None = None,
) -> Case:
    """A model, then parameters and a batch shaped for it (the draws are coupled)."""
    model = draw(models if models is not None else model_configs())
    loss = draw(losses) if losses is not None else LossConfig()
    optim = draw(optims) if optims is not None else OptimConfig()
    params_seed = draw(seeds)
    batch = draw(batches(model))
    return Case(
        config=Config(model=model, loss=loss, optim=optim),
        params=params_from_seed(params_seed, model),
        batch=batch,
        seed=draw(seeds),
        params_seed=params_seed,
    )


# --- bad input (SPEC section 7) -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BadInput:
    """Input broken in one place, and what the refusal must say.

    ``first`` is ``x`` (or ``z`` for :func:`bad_latents`), ``c`` the labels. The message must name
    ``field`` (``"x"``, ``"c"`` or ``"z"``; through ``loss`` and ``train_step`` as ``batch.x`` and
    ``batch.c``), contain ``expected``, and name the value given in one of the renderings in ``got``
    (empty when the spec asks for no particular one).
    """

    case: str
    first: Any
    c: Any
    field: str
    expected: str
    got: tuple[str, ...]

    def batch(self) -> Batch:
        return Batch(self.first, self.c)


def _value_renderings(value: float) -> tuple[str, ...]:
    """Ways a message may print the value it was given (float32 or float64 digits)."""
    v32 = F32(value)
    return tuple({str(np.float64(v32)), str(v32), repr(float(v32)), f"{float(v32):g}"})


def _shape(shape: tuple[int, ...]) -> tuple[str, ...]:
    return (f"shape {tuple(shape)}",)


@st.composite
def _valid(draw, model: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    b = draw(batch_sizes())
    return draw(pixel_arrays(b, model.input_dim)), draw(label_arrays(model.num_classes, b))


def _other_than(n: int, most: int) -> st.SearchStrategy[int]:
    """An integer in [1, most] other than n (by construction: a filter would reject too often)."""
    return st.integers(1, most - 1).map(lambda k: k + 1 if k >= n else k)


def _put(x: np.ndarray, c: np.ndarray):
    # jnp.asarray is a transfer, not an operation: nothing is compiled for the new shapes
    return jnp.asarray(x), jnp.asarray(c)


@st.composite
def _x_wrong_rank(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    rank = draw(st.sampled_from([0, 1, 3]))
    bad = {0: x[0, 0], 1: x[0], 3: x[:, :, None]}[rank]
    bad = np.asarray(bad)
    return BadInput(f"x of rank {rank}", *_put(bad, c), "x", "expected rank 2", _shape(bad.shape))


@st.composite
def _x_wrong_features(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    d = model.input_dim
    width = draw(_other_than(d, d + 8))
    bad = draw(pixel_arrays(x.shape[0], width))
    return BadInput(
        f"x with {width} features",
        *_put(bad, c),
        "x",
        f"expected {d} features",
        _shape(bad.shape),
    )


@st.composite
def _x_nonfinite(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    value = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    row = draw(st.integers(0, x.shape[0] - 1))
    col = draw(st.integers(0, x.shape[1] - 1))
    x = x.copy()
    x[row, col] = value
    return BadInput(
        f"x[{row}, {col}] = {value}",
        *_put(x, c),
        "x",
        "expected finite values",
        _value_renderings(value),
    )


@st.composite
def _x_outside(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    value = draw(
        st.one_of(
            st.floats(_ABOVE_ONE, 1e6, width=32),  # includes the float32 right after 1
            st.floats(-1e6, -_TINY, width=32),  # includes the smallest negative subnormal
        )
    )
    row = draw(st.integers(0, x.shape[0] - 1))
    col = draw(st.integers(0, x.shape[1] - 1))
    x = x.copy()
    x[row, col] = value
    return BadInput(
        f"x[{row}, {col}] = {value}",
        *_put(x, c),
        "x",
        "expected values in [0, 1]",
        _value_renderings(value),
    )


@st.composite
def _x_integer(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    bad = np.round(x).astype(np.int32)  # the right shape and range, but not floats
    return BadInput("x of integers", *_put(bad, c), "x", "expected a floating", ("int32",))


def _empty(model: ModelConfig) -> st.SearchStrategy[BadInput]:
    x = np.zeros((0, model.input_dim), F32)
    c = np.zeros((0,), np.int32)
    return st.just(
        BadInput("empty batch", *_put(x, c), "x", "expected at least one row", _shape(x.shape))
    )


@st.composite
def _c_float(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    bad = np.asarray(c, dtype=jnp.dtype(dtype))
    return BadInput(
        f"c of {dtype}", *_put(x, bad), "c", "expected an integer dtype", (f"dtype {dtype}",)
    )


@st.composite
def _c_outside(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    k = model.num_classes
    value = draw(st.one_of(st.integers(-1000, -1), st.integers(k, k + 1000), st.just(k)))
    i = draw(st.integers(0, c.shape[0] - 1))
    c = c.copy()
    c[i] = value
    return BadInput(
        f"c[{i}] = {value}",
        *_put(x, c),
        "c",
        f"expected labels in [0, {k})",
        (f"{value} at [{i}]",),
    )


@st.composite
def _c_wrong_rank(draw, model: ModelConfig) -> BadInput:
    x, c = draw(_valid(model))
    bad = draw(st.sampled_from([c[:, None], c[None, :], np.asarray(c[0])]))
    return BadInput(
        f"c of rank {bad.ndim}", *_put(x, bad), "c", "expected rank 1", _shape(bad.shape)
    )


@st.composite
def _c_wrong_length(draw, model: ModelConfig) -> BadInput:
    x, _ = draw(_valid(model))
    b = x.shape[0]
    n = draw(_other_than(b, b + 5))
    c = draw(label_arrays(model.num_classes, n))
    return BadInput(f"{n} labels for {b} rows", *_put(x, c), "c", f"expected {b} labels", (str(n),))


@st.composite
def bad_batches(draw, model: ModelConfig) -> BadInput:
    """A batch broken in one field: wrong rank, feature count, dtype, a NaN or an Inf, a value
    outside [0, 1], float labels, labels out of range (negative or >= num_classes), mismatched
    lengths, no rows at all."""
    return draw(
        st.one_of(
            _x_wrong_rank(model),
            _x_wrong_features(model),
            _x_nonfinite(model),
            _x_outside(model),
            _x_integer(model),
            _empty(model),
            _c_float(model),
            _c_outside(model),
            _c_wrong_rank(model),
            _c_wrong_length(model),
        )
    )


@st.composite
def bad_latents(draw, model: ModelConfig) -> BadInput:
    """A ``z`` for ``decode`` broken in one way, with valid labels for its rows (where it has
    rows). The spec's section 7 is about ``x`` and ``c``; for ``z`` only the field and what was
    expected are required."""
    b = draw(batch_sizes())
    el = model.latent_dim
    c = draw(label_arrays(model.num_classes, b))
    z = draw(hnp.arrays(F32, (b, el), elements=st.floats(-4.0, 4.0, width=32)))
    kind = draw(st.sampled_from(["width", "rank", "empty", "nonfinite", "integer"]))
    if kind == "width":
        width = draw(_other_than(el, el + 4))
        z = np.zeros((b, width), F32)
        expected = f"[B, {el}]"
    elif kind == "rank":
        z = draw(st.sampled_from([z[0], z[:, :, None]]))
        expected = f"[B, {el}]"
    elif kind == "empty":
        z, c = np.zeros((0, el), F32), np.zeros((0,), np.int32)
        expected = "B >= 1"
    elif kind == "nonfinite":
        z = z.copy()
        row, col = draw(st.integers(0, b - 1)), draw(st.integers(0, el - 1))
        z[row, col] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        expected = "expected finite values"
    else:
        z = np.round(z).astype(np.int32)
        expected = "expected a floating"
    return BadInput(f"z: {kind}", *_put(z, c), "z", expected, ())


# --- parameter trees that are not canonical (SPEC section 2) --------------------------------------


@dataclasses.dataclass(frozen=True)
class BadTree:
    """A canonical tree broken in one place; the refusal must name ``path`` and say ``fragment``."""

    case: str
    tree: Any = dataclasses.field(repr=False)
    path: str
    fragment: str


def _copy_tree(params: Canonical) -> Canonical:
    return {
        "encoder": [dict(layer) for layer in params["encoder"]],
        "latent": dict(params["latent"]),
        "decoder": [dict(layer) for layer in params["decoder"]],
    }


def _layers(params: Canonical) -> list[tuple[str, Any, str]]:
    """``(group, index or None, path)`` of every layer, with paths written as the checker does."""
    out: list[tuple[str, Any, str]] = []
    for group in ("encoder", "decoder"):
        out += [(group, i, f"params[{group!r}][{i}]") for i in range(len(params[group]))]
    out.append(("latent", None, "params['latent']"))
    return out


def _layer(tree: Canonical, group: str, index: int | None) -> dict:
    return tree[group] if index is None else tree[group][index]


@st.composite
def mutated_params(draw, params: Canonical) -> BadTree:
    """``params`` (canonical for their model) with one thing wrong: a layer dropped or added, a
    kernel or a bias of the wrong shape (a transposed kernel among them), a key missing or extra,
    a leaf in another float dtype."""
    tree = _copy_tree(params)
    kind = draw(
        st.sampled_from(
            [
                "drop layer",
                "add layer",
                "kernel shape",
                "bias shape",
                "missing key",
                "extra key",
                "dtype",
            ]
        )
    )
    if kind in ("drop layer", "add layer"):
        group = draw(st.sampled_from(["encoder", "decoder"]))
        n = len(tree[group])
        i = draw(st.integers(0, n - 1))
        if kind == "drop layer":
            del tree[group][i]
            got = n - 1
        else:
            tree[group].insert(i, dict(tree[group][i]))
            got = n + 1
        return BadTree(f"{kind} {i} of {group}", tree, f"params[{group!r}]", f"got {got} layers")

    group, index, path = draw(st.sampled_from(_layers(params)))
    layer = _layer(tree, group, index)
    if kind == "kernel shape":
        fan_in, fan_out = layer["kernel"].shape
        candidates = [
            (fan_out, fan_in),
            (fan_in + 1, fan_out),
            (fan_in, fan_out + 1),
            (fan_in * fan_out,),
            (1, fan_in, fan_out),
        ]
        if fan_in > 1:
            candidates.append((fan_in - 1, fan_out))
        shape = draw(st.sampled_from([s for s in candidates if s != (fan_in, fan_out)]))
        layer["kernel"] = jnp.zeros(shape, jnp.float32)
        return BadTree(
            f"kernel of shape {shape}",
            tree,
            f"{path}['kernel']",
            f"expected shape {(fan_in, fan_out)}",
        )
    if kind == "bias shape":
        (fan_out,) = layer["bias"].shape
        candidates = [(fan_out + 1,), (fan_out, 1), (1, fan_out), ()]
        if fan_out > 1:
            candidates.append((fan_out - 1,))
        shape = draw(st.sampled_from(candidates))
        layer["bias"] = jnp.zeros(shape, jnp.float32)
        return BadTree(
            f"bias of shape {shape}", tree, f"{path}['bias']", f"expected shape {(fan_out,)}"
        )
    if kind == "missing key":
        if draw(st.booleans()):  # a whole group
            name = draw(st.sampled_from(["encoder", "latent", "decoder"]))
            del tree[name]
            return BadTree(f"no {name!r}", tree, "params", "expected keys")
        name = draw(st.sampled_from(["kernel", "bias"]))
        del layer[name]
        return BadTree(f"no {name!r} in {path}", tree, path, "expected keys")
    if kind == "extra key":
        name = draw(st.sampled_from(["scale", "kernel_t", "embedding"]))
        if draw(st.booleans()):
            tree[name] = {"kernel": layer["kernel"], "bias": layer["bias"]}
            return BadTree(f"extra {name!r}", tree, "params", name)
        layer[name] = layer["bias"]
        return BadTree(f"extra {name!r} in {path}", tree, path, name)
    # another float dtype for one leaf
    leaf = draw(st.sampled_from(["kernel", "bias"]))
    dtype = draw(st.sampled_from(["float64", "float16", "bfloat16"]))
    # NumPy holds a float64 array even where JAX runs without x64
    layer[leaf] = np.asarray(layer[leaf], dtype=jnp.dtype(dtype))
    return BadTree(f"{path}[{leaf!r}] in {dtype}", tree, f"{path}[{leaf!r}]", dtype)
