"""The layers of the conformance suite, in dependency order.

A check of a later layer presupposes every earlier one: a loss cannot match the reference when the
forward pass does not, and a step cannot when the gradients do not. Each layer's checks are in the
module of the suite named after it (``test_loss.py`` for ``loss``). The plugin runs the checks in
this order and, after a run with failures, names per implementation the earliest layer that failed
and the check that failed there: the one to fix first. It counts the later failures but cannot know
whether they follow from it; a failure of an earlier layer often explains those of later ones.
"""

from __future__ import annotations

# (name, what a failure there means), in the order the suite runs them
LAYERS: tuple[tuple[str, str], ...] = (
    ("surface", "the protocol's members, the state as a pytree, canonical round trips"),
    ("shapes", "parameter and output shapes and dtypes, initialisation"),
    ("forward", "encode and decode against the float64 reference"),
    ("loss", "the loss and its terms against the reference"),
    ("gradients", "gradients against the reference"),
    ("step", "one optimiser step against the reference update"),
    (
        "later_steps",
        "the second and later steps against the reference optimiser, its state and its schedules",
    ),
    ("jit", "jit, donation, tracing and isolation from the caller's arrays"),
    ("bad_input", "refusal of bad input with the spec's error grammar"),
    ("properties", "properties over drawn models, batches, parameters and keys"),
    ("edges", "finite, correct numbers at saturated logits and extreme log-variances"),
    ("precision", "float32 state and outputs, bfloat16 compute"),
    ("training", "several steps: training on digits, other paths"),
    ("parallel", "data-parallel steps against the serial step"),
    ("pairwise", "two implementations against each other"),
)
NAMES = tuple(name for name, _ in LAYERS)
RANK = {name: i for i, name in enumerate(NAMES)}

# module -> its checks' layer: each layer's checks are in the module named after it
MODULES: dict[str, str] = {f"test_{name}": name for name in NAMES}


def layer_of(module: str) -> str:
    """The layer of a check, from its module's name (``cvae_rosetta.conformance.test_loss`` or
    ``test_loss``)."""
    return MODULES.get(module.rpartition(".")[2].removesuffix(".py"), "properties")


def describe(name: str) -> str:
    return dict(LAYERS)[name]
