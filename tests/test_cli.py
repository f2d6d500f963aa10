"""The ``cvae`` command line, end to end on the bundled digits (a few seconds per run)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from cvae_rosetta.app import train
from cvae_rosetta.app.cluster import membership
from cvae_rosetta.cli import build_parser, main
from cvae_rosetta.cli.flags import FLAGS
from cvae_rosetta.cli.messages import FIELD_FLAGS, in_flags
from cvae_rosetta.spec.config import SECTIONS, Config, ModelConfig

FAST = ["--epochs", "2", "--batch-size", "128", "--no-progress", "--latent-dim", "4"]


def run_cli(*args: str) -> int:
    return main(list(args))


def test_impls_lists_every_known_implementation(capsys):
    assert run_cli("impls") == 0
    out = capsys.readouterr().out
    assert "pure_jax" in out and "jax 0." in out
    for name in ("flax_linen", "flax_nnx", "haiku"):
        assert name in out


def test_train_writes_every_output(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli("train", "--impl", "pure_jax", "--out", str(out), *FAST) == 0
    for name in (
        "config.json",
        "metrics.jsonl",
        "samples.png",
        "reconstructions.png",
        "curves.png",
        "summary.json",
    ):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["impl"] == "pure_jax"
    assert config["config"]["model"]["input_dim"] == 64  # resolved from the data
    assert config["config"]["model"]["latent_dim"] == 4
    assert config["config"]["train"]["epochs"] == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    steps = [r for r in records if r["event"] == "step"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert len(steps) == 2 * (1437 // 128) == epochs[-1]["step"]
    assert all(np.isfinite(e["test_loss"]) for e in epochs)
    text = capsys.readouterr().out
    assert "test loss" in text and str(out) in text


def test_every_config_field_has_a_flag(tmp_path):
    out = tmp_path / "run"
    args = [
        "--loss",
        "mse",
        "--beta",
        "0.5",
        "--learning-rate",
        "0.002",
        "--clip-norm",
        "2",
        "--weight-decay",
        "0.01",
        "--schedule",
        "warmup_cosine",
        "--warmup-steps",
        "3",
        "--decay-steps",
        "20",
        "--end-learning-rate",
        "0.0001",
        "--encoder-dims",
        "16,8",
        "--decoder-dims",
        "8",
        "--remainder",
        "pad",
        "--seed",
        "3",
        "--compute-dtype",
        "float32",
    ]
    assert run_cli("train", "--out", str(out), *FAST, *args) == 0
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["loss"] == {"kind": "mse", "beta": 0.5}
    assert config["optim"] == {
        "learning_rate": 0.002,
        "clip_norm": 2.0,
        "weight_decay": 0.01,
        "schedule": "warmup_cosine",
        "warmup_steps": 3,
        "decay_steps": 20,
        "end_learning_rate": 0.0001,
    }
    assert config["model"]["encoder_dims"] == [16, 8] and config["model"]["decoder_dims"] == [8]
    assert config["data"]["remainder"] == "pad" and config["train"]["seed"] == 3
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1]["step"] == 2 * -(-1437 // 128)  # pad: ceil(N / B) batches per epoch


def test_same_seed_same_metrics(tmp_path):
    for name in ("a", "b"):
        assert run_cli("train", "--out", str(tmp_path / name), *FAST) == 0
    a, b = ((tmp_path / n / "metrics.jsonl").read_text() for n in ("a", "b"))
    strip = [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in a.splitlines()]
    again = [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in b.splitlines()]
    assert strip == again


def test_compare_trains_side_by_side(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run_cli("compare", "--impls", "pure_jax", "--out", str(out), *FAST) == 0
    for name in (
        "config.json",
        "curves.png",
        "samples.png",
        "summary.md",
        "summary.json",
        "pure_jax/metrics.jsonl",
        "pure_jax/samples.png",
        "pure_jax/reconstructions.png",
    ):
        assert (out / name).is_file(), name
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert rows[0]["impl"] == "pure_jax" and rows[0]["max_param_diff"] == 0.0
    text = capsys.readouterr().out
    assert "max |dparam|" in text and "pure_jax" in text


def test_existing_output_is_never_silently_replaced(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli("train", "--out", str(out), *FAST) == 0
    before = (out / "metrics.jsonl").read_text()
    assert run_cli("train", "--out", str(out), *FAST) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == before
    assert run_cli("train", "--out", str(out), "--overwrite", *FAST, "--seed", "1") == 0
    assert (out / "metrics.jsonl").read_text() != before

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    assert run_cli("train", "--out", str(mine), "--overwrite", *FAST) == 2
    assert "not a previous run" in capsys.readouterr().err
    assert (mine / "thesis.tex").read_text() == "precious"


def write_npz(directory, *, x_train, y_train, name="mnist.npz"):
    directory.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    np.savez(
        directory / name,
        x_train=x_train,
        y_train=y_train,
        x_test=rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        y_test=np.arange(6) % 10,
    )


def test_mnist_from_a_local_directory(tmp_path):
    rng = np.random.default_rng(1)
    write_npz(
        tmp_path / "mnist",
        x_train=rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
        y_train=np.arange(40) % 10,
    )
    out = tmp_path / "run"
    code = run_cli(
        "train",
        "--data",
        "mnist",
        "--data-dir",
        str(tmp_path / "mnist"),
        "--out",
        str(out),
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--no-progress",
    )
    assert code == 0
    assert json.loads((out / "config.json").read_text())["config"]["model"]["input_dim"] == 784


def bad_inputs(tmp_path):
    rng = np.random.default_rng(2)
    labels_bad = tmp_path / "labels"
    write_npz(
        labels_bad,
        x_train=rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        y_train=np.full(20, 12),
    )
    nan_pixels = tmp_path / "nan"
    x = rng.random((20, 28, 28)).astype(np.float32)
    x[3, 4, 5] = np.nan
    write_npz(nan_pixels, x_train=x, y_train=np.arange(20) % 10)
    (tmp_path / "a_file").write_text("")
    return {
        "unknown impl": (["--impl", "tensorflow"], "impl: expected a known implementation"),
        "missing files": (
            ["--data", "mnist", "--data-dir", str(tmp_path)],
            "train-images-idx3-ubyte",
        ),
        "no data dir": (["--data", "mnist"], "--data-dir: expected the directory"),
        "labels out of range": (
            ["--data", "mnist", "--data-dir", str(labels_bad)],
            "expected labels in [0, 10)",
        ),
        "NaN pixels": (["--data", "mnist", "--data-dir", str(nan_pixels)], "expected finite"),
        "batch too large": (
            ["--batch-size", "5000"],
            "--batch-size (data.batch_size): expected at most 1437",
        ),
        "bad number": (
            ["--latent-dim", "abc"],
            "--latent-dim (model.latent_dim): expected an integer >= 1",
        ),
        "bad loss": (["--loss", "l2"], "--loss (loss.kind): expected one of bernoulli, mse"),
        "negative lr": (
            ["--learning-rate", "-1"],
            "--learning-rate (optim.learning_rate): expected a finite",
        ),
        "input dim clash": (["--input-dim", "784"], "--input-dim (model.input_dim): expected 64"),
        "bad dims": (["--encoder-dims", "16,x"], "model.encoder_dims[1]"),
        "out under a file": (["--out", str(tmp_path / "a_file" / "run")], "is a file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown impl",
        "missing files",
        "no data dir",
        "labels out of range",
        "NaN pixels",
        "batch too large",
        "bad number",
        "bad loss",
        "negative lr",
        "input dim clash",
        "bad dims",
        "out under a file",
    ],
)
def test_bad_input_stops_before_training_and_writes_nothing(tmp_path, capsys, case):
    args, message = bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    assert run_cli("train", "--no-progress", "--epochs", "1", *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("cvae: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not out.exists()


def test_console_script_prints_one_line_and_no_traceback(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cvae_rosetta.cli",
            "train",
            "--impl",
            "nope",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("cvae: error: --impl: expected a known implementation")
    assert not (tmp_path / "x").exists()


# --- what the application names, shown as flags ---------------------------------------------------


def every_flag(parser: argparse.ArgumentParser) -> set[str]:
    flags = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= every_flag(sub)
    return flags


def test_every_config_field_is_shown_as_its_flag():
    fields = {
        f"{s}.{f.name}" for s, section in SECTIONS.items() for f in dataclasses.fields(section)
    }
    assert {f"{section}.{field}" for section, field, _, _ in FLAGS.values()} == fields
    for flag, (section, field, _, _) in FLAGS.items():
        name = f"{section}.{field}"
        assert FIELD_FLAGS[name] == flag
        assert in_flags(f"pure_jax: the loss is nan; lower {name}") == (
            f"pure_jax: the loss is nan; lower {flag}"
        )
        # the field a message is about keeps the name config.json gives it
        assert in_flags(f"{name}: expected 1, got {name}=2") == f"{name}: expected 1, got {flag}=2"
    assert set(FIELD_FLAGS.values()) <= every_flag(build_parser())  # no flag the CLI lacks


@pytest.mark.parametrize(
    "message",
    [
        "model.dropout: expected a number, got 0.5",  # a field without a flag
        "pure_jax: lower optim.momentum",
        "frobnicate: expected an option, got none",
        "runs/x/checkpoints/8: step: expected the metadata's 8, got 9",  # an array, not --step
        "out/run_dir/config.json: expected JSON, got nothing",  # a path
    ],
)
def test_a_name_without_a_flag_passes_unchanged(message):
    assert in_flags(message) == message


def test_options_are_shown_as_their_flags():
    assert in_flags("workdir: expected an empty or new directory, got x") == (
        "--out: expected an empty or new directory, got x"
    )
    assert in_flags("run_dir: expected a run directory, got the file x") == (
        "--run: expected a run directory, got the file x"
    )
    assert in_flags("precision_batches: expected integers, got 'x'") == (
        "--precision-batches: expected integers, got 'x'"
    )
    assert in_flags(
        "out: expected a new file, got x, which exists (overwrite=True replaces it)"
    ) == ("--out: expected a new file, got x, which exists (--overwrite replaces it)")
    assert in_flags("seed: expected an integer >= 0, got -1") == (
        "--seed: expected an integer >= 0, got -1"
    )


# --- defaults and the cluster come from the application -------------------------------------------


def test_the_default_output_directory_is_the_applications():
    assert train.default_out("compare").parent == train.RUNS_DIR
    assert train.default_out("compare").name.startswith("compare-")
    assert train.default_workdir("pure_jax").name.startswith("pure_jax-")


def test_no_cluster_without_distributed(capsys):
    assert membership.cluster_from(Config(), distributed=False) is None
    with pytest.raises(membership.ConfigError) as caught:
        membership.cluster_from(Config(), distributed=False, num_processes=2)
    assert str(caught.value) == "num_processes: expected only with distributed=True, got 2"
    assert main(["train", "--coordinator", "h:1"]) == 2
    assert capsys.readouterr().err == (
        "cvae: error: --coordinator: expected only with --distributed, got 'h:1'\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "0"], "--port: expected an integer in [1, 65535], got 0"),
        (["--port", "p"], "--port: expected an integer in [1, 65535], got 'p'"),
        (["--timeout", "soon"], "--timeout: expected a number of seconds > 0, got 'soon'"),
        (["--timeout", "-1"], "--timeout: expected a number of seconds > 0, got -1.0"),
        (["--timeout", "nan"], "--timeout: expected a number of seconds > 0, got nan"),
    ],
)
def test_launch_refuses_a_bad_port_or_timeout(capsys, args, message):
    assert main(["launch", *args, "--", "train"]) == 2
    assert capsys.readouterr().err == f"cvae: error: {message}\n"


def test_what_cannot_fit_the_machine_is_refused_in_one_line_before_any_work(tmp_path):
    """A model of about 51 GB of weights, a thousand processes, and more epochs than the step
    counter counts: each refused in one line naming the flag, status 2, within 2 s of the
    command's start (no JAX started for the first two), nothing written, nothing started."""
    from cvae_rosetta.app import resources

    cases = [
        (
            ["train", "--latent-dim", "100000000"],
            "--latent-dim (model.latent_dim): expected a run that fits",
        ),
        (["launch", "--num-processes", "1000", "--", "train"], "--num-processes: expected at most"),
        (
            ["train", "--epochs", "99999999999999999999999"],
            "--epochs (train.epochs): expected at most",
        ),
    ]
    for args, message in cases:
        out = tmp_path / "run"
        command = [*args, "--out", str(out)]  # launch passes it on to its train command
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "cvae_rosetta.cli", *command],
            capture_output=True, text=True, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        took = time.monotonic() - started
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"cvae: error: {message}"), done.stderr
        assert done.stderr.count("\n") == 1 and not done.stdout, done.stderr
        assert not out.exists(), sorted(out.iterdir())
        if args[0] == "launch" or "--latent-dim" in args:
            assert took < 2, f"{args}: refused after {took:.1f} s"
    big = Config(model=ModelConfig(latent_dim=100_000_000))
    assert resources.training_bytes(big)[0] > 50e9  # the estimate, not the machine, decides
    resources.check_launch(1000, oversubscribe=True)  # the flag to go beyond


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["train", "--decoder-dims", "-1,5"], "--decoder-dims: expected a value after it (one "
         "that starts with '-' is written --decoder-dims=VALUE)"),
        (["train", "--epoch", "3"], "--epoch: expected a flag of this command (did you mean "
         "--epochs?), got an unknown one"),
        (["train", "--compilation-cache", "x", "--no-compilation-cache"], "--no-compilation-cache: "
         "expected at most one of --compilation-cache and --no-compilation-cache, got both"),
        (["compare", "--impls", ""], "--impls: expected implementations separated by commas "
         "(leave the flag out for all of them), got ''"),
        (["frobnicate"], "COMMAND: expected one of impls, train, compare, evaluate, launch, "
         "convert, sample, reconstruct, export, bench, got 'frobnicate'"),
        (["train", "--epochs", "0"], "--epochs (train.epochs): expected an integer >= 1, got 0 "
         "(an integer)"),
        (["train", "--devices", "2"], "--devices (train.devices): expected 1 with --data-parallel "
         "'none' (choose pmap, sharded or shard_map to use more devices), got 2"),
        (["train", "--data-parallel", "pmap", "--devices", "2", "--batch-size", "63"],
         "--devices, --batch-size (train.devices, data.batch_size): expected a batch size that is "
         "a multiple of the devices (every device takes the same number of rows), got 2 devices "
         "and a batch of 63"),
        (["train", "--data-parallel", "sharded", "--devices", "3"],  # the batch size its default
         "--devices, --batch-size (train.devices, data.batch_size): expected a batch size that is "
         "a multiple of the devices (every device takes the same number of rows), got 3 devices "
         "and a batch of 64"),
        (["train", "--max-steps", "0"], "--max-steps: expected an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_argparse_s_refusals_are_one_line_in_the_project_s_words(tmp_path, capsys, argv, line):
    """No usage block, no abbreviation taken for a flag, the flag as typed, status 2."""
    try:
        status = main([*argv, "--out", str(tmp_path / "run")])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err == f"cvae: error: {line}\n", err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_every_config_flag_s_refusal_names_the_flag_as_typed(tmp_path, capsys, flag):
    """A value of the wrong kind for any config flag: one line naming the flag as typed, the
    config field it sets in brackets, the value's kind in words, status 2, nothing written."""
    section, field, _, _ = FLAGS[flag]
    status = main(["train", f"{flag}=zz", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"cvae: error: {flag} ({section}.{field}"), err
    assert "(int)" not in err and "(str)" not in err and "usage:" not in err
    assert not (tmp_path / "run").exists()


def test_launch_shows_a_refusal_every_process_makes_once(tmp_path, capfd):
    out = tmp_path / "run"
    code = main(
        ["launch", "--num-processes", "2", "--", "train", "--epochs", "0", "--out", str(out)]
    )
    assert code == 2
    err = capfd.readouterr().err
    line = "cvae: error: --epochs (train.epochs): expected an integer >= 1, got 0"
    assert err.count(line) == 1, err
    assert not out.exists()
