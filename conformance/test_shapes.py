"""The ``shapes`` layer: the shapes and dtypes of the parameters ``init`` draws and of every
output, and the initialisation itself (SPEC sections 1, 2 and 6): LeCun-normal kernels, zero biases,
drawn from the key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cvae_rosetta.conformance import common
from cvae_rosetta.conformance.assertions import assert_trees_close
from cvae_rosetta.conformance.common import CONFIG, MODEL, B, at_path
from cvae_rosetta.spec.config import Config, ModelConfig

params, batch = common.params, common.batch  # the suite's parameters and batch


def test_init_gives_canonical_shapes_and_dtypes(impl):
    from cvae_rosetta.spec.canonical import shapes

    got = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    expected = shapes(MODEL)
    got_shapes = jax.tree.map(lambda a: tuple(a.shape), got)
    want_shapes = jax.tree.map(tuple, expected, is_leaf=lambda x: isinstance(x, tuple))
    assert got_shapes == want_shapes, (
        f"init's canonical parameters have the shapes {got_shapes}; the spec's are {want_shapes}"
    )
    for path, leaf in jax.tree_util.tree_leaves_with_path(got):
        assert leaf.dtype == jnp.float32, (
            f"init's parameter {jax.tree_util.keystr(path)} is {leaf.dtype}; the spec's are float32"
        )


def test_output_shapes(impl, params, batch):
    state = impl.from_canonical(params, CONFIG)
    mean, logvar = impl.encode(state, batch.x, batch.c)
    logits = impl.decode(state, mean, batch.c)
    loss, metrics = impl.loss(state, batch, jax.random.key(1))
    expected = {
        "encode's mean": (mean, (B, MODEL.latent_dim)),
        "encode's logvar": (logvar, (B, MODEL.latent_dim)),
        "decode's logits": (logits, (B, MODEL.input_dim)),
        "loss": (loss, ()),
    }
    for what, (value, shape) in expected.items():
        assert np.shape(value) == shape, (
            f"{what} has shape {np.shape(value)}; the spec's is {shape}"
        )
        assert value.dtype == jnp.float32, f"{what} is {value.dtype}; the spec returns float32"
    missing = {"loss", "recon", "kl"} - set(metrics)
    assert not missing, f"the metrics lack {sorted(missing)}; the spec's are loss, recon and kl"
    for name, value in metrics.items():
        assert np.shape(value) == (), (
            f"metrics[{name!r}] has shape {np.shape(value)}; the spec's metrics are scalars"
        )


INIT_MODEL = ModelConfig(input_dim=784, num_classes=10, latent_dim=32)


def test_init_is_lecun_normal_with_zero_biases(impl):
    """Kernel variance 1/fan_in (truncated normal, corrected), within sampling error; biases 0."""
    from cvae_rosetta.spec.canonical import layer_sizes

    params = impl.to_canonical(impl.init(jax.random.key(3), Config(model=INIT_MODEL)))
    sizes = layer_sizes(INIT_MODEL)
    layers = [*params["encoder"], params["latent"], *params["decoder"]]
    fans = [*sizes["encoder"], *sizes["latent"], *sizes["decoder"]]
    for i, (layer, (fan_in, fan_out)) in enumerate(zip(layers, fans, strict=True)):
        kernel = np.asarray(layer["kernel"], np.float64)
        n = kernel.size
        ratio = kernel.var() * fan_in
        what = f"init's layer {i} ({fan_in} -> {fan_out})"
        # the sample variance of n draws has relative standard error ~ sqrt(2 / n) (a bit less for
        # a truncated normal); allow five of them
        assert abs(ratio - 1.0) < 5 * np.sqrt(2.0 / n), (
            f"{what} has kernel variance {ratio:.4g} / fan_in; the spec's LeCun normal has "
            f"1 / fan_in (within {5 * np.sqrt(2.0 / n):.2g})"
        )
        assert abs(kernel.mean()) < 5 / np.sqrt(n * fan_in), (
            f"{what} has kernel mean {kernel.mean():.3g}; the spec's LeCun normal has mean 0 "
            f"(within {5 / np.sqrt(n * fan_in):.2g})"
        )
        # truncated at two standard deviations: no entry beyond 2 / sqrt(fan_in) * 1.14
        limit = 2.0 / 0.87962566103423978 / np.sqrt(fan_in) + 1e-6
        assert np.abs(kernel).max() <= limit, (
            f"{what} has a kernel entry {np.abs(kernel).max():.3g} from 0; the spec's truncated "
            f"normal stops at two standard deviations, {limit:.3g}"
        )
        bias = np.asarray(layer["bias"])
        assert np.all(bias == 0), (
            f"{what} has {int(np.sum(bias != 0))} nonzero biases (largest "
            f"{np.abs(bias).max():.3g}); the spec initialises biases to 0"
        )


def test_init_depends_on_the_key(impl):
    a = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    b = impl.to_canonical(impl.init(jax.random.key(0), CONFIG))
    c = impl.to_canonical(impl.init(jax.random.key(1), CONFIG))
    assert_trees_close(
        b, a, "init with key 0, twice,", rtol=0.0, against="the first init with that key"
    )
    for path, x in jax.tree_util.tree_leaves_with_path(a):
        if x.ndim == 2:
            assert not np.array_equal(x, at_path(c, path)), (
                f"init with keys 0 and 1 gave the same kernel {jax.tree_util.keystr(path)}: "
                "the key passed in is ignored"
            )
