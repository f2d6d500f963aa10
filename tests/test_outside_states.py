"""An implementation from outside, with a train state of its own, through ``cvae train``: its
optimiser state is checkpointed wherever it holds one Adam state in canonical form (a NamedTuple of
exactly ``count``, ``mu`` and ``nu``, optax's or its own), a state that cannot be checkpointed is
refused before the first step with nothing written, and ``grad_norm`` is logged for any object
that can cut its step at the gradient, an ``Adapter`` or not.

The implementations are pure JAX behind a state class of their own, written into a package in a
temporary folder and loaded as ``--impl package.module:attribute``, as a user's would be. Their
arithmetic is pure JAX's, so their runs must equal pure JAX's bit for bit.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from cvae_rosetta.app import checkpoint, convert, trainstate
from cvae_rosetta.cli.tiny_runs import (
    TINY,
    TOTAL,
    assert_same_run,
    final_state,
    records,
    snapshot,
    train,
)
from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.config import Config, DataConfig, ModelConfig

PACKAGE = "outside_states_pkg"

SOURCE = '''
    """Pure JAX behind train states of its own, in an object that is not an Adapter."""

    import dataclasses
    from typing import Any, NamedTuple

    import jax
    import optax

    from cvae_rosetta.impls import pure_jax

    BASE = pure_jax.implementation


    class OwnAdam(NamedTuple):
        """Adam's state in this implementation's own type: the same three fields as optax's."""

        count: Any
        mu: Any
        nu: Any


    def _is_adam(node):
        return isinstance(node, optax.ScaleByAdamState)


    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class OwnState:
        """Pure JAX's state inside; ``opt_state`` is a property that shows its Adam state as an
        ``OwnAdam``, and ``replace`` takes one back."""

        inner: Any

        step = property(lambda self: self.inner.step)
        params = property(lambda self: self.inner.params)
        config = property(lambda self: self.inner.config)

        @property
        def opt_state(self):
            nodes = jax.tree.leaves(self.inner.opt_state, is_leaf=_is_adam)
            (adam,) = [n for n in nodes if _is_adam(n)]
            return OwnAdam(adam.count, adam.mu, adam.nu)

        def replace(self, **changes):
            if "opt_state" in changes:
                own = changes.pop("opt_state")
                assert type(own) is OwnAdam, type(own)
                adam = optax.ScaleByAdamState(*own)
                changes["opt_state"] = jax.tree.map(
                    lambda n: adam if _is_adam(n) else n, self.inner.opt_state, is_leaf=_is_adam
                )
            return type(self)(self.inner.replace(**changes))

        def apply_gradients(self, grads):
            return type(self)(self.inner.apply_gradients(grads))


    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class NoOptState:
        """Step and parameters, its optimiser state out of sight: nothing to checkpoint it from."""

        inner: Any

        step = property(lambda self: self.inner.step)
        params = property(lambda self: self.inner.params)
        config = property(lambda self: self.inner.config)

        def replace(self, **changes):
            return NoOptState(self.inner.replace(**changes))


    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class TwoAdams(OwnState):
        @property
        def opt_state(self):
            return (OwnState.opt_state.fget(self), OwnState.opt_state.fget(self))


    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class CutMoments(OwnState):
        @property
        def opt_state(self):
            own = OwnState.opt_state.fget(self)
            return own._replace(mu=jax.tree.map(lambda a: a[..., :1], own.mu))


    class Wrapped:
        """The protocol's eight members over a state class; ``gradients``: ``"grads"`` (a method on
        the caller's key), ``"grads_fn"`` (on the noise) or None (neither)."""

        framework = "jax"

        def __init__(self, name, state=OwnState, gradients=None):
            self.name, self.state = name, state
            if gradients == "grads":
                self.grads = lambda s, batch, key: BASE.grads(s.inner, batch, key)
            elif gradients == "grads_fn":
                self.grads_fn = lambda s, batch, eps: BASE.grads_fn(s.inner, batch, eps)

        def init(self, key, config):
            return self.state(BASE.init(key, config))

        def from_canonical(self, params, config):
            return self.state(BASE.from_canonical(params, config))

        def to_canonical(self, state):
            return BASE.to_canonical(state.inner)

        def loss(self, state, batch, key):
            return BASE.loss(state.inner, batch, key)

        def train_step(self, state, batch, key):
            inner, metrics = BASE.train_step(state.inner, batch, key)
            return self.state(inner), metrics

        def encode(self, state, x, c):
            return BASE.encode(state.inner, x, c)

        def decode(self, state, z, c):
            return BASE.decode(state.inner, z, c)


    own_adam = Wrapped("own_adam", gradients="grads")
    own_adam_grads_fn = Wrapped("own_adam_grads_fn", gradients="grads_fn")
    own_adam_plain = Wrapped("own_adam_plain")
    no_opt_state = Wrapped("no_opt_state", NoOptState)
    two_adams = Wrapped("two_adams", TwoAdams)
    cut_moments = Wrapped("cut_moments", CutMoments)
'''


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """The package on ``sys.path`` for this module's tests; ``outside(attr)`` is the target."""
    root = tmp_path_factory.mktemp("outside")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "states.py").write_text(textwrap.dedent(SOURCE))
    sys.path.insert(0, str(root))
    yield lambda attribute: f"{PACKAGE}.states:{attribute}"
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
        del sys.modules[name]


def run(impl: str, out: Path, *extra: str) -> Path:
    assert train("--impl", impl, *TINY, "--checkpoint-every", "0", *extra, "--out", str(out)) == 0
    return out


def tiny_config() -> Config:
    """The model of the tiny runs (``TINY``), on their synthetic data."""
    model = ModelConfig(
        input_dim=64, num_classes=10, latent_dim=2, encoder_dims=(8,), decoder_dims=(8,)
    )
    return Config(model=model, data=DataConfig(name="synthetic"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Pure JAX's tiny run, 4 epochs in one go."""
    return run("pure_jax", tmp_path_factory.mktemp("reference") / "run")


# --- an Adam state of its own, checkpointed ------------------------------------------------------


def test_an_own_adam_namedtuple_is_checkpointed_exactly(outside):
    impl = protocol.load(outside("own_adam"))
    assert not isinstance(impl, protocol.Adapter)
    config = tiny_config()
    state = impl.init(jax.random.key(0), config)
    assert type(state.opt_state).__name__ == "OwnAdam"
    trainstate.check_checkpointable(impl, state, config)
    tree = trainstate.canonical_state(impl, state)
    tree["opt_state"]["count"] = np.int32(5)
    tree["opt_state"]["mu"] = jax.tree.map(lambda a: a + 1, tree["params"])
    back = trainstate.implementation_state(impl, tree, config)
    assert type(back).__name__ == "OwnState" and type(back.opt_state).__name__ == "OwnAdam"
    again = trainstate.canonical_state(impl, back)
    flat, flat_again = checkpoint.flatten(tree), checkpoint.flatten(again)
    assert flat.keys() == flat_again.keys()
    for key in flat:
        np.testing.assert_array_equal(flat[key], flat_again[key], err_msg=key)


def test_an_own_adam_run_resumes_and_continues_across_implementations(outside, reference, tmp_path):
    own = outside("own_adam")
    # its own run, checkpointed after 2 epochs, resumed by itself to 4: pure JAX's run, bit for bit
    first = run(own, tmp_path / "own", "--epochs", "2")
    assert checkpoint.latest_of_run(first).impl == "own_adam"
    assert train("--resume", str(first), "--epochs", "4", "--no-progress") == 0
    assert_same_run(first, reference)
    # pure JAX's half a run continued by it, and its half a run continued by pure JAX
    for start, then in (("pure_jax", own), (own, "pure_jax")):
        half = run(start, tmp_path / f"from-{start.split(':')[-1]}", "--epochs", "2")
        args = ["--resume", str(half), "--impl", then, "--epochs", "4", "--no-progress"]
        assert train(*args) == 0
        assert_same_run(half, reference)
    # the canonical file of its run, and that file loaded back into its own state
    out = tmp_path / "own.npz"
    convert.convert(first, out)
    loaded = convert.load_npz(out)
    ours, theirs = checkpoint.flatten(loaded.state), final_state(first)
    assert ours.keys() == theirs.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    impl = protocol.load(own)
    state = trainstate.implementation_state(impl, loaded.state, loaded.config)
    assert int(state.step) == TOTAL and int(state.opt_state.count) == TOTAL


# --- refused before the first step, nothing written ----------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("no_opt_state", "to keep its train state as step, params and opt_state"),
        ("two_adams", "got 2 Adam state(s) among 2 node(s)"),
        ("cut_moments", "opt_state.mu: expected the Adam moments of 'cut_moments' shaped like"),
    ],
)
def test_a_state_that_cannot_be_checkpointed_is_refused_before_training(
    outside, reference, tmp_path, capsys, attribute, message
):
    out = tmp_path / "run"
    assert train("--impl", outside(attribute), *TINY, "--out", str(out)) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("cvae: error: ") and "\n" not in err, err
    assert message in err, err
    assert "Traceback" not in captured.err and not captured.out.strip(), captured
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # no folder, no config.json

    # resuming a run with it is refused before anything of the run changes
    resumed = tmp_path / "resumed"
    shutil.copytree(reference, resumed)
    before = snapshot(resumed)
    args = ["--resume", str(resumed), "--impl", outside(attribute), "--epochs", "5"]
    assert train(*args, "--no-progress") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cvae: error: ") and "\n" not in err and message in err, err
    assert snapshot(resumed) == before


# --- grad_norm by duck typing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "logged"),
    [("own_adam", True), ("own_adam_grads_fn", True), ("own_adam_plain", False)],
)
def test_grad_norm_is_logged_for_any_implementation_that_can_cut_its_step(
    outside, reference, tmp_path, attribute, logged
):
    """An object with a ``grads`` method or a ``grads_fn``, whose state has ``apply_gradients``,
    logs pure JAX's very ``grad_norm``; one with neither runs its ``train_step`` and logs none."""
    impl = protocol.load(outside(attribute))
    assert not isinstance(impl, protocol.Adapter)
    out = run(outside(attribute), tmp_path / "run", "--epochs", "1")
    steps = [r for r in records(out) if r["event"] == "step"]
    want = [r for r in records(reference) if r["event"] == "step"][: len(steps)]
    assert steps and all(("grad_norm" in r) is logged for r in steps), steps[0]
    if logged:
        assert [r["grad_norm"] for r in steps] == [r["grad_norm"] for r in want]
    assert [r["loss"] for r in steps] == [r["loss"] for r in want]
