"""What the conformance tests share: a small model, inputs, and parameters drawn by the suite;
fresh copies of them for every check; and the messages of failures.

Everything here comes from the spec alone, never from an implementation. Failures say in a plain
first line what was seen against what the spec says (:func:`mismatch`, :func:`refusal`), naming
the mistake where a known one explains it (:func:`explain_ratio`, and the catalogue of
:mod:`cvae_rosetta.conformance.mistakes`): the conformance plugin's diagnosis shows that line.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae_rosetta.conformance.strategies import params_from_seed
from cvae_rosetta.spec.config import Config, ModelConfig, OptimConfig
from cvae_rosetta.spec.validation import Batch

# A small model of the bundled digits' shape: 64 pixels, 10 labels.
MODEL = ModelConfig(
    input_dim=64, num_classes=10, latent_dim=8, encoder_dims=(32, 16), decoder_dims=(16, 32)
)
CONFIG = Config(model=MODEL)
B = 12

# float32 against float64: relative error of sums of O(100) products is ~1e-6; leave headroom.
RTOL, ATOL = 2e-5, 1e-5


def digits(batch_size: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray, Batch]:
    """Real handwritten digits for the checks that train: scikit-learn's bundled 8x8 digits scaled
    from 0..16 to [0, 1], the first 1500 shuffled (by ``seed``) into full batches
    ``xs: [n, B, 64]``, ``cs: [n, B]``, and the other 297 as one test batch. The suite reads them
    itself, so it needs nothing of the application's data loading."""
    from sklearn.datasets import load_digits

    x, c = load_digits(return_X_y=True)
    x, c = (x / 16.0).astype(np.float32), c.astype(np.int32)
    train, test = slice(0, 1500), slice(1500, None)
    order = np.random.default_rng(seed).permutation(1500)
    n = 1500 // batch_size
    xs = x[train][order][: n * batch_size].reshape(n, batch_size, -1)
    cs = c[train][order][: n * batch_size].reshape(n, batch_size)
    return xs, cs, Batch(jnp.asarray(x[test]), jnp.asarray(c[test]))


def key_bits(key: jax.Array) -> tuple[int, ...]:
    """A PRNG key's bits, as the seed of a NumPy generator."""
    return tuple(int(word) for word in np.asarray(jax.random.key_data(key)).ravel())


def reference_params(key: jax.Array, model: ModelConfig = MODEL) -> dict:
    """Canonical parameters drawn by the suite itself (never by an implementation): kernels
    ``normal / sqrt(fan_in)``, nonzero biases ``0.1 * normal`` (so a converter that drops or
    misplaces them is caught), drawn with NumPy from the key's bits (in JAX, every new leaf shape
    would compile a sampler)."""
    return params_from_seed(key_bits(key), model)


def make_batch(key: jax.Array, b: int = B, model: ModelConfig = MODEL) -> Batch:
    """Uniform pixels with exact 0 and 1 among them, and uniform labels, drawn with NumPy from the
    key's bits."""
    rng = np.random.default_rng(key_bits(key))
    x = rng.random((b, model.input_dim), dtype=np.float32)
    x[0, :3] = [0.0, 1.0, 0.5]  # exact 0 and 1 pixels
    c = rng.integers(0, model.num_classes, b, dtype=np.int32)
    return Batch(jnp.asarray(x), jnp.asarray(c))


def spec_noise(key: jax.Array, b: int, latent: int) -> np.ndarray:
    """SPEC section 3: the noise of a step."""
    return np.asarray(jax.random.normal(key, (b, latent)))


def at_path(tree, path):
    """The leaf of ``tree`` at a ``jax.tree_util`` key path."""
    for entry in path:
        tree = tree[getattr(entry, "key", getattr(entry, "idx", None))]
    return tree


def capabilities(impl) -> set[str]:
    """What an implementation offers beyond the protocol of SPEC section 6.

    ``paths``: other ways to run the same train step (``extras["paths"]`` of an
    :class:`~cvae_rosetta.spec.protocol.Adapter`). ``data_parallel``: a ``grads_fn`` (the step's
    gradient half), which the per-device data-parallel steps (``pmap``, ``shard_map``) need.
    """
    found = set()
    if getattr(impl, "extras", {}).get("paths"):
        found.add("paths")
    if getattr(impl, "grads_fn", None) is not None:
        found.add("data_parallel")
    return found


def require(impl, capability: str) -> None:
    """Report the calling check as not applicable (never as passed) without ``capability``."""
    if capability not in capabilities(impl):
        pytest.skip(f"not applicable: {getattr(impl, 'name', impl)} has no {capability!r}")


SPEC_EPS = 1e-8  # Adam's epsilon, added to the bias-corrected root sqrt(v_hat)
B2 = 0.999


def spec_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    """SPEC section 5 at the constant rate, built here from the config's fields (not from the
    shared code)."""
    return _spec_chain(optim.learning_rate, optim.clip_norm, optim.weight_decay)


def _spec_chain(learning_rate, clip_norm, weight_decay, eps=SPEC_EPS):
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(learning_rate, b1=0.9, b2=B2, eps=eps, weight_decay=weight_decay),
    )


class _Settings(NamedTuple):
    """The settings of the spec's optimiser, as the traced values of :func:`_spec_step`."""

    learning_rate: Any
    clip_norm: Any
    weight_decay: Any
    eps: Any


@jax.jit
def _spec_step(params, grads, opt_state, settings: _Settings):
    # the settings are traced values (optax takes them so): one compilation serves every setting
    tx = _spec_chain(*settings)
    opt_state = tx.init(params) if opt_state is None else opt_state
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def spec_step(optim: OptimConfig, params, grads, opt_state=None, *, eps: float = SPEC_EPS):
    """One step of the spec's optimiser at the constant rate on ``params`` with the gradients
    ``grads``, from ``opt_state`` (a fresh state when ``None``): the new parameters and the
    optimiser state. Compiled once for every setting (op by op, optax would compile every small
    operation for every leaf shape). ``eps``: another epsilon, for a mistake's step."""
    settings = (optim.learning_rate, optim.clip_norm, optim.weight_decay, eps)
    return _spec_step(params, grads, opt_state, _Settings(*(np.float32(v) for v in settings)))


# --- arrays of its own ----------------------------------------------------------------------------
# An implementation may keep, donate or delete what it is given (a ``from_canonical`` that keeps
# the caller's arrays lets a donated step delete them). Every check therefore gets arrays of its
# own: the drawn values are kept here and never handed out; each call returns new buffers.


def fresh(tree: Any) -> Any:
    """``tree`` with every array leaf in a new buffer of its own (PRNG keys included)."""

    def copy(leaf):
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jnp.array(jax.random.key_data(leaf), copy=True)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        if isinstance(leaf, (jax.Array, np.ndarray)):
            return jnp.array(leaf, copy=True)
        return leaf

    return jax.tree.map(copy, tree)


@functools.cache
def _drawn_params(seed: int, model: ModelConfig) -> dict:
    return reference_params(jax.random.key(seed), model)


@functools.cache
def _drawn_batch(seed: int, b: int, model: ModelConfig) -> Batch:
    return make_batch(jax.random.key(seed), b, model)


def suite_params(seed: int = 42, model: ModelConfig = MODEL) -> dict:
    """``reference_params(key(seed), model)``, in new buffers on every call."""
    return fresh(_drawn_params(seed, model))


def suite_batch(seed: int = 7, b: int = B, model: ModelConfig = MODEL) -> Batch:
    """``make_batch(key(seed), b, model)``, in new buffers on every call."""
    return fresh(_drawn_batch(seed, b, model))


def copy_to_host(tree: Any) -> Any:
    """``tree`` as NumPy arrays of their own (never views of a device buffer): what the caller
    held, to compare with after the implementation had its arrays."""
    return jax.tree.map(lambda leaf: np.array(leaf, copy=True), tree)


@pytest.fixture
def params():
    """The suite's canonical parameters, in buffers of this check's own (see ``common.fresh``):
    a fixture of every layer that checks the spec's numbers, each module taking it as
    ``params = common.params``."""
    return suite_params(42)


@pytest.fixture
def batch():
    """The suite's batch of 12 examples (seed 7), the fixture beside :func:`params`."""
    return suite_batch(7)


def as32(tree):
    return jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), tree)


class Probe(NamedTuple):
    """Everything an implementation computes from canonical parameters, in one compiled program."""

    mean: jax.Array
    logvar: jax.Array
    logits: jax.Array  # decode of the given latents
    loss: jax.Array
    metrics: dict
    grads: Any  # d loss / d canonical parameters, through from_canonical
    stepped_state: Any  # the state after one train_step from the parameters
    stepped: Any  # its canonical parameters
    step_metrics: dict


def _probe(impl, params, batch: Batch, z, key, config: Config) -> Probe:
    state = impl.from_canonical(params, config)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    logits = impl.decode(state, z, batch.c)

    def loss_of(p):
        return impl.loss(impl.from_canonical(p, config), batch, key)

    (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    stepped, step_metrics = impl.train_step(impl.from_canonical(params, config), batch, key)
    canonical = impl.to_canonical(stepped)
    return Probe(mean, logvar, logits, loss, metrics, grads, stepped, canonical, step_metrics)


@functools.cache
def probe(impl) -> Callable[..., Probe]:
    """``probe(impl)(params, batch, z, key, config=...)``: the forward pass, the loss, its
    gradient and one step, jitted (``config`` static). The numerics modules share it, so a setting
    that two of them check (the suite's model in float32 or bfloat16 with the Bernoulli loss) is
    compiled once, and a training run's programs are jitted too."""
    return jax.jit(functools.partial(_probe, impl), static_argnames="config")


# --- messages that name what was seen and what the spec says -------------------------------------
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


def assert_close(got: Any, want: Any, what: str, *, rtol: float, atol: float = 0.0, **hints):
    """Fail with :func:`mismatch`'s message unless ``got`` equals ``want`` within tolerance
    (``hints``: the fields of :class:`Hints`)."""
    message = mismatch(got, want, what, rtol=rtol, atol=atol, hints=Hints(**hints))
    if message is not None:
        raise AssertionError(message)


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


def assert_trees_close(got: Any, want: Any, what: str, *, rtol: float, atol: float = 0.0, **kw):
    message = tree_mismatch(got, want, what, rtol=rtol, atol=atol, **kw)
    if message is not None:
        raise AssertionError(message)


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


def refused_with(call: Callable[[], Any], what: str, expected: str = "") -> str:
    """The message of the ``ValueError`` ``call()`` raises; an ``AssertionError`` saying what
    happened instead when it raises something else or nothing (``expected``: what the spec's
    message says, for that one)."""
    saying = f" saying {expected!r}" if expected else ""
    try:
        call()
    except ValueError as err:
        return str(err)
    except Exception as err:
        raise AssertionError(
            f"{what}: raised {type(err).__name__} where the spec raises ValueError{saying}: "
            f"{str(err).strip()[:200]!r}"
        ) from err
    raise AssertionError(f"{what}: accepted, where the spec refuses it with a ValueError{saying}")


def assert_refused(call: Callable[[], Any], what: str, expected: str) -> None:
    message = refusal(call, what, expected)
    if message is not None:
        raise AssertionError(message)
