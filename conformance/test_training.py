"""The ``training`` layer: several steps. Forty steps on the bundled digits lower the held-out
loss, and every other path an implementation offers for its train step computes what the protocol
step does.

An implementation may expose, beside its pure protocol step, the way its framework writes the step
(NNX's in-place ``nnx.jit`` step, Equinox's ``filter_jit``) or faster variants. Each is held to the
contract of SPEC section 6.3 (:func:`check_path`): ``make(state) -> (step, carry)``,
``step(carry, batch, key) -> (carry, metrics)`` with every metric ``train_step`` returns, the noise
drawn from the key it is given, the batch and the key left to the caller; and its metrics are
compared with ``train_step``'s over consecutive steps: the metrics of step t+1 are a function of the
parameters after step t, so agreeing metrics over several steps mean agreeing updates. A failure
names the path, the step and the clause it breaks. An implementation without such paths reports
these checks as not applicable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from cvae_rosetta.conformance.assertions import assert_close, require
from cvae_rosetta.conformance.common import CONFIG, digits, suite_batch, suite_params
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.validation import Batch

STEPS = 4
PATH_RTOL = 1e-5
KEY_SEED = 50  # step t's key is jax.random.key(KEY_SEED + t)
OTHER_KEY = 99  # the key that tells whether a path ignores the one it is given
SECTION = "SPEC section 6.3"
MAKE = f"{SECTION}: make(state) returns (step, carry), step callable"
STEP = (
    f"{SECTION}: step(carry, batch, key) returns (carry, metrics), the metrics a mapping with "
    "every metric train_step returns, each a scalar"
)
NOISE = (
    f"{SECTION}: a step draws eps = normal(key, (B, L)) from the key it is given, as train_step "
    "does"
)
INPUTS = f"{SECTION}: the batch and the key stay the caller's; a step must not donate them"


class ProtocolRun(NamedTuple):
    """``train_step`` over the suite's batches and keys: the state before each step (kept, for
    the diagnosis of a path's noise) and each step's metrics."""

    step: Callable
    batches: list[Batch]
    keys: list[jax.Array]
    states: list[Any]
    metrics: list[dict[str, float]]


def protocol_run(impl) -> ProtocolRun:
    """``STEPS`` consecutive steps of the jitted ``train_step`` (nothing donated) from the suite's
    parameters."""
    batches = [suite_batch(40 + t) for t in range(STEPS)]
    keys = [jax.random.key(KEY_SEED + t) for t in range(STEPS)]
    step = jax.jit(impl.train_step)
    states = [impl.from_canonical(suite_params(31), CONFIG)]
    metrics = []
    for batch, key in zip(batches, keys, strict=True):
        state, out = step(states[-1], batch, key)
        states.append(state)
        metrics.append({k: float(v) for k, v in out.items()})
    return ProtocolRun(step, batches, keys, states[:-1], metrics)


def _described(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _first_line(err: Exception) -> str:
    return next((line for line in str(err).splitlines() if line.strip()), "no message")


def _made(impl, label: str, make: Callable) -> tuple[Callable, Any]:
    """``make`` on a fresh state from ``from_canonical``, its result held to the clause."""
    try:
        made = make(impl.from_canonical(suite_params(31), CONFIG))
    except Exception as err:
        raise AssertionError(
            f"the path {label!r}: make(state) raised {type(err).__name__} on a fresh state from "
            f"from_canonical ({MAKE}): {_first_line(err)}"
        ) from err
    if not (isinstance(made, (tuple, list)) and len(made) == 2 and callable(made[0])):
        raise AssertionError(
            f"the path {label!r}: make(state) returned {_described(made)} ({MAKE})"
        )
    return made[0], made[1]


def _stepped(label: str, step: Callable, carry: Any, t: int, inputs: tuple) -> tuple[Any, Mapping]:
    """One call of a path's step, its result held to the clause."""
    batch, key = inputs
    try:
        out = step(carry, batch, key)
    except Exception as err:
        raise AssertionError(
            f"the path {label!r}: step(carry, batch, key) raised {type(err).__name__} at step "
            f"{t} ({STEP}): {_first_line(err)}"
        ) from err
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], Mapping)):
        pair = isinstance(out, (tuple, list)) and len(out) == 2
        inner = f" whose second item is {_described(out[1])}" if pair else ""
        raise AssertionError(
            f"the path {label!r}: step(carry, batch, key) returned {_described(out)}{inner} at "
            f"step {t}, not (carry, metrics) ({STEP})"
        )
    return out[0], out[1]


def _metrics_named(label: str, metrics: Mapping, want: Mapping, t: int) -> dict[str, float]:
    """The path's values of ``train_step``'s metrics, each a scalar."""
    missing = [name for name in want if name not in metrics]
    if missing:
        raise AssertionError(
            f"the path {label!r}'s metrics at step {t} lack {', '.join(map(repr, missing))}: it "
            f"returns {sorted(metrics)} where train_step returns {sorted(want)} ({STEP})"
        )
    for name in want:
        if np.shape(metrics[name]) != ():
            raise AssertionError(
                f"the path {label!r}'s {name} at step {t} has shape {np.shape(metrics[name])}, "
                f"not a scalar ({STEP})"
            )
    return {name: float(metrics[name]) for name in want}


def _inputs_kept(label: str, batch: Batch, key: jax.Array, t: int) -> None:
    for what, leaf in (("the batch's x", batch.x), ("the batch's c", batch.c), ("the key", key)):
        if getattr(leaf, "is_deleted", lambda: False)():
            raise AssertionError(
                f"the path {label!r}'s step {t} deleted {what} it was given: it donated it "
                f"({INPUTS})"
            )


def _agree(got: Mapping[str, float], want: Mapping[str, float]) -> bool:
    return all(
        np.isclose(got[name], value, rtol=PATH_RTOL, atol=0.0) for name, value in want.items()
    )


def _other_keys(run: ProtocolRun, t: int) -> Iterator[tuple[str, jax.Array]]:
    """The keys a path may wrongly draw step ``t``'s noise from, each with its name."""
    for s in range(STEPS):
        if s != t:
            yield f"the key of step {s} (jax.random.key({KEY_SEED + s}))", run.keys[s]
    yield "jax.random.key(0)", jax.random.key(0)
    halves = jax.random.split(run.keys[t])
    for i in range(2):
        yield f"jax.random.split(key)[{i}] of the key it is given", halves[i]


def _noise_mistake(impl, label: str, make: Callable, run: ProtocolRun, t: int, got: dict):
    """What explains a path's metrics at step ``t`` that differ from ``train_step``'s, when its
    noise does: the key whose ``train_step`` metrics they are, or a key the path ignores (the same
    metrics from a fresh run of the path with another key at step ``t``). None otherwise."""
    for which, key in _other_keys(run, t):
        _, metrics = run.step(run.states[t], run.batches[t], key)
        if _agree(got, {k: float(v) for k, v in metrics.items() if k in got}):
            return (
                f"the path {label!r}'s metrics at step {t} are train_step's with {which}, not "
                f"with the key it is given ({NOISE})"
            )
    try:
        step, carry = make(impl.from_canonical(suite_params(31), CONFIG))
        for s in range(t):
            carry, _ = step(carry, run.batches[s], run.keys[s])
        _, again = step(carry, run.batches[t], jax.random.key(OTHER_KEY))
        ignored = _agree({k: float(again[k]) for k in got}, got)
    except Exception:
        return None
    if ignored:
        return (
            f"the path {label!r} ignores the key it is given: its step {t} returns the same "
            f"metrics for jax.random.key({KEY_SEED + t}) and for jax.random.key({OTHER_KEY}) "
            f"({NOISE})"
        )
    return None


def check_path(impl, label: str, make: Callable, run: ProtocolRun) -> None:
    """SPEC section 6.3: the path ``label`` of ``impl`` from a fresh state, over the batches and
    keys of ``run``, against ``train_step``'s metrics there; an ``AssertionError`` naming the
    clause it breaks."""
    step, carry = _made(impl, label, make)
    for t, inputs in enumerate(zip(run.batches, run.keys, strict=True)):
        carry, metrics = _stepped(label, step, carry, t, inputs)
        got = _metrics_named(label, metrics, run.metrics[t], t)
        _inputs_kept(label, *inputs, t)
        for name, want in run.metrics[t].items():
            assert_close(
                got[name],
                want,
                f"the path {label!r}'s {name} at step {t}",
                rtol=PATH_RTOL,
                against="train_step's",
                explain=lambda t=t, got=got: _noise_mistake(impl, label, make, run, t, got),
            )


def test_every_path_follows_the_protocol_step(impl):
    require(impl, "paths")
    run = protocol_run(impl)
    for label, make in impl.extras["paths"].items():
        check_path(impl, label, make, run)


def test_a_few_dozen_steps_lower_the_loss_on_digits(impl):
    config = Config(model=ModelConfig(input_dim=64, num_classes=10, latent_dim=8))
    state = impl.from_canonical(suite_params(0, config.model), config)
    xs, cs, fixed = digits(64, seed=0)
    step = jax.jit(impl.train_step, donate_argnums=0)
    loss = jax.jit(impl.loss)  # as training evaluates it: one program for both calls
    before = float(loss(state, fixed, jax.random.key(1))[0])
    for t in range(40):
        state, _ = step(state, Batch(xs[t % len(xs)], cs[t % len(cs)]), jax.random.key(t))
    after = float(loss(state, fixed, jax.random.key(1))[0])
    assert after < 0.8 * before, (
        f"40 steps on the digits took the held-out loss from {before:.4g} to {after:.4g}; the "
        f"spec's model gets below 0.8 times the start ({0.8 * before:.4g})"
    )
