"""Steady-state train-step time of every installed implementation, interleaved in one process.

    python benchmarks/step_time.py [--batch-sizes 8,256] [--dtypes float32,bfloat16]
                                   [--rounds 7] [--steps 200] [--impls a,b] [--out FILE]

Every implementation starts from the same canonical parameters (MNIST-sized model, synthetic data)
and runs ``jax.jit(impl.train_step, donate_argnums=0)``; extra paths an implementation exposes
(``implementation.extras["paths"]``: name -> a callable ``make(state) -> (step, state)``) are
timed beside it. Rounds alternate between implementations so drift hits all alike; each round
times ``--steps`` steps after ``block_until_ready``, warm-up excluded. The figures are medians over
rounds, with the spread (min and max), and the ratio to pure JAX measured in the same run. The
file is written again after every batch size and dtype, so a run stopped early keeps what it
measured; it names the device (``device_kind``: ``cpu`` or the accelerator's name).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import jax

from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.config import Config, ModelConfig
from cvae_rosetta.spec.validation import Batch


def paths_of(name: str, impl, config: Config, params) -> dict:
    """``label -> (step, state)``: the protocol step, and any extra path the implementation has."""
    paths = {
        name: (jax.jit(impl.train_step, donate_argnums=0), impl.from_canonical(params, config))
    }
    extra = getattr(impl, "extras", {}).get("paths", {})
    for label, make in extra.items():
        step, state = make(impl.from_canonical(params, config))
        paths[f"{name}:{label}"] = (step, state)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="8,256")
    parser.add_argument("--dtypes", default="float32", help="compute dtypes, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--impls", default=None, help="comma-separated [every installed one]")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    names = (
        args.impls.split(",") if args.impls else [i.name for i in protocol.known() if i.installed]
    )
    impls = {n: protocol.load(n) for n in names}
    reference = protocol.load("pure_jax")
    params = reference.to_canonical(reference.init(jax.random.key(0), Config()))
    results = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "device_count": jax.device_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "steps": args.steps,
        "batches": {},
    }
    # every dtype of a batch size together: a run stopped early keeps whole comparisons
    cases = [(b, d) for b in map(int, args.batch_sizes.split(",")) for d in args.dtypes.split(",")]
    for b, dtype in cases:
        config = Config(model=ModelConfig(compute_dtype=dtype))
        x = jax.random.uniform(jax.random.key(1), (b, config.model.input_dim))
        c = jax.random.randint(jax.random.key(2), (b,), 0, config.model.num_classes)
        batch = Batch(x, c)
        key = jax.random.key(3)
        paths = {}
        for name, impl in impls.items():
            paths.update(paths_of(name, impl, config, params))
        states = {}
        for label, (step, state) in paths.items():  # warm-up: compile and settle
            for _ in range(20):
                state, metrics = step(state, batch, key)
            jax.block_until_ready(state)
            states[label] = state
        times: dict[str, list[float]] = {label: [] for label in paths}
        for _ in range(args.rounds):
            for label, (step, _) in paths.items():
                state = states[label]
                jax.block_until_ready(state)
                start = time.perf_counter()
                for _ in range(args.steps):
                    state, metrics = step(state, batch, key)
                jax.block_until_ready((state, metrics))
                times[label].append((time.perf_counter() - start) / args.steps)
                states[label] = state
        base = statistics.median(times["pure_jax"]) if "pure_jax" in times else None
        rows = {}
        for label, ts in times.items():
            median = statistics.median(ts)
            rows[label] = {
                "median_us": median * 1e6,
                "min_us": min(ts) * 1e6,
                "max_us": max(ts) * 1e6,
                "ratio_to_pure_jax": median / base if base else None,
            }
        results["batches"][str(b) if dtype == "float32" else f"{b} {dtype}"] = rows
        print(f"batch {b}, {dtype}:")
        for label, row in rows.items():
            ratio = f"{row['ratio_to_pure_jax']:.3f}x" if row["ratio_to_pure_jax"] else "-"
            print(
                f"  {label:28s} {row['median_us']:9.1f} us  "
                f"[{row['min_us']:.1f}, {row['max_us']:.1f}]  {ratio}"
            )
        if args.out:  # after every case: a run stopped early keeps what it measured
            with open(args.out, "w") as f:
                json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
