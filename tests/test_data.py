"""Tests of ``cvae_rosetta.app.data``: loaders, file parsing, checks and batching."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import jax
import numpy as np
import pytest

from cvae_rosetta.app import data
from cvae_rosetta.spec.config import DataConfig
from cvae_rosetta.spec.errors import ConfigError, DataError, InputError

ROWS, COLS = 28, 28  # MNIST's size: other sizes are refused under its names


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when ``path`` ends in ``.gz``)."""
    array = np.asarray(array, dtype=np.uint8)
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += array.tobytes()
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def fake_mnist(seed: int = 0, n_train: int = 20, n_test: int = 10):
    rng = np.random.default_rng(seed)
    images = {
        "train_x": rng.integers(0, 256, size=(n_train, ROWS, COLS), dtype=np.uint8),
        "train_c": rng.integers(0, 10, size=n_train, dtype=np.uint8),
        "test_x": rng.integers(0, 256, size=(n_test, ROWS, COLS), dtype=np.uint8),
        "test_c": rng.integers(0, 10, size=n_test, dtype=np.uint8),
    }
    images["train_x"][0, 0, 0], images["train_x"][0, 0, 1] = 0, 255
    return images


def write_idx_set(directory: Path, arrays: dict, gz: bool | dict = False) -> dict[str, Path]:
    paths = {}
    for part, file in data.IDX_FILES.items():
        zipped = gz[part] if isinstance(gz, dict) else gz
        paths[part] = directory / (file + (".gz" if zipped else ""))
        write_idx(paths[part], arrays[part])
    return paths


def assert_matches(ds: data.Dataset, arrays: dict) -> None:
    assert ds.image_shape == (ROWS, COLS)
    assert ds.input_dim == ROWS * COLS == ds.train.x.shape[1]
    assert ds.num_classes == 10
    for part in ("train", "test"):
        split = getattr(ds, part)
        expected = arrays[f"{part}_x"].reshape(len(split), -1).astype(np.float64) / 255.0
        assert split.x.dtype == np.float32 and split.c.dtype == np.int32
        np.testing.assert_allclose(split.x, expected, rtol=0, atol=1e-7)
        np.testing.assert_array_equal(split.c, arrays[f"{part}_c"])


# ----------------------------------------------------------------------------------- digits


def test_digits_shapes_range_and_stratified_split():
    ds = data.load_digits()
    assert ds.name == "digits" and ds.image_shape == (8, 8) and ds.input_dim == 64
    assert len(ds.train) + len(ds.test) == 1797
    assert len(ds.test) == 360
    for split in (ds.train, ds.test):
        assert split.x.dtype == np.float32 and split.c.dtype == np.int32
        assert split.x.shape == (len(split), 64)
        assert split.x.min() == 0.0 and split.x.max() == 1.0
    total = np.bincount(np.concatenate([ds.train.c, ds.test.c]), minlength=10)
    test = np.bincount(ds.test.c, minlength=10)
    assert np.all(np.abs(test - 0.2 * total) <= 1)
    again = data.load_digits()
    np.testing.assert_array_equal(again.train.x, ds.train.x)
    np.testing.assert_array_equal(again.test.c, ds.test.c)


def test_load_dispatches_on_name():
    assert data.load(DataConfig(name="digits")).name == "digits"
    ds = data.load(DataConfig(name="synthetic"))
    assert ds.name == "synthetic" and len(ds.train) == 512 and len(ds.test) == 128


# ----------------------------------------------------------------------------------- synthetic


def test_synthetic_form_and_determinism():
    ds = data.synthetic(num_train=100, num_test=30, image_shape=(3, 5), num_classes=4, seed=3)
    assert ds.train.x.shape == (100, 15) and ds.test.x.shape == (30, 15)
    assert ds.train.x.dtype == np.float32 and ds.train.c.dtype == np.int32
    assert (ds.train.x == 0).any() and (ds.train.x == 1).any()
    assert ds.train.x.min() >= 0 and ds.train.x.max() <= 1
    assert np.bincount(ds.train.c, minlength=4).tolist() == [25, 25, 25, 25]
    same = data.synthetic(num_train=100, num_test=30, image_shape=(3, 5), num_classes=4, seed=3)
    np.testing.assert_array_equal(same.train.x, ds.train.x)
    np.testing.assert_array_equal(same.test.c, ds.test.c)
    other = data.synthetic(num_train=100, num_test=30, image_shape=(3, 5), num_classes=4, seed=4)
    assert not np.array_equal(other.train.x, ds.train.x)
    with pytest.raises(ConfigError, match="synthetic.num_train"):
        data.synthetic(num_train=0)


# ----------------------------------------------------------------------------------- IDX files


@pytest.mark.parametrize(
    "gz", [False, True, {"train_x": True, "train_c": False, "test_x": False, "test_c": True}]
)
def test_idx_round_trip(tmp_path, gz):
    arrays = fake_mnist()
    write_idx_set(tmp_path, arrays, gz)
    ds = data.load_mnist(tmp_path)
    assert ds.name == "mnist"
    assert_matches(ds, arrays)


def test_idx_round_trip_through_load_and_fashion_name(tmp_path):
    arrays = fake_mnist(seed=1)
    write_idx_set(tmp_path, arrays, gz=True)
    ds = data.load(DataConfig(name="fashion_mnist", data_dir=str(tmp_path), batch_size=8))
    assert ds.name == "fashion_mnist"
    assert_matches(ds, arrays)


@pytest.mark.parametrize(
    ("blank", "name", "other"), [(0.81, "fashion_mnist", "MNIST"), (0.5, "mnist", "Fashion-MNIST")]
)
def test_files_of_the_other_set_are_named_in_a_warning(tmp_path, capsys, blank, name, other):
    arrays = fake_mnist(seed=2, n_train=40)
    for part in ("train_x", "test_x"):
        x = arrays[part]
        x[np.random.default_rng(3).random(x.shape) < blank] = 0
    write_idx_set(tmp_path, arrays)
    data.load_mnist(tmp_path, name=name)
    said = capsys.readouterr().err
    assert said.startswith(f"cvae: warning: {tmp_path}: these images look like {other}'s, not ")
    data.load_mnist(tmp_path, name="mnist" if name == "fashion_mnist" else "fashion_mnist")
    assert capsys.readouterr().err == ""  # named as what they look like: nothing to say


def test_plain_idx_file_wins_over_gz(tmp_path):
    arrays = fake_mnist()
    write_idx_set(tmp_path, arrays)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(20, 9, dtype=np.uint8))
    np.testing.assert_array_equal(data.load_mnist(tmp_path).train.c, arrays["train_c"])


def test_read_idx_returns_exact_array(tmp_path):
    array = np.arange(2 * 3 * 7, dtype=np.uint8).reshape(2, 3, 7)
    write_idx(tmp_path / "a", array)
    out = data.read_idx(tmp_path / "a")
    assert out.dtype == np.uint8 and out.shape == (2, 3, 7)
    np.testing.assert_array_equal(out, array)


def _bad_file(tmp_path, raw: bytes) -> Path:
    arrays = fake_mnist()
    paths = write_idx_set(tmp_path, arrays)
    paths["train_x"].write_bytes(raw)
    return paths["train_x"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: raw[:-1], "truncated"),
        (lambda raw: raw + b"\0", "trailing bytes"),
        (lambda raw: raw[:10], "expected a 16-byte IDX header"),
        (lambda raw: raw[:2], "at least 4 bytes"),
        (lambda raw: b"\x01" + raw[1:], "magic number"),
        (lambda raw: raw[:2] + b"\x0d" + raw[3:], "type code 0x08"),
    ],
)
def test_corrupt_idx_file_names_the_file(tmp_path, mutate, message):
    write_idx(tmp_path / "good", fake_mnist()["train_x"])
    path = _bad_file(tmp_path, mutate((tmp_path / "good").read_bytes()))
    with pytest.raises(DataError, match=message) as info:
        data.load_mnist(tmp_path)
    assert str(path) in str(info.value)


def test_truncated_gzip_names_the_file(tmp_path):
    arrays = fake_mnist()
    paths = write_idx_set(tmp_path, arrays, gz=True)
    raw = paths["test_c"].read_bytes()
    paths["test_c"].write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="readable IDX file") as info:
        data.load_mnist(tmp_path)
    assert str(paths["test_c"]) in str(info.value)


def test_idx_count_and_rank_mismatch(tmp_path):
    arrays = fake_mnist()
    arrays["test_c"] = arrays["test_c"][:9]
    paths = write_idx_set(tmp_path, arrays)
    with pytest.raises(DataError, match="expected 10 labels") as info:
        data.load_mnist(tmp_path)
    assert str(paths["test_c"]) in str(info.value)
    write_idx(paths["test_c"], np.zeros((10, 1), dtype=np.uint8))
    with pytest.raises(DataError, match="expected a 1-dimensional IDX file"):
        data.load_mnist(tmp_path)
    write_idx(paths["test_c"], np.zeros(10, dtype=np.uint8))
    write_idx(paths["test_x"], np.zeros((10, ROWS + 1, COLS), dtype=np.uint8))
    with pytest.raises(DataError, match=f"of {ROWS}x{COLS} pixels, got {ROWS + 1}x{COLS}"):
        data.load_mnist(tmp_path)


@pytest.mark.parametrize(
    ("part", "rank", "what"),
    [("train_x", 3, "images, [N, rows, cols]"), ("test_c", 1, "labels, [N]")],
)
def test_an_idx_header_claiming_another_rank_says_which_rank_was_expected(
    tmp_path, part, rank, what
):
    """A magic number claiming 9 dimensions: the error names the rank the file must have, not
    the byte count nine made-up dimensions would need."""
    paths = write_idx_set(tmp_path, fake_mnist())
    raw = bytearray(paths[part].read_bytes())
    raw[3] = 9
    paths[part].write_bytes(bytes(raw))
    with pytest.raises(DataError) as info:
        data.load_mnist(tmp_path)
    assert str(info.value) == (
        f"{paths[part]}: expected a {rank}-dimensional IDX file ({what}), got a header claiming "
        "9 dimensions"
    )


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
@pytest.mark.parametrize("form", ["idx", "npz-3d", "npz-flat"])
def test_images_that_are_not_28x28_are_refused(tmp_path, name, form):
    arrays = fake_mnist()
    small = np.zeros((10, 20, 20), np.uint8)
    title = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}[name]
    if form == "idx":
        paths = write_idx_set(tmp_path, {**arrays, "test_x": small})
        field = str(paths["test_x"])
    else:
        x = small if form == "npz-3d" else small.reshape(10, 400)
        _save_npz(tmp_path / data.NPZ_FILES[name], x_test=x)
        field = f"{tmp_path / data.NPZ_FILES[name]}: x_test"
    with pytest.raises(DataError) as info:
        data.load_mnist(tmp_path, name=name)
    assert str(info.value) == f"{field}: expected {title} images of 28x28 pixels, got 20x20"


def test_idx_label_out_of_range_is_refused(tmp_path):
    arrays = fake_mnist()
    arrays["train_c"][7] = 10
    paths = write_idx_set(tmp_path, arrays)
    with pytest.raises(InputError, match=r"mnist\.train\.c: expected labels in \[0, 10\)") as info:
        data.load_mnist(tmp_path)
    assert "got 10 at [7]" in str(info.value)
    assert str(paths["train_c"]) in str(info.value)


# ----------------------------------------------------------------------------------- NPZ files


def test_npz_round_trip_3d_and_flat(tmp_path):
    arrays = fake_mnist()
    np.savez(
        tmp_path / "mnist.npz",
        x_train=arrays["train_x"],
        y_train=arrays["train_c"],
        x_test=arrays["test_x"],
        y_test=arrays["test_c"],
    )
    assert_matches(data.load_mnist(tmp_path), arrays)
    square = fake_mnist(n_train=6, n_test=3)
    np.savez(
        tmp_path / "fashion_mnist.npz",
        x_train=np.zeros((6, 784), np.uint8),
        y_train=square["train_c"][:6].astype(np.int64),
        x_test=np.full((3, 784), 255, np.uint8),
        y_test=square["test_c"][:3],
    )
    ds = data.load_mnist(tmp_path, name="fashion_mnist")
    assert ds.image_shape == (28, 28) and ds.train.x.shape == (6, 784)
    assert ds.train.c.dtype == np.int32 and (ds.test.x == 1).all()


def test_idx_files_take_precedence_over_npz(tmp_path):
    arrays = fake_mnist()
    write_idx_set(tmp_path, arrays)
    (tmp_path / "mnist.npz").write_bytes(b"not an npz")
    assert_matches(data.load_mnist(tmp_path), arrays)


def _save_npz(path: Path, **overrides) -> None:
    arrays = fake_mnist()
    content = {
        "x_train": arrays["train_x"],
        "y_train": arrays["train_c"],
        "x_test": arrays["test_x"],
        "y_test": arrays["test_c"],
    }
    content.update(overrides)
    np.savez(path, **content)


def test_float_npz_images_are_taken_as_is_and_checked(tmp_path):
    x = np.random.default_rng(0).random((20, ROWS, COLS))
    _save_npz(tmp_path / "mnist.npz", x_train=x)
    ds = data.load_mnist(tmp_path)
    np.testing.assert_allclose(ds.train.x, x.reshape(20, -1).astype(np.float32))
    x[3, 1, 2] = np.nan
    _save_npz(tmp_path / "mnist.npz", x_train=x)
    with pytest.raises(InputError, match=r"mnist\.train\.x: expected finite values") as info:
        data.load_mnist(tmp_path)
    assert "mnist.npz" in str(info.value)
    x[3, 1, 2] = 1.5
    _save_npz(tmp_path / "mnist.npz", x_test=x[:10])
    with pytest.raises(InputError, match=r"mnist\.test\.x: expected values in \[0, 1\]"):
        data.load_mnist(tmp_path)


def test_npz_bad_contents(tmp_path):
    path = tmp_path / "mnist.npz"
    _save_npz(path, y_test=np.full(10, -1, dtype=np.int64))
    with pytest.raises(InputError, match=r"mnist\.test\.c: expected labels in \[0, 10\)"):
        data.load_mnist(tmp_path)
    _save_npz(path, y_test=np.full(10, 2**40, dtype=np.int64))
    with pytest.raises(DataError, match="fit in int32"):
        data.load_mnist(tmp_path)
    _save_npz(path, y_train=np.zeros(20, dtype=np.float32))
    with pytest.raises(DataError, match="y_train: expected integer labels"):
        data.load_mnist(tmp_path)
    _save_npz(path, x_train=np.zeros((20, 10), dtype=np.uint8))
    with pytest.raises(DataError, match="x_train: expected images of shape"):
        data.load_mnist(tmp_path)
    _save_npz(path, x_train=np.zeros((20, ROWS, COLS), dtype=np.int16))
    with pytest.raises(DataError, match="uint8 or floating images"):
        data.load_mnist(tmp_path)
    _save_npz(path, y_test=np.zeros(9, dtype=np.uint8))
    with pytest.raises(DataError, match="y_test: expected 10 labels"):
        data.load_mnist(tmp_path)
    np.savez(path, x_train=np.zeros((2, 2, 2), np.uint8))
    with pytest.raises(DataError, match="missing y_train, x_test, y_test"):
        data.load_mnist(tmp_path)
    path.write_bytes(b"definitely not a zip archive")
    with pytest.raises(DataError, match="readable NPZ file, got a damaged file") as info:
        data.load_mnist(tmp_path)
    assert str(path) in str(info.value)
    objects = np.empty(20, dtype=object)  # pickled: said so, never NumPy's advice to unpickle
    np.savez(path, x_train=objects, y_train=objects, x_test=objects, y_test=objects)
    with pytest.raises(DataError, match=r"arrays of Python objects \(pickled\)") as info:
        data.load_mnist(tmp_path)
    assert "allow_pickle" not in str(info.value)


# ----------------------------------------------------------------------------------- missing


def test_missing_files_lists_what_was_expected(tmp_path):
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", fake_mnist()["train_x"])
    with pytest.raises(DataError) as info:
        data.load_mnist(tmp_path, name="fashion_mnist")
    message = str(info.value)
    assert str(tmp_path) in message
    for file in data.IDX_FILES.values():
        assert file in message
    assert ".gz" in message and "fashion_mnist.npz" in message
    assert "found train-images-idx3-ubyte.gz" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="found none of them"):
        data.load_mnist(empty)


def test_missing_data_dir_and_bad_name(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.data_dir: expected a directory with MNIST files"):
        data.load_mnist(None)
    with pytest.raises(ConfigError, match="data.data_dir: .*got None"):
        data.load(DataConfig(name="mnist"))
    with pytest.raises(DataError, match="data.data_dir: expected an existing directory"):
        data.load_mnist(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="data.name"):
        data.load_mnist(tmp_path, name="digits")


# ----------------------------------------------------------------------------------- checks


def _tiny(x: np.ndarray, c: np.ndarray) -> data.Dataset:
    good = data.Split(np.zeros((2, 4), np.float32), np.zeros(2, np.int32))
    return data.Dataset("tiny", data.Split(x, c), good, num_classes=3, image_shape=(2, 2))


def test_check_dataset_refuses_bad_splits():
    ok_x, ok_c = np.full((3, 4), 0.5, np.float32), np.array([0, 1, 2], np.int32)
    data.check_dataset(_tiny(ok_x, ok_c))
    cases = [
        (ok_x.astype(np.float64), ok_c, r"tiny\.train\.x: expected dtype float32"),
        (ok_x, ok_c.astype(np.int64), r"tiny\.train\.c: expected dtype int32"),
        (ok_x.astype(np.uint8), ok_c, r"tiny\.train\.x: expected a floating dtype"),
        (np.full((3, 5), 0.5, np.float32), ok_c, r"tiny\.train\.x: expected 4 features"),
        (np.where(np.eye(3, 4) > 0, np.inf, 0.5).astype(np.float32), ok_c, "finite"),
        (ok_x, np.array([0, 3, 1], np.int32), r"tiny\.train\.c: expected labels in \[0, 3\)"),
        (ok_x, np.array([0, 1], np.int32), r"tiny\.train\.c: expected 3 labels"),
    ]
    for x, c, message in cases:
        with pytest.raises(InputError, match=message):
            data.check_dataset(_tiny(x, c))


def test_check_batch_size():
    ds = data.synthetic(num_train=40, num_test=8)
    data.check_batch_size(ds, 40)
    with pytest.raises(
        ConfigError,
        match=r"data\.batch_size: expected at most 40 \(the training examples of synthetic\), "
        r"got 41",
    ):
        data.check_batch_size(ds, 41)


# ----------------------------------------------------------------------------------- batching


@pytest.fixture(scope="module")
def split() -> data.Split:
    return data.synthetic(num_train=23, num_test=5, image_shape=(2, 3), seed=1).train


def _rows(xs: jax.Array, split: data.Split) -> np.ndarray:
    """The index in ``split`` of every row of ``xs`` (rows of the synthetic split are unique)."""
    lookup = {row.tobytes(): i for i, row in enumerate(split.x)}
    assert len(lookup) == len(split)
    flat = np.asarray(xs).reshape(-1, split.x.shape[1])
    return np.array([lookup[row.tobytes()] for row in flat])


def test_drop_batches_each_example_at_most_once(split):
    batches = data.EpochBatches(split, 5, "drop")
    assert batches.num_batches == len(batches) == 4
    xs, cs = batches.epoch(jax.random.key(0))
    assert xs.shape == (4, 5, 6) and cs.shape == (4, 5)
    assert xs.dtype == np.float32 and cs.dtype == np.int32
    idx = _rows(xs, split)
    assert len(set(idx.tolist())) == 20
    np.testing.assert_array_equal(np.asarray(cs).reshape(-1), split.c[idx])


def test_pad_batches_each_example_at_least_once(split):
    batches = data.EpochBatches(split, 5, "pad")
    assert batches.num_batches == 5
    key = jax.random.key(1)
    xs, cs = batches.epoch(key)
    assert xs.shape == (5, 5, 6) and cs.shape == (5, 5)
    idx = _rows(xs, split)
    assert set(idx.tolist()) == set(range(23))
    order = np.asarray(jax.random.permutation(key, 23))
    np.testing.assert_array_equal(idx, np.concatenate([order, order[:2]]))
    np.testing.assert_array_equal(np.asarray(cs).reshape(-1), split.c[idx])


def test_exact_multiple_gives_same_count_for_both(split):
    assert data.EpochBatches(split, 23, "drop").num_batches == 1
    assert data.EpochBatches(split, 23, "pad").num_batches == 1
    assert data.EpochBatches(split, 1, "pad").num_batches == 23


def test_keys_decide_the_order_and_shapes_compile_once(split):
    batches = data.EpochBatches(split, 4, "drop")
    first = batches.epoch(jax.random.key(0))
    before = data._gather_epoch._cache_size()
    same = batches.epoch(jax.random.key(0))
    raw = batches.epoch(jax.random.PRNGKey(0))
    other = batches.epoch(jax.random.key(1))
    for key in range(2, 6):
        batches.epoch(jax.random.key(key))
    assert data._gather_epoch._cache_size() == before
    np.testing.assert_array_equal(first[0], same[0])
    np.testing.assert_array_equal(first[1], raw[1])
    assert not np.array_equal(np.asarray(first[0]), np.asarray(other[0]))
    assert other[0].shape == first[0].shape
    assert isinstance(first[0], jax.Array)


def test_epoch_batches_refuses_bad_arguments(split):
    with pytest.raises(ConfigError, match="data.batch_size: expected at most 23"):
        data.EpochBatches(split, 24, "drop")
    with pytest.raises(ConfigError, match="data.batch_size: expected an integer >= 1"):
        data.EpochBatches(split, 0, "pad")
    with pytest.raises(ConfigError, match="data.remainder"):
        data.EpochBatches(split, 4, "wrap")
    with pytest.raises(InputError, match="key"):
        data.EpochBatches(split, 4).epoch(jax.random.split(jax.random.key(0), 2))


def test_eval_batches_in_order(split):
    chunks = data.eval_batches(split, 10)
    assert [x.shape[0] for x, _ in chunks] == [10, 10, 3]
    assert all(isinstance(x, jax.Array) and isinstance(c, jax.Array) for x, c in chunks)
    np.testing.assert_array_equal(np.concatenate([np.asarray(x) for x, _ in chunks]), split.x)
    np.testing.assert_array_equal(np.concatenate([np.asarray(c) for _, c in chunks]), split.c)
    assert len(data.eval_batches(split, 100)) == 1
    with pytest.raises(ConfigError, match="data.batch_size"):
        data.eval_batches(split, 0)


def test_the_digits_split_is_kept_and_read_back_without_scikit_learn(tmp_path):
    """The digits read from scikit-learn's file and split once by scikit-learn equal what
    scikit-learn itself returns; a second process reads the split from the data cache and never
    imports scikit-learn; a damaged cache file is passed over and written again."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    x, y = sk_load_digits(return_X_y=True)
    x = (np.asarray(x, dtype=np.float64) / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    script = (
        "import sys, numpy as np\n"
        "from cvae_rosetta.app import data\n"
        "ds = data.load_digits()\n"
        "np.savez(sys.argv[1], xtr=ds.train.x, xte=ds.test.x, ytr=ds.train.c, yte=ds.test.c)\n"
        "print('sklearn' in sys.modules)\n"
    )
    env = {**os.environ, "CVAE_DATA_CACHE": str(tmp_path / "cache")}

    def load(name: str):
        out = tmp_path / f"{name}.npz"
        run = subprocess.run(
            [sys.executable, "-c", script, str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        with np.load(out) as got:
            for key, want in (("xtr", x_tr), ("xte", x_te), ("ytr", y_tr), ("yte", y_te)):
                np.testing.assert_array_equal(got[key], want)
        return run.stdout.strip() == "True"

    assert load("first")  # scikit-learn computed the split
    [kept] = (tmp_path / "cache").glob("digits-split-scikit-learn-*.npz")
    assert not load("second")  # read back: scikit-learn never imported
    kept.write_bytes(b"not an npz")
    assert load("damaged")  # computed again
    assert not load("rewritten")
