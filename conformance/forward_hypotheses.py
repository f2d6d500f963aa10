"""The forward pass's hypotheses: the ways a port plausibly writes ``encode`` and ``decode``.

The parts of :mod:`cvae_rosetta.conformance.hypotheses`'s search for the forward pass (the hidden
activation and where it applies, the bias's place, the label's place and value, the encoder's
input, the latent layer's split and activation, the decoder's output), each computed in float64
from the same canonical parameters and inputs as the reference. Where no way reproduces
``encode``, the spec's structure with the input mapped to ``a x + b`` (``x / 255``, a data set's
normalisation) or the leaky ReLU's slope fitted is tried.

Nothing here runs unless a check has already failed: a passing implementation pays nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.hypotheses import MAX_DEPARTURES, Part, Way, describe, hypotheses

ACTIVATIONS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "relu": ("ReLU", lambda a: np.maximum(a, 0.0)),
    "gelu": (
        "GELU (tanh approximation, jax.nn.gelu's default)",
        lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
    ),
    "gelu exact": (
        "exact GELU (erf form, PyTorch's nn.GELU default)",
        lambda a: 0.5 * a * (1 + _erf(a / math.sqrt(2))),
    ),
    "silu": ("SiLU (swish)", lambda a: a * reference.sigmoid(a)),
    "tanh": ("tanh", np.tanh),
    "sigmoid": ("sigmoid", reference.sigmoid),
    "leaky relu": ("leaky ReLU (slope 0.01)", lambda a: np.where(a > 0, a, 0.01 * a)),
    "elu": ("ELU", lambda a: np.where(a > 0, a, np.expm1(np.minimum(a, 0.0)))),
    "softplus": ("softplus", lambda a: np.logaddexp(a, 0.0)),
}


def _erf(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a)


def forward_parts(which: str) -> tuple[Part, ...]:
    """The parts of ``encode`` or ``decode`` (``which``) and their alternatives."""
    hidden = Part(
        "hidden activation",
        tuple(
            Way(key, f"with {words} as the hidden layers' activation", "the spec's is ReLU")
            if key != "relu"
            else Way(key)
            for key, (words, _) in ACTIVATIONS.items()
        ),
    )
    placement = Part(
        "activation placement",
        (
            Way("every hidden layer"),
            Way(
                "not the last",
                "with no activation after the last hidden layer",
                "the spec applies it after every hidden layer",
            ),
            Way(
                "bias after",
                "with each hidden layer's bias added after its activation, act(h W) + b",
                "the spec adds it before, act(h W + b)",
            ),
        ),
    )
    order = Part(
        "conditioning",
        (
            Way("after"),
            Way(
                "before",
                "with the one-hot label concatenated before its input ([one_hot(c), "
                f"{'x' if which == 'encode' else 'z'}])",
                f"the spec concatenates [{'x' if which == 'encode' else 'z'}, one_hot(c)]",
            ),
        ),
    )
    label = Part(
        "label",
        (
            Way("one_hot(c)"),
            Way(
                "shifted",
                "with the labels shifted, one_hot(c - 1) (a port from 1-based labels; label 0 "
                "a row of zeros)",
                "the spec's one_hot(c) takes c in [0, num_classes)",
            ),
        ),
    )
    if which == "decode":
        output = Part(
            "output",
            (
                Way("linear"),
                Way(
                    "sigmoid", "returning probabilities sigmoid(logits)", "the spec returns logits"
                ),
                Way(
                    "relu",
                    "with a ReLU after the output layer (relu(logits), never negative)",
                    "the spec leaves the output layer linear",
                ),
            ),
        )
        return (hidden, placement, order, label, output)
    split = Part(
        "split",
        (
            Way("halves"),
            Way(
                "swapped",
                "returning (logvar, mean): its mean is the reference's logvar and its logvar "
                "the reference's mean",
                "the spec splits the latent layer's output as [mean, logvar]",
            ),
            Way(
                "interleaved",
                "with the latent layer's output split interleaved (mean the even columns, "
                "logvar the odd ones)",
                "the spec takes mean as the first L columns and logvar as the last L",
            ),
        ),
    )
    latent = Part(
        "latent activation",
        (
            Way("linear"),
            Way(
                "relu",
                "with a ReLU after the latent layer (mean and logvar never negative)",
                "the spec's latent layer is linear",
            ),
        ),
    )
    given = Part(
        "input",
        (
            Way("as given"),
            Way(
                "rescaled",
                "with x rescaled to [-1, 1] (2x - 1) before the encoder",
                "the spec feeds x in [0, 1] as it is",
            ),
            Way(
                "binarised",
                "with x binarised (x > 0.5) before the encoder",
                "the spec feeds x in [0, 1] as it is",
            ),
            Way(
                "transposed",
                "with each image's pixels read column by column (the square image transposed: "
                "a layout mix-up)",
                "the spec's x is each image's rows one after the other",
            ),
        ),
    )
    return (hidden, placement, order, label, given, split, latent)


def _given(x: np.ndarray, how: str) -> np.ndarray:
    """The encoder's input as a port may have prepared it."""
    if how == "rescaled":
        return 2.0 * x - 1.0
    if how == "binarised":
        return (x > 0.5).astype(np.float64)
    if how == "transposed":
        side = math.isqrt(x.shape[1])
        return x.reshape(-1, side, side).transpose(0, 2, 1).reshape(x.shape)
    return x


def _forward(ways: dict[str, Way], params, given: tuple, which: str, fitted=None):
    """The output of ``which`` written ``ways`` from ``given`` (``x`` or ``z``, ``c``, the number
    of classes); ``fitted``: the input mapped to ``a x + b`` (``"input": (a, b)``) or the hidden
    activation a leaky ReLU of slope ``"slope"``."""
    (inputs, c, num_classes), fitted = given, fitted or {}
    way = {name: w.key for name, w in ways.items()}
    act = ACTIVATIONS[way["hidden activation"]][1]
    if "slope" in fitted:
        act = lambda a: np.where(a > 0, a, fitted["slope"] * a)
    c = np.asarray(c) - (way["label"] == "shifted")
    label = reference.one_hot(np.maximum(c, 0), num_classes) * (c >= 0)[:, None]
    inputs = _given(np.asarray(inputs, np.float64), way.get("input", "as given"))
    if "input" in fitted:
        inputs = fitted["input"][0] * inputs + fitted["input"][1]
    h = np.concatenate([label, inputs] if way["conditioning"] == "before" else [inputs, label], 1)
    p = reference.as64(params)
    layers = p["encoder"] if which == "encode" else p["decoder"]
    hidden = len(layers) if which == "encode" else len(layers) - 1
    activated = hidden - 1 if way["activation placement"] == "not the last" else hidden
    after = way["activation placement"] == "bias after"
    for i, layer in enumerate(layers):
        h = h @ layer["kernel"] + (0.0 if after and i < activated else layer["bias"])
        if i < activated:
            h = act(h) + (layer["bias"] if after else 0.0)
    if which == "decode":
        return {"linear": h, "sigmoid": reference.sigmoid(h), "relu": np.maximum(h, 0.0)}[
            way["output"]
        ]
    s = h @ p["latent"]["kernel"] + p["latent"]["bias"]
    s = np.maximum(s, 0.0) if way["latent activation"] == "relu" else s
    latent = s.shape[1] // 2
    if way["split"] == "interleaved":
        return s[:, 0::2], s[:, 1::2]
    mean, logvar = s[:, :latent], s[:, latent:]
    return (logvar, mean) if way["split"] == "swapped" else (mean, logvar)


def _spec_ways(which: str) -> dict[str, Way]:
    """The spec's way of every part of ``which``."""
    return {part.name: part.ways[0] for part in forward_parts(which)}


def searched_forward(which: str) -> Callable[[], str]:
    """What :func:`search_forward` tried, said when no hypothesis reproduced the output."""

    def said() -> str:
        parts = forward_parts(which)
        tried = sum(1 for h in hypotheses(parts) if h.departures)
        fitted = "x mapped to a x + b, or " if which == "encode" else ""
        return (
            f"none of the {tried} ways of writing {which} searched reproduces it (up to "
            f"{MAX_DEPARTURES} departures from the spec in {', '.join(p.name for p in parts)}), "
            f"nor does the spec's with {fitted}a leaky ReLU's slope fitted"
        )

    return said


def search_forward(
    which: str,
    got: Any,
    params: Any,
    given: tuple[Any, Any, int],
    close: Callable[[Any, Any], bool],
) -> str | None:
    """The hypothesis of ``encode`` or ``decode`` (``which``) whose float64 output from the same
    canonical parameters and inputs (``given``: ``x`` or ``z``, ``c``, the number of classes)
    ``close(got, want)`` accepts, the fewest departures first, as a sentence; None when none fits
    (or the spec's own does)."""
    inputs = given[0]
    parts = forward_parts(which)
    if which == "encode" and np.shape(got[0])[-1] < 2:  # one latent dimension: one split
        parts = tuple(part for part in parts if part.name != "split")
    if which == "encode" and math.isqrt(np.shape(inputs)[-1]) ** 2 != np.shape(inputs)[-1]:
        parts = tuple(
            Part(part.name, tuple(w for w in part.ways if w.key != "transposed")) for part in parts
        )  # no square image to transpose
    spec = _spec_ways(which)  # the parts left out above keep the spec's way
    for h in hypotheses(parts):
        if not h.departures:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            want = _forward(spec | h.ways, params, given, which)
        if close(got, want):
            return describe(h.departures, f"{which} matches the float64 reference")
    return None


def fit_forward(
    which: str,
    got: Any,
    params: Any,
    given: tuple[Any, Any, int],
    close: Callable[[Any, Any], bool],
) -> str | None:
    """The spec's ``encode`` or ``decode`` with a constant fitted, where no way searched
    reproduces ``got``: the encoder's input mapped to ``a x + b`` (``x / 255`` again, a data set's
    mean and deviation), or the hidden activation a leaky ReLU of any slope; least squares from
    the spec's values, then ``close`` decides. A sentence, or None."""
    from scipy.optimize import least_squares

    spec = _spec_ways(which)
    seen = np.concatenate([np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(got)])

    def output(fitted):
        with np.errstate(all="ignore"):
            return _forward(spec, params, given, which, fitted)

    def residual(fitted):
        flat = np.concatenate([np.ravel(a) for a in jax.tree.leaves(output(fitted))])
        return np.nan_to_num(flat - seen, nan=1e6, posinf=1e6, neginf=-1e6)

    lead = f"{which} matches the float64 reference"
    if which == "encode":
        a, b = least_squares(lambda ab: residual({"input": ab}), [1.0, 0.0]).x
        if close(got, output({"input": (a, b)})) and not close(got, output({})):
            mapped = (
                f"multiplied by {a:.4g} (x / {1 / a:.4g})"
                if abs(b) <= 1e-4 * abs(a)
                else f"mapped to a x + b with a = {a:.4g}, b = {b:.4g} ((x - {-b / a:.4g}) / "
                f"{1 / a:.4g})"
            )
            return (
                f"{lead} where x is first {mapped}: rescaled or normalised again, the constants "
                "fitted; the spec feeds x in [0, 1] as it is"
            )
    slope = least_squares(lambda s: residual({"slope": s[0]}), [0.1]).x[0]
    if close(got, output({"slope": slope})) and not close(got, output({})):
        return (
            f"{lead} with a leaky ReLU of slope {slope:.3g} as the hidden layers' activation "
            "(fitted): the spec's is ReLU"
        )
    return None
