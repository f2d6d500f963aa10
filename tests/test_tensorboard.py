"""``cvae train``'s TensorBoard event files (``RUN/tb/``), its ``--profile-steps`` trace and the
wording of its final lines, through the CLI.

The event files are read back with tensorboardX's own protobufs (TFRecord framing, then
``event_pb2.Event``), with TensorBoard's purge rule applied (a ``SessionLog.START`` at step ``s``
hides every earlier event at a step >= ``s``), and checked against ``metrics.jsonl``: the same tags
at the same steps with the same (float32) values. The gradient norm of step 1 is checked against
one computed here from the run's first batch.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from PIL import Image

from cvae_rosetta.cli import main
from cvae_rosetta.cli.tiny_runs import INSTALLED, TINY, TOTAL, train

STEP_TAGS = ("train/loss", "train/recon", "train/kl", "train/learning_rate", "train/grad_norm")
# each implementation where its framework is installed (tox: flax_nnx, equinox, keras, cross)
NEEDS = {
    "flax_linen": "needs_flax",
    "flax_nnx": "needs_flax",
    "equinox": "needs_equinox",
    "keras": "needs_keras",
}
IMPLEMENTATIONS = [
    pytest.param(n, marks=[] if n == "pure_jax" else getattr(pytest.mark, NEEDS.get(n, "cross")))
    for n in INSTALLED
]
EPOCH_TAGS = tuple(f"epoch/{k}_{n}" for k in ("train", "test") for n in ("loss", "recon", "kl"))


def read_events(directory: Path) -> tuple[dict, dict]:
    """``({tag: {step: value}}, {tag: {step: image}})`` of every event file in ``directory``, in
    file order, as TensorBoard shows them after its purges; a step logged twice fails."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    scalars: dict[str, dict[int, float]] = {}
    pictures: dict[str, dict[int, np.ndarray]] = {}
    paths = sorted(directory.glob("events.out.tfevents.*"), key=lambda p: p.name.split(".")[3])
    assert paths, f"no event file in {directory}"
    for path in paths:
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4  # length, its CRC, the event, its CRC
            if event.session_log.status == SessionLog.START:
                for series in (*scalars.values(), *pictures.values()):
                    for step in [s for s in series if s >= event.step]:
                        del series[step]
            for value in event.summary.value:
                if value.HasField("image"):
                    series = pictures.setdefault(value.tag, {})
                    image = Image.open(io.BytesIO(value.image.encoded_image_string))
                    shown = np.asarray(image)
                else:
                    series = scalars.setdefault(value.tag, {})
                    shown = value.simple_value
                assert event.step not in series, (value.tag, event.step)
                series[event.step] = shown
    return scalars, pictures


def assert_events_match_metrics(run: Path) -> None:
    """Every record of ``metrics.jsonl`` is in ``run/tb/`` at its step, value for value, and
    nothing else is; one sample and one reconstruction grid per epoch."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scalars, pictures = read_events(run / "tb")
    steps = [r for r in records if r["event"] == "step"]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert set(scalars) == {*STEP_TAGS, *EPOCH_TAGS, "epoch/steps_per_second"}
    for tag in STEP_TAGS:
        name = tag.split("/")[1]
        want = {r["step"]: np.float32(r[name]) for r in steps}
        assert scalars[tag] == want, tag
    for tag in EPOCH_TAGS:
        want = {r["step"]: np.float32(r[tag.split("/")[1]]) for r in epochs}
        assert scalars[tag] == want, tag
    assert sorted(scalars["epoch/steps_per_second"]) == [r["step"] for r in epochs]
    assert all(v > 0 for v in scalars["epoch/steps_per_second"].values())
    assert set(pictures) == {"samples", "reconstructions"}
    for grids in pictures.values():
        assert sorted(grids) == [r["step"] for r in epochs]
        assert all(g.shape[2] == 3 and g.dtype == np.uint8 and g.std() > 0 for g in grids.values())


def assert_grad_norm_is_the_gradients(run: Path) -> None:
    """Step 1's ``grad_norm`` is the global norm of the raw gradient of the run's first batch:
    the implementation's ``grads_fn`` on the initial state, batch and noise that the run's seed
    gives (SPEC section 3), not the clipped gradient's norm nor the update's."""
    from cvae_rosetta.app import data
    from cvae_rosetta.app.run import RunKeys
    from cvae_rosetta.spec import protocol
    from cvae_rosetta.spec.config import Config
    from cvae_rosetta.spec.model import noise, step_key
    from cvae_rosetta.spec.validation import Batch

    stored = json.loads((run / "config.json").read_text())
    config = Config.from_dict(stored["config"])
    impl = protocol.load(stored["impl"])
    keys = RunKeys.from_seed(config.train.seed)
    b = config.data.batch_size
    batches = data.EpochBatches(data.load(config.data).train, b, config.data.remainder)
    xs, cs = batches.epoch(jax.random.fold_in(keys.shuffle, 0))
    eps = noise(step_key(keys.train, 0), b, config.model.latent_dim)
    grads, _ = jax.jit(impl.grads_fn)(impl.init(keys.init, config), Batch(xs[0], cs[0]), eps)
    want = float(optax.tree.norm(grads))
    assert want > 1.1 * config.optim.clip_norm, "a norm the clipped gradient's could not match"
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1
    np.testing.assert_allclose(first["grad_norm"], want, rtol=1e-5, err_msg=str(run))


# --- the event files -----------------------------------------------------------------------------


def test_a_run_writes_tensorboard_events_that_match_metrics_jsonl(tmp_path):
    out = tmp_path / "run"
    args = [*TINY, "--epochs", "2", "--schedule", "cosine", "--out", str(out)]
    assert train(*args) == 0
    assert_events_match_metrics(out)
    scalars, pictures = read_events(out / "tb")
    rates = scalars["train/learning_rate"]
    assert rates[1] == np.float32(1e-3) and rates[1] > rates[8] > rates[16] > 0  # cosine
    samples = pictures["samples"][8]
    # synthetic data: 10 labels of 8 x 8 images, a row each, scaled up to 32 x 32
    assert samples.shape == (10 * (32 + 1) + 1, 8 * (32 + 1) + 1, 3)  # grey as RGB
    assert [p.name for p in (out / "tb").iterdir()] == [p.name for p in (out / "tb").glob("ev*")]


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_every_implementation_writes_the_same_tags(tmp_path, name):
    out = tmp_path / "run"
    assert train("--impl", name, *TINY, "--epochs", "1", "--out", str(out)) == 0
    assert_events_match_metrics(out)
    assert_grad_norm_is_the_gradients(out)


@pytest.mark.parametrize("mechanism", ["pmap", "sharded", "shard_map"])
def test_every_data_parallel_mechanism_writes_them(tmp_path, mechanism):
    """One device in this process: each mechanism's placed state and its local copy for the
    pictures (several devices and processes: test_tensorboard_is_written_by_process_0_only)."""
    out = tmp_path / "run"
    args = [*TINY, "--epochs", "1", "--data-parallel", mechanism, "--out", str(out)]
    assert train(*args) == 0
    assert_events_match_metrics(out)
    assert_grad_norm_is_the_gradients(out)


@pytest.mark.multidevice
@pytest.mark.parametrize("mechanism", ["pmap", "sharded", "shard_map"])
def test_the_gradient_norm_is_the_global_batchs_on_eight_devices(tmp_path, mechanism):
    """The norm of the gradient averaged over the devices (a subprocess that arranges its own
    eight host devices): the serial gradient's. Under
    ``shard_map`` a gradient with respect to the replicated state comes back summed over the
    devices unless the step makes the state each device's own, and then ``n`` times too long;
    clipping and Adam hide that factor from the parameters, not from this check."""
    import subprocess
    import sys

    out = tmp_path / "run"
    args = ["train", *TINY, "--epochs", "1", "--data-parallel", mechanism, "--devices", "8"]
    done = subprocess.run(
        [sys.executable, "-m", "cvae_rosetta.cli", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_events_match_metrics(out)
    assert_grad_norm_is_the_gradients(out)


def test_no_tensorboard_writes_none(tmp_path):
    out = tmp_path / "run"
    assert train(*TINY, "--epochs", "1", "--no-tensorboard", "--out", str(out)) == 0
    assert not (out / "tb").exists()


@pytest.mark.multidevice
def test_tensorboard_is_written_by_process_0_only(tmp_path):
    """Two processes of two devices each (``cvae launch``): one event file, every step in it."""
    import subprocess
    import sys

    out = tmp_path / "run"
    args = ["launch", "--num-processes", "2", "--timeout", "240", "--", "train", *TINY]
    args += ["--epochs", "1", "--data-parallel", "sharded", "--devices", "4", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "cvae_rosetta.cli", *args], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(list((out / "tb").iterdir())) == 1
    assert_events_match_metrics(out)
    assert_grad_norm_is_the_gradients(out)  # after the all-reduce across the processes


# --- the profiler trace --------------------------------------------------------------------------


def test_profile_steps_traces_exactly_those_steps(tmp_path):
    out = tmp_path / "run"
    assert train(*TINY, "--epochs", "1", "--profile-steps", "3:5", "--out", str(out)) == 0
    (trace,) = (out / "profile" / "plugins" / "profile").glob("*/*.xplane.pb")
    assert trace.stat().st_size > 0
    (perfetto,) = trace.parent.glob("perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(perfetto.read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    traced = {int(e["args"]["step_num"]) for e in events if e.get("name") == "train"}
    assert traced == {3, 4, 5}


FORMAT = (
    "expected FIRST:LAST, whole steps with 1 <= FIRST <= LAST (counted from 1 as in "
    "metrics.jsonl, both traced)"
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5:3", FORMAT),
        ("a:b", FORMAT),
        ("-1:3", FORMAT),
        ("0:3", FORMAT),
        ("4", FORMAT),
        (f"30:{TOTAL + 1}", f"expected steps within 1:{TOTAL} (the run's steps)"),
    ],
)
def test_bad_profile_steps_are_refused_before_anything_is_written(
    tmp_path, capsys, value, expected
):
    out = tmp_path / "run"
    assert main(["train", *TINY, f"--profile-steps={value}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"cvae: error: --profile-steps: {expected}, got {value!r}\n"
    assert not out.exists()


def test_profile_steps_already_taken_are_refused_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(*TINY, "--epochs", "1", "--out", str(out)) == 0
    args = ["--resume", str(out), "--epochs", "2", "--profile-steps", "5:10"]
    assert train(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "cvae: error: --profile-steps: expected steps within 9:16 (the 8 steps the run has "
        "left), got '5:10'"
    )


# --- the final lines -----------------------------------------------------------------------------


def test_the_final_lines_say_what_each_number_is(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", *TINY, "--epochs", "1", "--no-tensorboard", "--out", str(out)]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "  loss = the training objective (recon + beta * kl, beta 1, one posterior sample per "
        "example in nats), last epoch:"
    )
    assert lines[2].startswith("  train loss ") and "(mean over the epoch's steps)" in lines[2]
    assert "test loss " in lines[2] and "(mean over the test split; recon " in lines[2]
    assert lines[3] == (
        "  bounds on the test split's negative log-likelihood (Bernoulli, in nats; final "
        "parameters; beta 1; 1 posterior sample per example): -elbo = recon + kl averaged over "
        "the samples; -iwae = the importance-weighted bound, tighter"
    )
    assert lines[4].startswith("  test -elbo ") and "-iwae(k=1) " in lines[4]
