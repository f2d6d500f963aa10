"""``cvae convert``, ``cvae sample``, ``cvae reconstruct``, ``cvae export`` and
``cvae_rosetta.app.serving``.

One tiny pure-JAX run serves every test. The exported model is loaded in a subprocess where Flax,
Haiku, Equinox, Optax and Orbax cannot be imported, and must give exactly what the compiled
functions of the run's implementation give.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.app import checkpoint, convert, inference, paramsfile, trainstate
from cvae_rosetta.cli import main
from cvae_rosetta.cli.tiny_runs import fast_outputs
from cvae_rosetta.spec import protocol

TINY = [
    *("--data", "synthetic", "--batch-size", "64", "--latent-dim", "2", "--encoder-dims", "8"),
    *("--decoder-dims", "8", "--iw-samples", "1", "--no-progress", "--epochs", "2"),
]
FRAMEWORKS = ("flax", "haiku", "equinox", "keras")
BLOCKED = (*FRAMEWORKS, "optax", "orbax", "chex", "jmp", "tensorstore", "sklearn")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    with fast_outputs():
        assert main(["train", "--impl", "pure_jax", *TINY, "--out", str(out)]) == 0
    return out


def cli(*args: str) -> int:
    return main(list(args))


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("cvae: error: ") and err.count("\n") == 0, err
    return err


# --- convert --------------------------------------------------------------------------------------


def test_convert_writes_the_canonical_checkpoint(trained, tmp_path, capsys):
    out = tmp_path / "canonical.npz"
    assert cli("convert", "--run", str(trained), "--out", str(out)) == 0
    assert "step 16" in capsys.readouterr().out
    with np.load(out, allow_pickle=False) as npz:  # arrays and a JSON string, no pickle
        names = set(npz.files)
        meta = json.loads(str(npz["metadata.json"]))
    assert {"step", "run_keys", "opt_state/count", "params/latent/kernel"} <= names
    assert {"opt_state/mu/encoder/0/kernel", "opt_state/nu/decoder/1/bias"} <= names
    assert meta["step"] == 16 and meta["impl"] == "pure_jax" and meta["config"]["model"]
    assert meta["arrays"]["params/latent/kernel"]["sha256"]
    loaded = convert.load_npz(out)
    latest = checkpoint.latest_of_run(trained)
    a, b = checkpoint.flatten(loaded.state), checkpoint.flatten(latest.state)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert loaded.progress == latest.progress
    # the file is framework-neutral: any implementation takes it up
    for info in protocol.known():
        if not info.installed or not info.builtin:
            continue
        impl = protocol.load(info.name)
        state = trainstate.implementation_state(impl, loaded.state, loaded.config)
        assert int(state.step) == 16


def test_convert_of_a_run_without_checkpoints_keeps_its_parameters(trained, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(trained, bare, ignore=shutil.ignore_patterns("checkpoints"))
    out = tmp_path / "params.npz"
    assert cli("convert", "--run", str(bare), "--out", str(out)) == 0
    params = convert.load_npz(out)
    expected = paramsfile.load_params(trained / "params.npz")
    jax.tree.map(np.testing.assert_array_equal, params, expected)


def test_convert_refuses_bad_input_and_keeps_what_exists(trained, tmp_path, capsys):
    existing = tmp_path / "exists.npz"
    existing.write_bytes(b"keep me")
    cases = [
        (["--out", str(existing)], "--out: expected a new file"),
        (["--out", str(tmp_path / "x.txt")], "--out: expected a file name ending in .npz"),
        (["--out", str(tmp_path / "nodir" / "x.npz")], "--out: expected an existing directory"),
        (["--out", str(tmp_path / "x.npz"), "--step", "5"], "--step: expected one of"),
    ]
    for extra, message in cases:
        assert cli("convert", "--run", str(trained), *extra) == 2
        assert message in one_line_error(capsys)
    assert cli("convert", "--run", str(tmp_path / "nope"), "--out", str(tmp_path / "y.npz")) == 2
    assert "--run: expected a run directory" in one_line_error(capsys)
    assert existing.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists.npz"]


# --- sample and reconstruct ---------------------------------------------------------------------


def test_sample_writes_png_and_npz(trained, tmp_path, capsys):
    png, npz = tmp_path / "s.png", tmp_path / "s.npz"
    assert cli("sample", "--run", str(trained), "--label", "3", "--n", "16", "--out", str(png)) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    args = ["sample", "--run", str(trained), "--label", "3,7", "--n", "5", "--seed", "1"]
    assert cli(*args, "--out", str(npz)) == 0
    with np.load(npz, allow_pickle=False) as f:
        images, labels = f["images"], f["labels"]
    assert images.shape == (10, 64) and labels.tolist() == [3] * 5 + [7] * 5
    assert np.all((images >= 0) & (images <= 1))
    trained_model = inference.load_trained(trained)
    again, _ = inference.sample(trained_model, [3, 7], 5, 1)
    np.testing.assert_array_equal(images, again)
    capsys.readouterr()


def test_reconstruct_writes_png_and_npz(trained, tmp_path):
    png, npz = tmp_path / "r.png", tmp_path / "r.npz"
    assert cli("reconstruct", "--run", str(trained), "--out", str(png)) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    assert cli("reconstruct", "--run", str(trained), "--n", "4", "--out", str(npz)) == 0
    with np.load(npz, allow_pickle=False) as f:
        assert f["x"].shape == f["reconstructions"].shape == (4, 64)
        assert f["labels"].shape == (4,) and f["image_shape"].tolist() == [8, 8]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label", "12"], "--label: expected labels in [0, 10)"),
        (["--label", "x"], "--label: expected labels in [0, 10)"),
        (["--n", "0", "--label", "1"], "--n: expected an integer in [1, 10000]"),
        (["--seed", "-1", "--label", "1"], "--seed: expected an integer >= 0"),
        (["--label", "1", "--impl", "nosuch"], "impl: expected a known implementation"),
    ],
)
def test_sample_refuses_bad_input(trained, tmp_path, capsys, args, message):
    out = tmp_path / "s.png"
    assert cli("sample", "--run", str(trained), "--out", str(out), *args) == 2
    assert message in one_line_error(capsys)
    assert not out.exists()


# --- export and serving -------------------------------------------------------------------------

needs_flatbuffers = pytest.mark.skipif(
    importlib.util.find_spec("flatbuffers") is None,
    reason="jax.export serialises with the flatbuffers package",
)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    if importlib.util.find_spec("flatbuffers") is None:
        pytest.skip("jax.export serialises with the flatbuffers package")
    out = tmp_path_factory.mktemp("export") / "model"
    assert cli("export", "--run", str(trained), "--out", str(out)) == 0
    return out


SERVE = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # importing any of them now fails
import numpy as np
from cvae_rosetta.app import serving

model = serving.load(sys.argv[1])
x, c = np.load(sys.argv[2])["x"], np.load(sys.argv[2])["c"]
out = {{}}
for n in (1, 7):
    labels = np.arange(n, dtype=np.int32) % model.num_classes
    out[f"generate{{n}}"] = model.generate(labels, model.key(5))
mean, logvar = model.encode(x, c)
out.update(mean=mean, logvar=logvar, decode=model.decode(mean, c))
out["seeded"] = model.generate([3, 3], seed=2)
np.savez(sys.argv[3], **out)
loaded = sorted(m for m in {blocked!r} if sys.modules.get(m) is not None)
assert not loaded, loaded
"""


@needs_flatbuffers
def test_export_writes_a_manifest_of_shapes(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    gen = manifest["functions"]["generator"]
    assert [i["shape"] for i in gen["inputs"]] == [["b"], manifest["key_shape"]]
    assert gen["outputs"] == [{"name": "images", "shape": ["b", 64], "dtype": "float32"}]
    enc = manifest["functions"]["encoder"]
    assert [o["shape"] for o in enc["outputs"]] == [["b", 2], ["b", 2]]
    assert manifest["impl"] == "pure_jax" and manifest["step"] == 16
    for entry in manifest["functions"].values():
        assert (exported / entry["file"]).is_file()
    assert "stablehlo" in (exported / "generator.mlir").read_text()


@needs_flatbuffers
def test_served_model_needs_only_jax_and_reproduces_the_run(trained, exported, tmp_path):
    x = np.asarray(jax.random.uniform(jax.random.key(4), (5, 64)), np.float32)
    c = np.arange(5, dtype=np.int32)
    np.savez(tmp_path / "inputs.npz", x=x, c=c)
    script = SERVE.format(blocked=BLOCKED)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(exported),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "served.npz"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = dict(np.load(tmp_path / "served.npz"))

    model = inference.load_trained(trained)
    fns = {
        name: jax.jit(fn) for name, fn in inference.model_functions(model.impl, model.state).items()
    }
    key = jax.random.key_data(jax.random.key(5))
    for n in (1, 7):
        labels = jnp.arange(n, dtype=jnp.int32) % 10
        np.testing.assert_array_equal(served[f"generate{n}"], fns["generator"](labels, key))
    mean, logvar = fns["encoder"](x, c)
    np.testing.assert_array_equal(served["mean"], mean)
    np.testing.assert_array_equal(served["logvar"], logvar)
    np.testing.assert_array_equal(served["decode"], fns["decoder"](mean, c))
    # cvae sample --seed draws what the served generator draws for the same seed
    images, _ = inference.sample(model, [3], 2, 2)
    np.testing.assert_array_equal(served["seeded"], images)


@needs_flatbuffers
def test_served_model_refuses_bad_input(exported):
    from cvae_rosetta.app import serving
    from cvae_rosetta.spec.errors import InputError

    model = serving.load(exported)
    with pytest.raises(InputError, match=r"labels: expected labels in \[0, 10\)"):
        model.generate([10], seed=0)
    with pytest.raises(InputError, match=r"x: expected values in \[0, 1\]"):
        model.encode(np.full((2, 64), 2.0, np.float32), np.zeros(2, np.int32))
    with pytest.raises(InputError, match="key: expected uint32 key data"):
        model.generate([1], np.zeros(3, np.uint32))


@needs_flatbuffers
def test_export_refuses_to_overwrite_and_detects_tampering(trained, exported, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert cli("export", "--run", str(trained), "--out", str(other)) == 2
    assert "--out: expected an empty or new directory" in one_line_error(capsys)
    assert cli("export", "--run", str(trained), "--out", str(other), "--overwrite") == 2
    assert "not a previous export" in one_line_error(capsys)
    assert (other / "notes.txt").read_text() == "mine"
    fresh = str(tmp_path / "m")
    assert cli("export", "--run", str(trained), "--out", fresh, "--platforms", "gpu") == 2
    assert "--platforms: expected" in one_line_error(capsys)

    from cvae_rosetta.app import serving
    from cvae_rosetta.spec.errors import OutputError

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    blob = copy / "encoder.jax_exported"
    data = blob.read_bytes()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(OutputError, match="expected SHA-256"):
        serving.load(copy)


def test_export_without_flatbuffers_says_what_to_install(trained, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "flatbuffers" else real(name, *a),
    )
    assert cli("export", "--run", str(trained), "--out", str(tmp_path / "m")) == 2
    assert "pip install flatbuffers" in one_line_error(capsys)
    assert not (tmp_path / "m").exists()
