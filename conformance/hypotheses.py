"""Hypotheses, searched: what a person porting the spec plausibly wrote, tried after a check fails.

A catalogue names the mistakes it has seen; this module searches the ways each part of a layer can
be written. A layer is a set of *parts* (for the optimiser: where the clipping is and over what,
where epsilon sits, the bias corrections, the first and second moments, the weight decay, the
moments' rates, whether the state advances, the direction; for the forward pass, in
:mod:`cvae_rosetta.conformance.forward_hypotheses`: the activation and where it applies, the
label's place and value, the encoder's input, the latent layer's split and activation, the
decoder's output), each with the spec's way and the alternatives a port plausibly takes (Keras's
``clipnorm``, TensorFlow's epsilon, the AdamW paper's decay, NAdam, Adamax, PyTorch's
``weight_decay``, ...). A *hypothesis* picks one way for every part; the search computes each
hypothesis with few departures from the spec in float64, from the same inputs as the reference,
and names the one that reproduces what the implementation did within the check's tolerance, its
departures together (two mistakes are named as two, never as one of them alone). Where none
does, the spec's step with one of its constants changed is tried, the constant fitted (b1, b2,
epsilon, the weight decay, the rate: ``b2 = 0.98``); where that fails too, the
check says what was searched.

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
from cvae_rosetta.conformance.messages import Hints, explain_ratio
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
                Way(
                    "sum of leaf norms",
                    "with the clip factor taken from the sum of the variables' norms "
                    "(sum of ||g_leaf||, not the norm of all the gradients together)",
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
                Way(
                    "one ahead",
                    "with the bias corrections one step ahead, (1 - b1^(t+1)) and (1 - b2^(t+1)) "
                    "(the count incremented twice)",
                    f"the spec divides by (1 - b1^t) and (1 - b2^t) at step t = {t}",
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
            "first moment",
            (
                Way("average"),
                Way(
                    "undamped",
                    "with the first moment accumulated without (1 - b1), m = b1 m + g "
                    "(heavy-ball momentum)",
                    "the spec's m = b1 m + (1 - b1) g",
                ),
                Way(
                    "nesterov",
                    "with Nesterov's momentum, b1 m_hat + (1 - b1) g_hat in the update (NAdam, "
                    "optax.nadam)",
                    "the spec's update uses m_hat alone (Adam)",
                ),
                Way(
                    "none",
                    "without a first moment (the gradient itself over sqrt(v_hat): RMSprop-like)",
                    "the spec's update is m_hat / (sqrt(v_hat) + eps)",
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
                Way(
                    "infinity norm",
                    "with Adamax's infinity norm u = max(b2 u, |g|) where Adam has sqrt(v_hat) "
                    "(optax.adamax)",
                    "the spec's Adam divides by sqrt(v_hat) + eps",
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

    def sum_of_norms(self, v: np.ndarray) -> np.floating:
        """The sum over the leaves of their norms (a NumPy scalar: a zero divides as NumPy's)."""
        return np.sum(np.sqrt(np.bincount(self.ids, weights=v * v, minlength=len(self.shapes))))


def _clipped(v: np.ndarray, clip: float, reach: str, flat: _Flat) -> np.ndarray:
    if reach == "by value":
        return np.clip(v, -clip, clip)
    if reach == "per leaf":
        norm = flat.leaf_norms(v)
    elif reach == "sum of leaf norms":
        norm = flat.sum_of_norms(v)
    else:
        norm = np.sqrt(np.sum(v * v))
    norm = norm * norm if reach == "squared norm" else norm
    with np.errstate(divide="ignore"):
        return v * np.minimum(1.0, np.where(norm > 0, clip / norm, 1.0))


def _walk(
    h: Hypothesis,
    history: Sequence[tuple[np.ndarray, np.ndarray]],
    optim,
    flat,
    constants: dict[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The parameters hypothesis ``h`` reaches from the last ``before`` of ``history`` (pairs of
    the parameters before each step and the float64 gradient there), its state carried along from
    the first; and the size of the last update's terms before they add up (Adam's and the
    decay's), which float32 rounds. ``constants`` replaces the spec's (:data:`CONSTANTS`' names)."""
    way = {name: w.key for name, w in h.ways.items()}
    k = {"b1": B1, "b2": B2, "eps": EPS, "rate": 1.0, "gradient": 1.0}
    k |= {"clip_norm": float(optim.clip_norm), "weight_decay": float(optim.weight_decay)}
    k |= constants or {}
    b1, b2 = (k["b2"], k["b1"]) if way["moment rates"] == "swapped" else (k["b1"], k["b2"])
    wd, clip, first = k["weight_decay"], k["clip_norm"], way["first moment"]
    m = v = top = np.zeros_like(history[0][0])
    count = 0
    for p, g in history:
        if way["state"] == "restarts":
            m, v, top, count = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p), 0
        rate = k["rate"] * reference.learning_rate(optim, count)
        g = k["gradient"] * g
        g = g + wd * p if way["weight decay"] == "l2 loss" else g
        if way["clipping"] == "before":
            g = _clipped(g, clip, way["clipping's reach"], flat)
        g = g + wd * p if way["weight decay"] == "l2 clipped" else g
        count += 1
        m, v = b1 * m + (1.0 if first == "undamped" else 1 - b1) * g, b2 * v + (1 - b2) * g * g
        corrected = way["bias correction"] in ("both", "first only", "one ahead")
        t = count + 1 if way["bias correction"] == "one ahead" else count
        c1 = 1 - b1**t if corrected else 1.0
        c2 = 1 - b2**t if way["bias correction"] in ("both", "second only", "one ahead") else 1.0
        m_hat = {
            "nesterov": b1 * m / (1 - b1 ** (count + 1) if corrected else 1.0) + (1 - b1) * g / c1,
            "none": g,
        }.get(first, m / c1)
        top = np.maximum(top, v / c2 if way["second moment"] == "running max corrected" else v)
        top = np.maximum(b2 * top, np.abs(g)) if way["second moment"] == "infinity norm" else top
        root = {"running max corrected": top * c2, "infinity norm": top * top * c2}
        root = root.get(way["second moment"], v)
        eps = KERAS_EPS if "keras" in way["epsilon"] else k["eps"]
        if way["epsilon"] == "inside":
            adam = m_hat / np.sqrt(root / c2 + eps)
        else:
            if way["epsilon"].startswith("uncorrected"):
                eps /= math.sqrt(1 - b2**count)
            adam = m_hat / (np.sqrt(root / c2) + eps)
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
        if h.ways["second moment"].key == "infinity norm" and (
            name == "epsilon" or h.ways[name].key in ("first only", "second only")
        ):
            return True  # Adamax has no root to put epsilon in, and no v to correct
    return False


def describe(departures: Sequence[tuple[str, Way]], lead: str) -> str:
    """One sentence naming every departure, then what the spec does instead."""
    ways = [way for _, way in departures]
    said = " and ".join(way.words for way in ways)
    specs = "; ".join(dict.fromkeys(way.spec for way in ways if way.spec))
    return f"{lead} {said}: {specs}"


class _Seen:
    """What the implementation's step reached, on the entries the check selects, and the rule a
    hypothesis's step must meet to reproduce it (see :func:`search_step`)."""

    def __init__(self, got, history, masks, atol: float, rtol: float):
        self.flat = _Flat(got)
        self.steps = [(self.flat.vector(p), self.flat.vector(g)) for p, g in history]
        self.mask = self.flat.vector(masks) > 0
        self.target = self.flat.vector(got)[self.mask]
        self.start = self.steps[-1][0][self.mask]
        # float32 rounding on the scale of the operands: the parameters before and after
        scale = np.maximum(np.abs(self.target), np.abs(self.start))
        self.ulp = np.spacing(scale.astype(np.float32)).astype(np.float64)
        self.atol, self.rtol = atol, rtol

    def excess(self, h: Hypothesis, optim, constants=None) -> tuple[float, float]:
        """How far ``h``'s step is from fitting (at most 1: it fits) and how close it comes (the
        largest error against its own move)."""
        with np.errstate(all="ignore"):
            want, size = (v[self.mask] for v in _walk(h, self.steps, optim, self.flat, constants))
            error = np.abs(self.target - want)
            move = np.abs(want - self.start)
            # within the check's tolerance, and within float32 rounding (of the parameters, and
            # of Adam's constants in the update's terms) and 1% of its own move
            allowed = np.minimum(
                self.atol + self.rtol * np.abs(want), 2 * self.ulp + 1e-4 * size + 0.01 * move
            )
            excess, close = np.max(error / allowed), np.max(error / (move + self.ulp))
        return (float(excess), float(close)) if np.isfinite(excess) else (math.inf, math.inf)

    def squared_error(self, h: Hypothesis, optim, constants=None) -> float:
        """The sum of ``h``'s squared errors: smooth in a constant, where :meth:`excess` is not."""
        with np.errstate(all="ignore"):
            want, _ = _walk(h, self.steps, optim, self.flat, constants)
            total = float(np.sum(np.square(self.target - want[self.mask])))
        return total if math.isfinite(total) else math.inf

    def lead(self) -> str:
        t = len(self.steps)
        return "the step is AdamW's" if t == 1 else f"step {t} is AdamW's"


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
    seen = _Seen(got, history, masks, atol, rtol)
    fits = []
    for h in hypotheses(optimiser_parts(optim, len(seen.steps))):
        if not _inert(h, optim, len(seen.steps)):
            excess, close = seen.excess(h, optim)
            if excess <= 1.0:
                fits.append((close, h))
    if not fits:
        return None
    best = min(score for score, _ in fits)
    close = [h for score, h in fits if score <= max(2 * best, 0.05)]
    fewest = min(len(h.departures) for h in close)
    chosen = [h for h in close if len(h.departures) == fewest]
    if not chosen[0].departures:
        return None
    sentence = describe(chosen[0].departures, seen.lead())
    if len(chosen) > 1:
        others = "; or ".join(describe(h.departures, "AdamW's") for h in chosen[1:3])
        sentence += f" (or, as close on this check: {others})"
    return sentence


def _rounded(name: str, value: float, digits: int) -> float:
    """``value`` to ``digits`` significant digits (of ``1 - value`` for b1 and b2)."""
    if name in ("b1", "b2"):
        return 1.0 - float(f"{1.0 - value:.{digits}g}")
    return float(f"{value:.{digits}g}")


# The spec's constants a port may have changed, each fitted alone where no way of writing AdamW
# reproduces the step: name -> (the fitted coordinate's bounds, the value at a coordinate, the
# words for a value; optim is the config)
CONSTANTS: dict[str, tuple[tuple[float, float], Callable, Callable]] = {
    "b1": (
        (-5.0, 0.0),
        lambda u, _: 1.0 - 10.0**u,
        lambda b, _: f"b1 = {b:.10g} (the spec's 0.9)",
    ),
    "b2": (
        (-6.0, 0.0),
        lambda u, _: 1.0 - 10.0**u,
        lambda b, _: f"b2 = {b:.10g} (the spec's 0.999)",
    ),
    "eps": ((-14.0, 0.0), lambda u, _: 10.0**u, lambda e, _: f"eps = {e:.6g} (the spec's 1e-08)"),
    "weight_decay": (
        (-8.0, 1.0),
        lambda u, _: 10.0**u,
        lambda w, o: (
            f"weight decay {w:.6g} (optim.weight_decay = {o.weight_decay:g}"
            + {
                1e-4: "; 1e-4 is optax.adamw's default",
                0.004: "; 0.004 is Keras's AdamW default",
                0.01: "; 0.01 is torch.optim.AdamW's default",
            }.get(w, "")
            + ")"
        ),
    ),
    "rate": (
        (-4.0, 4.0),
        lambda u, _: 10.0**u,
        lambda r, o: (
            f"a learning rate {r:.6g} times the spec's at every step "
            f"({r * o.learning_rate:.3g} where optim.learning_rate is {o.learning_rate:g})"
        ),
    ),
}


def fit_constant(
    got: Any,
    history: Sequence[tuple[Any, Any]],
    optim: OptimConfig,
    masks: Any,
    atol: float,
    rtol: float = 1e-6,
) -> str | None:
    """The spec's step with one of its :data:`CONSTANTS` changed (b2 = 0.98, another epsilon,
    weight decay or rate) that reproduces ``got`` by
    :func:`search_step`'s rule, the constant fitted (a coarse grid, then Brent's method between the
    grid's neighbours), as a sentence; None when none does."""
    from scipy.optimize import minimize_scalar

    seen = _Seen(got, history, masks, atol, rtol)
    spec = hypotheses(optimiser_parts(optim, len(seen.steps)), most=0)[0]
    if seen.excess(spec, optim)[0] <= 1.0:
        return None  # the spec's own constants reproduce it
    fits = []
    for name, ((lo, hi), value, words) in CONSTANTS.items():

        def error(u, name=name, value=value):
            return seen.squared_error(spec, optim, {name: value(u, optim)})

        grid = np.linspace(lo, hi, 57)
        i = int(np.argmin([error(u) for u in grid]))
        bounds = (grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])
        u = minimize_scalar(error, bounds=bounds, method="bounded", options={"xatol": 1e-9}).x
        best = value(u, optim)
        # the value said: the fewest significant digits that still fit (b2 = 0.98, not 0.9799)
        for digits in (1, 2, 3, 4, 6, 12):
            said = _rounded(name, best, digits)
            excess = seen.excess(spec, optim, {name: said})[0]
            if excess <= 1.0:
                fits.append((excess, words(said, optim)))
                break
    if not fits:
        return None
    return (
        f"{seen.lead()} with {min(fits)[1]}: the spec's structure with this one constant "
        "changed reproduces it (fitted; no way of writing AdamW searched does with the spec's "
        "constants)"
    )


def searched_step(optim: OptimConfig, steps: int) -> Callable[[], str]:
    """What :func:`search_step` tried, said when no hypothesis reproduced the step."""

    def said() -> str:
        parts = optimiser_parts(optim, steps)
        tried = [h for h in hypotheses(parts) if h.departures and not _inert(h, optim, steps)]
        return (
            f"none of the {len(tried)} ways of writing AdamW searched reproduces it (up to "
            f"{MAX_DEPARTURES} departures from the spec in {', '.join(p.name for p in parts)}), "
            f"nor does the spec's with one of {', '.join(CONSTANTS)} fitted"
        )

    return said


def scaled_update(got: Any, start: Any, want: Any, optim: OptimConfig, masks: Any) -> str | None:
    """The step's update as a multiple of the spec's, on the entries ``masks`` selects, where the
    factor is a config value (the rate, the clip norm, their inverses) or a product
    :func:`messages.explain_ratio` names: ``the step's update is 0.001 times the spec's: the factor
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
    the spec's that a config value names, else (parameters that moved) a fitted constant, else
    the true sentence on how far the parameters moved."""

    def explain() -> str | None:
        start = history[-1][0]
        unmoved = all(jax.tree.leaves(jax.tree.map(np.array_equal, got, start)))
        return (
            search_step(got, history, optim, masks, atol)
            or scaled_update(got, start, want, optim, masks)
            or (None if unmoved else fit_constant(got, history, optim, masks, atol))
            or unchanged_or_moved(got, start, want, atol)
        )

    return explain
