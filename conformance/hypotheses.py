"""Hypotheses, searched: what a person porting the spec plausibly wrote, tried after a check fails.

A catalogue names the mistakes it has seen; this module searches the ways each part of a layer can
be written. A layer is a set of *parts* (for the optimiser: where the clipping is and over what,
where epsilon sits, the bias corrections, the second moment, the weight decay, the moments' rates,
whether the state advances, the direction; for the forward pass: the activation and where it
applies, the label's place and value, the encoder's input, the latent layer's split and
activation, the decoder's output), each with the spec's way and the alternatives a port plausibly
takes (Keras's ``clipnorm``, TensorFlow's epsilon, the AdamW paper's decay, PyTorch's
``weight_decay``, ...). A *hypothesis* picks one way for every part; the search computes each
hypothesis with few departures from the spec in float64, from the same inputs as the reference,
and names the one that reproduces what the implementation did within the check's tolerance, its
departures together (two mistakes are named as two, never as one of them alone). Where none
does, the check says so. The ways are discrete: a constant a port changed (b2 = 0.98, x / 255) is
named only where it is one of them, or where the step's update is a config value times the
spec's.

Nothing here runs unless a check has already failed: a passing implementation pays nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from cvae_rosetta.conformance import reference
from cvae_rosetta.conformance.common import Hints, explain_ratio
from cvae_rosetta.spec.config import OptimConfig

B1, B2, EPS = reference.B1, reference.B2, reference.EPS
KERAS_EPS = 1e-7  # keras.optimizers.Adam's and AdamW's default epsilon
MAX_DEPARTURES = 3  # hypotheses with more departures from the spec are not tried


@dataclasses.dataclass(frozen=True)
class Way:
    """One way of writing a part: ``key`` (what the computation reads), how a diagnosis says it
    (``words``, a phrase after "the step is AdamW's"), and what the spec does instead (``spec``)."""

    key: str
    words: str = ""
    spec: str = ""


@dataclasses.dataclass(frozen=True)
class Part:
    """A part of a layer: the spec's way first, then the alternatives."""

    name: str
    ways: tuple[Way, ...]

    @property
    def alternatives(self) -> tuple[Way, ...]:
        return self.ways[1:]


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """A way for every part, by part name; ``departures``: the ways that are not the spec's."""

    ways: dict[str, Way]
    departures: tuple[tuple[str, Way], ...]


def hypotheses(parts: Sequence[Part], most: int = MAX_DEPARTURES) -> list[Hypothesis]:
    """Every hypothesis with at most ``most`` departures from the spec, fewest first (the spec's
    own first of all)."""
    found = []
    for count in range(most + 1):
        for chosen in itertools.combinations(parts, count):
            for ways in itertools.product(*(part.alternatives for part in chosen)):
                picked = {part.name: part.ways[0] for part in parts}
                picked.update({part.name: way for part, way in zip(chosen, ways, strict=True)})
                departures = tuple((part.name, way) for part, way in zip(chosen, ways, strict=True))
                found.append(Hypothesis(picked, departures))
    return found


# --- the optimiser --------------------------------------------------------------------------------


def optimiser_parts(optim: OptimConfig, t: int) -> tuple[Part, ...]:
    """The parts of the spec's step (``clip_by_global_norm`` then AdamW) and their alternatives,
    worded for a diagnosis of step ``t``."""
    clip = f"global norm clip_norm = {optim.clip_norm:g}"
    spec_clip = f"the spec clips the gradient to {clip} before Adam"
    factor = 1.0 / math.sqrt(1.0 - B2**t)
    spec_eps = "the spec adds eps to the bias-corrected sqrt(v_hat)"
    keras = "epsilon added to the uncorrected sqrt(v) (Keras's and TensorFlow's Adam)"
    return (
        Part(
            "clipping",
            (
                Way("before"),
                Way("none", "without clip_by_global_norm", spec_clip),
                Way(
                    "after",
                    "with clip_by_global_norm after Adam (the update clipped, not the gradient: "
                    "optax.chain(adamw(...), clip_by_global_norm(...)))",
                    spec_clip,
                ),
            ),
        ),
        Part(
            "clipping's reach",
            (
                Way("global"),
                Way(
                    "per leaf",
                    "with each variable clipped to norm clip_norm on its own (per leaf, Keras's "
                    "clipnorm; global_clipnorm is the spec's)",
                    f"the spec clips to the {clip} of all the gradients together",
                ),
                Way(
                    "by value",
                    "with each entry clipped to [-clip_norm, clip_norm] (clip_by_value, Keras's "
                    "clipvalue)",
                    f"the spec scales the whole gradient down to {clip}",
                ),
                Way(
                    "squared norm",
                    "with the clip factor min(1, clip_norm / sum(g^2)), the norm's square root "
                    "left out",
                    f"the spec's factor is min(1, clip_norm / sqrt(sum(g^2))), to {clip}",
                ),
            ),
        ),
        Part(
            "epsilon",
            (
                Way("corrected"),
                Way(
                    "uncorrected",
                    f"with {keras}: effective epsilon eps/sqrt(1-b2^t), {factor:.3g} times the "
                    f"spec's {EPS:g} at step {t}",
                    spec_eps,
                ),
                Way(
                    "uncorrected keras",
                    f"with {keras}: effective epsilon eps/sqrt(1-b2^t), and Keras's default "
                    f"epsilon {KERAS_EPS:g} where the spec's is {EPS:g} (effective "
                    f"{KERAS_EPS * factor:.3g} at step {t})",
                    spec_eps,
                ),
                Way(
                    "keras",
                    f"with epsilon {KERAS_EPS:g} (Keras's default) where the spec's is {EPS:g}",
                    spec_eps,
                ),
                Way(
                    "inside",
                    "with epsilon inside the root, sqrt(v_hat + eps) (optax's eps_root)",
                    spec_eps,
                ),
            ),
        ),
        Part(
            "bias correction",
            (
                Way("both"),
                Way(
                    "none",
                    "without bias correction (m and v used as they are)",
                    f"the spec divides them by (1 - b1^t) and (1 - b2^t) (at step {t} the update "
                    f"is {(1 - B1**t) / math.sqrt(1 - B2**t):.3g} times the spec's)",
                ),
                Way(
                    "first only",
                    "with the bias correction of m alone (v used as it is)",
                    "the spec divides v by (1 - b2^t) too",
                ),
                Way(
                    "second only",
                    "with the bias correction of v alone (m used as it is)",
                    "the spec divides m by (1 - b1^t) too",
                ),
            ),
        ),
        Part(
            "weight decay",
            (
                Way("decoupled"),
                Way(
                    "unscaled",
                    "with the weight decay not scaled by the learning rate (theta -= lr * adam + "
                    "weight_decay * theta, the AdamW paper's form)",
                    "optax's adamw, the spec's, subtracts lr * (adam + weight_decay * theta)",
                ),
                Way(
                    "l2 loss",
                    "with weight_decay * params added to the gradient before the clipping (an L2 "
                    "penalty in the loss)",
                    "the spec's AdamW decays the parameters apart from the gradient",
                ),
                Way(
                    "l2 clipped",
                    "with weight_decay * params added to the clipped gradient (an L2 penalty in "
                    "the optimiser, torch.optim.Adam's weight_decay)",
                    "the spec's AdamW decays the parameters apart from the gradient",
                ),
                Way(
                    "none",
                    f"without weight decay (optax.adam, weight_decay = {optim.weight_decay:g} "
                    "never read)",
                    "the spec's AdamW subtracts lr * weight_decay * theta",
                ),
            ),
        ),
        Part(
            "second moment",
            (
                Way("average"),
                Way(
                    "running max corrected",
                    "with AMSGrad's running maximum of the corrected v_hat in the root "
                    "(optax.amsgrad)",
                    "the spec's Adam divides by the root of v itself",
                ),
            ),
        ),
        Part(
            "moment rates",
            (
                Way("spec"),
                Way(
                    "swapped",
                    "with b1 and b2 swapped (b1 = 0.999, b2 = 0.9)",
                    "the spec's b1 is 0.9 and b2 0.999",
                ),
            ),
        ),
        Part(
            "state",
            (
                Way("advances"),
                Way(
                    "restarts",
                    "with its state restarted at every step (the optimiser state does not advance)",
                    "the spec's Adam carries its moments and count",
                ),
            ),
        ),
        Part(
            "direction",
            (
                Way("descent"),
                Way(
                    "ascent",
                    "with every update's sign flipped (it climbs the loss)",
                    "the spec's step goes down the gradient",
                ),
            ),
        ),
    )


class _Flat:
    """Canonical trees of one structure as float64 vectors, and back; ``segments``: each leaf's
    slice, for the per-leaf norms."""

    def __init__(self, tree: Any):
        leaves, self.treedef = jax.tree.flatten(tree)
        self.shapes = [np.shape(leaf) for leaf in leaves]
        sizes = [int(np.prod(shape)) for shape in self.shapes]
        self.ids = np.repeat(np.arange(len(sizes)), sizes)

    def vector(self, tree: Any) -> np.ndarray:
        return np.concatenate(
            [np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)]
        )

    def leaf_norms(self, v: np.ndarray) -> np.ndarray:
        return np.sqrt(np.bincount(self.ids, weights=v * v, minlength=len(self.shapes)))[self.ids]


def _clipped(v: np.ndarray, clip: float, reach: str, flat: _Flat) -> np.ndarray:
    if reach == "by value":
        return np.clip(v, -clip, clip)
    norm = flat.leaf_norms(v) if reach == "per leaf" else np.sqrt(np.sum(v * v))
    norm = norm * norm if reach == "squared norm" else norm
    with np.errstate(divide="ignore"):
        return v * np.minimum(1.0, np.where(norm > 0, clip / norm, 1.0))


def _walk(
    h: Hypothesis, history: Sequence[tuple[np.ndarray, np.ndarray]], optim, flat
) -> tuple[np.ndarray, np.ndarray]:
    """The parameters hypothesis ``h`` reaches from the last ``before`` of ``history`` (pairs of
    the parameters before each step and the float64 gradient there), its state carried along from
    the first; and the size of the last update's terms before they add up (Adam's and the
    decay's), which float32 rounds."""
    way = {name: w.key for name, w in h.ways.items()}
    b1, b2 = (B2, B1) if way["moment rates"] == "swapped" else (B1, B2)
    wd, clip = float(optim.weight_decay), float(optim.clip_norm)
    m = v = top = np.zeros_like(history[0][0])
    count = 0
    for p, g in history:
        if way["state"] == "restarts":
            m, v, top, count = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p), 0
        rate = reference.learning_rate(optim, count)
        g = g + wd * p if way["weight decay"] == "l2 loss" else g
        if way["clipping"] == "before":
            g = _clipped(g, clip, way["clipping's reach"], flat)
        g = g + wd * p if way["weight decay"] == "l2 clipped" else g
        count += 1
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        c1 = 1 - b1**count if way["bias correction"] in ("both", "first only") else 1.0
        c2 = 1 - b2**count if way["bias correction"] in ("both", "second only") else 1.0
        top = np.maximum(top, v / c2 if way["second moment"] == "running max corrected" else v)
        root = {"running max": top, "running max corrected": top * c2}.get(way["second moment"], v)
        eps = KERAS_EPS if "keras" in way["epsilon"] else EPS
        if way["epsilon"] == "inside":
            adam = (m / c1) / np.sqrt(root / c2 + eps)
        else:
            if way["epsilon"].startswith("uncorrected"):
                eps /= math.sqrt(1 - b2**count)
            adam = (m / c1) / (np.sqrt(root / c2) + eps)
        decay = {"decoupled": rate * wd * p, "unscaled": wd * p}.get(way["weight decay"], 0.0)
        update = rate * adam + decay
        size = np.abs(rate * adam) + np.abs(decay)  # the terms' size, before they cancel
        if way["clipping"] == "after":
            clipped = _clipped(update, clip, way["clipping's reach"], flat)
            size = size * np.abs(clipped / np.where(update == 0, 1.0, update))
            update = clipped
        last = p + update if way["direction"] == "ascent" else p - update
    return last, size


def _inert(h: Hypothesis, optim: OptimConfig, steps: int) -> bool:
    """Whether a departure of ``h`` changes nothing for this config and number of steps (the state
    restarting or AMSGrad's maximum before the second step, decay choices without decay, a reach
    with no clipping)."""
    for name, _ in h.departures:
        if name in ("state", "second moment") and steps < 2:
            return True
        if name == "weight decay" and not optim.weight_decay:
            return True
        if name == "clipping's reach" and h.ways["clipping"].key == "none":
            return True
    return False


def describe(departures: Sequence[tuple[str, Way]], lead: str) -> str:
    """One sentence naming every departure, then what the spec does instead."""
    ways = [way for _, way in departures]
    said = " and ".join(way.words for way in ways)
    specs = "; ".join(dict.fromkeys(way.spec for way in ways if way.spec))
    return f"{lead} {said}: {specs}"


def search_step(
    got: Any,
    history: Sequence[tuple[Any, Any]],
    optim: OptimConfig,
    masks: Any,
    atol: float,
    rtol: float = 1e-6,
) -> str | None:
    """The hypothesis of the optimiser whose step from the last parameters of ``history`` reaches
    ``got`` on the entries ``masks`` selects (within ``atol + rtol |want|``, the check's own), as
    a sentence; None when the spec's own step fits best or none fits. ``history``: ``(before,
    float64 gradient)`` for every step so far, the first from a fresh optimiser.

    A hypothesis fits when, on every entry, what it leaves unexplained is within the check's
    tolerance and within two float32 roundings of the entry, 1e-4 of the update's terms (float32
    Adam's constants round to about that) and 1% of the hypothesis's own move
    (parameters that stayed still fit no hypothesis that moves them, however little). Where
    several fit, the closest wins, and among those as close as it the one with the fewest
    departures; others as close are named after it."""
    flat = _Flat(got)
    steps = [(flat.vector(p), flat.vector(g)) for p, g in history]
    target = flat.vector(got)
    mask = flat.vector(masks) > 0
    start = steps[-1][0]
    # float32 rounding on the scale of the operands: the parameters before and after
    scale = np.maximum(np.abs(target[mask]), np.abs(start[mask]))
    ulp = np.spacing(scale.astype(np.float32)).astype(np.float64)
    fits = []
    for h in hypotheses(optimiser_parts(optim, len(steps))):
        if _inert(h, optim, len(steps)):
            continue
        want, size = (v[mask] for v in _walk(h, steps, optim, flat))
        error = np.abs(target[mask] - want)
        move = np.abs(want - start[mask])
        # within the check's tolerance, and within float32 rounding (of the parameters, and of
        # Adam's constants in the update's terms) and 1% of its own move
        near = 2 * ulp + 1e-4 * size + 0.01 * move
        if np.all(error <= atol + rtol * np.abs(want)) and np.all(error <= near):
            fits.append((float(np.max(error / (move + ulp))), h))
    if not fits:
        return None
    best = min(score for score, _ in fits)
    close = [h for score, h in fits if score <= max(2 * best, 0.05)]
    fewest = min(len(h.departures) for h in close)
    chosen = [h for h in close if len(h.departures) == fewest]
    if not chosen[0].departures:
        return None
    lead = "the step is AdamW's" if len(steps) == 1 else f"step {len(steps)} is AdamW's"
    sentence = describe(chosen[0].departures, lead)
    if len(chosen) > 1:
        others = "; or ".join(describe(h.departures, "AdamW's") for h in chosen[1:3])
        sentence += f" (or, as close on this check: {others})"
    return sentence


def searched_step(optim: OptimConfig, steps: int) -> Callable[[], str]:
    """What :func:`search_step` tried, said when no hypothesis reproduced the step."""

    def said() -> str:
        parts = optimiser_parts(optim, steps)
        tried = [h for h in hypotheses(parts) if h.departures and not _inert(h, optim, steps)]
        return (
            f"none of the {len(tried)} ways of writing AdamW searched reproduces it (up to "
            f"{MAX_DEPARTURES} departures from the spec in {', '.join(p.name for p in parts)})"
        )

    return said


def scaled_update(got: Any, start: Any, want: Any, optim: OptimConfig, masks: Any) -> str | None:
    """The step's update as a multiple of the spec's, on the entries ``masks`` selects, where the
    factor is a config value (the rate, the clip norm, their inverses) or a product
    :func:`common.explain_ratio` names: ``the step's update is 0.001 times the spec's: the factor
    is optim.learning_rate``."""
    flat = _Flat(got)
    mask = flat.vector(masks) > 0
    moved = (flat.vector(got) - flat.vector(start))[mask]
    spec = (flat.vector(want) - flat.vector(start))[mask]
    square = float(np.sum(spec * spec))
    if square == 0.0:
        return None
    scale = float(np.sum(moved * spec)) / square
    if np.linalg.norm(moved - scale * spec) > 1e-3 * abs(scale) * math.sqrt(square):
        return None
    lr, clip = float(optim.learning_rate), float(optim.clip_norm)
    notes = {
        lr: f"the factor is optim.learning_rate = {lr:g}: the rate applied twice",
        1 / lr: f"the factor is 1/optim.learning_rate: the update not scaled by the rate {lr:g}",
        clip: f"the factor is optim.clip_norm = {clip:g}",
    }
    if clip != 1.0:
        notes[1 / clip] = f"the factor is 1/optim.clip_norm (clip_norm = {clip:g})"
    return explain_ratio("the step's update", scale, 1.0, Hints(notes=notes), show=False)


def unchanged_or_moved(got: Any, start: Any, want: Any, atol: float) -> str | None:
    """A true sentence for parameters that stayed where they were, or moved less than the
    check's tolerance ``atol`` where the spec's step moves them further."""
    flat = _Flat(got)
    g, s, w = flat.vector(got), flat.vector(start), flat.vector(want)
    if np.array_equal(g, s):
        return "train_step left the parameters unchanged"
    moved = np.abs(g - s)
    if moved.max() <= atol < np.abs(w - s).max():
        return (
            f"train_step moved {int(np.count_nonzero(moved))} of {g.size} parameter entries, by "
            f"at most {moved.max():.3g}, under the check's tolerance {atol:.3g}, where the spec's "
            f"step moves them by up to {np.abs(w - s).max():.3g}"
        )
    return None


def explain_step(
    got: Any,
    history: Sequence[tuple[Any, Any]],
    optim: OptimConfig,
    masks: Any,
    atol: float,
    want: Any,
) -> Callable[[], str | None]:
    """What a failed step check's ``explain`` runs: the search, else the update as a multiple of
    the spec's that a config value names, else the true sentence on how far the parameters
    moved."""

    def explain() -> str | None:
        found = search_step(got, history, optim, masks, atol)
        start = history[-1][0]
        return (
            found
            or scaled_update(got, start, want, optim, masks)
            or unchanged_or_moved(got, start, want, atol)
        )

    return explain


# --- the forward pass -----------------------------------------------------------------------------

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


def _forward(ways: dict[str, Way], params, inputs, c, num_classes: int, which: str):
    way = {name: w.key for name, w in ways.items()}
    act = ACTIVATIONS[way["hidden activation"]][1]
    c = np.asarray(c) - (way["label"] == "shifted")
    label = reference.one_hot(np.maximum(c, 0), num_classes) * (c >= 0)[:, None]
    inputs = _given(np.asarray(inputs, np.float64), way.get("input", "as given"))
    h = np.concatenate([label, inputs] if way["conditioning"] == "before" else [inputs, label], 1)
    p = reference.as64(params)
    layers = p["encoder"] if which == "encode" else p["decoder"]
    hidden = len(layers) if which == "encode" else len(layers) - 1
    activated = hidden - 1 if way["activation placement"] == "not the last" else hidden
    for i, layer in enumerate(layers):
        h = h @ layer["kernel"] + layer["bias"]
        if i < activated:
            h = act(h)
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


def searched_forward(which: str) -> Callable[[], str]:
    """What :func:`search_forward` tried, said when no hypothesis reproduced the output."""

    def said() -> str:
        parts = forward_parts(which)
        tried = sum(1 for h in hypotheses(parts) if h.departures)
        return (
            f"none of the {tried} ways of writing {which} searched reproduces it (up to "
            f"{MAX_DEPARTURES} departures from the spec in {', '.join(p.name for p in parts)})"
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
    inputs, c, num_classes = given
    parts = forward_parts(which)
    if which == "encode" and np.shape(got[0])[-1] < 2:  # one latent dimension: one split
        parts = tuple(part for part in parts if part.name != "split")
    if which == "encode" and math.isqrt(np.shape(inputs)[-1]) ** 2 != np.shape(inputs)[-1]:
        parts = tuple(
            Part(part.name, tuple(w for w in part.ways if w.key != "transposed")) for part in parts
        )  # no square image to transpose
    for h in hypotheses(parts):
        if not h.departures:
            continue
        ways = {part.name: part.ways[0] for part in forward_parts(which)} | h.ways
        with np.errstate(over="ignore", invalid="ignore"):
            want = _forward(ways, params, inputs, c, num_classes, which)
        if close(got, want):
            return describe(h.departures, f"{which} matches the float64 reference")
    return None
