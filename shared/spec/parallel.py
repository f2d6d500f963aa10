"""Data parallelism written once for every implementation: ``pmap``, sharded ``jit``, ``shard_map``.

Every mechanism splits the global batch of ``B`` rows over a one-dimensional mesh of ``n`` devices
(axis ``"data"``), keeps the train state replicated, and follows SPEC section 3: the noise is drawn
once for the global batch, ``normal(key, (B, L))``, and device ``d`` uses rows
``d*B/n .. (d+1)*B/n`` of it. A data-parallel step therefore computes the serial step on the same
global batch, up to the order of floating-point sums.

- ``sharded``: the serial step under ``jax.jit`` with the batch sharded along its rows and the
  state replicated (``NamedSharding`` over ``jax.make_mesh``); XLA's partitioner inserts the
  all-reduce of the gradients. The implementation writes nothing for it.
- ``shard_map``: the step written per device; ``lax.pmean`` averages the gradients and the metrics
  explicitly before the update (the replicated state is first cast to each device's own, or JAX
  would already have summed its gradient over the devices: :func:`_per_device`).
- ``pmap``: the same per-device step under ``jax.pmap`` with an axis name, the state stacked along
  a leading device axis (the style of the source guide and of many codebases; JAX runs ``pmap`` on
  ``shard_map`` since 0.8).

The per-device step needs the step cut in two at the all-reduce: an implementation's
``compute_grads(state, batch, eps) -> (grads, metrics)`` (the ``grads_fn`` of its
:class:`~cvae_rosetta.spec.protocol.Adapter`) and ``state.apply_gradients(grads)``. Averaging
per-device mean losses is the global mean because every device holds the same number of rows.

The trainer's steps (:meth:`cvae_rosetta.app.devices.RunDevices.epoch_step`, built on
:class:`Plan`) also
report ``metrics["grad_norm"]``, the global norm of the step's gradient before clipping (after the
average over devices): the per-device steps have the gradient in hand, and the serial and
``sharded`` steps run the first half of the step (a ``grads`` method or a ``grads_fn``) and
``state.apply_gradients`` (what every built-in's ``train_step`` is) for any implementation that
has them, an :class:`~cvae_rosetta.spec.protocol.Adapter` or not (:func:`gradient_half`), and its
``train_step`` (no ``grad_norm``) otherwise. :meth:`Plan.make_step`, the data-parallel
``train_step`` that the suite compares with the serial one and the benchmark times, returns
``train_step``'s metrics only.

A step takes the state where its mechanism wants it: as it is for ``none``, replicated over the
mesh (:attr:`Plan.replicated`) for ``sharded`` and ``shard_map``, stacked along a leading device
axis and split over the mesh (:meth:`Plan.rows`) for ``pmap``. Across processes
(``jax.distributed``) the mesh holds every process's devices, each process puts only its own rows
of a global batch on its devices, and the ``sharded`` and ``shard_map`` steps run unchanged.

This module is part of the contract because the conformance suite checks these steps against the
serial one. What only ``cvae train`` and ``cvae bench`` need (splitting the host into devices, a
run's state and batches placed on its devices, the trainer's step over an epoch with its
``finite`` check) is the application's: ``cvae_rosetta.app.devices``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cvae_rosetta.spec.config import DATA_PARALLEL
from cvae_rosetta.spec.errors import ConfigError
from cvae_rosetta.spec.model import noise
from cvae_rosetta.spec.protocol import Adapter
from cvae_rosetta.spec.validation import Batch, check_batch

AXIS = "data"
MECHANISMS = DATA_PARALLEL
PER_DEVICE = ("pmap", "shard_map")  # the mechanisms that need the implementation's compute_grads

Step = Callable[[Any, Batch, jax.Array], tuple[Any, dict]]


def grad_norm(grads: Any) -> jax.Array:
    """The global norm of a gradient, as ``optax.clip_by_global_norm`` computes it before it
    clips."""
    return optax.tree.norm(grads)


def gradient_half(impl: Any) -> Callable[[Any, Batch, jax.Array], tuple[Any, dict]] | None:
    """``(state, batch, key) -> (grads, metrics)``: the first half of ``impl.train_step``, where
    the implementation offers one (duck typing: no base class needed), else ``None``.

    - ``impl.grads(state, batch, key)``, a method on the caller's key (what an :class:`Adapter`
      with a ``grads_fn`` has: ``grads_fn`` after its checks, on the noise it draws);
    - else ``impl.grads_fn(state, batch, eps)``, on the noise of SPEC section 3 for the key, drawn
      after the checks of section 7 as the adapter draws it.

    An :class:`Adapter` without a ``grads_fn``, or of a subclass with a ``train_step`` of its own
    (one that steps otherwise than ``grads_fn``), has none."""
    grads_fn = getattr(impl, "grads_fn", None)
    if isinstance(impl, Adapter):
        if grads_fn is None or type(impl).train_step is not Adapter.train_step:
            return None
        return impl.grads
    grads = getattr(impl, "grads", None)
    if callable(grads):
        return grads
    if not callable(grads_fn):
        return None

    def first_half(state, batch: Batch, key: jax.Array):
        return grads_fn(state, batch, Adapter._noise(state, batch, key))  # the adapter's checks

    return first_half


def serial_step(impl: Any, *, with_grad_norm: bool = False) -> Step:
    """``(state, batch, key) -> (state, metrics)``: ``impl.train_step``, or, ``with_grad_norm``,
    the same step cut at the gradient to add ``metrics["grad_norm"]``: the implementation's
    :func:`gradient_half`, then ``state.apply_gradients(grads=...)``. Any implementation that has
    both (a ``grads`` method or a ``grads_fn``, and a state with ``apply_gradients``) is cut, an
    :class:`Adapter` or not; any other runs its ``train_step``, without ``grad_norm``."""
    first_half = gradient_half(impl) if with_grad_norm else None
    if first_half is None:
        return impl.train_step

    def step(state, batch: Batch, key: jax.Array):
        if not callable(getattr(state, "apply_gradients", None)):
            return impl.train_step(state, batch, key)  # decided while tracing: no second half
        grads, metrics = first_half(state, batch, key)
        return state.apply_gradients(grads=grads), {**metrics, "grad_norm": grad_norm(grads)}

    return step


def check_mechanism(mechanism: str, impl: Any) -> None:
    """Refuse a per-device mechanism for an implementation that cannot cut its step in two."""
    if mechanism in PER_DEVICE and getattr(impl, "grads_fn", None) is None:
        raise ConfigError(
            f"train.data_parallel: expected 'none' or 'sharded' for {getattr(impl, 'name', impl)!r}"
            f", which has no grads_fn (compute_grads) to average across devices, got {mechanism!r}"
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a run spreads its batches: a mechanism over the first ``count`` devices."""

    mechanism: str
    devices: tuple[Any, ...]
    # The global draw of SPEC section 3, ``(key, B, L) -> f32[B, L]``; a field so that the suite
    # can swap in a wrong draw and prove that its checks see the difference.
    noise: Callable[[jax.Array, int, int], jax.Array] = noise

    @classmethod
    def create(cls, mechanism: str, count: int | None = None, impl: Any = None) -> Plan:
        """The plan of ``mechanism`` over the first ``count`` devices (default: one for ``none``,
        every device otherwise); with ``impl``, one that refuses a per-device mechanism the
        implementation cannot run (:func:`check_mechanism`)."""
        if mechanism not in MECHANISMS:
            raise ConfigError(
                f"train.data_parallel: expected one of {', '.join(MECHANISMS)}, got {mechanism!r}"
            )
        available = jax.devices()
        count = (1 if mechanism == "none" else len(available)) if count is None else count
        if mechanism == "none" and count != 1:
            raise ConfigError(
                f"train.devices: expected 1 without data parallelism (pick train.data_parallel "
                f"pmap, sharded or shard_map to use more), got {count}"
            )
        if count > len(available):
            raise ConfigError(
                f"train.devices: expected at most {len(available)} (the {available[0].platform} "
                f"devices JAX sees), got {count}"
            )
        if impl is not None:
            check_mechanism(mechanism, impl)
        return cls(mechanism, tuple(available[:count]))

    @property
    def count(self) -> int:
        return len(self.devices)

    @functools.cached_property
    def mesh(self) -> Mesh:
        # A one-dimensional mesh over the devices in the order JAX lists them (process by process),
        # so each process's devices hold a contiguous block of every batch's rows.
        # Auto axes: the partitioner propagates shardings (the sharded-jit style); with Explicit
        # axes every array's sharding would be part of its type.
        return jax.make_mesh(
            (self.count,), (AXIS,), axis_types=(AxisType.Auto,), devices=self.devices
        )

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    def rows(self, axis: int = 0) -> NamedSharding:
        """The sharding that splits dimension ``axis`` over the devices."""
        return NamedSharding(self.mesh, P(*([None] * axis), AXIS))

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size % self.count:
            raise ConfigError(
                f"data.batch_size: expected a multiple of the {self.count} devices of "
                f"train.data_parallel {self.mechanism}, got {batch_size}"
            )

    # --- the step --------------------------------------------------------------------------------

    def per_device_step(
        self, impl: Any, *, with_grad_norm: bool = False
    ) -> Callable[[Any, Batch, jax.Array], tuple[Any, dict]]:
        """``(state, batch rows, eps rows) -> (state, metrics)`` on one device: the gradient of its
        rows, averaged over the ``"data"`` axis, then one update that is the same everywhere;
        ``with_grad_norm``, the metrics also carry the averaged gradient's ``grad_norm``."""
        check_mechanism(self.mechanism, impl)
        grads_fn = impl.grads_fn
        replicated = self.mechanism == "shard_map"  # pmap's stacked state is each device's own

        def step(state, batch: Batch, eps: jax.Array):
            grads, metrics = grads_fn(_per_device(state) if replicated else state, batch, eps)
            grads, metrics = jax.lax.pmean((grads, metrics), AXIS)
            if with_grad_norm:
                metrics = {**metrics, "grad_norm": grad_norm(grads)}
            return state.apply_gradients(grads=grads), metrics

        return step

    def global_step(
        self, impl: Any, *, with_grad_norm: bool = False
    ) -> Callable[[Any, Batch, jax.Array], tuple[Any, dict]]:
        """``(state, global batch, key) -> (state, metrics)``, traceable (not yet jitted), for the
        ``none``, ``sharded`` and ``shard_map`` mechanisms; the batch's rows are split over the mesh
        by the caller's input sharding. ``with_grad_norm``: the metrics also carry ``grad_norm``
        where the step can see the gradient (always with ``shard_map``; see :func:`serial_step`)."""
        if self.mechanism in ("none", "sharded"):
            return serial_step(impl, with_grad_norm=with_grad_norm)
        if self.mechanism != "shard_map":
            raise ValueError(f"{self.mechanism} has no global step; use make_step")
        local = jax.shard_map(
            self.per_device_step(impl, with_grad_norm=with_grad_norm),
            mesh=self.mesh,
            in_specs=(P(), P(AXIS), P(AXIS)),
            out_specs=(P(), P()),
        )

        def step(state, batch: Batch, key: jax.Array):
            model = state.config.model
            check_batch(batch, model.input_dim, model.num_classes)
            return local(state, batch, self.noise(key, batch.x.shape[0], model.latent_dim))

        return step

    def pmap_step(
        self,
        impl: Any,
        wrap: Callable[[Callable], Callable] = lambda step: step,
        *,
        with_grad_norm: bool = False,
    ) -> tuple[Callable[[Batch, jax.Array, int], tuple], Callable]:
        """The ``pmap`` mechanism's step in its two parts: ``blocks(global batch, key, latent_dim)
        -> (x, c, eps)`` (traceable), the global noise drawn and each array cut into ``[n, B/n,
        ...]`` blocks, device ``d``'s the ``d``-th; and the ``pmap``-ed per-device step over a
        stacked state and those blocks (``wrap``: what the caller adds around the per-device
        step)."""

        def blocks(batch: Batch, key: jax.Array, latent_dim: int):
            eps = self.noise(key, batch.x.shape[0], latent_dim)
            return split_for_pmap(batch, eps, count=self.count)

        pstep = jax.pmap(
            wrap(self.per_device_step(impl, with_grad_norm=with_grad_norm)),
            axis_name=AXIS,
            devices=self.devices,
            donate_argnums=0,
        )
        return blocks, pstep

    def make_step(self, impl: Any) -> Step:
        """``step(placed state, global batch, key) -> (placed state, metrics)`` (the state where
        the mechanism wants it: see the module's docstring), compiled on first use, the old state
        donated. The global batch may live anywhere; it is split here."""
        if self.mechanism == "pmap":
            blocks, pstep = self.pmap_step(impl)
            prepare = jax.jit(blocks, static_argnums=2, out_shardings=self.rows())

            def step(state, batch: Batch, key: jax.Array):
                model = state.config.model
                check_batch(batch, model.input_dim, model.num_classes)
                self.check_batch_size(batch.x.shape[0])
                x, c, eps = prepare(batch, key, model.latent_dim)
                state, metrics = pstep(state, Batch(x, c), eps)
                return state, first_device(metrics)

            return step

        rows = self.rows() if self.mechanism != "none" else None
        jitted = jax.jit(
            self.global_step(impl),
            in_shardings=None if rows is None else (self.replicated, rows, self.replicated),
            out_shardings=None if rows is None else (self.replicated, self.replicated),
            donate_argnums=0,
        )

        def step(state, batch: Batch, key: jax.Array):
            if rows is not None:
                self.check_batch_size(batch.x.shape[0])
            return jitted(state, batch, key)

        return step


def _per_device(tree: Any) -> Any:
    """Each device's own copy of a tree replicated over the ``"data"`` axis (typed as varying over
    it), so that a gradient with respect to it is the gradient of the device's rows alone. Under
    ``shard_map`` the state comes in replicated (``P()``), and JAX sums the gradient with respect
    to a replicated input over the devices (the transpose of replication is a ``psum``): without
    this cast the ``pmean`` that follows would average ``n`` copies of ``n`` times the mean
    gradient. (Global-norm clipping and Adam hide most of that factor from the parameters, not from
    ``grad_norm``.)"""
    return jax.tree.map(lambda leaf: jax.lax.pcast(leaf, AXIS, to="varying"), tree)


def first_device(tree: Any) -> Any:
    """Device 0's row of a pmap output (every row is the same after ``pmean``), read from that
    device's own buffer rather than by an indexing op over all the devices."""
    return jax.tree.map(lambda a: a.addressable_data(0)[0], tree)


def split_for_pmap(batch: Batch, eps: jax.Array, *, count: int):
    """``[B, ...] -> [count, B/count, ...]``: device ``d`` gets the ``d``-th block of rows."""
    return tuple(a.reshape(count, a.shape[0] // count, *a.shape[1:]) for a in (*batch, eps))
