"""``params.npz``, a run's final canonical parameters, and the flat names of a tree of arrays
that it, a checkpoint and ``cvae convert``'s file share: ``encoder/0/kernel``, ``latent/bias``
(a checkpoint's under ``params/``, ``opt_state/mu/``, ``opt_state/nu/``).

The parameters are stored as named arrays only (no pickles), and read back checked: every key
``group[/i]/leaf``, every group's layers numbered from 0, every float finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.spec.errors import ParameterError

PARAM_GROUPS = ("encoder", "latent", "decoder")
# a canonical tree's keys in the order params.npz lists them: its groups, then a layer's leaves
CANONICAL_ORDER = (*PARAM_GROUPS, "kernel", "bias")


def flatten(
    tree: Any, prefix: str = "", *, order: Callable[[dict], Iterable[str]] = sorted
) -> dict[str, np.ndarray]:
    """``{"params/encoder/0/kernel": array, "opt_state/count": array, ...}``: the leaves of a tree
    of dicts and lists under their paths, a dict's keys taken in ``order`` (sorted by default)."""
    flat: dict[str, np.ndarray] = {}
    if isinstance(tree, dict):
        for key in order(tree):
            flat.update(flatten(tree[key], f"{prefix}{key}/", order=order))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            flat.update(flatten(value, f"{prefix}{i}/", order=order))
    else:
        flat[prefix.rstrip("/")] = np.asarray(tree)
    return flat


def _canonical_order(node: dict) -> list[str]:
    return [key for key in CANONICAL_ORDER if key in node]


def flatten_params(params: Any) -> dict[str, np.ndarray]:
    """A canonical tree as ``{"encoder/0/kernel": array, "latent/bias": array, ...}``, in the
    canonical order: encoder, latent, decoder, each layer's kernel before its bias."""
    return flatten(params, order=_canonical_order)


def unflatten_params(flat: dict[str, np.ndarray], *, source: str = "params") -> dict[str, Any]:
    """The inverse of :func:`flatten_params`; refuses a key that is not ``group[/i]/leaf``."""
    layers: dict[str, dict[int, dict[str, np.ndarray]]] = {g: {} for g in PARAM_GROUPS}
    for key, value in flat.items():
        parts = key.split("/")
        ok = len(parts) == 3 and parts[0] in ("encoder", "decoder") and parts[1].isdigit()
        ok = ok or (len(parts) == 2 and parts[0] == "latent")
        if not ok or parts[-1] not in ("kernel", "bias"):
            raise ParameterError(
                f"{source}: expected keys like encoder/0/kernel, latent/bias or decoder/1/bias, "
                f"got {key!r}"
            )
        index = int(parts[1]) if len(parts) == 3 else 0
        layers[parts[0]].setdefault(index, {})[parts[-1]] = value
    tree: dict[str, Any] = {}
    for group, found in layers.items():
        if sorted(found) != list(range(len(found))) or not found:
            raise ParameterError(
                f"{source}: expected {group} layers numbered 0, 1, ..., got "
                f"{sorted(found) or 'none'}"
            )
        ordered = [found[i] for i in range(len(found))]
        tree[group] = ordered[0] if group == "latent" else ordered
    return tree


def save_params(path: Path, params: Any) -> None:
    """``params.npz``: the canonical parameters, flattened, arrays only, written atomically."""
    flat = flatten_params(jax.device_get(params))
    files.atomic_write(path, lambda handle: np.savez(handle, **flat))


def load_params(path: Path) -> dict[str, Any]:
    """The canonical tree in ``params.npz`` (no pickles); check it with ``canonical.check``."""
    import zipfile
    import zlib

    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ParameterError(f"{path}: expected an NPZ archive of named arrays, got one array")
        with npz:
            flat = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        if isinstance(err, ParameterError):
            raise
        raise ParameterError(
            f"{path}: expected an NPZ file of canonical parameters, got {type(err).__name__}: {err}"
        ) from err
    for key, value in flat.items():
        if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
            raise ParameterError(f"{path}: {key}: expected finite values, got NaN or infinity")
    return unflatten_params(flat, source=str(path))
