"""The loader: short names, module:attribute strings (outside the repo too), clear refusals."""

from __future__ import annotations

import re
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
    assert infos["pure_jax"].installed and infos["pure_jax"].module == "jax"


def test_the_application_lists_each_framework_with_its_version():
    from cvae_rosetta.app import frameworks

    rows = {row.name: row for row in frameworks.known()}
    assert [row.name for row in frameworks.known()] == [i.name for i in protocol.known()]
    assert rows["pure_jax"].framework == "jax" and rows["pure_jax"].version
    assert rows["haiku"].framework == "dm-haiku"


def test_the_builtins_are_the_entry_points_of_pyproject():
    """Names and targets come from the installed metadata, the same as pyproject.toml's table, and
    every one of them has its framework row (and no row is left over)."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    table = tomllib.loads(pyproject.read_text())["project"]["entry-points"]
    declared = table[protocol.ENTRY_POINT_GROUP]
    assert {name: b.target for name, b in protocol.BUILTIN.items()} == declared
    assert set(protocol.BUILTIN_FRAMEWORKS) == set(declared)
    assert list(protocol.BUILTIN) == list(protocol.BUILTIN_FRAMEWORKS)  # `cvae impls` order


def test_each_builtin_is_installed_by_the_extra_the_application_names():
    """The application's table (cvae_rosetta.app.frameworks) has a row for every built-in, and
    each extra it names exists in pyproject.toml and requires that row's distribution."""
    from cvae_rosetta.app import frameworks

    pyproject = tomllib.loads(
        (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    )
    assert pyproject["project"]["name"] == frameworks.DISTRIBUTION
    extras = pyproject["project"]["optional-dependencies"]
    assert list(frameworks.INSTALLS) == list(protocol.BUILTIN_FRAMEWORKS)
    for name, install in frameworks.INSTALLS.items():
        if install.extra is None:  # a dependency of the project itself
            requirements = pyproject["project"]["dependencies"]
        else:
            requirements = extras[install.extra]
        names = [re.match(r"[A-Za-z0-9._-]+", r).group() for r in requirements]
        assert install.distribution in names, (name, install)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ImplementationNotFound) as info:
        protocol.load("tensorflow")
    message = str(info.value)
    assert "got 'tensorflow'" in message
    for name in protocol.BUILTIN:
        assert name in message
    assert "pure_jax (installed)" in message


def test_missing_module_and_attribute_are_named():
    with pytest.raises(ImplementationNotFound, match="cannot be found|no module named"):
        protocol.load("no_such_module_xyz:impl")
    with pytest.raises(ImplementationNotFound, match="to define 'nothing', got a module without"):
        protocol.load("cvae_rosetta.impls.pure_jax:nothing")
    with pytest.raises(ImplementationNotFound, match="missing: .*train_step"):
        protocol.load("cvae_rosetta.spec.config:Config")


@pytest.mark.parametrize(
    ("source", "spec", "message"),
    [
        # a mistyped module: the module itself cannot be found (no word of importing it)
        (
            None,
            "mypkg_xyz.nomod:implementation",
            "expected an importable module "
            "'mypkg_xyz.nomod', got no module named 'mypkg_xyz' on sys.path",
        ),
        (
            "",
            "{pkg}.nomod:implementation",
            "expected an importable module '{pkg}.nomod', got no "
            "module named '{pkg}.nomod' on sys.path",
        ),
        # the module exists, but something it imports does not
        (
            "import not_installed_xyz\n",
            "{pkg}.mine:implementation",
            "expected module "
            "'{pkg}.mine' to import, got ModuleNotFoundError inside it: it needs "
            "'not_installed_xyz', which is not installed",
        ),
        # the module exists, but an import inside it fails
        (
            "from json import no_such_name\n",
            "{pkg}.mine:implementation",
            "expected module "
            "'{pkg}.mine' to import, got ImportError inside it: cannot import name 'no_such_name'",
        ),
        # the module imports, the attribute is missing
        (
            "x = 1\n",
            "{pkg}.mine:implementation",
            "expected module '{pkg}.mine' to define "
            "'implementation', got a module without 'implementation'",
        ),
    ],
    ids=["no-package", "no-module", "missing-dependency", "import-error", "no-attribute"],
)
def test_a_broken_target_says_which_part_is_wrong(tmp_path, monkeypatch, source, spec, message):
    pkg = f"pkg_{tmp_path.name.replace('-', '_')}"
    if source is not None:
        outside_package(tmp_path, monkeypatch, pkg, source)
    with pytest.raises(ImplementationNotFound) as info:
        protocol.load(spec.format(pkg=pkg))
    text = str(info.value)
    assert text.startswith("impl: expected "), text
    assert message.format(pkg=pkg) in text
    assert "known but" not in text and "cannot be imported" not in text


def outside_package(tmp_path, monkeypatch, package: str, source: str) -> None:
    """``<package>/mine.py`` holding ``source``, in a folder put on ``sys.path``."""
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "mine.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


def renamed_pure_jax(name: str) -> str:
    """A module's source that copies pure JAX under another ``name``."""
    return f"""
        import dataclasses
        from cvae_rosetta.impls import pure_jax

        implementation = dataclasses.replace(pure_jax.implementation, name={name!r})
    """


def test_an_implementation_outside_the_repo(tmp_path, monkeypatch):
    """A module anywhere on sys.path that wraps its functions in the protocol loads by path."""
    outside_package(tmp_path, monkeypatch, "outside_pkg", renamed_pure_jax("mine"))
    impl = protocol.load("outside_pkg.mine:implementation")
    assert impl.name == "mine"
    sys.modules.pop("outside_pkg.mine", None)
    sys.modules.pop("outside_pkg", None)


def test_adapter_refuses_a_non_config():
    import jax

    from cvae_rosetta.spec.errors import ConfigError

    with pytest.raises(ConfigError, match="config: expected a cvae_rosetta.spec.config.Config"):
        protocol.load("pure_jax").init(jax.random.key(0), {"model": {}})


def test_a_builtin_without_its_framework_says_which_extra_installs_it(tmp_path, monkeypatch):
    """The contract's refusal names the missing module; the application's adds the extra (and
    only the application knows it)."""
    from cvae_rosetta.app import frameworks

    pkg = f"pkg_{tmp_path.name.replace('-', '_')}"
    outside_package(tmp_path, monkeypatch, pkg, "import not_installed_xyz\n")
    builtin = protocol.Builtin(f"{pkg}.mine:implementation", "not_installed_xyz")
    monkeypatch.setitem(protocol.BUILTIN, "flax_nnx", builtin)
    needs = "it needs 'not_installed_xyz', which is not installed"
    with pytest.raises(ImplementationNotFound) as info:
        protocol.load("flax_nnx")
    assert str(info.value).endswith(needs)
    with pytest.raises(ImplementationNotFound) as info:
        frameworks.load("flax_nnx")
    assert str(info.value).endswith(
        f"{needs}; install its framework with: pip install 'cvae-rosetta[flax]'"
    )
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
