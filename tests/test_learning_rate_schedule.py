"""Learning-rate schedules (``optim.schedule``, ``shared/spec/optim.py``): the config and its
refusals, the optimiser built once for every implementation, the rate logged per step, and a
scheduled run killed with SIGKILL and resumed bit for bit (the schedule's counterpart of
``test_checkpoint.py::test_resume_after_sigkill_mid_epoch_is_bit_identical``)."""

from __future__ import annotations

import json
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_tensorboard import read_events

from cvae_rosetta.cli import main
from cvae_rosetta.cli.tiny_runs import (
    TINY,
    TOTAL,
    assert_same_run,
    committed,
    kill,
    records,
    start,
    tmp_of,
    wait_for,
)
from cvae_rosetta.cli.tiny_runs import train as train_cli
from cvae_rosetta.spec.config import Config, OptimConfig
from cvae_rosetta.spec.errors import ConfigError
from cvae_rosetta.spec.optim import (
    clip_by_global_norm,
    learning_rates,
    make_optimizer,
    scale_by_adam,
    schedule,
)

WARMUP = ["--schedule", "warmup_cosine", "--warmup-steps", "5", "--end-learning-rate", "1e-4"]


# --- the config ----------------------------------------------------------------------------------


def test_constant_is_the_default_and_builds_the_spec_optimizer():
    optim = Config().optim
    assert (optim.schedule, optim.warmup_steps, optim.decay_steps) == ("constant", 0, None)
    assert optim.end_learning_rate == 0.0 and optim.for_run(100) is optim
    params = {"w": jnp.arange(4.0)}
    spec = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, 0.9, 0.999, 1e-8))
    assert jax.tree.structure(make_optimizer(optim).init(params)) == jax.tree.structure(
        spec.init(params)
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(schedule="linear"),
            "optim.schedule: expected one of constant, cosine, warmup_cosine",
        ),
        (dict(warmup_steps=5), "optim.warmup_steps: expected 0 with optim.schedule constant"),
        (dict(decay_steps=50), "optim.decay_steps: expected None with optim.schedule constant"),
        (dict(end_learning_rate=1e-4), "optim.end_learning_rate: expected 0.0 with optim.sche"),
        (dict(schedule="cosine", warmup_steps=3), "optim.warmup_steps: expected 0 with optim.sc"),
        (dict(schedule="warmup_cosine"), "optim.warmup_steps: expected an integer >= 1 with op"),
        (
            dict(schedule="warmup_cosine", warmup_steps=10, decay_steps=10),
            "optim.warmup_steps: expected fewer than the 10 steps of the whole schedule",
        ),
        (dict(schedule="cosine", decay_steps=0), "optim.decay_steps: expected an integer >= 1"),
        (dict(schedule="cosine", warmup_steps=-1), "optim.warmup_steps: expected an integer >= 0"),
        (
            dict(schedule="cosine", end_learning_rate=0.1),
            "optim.end_learning_rate: expected a number in [0, 0.001]",
        ),
        (dict(schedule="cosine", end_learning_rate=-1.0), "optim.end_learning_rate: expected a"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        OptimConfig(**fields)


def test_a_schedule_spans_the_run_unless_told():
    cosine = OptimConfig(schedule="cosine")
    assert cosine.for_run(320).decay_steps == 320
    assert OptimConfig(schedule="cosine", decay_steps=50).for_run(320).decay_steps == 50
    warm = OptimConfig(schedule="warmup_cosine", warmup_steps=400)
    with pytest.raises(ConfigError, match=r"^optim.warmup_steps: expected fewer than the 320 "):
        warm.for_run(320)
    with pytest.raises(ConfigError, match=r"^optim.decay_steps: expected the schedule's length"):
        make_optimizer(cosine)


# --- the optimiser -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cosine", "warmup_cosine"])
def test_the_scheduled_optimizer_is_optax_adamw_with_the_schedule(kind):
    """Its rate comes from Adam's count, so its state is the constant optimiser's (what a
    checkpoint holds); its updates are bit for bit those of the same steps with the rate counted by
    optax's own ``scale_by_learning_rate(schedule)``, and ``optax.adamw(schedule)``'s (whose
    clipping and bias corrections divide where the shared ones multiply) to a rounding."""
    warmup = 3 if kind == "warmup_cosine" else 0
    optim = OptimConfig(
        schedule=kind, warmup_steps=warmup, decay_steps=10, end_learning_rate=1e-4,
        weight_decay=0.1,
    )  # fmt: skip
    ours = make_optimizer(optim)
    counted = optax.chain(
        clip_by_global_norm(1.0),
        scale_by_adam(),
        optax.add_decayed_weights(0.1),
        optax.scale_by_learning_rate(schedule(optim)),
    )
    theirs = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule(optim), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1),
    )
    params = {"w": jnp.linspace(-1.0, 1.0, 7), "b": jnp.ones(3)}
    constant = make_optimizer(OptimConfig(weight_decay=0.1)).init(params)
    states = [ours.init(params), counted.init(params), theirs.init(params)]
    assert jax.tree.structure(states[0]) == jax.tree.structure(constant)
    ps = [params] * 3
    for t in range(14):  # past the schedule's end
        grads = jax.tree.map(lambda x, t=t: jnp.sin(x * (t + 1)) * 3.0, params)
        for i, tx in enumerate((ours, counted, theirs)):
            u, states[i] = jax.jit(tx.update)(grads, states[i], ps[i])
            ps[i] = optax.apply_updates(ps[i], u)
        for key in params:
            np.testing.assert_array_equal(ps[0][key], ps[1][key], err_msg=f"step {t + 1} {key}")
            np.testing.assert_allclose(ps[0][key], ps[2][key], rtol=1e-6, atol=1e-7)
    assert make_optimizer(optim) is ours  # built once per config


def test_the_shared_clipping_and_adam_are_optaxs_to_a_rounding():
    """Clipped and not (norms above and below ``clip_norm``), and Adam's first steps, where the
    bias corrections matter most: within a few float32 roundings of optax's."""
    params = {"w": jnp.linspace(-1.0, 1.0, 64), "b": jnp.ones(3)}
    for scale in (0.01, 100.0):
        grads = jax.tree.map(lambda x, s=scale: jnp.cos(3 * x) * s, params)
        ours, _ = clip_by_global_norm(1.0).update(grads, optax.EmptyState())
        theirs, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
        for key in params:
            np.testing.assert_allclose(ours[key], theirs[key], rtol=3e-7)
    a, b = scale_by_adam(), optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8)
    sa, sb = a.init(params), b.init(params)
    for t in range(5):
        grads = jax.tree.map(lambda x, t=t: jnp.sin(x * (t + 1)), params)
        ua, sa = a.update(grads, sa)
        ub, sb = b.update(grads, sb)
        assert jax.tree.structure(sa) == jax.tree.structure(sb)
        for key in params:
            np.testing.assert_allclose(ua[key], ub[key], rtol=1e-6, err_msg=f"step {t + 1}")
    # a bfloat16 tree keeps its dtype through both, as optax's does
    half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    ua, _ = a.update(half, a.init(half))
    ub, _ = b.update(half, b.init(half))
    assert jax.tree.map(lambda x: x.dtype, ua) == jax.tree.map(lambda x: x.dtype, ub)
    clipped, _ = clip_by_global_norm(1.0).update(half, optax.EmptyState())
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(clipped))


def test_learning_rates_are_the_schedule_at_the_steps_before():
    optim = OptimConfig(schedule="warmup_cosine", warmup_steps=4, decay_steps=12)
    want = [float(schedule(optim)(t - 1)) for t in range(1, 15)]
    np.testing.assert_allclose(learning_rates(optim, np.arange(1, 15)), want, rtol=1e-6)
    assert learning_rates(optim, [1])[0] == 0.0  # warm-up starts from 0
    assert learning_rates(OptimConfig(), [1, 2]).tolist() == [np.float32(1e-3)] * 2


# --- the conformance suite's float64 reference of the schedules ----------------------------------

SCHEDULED = [
    OptimConfig(schedule="cosine", learning_rate=3e-3, decay_steps=6, end_learning_rate=2e-4),
    OptimConfig(schedule="cosine", decay_steps=1),
    OptimConfig(
        schedule="warmup_cosine", learning_rate=2e-3, warmup_steps=3, decay_steps=9,
        end_learning_rate=1e-4, weight_decay=0.1, clip_norm=0.5,
    ),
    OptimConfig(schedule="warmup_cosine", warmup_steps=1, decay_steps=2),
]  # fmt: skip


@pytest.mark.parametrize("optim", SCHEDULED, ids=lambda o: o.schedule)
def test_the_reference_schedules_are_the_spec_optimizers(optim):
    """``conformance/reference.py`` writes the schedules and AdamW from their formulas, in float64
    (no optax): its rates are the shared optimiser's, and so are its steps, to float32 rounding."""
    from cvae_rosetta.conformance import reference

    steps = np.arange(1, optim.decay_steps + 4)  # past the schedule's end
    want = learning_rates(optim, steps)
    got = [reference.learning_rate(optim, int(t) - 1) for t in steps]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)

    tx = make_optimizer(optim)
    start = {"w": jnp.linspace(-1.0, 1.0, 7), "b": jnp.ones(3)}
    ours, state, ref, ref_state = start, tx.init(start), start, None
    for t in steps:
        grads = jax.tree.map(lambda x, t=t: jnp.sin(x * t) * 3.0, start)
        updates, state = jax.jit(tx.update)(grads, state, ours)
        ours = optax.apply_updates(ours, updates)
        step = reference.adamw_step(ref, grads, optim, ref_state)
        ref, ref_state = step.params, step.state
        assert step.rate == reference.learning_rate(optim, int(t) - 1)
        for key in start:
            np.testing.assert_allclose(ours[key], ref[key], rtol=1e-6, atol=1e-7, err_msg=str(t))


def _refusing(where: str):
    """The reference implementation, refusing every scheduled config in ``where``."""
    import dataclasses

    from cvae_rosetta.spec import protocol

    base = protocol.load("pure_jax")

    def refuse(config):
        if config.optim.schedule != "constant":
            raise ConfigError(f"optim.schedule: expected constant, got {config.optim.schedule}")

    if where == "from_canonical":

        def create(params, config):
            refuse(config)
            return base.from_canonical_fn(params, config)

        return dataclasses.replace(base, from_canonical_fn=create)

    def step(state, batch, eps):
        refuse(state.config)
        return base.train_step_fn(state, batch, eps)

    return dataclasses.replace(base, train_step_fn=step)


@pytest.mark.parametrize("where", ["from_canonical", "train_step"])
def test_the_schedule_check_is_not_applicable_to_an_implementation_that_refuses_them(where):
    """A ``ConfigError`` from ``from_canonical`` or the first ``train_step`` of a scheduled config
    reports the conformance suite's schedule check as not applicable, never as passed."""
    from cvae_rosetta.conformance import test_later_steps as schedules

    check = schedules.test_train_step_follows_the_learning_rate_schedule
    with pytest.raises(pytest.skip.Exception, match="^not applicable: .*optim.schedule="):
        check(_refusing(where), schedules.WARMUP_COSINE)


# --- through the CLI -----------------------------------------------------------------------------


def test_a_scheduled_run_logs_its_rate_and_records_its_length(tmp_path):
    out = tmp_path / "run"
    assert train_cli(*TINY, *WARMUP, "--out", str(out)) == 0
    optim = json.loads((out / "config.json").read_text())["config"]["optim"]
    assert optim["decay_steps"] == TOTAL  # derived from the run's length, recorded
    steps = [r for r in records(out) if r["event"] == "step"]
    rates = [r["learning_rate"] for r in steps]
    want = [float(schedule(OptimConfig(**optim))(t)) for t in range(TOTAL)]
    np.testing.assert_allclose(rates, want, rtol=1e-6)
    assert rates[0] == 0.0 and max(rates) == pytest.approx(1e-3) and rates[-1] > 1e-4


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (
            ["--schedule", "step"],
            "--schedule (optim.schedule): expected one of constant, cosine, warmup_cosine",
        ),
        (
            ["--warmup-steps", "10"],
            "--warmup-steps (optim.warmup_steps): expected 0 with --schedule constant",
        ),
        (
            ["--schedule", "warmup_cosine", "--warmup-steps", "x"],
            "--warmup-steps (optim.warmup_steps): expected",
        ),
        (
            ["--schedule", "warmup_cosine", "--warmup-steps", "40"],
            f"--warmup-steps (optim.warmup_steps): expected fewer than the {TOTAL} steps of the "
            "whole schedule",
        ),
    ],
)
def test_the_cli_refuses_bad_schedules_in_one_line(tmp_path, capsys, flags, error):
    out = tmp_path / "run"
    assert main(["train", *TINY, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cvae: error: {error}") and err.count("\n") == 1, err
    assert not out.exists()


def test_a_resume_cannot_change_the_schedule(tmp_path, capsys):
    out = tmp_path / "run"
    assert train_cli(*TINY, "--epochs", "1", "--out", str(out)) == 0
    assert train_cli("--resume", str(out), "--schedule", "cosine") == 2
    assert "optim.schedule" in capsys.readouterr().err


# --- killed and resumed --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A scheduled run of 4 epochs in one go."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert train_cli(*TINY, *WARMUP, "--checkpoint-every", "0", "--out", str(out)) == 0
    return out


@pytest.mark.faults  # a kill -9 and a resume: tox -e faults, with the other injected faults
def test_a_scheduled_run_killed_mid_epoch_resumes_bit_for_bit(reference, tmp_path):
    """SIGKILL while the third save (step 9, in epoch 2, past the warm-up) sleeps before its
    commit; the resume from checkpoint 6 (in the warm-up) takes the same rates, makes the same
    records and ends in the same state, bit for bit; TensorBoard hides the steps the killed run
    logged past its checkpoint and shows the resumed ones."""
    out = tmp_path / "killed" / "run"
    out.parent.mkdir()
    args = ["train", *TINY, *WARMUP, "--checkpoint-every", "3", "--out", str(out)]
    process = start(args, out.parent, slow="3:600")
    wait_for(process, lambda: tmp_of(out / "checkpoints", 9), "the save of step 9")
    assert kill(process)[0] == -signal.SIGKILL
    assert committed(out) == [3, 6]
    run = tmp_path / "run"
    shutil.copytree(out, run)
    assert train_cli("--resume", str(run), "--no-progress", "--iw-samples", "1") == 0
    assert_same_run(run, reference)
    rates = [r["learning_rate"] for r in records(run) if r["event"] == "step"]
    assert rates[:5] == sorted(rates[:5]) and rates[5:] == sorted(rates[5:], reverse=True)
    scalars, _ = read_events(run / "tb")
    assert len(list((run / "tb").iterdir())) == 2  # the killed run's file and the resumed one's
    steps = {r["step"]: r for r in records(run) if r["event"] == "step"}
    assert sorted(scalars["train/loss"]) == sorted(steps)
    for step, record in steps.items():
        assert scalars["train/loss"][step] == np.float32(record["loss"]), step
        assert scalars["train/learning_rate"][step] == np.float32(record["learning_rate"]), step
