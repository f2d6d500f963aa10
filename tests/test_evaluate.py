"""``cvae_rosetta.app.evaluate`` and ``cvae evaluate``: each figure against a hand check, then the
CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvae_rosetta.app import compare, data, evaluate, paramsfile, runlock
from cvae_rosetta.app.run import RunKeys
from cvae_rosetta.cli import main
from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.config import Config, DataConfig, ModelConfig, TrainConfig
from cvae_rosetta.spec.validation import Batch

LOG_2PI = math.log(2 * math.pi)
TINY = [
    *("--data", "synthetic", "--epochs", "1", "--batch-size", "64", "--latent-dim", "2"),
    *("--encoder-dims", "8", "--decoder-dims", "8", "--iw-samples", "4", "--no-progress"),
]


@pytest.fixture(scope="module")
def setup():
    dataset = data.synthetic(num_train=256, num_test=64)
    config = Config(
        model=ModelConfig(
            input_dim=64, num_classes=10, latent_dim=3, encoder_dims=(16,), decoder_dims=(16,)
        ),
        data=DataConfig(name="synthetic"),
        train=TrainConfig(epochs=1),
    )
    impl = protocol.load("pure_jax")
    return impl, impl.init(jax.random.key(0), config), dataset


# --- the bounds -----------------------------------------------------------------------------------


def log_sigmoid(v):
    return -np.logaddexp(0.0, -v)


def test_log_weights_match_a_hand_computation(setup):
    impl, state, dataset = setup
    x, c = dataset.test.x[:8], dataset.test.c[:8]
    eps = np.asarray(jax.random.normal(jax.random.key(1), (1, 8, 3)))
    log_px, log_ratio = evaluate.log_terms(impl, state, x, c, eps)

    mean, logvar = (np.asarray(a, np.float64) for a in impl.encode(state, x, c))
    z = mean + np.exp(0.5 * logvar) * eps[0]
    logits = np.asarray(impl.decode(state, jnp.asarray(z, jnp.float32), c), np.float64)
    hand_px = np.sum(x * log_sigmoid(logits) + (1 - x) * log_sigmoid(-logits), axis=-1)
    hand_pz = np.sum(-0.5 * z**2 - 0.5 * LOG_2PI, axis=-1)
    hand_qz = np.sum(-0.5 * eps[0] ** 2 - 0.5 * logvar - 0.5 * LOG_2PI, axis=-1)
    np.testing.assert_allclose(log_px[0], hand_px, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(log_ratio[0], hand_pz - hand_qz, rtol=1e-5, atol=1e-4)

    # k = 1: the importance-weighted bound is exactly the one-sample ELBO estimate
    log_w = log_px + log_ratio
    np.testing.assert_array_equal(evaluate.iwae_bound(log_w), log_w[0])


def test_iwae_is_at_least_the_elbo_on_the_same_draws(setup):
    impl, state, dataset = setup
    eps = np.asarray(jax.random.normal(jax.random.key(2), (32, 16, 3)))
    log_px, log_ratio = evaluate.log_terms(
        impl, state, dataset.test.x[:16], dataset.test.c[:16], eps
    )
    log_w = log_px + log_ratio
    iwae, elbo = evaluate.iwae_bound(log_w), log_w.mean(axis=0)
    assert np.all(iwae >= elbo - 1e-12)  # Jensen, per example
    assert np.all(iwae <= log_w.max(axis=0) + 1e-12)
    assert np.mean(iwae - elbo) > 1e-3  # and strictly tighter for a non-degenerate posterior


def test_bounds_over_a_split(setup):
    impl, state, dataset = setup
    key = jax.random.key(3)
    many = evaluate.bounds(impl, state, dataset.test, 64, key)
    one = evaluate.bounds(impl, state, dataset.test, 1, key)
    assert many["neg_iwae"] < many["neg_elbo"]
    assert many["neg_elbo"] == pytest.approx(many["recon"] + many["kl"], abs=1e-9)
    # the analytic KL is the trainer's, and the ELBO is the loss in expectation
    loss = jax.jit(impl.loss)
    batch = Batch(jnp.asarray(dataset.test.x), jnp.asarray(dataset.test.c))
    losses = [loss(state, batch, jax.random.key(i))[1] for i in range(8)]
    assert many["kl"] == pytest.approx(float(losses[0]["kl"]), rel=1e-5)
    assert many["neg_elbo"] == pytest.approx(np.mean([float(m["loss"]) for m in losses]), abs=0.2)
    # k = 1 estimates the same ELBO (with a sampled KL), so it sits close to it
    assert one["neg_iwae"] == pytest.approx(one["neg_elbo"], abs=0.3)
    assert many["means"].shape == (len(dataset.test), 3)


def test_chunking_does_not_change_the_bounds(setup, monkeypatch):
    impl, state, dataset = setup
    whole = evaluate.bounds(impl, state, dataset.test, 8, jax.random.key(4))
    monkeypatch.setattr(evaluate, "ROWS_PER_CALL", 8 * 5)  # chunks of 5 rows, the last padded
    cut = evaluate.bounds(impl, state, dataset.test, 8, jax.random.key(4))
    assert cut["kl"] == pytest.approx(whole["kl"], rel=1e-6)
    # the same rows through matmuls of another shape: equal to float32 rounding (values near zero
    # differ by ~1e-8 absolute, which no relative tolerance covers)
    np.testing.assert_allclose(cut["means"], whole["means"], rtol=1e-6, atol=1e-6)
    # different noise per chunk, so the sampled terms agree only statistically
    assert cut["neg_iwae"] == pytest.approx(whole["neg_iwae"], abs=0.5)


def test_logsumexp_is_stable():
    log_w = np.array([[-1000.0], [-1000.0 - math.log(3.0)]])
    expected = -1000.0 + math.log(1 + 1 / 3) - math.log(2)
    assert evaluate.iwae_bound(log_w)[0] == pytest.approx(expected, abs=1e-12)
    assert np.mean(np.exp(log_w)) == 0.0  # the naive log(mean(exp)) would give -inf
    assert evaluate.logsumexp(np.array([[800.0], [800.0]]))[0] == pytest.approx(800 + math.log(2))


def test_kl_per_example():
    mean = np.array([[0.0, 0.0], [1.0, 0.0]])
    logvar = np.array([[0.0, 0.0], [0.0, math.log(2.0)]])
    np.testing.assert_allclose(
        evaluate.kl_per_example(mean, logvar), [0.0, 0.5 + 0.5 * (2 - 1 - math.log(2))]
    )


# --- active units, diversity, the classifier ------------------------------------------------------


def test_active_units_on_a_constructed_case():
    signs = np.where(np.arange(100) % 2 == 0, 1.0, -1.0)[:, None]  # population variance = a^2
    amplitudes = np.array([0.0, 0.05, 0.2, 0.0999, 0.1001, 3.0])
    means = 7.0 + signs * amplitudes  # an offset does not make a unit active
    count, variances = evaluate.active_units(means)
    np.testing.assert_allclose(variances, amplitudes**2, atol=1e-12)
    assert count == 3  # 0.2, 0.1001 and 3.0: variances above 0.01, strictly
    assert evaluate.active_units(means, threshold=0.05)[0] == 1


@pytest.mark.parametrize(
    ("active", "kl", "collapsed"),
    [(0, 3.0, True), (4, 0.099, True), (1, 0.1, False), (4, 17.0, False)],
)
def test_posterior_collapse_is_no_active_unit_or_a_kl_below_the_floor(active, kl, collapsed):
    result = {"active_units": active, "kl": kl, "latent_dim": 4}
    note = evaluate.collapse_note(result)
    assert (note is not None) == collapsed
    if collapsed:
        assert note.startswith(f"posterior collapse: the latent code is unused ({active}/4 ")
        assert f"kl {kl:.3f} nats per example" in note and "bernoulli" in note
    rows = [{"impl": "a", "posterior_collapse": collapsed}, {"impl": "b"}]
    said = compare.collapse_rows_note(rows)
    assert (said is not None and said.startswith("posterior collapse in a: ")) == collapsed


def test_spread_and_diversity_by_hand():
    assert evaluate.spread(np.array([[0.0, 0.0], [3.0, 4.0]])) == pytest.approx(5 / math.sqrt(2))
    assert evaluate.spread(np.ones((1, 4))) is None
    rng = np.random.default_rng(0)
    real = data.Split(rng.random((40, 6)).astype(np.float32), np.arange(40, dtype=np.int32) % 4)
    centroids = np.stack([real.x[real.c == k].mean(axis=0) for k in range(4)])

    same, per_class = evaluate.diversity(real.x, real.c, real, 4)
    assert same == pytest.approx(1.0) and per_class == pytest.approx([1.0] * 4)
    half = centroids[real.c] + 0.5 * (real.x - centroids[real.c])
    assert evaluate.diversity(half, real.c, real, 4)[0] == pytest.approx(0.5)
    prototypes = centroids[real.c]  # one image per class, whatever z
    assert evaluate.diversity(prototypes, real.c, real, 4)[0] == pytest.approx(0.0, abs=1e-7)
    # a class without two real test images has no ratio, and is left out of the mean
    only = data.Split(real.x[real.c != 3], real.c[real.c != 3])
    score, per_class = evaluate.diversity(real.x, real.c, only, 4)
    assert per_class[3] is None and score == pytest.approx(1.0)


def test_the_classifier_reports_its_accuracy_on_real_test_data():
    digits = data.load_digits()
    clf = evaluate.fit_classifier(digits)
    predicted = clf.predict(digits.test.x)
    assert clf.test_accuracy == np.mean(predicted == digits.test.c)
    assert clf.test_accuracy > 0.95 and clf.train_examples == len(digits.train)
    assert clf.test_per_class == evaluate.per_class(predicted, digits.test.c, 10)
    assert evaluate.fit_classifier(dataclasses.replace(digits, train=_one_class(digits))) is None


READ_BACK = """import sys, numpy as np
from cvae_rosetta.app import data, evaluate
clf = evaluate.fit_classifier(data.load_digits())
np.save(sys.argv[1], clf.predict(np.load(sys.argv[2])))
print('sklearn' in sys.modules)
"""


def test_the_classifier_is_kept_and_votes_as_scikit_learns_own_prediction(tmp_path, monkeypatch):
    """The kept classifier labels the digits' test split, 2,000 uniform and 1,000 binary random
    images exactly as scikit-learn's SVC fit on the same split does, fit here or read back by a
    new process, which never imports scikit-learn; a damaged file is passed over and the
    classifier fit and kept again."""
    import subprocess
    import sys

    from sklearn.svm import SVC

    monkeypatch.setenv(data.DATA_CACHE_ENV, str(tmp_path / "cache"))  # the split kept there too
    digits = data.load_digits()
    svc = SVC(kernel="rbf", C=1.0, gamma="scale")
    svc.fit(np.asarray(digits.train.x, np.float64), digits.train.c)
    rng = np.random.default_rng(0)
    images = np.concatenate(
        [digits.test.x, rng.random((2000, 64)), rng.random((1000, 64)) > 0.6]
    ).astype(np.float32)
    want = svc.predict(np.asarray(images, np.float64))

    np.testing.assert_array_equal(evaluate.fit_classifier(digits).predict(images), want)
    [kept] = (tmp_path / "cache").glob("classifier-*.npz")
    np.save(tmp_path / "images.npy", images)
    run = subprocess.run(
        [sys.executable, "-c", READ_BACK, str(tmp_path / "read.npy"), str(tmp_path / "images.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "read.npy"), want)
    assert run.stdout.strip() == "False"  # read back: scikit-learn never imported
    kept.write_bytes(b"not an npz")
    np.testing.assert_array_equal(evaluate.fit_classifier(digits).predict(images), want)
    np.testing.assert_array_equal(evaluate.KernelVotes.load(kept).predict(images), want)


def _one_class(ds):
    rows = ds.train.c == 0
    return data.Split(ds.train.x[rows], ds.train.c[rows])


@dataclasses.dataclass(frozen=True)
class FixedImages:
    """A generator that ignores z: ``decode(z, c)`` is the image ``table[(c + shift) % K]``."""

    base: object
    table: np.ndarray
    shift: int = 0
    name: str = "fixed"

    def encode(self, state, x, c):
        return self.base.encode(state, x, c)

    def decode(self, state, z, c):
        p = jnp.clip(jnp.asarray(self.table), 1e-4, 1 - 1e-4)[(c + self.shift) % len(self.table)]
        return jnp.log(p) - jnp.log1p(-p) + 0.0 * z[:, :1]


def test_a_prototype_generator_scores_zero_diversity(setup, tmp_path):
    impl, state, dataset = setup
    centroids = np.stack([dataset.train.x[dataset.train.c == k].mean(axis=0) for k in range(10)])
    right = evaluate.evaluate(
        FixedImages(impl, centroids), state, dataset, evaluate.EvalSetup(0, iw_samples=4)
    )
    assert right["diversity"] == pytest.approx(0.0, abs=1e-6)
    assert right["conditional_accuracy"]["mean_images"]["overall"] == 1.0
    assert right["classifier"]["test_accuracy"] > 0.9
    wrong = evaluate.evaluate(
        FixedImages(impl, centroids, shift=1), state, dataset, evaluate.EvalSetup(0, iw_samples=4)
    )
    assert wrong["conditional_accuracy"]["mean_images"]["overall"] == 0.0
    assert wrong["conditional_accuracy"]["mean_images"]["per_class"] == [0.0] * 10


def test_evaluate_writes_its_pictures(setup, tmp_path):
    impl, state, dataset = setup
    result = evaluate.evaluate(
        impl, state, dataset, evaluate.EvalSetup(0, iw_samples=2), out=tmp_path
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [evaluate.GRID_FILE, evaluate.LATENT_FILE]
    assert result["iw_samples"] == 2 and result["latent_dim"] == 3
    assert len(result["unit_variances"]) == 3
    json.dumps(result, allow_nan=False)  # plain JSON, no NaN


# --- params.npz -----------------------------------------------------------------------------------


def test_params_round_trip(setup, tmp_path):
    impl, state, _ = setup
    params = impl.to_canonical(state)
    paramsfile.save_params(tmp_path / "params.npz", params)
    with np.load(tmp_path / "params.npz", allow_pickle=False) as npz:
        assert sorted(npz.files) == [
            "decoder/0/bias",
            "decoder/0/kernel",
            "decoder/1/bias",
            "decoder/1/kernel",
            "encoder/0/bias",
            "encoder/0/kernel",
            "latent/bias",
            "latent/kernel",
        ]
    back = paramsfile.load_params(tmp_path / "params.npz")
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert [p.name for p in tmp_path.iterdir()] == ["params.npz"]  # no temporary left


# --- the command line -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["train", "--out", str(out), *TINY]) == 0
    assert "-iwae(k=4)" in printed.getvalue() and "classifier on real test" in printed.getvalue()
    return out


def test_train_then_evaluate_end_to_end(trained):
    out = trained
    for name in ("params.npz", "evaluation.json", evaluate.GRID_FILE, evaluate.LATENT_FILE):
        assert (out / name).is_file(), name
    written = (out / "evaluation.json").read_text()
    result = json.loads(written)
    assert result["impl"] == "pure_jax" and result["iw_samples"] == 4
    assert result["neg_iwae"] <= result["neg_elbo"] + 0.5
    assert result["classifier"]["test_accuracy"] > 0.9

    # evaluating the saved parameters again gives the very same file
    (out / "evaluation.json").unlink()
    assert main(["evaluate", "--run", str(out), "--iw-samples", "4"]) == 0
    assert (out / "evaluation.json").read_text() == written


def test_compare_evaluates_every_implementation(tmp_path, capsys):
    """Built to collapse (the source guide's mse loss weighs the kl per latent unit against the
    squared error per pixel): the table, its notes, the row and evaluation.json say so."""
    out = tmp_path / "cmp"
    assert main(["compare", "--impls", "pure_jax", "--out", str(out), *TINY, "--loss", "mse"]) == 0
    row = json.loads((out / "summary.json").read_text())["rows"][0]
    for key in ("neg_elbo", "neg_iwae", "gen_accuracy", "classifier_accuracy", "diversity"):
        assert isinstance(row[key], float), key
    text = capsys.readouterr().out
    assert "gen acc" in text and "SVC scores" in text
    assert "\nsynthetic: 1 implementation, 1 epoch, batch 64, " in text  # counted, not "1 epochs"
    report = json.loads((out / "pure_jax" / "evaluation.json").read_text())
    assert report["posterior_collapse"] is True and report["collapse_kl"] == evaluate.COLLAPSE_KL
    assert row["posterior_collapse"] is True and row["active"].endswith(" collapsed")
    named = "posterior collapse in pure_jax: the latent code is unused"
    assert named in text and named in (out / "summary.md").read_text()
    assert "\n  posterior collapse: the latent code is unused" in evaluate.describe(report)
    first = (out / "pure_jax" / "evaluation.json").read_text()
    (out / "pure_jax" / "evaluation.json").unlink()
    assert main(["evaluate", "--run", str(out), "--iw-samples", "4"]) == 0  # every impl in it
    assert (out / "pure_jax" / "evaluation.json").read_text() == first


def _bad_cases(run_dir: Path, tmp: Path) -> dict[str, tuple[list[str], str, Path | None]]:
    """name -> (arguments, text the one line must hold, run directory whose files must survive)."""
    (tmp / "a_file").write_text("")
    (tmp / "not_a_run").mkdir()
    no_params = _copy_run(run_dir, tmp / "no_params")
    (no_params / "params.npz").unlink()
    broken = _copy_run(run_dir, tmp / "broken_params")
    (broken / "params.npz").write_bytes(b"not an npz file")
    bad_json = _copy_run(run_dir, tmp / "bad_json")
    (bad_json / "config.json").write_text("{not json")
    other_shape = _copy_run(run_dir, tmp / "other_shape")
    config = json.loads((other_shape / "config.json").read_text())
    config["config"]["model"]["latent_dim"] = 5
    (other_shape / "config.json").write_text(json.dumps(config))
    bad_field = _copy_run(run_dir, tmp / "bad_field")
    config["config"]["model"]["latent_dim"] = -1
    (bad_field / "config.json").write_text(json.dumps(config))
    wrong_keys = _copy_run(run_dir, tmp / "wrong_keys")
    np.savez(wrong_keys / "params.npz", weights=np.zeros(3))
    not_finite = _copy_run(run_dir, tmp / "not_finite")
    with np.load(not_finite / "params.npz") as npz:
        arrays = {key: npz[key] for key in npz.files}
    arrays["latent/bias"][0] = np.nan
    np.savez(not_finite / "params.npz", **arrays)
    return {
        "no such dir": ([str(tmp / "nope")], "--run: expected an existing run directory", None),
        "a file": ([str(tmp / "a_file")], "--run: expected a run directory, got the file", None),
        "not a run": ([str(tmp / "not_a_run")], "holding config.json", None),
        "no params": ([str(no_params)], "params.npz", no_params),
        "broken params": ([str(broken)], "expected an NPZ file", broken),
        "bad json": ([str(bad_json)], "config.json to be the JSON", bad_json),
        "other shape": ([str(other_shape)], "expected shape", other_shape),
        "bad field": ([str(bad_field)], "model.latent_dim: expected an integer >= 1", bad_field),
        "wrong keys": ([str(wrong_keys)], "expected keys like encoder/0/kernel", wrong_keys),
        "not finite": ([str(not_finite)], "latent/bias: expected finite values", not_finite),
        "iw zero": ([str(run_dir), "--iw-samples", "0"], "--iw-samples: expected an integer", None),
        "iw text": ([str(run_dir), "--iw-samples", "many"], "got 'many'", None),
        "iw huge": ([str(run_dir), "--iw-samples", "100000"], "in [1, 4096]", None),
    }


def _copy_run(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_bad_input_is_one_line_and_loses_nothing(trained, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()}
    for name, (args, message, kept) in _bad_cases(trained, tmp_path).items():
        files = {p.name: p.read_bytes() for p in kept.iterdir() if p.is_file()} if kept else {}
        assert main(["evaluate", "--run", *args]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("cvae: error: ") and err.count("\n") == 1, (name, err)
        assert message in err, (name, err)
        if kept:
            assert {p.name: p.read_bytes() for p in kept.iterdir() if p.is_file()} == files, name
    assert {p.name: p.read_bytes() for p in trained.iterdir() if p.is_file()} == before
    assert main(["evaluate"]) == 2
    assert "--run: expected a run directory" in capsys.readouterr().err


def test_a_run_another_process_writes_is_refused_naming_that_process(trained, tmp_path, capsys):
    """As cvae train holds a run it is writing (no params.npz yet): the holder is named, not a
    missing file."""
    out = _copy_run(trained, tmp_path / "being_written")
    (out / "params.npz").unlink()
    before = (out / "evaluation.json").read_bytes()
    with runlock.RunLock.acquire(out, command="train", field="out"):
        assert main(["evaluate", "--run", str(out)]) == 2
    line = capsys.readouterr().err
    assert line.startswith(
        f"cvae: error: --run: expected a run directory no other process is writing, got {out}, "
        f"held by pid {os.getpid()} on "
    )
    assert line.endswith(" (train)\n") and "\n" not in line[:-1]
    assert (out / "evaluation.json").read_bytes() == before  # nothing rewritten


def test_train_refuses_bad_iw_samples_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *TINY, "--iw-samples", "-2"]) == 2
    assert capsys.readouterr().err.startswith("cvae: error: --iw-samples: expected an integer")
    assert not out.exists()


def test_evaluation_keys_are_the_runs_own():
    keys = evaluate.EvalKeys.from_seed(0)
    run_keys = RunKeys.from_seed(0)
    data_of = jax.random.key_data
    used = [data_of(k).tolist() for k in dataclasses.astuple(run_keys)]
    mine = [data_of(k).tolist() for k in dataclasses.astuple(keys)]
    assert len({str(k) for k in used + mine}) == len(used) + len(mine)
    again = evaluate.EvalKeys.from_seed(0)
    assert [data_of(k).tolist() for k in dataclasses.astuple(again)] == mine
