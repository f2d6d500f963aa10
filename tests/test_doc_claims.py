"""What the side-by-side and tour pages say about speed holds against the committed results.

Every sentence of ``docs/topics/*.md`` and ``docs/tour/*.md`` that states a number, a ratio or an
ordering of speed is either generated from the results when the site is built (the jit page's
table, ``<!-- generated: jit-overhead -->`` in ``docs_build/jit_overhead.py``) or held here: a
phrase of the page, word for word (line breaks aside), with the conditions on ``benchmarks/results/
bench_cpu.json`` and ``bench_gpu.json`` that make it true, read through
:func:`cvae_rosetta.bench.results.load`. A new measurement that makes a sentence false fails its
claim, naming the page and the rows; a sentence that talks of speed and is neither held here nor
generated fails :func:`test_every_sentence_about_speed_is_held_by_a_claim`.

The conditions use each row's intervals (``vs_fast["step"]``: a path's time per call against its
own implementation's fast path, ``{"ratio", "low", "high", "within_noise", "rounds"}``): a
difference counts only where the interval leaves out 1.0. Numpy and the package only: no framework,
no JAX.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cvae_rosetta.bench import results

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
BACKENDS = {"CPU": "bench_cpu.json", "GPU": "bench_gpu.json"}
OBJECT_STYLES = ("flax_nnx", "equinox")  # the implementations with idiomatic paths on both backends
# Idiomatic paths that wrap nothing around ``jax.jit`` (Keras's fit step is Keras's own jit of the
# same step): not held to "slower per call", only to "never faster than the fast path".
UNWRAPPED = ("keras:model.fit step",)
PAGES = sorted([*DOCS.glob("topics/*.md"), *DOCS.glob("tour/*.md")])


# --- the results ---------------------------------------------------------------------------------


@functools.cache
def bench(backend: str) -> dict:
    path = RESULTS / BACKENDS[backend]
    if not path.is_file():
        pytest.fail(f"no {path.relative_to(ROOT)}: the pages' claims about the {backend} need it")
    return results.load(path)


def sizes(backend: str) -> list[str]:
    return sorted(bench(backend)["batches"], key=int)


def idiomatic(backend: str, size: str) -> list[dict]:
    """The rows of the paths that are not an implementation's fast path."""
    paths = bench(backend)["batches"][size]["paths"]
    return [r for r in paths if r["path"] not in (results.FAST, results.SAME_AS_FAST)]


def against_fast(backend: str, size: str, row: dict) -> dict:
    """``row``'s time per call against its implementation's fast path, with its interval."""
    entry = (row.get("vs_fast") or {}).get("step") or {}
    missing = {"ratio", "low", "high", "within_noise"} - set(entry)
    if missing or entry["low"] is None:
        pytest.fail(
            f"{BACKENDS[backend]}: batch {size}: {name(row)} has no interval in "
            f"vs_fast['step'] (missing {sorted(missing) or ['low/high']}): the harness's "
            "intervals are what these claims are checked with"
        )
    return entry


def name(row: dict) -> str:
    return f"{row['impl']}:{row['path']}"


def pure_jax_step_us(backend: str, size: str) -> float:
    batch = bench(backend)["batches"][size]
    step = results.fast_row(batch, results.REFERENCE)["step_us"]
    return float(step["median"] if isinstance(step, dict) else step)


def shown(entry: dict) -> str:
    return f"{entry['ratio']:.2f}x ({entry['low']:.2f}–{entry['high']:.2f})"


# --- the conditions: each returns what contradicts it (nothing when it holds) --------------------


def slower_at_the_smallest_batch() -> list[str]:
    """On both backends, at the smallest batch, every idiomatic path is slower than its fast path
    beyond noise; NNX and Equinox each have one."""
    wrong = []
    for backend in BACKENDS:
        size = sizes(backend)[0]
        rows = idiomatic(backend, size)
        for impl in OBJECT_STYLES:
            if not any(r["impl"] == impl for r in rows):
                wrong.append(f"{backend} batch {size}: no idiomatic path of {impl}")
        for row in (r for r in rows if name(r) not in UNWRAPPED):
            e = against_fast(backend, size, row)
            if not (e["ratio"] > 1 and e["within_noise"] is False):
                wrong.append(f"{backend} batch {size}: {name(row)} {shown(e)} of its fast path")
    return wrong


def never_faster_than_the_fast_path() -> list[str]:
    """On both backends, at every batch, no idiomatic path is faster than its fast path beyond
    noise."""
    return [
        f"{backend} batch {size}: {name(row)} {shown(e)} of its fast path"
        for backend in BACKENDS
        for size in sizes(backend)
        for row in idiomatic(backend, size)
        if (e := against_fast(backend, size, row))["ratio"] < 1 and e["within_noise"] is False
    ]


def cpu_step_grows_with_the_batch() -> list[str]:
    times = [(size, pure_jax_step_us("CPU", size)) for size in sizes("CPU")]
    if len(times) < 2:
        return [f"CPU: one batch size only ({times})"]
    return [
        f"CPU: pure JAX's step {a:.0f} µs at batch {s} and {b:.0f} µs at batch {t}"
        for (s, a), (t, b) in itertools.pairwise(times)
        if not b > a
    ]


def cpu_closest_at_the_largest_batch() -> list[str]:
    """On the CPU, each idiomatic path's ratio to its fast path is smallest at the largest batch,
    or within noise of 1.0 there (no difference measured: none can be closer, and medians inside
    the noise are never ranked)."""
    wrong = []
    largest = sizes("CPU")[-1]
    ratios: dict[str, dict[str, float]] = {}
    level: set[str] = set()  # within noise of the fast path at the largest batch
    for size in sizes("CPU"):
        for row in idiomatic("CPU", size):
            entry = against_fast("CPU", size, row)
            ratios.setdefault(name(row), {})[size] = entry["ratio"]
            if size == largest and entry["within_noise"]:
                level.add(name(row))
    for path, by_size in ratios.items():
        if largest not in by_size:
            wrong.append(f"CPU: {path} not measured at batch {largest}")
        elif path not in level and min(by_size.values()) < by_size[largest]:
            low = min(by_size, key=by_size.get)
            wrong.append(
                f"CPU: {path} {by_size[largest]:.2f}x at batch {largest}, "
                f"{by_size[low]:.2f}x at batch {low}"
            )
    return wrong


def cpu_within_noise_at_the_two_largest_batches() -> list[str]:
    """On the CPU, the two largest batch sizes are 256 and 1024 (the page names them), and at
    both every idiomatic path's interval against its fast path holds 1.0."""
    two = sizes("CPU")[-2:]
    if two != ["256", "1024"]:
        return [f"CPU: the two largest batch sizes are {', '.join(two)}, not 256 and 1024"]
    return [
        f"CPU batch {size}: {name(row)} {shown(e)} of its fast path"
        for size in two
        for row in idiomatic("CPU", size)
        if not (e := against_fast("CPU", size, row))["within_noise"]
    ]


def gpu_step_shorter_than_the_cpus() -> list[str]:
    gpu, cpu = sizes("GPU")[-1], sizes("CPU")[-1]
    g, c = pure_jax_step_us("GPU", gpu), pure_jax_step_us("CPU", cpu)
    if g < c:
        return []
    return [
        f"pure JAX's step: {g:.0f} µs on the GPU at batch {gpu}, {c:.0f} µs on the CPU at {cpu}"
    ]


def gpu_at_least_twice_at_the_largest_batch() -> list[str]:
    """On the GPU at its largest batch, every idiomatic path takes at least twice its fast path's
    time, the whole interval included."""
    size = sizes("GPU")[-1]
    return [
        f"GPU batch {size}: {name(row)} {shown(e)} of its fast path"
        for row in idiomatic("GPU", size)
        if (e := against_fast("GPU", size, row))["low"] < 2
    ]


# --- the claims ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    page: str  # under docs/
    words: str  # as the page has them, line breaks aside
    holds: tuple[Callable[[], list[str]], ...]

    def __str__(self) -> str:
        return f"{self.page}: {self.words[:50]}"


CLAIMS = [
    Claim("topics/jit.md", "Objects cost more per call:", (slower_at_the_smallest_batch,)),
    Claim(
        "topics/jit.md",
        "At the smallest batch measured, on the CPU and on the GPU, each idiomatic path that wraps "
        "the call and was measured there (the GPU run measured NNX's and Equinox's, not Keras's) "
        "is slower than its own fast path by more than the noise of the measurement.",
        (slower_at_the_smallest_batch,),
    ),
    Claim(
        "topics/jit.md",
        "Keras's `model.fit` step is Keras's own `jax.jit` of the same step, called through fit's "
        "Python function",
        (never_faster_than_the_fast_path,),
    ),
    Claim(
        "topics/jit.md",
        "What a wrapper adds is paid on every call, whatever the batch, so how much it weighs "
        "depends on how long the step itself takes.",
        (cpu_closest_at_the_largest_batch, gpu_at_least_twice_at_the_largest_batch),
    ),
    Claim(
        "topics/jit.md",
        "On the CPU the step takes longer as the batch grows, and every idiomatic path comes "
        "within noise of its fast path at the two largest batches measured (256 and 1024).",
        (cpu_step_grows_with_the_batch, cpu_within_noise_at_the_two_largest_batches),
    ),
    Claim(
        "topics/jit.md",
        "On the GPU the step stays short (pure JAX's at the GPU's largest batch takes less time "
        "than at the CPU's largest), and at its largest batch each idiomatic path measured there "
        "(NNX's and Equinox's) still takes at least twice as long as its fast path.",
        (gpu_step_shorter_than_the_cpus, gpu_at_least_twice_at_the_largest_batch),
    ),
    Claim(
        "topics/state.md",
        "a jitted step that takes the object is slower per call, clearly so at small batches, than "
        "one that takes it split into arrays and structure",
        (slower_at_the_smallest_batch, never_faster_than_the_fast_path),
    ),
    Claim(
        "topics/index.md",
        "what a jitted call costs each framework, and NNX's and Equinox's faster paths",
        (slower_at_the_smallest_batch, never_faster_than_the_fast_path),
    ),
    Claim(
        "topics/debugging.md",
        "the Python overhead of a framework's jit wrapper shows as the gap between its idiomatic "
        "path and its fast path",
        (slower_at_the_smallest_batch, never_faster_than_the_fast_path),
    ),
]

# Words that talk of speed without stating a measured one, each with why.
NOT_CLAIMS = {
    "`compiled.cost_analysis()`": "the name of JAX's API",
    '"low-overhead training loops"': "the title of advice in Equinox's documentation",
    "this project does not measure it": "says that it is not measured",
}

SPEED = re.compile(
    r"\b(?:faster|slower|quicker|fades?|speed\w*|overhead|costs?|cheap\w*|expensive|"
    r"(?:twice|\w+ times) as (?:long|slow|fast|quick)|"
    r"longer|shorter|weighs?|\d+(?:\.\d+)?x|µs|ms|per cent)\b|\d%",
    re.IGNORECASE,
)


def flat(text: str) -> str:
    return " ".join(text.split())


def prose(markdown: str) -> str:
    """The page's text as a reader sees its words: no front matter, generated blocks, code fences
    or comments (the directives), tables' cells as sentences of their own; whitespace collapsed."""
    markdown = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.DOTALL)
    # a generated block's committed copy (docs_build/raw_blocks.py): made, not written
    markdown = re.sub(r"^<!-- generated: .*?^<!-- /generated -->", "", markdown, flags=re.M | re.S)
    markdown = re.sub(r"^([ \t]*)(`{3,}|~{3,}).*?^\1\2[ \t]*$", "", markdown, flags=re.M | re.S)
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL)
    markdown = re.sub(r"^\|.*$", lambda m: ". ".join(m[0].split("|")), markdown, flags=re.M)
    return flat(markdown)


def sentences(markdown: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?:;])\s+", prose(markdown)) if s.strip(" .")]


@pytest.mark.parametrize("claim", CLAIMS, ids=str)
def test_each_claim_is_on_its_page_and_holds(claim):
    text = flat((DOCS / claim.page).read_text(encoding="utf-8"))
    assert flat(claim.words) in text, f"docs/{claim.page} no longer says: {claim.words}"
    wrong = [w for holds in claim.holds for w in holds()]
    assert not wrong, f"docs/{claim.page}: '{claim.words}' is contradicted by\n" + "\n".join(wrong)


def test_every_sentence_about_speed_is_held_by_a_claim():
    held = [flat(c.words) for c in CLAIMS if c.page.startswith(("topics/", "tour/"))]
    held += list(NOT_CLAIMS)
    loose = []
    for path in PAGES:
        for sentence in sentences(path.read_text(encoding="utf-8")):
            if SPEED.search(sentence) and not any(h in sentence or sentence in h for h in held):
                loose.append(f"docs/{path.relative_to(DOCS)}: {sentence}")
    assert not loose, (
        "sentences about speed that are neither generated nor held by a claim here:\n"
        + "\n".join(loose)
    )


def test_the_jit_page_generates_its_figures():
    """Its ratios are made from the results when the site is built, not written down."""
    assert "<!-- generated: jit-overhead -->" in (DOCS / "topics" / "jit.md").read_text()


def test_the_speed_vocabulary_finds_what_it_should():
    found = [
        s
        for s in sentences("The step is 1.8x slower. Nothing here. It costs 5 µs.")
        if SPEED.search(s)
    ]
    assert found == ["The step is 1.8x slower.", "It costs 5 µs."]
