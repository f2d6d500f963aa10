"""The example of an outside distribution, ``examples/cvae-rosetta-stax``, installs as a user
installs it and passes the commands of its own ``tox.ini``.

A fresh virtual environment is made in a temporary folder (``python -m venv``), and the packages of
the environment running this test are made visible in it by a ``.pth`` file that adds this
interpreter's site-packages (``sysconfig.get_paths()["purelib"]``) as a site directory, so that its
own ``.pth`` files (an editable install's import hook) take effect too. ``cvae-rosetta[test]`` and
JAX are therefore found installed, and nothing is downloaded but the example's build backend: every
``pip install`` here runs with ``--no-index``, with only that backend's wheel to find. The example
is then installed from a copy of its folder, its dependencies resolved against what is installed,
so an install would fail if its range of ``cvae-rosetta`` excluded the installed version; a copy
whose range does exclude it must fail, so the first install proves the range.

The commands of the example's ``tox.ini`` run in the fresh environment as tox runs them, from a
scratch directory outside the repository and with nothing on ``PYTHONPATH``: ``cvae ...`` as
``python -m cvae_rosetta ...`` and ``pytest ...`` as ``python -m pytest ...`` of that environment,
``{posargs}`` left out. ``cvae impls`` must list ``stax`` with the example's target, the registry
must read the label of the example's ``ABOUT`` from the installed file, and the conformance suite
must name the implementation and pass it, read from its summary line and from the JSON report.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.outside

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cvae-rosetta-stax"
SOURCE = EXAMPLE / "src" / "cvae_stax" / "__init__.py"
NAME = "stax"  # the example's entry point
TARGET = "cvae_stax:implementation"
# what the commands of tox.ini are run as, inside the fresh environment
RUN_AS = {"cvae": ["-m", "cvae_rosetta"], "pytest": ["-m", "pytest"]}


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float):
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def outside_env(venv: Path) -> dict[str, str]:
    """A user's shell with the fresh environment activated: its scripts first on ``PATH``, nothing
    on ``PYTHONPATH``, no implementation or report path of the caller's."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "CVAE_IMPL", "CVAE_CONFORMANCE_REPORT", "PYTHONHOME"):
        env.pop(name, None)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = os.pathsep.join(filter(None, [str(venv / "bin"), env.get("PATH")]))
    return env


def make_venv(venv: Path) -> Path:
    """A fresh environment with its own pip, which sees this environment's packages through a
    ``.pth`` file in its site-packages; its interpreter."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    probe = 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
    purelib = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    # each folder as a plain line, which pip's build isolation recognises and takes off the path
    # again, then as a site directory, whose own .pth files (an editable install's hook) run
    lines = [*ours, *(f"import site; site.addsitedir({path!r})" for path in ours)]
    (Path(purelib) / "_outer_environment.pth").write_text("\n".join(lines) + "\n")
    return python


def build_backend(python: Path, wheels: Path, env: dict[str, str]) -> None:
    """The wheels of the example's build backend (``build-system.requires``), the only download."""
    requires = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["build-system"]["requires"]
    command = [str(python), "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    result = run([*command, "-d", str(wheels), *requires], wheels.parent, env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def copy_example(destination: Path, requirement: str | None = None) -> Path:
    """A copy of the example's folder (pip builds in the folder it installs from), with its one
    dependency replaced by ``requirement`` where given."""
    shutil.copytree(
        EXAMPLE, destination, ignore=shutil.ignore_patterns(".tox", "build", "*.egg-info")
    )
    if requirement is not None:
        path = destination / "pyproject.toml"
        text = path.read_text()
        old = tomllib.loads(text)["project"]["dependencies"]
        assert len(old) == 1 and f'"{old[0]}"' in text, old
        path.write_text(text.replace(f'"{old[0]}"', f'"{requirement}"'))
    return destination


def tox_commands() -> tuple[list[list[str]], dict[str, str]]:
    """The commands of the example's one tox environment, ``{posargs}`` left out, and its
    ``set_env``."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(EXAMPLE / "tox.ini")
    envs = [s for s in tox.sections() if s.startswith("testenv")]
    assert len(envs) == 1, f"examples/cvae-rosetta-stax/tox.ini: expected one environment: {envs}"
    section = tox[envs[0]]
    assert section.get("package") == "wheel", "the example's environment must install its wheel"
    commands = [
        [word for word in shlex.split(line) if word != "{posargs}"]
        for line in section["commands"].strip().splitlines()
    ]
    set_env = dict(
        (part.strip() for part in line.split("=", 1))
        for line in section.get("set_env", "").strip().splitlines()
    )
    return commands, set_env


def declared_label() -> str:
    """``ABOUT["label"]`` of the example's module, read from its text as the registry reads it."""
    for node in ast.parse(SOURCE.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "ABOUT"
        ]:
            return ast.literal_eval(node.value)["label"]
    raise AssertionError(f"{SOURCE}: no ABOUT")


def check_suite(output: str, scratch: Path) -> None:
    """The suite names the implementation it loaded and passes every check it applies."""
    header = [line for line in output.splitlines() if line.strip().startswith(f"impl {NAME}:")]
    assert header and f"{NAME} from cvae_stax" in header[0], output[:3000]
    summary = re.search(rf"^{NAME}: (.+)$", output, re.MULTILINE)
    assert summary and "failed" not in summary.group(1), output[-3000:]
    written = re.search(r"^report: (.+)$", output, re.MULTILINE)
    assert written, output[-3000:]
    report = json.loads((scratch / written.group(1).strip()).read_text())
    assert report["implementations"][NAME]["name"] == NAME
    assert report["implementations"][NAME]["diagnosis"] is None, report["implementations"]
    counts = report["summary"][NAME]
    assert counts["failed"] == 0 and counts["passed"] > 100, counts
    assert set(report["results"][NAME].values()) <= {"passed", "not applicable"}


def test_the_example_installs_and_passes_its_own_tox_commands(tmp_path):
    venv = tmp_path / "venv"
    python = make_venv(venv)
    env = outside_env(venv)
    wheels = tmp_path / "backend"
    build_backend(python, wheels, env)
    pip = [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(wheels)]

    # a range that excludes the installed cvae-rosetta cannot be resolved without an index
    excluded = copy_example(tmp_path / "excluded", "cvae-rosetta[test]>=0.0.1,<0.1")
    result = run([*pip, "--dry-run", str(excluded)], tmp_path, env, timeout=600)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "No matching distribution found for cvae-rosetta" in result.stderr, result.stderr

    result = run([*pip, str(copy_example(tmp_path / "example"))], tmp_path, env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    installed = f"Successfully installed {project['name']}-{project['version']}"
    assert installed in result.stdout, result.stdout

    commands, set_env = tox_commands()
    assert [c[0] for c in commands] == ["cvae", "pytest"], commands
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    outputs = []
    for command in commands:
        full = [str(python), *RUN_AS[command[0]], *command[1:]]
        result = run(full, scratch, {**env, **set_env}, timeout=1800)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{shlex.join(command)}\n{output[-5000:]}"
        outputs.append(output)

    listed = [line.split() for line in outputs[0].splitlines() if line.startswith(f"{NAME} ")]
    assert listed and listed[0][-1] == TARGET, outputs[0]
    probe = (
        "from cvae_rosetta.spec import registry; "
        f"info = registry.info({NAME!r}); print(info.about.label); print(info.source)"
    )
    result = run([str(python), "-c", probe], scratch, env, timeout=120)
    label, source = result.stdout.splitlines()[-2:]
    assert label == declared_label(), result.stdout + result.stderr
    assert Path(source).is_relative_to(venv), f"the entry point's module is not installed: {source}"
    check_suite(outputs[1], scratch)
