"""Fuzzing ``cvae train``'s config flags: every bad combination is one line and exit status 2.

Hypothesis draws a set of flags, each with a valid value or a bad one whose field is known. With
any bad value, the command must exit with status 2, print exactly one line ``cvae: error: FLAG
(FIELD): ...`` naming the flag of one of the bad values as typed and the config field it sets
(whichever the checks meet first), print no traceback and create nothing. With none, it must
train (one epoch of the synthetic data set, a tiny model).

The example budgets follow the project's hypothesis profiles (``conformance/plugin.py``): twice the
profile's ``max_examples`` for the cheap refusals (20 under ``ci``), half of it for the runs that
train (5 under ``ci``).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from cvae_rosetta.cli import main
from cvae_rosetta.cli.flags import FLAGS

# synthetic: 8x8 pixels, 10 classes; a small model unless the drawn flags say otherwise (the last
# value of a flag wins)
BASE = [
    *("--data=synthetic", "--epochs=1", "--no-progress"),
    *("--latent-dim=2", "--encoder-dims=8", "--decoder-dims=8"),
]

# Values every config accepts on the synthetic data set (small, so a valid run stays quick).
VALID: dict[str, list[str]] = {
    "--seed": ["0", "3", str(2**40)],
    "--batch-size": ["16", "64", "512"],  # 512: the whole training split
    "--remainder": ["drop", "pad"],
    "--latent-dim": ["1", "2", "3"],
    "--encoder-dims": ["8", "8,4", " 8 , 4 "],
    "--decoder-dims": ["", "8", "4,4"],
    "--compute-dtype": ["float32", "bfloat16"],
    "--loss": ["bernoulli", "mse"],
    "--beta": ["0", "0.5", "1", "2"],
    "--learning-rate": ["1e-3", "0.01", "1e-5"],
    "--clip-norm": ["1", "0.1", "10"],
    "--weight-decay": ["0", "1e-4"],
    "--input-dim": ["64"],
    "--num-classes": ["10"],
    "--iw-samples": ["1", "3", "8"],
}

# Bad values and the field each one must be refused under: a config field set by the flag is named
# as the flag, the field in brackets (``--epochs (train.epochs): ...``); one the flag did not set
# (--data mnist without --data-dir) as the flag to give.
INVALID: dict[str, list[tuple[str, str]]] = {
    "--epochs": [(v, "--epochs (train.epochs") for v in ("0", "-1", "1.5", "one", "", "1e2")],
    "--seed": [(v, "--seed (train.seed") for v in ("-1", "x", "0.5", "")],
    "--batch-size": [
        (v, "--batch-size (data.batch_size") for v in ("0", "-8", "513", "8.0", "all", "")
    ],
    "--remainder": [(v, "--remainder (data.remainder") for v in ("keep", "DROP", "")],
    "--latent-dim": [(v, "--latent-dim (model.latent_dim") for v in ("0", "-2", "2.5", "z")],
    "--encoder-dims": [
        (v, "--encoder-dims (model.encoder_dims") for v in ("", "0", "8,-1", "8,x", "8;4")
    ],
    "--decoder-dims": [(v, "--decoder-dims (model.decoder_dims") for v in ("0", "x", "4,0")],
    "--compute-dtype": [
        (v, "--compute-dtype (model.compute_dtype") for v in ("float16", "fp32", "")
    ],
    "--loss": [(v, "--loss (loss.kind") for v in ("l2", "BERNOULLI", "")],
    "--beta": [(v, "--beta (loss.beta") for v in ("-0.1", "nan", "inf", "-inf", "lots")],
    "--learning-rate": [
        (v, "--learning-rate (optim.learning_rate") for v in ("0", "-1e-3", "nan", "inf", "x")
    ],
    "--clip-norm": [(v, "--clip-norm (optim.clip_norm") for v in ("0", "-1", "nan", "x")],
    "--weight-decay": [
        (v, "--weight-decay (optim.weight_decay") for v in ("-1e-4", "inf", "nan", "w")
    ],
    "--input-dim": [(v, "--input-dim (model.input_dim") for v in ("63", "784", "0", "x")],
    "--num-classes": [(v, "--num-classes (model.num_classes") for v in ("9", "11", "0", "ten")],
    "--data": [
        ("cifar10", "--data (data.name"),
        ("", "--data (data.name"),
        ("mnist", "--data-dir"),
    ],
    "--iw-samples": [(v, "--iw-samples") for v in ("0", "-1", "4097", "k")],
}
if "--devices" in FLAGS:  # data parallelism: only one device without a mechanism
    INVALID["--devices"] = [(v, "--devices (train.devices") for v in ("0", "-1", "x", "2")]
if "--data-parallel" in FLAGS:
    INVALID["--data-parallel"] = [
        (v, "--data-parallel (train.data_parallel") for v in ("bogus", "")
    ]


@st.composite
def flag_sets(draw, *, bad: bool) -> tuple[list[str], dict[str, str], set[str]]:
    """``(argv, the valid flags given, the fields of the bad values)``."""
    chosen = draw(st.sets(st.sampled_from(sorted(VALID)), max_size=7))
    values = {flag: draw(st.sampled_from(VALID[flag])) for flag in chosen}
    fields = set()
    if bad:
        for flag in draw(st.sets(st.sampled_from(sorted(INVALID)), min_size=1, max_size=3)):
            value, field = draw(st.sampled_from(INVALID[flag]))
            values[flag] = value
            fields.add(field)
    pairs = draw(st.permutations(sorted(values.items())))
    return [f"{flag}={value}" for flag, value in pairs], values, fields


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def budget(factor: float) -> int:
    return max(3, int(settings.default.max_examples * factor))


@settings(max_examples=budget(2))
@given(flag_sets(bad=True))
def test_every_bad_combination_is_one_line_naming_the_field(case):
    argv, _, fields = case
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        code, err = run_cli(["train", *BASE, *argv, "--out", str(out)])
        assert code == 2, (argv, err)
        assert err.startswith("cvae: error: ") and err.count("\n") == 1, (argv, err)
        assert "Traceback" not in err
        named = err.removeprefix("cvae: error: ").split(":")[0]
        assert any(named.startswith(field) for field in fields), (argv, fields, err)
        assert not out.exists()


@settings(max_examples=budget(0.5))
@given(flag_sets(bad=False))
def test_every_valid_combination_trains(case):
    argv, values, _ = case
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        code, err = run_cli(["train", *BASE, *argv, "--out", str(out)])
        assert code == 0, (argv, err)
        config = json.loads((out / "config.json").read_text())["config"]
        assert config["train"]["epochs"] == 1 and config["data"]["name"] == "synthetic"
        if "--latent-dim" in values:
            assert config["model"]["latent_dim"] == int(values["--latent-dim"])
        if "--loss" in values:
            assert config["loss"]["kind"] == values["--loss"]
        evaluation = json.loads((out / "evaluation.json").read_text())
        assert evaluation["iw_samples"] == int(values.get("--iw-samples", 64))
        records = (out / "metrics.jsonl").read_text().splitlines()
        assert json.loads(records[-1])["event"] == "epoch"


def test_a_seed_too_large_for_a_key_is_refused(tmp_path):
    code, err = run_cli(["train", *BASE, f"--seed={2**64}", "--out", str(tmp_path / "run")])
    assert code == 2
    assert err.startswith("cvae: error: --seed (train.seed): expected an integer in [0, ")
    code, err = run_cli(["train", *BASE, f"--seed={2**63 - 1}", "--out", str(tmp_path / "ok")])
    assert code == 0, err
