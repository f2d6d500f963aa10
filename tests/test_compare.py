"""``cvae compare``'s outputs (``shared/app/compare.py``): a Markdown table that renders as one,
rows and folders by implementation name, active units out of the latent size, and a curves figure
in which implementations that agree can all be seen."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image
from test_protocol import outside_package, renamed_pure_jax

from cvae_rosetta.app import charts, compare, evaluate
from cvae_rosetta.cli import main
from cvae_rosetta.spec import protocol

TINY = [
    *("--data", "synthetic", "--epochs", "1", "--batch-size", "128", "--latent-dim", "3"),
    *("--encoder-dims", "8", "--decoder-dims", "8", "--iw-samples", "1", "--no-progress"),
]
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def cells(line: str) -> list[str]:
    """A Markdown table row's cells, split as a renderer splits them: on pipes not escaped."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip() for c in UNESCAPED_PIPE.split(inner)]


def check_markdown_table(text: str) -> list[list[str]]:
    lines = text.strip().splitlines()
    header, rule, *body = (cells(line) for line in lines)
    assert len(header) == len(compare.COLUMNS), header
    assert all(re.fullmatch(r":?-{3,}:?", c) for c in rule) and len(rule) == len(header)
    for row in body:
        assert len(row) == len(header), (row, header)
    return [header, *body]


def test_the_markdown_table_has_as_many_cells_in_every_row_as_in_its_header():
    row = {key: 1.0 for key, _, _ in compare.COLUMNS}
    row.update(impl="pure_jax", active="2/32", max_param_diff=0.0)
    table = check_markdown_table(compare.markdown_table([row, {**row, "impl": "x|y"}]))
    assert r"max \|dparam\|" in compare.markdown_table([row]).splitlines()[0]
    assert table[0][-1] == r"max \|dparam\|" and table[2][0] == r"x\|y"


def test_names_are_made_unique_for_rows_and_folders():
    impls = [
        protocol.load("pure_jax"),
        type("Impl", (), {"name": "mine/yours"})(),
        protocol.load("pure_jax"),
        object(),
    ]
    specs = ["pure_jax", "pkg.mod:impl", "pure_jax", "pkg.other:thing"]
    assert compare.labels(impls, specs) == [
        "pure_jax",
        "mine_yours",
        "pure_jax-2",
        "pkg.other_thing",
    ]


def colour_pixels(path, runs: list[str]) -> dict[str, int]:
    """How many pixels of the figure have each run's colour (matplotlib's tab10, in order)."""
    from matplotlib import colormaps

    rgb = np.asarray(Image.open(path).convert("RGB")).astype(int)
    found = {}
    for i, run in enumerate(runs):
        colour = np.array(colormaps["tab10"].colors[i]) * 255
        found[run] = int((np.abs(rgb - colour).max(axis=-1) <= 12).sum())
    return found


def test_agreeing_curves_are_each_visible(tmp_path):
    """Five runs with the very same curves: each one's colour covers many pixels (a curve, not
    only a legend entry), where one set of axes overlaid shows only the last."""
    steps = np.arange(1, 41)
    one = {
        "train loss": list(zip(steps, 100 / np.sqrt(steps), strict=True)),
        "test loss": [(s, 90 / np.sqrt(s)) for s in (10, 20, 30, 40)],
        "train kl": list(zip(steps, np.log(steps), strict=True)),
    }
    runs = ["pure_jax", "flax_linen", "flax_nnx", "haiku", "equinox"]
    curves = {run: one for run in runs}
    path = charts.comparison_curves(curves, tmp_path / "c.png", reference="pure_jax", title="t")
    shown = colour_pixels(path, runs)
    assert min(shown.values()) >= 1000, shown
    overlaid = colour_pixels(charts.metric_panels(curves, tmp_path / "o.png"), runs)
    assert min(overlaid.values()) < 1000  # the check above tells the two apart
    with pytest.raises(Exception, match="reference: expected one of"):
        charts.comparison_curves(curves, tmp_path / "x.png", reference="nope")


def test_a_compare_names_rows_and_folders_by_implementation(tmp_path, monkeypatch, capsys):
    """Built-in pure JAX and a copy of it given as ``module:attribute`` that calls itself
    ``pure_jax`` too: rows and folders ``pure_jax`` and ``pure_jax-2`` (never the module path);
    ``active`` reads ``k/3``; ``cvae evaluate --run`` finds every folder."""
    outside_package(tmp_path, monkeypatch, "cmp_pkg_xyz", renamed_pure_jax("pure_jax"))
    out = tmp_path / "cmp"
    impls = ["pure_jax", "cmp_pkg_xyz.mine:implementation"]
    assert main(["compare", "--impls", ",".join(impls), "--out", str(out), *TINY]) == 0
    summary = json.loads((out / "summary.json").read_text())
    names = [row["impl"] for row in summary["rows"]]
    assert names == ["pure_jax", "pure_jax-2"]
    assert [row["target"] for row in summary["rows"]] == impls
    assert summary["reference"] == "pure_jax"
    for name, spec in zip(names, impls, strict=True):
        assert json.loads((out / name / "config.json").read_text())["impl"] == spec
        assert (out / name / "params.npz").is_file()
    assert not list(out.glob("*:*"))
    for row in summary["rows"]:
        collapsed = " collapsed" if row["posterior_collapse"] else ""
        assert row["active"] == f"{row['active_units']}/3{collapsed}"
        assert row["max_param_diff"] == 0.0  # the same arithmetic twice
    markdown, *notes = (out / "summary.md").read_text().rstrip("\n").split("\n\n")  # notes last
    table = check_markdown_table(markdown)
    active = [h for _, h, _ in compare.COLUMNS].index("active")
    assert [r[0] for r in table[1:]] == names
    assert all(re.fullmatch(r"\d+/3( collapsed)?", r[active]) for r in table[1:])
    assert notes == compare.notes(summary["rows"])
    assert min(colour_pixels(out / "curves.png", names).values()) >= 1000
    capsys.readouterr()
    (out / "pure_jax-2" / evaluate.EVALUATION_FILE).unlink()
    assert main(["evaluate", "--run", str(out), "--iw-samples", "1"]) == 0
    assert (out / "pure_jax-2" / evaluate.EVALUATION_FILE).is_file()
