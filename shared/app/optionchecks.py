"""The checks of how a run is carried out (:class:`~cvae_rosetta.app.run.Options`, and the same
fields where ``cvae compare``, ``cvae evaluate`` and the training loop take them): each refuses a
bad value with a :class:`~cvae_rosetta.spec.errors.ConfigError` naming the field, before anything
is read or written. Nothing here imports JAX.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, field_error

MAX_IW_SAMPLES = 4096


def check_debug_nans(debug_nans: bool, config: Config) -> None:
    """``debug_nans`` checks the serial step only."""
    if debug_nans and config.train.data_parallel != "none":
        raise ConfigError(
            "debug_nans: expected train.data_parallel none (it checks the serial step), got "
            f"{config.train.data_parallel!r}"
        )


def check_run_control(max_steps: Any = None, log_every: Any = 0, eval_every: Any = 1) -> None:
    """``max_steps`` (``None``, or an integer >= 1), ``log_every`` (an integer >= 0; 0: no step
    lines) and ``eval_every`` (an integer >= 1), refused naming the field."""
    for name, value, least in (
        ("max_steps", max_steps, 1),
        ("log_every", log_every, 0),
        ("eval_every", eval_every, 1),
    ):
        if value is None and name == "max_steps":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{name}: expected an integer >= {least}, got {value!r}")


def check_iw_samples(value: Any) -> int:
    """``--iw-samples``: an integer in ``[1, MAX_IW_SAMPLES]``."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok or not 1 <= value <= MAX_IW_SAMPLES:
        raise field_error(ConfigError, "iw_samples", f"an integer in [1, {MAX_IW_SAMPLES}]", value)
    return int(value)


def check_options(every: Any, keep: Any, seconds: Any = 0.0) -> tuple[int, int, float]:
    """``--checkpoint-every`` (an integer >= 0; 0: only at the end), ``--keep-checkpoints`` and
    ``--checkpoint-every-seconds`` (a finite number >= 0; 0: no time cadence)."""
    for flag, value, minimum in (("checkpoint_every", every, 0), ("keep_checkpoints", keep, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{flag}: expected an integer >= {minimum}, got {value!r}")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ConfigError(
            f"checkpoint_every_seconds: expected a number of seconds >= 0 (0: none), got "
            f"{seconds!r}"
        )
    return every, keep, float(seconds)
