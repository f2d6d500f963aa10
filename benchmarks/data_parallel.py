"""Step time of every data-parallel mechanism and device count, for every installed implementation.

    python benchmarks/data_parallel.py [--devices 1,2,4,8] [--batch-size 256] [--rounds 5]
                                       [--steps 50] [--impls a,b] [--out FILE]

On a CPU the process splits the host into ``max(--devices)`` XLA devices before JAX starts, and
each plan uses the first ``n`` of them; the forced devices share the machine's cores, so the
figures measure what each mechanism costs over the serial step, not scaling. On accelerators the
plans take the first ``n`` real devices. Every case starts from the same canonical parameters
(MNIST-sized model, synthetic batch), runs ``Plan.make_step`` (the step ``cvae train`` runs), warms
up, then times ``--steps`` steps per round with rounds interleaved across cases; medians, spread
and the ratio to the serial step of the same implementation in the same run are written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--impls", default=None, help="comma-separated [every installed one]")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.devices.split(",")]

    from cvae_rosetta.spec import parallel

    parallel.arrange_cpu_devices(max(counts))  # before JAX touches a device
    import jax

    from cvae_rosetta.spec import protocol
    from cvae_rosetta.spec.config import Config
    from cvae_rosetta.spec.validation import Batch

    names = (
        args.impls.split(",") if args.impls else [i.name for i in protocol.known() if i.installed]
    )
    impls = {n: protocol.load(n) for n in names}
    reference = protocol.load("pure_jax")
    config = Config()
    params = reference.to_canonical(reference.init(jax.random.key(0), config))
    b = args.batch_size
    x = jax.random.uniform(jax.random.key(1), (b, config.model.input_dim))
    c = jax.random.randint(jax.random.key(2), (b,), 0, config.model.num_classes)
    batch, key = Batch(x, c), jax.random.key(3)

    load_at_start = os.getloadavg()[0]
    cases = {}
    for name in impls:
        cases[(name, "none", 1)] = parallel.Plan.create("none")
        for mechanism in ("pmap", "sharded", "shard_map"):
            for n in counts:
                cases[(name, mechanism, n)] = parallel.Plan.create(mechanism, n)
    steps, states = {}, {}
    for case, plan in cases.items():
        impl = impls[case[0]]
        steps[case] = plan.make_step(impl)
        state = plan.place_state(impl.from_canonical(params, config))
        for _ in range(10):  # compile and settle
            state, metrics = steps[case](state, batch, key)
        states[case] = jax.block_until_ready(state)
    times: dict = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            state = states[case]
            start = time.perf_counter()
            for _ in range(args.steps):
                state, metrics = steps[case](state, batch, key)
            jax.block_until_ready((state, metrics))
            times[case].append((time.perf_counter() - start) / args.steps)
            states[case] = state

    rows = []
    for (name, mechanism, n), ts in times.items():
        serial = statistics.median(times[(name, "none", 1)])
        median = statistics.median(ts)
        rows.append(
            {
                "impl": name,
                "mechanism": mechanism,
                "devices": n,
                "median_us": median * 1e6,
                "min_us": min(ts) * 1e6,
                "max_us": max(ts) * 1e6,
                "ratio_to_serial": median / serial,
            }
        )
        print(f"{name:11s} {mechanism:9s} {n}  {median * 1e6:9.1f} us  {median / serial:.2f}x")
    results = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "python": platform.python_version(),
        "load_average_1min": [load_at_start, os.getloadavg()[0]],  # at start and at end
        "batch_size": b,
        "rounds": args.rounds,
        "steps": args.steps,
        "note": "forced host devices share the machine's cores"
        if jax.default_backend() == "cpu"
        else "",
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
