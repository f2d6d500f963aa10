"""Tests of cvae_rosetta.app.images and cvae_rosetta.app.charts: every writer makes a PNG of the
documented size and content."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cvae_rosetta.app import charts, images
from cvae_rosetta.app.charts import CURVE_DPI, LEGEND_WIDTH, PANEL_SIZE
from cvae_rosetta.app.images import (
    BACKGROUND,
    CAPTION_HEIGHT,
    COMBINE_PAD,
    GAP,
    GROUP_GAP,
    LABEL_WIDTH,
    TITLE_HEIGHT,
)
from cvae_rosetta.spec.errors import InputError

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)


def _open(path: Path) -> Image.Image:
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()
        return image.convert("RGB")


def _only(tmp_path: Path, *names: str) -> None:
    """``tmp_path`` holds exactly ``names``: no temporary file was left behind."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def _cell(image: Image.Image, r: int, c: int, cell: tuple[int, int], *, top: int = 0):
    """The pixels of the cell in row ``r``, column ``c`` of a grid with the default label column."""
    h, w = cell
    x = LABEL_WIDTH + GAP + c * (w + GAP)
    y = top + GAP + r * (h + GAP)
    block = np.asarray(image)[y : y + h, x : x + w]
    assert block.shape == (h, w, 3)
    return block


def _curves(runs=("pure_jax", "flax"), points: int = 5):
    return {
        run: {
            "train loss": [(s, 100.0 / (s + 1) + k) for s in range(points)],
            "test loss": [(s, 110.0 / (s + 1) + k) for s in range(0, points, 2)],
            "train recon": [(s, 90.0 / (s + 1) + k) for s in range(points)],
            "test kl": [(s, 10.0 + k) for s in range(points)],
        }
        for k, run in enumerate(runs)
    }


# -- sample_grid ---------------------------------------------------------------------------------


def test_sample_grid_size_rows_and_cell_content(tmp_path: Path) -> None:
    # Label 0: white, black, white; label 2: mid grey; label 5: black, white.
    ones, zeros, half = np.ones(64), np.zeros(64), np.full(64, 0.5)
    x = np.stack([zeros, ones, zeros, half, ones, ones]).astype(np.float32)
    c = np.array([5, 0, 0, 2, 5, 0])
    out = images.sample_grid(x, c, (8, 8), tmp_path / "s.png", scale=3)
    assert out == tmp_path / "s.png"
    image = _open(out)
    rows, cols, cell = 3, 3, (24, 24)
    assert image.size == (
        LABEL_WIDTH + cols * 24 + (cols + 1) * GAP,
        rows * 24 + (rows + 1) * GAP,
    )
    assert (_cell(image, 0, 0, cell) == WHITE).all()  # label 0, first sample
    assert (_cell(image, 0, 1, cell) == BLACK).all()
    assert (_cell(image, 0, 2, cell) == WHITE).all()
    assert (_cell(image, 1, 0, cell) == 128).all()  # label 2: 0.5 -> 128
    assert (_cell(image, 1, 1, cell) == BACKGROUND).all()  # label 2 has one sample only
    assert (_cell(image, 2, 0, cell) == BLACK).all()  # label 5
    assert (_cell(image, 2, 1, cell) == WHITE).all()
    # The gap between two cells is background.
    gap_x = LABEL_WIDTH + GAP + 24
    assert tuple(np.asarray(image)[GAP + 5, gap_x]) == BACKGROUND
    # Row labels are drawn in the label column (some dark pixels there).
    assert (np.asarray(image)[:, :LABEL_WIDTH] < 100).any()
    _only(tmp_path, "s.png")


def test_sample_grid_nearest_neighbour_upscaling_and_clipping(tmp_path: Path) -> None:
    pattern = np.array([[0.0, 1.0], [2.0, -1.0]])  # 2 clips to white, -1 to black
    out = images.sample_grid(pattern.reshape(1, 4), np.array([3]), (2, 2), tmp_path / "p.png")
    scale = images.default_scale((2, 2))
    block = _cell(_open(out), 0, 0, (2 * scale, 2 * scale))[:, :, 0]
    expected = np.kron(np.array([[0, 255], [255, 0]]), np.ones((scale, scale)))
    assert (block == expected).all()


def test_sample_grid_accepts_three_dim_images(tmp_path: Path) -> None:
    x = np.ones((2, 4, 3), dtype=np.float16)
    image = _open(images.sample_grid(x, np.array([1, 1]), (4, 3), tmp_path / "a.png", scale=1))
    assert image.size == (LABEL_WIDTH + 2 * 3 + 3 * GAP, 4 + 2 * GAP)
    assert (_cell(image, 0, 1, (4, 3)) == WHITE).all()


def test_sample_grid_accepts_bfloat16(tmp_path: Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.ones((1, 4), dtype=ml_dtypes.bfloat16)
    image = _open(images.sample_grid(x, np.array([0]), (2, 2), tmp_path / "b.png", scale=1))
    assert (_cell(image, 0, 0, (2, 2)) == WHITE).all()


def test_sample_grid_title_band(tmp_path: Path) -> None:
    x = np.zeros((2, 64))
    out = images.sample_grid(x, np.array([0, 1]), (8, 8), tmp_path / "t.png", title="s", scale=2)
    image = _open(out)
    assert image.size == (LABEL_WIDTH + 16 + 2 * GAP, TITLE_HEIGHT + 2 * 16 + 3 * GAP)
    assert (_cell(image, 1, 0, (16, 16), top=TITLE_HEIGHT) == BLACK).all()


def test_default_scale_makes_readable_cells() -> None:
    assert images.default_scale((8, 8)) * 8 in range(64, 97)
    assert images.default_scale((28, 28)) * 28 in range(64, 97)
    assert images.default_scale((500, 400)) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"images": np.zeros((3, 63))}, "images: expected shape"),
        ({"images": np.zeros((0, 64))}, "images: expected at least one image"),
        ({"images": np.zeros((3, 64), dtype=np.uint8)}, "images: expected a floating array"),
        ({"labels": np.array([0, 1])}, "labels: expected 3 labels"),
        ({"labels": np.array([0.0, 1.0, 2.0])}, "labels: expected an integer array"),
        ({"image_shape": (8,)}, "image_shape: expected a pair"),
        ({"image_shape": (8, 0)}, "image_shape: expected a pair"),
        ({"scale": 0}, "scale: expected an integer >= 1"),
        ({"scale": 2.0}, "scale: expected an integer >= 1"),
        ({"title": 3}, "title: expected a string"),
    ],
)
def test_sample_grid_rejects_bad_input(tmp_path: Path, kwargs, message) -> None:
    args = {"images": np.zeros((3, 64)), "labels": np.array([0, 1, 2]), "image_shape": (8, 8)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        images.sample_grid(path=tmp_path / "bad.png", **args)
    _only(tmp_path)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_sample_grid_rejects_non_finite(tmp_path: Path, bad: float) -> None:
    x = np.zeros((2, 64))
    x[1, 9] = bad
    with pytest.raises(
        InputError, match=r"images: expected finite values.*image 1, pixel \(1, 1\)"
    ):
        images.sample_grid(x, np.array([0, 1]), (8, 8), tmp_path / "n.png")
    _only(tmp_path)


# -- reconstruction_grid -------------------------------------------------------------------------


def test_reconstruction_grid_pairs_rows(tmp_path: Path) -> None:
    originals = np.ones((5, 16))
    reconstructions = np.zeros((5, 16))
    out = images.reconstruction_grid(
        originals,
        reconstructions,
        (4, 4),
        tmp_path / "r.png",
        layout=images.Layout(scale=2, columns=3),
    )
    image = _open(out)
    groups, rows, cols = 2, 4, 3
    assert image.size == (
        LABEL_WIDTH + cols * 8 + (cols + 1) * GAP,
        rows * 8 + (rows + 1) * GAP + (groups - 1) * GROUP_GAP,
    )
    assert (_cell(image, 0, 2, (8, 8)) == WHITE).all()  # original 2
    assert (_cell(image, 1, 2, (8, 8)) == BLACK).all()  # its reconstruction, just below
    # Second group starts GROUP_GAP lower: originals 3, 4, then an empty cell.
    assert (_cell(image, 2, 1, (8, 8), top=GROUP_GAP) == WHITE).all()
    assert (_cell(image, 3, 1, (8, 8), top=GROUP_GAP) == BLACK).all()
    assert (_cell(image, 2, 2, (8, 8), top=GROUP_GAP) == BACKGROUND).all()
    _only(tmp_path, "r.png")


def test_reconstruction_grid_default_columns(tmp_path: Path) -> None:
    x = np.zeros((4, 16))
    image = _open(
        images.reconstruction_grid(x, x, (4, 4), tmp_path / "r.png", layout=images.Layout(scale=1))
    )
    assert image.size == (LABEL_WIDTH + 4 * 4 + 5 * GAP, 2 * 4 + 3 * GAP)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reconstructions": np.zeros((3, 16))}, "reconstructions: expected 4 images"),
        ({"reconstructions": np.zeros((4, 15))}, "reconstructions: expected shape"),
        ({"originals": np.full((4, 16), np.nan)}, "originals: expected finite values"),
        ({"layout": images.Layout(columns=0)}, "columns: expected an integer >= 1"),
    ],
)
def test_reconstruction_grid_rejects_bad_input(tmp_path: Path, kwargs, message) -> None:
    args = {"originals": np.zeros((4, 16)), "reconstructions": np.zeros((4, 16))}
    args.update(kwargs)
    with pytest.raises(InputError, match=message):
        images.reconstruction_grid(image_shape=(4, 4), path=tmp_path / "bad.png", **args)
    _only(tmp_path)


# -- curves --------------------------------------------------------------------------------------


def test_loss_curves_writes_png_of_documented_size(tmp_path: Path) -> None:
    out = charts.loss_curves(_curves(), tmp_path / "sub" / "loss.png", title="loss")
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (
            round((PANEL_SIZE[0] + LEGEND_WIDTH) * CURVE_DPI),
            round(PANEL_SIZE[1] * CURVE_DPI),
        )
    _only(tmp_path / "sub", "loss.png")


def test_metric_panels_one_axes_per_metric(tmp_path: Path) -> None:
    curves = _curves(runs=("a", "b", "c"))
    out = charts.metric_panels(curves, tmp_path / "m.png", metrics=["loss", "recon", "kl"])
    with Image.open(out) as image:
        assert image.size == (
            round((3 * PANEL_SIZE[0] + LEGEND_WIDTH) * CURVE_DPI),
            round(PANEL_SIZE[1] * CURVE_DPI),
        )
    out = charts.metric_panels(curves, tmp_path / "m2.png", metrics=["kl"])
    with Image.open(out) as image:
        assert image.size[0] == round((PANEL_SIZE[0] + LEGEND_WIDTH) * CURVE_DPI)
    _only(tmp_path, "m.png", "m2.png")


def test_metric_panels_wraps_rows(tmp_path: Path) -> None:
    curves = {"r": {f"train m{i}": [(0, 1.0), (1, 2.0)] for i in range(4)}}
    with Image.open(charts.metric_panels(curves, tmp_path / "w.png")) as image:
        assert image.size[1] == round(2 * PANEL_SIZE[1] * CURVE_DPI)


def test_metric_name() -> None:
    assert charts.metric_name("train loss") == "loss"
    assert charts.metric_name("test_kl") == "kl"
    assert charts.metric_name("Training recon") == "recon"
    assert charts.metric_name("elbo") == "elbo"


def test_curves_do_not_import_pyplot(tmp_path: Path) -> None:
    import sys

    before = "matplotlib.pyplot" in sys.modules
    charts.metric_panels(_curves(), tmp_path / "m.png")
    assert ("matplotlib.pyplot" in sys.modules) == before


@pytest.mark.parametrize(
    ("curves", "message"),
    [
        ({}, "curves: expected a non-empty mapping"),
        ({"r": [(0, 1)]}, r"curves\['r'\]: expected a mapping"),
        ({"r": {"train loss": [(0, 1, 2)]}}, r"curves\['r'\]\['train loss'\]: expected a sequence"),
        ({"r": {"train loss": [(0, float("nan"))]}}, "expected finite"),
        ({"r": {"train loss": []}}, "expected at least one"),
    ],
)
def test_curves_reject_bad_input(tmp_path: Path, curves, message) -> None:
    with pytest.raises(InputError, match=message):
        charts.loss_curves(curves, tmp_path / "bad.png")
    _only(tmp_path)


def test_metric_panels_rejects_unknown_metric(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"metrics\[1\]: expected one of .*got 'elbo'"):
        charts.metric_panels(_curves(), tmp_path / "bad.png", metrics=["loss", "elbo"])
    _only(tmp_path)


# -- combine_side_by_side ------------------------------------------------------------------------


def _solid(path: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> Path:
    Image.new("RGB", size, colour).save(path)
    return path


def test_combine_side_by_side_one_row(tmp_path: Path) -> None:
    a = _solid(tmp_path / "a.png", (150, 100), (255, 0, 0))
    b = _solid(tmp_path / "b.png", (120, 80), (0, 0, 255))
    out = images.combine_side_by_side([a, b], ["first", "second"], tmp_path / "c.png")
    image = _open(out)
    tile_w, tile_h = 150, 100
    assert image.size == (
        2 * tile_w + 3 * COMBINE_PAD,
        CAPTION_HEIGHT + tile_h + 2 * COMBINE_PAD,
    )
    pixels = np.asarray(image)
    y = COMBINE_PAD + CAPTION_HEIGHT
    assert (pixels[y : y + 100, COMBINE_PAD : COMBINE_PAD + 150] == (255, 0, 0)).all()
    x = 2 * COMBINE_PAD + tile_w + (tile_w - 120) // 2  # centred in its tile
    assert (pixels[y : y + 80, x : x + 120] == (0, 0, 255)).all()
    assert (pixels[y + 80 :, x : x + 120] == WHITE).all()  # below the shorter picture
    # Captions are drawn above the pictures.
    assert (pixels[COMBINE_PAD : COMBINE_PAD + CAPTION_HEIGHT] < 100).any()
    _only(tmp_path, "a.png", "b.png", "c.png")


def test_combine_side_by_side_many_in_rows(tmp_path: Path) -> None:
    paths = [_solid(tmp_path / f"{i}.png", (140, 60), (0, 255, 0)) for i in range(5)]
    out = images.combine_side_by_side(paths, list("abcde"), tmp_path / "c.png", title="t")
    image = _open(out)
    n_rows = 2
    n_cols = math.ceil(5 / n_rows)
    assert image.size == (
        n_cols * 140 + (n_cols + 1) * COMBINE_PAD,
        TITLE_HEIGHT + n_rows * (CAPTION_HEIGHT + 60) + (n_rows + 1) * COMBINE_PAD,
    )
    out = images.combine_side_by_side(paths, list("abcde"), tmp_path / "d.png", columns=1)
    assert _open(out).size[1] == 5 * (CAPTION_HEIGHT + 60) + 6 * COMBINE_PAD


def test_combine_side_by_side_of_real_grids_and_curves(tmp_path: Path) -> None:
    grid = images.sample_grid(np.ones((2, 64)), np.array([0, 1]), (8, 8), tmp_path / "g.png")
    curve = charts.loss_curves(_curves(), tmp_path / "l.png")  # RGBA, flattened on white
    out = images.combine_side_by_side([grid, curve], ["grid", "curve"], tmp_path / "g.png")
    assert _open(out).mode == "RGB"  # and the output may replace one of the inputs
    _only(tmp_path, "g.png", "l.png")


def test_combine_side_by_side_rejects_bad_input(tmp_path: Path) -> None:
    a = _solid(tmp_path / "a.png", (10, 10), WHITE)
    (tmp_path / "text.png").write_text("not a picture")
    with pytest.raises(InputError, match="captions: expected 1 captions"):
        images.combine_side_by_side([a], ["x", "y"], tmp_path / "c.png")
    with pytest.raises(InputError, match="paths: expected at least one"):
        images.combine_side_by_side([], [], tmp_path / "c.png")
    with pytest.raises(InputError, match=r"paths\[1\]: expected the path of an image"):
        images.combine_side_by_side([a, tmp_path / "missing.png"], ["x", "y"], tmp_path / "c.png")
    with pytest.raises(InputError, match=r"paths\[0\]: expected the path of an image"):
        images.combine_side_by_side([tmp_path / "text.png"], ["x"], tmp_path / "c.png")
    with pytest.raises(InputError, match=r"captions\[0\]: expected a string"):
        images.combine_side_by_side([a], [1], tmp_path / "c.png")
    with pytest.raises(InputError, match="paths: expected a sequence"):
        images.combine_side_by_side(a, ["x"], tmp_path / "c.png")
    _only(tmp_path, "a.png", "text.png")


# -- atomic writes -------------------------------------------------------------------------------


def test_failed_grid_write_keeps_old_file_and_leaves_no_temporary(tmp_path, monkeypatch) -> None:
    target = tmp_path / "s.png"
    x, c = np.ones((1, 4)), np.array([0])
    images.sample_grid(x, c, (2, 2), target)
    before = target.read_bytes()

    def broken_save(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        images.sample_grid(np.zeros((1, 4)), c, (2, 2), target)
    assert target.read_bytes() == before
    _only(tmp_path, "s.png")


def test_failed_curve_write_leaves_nothing(tmp_path, monkeypatch) -> None:
    from matplotlib.figure import Figure

    def broken_savefig(self, fname, *args, **kwargs):
        fname.write(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(KeyboardInterrupt):
        charts.loss_curves(_curves(), tmp_path / "l.png")
    _only(tmp_path)


def test_written_file_has_umask_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    out = images.sample_grid(np.ones((1, 4)), np.array([0]), (2, 2), tmp_path / "s.png")
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not a private temporary's 0o600
