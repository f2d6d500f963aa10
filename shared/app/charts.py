"""Training curves as PNG files, drawn with matplotlib: one run's metrics, several runs overlaid,
and runs that should agree side by side with their differences.

Every function takes plain numpy arrays or Python numbers (convert jax arrays with ``np.asarray``
first), writes one PNG and returns its path. Writes are atomic
(:func:`cvae_rosetta.files.atomic_write`): the picture goes to a temporary file in the target's
directory, which is then renamed over the target with ``os.replace``, so an interrupted write leaves
either the old file or the new one, never half of one, with the umask's permissions. Missing parent
directories are created.

Curves are drawn with matplotlib through ``matplotlib.figure.Figure`` and the Agg canvas directly,
never through ``pyplot``, so a caller's pyplot state and backend are left alone. matplotlib is
imported only when a curve is drawn. Each curve writer has a function that returns its figure
unsaved (:func:`curves_figure`, :func:`metric_figure`, :func:`comparison_figure`), for a caller
that reads or changes it.

The grids and side-by-side figures are drawn by :mod:`cvae_rosetta.app.images`.

Bad input raises :class:`~cvae_rosetta.spec.errors.InputError` (a ``ValueError``) naming the
argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app.images import check_title
from cvae_rosetta.spec.errors import InputError, field_error

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


# -- curves --------------------------------------------------------------------------------------

_Curves = Mapping[str, Mapping[str, Sequence[tuple[float, float]]]]


@dataclass(frozen=True)
class AxisLabels:
    """The labels of a curve figure's axes: ``x`` under them, ``y`` beside them (the unit of the
    values; :func:`comparison_curves` puts its metric before it)."""

    x: str = "step"
    y: str = "nats"


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
    """A centred running mean over about a fortieth of the series (at least 3 points), and the
    window. Towards the start the window shrinks on both sides, so that it neither lags nor
    flattens the first steps; towards the end only its later side shrinks, so that the last point
    is the mean of the last half window, not one raw step."""
    n = len(values)
    half = max(1, round(n / 80))
    sums = np.concatenate([[0.0], np.cumsum(values)])
    index = np.arange(n)
    before = np.minimum(half, index)
    after = np.minimum(before, n - 1 - index)
    return (sums[index + after + 1] - sums[index - before]) / (before + after + 1), 2 * half + 1


LATE = 0.1  # the share of a long series' first points the y axis may leave above it
"""A long run's first steps fall far (a loss from hundreds of nats to tens); scaled to them, the
rest, where the runs differ, would be a flat line. The axis is fit to what follows the first
tenth, and what it leaves out is said on the panel."""


def _fit_late(ax: Any, lines: list[tuple[str, str, np.ndarray]]) -> None:
    """Fit ``ax``'s y axis to the points after the first :data:`LATE` of each long series where
    the first ones would squash them (more than three times their range), saying so."""
    long = [p for _, _, p in lines if len(p) > MARKER_MAX_POINTS]
    if not long:
        return
    late = np.concatenate([p[int(len(p) * LATE) :, 1] for p in long])
    every = np.concatenate([p[:, 1] for _, _, p in lines])
    low, high = float(np.min(every)), float(np.quantile(late, 0.995))
    if float(np.max(every)) - low <= 3 * (high - low) or high <= low:
        return
    margin = 0.05 * (high - low)
    ax.set_ylim(low - margin, high + margin)
    ax.annotate("first steps above", (0.01, 0.98), xycoords="axes fraction", va="top",
                fontsize=7, color="0.4")  # fmt: skip


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
    axis_labels: AxisLabels,
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

    xlabel, ylabel = axis_labels.x, axis_labels.y
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
        _fit_late(ax, lines)
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
    axis_labels: AxisLabels = AxisLabels(y="loss (nats)"),
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
    title = check_title(title)
    figure = curves_figure([("", lines)], title=title, axis_labels=axis_labels)
    return _save_figure(figure, path)


def metric_panels(
    curves: _Curves,
    path: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
    axis_labels: AxisLabels = AxisLabels(),
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
        metric_figure(curves, metrics=metrics, title=title, axis_labels=axis_labels), path
    )


def metric_figure(
    curves: _Curves,
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
    axis_labels: AxisLabels = AxisLabels(),
) -> Any:
    """The figure :func:`metric_panels` writes, not saved."""
    lines = _check_curves(curves)
    title = check_title(title)
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
    return curves_figure(panels, title=title, axis_labels=axis_labels)


def comparison_curves(
    curves: _Curves,
    path: str | os.PathLike[str],
    *,
    reference: str,
    metric: str = "loss",
    title: str | None = None,
    axis_labels: AxisLabels = AxisLabels(),
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
        curves, reference=reference, metric=metric, title=title, axis_labels=axis_labels
    )
    return _save_figure(figure, path)


def comparison_figure(
    curves: _Curves,
    *,
    reference: str,
    metric: str = "loss",
    title: str | None = None,
    axis_labels: AxisLabels = AxisLabels(),
) -> Any:
    """The figure :func:`comparison_curves` writes, not saved."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xlabel, ylabel = axis_labels.x, axis_labels.y
    lines = _check_curves(curves)
    title = check_title(title)
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
        _differences(axes[1], reference, series, colours, metric, axis_labels)
    if title:
        figure.suptitle(title)
    return figure


_COMPARISON_STYLES = {"train": ("-", None), "test": ("--", "o")}


def _differences(
    row: Any,
    reference: str,
    series: dict[tuple[str, str | None], np.ndarray],
    colours: dict[str, Any],
    metric: str,
    axis_labels: AxisLabels,
) -> None:
    """The bottom row of :func:`comparison_figure`: each run minus the reference; in the
    reference's own slot, with nothing to draw, no axes but what the row shows, in the
    reference's colour; the row's y axis labelled on its first axes. ``colours`` maps every run,
    in column order, to its colour."""
    runs = list(colours)
    xlabel, ylabel = axis_labels.x, axis_labels.y
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
