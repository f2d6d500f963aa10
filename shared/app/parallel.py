"""The trainer's data-parallel runtime: the devices a run asks for, and its step over an epoch.

The data-parallel steps themselves (:class:`~cvae_rosetta.spec.parallel.Plan`: ``pmap``, sharded
``jit``, ``shard_map``) are part of the contract, because the conformance suite checks them against
the serial step. What only ``cvae train`` and ``cvae bench`` need is here:
:func:`arrange_cpu_devices`, which splits the host into XLA devices before JAX starts, and
:func:`epoch_step`, the step the trainer compiles ahead and runs over an epoch's device-resident
batches, with ``metrics["finite"]`` (and ``grad_norm`` where the step can see the gradient).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from cvae_rosetta.spec.errors import ConfigError
from cvae_rosetta.spec.model import step_key
from cvae_rosetta.spec.parallel import Plan, first_device, split_for_pmap
from cvae_rosetta.spec.validation import Batch

# --- devices ------------------------------------------------------------------------------------


def arrange_cpu_devices(count: int) -> None:
    """Ask XLA:CPU for ``count`` host devices; must run before JAX touches any device.

    On a machine with accelerators this changes nothing on them (only the CPU backend is split).
    If JAX has already started with fewer devices, say so rather than run on the wrong number.
    """
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        if jax.device_count() < count:
            raise ConfigError(
                f"train.devices: expected at most {jax.device_count()} (JAX has already started "
                f"with {jax.device_count()} device(s) in this process), got {count}"
            ) from None


# --- the trainer's step over an epoch's device-resident batches ---------------------------------


def all_finite(tree: Any) -> jax.Array:
    """Whether every float in ``tree`` is finite: one fused reduction, cheap beside a step."""
    leaves = [jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree)]
    return jnp.stack(leaves).all()


def _with_finite(step: Callable) -> Callable:
    """The step, with ``metrics["finite"]``: whether the new state is finite. A non-finite
    gradient shows there on the step it happens, even while that step's loss is still finite."""

    def checked(state, *args):
        state, metrics = step(state, *args)
        return state, {**metrics, "finite": all_finite(state)}

    return checked


def epoch_step(plan: Plan, impl: Any, *, debug_nans: bool = False) -> Callable[..., Any]:
    """``(state, xs, cs, i, run_key, t) -> (state, metrics)`` for the trainer: batch ``i`` of the
    epoch's ``xs: [num_batches, B, D]``, key ``fold_in(run_key, t)``; the metrics also carry
    ``finite`` (see :func:`_with_finite`). Returns a function with ``lower(*args)`` like a
    ``jax.jit`` object, so the trainer can compile it ahead and time it. The metrics carry
    ``grad_norm`` too where the step can see the gradient (every mechanism for an implementation
    with a ``grads_fn``, the serial and ``sharded`` ones for one with a ``grads`` method, an
    ``Adapter`` or not; see :func:`~cvae_rosetta.spec.parallel.serial_step`). ``debug_nans``
    (serial only) checkifies the step for NaNs: it then returns ``(error, (state, metrics))``."""
    if plan.mechanism == "pmap":
        pstep = plan.pmap_step(impl, wrap=_with_finite, with_grad_norm=True)

        def prepare(xs, cs, i, run_key, t, latent_dim):
            x, c = xs[i], cs[i]
            eps = plan.noise(step_key(run_key, t), x.shape[0], latent_dim)
            return split_for_pmap(Batch(x, c), eps, count=plan.count)

        # the blocks land straight on their devices, where the compiled pmap expects them
        return _PmapEpochStep(jax.jit(prepare, static_argnums=5, out_shardings=plan.rows()), pstep)

    step = _with_finite(plan.global_step(impl, with_grad_norm=True))

    def fn(state, xs, cs, i, run_key, t):
        return step(state, Batch(xs[i], cs[i]), step_key(run_key, t))

    if plan.mechanism == "none":
        if debug_nans:
            from jax.experimental import checkify

            return jax.jit(checkify.checkify(fn, errors=checkify.nan_checks), donate_argnums=0)
        return jax.jit(fn, donate_argnums=0)
    epoch = plan.rows(axis=1)  # [num_batches, B, ...]: every batch's rows split over the mesh
    r = plan.replicated
    return jax.jit(
        fn,
        in_shardings=(r, epoch, epoch, r, r, r),
        out_shardings=(r, r),
        donate_argnums=0,
    )


@dataclasses.dataclass
class _PmapEpochStep:
    prepare: Any
    pstep: Any

    def lower(self, state, xs, cs, i, run_key, t):
        latent_dim = state.config.model.latent_dim
        prepare = self.prepare.lower(xs, cs, i, run_key, t, latent_dim).compile()
        x, c, eps = jax.eval_shape(lambda: prepare(xs, cs, i, run_key, t))
        pstep = self.pstep.lower(state, Batch(x, c), eps).compile()
        return _Lowered(prepare, pstep)


@dataclasses.dataclass
class _Lowered:
    prepare: Any
    pstep: Any

    def compile(self) -> Callable[..., Any]:
        def step(state, xs, cs, i, run_key, t):
            x, c, eps = self.prepare(xs, cs, i, run_key, t)
            state, metrics = self.pstep(state, Batch(x, c), eps)
            return state, first_device(metrics)

        return step
