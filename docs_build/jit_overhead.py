"""What the jit wrappers cost (``<!-- generated: jit-overhead -->``): each idiomatic path's step
time against its own implementation's fast path, from the committed ``cvae bench`` results."""

from __future__ import annotations

from repository import IMPLEMENTATIONS, ROOT, DocsError, repo_path

from cvae_rosetta.app.markdown import markdown_table
from cvae_rosetta.bench.markdown import impl_label

RESULTS = ROOT / "benchmarks" / "results"
BENCH_FILES = ("bench_cpu.json", "bench_gpu.json")  # the committed `cvae bench` results


def jit_overhead() -> str:
    """Each idiomatic path's step time against its own implementation's fast path, with the
    interval of the paired rounds, at the smallest and the largest batch size of every committed
    ``cvae bench`` result (:data:`BENCH_FILES`), read through ``cvae_rosetta.bench.results.load``
    (which reads JSON and imports no JAX)."""
    try:
        from cvae_rosetta.bench import results
    except ImportError as error:
        raise DocsError(f"jit-overhead: the project is not installed here ({error})") from None
    columns: list[str] = []
    cells: dict[tuple[str, str], dict[int, str]] = {}
    sources = []
    coverage: dict[str, tuple[float, int]] = {}  # backend -> its intervals' confidence and rounds
    for name in BENCH_FILES:
        path = RESULTS / name
        if not path.is_file():
            continue
        try:
            result = results.load(path)
        except (ValueError, KeyError) as error:
            raise DocsError(f"{repo_path(path)}: {error}") from None
        backend = str((result.get("environment") or {}).get("backend") or "?").upper()
        sources.append(f"`{name}` ({results.provenance(result)})")
        sizes = sorted(result["batches"], key=int)
        for size in dict.fromkeys([sizes[0], sizes[-1]]):
            column = len(columns)
            columns.append(f"{backend}, batch {size}")
            for row in result["batches"][size]["paths"]:
                if row["path"] in (results.FAST, results.SAME_AS_FAST):
                    continue
                entry = (row.get("vs_fast") or {}).get("step")
                if not entry or entry.get("ratio") is None:
                    raise DocsError(
                        f"{repo_path(path)}: batch {size}: {row['impl']}:{row['path']} has no "
                        "vs_fast['step'] ratio"
                    )
                cells.setdefault((row["impl"], row["path"]), {})[column] = _ratio(entry)
                if entry.get("confidence") is not None:
                    coverage.setdefault(backend, (entry["confidence"], entry["rounds"]))
    if not columns:
        raise DocsError(f"no benchmark results in {repo_path(RESULTS)} ({', '.join(BENCH_FILES)})")
    order = list(IMPLEMENTATIONS)
    rows = sorted(cells, key=lambda k: order.index(k[0]) if k[0] in order else len(order))
    held = " and ".join(
        f"{confidence:.0%}{' confidence' if n == 0 else ''} with the {backend}'s {rounds} rounds"
        for n, (backend, (confidence, rounds)) in enumerate(coverage.items())
    )
    intro = (
        "Time per call of each idiomatic path's step, from a Python loop that calls it, as a "
        "multiple of its own implementation's fast path's, timed in the same rounds (the median, "
        "and the interval over the paired rounds that holds it"
        + (f": {held}; " if held else ": ")
        + "an interval that holds 1.00x is noise), at the smallest and the largest batch "
        f"measured; from {' and '.join(sources)}:"
    )
    body = []
    for impl, path in rows:
        first, _, rest = path.partition(" ")
        name = f"`{first}` {rest}".rstrip()
        cells_of = cells[impl, path]
        body.append(
            [f"{impl_label(impl)}: {name}", *(cells_of.get(c, "-") for c in range(len(columns)))]
        )
    table = markdown_table(["idiomatic path", *columns], body, "l" + "r" * len(columns))
    return f"{intro}\n\n{table}"


def _ratio(entry: dict) -> str:
    if entry.get("low") is None or entry.get("high") is None:
        return f"{entry['ratio']:.2f}x"
    return f"{entry['ratio']:.2f}x ({entry['low']:.2f}–{entry['high']:.2f})"
