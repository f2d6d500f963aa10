r"""Deliberately broken implementations: the reference with one plausible porting bug each.

Every one reuses the reference (``pure_jax``, loaded by name like any implementation: the suite
imports nothing of ``cvae_rosetta.impls``), its adapter's functions and
:class:`cvae_rosetta.spec.protocol.Adapter`, and changes one thing. Each is a module attribute, so
the suite can be pointed at it::

    pytest --pyargs cvae_rosetta.conformance \
        --impl cvae_rosetta.conformance.meta_tests.broken:kl_missing_half

``BUGS`` maps each name to the one-line docstring saying which real-world mistake it models, in
definition order; ``conformance/meta_tests/test_meta.py`` runs the suite on every entry and asserts
that it fails. Adding a function decorated with :func:`bug` adds a case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from cvae_rosetta.spec import canonical, protocol
from cvae_rosetta.spec.canonical import layer_sizes
from cvae_rosetta.spec.config import Config, LossConfig, OptimConfig
from cvae_rosetta.spec.losses import bernoulli_recon, kl_terms
from cvae_rosetta.spec.model import condition, noise, reparameterize, split_moments
from cvae_rosetta.spec.optim import make_optimizer, schedule
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.state import TrainState
from cvae_rosetta.spec.validation import (
    Batch,
    check_batch,
    check_features,
    check_labels,
    check_latent,
)

BASE: Adapter = protocol.load("pure_jax")
BUGS: dict[str, str] = {}  # name -> the docstring of its bug, in definition order


def bug(build: Callable[[], Adapter]) -> Adapter:
    """Register ``build``'s adapter under the function's name, with its docstring as the bug."""
    doc = " ".join((build.__doc__ or "").split())
    assert doc, f"{build.__name__}: every broken implementation says what it models"
    impl = build()
    # Every optional field back to its default (extras replaced, not merged): a broken
    # implementation offers no capability beyond the protocol. The reference's would be unbroken
    # (its other step paths, its ``grads_fn`` for the data-parallel steps) and fail test_training's
    # paths check or test_parallel for that reason, not for the bug.
    optional = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(Adapter)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    impl = dataclasses.replace(
        impl, **(optional | {"name": f"broken:{build.__name__}", "extras": {"bug": doc}})
    )
    BUGS[build.__name__] = doc
    return impl


def _rebuild(cls: type[Adapter], **changes) -> Adapter:
    """The reference's adapter as an instance of ``cls`` (an Adapter with a method changed)."""
    fields = {f.name: getattr(BASE, f.name) for f in dataclasses.fields(Adapter)}
    return cls(**(fields | changes))


def _reference_params(key, config: Config):
    """The reference's initial parameters: its state's, in canonical form (which is its own)."""
    return BASE.to_canonical_fn(BASE.init_fn(key, config))


# --- the pieces a bug replaces --------------------------------------------------------------------
# The reference's forward pass over its canonical parameter tree, written again from its pieces
# (``impls/pure_jax.py``'s ``dense``, ``mlp``, ``encode`` and ``decode``) so that a bug can swap
# one: ``_encoder()`` and ``_decoder()`` with nothing swapped are the reference's ``encode`` and
# ``decode``.


def _dense(layer, h):
    return h @ layer["kernel"].astype(h.dtype) + layer["bias"].astype(h.dtype)


def _mlp(layers, h):
    for layer in layers:
        h = jax.nn.relu(_dense(layer, h))
    return h


def _encoder(*, cond=condition, split=split_moments):
    def encode(params, x, c, model):
        h = cond(x.astype(model.compute_dtype), c, model.num_classes)
        s = _dense(params["latent"], _mlp(params["encoder"], h))
        return split(s, model.latent_dim)

    return encode


def _decoder(*, cond=condition, relu_output=False, output=lambda logits: logits):
    def decode(params, z, c, model):
        *hidden, out = params["decoder"]
        h = _mlp(hidden, cond(z.astype(model.compute_dtype), c, model.num_classes))
        logits = _dense(out, h)
        if relu_output:
            logits = jax.nn.relu(logits)
        return output(logits).astype(jnp.float32)

    return decode


_ENCODE, _DECODE = _encoder(), _decoder()  # the reference's


def _objective(
    *, kl=kl_terms, bernoulli_reduce=jnp.mean, mse_pixel_reduce=jnp.mean, recon=bernoulli_recon
):
    """``cvae_rosetta.spec.losses.cvae_loss`` with one of its pieces swappable."""

    def cvae_loss(logits, x, mean, logvar, loss: LossConfig):
        if loss.kind == "bernoulli":
            recon_value = bernoulli_reduce(recon(logits, x))
            kl_value = bernoulli_reduce(jnp.sum(kl(mean, logvar), axis=-1))
        else:
            squared = jnp.square(jax.nn.sigmoid(logits.astype(jnp.float32)) - x)
            recon_value = jnp.mean(mse_pixel_reduce(0.5 * squared, axis=-1))
            kl_value = jnp.mean(kl(mean, logvar))
        total = recon_value + loss.beta * kl_value
        return total, {"loss": total, "recon": recon_value, "kl": kl_value}

    return cvae_loss


def _pipeline(
    *,
    encode=_ENCODE,
    decode=_DECODE,
    reparam=reparameterize,
    objective=None,
    **changes,
) -> Adapter:
    """The reference's adapter with its forward pass or loss built from other pieces."""
    from cvae_rosetta.spec.losses import cvae_loss

    objective = objective or cvae_loss

    def loss_fn(params, batch, eps, config):
        mean, logvar = encode(params, batch.x, batch.c, config.model)
        z = reparam(mean, logvar, eps)
        return objective(
            decode(params, z, batch.c, config.model), batch.x, mean, logvar, config.loss
        )

    def train_step(state, batch, eps):
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (_, metrics), grads = grad_fn(state.params, batch, eps, state.config)
        return state.apply_gradients(grads), metrics

    fields = dict(
        loss_fn=lambda state, batch, eps: loss_fn(state.params, batch, eps, state.config),
        train_step_fn=train_step,
        encode_fn=lambda state, x, c: encode(state.params, x, c, state.config.model),
        decode_fn=lambda state, z, c: decode(state.params, z, c, state.config.model),
    )
    return dataclasses.replace(BASE, **(fields | changes))


def _state_with_optimizer(make: Callable[[OptimConfig], optax.GradientTransformation]):
    """``from_canonical`` for a state whose optimiser is ``make(config.optim)``, not the spec's."""

    def create(params, config: Config) -> TrainState:
        tx = make(config.optim)
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), config, tx)

    return create


def _init_with(create):
    return lambda key, config: create(_reference_params(key, config), config)


# --- the loss -------------------------------------------------------------------------------------


@bug
def kl_missing_half():
    """The KL term written without its 0.5 (``exp(logvar) + mean^2 - 1 - logvar``), a factor-2 slip
    copying the formula."""
    return _pipeline(objective=_objective(kl=lambda m, lv: jnp.exp(lv) + jnp.square(m) - 1.0 - lv))


@bug
def std_as_exp_logvar():
    """The reparameterisation takes the standard deviation as ``exp(logvar)`` instead of
    ``exp(0.5 * logvar)`` (the output read as a log-std)."""
    return _pipeline(reparam=lambda mean, logvar, eps: mean + jnp.exp(logvar) * eps)


@bug
def loss_summed_over_batch():
    """The Bernoulli loss summed over the batch where the spec averages (PyTorch's
    ``reduction='sum'`` habit), so its scale grows with the batch size."""
    return _pipeline(objective=_objective(bernoulli_reduce=jnp.sum))


@bug
def mse_summed_over_pixels():
    """The ``mse`` reconstruction summed over pixels like the Bernoulli one, where the source
    guide's definition is a mean over every element."""
    return _pipeline(objective=_objective(mse_pixel_reduce=jnp.sum))


@bug
def logits_as_probabilities():
    """``decode`` returns ``sigmoid`` probabilities (a Keras ``activation='sigmoid'`` output
    layer), and the loss then feeds them to a cross-entropy that expects logits."""
    return _pipeline(decode=_decoder(output=jax.nn.sigmoid))


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
    return _pipeline(objective=_objective(recon=_naive_bernoulli))


# --- the model ------------------------------------------------------------------------------------


def _encode_without_label(params, x, c, model):
    first, *rest = params["encoder"]
    h = x.astype(model.compute_dtype)
    h = jax.nn.relu(_dense({**first, "kernel": first["kernel"][: model.input_dim]}, h))
    s = _dense(params["latent"], _mlp(rest, h))
    return split_moments(s, model.latent_dim)


@bug
def encoder_ignores_label():
    """The encoder is fed ``x`` alone, as in the source guide's ``VAE``: only the decoder sees the
    label (the label rows of the first encoder kernel are never read)."""
    return _pipeline(encode=_encode_without_label)


def _one_hot_10(h, c, num_classes):
    del num_classes
    return jnp.concatenate([h, jax.nn.one_hot(c, 10, dtype=h.dtype)], axis=-1)


@bug
def one_hot_hardcoded_10():
    """``one_hot(c, 10)`` hard-coded from an MNIST port instead of ``config.model.num_classes``:
    right for ten labels, wrong for any other number."""
    return _pipeline(encode=_encoder(cond=_one_hot_10), decode=_decoder(cond=_one_hot_10))


@bug
def latent_split_swapped():
    """The latent layer's output split the other way round, ``logvar, mean = split(s, 2)``."""
    return _pipeline(encode=_encoder(split=lambda s, n: split_moments(s, n)[::-1]))


@bug
def relu_on_output_layer():
    """The decoder's MLP loop applies its ReLU after every layer, the output layer included, so
    no logit is ever negative."""
    return _pipeline(decode=_decoder(relu_output=True))


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


class _NoCopyAdapter(Adapter):
    def to_canonical(self, state):
        return self.to_canonical_fn(state)  # the state's own buffers, not copies


@bug
def canonical_views_of_donated_buffers():
    """``to_canonical`` hands out the state's own buffers instead of copies: once a step donates
    the state, the caller's canonical tree is deleted under it."""
    return _rebuild(_NoCopyAdapter)


class _AliasingAdapter(Adapter):
    def from_canonical(self, params, config):
        canonical.check(params, config.model)
        return self.from_canonical_fn(params, config)  # the caller's arrays, not copies


@bug
def from_canonical_keeps_callers_arrays():
    """``from_canonical`` builds the state on the caller's own arrays instead of copies: a jitted
    step that donates the state deletes the caller's parameter tree under it (and every later use
    of that tree fails with "Array has been deleted")."""
    return _rebuild(_AliasingAdapter)


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
        init_fn=lambda key, config: _bf16_master(_reference_params(key, config), config),
        from_canonical_fn=_bf16_master,
        to_canonical_fn=lambda state: jax.tree.map(lambda p: p.astype(jnp.float32), state.params),
    )


def _encode_f32(params, x, c, model):
    return _ENCODE(params, x, c, dataclasses.replace(model, compute_dtype="float32"))


def _decode_f32(params, z, c, model):
    return _DECODE(params, z, c, dataclasses.replace(model, compute_dtype="float32"))


@bug
def compute_dtype_ignored():
    """``compute_dtype`` is never read (a Flax ``Dense`` built without ``dtype=``): a bfloat16
    configuration silently computes in float32."""
    return _pipeline(encode=_encode_f32, decode=_decode_f32)


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
    create = _state_with_optimizer(_adam_without_decay)
    return dataclasses.replace(
        BASE, init_fn=_init_with(create), from_canonical_fn=create, train_step_fn=_l2_train_step
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
    create = _state_with_optimizer(_adamw_without_clipping)
    return dataclasses.replace(BASE, init_fn=_init_with(create), from_canonical_fn=create)


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
    create = _state_with_optimizer(_constant_rate)
    return dataclasses.replace(BASE, init_fn=_init_with(create), from_canonical_fn=create)


def _adam_epsilon_on_uncorrected_root(
    b1: float, b2: float, eps: float
) -> optax.GradientTransformation:
    """Adam as Keras and TensorFlow write it: ``lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)`` and
    ``m / (sqrt(v) + eps)``, in optax's state (a ``ScaleByAdamState``)."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        count = optax.safe_int32_increment(state.count)
        t = count.astype(jnp.float32)
        corrected = jnp.sqrt(1 - b2**t) / (1 - b1**t)
        updates = jax.tree.map(lambda m, v: corrected * m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


@functools.cache
def _keras_adamw(optim: OptimConfig) -> optax.GradientTransformation:
    rate = optim.learning_rate if optim.schedule == "constant" else schedule(optim)
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        _adam_epsilon_on_uncorrected_root(0.9, 0.999, 1e-8),
        optax.add_decayed_weights(optim.weight_decay),
        optax.scale_by_learning_rate(rate),
    )


@bug
def adam_epsilon_on_uncorrected_root():
    """AdamW as ``keras.optimizers.AdamW`` computes it, with the spec's epsilon: the bias
    corrections folded into the rate, ``lr * sqrt(1 - b2^t) / (1 - b1^t)``, and epsilon added to
    the uncorrected ``sqrt(v)``, so the effective epsilon is ``eps / sqrt(1 - b2^t)``, 31.6 times
    the spec's at the first step (invisible until the gradients are tiny)."""
    create = _state_with_optimizer(_keras_adamw)
    return dataclasses.replace(BASE, init_fn=_init_with(create), from_canonical_fn=create)


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
    return _rebuild(_FixedKeyAdapter)


_CALLS = itertools.count()


class _GlobalRngAdapter(Adapter):
    @staticmethod
    def _noise(state, batch, key):
        return Adapter._noise(state, batch, jax.random.fold_in(key, next(_CALLS)))


@bug
def hidden_rng_state():
    """A global generator advanced on every call (the NumPy/PyTorch habit) mixed into the key:
    the same key gives different noise on different calls."""
    return _rebuild(_GlobalRngAdapter)


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
    return _rebuild(_RowNoiseAdapter)


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
    return _rebuild(_UncheckedLabelsAdapter)


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
    return _rebuild(_FreelyWordedAdapter)


NAMES: list[str] = list(BUGS)

# What the suite's diagnosis must say of each: the earliest layer that fails
# (``cvae_rosetta.conformance.layers``) and a phrase of the first line of its cause's message (the
# first check to fail in that layer). ``test_meta.py`` holds every run to it.
EXPECTED: dict[str, tuple[str, str]] = {
    "kl_missing_half": ("loss", "kl is twice the reference"),
    "std_as_exp_logvar": ("loss", "takes exp(logvar) as its standard deviation"),
    "loss_summed_over_batch": ("loss", "a sum over the batch where the spec averages"),
    "mse_summed_over_pixels": ("loss", "a sum over pixels where the spec averages"),
    "logits_as_probabilities": ("forward", "decode returns probabilities sigmoid(logits)"),
    "bernoulli_loss_from_probabilities": ("edges", "at saturated logits"),
    "encoder_ignores_label": ("forward", "the encoder ignores the label"),
    "one_hot_hardcoded_10": ("properties", "labels"),
    "latent_split_swapped": ("forward", "encode returns (logvar, mean)"),
    "relu_on_output_layer": ("forward", "a ReLU after the output layer"),
    "latent_kernel_transposed": ("forward", "['latent']['kernel'] transposed"),
    "biases_dropped_in_conversion": ("surface", "is all zeros"),
    "canonical_views_of_donated_buffers": ("jit", "to_canonical hands out the state's own buffers"),
    "from_canonical_keeps_callers_arrays": ("jit", "from_canonical keeps the caller's arrays"),
    "parameters_stored_in_compute_dtype": ("edges", "the parameters rounded to bfloat16"),
    "compute_dtype_ignored": ("precision", "compute_dtype is ignored"),
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
    "optimizer_rebuilt_every_step": ("jit", "traced 3 times"),
    "key_ignored": ("loss", "eps = normal(key, (B, L))"),
    "hidden_rng_state": ("loss", "eps = normal(key, (B, L))"),
    "noise_shared_by_all_rows": ("loss", "the same noise row for every example"),
    "labels_not_range_checked": ("bad_input", "accepted, where the spec refuses it"),
    "bad_input_worded_freely": ("bad_input", "the spec's grammar"),
}
