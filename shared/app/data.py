"""Data sets and device-resident batching.

A :class:`Dataset` holds a train and a test :class:`Split` as host numpy arrays: pixels
``x: float32[N, D]`` in [0, 1] (images flattened row-major) and labels ``c: int32[N]``. Every
loader checks what it returns with :func:`check_dataset` (the host-side value checks of SPEC
section 7), so a bad file is refused before any array reaches a model.

Data sets:

* ``digits``: scikit-learn's bundled 8x8 digits (no download), a fixed stratified 80/20 split.
* ``mnist`` / ``fashion_mnist``: read from a local directory, either the four IDX files (each
  plain or gzipped; a plain file wins over its ``.gz``) or, when those are not all there, one NPZ
  file in the Keras layout. Nothing is downloaded.
* ``synthetic``: small deterministic random data of the right form, for tests.

:class:`EpochBatches` keeps a split on the device and cuts one shuffled epoch into equally shaped
batches with one jitted gather; :func:`eval_batches` cuts a split in order for evaluation.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib.metadata
import importlib.util
import math
import os
import struct
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.spec.config import REMAINDERS, DataConfig
from cvae_rosetta.spec.errors import ConfigError, DataError, InputError, field_error
from cvae_rosetta.spec.validation import check_features, check_labels

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_c": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_c": "t10k-labels-idx1-ubyte",
}
"""The four IDX file names of MNIST and Fashion-MNIST (each may also end in ``.gz``)."""

NPZ_FILES = {"mnist": "mnist.npz", "fashion_mnist": "fashion_mnist.npz"}
"""The NPZ alternative per data set, with keys ``x_train, y_train, x_test, y_test``."""

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")

_TITLES = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}
IMAGE_SHAPE = (28, 28)
"""The image size of MNIST and Fashion-MNIST; other sizes are refused under those names."""
IDX_RANKS = {"train_x": 3, "train_c": 1, "test_x": 3, "test_c": 1}
"""How many dimensions each IDX file has: images ``[N, rows, cols]``, labels ``[N]``."""
_IDX_WHAT = {3: "images, [N, rows, cols]", 1: "labels, [N]"}
_IDX_UBYTE = 0x08
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True, eq=False)
class Split:
    """One split: ``x: float32[N, D]`` pixels in [0, 1] and ``c: int32[N]`` labels."""

    x: np.ndarray
    c: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True, eq=False)
class Dataset:
    """A named data set: train and test splits, the class count and the image shape."""

    name: str
    train: Split
    test: Split
    num_classes: int
    image_shape: tuple[int, int]

    @property
    def input_dim(self) -> int:
        """Pixels per image, ``rows * cols``: the width of ``x``."""
        return int(self.image_shape[0] * self.image_shape[1])


# ----------------------------------------------------------------------------------- checks


def check_dataset(ds: Dataset) -> None:
    """Refuse a data set whose splits break SPEC section 7 or the :class:`Split` dtypes.

    Raises :class:`~cvae_rosetta.spec.errors.InputError` naming the field, e.g. ``digits.train.x``.
    """
    for part in ("train", "test"):
        split = getattr(ds, part)
        field = f"{ds.name}.{part}"
        check_features(split.x, ds.input_dim, field=f"{field}.x")
        if split.x.dtype != np.float32:
            raise InputError(f"{field}.x: expected dtype float32, got dtype {split.x.dtype}")
        check_labels(split.c, ds.num_classes, rows=split.x.shape[0], field=f"{field}.c")
        if split.c.dtype != np.int32:
            raise InputError(f"{field}.c: expected dtype int32, got dtype {split.c.dtype}")


def check_batch_size(ds: Dataset, batch_size: int) -> None:
    """Refuse a ``batch_size`` larger than the training split (it would give no batch)."""
    _check_batch_size(batch_size, len(ds.train), f"the training examples of {ds.name}")


def _check_batch_size(batch_size: Any, n: int | None, what: str = "") -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise field_error(ConfigError, "data.batch_size", "an integer >= 1", batch_size)
    if batch_size < 1:
        raise field_error(ConfigError, "data.batch_size", "an integer >= 1", batch_size)
    if n is not None and batch_size > n:
        raise field_error(ConfigError, "data.batch_size", f"at most {n} ({what})", batch_size)


# ----------------------------------------------------------------------------------- loaders


def load(data: DataConfig) -> Dataset:
    """The data set ``data.name`` names, checked with :func:`check_dataset`.

    ``data.data_dir`` is used by ``mnist`` and ``fashion_mnist`` only; ``synthetic`` takes the
    defaults of :func:`synthetic`.
    """
    if data.name == "digits":
        return load_digits()
    if data.name in NPZ_FILES:
        return load_mnist(data.data_dir, name=data.name)
    if data.name == "synthetic":
        return synthetic()
    raise field_error(
        ConfigError, "data.name", "one of digits, mnist, fashion_mnist, synthetic", data.name
    )


# Where the digits' split is kept between runs: a folder, or "off" (default: beside the
# compilation cache, $XDG_CACHE_HOME/cvae-rosetta/data or ~/.cache/cvae-rosetta/data).
DATA_CACHE_ENV = "CVAE_DATA_CACHE"
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")  # in scikit-learn's package folder


def load_digits() -> Dataset:
    """scikit-learn's bundled digits: 1797 8x8 images scaled from 0..16 to [0, 1].

    The split is fixed: stratified by class, 20% test, ``random_state=0``
    (``sklearn.model_selection.train_test_split``). Importing scikit-learn takes about a second, so
    the images are read from its data file directly and the split's indices are kept in
    :data:`DATA_CACHE_ENV`'s folder, one file per scikit-learn version: a later run reads them
    instead of importing scikit-learn.
    """
    x, y = _digits_arrays()
    x = (np.asarray(x, dtype=np.float64) / 16.0).astype(np.float32)
    y = np.asarray(y).astype(np.int32)
    train, test = _digits_split(y)
    x_tr, x_te, y_tr, y_te = x[train], x[test], y[train], y[test]
    ds = Dataset(
        name="digits",
        train=Split(np.ascontiguousarray(x_tr), np.ascontiguousarray(y_tr)),
        test=Split(np.ascontiguousarray(x_te), np.ascontiguousarray(y_te)),
        num_classes=10,
        image_shape=(8, 8),
    )
    check_dataset(ds)
    return ds


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits' images and labels as ``sklearn.datasets.load_digits`` reads them (a CSV whose
    last column is the label), from scikit-learn's own file, without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder).joinpath(*DIGITS_FILE)
        if path.is_file():
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int)
    from sklearn.datasets import load_digits as sk_load_digits  # laid out otherwise

    return sk_load_digits(return_X_y=True)


def data_cache_folder(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """The folder of :data:`DATA_CACHE_ENV` (None: ``off``)."""
    given = environ.get(DATA_CACHE_ENV, "").strip()
    if given.lower() == "off":
        return None
    if given:
        return Path(given).expanduser()
    from cvae_rosetta.app import cache

    return cache.user_folder(environ) / "data"


# what reading a kept file may raise where it is damaged or not ours: it is computed again
UNREADABLE = (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError)


def kept_file(stem: str) -> Path | None:
    """Where something scikit-learn computed is kept between runs: ``STEM-scikit-learn-VERSION.npz``
    in :func:`data_cache_folder` (None: no cache, or scikit-learn not installed)."""
    folder = data_cache_folder()
    try:
        version = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        return None
    return folder / f"{stem}-scikit-learn-{version}.npz" if folder else None


def keep(path: Path | None, **arrays: np.ndarray) -> None:
    """``arrays`` written to ``path`` (from :func:`kept_file`) atomically; a cache that cannot be
    written is passed over, and the next run computes them again."""
    if path is not None:
        from cvae_rosetta import files

        with contextlib.suppress(OSError):
            files.atomic_write(path, lambda f: np.savez(f, **arrays), parents=True)


def _digits_split(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The train and test indices of the digits' split, read from the data cache when it holds
    them for this scikit-learn version, else computed by scikit-learn and kept there."""
    path = kept_file("digits-split")
    if path is not None and path.is_file():
        try:
            with np.load(path) as kept:
                train, test = kept["train"], kept["test"]
            both = np.sort(np.concatenate([train, test]))
            if len(test) == math.ceil(0.2 * len(y)) and np.array_equal(both, np.arange(len(y))):
                return train, test
        except UNREADABLE:
            pass  # damaged or not ours: computed again below
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)
    keep(path, train=train, test=test)
    return train, test


def load_mnist(data_dir: str | os.PathLike[str] | None, name: str = "mnist") -> Dataset:
    """MNIST or Fashion-MNIST (``name``) from the local directory ``data_dir``.

    Reads the four IDX files of :data:`IDX_FILES` (each plain or ``.gz``) when all are present,
    otherwise ``data_dir / NPZ_FILES[name]``. NPZ images are ``[N, rows, cols]`` or ``[N, D]``
    with D a perfect square; either way they must be 28x28 pixels (:data:`IMAGE_SHAPE`). uint8
    images are divided by 255, floating images are taken as already in [0, 1] (and refused if
    they are not, or are not finite). Labels are integers.

    Raises :class:`~cvae_rosetta.spec.errors.ConfigError` when ``data_dir`` is None,
    :class:`~cvae_rosetta.spec.errors.DataError` when the files are missing or malformed (naming
    the file) and :class:`~cvae_rosetta.spec.errors.InputError` when their values break SPEC
    section 7.
    """
    if name not in NPZ_FILES:
        raise field_error(ConfigError, "data.name", "mnist or fashion_mnist", name)
    title = _TITLES[name]
    wanted = f"the four IDX files or {NPZ_FILES[name]}"
    if data_dir is None:
        raise field_error(
            ConfigError, "data.data_dir", f"a directory with {title} files ({wanted})", None
        )
    directory = Path(data_dir)
    if not directory.is_dir():
        raise field_error(DataError, "data.data_dir", "an existing directory", str(directory))

    idx_paths = {part: _find_idx(directory, file) for part, file in IDX_FILES.items()}
    npz_path = directory / NPZ_FILES[name]
    if all(p is not None for p in idx_paths.values()):
        paths: dict[str, Path] = {k: p for k, p in idx_paths.items() if p is not None}
        arrays = {part: read_idx(path, rank=IDX_RANKS[part]) for part, path in paths.items()}
        source = {part: str(path) for part, path in paths.items()}
        fields = source
        train = _idx_split(arrays["train_x"], arrays["train_c"], paths["train_x"], paths["train_c"])
        test = _idx_split(arrays["test_x"], arrays["test_c"], paths["test_x"], paths["test_c"])
    elif npz_path.is_file():
        train, test = _npz_splits(npz_path)
        source = dict.fromkeys(("train_x", "train_c", "test_x", "test_c"), str(npz_path))
        fields = {part: f"{npz_path}: {key}" for part, key in zip(IDX_FILES, NPZ_KEYS, strict=True)}
    else:
        found = sorted(str(p.name) for p in idx_paths.values() if p is not None)
        idx_names = ", ".join(IDX_FILES.values())
        raise DataError(
            f"{directory}: expected {title} files: either the four IDX files {idx_names} "
            f"(each plain or with .gz) or {NPZ_FILES[name]}; found "
            f"{', '.join(found) if found else 'none of them'}"
        )

    (train_split, rows, cols), (test_split, t_rows, t_cols) = train, test
    for part, shape in (("train_x", (rows, cols)), ("test_x", (t_rows, t_cols))):
        if shape != IMAGE_SHAPE:
            raise DataError(
                f"{fields[part]}: expected {title} images of {IMAGE_SHAPE[0]}x{IMAGE_SHAPE[1]} "
                f"pixels, got {shape[0]}x{shape[1]}"
            )
    ds = Dataset(name, train_split, test_split, num_classes=10, image_shape=(rows, cols))
    try:
        check_dataset(ds)
    except InputError as err:
        part = str(err).split(":", 1)[0].removeprefix(f"{name}.").replace(".", "_")
        raise InputError(f"{err} (read from {source.get(part, directory)})") from err
    if (other := _looks_like(ds.train.x)) not in (None, name):
        print(
            f"cvae: warning: {directory}: these images look like {_TITLES[other]}'s, not "
            f"{title}'s ({np.mean(ds.train.x == 0):.0%} of the training pixels are blank; MNIST "
            "has about 81%, Fashion-MNIST about 50%)",
            file=sys.stderr,
        )
    return ds


def _looks_like(x: np.ndarray) -> str | None:
    """Which of the two sets training images look like by their share of blank pixels (0): MNIST's
    digits leave about 81% blank, Fashion-MNIST's clothes about 50%; ``None`` for anything else
    (made-up images, noise)."""
    blank = float(np.mean(x == 0))
    if blank > 0.7:
        return "mnist"
    return "fashion_mnist" if 0.35 < blank < 0.65 else None


def synthetic(
    num_train: int = 512,
    num_test: int = 128,
    image_shape: tuple[int, int] = (8, 8),
    num_classes: int = 10,
    seed: int = 0,
) -> Dataset:
    """Deterministic random data for tests: per-class prototype images plus noise.

    Pixels are clipped to [0, 1], so exact 0s and 1s occur; labels cycle through the classes
    and are shuffled. The same arguments always give the same arrays.
    """
    for field, value in (
        ("num_train", num_train),
        ("num_test", num_test),
        ("num_classes", num_classes),
        ("seed", seed),
    ):
        minimum = 0 if field == "seed" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise field_error(ConfigError, f"synthetic.{field}", f"an integer >= {minimum}", value)
    shape = tuple(image_shape)
    if len(shape) != 2 or not all(isinstance(v, int) and v >= 1 for v in shape):
        raise field_error(ConfigError, "synthetic.image_shape", "two integers >= 1", image_shape)
    rows, cols = shape
    rng = np.random.default_rng(seed)
    prototypes = rng.random((num_classes, rows * cols))

    def make(n: int) -> Split:
        c = rng.permutation(np.arange(n) % num_classes).astype(np.int32)
        x = prototypes[c] + rng.normal(0.0, 0.25, size=(n, rows * cols))
        return Split(np.clip(x, 0.0, 1.0).astype(np.float32), c)

    ds = Dataset("synthetic", make(num_train), make(num_test), num_classes, (rows, cols))
    check_dataset(ds)
    return ds


# ----------------------------------------------------------------------------------- IDX / NPZ


def read_idx(path: str | os.PathLike[str], *, rank: int | None = None) -> np.ndarray:
    """An unsigned-byte IDX file (plain, or gzipped when the name ends in ``.gz``) as uint8.

    The header is two zero bytes, the type code 0x08, the rank, then one big-endian uint32 per
    dimension; the rank must be ``rank`` when given (3 for images, 1 for labels), and the file
    must hold exactly the bytes the dimensions call for. Anything else raises
    :class:`~cvae_rosetta.spec.errors.DataError` naming the file.
    """
    path = Path(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(
            f"{path}: expected a readable IDX file, got {type(err).__name__}: {err}"
        ) from err
    if len(raw) < 4:
        raise DataError(f"{path}: expected an IDX header of at least 4 bytes, got {len(raw)}")
    if raw[0] != 0 or raw[1] != 0:
        raise DataError(
            f"{path}: expected an IDX magic number starting with two zero bytes, "
            f"got 0x{int.from_bytes(raw[:4], 'big'):08x}"
        )
    if raw[2] != _IDX_UBYTE:
        raise DataError(f"{path}: expected IDX type code 0x08 (unsigned byte), got 0x{raw[2]:02x}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if rank is not None and ndim != rank:
        what = f" ({_IDX_WHAT[rank]})" if rank in _IDX_WHAT else ""
        raise DataError(
            f"{path}: expected a {rank}-dimensional IDX file{what}, got a header claiming {ndim} "
            "dimensions"
        )
    if ndim == 0:
        raise DataError(f"{path}: expected an IDX rank of at least 1, got 0")
    if len(raw) < header:
        raise DataError(
            f"{path}: expected a {header}-byte IDX header for rank {ndim}, got {len(raw)} bytes"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    size = math.prod(dims)
    if len(raw) != header + size:
        what = "truncated" if len(raw) < header + size else "trailing bytes"
        raise DataError(
            f"{path}: expected {header + size} bytes for dimensions {dims}, got {len(raw)} ({what})"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find_idx(directory: Path, file: str) -> Path | None:
    for candidate in (directory / file, directory / f"{file}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _idx_split(
    images: np.ndarray, labels: np.ndarray, images_path: Path, labels_path: Path
) -> tuple[Split, int, int]:
    if images.ndim != 3 or images.shape[1] < 1 or images.shape[2] < 1:
        raise DataError(
            f"{images_path}: expected images of rank 3, [N, rows, cols], got dimensions "
            f"{images.shape}"
        )
    if labels.ndim != 1:
        raise DataError(
            f"{labels_path}: expected labels of rank 1, [N], got dimensions {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise DataError(
            f"{labels_path}: expected {images.shape[0]} labels, one per image in "
            f"{images_path.name}, got {labels.shape[0]}"
        )
    n, rows, cols = images.shape
    x = images.reshape(n, rows * cols).astype(np.float32) / np.float32(255.0)
    return Split(x, labels.astype(np.int32)), rows, cols


def _npz_problem(err: BaseException) -> str:
    """What is wrong with an NPZ file, in the user's terms: NumPy's own message about pickles
    advises loading them unsafely, which this project never does."""
    if "Object arrays" in str(err):
        return "arrays of Python objects (pickled), which are never loaded: save plain arrays"
    if "allow_pickle" in str(err):  # neither a zip archive nor an array: NumPy guesses a pickle
        return "a damaged file, or another format (not a zip archive of arrays)"
    return f"a damaged file ({type(err).__name__}: {err})"


def _npz_splits(path: Path) -> tuple[tuple[Split, int, int], tuple[Split, int, int]]:
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        raise DataError(f"{path}: expected a readable NPZ file, got {_npz_problem(err)}") from err
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: expected an NPZ archive of named arrays, got a single array")
    with npz:
        missing = [k for k in NPZ_KEYS if k not in npz.files]
        if missing:
            raise DataError(
                f"{path}: expected the keys {', '.join(NPZ_KEYS)}, got "
                f"{', '.join(sorted(npz.files)) or 'no arrays'} (missing {', '.join(missing)})"
            )
        try:
            arrays = {k: npz[k] for k in NPZ_KEYS}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            raise DataError(f"{path}: expected readable arrays, got {_npz_problem(err)}") from err
    train = _npz_split(path, "train", arrays["x_train"], arrays["y_train"])
    test = _npz_split(path, "test", arrays["x_test"], arrays["y_test"])
    return train, test


def _npz_split(
    path: Path, part: str, images: np.ndarray, labels: np.ndarray
) -> tuple[Split, int, int]:
    xk, yk = f"x_{part}", f"y_{part}"
    if images.ndim == 3:
        n, rows, cols = images.shape
    elif images.ndim == 2 and math.isqrt(images.shape[1]) ** 2 == images.shape[1]:
        n, rows, cols = images.shape[0], math.isqrt(images.shape[1]), math.isqrt(images.shape[1])
    else:
        raise DataError(
            f"{path}: {xk}: expected images of shape [N, rows, cols] or [N, D] with D a perfect "
            f"square, got shape {images.shape}"
        )
    if rows < 1 or cols < 1:
        raise DataError(
            f"{path}: {xk}: expected images of at least 1x1 pixels, got shape {images.shape}"
        )
    flat = images.reshape(n, rows * cols)
    if images.dtype == np.uint8:
        x = flat.astype(np.float32) / np.float32(255.0)
    elif np.issubdtype(images.dtype, np.floating):
        x = flat.astype(np.float32)
    else:
        raise DataError(
            f"{path}: {xk}: expected uint8 or floating images, got dtype {images.dtype}"
        )
    if labels.ndim != 1 or labels.shape[0] != n:
        raise DataError(
            f"{path}: {yk}: expected {n} labels of shape [{n}], one per image, got "
            f"shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: {yk}: expected integer labels, got dtype {labels.dtype}")
    if labels.size and (int(labels.min()) < _INT32.min or int(labels.max()) > _INT32.max):
        raise DataError(
            f"{path}: {yk}: expected labels that fit in int32, got values in "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    return Split(x, labels.astype(np.int32)), rows, cols


# ----------------------------------------------------------------------------------- batching


def _as_key(key: Any) -> jax.Array:
    """A typed PRNG key from a new-style key or a raw ``uint32[2]`` (``PRNGKey``) key."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        typed = key
    else:
        try:
            typed = jax.random.wrap_key_data(jnp.asarray(key, dtype=jnp.uint32))
        except (TypeError, ValueError) as err:
            raise field_error(InputError, "key", "a PRNG key from jax.random.key", key) from err
    if typed.shape != ():
        raise field_error(InputError, "key", "a single PRNG key (shape ())", key)
    return typed


def batches_per_epoch(num_examples: int, batch_size: int, remainder: str = "drop") -> int:
    """The batches of one epoch over ``num_examples`` rows, a step each: a partial last batch is
    dropped (``remainder="drop"``) or padded to a full one (``"pad"``), as :class:`EpochBatches`
    cuts them."""
    return num_examples // batch_size if remainder == "drop" else -(-num_examples // batch_size)


@functools.partial(jax.jit, static_argnames=("num_batches", "batch_size"))
def _gather_epoch(
    key: jax.Array, x: jax.Array, c: jax.Array, *, num_batches: int, batch_size: int
) -> tuple[jax.Array, jax.Array]:
    n = x.shape[0]
    order = jax.random.permutation(key, n)
    # Position i of the epoch takes permutation entry i mod n: for drop there are at most n
    # positions (a prefix of the permutation), for pad the tail wraps to the permutation's start.
    idx = order[np.arange(num_batches * batch_size) % n]
    xs = jnp.take(x, idx, axis=0).reshape(num_batches, batch_size, x.shape[1])
    cs = jnp.take(c, idx, axis=0).reshape(num_batches, batch_size)
    return xs, cs


class EpochBatches:
    """A split on the default device, cut into shuffled, equally shaped batches per epoch.

    ``epoch(key)`` draws ``jax.random.permutation(key, N)`` and gathers, on the device, the
    batches ``xs: float32[num_batches, B, D]`` and ``cs: int32[num_batches, B]``:

    * ``remainder="drop"``: ``num_batches = N // B``; the first ``num_batches * B`` entries of the
      permutation are used, so each example appears at most once per epoch.
    * ``remainder="pad"``: ``num_batches = ceil(N / B)``; the permutation is extended by wrapping
      around to its start until the last batch is full, so each example appears at least once
      (and the first ``num_batches * B - N`` of the permutation twice).

    The gather is one jitted function, compiled once per shape and reused by every epoch and
    every instance with the same shapes. The same key gives the same batches.
    """

    def __init__(self, split: Split, batch_size: int, remainder: str = "drop") -> None:
        if remainder not in REMAINDERS:
            raise field_error(
                ConfigError, "data.remainder", f"one of {', '.join(REMAINDERS)}", remainder
            )
        n = len(split)
        _check_batch_size(batch_size, n, "the examples in the split")
        if split.c.shape != (n,):
            raise InputError(
                f"c: expected {n} labels, one per row of x, got shape {tuple(split.c.shape)}"
            )
        self.batch_size = int(batch_size)
        self.remainder = remainder
        self.num_batches = batches_per_epoch(n, self.batch_size, remainder)
        self.x = jax.device_put(np.asarray(split.x))
        self.c = jax.device_put(np.asarray(split.c))

    def __len__(self) -> int:
        return self.num_batches

    def epoch(self, key: Any) -> tuple[jax.Array, jax.Array]:
        """``(xs, cs)`` of one epoch shuffled by ``key`` (new-style or raw ``PRNGKey`` key)."""
        return _gather_epoch(
            _as_key(key), self.x, self.c, num_batches=self.num_batches, batch_size=self.batch_size
        )


def eval_batches(split: Split, batch_size: int) -> list[tuple[jax.Array, jax.Array]]:
    """The split in order, on the device, in chunks of ``batch_size`` (the last may be smaller).

    Weighting each chunk's mean by its row count gives the exact mean over the split.
    """
    _check_batch_size(batch_size, None)
    n = len(split)
    return [
        (jax.device_put(split.x[i : i + batch_size]), jax.device_put(split.c[i : i + batch_size]))
        for i in range(0, n, int(batch_size))
    ]
