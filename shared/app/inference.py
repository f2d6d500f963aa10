"""A trained model from a run directory, and what ``cvae sample`` and ``cvae reconstruct`` make
with it.

The parameters come from the run's newest intact checkpoint (the state training reached, even if
the run was stopped), or from ``params.npz`` for a run without checkpoints. Any installed
implementation can load them: the parameters are canonical.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta import files
from cvae_rosetta.app import rundir
from cvae_rosetta.spec import canonical
from cvae_rosetta.spec.config import Config
from cvae_rosetta.spec.errors import ConfigError, ParameterError

MAX_SAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Trained:
    """A run's trained model behind an implementation."""

    directory: Path
    impl: Any
    state: Any
    config: Config
    step: int | None  # the checkpoint's step, None for params.npz
    source: str  # what the parameters were read from

    @property
    def image_shape(self) -> tuple[int, int]:
        return image_shape_of(self.config)


def image_shape_of(config: Config) -> tuple[int, int]:
    """The images' ``(rows, cols)``: every bundled data set is square, anything else one row."""
    d = config.model.input_dim
    side = math.isqrt(d)
    return (side, side) if side * side == d else (1, d)


def load_trained(run_dir: Any, impl_name: str | None = None) -> Trained:
    """The run's parameters in ``impl_name`` (default: the implementation the run names)."""
    from cvae_rosetta.app import checkpoint, frameworks, paramsfile, resuming

    path, data, config = resuming.read_run(run_dir)
    impl = frameworks.load(impl_name or data["impl"])
    if checkpoint.has_checkpoints(path):
        found = checkpoint.latest_of_run(path)
        params, step = found.state["params"], found.step
        source = str(checkpoint.checkpoints_of(path) / str(step))
    else:
        params_file = path / rundir.PARAMS_FILE
        if not params_file.is_file():
            raise ParameterError(
                f"run_dir: expected checkpoints or params.npz in {path} (cvae train writes them), "
                "got neither"
            )
        params, step, source = paramsfile.load_params(params_file), None, str(params_file)
    try:
        canonical.check(params, config.model, field=source)
        state = impl.from_canonical(params, config)
    except ParameterError as err:
        raise ParameterError(f"{source}: {err}") from err
    return Trained(path, impl, state, config, step, source)


# --- checks of the commands' own flags ---------------------------------------------------------


def check_count(value: Any, flag: str = "count", maximum: int = MAX_SAMPLES) -> int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or not 1 <= value <= maximum:
        raise ConfigError(f"{flag}: expected an integer in [1, {maximum}], got {value!r}")
    return int(value)


def check_labels(text: Any, num_classes: int) -> list[int]:
    """``--label``: one label or a comma-separated list, each in ``[0, num_classes)``."""
    if text is None:
        raise ConfigError(f"labels: expected a label in [0, {num_classes}), got none")
    labels = []
    for part in str(text).split(","):
        try:
            label = int(part.strip())
        except ValueError:
            label = None
        if label is None or not 0 <= label < num_classes:
            raise ConfigError(
                f"labels: expected labels in [0, {num_classes}) (model.num_classes), got "
                f"{part.strip()!r}"
            )
        labels.append(label)
    return labels


def check_seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"seed: expected an integer >= 0, got {value!r}")
    return value


# --- outputs ----------------------------------------------------------------------------------


def write_arrays(path: Path, **arrays: Any) -> None:
    """An NPZ of named arrays (no pickles), written atomically (:mod:`cvae_rosetta.files`)."""
    named = {k: np.asarray(v) for k, v in arrays.items()}
    files.atomic_write(path, lambda handle: np.savez(handle, **named))


def model_functions(impl: Any, state: Any) -> dict[str, Any]:
    """The served functions of a trained state, traceable with a symbolic batch size ``b``:

    * ``generator(labels: i32[b], key: u32[k]) -> images f32[b, D]``: ``sigmoid(decode(z, c))``
      with ``z = normal(key, (b, L))``; ``key`` is a JAX key's data (``jax.random.key_data``)
    * ``encoder(x: f32[b, D], c: i32[b]) -> (mean, logvar)``, each ``f32[b, L]``
    * ``decoder(z: f32[b, L], c: i32[b]) -> images f32[b, D]``: ``sigmoid(decode(z, c))``
    """
    from cvae_rosetta.spec.model import generate

    prng = prng_name()

    def generator(labels, key):
        return generate(impl, state, jax.random.wrap_key_data(key, impl=prng), labels)

    def encoder(x, c):
        return impl.encode(state, x, c)

    def decoder(z, c):
        return jax.nn.sigmoid(impl.decode(state, z, c))

    return {"generator": generator, "encoder": encoder, "decoder": decoder}


def prng_name() -> str:
    """The name of JAX's default PRNG implementation (``threefry2x32`` unless configured)."""
    return str(jax.random.key_impl(jax.random.key(0)))


def sample(trained: Trained, labels: list[int], n: int, seed: int | None) -> tuple[Any, Any]:
    """``n`` images per label from the compiled generator (the function ``cvae export`` writes);
    the key is the run's own sample key unless ``seed`` is given."""
    from cvae_rosetta.app.run import RunKeys

    key = (
        RunKeys.from_seed(trained.config.train.seed).sample
        if seed is None
        else jax.random.key(seed)
    )
    c = jnp.asarray(np.repeat(np.asarray(labels, np.int32), n))
    generator = jax.jit(model_functions(trained.impl, trained.state)["generator"])
    return np.asarray(generator(c, jax.random.key_data(key))), np.asarray(c)


def write_samples(trained: Trained, out: Path, images_: Any, labels: Any) -> None:
    from cvae_rosetta.app import images

    if out.suffix.lower() == ".npz":
        write_arrays(out, images=images_, labels=labels, image_shape=np.array(trained.image_shape))
    else:
        name = getattr(trained.impl, "name", "model")
        images.sample_grid(images_, labels, trained.image_shape, out, title=f"{name}: samples")


def reconstruct(trained: Trained, n: int) -> tuple[Any, Any, Any]:
    """The first ``n`` test examples of the run's data set and their reconstructions,
    ``sigmoid(decode(mean, c))``, through the compiled encoder and decoder."""
    from cvae_rosetta.app import data

    dataset = data.load(trained.config.data)
    n = min(n, len(dataset.test))
    x, c = jnp.asarray(dataset.test.x[:n]), jnp.asarray(dataset.test.c[:n])
    fns = model_functions(trained.impl, trained.state)
    encoder, decoder = jax.jit(fns["encoder"]), jax.jit(fns["decoder"])
    mean, _ = encoder(x, c)
    return np.asarray(x), np.asarray(c), np.asarray(decoder(mean, c))


def write_reconstructions(trained: Trained, out: Path, x: Any, c: Any, recon: Any) -> None:
    from cvae_rosetta.app import images

    if out.suffix.lower() == ".npz":
        write_arrays(
            out, x=x, labels=c, reconstructions=recon, image_shape=np.array(trained.image_shape)
        )
    else:
        name = getattr(trained.impl, "name", "model")
        images.reconstruction_grid(
            x, recon, trained.image_shape, out, title=f"{name}: reconstructions"
        )


# --- the commands, as functions ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Samples:
    """What ``cvae sample`` draws: ``count`` images of each label in ``labels`` (one label, a
    comma-separated string of them, or a list), from the run's own sample key unless ``seed`` is
    given. :func:`sample_run` checks them."""

    labels: Any
    count: Any = 16
    seed: Any = None


def sample_run(
    run_dir: Any,
    out: Any,
    samples: Samples,
    *,
    impl: str | None = None,
    overwrite: bool = False,
) -> tuple[Path, Trained, int]:
    """``cvae sample``: the ``samples`` (``count`` images of each label) from the run in
    ``run_dir``, written to ``out`` (``.png`` grid or ``.npz``). Everything is checked before
    anything is computed. Returns the path, the model, the count."""
    from cvae_rosetta.app import convert

    count = check_count(samples.count)
    seed = check_seed(samples.seed)
    path = convert.check_out_file(out, suffixes=(".png", ".npz"), overwrite=overwrite)
    trained = load_trained(run_dir, impl)
    labels = samples.labels
    text = ",".join(map(str, labels)) if isinstance(labels, (list, tuple)) else labels
    wanted = check_labels(text, trained.config.model.num_classes)
    images_, c = sample(trained, wanted, count, seed)
    write_samples(trained, path, images_, c)
    return path, trained, len(c)


def reconstruct_run(
    run_dir: Any, out: Any, *, count: Any = 16, impl: str | None = None, overwrite: bool = False
) -> tuple[Path, Trained, int]:
    """``cvae reconstruct``: the first ``count`` test examples of the run's data set and their
    reconstructions, written to ``out`` (``.png`` grid or ``.npz``)."""
    from cvae_rosetta.app import convert

    count = check_count(count)
    path = convert.check_out_file(out, suffixes=(".png", ".npz"), overwrite=overwrite)
    trained = load_trained(run_dir, impl)
    x, c, recon = reconstruct(trained, count)
    write_reconstructions(trained, path, x, c, recon)
    return path, trained, len(c)
