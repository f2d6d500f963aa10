"""The loader: short names, module:attribute strings (outside the repo too), clear refusals."""

from __future__ import annotations

import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from cvae_rosetta.spec import protocol
from cvae_rosetta.spec.errors import ImplementationNotFound


def test_short_name_resolves_to_the_reference():
    impl = protocol.load("pure_jax")
    assert impl.name == "pure_jax"
    assert protocol.load("cvae_rosetta.impls.pure_jax:implementation") is impl


def test_known_lists_every_builtin_with_its_install_state():
    infos = {i.name: i for i in protocol.known()}
    assert set(protocol.BUILTIN) <= set(infos)
    assert infos["pure_jax"].installed and infos["pure_jax"].version


def test_the_builtins_are_the_entry_points_of_pyproject():
    """Names and targets come from the installed metadata, the same as pyproject.toml's table, and
    every one of them has its framework row (and no row is left over)."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    table = tomllib.loads(pyproject.read_text())["project"]["entry-points"]
    declared = table[protocol.ENTRY_POINT_GROUP]
    assert {name: b.target for name, b in protocol.BUILTIN.items()} == declared
    assert set(protocol.BUILTIN_FRAMEWORKS) == set(declared)
    assert list(protocol.BUILTIN) == list(protocol.BUILTIN_FRAMEWORKS)  # `cvae impls` order


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ImplementationNotFound) as info:
        protocol.load("tensorflow")
    message = str(info.value)
    assert "got 'tensorflow'" in message
    for name in protocol.BUILTIN:
        assert name in message
    assert "pure_jax (installed)" in message


def test_missing_module_and_attribute_are_named():
    with pytest.raises(ImplementationNotFound, match="cannot be imported"):
        protocol.load("no_such_module_xyz:impl")
    with pytest.raises(ImplementationNotFound, match="to define 'nothing'"):
        protocol.load("cvae_rosetta.impls.pure_jax:nothing")
    with pytest.raises(ImplementationNotFound, match="missing: .*train_step"):
        protocol.load("cvae_rosetta.spec.config:Config")


def test_an_implementation_outside_the_repo(tmp_path, monkeypatch):
    """A module anywhere on sys.path that wraps its functions in the protocol loads by path."""
    package = tmp_path / "outside_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mine.py").write_text(
        textwrap.dedent("""
        import dataclasses
        from cvae_rosetta.impls import pure_jax

        implementation = dataclasses.replace(pure_jax.implementation, name="mine")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = protocol.load("outside_pkg.mine:implementation")
    assert impl.name == "mine"
    sys.modules.pop("outside_pkg.mine", None)
    sys.modules.pop("outside_pkg", None)


def test_adapter_refuses_a_non_config():
    import jax

    from cvae_rosetta.spec.errors import ConfigError

    with pytest.raises(ConfigError, match="config: expected a cvae_rosetta.spec.config.Config"):
        protocol.load("pure_jax").init(jax.random.key(0), {"model": {}})
