"""Data parallelism (shared/spec/parallel.py) over every implementation: ``pmap``, sharded ``jit``,
``shard_map``, on 1, 2, 4 and 8 devices.

A data-parallel step on a global batch must compute the serial step on that batch: the same
parameters, optimiser state and step count, the same metrics, after one step and after ten, with
the state identical on every device. The device counts are those JAX sees: one on a plain CPU (each
implementation's tox environment), two, four and eight in the ``multidevice`` one, which forces
eight host devices before JAX starts (and leaves out the cases on one device).
``pmap`` and ``shard_map`` need the implementation's ``grads_fn``; without it they are reported as
not applicable.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.conformance.assertions import assert_trees_close, require
from cvae_rosetta.conformance.common import (
    CONFIG,
    MODEL,
    copy_to_host,
    fresh,
    suite_batch,
    suite_params,
)
from cvae_rosetta.conformance.messages import tree_mismatch
from cvae_rosetta.spec import parallel
from cvae_rosetta.spec.model import noise

DEVICE_COUNTS = [n for n in (1, 2, 4, 8) if n <= jax.device_count()]
B = 16  # divisible by every device count above
STEPS = 10
# The serial and the parallel step sum the same numbers in a different order (per device, then
# across devices); ten Adam steps keep that within a few float32 ulps of the parameters.
RTOL, ATOL = 1e-5, 1e-6


def _applicable(impl, mechanism: str) -> None:
    if mechanism in parallel.PER_DEVICE:
        require(impl, "data_parallel")


@pytest.fixture(scope="module")
def run(impl):
    """The serial run every parallel run is compared with: states and metrics after each step.
    Parameters and batches are kept as NumPy arrays: each run gets buffers of its own."""
    params = copy_to_host(suite_params(71))
    batches = [copy_to_host(suite_batch(100 + t, B)) for t in range(STEPS)]
    keys = [jax.random.fold_in(jax.random.key(72), t) for t in range(STEPS)]
    step = jax.jit(impl.train_step)
    state = impl.from_canonical(fresh(params), CONFIG)
    history = []
    for batch, key in zip(batches, keys, strict=True):
        state, metrics = step(state, fresh(batch), key)
        history.append((jax.device_get(state), jax.device_get(metrics)))
    return params, batches, keys, history


CHECKED = (0, STEPS - 1)  # after one step and after ten


def _placed(plan: parallel.Plan, state):
    """The state where ``plan.make_step`` takes it: as it is for ``none``, stacked per device and
    split over the mesh for ``pmap``, replicated over the mesh otherwise."""
    if plan.mechanism == "none":
        return state
    if plan.mechanism == "pmap":
        stacked = jax.tree.map(lambda a: np.stack([np.asarray(a)] * plan.count), state)
        return jax.device_put(stacked, plan.rows())
    return jax.device_put(state, plan.replicated)


def _device_copies(plan: parallel.Plan, state) -> list:
    """The copy of a placed state on each device, as host arrays."""
    if plan.mechanism == "none":
        return [jax.device_get(state)]
    leaves, treedef = jax.tree.flatten(state)
    per_device = [[np.asarray(s.data) for s in leaf.addressable_shards] for leaf in leaves]
    copies = []
    for d in range(len(per_device[0])):
        values = [shards[d] for shards in per_device]
        if plan.mechanism == "pmap":
            values = [v[0] for v in values]
        copies.append(treedef.unflatten(values))
    return copies


def _train(impl, plan: parallel.Plan, run, steps: int = STEPS):
    """``{t: (copy of the state on each device, metrics, canonical params)}`` for ``t`` in
    CHECKED, taken before the next step donates the state."""
    params, batches, keys, _ = run
    step = plan.make_step(impl)
    state = _placed(plan, impl.from_canonical(fresh(params), CONFIG))
    seen = {}
    for t, (batch, key) in enumerate(zip(batches[:steps], keys[:steps], strict=True)):
        state, metrics = step(state, fresh(batch), key)
        if t in CHECKED:
            copies = _device_copies(plan, state)
            canonical = jax.device_get(impl.to_canonical(jax.device_put(copies[0])))
            seen[t] = (copies, jax.device_get(metrics), canonical)
    return seen


@pytest.mark.parametrize(
    "devices",
    [pytest.param(n, marks=pytest.mark.one_device) if n == 1 else n for n in DEVICE_COUNTS],
)
@pytest.mark.parametrize("mechanism", ["pmap", "sharded", "shard_map"])
def test_parallel_step_equals_the_serial_step(impl, run, mechanism, devices):
    _applicable(impl, mechanism)
    plan = parallel.Plan.create(mechanism, devices)
    seen = _train(impl, plan, run)
    for t in CHECKED:
        copies, metrics, canonical = seen[t]
        want_state, want_metrics = run[3][t]
        after = f"{mechanism} on {devices} device(s), after step {t + 1}"
        assert len(copies) == devices, (
            f"{after}: the state has {len(copies)} copies, one per device expected"
        )
        for d, copy in enumerate(copies[1:], start=1):  # replicated means bit-identical
            differs = tree_mismatch(
                copy, copies[0], f"{after}, device {d}'s state", rtol=0.0, against="device 0's"
            )
            assert differs is None, differs
        assert_trees_close(
            metrics,
            want_metrics,
            f"{after}, the metrics",
            rtol=RTOL,
            atol=ATOL,
            against="the serial step's",
        )
        # every leaf of the state: parameters, optimiser state, step
        assert_trees_close(
            copies[0],
            want_state,
            f"{after}, the state",
            rtol=RTOL,
            atol=ATOL,
            against="the serial step's",
        )
        assert_trees_close(
            canonical,
            impl.to_canonical(want_state),
            f"{after}, the canonical parameters",
            rtol=RTOL,
            atol=ATOL,
            against="the serial step's",
        )


@pytest.mark.parametrize("mechanism", parallel.PER_DEVICE)
def test_each_device_uses_its_own_rows_of_the_global_noise(impl, mechanism):
    """Device d sees rows d*B/n .. (d+1)*B/n of normal(key, (B, L)), its own rows of x and c."""
    require(impl, "data_parallel")
    devices = DEVICE_COUNTS[-1]
    seen: dict[int, tuple] = {}

    def record(index, x, c, eps):
        seen[int(index)] = (np.asarray(x), np.asarray(c), np.asarray(eps))

    def grads_fn(state, batch, eps):
        jax.debug.callback(record, jax.lax.axis_index(parallel.AXIS), batch.x, batch.c, eps)
        return impl.grads_fn(state, batch, eps)

    spy = _with_grads_fn(impl, grads_fn)
    plan = parallel.Plan.create(mechanism, devices)
    batch, key = suite_batch(81, B), jax.random.key(82)
    state = _placed(plan, spy.from_canonical(suite_params(83), CONFIG))
    jax.block_until_ready(plan.make_step(spy)(state, batch, key))
    jax.effects_barrier()
    eps = np.asarray(noise(key, B, MODEL.latent_dim))
    rows = B // devices
    assert sorted(seen) == list(range(devices)), (
        f"{mechanism}: the gradient ran on the devices {sorted(seen)}, expected 0 to {devices - 1}"
    )
    for d, (x, c, e) in seen.items():
        block = slice(d * rows, (d + 1) * rows)
        for what, got, want in (
            ("noise", e, eps[block]),
            ("x", x, np.asarray(batch.x)[block]),
            ("c", c, np.asarray(batch.c)[block]),
        ):
            differs = tree_mismatch(
                got,
                want,
                f"{mechanism}: device {d}'s {what}",
                rtol=0.0,
                against=f"rows {block.start} to {block.stop - 1} of the global batch's",
            )
            assert differs is None, differs


@pytest.mark.parametrize("mechanism", parallel.PER_DEVICE)
def test_the_check_catches_devices_that_share_their_noise(impl, run, mechanism):
    """Every device drawing the same rows (a per-device ``normal(key, (B/n, L))``) is a plausible
    bug; the tolerance of the equality check above must be tight enough to see it."""
    require(impl, "data_parallel")
    devices = DEVICE_COUNTS[-1]
    if devices < 2:
        pytest.skip("not applicable: one device cannot share its noise (see tox -e multidevice)")

    def same_noise_everywhere(key, b, latent):
        return jnp.tile(noise(key, b // devices, latent), (devices, 1))

    plan = dataclasses.replace(
        parallel.Plan.create(mechanism, devices), noise=same_noise_everywhere
    )
    _, metrics, _ = _train(impl, plan, run, steps=1)[0]
    differs = tree_mismatch(metrics, run[3][0][1], "metrics", rtol=RTOL, atol=ATOL)
    assert differs is not None, (
        f"{mechanism}: devices sharing their noise give the serial step's metrics within "
        f"rtol {RTOL:g}: the check above cannot see that mistake"
    )


def _with_grads_fn(impl, grads_fn):
    if dataclasses.is_dataclass(impl):
        return dataclasses.replace(impl, grads_fn=grads_fn)
    pytest.skip(f"not applicable: {impl.name} is not an Adapter, so its grads_fn cannot be wrapped")
