"""Keras's own ways of stepping compute what the implementation's protocol step does; where the
implementation departs from stock Keras (its optimiser, its schedules' arguments, its backend), the
departure is needed and in place.

``model.fit``'s train function and ``model.train_on_batch`` run the model's ``train_step`` (Keras's
JAX trainer jits it); the protocol step is the ``fast_path`` section's, under a plain ``jax.jit``.
The optimiser is a subclass of Keras's ``AdamW``, because the stock one puts epsilon elsewhere; the
schedules are Keras's ``CosineDecay``, whose ``decay_steps`` does not count the warm-up. Keras picks
its backend once per process, so the module selects JAX and refuses any other. Run in the
environments that install Keras (``keras`` and ``cross``); elsewhere the file is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cvae_rosetta.conformance.common import CONFIG, make_batch, reference_params
from cvae_rosetta.spec.config import Config, ModelConfig, OptimConfig
from cvae_rosetta.spec.optim import make_optimizer, schedule

pytestmark = pytest.mark.needs_keras

keras_impl = pytest.importorskip("cvae_rosetta.impls.keras_impl", reason="Keras is not installed")
keras = keras_impl.keras
impl = keras_impl.implementation


def run(args: list[str], cwd, **env: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in a process of its own, without this one's KERAS_BACKEND (in ``cwd``: a
    source checkout's directory would put its own build metadata on ``sys.path``)."""
    environ = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**environ, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- the backend ---------------------------------------------------------------------------------


def test_another_backend_is_refused_in_one_line(tmp_path):
    """KERAS_BACKEND naming another backend: the import refuses before Keras loads one; the CLI
    says so in one line, exits 2 and writes nothing."""
    done = run(["-c", "import cvae_rosetta.impls.keras_impl"], tmp_path, KERAS_BACKEND="torch")
    message = (
        "KERAS_BACKEND: expected 'jax' (the keras implementation runs on Keras's JAX backend), "
        "got 'torch'"
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"cvae_rosetta.spec.errors.ImplementationNotFound: {message}", done.stderr
    out = tmp_path / "run"
    args = ["-m", "cvae_rosetta", "train", "--impl", "keras", "--epochs", "1", "--out", str(out)]
    cli = run(args, tmp_path, KERAS_BACKEND="torch")
    assert (cli.returncode, cli.stderr) == (2, f"cvae: error: {message}\n")
    assert not out.exists()


def test_keras_imported_with_another_backend_is_refused(tmp_path):
    code = "import os, keras\ndel os.environ['KERAS_BACKEND']\nimport cvae_rosetta.impls.keras_impl"
    done = run(["-c", code], tmp_path, KERAS_BACKEND="numpy")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(
        "keras.backend.backend(): expected 'jax' (the keras implementation runs on Keras's JAX "
        "backend), got 'numpy' (keras was imported with it before this implementation)"
    ), done.stderr


def test_the_jax_backend_is_selected_when_none_is_named(tmp_path):
    code = "import cvae_rosetta.impls.keras_impl, keras\nprint(keras.backend.backend())"
    done = run(["-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["jax"]


# --- Keras's ways of stepping --------------------------------------------------------------------


def steps(n: int = 3):
    for t in range(n):
        yield make_batch(jax.random.key(10 + t)), jax.random.key(20 + t)


def test_fits_train_function_equals_the_fast_path_after_three_steps():
    """The path runs the very function fit calls per batch; its state is fit's four lists."""
    params = reference_params(jax.random.key(0))
    step, carry = impl.extras["paths"]["model.fit step"](impl.from_canonical(params, CONFIG))
    fast = jax.jit(impl.train_step, donate_argnums=0)
    state = impl.from_canonical(params, CONFIG)
    for batch, key in steps():
        carry, logs = step(carry, batch, key)
        state, metrics = fast(state, batch, key)
        chex.assert_trees_all_close(logs, metrics, rtol=1e-6)
    trainable, non_trainable, optimizer_variables, _ = carry
    assert non_trainable == []
    chex.assert_trees_all_close(trainable, state.params, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(
        optimizer_variables, state.optimizer_variables, rtol=1e-6, atol=1e-7
    )
    assert int(state.opt_state.count) == int(state.step) == 3


def test_train_on_batch_keeps_the_fast_paths_values_in_the_models_variables():
    params = reference_params(jax.random.key(1))
    step, model = impl.extras["paths"]["model.train_on_batch"](impl.from_canonical(params, CONFIG))
    assert model is not impl.from_canonical(params, CONFIG).model  # a model of its own
    fast = jax.jit(impl.train_step)
    state = impl.from_canonical(params, CONFIG)
    for batch, key in steps():
        model, logs = step(model, batch, key)
        state, metrics = fast(state, batch, key)
        # on the host: train_on_batch waits for each step (floats in Keras 3.15, NumPy in 3.12)
        assert not any(isinstance(v, jax.Array) for v in logs.values())
        chex.assert_trees_all_close(logs, jax.device_get(metrics), rtol=1e-6)
    values = [v.value for v in model.trainable_variables]
    chex.assert_trees_all_close(values, state.params, rtol=1e-6, atol=1e-7)
    assert int(model.optimizer.iterations.value) == 3


def test_model_fit_itself_ends_where_the_fast_path_ends():
    """``model.fit`` over three batches, the noise of each step's key passed as data beside x and
    c (unshuffled): the same parameters as three protocol steps, and the last batch's metrics."""
    params = reference_params(jax.random.key(6))
    _, model = impl.extras["paths"]["model.train_on_batch"](impl.from_canonical(params, CONFIG))
    batches, keys = zip(*steps(), strict=True)
    n, latent = batches[0].x.shape[0], CONFIG.model.latent_dim
    x = np.concatenate([batch.x for batch in batches])
    c = np.concatenate([batch.c for batch in batches])
    eps = np.concatenate([keras_impl.noise(key, n, latent) for key in keys])
    history = model.fit((x, c, eps), batch_size=n, shuffle=False, verbose=0)
    fast = jax.jit(impl.train_step)
    state = impl.from_canonical(params, CONFIG)
    for batch, key in zip(batches, keys, strict=True):
        state, metrics = fast(state, batch, key)
    chex.assert_trees_all_close(
        [v.value for v in model.trainable_variables], state.params, rtol=1e-6, atol=1e-7
    )
    last = {name: values[-1] for name, values in history.history.items()}
    chex.assert_trees_all_close(last, jax.device_get(metrics), rtol=1e-6)


# --- the optimiser and the schedules -------------------------------------------------------------


def first_step(optimizer, grads: list, params: list) -> list:
    """The parameters after one step of a Keras optimiser, stateless."""
    optimizer.build([keras.Variable(p) for p in params])
    new, _ = optimizer.stateless_apply([v.value for v in optimizer.variables], grads, params)
    return new


def test_the_optimizer_is_the_spec_where_keras_adamw_is_not():
    """Where |g| is near epsilon, stock AdamW (epsilon on the uncorrected sqrt(v): 31.6 times the
    spec's at the first step) moves less than the spec; the subclass moves as optax does."""
    params = [jnp.linspace(-1.0, 1.0, 6)]
    grads = [jnp.array([3e-8, -1e-8, 5e-9, 2e-7, -4e-8, 1e-3])]
    optim = OptimConfig(weight_decay=0.1)
    tx = make_optimizer(optim)
    updates, _ = tx.update(grads, tx.init(params), params)
    want = params[0] + updates[0]
    ours = first_step(keras_impl.optimizer_of(optim), grads, params)
    np.testing.assert_allclose(ours[0], want, rtol=1e-6, atol=1e-7)
    stock = keras.optimizers.AdamW(
        optim.learning_rate, weight_decay=0.1, epsilon=1e-8, global_clipnorm=optim.clip_norm
    )
    moved = np.abs(np.asarray(first_step(stock, grads, params)[0] - params[0]))
    spec_moved = np.abs(np.asarray(want - params[0]))
    assert np.all(moved[:5] < 0.5 * spec_moved[:5]), (moved, spec_moved)


def update_flops(optim: OptimConfig, size: int) -> tuple[float, float]:
    """FLOP of one compiled update of ``size`` float32 parameters, as XLA's cost analysis counts
    them: the spec's optax chain (and ``optax.apply_updates``), then Keras's."""
    params, grads = [jnp.ones(size)], [jnp.full(size, 0.1)]
    tx = make_optimizer(optim)

    def spec_update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    optimizer = keras_impl.optimizer_of(optim)
    optimizer.build([keras.Variable(p) for p in params])
    variables = [v.value for v in optimizer.variables]
    counted = []
    for step, args in ((spec_update, (params, tx.init(params), grads)),
                       (optimizer.stateless_apply, (variables, grads, params))):  # fmt: skip
        cost = jax.jit(step).lower(*args).compile().cost_analysis()
        counted.append((cost[0] if isinstance(cost, list) else cost)["flops"])
    return counted[0], counted[1]


def per_parameter(optim: OptimConfig) -> tuple[float, float]:
    """FLOP per parameter of the spec's update and of Keras's: the counts' growth from 1,000
    parameters to 2,000, which leaves out the few scalar operations of either."""
    (spec, ours), (spec2, ours2) = update_flops(optim, 1000), update_flops(optim, 2000)
    return (spec2 - spec) / 1000, (ours2 - ours) / 1000


def test_kerass_update_computes_the_decay_where_optax_skips_it():
    """docs/fast_step.md's account of Keras's larger step: optax's ``add_decayed_weights`` returns
    the updates untouched at a decay of 0.0 (the spec's default) and adds two FLOP per parameter
    above it; Keras's ``AdamW`` computes ``variable - variable * weight_decay * learning_rate`` at
    any decay, so its count does not change with the decay."""
    (spec0, keras0), (spec1, keras1) = (
        per_parameter(OptimConfig()),
        per_parameter(OptimConfig(weight_decay=0.1)),
    )
    assert OptimConfig().weight_decay == 0.0
    assert spec1 - spec0 == 2.0, (spec0, spec1)
    assert keras1 == keras0, (keras0, keras1)
    assert keras0 - spec0 >= 2.0, (spec0, keras0)


@pytest.mark.parametrize("kind", ["cosine", "warmup_cosine"])
def test_kerass_cosine_decay_is_the_spec_schedule(kind):
    """Keras's CosineDecay, given decay_steps without the warm-up, takes the spec's (optax's)
    rate at every count, past the end included."""
    warmup = 4 if kind == "warmup_cosine" else 0
    optim = OptimConfig(
        schedule=kind, learning_rate=3e-3, warmup_steps=warmup, decay_steps=12,
        end_learning_rate=1e-4,
    )  # fmt: skip
    counts = np.arange(16, dtype=np.int32)
    got = [float(keras_impl.learning_rate(optim)(jnp.int32(t))) for t in counts]
    want = [float(schedule(optim)(t)) for t in counts]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)


# --- the state: built outside traces, checkpointed in canonical form -----------------------------


def test_a_new_config_first_met_inside_jit_leaks_no_tracer():
    config = Config(model=ModelConfig(input_dim=20, num_classes=3, latent_dim=5, encoder_dims=(7,)))
    params = reference_params(jax.random.key(2), config.model)
    with jax.checking_leaks():
        back = jax.jit(lambda p: impl.to_canonical(impl.from_canonical(p, config)))(params)
    chex.assert_trees_all_close(back, params, rtol=0)
    again = impl.from_canonical(params, Config.from_dict(config.to_dict()))
    assert again.compiled is keras_impl.compiled_of(config)  # one compiled model per config


def test_bfloat16_is_each_layers_policy_not_the_global_one():
    state = impl.from_canonical(reference_params(jax.random.key(3)), CONFIG.replace(
        model=CONFIG.model.replace(compute_dtype="bfloat16")
    ))  # fmt: skip
    layers = keras_impl.dense_layers(state.model)
    assert {layer.dtype_policy.name for layer in layers} == {"mixed_bfloat16"}
    assert {v.dtype for v in state.model.trainable_variables} == {"float32"}
    assert keras.config.dtype_policy().name == "float32"
    batch = make_batch(jax.random.key(4))
    mean, logvar = impl.encode(state, batch.x, batch.c)
    assert mean.dtype == logvar.dtype == impl.decode(state, mean, batch.c).dtype == jnp.float32


def test_the_checkpoint_form_round_trips():
    """count, mu and nu read from the optimiser's variables and written back (``opt_state``,
    ``replace``), as ``cvae train`` checkpoints them."""
    from cvae_rosetta.app.trainstate import canonical_state, implementation_state

    state = impl.from_canonical(reference_params(jax.random.key(5)), CONFIG)
    for batch, key in steps(2):
        state, _ = impl.train_step(state, batch, key)
    tree = canonical_state(impl, state)
    assert int(tree["opt_state"]["count"]) == 2
    back = implementation_state(impl, tree, CONFIG)
    chex.assert_trees_all_equal(back.params, state.params)
    chex.assert_trees_all_equal(back.optimizer_variables, state.optimizer_variables)
    assert isinstance(state.opt_state, keras_impl.AdamState)
    assert state.opt_state._fields == optax.ScaleByAdamState._fields == ("count", "mu", "nu")
