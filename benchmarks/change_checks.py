"""The checks of ``change_cost.py``'s changes, run in a process whose ``cvae_rosetta`` is the
patched copy: each takes the patched implementation's adapter, trains it a few steps, tests the
changed behaviour against the float64 reference computed the changed way, and returns what it
found in one line (an ``AssertionError`` says what is wrong).

The model has hidden layers of equal widths (so that the residual change has layers to wrap), and
the reference's forward pass is written here once with the changes' variants (activation,
LayerNorm, residual connections); the losses and gradients are the conformance suite's reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import numpy as np
from change_cost import DECODER_RATE, WARMUP_STEPS

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import (
    at_path,
    make_batch,
    reference_params,
    spec_noise,
    spec_step,
)
from cvae_rosetta.spec.config import Config, LossConfig, ModelConfig

MODEL = ModelConfig(
    input_dim=64, num_classes=10, latent_dim=4, encoder_dims=(32, 32), decoder_dims=(32, 32)
)
CONFIG = Config(model=MODEL)
B = 16


def _inputs(seed: int = 0):
    key = jax.random.key(seed)
    params = reference_params(jax.random.fold_in(key, 1), MODEL)
    batch = make_batch(jax.random.fold_in(key, 2), B, MODEL)
    return params, batch, jax.random.fold_in(key, 3)


def _canonical(impl, state) -> dict:
    return jax.tree.map(lambda a: np.array(a, np.float64), impl.to_canonical(state))


def _steps(impl, state, batch, key, n: int = 3):
    """``n`` train steps; the states and metrics after each, the loss finite."""
    out = []
    for i in range(n):
        state, metrics = impl.train_step(state, batch, jax.random.fold_in(key, i))
        loss = float(metrics["loss"])
        assert math.isfinite(loss), f"step {i + 1}: loss {loss}"
        out.append((state, {k: float(v) for k, v in metrics.items()}))
    return out


# --- the reference forward pass, with the changes' variants -------------------------------------


def gelu_tanh(a):
    return 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))


def gelu_exact(a):
    return 0.5 * a * (1 + np.vectorize(math.erf)(a / np.sqrt(2)))


def relu(a):
    return np.maximum(a, 0.0)


def layer_norm(a, eps: float = 1e-5):
    mean = a.mean(axis=-1, keepdims=True)
    return (a - mean) / np.sqrt(a.var(axis=-1, keepdims=True) + eps)


def _mlp(layers, h, *, act, norm, residual, last_linear):
    for i, layer in enumerate(layers):
        pre = h @ layer["kernel"] + layer["bias"]
        if last_linear and i == len(layers) - 1:
            return pre
        out = act(layer_norm(pre) if norm else pre)
        h = h + out if residual and i > 0 and out.shape == h.shape else out
    return h


def forward(params, x, c, z, variant: dict | None = None):
    """(mean, logvar) of ``x, c`` and the logits of ``z, c``, in float64; ``variant``: the
    change's ``act`` (the activation), ``norm`` (LayerNorm before it), ``residual``."""
    p = reference.as64(params)
    onehot = reference.one_hot(c, MODEL.num_classes)
    mlp = {"act": relu, "norm": False, "residual": False, **(variant or {})}
    h0 = np.concatenate([np.asarray(x, np.float64), onehot], 1)
    h = _mlp(p["encoder"], h0, **mlp, last_linear=False)
    s = h @ p["latent"]["kernel"] + p["latent"]["bias"]
    mean, logvar = s[:, : MODEL.latent_dim], s[:, MODEL.latent_dim :]
    g0 = np.concatenate([np.asarray(z, np.float64), onehot], 1)
    return mean, logvar, _mlp(p["decoder"], g0, **mlp, last_linear=True)


def _close(got, want, rtol: float, atol: float) -> bool:
    return bool(np.allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol))


def _largest(got, want) -> str:
    return ", ".join(
        f"{np.max(np.abs(np.asarray(g, np.float64) - w)):.3g}"
        for g, w in zip(got, want, strict=True)
    )


def _forward_is(impl, name: str, rtol: float, atol: float, **variant) -> str:
    """encode and decode from the canonical parameters equal :func:`forward` with ``variant``
    (``act`` may be a list: any one of them), and not the spec's; three steps train."""
    params, batch, key = _inputs()
    state = impl.from_canonical(params, CONFIG)
    z = np.asarray(jax.random.normal(key, (B, MODEL.latent_dim)), np.float32)
    got = (*impl.encode(state, batch.x, batch.c), impl.decode(state, z, batch.c))
    acts = variant.pop("act", [relu])
    wants = {
        act.__name__: forward(params, batch.x, batch.c, z, {**variant, "act": act}) for act in acts
    }
    fits = [name for name, want in wants.items() if all(
        _close(g, w, rtol, atol) for g, w in zip(got, want, strict=True))]  # fmt: skip
    assert fits, (
        f"encode/decode are not the reference with {name}: largest differences "
        + _largest(got, next(iter(wants.values())))
    )
    spec = forward(params, batch.x, batch.c, z)
    assert not _close(got[2], spec[2], rtol, atol), f"decode is still the spec's, without {name}"
    _steps(impl, state, batch, key)
    return f"encode and decode are the reference with {name} ({', '.join(fits)}); 3 steps train"


def _grads_agree(impl, state, batch, key, metrics: dict) -> None:
    """The trainer's fast path runs the adapter's ``grads_fn`` (the step's first half) where it
    has one: its metrics must be the step's, or the change would not reach ``cvae train``."""
    if impl.grads_fn is None:
        return
    _, got = impl.grads(state, batch, key)
    for name, value in metrics.items():
        assert name in got and abs(float(got[name]) - value) <= 1e-6 * max(1.0, abs(value)), (
            f"grads_fn's metrics[\"{name}\"] is {got.get(name)}, the step's {value}: the trainer's "
            "fast path does not see the change"
        )


# --- the checks ---------------------------------------------------------------------------------


def check_gelu(impl) -> str:
    return _forward_is(impl, "GELU", 1e-4, 1e-5, act=[gelu_tanh, gelu_exact])


def check_layer_norm(impl) -> str:
    # the frameworks' epsilons differ (1e-6 to 1e-3): against 1e-5, a difference of up to about
    # 1e-3 of the hidden activations' scale
    return _forward_is(impl, "LayerNorm before each ReLU", 1e-2, 1e-2, norm=True)


def check_residual(impl) -> str:
    return _forward_is(impl, "residual connections", 1e-4, 1e-5, residual=True)


def _spec_update(params, batch, key, *, beta: float | None = None):
    """The parameters after the spec's first step from ``params``, in float64 gradients through the
    spec's optimiser (``beta``: another weight of the KL term)."""
    eps = spec_noise(key, B, MODEL.latent_dim)
    loss = CONFIG.loss if beta is None else LossConfig(kind=CONFIG.loss.kind, beta=beta)
    ref = reference.loss_and_grad(params, batch.x, batch.c, eps, num_classes=MODEL.num_classes,
                                  loss=loss)  # fmt: skip
    grads32 = jax.tree.map(lambda g: np.asarray(g, np.float32), ref.grads)
    start = jax.tree.map(lambda p: np.asarray(p, np.float32), params)
    new, _ = spec_step(CONFIG.optim, start, grads32)
    return ref, jax.tree.map(lambda n, p: np.asarray(n, np.float64) - np.asarray(p, np.float64),
                             new, start)  # fmt: skip


def _reliable(ref) -> dict:
    """Entries whose gradient is well above float32 noise (Adam's first step takes their sign)."""
    top = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref.grads))
    return jax.tree.map(lambda g: (np.abs(g) > 1e-3 * np.abs(g).max()) & (np.abs(g) > 1e-4 * top),
                        ref.grads)  # fmt: skip


def _moved_as(got: dict, want: dict, masks: dict, part: str, factor: float) -> None:
    lr = CONFIG.optim.learning_rate
    for path, mask in jax.tree_util.tree_leaves_with_path(masks[part]):
        g = np.asarray(at_path(got[part], path))[mask]
        w = factor * np.asarray(at_path(want[part], path))[mask]
        assert np.allclose(g, w, rtol=1e-3, atol=1e-3 * lr), (
            f"[{part!r}]{jax.tree_util.keystr(path)} moved by {np.max(np.abs(g)):.3g} at most; "
            f"expected {factor:g} times the spec's step ({np.max(np.abs(w)):.3g})"
        )


def check_frozen_encoder(impl) -> str:
    params, batch, key = _inputs()
    state = impl.from_canonical(params, CONFIG)
    start = _canonical(impl, state)
    end = _canonical(impl, _steps(impl, state, batch, key)[-1][0])
    for part in ("encoder", "latent"):
        for path, a in jax.tree_util.tree_leaves_with_path(start[part]):
            assert np.array_equal(a, at_path(end[part], path)), (
                f"[{part!r}]{jax.tree_util.keystr(path)} moved; the encoder should be frozen"
            )
    for path, a in jax.tree_util.tree_leaves_with_path(start["decoder"]):
        assert not np.array_equal(a, at_path(end["decoder"], path)), (
            f"['decoder']{jax.tree_util.keystr(path)} did not move in three steps"
        )
    return (
        "after 3 steps the encoder and the latent layer are bit for bit the same; the decoder moved"
    )


def check_decoder_rate(impl) -> str:
    params, batch, key = _inputs()
    state = impl.from_canonical(params, CONFIG)
    start = _canonical(impl, state)
    stepped = _canonical(impl, impl.train_step(state, batch, key)[0])
    moved = jax.tree.map(lambda a, b: a - b, stepped, start)
    ref, want = _spec_update(params, batch, key)
    masks = _reliable(ref)
    _moved_as(moved, want, masks, "decoder", DECODER_RATE)
    _moved_as(moved, want, masks, "encoder", 1.0)
    _moved_as(moved, want, masks, "latent", 1.0)
    return f"one step moves the decoder {DECODER_RATE:g} times the spec's step, the rest by it"


def check_extra_metric(impl) -> str:
    params, batch, key = _inputs()
    _, metrics = impl.train_step(impl.from_canonical(params, CONFIG), batch, key)
    assert "mse" in metrics, f'metrics has no "mse": {sorted(metrics)}'
    metrics = {k: float(v) for k, v in metrics.items()}
    _grads_agree(impl, impl.from_canonical(params, CONFIG), batch, key, metrics)
    eps = spec_noise(key, B, MODEL.latent_dim)
    mean, logvar = reference.encode(params, batch.x, batch.c, MODEL.num_classes)
    logits = reference.decode(params, mean + np.exp(0.5 * logvar) * eps, batch.c,
                              MODEL.num_classes)  # fmt: skip
    want = float(np.mean((reference.sigmoid(logits) - np.asarray(batch.x, np.float64)) ** 2))
    got = float(metrics["mse"])
    assert abs(got - want) <= 1e-5 * abs(want), f'metrics["mse"] {got:.7g}, reference {want:.7g}'
    return f"metrics[\"mse\"] {got:.6g} is the reference's at the step's noise"


def check_kl_warmup(impl) -> str:
    params, batch, key = _inputs()
    state = impl.from_canonical(params, CONFIG)
    start = _canonical(impl, state)
    steps = _steps(impl, state, batch, key)
    beta = CONFIG.loss.beta
    for t, (_, m) in enumerate(steps):
        want = m["recon"] + beta * min(1.0, t / WARMUP_STEPS) * m["kl"]
        assert abs(m["loss"] - want) <= 1e-6 * abs(want), (
            f"step {t + 1}'s loss {m['loss']:.7g}, expected recon + beta * {t}/{WARMUP_STEPS} * kl"
            f" = {want:.7g}"
        )
    first = jax.random.fold_in(key, 0)  # the first step's key (_steps)
    _grads_agree(impl, impl.from_canonical(params, CONFIG), batch, first, steps[0][1])
    ref, want = _spec_update(params, batch, first, beta=0.0)
    moved = jax.tree.map(lambda a, b: a - b, _canonical(impl, steps[0][0]), start)
    masks = _reliable(ref)
    for part in ("encoder", "latent", "decoder"):
        _moved_as(moved, want, masks, part, 1.0)
    return "the first step is the spec's with beta 0; steps 2-3 weigh the KL term by t/1000"


def _same(a, b) -> bool:
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def check_dropout(impl) -> str:
    params, batch, key = _inputs()
    state = impl.from_canonical(params, CONFIG)
    # inference: no dropout
    z = np.asarray(jax.random.normal(key, (B, MODEL.latent_dim)), np.float32)
    got = (*impl.encode(state, batch.x, batch.c), impl.decode(state, z, batch.c))
    assert all(
        _close(g, w, 1e-4, 1e-5)
        for g, w in zip(got, forward(params, batch.x, batch.c, z), strict=True)
    ), "encode or decode is not the spec's: dropout outside the training step"
    # training: the step is not the spec's, and is a function of the key

    def stepped(start, k):
        return _canonical(impl, impl.train_step(impl.from_canonical(start, CONFIG), batch, k)[0])

    once = stepped(params, key)
    assert _same(once, stepped(params, key)), "equal keys, different steps"
    _, metrics = impl.train_step(impl.from_canonical(params, CONFIG), batch, key)
    metrics = {k: float(v) for k, v in metrics.items()}
    _grads_agree(impl, impl.from_canonical(params, CONFIG), batch, key, metrics)
    _, spec = _spec_update(params, batch, key)
    moved = jax.tree.map(lambda a, b: a - b, once, _canonical(impl, state))
    assert not all(
        np.allclose(m, s, rtol=1e-3, atol=1e-9)
        for m, s in zip(jax.tree.leaves(moved), jax.tree.leaves(spec), strict=True)
    ), "the step is the spec's: no dropout in training"
    # with the noise held fixed (logvar -100: z is the mean), two keys differ by dropout alone
    quiet = jax.tree.map(np.array, params)
    quiet["latent"]["bias"][MODEL.latent_dim :] = -100.0
    quiet["latent"]["kernel"][:, MODEL.latent_dim :] = 0.0
    assert not _same(stepped(quiet, key), stepped(quiet, jax.random.fold_in(key, 99))), (
        "with the noise held fixed, two keys give the same step: dropout does not follow the key"
    )
    return "inference is the spec's; the step is not; equal keys equal, other keys other masks"


CHECKS: dict[str, Callable] = {
    "gelu": check_gelu,
    "layer_norm": check_layer_norm,
    "dropout": check_dropout,
    "residual": check_residual,
    "frozen_encoder": check_frozen_encoder,
    "decoder_rate": check_decoder_rate,
    "extra_metric": check_extra_metric,
    "kl_warmup": check_kl_warmup,
}
