"""How the suite's programs compile, and what they hold: XLA's optimisation level per check, JAX's
persistent compilation cache for a session, and the compiled programs dropped from memory.

The suite's time is compilation. The plugin (:mod:`cvae_rosetta.conformance.plugin`) compiles most
checks with most of XLA's optimisation off (:func:`fully_optimized` says which not), points JAX's
persistent cache at pytest's cache folder for the session (:func:`cache_dir`), and drops JAX's
in-memory caches of compiled programs once the last check of a module has run or the process nears
its limit of memory mappings (:func:`near_the_mapping_limit`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# XLA's optimisation of the programs the suite compiles: most of it off by default (a check compiles
# each program once and runs it a few times, and compiling is most of a run's time), full under
# --full-optimization, and full for the modules marked FULLY_OPTIMIZED on every backend but the
# CPU. On the CPU, turning it off changes only LLVM's code generation, not the program XLA
# optimises to (tests/test_optimization.py compares the two), so numerics there are the training
# run's.
OPTIMIZATIONS = "jax_disable_most_optimizations"
FULLY_OPTIMIZED = "fully_optimized"
SAME_PROGRAM_BACKENDS = ("cpu",)  # where most optimisations off leaves the optimised HLO as it is


def fully_optimized(*, marked: bool, everything: bool, backend: str) -> bool:
    """Whether a check's programs compile with XLA's full optimisation: everything under
    --full-optimization; a check marked ``fully_optimized`` where turning optimisations off would
    change the program (every backend but those of ``SAME_PROGRAM_BACKENDS``); none otherwise."""
    return everything or (marked and backend not in SAME_PROGRAM_BACKENDS)


# The suite's time is compilation (a passing run spends most of it in XLA). A repeated run on the
# same machine, the usual loop while porting an implementation, reads every program it compiled
# before from JAX's persistent cache instead; only what changed compiles again. Every program is
# kept, the many tiny ones of eager (op-by-op) calls included: the plugin drops JAX's in-memory
# caches after each module (see its _last_of_their_module), and a first run then reads back from
# disk what an earlier module compiled instead of compiling it again (1,476 compilations of a
# passing run became 826, measured on 2026-12-03, before the optimiser checks ran jitted).
CACHE_SETTINGS = {
    "jax_compilation_cache_dir": None,  # set to the folder
    "jax_persistent_cache_min_compile_time_secs": 0.0,  # every program, however small
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


def cache_dir(config: pytest.Config) -> str | None:
    """The folder for JAX's persistent compilation cache in this session, or None: ``off``; or
    ``auto`` where JAX has one configured already (``JAX_COMPILATION_CACHE_DIR``) or pytest's
    cache is disabled (``-p no:cacheprovider``)."""
    choice = str(config.getoption("compilation_cache")).strip()
    if choice.lower() == "off":
        return None
    if choice.lower() != "auto":
        return str(Path(choice).expanduser().resolve())
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or getattr(config, "cache", None) is None:
        return None
    return str(config.cache.mkdir("cvae_rosetta_jax"))


# Every compiled program holds memory mappings, of which a Linux process may have
# ``vm.max_map_count`` (65,530 by default): XLA's compiler crashes (SIGSEGV) at the limit. One
# hypothesis-driven check under ``--thorough`` compiles enough programs for ~40,000, so the caches
# are dropped after any check that leaves more than half the limit, not only at a module's end.
MAPS, MAX_MAP_COUNT = Path("/proc/self/maps"), Path("/proc/sys/vm/max_map_count")


def mappings() -> int | None:
    """How many memory mappings this process holds (None: not Linux)."""
    try:
        with MAPS.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def mapping_limit() -> int:
    try:
        return int(MAX_MAP_COUNT.read_text())
    except (OSError, ValueError):
        return 65530


def near_the_mapping_limit() -> bool:
    held = mappings()
    return held is not None and held > mapping_limit() // 2


def release_compiled_programs() -> None:
    """Drop JAX's in-memory caches of compiled programs once the last check of a module of the suite
    has run: no later check needs its programs, and kept, they are most of a run's memory (2.2 GB
    at the end of a passing run against 1.5 GB dropped, measured on two cores)."""
    import jax

    jax.clear_caches()
