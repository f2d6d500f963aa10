"""Checkpoints (``shared/app/checkpoint.py``): the canonical train state
(``shared/app/trainstate.py``), saving and verifying, exact resume after SIGKILL and SIGINT,
resuming with another framework, damaged checkpoints, refusals.

The runs are tiny (synthetic data, 8 steps per epoch, 4 epochs). Killing a run mid-save is made
deterministic by the ``CVAE_CHECKPOINT_SLOW_SAVE`` hook: the N-th save sleeps just before its
commit, so the test knows where the process is when it kills it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import shutil
import signal
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from cvae_rosetta.app import checkpoint, resuming, trainstate
from cvae_rosetta.app.run import Position, Progress, RunKeys
from cvae_rosetta.cli.tiny_runs import (
    INSTALLED,
    TINY,
    TOTAL,
    assert_same_run,
    committed,
    corrupt,
    final_state,
    kill,
    records,
    snapshot,
    start,
    tmp_of,
    train,
    wait_for,
)
from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.config import Config, DataConfig, ModelConfig
from cvae_rosetta.spec.errors import CheckpointError
from cvae_rosetta.spec.validation import Batch

pytestmark = pytest.mark.cross

IMPL = "haiku" if "haiku" in INSTALLED else "pure_jax"  # the runs' implementation
OTHER = "flax_nnx" if "flax_nnx" in INSTALLED else None  # the one that takes a run over


def config() -> Config:
    model = ModelConfig(
        input_dim=64, num_classes=10, latent_dim=2, encoder_dims=(8,), decoder_dims=(8,)
    )
    return Config(model=model, data=DataConfig(name="synthetic"))


@functools.cache
def reference_tree() -> dict:
    """The canonical state of pure JAX three steps in, so Adam's moments and count are not
    trivial."""
    ref = protocol.load("pure_jax")
    state = ref.init(jax.random.key(0), config())
    x = jax.random.uniform(jax.random.key(1), (16, 64))
    c = jax.numpy.arange(16, dtype=jax.numpy.int32) % 10
    step = jax.jit(ref.train_step)
    for t in range(3):
        state, _ = step(state, Batch(x, c), jax.random.key(t))
    return trainstate.canonical_state(ref, state)


# --- the canonical train state -------------------------------------------------------------------


@pytest.mark.parametrize("name", INSTALLED)
def test_canonical_state_round_trips_exactly_in_every_implementation(name):
    tree = reference_tree()
    assert int(tree["step"]) == 3 and int(tree["opt_state"]["count"]) == 3
    assert np.any(tree["opt_state"]["nu"]["latent"]["kernel"] > 0)
    impl = protocol.load(name)
    back = trainstate.canonical_state(impl, trainstate.implementation_state(impl, tree, config()))
    flat, flat_back = checkpoint.flatten(tree), checkpoint.flatten(back)
    assert flat.keys() == flat_back.keys()
    for key in flat:
        assert flat[key].dtype == flat_back[key].dtype, key
        np.testing.assert_array_equal(flat[key], flat_back[key], err_msg=key)


@pytest.mark.parametrize("name", INSTALLED)
def test_a_run_starts_from_the_protocols_init_bit_for_bit_though_it_jits_it(name):
    """``cvae train`` jits ``init`` (one program the compilation cache keeps); the state must be
    the eager call's to the last bit, in every framework and for more than one key and shape."""
    from cvae_rosetta.app.train import fresh_state

    impl = protocol.load(name)
    wide = Config(model=ModelConfig(encoder_dims=(96, 48), decoder_dims=(48, 96), latent_dim=6))
    for seed, cfg in [(0, config()), (7, wide)]:
        key = jax.random.key(seed)
        eager = checkpoint.flatten(trainstate.canonical_state(impl, impl.init(key, cfg)))
        jitted = checkpoint.flatten(trainstate.canonical_state(impl, fresh_state(impl, key, cfg)))
        assert eager.keys() == jitted.keys()
        for path, array in eager.items():
            assert array.tobytes() == jitted[path].tobytes(), (seed, path)


@pytest.mark.parametrize("name", INSTALLED)
def test_moments_land_beside_their_parameters_in_every_framework(name):
    # optax updates each parameter leaf with the moment leaf at the same place of the framework's
    # own tree: with mu = 2 * params and nu = 3 * params, every pair must line up, transposes and
    # renamings included.
    tree = reference_tree()
    scaled = {
        **tree,
        "opt_state": {
            "count": tree["opt_state"]["count"],
            "mu": jax.tree.map(lambda a: 2 * a, tree["params"]),
            "nu": jax.tree.map(lambda a: 3 * a, tree["params"]),
        },
    }
    impl = protocol.load(name)
    state = trainstate.implementation_state(impl, scaled, config())
    adam = trainstate._adam_state(state.opt_state, impl)
    assert int(adam.count) == 3 and int(state.step) == 3
    for factor, moment in ((2, adam.mu), (3, adam.nu)):
        pairs = jax.tree.leaves(jax.tree.map(lambda p, m: (p, m), state.params, moment))
        assert len(pairs) == 2 * len(jax.tree.leaves(tree["params"]))
        for p, m in zip(pairs[::2], pairs[1::2], strict=True):
            np.testing.assert_array_equal(factor * np.asarray(p), np.asarray(m))


def test_a_foreign_optimiser_state_is_refused():
    ref = protocol.load("pure_jax")
    state = ref.init(jax.random.key(0), config())
    bad = state.replace(opt_state=(state.opt_state, state.opt_state))
    with pytest.raises(CheckpointError, match="opt_state: expected the state of SPEC section 5"):
        trainstate.canonical_state(ref, bad)


# --- saving, verifying --------------------------------------------------------------------------


def saved(tmp_path: Path, count: int = 3, keep: int = 2) -> checkpoint.Checkpoints:
    checkpoints = checkpoint.Checkpoints(tmp_path / "checkpoints", keep=keep, writable=True)
    for step in range(1, count + 1):
        tree = {**reference_tree(), "step": np.int32(step)}
        progress = Progress(Position(step, 0, step), ((1.5, 1.0, 0.5),) * step, 2 * step, 0.1)
        checkpoints.save(
            checkpoint.Checkpoint(
                tree, RunKeys.from_seed(0), progress, config(), "pure_jax", "data"
            )
        )
    return checkpoints


@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_save_and_restore_keep_every_bit_and_only_the_latest(tmp_path):
    checkpoints = saved(tmp_path, count=4, keep=2)
    try:
        assert checkpoints.steps() == [3, 4]
        restored = checkpoints.restore(4)
    finally:
        checkpoints.close()
    assert restored.progress == Progress(Position(4, 0, 4), ((1.5, 1.0, 0.5),) * 4, 8, 0.1)
    assert restored.impl == "pure_jax" and restored.config == config()
    keys = RunKeys.from_seed(0)
    for a, b in zip(
        checkpoint.key_data(restored.keys)[0], checkpoint.key_data(keys)[0], strict=True
    ):
        np.testing.assert_array_equal(a, b)
    meta = json.loads((tmp_path / "checkpoints" / "4" / "meta" / "metadata").read_text())
    assert meta["arrays"]["params/latent/kernel"]["sha256"]
    assert meta["step"] == 4 and meta["config"]["model"]["latent_dim"] == 2
    # arrays (TensorStore's OCDBT under arrays/) and JSON, nothing else, no pickle anywhere
    for path in (tmp_path / "checkpoints" / "4").rglob("*"):
        if path.is_file() and "arrays" not in path.parts and path.name != "commit_success.txt":
            json.loads(path.read_text())


def test_orbax_is_used_through_its_current_api_only(tmp_path, caplog):
    """A save and a restore raise no deprecation of Orbax's: no warning of the kind from its code,
    no deprecation event (Orbax records one through jax.monitoring when an old API is used), no
    log line about a deprecated option; and no Orbax class of its internal modules is subclassed."""
    import warnings

    events: list[str] = []

    def listen(event: str, **_: object) -> None:
        events.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
            warnings.simplefilter("always")
            checkpoints = saved(tmp_path, count=3, keep=2)
            try:
                assert checkpoints.restore(3).step == 3
            finally:
                checkpoints.close()
    finally:
        jax.monitoring.unregister_event_listener(listen)
    kinds = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
    deprecations = [
        f"{w.filename}: {w.message}"
        for w in caught
        if issubclass(w.category, kinds) and ("orbax" in w.filename or "checkpoint" in w.filename)
    ]
    assert deprecations == []
    assert [e for e in events if "orbax" in e and "deprecat" in e] == []
    logged = [r.getMessage() for r in caplog.records if "deprecat" in r.getMessage().lower()]
    assert logged == []
    ocp, items, args = checkpoint._orbax()
    for cls in (items, args):
        bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("orbax")]
        public = {ocp.CompositeCheckpointHandler, ocp.args.Composite}
        assert bases[0] in public, f"{cls.__name__} subclasses {bases[0]}, not a public class"


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
def test_a_damaged_latest_checkpoint_is_reported_by_step(tmp_path, how):
    checkpoints = saved(tmp_path, count=3, keep=3)
    try:
        target = max(
            (p for p in (tmp_path / "checkpoints" / "3" / "arrays").rglob("*") if p.is_file()),
            key=lambda p: p.stat().st_size,
        )
        corrupt(target, how)
        word = {"truncate": "truncated", "flip": "corrupted", "delete": "missing"}[how]
        with pytest.raises(CheckpointError, match=f"step 3, is damaged.*{word}"):
            checkpoints.latest(latest_good=False)
        good, damaged = checkpoints.latest(latest_good=True)
    finally:
        checkpoints.close()
    assert good.step == 2 and [s for s, _ in damaged] == [3]


def test_damaged_metadata_is_reported_too(tmp_path):
    checkpoints = saved(tmp_path, count=2, keep=2)
    try:
        (tmp_path / "checkpoints" / "2" / "meta" / "metadata").write_text("{not json")
        with pytest.raises(CheckpointError, match="step 2, is damaged"):
            checkpoints.latest(latest_good=False)
        (tmp_path / "checkpoints" / "1" / "cvae_files.json").write_text("[]")
        with pytest.raises(CheckpointError, match="expected an intact checkpoint, got none"):
            checkpoints.latest(latest_good=True)
    finally:
        checkpoints.close()


# --- runs: an uninterrupted reference, a run killed in the middle of a save ---------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """4 epochs in one go."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert train("--impl", IMPL, *TINY, "--checkpoint-every", "0", "--out", str(out)) == 0
    return out


def _start(out: Path, slow: str):
    """Haiku (pure JAX without it) with a checkpoint every 3 steps, in a new process."""
    args = ["train", "--impl", IMPL, *TINY, "--checkpoint-every", "3", "--out", str(out)]
    return start(args, out.parent, slow=slow)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Haiku (pure JAX without it), checkpoints every 3 steps; SIGKILL while the third save (step
    9, in epoch 2) sleeps before its commit. Checkpoints 3 and 6 are committed, metrics.jsonl runs
    on to step 9."""
    out = tmp_path_factory.mktemp("killed") / "run"
    process = _start(out, "3:600")
    wait_for(process, lambda: tmp_of(out / "checkpoints", 9), "the save of step 9")
    assert kill(process)[0] == -signal.SIGKILL
    return out


def test_a_crash_during_a_save_leaves_the_previous_checkpoints_intact(killed):
    assert tmp_of(killed / "checkpoints", 9)  # the save that was killed, never committed
    assert committed(killed) == [3, 6]
    checkpoints = checkpoint.Checkpoints(killed / "checkpoints")
    try:
        assert checkpoints.steps() == [3, 6]
        latest, damaged = checkpoints.latest(latest_good=False)
    finally:
        checkpoints.close()
    assert damaged == [] and latest.step == 6
    assert latest.progress.position == Position(6, 0, 6)  # in the middle of the first epoch
    assert len(records(killed)) == 10  # steps 1-9 and epoch 1: past the checkpoint


def test_a_failed_save_is_removed_even_while_its_writes_are_still_in_flight(tmp_path):
    """After a failed save the checkpoint library's threads may still write into its temporary
    directory (seen under a full disk on a busy machine: ``50.orbax-checkpoint-tmp`` was left).
    A writer that goes on for half a second after the failure must not leave it behind."""
    checkpoints = checkpoint.Checkpoints(tmp_path / "checkpoints", writable=True)
    unfinished = checkpoints.directory / f"7{checkpoint.TMP_SUFFIX}" / "arrays"
    unfinished.mkdir(parents=True)
    stop = time.monotonic() + 0.5

    def in_flight() -> None:
        for number in itertools.count():
            if time.monotonic() > stop:
                return
            with contextlib.suppress(OSError):
                unfinished.mkdir(parents=True, exist_ok=True)
                (unfinished / f"chunk{number}").write_bytes(b"x" * 64)
            time.sleep(0.01)

    writer = threading.Thread(target=in_flight)
    writer.start()
    try:
        checkpoints.discard_unfinished(7)
    finally:
        writer.join()
        checkpoints.close()
    assert not list(checkpoints.directory.iterdir())


def test_resume_after_sigkill_mid_epoch_is_bit_identical(killed, reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    assert train("--resume", str(run), "--no-progress", "--iw-samples", "1") == 0
    assert not tmp_of(run / "checkpoints", 9)  # the crashed save's leftovers are gone
    assert_same_run(run, reference)
    same = json.loads((run / "config.json").read_text())
    assert same["resumes"] == [{"step": 6, "impl": IMPL, "from": IMPL}]


@pytest.mark.skipif(OTHER is None, reason="needs flax")
def test_another_framework_continues_the_run(killed, reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    args = ["--resume", str(run), "--impl", OTHER, "--no-progress", "--iw-samples", "1"]
    assert train(*args) == 0
    ours, theirs = final_state(run), final_state(reference)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-4, atol=1e-6, err_msg=key)
    mine, ref = records(run), records(reference)
    assert [(r["event"], r["step"]) for r in mine] == [(r["event"], r["step"]) for r in ref]
    assert mine[:6] == ref[:6]  # the steps taken before the crash are kept as they were
    for a, b in zip(mine, ref, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float):
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), (a["step"], k)
    written = json.loads((run / "config.json").read_text())
    assert written["impl"] == OTHER
    assert written["resumes"] == [{"step": 6, "impl": OTHER, "from": IMPL}]
    assert checkpoint.latest_of_run(run).impl == OTHER


def test_sigint_stops_after_a_checkpoint_and_resumes_exactly(reference, tmp_path):
    out = tmp_path / "run"
    process = _start(out, "2:2")  # the second save (step 6) takes 2 s: SIGINT arrives during it
    wait_for(process, lambda: tmp_of(out / "checkpoints", 6), "the save of step 6")
    status, stderr = kill(process, signal.SIGINT)
    assert status == 130, stderr
    assert "stopped by SIGINT at step 6 (6 batches into epoch 1)" in stderr, stderr
    assert f"--resume {out}" in stderr
    assert "Traceback" not in stderr
    assert committed(out) == [3, 6]
    assert len(records(out)) == 6
    assert train("--resume", str(out), "--no-progress", "--iw-samples", "1") == 0
    assert_same_run(out, reference)


# --- damaged checkpoints and refusals through the CLI --------------------------------------------


def error_line(capsys) -> str:
    """What the command printed on stderr, but the warning that it took over the lock a killed run
    left (tested in test_run_guards.py)."""
    lines = capsys.readouterr().err.strip().splitlines()
    return "\n".join(line for line in lines if not line.startswith("cvae: warning: took over"))


def test_resume_refuses_a_damaged_latest_unless_told(killed, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    target = next(
        p
        for p in (run / "checkpoints" / "6" / "arrays").rglob("*")
        if p.is_file() and p.stat().st_size > 64
    )
    corrupt(target, "truncate")
    before = snapshot(run)
    assert train("--resume", str(run), "--no-progress") == 2
    err = error_line(capsys)
    assert err.count("\n") == 0 and err.startswith("cvae: error: checkpoint:")
    assert "step 6, is damaged" in err and "--resume-latest-good" in err
    assert snapshot(run) == before  # nothing written

    assert (
        train("--resume", str(run), "--resume-latest-good", "--no-progress", "--iw-samples", "1")
        == 0
    )
    out = capsys.readouterr()
    assert "checkpoint 6 is damaged" in out.err and "resuming" in out.out and "step 3" in out.out
    assert list((run / resuming.DAMAGED_DIR).iterdir())  # moved aside, not deleted
    assert checkpoint.latest_of_run(run).step == TOTAL


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--latent-dim", "3", "--beta", "2"],
            "--latent-dim, --beta (model.latent_dim, loss.beta): expected the values",
        ),
        (["--batch-size", "32"], "--batch-size (data.batch_size): expected the values"),
        (["--epochs", "0"], "--epochs (train.epochs): expected an integer >= 1"),
        (["--out", "elsewhere"], "--out: expected none with --resume"),
        (["--checkpoint-every", "-1"], "--checkpoint-every: expected an integer >= 0"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints: expected an integer >= 1"),
    ],
)
def test_resume_refuses_other_settings_naming_them(killed, capsys, extra, message):
    before = snapshot(killed)
    assert train("--resume", str(killed), "--no-progress", *extra) == 2
    err = error_line(capsys)
    assert err.count("\n") == 0 and message in err, err
    assert snapshot(killed) == before


def test_resume_refuses_fewer_epochs_than_done(reference, capsys):
    before = snapshot(reference)
    assert train("--resume", str(reference), "--no-progress", "--epochs", "3") == 2
    err = error_line(capsys)
    assert "--epochs (train.epochs): expected at least 4 (the checkpoint at step 32" in err, err
    assert snapshot(reference) == before


def test_resume_refuses_a_config_json_that_disagrees_with_its_checkpoint(killed, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    config_file = run / "config.json"
    data = json.loads(config_file.read_text())
    data["config"]["model"]["latent_dim"] = 5
    config_file.write_text(json.dumps(data))
    before = snapshot(run)
    assert train("--resume", str(run), "--no-progress") == 2
    err = error_line(capsys)
    assert "model.latent_dim: expected the values of the run in" in err, err
    assert snapshot(run) == before


def test_resume_of_what_is_not_a_resumable_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "nockpt").mkdir()
    (tmp_path / "nockpt" / "config.json").write_text(
        json.dumps({"impl": "pure_jax", "config": config().to_dict()})
    )
    (tmp_path / "number").mkdir()  # before this change: TypeError, a traceback
    (tmp_path / "number" / "config.json").write_text("5")
    for target, message in (
        (tmp_path / "missing", "--resume: expected a run directory of cvae train"),
        (tmp_path / "empty", "holds none"),
        (tmp_path / "number", "config.json to name its implementation and config, it does not"),
        (tmp_path / "nockpt", "checkpoints (cvae train writes checkpoints there), got no such"),
    ):
        assert train("--resume", str(target), "--no-progress") == 2
        err = error_line(capsys)
        assert err.count("\n") == 0 and message in err, err
    assert train("--resume-latest-good", "--no-progress") == 2
    assert "expected only with --resume" in capsys.readouterr().err
