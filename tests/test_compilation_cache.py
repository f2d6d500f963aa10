"""JAX's persistent compilation cache in the ``cvae`` commands (``cvae_rosetta.app.cache``).

Where it goes (flag, then ``$CVAE_COMPILATION_CACHE``, then JAX's own
``$JAX_COMPILATION_CACHE_DIR``, then the per-user default), that every command that runs JAX
points JAX at it before its work, that a folder that cannot be written only costs a one-line
warning, and that a second identical ``cvae train`` reads its programs back from the cache instead
of compiling them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cvae_rosetta import cli
from cvae_rosetta.app import cache
from cvae_rosetta.cli.tiny_runs import TINY, train
from cvae_rosetta.spec.errors import ConfigError

HOME = Path.home()


# --- where it goes --------------------------------------------------------------------------------


def test_the_default_is_per_user():
    assert cache.choose(environ={}) == cache.Choice(HOME / ".cache/cvae-rosetta/jax", "default")
    assert cache.choose(environ={"XDG_CACHE_HOME": "/x/c"}).folder == Path("/x/c/cvae-rosetta/jax")
    # a relative XDG_CACHE_HOME is ignored, as the XDG specification says
    assert cache.choose(environ={"XDG_CACHE_HOME": "rel"}).folder == cache.default_folder({})


def test_the_flag_wins_over_the_environment():
    env = {"CVAE_COMPILATION_CACHE": "/from/env", "JAX_COMPILATION_CACHE_DIR": "/jax/own"}
    assert cache.choose("/from/flag", environ=env).folder == Path("/from/flag")
    assert cache.choose(off=True, environ=env).folder is None
    assert cache.choose("off", environ=env).folder is None
    assert cache.choose(environ=env) == cache.Choice(Path("/from/env"), "$CVAE_COMPILATION_CACHE")
    assert cache.choose(environ={"CVAE_COMPILATION_CACHE": "OFF"}).folder is None
    # auto (the conformance plugin's default) or empty: as if unset
    for unset in ("auto", "", " "):
        assert cache.choose(environ={"CVAE_COMPILATION_CACHE": unset}).source == "default"


def test_jax_own_setting_is_left_alone_and_bench_defaults_to_none():
    own = cache.choose(environ={"JAX_COMPILATION_CACHE_DIR": "/jax/own"})
    assert own.jax_own and own.folder is None
    assert cache.use(own) == (None, None)  # nothing changed, not even imported
    bench = cache.choose(default_on=False, environ={})
    assert bench.folder is None and not bench.jax_own
    assert cache.choose("/d", default_on=False, environ={}).folder == Path("/d")  # asked: used


def test_an_empty_folder_is_refused():
    with pytest.raises(
        ConfigError, match=r"compilation_cache: expected a directory or 'off', got ''"
    ):
        cache.choose("")


# --- every command points JAX at it before its work -----------------------------------------------

RUN = ["--run", "nowhere"]
COMMANDS = {
    "train": ["train", "--data", "synthetic", "--epochs", "1"],
    "compare": ["compare", "--data", "synthetic", "--epochs", "1"],
    "evaluate": ["evaluate", *RUN],
    "convert": ["convert", *RUN, "--out", "x.npz"],
    "sample": ["sample", *RUN, "--label", "1", "--out", "x.png"],
    "reconstruct": ["reconstruct", *RUN, "--out", "x.png"],
    "export": ["export", *RUN, "--out", "x"],
    "bench": ["bench", "--quick"],
}


class Reached(ConfigError):
    pass


@pytest.fixture
def chosen(monkeypatch, tmp_path):
    """What each command hands to ``cache.use``; the command stops there (before its work)."""
    seen: list[cache.Choice] = []

    def use(choice, environ=os.environ):
        seen.append(choice)
        raise Reached("reached the compilation cache")

    monkeypatch.setattr(cache, "use", use)
    monkeypatch.delenv("CVAE_COMPILATION_CACHE", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return seen


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_jax_command_sets_the_cache_before_its_work(command, chosen, tmp_path, capsys):
    argv = COMMANDS[command]
    folder = tmp_path / "mine"
    assert cli.main([*argv, "--compilation-cache", str(folder)]) == 2
    assert cli.main([*argv, "--no-compilation-cache"]) == 2
    assert cli.main(argv) == 2  # the default
    os.environ["CVAE_COMPILATION_CACHE"] = str(tmp_path / "env")  # monkeypatch restores it
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("reached the compilation cache") == 4, err
    default = None if command == "bench" else tmp_path / "xdg/cvae-rosetta/jax"
    assert [c.folder for c in chosen] == [folder, None, default, tmp_path / "env"]
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.png").exists()


def test_the_flags_are_on_every_jax_command_and_exclusive(capsys):
    for argv in COMMANDS.values():
        with pytest.raises(SystemExit) as stop:
            cli.main([*argv, "--compilation-cache", "d", "--no-compilation-cache"])
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count(
        "expected at most one of --compilation-cache and --no-compilation-cache, got both"
    ) == len(COMMANDS), err


# --- using it -------------------------------------------------------------------------------------


@pytest.fixture
def jax_cache_settings():
    """JAX's cache settings as they were, restored after the test (it runs in this process)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ["jax_compilation_cache_dir", *cache.THRESHOLDS]
    before = {name: getattr(jax.config, name) for name in names}
    yield jax.config
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_use_points_jax_at_the_folder(tmp_path, jax_cache_settings):
    folder, warning = cache.use(cache.Choice(tmp_path / "a" / "b", "--compilation-cache"), {})
    assert warning is None and folder == (tmp_path / "a" / "b").resolve()
    assert jax_cache_settings.jax_compilation_cache_dir == str(folder)
    assert jax_cache_settings.jax_persistent_cache_min_compile_time_secs == 0
    assert jax_cache_settings.jax_persistent_cache_min_entry_size_bytes == 0
    assert (folder.stat().st_mode & 0o777) == 0o700  # the cache is trusted: the user's own
    assert cache.use(cache.Choice(None, "--no-compilation-cache"), {}) == (None, None)
    assert jax_cache_settings.jax_compilation_cache_dir is None


def test_an_unwritable_folder_warns_in_one_line_and_runs_without(tmp_path, jax_cache_settings):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder, warning = cache.use(cache.Choice(blocker / "cache", "--compilation-cache"), {})
    assert folder is None and jax_cache_settings.jax_compilation_cache_dir is None
    assert "\n" not in warning and str(blocker / "cache") in warning and "without it" in warning


def test_a_run_with_an_unwritable_cache_still_trains(tmp_path, capsys, jax_cache_settings):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "run"
    argv = [*TINY, "--epochs", "1", "--out", str(out), "--compilation-cache", str(blocker / "c")]
    assert train(*argv) == 0
    assert (out / "config.json").is_file()
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("cvae: warning:")]
    assert len(warnings) == 1 and "compilation cache" in warnings[0], err


def cvae(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cvae_rosetta.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_second_identical_run_reads_its_programs_from_the_cache(tmp_path):
    """With ``JAX_LOG_COMPILES`` JAX names every persistent-cache hit on stderr: the first run
    writes the folder, the identical second one reads every program back (it adds nothing)."""
    folder = tmp_path / "cache"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_LOG_COMPILES": "1"}
    env["CVAE_COMPILATION_CACHE"] = str(folder)  # the variable, not a flag
    argv = ["train", *TINY, "--epochs", "1", "--no-tensorboard", "--iw-samples", "1"]
    first = cvae(*argv, "--out", str(tmp_path / "a"), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    written = sorted(folder.iterdir())
    assert written, "the first run wrote nothing into the cache"
    assert "Persistent compilation cache hit" not in first.stderr
    second = cvae(*argv, "--out", str(tmp_path / "b"), env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    hits = [
        line for line in second.stderr.splitlines() if "Persistent compilation cache hit" in line
    ]
    assert len(hits) >= len(written) // 2, second.stderr[-3000:]
