"""``cvae train --config FILE``, ``--print-config``, ``--version``, ``--platform``, the run-length
flags, the help's types and choices, and the refusals that come before JAX is imported (three of
them were silent acceptances: an empty width, an empty ``--out``, ``--data-dir`` with a data set
that reads none)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import platform
import signal
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import cvae_rosetta
from cvae_rosetta import cli
from cvae_rosetta.app import configfile
from cvae_rosetta.cli.flags import CHOICES, FLAGS, resolve_config
from cvae_rosetta.cli.tiny_runs import TINY, train
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError

SMALL = {"model": {"latent_dim": 4, "encoder_dims": [8]}, "train": {"epochs": 1}}


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def refused(capsys, *argv: str) -> str:
    """The one line ``cvae ARGV`` is refused with (status 2)."""
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("cvae: error: ") and err.count("\n") == 1, err
    return err.strip()


def toml_file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- refusals come before JAX ---------------------------------------------------------------------

# Run in a fresh interpreter: every one refused (or, for --print-config, done), and JAX never
# imported, so a refusal returns at once.
PROBE = """
import json, sys
from cvae_rosetta.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    results.append([argv, status, "jax" in sys.modules])
print(json.dumps(results))
"""


def test_refusals_and_printing_do_not_import_jax(tmp_path):
    bad = toml_file(tmp_path / "bad.toml", "[model]\nlatnt_dim = 3\n")
    good = toml_file(tmp_path / "good.toml", "[model]\nlatent_dim = 3\n")
    out = str(tmp_path / "out")
    cases = [
        (["train", "--latent-dim", "x"], 2),
        (["train", "--encoder-dims", "256,,64"], 2),
        (["train", "--out", ""], 2),
        (["train", "--data", "digits", "--data-dir", str(tmp_path)], 2),
        (["train", "--data", "mnist", "--data-dir", str(tmp_path / "none")], 2),
        (["train", "--config", str(bad), "--out", out], 2),
        (["train", "--config", str(tmp_path / "missing.toml")], 2),
        (["train", "--impl", "nope", "--out", out], 2),
        (["compare", "--impls", "pure_jax,a:b:c"], 2),
        (["train", "--compilation-cache", ""], 2),
        (["train", "--platform", "abacus"], 2),
        (["sample", "--run", ""], 2),
        (["train", "--resume", out, "--config", str(good)], 2),
        (["train", "--config", str(good), "--latent-dim", "8", "--print-config"], 0),
        (["compare", "--print-config"], 0),
        (["--version"], 0),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([argv for argv, _ in cases])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [status for _, status, _ in results] == [status for _, status in cases], proc.stderr
    imported = [argv for argv, _, jax in results if jax]
    assert not imported, f"JAX was imported by: {imported[0]}"
    assert proc.stderr.count("cvae: error: ") == 13, proc.stderr
    assert not Path(out).exists()


# --- config files ---------------------------------------------------------------------------------


def test_a_config_file_and_a_flag_over_it(tmp_path):
    """The file's values, the flag's override: what config.json records."""
    cfg = toml_file(
        tmp_path / "cfg.toml",
        "[model]\nlatent_dim = 4\nencoder_dims = [8]\ndecoder_dims = []\n"
        '[data]\nname = "synthetic"\nbatch_size = 32\n[train]\nepochs = 1\nseed = 7\n',
    )
    out = tmp_path / "run"
    argv = ["--config", str(cfg), "--latent-dim", "3", "--out", str(out), "--no-progress"]
    assert train(*argv, "--iw-samples", "1", "--no-tensorboard") == 0
    saved = json.loads((out / "config.json").read_text())["config"]
    assert saved["model"]["latent_dim"] == 3  # the flag
    assert saved["model"]["encoder_dims"] == [8] and saved["model"]["decoder_dims"] == []
    assert saved["data"] == {**saved["data"], "name": "synthetic", "batch_size": 32}
    assert saved["train"]["epochs"] == 1 and saved["train"]["seed"] == 7


@pytest.mark.parametrize("kind", ["toml", "json", "py", "py-to-dict", "run"])
def test_every_kind_of_config_file(tmp_path, kind):
    if kind == "toml":
        path = toml_file(
            tmp_path / "c.toml",
            "[model]\nlatent_dim = 4\nencoder_dims = [8]\n[train]\nepochs = 1\n",
        )
    elif kind == "json":
        path = tmp_path / "c.json"
        path.write_text(json.dumps(SMALL))
    elif kind == "py":
        path = tmp_path / "default.py"
        path.write_text(f"def get_config():\n    return {SMALL!r}\n")
    elif kind == "py-to-dict":  # as ml_collections.ConfigDict returns it
        path = tmp_path / "default.py"
        path.write_text(
            "class ConfigDict:\n    def to_dict(self):\n"
            f"        return {SMALL!r}\n\n\ndef get_config():\n    return ConfigDict()\n"
        )
    else:  # a run's own config.json
        path = tmp_path / "config.json"
        whole = Config().to_dict()
        whole["model"].update(SMALL["model"])
        whole["train"].update(SMALL["train"])
        path.write_text(json.dumps({"command": "train", "impl": "pure_jax", "config": whole}))
    resolved = resolve_config(parse("train", "--config", str(path), "--epochs", "2"))
    assert resolved.config.model.latent_dim == 4 and resolved.config.model.encoder_dims == (8,)
    assert resolved.config.train.epochs == 2  # the flag wins
    assert resolved.sources["model.latent_dim"] == str(path)
    assert resolved.sources["train.epochs"] == "--epochs"
    assert {"model.latent_dim", "model.encoder_dims", "train.epochs"} <= resolved.given


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[model]\nlatnt_dim = 3\n", "model.latnt_dim: expected a field of model ("),
        ("[modle]\nlatent_dim = 3\n", "modle: expected a section of the config ("),
        ("model = 3\n", "model: expected a table of model's fields, got 3"),
        ("[model]\nlatent_dim = 'x'\n", "model.latent_dim: expected an integer >= 1, got 'x'"),
        ("[model]\nencoder_dims = [8, 0]\n", "model.encoder_dims[1]: expected an integer >= 1"),
        ("[model]\nlatent_dim = \n", "--config: expected TOML, got"),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_field_and_the_file(tmp_path, capsys, text, named):
    path = toml_file(tmp_path / "cfg.toml", text)
    out = tmp_path / "out"
    line = refused(capsys, "train", "--config", str(path), "--out", str(out))
    assert named in line and str(path) in line, line
    assert not out.exists()


def test_bad_python_and_json_files_are_one_line(tmp_path, capsys):
    crash = tmp_path / "crash.py"
    crash.write_text("def get_config():\n    return 1 / 0\n")
    assert "ZeroDivisionError" in refused(capsys, "train", "--config", str(crash))
    leaves = tmp_path / "leaves.py"  # sys.exit() in a config ends nothing but its loading
    leaves.write_text("import sys\n\ndef get_config():\n    sys.exit(3)\n")
    assert "got sys.exit(3)" in refused(capsys, "train", "--config", str(leaves))
    nothing = tmp_path / "nothing.py"
    nothing.write_text("x = 1\n")
    assert "got no get_config" in refused(capsys, "train", "--config", str(nothing))
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    assert "a mapping of the config's sections, got list" in refused(
        capsys, "compare", "--config", str(listed)
    )
    yaml = tmp_path / "c.yaml"
    yaml.write_text("model: {}")
    assert "--config: expected a .toml, .json or .py file" in refused(
        capsys, "train", "--config", str(yaml)
    )


def test_print_config_shows_each_value_and_where_it_came_from(tmp_path, capsys):
    cfg = toml_file(tmp_path / "cfg.toml", "[model]\nlatent_dim = 4\n[train]\nepochs = 5\n")
    argv = ["train", "--config", str(cfg), "--latent-dim", "8", "--beta", "0.5", "--print-config"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    lines = {line.split("=")[0].strip(): line for line in text.splitlines() if "=" in line}
    # the flag's value, the flag, and the file's value it overrides
    assert lines["latent_dim"].endswith("# --latent-dim, over 4 in the file")
    assert "= 8" in lines["latent_dim"]
    assert lines["epochs"].endswith(f"# {cfg}") and "= 5" in lines["epochs"]
    assert lines["beta"].endswith("# --beta") and lines["seed"].endswith("# default")
    assert lines["# input_dim"].endswith("# from the data")  # decided by the data set
    # the text is a config file: read back, it is the same config
    printed = toml_file(tmp_path / "printed.toml", text)
    again = resolve_config(parse("train", "--config", str(printed)))
    assert again.config == resolve_config(parse(*argv)).config
    assert tomllib.loads(text)["model"]["latent_dim"] == 8


def test_print_config_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["train", "--out", str(out), "--print-config"]) == 0
    assert cli.main(["compare", "--out", str(out), "--print-config"]) == 0
    assert not out.exists() and "[model]" in capsys.readouterr().out


def test_toml_values_round_trip():
    values = {"optim": {"learning_rate": 1e-05, "clip_norm": 2.0, "schedule": 'a"b'}}
    values["model"] = {"encoder_dims": [256, 128], "decoder_dims": []}
    text = configfile.to_toml(values, {})
    assert tomllib.loads(text) == values


# --- --version, --platform, help ------------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    first, *stack = capsys.readouterr().out.strip().splitlines()
    ours, jax = metadata.version("cvae-rosetta"), metadata.version("jax")
    assert first == f"cvae-rosetta {ours} (jax {jax})"
    assert stack[0].split() == ["Python", platform.python_version()]  # then "  NAME  VERSION"
    for name in cvae_rosetta.STACK:
        try:
            expected = metadata.version(name)
        except metadata.PackageNotFoundError:
            expected = None
        line = next(line for line in stack if line.split()[0] == name)
        assert line.split()[1:] == ([expected] if expected else ["not", "installed"]), line
    assert len(stack) == 1 + len(cvae_rosetta.STACK)


@pytest.mark.parametrize("argv", [["--version"], ["impls"]])
def test_version_and_impls_start_no_jax(argv):
    code = f"import sys; from cvae_rosetta.cli import main\ntry: main({argv!r})\n"
    code += "except SystemExit: pass\nprint('jax' in sys.modules, file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.strip() == "False", done.stderr
    if argv == ["impls"]:  # the built-ins listed, read from the entry points alone
        listed = [line.split()[0] for line in done.stdout.splitlines()]
        assert listed[:6] == ["pure_jax", "flax_linen", "flax_nnx", "haiku", "equinox", "keras"]


STOP_DURING_IMPORT = """
import importlib.abc, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets it (a background job's
# children start with SIGINT ignored)

class StopHere(importlib.abc.MetaPathFinder):  # SIGTERM while the CLI's modules are imported
    def find_spec(self, name, path, target=None):
        if name == "cvae_rosetta.cli.exits":
            os.kill(os.getpid(), SIGNAL)
        return None

sys.meta_path.insert(0, StopHere())
from cvae_rosetta.cli import main
sys.exit(main(["impls"]))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_cli_is_imported_is_one_line(signum):
    code = STOP_DURING_IMPORT.replace("SIGNAL", str(int(signum)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signum and not done.stdout, done
    name = signal.Signals(signum).name
    line = f"cvae: stopped by {name} while starting, nothing written; run the same command\n"
    assert done.stderr == line


def _has(platform: str) -> bool:
    """Whether JAX may find ``platform`` here (its plugin is installed)."""
    if platform == "tpu":
        return importlib.util.find_spec("libtpu") is not None
    return bool(metadata.entry_points(group="jax_plugins")) or bool(
        importlib.util.find_spec("jax_plugins")
    )


@pytest.mark.parametrize("platform", ["tpu", "gpu"])
def test_a_platform_jax_cannot_use_is_refused_in_one_line(tmp_path, platform):
    if _has(platform):
        pytest.skip(f"JAX may find a {platform} here")
    out = tmp_path / "run"
    argv = ["train", *TINY, "--platform", platform, "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "cvae_rosetta.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("cvae: error: --platform: expected a platform JAX can use")
    assert proc.stderr.count("\n") == 1 and f"got {platform!r}" in proc.stderr, proc.stderr
    assert not out.exists()


def test_help_shows_types_and_choices(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, (section, field, _, _) in FLAGS.items():
        choices = CHOICES.get(f"{section}.{field}")
        shown = "{" + ",".join(choices) + "}" if choices else None
        assert f"{flag} {shown or ''}".strip() in text
    assert "--latent-dim INT" in text and "--beta FLOAT" in text
    assert "--encoder-dims DIMS" in text and "--data-dir DIR" in text
    assert "--loss {bernoulli,mse}" in text and "--schedule {constant,cosine,warmup_cosine}" in text
    assert " V " not in text and "[784]" not in text and "[10]" not in text
    assert text.count("[from the data]") == 2


# --- the silent acceptances -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--encoder-dims", "256,,64"),
        ("--encoder-dims", "256,"),
        ("--decoder-dims", ",8"),
        ("--decoder-dims", "8,,8"),
    ],
)
def test_an_empty_width_is_refused(tmp_path, capsys, flag, value):
    out = tmp_path / "out"
    line = refused(capsys, "train", flag, value, "--out", str(out))
    field = "model." + flag.removeprefix("--").replace("-", "_")
    assert f"{flag} ({field}): expected a sequence of integers >= 1, got {value!r}" in line
    assert not out.exists()


def test_no_decoder_layers_is_still_an_empty_list():
    assert resolve_config(parse("train", "--decoder-dims", "")).config.model.decoder_dims == ()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--out", ""], "--out: expected a directory, got ''"),
        (["compare", "--out", ""], "--out: expected a directory, got ''"),
        (["export", "--run", "r", "--out", ""], "--out: expected a directory, got ''"),
        (["bench", "--out", ""], "--out: expected a directory, got ''"),
        (["sample", "--run", "r", "--label", "1", "--out", ""], "--out: expected a file, got ''"),
        (["evaluate", "--run", ""], "--run: expected a run directory, got ''"),
        (["train", "--resume", ""], "--resume: expected a run directory, got ''"),
    ],
)
def test_an_empty_path_is_refused(tmp_path, capsys, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert refused(capsys, *argv) == f"cvae: error: {expected}"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("data", ["digits", "synthetic"])
def test_a_data_dir_for_a_data_set_that_reads_none_is_refused(tmp_path, capsys, data):
    out = tmp_path / "out"
    line = refused(capsys, "train", "--data", data, "--data-dir", str(tmp_path), "--out", str(out))
    assert line == (
        f"cvae: error: --data-dir (data.data_dir): expected no data directory with --data {data} "
        f"(only mnist and fashion_mnist read one), got {str(tmp_path)!r}"
    )
    cfg = toml_file(tmp_path / "cfg.toml", f'[data]\ndata_dir = "{tmp_path}"\n')
    line = refused(capsys, "compare", "--config", str(cfg), "--out", str(out))
    assert line == (
        "cvae: error: data.data_dir: expected no data directory with --data digits (only mnist "
        f"and fashion_mnist read one), got {str(tmp_path)!r} (set in {cfg})"
    )
    assert not out.exists()


def test_a_missing_data_dir_is_refused_before_jax(tmp_path, capsys):
    line = refused(capsys, "train", "--data", "mnist", "--data-dir", str(tmp_path / "none"))
    assert "--data-dir (data.data_dir): expected an existing directory" in line


@pytest.mark.parametrize(
    ("impl", "expected"),
    [
        ("nope", "impl: expected a known implementation or 'module:attribute', got 'nope'"),
        ("a:b:c", "impl: expected a name or 'module:attribute', got 'a:b:c'"),
        (":x", "impl: expected a name or 'module:attribute', got ':x'"),
    ],
)
def test_an_impl_name_is_checked_before_jax(tmp_path, capsys, impl, expected):
    assert expected in refused(capsys, "train", "--impl", impl, "--out", str(tmp_path / "o"))
    assert expected in refused(capsys, "sample", "--run", "r", "--impl", impl)


# --- --max-steps, --log-every, --eval-every: handed to Options, checked by Options.check ----------


def test_the_run_length_flags_reach_the_options(monkeypatch, tmp_path):
    from cvae_rosetta.app import train as app_train

    seen = []

    def stop_here(config, workdir, options, **_):
        seen.append(options)
        raise ConfigError("stopped before training")

    monkeypatch.setattr(app_train, "train_and_evaluate", stop_here)
    argv = ["train", *TINY, "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--max-steps", "5", "--log-every", "2", "--eval-every", "3"]) == 2
    assert cli.main(argv) == 2
    given, default = seen
    assert (given.max_steps, given.log_every, given.eval_every) == (5, 2, 3)
    fields = {f.name: f.default for f in dataclasses.fields(app_train.Options)}
    assert default.max_steps == fields["max_steps"] and default.eval_every == fields["eval_every"]


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--max-steps", "0", "--max-steps: expected an integer >= 1, got 0"),
        ("--max-steps", "x", "--max-steps: expected an integer >= 1, got 'x'"),
        ("--log-every", "-1", "--log-every: expected an integer >= 0, got -1"),
        ("--eval-every", "0", "--eval-every: expected an integer >= 1, got 0"),
    ],
)
def test_bad_run_length_flags_are_refused_by_the_options(tmp_path, capsys, flag, value, expected):
    out = tmp_path / "out"
    assert refused(capsys, "train", *TINY, flag, value, "--out", str(out)) == (
        f"cvae: error: {expected}"
    )
    assert not out.exists()


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``cvae --version | head -1``: the pipe closes before every line is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cvae_rosetta.cli", "--version"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    process.stdout.close()  # before the child has written anything: it starts in ~0.2 s
    err = process.stderr.read()
    assert process.wait(timeout=60) == 128 + signal.SIGPIPE, err
    assert err == "", err
