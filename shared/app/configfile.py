"""Config files for ``cvae train --config FILE`` and ``cvae compare --config FILE``.

A file holds the config's sections and fields as a run's ``config.json`` holds them (under its
``config`` entry), any of them left out:

- TOML (``.toml``): a table per section, ``[model]`` then ``latent_dim = 8``;
- JSON (``.json``): ``{"model": {"latent_dim": 8}}``; a run's own ``config.json`` is read too
  (its ``config`` entry);
- Python (``.py``): a file defining ``get_config()`` that returns such a mapping (or an object
  with ``to_dict()``, as ``ml_collections.ConfigDict`` has), as Flax's examples'
  ``configs/default.py`` do.

Unknown sections and fields are refused, naming the field and the file. Nothing here imports JAX,
so a bad file is refused at once. :func:`to_toml` writes a resolved config back as TOML, with
where each value came from, for ``--print-config``; ``--config`` reads it back unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import runpy
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cvae_rosetta.spec.config import SECTIONS
from cvae_rosetta.spec.errors import ConfigError, field_error

SUFFIXES = (".toml", ".json", ".py")
RUN_ENTRY = "config"  # where a run's config.json holds the config


def fields_of(section: str) -> list[str]:
    return [f.name for f in dataclasses.fields(SECTIONS[section])]


def read(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` of the config file ``path``, every name checked against the
    config's sections and fields (the values are the config's to check)."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in SUFFIXES:
        raise field_error(ConfigError, "config_file", "a .toml, .json or .py file", str(path))
    if not path.is_file():
        raise field_error(ConfigError, "config_file", "an existing file", str(path))
    data = _load(path)
    is_run = isinstance(data, Mapping) and isinstance(data.get(RUN_ENTRY), Mapping)
    if is_run and not set(data) & set(SECTIONS):  # a run's config.json: {"command", "config"...}
        data = data[RUN_ENTRY]
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config_file: expected {path} to hold a mapping of the config's sections, got "
            f"{type(data).__name__}"
        )
    return _checked(data, path)


def _load(path: Path) -> Any:
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return tomllib.loads(path.read_text(encoding="utf-8"))
        if suffix == ".json":
            return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:  # TOMLDecodeError is a ValueError
        what = "TOML" if suffix == ".toml" else "JSON"
        raise ConfigError(
            f"config_file: expected {what}, got {path}, which does not parse: {_one_line(err)}"
        ) from err
    return _python_config(path)


def _python_config(path: Path) -> Any:
    try:
        namespace = runpy.run_path(str(path))
        get_config = namespace.get("get_config")
        if not callable(get_config):
            raise ConfigError(
                f"config_file: expected {path} to define get_config() returning the config's "
                "sections, got no get_config"
            )
        data = get_config()
    except ConfigError:
        raise
    except SystemExit as err:  # sys.exit() in the user's code ends nothing but the loading
        raise ConfigError(
            f"config_file: expected {path} to run and its get_config() to return the config's "
            f"sections, got sys.exit({err.code!r})"
        ) from err
    except Exception as err:  # the file is the user's code: any error is named, in one line
        raise ConfigError(
            f"config_file: expected {path} to run and its get_config() to return the config's "
            f"sections, got {type(err).__name__}: {_one_line(err)}"
        ) from err
    to_dict = getattr(data, "to_dict", None)  # ml_collections.ConfigDict and the like
    return to_dict() if callable(to_dict) and not isinstance(data, Mapping) else data


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _checked(data: Mapping[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for section, fields in data.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"{path}: {section}: expected a section of the config ({', '.join(SECTIONS)}), "
                "got an unknown section"
            )
        if not isinstance(fields, Mapping):
            raise ConfigError(
                f"{path}: {section}: expected a table of {section}'s fields, got {fields!r}"
            )
        known = fields_of(section)
        for name in fields:
            if name not in known:
                raise ConfigError(
                    f"{path}: {section}.{name}: expected a field of {section} "
                    f"({', '.join(known)}), got an unknown field"
                )
        out[section] = dict(fields)
    return out


# --- a resolved config as TOML, with where each value came from ----------------------------------


def to_toml(
    values: Mapping[str, Mapping[str, Any]],
    sources: Mapping[str, str],
    unset: Mapping[str, str] | None = None,
    header: str = "",
) -> str:
    """``values`` (``{section: {field: value}}``) as TOML, each line followed by its source
    (``sources["model.latent_dim"]``: ``default``, a file, a flag). A field in ``unset`` is
    written as a comment saying what decides it at run time (``from the data``), and so is a
    ``None`` (TOML has no null); either way the text reads back as the same config."""
    unset = unset or {}
    lines = [f"# {line}" for line in header.splitlines()]
    for section, fields in values.items():
        lines += ["", f"[{section}]"]
        rows = []
        for name, value in fields.items():
            key = f"{section}.{name}"
            source = sources.get(key, "default")
            if key in unset and source == "default":
                rows.append((f"# {name} =", f"{unset[key]}"))
            elif value is None:
                rows.append((f"# {name} =", f"none ({source})"))
            else:
                rows.append((f"{name} = {_toml_value(value)}", source))
        width = max(len(text) for text, _ in rows)
        lines += [f"{text.ljust(width)}  # {source}" for text, source in rows]
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value) if math.isfinite(value) else "nan"  # the config allows finite only
        return text if any(c in text for c in ".en") else f"{text}.0"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")
