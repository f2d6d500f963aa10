"""``cvae export``: a trained run's generator, encoder and decoder, serialised with ``jax.export``.

Each function (:func:`cvae_rosetta.app.inference.model_functions`) is traced once with a symbolic
batch dimension ``b`` and its trained parameters as constants, and written as a serialised
``jax.export.Exported`` (StableHLO inside; ``NAME.jax_exported``) beside its StableHLO text
(``NAME.mlir``, to read). ``manifest.json`` gives every input's and output's shape and dtype, the
model's sizes, the PRNG the generator's key belongs to, the platforms it was lowered for and the
SHA-256 of every file. :mod:`cvae_rosetta.app.serving` loads and runs them with JAX alone.
Serialisation needs the ``flatbuffers`` package.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from cvae_rosetta import files
from cvae_rosetta.spec.errors import ConfigError, OutputError

FORMAT = "cvae-rosetta export"
VERSION = 1
MANIFEST = "manifest.json"
SUFFIX = ".jax_exported"
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def check_platforms(text: Any) -> tuple[str, ...]:
    """``--platforms``: comma-separated, each one JAX can lower for (default: this machine's)."""
    if text is None:
        return (jax.default_backend(),)
    names = tuple(p.strip() for p in str(text).split(",") if p.strip())
    bad = [p for p in names if p not in PLATFORMS]
    if not names or bad:
        raise ConfigError(
            f"platforms: expected a comma-separated list of {', '.join(PLATFORMS)}, got {text!r}"
        )
    return names


def check_out_dir(path: Any, *, overwrite: bool) -> Path:
    """A new or empty directory; with ``overwrite``, also a previous export (it has a manifest)."""
    from cvae_rosetta.app import rundir

    if path is None:
        raise OutputError("out: expected a directory for the exported model, got none")
    return rundir.check_out_dir(path, overwrite=overwrite, marker=MANIFEST, what="export")


def _check_serialisation() -> None:
    if importlib.util.find_spec("flatbuffers") is None:
        raise ConfigError(
            "export: expected the flatbuffers package, which jax.export serialises with, got none "
            "installed (pip install flatbuffers)"
        )


def _spec(shape: tuple[Any, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _describe(name: str, aval: Any) -> dict[str, Any]:
    shape = [d if isinstance(d, int) else str(d) for d in aval.shape]
    return {"name": name, "shape": shape, "dtype": str(aval.dtype)}


def export(trained: Any, out: Path, *, platforms: tuple[str, ...], overwrite: bool) -> dict:
    """Write the exported functions and ``manifest.json`` of ``trained`` (an
    :class:`cvae_rosetta.app.inference.Trained`) into ``out``, all at once (a temporary directory
    renamed)."""
    from cvae_rosetta.app import inference

    _check_serialisation()
    model = trained.config.model
    (b,) = jax.export.symbolic_shape("b")
    key_shape = tuple(jax.random.key_data(jax.random.key(0)).shape)
    inputs = {
        "generator": [("labels", _spec((b,), "int32")), ("key", _spec(key_shape, "uint32"))],
        "encoder": [("x", _spec((b, model.input_dim), "float32")), ("c", _spec((b,), "int32"))],
        "decoder": [("z", _spec((b, model.latent_dim), "float32")), ("c", _spec((b,), "int32"))],
    }
    outputs = {"generator": ("images",), "encoder": ("mean", "logvar"), "decoder": ("images",)}
    functions = inference.model_functions(trained.impl, trained.state)
    # replaced only if it is a previous export (check_out_dir found it empty otherwise)
    replace = overwrite and (out / MANIFEST).is_file()
    with files.atomic_directory(out, overwrite=replace) as tmp:
        entries = {}
        for name, fn in functions.items():
            exported = jax.export.export(jax.jit(fn), platforms=platforms)(
                *(spec for _, spec in inputs[name])
            )
            blob = bytes(exported.serialize())
            files.write_bytes(tmp / f"{name}{SUFFIX}", blob)
            files.write_text(tmp / f"{name}.mlir", exported.mlir_module())
            entries[name] = {
                "file": f"{name}{SUFFIX}",
                "sha256": hashlib.sha256(blob).hexdigest(),
                "inputs": [
                    _describe(n, a)
                    for (n, _), a in zip(inputs[name], exported.in_avals, strict=True)
                ],
                "outputs": [
                    _describe(n, a) for n, a in zip(outputs[name], exported.out_avals, strict=True)
                ],
                "calling_convention_version": exported.calling_convention_version,
            }
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "impl": getattr(trained.impl, "name", str(trained.impl)),
            "run": str(trained.directory),
            "source": trained.source,
            "step": trained.step,
            "model": model.to_dict(),
            "image_shape": list(trained.image_shape),
            "prng": inference.prng_name(),
            "key_shape": list(key_shape),
            "platforms": list(platforms),
            "jax": jax.__version__,
            "batch": "b: any number of rows >= 1",
            "functions": entries,
        }
        files.write_json(tmp / MANIFEST, manifest)
    return manifest


def export_run(
    run_dir: Any,
    out: Any,
    *,
    platforms: Any = None,
    impl: str | None = None,
    overwrite: bool = False,
) -> tuple[Path, dict]:
    """``cvae export``: the trained model of the run in ``run_dir`` exported into the directory
    ``out`` for ``platforms`` (comma-separated; default this machine's). Everything is checked
    before anything is traced. Returns the directory and its manifest."""
    from cvae_rosetta.app import inference

    platforms = check_platforms(platforms)
    path = check_out_dir(out, overwrite=overwrite)
    trained = inference.load_trained(run_dir, impl)
    return path, export(trained, path, platforms=platforms, overwrite=overwrite)
