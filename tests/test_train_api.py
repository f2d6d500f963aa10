"""A whole run from Python, without the CLI: ``cvae_rosetta.app.train``; and ``cvae train`` as
that call plus argument parsing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cvae_rosetta import cli
from cvae_rosetta.app import rundir, train
from cvae_rosetta.app.train import Options, resume, train_and_evaluate
from cvae_rosetta.cli.messages import in_flags
from cvae_rosetta.spec.config import Config, DataConfig, ModelConfig, TrainConfig
from cvae_rosetta.spec.errors import ConfigError, CvaeError

CONFIG = Config(
    data=DataConfig(batch_size=128),
    model=ModelConfig(latent_dim=4, encoder_dims=(32,), decoder_dims=(32,)),
    train=TrainConfig(epochs=1),
)
QUIET = Options(progress=False, iw_samples=4)


def test_train_and_evaluate_writes_a_whole_run(tmp_path):
    out = tmp_path / "run"
    outcome = train_and_evaluate(CONFIG, out, QUIET)
    assert not outcome.stopped
    assert outcome.workdir == out and outcome.impl == "pure_jax" and outcome.dataset == "digits"
    assert outcome.config.model.input_dim == 64  # fitted to the digits
    for name in (*rundir.RUN_FILES, *rundir.EVALUATION_FILES):
        assert (out / name).is_file(), name
    files = (*rundir.RUN_FILES, *rundir.EVALUATION_FILES, f"{rundir.TB_DIR}/")  # TensorBoard's
    assert sorted(outcome.written) == sorted(files)
    assert (out / rundir.CHECKPOINT_DIR).is_dir()
    summary = json.loads((out / rundir.SUMMARY_FILE).read_text())
    assert summary["step"] == 1437 // 128 == outcome.summary["step"]
    assert np.isfinite(summary["test_loss"])
    evaluation = json.loads((out / rundir.EVALUATION_FILE).read_text())
    assert evaluation["iw_samples"] == 4 == outcome.evaluation["iw_samples"]
    assert "pure_jax on digits" in train.describe(outcome)


def test_resume_from_python_extends_a_run(tmp_path):
    out = tmp_path / "run"
    first = train_and_evaluate(CONFIG, out, QUIET)
    more = resume(out, QUIET, changes={"train.epochs": 2})
    assert more.summary["step"] == 2 * first.summary["step"]
    assert json.loads((out / rundir.CONFIG_FILE).read_text())["config"]["train"]["epochs"] == 2


def test_resume_refuses_a_change_the_checkpoint_cannot_follow(tmp_path):
    out = tmp_path / "run"
    train_and_evaluate(CONFIG, out, QUIET)
    before = (out / rundir.METRICS_FILE).read_bytes()
    with pytest.raises(CvaeError, match=r"model\.latent_dim"):
        resume(out, QUIET, changes={"model.latent_dim": 8})
    assert (out / rundir.METRICS_FILE).read_bytes() == before


@pytest.mark.parametrize(
    ("options", "config", "message"),
    [
        (Options(checkpoint_every=-1), CONFIG, "checkpoint_every: expected an integer >= 0"),
        (Options(keep_checkpoints=0), CONFIG, "keep_checkpoints: expected an integer >= 1"),
        (Options(iw_samples=0), CONFIG, "iw_samples: expected an integer"),
        (
            Options(debug_nans=True),
            CONFIG.replace(train=CONFIG.train.replace(data_parallel="sharded")),
            "debug_nans: expected train.data_parallel none",
        ),
    ],
    ids=["every", "keep", "iw", "debug_nans"],
)
def test_bad_options_name_fields_and_write_nothing(tmp_path, options, config, message):
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as caught:
        train_and_evaluate(config, out, options)
    assert str(caught.value).startswith(message), caught.value
    assert "--" not in str(caught.value)  # fields, not flags: the CLI maps them
    assert not out.exists()


def test_the_cli_shows_the_same_errors_as_flags(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "--out", str(out), "--checkpoint-every", "-1"]) == 2
    assert capsys.readouterr().err.startswith(
        "cvae: error: --checkpoint-every: expected an integer >= 0"
    )
    assert cli.main(["train", "--debug-nans", "--data-parallel", "sharded"]) == 2
    assert "--debug-nans: expected --data-parallel none" in capsys.readouterr().err
    assert not out.exists()


def test_in_flags_maps_fields_inside_and_keeps_leading_config_fields():
    assert in_flags("optim.learning_rate: expected a finite number > 0, got -1.0") == (
        "optim.learning_rate: expected a finite number > 0, got -1.0"
    )
    typed = {"optim.learning_rate": "--learning-rate", "model.encoder_dims": "--encoder-dims"}
    assert in_flags("optim.learning_rate: expected a finite number > 0, got -1.0", typed) == (
        "--learning-rate (optim.learning_rate): expected a finite number > 0, got -1.0"
    )
    assert in_flags("model.encoder_dims[1]: expected an integer >= 1, got 0", typed) == (
        "--encoder-dims (model.encoder_dims[1]): expected an integer >= 1, got 0"
    )
    # one of the fields not typed (its value from a file): config.json's names for all of them
    both = "model.encoder_dims, loss.beta: expected the values of the run"
    assert in_flags(both, typed) == both
    assert in_flags("pure_jax: the loss is nan at step 3; lower optim.learning_rate") == (
        "pure_jax: the loss is nan at step 3; lower --learning-rate"
    )
    assert in_flags("pure_jax: debug_nans: at step 4") == "pure_jax: --debug-nans: at step 4"
    assert in_flags("workdir: expected an empty or new directory, got /tmp/data.npz") == (
        "--out: expected an empty or new directory, got /tmp/data.npz"
    )


def test_cvae_train_is_train_and_evaluate_plus_parsing(tmp_path, monkeypatch, capsys):
    calls = []

    def recorded(config, workdir, options, *, given, cluster):
        calls.append((config, workdir, options, set(given), cluster))
        raise SystemExit(0)

    monkeypatch.setattr(train, "train_and_evaluate", recorded)
    argv = ["train", "--impl", "flax_nnx", "--epochs", "3", "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit):
        cli.main([*argv, "--latent-dim", "5", "--checkpoint-every", "7", "--no-progress"])
    (config, workdir, options, given, cluster) = calls[0]
    assert config == Config(train=TrainConfig(epochs=3), model=ModelConfig(latent_dim=5))
    assert str(workdir) == str(tmp_path / "r")
    assert options == Options(impl="flax_nnx", checkpoint_every=7, progress=False)
    assert given == {"train.epochs", "model.latent_dim"}
    assert cluster is None


def test_the_other_commands_are_functions_too(tmp_path):
    from cvae_rosetta.app import convert, export, inference

    run_dir = tmp_path / "run"
    train_and_evaluate(CONFIG, run_dir, QUIET)
    path, trained, count = inference.sample_run(
        run_dir, tmp_path / "s.npz", inference.Samples([3, 7], count=2)
    )
    assert count == 4 and trained.impl.name == "pure_jax"
    with np.load(path) as arrays:
        assert arrays["images"].shape == (4, 64) and list(arrays["labels"]) == [3, 3, 7, 7]
    path, _, count = inference.reconstruct_run(run_dir, tmp_path / "r.png", count=5)
    assert path.is_file() and count == 5
    path, meta = convert.convert(run_dir, tmp_path / "c.npz")
    assert path.is_file() and meta["impl"] == "pure_jax"
    path, manifest = export.export_run(run_dir, tmp_path / "exported", platforms="cpu")
    assert (path / export.MANIFEST).is_file() and manifest["platforms"] == ["cpu"]
    with pytest.raises(ConfigError, match="^count: expected an integer in"):
        inference.sample_run(run_dir, tmp_path / "t.npz", inference.Samples([1], count=0))
    with pytest.raises(ConfigError, match=r"^labels: expected labels in \[0, 10\)"):
        inference.sample_run(run_dir, tmp_path / "t.npz", inference.Samples([12]))
    assert not (tmp_path / "t.npz").exists()
