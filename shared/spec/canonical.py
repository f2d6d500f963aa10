"""SPEC section 2: the canonical parameter pytree every implementation converts to and from.

```
{"encoder": [{"kernel": f32[in, out], "bias": f32[out]}, ...],
 "latent":  {"kernel": f32[encoder_dims[-1], 2L], "bias": f32[2L]},
 "decoder": [{"kernel": ..., "bias": ...}, ...]}      # hidden layers, then the output layer
```
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from cvae_rosetta.spec.config import ModelConfig
from cvae_rosetta.spec.errors import ParameterError, describe

Layer = dict[str, Any]
Canonical = dict[str, Any]


def layer_sizes(model: ModelConfig) -> dict[str, list[tuple[int, int]]]:
    """``(fan_in, fan_out)`` of every dense layer, grouped as in the canonical tree."""
    k, d, z = model.num_classes, model.input_dim, model.latent_dim
    enc = [d + k, *model.encoder_dims]
    dec = [z + k, *model.decoder_dims, d]
    return {
        "encoder": list(itertools.pairwise(enc)),
        "latent": [(model.encoder_dims[-1], 2 * z)],
        "decoder": list(itertools.pairwise(dec)),
    }


def shapes(model: ModelConfig) -> Canonical:
    """The canonical tree with each leaf replaced by its expected shape."""
    sizes = layer_sizes(model)

    def layer(fan_in: int, fan_out: int) -> Layer:
        return {"kernel": (fan_in, fan_out), "bias": (fan_out,)}

    return {
        "encoder": [layer(*s) for s in sizes["encoder"]],
        "latent": layer(*sizes["latent"][0]),
        "decoder": [layer(*s) for s in sizes["decoder"]],
    }


def check(params: Any, model: ModelConfig, *, field: str = "params") -> None:
    """Refuse a tree that is not canonical for ``model``: wrong keys, lengths, shapes, dtypes.

    The message names the first offending path, what was expected there and what was given.
    """
    _check_node(params, shapes(model), field)


def _check_node(node: Any, expected: Any, path: str) -> None:
    if isinstance(expected, list):
        if not isinstance(node, (list, tuple)) or len(node) != len(expected):
            got = f"{len(node)} layers" if isinstance(node, (list, tuple)) else describe(node)
            raise ParameterError(f"{path}: expected a list of {len(expected)} layers, got {got}")
        for i, (n, e) in enumerate(zip(node, expected, strict=True)):
            _check_node(n, e, f"{path}[{i}]")
        return
    _check_keys(node, expected, path)
    for key, sub in expected.items():
        if not isinstance(sub, tuple):  # a group of layers, not a leaf shape
            _check_node(node[key], sub, f"{path}[{key!r}]")
            continue
        leaf = node[key]
        if not hasattr(leaf, "shape") or tuple(leaf.shape) != sub:
            raise ParameterError(f"{path}[{key!r}]: expected shape {sub}, got {describe(leaf)}")
        if np.dtype(leaf.dtype) != np.float32:
            raise ParameterError(f"{path}[{key!r}]: expected dtype float32, got {leaf.dtype}")


def _check_keys(node: Any, expected: dict, path: str) -> None:
    if not isinstance(node, dict):
        expected_keys = sorted(expected)
        raise ParameterError(
            f"{path}: expected a dict with keys {expected_keys}, got {describe(node)}"
        )
    if set(node) != set(expected):
        raise ParameterError(
            f"{path}: expected keys {sorted(expected)}, got keys {sorted(map(str, node))}"
        )
