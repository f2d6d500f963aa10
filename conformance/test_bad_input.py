"""The ``bad_input`` layer: refusal of bad input in the spec's error grammar,
``<field>: expected <what>, got <actual>`` (SPEC section 7).

Drawn from the spec alone (``cvae_rosetta.conformance.strategies``): trees that are not canonical
are refused by ``from_canonical`` naming the path, and bad batches and latents by every call that
takes them, naming the field, what was expected and the value given. Then a fixed set: bad batches
refused by ``loss`` and ``train_step``, bad inputs by ``encode`` and ``decode``, and malformed
parameter trees by ``from_canonical``, each with the spec's words. Every refusal runs eagerly,
where the value checks of SPEC section 7 run.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cvae_rosetta.conformance import common
from cvae_rosetta.conformance.assertions import assert_refused, refused_with
from cvae_rosetta.conformance.common import CONFIG, MODEL, B
from cvae_rosetta.conformance.messages import GRAMMAR
from cvae_rosetta.conformance.strategies import (
    bad_batches,
    bad_latents,
    canonical_params,
    mutated_params,
    shared_models,
)
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.validation import Batch

params, batch = common.params, common.batch  # the suite's parameters and batch


@settings(report_multiple_bugs=False)
@given(model=shared_models, params=shared_models.flatmap(canonical_params), data=st.data())
def test_from_canonical_refuses_trees_that_are_not_canonical(impl, model, params, data):
    bad = data.draw(mutated_params(params), label="mutation")
    message = refused_with(
        lambda: impl.from_canonical(bad.tree, Config(model=model)),
        f"from_canonical of a tree with {bad.case}",
    )
    said = message.splitlines()[0] if message else "(an empty message)"
    assert f"{bad.path}:" in message, (
        f"from_canonical refused a tree wrong at {bad.path} with {said!r}, which does not name "
        f"{bad.path} in the spec's grammar {GRAMMAR!r}"
    )
    assert bad.fragment in message, (
        f"from_canonical refused a tree wrong at {bad.path} with {said!r}, which does not say "
        f"{bad.fragment!r}"
    )


def assert_names_field(message: str, field: str) -> None:
    """``field`` appears as a field name (``x:`` is not found inside ``batch.x:``)."""
    assert re.search(rf"(?<![\w.]){re.escape(field)}:", message), (
        f"refused with {message.splitlines()[0]!r}, which does not name the field {field!r} in "
        f"the spec's grammar {GRAMMAR!r}"
    )


def _check_refusal(call, bad, field: str, what: str) -> None:
    message = refused_with(call, f"{what} with {bad.case}", f"{field}: {bad.expected}")
    said = message.splitlines()[0] if message else "(an empty message)"
    assert_names_field(message, field)
    assert bad.expected in message, (
        f"refused {field} with {said!r}, which does not say what was expected, {bad.expected!r} "
        f"(the spec's grammar {GRAMMAR!r})"
    )
    if bad.got:
        assert any(g in message for g in bad.got), (
            f"refused {field} with {said!r}, which does not say what it got, one of {bad.got}"
        )


@settings(report_multiple_bugs=False)
@given(
    model=shared_models,
    params=shared_models.flatmap(canonical_params),
    bad=shared_models.flatmap(bad_batches),
)
def test_bad_batches_are_refused_naming_the_field(impl, model, params, bad):
    """SPEC section 7, through every call that takes the input: the error names the field, what
    was expected and the value given."""
    state = impl.from_canonical(params, Config(model=model))
    key = jax.random.key(0)
    for entry in ("loss", "train_step"):
        _check_refusal(
            lambda entry=entry: getattr(impl, entry)(state, bad.batch(), key),
            bad,
            f"batch.{bad.field}",
            f"{entry} of a batch",
        )
    _check_refusal(lambda: impl.encode(state, bad.first, bad.c), bad, bad.field, "encode")
    if bad.field == "c":  # x is valid: decode gets a valid z of as many rows
        z = jnp.asarray(np.zeros((bad.first.shape[0], model.latent_dim), np.float32))
        _check_refusal(lambda: impl.decode(state, z, bad.c), bad, "c", "decode")


@settings(report_multiple_bugs=False)
@given(
    model=shared_models,
    params=shared_models.flatmap(canonical_params),
    bad=shared_models.flatmap(bad_latents),
)
def test_bad_latents_are_refused_by_decode(impl, model, params, bad):
    state = impl.from_canonical(params, Config(model=model))
    _check_refusal(lambda: impl.decode(state, bad.first, bad.c), bad, "z", "decode")


BAD_BATCHES = {
    "x rank 1": (lambda b: Batch(b.x[0], b.c), "batch.x: expected rank 2"),
    "x features": (lambda b: Batch(b.x[:, :10], b.c), "batch.x: expected 64 features"),
    "x NaN": (lambda b: Batch(b.x.at[2, 3].set(jnp.nan), b.c), "batch.x: expected finite"),
    "x Inf": (lambda b: Batch(b.x.at[0, 0].set(jnp.inf), b.c), "batch.x: expected finite"),
    "x above 1": (
        lambda b: Batch(b.x.at[1, 1].set(1.5), b.c),
        "batch.x: expected values in [0, 1]",
    ),
    "x below 0": (lambda b: Batch(b.x.at[1, 1].set(-0.1), b.c), "batch.x: expected values in"),
    "x integer": (
        lambda b: Batch(jnp.zeros(b.x.shape, jnp.int32), b.c),
        "batch.x: expected a floating",
    ),
    "c float": (lambda b: Batch(b.x, b.c.astype(jnp.float32)), "batch.c: expected an integer"),
    "c too large": (lambda b: Batch(b.x, b.c.at[0].set(10)), "batch.c: expected labels in [0, 10)"),
    "c negative": (lambda b: Batch(b.x, b.c.at[0].set(-1)), "batch.c: expected labels in [0, 10)"),
    "c length": (lambda b: Batch(b.x, b.c[:-1]), "batch.c: expected 12 labels"),
    "c rank 2": (lambda b: Batch(b.x, b.c[:, None]), "batch.c: expected rank 1"),
    "empty": (lambda b: Batch(b.x[:0], b.c[:0]), "batch.x: expected at least one row"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
@pytest.mark.parametrize("entry", ["loss", "train_step"])
def test_bad_batches_are_refused(impl, params, batch, case, entry):
    state = impl.from_canonical(params, CONFIG)
    make, message = BAD_BATCHES[case]
    assert_refused(
        lambda: getattr(impl, entry)(state, make(batch), jax.random.key(0)),
        f"{entry} of a batch with {case}",
        message,
    )


def test_bad_encode_and_decode_inputs_are_refused(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    z = jnp.zeros((B, MODEL.latent_dim))
    assert_refused(
        lambda: impl.encode(state, batch.x[:, :5], batch.c),
        "encode of x with 5 features",
        "x: expected 64 features",
    )
    assert_refused(
        lambda: impl.encode(state, batch.x, batch.c.at[3].set(99)),
        "encode of a label 99",
        "c: expected labels in [0, 10)",
    )
    assert_refused(
        lambda: impl.decode(state, jnp.zeros((B, MODEL.latent_dim + 1)), batch.c),
        f"decode of z with {MODEL.latent_dim + 1} columns",
        "z: expected",
    )
    assert_refused(
        lambda: impl.decode(state, z, batch.c[:3]),
        f"decode of {B} rows of z with 3 labels",
        "c: expected 12 labels",
    )


def test_wrong_parameter_trees_are_refused(impl, params):
    wrong_shape = jax.tree.map(lambda a: a, params)
    wrong_shape["latent"]["kernel"] = jnp.zeros((3, 3))
    assert_refused(
        lambda: impl.from_canonical(wrong_shape, CONFIG),
        "from_canonical of a 3 x 3 latent kernel",
        "params['latent']['kernel']: expected shape",
    )
    missing_layer = dict(params, encoder=params["encoder"][:-1])
    assert_refused(
        lambda: impl.from_canonical(missing_layer, CONFIG),
        "from_canonical of an encoder of one layer",
        "params['encoder']: expected a list of 2 layers",
    )
    assert_refused(
        lambda: impl.from_canonical({"encoder": params["encoder"]}, CONFIG),
        "from_canonical of a tree without 'latent' and 'decoder'",
        "params",
    )
