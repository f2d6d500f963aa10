"""The layers of the conformance suite, in dependency order.

A check of a later layer presupposes every earlier one: a loss cannot match the reference when the
forward pass does not, and a step cannot when the gradients do not. The plugin runs the checks in
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

# module -> its checks' layer; CHECKS below overrides per check (the function's name)
MODULES: dict[str, str] = {
    "test_spec": "surface",
    "test_properties": "properties",
    "test_edges": "edges",
    "test_precision": "precision",
    "test_meta_gaps": "step",
    # after test_meta_gaps' constant-rate later steps (modules run in the order of their names)
    "test_schedules": "later_steps",
    "test_variants": "jit",
    "test_paths": "training",
    "test_parallel": "parallel",
    "test_cross": "pairwise",
}
CHECKS: dict[str, str] = {
    # test_spec
    "test_protocol_surface": "surface",
    "test_canonical_round_trip": "surface",
    "test_state_is_a_pytree_of_arrays": "surface",
    "test_init_gives_canonical_shapes_and_dtypes": "shapes",
    "test_output_shapes": "shapes",
    "test_init_is_lecun_normal_with_zero_biases": "shapes",
    "test_init_depends_on_the_key": "shapes",
    "test_encode_decode_match_reference": "forward",
    "test_labels_condition_both_sides": "forward",
    "test_loss_matches_reference": "loss",
    "test_noise_comes_from_the_key_alone": "loss",
    "test_gradients_match_reference": "gradients",
    "test_train_step_matches_reference_update": "step",
    "test_jitted_step_equals_eager_step": "jit",
    "test_donated_step_leaves_callers_parameters_intact": "jit",
    "test_step_traces_once_for_equal_configs": "jit",
    "test_donated_step_uses_its_buffers": "jit",
    "test_a_few_dozen_steps_lower_the_loss_on_digits": "training",
    "test_bad_batches_are_refused": "bad_input",
    "test_bad_encode_and_decode_inputs_are_refused": "bad_input",
    "test_wrong_parameter_trees_are_refused": "bad_input",
    # test_properties
    "test_from_canonical_refuses_trees_that_are_not_canonical": "bad_input",
    "test_bad_batches_are_refused_naming_the_field": "bad_input",
    "test_bad_latents_are_refused_by_decode": "bad_input",
    # test_meta_gaps
    "test_clipping_is_applied_before_adam": "step",
    "test_later_steps_follow_the_reference_optimizer": "later_steps",
}


def layer_of(module: str, check: str) -> str:
    """The layer of a check, from its module's name (``cvae_rosetta.conformance.test_spec`` or
    ``test_spec``) and its function's name (parameters in brackets ignored)."""
    check = check.split("[")[0]
    if check in CHECKS:
        return CHECKS[check]
    return MODULES.get(module.rpartition(".")[2].removesuffix(".py"), "properties")


def describe(name: str) -> str:
    return dict(LAYERS)[name]
