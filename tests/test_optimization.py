"""What "most optimisations off" changes in the suite's programs on the CPU: the code that LLVM
generates, not the program that XLA optimises to.

The plugin compiles every check with ``jax_disable_most_optimizations`` on the CPU, the numerics
modules (``test_edges``, ``test_precision``) too, and says that their numerics are still the
training run's. That rests on this: for every implementation, the numerics probe of the suite's
model (forward pass, loss, gradient and one step in one program), in float32 and bfloat16 and for
both loss kinds, is the same optimised HLO module (every fusion, every rewrite of the algebraic
simplifier) with and without the setting. What differs is LLVM's optimisation of the generated
code, which rounds differently (contracted multiply-adds, vectorised loops) but computes the same
operations. If a JAX or XLA release changes that, this test fails and the plugin's choice for the
CPU (``compilation.SAME_PROGRAM_BACKENDS``) must change with it.
"""

from __future__ import annotations

import re

import jax
import pytest

from cvae_rosetta.conformance import common
from cvae_rosetta.conformance.common import MODEL, B, spec_noise, suite_batch, suite_params
from cvae_rosetta.conformance.compilation import (
    OPTIMIZATIONS,
    SAME_PROGRAM_BACKENDS,
    fully_optimized,
)
from cvae_rosetta.spec.config import Config, LossConfig
from cvae_rosetta.spec.protocol import known, load

# every built-in installed: all six in tox -e cross, all but Haiku in newest-cross
IMPLS = [info.name for info in known() if info.builtin and info.installed]
# the numerics modules' settings: both compute dtypes and both loss kinds
CASES = (("float32", "bernoulli"), ("bfloat16", "mse"))
_METADATA = re.compile(r",? ?metadata=\{[^}]*\}")


def optimized_hlo(lowered, *, most_off: bool) -> str:
    """The optimised HLO module XLA compiles ``lowered`` to, without source-line metadata."""
    before = jax.config.values[OPTIMIZATIONS]
    jax.config.update(OPTIMIZATIONS, most_off)
    try:
        return _METADATA.sub("", lowered.compile().as_text())
    finally:
        jax.config.update(OPTIMIZATIONS, before)


@pytest.mark.cross
@pytest.mark.parametrize("dtype, kind", CASES, ids=[f"{d}-{k}" for d, k in CASES])
@pytest.mark.parametrize("name", IMPLS)
def test_most_optimizations_off_leave_the_cpu_program_as_it_is(name, dtype, kind):
    assert jax.default_backend() == "cpu"
    impl = load(name)
    config = Config(model=MODEL.replace(compute_dtype=dtype), loss=LossConfig(kind=kind))
    args = (
        suite_params(42),
        suite_batch(7),
        spec_noise(jax.random.key(5), B, MODEL.latent_dim),
        jax.random.key(3),
    )
    with jax.default_matmul_precision("highest"):  # as the plugin sets it for the suite's checks
        lowered = common.probe(impl).lower(*args, config=config)
    full = optimized_hlo(lowered, most_off=False)
    light = optimized_hlo(lowered, most_off=True)
    assert full.count("fusion") > 10, full[:2000]  # an optimised module, fusions and all
    assert light == full, (
        f"{name} {dtype} {kind}: with {OPTIMIZATIONS} the CPU's optimised HLO differs from the "
        "fully optimised one; the numerics modules must then compile fully optimised on the CPU"
    )


def test_which_checks_compile_fully_optimized():
    assert SAME_PROGRAM_BACKENDS == ("cpu",)
    for backend in ("cpu", "gpu", "tpu"):
        assert fully_optimized(marked=False, everything=True, backend=backend)
        assert not fully_optimized(marked=False, everything=False, backend=backend)
    assert not fully_optimized(marked=True, everything=False, backend="cpu")
    assert fully_optimized(marked=True, everything=False, backend="gpu")
    assert fully_optimized(marked=True, everything=False, backend="tpu")
