"""What one ``cvae bench`` measures: its settings, each with a flag of the same name, and how the
flags' text becomes them, refused with ``setting: expected ..., got ...`` where it does not parse
or does not fit the others.

Nothing here imports JAX: settings are checked before JAX starts, so that ``cvae bench`` can
arrange its host devices first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from cvae_rosetta.bench.results import REFERENCE
from cvae_rosetta.spec.config import DATA_PARALLEL, ModelConfig
from cvae_rosetta.spec.errors import ConfigError, field_error

BATCH_SIZES = (1, 8, 64, 256, 1024)
MECHANISMS = tuple(m for m in DATA_PARALLEL if m != "none")
MIN_STEPS = 8  # steps of a timed round, whatever the batch size


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one ``cvae bench`` measures; every field has a flag of the same name."""

    batch_sizes: tuple[int, ...] = BATCH_SIZES
    rounds: int = 10  # timed rounds, interleaved across every path (the intervals' pairs)
    steps: int = 256  # at most this many steps per round (fewer at large batches)
    epoch_examples: int = 16384  # a timed round covers about this many examples
    unrolls: tuple[int, ...] = (1, 2, 8)  # lax.scan unroll values (beyond 1: pure JAX only)
    devices: tuple[int, ...] = (1, 2, 4)  # device counts of the data-parallel cases
    mechanisms: tuple[str, ...] = MECHANISMS
    parallel_batch: int = 256  # global batch of the data-parallel cases
    parallel_impls: tuple[str, ...] | None = None  # None: every benchmarked implementation
    impls: tuple[str, ...] | None = None  # None: every installed implementation
    roof_size: int = 1024  # N of the N x N matmul roof
    precision_batches: tuple[int, ...] = (256,)  # batch sizes of bfloat16 against float32
    technique_batches: tuple[int, ...] = (1, 256)  # batch sizes of pure JAX's step variants
    quick: bool = False
    # the MNIST-sized default; smaller only in tests
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)

    def steps_at(self, batch_size: int) -> int:
        """``K``, the steps of a timed round at ``batch_size``."""
        return max(MIN_STEPS, min(self.steps, self.epoch_examples // batch_size))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["model"] = self.model.to_dict()
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


QUICK = dict(
    batch_sizes=(8, 256),
    rounds=5,
    steps=48,
    epoch_examples=2048,
    unrolls=(1,),
    devices=(2,),
    mechanisms=("sharded", "shard_map"),
    parallel_impls=(REFERENCE,),
    precision_batches=(),
    technique_batches=(),
)


def _ints(flag: str, text: Any) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",")) if isinstance(text, str) else ()
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise field_error(ConfigError, flag, "comma-separated integers >= 1", text)
    return tuple(dict.fromkeys(values))


def _int(flag: str, text: Any) -> int:
    try:
        value = int(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if value is None or value < 1:
        raise field_error(ConfigError, flag, "an integer >= 1", text)
    return value


def _names(flag: str, text: Any, choices: Sequence[str] | None = None) -> tuple[str, ...]:
    expected = (
        f"comma-separated names among {', '.join(choices)}"
        if choices
        else "comma-separated implementation names or module:attribute"
    )
    parts = text.split(",") if isinstance(text, str) else []
    names = tuple(dict.fromkeys(part.strip() for part in parts))
    if not names or any(not n for n in names) or (choices and any(n not in choices for n in names)):
        raise field_error(ConfigError, flag, expected, text)
    return names


# The settings a user may give as text (the flags of ``cvae bench``, without the dashes), each
# with its parser: ``parse(flag, text) -> value`` or ``setting: expected ..., got ...``.
PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "batch_sizes": _ints,
    "rounds": _int,
    "steps": _int,
    "epoch_examples": _int,
    "unrolls": _ints,
    "devices": _ints,
    "mechanisms": lambda f, t: _names(f, t, MECHANISMS),
    "parallel_batch": _int,
    "parallel_impls": _names,
    "impls": _names,
    "roof_size": _int,
    "precision_batches": lambda f, t: () if t == "none" else _ints(f, t),
    "technique_batches": lambda f, t: () if t == "none" else _ints(f, t),
}
SETTING_FLAGS = tuple(PARSERS)


def settings_from_flags(
    *, quick: bool = False, model: ModelConfig | None = None, **flags: str | None
) -> Settings:
    """The settings the flags describe (:data:`SETTING_FLAGS`: text as typed, ``None`` where not
    given), refused with ``setting: expected ..., got ...`` where a value does not parse or does
    not fit the others. ``quick`` starts from :data:`QUICK`; given flags override either."""
    values: dict[str, Any] = dict(QUICK) if quick else {}
    if unknown := set(flags) - set(PARSERS):
        raise TypeError(f"settings_from_flags: unknown settings {sorted(unknown)}")
    for name, text in flags.items():
        if text is not None:
            values[name] = PARSERS[name](name, text)
    if "unrolls" in values:  # the per-call overhead needs the plain scan
        values["unrolls"] = tuple(dict.fromkeys((1, *values["unrolls"])))
    settings = Settings(quick=quick, model=model or ModelConfig(), **values)
    if settings.parallel_batch % math.lcm(*settings.devices):
        raise ConfigError(
            f"parallel_batch: expected a multiple of every count in devices "
            f"({', '.join(map(str, settings.devices))}), got {settings.parallel_batch}"
        )
    return settings
