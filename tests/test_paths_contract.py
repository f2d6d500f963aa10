"""The contract of an implementation's other step paths (SPEC section 6.3), as the suite checks it.

Each broken path is built on pure JAX's own step (``dataclasses.replace(impl, extras={"paths":
...})``) and breaks one clause; the suite's check (``conformance/test_training.py``'s
:func:`check_path`) must fail it with a message that names that clause, and pass the paths that
keep the contract, the ones that donate the state they are given included. The last test runs the
suite's check through pytest, as a user does, and reads the clause in the report's diagnosis.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from cvae_rosetta.conformance.test_training import KEY_SEED, check_path, protocol_run
from cvae_rosetta.spec.model import noise
from cvae_rosetta.spec.protocol import load

IMPL = load("pure_jax")
SECTION = "SPEC section 6.3"


@pytest.fixture(scope="module")
def run():
    return protocol_run(IMPL)


def _eps(state, batch, key):
    return noise(key, batch.x.shape[0], state.config.model.latent_dim)


_STEP = jax.jit(IMPL.train_step_fn)  # (state, batch, eps) -> (state, metrics)
_DONATING = jax.jit(IMPL.train_step_fn, donate_argnums=0)


def path_of(step):
    """``make`` for a path whose step is ``step`` itself, its carry the state it is given."""

    def make(state):
        return step, state

    return make


def honest(state, batch, key):
    return _STEP(state, batch, _eps(state, batch, key))


def donating(state, batch, key):
    return _DONATING(state, batch, _eps(state, batch, key))


def check(run, step=None, make=None, label="mine"):
    impl = dataclasses.replace(IMPL, extras={"paths": {label: make or path_of(step)}})
    check_path(impl, label, impl.extras["paths"][label], run)


def failure(run, **kw) -> str:
    with pytest.raises(AssertionError) as caught:
        check(run, **kw)
    return str(caught.value)


# --- paths that keep the contract -----------------------------------------------------------------


def test_a_path_that_keeps_the_contract_passes(run):
    check(run, step=honest)


def test_a_path_may_donate_the_state_it_is_given(run):
    def make(state):
        return donating, state

    check(run, make=make)


def test_a_path_may_return_more_metrics_than_train_step(run):
    def step(state, batch, key):
        state, metrics = honest(state, batch, key)
        return state, {**metrics, "lr": 1e-3}

    check(run, step=step)


# --- make -----------------------------------------------------------------------------------------


def test_a_make_that_raises_is_named(run):
    def make(state):
        raise RuntimeError("no such framework object")

    message = failure(run, make=make)
    assert message.startswith("the path 'mine': make(state) raised RuntimeError"), message
    assert f"({SECTION}: make(state) returns (step, carry)" in message, message
    assert message.endswith(": no such framework object"), message


def test_a_make_that_returns_no_pair_is_named(run):
    message = failure(run, make=lambda state: honest)
    assert message == (
        f"the path 'mine': make(state) returned a function ({SECTION}: make(state) returns "
        "(step, carry), step callable)"
    )


# --- step -----------------------------------------------------------------------------------------


def test_a_step_that_raises_is_named_with_its_step(run):
    calls = []

    def step(state, batch, key):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("out of memory")
        return honest(state, batch, key)

    message = failure(run, step=step)
    assert message.startswith(
        "the path 'mine': step(carry, batch, key) raised ValueError at step 2 "
        f"({SECTION}: step(carry, batch, key) returns (carry, metrics)"
    ), message


def test_a_step_that_returns_the_metrics_alone_is_named(run):
    message = failure(run, step=lambda state, batch, key: honest(state, batch, key)[1])
    assert message.startswith(
        "the path 'mine': step(carry, batch, key) returned a dict at step 0, not (carry, metrics)"
    ), message
    assert SECTION in message


def test_a_step_that_returns_the_pair_swapped_is_named(run):
    message = failure(run, step=lambda state, batch, key: honest(state, batch, key)[::-1])
    assert message.startswith(
        "the path 'mine': step(carry, batch, key) returned a tuple of 2 whose second item is a "
        f"{type(run.states[0]).__name__} at step 0, not (carry, metrics)"
    ), message


# --- the metrics ----------------------------------------------------------------------------------


def test_metrics_that_lack_one_of_train_steps_names_are_named(run):
    def step(state, batch, key):
        state, metrics = honest(state, batch, key)
        return state, {k: v for k, v in metrics.items() if k != "kl"}

    message = failure(run, step=step)
    assert message == (
        "the path 'mine''s metrics at step 0 lack 'kl': it returns ['loss', 'recon'] where "
        f"train_step returns ['kl', 'loss', 'recon'] ({SECTION}: step(carry, batch, key) returns "
        "(carry, metrics), the metrics a mapping with every metric train_step returns, each a "
        "scalar)"
    )


def test_a_metric_that_is_not_a_scalar_is_named(run):
    def step(state, batch, key):
        state, metrics = honest(state, batch, key)
        return state, {**metrics, "recon": jnp.full((12,), metrics["recon"])}

    message = failure(run, step=step)
    assert message.startswith("the path 'mine''s recon at step 0 has shape (12,), not a scalar"), (
        message
    )
    assert SECTION in message


def test_a_step_whose_metrics_differ_fails_without_blaming_the_noise(run):
    def step(state, batch, key):
        state, metrics = honest(state, batch, key)
        return state, {**metrics, "loss": metrics["loss"] + 0.5}

    message = failure(run, step=step)
    assert message.startswith("the path 'mine''s loss at step 0"), message
    assert "train_step's" in message and "key" not in message, message


# --- the noise ------------------------------------------------------------------------------------


def _drawing(choose):
    """``make`` for a path that draws its noise from ``choose(keys)``, ``keys`` the keys its step
    was given so far, the current one last."""

    def make(state):
        given = []

        def step(state, batch, key):
            given.append(key)
            return _STEP(state, batch, _eps(state, batch, choose(given)))

        return step, state

    return make


def test_noise_from_a_fixed_key_names_that_key(run):
    message = failure(run, make=_drawing(lambda keys: jax.random.key(0)))
    assert message.startswith(
        "the path 'mine''s metrics at step 0 are train_step's with jax.random.key(0), not with "
        f"the key it is given ({SECTION}: a step draws eps = normal(key, (B, L)) from the key it "
        "is given, as train_step does)"
    ), message


def test_noise_from_a_split_of_the_key_names_the_half(run):
    message = failure(run, make=_drawing(lambda keys: jax.random.split(keys[-1])[1]))
    assert message.startswith(
        "the path 'mine''s metrics at step 0 are train_step's with jax.random.split(key)[1] of "
        "the key it is given, not with the key it is given"
    ), message


def test_noise_from_the_first_key_given_names_that_key_at_the_next_step(run):
    message = failure(run, make=_drawing(lambda keys: keys[0]))
    assert message.startswith(
        "the path 'mine''s metrics at step 1 are train_step's with the key of step 0 "
        f"(jax.random.key({KEY_SEED})), not with the key it is given"
    ), message


def test_a_step_that_ignores_its_key_is_named(run):
    def step(state, batch, key):  # the mean of the posterior: no noise at all
        eps = jnp.zeros((batch.x.shape[0], state.config.model.latent_dim))
        return _STEP(state, batch, eps)

    message = failure(run, step=step)
    assert message.startswith(
        f"the path 'mine' ignores the key it is given: its step 0 returns the same metrics for "
        f"jax.random.key({KEY_SEED}) and for jax.random.key(99) ({SECTION}: a step draws eps"
    ), message


# --- the caller's batch and key -------------------------------------------------------------------


def test_a_step_that_deletes_the_batch_it_is_given_is_named(run):
    def step(state, batch, key):
        out = honest(state, batch, key)
        jax.block_until_ready(out)
        batch.x.delete()
        return out

    fresh = protocol_run(IMPL)  # its batches are deleted by the check
    message = failure(fresh, step=step)
    assert message == (
        "the path 'mine''s step 0 deleted the batch's x it was given: it donated it "
        f"({SECTION}: the batch and the key stay the caller's; a step must not donate them)"
    )


# --- through pytest -------------------------------------------------------------------------------

BROKEN = """
    import dataclasses

    from cvae_rosetta.spec.protocol import load

    IMPL = load("pure_jax")


    def make(state):
        def step(state, batch, key):
            state, metrics = IMPL.train_step(state, batch, key)
            return state, {"loss": metrics["loss"]}

        return step, state


    implementation = dataclasses.replace(IMPL, extras={"paths": {"loss only": make}})
"""


def test_the_suite_reports_the_clause_a_path_breaks(tmp_path):
    (tmp_path / "broken_paths.py").write_text(textwrap.dedent(BROKEN).lstrip())
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("CVAE_") and k != "PYTEST_ADDOPTS"
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    command = [
        sys.executable,
        *("-m", "pytest", "-p", "no:cacheprovider"),
        *("--impl", "broken_paths:implementation", "--pyargs"),
        "cvae_rosetta.conformance.test_training::test_every_path_follows_the_protocol_step",
    ]
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    report = json.loads((tmp_path / "conformance-report.json").read_text())
    found = report["implementations"]["broken_paths:implementation"]["diagnosis"]
    assert found["check"] == "test_training.py::test_every_path_follows_the_protocol_step"
    assert found["message"].startswith(
        "the path 'loss only''s metrics at step 0 lack 'kl', 'recon': it returns ['loss']"
    ), found
    assert SECTION in found["message"], found
