"""The loader: short names, module:attribute strings (outside the repo too), clear refusals."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from test_entry_point_only import install

from cvae_rosetta.spec import protocol, registry
from cvae_rosetta.spec.errors import ImplementationNotFound


def test_short_name_resolves_to_the_reference():
    impl = protocol.load("pure_jax")
    assert impl.name == "pure_jax"
    assert protocol.load("cvae_rosetta.impls.pure_jax:implementation") is impl


def builtins() -> list[protocol.ImplInfo]:
    return [info for info in protocol.known() if info.builtin]


def test_known_lists_every_builtin_with_its_install_state():
    infos = {i.name: i for i in protocol.known()}
    assert infos["pure_jax"].installed and infos["pure_jax"].module == "jax"
    assert infos["pure_jax"].builtin and infos["pure_jax"].about.label == "pure JAX"
    assert infos["haiku"].about.distribution == "dm-haiku" and infos["haiku"].module == "haiku"


def test_the_application_lists_each_framework_with_its_version():
    from cvae_rosetta.app import frameworks

    rows = {row.name: row for row in frameworks.known()}
    assert [row.name for row in frameworks.known()] == [i.name for i in protocol.known()]
    assert rows["pure_jax"].framework == "jax" and rows["pure_jax"].version
    assert rows["haiku"].framework == "dm-haiku"


PYPROJECT = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())


def test_the_builtins_are_the_entry_points_of_pyproject_in_its_order():
    """The one list of built-ins is pyproject.toml's table of entry points: the registry finds
    each name and target in the installed metadata, and lists them in the table's order (which
    the metadata does not keep: each file's ``ABOUT["order"]`` does)."""
    declared = PYPROJECT["project"]["entry-points"][protocol.ENTRY_POINT_GROUP]
    assert {info.name: info.target for info in builtins()} == declared
    assert [info.name for info in builtins()] == list(declared)  # `cvae impls`, tabs, columns
    assert [info.name for info in protocol.known()][: len(declared)] == list(declared)


@pytest.mark.parametrize(
    "name", list(PYPROJECT["project"]["entry-points"][protocol.ENTRY_POINT_GROUP])
)
def test_each_builtin_says_all_of_itself_and_pyproject_agrees(name):
    """Every built-in's file has an ``ABOUT`` with every key (``order`` may be left out: such a
    one comes after those with one); the extra it names exists in pyproject.toml, requires its
    distribution and is part of ``all`` (None: the distribution is a dependency of the project
    itself); loaded, the implementation reports that distribution as its framework."""
    from cvae_rosetta.app import frameworks

    info = next(info for info in builtins() if info.name == name)
    about = registry.read_about(info.source)
    assert about is not None and set(registry.FIELDS) - {"order"} <= set(about), (name, about)
    assert info.about.declared == tuple(about)
    project = PYPROJECT["project"]
    assert project["name"] == frameworks.DISTRIBUTION
    extras = project["optional-dependencies"]
    extra = about["extra"]
    requirements = project["dependencies"] if extra is None else extras[extra]
    names = [re.match(r"[A-Za-z0-9._-]+", r).group() for r in requirements]
    assert about["distribution"] in names, (name, about)
    if extra is not None:
        assert f"{frameworks.DISTRIBUTION}[" in extras["all"][0]
        assert extra in re.findall(r"[\w-]+", extras["all"][0].partition("[")[2]), extras["all"]
    if info.installed:
        impl = protocol.load(name)
        assert impl.framework == about["distribution"]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ImplementationNotFound) as info:
        protocol.load("tensorflow")
    message = str(info.value)
    assert "got 'tensorflow'" in message
    for info in builtins():
        assert info.name in message
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


def test_a_package_in_the_working_directory_loads_as_python_m_would(tmp_path, monkeypatch):
    """``pytest --impl mypackage.my_impl:implementation`` and ``cvae train --impl ...`` from the
    folder that holds ``mypackage``, with that folder on no entry of ``sys.path`` (the console
    scripts put their own folder there, not the working directory): the loader looks in the
    working directory too, appending it to ``sys.path`` (last) once the package is found there,
    and leaving ``sys.path`` as it was when it is not there either."""
    pkg = f"cwd_{tmp_path.name.replace('-', '_')}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "mine.py").write_text(textwrap.dedent(renamed_pure_jax("from_cwd")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    try:
        monkeypatch.chdir(elsewhere)
        before = list(sys.path)
        with pytest.raises(ImplementationNotFound) as info:
            protocol.load(f"{pkg}.mine:implementation")
        assert str(info.value).endswith(
            f"got no module named {pkg!r} on sys.path or in the working directory {elsewhere}"
        ), info.value
        assert sys.path == before

        monkeypatch.chdir(tmp_path)
        assert protocol.load(f"{pkg}.mine:implementation").name == "from_cwd"
        assert sys.path == [*before, str(tmp_path)]
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == pkg]:
            del sys.modules[name]


def test_adapter_refuses_a_non_config():
    import jax

    from cvae_rosetta.spec.errors import ConfigError

    with pytest.raises(ConfigError, match="config: expected a cvae_rosetta.spec.config.Config"):
        protocol.load("pure_jax").init(jax.random.key(0), {"model": {}})


def test_an_implementation_without_its_framework_says_which_extra_installs_it(
    tmp_path, monkeypatch
):
    """Registered by an entry point, with an ``ABOUT`` naming a module that is not installed and
    an extra: listed as not installed (its file is read, never imported); the contract's refusal
    names the missing module, the application's adds the extra (only the application knows
    what an extra is)."""
    from cvae_rosetta.app import frameworks

    pkg = f"pkg_{tmp_path.name.replace('-', '_')}"
    about = (
        '{"label": "Needs", "module": "not_installed_xyz", "distribution": "nix", "extra": "flax"}'
    )
    install(
        tmp_path,
        "needs-xyz",
        {"needs_xyz": f"{pkg}.mine:implementation"},
        {
            f"{pkg}/__init__.py": "",
            f"{pkg}/mine.py": f"import not_installed_xyz\n\nABOUT = {about}\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    info = next(i for i in protocol.known() if i.name == "needs_xyz")
    assert not info.installed and not info.builtin and info.module == "not_installed_xyz"
    assert (info.about.label, info.about.extra) == ("Needs", "flax")
    assert frameworks.distribution("needs_xyz") == "nix"
    needs = "it needs 'not_installed_xyz', which is not installed"
    with pytest.raises(ImplementationNotFound) as error:
        protocol.load("needs_xyz")
    assert str(error.value).endswith(needs)
    with pytest.raises(ImplementationNotFound) as error:
        frameworks.load("needs_xyz")
    assert str(error.value).endswith(
        f"{needs}; install its framework with: pip install 'cvae-rosetta[flax]'"
    )
    assert isinstance(error.value.__cause__, ModuleNotFoundError)
    sys.modules.pop(pkg, None)


def test_one_registered_from_outside_without_about_gets_the_defaults(tmp_path, monkeypatch):
    """Label: its name; module: its target's top-level package; distribution: the one the
    installed metadata says holds that package; no extra. Listed after the built-in ones."""
    pkg = f"pkg_{tmp_path.name.replace('-', '_')}"
    install(
        tmp_path,
        "plain-dist",
        {"plain": f"{pkg}.mine:implementation"},
        {f"{pkg}/__init__.py": "", f"{pkg}/mine.py": "import this_is_never_imported\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    infos = protocol.known()
    assert [i.builtin for i in infos] == sorted((i.builtin for i in infos), reverse=True)
    info = next(i for i in infos if i.name == "plain")
    assert info.installed and info.source == tmp_path / pkg / "mine.py"
    assert info.about == registry.About("plain", pkg, "plain-dist", None, None, ())
    sys.modules.pop(pkg, None)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("ABOUT = ['Mine']\n", "expected a literal dict, got ['Mine'] (a list)"),
        ("ABOUT = dict(label='x')\n", "expected a literal dict, got \"dict(label='x')\""),
        ("ABOUT = {'lable': 'x'}\n", "expected keys among label, module, distribution, extra, "),
        ("ABOUT = {'label': ''}\n", "'label': expected a non-empty string, got ''"),
        ("ABOUT = {'module': 'a-b'}\n", "'module': expected a module's dotted name, got 'a-b'"),
        (
            "ABOUT = {'extra': 3}\n",
            "'extra': expected None or a non-empty string, got 3 (an integer)",
        ),
        ("ABOUT = {'order': True}\n", "'order': expected an integer, got True (true or false)"),
        ("ABOUT = {}\nABOUT = {}\n", "expected one assignment, got 2 (lines 1, 2)"),
        ("ABOUT = {\n", "expected Python source to read it from, got SyntaxError at line 1"),
    ],
    ids=["list", "call", "key", "label", "module", "extra", "order", "twice", "syntax"],
)
def test_a_malformed_about_is_refused_naming_the_file_and_the_key(tmp_path, source, message):
    path = tmp_path / "mine.py"
    path.write_text(source)
    with pytest.raises(ImplementationNotFound) as error:
        registry.read_about(path)
    assert str(error.value).startswith(f"ABOUT of {path}"), str(error.value)
    assert message in str(error.value)


def test_the_registry_imports_no_jax():
    """The docs build and the benchmark's pages read it: it reads files, imports nothing."""
    code = (
        "import sys; from cvae_rosetta.spec import registry; infos = registry.known(); "
        "assert infos and 'jax' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
