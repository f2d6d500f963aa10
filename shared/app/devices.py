"""A run on its devices: the host split into devices, the run's data placed on them, its step.

The data-parallel steps themselves (:class:`~cvae_rosetta.spec.parallel.Plan`: ``pmap``, sharded
``jit``, ``shard_map``) are part of the contract, because the conformance suite checks them against
the serial step. What only ``cvae train`` and ``cvae bench`` need is here:
:func:`arrange_cpu_devices`, which splits the host into XLA devices before JAX starts, and
:class:`RunDevices`, a run's plan with what the run does on its devices: the state placed where the
mechanism wants it (:meth:`~RunDevices.place_state`), each epoch's batches split over the devices
(:meth:`~RunDevices.place_epoch`; across processes each process puts only its own rows), one
device's copy of the state back for evaluation and checkpoints (:meth:`~RunDevices.local_state`),
and the step the trainer compiles ahead and runs over an epoch's device-resident batches
(:meth:`~RunDevices.epoch_step`), with ``metrics["finite"]`` (and ``grad_norm`` where the step can
see the gradient).

A run goes into the contract twice: for its plan (:meth:`RunDevices.of`, which also refuses a
mechanism the implementation cannot run) and for its mechanism's step (in
:meth:`RunDevices.epoch_step`); the rest is done here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError
from cvae_rosetta.spec.model import step_key
from cvae_rosetta.spec.parallel import Plan
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


# --- a run's data on its devices ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunDevices:
    """A run's :class:`~cvae_rosetta.spec.parallel.Plan` and what the run does on its devices."""

    plan: Plan

    @classmethod
    def of(cls, config: Config, impl: Any = None) -> RunDevices:
        """The devices a run's config asks for; with ``impl``, refusing a mechanism that the
        implementation cannot run."""
        return cls(Plan.create(config.train.data_parallel, config.train.devices, impl))

    def place_state(self, state: Any) -> Any:
        """The state as the step wants it: replicated, or stacked per device for ``pmap``."""
        plan = self.plan
        if plan.mechanism == "none":
            return state
        if plan.mechanism == "pmap":
            stacked = jax.tree.map(lambda a: np.stack([np.asarray(a)] * plan.count), state)
            return self._put(stacked, plan.rows())
        return self._put(jax.tree.map(np.asarray, state), plan.replicated)

    def place_epoch(self, xs: Any, cs: Any) -> tuple[Any, Any]:
        """An epoch's batches, ``[num_batches, B, ...]``, each batch's rows split over the devices
        (across processes, ``xs`` and ``cs`` are the whole epoch's and each process puts only its
        own rows on its devices)."""
        if self.plan.mechanism == "none":
            return xs, cs
        rows = self.plan.rows(axis=1)
        return self._put(xs, rows, axis=1), self._put(cs, rows, axis=1)

    def local_state(self, state: Any) -> Any:
        """One device's copy of a placed state (every copy is the same), for evaluation and
        saving: a plain single-device state of the implementation."""
        if self.plan.mechanism == "none":
            return state
        return _device_zero(state, stacked=self.plan.mechanism == "pmap")

    def rows_of_process(self, batch_size: int) -> slice:
        """The rows of every global batch that this process's devices hold."""
        devices = self.plan.devices
        index = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
        per_device = batch_size // len(devices)
        return slice(index[0] * per_device, (index[-1] + 1) * per_device)

    def _put(self, tree: Any, sharding: NamedSharding, axis: int | None = None) -> Any:
        if jax.process_count() == 1:
            return jax.device_put(tree, sharding)

        def put(a):
            a = np.asarray(a)
            if axis is None:  # replicated: every process holds the whole value
                return jax.make_array_from_process_local_data(sharding, a, a.shape)
            index = [slice(None)] * a.ndim
            index[axis] = self.rows_of_process(a.shape[axis])
            return jax.make_array_from_process_local_data(sharding, a[tuple(index)], a.shape)

        return jax.tree.map(put, tree)

    def epoch_step(self, impl: Any, *, debug_nans: bool = False) -> Callable[..., Any]:
        """``(state, xs, cs, i, run_key, t) -> (state, metrics)`` for the trainer: batch ``i`` of
        the epoch's ``xs: [num_batches, B, D]``, key ``fold_in(run_key, t)``; the metrics also
        carry ``finite`` (see :func:`_with_finite`). Returns a function with ``lower(*args)`` like
        a ``jax.jit`` object, so the trainer can compile it ahead and time it. The metrics carry
        ``grad_norm`` too where the step can see the gradient (every mechanism for an
        implementation with a ``grads_fn``, the serial and ``sharded`` ones for one with a
        ``grads`` method, an ``Adapter`` or not; see
        :func:`~cvae_rosetta.spec.parallel.serial_step`). ``debug_nans`` (serial only) checkifies
        the step for NaNs: it then returns ``(error, (state, metrics))``."""
        plan = self.plan
        if plan.mechanism == "pmap":
            blocks, pstep = plan.pmap_step(impl, wrap=_with_finite, with_grad_norm=True)

            def prepare(xs, cs, i, run_key, t, latent_dim):
                return blocks(Batch(xs[i], cs[i]), step_key(run_key, t), latent_dim)

            # the blocks land straight on their devices, where the compiled pmap expects them
            prepare = jax.jit(prepare, static_argnums=5, out_shardings=plan.rows())
            return _PmapEpochStep(prepare, pstep)

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


def _device_zero(tree: Any, *, stacked: bool) -> Any:
    """Device 0's copy of a tree placed on several devices, read from that device's own buffer;
    ``stacked``: its row of a ``pmap`` output (every row is the same after ``pmean``)."""
    if stacked:
        return jax.tree.map(lambda a: a.addressable_data(0)[0], tree)
    return jax.tree.map(lambda a: a.addressable_data(0), tree)


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
            return state, _device_zero(metrics, stacked=True)

        return step
