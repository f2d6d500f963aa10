"""The reference rewritten from pieces a broken implementation can swap, for ``broken``.

The reference (``pure_jax``, loaded by name like any implementation: the suite imports nothing of
``cvae_rosetta.impls``) and its forward pass and loss written again over its canonical parameter
tree from its pieces (``impls/pure_jax.py``'s ``dense``, ``mlp``, ``encode`` and ``decode``):
:func:`pipeline` with nothing swapped computes what the reference does, bit for bit
(``test_meta.py`` holds it to that), so each broken implementation of
:mod:`cvae_rosetta.conformance.meta_tests.broken` and ``searched`` differs from the reference by
its bug alone. :func:`hand_written_adamw` is the spec's optimiser with Adam written out by hand,
for the bugs of its arithmetic.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.config import Config, LossConfig, OptimConfig
from cvae_rosetta.spec.losses import bernoulli_recon, kl_terms
from cvae_rosetta.spec.model import condition, reparameterize, split_moments
from cvae_rosetta.spec.optim import schedule
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.state import TrainState

BASE: Adapter = protocol.load("pure_jax")


def rebuild(cls: type[Adapter], **changes) -> Adapter:
    """The reference's adapter as an instance of ``cls`` (an Adapter with a method changed)."""
    fields = {f.name: getattr(BASE, f.name) for f in dataclasses.fields(Adapter)}
    return cls(**(fields | changes))


def reference_params(key, config: Config):
    """The reference's initial parameters: its state's, in canonical form (which is its own)."""
    return BASE.to_canonical_fn(BASE.init_fn(key, config))


# --- the pieces a bug replaces --------------------------------------------------------------------
# ``encoder()`` and ``decoder()`` with nothing swapped are the reference's ``encode``, ``decode``.


def dense(layer, h):
    return h @ layer["kernel"].astype(h.dtype) + layer["bias"].astype(h.dtype)


def mlp(layers, h, linear=dense, act=jax.nn.relu):
    for layer in layers:
        h = act(linear(layer, h))
    return h


def encoder(*, cond=condition, split=split_moments, linear=dense, act=jax.nn.relu):
    def encode(params, x, c, model):
        h = cond(x.astype(model.compute_dtype), c, model.num_classes)
        s = linear(params["latent"], mlp(params["encoder"], h, linear, act))
        return split(s, model.latent_dim)

    return encode


def decoder(
    *,
    cond=condition,
    relu_output=False,
    output=lambda logits: logits,
    linear=dense,
    act=jax.nn.relu,
):
    def decode(params, z, c, model):
        *hidden, out = params["decoder"]
        h = mlp(hidden, cond(z.astype(model.compute_dtype), c, model.num_classes), linear, act)
        logits = linear(out, h)
        if relu_output:
            logits = jax.nn.relu(logits)
        return output(logits).astype(jnp.float32)

    return decode


ENCODE, DECODE = encoder(), decoder()  # the reference's


def spec_finish(recon, kl, beta):
    """The total and the metrics from the two terms, as the spec writes them."""
    total = recon + beta * kl
    return total, {"loss": total, "recon": recon, "kl": kl}


def make_objective(
    *,
    kl=kl_terms,
    bernoulli_reduce=jnp.mean,
    mse_pixel_reduce=jnp.mean,
    recon=bernoulli_recon,
    kl_latent_reduce=jnp.sum,
    finish=spec_finish,
):
    """``cvae_rosetta.spec.losses.cvae_loss`` with one of its pieces swappable: a term, a
    reduction, the total and the metrics reported (``finish(recon, kl, beta)``)."""

    def cvae_loss(logits, x, mean, logvar, loss: LossConfig):
        if loss.kind == "bernoulli":
            recon_value = bernoulli_reduce(recon(logits, x))
            kl_value = bernoulli_reduce(kl_latent_reduce(kl(mean, logvar), axis=-1))
        else:
            squared = jnp.square(jax.nn.sigmoid(logits.astype(jnp.float32)) - x)
            recon_value = jnp.mean(mse_pixel_reduce(0.5 * squared, axis=-1))
            kl_value = jnp.mean(kl(mean, logvar))
        return finish(recon_value, kl_value, loss.beta)

    return cvae_loss


def pipeline(
    *,
    encode=ENCODE,
    decode=DECODE,
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


def state_with_optimizer(make: Callable[[OptimConfig], optax.GradientTransformation]):
    """``from_canonical`` for a state whose optimiser is ``make(config.optim)``, not the spec's."""

    def create(params, config: Config) -> TrainState:
        tx = make(config.optim)
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), config, tx)

    return create


def init_with(create):
    return lambda key, config: create(reference_params(key, config), config)


def adam_written_out(
    *,
    correct_first: bool,
    correct_second: bool,
    folded: bool = False,
    eps: float = 1e-8,
    first_damping: float = 0.1,
    ahead: int = 0,
) -> optax.GradientTransformation:
    """Adam (b1 0.9, b2 0.999) written out by hand in optax's state: each moment bias-corrected
    or not, or (``folded``) both corrections folded into the rate with epsilon on the raw root, as
    Keras writes it; ``m = b1 m + first_damping g`` (the spec's damping is 1 - b1); the
    corrections ``ahead`` steps ahead of the count."""
    b1, b2 = 0.9, 0.999

    def init(params):
        mu, nu = (jax.tree.map(jnp.zeros_like, params) for _ in range(2))
        return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    def update(updates, state, params=None):
        del params
        mu = jax.tree.map(lambda m, g: b1 * m + first_damping * g, state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        count = optax.safe_int32_increment(state.count)
        t = count.astype(jnp.float32) + ahead
        c1 = 1 - b1**t if correct_first else 1.0
        c2 = 1 - b2**t if correct_second else 1.0
        if folded:
            rate = jnp.sqrt(1 - b2**t) / (1 - b1**t)
            new = jax.tree.map(lambda m, v: rate * m / (jnp.sqrt(v) + eps), mu, nu)
        else:
            new = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
        return new, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


@functools.cache
def hand_written_adamw(optim: OptimConfig, **adam) -> optax.GradientTransformation:
    """The spec's chain with Adam written out by hand (:func:`adam_written_out` with ``adam``),
    then the decay and the rate (its schedule's, where it has one), as optax's adamw has them."""
    rate = optim.learning_rate if optim.schedule == "constant" else schedule(optim)
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        adam_written_out(**adam),
        optax.add_decayed_weights(optim.weight_decay),
        optax.scale_by_learning_rate(rate),
    )


def with_optimizer(make: Callable[[OptimConfig], optax.GradientTransformation]) -> Adapter:
    """The reference with the optimiser ``make(optim)`` makes."""
    create = state_with_optimizer(functools.cache(make))
    return dataclasses.replace(BASE, init_fn=init_with(create), from_canonical_fn=create)


def adamw_with(optim: OptimConfig, **changes) -> optax.GradientTransformation:
    """The spec's chain, ``clip_by_global_norm`` then ``adamw``, with ``adamw``'s arguments
    ``changes`` changed."""
    settings = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=optim.weight_decay) | changes
    return optax.chain(
        optax.clip_by_global_norm(optim.clip_norm), optax.adamw(optim.learning_rate, **settings)
    )


def activated(act) -> Adapter:
    """The reference with ``act`` as the hidden layers' activation."""
    return pipeline(encode=encoder(act=act), decode=decoder(act=act))


def prepared(how):
    """The reference's encoder fed ``how(x)``."""

    def cond(x, c, num_classes):
        return condition(how(x), c, num_classes)

    return encoder(cond=cond)
