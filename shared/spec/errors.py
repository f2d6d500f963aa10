"""The project's error types.

Every refusal of bad input raises a :class:`CvaeError` whose message names the field, what was
expected and what was given. The CLI prints such errors as one line and exits with status 2; any
other exception is a bug and keeps its traceback, but for the failures ``cli/exits.py`` names (an
unavailable platform, a failed write, a stop).
"""

from __future__ import annotations

from typing import Any


class CvaeError(Exception):
    """Base class of every error the project raises on purpose."""


class ConfigError(CvaeError, ValueError):
    """A configuration field holds a value the spec does not allow."""


class InputError(CvaeError, ValueError):
    """A batch or an array does not meet SPEC section 7."""


class DataError(CvaeError):
    """A data set cannot be found or read."""


class ImplementationNotFound(CvaeError, LookupError):
    """No implementation answers to the requested name."""


class ParameterError(CvaeError, ValueError):
    """A parameter tree does not have the canonical structure of SPEC section 2."""


class OutputError(CvaeError):
    """An output directory cannot be used."""


class CheckpointError(CvaeError):
    """A checkpoint cannot be found, read or trusted, or does not fit the run it would resume."""


# What a value is, in words rather than Python's type names (a user never typed ``NoneType``).
KINDS = {
    "int": "an integer",
    "float": "a number",
    "str": "text",
    "bool": "true or false",
    "NoneType": "nothing",
    "list": "a list",
    "tuple": "a list",
    "dict": "a table",
}


def describe(value: Any) -> str:
    """A short, readable description of ``value`` for error messages."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"an array of shape {tuple(shape)} and dtype {dtype}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = type(value).__name__
    return f"{text} ({KINDS.get(kind, kind)})"


def field_error(cls: type[CvaeError], field: str, expected: str, value: Any) -> CvaeError:
    """``cls("<field>: expected <expected>, got <value>")``: the one message format."""
    return cls(f"{field}: expected {expected}, got {describe(value)}")
