"""Serve a model that ``cvae export`` wrote, with JAX, NumPy and flatbuffers (which
``jax.export.deserialize`` imports) alone: no Flax, Haiku, Equinox, Optax or Orbax.

```python
from cvae_rosetta.app import serving

model = serving.load("exported/")
images = model.generate([3, 3, 7], seed=0)      # f32[3, D] in [0, 1]
mean, logvar = model.encode(x, c)               # x: f32[B, D] in [0, 1], c: int[B]
images = model.decode(z, c)
```

Every function takes any batch size (the batch dimension was exported symbolic) and refuses bad
input before it runs, as the implementations do (SPEC section 7). The files are checked against
the SHA-256 in ``manifest.json`` before they are deserialised.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.spec.errors import InputError, OutputError
from cvae_rosetta.spec.validation import check_features, check_labels, check_latent

FORMAT = "cvae-rosetta export"
VERSION = 1
MANIFEST = "manifest.json"


class Model:
    """The exported generator, encoder and decoder of one trained run."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        try:
            manifest = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise OutputError(
                f"{path}: expected the manifest cvae export writes, got {type(err).__name__}: {err}"
            ) from err
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise OutputError(f"{path}: expected format {FORMAT!r}, got {manifest.get('format')!r}")
        if manifest.get("version") != VERSION:
            raise OutputError(
                f"{path}: expected version {VERSION}, got {manifest.get('version')!r}"
            )
        self.manifest = manifest
        model = manifest["model"]
        self.input_dim = int(model["input_dim"])
        self.num_classes = int(model["num_classes"])
        self.latent_dim = int(model["latent_dim"])
        self.image_shape = tuple(manifest["image_shape"])
        self.prng = str(manifest["prng"])
        self._functions = {name: self._load(name, e) for name, e in manifest["functions"].items()}

    def _load(self, name: str, entry: dict[str, Any]) -> Any:
        path = self.directory / entry["file"]
        try:
            blob = path.read_bytes()
        except OSError as err:
            raise OutputError(f"{path}: expected the exported {name}, got {err.strerror}") from err
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            raise OutputError(
                f"{path}: expected SHA-256 {entry['sha256'][:12]}... (manifest.json), got "
                "different contents"
            )
        return jax.export.deserialize(bytearray(blob))

    def key(self, seed: int) -> np.ndarray:
        """The key data the generator takes, for an integer seed."""
        return np.asarray(jax.random.key_data(jax.random.key(seed, impl=self.prng)))

    def _key_data(self, key: Any, seed: int | None) -> jax.Array:
        if key is None and seed is None:
            raise InputError("key: expected a JAX key, its key data or a seed, got none")
        if key is None:
            return jnp.asarray(self.key(int(seed)))
        if jnp.issubdtype(getattr(key, "dtype", np.float32), jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        data = jnp.asarray(key)
        expected = tuple(self.manifest["key_shape"])
        if data.shape != expected or data.dtype != jnp.uint32:
            raise InputError(
                f"key: expected uint32 key data of shape {expected} ({self.prng}), got an array "
                f"of shape {data.shape} and dtype {data.dtype}"
            )
        return data

    def generate(self, labels: Any, key: Any = None, *, seed: int | None = None) -> np.ndarray:
        """``sigmoid(decode(z, labels))`` with ``z = normal(key, (B, L))``: images ``f32[B, D]``."""
        c = jnp.asarray(np.asarray(labels))
        check_labels(c, self.num_classes, field="labels")
        out = self._functions["generator"].call(c.astype(jnp.int32), self._key_data(key, seed))
        return np.asarray(out)

    def encode(self, x: Any, c: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, logvar)`` of q(z | x, c), each ``f32[B, L]``."""
        x, c = jnp.asarray(x), jnp.asarray(c)
        check_features(x, self.input_dim)
        check_labels(c, self.num_classes, rows=x.shape[0])
        mean, logvar = self._functions["encoder"].call(x.astype(jnp.float32), c.astype(jnp.int32))
        return np.asarray(mean), np.asarray(logvar)

    def decode(self, z: Any, c: Any) -> np.ndarray:
        """``sigmoid(decode(z, c))``: the mean images ``f32[B, D]``."""
        z, c = jnp.asarray(z), jnp.asarray(c)
        check_latent(z, self.latent_dim)
        check_labels(c, self.num_classes, rows=z.shape[0], of="z")
        out = self._functions["decoder"].call(z.astype(jnp.float32), c.astype(jnp.int32))
        return np.asarray(out)

    def reconstruct(self, x: Any, c: Any) -> np.ndarray:
        """``sigmoid(decode(mean, c))``: the deterministic reconstruction."""
        mean, _ = self.encode(x, c)
        return self.decode(mean, c)


def load(directory: str | Path) -> Model:
    return Model(directory)
