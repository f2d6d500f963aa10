"""SPEC section 7: what a batch must be, checked before any computation.

:func:`check_batch` checks structure, rank, feature count and dtypes always (these are known at
trace time, so the checks also run when a call is traced under ``jax.jit``) and the values (finite,
in [0, 1], labels in range) whenever the arrays are concrete. Under ``jax.jit`` the arrays are
tracers and the value checks cannot run: the data layer checks every value once, on the host, before
anything reaches a model, so a jitted training step never sees an unchecked array.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.spec.errors import InputError, field_error


class Batch(NamedTuple):
    """A batch: ``x: f32[B, input_dim]`` pixels in [0, 1] and ``c: int[B]`` labels."""

    x: Any
    c: Any


def _is_concrete(array: Any) -> bool:
    return not isinstance(array, jax.core.Tracer)


def _finite(array: Any, field: str) -> np.ndarray:
    """``array`` as float64 on the host, refused if any entry is NaN or infinite."""
    values = np.asarray(array, dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise InputError(
            f"{field}: expected finite values, got {values[row, col]} at [{row}, {col}] "
            f"({int(bad.sum())} non-finite in all)"
        )
    return values


def check_features(x: Any, input_dim: int, *, field: str = "x") -> None:
    """``x`` is a float array of shape ``[B, input_dim]`` with B >= 1, finite, in [0, 1]."""
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None or dtype is None:
        raise field_error(InputError, field, f"an array of shape [B, {input_dim}]", x)
    if len(shape) != 2:
        raise InputError(
            f"{field}: expected rank 2, shape [B, {input_dim}], got shape {tuple(shape)}"
        )
    if shape[0] < 1:
        raise InputError(f"{field}: expected at least one row (B >= 1), got shape {tuple(shape)}")
    if shape[1] != input_dim:
        raise InputError(
            f"{field}: expected {input_dim} features per row (model.input_dim), "
            f"got shape {tuple(shape)}"
        )
    if not jnp.issubdtype(dtype, jnp.floating):
        raise InputError(f"{field}: expected a floating dtype, got dtype {dtype}")
    if _is_concrete(x):
        values = _finite(x, field)
        out = (values < 0) | (values > 1)
        if out.any():
            row, col = np.argwhere(out)[0]
            raise InputError(
                f"{field}: expected values in [0, 1], got {values[row, col]} at [{row}, {col}] "
                f"({int(out.sum())} outside in all)"
            )


def check_labels(
    c: Any, num_classes: int, *, rows: int | None = None, field: str = "c", of: str = "x"
) -> None:
    """``c`` is an integer array of shape ``[B]`` with labels in ``[0, num_classes)``."""
    shape = getattr(c, "shape", None)
    dtype = getattr(c, "dtype", None)
    if shape is None or dtype is None:
        raise field_error(InputError, field, "an integer array of shape [B]", c)
    if len(shape) != 1:
        raise InputError(f"{field}: expected rank 1, shape [B], got shape {tuple(shape)}")
    if shape[0] < 1:
        raise InputError(f"{field}: expected at least one label (B >= 1), got shape {tuple(shape)}")
    if rows is not None and shape[0] != rows:
        raise InputError(f"{field}: expected {rows} labels, one per row of {of}, got {shape[0]}")
    if not jnp.issubdtype(dtype, jnp.integer):
        raise InputError(f"{field}: expected an integer dtype, got dtype {dtype}")
    if _is_concrete(c):
        values = np.asarray(c)
        out = (values < 0) | (values >= num_classes)
        if out.any():
            i = int(np.argwhere(out)[0][0])
            raise InputError(
                f"{field}: expected labels in [0, {num_classes}) (model.num_classes), "
                f"got {values[i]} at [{i}] ({int(out.sum())} outside in all)"
            )


def check_batch(batch: Any, input_dim: int, num_classes: int) -> None:
    """The whole of SPEC section 7 for a :class:`Batch` (or anything with ``x`` and ``c``)."""
    if not (hasattr(batch, "x") and hasattr(batch, "c")):
        raise field_error(InputError, "batch", "a Batch with fields x and c", batch)
    check_features(batch.x, input_dim, field="batch.x")
    check_labels(batch.c, num_classes, rows=batch.x.shape[0], field="batch.c")


def check_latent(z: Any, latent_dim: int, *, field: str = "z") -> None:
    """``z`` is a finite float array of shape ``[B, latent_dim]``."""
    shape = getattr(z, "shape", None)
    dtype = getattr(z, "dtype", None)
    if shape is None or dtype is None or len(shape) != 2 or shape[1] != latent_dim or shape[0] < 1:
        raise field_error(InputError, field, f"an array of shape [B, {latent_dim}], B >= 1", z)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise InputError(f"{field}: expected a floating dtype, got dtype {dtype}")
    if _is_concrete(z):
        _finite(z, field)
