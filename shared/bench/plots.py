"""The plots of a result, drawn with matplotlib's ``Figure`` and Agg canvas (never ``pyplot``)
for the docs' text column, and written atomically: the step time per call and the device time
against pure JAX's, with their intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cvae_rosetta.bench.markdown import backend_name, impl_label
from cvae_rosetta.bench.results import (
    batches_by_size,
    fast_row,
    impls_measured,
    provenance,
    scan_row,
)

PLOTS = {"step_time": "step time per call and device time against pure JAX"}
# Plots are drawn for the 688 px text column the page shows them in ({ width="688" }): 6.88 in at
# 100 px an inch, so 9 pt text reads as 12.5 px; 200 dpi makes the PNG 1376 px wide, for HiDPI.
DISPLAY_WIDTH, FIGURE_WIDTH, FIGURE_DPI = 688, 6.88, 200  # CSS px, inches, dots per inch
FIGURE_STYLE = {"font.size": 9, "axes.titlesize": 10, "figure.titlesize": 10}  # the rest: 9 pt


def figure_png(path: Path, height: float, draw) -> None:
    """``draw(figure)`` on a figure :data:`FIGURE_WIDTH` x ``height`` inches, :data:`FIGURE_STYLE`,
    written to ``path`` as a PNG at :data:`FIGURE_DPI`, atomically."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cvae_rosetta.files import atomic_write

    with matplotlib.rc_context(FIGURE_STYLE):
        figure = Figure(figsize=(FIGURE_WIDTH, height), dpi=FIGURE_DPI, layout="constrained")
        FigureCanvasAgg(figure)
        draw(figure)
        save = lambda handle: figure.savefig(handle, format="png", dpi=FIGURE_DPI)
        atomic_write(path, save, parents=True)


def plots(result: dict[str, Any], directory: Path, prefix: str = "bench_") -> dict[str, str]:
    """Draw every plot (:data:`PLOTS`) into ``directory``; returns ``plot name -> file name``."""
    if not result["batches"]:
        return {}
    file = f"{prefix}step_time.png"
    figure_png(directory / file, 3.5, lambda figure: _plot_step_time(figure, result))  # inches high
    return {"step_time": file}


def _errorbar(axis, xs, entries, i, label):
    ys = [e["ratio"] for e in entries]
    low = [e["ratio"] - (e["low"] if e.get("low") is not None else e["ratio"]) for e in entries]
    high = [(e["high"] if e.get("high") is not None else e["ratio"]) - e["ratio"] for e in entries]
    style = {"color": f"C{i}", "marker": "o", "markersize": 4, "linewidth": 1.3}
    axis.errorbar(xs, ys, yerr=[low, high], label=label, capsize=2.5, **style)


DODGE = 1.1  # the factor between neighbouring implementations' x, so intervals do not overlap


def _plot_step_time(figure, result):
    device, call = figure.subplots(1, 2, sharey=True)
    batches = batches_by_size(result)
    impls = impls_measured(result)
    for i, impl in enumerate(impls):
        shift = DODGE ** (i - (len(impls) - 1) / 2)
        scans = [(b, scan_row(bt, impl)) for b, bt in batches]
        scans = [(b * shift, s["vs_pure_jax"]["step"]) for b, s in scans if s]
        _errorbar(device, [b for b, _ in scans], [e for _, e in scans], i, impl_label(impl))
        calls = [(b * shift, fast_row(bt, impl)["vs_pure_jax"]["step"]) for b, bt in batches]
        _errorbar(call, [b for b, _ in calls], [e for _, e in calls], i, impl_label(impl))
    for axis, title in ((device, "device time (one lax.scan)"), (call, "per call (Python loop)")):
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        axis.set(xscale="log", xlabel="batch size", title=title)
        axis.set_xticks([b for b, _ in batches], [str(b) for b, _ in batches])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
    device.set(ylabel="ratio to pure JAX, with interval")
    legend = {"loc": "outside lower center", "ncols": min(len(impls), 6), "frameon": False}
    figure.legend(*call.get_legend_handles_labels(), **legend)  # below the panels, off the data
    rounds = result["settings"]["rounds"]
    figure.suptitle(f"{backend_name(result)}: {provenance(result)}; {rounds} rounds")
