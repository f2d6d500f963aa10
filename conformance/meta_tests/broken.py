r"""Deliberately broken implementations: the reference with one plausible porting bug each.

Every one reuses the reference (``pure_jax``, loaded by name like any implementation: the suite
imports nothing of ``cvae_rosetta.impls``), its adapter's functions and
:class:`cvae_rosetta.spec.protocol.Adapter`, and changes one thing (the reference's forward pass
and loss, rewritten from pieces a bug can swap, are in
:mod:`cvae_rosetta.conformance.meta_tests.pieces`). Each is a module attribute, so
the suite can be pointed at it::

    pytest --pyargs cvae_rosetta.conformance \
        --impl cvae_rosetta.conformance.meta_tests.broken:kl_missing_half

``BUGS`` maps each name to the one-line docstring saying which real-world mistake it models, in
definition order, these first and then those of
:mod:`cvae_rosetta.conformance.meta_tests.searched` (the mistakes the search of hypotheses names);
``target(name)`` is what ``--impl`` takes for each. ``conformance/meta_tests/test_meta.py`` runs
the suite on every entry and asserts that it fails. Adding a function decorated with :func:`bug`
(:mod:`cvae_rosetta.conformance.meta_tests.registry`) adds a case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from cvae_rosetta.conformance.meta_tests.pieces import (
    BASE,
    DECODE,
    ENCODE,
    decoder,
    dense,
    encoder,
    hand_written_adamw,
    init_with,
    make_objective,
    mlp,
    pipeline,
    rebuild,
    reference_params,
    state_with_optimizer,
    with_optimizer,
)
from cvae_rosetta.conformance.meta_tests.registry import (  # noqa: F401 (target: re-exported)
    BUGS,
    MODULES,
    bug,
    target,
)
from cvae_rosetta.spec import canonical
from cvae_rosetta.spec.canonical import layer_sizes
from cvae_rosetta.spec.config import Config, OptimConfig
from cvae_rosetta.spec.model import noise, split_moments
from cvae_rosetta.spec.optim import make_optimizer
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import (
    Batch,
    check_batch,
    check_features,
    check_labels,
    check_latent,
)

# --- the loss -------------------------------------------------------------------------------------


@bug
def kl_missing_half():
    """The KL term written without its 0.5 (``exp(logvar) + mean^2 - 1 - logvar``), a factor-2 slip
    copying the formula."""
    return pipeline(
        objective=make_objective(kl=lambda m, lv: jnp.exp(lv) + jnp.square(m) - 1.0 - lv)
    )


@bug
def std_as_exp_logvar():
    """The reparameterisation takes the standard deviation as ``exp(logvar)`` instead of
    ``exp(0.5 * logvar)`` (the output read as a log-std)."""
    return pipeline(reparam=lambda mean, logvar, eps: mean + jnp.exp(logvar) * eps)


@bug
def loss_summed_over_batch():
    """The Bernoulli loss summed over the batch where the spec averages (PyTorch's
    ``reduction='sum'`` habit), so its scale grows with the batch size."""
    return pipeline(objective=make_objective(bernoulli_reduce=jnp.sum))


@bug
def mse_summed_over_pixels():
    """The ``mse`` reconstruction summed over pixels like the Bernoulli one, where the source
    guide's definition is a mean over every element."""
    return pipeline(objective=make_objective(mse_pixel_reduce=jnp.sum))


@bug
def logits_as_probabilities():
    """``decode`` returns ``sigmoid`` probabilities (a Keras ``activation='sigmoid'`` output
    layer), and the loss then feeds them to a cross-entropy that expects logits."""
    return pipeline(decode=decoder(output=jax.nn.sigmoid))


def _naive_bernoulli(logits, x):
    prob = jax.nn.sigmoid(logits.astype(jnp.float32))
    x = x.astype(jnp.float32)
    return -jnp.sum(x * jnp.log(prob) + (1.0 - x) * jnp.log(1.0 - prob), axis=-1)


@bug
def bernoulli_loss_from_probabilities():
    """The Bernoulli loss written straight from its formula, ``-(x log sigmoid(l) + (1 - x)
    log(1 - sigmoid(l)))``: right for moderate logits, but once a logit saturates in float32
    (``sigmoid(l) == 1.0``) it takes ``log(0)``, and the loss, its gradient and the parameters after
    one step are no longer finite."""
    return pipeline(objective=make_objective(recon=_naive_bernoulli))


# --- the model ------------------------------------------------------------------------------------


def _encode_without_label(params, x, c, model):
    first, *rest = params["encoder"]
    h = x.astype(model.compute_dtype)
    h = jax.nn.relu(dense({**first, "kernel": first["kernel"][: model.input_dim]}, h))
    s = dense(params["latent"], mlp(rest, h))
    return split_moments(s, model.latent_dim)


@bug
def encoder_ignores_label():
    """The encoder is fed ``x`` alone, as in the source guide's ``VAE``: only the decoder sees the
    label (the label rows of the first encoder kernel are never read)."""
    return pipeline(encode=_encode_without_label)


def _one_hot_10(h, c, num_classes):
    del num_classes
    return jnp.concatenate([h, jax.nn.one_hot(c, 10, dtype=h.dtype)], axis=-1)


@bug
def one_hot_hardcoded_10():
    """``one_hot(c, 10)`` hard-coded from an MNIST port instead of ``config.model.num_classes``:
    right for ten labels, wrong for any other number."""
    return pipeline(encode=encoder(cond=_one_hot_10), decode=decoder(cond=_one_hot_10))


@bug
def latent_split_swapped():
    """The latent layer's output split the other way round, ``logvar, mean = split(s, 2)``."""
    return pipeline(encode=encoder(split=lambda s, n: split_moments(s, n)[::-1]))


@bug
def relu_on_output_layer():
    """The decoder's MLP loop applies its ReLU after every layer, the output layer included, so
    no logit is ever negative."""
    return pipeline(decode=decoder(relu_output=True))


# --- the conversion to and from canonical parameters ---------------------------------------------


def _transpose_latent(params):
    latent = params["latent"]
    return {**params, "latent": {**latent, "kernel": latent["kernel"].T}}


@bug
def latent_kernel_transposed():
    """A converter copied from an ``[out, in]`` framework (Equinox) transposes the latent kernel
    both ways while the model reads ``[in, out]``: the round trip is exact, and the latent layer
    being square (16 x 16 in the suite's model, 64 x 64 by default) hides it from shape checks."""
    return dataclasses.replace(
        BASE,
        from_canonical_fn=lambda params, config: BASE.from_canonical_fn(
            _transpose_latent(params), config
        ),
        to_canonical_fn=lambda state: _transpose_latent(state.params),
    )


def _without_biases(params):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: jnp.zeros_like(leaf) if path[-1].key == "bias" else leaf, params
    )


@bug
def biases_dropped_in_conversion():
    """``from_canonical`` copies the kernels only, so every bias keeps its zero initial value."""
    return dataclasses.replace(
        BASE,
        from_canonical_fn=lambda params, config: BASE.from_canonical_fn(
            _without_biases(params), config
        ),
    )


def _interleave_latent(params, inverse: bool = False):
    """The latent layer's output columns reordered so that the model's mean (its first half) is the
    canonical even columns and its logvar the odd ones; ``inverse`` orders them back."""
    latent = params["latent"]
    width = latent["bias"].shape[-1]
    order = np.concatenate([np.arange(0, width, 2), np.arange(1, width, 2)])
    order = np.argsort(order) if inverse else order
    return {
        **params,
        "latent": {"kernel": latent["kernel"][:, order], "bias": latent["bias"][order]},
    }


@bug
def latent_interleaved_in_conversion():
    """The converter reads the latent layer's ``[mean, logvar]`` output as interleaved pairs (mean
    the even columns, logvar the odd ones) and writes it back the same way: the round trip is
    exact and the shapes are the spec's."""
    return dataclasses.replace(
        BASE,
        from_canonical_fn=lambda params, config: BASE.from_canonical_fn(
            _interleave_latent(params), config
        ),
        to_canonical_fn=lambda state: _interleave_latent(state.params, inverse=True),
    )


class _NoCopyAdapter(Adapter):
    def to_canonical(self, state):
        return self.to_canonical_fn(state)  # the state's own buffers, not copies


@bug
def canonical_views_of_donated_buffers():
    """``to_canonical`` hands out the state's own buffers instead of copies: once a step donates
    the state, the caller's canonical tree is deleted under it."""
    return rebuild(_NoCopyAdapter)


class _AliasingAdapter(Adapter):
    def from_canonical(self, params, config):
        canonical.check(params, config.model)
        return self.from_canonical_fn(params, config)  # the caller's arrays, not copies


@bug
def from_canonical_keeps_callers_arrays():
    """``from_canonical`` builds the state on the caller's own arrays instead of copies: a jitted
    step that donates the state deletes the caller's parameter tree under it (and every later use
    of that tree fails with "Array has been deleted")."""
    return rebuild(_AliasingAdapter)


def _bf16_master(params, config: Config):
    dtype = jnp.dtype(config.model.compute_dtype)
    return BASE.from_canonical_fn(jax.tree.map(lambda p: p.astype(dtype), params), config)


@bug
def parameters_stored_in_compute_dtype():
    """Mixed precision done by storing the parameters in the compute dtype: under bfloat16 the
    master weights are bfloat16 (the spec keeps them float32), so conversions and small updates
    lose bits."""
    return dataclasses.replace(
        BASE,
        init_fn=lambda key, config: _bf16_master(reference_params(key, config), config),
        from_canonical_fn=_bf16_master,
        to_canonical_fn=lambda state: jax.tree.map(lambda p: p.astype(jnp.float32), state.params),
    )


def _encode_f32(params, x, c, model):
    return ENCODE(params, x, c, dataclasses.replace(model, compute_dtype="float32"))


def _decode_f32(params, z, c, model):
    return DECODE(params, z, c, dataclasses.replace(model, compute_dtype="float32"))


@bug
def compute_dtype_ignored():
    """``compute_dtype`` is never read (a Flax ``Dense`` built without ``dtype=``): a bfloat16
    configuration silently computes in float32."""
    return pipeline(encode=_encode_f32, decode=_decode_f32)


def _dense_f32_weights(layer, h):
    return h @ layer["kernel"] + layer["bias"]  # float32 weights: a bfloat16 h is promoted


@bug
def bf16_activations_with_f32_weights():
    """The inputs cast to ``compute_dtype`` but the float32 parameters not: JAX computes a matmul
    of bfloat16 activations and float32 weights in float32, so a bfloat16 configuration rounds its
    inputs and then computes in float32."""
    return pipeline(
        encode=encoder(linear=_dense_f32_weights), decode=decoder(linear=_dense_f32_weights)
    )


# --- initialisation -------------------------------------------------------------------------------


def _uniform_params(key, model):
    """Equinox's ``Linear`` default: kernel and bias uniform in +-1/sqrt(fan_in)."""
    sizes = layer_sizes(model)
    keys = iter(jax.random.split(key, 2 * sum(len(group) for group in sizes.values())))

    def layer(fan_in, fan_out):
        bound = 1.0 / jnp.sqrt(fan_in)
        return {
            "kernel": jax.random.uniform(
                next(keys), (fan_in, fan_out), minval=-bound, maxval=bound
            ),
            "bias": jax.random.uniform(next(keys), (fan_out,), minval=-bound, maxval=bound),
        }

    return {
        "encoder": [layer(*s) for s in sizes["encoder"]],
        "latent": layer(*sizes["latent"][0]),
        "decoder": [layer(*s) for s in sizes["decoder"]],
    }


@bug
def uniform_init():
    """Equinox's default ``Linear`` initialisation kept (uniform in +-1/sqrt(fan_in), biases
    included) instead of the spec's LeCun normal with zero biases."""
    return dataclasses.replace(
        BASE,
        init_fn=lambda key, config: BASE.from_canonical_fn(
            _uniform_params(key, config.model), config
        ),
    )


# --- optimisation ---------------------------------------------------------------------------------


def _frozen_opt_state_step(state, batch, eps):
    new, metrics = BASE.train_step_fn(state, batch, eps)
    return new.replace(opt_state=state.opt_state), metrics


@bug
def optimizer_state_not_advanced():
    """The new optimiser state is computed and dropped (``updates, _ = tx.update(...)``), so Adam
    restarts every step: its moments stay zero and its bias correction is stuck at step 1."""
    return dataclasses.replace(BASE, train_step_fn=_frozen_opt_state_step)


@functools.cache
def _adam_without_decay(optim: OptimConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adam(optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8),
    )


def _l2_train_step(state, batch, eps):
    decay = state.config.optim.weight_decay

    def objective(params):
        loss, metrics = BASE.loss_fn(state.replace(params=params), batch, eps)
        l2 = sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params))
        return loss + 0.5 * decay * l2, metrics

    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    return state.apply_gradients(grads), metrics


@bug
def weight_decay_as_l2_loss():
    """Weight decay added to the loss as an L2 penalty and fed through plain Adam (the
    ``torch.optim.Adam(weight_decay=...)`` habit) instead of AdamW's decoupled decay."""
    create = state_with_optimizer(_adam_without_decay)
    return dataclasses.replace(
        BASE, init_fn=init_with(create), from_canonical_fn=create, train_step_fn=_l2_train_step
    )


@functools.cache
def _adamw_without_clipping(optim: OptimConfig) -> optax.GradientTransformation:
    return optax.adamw(
        optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
    )


@bug
def gradient_clipping_missing():
    """The optimiser built as ``optax.adamw`` alone: ``clip_by_global_norm(clip_norm)`` is
    forgotten (harmless-looking, because Adam's first step does not depend on the gradient's
    scale)."""
    return with_optimizer(_adamw_without_clipping)


@functools.cache
def _constant_rate(optim: OptimConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(
            optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
        ),
    )


@bug
def schedule_ignored():
    """The optimiser built from ``learning_rate`` alone, ``optax.adamw(optim.learning_rate,
    ...)``: ``optim.schedule`` and its fields are never read, so a run asked for a warm-up and a
    cosine decay trains at the constant peak rate without a word."""
    return with_optimizer(_constant_rate)


@bug
def adam_epsilon_on_uncorrected_root():
    """AdamW as ``keras.optimizers.AdamW`` computes it, with the spec's epsilon: the bias
    corrections folded into the rate, ``lr * sqrt(1 - b2^t) / (1 - b1^t)``, and epsilon added to
    the uncorrected ``sqrt(v)``, so the effective epsilon is ``eps / sqrt(1 - b2^t)``, 31.6 times
    the spec's at the first step (seen where gradient entries are small against it)."""
    folded = functools.partial(hand_written_adamw, correct_first=False, correct_second=False)
    return with_optimizer(functools.partial(folded, folded=True))


@bug
def adam_without_bias_correction():
    """Adam written from the moment updates alone, ``m / (sqrt(v) + eps)`` with ``m`` and ``v`` as
    they are: no division by ``1 - b1^t`` and ``1 - b2^t``, so the first update is 3.16 times the
    spec's and the early steps are too large."""
    return with_optimizer(
        lambda optim: hand_written_adamw(optim, correct_first=False, correct_second=False)
    )


def _retracing_step(state, batch, eps):
    new, metrics = BASE.train_step_fn(state, batch, eps)
    # an uncached make_optimizer: a fresh transformation, unequal to the last one, every step
    return new.replace(tx=make_optimizer.__wrapped__(state.config.optim)), metrics


@bug
def optimizer_rebuilt_every_step():
    """The optax transformation is rebuilt inside the step (an uncached ``make_optimizer``), so
    the state's static metadata compares unequal after every step and a jitted step silently
    retraces on every call."""
    return dataclasses.replace(BASE, train_step_fn=_retracing_step)


# --- randomness -----------------------------------------------------------------------------------


class _FixedKeyAdapter(Adapter):
    @staticmethod
    def _noise(state, batch, key):
        return Adapter._noise(state, batch, jax.random.key(0))


@bug
def key_ignored():
    """The noise comes from a key made once at start-up (``key = PRNGKey(0)`` closed over) and
    the key passed in is ignored: the same noise on every step."""
    return rebuild(_FixedKeyAdapter)


class _StepFixedKeyAdapter(Adapter):
    def train_step(self, state, batch, key):
        return super().train_step(state, batch, jax.random.key(0))


@bug
def step_ignores_key():
    """``loss`` draws its noise from the key it is given, but ``train_step`` from a key made once
    at start-up: every loss check passes, and training sees the same noise on every step."""
    return rebuild(_StepFixedKeyAdapter)


_CALLS = itertools.count()


class _GlobalRngAdapter(Adapter):
    @staticmethod
    def _noise(state, batch, key):
        return Adapter._noise(state, batch, jax.random.fold_in(key, next(_CALLS)))


@bug
def hidden_rng_state():
    """A global generator advanced on every call (the NumPy/PyTorch habit) mixed into the key:
    the same key gives different noise on different calls."""
    return rebuild(_GlobalRngAdapter)


class _RowNoiseAdapter(Adapter):
    @staticmethod
    def _noise(state, batch, key):
        check_batch(batch, state.config.model.input_dim, state.config.model.num_classes)
        row = noise(key, 1, state.config.model.latent_dim)[0]  # shape (L,)
        return jnp.broadcast_to(row, (batch.x.shape[0], row.shape[0]))


@bug
def noise_shared_by_all_rows():
    """The noise drawn with shape ``(L,)`` and broadcast over the batch: every row of a step gets
    the same ``eps``."""
    return rebuild(_RowNoiseAdapter)


# --- input validation -----------------------------------------------------------------------------


def _check_labels_shape_only(c, num_classes, *, rows=None, field="c"):
    """check_labels without the range check (the values are replaced by zeros before it)."""
    if hasattr(c, "shape") and hasattr(c, "dtype"):
        c = jnp.zeros_like(c)
    check_labels(c, num_classes, rows=rows, field=field)


class _UncheckedLabelsAdapter(Adapter):
    def encode(self, state, x, c):
        check_features(x, state.config.model.input_dim)
        _check_labels_shape_only(c, state.config.model.num_classes, rows=x.shape[0])
        return self.encode_fn(state, x, c)

    def decode(self, state, z, c):
        check_latent(z, state.config.model.latent_dim)
        _check_labels_shape_only(c, state.config.model.num_classes, rows=z.shape[0])
        return self.decode_fn(state, z, c)

    @staticmethod
    def _noise(state, batch, key):
        c = getattr(batch, "c", None)
        if hasattr(c, "shape") and hasattr(c, "dtype"):
            batch = Batch(batch.x, jnp.zeros_like(c))  # checked, but for shape and dtype only
        return Adapter._noise(state, batch, key)


@bug
def labels_not_range_checked():
    """Labels checked for shape and dtype but not range: ``jax.nn.one_hot`` silently maps an
    out-of-range label to a zero row and the model trains on it."""
    return rebuild(_UncheckedLabelsAdapter)


@contextlib.contextmanager
def _worded(text: str):
    try:
        yield
    except ValueError:
        raise ValueError(text) from None


class _FreelyWordedAdapter(Adapter):
    def from_canonical(self, params, config):
        with _worded("invalid parameters"):
            return super().from_canonical(params, config)

    def encode(self, state, x, c):
        with _worded("invalid input"):
            return super().encode(state, x, c)

    def decode(self, state, z, c):
        with _worded("invalid input"):
            return super().decode(state, z, c)

    @staticmethod
    def _noise(state, batch, key):
        with _worded("invalid batch"):
            return Adapter._noise(state, batch, key)


@bug
def bad_input_worded_freely():
    """Bad input refused with messages of its own (``invalid batch``, ``invalid input``) instead of
    the spec's ``<field>: expected <what>, got <actual>``: the caller learns neither which field is
    wrong nor why."""
    return rebuild(_FreelyWordedAdapter)


# the broken implementations whose causes the search of hypotheses names: its ways, then the
# constants it fits, registered after these
from cvae_rosetta.conformance.meta_tests import fitted, searched  # noqa: E402

# this module's, then searched's, then fitted's, each in definition order (sorted is stable)
MODULE_ORDER = (__name__, searched.__name__, fitted.__name__)
NAMES: list[str] = sorted(BUGS, key=lambda name: MODULE_ORDER.index(MODULES[name]))

# What the suite's diagnosis must say of each: the earliest layer that fails
# (``cvae_rosetta.conformance.layers``) and a phrase of the first line of its cause's message (the
# first check to fail in that layer). ``test_meta.py`` holds every run to it.
EXPECTED: dict[str, tuple[str, str]] = {
    "kl_missing_half": ("loss", "kl is twice the reference"),
    "std_as_exp_logvar": ("loss", "takes exp(logvar) as its standard deviation"),
    "loss_summed_over_batch": ("loss", "a sum over the batch where the spec averages"),
    "mse_summed_over_pixels": ("loss", "a sum over pixels where the spec averages"),
    "logits_as_probabilities": (
        "forward",
        "decode matches the float64 reference returning probabilities sigmoid(logits)",
    ),
    "bernoulli_loss_from_probabilities": ("edges", "at saturated logits"),
    "encoder_ignores_label": ("forward", "the encoder ignores the label"),
    "one_hot_hardcoded_10": ("properties", "labels"),
    "latent_split_swapped": (
        "forward",
        "encode matches the float64 reference returning (logvar, mean)",
    ),
    "relu_on_output_layer": ("forward", "a ReLU after the output layer"),
    "latent_kernel_transposed": ("forward", "['latent']['kernel'] transposed"),
    "latent_interleaved_in_conversion": (
        "forward",
        "the latent layer's output split interleaved (mean the even columns, logvar the odd ones)",
    ),
    "biases_dropped_in_conversion": ("surface", "is all zeros"),
    "canonical_views_of_donated_buffers": ("jit", "to_canonical hands out the state's own buffers"),
    "from_canonical_keeps_callers_arrays": ("jit", "from_canonical keeps the caller's arrays"),
    "parameters_stored_in_compute_dtype": ("edges", "the parameters rounded to bfloat16"),
    "compute_dtype_ignored": ("precision", "compute_dtype is ignored"),
    "bf16_activations_with_f32_weights": (
        "precision",
        "bfloat16 activations meet float32 weights, and JAX computes such a matmul in float32",
    ),
    "uniform_init": ("shapes", "the spec's LeCun normal"),
    "optimizer_state_not_advanced": ("later_steps", "the optimiser state does not advance"),
    "weight_decay_as_l2_loss": ("step", "an L2 penalty"),
    "gradient_clipping_missing": ("step", "without clip_by_global_norm"),
    "schedule_ignored": (
        "later_steps",
        "with optim.schedule='warmup_cosine', the parameters after step 1 (warm-up, rate 0) "
        "differ from the float64 reference as if the learning rate were constant at 0.003 "
        "(optim.learning_rate): the schedule is ignored",
    ),
    "adam_epsilon_on_uncorrected_root": (
        "step",
        "epsilon added to the uncorrected sqrt(v) (Keras's and TensorFlow's Adam): effective "
        "epsilon eps/sqrt(1-b2^t)",
    ),
    "adam_without_bias_correction": ("step", "the step is AdamW's without bias correction"),
    "optimizer_rebuilt_every_step": ("jit", "traced 3 times"),
    "key_ignored": ("loss", "eps = normal(key, (B, L))"),
    "step_ignores_key": ("step", "the step ignores the key it is given"),
    "hidden_rng_state": ("loss", "eps = normal(key, (B, L))"),
    "noise_shared_by_all_rows": ("loss", "the same noise row for every example"),
    "labels_not_range_checked": ("bad_input", "accepted, where the spec refuses it"),
    "bad_input_worded_freely": ("bad_input", "the spec's grammar"),
}
# found by the search of hypotheses (conformance/hypotheses.py), each part's ways
EXPECTED |= searched.EXPECTED | fitted.EXPECTED
