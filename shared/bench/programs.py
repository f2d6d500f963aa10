"""What ``cvae bench`` runs beside each implementation's step, and what XLA made of a compiled
program.

The operands every measurement runs on (the config and synthetic, device-resident batches); the
programs timed besides the fast path (an implementation's idiomatic paths, the epoch as one jitted
``lax.scan``, the empty step, the streaming update of the roofline); and a compiled program's
``cost_analysis``, ``memory_analysis`` and its optimized HLO's counts and fingerprint.

Nothing here imports JAX at module level (``cvae bench`` arranges its host devices first).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from cvae_rosetta.bench.results import SAME_AS_FAST
from cvae_rosetta.bench.settings import Settings


def config_of(settings: Settings):
    """The config every state of a measurement is made with: the settings' model, the rest the
    defaults."""
    from cvae_rosetta.spec.config import Config

    return Config(model=settings.model)


def synthetic_data(settings: Settings, batch_size: int, steps: int):
    """``steps`` synthetic batches on the device: ``xs [K, B, D]``, ``cs [K, B]``, keys ``[K]``,
    and the same as lists of ``K`` batches and ``K`` keys, for a Python loop."""
    import jax

    from cvae_rosetta.spec.validation import Batch

    model = settings.model
    kx, kc, kk = jax.random.split(jax.random.key(1), 3)
    xs = jax.random.uniform(kx, (steps, batch_size, model.input_dim))
    cs = jax.random.randint(kc, (steps, batch_size), 0, model.num_classes)
    xs, cs, keys = jax.block_until_ready((xs, cs, jax.random.split(kk, steps)))
    batches = [Batch(xs[i], cs[i]) for i in range(steps)]
    return xs, cs, keys, batches, [keys[i] for i in range(steps)]


def paths_of(impl: Any) -> dict[str, Callable | None]:
    """``path name -> make(state) -> (step, state)`` of an implementation's idiomatic paths (its
    ``extras["paths"]``), or ``{"idiomatic": None}`` when its idiomatic path is its fast path."""
    extra = getattr(impl, "extras", {}).get("paths") or {}
    return dict(extra) if extra else {SAME_AS_FAST: None}


def epoch_program(impl: Any, unroll: int, donate: bool = True, step: Any = None) -> Any:
    """``(state, xs [K, B, D], cs [K, B], keys [K]) -> (state, metrics [K])``: ``K`` train steps
    (``impl.train_step``, or ``step``) as one jitted ``lax.scan`` over device-resident batches, the
    state donated."""
    import jax

    from cvae_rosetta.spec.validation import Batch

    step = step or impl.train_step

    def epoch(state, xs, cs, keys):
        def body(state, inputs):
            x, c, key = inputs
            return step(state, Batch(x, c), key)

        return jax.lax.scan(body, state, (xs, cs, keys), unroll=unroll)

    return jax.jit(epoch, donate_argnums=0 if donate else ())


def empty_step(impl: Any, state: Any, batch: Any, key: Any) -> Any:
    """A jitted step that computes nothing: ``(state, batch, key) -> (state, zero metrics)`` with
    the state donated and the metrics shaped like ``impl.train_step``'s, so a call moves exactly
    what a step's call moves."""
    import jax
    import jax.numpy as jnp

    _, metrics = jax.eval_shape(impl.train_step, state, batch, key)

    def step(state, batch, key):
        return state, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metrics)

    return jax.jit(step, donate_argnums=0)


def streaming_update(params: Any) -> tuple[Any, tuple, float]:
    """The bandwidth half of the roofline: ``(g, m, v, p) -> (g, m', v', p')``, Adam's pass over
    float32 buffers of the parameters' total size (elementwise, all donated), compiled; its
    operands; and the bytes its ``cost_analysis`` counts, which the rate divides, as the steps'
    bytes are counted (ten passes over the parameters' size in the committed CPU result, where
    the code reads four buffers and writes three)."""
    import jax
    import jax.numpy as jnp

    size = sum(leaf.size for leaf in jax.tree.leaves(params))
    buffers = tuple(jnp.full((size,), 0.5 + i, jnp.float32) for i in range(4))

    def update(g, m, v, p):
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        return g, m, v, p - 1e-3 * m / (jnp.sqrt(v) + 1e-8)

    compiled = jax.jit(update, donate_argnums=(0, 1, 2, 3)).lower(*buffers).compile()
    return compiled, jax.block_until_ready(buffers), cost_analysis(compiled)["bytes_accessed"]


def cost_analysis(compiled: Any) -> dict[str, float | None]:
    """A compiled program's FLOPs and bytes accessed per call, from its ``cost_analysis``
    (``None`` where XLA counts none)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    return {"flops": cost.get("flops"), "bytes_accessed": cost.get("bytes accessed")}


def memory_analysis(compiled: Any) -> dict[str, int]:
    """A compiled program's buffer sizes in bytes (its ``memory_analysis``'s ``*_in_bytes``);
    empty where the backend gives none."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    return {
        name: int(getattr(stats, name))
        for name in dir(stats)
        if name.endswith("_in_bytes") and isinstance(getattr(stats, name), int)
    }


def program(text: str) -> str:
    """An optimized HLO module as XLA runs it, without what names it: no source tables, metadata,
    instruction or parameter names (renamed in order of appearance). Two steps with the same
    program run the same kernels on the same buffers, whatever framework traced them."""
    body = text[min((text.find(m) for m in ("\n%", "\nENTRY ") if m in text), default=0) :]
    body = re.sub(r",? metadata=\{[^}]*\}", "", body)
    names: dict[str, str] = {}
    body = re.sub(r"%([\w.\-]+)", lambda m: names.setdefault(m[1], f"%{len(names)}"), body)
    return re.sub(r"([(,] ?)[A-Za-z_][\w.]*: ", r"\1p: ", body)


def hlo_stats(text: str) -> dict[str, Any]:
    """Counts over the entry computation of an optimized HLO module: instructions, fusions, library
    fusions (``kind=kCustom``: XNNPACK/YNNPACK/oneDNN), plain dots, copies; the transposes of
    the whole module (fusion bodies included: a weight transposed every step shows there); and
    the fingerprint of its :func:`program`."""
    entry = text.split("\nENTRY ", 1)[-1].split("\n}\n", 1)[0]
    lines = [line for line in entry.splitlines()[1:] if " = " in line]
    return {
        "fingerprint": hashlib.sha256(program(text).encode()).hexdigest()[:16],
        "instructions": len(lines),
        "fusions": sum(" fusion(" in line for line in lines),
        "library_fusions": sum("kind=kCustom" in line for line in lines),
        "plain_dots": sum(" dot(" in line for line in lines),
        "copies": sum(" copy(" in line for line in lines),
        "transposes": text.count(" transpose("),
    }
