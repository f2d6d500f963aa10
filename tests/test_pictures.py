"""The pictures a run writes read as what they show, and a run directory keeps only what a run
needs: digit grids with background between the tiles, a combined picture titled once per panel
with no empty slot, a per-run curves figure whose test curve can be seen, a resumed run titled
with every implementation it was trained with, no ``run.lock`` left by a run that ended, no file a
user added deleted by ``--overwrite``, and a note under the compare table when some
implementation is not bit-identical to the reference (issue #32)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cvae_rosetta.app import (
    charts,
    compare,
    images,
    metricslog,
    resuming,
    rundir,
    runlock,
    runpictures,
)
from cvae_rosetta.app import run as app_run
from cvae_rosetta.cli import main
from cvae_rosetta.spec.errors import OutputError

BACKGROUND = np.array(images.BACKGROUND)
TINY = [
    *("--data", "synthetic", "--epochs", "1", "--batch-size", "128", "--latent-dim", "3"),
    *("--encoder-dims", "8", "--decoder-dims", "8", "--iw-samples", "1", "--no-progress"),
    "--no-tensorboard",
]


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def runs(line: np.ndarray) -> list[tuple[bool, int]]:
    """A line of pixels as ``(is background, length)`` runs, in order."""
    found: list[tuple[bool, int]] = []
    for is_background in (line == BACKGROUND).all(axis=-1):
        if found and found[-1][0] == bool(is_background):
            found[-1] = (found[-1][0], found[-1][1] + 1)
        else:
            found.append((bool(is_background), 1))
    return found


# --- digit grids --------------------------------------------------------------------------------


def test_digits_on_black_are_separate_tiles_at_the_default_scale(tmp_path):
    """Black cells (a digit's background, which its strokes and blur reach the edges of) with
    bands of background between them at least an eighth of a cell wide, across and down: with the
    old 2 px separator at 80 px cells, a grid read as vertical stripes."""
    x = np.zeros((12, 64))  # 3 labels x 4 images, all black
    labels = np.repeat(np.arange(3), 4)
    image = pixels(images.sample_grid(x, labels, (8, 8), tmp_path / "s.png"))
    cell = 8 * images.default_scale((8, 8))
    label_width = images.LABEL_WIDTH
    middle_of_row = images.GAP + cell // 2
    across = runs(image[middle_of_row, label_width:])
    tiles = [length for background, length in across if not background]
    gaps = [length for background, length in across if background]
    assert tiles == [cell] * 4, across
    assert len(gaps) == 5 and min(gaps) >= cell / 8, gaps  # around and between the tiles
    down = runs(image[:, label_width + images.GAP + cell // 2])
    assert [length for background, length in down if not background] == [cell] * 3, down
    assert min(length for background, length in down if background) >= cell / 8, down


def test_reconstruction_pairs_are_closer_than_groups(tmp_path):
    x = np.zeros((4, 64))
    image = pixels(
        images.reconstruction_grid(
            x, x, (8, 8), tmp_path / "r.png", layout=images.Layout(columns=2)
        )
    )
    column = image[:, images.LABEL_WIDTH + images.GAP + 5]
    down = runs(column)
    assert [background for background, _ in down] == [True, False] * 4 + [True], down
    inner = [length for background, length in down[1:-1] if background]
    within, between, within_again = inner
    assert within == within_again == images.GAP and between == images.GAP + images.GROUP_GAP
    assert within >= 8 * images.default_scale((8, 8)) / 8


# --- combined pictures ----------------------------------------------------------------------------


def test_rows_of_a_combined_picture_leave_no_slot_empty():
    assert images.panel_rows(6) == [3, 3]
    assert images.panel_rows(4) == [4]
    assert images.panel_rows(8) == [4, 4]
    assert images.panel_rows(5) == [3, 2]
    assert images.panel_rows(10) == [4, 3, 3]
    assert images.panel_rows(5, columns=2) == [2, 2, 1]
    for count in range(1, 30):
        rows = images.panel_rows(count)
        assert sum(rows) == count and max(rows) - min(rows) <= 1 and max(rows) <= 4


def test_a_short_last_row_is_centred(tmp_path):
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]
    paths = []
    for i, colour in enumerate(colours):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (100, 50), colour).save(paths[-1])
    image = pixels(images.combine_side_by_side(paths, None, tmp_path / "c.png"))
    width = image.shape[1]
    assert width == 3 * 100 + 4 * images.COMBINE_PAD
    second = image[2 * images.COMBINE_PAD + 50 + 10]  # a line through the second row
    coloured = np.flatnonzero((second != 255).any(axis=-1))
    left, right = coloured[0], width - 1 - coloured[-1]
    assert abs(left - right) <= 1, (left, right)  # as much white on either side
    assert (second[left] == colours[3]).all() and (second[coloured[-1]] == colours[4]).all()


def test_the_compare_samples_name_each_panel_once(tmp_path):
    """Each implementation's own grid is titled ``NAME: samples``; the combined picture pastes it
    with no caption band above it (before, a caption ``NAME`` sat over the title ``NAME:
    samples``), under one title of its own."""
    names = ["pure_jax", "flax_linen", "haiku"]
    grids = {}
    for k, name in enumerate(names):
        x = np.full((4, 64), 0.25 * k)
        grids[name] = images.sample_grid(
            x, np.array([0, 0, 1, 1]), (8, 8), tmp_path / name / "samples.png",
            title=f"{name}: samples",
        )  # fmt: skip
    image = pixels(compare.combine_samples(tmp_path, names, "digits"))
    pad, top = images.COMBINE_PAD, images.TITLE_HEIGHT
    for k, name in enumerate(names):
        panel = pixels(grids[name])
        h, w = panel.shape[:2]
        x = pad + k * (w + pad)
        assert (image[top + pad : top + pad + h, x : x + w] == panel).all(), name
    assert image.shape[0] == top + h + 2 * pad  # one row, no caption band


# --- curves ---------------------------------------------------------------------------------------


def run_curves(steps: int = 200, epochs: int = 10, seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    step = np.arange(1, steps + 1)
    train = 30 + 20 / np.sqrt(step) + rng.normal(0, 1.5, steps)
    ends = step[steps // epochs - 1 :: steps // epochs]
    return {
        "train loss": list(zip(step, train, strict=True)),
        "test loss": [(s, 31 + 20 / np.sqrt(s)) for s in ends],
    }


def lines_of(ax):
    test = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    train = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    return train, test


def test_the_test_curve_of_a_run_is_drawn_above_a_light_train_line_in_its_own_colour():
    from matplotlib.colors import to_rgba

    figure = charts.metric_figure({"pure_jax": run_curves()}, title="pure_jax on digits")
    (ax,) = [ax for ax in figure.axes if ax.get_visible()]
    train, (test,) = lines_of(ax)
    raw = next(line for line in train if len(line.get_xdata()) == 200 and line.get_alpha())
    mean = next(line for line in train if line is not raw)
    assert to_rgba(test.get_color())[:3] not in {to_rgba(t.get_color())[:3] for t in train}
    assert test.get_zorder() > max(t.get_zorder() for t in train)
    assert test.get_marker() == "o"
    assert raw.get_alpha() <= 0.5 and mean.get_alpha() in (None, 1.0)
    rough = np.std(np.diff(raw.get_ydata()))
    assert np.std(np.diff(mean.get_ydata())) < rough / 3  # the running mean is smooth
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert texts[0] == "train, each step" and texts[1].startswith("train, running mean")
    assert "test" in texts


def test_the_running_mean_ends_on_a_mean_and_a_long_run_is_scaled_to_where_it_converged():
    values = np.ones(400)
    values[-1] = 41.0  # one raw step at the end: the mean of the last half window, not a dip
    mean, window = charts._running_mean(values)
    assert mean[-1] == pytest.approx((window // 2 + 41.0) / (window // 2 + 1))
    assert mean[0] == 1.0 and mean[200] == 1.0

    step = np.arange(1, 3001)  # a long run: 200 nats at first, then about 20
    loss = 20 + 180 * np.exp(-step / 30) + np.random.default_rng(0).normal(0, 0.5, step.size)
    curves = {"train loss": list(zip(step, loss, strict=True)), "test loss": [(3000, 20.0)]}
    (ax,) = [a for a in charts.metric_figure({"r": curves}).axes if a.get_visible()]
    assert ax.get_ylim()[1] < 30 and "first steps above" in [t.get_text() for t in ax.texts]
    (ax,) = [a for a in charts.metric_figure({"r": run_curves()}).axes if a.get_visible()]
    assert ax.get_ylim()[1] > 45 and not ax.texts  # its first steps are within its range


def test_several_runs_keep_a_colour_each_and_their_test_curves_on_top():
    from matplotlib.colors import to_rgba

    curves = {"a": run_curves(seed=1), "b": run_curves(seed=2)}
    figure = charts.metric_figure(curves)
    (ax,) = [ax for ax in figure.axes if ax.get_visible()]
    train, test = lines_of(ax)
    assert len(test) == 2 and len({to_rgba(t.get_color()) for t in test}) == 2
    assert min(t.get_zorder() for t in test) > max(t.get_zorder() for t in train)
    texts = [t.get_text() for t in figure.legends[0].get_texts()]
    assert texts[:2] == ["a", "b"] and "test" in texts


def test_the_compare_curves_name_each_run_once_and_leave_no_slot_empty():
    """Before, every difference panel's title named its run again (``flax_linen - pure_jax:
    ...``) and the reference's difference slot held a flat line at 0: nothing to read."""
    names = ["pure_jax", "flax_linen", "equinox"]
    curves = {name: run_curves(seed=k) for k, name in enumerate(names)}
    figure = charts.comparison_figure(curves, reference="pure_jax", title="t")
    axes = figure.axes
    assert len(axes) == 2 * len(names)
    for name in names:
        assert sum(name in ax.get_title() for ax in axes) == 1, name
    slot = axes[len(names)]  # under the reference, the first column
    assert not slot.axison and not slot.get_lines()
    assert [t.get_text() for t in slot.texts] == ["this row:\neach run's loss\nminus pure_jax's"]
    for ax in axes:
        assert ax is slot or ax.get_lines(), ax.get_title()
    first = axes[len(names) + 1]
    assert "minus pure_jax" in first.get_ylabel()
    assert any(label.get_visible() and label.get_text() for label in first.get_yticklabels())


# --- the title of a run resumed in another framework ---------------------------------------------


def write_run(directory: Path, resumes: list[dict]) -> Path:
    directory.mkdir(exist_ok=True)
    record = {"command": "train", "impl": "pure_jax", "config": {}, "resumes": resumes}
    (directory / rundir.CONFIG_FILE).write_text(json.dumps(record))
    return directory


def test_a_run_is_titled_with_every_implementation_that_trained_it(tmp_path):
    def title(resumes, current, last=88):
        return runpictures.run_title(write_run(tmp_path, resumes), current, [{"step": last}])

    assert title([], "pure_jax") == "pure_jax"
    keras = {"step": 44, "impl": "keras", "from": "pure_jax"}
    assert title([keras], "keras") == "pure_jax (steps 1-44), then keras (45-88)"
    haiku = {"step": 60, "impl": "haiku", "from": "keras"}
    assert title([keras, haiku], "haiku", 90) == (
        "pure_jax (steps 1-44), then keras (45-60), then haiku (61-90)"
    )
    # keras stopped, and went back to the checkpoint at step 20 (its steps after 20 are gone)
    back = {"step": 20, "impl": "equinox", "from": "pure_jax"}
    assert title([keras, back], "equinox") == "pure_jax (steps 1-20), then equinox (21-88)"
    assert title([{"step": 44, "impl": "pure_jax", "from": "pure_jax"}], "pure_jax") == "pure_jax"
    # resumed at the last step: nothing left to train, the steps are all pure_jax's
    assert title([{"step": 88, "impl": "keras", "from": "pure_jax"}], "keras") == "pure_jax"


@pytest.mark.needs_flax  # resumed in Flax Linen: the flax environment runs it
def test_a_resumed_run_draws_its_curves_under_both_names_and_leaves_no_lock(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    assert not (out / rundir.LOCK_FILE).exists()
    titles = []
    draw = charts.metric_panels
    monkeypatch.setattr(
        charts, "metric_panels", lambda *a, **k: (titles.append(k["title"]), draw(*a, **k))[1]
    )
    assert main(["train", "--resume", str(out), "--impl", "flax_linen", "--epochs", "2"]) == 0
    steps = [r["step"] for r in metricslog.read_metrics(out / rundir.METRICS_FILE)]
    half = max(steps) // 2
    assert titles == [
        f"pure_jax (steps 1-{half}), then flax_linen ({half + 1}-{max(steps)}) on synthetic"
    ]
    assert not (out / rundir.LOCK_FILE).exists()


# --- run.lock -------------------------------------------------------------------------------------


def test_the_lock_file_is_removed_when_its_run_ends_however_it_ends(tmp_path):
    path = tmp_path / rundir.LOCK_FILE
    with runlock.RunLock.acquire(tmp_path, command="train", field="out"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()
    with pytest.raises(OutputError), runlock.RunLock.acquire(tmp_path, command="t", field="out"):
        raise OutputError("refused under the lock")
    assert not path.exists()
    with runlock.RunLock.acquire(tmp_path, command="train", field="out"):
        with pytest.raises(OutputError, match="held by pid"):  # refused: the holder's file stays
            runlock.RunLock.acquire(tmp_path, command="train --resume", field="resume")
        assert json.loads(path.read_text())["command"] == "train"
    assert not path.exists()


def test_a_lock_file_released_between_open_and_lock_is_opened_again(tmp_path, monkeypatch):
    """Removing the file on release is safe only if a process that opened it just before it was
    removed does not then lock the removed file: it must lock the one the path names."""
    path = tmp_path / rundir.LOCK_FILE
    real = runlock.RunLock._lock
    calls = []

    def released_meanwhile(descriptor):
        calls.append(descriptor)
        if len(calls) == 1:
            path.unlink()  # the holder released it after this process opened it
        return real(descriptor)

    monkeypatch.setattr(runlock.RunLock, "_lock", staticmethod(released_meanwhile))
    lock = runlock.RunLock.acquire(tmp_path, command="train", field="out")
    try:
        assert len(calls) == 2
        assert json.loads(path.read_text())["pid"] == os.getpid()  # the file the path names
        assert os.fstat(lock._descriptor).st_ino == os.stat(path).st_ino
    finally:
        lock.release()
    assert not path.exists()


# --- --overwrite --------------------------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}  # fmt: skip


def test_overwrite_refuses_a_run_holding_files_no_run_wrote_naming_them(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "x.png").write_bytes(b"picture")
    before = snapshot(out)
    capsys.readouterr()
    assert main(["train", *TINY, "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("cvae: error: --out: expected a previous run holding only its own")
    assert "--overwrite deletes them" in err
    assert f"got {out} with 2 that no run wrote: mine/, notes.txt; move them out of {out}" in err
    assert snapshot(out) == before  # nothing deleted, nothing written
    (out / "notes.txt").unlink()
    (out / "mine" / "x.png").unlink()
    (out / "mine").rmdir()
    (out / ".samples.png.4711.0123abcd.tmp").write_bytes(b"half")  # a killed run's, the run's
    (out / ".cvae-probe-k2j4h1").mkdir()  # a killed check's probe
    assert main(["train", *TINY, "--out", str(out), "--overwrite"]) == 0
    assert not (out / ".samples.png.4711.0123abcd.tmp").exists()
    assert not (out / ".cvae-probe-k2j4h1").exists()


def test_a_compare_directory_is_checked_folder_by_folder(tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / rundir.CONFIG_FILE).write_text(json.dumps({"command": "compare", "impls": ["pure_jax"],
                                                      "folders": ["pure_jax"]}))  # fmt: skip
    (out / "summary.md").write_text("|")
    (out / "pure_jax").mkdir()
    for name in (rundir.CONFIG_FILE, rundir.PARAMS_FILE, "notes.txt"):
        (out / "pure_jax" / name).write_text("x")
    (out / "keras").mkdir()  # not a folder the compare wrote
    assert rundir.foreign_entries(out) == ["keras/", "pure_jax/notes.txt"]
    with pytest.raises(OutputError, match="2 that no run wrote: keras/, pure_jax/notes.txt"):
        rundir.check_out_dir(out, overwrite=True)


def test_the_run_names_agree_with_the_modules_that_write_them():
    assert rundir.TB_DIR == app_run.TB_DIR
    assert rundir.PROFILE_DIR == app_run.PROFILE_DIR
    assert rundir.DAMAGED_DIR == resuming.DAMAGED_DIR


# --- the note under the compare table ------------------------------------------------------------


def rows(**diffs: float) -> list[dict]:
    return [
        {"impl": name, "reference": "pure_jax", "max_param_diff": diff, "test_loss": 21.0 + diff}
        for name, diff in {"pure_jax": 0.0, **diffs}.items()
    ]


def test_the_compare_table_explains_a_max_dparam_above_zero():
    same = rows(flax_linen=0.0, haiku=0.0)
    assert compare.dparam_note(same) is None
    assert compare.text_table(same) == compare.summary_table(same, compare.COLUMNS)
    assert compare.summary_markdown(same) == compare.markdown_table(same) + "\n"

    drifted = rows(flax_linen=0.0, equinox=0.9, keras=0.8)
    note = compare.dparam_note(drifted)
    assert note.startswith("max |dparam|: equinox 9.00e-01 and keras 8.00e-01 are not ")
    assert "bit-identical to pure_jax" in note and "docs/evaluation.md" in note
    assert "[out, in]" in note and "Keras 3" in note
    assert "test losses within 9.0e-01 nats of pure_jax's" in note
    assert "flax_linen" not in note
    assert compare.text_table(drifted).splitlines()[-1] == note
    assert compare.summary_markdown(drifted).endswith(f"\n\n{note}\n")

    mine = compare.dparam_note(rows(mine=1e-6))
    assert mine.startswith("max |dparam|: mine 1.00e-06 is not bit-identical")
    assert "[out, in]" not in mine and "Keras" not in mine
