"""The messages of the conformance suite's failures: a plain first line saying what was seen
against what the spec says (:func:`mismatch`, :func:`tree_mismatch`, :func:`refusal`), naming the
mistake where a known one explains it (:func:`explain_ratio`, and the catalogue of
:mod:`cvae_rosetta.conformance.mistakes`): the conformance plugin's diagnosis shows that line.
The checks fail with them through :mod:`cvae_rosetta.conformance.assertions`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from cvae_rosetta.spec.config import ModelConfig

# The first line of every failure is a plain sentence (the plugin's diagnosis shows it): which
# output or term, what it was against what the spec says, and where a simple factor or a known
# mistake explains the difference, that mistake.


@dataclasses.dataclass(frozen=True)
class Axis:
    """An axis a quantity is reduced over, and how the spec reduces it (``sum`` or ``mean``)."""

    label: str  # "pixels", "the batch", "latent dimensions"
    size: int
    spec: str  # "sum" or "mean"


def loss_axes(kind: str, term: str, b: int, model: ModelConfig) -> tuple[Axis, ...]:
    """The spec's reductions of ``recon`` or ``kl`` (SPEC section 4): Bernoulli sums over pixels
    and latent dimensions and averages over the batch; ``mse`` averages over every element."""
    inner = (
        ("pixels", model.input_dim) if term == "recon" else ("latent dimensions", model.latent_dim)
    )
    return (
        Axis(*inner, "sum" if kind == "bernoulli" else "mean"),
        Axis("the batch", b, "mean"),
    )


def _fraction(factor: float) -> str:
    if factor < 0:
        return f"-{_fraction(-factor)}"
    if factor >= 1:
        return f"{factor:g} times"
    inverse = 1.0 / factor
    if abs(inverse - round(inverse)) < 1e-9:
        return f"1/{round(inverse)} of"
    return f"{factor:.4g} times"


# factors any slip can make, how a sentence reads them, and what they are when combined with others
GENERIC = {
    2.0: ("twice", "a factor 2"),
    0.5: ("half", "a factor 1/2"),
    -1.0: ("the opposite sign of", "the opposite sign"),
}


def _factors(axes: tuple[Axis, ...], notes: dict[float, str]) -> list[tuple[float, str, bool]]:
    """The elementary factors a mistake multiplies a quantity by: ``(factor, what would cause it,
    whether it is generic)``: a reduction over one of ``axes`` the spec does not do, a factor
    ``notes`` names (a config value, a known slip), a generic 2, 1/2 or -1."""
    found = []
    for axis in axes:
        if axis.size < 2:
            continue
        if axis.spec == "sum":
            found.append((1.0 / axis.size, f"a mean over {axis.label} where the spec sums", False))
        else:
            found.append(
                (float(axis.size), f"a sum over {axis.label} where the spec averages", False)
            )
    found += [(factor, why, False) for factor, why in notes.items()]
    found += [(factor, words[1], True) for factor, words in GENERIC.items() if factor not in notes]
    return found


def _candidates(
    axes: tuple[Axis, ...], notes: dict[float, str], most: int = 3
) -> list[tuple[int, float, str, str]]:
    """``(how many factors, their product, how it reads, what would cause it)``: every product of
    up to ``most`` elementary factors (:func:`_factors`), at most one of them generic, none that
    undoes another, fewest first. A single generic factor reads as itself, its cause unsaid unless
    ``notes`` gives it."""
    elementary = _factors(axes, notes)
    found = []
    for count in range(1, most + 1):
        for combo in itertools.combinations(elementary, count):
            factor = float(np.prod([f for f, _, _ in combo]))
            if sum(generic for *_, generic in combo) > 1 or abs(factor - 1.0) < 1e-9:
                continue
            if count == 1 and combo[0][2]:
                found.append((1, factor, GENERIC[factor][0], ""))
                continue
            reads = GENERIC[factor][0] if factor in GENERIC else _fraction(factor)
            found.append((count, factor, reads, ", and ".join(why for _, why, _ in combo)))
    return found


def _no_factor(ratio: float, hints: Hints) -> str:
    """What :func:`explain_ratio` searched, said when no product fits ``ratio``."""
    named = [f"{factor:g}" for factor in (hints.notes or {})]
    reductions = [axis.label for axis in hints.axes if axis.size > 1]
    tried = [f"a sum or mean over {' or '.join(reductions)} the spec does not do"]
    tried = tried if reductions else []
    tried += [f"the factors {', '.join(named)} the check names"] if named else []
    return (
        f"the ratio {ratio:.4g} is no product of up to three of the factors searched ("
        + "; ".join([*tried, "2, 1/2, -1"])
        + ")"
    )


def _what_was_searched(g: np.ndarray, w: np.ndarray, hints: Hints) -> str:
    """``; what was searched for a cause``, after a failure's numbers when nothing explained it:
    the caller's search (``hints.searched``), or the factors :func:`explain_ratio` tried."""
    if hints.searched is not None:
        return f"; {hints.searched()}"
    if g.ndim == 0 and (hints.axes or hints.notes) and w.item() and np.isfinite(g.item()):
        return f"; {_no_factor(g.item() / w.item(), hints)}"
    return ""


@dataclasses.dataclass(frozen=True)
class Hints:
    """How :func:`mismatch` words a failure beyond the numbers: what ``want`` is (``against``),
    and what may explain a difference: a reduction over one of ``axes`` that the spec does not do,
    a factor that ``notes`` says what would cause, or ``explain()``, a cause the caller knows."""

    against: str = "the float64 reference"
    axes: tuple[Axis, ...] = ()
    notes: dict[float, str] | None = None
    explain: Callable[[], str | None] | None = None
    # what was searched for a cause, said after the numbers when nothing explains the difference
    searched: Callable[[], str] | None = None


NO_HINTS = Hints()


def explain_ratio(
    name: str,
    got: float,
    want: float,
    hints: Hints = NO_HINTS,
    rtol: float = 1e-3,
    show: bool = True,
) -> str | None:
    """A sentence for ``got = factor * want`` when the factor is one plausible mistakes make, alone
    or up to three together: a reduction over one of ``hints.axes`` the spec does not do
    (``recon is 1/64 of the reference: a mean over pixels where the spec sums``), a factor that
    ``hints.notes`` names (a config value such as beta, a known slip), a factor of 2, 1/2 or -1.
    The fewest factors that fit win; where several sets as small fit, each is named. None when no
    product fits within ``rtol``."""
    axes, notes = hints.axes, hints.notes or {}
    got, want = float(got), float(want)
    if not (np.isfinite(got) and np.isfinite(want)) or want == 0.0:
        return None
    ratio = got / want
    fits = [c for c in _candidates(axes, notes) if abs(ratio / c[1] - 1.0) <= rtol]
    if not fits:
        return None
    fewest = [c for c in fits if c[0] == fits[0][0]]
    reads = fewest[0][2]
    why = "; or ".join(dict.fromkeys(c[3] for c in fewest if c[3]))
    seen = f" ({got:.6g} against {want:.6g})" if show else ""
    return f"{name} is {reads} the reference{seen}" + (f": {why}" if why else "")


def _index(flat: int, shape: tuple[int, ...]) -> str:
    if not shape:
        return ""
    return " at [" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def where_max(values: Any) -> str:
    """`` at [i, j]``: where an array is largest."""
    values = np.asarray(values)
    return _index(int(np.argmax(values)), values.shape)


def _tolerance(rtol: float, atol: float) -> str:
    return f"rtol {rtol:g}" + (f", atol {atol:.3g}" if atol else "")


def mismatch(
    got: Any,
    want: Any,
    what: str,
    *,
    rtol: float,
    atol: float = 0.0,
    hints: Hints = NO_HINTS,
) -> str | None:
    """None when ``got`` equals ``want`` within ``|got - want| <= atol + rtol |want|`` (NumPy's
    rule) everywhere; otherwise the message of the failure, its first line a plain sentence,
    naming ``want`` as ``hints.against``:

    - non-finite values where ``want`` is finite: how many, and the first;
    - ``hints.explain()``, when the caller knows a cause that fits (it runs only on a failure);
    - all zeros where ``want`` is not;
    - ``got`` proportional to ``want`` by a factor a plausible mistake makes (:func:`explain_ratio`,
      on the best-fitting scale, for arrays when the fit is exact to 1e-3);
    - else ``what`` differs, by how much and where, and what was searched for a cause
      (``hints.searched()``), where the caller searched.
    """
    against, explain = hints.against, hints.explain
    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        return f"{what} has shape {g.shape} where {against} has {w.shape}"
    scalar = g.ndim == 0
    with np.errstate(invalid="ignore", over="ignore"):
        finite_w = np.isfinite(w)
        broken = finite_w & ~np.isfinite(g)
        close = np.abs(g - w) <= atol + rtol * np.abs(w)
        close |= (g == w) & ~finite_w  # the same infinity
    if close.all() and not broken.any():
        return None
    detail = []
    if broken.any():
        first = int(np.flatnonzero(broken)[0])
        kinds = sorted({"NaN" if np.isnan(v) else "inf" for v in g.ravel()[broken.ravel()]})
        if scalar:
            line = f"{what} is {g.item()} where {against} is {w.item():.6g}"
        else:
            line = (
                f"{what} has {int(broken.sum())} {'/'.join(kinds)} entries where {against} "
                f"is finite, the first{_index(first, g.shape)}: {g.ravel()[first]} against "
                f"{w.ravel()[first]:.6g}"
            )
        return line
    first_line = explain() if explain is not None else None
    if first_line is None and not scalar and np.all(g == 0) and np.any(w != 0):
        first_line = (
            f"{what} is all zeros; in {against} it is not (entries up to {np.abs(w).max():.3g})"
        )
    if first_line is None:
        if scalar:
            first_line = explain_ratio(what, g.item(), w.item(), hints)
        else:
            den = float(np.sum(w * w))
            if den > 0:
                scale = float(np.sum(g * w)) / den
                if np.linalg.norm(g - scale * w) <= 1e-3 * abs(scale) * np.sqrt(den):
                    first_line = explain_ratio(what, scale * np.sqrt(den), np.sqrt(den), hints)
                    if first_line is not None:
                        first_line = first_line.replace(
                            f" ({scale * np.sqrt(den):.6g} against {np.sqrt(den):.6g})", ""
                        )
    diff = np.abs(g - w)
    worst = int(np.argmax(np.where(close, -1.0, diff)))
    if first_line is None:
        if scalar:
            rel = abs(g.item() - w.item()) / abs(w.item()) if w.item() else float("inf")
            first_line = (
                f"{what} differs from {against}: {g.item():.7g} against {w.item():.7g} "
                f"(relative {rel:.2g}; {_tolerance(rtol, atol)})"
            )
        else:
            first_line = (
                f"{what} differs from {against}: max |diff| {diff.ravel()[worst]:.3g}"
                f"{_index(worst, g.shape)} ({int((~close).sum())} of {g.size} entries outside "
                f"{_tolerance(rtol, atol)})"
            )
        first_line += _what_was_searched(g, w, hints)
    if not scalar:
        detail.append(
            f"got {g.ravel()[worst]:.7g} and want {w.ravel()[worst]:.7g}{_index(worst, g.shape)}; "
            f"{int((~close).sum())} of {g.size} entries outside {_tolerance(rtol, atol)}"
        )
    else:
        detail.append(f"got {g.item()!r}, want {w.item()!r} ({_tolerance(rtol, atol)})")
    return "\n".join([first_line, *detail])


def tree_mismatch(
    got: Any,
    want: Any,
    what: str,
    *,
    rtol: float,
    atol: float = 0.0,
    against: str = "the float64 reference",
    **hints,
) -> str | None:
    """:func:`mismatch` over two canonical trees (or any trees of one structure), naming the first
    leaf that differs by its path and how many leaves differ (``hints``: the other fields of
    :class:`Hints`, for every leaf)."""
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten_with_path(want)
    if got_def != want_def:
        return f"{what} has the structure {got_def} where {against} has {want_def}"
    bad = []
    for (path, g), (_, w) in zip(got_leaves, want_leaves, strict=True):
        name = f"{what} {jax.tree_util.keystr(path)}"
        message = mismatch(g, w, name, rtol=rtol, atol=atol, hints=Hints(against, **hints))
        if message is not None:
            bad.append(message)
    if not bad:
        return None
    first, _, rest = bad[0].partition("\n")
    if len(bad) > 1:
        first += f" ({len(bad)} of {len(got_leaves)} leaves differ)"
    return "\n".join([first, *([rest] if rest else []), *(m.splitlines()[0] for m in bad[1:])])


# --- refusals (SPEC section 7) --------------------------------------------------------------------

GRAMMAR = "<field>: expected <what>, got <actual>"


def refusal(call: Callable[[], Any], what: str, expected: str) -> str | None:
    """None when ``call()`` raises a ``ValueError`` whose message contains ``expected`` (the
    spec's words, e.g. ``batch.x: expected rank 2``); otherwise what happened instead."""
    try:
        call()
    except ValueError as err:
        said = str(err)
        if expected in said:
            return None
        first = said.strip().splitlines()[0] if said.strip() else "(an empty message)"
        return (
            f"{what}: refused, but worded outside the spec's grammar {GRAMMAR!r}: "
            f"{first!r} does not say {expected!r}"
        )
    except Exception as err:  # the message says what was raised instead
        return (
            f"{what}: raised {type(err).__name__} where the spec raises ValueError "
            f"{expected!r}...: {str(err).strip()[:200]!r}"
        )
    return f"{what}: accepted, where the spec refuses it with ValueError {expected!r}..."
