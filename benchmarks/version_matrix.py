"""How long code keeps working: each implementation file, unchanged, on its framework's releases.

    python benchmarks/version_matrix.py [--distribution NAME] [--series N] [--out FILE] [--render]

For every framework a built-in implementation uses (flax for Flax Linen and Flax NNX, dm-haiku,
equinox, keras), the registry's final releases are grouped into series (a minor version, ``0.12``;
for ``0.0.N`` versions, each ``N``), and the newest release of each series is tried: every series
of the last two years, and at least the last :data:`MIN_SERIES`. Each one is installed in a
virtual environment of its own (on Python 3.11, or 3.12 where it needs it) with the newest JAX that
both it and this project accept (the
resolver chooses; this project's own dependency ranges are kept), this project's wheel installed
beside it unchanged, and the implementation's suite run on it (``pytest --pyargs
cvae_rosetta.conformance --impl NAME``, stopping at the first failure). The outcome is one of:
``passes``; ``fails`` (the first failing check, and its message's first line); ``does not
import`` (the implementation file's import fails: its last line); ``framework does not import``
(the release itself does not import beside a JAX this project runs on, so the file was not tried);
``does not install`` (the resolver's last line). The
deprecation warnings the suite shows on each release are kept, by message.

A benchmark, not a test: it installs many versions (a few minutes each; the file records the date
and the machine). The result file, ``benchmarks/results/version_matrix.json``, is what the
choosing page's production row reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "version_matrix.json"
SCHEMA = "cvae-version-matrix/1"
# distribution -> the implementations that use it, and the extra of pyproject.toml that installs
# it (whose other requirements come along: Haiku's JAX range and jmp)
USERS = {
    "flax": (("flax_linen", "flax_nnx"), "flax"),
    "dm-haiku": (("haiku",), "haiku"),
    "equinox": (("equinox",), "equinox"),
    "keras": (("keras",), "keras"),
}
MIN_SERIES = 4
# the module each implementation's framework is imported as
FRAMEWORK_MODULES = {"flax_linen": "flax.linen", "flax_nnx": "flax.nnx", "haiku": "haiku",
                     "equinox": "equinox", "keras": "keras"}  # fmt: skip
# The Pythons this project supports, tried in turn: a release that needs a newer one (flax 0.12.12
# needs 3.12) is tried on it (uv finds each by its version)
PYTHONS = ("3.11", "3.12")
YEARS = 2
SUITE_TIMEOUT = 1800
FINAL = re.compile(r"^\d+(\.\d+)*$")
WARNING = re.compile(r"(\w*DeprecationWarning|FutureWarning): (.+)")


def series_of(version: str) -> str:
    parts = version.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["0", "0"] else ".".join(parts[:2])


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def releases(name: str) -> list[dict]:
    """The newest final release of each series, newest first: those of the last two years, and
    at least :data:`MIN_SERIES`."""
    import maintenance  # benchmarks/maintenance.py, beside this script

    found = maintenance.record(name, maintenance.fetch(name))["releases"]
    newest: dict[str, dict] = {}
    for release in found:  # oldest first: the last of a series wins
        newest[series_of(release["version"])] = release
    kept = sorted(newest.values(), key=lambda r: _key(r["version"]), reverse=True)
    since = (datetime.date.today() - datetime.timedelta(days=365 * YEARS)).isoformat()
    recent = [r for r in kept if r["date"] >= since]
    return kept[: max(len(recent), MIN_SERIES)]


def project_requirements(name: str | None = None) -> list[str]:
    """This project's own dependencies and its test extra, as pyproject.toml states them, and
    ``name``'s extra without ``name`` itself (the release tried takes its place)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    extra = [r for r in extras[USERS[name][1]] if not r.startswith(name)] if name else []
    return [*project["dependencies"], *extras["test"], *extra]


def build_wheel(into: Path) -> Path:
    subprocess.run(["uv", "build", "--wheel", "--out-dir", str(into), str(ROOT)], check=True,
                   capture_output=True)  # fmt: skip
    return next(into.glob("cvae_rosetta-*.whl"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def install(name: str, version: str, venv: Path) -> tuple[Path | None, str]:
    """A virtual environment with the release and this project's requirements, on the first
    supported Python it installs on (:data:`PYTHONS`); None and the resolver's last line where it
    installs on none."""
    said = ""
    for python in PYTHONS:
        shutil.rmtree(venv, ignore_errors=True)
        made = subprocess.run(["uv", "venv", "--python", python, str(venv)], capture_output=True,
                              text=True)  # fmt: skip
        if made.returncode != 0:
            said = _last_line(made.stderr)
            continue
        installed = subprocess.run(
            ["uv", "pip", "install", "--python", str(venv / "bin" / "python"),
             f"{name}=={version}", *project_requirements(name)],
            capture_output=True, text=True,
        )  # fmt: skip
        if installed.returncode == 0:
            return venv / "bin" / "python", ""
        said = _last_line(installed.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    return None, said


def try_release(name: str, version: str, wheel: Path, work: Path) -> dict:
    """One release: installed, then each implementation that uses it imported and run."""
    impls, _ = USERS[name]
    venv = work / f"{name}-{version}"
    start = time.perf_counter()
    python, refused = install(name, version, venv)
    if python is None:
        print(f"{name} {version}: does not install: {refused[:150]}", flush=True)
        return {i: {"status": "does not install", "detail": refused} for i in impls}
    subprocess.run(["uv", "pip", "install", "--python", str(python), "--no-deps", str(wheel)],
                   check=True, capture_output=True)  # fmt: skip
    jax = subprocess.run([str(python), "-c", "import jax, sys; print(jax.__version__, "
                          "'on Python %d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    out = {}
    for impl in impls:
        out[impl] = {"jax": jax, **run_suite(python, impl, work)}
        out[impl]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{name} {version} {impl}: {out[impl]['status']} {out[impl].get('detail', '')[:150]}",
              flush=True)  # fmt: skip
    shutil.rmtree(venv, ignore_errors=True)
    return out


def run_suite(python: Path, impl: str, work: Path) -> dict:
    """The implementation's suite on ``python``'s environment: first its framework imported alone
    (a release that does not import beside the JAX installed cannot try the file at all), then the
    file, then the suite to its first failure."""
    module = {"haiku": "haiku_impl", "equinox": "equinox_impl", "keras": "keras_impl"}.get(
        impl, impl
    )
    for status, code in (
        ("framework does not import", f"import {FRAMEWORK_MODULES[impl]}"),
        ("does not import", f"import cvae_rosetta.impls.{module}"),
    ):
        imported = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, cwd=work
        )
        if imported.returncode != 0:
            return {"status": status, "detail": _last_line(imported.stderr)}
    suite = subprocess.run(
        [str(python), "-m", "pytest", "--pyargs", "cvae_rosetta.conformance", "--impl", impl,
         "-x", "-q", "-p", "no:cacheprovider", "-W", "default::DeprecationWarning",
         "-W", "default::FutureWarning", "-rf"],
        capture_output=True, text=True, cwd=work, timeout=SUITE_TIMEOUT,
    )  # fmt: skip
    text = suite.stdout + suite.stderr
    warnings = sorted({f"{m[1]}: {m[2].strip()[:200]}" for m in WARNING.finditer(text)})
    final = [line for line in text.splitlines() if re.match(r"^=+ .* in [\d.]+s", line)]
    summary = final[-1].strip("= ") if final else _last_line(text)
    if suite.returncode == 0:
        return {"status": "passes", "detail": summary, "warnings": warnings}
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", text, re.MULTILINE)
    refused = re.search(r"^(?:ERROR|cvae_rosetta|pytest): .*$|^E   .*$", text, re.MULTILINE)
    internal = [line for line in text.splitlines() if re.match(r"^INTERNALERROR> \w*Error", line)]
    if failed:
        detail = f"{failed[1]}: {failed[2] or ''}".strip()
    elif internal:  # pytest itself stopped, in a plugin's hook
        detail = "pytest's internal error: " + internal[-1].removeprefix("INTERNALERROR> ")
    else:
        detail = refused[0].strip() if refused else _last_line(text)
    return {"status": "fails", "detail": detail[:400], "summary": summary, "warnings": warnings}


def measure(names: list[str], series: int | None) -> dict:
    import platform

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cvae-versions-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(work / "wheel")
        for name in names:
            results[name] = {}
            for release in releases(name)[:series]:
                tried = try_release(name, release["version"], wheel, work)
                results[name][release["version"]] = {"date": release["date"], "impls": tried}
    return {
        "schema": SCHEMA,
        "kind": "version_matrix",
        "run": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "project_jax": next(r for r in project_requirements() if r.startswith("jax")),
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distribution", action="append", choices=list(USERS))
    parser.add_argument("--series", type=int, help="at most this many series each (newest first)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    names = args.distribution or list(USERS)
    data = measure(names, args.series)
    if args.out.exists() and args.distribution:  # a partial run keeps the others' results
        previous = json.loads(args.out.read_text())
        data["results"] = {**previous.get("results", {}), **data["results"]}
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
