"""Where pure JAX's step spends its time at a large batch, and what closes the gap to the roof.

    python benchmarks/roof_gap.py [--batch-size 1024] [--rounds 5] [--steps 12] [--passes 2]
                                  [--sets default,fast_math,...] [--out FILE]

Each XLA flag set runs in its own process (XLA reads ``XLA_FLAGS`` once); the sets alternate over
``--passes`` passes so that drift in the machine's load hits them alike, and the figures are the
medians over passes of each process's medians over interleaved rounds. In every process:

- ``roof``: a jitted f32 ``N x N @ N x N`` matmul (``N = --roof-size``);
- ``step``: pure JAX's fast path, ``jax.jit(impl.train_step, donate_argnums=0)``;
- ``epoch``: the same ``--steps`` steps as one ``lax.scan`` (one call);
- ``grads``: the forward and backward pass alone (``compute_grads``), no update;
- ``update``: the update alone (global-norm clipping and AdamW, ``state.apply_gradients``);
- ``matmuls``: the step's 20 matmuls alone (forward, input gradients, weight gradients), same
  shapes and contracting dimensions;
- ``flat_adam`` (experiment): the step with the parameters and the optimiser state as one flat
  vector (``ravel_pytree``), so clipping and AdamW run as a few fusions over one array instead of
  some per leaf; the same arithmetic as SPEC section 5 up to the order of the norm's sum;
- ``transposed_dw`` (experiment): the step with each weight gradient computed from an explicitly
  transposed activation (``optimization_barrier(h.T) @ g``), so XLA sees a canonical
  ``[M, K] x [K, N]`` matmul instead of one contracting the batch axis of both operands;
- ``optax_bce`` (experiment): the step with the Bernoulli term as
  ``optax.sigmoid_binary_cross_entropy``, two log-sigmoids per pixel, where the shared loss
  (``shared/spec/losses.py``) writes the same function as ``softplus(l) - l*x``, one softplus
  per pixel (the shared loss's form before this benchmark found what it cost);
- ``split_condition`` (experiment): the label enters the first layer of the encoder and of the
  decoder as a row of its kernel, ``h @ W[:n] + W[n:][c]``, instead of a one-hot column
  concatenated to the input (the same function; no ``[B, n + classes]`` copy);
- ``split_condition_epoch``: the same, its steps as one ``lax.scan``.

The other flag sets measure the step, its parts and ``split_condition`` alone and as one
``lax.scan``; ``combined`` and ``combined_scheduler`` put together the flags that helped on their
own. The default set also profiles the step and the experiments
(``jax.profiler``) and sums the time of every XLA:CPU thunk by kind: YNNPACK matmul fusions,
plain XLA dots, elementwise (loop) fusions, the rest. The flag sets and the profile are XLA:CPU's:
on an accelerator run ``--sets default``, which measures the step, its parts and the experiments
against the roof on that device, unprofiled (the file names the backend and the device).
Nothing here changes an implementation or the shared optimiser; the experiments are local copies.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

SETS = {
    "default": ("", "XLA's defaults"),
    "vector_width_512": ("--xla_cpu_prefer_vector_width=512", "512-bit vectors in generated loops"),
    "fast_math": (
        "--xla_cpu_enable_fast_math=true",
        "fast math in generated code (changes the numerics: not a fix)",
    ),
    "ynn_eltwise_reduce": (
        "--xla_cpu_experimental_ynn_fusion_type=+eltwise,+reduce",
        "elementwise and reduce fusions handed to YNNPACK too",
    ),
    "ynn_dot_fusion": (
        "--xla_cpu_experimental_ynn_fusion_type=+dot",
        "YNNPACK dot fusions (a dot with its elementwise neighbours)",
    ),
    "no_ynn_dots": (
        "--xla_cpu_experimental_ynn_fusion_type=-individual_dot",
        "no YNNPACK matmuls (XLA's own dot emitter / Eigen)",
    ),
    "xnn_greedy": (
        "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
        "greedy XNNPACK subgraph fusion",
    ),
    "no_concurrency_scheduler": (
        "--xla_cpu_enable_concurrency_optimized_scheduler=false",
        "XLA's memory-minimising scheduler instead of the concurrency-optimised one",
    ),
    "single_thread_eigen": (
        "--xla_cpu_multi_thread_eigen=false",
        "single-threaded Eigen kernels",
    ),
    "onednn": ("--xla_cpu_use_onednn=true", "oneDNN for matmul fusions"),
    "combined": (
        "--xla_cpu_experimental_ynn_fusion_type=-individual_dot --xla_cpu_prefer_vector_width=512",
        "no YNNPACK matmuls and 512-bit vectors",
    ),
    "combined_scheduler": (
        "--xla_cpu_experimental_ynn_fusion_type=-individual_dot --xla_cpu_prefer_vector_width=512 "
        "--xla_cpu_enable_concurrency_optimized_scheduler=false",
        "the same and the memory-minimising scheduler",
    ),
}
EXPERIMENTS = {
    "transposed_dw": {"transposed_dw": True},
    "optax_bce": {"optax_bce": True},
    "split_condition": {"split": True},
}
ITEMS = (
    "roof",
    "step",
    "epoch",
    "grads",
    "update",
    "matmuls",
    "flat_adam",
    "transposed_dw",
    "optax_bce",
    "split_condition",
    "split_condition_epoch",
)
# The flag sets other than the default measure the step and its parts; the experiments run once.
FLAG_ITEMS = (
    *("roof", "step", "epoch", "grads", "update", "matmuls"),
    *("split_condition", "split_condition_epoch"),
)


# --- one process ----------------------------------------------------------------------------------


def child(batch_size: int, rounds: int, steps: int, roof_size: int, items, profile: bool) -> dict:
    import jax

    from cvae_rosetta.bench import harness as bench
    from cvae_rosetta.spec import protocol
    from cvae_rosetta.spec.config import Config
    from cvae_rosetta.spec.model import noise
    from cvae_rosetta.spec.validation import Batch

    profile = profile and jax.default_backend() == "cpu"  # the profile reads XLA:CPU thunks
    impl = protocol.load("pure_jax")
    config = Config()
    model = config.model
    params = impl.to_canonical(impl.init(jax.random.key(0), config))
    xs, cs, keys = bench._data(bench.Settings(), batch_size, steps)
    batches = [Batch(xs[i], cs[i]) for i in range(steps)]
    key_list = [keys[i] for i in range(steps)]
    eps = noise(key_list[0], batch_size, model.latent_dim)
    programs, timed, out = {}, {}, {"items": {}, "hlo": {}, "compile_s": {}}
    out["backend"], out["device_kind"] = jax.default_backend(), jax.devices()[0].device_kind

    def loop(step, state, args_of):
        def run(state):
            jax.block_until_ready(state)
            start = time.perf_counter()
            for i in range(steps):
                state, metrics = step(state, *args_of(i))
            jax.block_until_ready((state, metrics))
            return (time.perf_counter() - start) / steps, state

        return run, state

    def stateless(fn, *args, calls=steps):
        def run(state):
            start = time.perf_counter()
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
            return (time.perf_counter() - start) / calls, state

        return run, None

    def compile_(name, jitted, *args):
        compiled, times = bench.aot(jitted, *args)
        out["compile_s"][name] = sum(times.values())
        out["hlo"][name] = bench.hlo_stats(compiled.as_text())
        cost = bench._cost(compiled)
        out.setdefault("flops", {})[name] = cost["flops"]
        programs[name] = compiled
        return compiled

    one_call = lambda epoch: bench.epoch_timer(epoch, xs, cs, keys, steps)
    batch_args = lambda i: (batches[i], key_list[i])
    if "roof" in items:
        a = jax.random.normal(jax.random.key(5), (roof_size, roof_size))
        mm = compile_("roof", jax.jit(lambda a, b: a @ b), a, a)
        timed["roof"] = stateless(mm, a, a, calls=max(3, steps // 2))
    if "step" in items:
        state = impl.from_canonical(params, config)
        step = compile_("step", jax.jit(impl.train_step, donate_argnums=0), state, *batch_args(0))
        timed["step"] = loop(step, state, batch_args)
    if "epoch" in items:
        state = impl.from_canonical(params, config)
        epoch = compile_("epoch", bench.epoch_program(impl, 1), state, xs, cs, keys)
        timed["epoch"] = (one_call(epoch), state)
    if "grads" in items:
        state = impl.from_canonical(params, config)
        grads = compile_("grads", jax.jit(impl.grads_fn), state, batches[0], eps)
        timed["grads"] = stateless(grads, state, batches[0], eps)
    if "update" in items:
        state = impl.from_canonical(params, config)
        g, _ = jax.jit(impl.grads_fn)(state, batches[0], eps)
        update = compile_(
            "update",
            jax.jit(lambda s, g: (s.apply_gradients(g), s.step), donate_argnums=0),
            state,
            g,
        )
        timed["update"] = loop(update, state, lambda i: (g,))
    if "matmuls" in items:
        args = _matmul_operands(jax, model, batch_size)
        fn = compile_("matmuls", jax.jit(_matmuls), args)
        timed["matmuls"] = stateless(fn, args)
    if "flat_adam" in items:
        flat_step, carry = flat_adam(jax, config, params)
        step = compile_("flat_adam", jax.jit(flat_step, donate_argnums=0), carry, *batch_args(0))
        timed["flat_adam"] = loop(step, carry, batch_args)
    for name, options in EXPERIMENTS.items():
        if name not in items:
            continue
        loss = _local_loss(jax, config, **options)

        def local_step(state, batch, key, loss=loss):
            e = noise(key, batch.x.shape[0], model.latent_dim)
            (_, metrics), g = jax.value_and_grad(loss, has_aux=True)(state.params, batch, e)
            return state.apply_gradients(g), metrics

        state = impl.from_canonical(params, config)
        step = compile_(name, jax.jit(local_step, donate_argnums=0), state, *batch_args(0))
        timed[name] = loop(step, state, batch_args)
        if f"{name}_epoch" in items:  # the same steps as one lax.scan
            program = bench.epoch_program(types.SimpleNamespace(train_step=local_step), 1)
            state = impl.from_canonical(params, config)
            epoch_of = compile_(f"{name}_epoch", program, state, xs, cs, keys)
            timed[f"{name}_epoch"] = (one_call(epoch_of), state)

    names = list(timed)
    seconds = {name: [] for name in names}
    states = {name: timed[name][1] for name in names}
    for _ in range(1):  # warm-up
        for name in names:
            _, states[name] = timed[name][0](states[name])
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            t, states[name] = timed[name][0](states[name])
            seconds[name].append(t)
    for name in names:
        out["items"][name] = {
            "median_ms": statistics.median(seconds[name]) * 1e3,
            "min_ms": min(seconds[name]) * 1e3,
            "max_ms": max(seconds[name]) * 1e3,
        }
    if "roof" in out["items"]:
        out["roof_gflops_per_s"] = 2 * roof_size**3 / out["items"]["roof"]["median_ms"] / 1e6
    if profile:  # the step, and each experiment that changes the step's program
        out["profiles"] = {
            name: _profile(jax, programs[name], states[name], batches, key_list)
            for name in ("step", "flat_adam", *EXPERIMENTS)
            if name in programs
        }
    return out


def flat_adam(jax, config, params):
    """Pure JAX's step over ``(flat parameters, optimiser state of the flat vector)``:
    ``ravel_pytree`` once, the shared optimiser (SPEC section 5) on one array, the model unravelled
    inside the trace. Returns ``(step(carry, batch, key), carry)``; the carry has 5 leaves where
    pure JAX's state has 56."""
    import jax.numpy as jnp
    import optax
    from jax.flatten_util import ravel_pytree

    from cvae_rosetta.spec import protocol
    from cvae_rosetta.spec.model import noise
    from cvae_rosetta.spec.optim import make_optimizer

    reference = protocol.load("pure_jax")
    # pure JAX's loss for given noise is its adapter's ``loss_fn(state, batch, eps)``, which reads
    # the state's parameters and config; the rest of this state never enters the trace
    template = reference.from_canonical(params, config)
    tx = make_optimizer(config.optim)
    flat, unravel = ravel_pytree(params)

    def loss_of(flat, batch, eps):
        return reference.loss_fn(template.replace(params=unravel(flat)), batch, eps)

    def step(carry, batch, key):
        flat, opt_state = carry
        e = noise(key, batch.x.shape[0], config.model.latent_dim)
        (_, metrics), g = jax.value_and_grad(loss_of, has_aux=True)(flat, batch, e)
        updates, opt_state = tx.update(g, opt_state, flat)
        return (optax.apply_updates(flat, updates), opt_state), metrics

    return step, (jnp.array(flat), tx.init(flat))


def _local_loss(
    jax, config, *, transposed_dw: bool = False, optax_bce: bool = False, split: bool = False
):
    """Pure JAX's loss, written here with changes: weight gradients from explicitly transposed
    activations; the Bernoulli term as ``optax.sigmoid_binary_cross_entropy`` (two log-sigmoids
    per pixel, where the shared loss takes one softplus); the label as a row of the
    kernel (``h @ W[:n] + W[n:][c]``) instead of a one-hot column concatenated to the input."""
    import jax.numpy as jnp
    import optax

    from cvae_rosetta.spec.losses import cvae_loss, kl_terms
    from cvae_rosetta.spec.model import condition, reparameterize, split_moments

    model = config.model

    @jax.custom_vjp
    def dense_t(h, kernel, bias):
        return h @ kernel + bias

    def dense_fwd(h, kernel, bias):
        return h @ kernel + bias, (h, kernel)

    def dense_bwd(res, g):
        h, kernel = res
        h_t = jax.lax.optimization_barrier(h.T)  # materialised: [fan_in, B] row-major
        return g @ kernel.T, h_t @ g, g.sum(0)

    dense_t.defvjp(dense_fwd, dense_bwd)
    dense = dense_t if transposed_dw else (lambda h, kernel, bias: h @ kernel + bias)

    def mlp(layers, h):
        for layer in layers:
            h = jax.nn.relu(dense(h, layer["kernel"], layer["bias"]))
        return h

    def first(layers, h, c):
        """The first layer of a stack over ``[h, one_hot(c)]``, then the others."""
        if not split:
            return mlp(layers, condition(h, c, model.num_classes))
        kernel, bias = layers[0]["kernel"], layers[0]["bias"]
        n = h.shape[-1]
        h = jax.nn.relu(dense(h, kernel[:n], bias) + jnp.take(kernel[n:], c, axis=0))
        return mlp(layers[1:], h)

    def loss(p, batch, e):
        s = dense(first(p["encoder"], batch.x, batch.c), p["latent"]["kernel"], p["latent"]["bias"])
        mean, logvar = split_moments(s, model.latent_dim)
        z = reparameterize(mean, logvar, e)
        *hidden, output = p["decoder"]
        h = first(hidden, z, batch.c)
        logits = dense(h, output["kernel"], output["bias"])
        if not optax_bce:
            return cvae_loss(logits, batch.x, mean, logvar, config.loss)
        bce = optax.sigmoid_binary_cross_entropy(logits, batch.x)  # two log-sigmoids per pixel
        recon = jnp.mean(jnp.sum(bce, axis=-1))
        kl = jnp.mean(jnp.sum(kl_terms(mean, logvar), axis=-1))
        total = recon + config.loss.beta * kl
        return total, {"loss": total, "recon": recon, "kl": kl}

    return loss


def _layers(model):
    from cvae_rosetta.spec.canonical import layer_sizes

    sizes = layer_sizes(model)
    return [*sizes["encoder"], *sizes["latent"], *sizes["decoder"]]


def _matmul_operands(jax, model, b):
    """Per layer: the activation ``h [B, in]``, the kernel ``[in, out]`` and the output gradient
    ``g [B, out]``; the first layer's input needs no gradient."""
    key = jax.random.key(7)
    operands = []
    for fan_in, fan_out in _layers(model):
        k1, k2, k3, key = jax.random.split(key, 4)
        operands.append(
            (
                jax.random.normal(k1, (b, fan_in)),
                jax.random.normal(k2, (fan_in, fan_out)),
                jax.random.normal(k3, (b, fan_out)),
            )
        )
    return operands


def _matmuls(operands):
    outs = []
    for i, (h, kernel, g) in enumerate(operands):
        outs.append(h @ kernel)  # forward
        outs.append(h.T @ g)  # weight gradient: contracts the batch axis of both
        if i > 0:
            outs.append(g @ kernel.T)  # input gradient (the first layer's input needs none)
    return outs


def _profile(jax, compiled, state, batches, keys, calls: int = 10) -> dict:
    """Per-thunk time of the step from a ``jax.profiler`` trace, summed by kind (ms per step)."""
    from jax._src.lib import _profile_data

    kinds = _instruction_kinds(compiled.as_text())
    with tempfile.TemporaryDirectory() as directory:
        jax.profiler.start_trace(directory)
        start = time.perf_counter()
        for i in range(calls):
            state, metrics = compiled(state, batches[i % len(batches)], keys[i % len(keys)])
        jax.block_until_ready((state, metrics))
        wall = (time.perf_counter() - start) / calls
        jax.profiler.stop_trace()
        path = next(Path(directory).rglob("*.xplane.pb"))
        data = _profile_data.ProfileData.from_file(str(path))
    by_kind = collections.Counter()
    by_name = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in kinds:
                    by_kind[kinds[event.name]["kind"]] += event.duration_ns
                    by_name[event.name] += event.duration_ns
    top = []
    for name, ns in by_name.most_common(12):
        info = kinds[name]
        ms = ns / 1e6 / calls
        top.append(
            {
                "name": name,
                "kind": info["kind"],
                "shape": info["shape"],
                "ms": ms,
                "gflops_per_s": info["flops"] / ms / 1e6 if info.get("flops") else None,
            }
        )
    return {
        "wall_ms": wall * 1e3,
        "thunk_ms": {k: v / 1e6 / calls for k, v in by_kind.most_common()},
        "top": top,
        "note": "thunks run on the calling thread and on XLA's thread pool, so their sum can "
        "exceed the wall time; the profiler itself slows the step",
    }


INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]\S* (\w[\w\-]*)\((.*)$")


def _instruction_kinds(text: str) -> dict:
    """``instruction name -> {kind, shape, flops}`` for the entry computation's instructions."""
    shapes, computations, current = {}, collections.defaultdict(list), None
    for line in text.splitlines():
        if line.startswith(("ENTRY ", "%")) and line.rstrip().endswith("{"):
            current = "ENTRY" if line.startswith("ENTRY") else line.split()[0].lstrip("%")
            continue
        match = INSTRUCTION.match(line)
        if match and current:
            name, _, dims, op, rest = match.groups()
            shapes[name] = [int(d) for d in dims.split(",") if d]
            computations[current].append((name, dims, op, rest, line))

    def dot_flops(rest: str, line: str, out_dims: str) -> float:
        operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
        lhs = shapes.get(operands[0], [])
        k = 1
        for d in (int(x) for x in contracting.group(1).split(",") if x) if contracting else ():
            k *= lhs[d] if d < len(lhs) else 1
        n = 1
        for d in (int(x) for x in out_dims.split(",") if x):
            n *= d
        return 2.0 * n * k

    kinds = {}
    for name, dims, op, rest, line in computations["ENTRY"]:
        info = {"shape": dims, "flops": None}
        if op == "dot":
            info.update(kind="dot (plain XLA)", flops=dot_flops(rest, line, dims))
        elif op == "fusion":
            called = re.search(r"calls=%([\w.\-]+)", line)
            body = computations.get(called.group(1), []) if called else []
            dots = [b for b in body if b[2] == "dot"]
            if "kind=kCustom" in line:
                info["kind"] = "matmul (YNNPACK fusion)" if dots else "reduce (YNNPACK fusion)"
            else:
                info["kind"] = "loop fusion" if not dots else "dot fusion (XLA)"
            if dots:
                info["flops"] = sum(dot_flops(b[3], b[4], b[1]) for b in dots)
        else:
            info["kind"] = op
        kinds[name] = info
    return kinds


# --- the driver -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--roof-size", type=int, default=1024)
    parser.add_argument("--sets", default=",".join(SETS), help="flag sets, comma-separated")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        items = ITEMS if args.child == "default" else FLAG_ITEMS
        result = child(
            args.batch_size,
            args.rounds,
            args.steps,
            args.roof_size,
            items,
            profile=args.child == "default",
        )
        print("RESULT " + json.dumps(result))
        return 0

    sets = [s for s in args.sets.split(",") if s]
    runs: dict[str, list[dict]] = {s: [] for s in sets}
    for p in range(args.passes):
        for name in sets:
            flags, _ = SETS[name]
            env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
            load = os.getloadavg()[0]
            command = [sys.executable, __file__, "--child", name]
            command += ["--batch-size", str(args.batch_size), "--rounds", str(args.rounds)]
            command += ["--steps", str(args.steps), "--roof-size", str(args.roof_size)]
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            result = json.loads(lines[-1][len("RESULT ") :])
            result["load_average"] = [load, os.getloadavg()[0]]
            runs[name].append(result)
            step = result["items"]["step"]["median_ms"]
            print(
                f"pass {p + 1} {name:26s} step {step:7.2f} ms  roof "
                f"{result['roof_gflops_per_s']:6.1f} GFLOP/s  load {load:.2f}",
                flush=True,
            )
    summary = {}
    for name, results in runs.items():
        if not results:
            continue
        items = {}
        for item in results[0]["items"]:
            items[item] = statistics.median(r["items"][item]["median_ms"] for r in results)
        flops = results[0]["flops"]
        roof = statistics.median(r["roof_gflops_per_s"] for r in results)
        summary[name] = {
            "flags": SETS[name][0],
            "what": SETS[name][1],
            "ms": items,
            "passes_ms": {i: [r["items"][i]["median_ms"] for r in results] for i in items},
            "roof_gflops_per_s": roof,
            "flops": flops,
            "gflops_per_s": {
                i: flops[i] / items[i] / 1e6 for i in items if flops.get(i) and i != "epoch"
            },
            "hlo": results[0]["hlo"],
            "compile_s": results[0]["compile_s"],
            "load_average": [r["load_average"] for r in results],
            "profiles": results[0].get("profiles"),
        }
        if "epoch" in items and flops.get("step"):
            summary[name]["gflops_per_s"]["epoch"] = flops["step"] / items["epoch"] / 1e6
    import jax

    from cvae_rosetta.bench.harness import cpu_model

    first = next((results[0] for results in runs.values() if results), {})
    data = {
        "jax": jax.__version__,
        "backend": first.get("backend"),  # as the measuring processes saw it
        "device_kind": first.get("device_kind"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "steps": args.steps,
        "passes": args.passes,
        "roof_size": args.roof_size,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "sets": summary,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
