"""Pictures as PNG files: sample and reconstruction grids, loss curves, side-by-side figures.

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

Curves are drawn with matplotlib through ``matplotlib.figure.Figure`` and the Agg canvas directly,
never through ``pyplot``, so a caller's pyplot state and backend are left alone. matplotlib is
imported only when a curve is drawn. Each curve writer has a function that returns its figure
unsaved (:func:`curves_figure`, :func:`metric_figure`, :func:`comparison_figure`), for a caller
that reads or changes it.

Bad input raises :class:`~cvae_rosetta.spec.errors.InputError` (a ``ValueError``) naming the
argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
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

CURVE_DPI = 100
"""Dots per inch of curve figures; a figure's pixel size is its size in inches times this."""
PANEL_SIZE = (4.8, 3.6)
"""Width and height in inches of one axes panel of a curve figure."""
LEGEND_WIDTH = 2.0
"""Extra figure width in inches for the legend, right of the panels."""
COMPARISON_PANEL = (3.4, 2.8)
"""Width and height in inches of one panel of :func:`comparison_curves`."""
PANELS_PER_ROW = 3
"""Curve panels per row of a :func:`metric_panels` figure."""
MARKER_MAX_POINTS = 25
"""Series with at most this many points are drawn with markers as well as lines; a longer
``train`` series is drawn light, under its running mean."""
RAW_ALPHA = 0.3
"""Opacity of a long train series' own (per-step, noisy) line under its running mean."""

_OTHER_STYLES: tuple[Any, ...] = (":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)))
_KIND_PREFIX = re.compile(r"^(?:train|test)(?:ing)?[\s_/:.\-]*", re.IGNORECASE)


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


def _check_title(title: Any) -> str | None:
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
    draw: ImageDraw.ImageDraw, font: Any, text: str, x: float, y: float, align: str, colour: Any
) -> None:
    """Draw ``text`` with its box's left / centre / right edge at ``x`` and its middle at ``y``."""
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
        _draw_text(draw, font, text, label_width - LABEL_PAD, middle, "right", TEXT)
    if title:
        _draw_text(draw, font, title, LABEL_PAD, TITLE_HEIGHT / 2, "left", TEXT)
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
    title = _check_title(title)
    pixels = _check_images("images", images, shape)
    classes = _check_labels(labels, pixels.shape[0])
    factor = default_scale(shape) if scale is None else _check_positive_int("scale", scale)
    rows = [np.flatnonzero(classes == label) for label in np.unique(classes)]
    cells = [[pixels[i] for i in indices] for indices in rows]
    texts = [str(int(label)) for label in np.unique(classes)]
    return _save_image(_grid(cells, texts, shape, factor, title), path)


def reconstruction_grid(
    originals: Any,
    reconstructions: Any,
    image_shape: tuple[int, int],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    scale: int | None = None,
    columns: int | None = None,
) -> Path:
    """Write originals above their reconstructions, so each column compares one image.

    Both arrays are float ``[N, H*W]`` (or ``[N, H, W]``) in [0, 1] with the same N. The images are
    cut into groups of ``columns`` (default ``min(N, 10)``); each group is two rows, labelled
    ``orig`` and ``recon``, with image ``i`` of the group in column ``i`` of both. The last group
    may be shorter, ending in empty cells. Groups are ``GAP + GROUP_GAP`` apart, so the module's
    grid height gains ``(groups - 1) * GROUP_GAP`` and group ``g`` starts ``g * GROUP_GAP`` lower.
    ``scale`` defaults to :func:`default_scale`.
    """
    shape = _check_image_shape(image_shape)
    title = _check_title(title)
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
    title = _check_title(title)
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
            _draw_text(draw, font, captions[i], x + tile_w / 2, y + band / 2, "centre", TEXT)
        canvas.paste(picture, (x + (tile_w - picture.width) // 2, y + band))
    if title:
        _draw_text(draw, font, title, COMBINE_PAD, TITLE_HEIGHT / 2, "left", TEXT)
    return _save_image(canvas, path)


# -- curves --------------------------------------------------------------------------------------

_Curves = Mapping[str, Mapping[str, Sequence[tuple[float, float]]]]


def _kind(series: str) -> str | None:
    lowered = series.lower()
    for kind in ("train", "test"):
        if lowered.startswith(kind):
            return kind
    return None


def metric_name(series: str) -> str:
    """The metric a series measures: its name less a leading train/test word.

    ``"train loss"`` -> ``"loss"``, ``"test_kl"`` -> ``"kl"``, ``"training recon"`` ->
    ``"recon"``, ``"elbo"`` -> ``"elbo"``.
    """
    return re.sub(_KIND_PREFIX, "", series, count=1)


def _check_curves(curves: Any) -> list[tuple[str, str, np.ndarray]]:
    """``curves`` as ``(run, series, points [k, 2])`` triples, in the given order."""
    if not isinstance(curves, Mapping) or not curves:
        raise field_error(InputError, "curves", "a non-empty mapping of run name to series", curves)
    lines = []
    for run, series_map in curves.items():
        if not isinstance(run, str):
            raise field_error(InputError, "curves key", "a run name (str)", run)
        if not isinstance(series_map, Mapping):
            raise field_error(
                InputError, f"curves[{run!r}]", "a mapping of series name to points", series_map
            )
        for series, points in series_map.items():
            name = f"curves[{run!r}][{series!r}]"
            if not isinstance(series, str):
                raise field_error(InputError, f"curves[{run!r}] key", "a series name (str)", series)
            try:
                array = np.asarray(points, dtype=np.float64)
            except (TypeError, ValueError):
                raise field_error(InputError, name, "a sequence of (x, y) pairs", points) from None
            if array.size == 0:
                continue
            if array.ndim != 2 or array.shape[1] != 2:
                raise field_error(InputError, name, "a sequence of (x, y) pairs", points)
            bad = ~np.isfinite(array)
            if bad.any():
                i = int(np.argwhere(bad)[0][0])
                point = tuple(array[i].tolist())
                raise InputError(f"{name}: expected finite (x, y) points, got {point} at [{i}]")
            lines.append((run, series, array))
    if not lines:
        raise InputError("curves: expected at least one (x, y) point, got none")
    return lines


def _running_mean(values: np.ndarray) -> tuple[np.ndarray, int]:
    """A centred running mean over about a fortieth of the series (at least 3 points), its window
    shrinking towards the ends so that it neither lags nor flattens the first steps; and the
    window."""
    n = len(values)
    half = max(1, round(n / 80))
    sums = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(n)
    reach = np.minimum(half, np.minimum(index, n - 1 - index))
    return (sums[index + reach + 1] - sums[index - reach]) / (2 * reach + 1), 2 * half + 1


def _series_styles(panels: list[tuple[str, list[tuple[str, str, np.ndarray]]]]) -> dict[str, Any]:
    """Line style per series kind: ``train`` solid, ``test`` dashed, any other its own."""
    styles: dict[str, Any] = {}
    for _, lines in panels:
        for _, series, _ in lines:
            kind = _kind(series)
            key = kind or series
            if key not in styles:
                others = sum(1 for k in styles if k not in ("train", "test"))
                styles[key] = {"train": "-", "test": "--"}.get(
                    key, _OTHER_STYLES[others % len(_OTHER_STYLES)]
                )
    return styles


def _plot_series(ax: Any, points: np.ndarray, kind: str | None, colour: Any, style: Any) -> int:
    """One series in ``ax``; a long ``train`` series light with its running mean over it (the
    window returned, else 0), a ``test`` series with markers above everything else."""
    few = len(points) <= MARKER_MAX_POINTS
    marker = "o" if few or kind == "test" else None
    if kind == "train" and not few:
        ax.plot(*points.T, color=colour, linestyle=style, linewidth=0.8, alpha=RAW_ALPHA, zorder=1)
        mean, window = _running_mean(points[:, 1])
        ax.plot(points[:, 0], mean, color=colour, linestyle=style, linewidth=1.6, zorder=2)
        return window
    ax.plot(
        *points.T,
        color=colour,
        linestyle=style,
        linewidth=1.8 if kind == "test" else 1.6,
        marker=marker,
        markersize=4 if kind == "test" else 3,
        zorder=3 if kind == "test" else 2,
    )
    return 0


def _kind_handles(
    styles: dict[str, Any], colour_of: Any, windows: set[int], xlabel: str
) -> list[Any]:
    """Legend entries for the series kinds: ``colour_of(kind)`` their colour."""
    from matplotlib.lines import Line2D

    handles = []
    for key, style in styles.items():
        colour = colour_of(key)
        if key == "train" and windows:
            every = f"{xlabel}s" if xlabel else "points"
            size = f" of {windows.pop()} {every}" if len(windows) == 1 else ""
            handles += [
                Line2D(
                    [],
                    [],
                    color=colour,
                    linestyle=style,
                    alpha=RAW_ALPHA,
                    label=f"train, each {xlabel or 'point'}",
                ),
                Line2D(
                    [],
                    [],
                    color=colour,
                    linestyle=style,
                    linewidth=1.6,
                    label=f"train, running mean{size}",
                ),
            ]
        else:
            marker = "o" if key == "test" else None
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colour,
                    linestyle=style,
                    linewidth=1.6,
                    marker=marker,
                    markersize=4,
                    label=key,
                )
            )
    return handles


def curves_figure(
    panels: list[tuple[str, list[tuple[str, str, np.ndarray]]]],
    *,
    title: str | None,
    xlabel: str,
    ylabel: str,
) -> Any:
    """The matplotlib ``Figure`` of :func:`loss_curves` and :func:`metric_panels`: one axes per
    ``(panel title, [(run, series, points [k, 2]), ...])``, not saved.

    With one run, the series kinds have colours of their own (``train`` blue, ``test`` orange,
    others green, red, ...) and the legend is titled with the run unless the figure has a title;
    with several, each run has one
    colour and the legend names the runs by colour and the kinds by line style. A ``train`` series
    of more than :data:`MARKER_MAX_POINTS` points (per step, noisy) is drawn thin and light
    (alpha :data:`RAW_ALPHA`) with its running mean over it (:func:`_running_mean`); a ``test``
    series (per epoch) is drawn with markers above every other line.
    """
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    runs = list(dict.fromkeys(run for _, lines in panels for run, _, _ in lines))
    styles = _series_styles(panels)
    palette = colormaps["tab10" if max(len(runs), len(styles)) <= 10 else "tab20"].colors
    by_kind = {key: palette[i % len(palette)] for i, key in enumerate(styles)}
    by_run = {run: palette[i % len(palette)] for i, run in enumerate(runs)}

    def colour(run: str, key: str) -> Any:
        return by_kind[key] if len(runs) == 1 else by_run[run]

    n_cols = min(len(panels), PANELS_PER_ROW)
    n_rows = math.ceil(len(panels) / n_cols)
    size = (PANEL_SIZE[0] * n_cols + LEGEND_WIDTH, PANEL_SIZE[1] * n_rows)
    figure = Figure(figsize=size, dpi=CURVE_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(n_rows, n_cols, squeeze=False)
    windows: set[int] = set()
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        panel_title, lines = panels[index]
        for run, series, points in lines:
            key = _kind(series) or series
            window = _plot_series(ax, points, _kind(series), colour(run, key), styles[key])
            windows |= {window} if window else set()
        if all(float(x).is_integer() for _, _, p in lines for x in p[:, 0]):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel_title:
            ax.set_title(panel_title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    if len(runs) == 1:
        handles = _kind_handles(styles, by_kind.__getitem__, windows, xlabel)
        named = None if title else runs[0]  # a title names the run (or the runs of a resumed one)
        figure.legend(handles=handles, loc="outside right upper", frameon=False, title=named)
    else:
        handles = [Line2D([], [], color=by_run[run], linewidth=2.5, label=run) for run in runs]
        if windows or len(styles) > 1 or not set(styles) <= {"train", "test"}:
            handles += [Line2D([], [], color="none", label=" ")]
            handles += _kind_handles(styles, lambda _: "0.3", windows, xlabel)
        figure.legend(handles=handles, loc="outside right upper", frameon=False)
    if title:
        figure.suptitle(title)
    return figure


def _save_figure(figure: Any, path: str | os.PathLike[str]) -> Path:
    return files.atomic_write(
        path, lambda handle: figure.savefig(handle, format="png"), parents=True
    )


def loss_curves(
    curves: _Curves,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "loss (nats)",
) -> Path:
    """Write one axes with every series of every run overlaid.

    ``curves`` maps run name (``"pure_jax"``) -> series name (``"train loss"``) -> ``(x, y)``
    points, drawn in the given order. A series whose name starts with ``train`` is solid, with
    ``test`` dashed with markers and drawn above the others, any other gets its own dotted style.
    Colours: one per series kind for one run, one per run for several (:func:`curves_figure`); a
    long, noisy train series is drawn light under its running mean. The legend, right of the axes,
    names what the colours and line styles mean. Series of few points get markers; empty series
    are skipped, but at least one point is needed and every point must be finite. The figure is
    ``PANEL_SIZE + (LEGEND_WIDTH, 0)`` inches at :data:`CURVE_DPI`. Meant for one metric; for
    several use :func:`metric_panels`.
    """
    lines = _check_curves(curves)
    title = _check_title(title)
    figure = curves_figure([("", lines)], title=title, xlabel=xlabel, ylabel=ylabel)
    return _save_figure(figure, path)


def metric_panels(
    curves: _Curves,
    path: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "nats",
) -> Path:
    """Write one axes per metric, every run overlaid, e.g. panels ``loss``, ``recon`` and ``kl``.

    ``curves`` is as for :func:`loss_curves`. Series are grouped by :func:`metric_name`, so
    ``"train loss"`` and ``"test loss"`` share the ``loss`` panel. ``metrics`` picks and orders
    the panels (default: every metric, in first-seen order); naming an absent metric raises.
    Panels are titled by metric, :data:`PANELS_PER_ROW` to a row, sharing one legend (colours
    and line styles as in :func:`loss_curves`). The figure is ``PANEL_SIZE[0] * n_cols +
    LEGEND_WIDTH`` by ``PANEL_SIZE[1] * n_rows`` inches at :data:`CURVE_DPI`.
    """
    return _save_figure(
        metric_figure(curves, metrics=metrics, title=title, xlabel=xlabel, ylabel=ylabel), path
    )


def metric_figure(
    curves: _Curves,
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "nats",
) -> Any:
    """The figure :func:`metric_panels` writes, not saved."""
    lines = _check_curves(curves)
    title = _check_title(title)
    groups: dict[str, list[tuple[str, str, np.ndarray]]] = {}
    for line in lines:
        groups.setdefault(metric_name(line[1]), []).append(line)
    if metrics is None:
        order = list(groups)
    else:
        if isinstance(metrics, str) or not isinstance(metrics, Sequence) or not metrics:
            raise field_error(
                InputError, "metrics", "a non-empty sequence of metric names", metrics
            )
        order = list(metrics)
        for i, metric in enumerate(order):
            if metric not in groups:
                raise InputError(
                    f"metrics[{i}]: expected one of {', '.join(map(repr, groups))}, got {metric!r}"
                )
    panels = [(metric, groups[metric]) for metric in order]
    return curves_figure(panels, title=title, xlabel=xlabel, ylabel=ylabel)


def comparison_curves(
    curves: _Curves,
    path: str | os.PathLike[str],
    *,
    reference: str,
    metric: str = "loss",
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "nats",
) -> Path:
    """Write runs that should agree so that each one can be seen: one column per run.

    The top row draws each run's ``train <metric>`` (solid) and ``test <metric>`` (dashed, with
    markers, above the train line) in its own axes and colour, titled with the run, every axes on
    the same scales, so curves that agree do not hide one another. The bottom row draws, under
    every run but ``reference``, its difference from ``reference`` at the steps both have (run
    minus reference, on one shared scale, the largest in the axes' title): what a reader comparing
    frameworks looks for; each run is named once, above its column. The reference has no
    difference to draw: its slot says, in its colour, what the row shows (its x axis is labelled in
    the top row). ``curves`` is as for :func:`loss_curves`; ``reference``
    must be one of its runs. The figure is ``COMPARISON_PANEL`` inches a panel at
    :data:`CURVE_DPI`.
    """
    figure = comparison_figure(
        curves, reference=reference, metric=metric, title=title, xlabel=xlabel, ylabel=ylabel
    )
    return _save_figure(figure, path)


def comparison_figure(
    curves: _Curves,
    *,
    reference: str,
    metric: str = "loss",
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "nats",
) -> Any:
    """The figure :func:`comparison_curves` writes, not saved."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = _check_curves(curves)
    title = _check_title(title)
    runs = list(dict.fromkeys(run for run, _, _ in lines))
    if reference not in runs:
        raise InputError(
            f"reference: expected one of {', '.join(map(repr, runs))}, got {reference!r}"
        )
    series = {(run, _kind(name)): p for run, name, p in lines if metric_name(name) == metric}
    palette = colormaps["tab10" if len(runs) <= 10 else "tab20"].colors
    colours = {run: palette[i % len(palette)] for i, run in enumerate(runs)}
    n_rows = 2 if len(runs) > 1 else 1
    size = (COMPARISON_PANEL[0] * len(runs), COMPARISON_PANEL[1] * n_rows)
    figure = Figure(figsize=size, dpi=CURVE_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(n_rows, len(runs), squeeze=False, sharex=True, sharey="row")
    for column, run in enumerate(runs):
        top = axes[0, column]
        for kind, (linestyle, marker) in _COMPARISON_STYLES.items():
            points = series.get((run, kind))
            if points is not None:
                top.plot(
                    *points.T,
                    color=colours[run],
                    linestyle=linestyle,
                    marker=marker,
                    markersize=4,
                    linewidth=1.6,
                    label=f"{kind} {metric}",
                    zorder=3 if kind == "test" else 2,
                )
        top.set_title(run, color=colours[run], fontweight="bold")
        top.set_ylabel(f"{metric} ({ylabel})" if column == 0 else "")
        top.grid(True, alpha=0.3)
        if column == 0:
            top.legend(frameon=False, fontsize="small")
        if n_rows == 1 or run == reference:
            top.set_xlabel(xlabel)
            top.tick_params(labelbottom=True)
    if n_rows == 2:
        _differences(axes[1], runs, reference, series, colours, metric, xlabel, ylabel)
    if title:
        figure.suptitle(title)
    return figure


_COMPARISON_STYLES = {"train": ("-", None), "test": ("--", "o")}


def _differences(
    row: Any,
    runs: list[str],
    reference: str,
    series: dict[tuple[str, str | None], np.ndarray],
    colours: dict[str, Any],
    metric: str,
    xlabel: str,
    ylabel: str,
) -> None:
    """The bottom row of :func:`comparison_figure`: each run minus the reference; in the
    reference's own slot, with nothing to draw, no axes but what the row shows, in the
    reference's colour; the row's y axis labelled on its first axes."""
    shown = [column for column, run in enumerate(runs) if run != reference]
    for column, run in enumerate(runs):
        ax = row[column]
        if run == reference:
            ax.axis("off")
            ax.text(
                0.5,
                0.5,
                f"this row:\neach run's {metric}\nminus {reference}'s",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color=colours[run],
                fontsize="x-large",
                fontweight="bold",
            )
            continue
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        if column == shown[0]:
            ax.set_ylabel(f"{metric} minus {reference} ({ylabel})")
            ax.tick_params(labelleft=True)
        largest = 0.0
        for kind, (linestyle, marker) in _COMPARISON_STYLES.items():
            ours, theirs = series.get((run, kind)), series.get((reference, kind))
            if ours is None or theirs is None:
                continue
            steps, mine, base = np.intersect1d(ours[:, 0], theirs[:, 0], return_indices=True)
            diff = ours[mine, 1] - theirs[base, 1]
            largest = max(largest, float(np.abs(diff).max(initial=0.0)))
            ax.plot(
                steps,
                diff,
                color=colours[run],
                linestyle=linestyle,
                marker=marker,
                markersize=4,
                linewidth=1.6,
                zorder=3 if kind == "test" else 2,
            )
        ax.set_title(f"max |diff| {largest:.1e}" if largest else "identical", fontsize="small")
