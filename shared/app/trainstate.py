"""An implementation's train state as the canonical tree and back: the form a checkpoint holds
it in, so that any implementation can continue it.

```
{"step":      i32[],                          # optimiser steps taken
 "params":    canonical parameters,          # SPEC section 2
 "opt_state": {"count": i32[],               # Adam's step count
               "mu":    canonical tree,      # Adam's first moments, shaped like the parameters
               "nu":    canonical tree}}     # and second moments
```

The optimiser of SPEC section 5 (``chain(clip_by_global_norm, adamw)``) keeps exactly one Adam state
and nothing else, whatever the framework: a NamedTuple whose fields are exactly ``count``, ``mu``
and ``nu`` (optax's ``ScaleByAdamState``, or an implementation's own). ``mu`` and ``nu`` are trees
like the framework's parameters, so each is converted with the implementation's own ``to_canonical``
and ``from_canonical``, by treating it as the parameters of a state (:func:`canonical_state`,
:func:`implementation_state`, which rebuilds the Adam state with its ``_replace``). A state needs
only ``step``, ``params``, ``opt_state`` (attributes or properties) and ``replace(**changes)``
(``dataclasses.replace`` when it has none), as Flax's ``TrainState`` has. ``cvae train`` runs that
conversion on the fresh state before its first step (:func:`check_checkpointable`), so a run that
could not be checkpointed is refused before it trains.

The checkpoints themselves (the state with the run's keys and metadata, on disk through Orbax) are
:mod:`cvae_rosetta.app.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.spec import canonical
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import CheckpointError, ParameterError

ADAM_FIELDS = ("count", "mu", "nu")  # optax.ScaleByAdamState's, and any NamedTuple's like it


def _is_adam(node: Any) -> bool:
    """An Adam state: a NamedTuple whose fields are exactly ``count``, ``mu`` and ``nu``, optax's
    ``ScaleByAdamState`` or an implementation's own."""
    return isinstance(node, tuple) and tuple(getattr(node, "_fields", ())) == ADAM_FIELDS


def _name(impl: Any) -> str:
    return repr(getattr(impl, "name", impl))


def _shapes(tree: Any) -> list[tuple[int, ...]]:
    return [tuple(np.shape(leaf)) for leaf in jax.tree.leaves(tree)]


def _adam_state(opt_state: Any, impl: Any, params: Any = None) -> Any:
    """The one Adam state of the spec's optimiser, with ``mu`` and ``nu`` shaped like ``params``
    (when given); refuses an optimiser state with anything else."""
    nodes = jax.tree.leaves(opt_state, is_leaf=_is_adam)
    adams = [n for n in nodes if _is_adam(n)]
    if len(adams) != 1 or len(nodes) != 1:
        raise CheckpointError(
            f"opt_state: expected the state of SPEC section 5's optimiser from {_name(impl)}: one "
            f"Adam state (a NamedTuple of exactly count, mu and nu, such as "
            f"optax.ScaleByAdamState) and nothing else, got {len(adams)} Adam state(s) among "
            f"{len(nodes)} node(s)"
        )
    adam = adams[0]
    if params is not None:
        want = _shapes(params)
        for field in ("mu", "nu"):
            got = _shapes(getattr(adam, field))
            if len(got) != len(want):
                raise CheckpointError(
                    f"opt_state.{field}: expected the Adam moments of {_name(impl)} shaped like "
                    f"its params ({len(want)} arrays), got {len(got)} arrays"
                )
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                if g != w:
                    raise CheckpointError(
                        f"opt_state.{field}: expected the Adam moments of {_name(impl)} shaped "
                        f"like its params (array {i} of shape {w}), got array {i} of shape {g}"
                    )
    return adam


def _replace(state: Any, impl: Any, **changes: Any) -> Any:
    """``state.replace(**changes)``, or ``dataclasses.replace`` for a dataclass without one."""
    if not hasattr(state, "replace") and not dataclasses.is_dataclass(state):
        raise CheckpointError(
            f"impl: expected {_name(impl)}'s train state to have a replace(**changes) method or to "
            f"be a dataclass, to be checkpointed, got a {type(state).__name__}"
        )
    try:
        if hasattr(state, "replace"):
            return state.replace(**changes)
        return dataclasses.replace(state, **changes)
    except TypeError as err:
        raise CheckpointError(
            f"impl: expected {_name(impl)}'s train state to accept replace("
            f"{', '.join(f'{k}=...' for k in changes)}) to be checkpointed, got TypeError: {err}"
        ) from err


def _check_state_shape(state: Any, impl: Any) -> None:
    missing = [name for name in ("step", "params", "opt_state") if not hasattr(state, name)]
    if missing:
        raise CheckpointError(
            f"impl: expected {_name(impl)} to keep its train state as step, params and opt_state "
            f"(as Flax's TrainState does) to be checkpointed, got a {type(state).__name__} without "
            f"{', '.join(missing)}"
        )


def canonical_state(impl: Any, state: Any) -> dict[str, Any]:
    """An implementation's train state as the canonical tree (host arrays)."""
    _check_state_shape(state, impl)
    adam = _adam_state(state.opt_state, impl, state.params)

    def as_params(tree: Any) -> canonical.Canonical:
        return impl.to_canonical(_replace(state, impl, params=tree))

    tree = {
        "step": jnp.asarray(state.step, jnp.int32),
        "params": impl.to_canonical(state),
        "opt_state": {
            "count": jnp.asarray(adam.count, jnp.int32),
            "mu": as_params(adam.mu),
            "nu": as_params(adam.nu),
        },
    }
    return jax.tree.map(np.asarray, jax.device_get(tree))


def implementation_state(impl: Any, tree: dict[str, Any], config: Config) -> Any:
    """The implementation's train state holding a canonical tree's parameters, Adam moments, count
    and step (the inverse of :func:`canonical_state`): the Adam state rebuilt with its own
    ``_replace(count=, mu=, nu=)``, the train state with ``replace(step=, opt_state=)``."""
    check_state_tree(tree, config)
    state = impl.from_canonical(tree["params"], config)
    _check_state_shape(state, impl)
    adam = _adam_state(state.opt_state, impl, state.params)
    opt = tree["opt_state"]
    moments = {
        name: impl.from_canonical(opt[name], config).params for name in ("mu", "nu")
    }  # each moment tree in the framework's own layout
    count = jnp.asarray(opt["count"], getattr(adam.count, "dtype", jnp.int32))
    new = adam._replace(count=count, **moments)
    opt_state = jax.tree.map(lambda n: new if _is_adam(n) else n, state.opt_state, is_leaf=_is_adam)
    if jax.tree.structure(opt_state) != jax.tree.structure(state.opt_state):
        raise CheckpointError(
            f"opt_state: {_name(impl)} rebuilt its Adam moments with another structure than its "
            "own optimiser state"
        )
    return _replace(state, impl, step=jnp.asarray(tree["step"], jnp.int32), opt_state=opt_state)


def check_checkpointable(impl: Any, state: Any, config: Config) -> None:
    """Refuse, before a run's first step, an implementation whose train state a checkpoint cannot
    hold: ``state`` (a fresh one will do) converted to the canonical tree and back, and that again
    to the canonical tree, as a save and a resume do. Raises :class:`CheckpointError`."""
    tree = canonical_state(impl, state)
    canonical_state(impl, implementation_state(impl, tree, config))  # which checks the tree


def _check_scalar(value: Any, field: str) -> None:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape != () or dtype is None or np.dtype(dtype) != np.int32 or int(value) < 0:
        raise CheckpointError(f"{field}: expected a non-negative int32 scalar, got {value!r}")


def check_state_tree(tree: Any, config: Config) -> None:
    """Refuse a tree that is not the canonical train state of ``config.model``."""
    if not isinstance(tree, dict) or set(tree) - {"run_keys"} != {"step", "params", "opt_state"}:
        keys = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
        raise CheckpointError(f"train state: expected keys opt_state, params, step, got {keys}")
    opt = tree["opt_state"]
    if not isinstance(opt, dict) or set(opt) != {"count", "mu", "nu"}:
        keys = sorted(opt) if isinstance(opt, dict) else type(opt).__name__
        raise CheckpointError(f"opt_state: expected keys count, mu, nu, got {keys}")
    _check_scalar(tree["step"], "step")
    _check_scalar(opt["count"], "opt_state.count")
    try:
        canonical.check(tree["params"], config.model, field="params")
        canonical.check(opt["mu"], config.model, field="opt_state.mu")
        canonical.check(opt["nu"], config.model, field="opt_state.nu")
    except ParameterError as err:
        raise CheckpointError(str(err)) from err
