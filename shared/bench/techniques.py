"""Pure JAX's step written other ways (:data:`TECHNIQUES`: without donation, with
``optax.flatten``, with optax's own clipping or AdamW in place of the shared halves, with each
kernel's gradient computed in the kernel's own layout) against its fast path, per call and as one
``lax.scan``, with each compiled step's bytes, fusions and transposes: what ``docs/fast_step.md``
reads.

Nothing here imports JAX at module level (``cvae bench`` arranges its host devices first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cvae_rosetta.bench.programs import (
    config_of,
    cost_analysis,
    epoch_program,
    hlo_stats,
    synthetic_data,
)
from cvae_rosetta.bench.results import FAST
from cvae_rosetta.bench.settings import Settings
from cvae_rosetta.bench.timing import ProgressBar, Timed, interleave, spread, timed_loop, timer

TECHNIQUES = {
    FAST: "jax.jit(train_step, donate_argnums=0): the fast path",
    "no donation": "jax.jit(train_step): every step allocates a new state",
    "optax.flatten": "the optimiser wrapped in optax.flatten: one vector for the parameters",
    "optax's clipping": "optax.clip_by_global_norm (g / n * c under a select) before the shared "
    "AdamW",
    "optax's AdamW": "optax.adamw (bias corrections dividing every element) after the shared "
    "clipping",
    "kernel layout": "each h @ kernel's gradient written h.T @ g (a jax.custom_vjp), in the "
    "kernel's [in, out] layout: JAX's own rule writes (g.T @ h).T",
}


# --8<-- [start:kernel_layout]
def kernel_layout_matmul() -> Callable:
    """``h @ kernel`` whose backward pass computes the kernel's gradient as ``h.T @ g``, in the
    kernel's own ``[in, out]`` layout, where JAX's rule computes ``g.T @ h`` and transposes it."""
    import jax

    @jax.custom_vjp
    def matmul(h, kernel):
        return h @ kernel

    def forward(h, kernel):
        return h @ kernel, (h, kernel)

    def backward(saved, g):
        h, kernel = saved
        return g @ kernel.T, h.T @ g

    matmul.defvjp(forward, backward)
    return matmul


# --8<-- [end:kernel_layout]


def kernel_layout_step(impl: Any) -> Callable:
    """``impl``'s step with every ``h @ kernel`` of its loss (a 2-D ``dot_general`` contracting
    ``h``'s last axis with the kernel's first) given a VJP that computes the kernel's gradient as
    ``h.T @ g``. JAX's transpose rule computes it as ``g.T @ h``, ``[out, in]``, and transposes it
    into the kernel's ``[in, out]``; at batch 1 XLA:CPU makes that product an elementwise outer
    product and keeps the transpose inside the optimiser's fusions, which then read the gradient
    across its rows. Equinox's ``[out, in]`` weights need no transpose. The loss is traced once and
    its jaxpr evaluated with those ``dot_general``s swapped (JAX's custom-interpreter pattern), so
    the model's code is the implementation's own."""
    import jax
    from jax import lax
    from jax.extend.core import Literal

    from cvae_rosetta.spec.model import noise

    matmul = kernel_layout_matmul()
    plain = (((1,), (0,)), ((), ()))

    def evaluate(closed, *args):
        names = (*closed.jaxpr.constvars, *closed.jaxpr.invars)
        env = dict(zip(names, (*closed.consts, *args), strict=True))
        read = lambda v: v.val if isinstance(v, Literal) else env[v]
        for eqn in closed.jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            if eqn.primitive is lax.dot_general_p and eqn.params["dimension_numbers"] == plain:
                outs = [matmul(*ins)]
            else:
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
                outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in closed.jaxpr.outvars]

    def step(state, batch, key):
        eps = noise(key, batch.x.shape[0], state.config.model.latent_dim)
        loss = lambda params: impl.loss_fn(state.replace(params=params), batch, eps)
        closed, shape = jax.make_jaxpr(loss, return_shape=True)(state.params)
        flat = lambda params: jax.tree.unflatten(
            jax.tree.structure(shape), evaluate(closed, *jax.tree.leaves(params))
        )
        grads, metrics = jax.grad(flat, has_aux=True)(state.params)
        return state.apply_gradients(grads), metrics

    return step


def _technique_states(state: Any) -> dict[str, tuple[Any, bool]]:
    """``technique -> (state, donated)``: pure JAX's state with the optimiser each one uses (the
    optimiser states of optax's own halves have the shared one's structure); the kernel layout's
    state is the fast path's (its step differs, :func:`kernel_layout_step`)."""
    import optax

    from cvae_rosetta.spec import optim

    o = state.config.optim
    ours = optim.adamw(optim.schedule(o), o.weight_decay)
    theirs = optax.adamw(
        o.learning_rate, optim.B1, optim.B2, optim.EPS, weight_decay=o.weight_decay
    )
    flat = optax.flatten(state.tx)
    return {
        FAST: (state, True),
        "no donation": (state, False),
        "optax.flatten": (state.replace(tx=flat, opt_state=flat.init(state.params)), True),
        "optax's clipping": (
            state.replace(tx=optax.chain(optax.clip_by_global_norm(o.clip_norm), ours)),
            True,
        ),
        "optax's AdamW": (
            state.replace(tx=optax.chain(optim.clip_by_global_norm(o.clip_norm), theirs)),
            True,
        ),
        "kernel layout": (state, True),
    }


def measure_techniques(settings: Settings, impl, params, b: int, bar: ProgressBar) -> dict:
    """Pure JAX's step written each way of :data:`TECHNIQUES` at batch ``b``, per call and as one
    ``lax.scan``, all interleaved; with each compiled step's bytes, FLOPs and HLO counts."""
    import jax

    k = settings.steps_at(b)
    xs, cs, keys, batches, key_list = synthetic_data(settings, b, k)
    base = impl.from_canonical(params, config_of(settings))
    rows, timed = {}, []
    copy = lambda state: jax.tree.map(lambda a: a.copy(), state)
    for name, (state, donated) in _technique_states(base).items():
        donate = (0,) if donated else ()
        train_step = kernel_layout_step(impl) if name == "kernel layout" else impl.train_step
        step = jax.jit(train_step, donate_argnums=donate)
        compiled = step.lower(copy(state), batches[0], key_list[0]).compile()
        epoch = epoch_program(impl, 1, donated, train_step)
        rows[name] = {
            "technique": name,
            "what": TECHNIQUES[name],
            **cost_analysis(compiled),
            "hlo": hlo_stats(compiled.as_text()),
        }
        loop, scan = copy(state), copy(state)
        jax.block_until_ready(compiled(copy(state), batches[0], key_list[0]))
        jax.block_until_ready(epoch(copy(state), xs, cs, keys))
        timed.append(Timed((name, "step_us"), timed_loop(compiled, batches, key_list), loop))
        call = timer(lambda s, e=epoch: e(s, xs, cs, keys))
        timed.append(Timed((name, "scan_us"), call, scan))
        bar.tick(f"compile {name}")
    interleave(timed, settings.rounds, bar.tick)
    for item in timed:
        rows[item.key[0]][item.key[1]] = spread(item.seconds, k)
    return {"batch_size": b, "steps_per_round": k, "rows": list(rows.values())}
