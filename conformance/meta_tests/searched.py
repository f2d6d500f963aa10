r"""Broken implementations whose causes the suite finds by its search of hypotheses.

Each is the reference with a mistake from a family of ``cvae_rosetta.conformance.hypotheses`` (or,
for the loss, a factor of :func:`cvae_rosetta.conformance.messages.explain_ratio`'s products): one
for each way of a part that no entry of ``broken`` covers, and one with two departures in the same
part or layer (per-variable clipping after Adam; the KL without its 0.5 and averaged; tanh with
the label first), which the diagnosis must name together. Registered like ``broken``'s, after
them; ``broken.EXPECTED`` holds each to its diagnosis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from cvae_rosetta.conformance.meta_tests.pieces import (
    BASE,
    activated,
    adamw_with,
    decoder,
    dense,
    encoder,
    hand_written_adamw,
    make_objective,
    pipeline,
    prepared,
    with_optimizer,
)
from cvae_rosetta.conformance.meta_tests.registry import bug
from cvae_rosetta.spec.model import condition, split_moments
from cvae_rosetta.spec.protocol import Adapter

# --- the loss -------------------------------------------------------------------------------------


def _bernoulli_mean_over_pixels(logits, x):
    logits = logits.astype(jnp.float32)
    return jnp.mean(jax.nn.softplus(logits) - logits * x.astype(jnp.float32), axis=-1)


@bug
def bernoulli_mean_over_pixels():
    """The Bernoulli term averaged over pixels, ``optax.sigmoid_binary_cross_entropy(...).mean()``
    over every element, where the spec sums over pixels and averages over the batch."""
    return pipeline(objective=make_objective(recon=_bernoulli_mean_over_pixels))


@bug
def kl_mean_over_latent_dimensions():
    """The KL term averaged over latent dimensions (``jnp.mean(kl_terms(...))`` over every element)
    where the Bernoulli loss sums them."""
    return pipeline(objective=make_objective(kl_latent_reduce=jnp.mean))


@bug
def kl_missing_half_and_averaged():
    """Two slips in one term: the KL without its 0.5, and averaged over latent dimensions."""
    return pipeline(
        objective=make_objective(
            kl=lambda m, lv: jnp.exp(lv) + jnp.square(m) - 1.0 - lv, kl_latent_reduce=jnp.mean
        )
    )


@bug
def kl_reported_weighted():
    """``metrics["kl"]`` reported as ``beta * kl``, the term as it enters the loss, while the loss
    itself is right: the spec's metrics report the unweighted KL."""

    def finish(recon, kl, beta):
        total = recon + beta * kl
        return total, {"loss": total, "recon": recon, "kl": beta * kl}

    return pipeline(objective=make_objective(finish=finish))


@bug
def beta_weighs_reconstruction():
    """``loss = beta * recon + kl``: beta put on the wrong term (reading beta as the weight of the
    data term)."""

    def finish(recon, kl, beta):
        total = beta * recon + kl
        return total, {"loss": total, "recon": recon, "kl": kl}

    return pipeline(objective=make_objective(finish=finish))


# --- the model ------------------------------------------------------------------------------------


def _label_first(h, c, num_classes):
    return jnp.concatenate([jax.nn.one_hot(c, num_classes, dtype=h.dtype), h], axis=-1)


@bug
def label_concatenated_first():
    """The one-hot label concatenated before the input, ``[one_hot(c), x]`` (and ``[one_hot(c),
    z]``), where the spec's canonical kernels read ``[x, one_hot(c)]``: the shapes agree."""
    return pipeline(
        encode=encoder(cond=_label_first),
        decode=decoder(cond=_label_first),
    )


@bug
def gelu_hidden_activation():
    """GELU as the hidden layers' activation (a transformer habit) where the spec's is ReLU."""
    return pipeline(encode=encoder(act=jax.nn.gelu), decode=decoder(act=jax.nn.gelu))


def _relu_latent(s, latent_dim):
    return split_moments(jax.nn.relu(s), latent_dim)


@bug
def relu_after_latent_layer():
    """The latent layer built like the hidden ones, with its ReLU (``Dense(2 * L,
    activation='relu')``): mean and logvar are never negative."""
    return pipeline(encode=encoder(split=_relu_latent))


@bug
def tanh_activation_label_first():
    """Two slips in the forward pass: tanh as the hidden activation, and the label concatenated
    before the input."""
    return pipeline(
        encode=encoder(cond=_label_first, act=jnp.tanh),
        decode=decoder(cond=_label_first, act=jnp.tanh),
    )


# --- optimisation ---------------------------------------------------------------------------------


def _clip_then_adamw(clip: Callable[[float], optax.GradientTransformation]) -> Adapter:
    """The spec's chain with its clipping replaced by ``clip(clip_norm)``."""
    return with_optimizer(
        lambda optim: optax.chain(
            clip(optim.clip_norm),
            optax.adamw(
                optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
            ),
        )
    )


def _clip_each_leaf(clip_norm: float) -> optax.GradientTransformation:
    """Each variable's gradient clipped to norm ``clip_norm`` on its own (Keras's ``clipnorm``)."""

    def clip(updates, state, params=None):
        del params
        scaled = jax.tree.map(
            lambda g: g * jnp.minimum(1.0, clip_norm / jnp.maximum(jnp.linalg.norm(g), 1e-30)),
            updates,
        )
        return scaled, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), clip)


@bug
def clipping_after_adam():
    """The chain written the other way round, ``optax.chain(adamw(...), clip_by_global_norm(...))``:
    Adam's update is clipped, not the gradient, so a small clip norm all but stops the step."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.adamw(
                optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
            ),
            optax.clip_by_global_norm(optim.clip_norm),
        )
    )


@bug
def clipping_per_variable():
    """Keras's ``clipnorm`` (each variable's gradient clipped to the norm on its own) where the
    spec clips the global norm (Keras's ``global_clipnorm``)."""
    return _clip_then_adamw(_clip_each_leaf)


@bug
def clipping_per_variable_after_adam():
    """Two mistakes in one part: each variable's update clipped on its own, after Adam."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.adamw(
                optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay
            ),
            _clip_each_leaf(optim.clip_norm),
        )
    )


@bug
def weight_decay_not_scaled_by_rate():
    """The AdamW paper's ``theta -= lr * adam + wd * theta`` where optax (the spec) scales the decay
    by the rate too: ``scale_by_adam``, ``scale(-lr)``, then ``add_decayed_weights(-wd)``."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8),
            optax.scale(-optim.learning_rate),
            optax.add_decayed_weights(-optim.weight_decay),
        )
    )


@bug
def weight_decay_in_adam_gradient():
    """``torch.optim.Adam(weight_decay=...)``'s habit: ``weight_decay * params`` added to the
    clipped gradient inside the optimiser, before Adam, where AdamW decouples it."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.add_decayed_weights(optim.weight_decay),
            optax.adam(optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8),
        )
    )


@bug
def weight_decay_forgotten():
    """``optax.adam`` where the spec has ``optax.adamw``: ``weight_decay`` never read."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.adam(optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8),
        )
    )


@bug
def epsilon_inside_root():
    """Epsilon inside the square root, ``sqrt(v_hat + eps)`` (optax's ``eps_root``, some papers'
    form), where the spec adds it to ``sqrt(v_hat)``."""
    return with_optimizer(lambda optim: adamw_with(optim, eps=0.0, eps_root=1e-8))


@bug
def keras_default_epsilon():
    """Keras's default epsilon 1e-7 copied into optax's AdamW (where the spec's is 1e-8)."""
    return with_optimizer(lambda optim: adamw_with(optim, eps=1e-7))


@bug
def adam_rates_swapped():
    """``b1`` and ``b2`` given in the wrong order (``adamw(lr, 0.999, 0.9)``): the first step is the
    spec's, the later ones are not."""
    return with_optimizer(lambda optim: adamw_with(optim, b1=0.999, b2=0.9))


@bug
def update_added():
    """The update added where it is subtracted: ``scale_by_learning_rate(lr, flip_sign=False)``
    after ``scale_by_adam``, so every step climbs the loss."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8),
            optax.add_decayed_weights(optim.weight_decay),
            optax.scale_by_learning_rate(optim.learning_rate, flip_sign=False),
        )
    )


@bug
def adam_first_moment_corrected_only():
    """Adam written out by hand with ``m_hat = m / (1 - b1^t)`` but ``v`` used as it is: the
    second correction forgotten."""
    return with_optimizer(
        lambda optim: hand_written_adamw(optim, correct_first=True, correct_second=False)
    )


@bug
def adam_second_moment_corrected_only():
    """Adam written out by hand with ``v_hat = v / (1 - b2^t)`` but ``m`` used as it is: the
    first correction forgotten."""
    return with_optimizer(
        lambda optim: hand_written_adamw(optim, correct_first=False, correct_second=True)
    )


@bug
def keras_adam_at_its_default_epsilon():
    """``keras.optimizers.AdamW`` as it is, default epsilon included: the corrections folded into
    the rate, epsilon 1e-7 on the raw root, where the spec adds 1e-8 to the corrected root."""
    return with_optimizer(
        lambda optim: hand_written_adamw(
            optim, correct_first=False, correct_second=False, folded=True, eps=1e-7
        )
    )


@bug
def gelu_exact_hidden_activation():
    """PyTorch's ``nn.GELU()`` (the exact erf form) as the hidden activation, where the spec's is
    ReLU."""
    return activated(functools.partial(jax.nn.gelu, approximate=False))


@bug
def silu_hidden_activation():
    """SiLU (swish, ``jax.nn.silu``) as the hidden activation, a habit from diffusion models'
    networks, where the spec's is ReLU."""
    return activated(jax.nn.silu)


@bug
def sigmoid_hidden_activation():
    """Sigmoid hidden layers, as in textbook multilayer perceptrons, where the spec's is ReLU."""
    return activated(jax.nn.sigmoid)


@bug
def leaky_relu_hidden_activation():
    """Leaky ReLU (slope 0.01, ``jax.nn.leaky_relu``'s default), a GAN habit, where the spec's is
    ReLU."""
    return activated(jax.nn.leaky_relu)


@bug
def elu_hidden_activation():
    """ELU hidden layers (``jax.nn.elu``), where the spec's is ReLU."""
    return activated(jax.nn.elu)


@bug
def softplus_hidden_activation():
    """Softplus hidden layers (a smooth ReLU), where the spec's is ReLU."""
    return activated(jax.nn.softplus)


def _mlp_last_linear(layers, h, linear):
    *activated, last = layers
    for layer in activated:
        h = jax.nn.relu(linear(layer, h))
    return linear(last, h)


def _encode_last_hidden_linear(params, x, c, model):
    h = condition(x.astype(model.compute_dtype), c, model.num_classes)
    s = dense(params["latent"], _mlp_last_linear(params["encoder"], h, dense))
    return split_moments(s, model.latent_dim)


@bug
def last_hidden_layer_linear():
    """The encoder's layers written as ``Sequential([Dense, ReLU, Dense])``, the activation after
    its last hidden layer left out, where the spec applies ReLU after every hidden layer."""
    return pipeline(encode=_encode_last_hidden_linear)


def _clip_by_norm_without_root(clip_norm: float) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        del params
        total = sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(updates))
        scale = jnp.minimum(1.0, clip_norm / total)
        return jax.tree.map(lambda g: g * scale, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@bug
def clipping_by_value():
    """``optax.clip(clip_norm)`` (Keras's ``clipvalue``): every entry clipped to [-c, c] where the
    spec scales the whole gradient down to global norm c."""
    return _clip_then_adamw(optax.clip)


@bug
def clipping_norm_without_root():
    """The global norm written as ``sum(g ** 2)``, its square root left out, in a clip written by
    hand: the factor is ``min(1, c / sum(g^2))``."""
    return _clip_then_adamw(_clip_by_norm_without_root)


@bug
def amsgrad_from_optax():
    """``optax.amsgrad`` (with the decay added) where the spec has Adam: the root of the running
    maximum of ``v_hat``, the same as Adam at the first step and not after."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            optax.scale_by_amsgrad(b1=0.9, b2=0.999, eps=1e-8),
            optax.add_decayed_weights(optim.weight_decay),
            optax.scale_by_learning_rate(optim.learning_rate),
        )
    )


@bug
def kl_minus_one_dropped():
    """The KL terms' ``-1`` left out as "only a constant", ``0.5 * (exp(logvar) + mean^2 -
    logvar)``: the gradient is the spec's, the reported kl is L/2 too high."""
    return pipeline(
        objective=make_objective(kl=lambda m, lv: 0.5 * (jnp.exp(lv) + jnp.square(m) - lv))
    )


def _bce_arguments_swapped(logits, x):
    x = x.astype(jnp.float32)
    return jnp.sum(optax.sigmoid_binary_cross_entropy(x, logits.astype(jnp.float32)), axis=-1)


@bug
def bernoulli_arguments_swapped():
    """Keras's ``binary_crossentropy(y_true, y_pred)`` order given to optax's
    ``sigmoid_binary_cross_entropy(logits, labels)``: the images taken as logits."""
    return pipeline(objective=make_objective(recon=_bce_arguments_swapped))


def _metrics_after_update(state, batch, eps):
    new, _ = BASE.train_step_fn(state, batch, eps)
    _, metrics = BASE.loss_fn(new, batch, eps)
    return new, metrics


@bug
def step_metrics_after_update():
    """The step's metrics computed again after ``apply_gradients`` (a logging call placed after
    the update), where the spec reports the loss the gradients came from."""
    return dataclasses.replace(BASE, train_step_fn=_metrics_after_update)


def _one_based(h, c, num_classes):
    return jnp.concatenate([h, jax.nn.one_hot(c - 1, num_classes, dtype=h.dtype)], axis=-1)


@bug
def labels_one_based():
    """``one_hot(c - 1)`` kept from a port of 1-based labels (MATLAB, some datasets' files):
    label 0 becomes a row of zeros and every other label the one before it."""
    return pipeline(encode=encoder(cond=_one_based), decode=decoder(cond=_one_based))


@bug
def input_binarised():
    """The encoder fed ``x > 0.5`` (a binarised-MNIST habit) where the spec feeds the grey levels
    in [0, 1]."""
    return pipeline(encode=prepared(lambda x: (x > 0.5).astype(x.dtype)))


@bug
def input_rescaled():
    """The encoder fed ``2x - 1`` (images normalised to [-1, 1], a GAN habit) where the spec
    feeds x in [0, 1]."""
    return pipeline(encode=prepared(lambda x: 2.0 * x - 1.0))


def _transposed(x):
    side = math.isqrt(x.shape[-1])
    return jnp.swapaxes(x.reshape(*x.shape[:-1], side, side), -1, -2).reshape(x.shape)


@bug
def input_transposed():
    """Each image flattened column by column (an image layout mix-up between libraries) where the
    spec's x is each image's rows one after the other."""
    return pipeline(encode=prepared(_transposed))


def _clip_by_sum_of_norms(clip_norm: float) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        del params
        total = sum(jnp.linalg.norm(g) for g in jax.tree.leaves(updates))
        return jax.tree.map(lambda g: g * jnp.minimum(1.0, clip_norm / total), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@bug
def clipping_by_sum_of_norms():
    """A clip written by hand whose norm adds the variables' norms, ``sum(norm(g) for g in
    leaves)``, where the global norm is the root of every square together."""
    return _clip_then_adamw(_clip_by_sum_of_norms)


def _optax_variant(make: Callable[..., optax.GradientTransformation]) -> Adapter:
    """The spec's chain with ``adamw`` replaced by ``make`` (an optax optimiser of AdamW's
    arguments)."""
    return with_optimizer(
        lambda optim: optax.chain(
            optax.clip_by_global_norm(optim.clip_norm),
            make(optim.learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay),
        )
    )


@bug
def nadam_from_optax():
    """``optax.nadamw`` (Adam with Nesterov's momentum) where the spec has ``optax.adamw``."""
    return _optax_variant(optax.nadamw)


@bug
def adamax_from_optax():
    """``optax.adamaxw`` (Adam's infinity-norm variant) where the spec has ``optax.adamw``: the
    same as Adam at the first step and not after."""
    return _optax_variant(optax.adamaxw)


@bug
def momentum_without_damping():
    """Adam written out by hand with ``m = b1 * m + g`` (heavy-ball momentum, as SGD's momentum is
    written) where the spec's first moment is ``b1 * m + (1 - b1) * g``."""
    return with_optimizer(
        lambda optim: hand_written_adamw(
            optim, correct_first=True, correct_second=True, first_damping=1.0
        )
    )


@bug
def no_first_moment():
    """``optax.adamw(..., b1=0.0)``: a port that read b1 as "no momentum", so the update is the
    gradient over ``sqrt(v_hat)``, RMSprop-like."""
    return with_optimizer(lambda optim: adamw_with(optim, b1=0.0))


def _bias_after(layers, h, linear, act):
    for layer in layers:
        h = act(h @ layer["kernel"].astype(h.dtype)) + layer["bias"].astype(h.dtype)
    return h


def _encode_bias_after(params, x, c, model):
    h = condition(x.astype(model.compute_dtype), c, model.num_classes)
    s = dense(params["latent"], _bias_after(params["encoder"], h, dense, jax.nn.relu))
    return split_moments(s, model.latent_dim)


@bug
def bias_after_activation():
    """Each hidden layer written ``relu(h @ W) + b``, the bias added after the activation (a
    hand-written layer), where the spec's is ``relu(h @ W + b)``."""
    return pipeline(encode=_encode_bias_after)


@bug
def bias_correction_one_step_ahead():
    """Adam written out by hand with the count incremented before the step and again in the
    corrections, ``1 - b1 ** (t + 1)``, where the spec's step t divides by ``1 - b1 ** t``."""
    return with_optimizer(
        lambda optim: hand_written_adamw(optim, correct_first=True, correct_second=True, ahead=1)
    )


@bug
def kl_for_log_sigma():
    """The KL written for an encoder that returns log sigma, ``0.5 * (exp(2 lv) + m^2 - 1 -
    2 lv)``, while the encoder and the sample treat its output as logvar (the spec's)."""
    return pipeline(
        objective=make_objective(
            kl=lambda m, lv: 0.5 * (jnp.exp(2 * lv) + jnp.square(m) - 1.0 - 2 * lv)
        )
    )


@bug
def kl_without_mean_square():
    """The KL terms without ``mean^2``, ``0.5 * (exp(lv) - 1 - lv)`` (the mean's part dropped)."""
    return pipeline(objective=make_objective(kl=lambda m, lv: 0.5 * (jnp.exp(lv) - 1.0 - lv)))


@bug
def kl_the_other_way_round():
    """KL(prior || posterior) where the spec's is KL(posterior || prior): ``0.5 * ((1 + m^2) *
    exp(-lv) - 1 + lv)``."""
    return pipeline(
        objective=make_objective(
            kl=lambda m, lv: 0.5 * ((1.0 + jnp.square(m)) * jnp.exp(-lv) - 1.0 + lv)
        )
    )


def _squared_error_loss(logits, x, mean, logvar, loss):
    from cvae_rosetta.spec.losses import cvae_loss, kl_terms

    if loss.kind != "mse":
        return cvae_loss(logits, x, mean, logvar, loss)
    recon = jnp.mean(optax.squared_error(jax.nn.sigmoid(logits.astype(jnp.float32)), x))
    kl = jnp.mean(kl_terms(mean, logvar))
    total = recon + loss.beta * kl
    return total, {"loss": total, "recon": recon, "kl": kl}


@bug
def mse_without_half():
    """``optax.squared_error`` (``(p - x)^2``) where the spec's mse term is ``optax.l2_loss``
    (``0.5 * (p - x)^2``)."""
    return pipeline(objective=_squared_error_loss)


# What the suite's diagnosis must say of each (``broken.EXPECTED`` holds them with the others').
EXPECTED: dict[str, tuple[str, str]] = {
    "bernoulli_mean_over_pixels": ("loss", "recon is 1/64 of the reference"),
    "kl_mean_over_latent_dimensions": (
        "loss",
        "kl is 1/8 of the reference (0.175605 against 1.40484): a mean over latent dimensions",
    ),
    "kl_missing_half_and_averaged": (
        "loss",
        "kl is 1/4 of the reference (0.351211 against 1.40484): a mean over latent dimensions "
        "where the spec sums, and the KL terms written without their factor 0.5",
    ),
    "kl_reported_weighted": (
        "loss",
        "the factor is beta = 0.25 (config.loss.beta): kl reported weighted, beta * kl",
    ),
    "beta_weighs_reconstruction": ("loss", "loss is beta * recon + kl"),
    "label_concatenated_first": (
        "forward",
        "with the one-hot label concatenated before its input ([one_hot(c), x])",
    ),
    "gelu_hidden_activation": ("forward", "with GELU (tanh approximation"),
    "relu_after_latent_layer": ("forward", "with a ReLU after the latent layer"),
    "tanh_activation_label_first": (
        "forward",
        "with tanh as the hidden layers' activation and with the one-hot label concatenated "
        "before its input",
    ),
    "clipping_after_adam": ("step", "the step is AdamW's with clip_by_global_norm after Adam"),
    "clipping_per_variable": ("step", "with each variable clipped to norm clip_norm on its own"),
    "clipping_per_variable_after_adam": (
        "step",
        "with clip_by_global_norm after Adam (the update clipped, not the gradient: "
        "optax.chain(adamw(...), clip_by_global_norm(...))) and with each variable clipped",
    ),
    "weight_decay_not_scaled_by_rate": (
        "step",
        "with the weight decay not scaled by the learning rate",
    ),
    "weight_decay_in_adam_gradient": ("step", "torch.optim.Adam's weight_decay"),
    "weight_decay_forgotten": ("step", "without weight decay"),
    "epsilon_inside_root": ("step", "with epsilon inside the root, sqrt(v_hat + eps)"),
    "keras_default_epsilon": ("step", "with epsilon 1e-07 (Keras's default)"),
    "adam_rates_swapped": ("later_steps", "with b1 and b2 swapped"),
    "update_added": ("step", "with every update's sign flipped"),
    "adam_first_moment_corrected_only": ("step", "with the bias correction of m alone"),
    "adam_second_moment_corrected_only": ("step", "with the bias correction of v alone"),
    "keras_adam_at_its_default_epsilon": (
        "step",
        "and Keras's default epsilon 1e-07 where the spec's is 1e-08",
    ),
    "gelu_exact_hidden_activation": ("forward", "with exact GELU (erf form"),
    "silu_hidden_activation": ("forward", "with SiLU (swish) as the hidden layers' activation"),
    "sigmoid_hidden_activation": ("forward", "with sigmoid as the hidden layers' activation"),
    "leaky_relu_hidden_activation": ("forward", "with leaky ReLU (slope 0.01)"),
    "elu_hidden_activation": ("forward", "with ELU as the hidden layers' activation"),
    "softplus_hidden_activation": ("forward", "with softplus as the hidden layers' activation"),
    "last_hidden_layer_linear": ("forward", "with no activation after the last hidden layer"),
    "clipping_by_value": ("step", "with each entry clipped to [-clip_norm, clip_norm]"),
    "clipping_norm_without_root": ("step", "the norm's square root left out"),
    "amsgrad_from_optax": ("later_steps", "running maximum of the corrected v_hat"),
    "kl_minus_one_dropped": ("loss", "the KL terms written without their -1"),
    "bernoulli_arguments_swapped": ("loss", "the Bernoulli loss with its arguments swapped"),
    "step_metrics_after_update": ("step", "at the parameters after the update"),
    "labels_one_based": ("forward", "with the labels shifted, one_hot(c - 1)"),
    "input_binarised": ("forward", "with x binarised (x > 0.5)"),
    "input_rescaled": ("forward", "with x rescaled to [-1, 1]"),
    "input_transposed": ("forward", "with each image's pixels read column by column"),
    "clipping_by_sum_of_norms": ("step", "the sum of the variables' norms"),
    "nadam_from_optax": ("step", "with Nesterov's momentum"),
    "adamax_from_optax": ("later_steps", "with Adamax's infinity norm"),
    "momentum_without_damping": ("step", "m = b1 m + g (heavy-ball momentum)"),
    "no_first_moment": ("later_steps", "without a first moment"),
    "bias_after_activation": ("forward", "bias added after its activation, act(h W) + b"),
    "bias_correction_one_step_ahead": ("step", "with the bias corrections one step ahead"),
    "kl_for_log_sigma": ("loss", "the KL written for a log standard deviation"),
    "kl_without_mean_square": ("loss", "the KL terms without mean^2"),
    "kl_the_other_way_round": ("loss", "the KL the other way round"),
    "mse_without_half": ("loss", "the squared error without its 1/2"),
}
