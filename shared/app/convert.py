"""The canonical checkpoint file (``cvae convert``): a run's checkpoint, or without any its final
parameters, as one NPZ any program reads without a framework (the arrays under their flat names,
the metadata as a JSON string, ``metadata.json``; no pickle), and :func:`load_npz` to read it
back, checksums checked. :func:`check_out_file` checks an output file (``cvae sample`` and
``cvae reconstruct`` use it too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app import rundir
from cvae_rosetta.app.checkpoint import (
    FORMAT,
    VERSION,
    Checkpoint,
    array_digest,
    from_parts,
    has_checkpoints,
    latest_of_run,
)
from cvae_rosetta.app.paramsfile import flatten, flatten_params, load_params, unflatten_params
from cvae_rosetta.app.resuming import read_run
from cvae_rosetta.spec import canonical
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import CheckpointError, ConfigError

NPZ_METADATA = "metadata.json"


def write_npz(path: Path, flat: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    """Arrays and a JSON document (a 0-d unicode array, so no pickle) in one NPZ, atomically."""
    document = {NPZ_METADATA: np.array(json.dumps(metadata))}
    files.atomic_write(path, lambda handle: np.savez(handle, **flat, **document))


def read_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import zipfile
    import zlib

    try:
        with np.load(path, allow_pickle=False) as npz:
            flat = {key: npz[key] for key in npz.files}
        metadata = json.loads(str(flat.pop(NPZ_METADATA)))
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise CheckpointError(
            f"{path}: expected a canonical checkpoint (NPZ with {NPZ_METADATA}), got "
            f"{type(err).__name__}: {err}"
        ) from err
    return flat, metadata


def convert(
    run_dir: Any, out: Any, *, step: Any = None, overwrite: bool = False
) -> tuple[Path, dict[str, Any]]:
    """``cvae convert``: a run's checkpoint (or, without any, its ``params.npz``) as one canonical
    NPZ at ``out``; returns the path and its metadata."""
    out = check_out_file(out, suffixes=(".npz",), overwrite=overwrite)
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ConfigError(f"step: expected an integer >= 0, got {step!r}")
    path, data, config = read_run(run_dir)
    if has_checkpoints(path):
        checkpoint = latest_of_run(path, step=step)
        meta = checkpoint.metadata()
        meta["source"] = {"run": str(path), "checkpoint": checkpoint.step}
        flat = flatten(checkpoint.arrays())
    else:
        if step is not None:
            raise CheckpointError(
                f"step: expected a run with checkpoints, got {path}, which has none"
            )
        params_file = path / rundir.PARAMS_FILE
        if not params_file.is_file():
            raise CheckpointError(
                f"run_dir: expected checkpoints or params.npz in {path}, got neither"
            )
        params = load_params(params_file)
        canonical.check(params, config.model, field=str(params_file))
        flat = {f"params/{k}": v for k, v in flatten_params(params).items()}
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "impl": data["impl"],
            "config": config.to_dict(),
            "params_only": True,  # no optimiser state: the run kept none
            "arrays": {name: array_digest(a) for name, a in flat.items()},
            "source": {"run": str(path), "params": rundir.PARAMS_FILE},
        }
    write_npz(out, flat, meta)
    return out, meta


def load_npz(path: Any) -> Checkpoint | dict[str, Any]:
    """A canonical NPZ of :func:`convert`: the whole :class:`Checkpoint`, or for a params-only file
    the canonical parameters."""
    path = Path(path)
    flat, meta = read_npz(path)
    if isinstance(meta, dict) and meta.get("params_only"):
        params = unflatten_params(
            {k.removeprefix("params/"): v for k, v in flat.items()}, source=str(path)
        )
        canonical.check(params, Config.from_dict(meta["config"]).model, field=str(path))
        return params
    return from_parts(flat, meta, source=str(path))


def check_out_file(path: Any, *, suffixes: tuple[str, ...], overwrite: bool = False) -> Path:
    """An output file: a wanted suffix, an existing directory to write it in, never an existing
    file replaced unless ``overwrite``."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ConfigError(f"out: expected a file path ending in {' or '.join(suffixes)}, got none")
    out = Path(path).expanduser()
    if out.suffix.lower() not in suffixes:
        raise ConfigError(
            f"out: expected a file name ending in {' or '.join(suffixes)}, got {out.name!r}"
        )
    if out.is_dir():
        raise ConfigError(f"out: expected a file, got the directory {out}")
    if out.exists() and not overwrite:
        raise ConfigError(
            f"out: expected a new file, got {out}, which exists (overwrite=True replaces it)"
        )
    if not out.parent.is_dir():
        raise ConfigError(f"out: expected an existing directory for {out.name}, got {out.parent}")
    if not os.access(out.parent, os.W_OK):
        raise ConfigError(f"out: expected a writable directory, got {out.parent}")
    return out
