"""Data parallelism and multi-process runs: what is refused before anything runs, on any machine.

The equality of every mechanism with the serial step is the conformance suite's
(``conformance/test_parallel.py``, all device counts in ``tox -e multidevice``); the end-to-end runs
over several devices and processes are in ``tests/test_multidevice.py``.
"""

from __future__ import annotations

import dataclasses

import jax
import pytest

from cvae_rosetta.app.cluster import membership
from cvae_rosetta.app.devices import RunDevices
from cvae_rosetta.cli import main
from cvae_rosetta.conformance.common import CONFIG, make_batch
from cvae_rosetta.impls import pure_jax
from cvae_rosetta.spec import parallel
from cvae_rosetta.spec.config import Config, DataConfig, TrainConfig
from cvae_rosetta.spec.errors import ConfigError

TINY = ["--epochs", "1", "--batch-size", "64", "--no-progress", "--data", "synthetic"]


def refused(capsys, *args: str) -> str:
    """Run the CLI, expect exit status 2 and one line on stderr; return that line."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cvae: error: "), err
    return err[0]


def test_config_names_each_data_parallel_field():
    with pytest.raises(ConfigError, match=r"train\.data_parallel: expected one of none, pmap"):
        TrainConfig(data_parallel="dp")
    with pytest.raises(ConfigError, match=r"train\.devices: expected 1 with train\.data_parall"):
        TrainConfig(devices=2)
    with pytest.raises(ConfigError, match=r"train\.devices: expected an integer >= 1, got 0"):
        TrainConfig(data_parallel="pmap", devices=0)
    with pytest.raises(ConfigError, match=r"train\.devices, data\.batch_size: expected a batch si"):
        Config(data=DataConfig(batch_size=30), train=TrainConfig(data_parallel="pmap", devices=4))


def test_a_plan_refuses_more_devices_than_jax_has():
    with pytest.raises(
        ConfigError, match=rf"train\.devices: expected at most {jax.device_count()}"
    ):
        parallel.Plan.create("sharded", jax.device_count() + 1)
    with pytest.raises(ConfigError, match="train.data_parallel: expected one of"):
        parallel.Plan.create("vmap", 1)


def test_a_plan_refuses_a_batch_its_devices_cannot_split():
    plan = parallel.Plan("sharded", (jax.devices()[0],) * 3)  # the count is all that matters here
    with pytest.raises(ConfigError, match=r"data\.batch_size: expected a multiple of the 3"):
        plan.check_batch_size(8)
    plan.check_batch_size(9)


def test_per_device_mechanisms_need_the_gradient_half_of_the_step():
    no_grads = dataclasses.replace(pure_jax.implementation, grads_fn=None)
    for mechanism in parallel.PER_DEVICE:
        with pytest.raises(
            ConfigError, match=r"train\.data_parallel: expected 'none' or 'sharded'"
        ):
            parallel.check_mechanism(mechanism, no_grads)
    parallel.check_mechanism("sharded", no_grads)  # the partitioner needs nothing more
    run = RunDevices(parallel.Plan.create("sharded", 1))
    state = run.place_state(no_grads.init(jax.random.key(0), CONFIG))
    batch = make_batch(jax.random.key(1), 4)
    state, metrics = run.plan.make_step(no_grads)(state, batch, jax.random.key(2))
    assert int(run.local_state(state).step) == 1 and float(metrics["loss"]) > 0
    with pytest.raises(ConfigError, match=r"train\.data_parallel: expected 'none' or 'sharded'"):
        parallel.Plan.create("pmap", 1, no_grads)  # a plan for the implementation checks it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--data-parallel", "pmap", "--devices", "3"],
            "--devices, --batch-size (train.devices, data.batch_size): expected a batch size that",
        ),
        (["--devices", "2"], "--devices (train.devices): expected 1 with --data-parallel 'none'"),
        (
            ["--data-parallel", "dp"],
            "--data-parallel (train.data_parallel): expected one of none, pmap",
        ),
        (["--process-id", "1"], "--process-id: expected only with --distributed, got 1"),
        (
            ["--distributed", "--coordinator", "host", "--num-processes", "2", "--process-id", "0"],
            "--coordinator: expected HOST:PORT",
        ),
        (
            [
                "--distributed",
                "--data-parallel",
                "sharded",
                "--coordinator",
                "127.0.0.1:9",
                "--num-processes",
                "2",
                "--process-id",
                "2",
            ],
            "--process-id: expected an integer in [0, 2), got 2",
        ),
        (
            [
                "--distributed",
                "--data-parallel",
                "pmap",
                "--coordinator",
                "127.0.0.1:9",
                "--num-processes",
                "2",
                "--process-id",
                "0",
            ],
            "--data-parallel (train.data_parallel): expected one of sharded, shard_map with a "
            "distributed run",
        ),
        (
            [
                "--distributed",
                "--data-parallel",
                "sharded",
                "--devices",
                "3",
                "--batch-size",
                "63",
                "--coordinator",
                "127.0.0.1:9",
                "--num-processes",
                "2",
                "--process-id",
                "0",
            ],
            "--devices (train.devices): expected a multiple of --num-processes",
        ),
    ],
)
def test_the_cli_refuses_bad_parallel_settings_before_writing(tmp_path, capsys, args, message):
    out = tmp_path / "run"
    line = refused(capsys, "train", "--out", str(out), *TINY, *args)
    assert message in line
    assert not out.exists()


def test_launch_refuses_what_it_cannot_start(capsys):
    assert "expected a train command after --" in refused(capsys, "launch", "--", "compare")
    assert "--num-processes: expected an integer >= 1" in refused(
        capsys, "launch", "--num-processes", "0", "--", "train"
    )
    assert "--port: expected an integer in [1, 65535]" in refused(
        capsys, "launch", "--port", "70000", "--", "train"
    )


def test_a_cluster_gives_each_process_one_device_unless_told():
    config = Config(train=TrainConfig(data_parallel="sharded"))
    cluster = membership.Cluster.create("127.0.0.1:1234", 4, 3, config, devices_given=False)
    assert cluster.config.train.devices == 4 and cluster.process_id == 3
    given = Config(train=TrainConfig(data_parallel="shard_map", devices=8))
    assert (
        membership.Cluster.create(
            "10.0.0.1:99", 2, 0, given, devices_given=True
        ).config.train.devices
        == 8
    )
