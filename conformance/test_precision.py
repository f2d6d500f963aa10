"""Mixed precision: ``config.model.compute_dtype = "bfloat16"`` (SPEC section 1).

Parameters and optimiser state stay float32, activations and matmuls are bfloat16, and what the
protocol returns (moments, logits, loss, metrics) is float32. Each implementation's bfloat16 run is
compared with its own float32 run from the same canonical parameters, batch and keys; pairs of
implementations are compared in bfloat16 with each other. Nothing assumes that two
implementations round identically: those that cast the same way may be bit-identical (here pure JAX
and Haiku are, in every result), but compiled, the same casts can still differ (Flax's gradients
differ from pure JAX's by 0.4 U to 0.7 U, in the units below).

Tolerances are derived from bfloat16's unit roundoff ``U = 2**-8`` (8 significant bits): every
rounding has a relative error uniform in [-U, U] (standard deviation U / sqrt(3)).

- Forward (``encode``, ``decode``): a dense layer rounds its input, its kernel and its output, so
  it adds about U of error in units of its output's RMS (the rounding errors of a fan-in-n dot
  product add up like sqrt(n) products, and so does the sum itself); at most four layers deep
  (the 784-pixel encoder: three hidden layers and the latent one) they random-walk to about 2 U.
  The check is on the whole array, ``||bf16 - f32|| / ||f32||``, at most ``4 U`` (measured: 0.95 U
  to 1.45 U). Element by element, a single output is one dot product of fan-in ~100, whose worst
  case is sqrt(100) U = 10 U per layer, about 17 U three layers deep; elements are held to 32 U of
  their array's RMS (measured: at most 8.8 U).
- "Really computes in bfloat16": every matmul of the traced ``loss`` and ``train_step`` takes
  bfloat16 operands, and the forward error is at least ``U / 3``. An implementation that ignores
  ``compute_dtype`` is bit-identical to its float32 run (error 0); one computing in float16 (11
  significant bits, 8 times finer) sits at 0.15 U to 0.19 U. Both fail. One that rounds only the
  operands of its matmuls, accumulating and adding biases in float32, passes (0.8 U to 1.1 U).
- Loss and reconstruction term: a mean over B x input_dim (>= 768) Bernoulli terms, whose logit
  errors enter with weight ``sigmoid(logit) - x`` and random sign, so they cancel like
  1 / sqrt(B x input_dim): about U / 50 (measured: U / 60). They are held to ``U / 4``, which a
  loss reduced (or merely returned) in bfloat16 fails three times in four (a bfloat16 result is
  rounded by up to U); and since a float32 result is a bfloat16 number only once in 2**16, the
  metrics must not be bfloat16 numbers. The KL term squares the moments (doubling their relative
  error) and averages over only B x L terms: ``2 U`` (measured: at most 0.76 U).
- Gradients pass forward and back through every layer in bfloat16, and near-zero pre-activations
  switch ReLUs on or off between the two runs, so single entries may change completely: only the
  whole tree (``32 U``, measured at most 15.7 U) and each tensor (``64 U``, measured at most 24 U)
  are held to an RMS bound, about twice what was measured on the 784-pixel model.
- Adam's first update is ``lr * g / (|g| + eps)``, i.e. ``lr * sign(g)`` per entry, so the two
  steps differ by 0 or by 2 lr, the latter where the bfloat16 error of ``g`` flips its sign. That
  happens for about a third of the gradient's relative error in entries; at most 5% of all entries
  may differ by more than lr / 1000 (measured: at most 1.6%), and none by more than 2 lr.
- Two bfloat16 implementations are each within the bounds above of their float32 runs, and those
  agree to float32 rounding, so by the triangle inequality they are within twice the bounds of each
  other.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance.common import MODEL, B, at_path, probe, suite_batch, suite_params
from cvae_rosetta.spec.config import Config, ModelConfig

# numerics as a training run compiles them: XLA's full optimisation for every program here, except
# on the CPU, where most optimisations off give the same optimised program (plugin.fully_optimized)
pytestmark = pytest.mark.fully_optimized

U = 2.0**-8  # bfloat16's unit roundoff

FORWARD_RMS = 4 * U  # whole-array relative error of encode / decode
FORWARD_FLOOR = U / 3  # ... and at least this much, or bfloat16 was not used
ELEMENT = 32 * U  # single entries, in units of their array's RMS
LOSS_RTOL = U / 4  # loss and recon: means over B x input_dim terms
KL_RTOL = 2 * U
GRAD_TREE_RMS = 32 * U
GRAD_LEAF_RMS = 64 * U
MAX_FLIPPED = 0.05  # fraction of first-step updates whose sign differs
PAIR = 2.0  # the triangle inequality, for two bfloat16 runs

MODELS = {
    "small": MODEL,  # cvae_rosetta.conformance.common's: 64 pixels, widths 32 and 16
    "784": ModelConfig(input_dim=784, num_classes=10, latent_dim=32),  # the default model
}


@pytest.fixture(params=list(MODELS), scope="module")
def model_name(request) -> str:
    return request.param


def config_of(model_name: str, dtype: str) -> Config:
    return Config(model=MODELS[model_name].replace(compute_dtype=dtype))


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything one implementation computes for one model and compute dtype."""

    params: Any  # the canonical parameters it started from
    mean: jax.Array
    logvar: jax.Array
    logits: jax.Array
    loss: jax.Array
    metrics: dict
    grads: Any  # d loss / d canonical parameters, through from_canonical
    stepped: Any  # canonical parameters after one train_step
    step_metrics: dict
    stepped_state: Any  # the state after that step, as ShapeDtypeStructs


@functools.cache
def run(impl, model_name: str, dtype: str) -> Run:
    """Cached: every test of this module, and every pair, reuses one run per implementation.

    Compiled as one function (what training runs is jitted too, and one compilation costs less
    than the many small ones of an eager pass), the one ``test_edges`` compiles for the suite's
    model.
    """
    model = MODELS[model_name]
    params = suite_params(42, model)
    out = probe(impl)(
        params,
        suite_batch(7, B, model),
        jax.random.normal(jax.random.key(3), (B, model.latent_dim)),
        jax.random.key(11),
        config=config_of(model_name, dtype),
    )
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), out.stepped_state)
    return Run(
        params, out.mean, out.logvar, out.logits, out.loss, out.metrics, out.grads, out.stepped,
        out.step_metrics, shapes,
    )  # fmt: skip


# --- helpers --------------------------------------------------------------------------------------


def rel_rms(got: Any, want: Any) -> float:
    """``||got - want|| / ||want||`` over every leaf of two trees of the same structure."""
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    num = den = 0.0
    for g, w in pairs:
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        num += float(np.sum((g - w) ** 2))
        den += float(np.sum(w**2))
    return float(np.sqrt(num / den))


def assert_close_in_bf16(got, want, what: str, scale: float = 1.0) -> None:
    """Whole-array and element-by-element bounds of the forward pass (module docstring)."""
    err = rel_rms(got, want)
    assert err <= scale * FORWARD_RMS, (
        f"{what}: relative RMS error {err:.3g} = {err / U:.2f} U, "
        f"expected at most {scale * FORWARD_RMS / U:g} U"
    )
    want64 = np.asarray(want, np.float64)
    rms = float(np.sqrt(np.mean(want64**2)))
    worst = float(np.max(np.abs(np.asarray(got, np.float64) - want64)))
    assert worst <= scale * ELEMENT * rms, (
        f"{what}: an entry is off by {worst:.3g} = {worst / rms / U:.1f} U of the array's RMS "
        f"{rms:.3g}, expected at most {scale * ELEMENT / U:g} U"
    )


def assert_metrics_close(got: dict, want: dict, what: str, scale: float = 1.0) -> None:
    for name, rtol in (("loss", LOSS_RTOL), ("recon", LOSS_RTOL), ("kl", KL_RTOL)):
        g, w = float(got[name]), float(want[name])
        assert abs(g - w) <= scale * rtol * abs(w), (
            f"{what} {name}: {g!r} against {w!r}, relative {abs(g - w) / abs(w):.3g}, "
            f"expected at most {scale * rtol:.3g}"
        )


def assert_grads_close(got, want, what: str, scale: float = 1.0) -> None:
    err = rel_rms(got, want)
    assert err <= scale * GRAD_TREE_RMS, (
        f"{what}: gradients' relative RMS error {err:.3g} = {err / U:.1f} U, "
        f"expected at most {scale * GRAD_TREE_RMS / U:g} U"
    )
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = at_path(want, path)
        leaf_err = rel_rms(g, w)
        assert leaf_err <= scale * GRAD_LEAF_RMS, (
            f"{what}: gradient {jax.tree_util.keystr(path)} has relative RMS error "
            f"{leaf_err / U:.1f} U, expected at most {scale * GRAD_LEAF_RMS / U:g} U"
        )


def assert_steps_agree(start, got, want, lr: float, what: str, scale: float = 1.0) -> None:
    """First Adam updates: equal entry by entry except where a gradient's sign flipped."""
    diffs = [
        np.abs((np.asarray(g) - np.asarray(s)) - (np.asarray(w) - np.asarray(s))).ravel()
        for s, g, w in zip(*(jax.tree.leaves(t) for t in (start, got, want)), strict=True)
    ]
    flat = np.concatenate(diffs)
    assert flat.max() <= 2 * lr * (1 + 1e-4), (
        f"{what}: an update differs by {flat.max():.3g}; two first Adam steps differ by at most "
        f"2 lr = {2 * lr:g}"
    )
    flipped = float(np.mean(flat > 1e-3 * lr))
    assert flipped <= scale * MAX_FLIPPED, (
        f"{what}: {flipped:.2%} of the entries were updated differently, "
        f"expected at most {scale * MAX_FLIPPED:.0%}"
    )


def floating_leaves(tree) -> list[tuple[str, Any]]:
    return [
        (jax.tree_util.keystr(path), leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if jnp.issubdtype(dtype_of(leaf), jnp.floating)
    ]


def dtype_of(leaf) -> np.dtype:
    return np.dtype(getattr(leaf, "dtype", None) or jnp.result_type(leaf))


def assert_all_float32(tree, what: str) -> None:
    leaves = floating_leaves(tree)
    assert leaves, f"{what}: no floating leaves at all, where the spec keeps float32 arrays"
    wrong = [f"{path}: {dtype_of(leaf)}" for path, leaf in leaves if dtype_of(leaf) != np.float32]
    assert not wrong, (
        f"{what}: {len(wrong)} floating leaves are not float32 (e.g. {wrong[0]}); the spec keeps "
        "parameters, optimiser state and outputs float32 whatever the compute dtype"
    )


def equations(fn, *args) -> list:
    """Every equation of the traced ``fn``, those of its sub-computations included."""
    found = []

    def walk(jaxpr) -> None:
        for eqn in jaxpr.eqns:
            found.append(eqn)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, jex.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jex.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def matmul_dtypes(eqns) -> list[tuple[str, ...]]:
    """Operand dtypes of every ``dot_general`` among ``eqns``."""
    return [
        tuple(str(v.aval.dtype) for v in eqn.invars)
        for eqn in eqns
        if eqn.primitive.name == "dot_general"
    ]


def has_values_of(eqns, dtype: str) -> bool:
    """Whether any equation among ``eqns`` takes or makes a value of ``dtype``."""
    return any(
        str(getattr(getattr(v, "aval", None), "dtype", "")) == dtype
        for eqn in eqns
        for v in (*eqn.invars, *eqn.outvars)
    )


def ignored_compute_dtype(dtype: str, entry: str, dots, eqns) -> str:
    """Why none of the matmuls of ``entry`` takes ``dtype`` operands only: ``dtype`` values that
    meet float32 weights (JAX computes such a matmul in float32), or no ``dtype`` value at all."""
    if not has_values_of(eqns, dtype):
        return (
            f"compute_dtype={dtype}: none of the {len(dots)} matmuls of {entry} takes {dtype} "
            f"operands (e.g. {dots[0]}), and no {dtype} value appears in it: compute_dtype is "
            "ignored"
        )
    mixed = [d for d in dots if dtype in d and "float32" in d]
    seen = f"{len(mixed)} take {dtype} and float32" if mixed else f"e.g. {dots[0]}"
    return (
        f"compute_dtype={dtype}: the traced {entry} has {dtype} values, but none of its "
        f"{len(dots)} matmuls takes {dtype} operands only ({seen}): {dtype} activations meet "
        "float32 weights, and JAX computes such a matmul in float32 (cast the weights to "
        "compute_dtype too)"
    )


def n_layers(model: ModelConfig) -> int:
    return len(model.encoder_dims) + 1 + len(model.decoder_dims) + 1


# --- each implementation --------------------------------------------------------------------------


def test_parameters_and_optimizer_state_stay_float32(impl, model_name):
    config = config_of(model_name, "bfloat16")
    model = MODELS[model_name]
    params = suite_params(0, model)
    batch = suite_batch(1, B, model)

    state = impl.init(jax.random.key(0), config)
    assert_all_float32(state, "init's state")
    assert_all_float32(impl.to_canonical(state), "to_canonical of init's state")

    state = impl.from_canonical(params, config)
    assert_all_float32(state, "from_canonical's state")
    assert_all_float32(impl.to_canonical(state), "to_canonical of from_canonical's state")

    r = run(impl, model_name, "bfloat16")
    assert_all_float32(r.stepped_state, "the state after a train_step")
    assert_all_float32(r.stepped, "to_canonical after a train_step")
    # and as traced under jit, without compiling: the step's output types
    traced, metrics = jax.eval_shape(impl.train_step, state, batch, jax.random.key(2))
    assert_all_float32(traced, "the state a traced train_step returns")
    assert_all_float32(metrics, "the metrics a traced train_step returns")


def test_outputs_are_float32(impl, model_name):
    r = run(impl, model_name, "bfloat16")
    for what, value in (("mean", r.mean), ("logvar", r.logvar), ("logits", r.logits)):
        assert value.dtype == jnp.float32, (
            f"{what} is {value.dtype} under bfloat16 compute; the spec returns float32"
        )
    assert r.loss.dtype == jnp.float32, (
        f"the loss is {r.loss.dtype} under bfloat16 compute; the spec returns float32"
    )
    assert_all_float32(r.metrics, "loss metrics")
    assert_all_float32(r.step_metrics, "train_step metrics")
    assert_all_float32(r.grads, "gradients with respect to the canonical parameters")


def test_matmuls_take_the_compute_dtype(impl, model_name):
    """Every matmul of the traced loss and step is bfloat16, and float32 in a float32 run (so the
    check sees the matmuls at all)."""
    model = MODELS[model_name]
    params = suite_params(0, model)
    batch = suite_batch(1, B, model)
    key = jax.random.key(2)
    layers = n_layers(model)
    for dtype in ("bfloat16", "float32"):
        state = impl.from_canonical(params, config_of(model_name, dtype))
        for entry, least in (("loss", layers), ("train_step", 2 * layers)):
            eqns = equations(getattr(impl, entry), state, batch, key)
            floating = [d for d in matmul_dtypes(eqns) if all("float" in t for t in d)]
            assert len(floating) >= least, (
                f"{dtype} {entry}: {len(floating)} floating matmuls traced, expected at least "
                f"{least} ({layers} layers)"
            )
            wrong = [d for d in floating if set(d) != {dtype}]
            if len(wrong) == len(floating) and dtype != "float32":
                raise AssertionError(ignored_compute_dtype(dtype, entry, floating, eqns))
            mixed = [d for d in wrong if dtype in d and dtype != "float32"]
            assert not wrong, (
                f"compute_dtype={dtype}: {len(wrong)} of {len(floating)} matmuls of {entry} "
                f"take other operands, e.g. {(mixed or wrong)[0]}"
                + (
                    f": in {len(mixed)} of them {dtype} activations meet float32 weights, and JAX "
                    "computes such a matmul in float32 (cast the weights to compute_dtype too)"
                    if mixed
                    else ""
                )
            )


def test_bf16_forward_is_close_to_float32_but_not_equal(impl, model_name):
    bf16, f32 = run(impl, model_name, "bfloat16"), run(impl, model_name, "float32")
    pairs = (("mean", bf16.mean, f32.mean), ("logvar", bf16.logvar, f32.logvar))
    for what, got, want in (*pairs, ("logits", bf16.logits, f32.logits)):
        assert not np.array_equal(got, want), (
            f"{what}: bfloat16 equals float32 bit for bit: compute_dtype is ignored"
        )
        err = rel_rms(got, want)
        assert err >= FORWARD_FLOOR, (
            f"{what}: relative RMS difference from float32 {err:.3g} = {err / U:.3f} U, expected "
            f"at least {FORWARD_FLOOR / U:g} U: not computed in bfloat16 (an error this small "
            "comes from rounding only some values, such as the inputs, to bfloat16 while the "
            "matmuls compute in float32, or from computing in float16)"
        )
        assert_close_in_bf16(got, want, f"{what} (bfloat16 against float32)")


def test_bf16_loss_and_gradients_are_close_to_float32(impl, model_name):
    bf16, f32 = run(impl, model_name, "bfloat16"), run(impl, model_name, "float32")
    assert float(bf16.loss) == float(bf16.metrics["loss"]), (
        f'metrics["loss"] {float(bf16.metrics["loss"])!r} is not the loss returned beside it, '
        f"{float(bf16.loss)!r}"
    )
    # Reduced in float32: a float32 result is a bfloat16 number by chance once in 2**16.
    values = [
        float(m[k]) for m in (bf16.metrics, bf16.step_metrics) for k in ("loss", "recon", "kl")
    ]
    in_bf16 = [v for v in values if float(jnp.asarray(v, jnp.bfloat16)) == v]
    assert len(in_bf16) <= 1, f"the metrics {in_bf16} are bfloat16 numbers: not reduced in float32"
    assert_metrics_close(bf16.metrics, f32.metrics, "bfloat16 against float32")
    assert_grads_close(bf16.grads, f32.grads, "bfloat16 against float32")
    assert rel_rms(bf16.grads, f32.grads) > 0, (
        "the bfloat16 gradients equal the float32 ones bit for bit: compute_dtype is ignored"
    )


def test_bf16_step_is_close_to_float32(impl, model_name):
    bf16, f32 = run(impl, model_name, "bfloat16"), run(impl, model_name, "float32")
    assert_metrics_close(bf16.step_metrics, f32.step_metrics, "step metrics, bf16 against f32")
    lr = config_of(model_name, "float32").optim.learning_rate
    assert_steps_agree(bf16.params, bf16.stepped, f32.stepped, lr, "bf16 step against f32 step")


# --- every pair, both in bfloat16 -----------------------------------------------------------------


def test_bf16_forward_agrees_across_implementations(impl_pair, model_name):
    a, b = (run(impl, model_name, "bfloat16") for impl in impl_pair)
    for what in ("mean", "logvar", "logits"):
        assert_close_in_bf16(getattr(a, what), getattr(b, what), what, scale=PAIR)


def test_bf16_loss_gradients_and_step_agree_across_implementations(impl_pair, model_name):
    a, b = (run(impl, model_name, "bfloat16") for impl in impl_pair)
    assert_metrics_close(a.metrics, b.metrics, "loss metrics", scale=PAIR)
    assert_metrics_close(a.step_metrics, b.step_metrics, "step metrics", scale=PAIR)
    assert_grads_close(a.grads, b.grads, "gradients", scale=PAIR)
    lr = config_of(model_name, "bfloat16").optim.learning_rate
    assert_steps_agree(a.params, a.stepped, b.stepped, lr, "one step", scale=PAIR)
