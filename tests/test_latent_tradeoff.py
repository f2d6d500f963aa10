"""benchmarks/latent_tradeoff.py in a smoke configuration: the bundled digits, 1 epoch, two latent
sizes; the result file's schema (read back by ``results.load``) and the render step's table between
the page's markers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from run_helpers import benchmark_script

from cvae_rosetta.bench import results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def script():
    return benchmark_script("latent_tradeoff")


RUN_KEYS = {
    "latent_dim", "epochs", "steps", "neg_elbo", "neg_iwae", "recon", "kl", "active_units",
    "gen_accuracy", "gen_accuracy_worst_class", "gen_accuracy_bernoulli",
    "gen_accuracy_at_temperature", "diversity", "diversity_at_temperature", "train_loss",
    "train_seconds", "seconds", "command",
}  # fmt: skip


def test_smoke_measurement_and_render(script, tmp_path):
    out = tmp_path / "latent_tradeoff.json"
    page = tmp_path / "evaluation.md"
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    assert script.BEGIN in doc and script.END in doc  # the real page has the markers
    page.write_text(doc)

    argv = ["--out", str(out), "--set", "digits:1", "--latents", "2,3", "--iw-samples", "2"]
    argv += ["--samples-dir", str(tmp_path), "--doc", str(page)]
    assert script.main(argv) == 0

    result = results.load(out)
    assert (result["schema"], result["kind"]) == (results.SCHEMA, "latent_tradeoff")
    assert result["command"] == ["python", "benchmarks/latent_tradeoff.py", *argv]
    assert result["started"] and result["environment"]["cpu_count"]
    assert {"jax", "jaxlib", "numpy", "scikit-learn"} <= set(result["environment"]["versions"])
    assert result["impl"] == "pure_jax" and result["iw_samples"] == 2
    (entry,) = result["sets"]
    assert entry["data"] == "digits" and entry["epochs"] == 1 and entry["subset"] is None
    assert (entry["train_size"], entry["test_size"]) == (1437, 360)
    assert 0.9 < entry["classifier"]["test_accuracy"] <= 1.0
    assert [run["latent_dim"] for run in entry["runs"]] == [2, 3]
    for run in entry["runs"]:
        assert set(run) == RUN_KEYS
        assert run["neg_iwae"] <= run["neg_elbo"] + 1.0 and run["kl"] >= 0
        assert 0 <= run["gen_accuracy"] <= 1 and 0 <= run["active_units"] <= run["latent_dim"]
        temperatures = {str(t) for t in script.TEMPERATURES}
        assert set(run["gen_accuracy_at_temperature"]) == temperatures
        assert set(run["diversity_at_temperature"]) == temperatures
        assert run["command"] == (
            f"cvae train --impl pure_jax --data digits --epochs 1 --latent-dim {run['latent_dim']}"
        )
    assert "samples_picture" not in entry  # 8x8 digits get none
    assert (tmp_path / script.CURVE_FILE).stat().st_size > 0

    rendered = page.read_text()
    head, rest = rendered.split(script.BEGIN, 1)
    table, tail = rest.split(script.END, 1)
    assert table == "\n" + script.table(result) + "\n"
    assert "| bundled digits (8x8), 1,437 train / 360 test, 1 epoch | 2 |" in table
    # only the text between the markers changed
    assert head == doc.split(script.BEGIN, 1)[0] and tail == doc.split(script.END, 1)[1]

    # --merge appends another measurement's sets, each keeping its command
    other = json.loads(out.read_text())
    other["command"] = ["python", "benchmarks/latent_tradeoff.py", "--set", "digits:2"]
    del other["sets"][0]["command"]
    other["sets"][0]["epochs"] = 2
    (tmp_path / "other.json").write_text(json.dumps(other))
    merged = script.merge(out, [tmp_path / "other.json"])
    assert [e["epochs"] for e in merged["sets"]] == [1, 2]
    assert merged["sets"][1]["command"] == "python benchmarks/latent_tradeoff.py --set digits:2"
    assert json.loads(out.read_text()) == merged
    assert f"and `{merged['sets'][1]['command']}`" in script.table(merged)
    other["seed"] = 1
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="seed"):
        script.merge(out, [tmp_path / "other.json"])


def test_the_committed_result_is_what_the_page_shows(script):
    result = results.load(ROOT / "benchmarks" / "results" / "latent_tradeoff_cpu.json")
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    assert f"{script.BEGIN}\n{script.table(result)}\n{script.END}" in doc


def test_the_pictures_are_drawn_for_the_width_the_page_shows_them_at(script, tmp_path):
    """The curve (from the committed result) and a samples picture (from made-up 28x28 images)
    are ``plots.FIGURE_WIDTH`` inches at ``plots.FIGURE_DPI``: twice the 688 px the page fixes,
    with every image of a label in its row of the mosaic."""
    from PIL import Image

    from cvae_rosetta.bench import plots

    wide = round(plots.FIGURE_WIDTH * plots.FIGURE_DPI)
    assert wide == 2 * plots.DISPLAY_WIDTH
    result = results.load(ROOT / "benchmarks" / "results" / "latent_tradeoff_cpu.json")
    script.curve(result, tmp_path / "curve.png")
    assert Image.open(tmp_path / "curve.png").width == wide

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), script.SAMPLES_PER_LABEL)
    grids = [(latent, (rng.random((labels.size, 784)), labels)) for latent in (2, 4, 8, 16, 32)]
    file = script.samples_picture("mnist", (28, 28), grids, tmp_path)
    assert Image.open(tmp_path / file).width == wide
    x, c = grids[0][1]
    mosaic, rows = script._mosaic(x, c, 28, 28)
    assert rows == list(range(10))
    gap = script.MOSAIC_GAP
    top, left = gap + 3 * (28 + gap), gap + 5 * (28 + gap)  # label 3's sixth image
    assert np.allclose(mosaic[top : top + 28, left : left + 28], x[c == 3][5].reshape(28, 28))
