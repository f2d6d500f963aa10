"""SPEC sections 1 to 4 in float64 NumPy, gradients by hand: the suite's independent reference.

Nothing here calls JAX, so an error in JAX's autodiff, in the shared loss code or in an
implementation cannot hide by being shared with the reference. Parameters are the canonical tree of
SPEC section 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

F64 = np.float64


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
    params, x, c, eps, *, num_classes: int, kind: str = "bernoulli", beta: float = 1.0
) -> Result:
    """The loss of SPEC section 4 for noise ``eps`` and its exact gradient, all in float64.

    Stable at the edges ``test_edges`` checks: the Bernoulli term is the softplus form
    ``max(l, 0) - l x + log1p(exp(-|l|))`` and its gradient ``sigmoid(l) - x`` (``sigmoid`` never
    exponentiates a positive number), finite for any finite logit; ``exp(logvar)`` is finite in
    float64 up to logvar = 709."""
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
