"""SPEC sections 1 to 5 in float64 NumPy, gradients by hand: the suite's independent reference.

Nothing here calls JAX or optax, so an error in JAX's autodiff, in the shared loss code, in the
shared optimiser or in an implementation cannot hide by being shared with the reference. Parameters
are the canonical tree of SPEC section 2. The optimiser (:func:`adamw_step`) and its learning-rate
schedules (:func:`learning_rate`) are written from their formulas (docs/spec.md, "Optimiser").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cvae_rosetta.spec.config import LossConfig

F64 = np.float64
DEFAULT_LOSS = LossConfig()  # Bernoulli, beta 1


def as64(tree: Any) -> Any:
    """The canonical tree with every leaf as a float64 NumPy array."""
    if isinstance(tree, dict):
        return {k: as64(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [as64(v) for v in tree]
    return np.asarray(tree, dtype=F64)


def one_hot(c: np.ndarray, num_classes: int) -> np.ndarray:
    out = np.zeros((len(c), num_classes), F64)
    out[np.arange(len(c)), np.asarray(c)] = 1.0
    return out


def sigmoid(a: np.ndarray) -> np.ndarray:
    return np.where(
        a >= 0, 1.0 / (1.0 + np.exp(-np.abs(a))), np.exp(-np.abs(a)) / (1.0 + np.exp(-np.abs(a)))
    )


def _mlp_forward(layers, h, relu_last: bool):
    """Activations of each layer input, and the pre-activations, for the backward pass."""
    inputs, pre = [], []
    for i, layer in enumerate(layers):
        inputs.append(h)
        a = h @ layer["kernel"] + layer["bias"]
        pre.append(a)
        h = np.maximum(a, 0.0) if (relu_last or i < len(layers) - 1) else a
    return h, inputs, pre


def _mlp_backward(layers, inputs, pre, grad_out, relu_last: bool):
    grads = [None] * len(layers)
    g = grad_out
    for i in reversed(range(len(layers))):
        if relu_last or i < len(layers) - 1:
            g = g * (pre[i] > 0)
        grads[i] = {"kernel": inputs[i].T @ g, "bias": g.sum(axis=0)}
        g = g @ layers[i]["kernel"].T
    return grads, g


def encode(params, x, c, num_classes):
    p = as64(params)
    h0 = np.concatenate([np.asarray(x, F64), one_hot(c, num_classes)], axis=1)
    h, _, _ = _mlp_forward(p["encoder"], h0, relu_last=True)
    s = h @ p["latent"]["kernel"] + p["latent"]["bias"]
    latent = s.shape[1] // 2
    return s[:, :latent], s[:, latent:]


def decode(params, z, c, num_classes):
    p = as64(params)
    g0 = np.concatenate([np.asarray(z, F64), one_hot(c, num_classes)], axis=1)
    logits, _, _ = _mlp_forward(p["decoder"], g0, relu_last=False)
    return logits


@dataclass
class Result:
    loss: float
    recon: float
    kl: float
    grads: Any  # canonical tree of float64 gradients of ``loss``
    mean: np.ndarray
    logvar: np.ndarray
    logits: np.ndarray


def loss_and_grad(
    params, x, c, eps, *, num_classes: int, loss: LossConfig = DEFAULT_LOSS
) -> Result:
    """The loss of SPEC section 4 (``loss``: its kind and beta) for noise ``eps`` and its exact
    gradient, all in float64.

    Stable at the edges ``test_edges`` checks: the Bernoulli term is the softplus form
    ``max(l, 0) - l x + log1p(exp(-|l|))`` and its gradient ``sigmoid(l) - x`` (``sigmoid`` never
    exponentiates a positive number), finite for any finite logit; ``exp(logvar)`` is finite in
    float64 up to logvar = 709."""
    kind, beta = loss.kind, loss.beta
    p = as64(params)
    x = np.asarray(x, F64)
    eps = np.asarray(eps, F64)
    y = one_hot(c, num_classes)
    b, d = x.shape
    latent = eps.shape[1]

    h0 = np.concatenate([x, y], axis=1)
    h, enc_in, enc_pre = _mlp_forward(p["encoder"], h0, relu_last=True)
    s = h @ p["latent"]["kernel"] + p["latent"]["bias"]
    mean, logvar = s[:, :latent], s[:, latent:]
    std = np.exp(0.5 * logvar)
    z = mean + std * eps
    g0 = np.concatenate([z, y], axis=1)
    logits, dec_in, dec_pre = _mlp_forward(p["decoder"], g0, relu_last=False)

    kl_terms = 0.5 * (np.exp(logvar) + mean**2 - 1.0 - logvar)
    dkl_dmean, dkl_dlogvar = mean, 0.5 * (np.exp(logvar) - 1.0)
    prob = sigmoid(logits)
    if kind == "bernoulli":
        bce = np.maximum(logits, 0) - logits * x + np.log1p(np.exp(-np.abs(logits)))
        recon = bce.sum(axis=1).mean()
        kl = kl_terms.sum(axis=1).mean()
        d_logits = (prob - x) / b
        kl_scale = beta / b
    elif kind == "mse":
        recon = np.mean(0.5 * (prob - x) ** 2)
        kl = np.mean(kl_terms)
        d_logits = (prob - x) * prob * (1 - prob) / (b * d)
        kl_scale = beta / (b * latent)
    else:
        raise ValueError(f"kind: expected bernoulli or mse, got {kind!r}")

    dec_grads, d_g0 = _mlp_backward(p["decoder"], dec_in, dec_pre, d_logits, relu_last=False)
    d_z = d_g0[:, :latent]
    d_mean = d_z + kl_scale * dkl_dmean
    d_logvar = d_z * eps * 0.5 * std + kl_scale * dkl_dlogvar
    d_s = np.concatenate([d_mean, d_logvar], axis=1)
    latent_grads = {"kernel": h.T @ d_s, "bias": d_s.sum(axis=0)}
    d_h = d_s @ p["latent"]["kernel"].T
    enc_grads, _ = _mlp_backward(p["encoder"], enc_in, enc_pre, d_h, relu_last=True)

    grads = {"encoder": enc_grads, "latent": latent_grads, "decoder": dec_grads}
    return Result(float(recon + beta * kl), float(recon), float(kl), grads, mean, logvar, logits)


# --- SPEC section 5: the optimiser ----------------------------------------------------------------

B1, B2, EPS = 0.9, 0.999, 1e-8


def _map(f, *trees):
    """``f`` over the leaves of canonical trees of one structure (dicts and lists of arrays)."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: _map(f, *(t[k] for t in trees)) for k in first}
    if isinstance(first, (list, tuple)):
        return [_map(f, *parts) for parts in zip(*trees, strict=True)]
    return f(*trees)


def _leaves(tree) -> list[np.ndarray]:
    if isinstance(tree, dict):
        return [leaf for k in tree for leaf in _leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [leaf for part in tree for leaf in _leaves(part)]
    return [tree]


def learning_rate(optim, count: int) -> float:
    """The rate of the step taken after ``count`` steps (step ``t = count + 1``), from the fields of
    ``optim`` (an ``OptimConfig``):

    - ``constant``: ``learning_rate``;
    - ``cosine``: ``end + (lr - end) * (1 + cos(pi * min(count, T) / T)) / 2`` with ``T =
      decay_steps``: ``lr`` at count 0, ``end_learning_rate`` from count ``T`` on;
    - ``warmup_cosine``: ``lr * count / W`` for ``count < W = warmup_steps`` (0 at the first step),
      then the cosine from ``lr`` over the ``T - W`` steps that remain (``decay_steps`` counts the
      warm-up), ``end_learning_rate`` from count ``T`` on.
    """
    lr = float(optim.learning_rate)
    if optim.schedule == "constant":
        return lr
    if optim.schedule not in ("cosine", "warmup_cosine"):
        raise ValueError(
            f"optim.schedule: expected constant, cosine or warmup_cosine, got {optim.schedule!r}"
        )
    if optim.decay_steps is None:
        raise ValueError("optim.decay_steps: expected the schedule's length in steps, got None")
    end = float(optim.end_learning_rate)
    warmup = int(optim.warmup_steps) if optim.schedule == "warmup_cosine" else 0
    if count < warmup:
        return lr * count / warmup
    length = int(optim.decay_steps) - warmup
    done = min(count - warmup, length) / length
    return end + (lr - end) * 0.5 * (1.0 + math.cos(math.pi * done))


@dataclass(frozen=True)
class Adam:
    """The optimiser's state: the number of steps taken and the two moments (canonical trees)."""

    count: int
    mu: Any
    nu: Any


@dataclass(frozen=True)
class Step:
    """One optimiser step: ``params = before - rate * direction``."""

    params: Any
    state: Adam
    rate: float  # the learning rate of this step, read from the schedule at the count before it
    direction: Any  # m_hat / (sqrt(v_hat) + eps) + weight_decay * before
    clip_scale: float  # min(1, clip_norm / ||g||)


def adam_start(params) -> Adam:
    zeros = _map(lambda p: np.zeros(np.shape(p), F64), params)
    return Adam(0, zeros, _map(np.copy, zeros))


def adamw_step(
    params, grads, optim, state: Adam | None = None, *, eps: float = EPS, bias_correction=True
) -> Step:
    """SPEC section 5 in float64: clip ``grads`` to global norm ``clip_norm``, then AdamW at the
    rate the schedule gives for the steps already taken (``state.count``), epsilon added to the
    bias-corrected root, the decay decoupled from the moments::

        g <- g * min(1, clip_norm / ||g||)
        m_t = b1 m_{t-1} + (1 - b1) g,   v_t = b2 v_{t-1} + (1 - b2) g^2
        m_hat = m_t / (1 - b1^t),        v_hat = v_t / (1 - b2^t)
        theta_t = theta_{t-1} - rate(t - 1) * (m_hat / (sqrt(v_hat) + eps) + wd * theta_{t-1})

    ``state`` None: a fresh optimiser (the first step). ``eps``: another epsilon, and
    ``bias_correction=False``: ``m_t`` and ``v_t`` as they are, each for a mistake's step."""
    p = as64(params)
    g = as64(grads)
    state = adam_start(p) if state is None else state
    norm = math.sqrt(sum(float(np.sum(leaf * leaf)) for leaf in _leaves(g)))
    scale = min(1.0, float(optim.clip_norm) / norm) if norm > 0 else 1.0
    g = _map(lambda leaf: leaf * scale, g)
    t = state.count + 1
    mu = _map(lambda m, gi: B1 * m + (1 - B1) * gi, state.mu, g)
    nu = _map(lambda v, gi: B2 * v + (1 - B2) * gi * gi, state.nu, g)
    wd = float(optim.weight_decay)
    c1, c2 = (1 - B1**t, 1 - B2**t) if bias_correction else (1.0, 1.0)
    direction = _map(
        lambda m, v, theta: (m / c1) / (np.sqrt(v / c2) + eps) + wd * theta,
        mu,
        nu,
        p,
    )
    rate = learning_rate(optim, state.count)
    new = _map(lambda theta, d: theta - rate * d, p, direction)
    return Step(new, Adam(t, mu, nu), rate, direction, scale)
