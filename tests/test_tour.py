"""The concept tour's examples (``examples/tour/``) run, and do in every framework what they say.

Each example file has one ``run_<implementation>`` per framework, listed in its ``RUNS``; every one
of them runs here and its observations are checked against what the tour's page claims. The files
need every framework; where one is missing (the per-framework tox environments) the test is skipped
with that reason. ``tox -e docs`` runs it with all of them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from cvae_rosetta.spec import registry

# Keras picks its backend once, at its first import (below, or in the tour's files): JAX.
os.environ.setdefault("KERAS_BACKEND", "jax")
BUILTIN = [info for info in registry.known() if info.builtin]
for framework in dict.fromkeys(info.module for info in BUILTIN):
    pytest.importorskip(framework, reason=f"the tour imports every framework; {framework} is not")

import jax.numpy as jnp  # noqa: E402

pytestmark = pytest.mark.docs

TOUR = Path(__file__).resolve().parent.parent / "examples" / "tour"
# Not ``impl``: the name of the conformance suite's own fixture. The built-in ones, in order.
IMPLEMENTATIONS = [info.name for info in BUILTIN]


def load(name: str):
    """An example file as a module, by path (the examples are not part of the installed wheel)."""
    module_name = f"examples.tour.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, TOUR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name", ["stateful_layers", "surgery", "scan_layers", "inspect_model", "variables"]
)
def test_every_example_covers_every_implementation_and_runs_as_a_script(name, capsys):
    module = load(name)
    assert list(module.RUNS) == IMPLEMENTATIONS
    module.main()
    printed = capsys.readouterr().out
    for impl in IMPLEMENTATIONS:
        assert impl in printed


@pytest.mark.parametrize("style", IMPLEMENTATIONS)
def test_stateful_layers(style):
    module = load("stateful_layers")
    seen = module.RUNS[style](*module.example_inputs())
    # Dropout: the key alone decides the mask.
    assert jnp.allclose(seen.train, seen.train_same_key)
    assert not jnp.allclose(seen.train, seen.train_other_key)
    # BatchNorm: a training call moves the running mean (from zero, towards the inputs' mean of 3
    # after the first layer), an evaluation call leaves it alone...
    assert jnp.array_equal(seen.mean_before, jnp.zeros_like(seen.mean_before))
    assert float(jnp.abs(seen.mean_after - seen.mean_before).max()) > 0.1
    assert jnp.array_equal(seen.mean_after_eval, seen.mean_after)
    # ... and in evaluation a row's output does not depend on the rest of its batch.
    assert jnp.allclose(seen.eval_batch[0], seen.eval_first[0], atol=1e-5)
    assert seen.train.shape == seen.eval_batch.shape == (16, 2)


@pytest.mark.parametrize("style", IMPLEMENTATIONS)
def test_surgery(style):
    module = load("surgery")
    seen = module.RUNS[style](*module.example_inputs())
    assert jnp.allclose(seen.before, seen.after_surgery, atol=1e-6)  # B starts at zero
    assert float(jnp.abs(seen.after_step - seen.before).max()) > 1e-4  # the adapter trained
    assert jnp.array_equal(seen.kernel_before, seen.kernel_after)  # the base layer did not
    assert sorted(map(sorted, seen.adapter_shapes)) == [[2, 4], [2, 8]]  # rank 2, 4 -> 8


@pytest.mark.parametrize("style", IMPLEMENTATIONS)
def test_scan_layers(style):
    module = load("scan_layers")
    seen = module.RUNS[style](module.example_inputs())
    assert jnp.allclose(seen.scanned, seen.looped, atol=1e-6)
    assert seen.leading == {module.LAYERS}
    assert seen.distinct
    assert seen.scanned.shape == (5, module.WIDTH)


@pytest.mark.parametrize("style", IMPLEMENTATIONS)
def test_inspect_model(style, capsys):
    module = load("inspect_model")
    seen = module.RUNS[style](module.example_inputs())
    capsys.readouterr()  # nnx.display prints the model
    assert seen.count == module.PARAMETERS == 58
    text = seen.summary
    assert "hidden" in text and "out" in text
    assert "\x1b[" not in text  # no terminal colour codes
    if style == "equinox":
        assert "f32[8,4]" in text  # Equinox's [out, in] weight layout shows
    else:
        assert "4,8" in text.replace(" ", "") or "(4, 8)" in text


@pytest.mark.parametrize("style", IMPLEMENTATIONS)
def test_variables(style):
    module = load("variables")
    seen = module.RUNS[style](*module.example_inputs())
    # The update wrote the checkpoint's parameters: the model's output is now the checkpoint's...
    assert not jnp.allclose(seen.before_update, seen.expected, atol=1e-3)
    assert jnp.allclose(seen.after_update, seen.expected, atol=1e-6)
    # ... and left the count alone: every call counted, before the update and after it.
    assert seen.calls == module.CALLS == 4
    # The counting state is picked out by its kind, and the gradient holds the parameters alone:
    # a kernel of 4 x 2 and a bias of 2, no count.
    assert seen.count_leaves == 1
    assert seen.grad_sizes == (2, 8)
