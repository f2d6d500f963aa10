"""Config validation: every bad field is named, with what was expected and what was given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cvae_rosetta.spec.config import (
    Config,
    DataConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
)
from cvae_rosetta.spec.errors import ConfigError


def test_defaults_are_the_specs():
    m = ModelConfig()
    assert (m.input_dim, m.num_classes, m.latent_dim) == (784, 10, 32)
    assert m.encoder_dims == (256, 128, 64) and m.decoder_dims == (128, 256)
    assert m.compute_dtype == "float32"
    assert (LossConfig().kind, LossConfig().beta) == ("bernoulli", 1.0)
    o = OptimConfig()
    assert (o.learning_rate, o.clip_norm, o.weight_decay) == (1e-3, 1.0, 0.0)


def test_configs_are_frozen_and_hashable():
    a, b = Config(), Config()
    assert a == b and hash(a) == hash(b)
    assert hash(Config(model=ModelConfig(latent_dim=3))) != hash(a)
    with pytest.raises(AttributeError):
        a.model.latent_dim = 3  # type: ignore[misc]


def test_lists_become_tuples():
    m = ModelConfig(encoder_dims=[8, 4], decoder_dims=[])
    assert m.encoder_dims == (8, 4) and m.decoder_dims == ()
    hash(m)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ModelConfig(latent_dim=0), "model.latent_dim: expected an integer >= 1, got 0"),
        (
            lambda: ModelConfig(latent_dim=2.5),
            "model.latent_dim: expected an integer >= 1, got 2.5",
        ),
        (
            lambda: ModelConfig(input_dim=True),
            "model.input_dim: expected an integer >= 1, got True",
        ),
        (lambda: ModelConfig(encoder_dims=()), "model.encoder_dims: expected at least one width"),
        (lambda: ModelConfig(encoder_dims=(8, -1)), "model.encoder_dims[1]: expected an integer"),
        (lambda: ModelConfig(encoder_dims="64"), "model.encoder_dims: expected a sequence"),
        (lambda: ModelConfig(compute_dtype="float16"), "model.compute_dtype: expected one of"),
        (lambda: LossConfig(kind="l1"), "loss.kind: expected one of bernoulli, mse, got 'l1'"),
        (lambda: LossConfig(beta=-1.0), "loss.beta: expected a finite number >= 0, got -1.0"),
        (lambda: LossConfig(beta=float("nan")), "loss.beta: expected a finite number >= 0"),
        (lambda: OptimConfig(learning_rate=0), "optim.learning_rate: expected a finite number > 0"),
        (lambda: OptimConfig(clip_norm=float("inf")), "optim.clip_norm: expected a finite"),
        (lambda: OptimConfig(weight_decay="x"), "optim.weight_decay: expected a finite number"),
        (lambda: DataConfig(name="cifar"), "data.name: expected one of digits, mnist"),
        (lambda: DataConfig(batch_size=0), "data.batch_size: expected an integer >= 1, got 0"),
        (lambda: DataConfig(remainder="keep"), "data.remainder: expected one of drop, pad"),
        (lambda: TrainConfig(epochs=0), "train.epochs: expected an integer >= 1, got 0"),
        (lambda: TrainConfig(seed=-3), "train.seed: expected an integer >= 0, got -3"),
        (lambda: Config(model=LossConfig()), "model: expected a ModelConfig"),
    ],
)
def test_bad_fields_are_named(make, message):
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(message), str(info.value)


def test_dict_round_trip_and_unknown_fields():
    config = Config(model=ModelConfig(latent_dim=4, decoder_dims=()), loss=LossConfig(kind="mse"))
    assert Config.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="model: unknown field.s. latnt_dim"):
        Config.from_dict({"model": {"latnt_dim": 3}})
    with pytest.raises(ConfigError, match="config: unknown section.s. modle"):
        Config.from_dict({"modle": {}})


@given(st.integers(min_value=-5, max_value=5), st.floats(allow_nan=True, allow_infinity=True))
def test_any_value_is_accepted_or_refused_with_a_config_error(latent, beta):
    """Whatever the value, construction either succeeds with a valid config or says why not."""
    try:
        ModelConfig(latent_dim=latent)
    except ConfigError as err:
        assert latent < 1 and "model.latent_dim" in str(err)
    else:
        assert latent >= 1
    try:
        LossConfig(beta=beta)
    except ConfigError as err:
        assert "loss.beta" in str(err)
    else:
        assert beta >= 0
