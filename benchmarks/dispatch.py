"""What one call of a fast path costs beyond its computation, at small batch sizes.

    python benchmarks/dispatch.py [--batch-sizes 1,8] [--rounds 7] [--steps 200] [--impls a,b]
                                  [--configs default,...] [--out FILE]

For every installed implementation's fast path (``jax.jit(impl.train_step, donate_argnums=0)``),
in one process with rounds interleaved: the step in a Python loop; the same steps as one
``lax.scan`` (per step); a jitted identity over the same train state (donated), which costs what
handing this state to ``jax.jit`` and back costs and nothing else; and the Python loop with
``block_until_ready`` after every step (no overlap of dispatch and computation). Each
configuration runs in its own process: XLA's defaults, JAX's synchronous CPU dispatch
(``JAX_CPU_ENABLE_ASYNC_DISPATCH=false``), and XLA's memory-minimising scheduler instead of the
concurrency-optimised one (``--xla_cpu_enable_concurrency_optimized_scheduler=false``). Beside
the implementations, pure JAX's step over a flat parameter vector and its optimiser state
(``roof_gap.flat_adam``: 5 leaves instead of 56) shows what the number of leaves costs. The two
configurations beside the defaults are XLA:CPU settings; on an accelerator run ``--configs default``
(the file names the backend and the device).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    "default": ({}, "JAX's and XLA's defaults"),
    "sync_dispatch": (
        {"JAX_CPU_ENABLE_ASYNC_DISPATCH": "false"},
        "computations run inline on the calling thread",
    ),
    "no_concurrency_scheduler": (
        {"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=false"},
        "XLA's memory-minimising scheduler",
    ),
}


FLAT = "pure_jax, flat state"


class Flat:
    """Pure JAX's step with the parameters and the optimiser state as flat vectors
    (``roof_gap.flat_adam``), behind the two members the timers use."""

    def __init__(self, jax, config, params) -> None:
        import roof_gap

        self.jax = jax
        self.step, self.carry = roof_gap.flat_adam(jax, config, params)

    def train_step(self, state, batch, key):
        return self.step(state, batch, key)

    def from_canonical(self, params, config):
        return self.jax.tree.map(lambda a: a.copy(), self.carry)


def timers(jax, impl, params, config, data, steps: int) -> dict:
    """``what -> [run(state) -> (seconds per step, state), state]`` for one implementation."""
    from cvae_rosetta.bench import harness as bench
    from cvae_rosetta.spec.validation import Batch

    xs, cs, keys = data
    batches = [Batch(xs[i], cs[i]) for i in range(steps)]
    key_list = [keys[i] for i in range(steps)]
    step = jax.jit(impl.train_step, donate_argnums=0)

    def loop(state, block=False):
        jax.block_until_ready(state)
        start = time.perf_counter()
        for batch, key in zip(batches, key_list, strict=True):
            state, metrics = step(state, batch, key)
            if block:
                jax.block_until_ready((state, metrics))
        jax.block_until_ready((state, metrics))
        return (time.perf_counter() - start) / steps, state

    scan = bench.epoch_timer(bench.epoch_program(impl, 1), xs, cs, keys, steps)

    identity = jax.jit(lambda s: s, donate_argnums=0)

    def noop(state):
        jax.block_until_ready(state)
        start = time.perf_counter()
        for _ in range(steps):
            state = identity(state)
        jax.block_until_ready(state)
        return (time.perf_counter() - start) / steps, state

    fresh = lambda: impl.from_canonical(params, config)
    return {
        "loop": [loop, fresh()],
        "scan": [scan, fresh()],
        "identity": [noop, fresh()],
        "blocked loop": [lambda s: loop(s, block=True), fresh()],
    }


def child(batch_sizes: list[int], rounds: int, steps: int, impls: str | None = None) -> dict:
    import jax

    from cvae_rosetta.bench import harness as bench
    from cvae_rosetta.spec import protocol

    names = impls.split(",") if impls else [i.name for i in protocol.known() if i.installed]
    names = ["pure_jax", *(n for n in names if n != "pure_jax")]  # the flat state is pure JAX's
    impls = {n: protocol.load(n) for n in names}
    settings = bench.Settings()
    config = bench._config(settings)
    params = bench._canonical(settings, impls["pure_jax"])
    impls[FLAT] = Flat(jax, config, params)
    out = {}
    for b in batch_sizes:
        data = bench._data(settings, b, steps)
        timed = {}
        for name, impl in impls.items():
            for what, timer in timers(jax, impl, params, config, data, steps).items():
                timed[(name, what)] = timer
        seconds = {key: [] for key in timed}
        order = list(timed)
        for r in range(rounds + 1):
            shift = r % len(order)
            for key in order[shift:] + order[:shift]:
                t, timed[key][1] = timed[key][0](timed[key][1])
                if r:  # round 0 is the warm-up
                    seconds[key].append(t)
        rows = {}
        for name, impl in impls.items():
            us = {
                what: statistics.median(seconds[(name, what)]) * 1e6
                for what in ("loop", "scan", "identity", "blocked loop")
            }
            us["overhead"] = us["loop"] - us["scan"]
            us["leaves"] = len(jax.tree.leaves(impl.from_canonical(params, config)))
            rows[name] = us
        out[str(b)] = rows
    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device_kind": device.device_kind, "batches": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--impls", default=None, help="comma-separated [every installed one]")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.child:
        print("RESULT " + json.dumps(child(sizes, args.rounds, args.steps, args.impls)))
        return 0
    results, device = {}, {}
    for name in args.configs.split(","):
        env_changes, what = CONFIGS[name]
        env = {**os.environ, **env_changes}
        load = os.getloadavg()[0]
        command = [sys.executable, __file__, "--child", "--batch-sizes", args.batch_sizes]
        command += ["--rounds", str(args.rounds), "--steps", str(args.steps)]
        command += ["--impls", args.impls] if args.impls else []
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        measured = json.loads(lines[-1][len("RESULT ") :])
        device = device or {k: measured[k] for k in ("backend", "device_kind")}
        results[name] = {
            "env": env_changes,
            "what": what,
            "load_average": [load, os.getloadavg()[0]],
            "batches": measured["batches"],
        }
        for b, rows in results[name]["batches"].items():
            for impl, us in rows.items():
                print(
                    f"{name:26s} batch {b:>4s} {impl:11s} loop {us['loop']:7.1f}  scan "
                    f"{us['scan']:7.1f}  overhead {us['overhead']:6.1f}  identity "
                    f"{us['identity']:6.1f}  blocked {us['blocked loop']:7.1f} µs",
                    flush=True,
                )
    from cvae_rosetta.bench.harness import cpu_model

    data = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        **device,  # backend and device_kind, as the measuring processes saw them
        "rounds": args.rounds,
        "steps": args.steps,
        "configs": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
