"""``cvae evaluate``: how good a trained model is, measured through the protocol alone.

Every figure is computed from ``encode(state, x, c) -> (mean, logvar)`` and
``decode(state, z, c) -> logits``, so any implementation (one outside the repo included) is
measured by the same code. The definitions are in ``docs/evaluation.md``; in short:

* ``neg_elbo``: ``recon + kl`` per test example, averaged; ``recon`` is the Bernoulli negative
  log-likelihood averaged over the ``k`` posterior draws below, ``kl`` the analytic
  ``KL(q(z|x,c) || N(0, I))``. In expectation this is the trainer's test loss with beta = 1.
* ``neg_iwae``: ``-(logsumexp_j log w_j - log k)`` with ``log w_j = log p(x|z_j,c) + log p(z_j)
  - log q(z_j|x,c)`` and ``z_j ~ q(z|x,c)`` (Burda et al., 2016); reduced in float64 on the host.
  It is a tighter bound: ``neg_iwae <= neg_elbo`` in expectation, with equality at ``k = 1``.
* ``active_units``: latent units ``u`` with ``Var_x(E_q[z_u]) > 0.01`` over the test split.
* conditional accuracy: an RBF support-vector classifier fit on the real training split labels
  generated images; the score is the fraction labelled as the class they were generated for.
* ``diversity``: per class, the RMS distance of generated mean images from their centroid
  divided by that of the real test images of the class; the mean over classes.
* ``posterior_collapse``: no active unit, or ``kl`` below ``COLLAPSE_KL`` nats per example: the
  decoder ignores the latent code and draws each label's images from the label alone.

Every key is derived from the run's seed, so the same run evaluates to the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app import charts, data, images, paramsfile, rundir, runlock
from cvae_rosetta.app.data import Dataset, Split
from cvae_rosetta.app.optionchecks import check_iw_samples
from cvae_rosetta.app.run import DEFAULT_IW_SAMPLES, RunKeys
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, OutputError, ParameterError

ACTIVE_THRESHOLD = 0.01
COLLAPSE_KL = 0.1
"""Nats per test example below which the latent code counts as unused: the mean KL bounds the
information the code carries about an image from above, and 0.1 nats tell apart fewer than
``exp(0.1) = 1.1`` images (docs/evaluation.md, "Posterior collapse")."""
GENERATED_PER_CLASS = 100
GRID_PER_CLASS = 10
CLASSIFIER_MAX_TRAIN = 5000
ROWS_PER_CALL = 16384  # decoder rows per compiled call: examples per chunk = this // k

EVALUATION_FILE = rundir.EVALUATION_FILE
PARAMS_FILE = rundir.PARAMS_FILE
GRID_FILE = rundir.GENERATED_FILE
LATENT_FILE = rundir.LATENT_FILE

_LOG_2PI = math.log(2.0 * math.pi)


# --- keys -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvalKeys:
    """The keys of an evaluation, derived from the run's seed and used for nothing else."""

    iwae: jax.Array
    generate: jax.Array
    binarize: jax.Array

    @classmethod
    def from_seed(cls, seed: int) -> EvalKeys:
        # RunKeys.sample itself draws samples.png; fold_in(sample, 1) is a key of its own.
        base = jax.random.fold_in(RunKeys.from_seed(seed).sample, 1)
        return cls(*jax.random.split(base, 3))


# --- bounds ---------------------------------------------------------------------------------------


def logsumexp(a: np.ndarray, axis: int = 0) -> np.ndarray:
    """``log(sum(exp(a)))`` along ``axis`` in float64, shifted by the maximum (stable)."""
    a = np.asarray(a, dtype=np.float64)
    peak = np.max(a, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    total = np.log(np.sum(np.exp(a - peak), axis=axis, keepdims=True)) + peak
    return np.squeeze(total, axis=axis)


def iwae_bound(log_w: np.ndarray) -> np.ndarray:
    """The importance-weighted bound per example from ``log_w: [k, N]``: ``lse_j - log k``."""
    log_w = np.asarray(log_w, dtype=np.float64)
    return logsumexp(log_w, axis=0) - math.log(log_w.shape[0])


def kl_per_example(mean: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    """Analytic ``KL(N(mean, exp(logvar)) || N(0, I))`` per row, float64."""
    mean = np.asarray(mean, dtype=np.float64)
    logvar = np.asarray(logvar, dtype=np.float64)
    return 0.5 * np.sum(np.exp(logvar) + mean**2 - 1.0 - logvar, axis=-1)


def _bce(logits: jax.Array, x: jax.Array) -> jax.Array:
    """Bernoulli negative log-likelihood summed over pixels (``optax``'s stable form)."""
    import optax

    return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, x), axis=-1)


def _make_log_terms(impl):
    """Compiled ``(state, x, c, eps[k, B, L]) -> (log p(x|z,c), log p(z) - log q(z|x,c), mean,
    logvar)``, the first two ``[k, B]``."""

    def terms(state, x, c, eps):
        k, b, latent = eps.shape
        mean, logvar = impl.encode(state, x, c)
        mean, logvar = mean.astype(jnp.float32), logvar.astype(jnp.float32)
        z = mean[None] + jnp.exp(0.5 * logvar)[None] * eps
        logits = impl.decode(state, z.reshape(k * b, latent), jnp.tile(c, k))
        logits = logits.astype(jnp.float32).reshape(k, b, -1)
        log_px = -_bce(logits, jnp.broadcast_to(x.astype(jnp.float32), logits.shape))
        log_pz = -0.5 * jnp.sum(jnp.square(z) + _LOG_2PI, axis=-1)
        log_qz = -0.5 * jnp.sum(jnp.square(eps) + logvar[None] + _LOG_2PI, axis=-1)
        return log_px, log_pz - log_qz, mean, logvar

    return jax.jit(terms)


def _make_decode(impl):
    return jax.jit(lambda state, z, c: jax.nn.sigmoid(impl.decode(state, z, c).astype(jnp.float32)))


def log_terms(impl, state, x, c, eps, *, fn=None) -> tuple[np.ndarray, np.ndarray]:
    """``(log p(x|z_j,c), log p(z_j) - log q(z_j|x,c))``, each ``[k, B]``, for ``z_j`` from ``eps``.

    ``eps: [k, B, L]`` is the standard-normal noise of the k posterior draws of every example.
    """
    fn = fn or _make_log_terms(impl)
    log_px, log_ratio, _, _ = fn(
        state, jnp.asarray(x), jnp.asarray(c), jnp.asarray(eps, jnp.float32)
    )
    return np.asarray(log_px, np.float64), np.asarray(log_ratio, np.float64)


def bounds(impl, state, split: Split, k: int, key: jax.Array) -> dict[str, Any]:
    """Test-set ELBO and IWAE in nats (negated), reconstruction, KL and the posterior means."""
    latent = state.config.model.latent_dim
    n = len(split)
    chunk = min(n, max(1, ROWS_PER_CALL // k))
    fn = _make_log_terms(impl)
    recon, iwae, means, logvars = [], [], [], []
    for i, start in enumerate(range(0, n, chunk)):
        # every chunk has the same shape (the last is padded with rows from the start, which are
        # dropped again), so the evaluation compiles once
        rows = np.arange(start, start + chunk) % n
        real = min(chunk, n - start)
        eps = jax.random.normal(jax.random.fold_in(key, i), (k, chunk, latent), jnp.float32)
        out = fn(state, jnp.asarray(split.x[rows]), jnp.asarray(split.c[rows]), eps)
        log_px, log_ratio, mean, logvar = (np.asarray(a, np.float64) for a in out)
        log_px, log_ratio = log_px[:, :real], log_ratio[:, :real]
        mean, logvar = mean[:real], logvar[:real]
        recon.append(-np.mean(log_px, axis=0))
        iwae.append(iwae_bound(log_px + log_ratio))
        means.append(mean)
        logvars.append(logvar)
    mean, logvar = np.concatenate(means), np.concatenate(logvars)
    recon_i, kl_i = np.concatenate(recon), kl_per_example(mean, logvar)
    return {
        "neg_elbo": float(np.mean(recon_i + kl_i)),
        "neg_iwae": float(-np.mean(np.concatenate(iwae))),
        "recon": float(np.mean(recon_i)),
        "kl": float(np.mean(kl_i)),
        "means": mean,
    }


def collapse_note(result: dict[str, Any]) -> str | None:
    """One line naming posterior collapse, what it means and what usually helps; ``None`` when the
    latent code is used (some active unit and ``kl`` at or above :data:`COLLAPSE_KL`)."""
    active, kl, latent = result["active_units"], result["kl"], result["latent_dim"]
    if active > 0 and kl >= COLLAPSE_KL:
        return None
    return (
        f"posterior collapse: the latent code is unused ({active}/{latent} active units, kl "
        f"{kl:.3f} nats per example; collapsed below {COLLAPSE_KL:g} or with no active unit): "
        + COLLAPSE_MEANING
    )


COLLAPSE_MEANING = (
    "the decoder draws every image of a label from the label alone, so samples of one label "
    "look alike; what helps: the default bernoulli loss, or a smaller --beta (--loss mse averages "
    "over pixels, which weighs the kl far more; docs/evaluation.md, Posterior collapse)"
)


def active_units(means: np.ndarray, threshold: float = ACTIVE_THRESHOLD) -> tuple[int, list[float]]:
    """Units whose posterior mean varies across examples: ``Var_x(E_q[z_u]) > threshold``."""
    variances = np.var(np.asarray(means, np.float64), axis=0)
    return int(np.sum(variances > threshold)), [float(v) for v in variances]


# --- the classifier -------------------------------------------------------------------------------


@dataclasses.dataclass
class Classifier:
    """An independent judge of generated images, fit on real training images only."""

    model: Any
    description: str
    train_examples: int
    test_accuracy: float | None
    test_per_class: list[float | None]

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.predict(np.asarray(x, np.float64)))


CLASSIFIER = "sklearn.svm.SVC(kernel='rbf', C=1.0, gamma='scale')"


@dataclasses.dataclass(frozen=True)
class KernelVotes:
    """A fitted RBF SVC as its arrays, and its prediction as libsvm (scikit-learn's) makes it: for
    every pair of classes ``i < j`` the decision ``sum_s coef_s exp(-gamma |x - sv_s|^2) +
    intercept`` over the two classes' support vectors, a vote for ``i`` where it is positive and
    for ``j`` otherwise, and the first class with the most votes. Read from the data cache, it
    predicts without importing scikit-learn (about a second of every evaluation); a test holds its
    predictions equal to scikit-learn's."""

    support_vectors: np.ndarray  # [S, D], grouped by class
    dual_coef: np.ndarray  # [K - 1, S]
    intercept: np.ndarray  # [K (K - 1) / 2], the pairs in order
    n_support: np.ndarray  # [K]
    gamma: float
    classes: np.ndarray  # [K]

    @classmethod
    def of(cls, svc: Any) -> KernelVotes:
        return cls(
            np.asarray(svc.support_vectors_, np.float64),
            np.asarray(svc._dual_coef_, np.float64),
            np.asarray(svc._intercept_, np.float64),
            np.asarray(svc._n_support, np.int64),
            float(svc._gamma),
            np.asarray(svc.classes_),
        )

    def predict(self, x: np.ndarray) -> np.ndarray:
        x, sv = np.asarray(x, np.float64), self.support_vectors
        squared = np.sum(x * x, axis=1)[:, None] + np.sum(sv * sv, axis=1)[None, :] - 2 * x @ sv.T
        kernel = np.exp(-self.gamma * np.maximum(squared, 0.0))
        start = np.concatenate([[0], np.cumsum(self.n_support)])
        k, rows = len(self.classes), np.arange(len(x))
        votes, pair = np.zeros((len(x), k), np.int64), 0
        for i in range(k):
            for j in range(i + 1, k):
                mine, theirs = slice(start[i], start[i + 1]), slice(start[j], start[j + 1])
                decision = kernel[:, mine] @ self.dual_coef[j - 1, mine]
                decision += kernel[:, theirs] @ self.dual_coef[i, theirs]
                decision += self.intercept[pair]
                votes[rows, np.where(decision > 0, i, j)] += 1
                pair += 1
        return self.classes[np.argmax(votes, axis=1)]  # the first of the most voted

    def arrays(self) -> dict[str, np.ndarray]:
        """Every field as an array, for :func:`data.keep` and :meth:`load`."""
        arrays = {f.name: np.asarray(getattr(self, f.name)) for f in dataclasses.fields(self)}
        narrow = self.support_vectors.astype(np.float32)  # the images' own precision, mostly
        if np.array_equal(narrow, self.support_vectors):
            arrays["support_vectors"] = narrow
        return arrays

    @classmethod
    def load(cls, path: Path) -> KernelVotes:
        with np.load(path) as kept:
            votes = cls(**{f.name: kept[f.name] for f in dataclasses.fields(cls)})
        k, (s, _) = len(votes.classes), votes.support_vectors.shape
        if (
            votes.dual_coef.shape != (k - 1, s)
            or votes.intercept.shape != (k * (k - 1) // 2,)
            or int(np.sum(votes.n_support)) != s
        ):
            raise ValueError(f"{path}: not the arrays of one classifier")
        return dataclasses.replace(
            votes,
            support_vectors=np.asarray(votes.support_vectors, np.float64),
            gamma=float(votes.gamma),
        )


def fit_classifier(dataset: Dataset) -> Classifier | None:
    """An RBF SVC (scikit-learn defaults) on the training split; None with fewer than 2 classes.

    At most :data:`CLASSIFIER_MAX_TRAIN` examples are used (a fixed random subset of larger splits),
    so MNIST-sized data sets stay quick. The fitted classifier is kept in the data cache
    (``$CVAE_DATA_CACHE``, as the digits' split is), one file per training set and scikit-learn
    version, and read back by a later evaluation of the same data instead of importing
    scikit-learn and fitting again (:class:`KernelVotes`).
    """
    x, c = dataset.train.x, dataset.train.c
    if len(np.unique(c)) < 2:
        return None
    if len(c) > CLASSIFIER_MAX_TRAIN:
        pick = np.random.default_rng(0).permutation(len(c))[:CLASSIFIER_MAX_TRAIN]
        x, c = x[np.sort(pick)], c[np.sort(pick)]
    clf = Classifier(_kernel_votes(x, c), CLASSIFIER, len(c), None, [])
    predicted = clf.predict(dataset.test.x)
    clf.test_accuracy = float(np.mean(predicted == dataset.test.c))
    clf.test_per_class = per_class(predicted, dataset.test.c, dataset.num_classes)
    return clf


def _kernel_votes(x: np.ndarray, c: np.ndarray) -> KernelVotes:
    """The SVC fit on ``x, c``, read from the data cache where it was kept (one file per training
    set), else fit by scikit-learn and kept there."""
    import hashlib

    digest = hashlib.sha256(CLASSIFIER.encode())
    for array in (np.ascontiguousarray(x), np.ascontiguousarray(c)):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    path = data.kept_file(f"classifier-{digest.hexdigest()[:20]}")
    if path is not None and path.is_file():
        try:
            return KernelVotes.load(path)
        except data.UNREADABLE:
            pass  # damaged or not ours: fit again below
    from sklearn.svm import SVC

    votes = KernelVotes.of(
        SVC(kernel="rbf", C=1.0, gamma="scale").fit(np.asarray(x, np.float64), c)
    )
    data.keep(path, **votes.arrays())
    return votes


def per_class(predicted: np.ndarray, labels: np.ndarray, num_classes: int) -> list[float | None]:
    """Accuracy per class (None for a class with no examples)."""
    out: list[float | None] = []
    for k in range(num_classes):
        rows = labels == k
        out.append(float(np.mean(predicted[rows] == k)) if rows.any() else None)
    return out


# --- diversity ------------------------------------------------------------------------------------


def spread(x: np.ndarray) -> float | None:
    """RMS distance from the centroid, ``sqrt(sum ||x_i - mean||^2 / (n - 1))``; None for n < 2."""
    x = np.asarray(x, np.float64)
    if x.shape[0] < 2:
        return None
    return float(math.sqrt(np.sum(np.square(x - x.mean(axis=0))) / (x.shape[0] - 1)))


def diversity(
    generated: np.ndarray, generated_labels: np.ndarray, real: Split, num_classes: int
) -> tuple[float | None, list[float | None]]:
    """Per class ``spread(generated) / spread(real test)``, and their mean over defined classes."""
    ratios: list[float | None] = []
    for k in range(num_classes):
        made, seen = spread(generated[generated_labels == k]), spread(real.x[real.c == k])
        ratios.append(made / seen if made is not None and seen else None)
    defined = [r for r in ratios if r is not None]
    return (float(np.mean(defined)) if defined else None), ratios


# --- pictures -------------------------------------------------------------------------------------


def latent_picture(means: np.ndarray, labels: np.ndarray, path: Path, *, title: str) -> Path:
    """A scatter of the first two principal components of ``means``, coloured by label."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    means = np.asarray(means, np.float64)
    centred = means - means.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    # the sign of each component is fixed so that its largest loading is positive
    largest = vt[np.arange(len(vt)), np.argmax(np.abs(vt), axis=1)]
    vt = vt * np.where(largest < 0, -1.0, 1.0)[:, None]
    proj = centred @ vt[:2].T
    if proj.shape[1] == 1:
        proj = np.concatenate([proj, np.zeros_like(proj)], axis=1)
    share = s**2 / max(float(np.sum(s**2)), 1e-300)
    figure = Figure(
        figsize=(charts.PANEL_SIZE[0] + charts.LEGEND_WIDTH / 2, charts.PANEL_SIZE[1] * 1.25),
        dpi=charts.CURVE_DPI,
        layout="constrained",
    )
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    palette = colormaps["tab10" if labels.max(initial=0) < 10 else "tab20"].colors
    for k in np.unique(labels):
        rows = labels == k
        ax.scatter(*proj[rows].T, s=8, color=palette[int(k) % len(palette)], label=str(int(k)))
    ax.set_xlabel(f"PC 1 ({share[0]:.0%} of variance)")
    ax.set_ylabel(f"PC 2 ({share[1]:.0%})" if len(share) > 1 else "(latent_dim is 1)")
    ax.grid(True, alpha=0.3)
    figure.legend(loc="outside right upper", frameon=False, title="label", markerscale=2)
    figure.suptitle(title)
    return files.atomic_write(
        path, lambda handle: figure.savefig(handle, format="png"), parents=True
    )


# --- the whole evaluation -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvalSetup:
    """What the evaluations of several implementations share, so that their figures compare: the
    ``seed`` every key is derived from (the run's), the ``k`` of the importance-weighted bound
    (``iw_samples``) and the ``classifier`` that judges generated images (``"fit"``: one fit on
    the training split by :func:`evaluate` itself; ``None``: no conditional accuracy)."""

    seed: int
    iw_samples: int = DEFAULT_IW_SAMPLES
    classifier: Classifier | str | None = "fit"


def evaluate(
    impl,
    state,
    dataset: Dataset,
    setup: EvalSetup,
    *,
    out: Path | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """Every figure of ``docs/evaluation.md`` for ``state`` on ``dataset``; pictures into ``out``.

    ``setup.classifier="fit"`` fits one here; pass a fitted one to share it between
    implementations.
    """
    k = check_iw_samples(setup.iw_samples)
    keys = EvalKeys.from_seed(setup.seed)
    model = state.config.model
    classifier = setup.classifier
    if isinstance(classifier, str):
        classifier = fit_classifier(dataset)

    b = bounds(impl, state, dataset.test, k, keys.iwae)
    active, variances = active_units(b["means"])

    labels = np.repeat(np.arange(dataset.num_classes, dtype=np.int32), GENERATED_PER_CLASS)
    z = jax.random.normal(keys.generate, (labels.shape[0], model.latent_dim), jnp.float32)
    mean_images = np.asarray(_make_decode(impl)(state, z, jnp.asarray(labels)), np.float32)
    sampled = np.asarray(jax.random.bernoulli(keys.binarize, jnp.asarray(mean_images)), np.float32)
    div, div_per_class = diversity(mean_images, labels, dataset.test, dataset.num_classes)

    def accuracy(x: np.ndarray) -> dict[str, Any]:
        if classifier is None:
            return {"overall": None, "per_class": [None] * dataset.num_classes}
        predicted = classifier.predict(x)
        return {
            "overall": float(np.mean(predicted == labels)),
            "per_class": per_class(predicted, labels, dataset.num_classes),
        }

    result = {
        "iw_samples": k,
        "test_examples": len(dataset.test),
        "neg_elbo": b["neg_elbo"],
        "neg_iwae": b["neg_iwae"],
        "recon": b["recon"],
        "kl": b["kl"],
        "active_units": active,
        "latent_dim": model.latent_dim,
        "active_threshold": ACTIVE_THRESHOLD,
        "unit_variances": variances,
        "generated_per_class": GENERATED_PER_CLASS,
        "conditional_accuracy": {
            "mean_images": accuracy(mean_images),
            "bernoulli_samples": accuracy(sampled),
        },
        "classifier": None
        if classifier is None
        else {
            "model": classifier.description,
            "train_examples": classifier.train_examples,
            "test_accuracy": classifier.test_accuracy,
            "test_per_class": classifier.test_per_class,
        },
        "diversity": div,
        "diversity_per_class": div_per_class,
        "definitions": DEFINITIONS,
    }
    result["posterior_collapse"] = collapse_note(result) is not None
    result["collapse_kl"] = COLLAPSE_KL
    if out is not None:
        name = title or getattr(impl, "name", "model")
        grid = np.concatenate(
            [np.flatnonzero(labels == c)[:GRID_PER_CLASS] for c in range(dataset.num_classes)]
        )
        acc = result["conditional_accuracy"]["mean_images"]["overall"]
        images.sample_grid(
            mean_images[grid],
            labels[grid],
            dataset.image_shape,
            out / GRID_FILE,
            title=f"{name}: sigmoid(decode(z, c)), z ~ N(0, I)"
            + (f"; classifier agrees {acc:.1%}" if acc is not None else ""),
        )
        latent_picture(
            b["means"],
            dataset.test.c,
            out / LATENT_FILE,
            title=f"{name}: test-set posterior means, PCA",
        )
    return result


DEFINITIONS = {
    "neg_elbo": "mean over test examples of recon + kl (nats); beta = 1 whatever the training beta",
    "neg_iwae": "mean over test examples of -(logsumexp_j log w_j - log k), z_j ~ q(z|x,c) (nats)",
    "recon": "Bernoulli negative log-likelihood, mean over the k posterior draws (nats)",
    "kl": "analytic KL(q(z|x,c) || N(0, I)) (nats)",
    "active_units": "units u with Var over test examples of E_q[z_u] > active_threshold",
    "conditional_accuracy": "fraction of generated images the classifier labels as the class they "
    "were generated for; mean_images: sigmoid(decode(z, c)) with z ~ N(0, I); "
    "bernoulli_samples: pixels drawn from Bernoulli(sigmoid(decode(z, c)))",
    "diversity": "per class, RMS distance of generated mean images from their centroid over the "
    "same for real test images (n - 1 denominators); mean over classes",
    "posterior_collapse": "no active unit, or kl below collapse_kl nats per example: the latent "
    "code is unused and each label's images come from the label alone",
}


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The figures ``cvae compare``'s table shows."""
    clf = result["classifier"]
    return {
        "neg_elbo": result["neg_elbo"],
        "neg_iwae": result["neg_iwae"],
        "active_units": result["active_units"],
        "gen_accuracy": result["conditional_accuracy"]["mean_images"]["overall"],
        "classifier_accuracy": clf["test_accuracy"] if clf else None,
        "diversity": result["diversity"],
        "posterior_collapse": collapse_note(result) is not None,
    }


def describe(result: dict[str, Any]) -> str:
    """Two lines for the terminal, and a third naming posterior collapse where there is one."""
    h = headline(result)

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    div = "-" if h["diversity"] is None else f"{h['diversity']:.2f}"
    note = collapse_note(result)
    return (
        f"  test -elbo {h['neg_elbo']:.3f}   -iwae(k={result['iw_samples']}) {h['neg_iwae']:.3f}"
        f"   kl {result['kl']:.3f}   active units {h['active_units']}/{result['latent_dim']}\n"
        f"  generated mean images classified as their label {pct(h['gen_accuracy'])} "
        f"(classifier on real test {pct(h['classifier_accuracy'])}), diversity {div}"
        + (f"\n  {note}" if note else "")
    )


# --- a run directory ------------------------------------------------------------------------------


@dataclasses.dataclass
class RunToEvaluate:
    directory: Path
    impl_name: str
    config: Config


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / rundir.CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise OutputError(
            f"run_dir: expected {path} to be the JSON a cvae run writes, got {type(err).__name__}: "
            f"{err}"
        ) from err
    if not isinstance(data, dict) or "config" not in data:
        raise OutputError(f"run_dir: expected {path} to hold a 'config' entry, it does not")
    return data


def find_runs(path: str | Path) -> list[RunToEvaluate]:
    """The run(s) in ``path``: a ``cvae train`` directory, or a ``cvae compare`` one (each impl).

    Refuses, naming ``--run``: no such directory, not a directory, no ``config.json``, a malformed
    one, a config that does not validate, a missing ``params.npz``, an unwritable directory.
    """
    directory = Path(path).expanduser()
    if not directory.exists():
        raise OutputError(
            f"run_dir: expected an existing run directory, got {directory}, which does not exist"
        )
    if not directory.is_dir():
        raise OutputError(f"run_dir: expected a run directory, got the file {directory}")
    if not (directory / rundir.CONFIG_FILE).is_file():
        raise OutputError(
            f"run_dir: expected a run directory holding config.json (one cvae train or "
            f"cvae compare wrote), got {directory}, which holds none"
        )
    data = _read_config(directory)
    try:
        config = Config.from_dict(data["config"])
    except ConfigError as err:
        raise ConfigError(f"{directory / 'config.json'}: {err}") from err
    if isinstance(data.get("impls"), list) and "impl" not in data:  # a compare directory
        names = data["impls"]
        folders = data.get("folders", names)  # each implementation's folder, by its name
        runs = [
            RunToEvaluate(directory / str(f), str(n), config)
            for f, n in zip(folders, names, strict=True)
        ]
    elif isinstance(data.get("impl"), str):
        runs = [RunToEvaluate(directory, data["impl"], config)]
    else:
        raise OutputError(
            f"run_dir: expected {directory / 'config.json'} to name its implementation ('impl'), "
            "it does not"
        )
    for r in runs:
        runlock.refuse_if_held(r.directory, field="run_dir")  # a run being trained: say by whom
        if not (r.directory / PARAMS_FILE).is_file():
            raise OutputError(
                f"run_dir: expected the trained parameters {r.directory / PARAMS_FILE} "
                f"(cvae train writes them), got no such file"
            )
        try:  # a real probe, as for --out
            tempfile.TemporaryDirectory(dir=r.directory, prefix=".cvae-probe-").cleanup()
        except OSError as err:
            raise OutputError(
                f"run_dir: expected a writable run directory, got {r.directory} ({err.strerror})"
            ) from err
    return runs


def evaluate_run(path: str | Path, *, iw_samples: Any = DEFAULT_IW_SAMPLES) -> list[dict[str, Any]]:
    """``cvae evaluate --run``: check everything, then evaluate and write ``evaluation.json``."""
    from cvae_rosetta.app import frameworks

    k = check_iw_samples(iw_samples)
    runs = find_runs(path)
    config = runs[0].config
    impls = {r.impl_name: frameworks.load(r.impl_name) for r in runs}
    params = {r.impl_name: paramsfile.load_params(r.directory / PARAMS_FILE) for r in runs}
    dataset = data.load(config.data)
    for name, actual in (
        ("input_dim", dataset.input_dim),
        ("num_classes", dataset.num_classes),
    ):
        if getattr(config.model, name) != actual:
            raise ConfigError(
                f"model.{name}: expected {actual} (from {dataset.name}), got "
                f"{getattr(config.model, name)} in {runs[0].directory / 'config.json'}"
            )
    states = {}
    for r in runs:
        try:
            states[r.impl_name] = impls[r.impl_name].from_canonical(params[r.impl_name], config)
        except ParameterError as err:
            raise ParameterError(f"{r.directory / PARAMS_FILE}: {err}") from err

    setup = EvalSetup(config.train.seed, k, fit_classifier(dataset))
    results = []
    for r in runs:
        impl = impls[r.impl_name]
        with runlock.RunLock.acquire(r.directory, command="evaluate", field="run_dir"):
            result = evaluate(
                impl,
                states[r.impl_name],
                dataset,
                setup,
                out=r.directory,
                title=getattr(impl, "name", r.impl_name),
            )
            files.write_json(r.directory / EVALUATION_FILE, {"impl": r.impl_name, **result})
        results.append({"impl": r.impl_name, "directory": str(r.directory), **result})
    return results
