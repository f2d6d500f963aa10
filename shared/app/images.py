"""Pictures as PNG files: sample and reconstruction grids, side-by-side figures.

Every function takes plain numpy arrays or Python numbers (convert jax arrays with ``np.asarray``
first), writes one PNG and returns its path. Writes are atomic
(:func:`cvae_rosetta.files.atomic_write`): the picture goes to a temporary file in the target's
directory, which is then renamed over the target with ``os.replace``, so an interrupted write leaves
either the old file or the new one, never half of one, with the umask's permissions. Missing parent
directories are created.

Grids are drawn with Pillow as RGB PNGs. Pixel values are floats (any floating dtype, bfloat16
included) in [0, 1], 0 black and 1 white, rounded to 8-bit grey; values outside [0, 1] are
clipped, non-finite values (NaN, inf) raise, as do integer arrays (a 0-255 image would otherwise
come out all white). Cells are upscaled by an integer factor with
nearest-neighbour repetition, so pixels stay crisp, and set apart by :data:`GAP` pixels of
:data:`BACKGROUND` grey on every side, so each reads as a picture of its own. A grid of ``rows``
x ``cols`` cells of an ``(H, W)`` image at factor ``s`` is exactly::

    width  = label_width + cols * W * s + (cols + 1) * GAP
    height = top + rows * H * s + (rows + 1) * GAP

where ``top`` is :data:`TITLE_HEIGHT` with a title and 0 without, and ``label_width`` is
:data:`LABEL_WIDTH` unless a row label needs more (then its text width plus twice
:data:`LABEL_PAD`). The cell in row ``r``, column ``c`` has its top-left pixel at
``(label_width + GAP + c * (W * s + GAP), top + GAP + r * (H * s + GAP))``.
:func:`reconstruction_grid` also puts :data:`GROUP_GAP` between its row pairs. A title wider than
the grid widens the picture (the cells keep their places). Gaps, label column and empty cells are
:data:`BACKGROUND` grey.

The training curves are drawn by :mod:`cvae_rosetta.app.charts`.

Bad input raises :class:`~cvae_rosetta.spec.errors.InputError` (a ``ValueError``) naming the
argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont, UnidentifiedImageError

from cvae_rosetta import files
from cvae_rosetta.spec.errors import InputError, field_error

GAP = 12
"""Pixels of background between neighbouring grid cells and around the cell block: about a
seventh of a default cell (:data:`TARGET_CELL`), so that digits on black, whose strokes and blur
reach their cells' edges, read as separate pictures at 100 % rather than as one striped block."""
GROUP_GAP = 20
"""Extra pixels between the original/reconstruction row pairs of :func:`reconstruction_grid`."""
LABEL_WIDTH = 48
"""Minimum width in pixels of the row-label column of a grid."""
LABEL_PAD = 4
"""Pixels between a row label and its first cell, and at the label column's left edge."""
TITLE_HEIGHT = 24
"""Height in pixels of the title band at the top of a grid or combined figure."""
CAPTION_HEIGHT = 24
"""Height in pixels of the caption band above each picture in :func:`combine_side_by_side`."""
COMBINE_PAD = 8
"""Pixels between (and around) the pictures of :func:`combine_side_by_side`."""
TARGET_CELL = 80
"""Cell size in pixels that :func:`default_scale` aims for."""
FONT_SIZE = 14
"""Size of PIL's default font for labels, titles and captions (where FreeType is available)."""

BACKGROUND = (200, 200, 200)
"""Colour of a grid's gaps, label column, title band and empty cells (light grey, so both black
and white cells stand out)."""
TEXT = (0, 0, 0)
COMBINE_BACKGROUND = (255, 255, 255)


# -- writing -------------------------------------------------------------------------------------


def _save_image(image: Image.Image, path: str | os.PathLike[str]) -> Path:
    return files.atomic_write(path, lambda handle: image.save(handle, format="PNG"), parents=True)


# -- checking ------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_image_shape(image_shape: Any) -> tuple[int, int]:
    ok = isinstance(image_shape, (tuple, list)) and len(image_shape) == 2
    ok = ok and all(_is_int(v) and v >= 1 for v in image_shape)
    if not ok:
        raise field_error(InputError, "image_shape", "a pair of integers (H, W) >= 1", image_shape)
    return int(image_shape[0]), int(image_shape[1])


def check_title(title: Any) -> str | None:
    if title is not None and not isinstance(title, str):
        raise field_error(InputError, "title", "a string or None", title)
    return title or None


def _check_positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise field_error(InputError, name, "an integer >= 1", value)
    return int(value)


def _check_images(name: str, images: Any, image_shape: tuple[int, int]) -> np.ndarray:
    """``images`` (``[N, H*W]`` or ``[N, H, W]``) as float64 ``[N, H, W]`` clipped to [0, 1]."""
    h, w = image_shape
    array = np.asarray(images)
    floating = np.issubdtype(array.dtype, np.floating) or array.dtype.name.startswith(
        ("bfloat16", "float8")
    )
    if not floating:
        raise InputError(
            f"{name}: expected a floating array with values in [0, 1], got dtype {array.dtype}"
        )
    if array.ndim == 2 and array.shape[1] == h * w:
        array = array.reshape(array.shape[0], h, w)
    elif not (array.ndim == 3 and array.shape[1:] == (h, w)):
        raise InputError(
            f"{name}: expected shape [N, {h * w}] or [N, {h}, {w}] for image_shape {(h, w)}, "
            f"got shape {array.shape}"
        )
    if array.shape[0] < 1:
        raise InputError(f"{name}: expected at least one image, got shape {array.shape}")
    values = array.astype(np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name}: expected finite values, got {values[index]} at image {index[0]}, "
            f"pixel {index[1:]} ({int(bad.sum())} non-finite in all)"
        )
    return np.clip(values, 0.0, 1.0)


def _check_labels(labels: Any, count: int) -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise field_error(InputError, "labels", "an integer array of shape [N]", labels)
    if array.shape[0] != count:
        raise InputError(f"labels: expected {count} labels, one per image, got {array.shape[0]}")
    return array


# -- drawing grids -------------------------------------------------------------------------------


def _font(size: int = FONT_SIZE) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1 or no FreeType: the bitmap font
        return ImageFont.load_default()


def _text_box(font: Any, text: str) -> tuple[int, int, int, int]:
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox(
        (0, 0), text, font=font
    )
    return int(left), int(top), int(right), int(bottom)


def _text_width(font: Any, text: str) -> int:
    left, _, right, _ = _text_box(font, text)
    return right - left


def _draw_text(
    draw: ImageDraw.ImageDraw,
    font: Any,
    text: str,
    xy: tuple[float, float],
    align: str,
    colour: Any,
) -> None:
    """Draw ``text`` with its box's left / centre / right edge at ``x`` and its middle at ``y``,
    ``xy`` being ``(x, y)`` (Pillow's order)."""
    x, y = xy
    left, top, right, bottom = _text_box(font, text)
    offset = {"left": 0.0, "centre": (right - left) / 2, "right": float(right - left)}[align]
    draw.text(
        (round(x - offset - left), round(y - (top + bottom) / 2)), text, font=font, fill=colour
    )


def default_scale(image_shape: tuple[int, int]) -> int:
    """The upscaling factor that makes the longer image side about :data:`TARGET_CELL` pixels.

    8 x 8 digits get 10 (80 px cells), 28 x 28 MNIST gets 3 (84 px); never less than 1.
    """
    h, w = _check_image_shape(image_shape)
    return max(1, round(TARGET_CELL / max(h, w)))


def _grid(
    cells: Sequence[Sequence[np.ndarray | None]],
    row_labels: Sequence[str],
    image_shape: tuple[int, int],
    scale: int,
    title: str | None,
    *,
    group: int = 0,
) -> Image.Image:
    """A grid picture: ``cells[r][c]`` is an ``[H, W]`` image in [0, 1] or ``None`` (empty).

    With ``group`` > 0, rows come in groups of ``group`` separated by an extra :data:`GROUP_GAP`.
    """
    h, w = image_shape
    cell_h, cell_w = h * scale, w * scale
    rows = len(cells)
    cols = max(len(row) for row in cells)
    font = _font()
    label_width = max([LABEL_WIDTH] + [_text_width(font, t) + 2 * LABEL_PAD for t in row_labels])
    top = TITLE_HEIGHT if title else 0
    width = label_width + cols * cell_w + (cols + 1) * GAP
    groups = math.ceil(rows / group) if group else 1
    height = top + rows * cell_h + (rows + 1) * GAP + (groups - 1) * GROUP_GAP
    if title:
        width = max(width, _text_width(font, title) + 2 * LABEL_PAD)

    def row_top(r: int) -> int:
        return top + GAP + r * (cell_h + GAP) + (r // group if group else 0) * GROUP_GAP

    canvas = np.empty((height, width, 3), dtype=np.uint8)
    canvas[:] = BACKGROUND
    for r, row in enumerate(cells):
        y = row_top(r)
        for c, cell in enumerate(row):
            if cell is None:
                continue
            x = label_width + GAP + c * (cell_w + GAP)
            pixels = np.rint(cell * 255.0).astype(np.uint8)
            pixels = np.repeat(np.repeat(pixels, scale, axis=0), scale, axis=1)
            canvas[y : y + cell_h, x : x + cell_w] = pixels[:, :, None]

    image = Image.fromarray(canvas)  # uint8 [H, W, 3] is RGB
    draw = ImageDraw.Draw(image)
    for r, text in enumerate(row_labels):
        middle = row_top(r) + cell_h / 2
        _draw_text(draw, font, text, (label_width - LABEL_PAD, middle), "right", TEXT)
    if title:
        _draw_text(draw, font, title, (LABEL_PAD, TITLE_HEIGHT / 2), "left", TEXT)
    return image


def sample_grid(
    images: Any,
    labels: Any,
    image_shape: tuple[int, int],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    scale: int | None = None,
) -> Path:
    """Write a class-conditional sample grid: one row per distinct label, in increasing order.

    ``images`` is float ``[N, H*W]`` (or ``[N, H, W]``) in [0, 1], ``labels`` int ``[N]``. Each row
    starts with its label number and holds that label's images in their given order; the grid has
    as many columns as the most frequent label has images, and shorter rows end in empty cells.
    ``scale`` defaults to :func:`default_scale`.
    """
    shape = _check_image_shape(image_shape)
    title = check_title(title)
    pixels = _check_images("images", images, shape)
    classes = _check_labels(labels, pixels.shape[0])
    factor = default_scale(shape) if scale is None else _check_positive_int("scale", scale)
    rows = [np.flatnonzero(classes == label) for label in np.unique(classes)]
    cells = [[pixels[i] for i in indices] for indices in rows]
    texts = [str(int(label)) for label in np.unique(classes)]
    return _save_image(_grid(cells, texts, shape, factor, title), path)


@dataclass(frozen=True)
class Layout:
    """How :func:`reconstruction_grid` lays out its cells: each image upscaled ``scale`` times
    (default :func:`default_scale`), ``columns`` images to a pair of rows (default
    ``min(N, 10)``)."""

    scale: int | None = None
    columns: int | None = None


def reconstruction_grid(
    originals: Any,
    reconstructions: Any,
    image_shape: tuple[int, int],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    layout: Layout = Layout(),
) -> Path:
    """Write originals above their reconstructions, so each column compares one image.

    Both arrays are float ``[N, H*W]`` (or ``[N, H, W]``) in [0, 1] with the same N. The images are
    cut into groups of ``layout.columns`` (default ``min(N, 10)``); each group is two rows, labelled
    ``orig`` and ``recon``, with image ``i`` of the group in column ``i`` of both. The last group
    may be shorter, ending in empty cells. Groups are ``GAP + GROUP_GAP`` apart, so the module's
    grid height gains ``(groups - 1) * GROUP_GAP`` and group ``g`` starts ``g * GROUP_GAP`` lower.
    ``layout.scale`` defaults to :func:`default_scale`.
    """
    scale, columns = layout.scale, layout.columns
    shape = _check_image_shape(image_shape)
    title = check_title(title)
    first = _check_images("originals", originals, shape)
    second = _check_images("reconstructions", reconstructions, shape)
    if first.shape[0] != second.shape[0]:
        raise InputError(
            f"reconstructions: expected {first.shape[0]} images, one per original, "
            f"got {second.shape[0]}"
        )
    factor = default_scale(shape) if scale is None else _check_positive_int("scale", scale)
    count = first.shape[0]
    width = min(count, 10) if columns is None else _check_positive_int("columns", columns)
    cells: list[list[np.ndarray | None]] = []
    texts: list[str] = []
    for start in range(0, count, width):
        cells.append(list(first[start : start + width]))
        cells.append(list(second[start : start + width]))
        texts += ["orig", "recon"]
    return _save_image(_grid(cells, texts, shape, factor, title, group=2), path)


# -- combining pictures --------------------------------------------------------------------------


def _open_rgb(name: str, path: Any) -> Image.Image:
    try:
        with Image.open(path) as opened:
            opened.load()
            image = opened.copy()
    except (FileNotFoundError, IsADirectoryError, UnidentifiedImageError, TypeError) as error:
        expected = "the path of an image file Pillow can read"
        raise field_error(InputError, name, expected, path) from error
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, COMBINE_BACKGROUND)
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGB")


def panel_rows(count: int, columns: int | None = None) -> list[int]:
    """How many pictures each row of :func:`combine_side_by_side` holds, top to bottom.

    With ``columns``, rows of ``columns`` and a shorter last one. Without, all in one row for up to
    4, else as few rows of at most 4 as possible, as evenly filled as possible: 6 -> 3 + 3, 8 ->
    4 + 4, 5 -> 3 + 2, 10 -> 4 + 3 + 3; rows differ by one picture at most, longer rows first.
    """
    count = _check_positive_int("count", count)
    if columns is not None:
        width = min(_check_positive_int("columns", columns), count)
        return [min(width, count - start) for start in range(0, count, width)]
    n_rows = math.ceil(count / 4)
    short, extra = divmod(count, n_rows)
    return [short + 1] * extra + [short] * (n_rows - extra)


def combine_side_by_side(
    paths: Sequence[str | os.PathLike[str]],
    captions: Sequence[str] | None,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    columns: int | None = None,
) -> Path:
    """Write existing pictures side by side, each under its caption, on a white background.

    Pictures fill the rows of :func:`panel_rows` (``columns`` a row, or at most 4 as evenly as
    possible); a row shorter than the longest is centred, so no tile is left empty at its end.
    Every tile is as wide as the widest picture (or caption) and as high as the highest picture; a
    picture sits centred at the top of its tile, its caption centred above it. ``captions=None``
    draws none (the pictures name themselves, as titled grids do), and the caption band is then
    0 high. With ``n_cols`` tiles in the longest row and ``n_rows`` rows::

        width  = n_cols * tile_w + (n_cols + 1) * COMBINE_PAD
        height = top + n_rows * (caption + tile_h) + (n_rows + 1) * COMBINE_PAD

    ``top`` is :data:`TITLE_HEIGHT` with a title and 0 without; ``caption`` is
    :data:`CAPTION_HEIGHT` with captions and 0 without. Tile ``i`` of a row of ``k`` starts
    ``COMBINE_PAD + ((n_cols - k) / 2 + i) * (tile_w + COMBINE_PAD)`` from the left (rounded
    down). ``path`` may be one of ``paths``.
    """
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise field_error(InputError, "paths", "a sequence of image paths", paths)
    if captions is not None and (
        isinstance(captions, (str, bytes)) or not isinstance(captions, Sequence)
    ):
        raise field_error(InputError, "captions", "a sequence of strings or None", captions)
    if not paths:
        raise InputError("paths: expected at least one image path, got an empty sequence")
    if captions is not None and len(captions) != len(paths):
        raise InputError(
            f"captions: expected {len(paths)} captions, one per path, got {len(captions)}"
        )
    for i, caption in enumerate(captions or ()):
        if not isinstance(caption, str):
            raise field_error(InputError, f"captions[{i}]", "a string", caption)
    title = check_title(title)
    rows = panel_rows(len(paths), columns)
    n_cols, n_rows = max(rows), len(rows)

    pictures = [_open_rgb(f"paths[{i}]", p) for i, p in enumerate(paths)]
    font = _font()
    tile_w = max(
        [p.width for p in pictures] + [_text_width(font, c) + 2 * LABEL_PAD for c in captions or ()]
    )
    tile_h = max(p.height for p in pictures)
    top = TITLE_HEIGHT if title else 0
    band = CAPTION_HEIGHT if captions is not None else 0
    width = n_cols * tile_w + (n_cols + 1) * COMBINE_PAD
    height = top + n_rows * (band + tile_h) + (n_rows + 1) * COMBINE_PAD
    if title:
        width = max(width, _text_width(font, title) + 2 * COMBINE_PAD)

    canvas = Image.new("RGB", (width, height), COMBINE_BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    places = [(r, c, k) for r, k in enumerate(rows) for c in range(k)]
    for i, (picture, (r, c, k)) in enumerate(zip(pictures, places, strict=True)):
        x = COMBINE_PAD + math.floor(((n_cols - k) / 2 + c) * (tile_w + COMBINE_PAD))
        y = top + COMBINE_PAD + r * (band + tile_h + COMBINE_PAD)
        if captions is not None:
            _draw_text(draw, font, captions[i], (x + tile_w / 2, y + band / 2), "centre", TEXT)
        canvas.paste(picture, (x + (tile_w - picture.width) // 2, y + band))
    if title:
        _draw_text(draw, font, title, (COMBINE_PAD, TITLE_HEIGHT / 2), "left", TEXT)
    return _save_image(canvas, path)
