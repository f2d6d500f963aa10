"""benchmarks/compare_defaults.py's block of docs/evaluation.md: the committed page is what the
committed result renders, and each figure under the table is computed from the result, checked on
a result made up so that a wrong computation gives another sentence."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from run_helpers import benchmark_script

from cvae_rosetta.bench import results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def script():
    return benchmark_script("compare_defaults")


def test_the_committed_result_is_what_the_page_shows(script):
    result = results.load(ROOT / "benchmarks" / "results" / "compare_cpu.json")
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    assert f"{script.BEGIN}\n{script.section(result)}\n{script.END}" in doc


def _evaluation(elbo, iwae, diversity_per_class, mean_acc):
    return {
        "neg_elbo": elbo,
        "neg_iwae": iwae,
        "recon": elbo - 1.5,
        "kl": 1.5,
        "active_units": 2,
        "latent_dim": 32,
        "iw_samples": 64,
        "conditional_accuracy": {
            "mean_images": {"overall": mean_acc},
            "bernoulli_samples": {"overall": 0.9},
        },
        "classifier": {"test_accuracy": 0.97},
        "diversity": sum(diversity_per_class) / len(diversity_per_class),
        "diversity_per_class": diversity_per_class,
    }


def test_the_figures_under_the_table_come_from_the_result(script):
    """Three implementations, one drifting: the bit-identical one is named, the drift is the
    drifting one's, the spread is over every ELBO, the diversity range is the reference's own per
    label (its lowest label 3, not label 0 and not the mean), the bound's gap spans every
    implementation."""
    rows = [
        {"impl": "pure_jax", "reference": "pure_jax", "max_param_diff": 0.0},
        {"impl": "haiku", "reference": "pure_jax", "max_param_diff": 0.0},
        {"impl": "equinox", "reference": "pure_jax", "max_param_diff": 1.25},
    ]
    evaluations = {
        "pure_jax": _evaluation(21.0, 20.8, [0.6, 0.7, 0.5, 0.3, 0.9], 1.0),
        "haiku": _evaluation(21.0, 20.8, [0.6, 0.7, 0.5, 0.3, 0.9], 1.0),
        "equinox": _evaluation(21.05, 20.75, [0.1, 0.2, 0.2, 0.2, 0.2], 0.99),
    }
    result = {
        "started": "2026-12-07 16:00:00 +0000",
        "environment": {"cpu_count": 2, "cpu_model": "a CPU", "versions": {"jax": "0.10.2"}},
        "load_average": {"start": [0.5, 0.4, 0.3]},
        "seconds": 95.4,
        "rows": rows,
        "evaluations": evaluations,
    }
    text = script.section(copy.deepcopy(result))
    assert "95 s for the whole command on 2 cores (a CPU, load average 0.5 at the start)" in (
        " ".join(text.split())
    )
    assert "(largest parameter difference 0): Haiku." in text
    assert "Largest parameter difference of the others: Equinox 1.25;" in text
    assert "within 0.05 nats of the others'" in text
    assert "ranges from 0.30 (label 3) to 0.90 (label 4)" in text
    assert "0.20 to 0.30 nats tighter than the ELBO at k = 64" in text
    assert "0.990 to 1.000 of them, against the classifier's 0.970" in text
    assert text.count("| Equinox |") == 1 and "| 21.050 | 20.750 |" in text
