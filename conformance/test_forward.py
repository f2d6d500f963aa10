"""The ``forward`` layer: ``encode`` and ``decode`` against the float64 reference (SPEC section 1).

Numbers are compared with the float64 NumPy reference of ``cvae_rosetta.conformance.reference``,
computed from the same canonical parameters. Every failure's first line says what was seen
against what the spec says, and names the way of writing the model that reproduces it, where one
of those searched does (``cvae_rosetta.conformance.forward_hypotheses``: ``decode matches the
float64 reference with GELU (tanh approximation, jax.nn.gelu's default) as the hidden layers'
activation: the spec's is ReLU``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.conformance import common, reference
from cvae_rosetta.conformance.assertions import assert_close
from cvae_rosetta.conformance.common import ATOL, CONFIG, MODEL, RTOL, B
from cvae_rosetta.conformance.forward_hypotheses import searched_forward
from cvae_rosetta.conformance.mistakes import Loaded, decode_mistake, encode_mistake

params, batch = common.params, common.batch  # the suite's parameters and batch


def _unchanged_rows(a, b) -> np.ndarray:
    """Rows of two outputs that do not differ by more than 1e-4 anywhere."""
    return np.flatnonzero(np.abs(np.asarray(a) - np.asarray(b)).max(axis=1) <= 1e-4)


def test_labels_condition_both_sides(impl, params, batch):
    """Changing only the labels changes the encoder's and the decoder's output, in every row."""
    state = impl.from_canonical(params, CONFIG)
    other = (batch.c + 1) % MODEL.num_classes
    z = jnp.zeros((B, MODEL.latent_dim))
    sides = (
        ("encode", "encoder", impl.encode(state, batch.x, batch.c)[0]),
        ("decode", "decoder", impl.decode(state, z, batch.c)),
    )
    changed = (impl.encode(state, batch.x, other)[0], impl.decode(state, z, other))
    for (call, part, before), after in zip(sides, changed, strict=True):
        same = _unchanged_rows(before, after)
        assert len(same) < B, (
            f"{call}'s output does not change when only c changes: the {part} ignores the label"
        )
        assert not len(same), (
            f"{call}'s output does not change in rows {same.tolist()} of {B} when only c "
            f"changes: the {part} sees the label in some rows only"
        )


def test_encode_decode_match_reference(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    ref_mean, ref_logvar = reference.encode(params, batch.x, batch.c, MODEL.num_classes)

    def encode_hint():
        return encode_mistake(
            Loaded(impl, state, params), batch.x, batch.c, mean, logvar, MODEL.num_classes
        )

    for what, got, want in (("mean", mean, ref_mean), ("logvar", logvar, ref_logvar)):
        assert_close(
            got,
            want,
            f"encode's {what}",
            rtol=RTOL,
            atol=ATOL,
            explain=encode_hint,
            searched=searched_forward("encode"),
        )
    z = jax.random.normal(jax.random.key(3), (B, MODEL.latent_dim))
    logits = impl.decode(state, z, batch.c)
    assert_close(
        logits,
        reference.decode(params, z, batch.c, MODEL.num_classes),
        "decode's logits",
        rtol=RTOL,
        atol=ATOL,
        explain=lambda: decode_mistake(
            Loaded(impl, state, params), z, batch.c, logits, MODEL.num_classes
        ),
        searched=searched_forward("decode"),
    )
