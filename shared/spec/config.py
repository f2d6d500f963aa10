"""Configuration: frozen, hashable dataclasses, validated on construction.

``Config.model``, ``Config.loss`` and ``Config.optim`` are SPEC sections 1, 4 and 5; ``Config.data``
and ``Config.train`` describe a run. Every field is checked in ``__post_init__``; a bad value raises
:class:`~cvae_rosetta.spec.errors.ConfigError` naming the field, the expected and the given value.
Configs are hashable, so they travel inside a train state as static pytree metadata.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from cvae_rosetta.spec.errors import ConfigError, field_error

COMPUTE_DTYPES = ("float32", "bfloat16")
LOSS_KINDS = ("bernoulli", "mse")
DATA_SETS = ("digits", "mnist", "fashion_mnist", "synthetic")
REMAINDERS = ("drop", "pad")
DATA_PARALLEL = ("none", "pmap", "sharded", "shard_map")
SCHEDULES = ("constant", "cosine", "warmup_cosine")
MAX_SEED = 2**63 - 1


def _int(section: str, name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise field_error(ConfigError, f"{section}.{name}", f"an integer >= {minimum}", value)
    return int(value)


def _float(section: str, name: str, value: Any, *, positive: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > 0 if positive else value >= 0)
    if not ok:
        expected = "a finite number > 0" if positive else "a finite number >= 0"
        raise field_error(ConfigError, f"{section}.{name}", expected, value)
    return float(value)


def _choice(section: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise field_error(ConfigError, f"{section}.{name}", f"one of {', '.join(choices)}", value)
    return value


def _dims(section: str, name: str, value: Any, *, allow_empty: bool) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise field_error(ConfigError, f"{section}.{name}", "a sequence of integers >= 1", value)
    if not value and not allow_empty:
        raise field_error(ConfigError, f"{section}.{name}", "at least one width", value)
    return tuple(_int(section, f"{name}[{i}]", v) for i, v in enumerate(value))


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


class _Section:
    """Shared behaviour of the config sections: dict round trip and ``replace``."""

    _section: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        if not isinstance(data, Mapping):
            raise field_error(ConfigError, cls._section, "a mapping of fields", data)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"{cls._section}: unknown field(s) {', '.join(unknown)}; "
                f"known fields are {', '.join(sorted(names))}"
            )
        return cls(**data)

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """SPEC section 1."""

    _section = "model"
    input_dim: int = 784
    num_classes: int = 10
    latent_dim: int = 32
    encoder_dims: tuple[int, ...] = (256, 128, 64)
    decoder_dims: tuple[int, ...] = (128, 256)
    compute_dtype: str = "float32"

    def __post_init__(self) -> None:
        _set(self, "input_dim", _int("model", "input_dim", self.input_dim))
        _set(self, "num_classes", _int("model", "num_classes", self.num_classes))
        _set(self, "latent_dim", _int("model", "latent_dim", self.latent_dim))
        enc = _dims("model", "encoder_dims", self.encoder_dims, allow_empty=False)
        _set(self, "encoder_dims", enc)
        _set(
            self,
            "decoder_dims",
            _dims("model", "decoder_dims", self.decoder_dims, allow_empty=True),
        )
        _choice("model", "compute_dtype", self.compute_dtype, COMPUTE_DTYPES)


@dataclasses.dataclass(frozen=True)
class LossConfig(_Section):
    """SPEC section 4."""

    _section = "loss"
    kind: str = "bernoulli"
    beta: float = 1.0

    def __post_init__(self) -> None:
        _choice("loss", "kind", self.kind, LOSS_KINDS)
        _set(self, "beta", _float("loss", "beta", self.beta, positive=False))


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Section):
    """SPEC section 5."""

    _section = "optim"
    learning_rate: float = 1e-3  # the constant rate, or the schedule's peak
    clip_norm: float = 1.0
    weight_decay: float = 0.0
    # The learning-rate schedule (shared/spec/optim.py): constant, cosine or warmup_cosine.
    schedule: str = "constant"
    warmup_steps: int = 0  # warmup_cosine: steps of the linear warm-up from 0
    decay_steps: int | None = None  # the whole schedule, warm-up included; None: the run's steps
    end_learning_rate: float = 0.0  # where the cosine ends

    def __post_init__(self) -> None:
        lr = _float("optim", "learning_rate", self.learning_rate, positive=True)
        _set(self, "learning_rate", lr)
        _set(self, "clip_norm", _float("optim", "clip_norm", self.clip_norm, positive=True))
        wd = _float("optim", "weight_decay", self.weight_decay, positive=False)
        _set(self, "weight_decay", wd)
        kind = _choice("optim", "schedule", self.schedule, SCHEDULES)
        warmup = _int("optim", "warmup_steps", self.warmup_steps, minimum=0)
        _set(self, "warmup_steps", warmup)
        if self.decay_steps is not None:
            _set(self, "decay_steps", _int("optim", "decay_steps", self.decay_steps))
        end = _float("optim", "end_learning_rate", self.end_learning_rate, positive=False)
        _set(self, "end_learning_rate", end)
        if kind == "constant":
            for name, value, default in (
                ("warmup_steps", warmup, 0),
                ("decay_steps", self.decay_steps, None),
                ("end_learning_rate", end, 0.0),
            ):
                if value != default:
                    raise ConfigError(
                        f"optim.{name}: expected {default} with optim.schedule constant (choose "
                        f"cosine or warmup_cosine to schedule the rate), got {value}"
                    )
            return
        if end > lr:
            raise ConfigError(
                f"optim.end_learning_rate: expected a number in [0, {lr:g}] (optim.learning_rate, "
                f"where the cosine starts), got {end:g}"
            )
        if kind == "cosine" and warmup:
            raise ConfigError(
                f"optim.warmup_steps: expected 0 with optim.schedule cosine (warmup_cosine warms "
                f"up), got {warmup}"
            )
        if kind == "warmup_cosine" and not warmup:
            raise ConfigError(
                "optim.warmup_steps: expected an integer >= 1 with optim.schedule warmup_cosine, "
                "got 0"
            )
        self._check_length(self.decay_steps)

    def _check_length(self, steps: int | None, *, what: str = "optim.decay_steps") -> None:
        if steps is not None and self.warmup_steps >= steps:
            raise ConfigError(
                f"optim.warmup_steps: expected fewer than the {steps} steps of the whole schedule "
                f"({what}; the warm-up is part of it), got {self.warmup_steps}"
            )

    def for_run(self, total_steps: int) -> OptimConfig:
        """This config with ``decay_steps`` set to ``total_steps`` (the run's length) where a
        schedule leaves it unset; what ``config.json`` then records, so a resumed run keeps it."""
        if self.schedule == "constant" or self.decay_steps is not None:
            return self
        self._check_length(
            total_steps, what="the run's steps: train.epochs times the batches of an epoch"
        )
        return self.replace(decay_steps=total_steps)


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """Which data set, where its files are, and how it is cut into batches.

    ``remainder`` says what happens to the examples left over when the training split is not a
    multiple of ``batch_size``: ``drop`` leaves them out of this epoch (the per-epoch shuffle brings
    them back in later epochs), ``pad`` fills the last batch with examples from the start of the
    epoch's permutation, so every example is seen at least once per epoch. Either way every batch
    has the same shape, so the step compiles once.
    """

    _section = "data"
    name: str = "digits"
    data_dir: str | None = None
    batch_size: int = 64
    remainder: str = "drop"

    def __post_init__(self) -> None:
        _choice("data", "name", self.name, DATA_SETS)
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            raise field_error(ConfigError, "data.data_dir", "a directory path", self.data_dir)
        _set(self, "batch_size", _int("data", "batch_size", self.batch_size))
        _choice("data", "remainder", self.remainder, REMAINDERS)


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
    """How long to train, from which seed, and over how many devices.

    ``data_parallel`` is ``none`` (one device) or the mechanism that splits every batch over
    ``devices`` devices: ``pmap``, ``sharded`` (jit over a sharded batch) or ``shard_map``; see
    ``shared/spec/parallel.py``.
    """

    _section = "train"
    epochs: int = 300
    seed: int = 0
    data_parallel: str = "none"
    devices: int = 1

    def __post_init__(self) -> None:
        _set(self, "epochs", _int("train", "epochs", self.epochs))
        _set(self, "seed", _int("train", "seed", self.seed, minimum=0))
        if self.seed > MAX_SEED:  # jax.random.key takes a signed 64-bit seed
            raise field_error(
                ConfigError, "train.seed", f"an integer in [0, {MAX_SEED}]", self.seed
            )
        _choice("train", "data_parallel", self.data_parallel, DATA_PARALLEL)
        _set(self, "devices", _int("train", "devices", self.devices))
        if self.data_parallel == "none" and self.devices != 1:
            raise ConfigError(
                "train.devices: expected 1 with train.data_parallel 'none' (choose pmap, sharded "
                f"or shard_map to use more devices), got {self.devices}"
            )


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole resolved configuration of a run (what ``config.json`` records)."""

    model: ModelConfig = ModelConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, f.default.__class__):
                expected = f"a {f.default.__class__.__name__}"
                raise field_error(ConfigError, f.name, expected, value)
        if self.data.batch_size % self.train.devices:
            raise ConfigError(
                f"train.devices, data.batch_size: expected a batch size that is a multiple of the "
                f"devices (every device takes the same number of rows), got {self.train.devices} "
                f"devices and a batch of {self.data.batch_size}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name).to_dict() for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        if not isinstance(data, Mapping):
            raise field_error(ConfigError, "config", "a mapping of sections", data)
        sections = {f.name: f.default.__class__ for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(sections))
        if unknown:
            raise ConfigError(
                f"config: unknown section(s) {', '.join(unknown)}; "
                f"known sections are {', '.join(sections)}"
            )
        return cls(**{name: sections[name].from_dict(data[name]) for name in data})

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "loss": LossConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "train": TrainConfig,
}
