"""Both ways to bring your own implementation pass the conformance suite, outside the repository.

Every command runs in a subprocess from the temporary folder that holds the package, as a user
outside the repository runs it: plain ``pytest`` and ``cvae`` (this environment's scripts), nothing
on ``PYTHONPATH``, so the package is found because it is in the working directory.

The template route: ``template/my_impl.py`` is copied into a package in a temporary folder
(``byo_pkg``), each of its placeholders (a function that ends in ``raise NotImplementedError``) is
replaced by a small plain-JAX implementation written below, and the suite's spec checks and
``cvae train`` run on it; the filled template also trains for an epoch. The template as it is must
fail the suite, so it cannot pass by accident.

The raw route: ``template/raw_impl.py``, which implements the protocol members itself with its own
loss, validation and train state and imports nothing from ``cvae_rosetta``, goes through the
commands of its route exactly as ``template/README.md`` and ``docs/own_implementation.md`` write
them (copied as it is into ``mypackage``, the whole suite, ``cvae train``), and must pass the
suite (every refusal matched word for word against the error grammar of ``docs/spec.md``) and
train, checkpoint included; a copy that words one refusal outside the grammar must fail, so the
grammar is what it passes by.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from cvae_rosetta.conformance import plugin

pytestmark = pytest.mark.suite_runs

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "template" / "my_impl.py"
TARGET = "byo_pkg.my_impl:implementation"
RAW = ROOT / "template" / "raw_impl.py"


def _layout():
    """``tests/test_layout.py``'s section names and marker pattern, imported by path (``tests`` is
    not a package)."""
    spec = importlib.util.spec_from_file_location(
        "_layout_rules", ROOT / "tests" / "test_layout.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SECTIONS, module.MARKER


SECTIONS, MARKER = _layout()

# A plain-JAX CVAE for the template's placeholders. Its parameters are not the canonical tree (a
# flat dict, kernels stored [out, in] as "w"), so the converters have real work to do.
FILL = {
    "build_model": '''
        @functools.cache
        def build_model(model: ModelConfig) -> Any:
            """``(encode, decode)`` over a flat parameter dict, in the compute dtype."""
            dtype = jnp.dtype(model.compute_dtype)
            n_enc, n_dec = len(model.encoder_dims), len(model.decoder_dims)

            def dense(layer, h):
                return h @ layer["w"].T.astype(dtype) + layer["b"].astype(dtype)

            def encode(params, x, c):
                h = condition(x.astype(dtype), c, model.num_classes)
                for i in range(n_enc):
                    h = jax.nn.relu(dense(params[f"enc{i}"], h))
                return split_moments(dense(params["latent"], h), model.latent_dim)

            def decode(params, z, c):
                h = condition(z.astype(dtype), c, model.num_classes)
                for i in range(n_dec):
                    h = jax.nn.relu(dense(params[f"dec{i}"], h))
                return dense(params[f"dec{n_dec}"], h).astype(jnp.float32)

            return encode, decode
    ''',
    "init_params": '''
        def init_params(key: jax.Array, model: ModelConfig) -> Params:
            """LeCun-normal kernels, zero biases, as a flat dict of [out, in] kernels."""
            sizes = layer_sizes(model)
            names = [f"enc{i}" for i in range(len(sizes["encoder"]))] + ["latent"]
            names += [f"dec{i}" for i in range(len(sizes["decoder"]))]
            shapes = [*sizes["encoder"], *sizes["latent"], *sizes["decoder"]]
            init = jax.nn.initializers.lecun_normal()
            keys = jax.random.split(key, len(names))
            return {
                name: {
                    "w": init(k, (fan_in, fan_out), jnp.float32).T,
                    "b": jnp.zeros((fan_out,), jnp.float32),
                }
                for name, k, (fan_in, fan_out) in zip(names, keys, shapes, strict=True)
            }
    ''',
    "to_canonical_params": """
        def to_canonical_params(params: Params, model: ModelConfig) -> Canonical:
            def layer(name):
                return {"kernel": params[name]["w"].T, "bias": params[name]["b"]}

            return {
                "encoder": [layer(f"enc{i}") for i in range(len(model.encoder_dims))],
                "latent": layer("latent"),
                "decoder": [layer(f"dec{i}") for i in range(len(model.decoder_dims) + 1)],
            }
    """,
    "from_canonical_params": """
        def from_canonical_params(canonical: Canonical, model: ModelConfig) -> Params:
            def layer(p):
                return {"w": p["kernel"].T, "b": p["bias"]}

            params = {f"enc{i}": layer(p) for i, p in enumerate(canonical["encoder"])}
            params["latent"] = layer(canonical["latent"])
            params.update({f"dec{i}": layer(p) for i, p in enumerate(canonical["decoder"])})
            return params
    """,
    "encode": """
        def encode(params: Params, x: jax.Array, c: jax.Array, model: ModelConfig):
            return build_model(model)[0](params, x, c)
    """,
    "decode": """
        def decode(params: Params, z: jax.Array, c: jax.Array, model: ModelConfig) -> jax.Array:
            return build_model(model)[1](params, z, c)
    """,
}


def _is_placeholder(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef):
        return False
    last = node.body[-1]
    return (
        isinstance(last, ast.Raise)
        and isinstance(last.exc, ast.Call)
        and getattr(last.exc.func, "id", None) == "NotImplementedError"
    )


def placeholders(source: str) -> list[str]:
    """Names of the top-level functions that end in ``raise NotImplementedError(...)``."""
    return [node.name for node in ast.parse(source).body if _is_placeholder(node)]


def raises_left(source: str) -> int:
    """How many ``raise NotImplementedError`` statements are left anywhere in ``source``."""
    return sum(
        isinstance(node, ast.Raise)
        and "NotImplementedError" in ast.unparse(node.exc if node.exc is not None else node)
        for node in ast.walk(ast.parse(source))
    )


def fill(source: str, name: str, code: str) -> str:
    """``source`` with the placeholder function ``name`` (decorators included) replaced by
    ``code``; fails loudly if there is no such placeholder, or if ``code`` does not define it."""
    nodes = [n for n in ast.parse(source).body if getattr(n, "name", None) == name]
    if len(nodes) != 1:
        raise AssertionError(f"template: expected one function {name!r}, found {len(nodes)}")
    (node,) = nodes
    if not _is_placeholder(node):
        raise AssertionError(f"template: {name!r} is not a placeholder (no NotImplementedError)")
    code = textwrap.dedent(code).strip("\n") + "\n"
    defined = [n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    if defined != [name]:
        raise AssertionError(f"the code for {name!r} defines {defined}, expected exactly {name!r}")
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    lines = source.splitlines(keepends=True)
    return "".join([*lines[:first], code, *lines[node.end_lineno :]])


def completed_template() -> str:
    source = TEMPLATE.read_text()
    assert sorted(placeholders(source)) == sorted(FILL), (
        f"the template's placeholders {placeholders(source)} are not the ones this test fills "
        f"{sorted(FILL)}"
    )
    for name, code in FILL.items():
        source = fill(source, name, code)
    return source


def assert_sections_in_order(source: str, what: str) -> None:
    expected = [(kind, name) for name in SECTIONS for kind in ("start", "end")]
    assert MARKER.findall(source) == expected, f"{what}: sections {MARKER.findall(source)}"


def make_package(root: Path, package: str, source: str, module: str = "my_impl") -> None:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / f"{module}.py").write_text(source)


SCRIPTS = Path(sysconfig.get_path("scripts"))  # this environment's `pytest` and `cvae`


def outside_env(root: Path) -> dict[str, str]:
    """The environment of a user's shell in ``root``: this environment's scripts first on ``PATH``,
    nothing on ``PYTHONPATH`` (the package is found because it is in the working directory), no
    ``CVAE_IMPL`` or report path of the caller's."""
    env = dict(os.environ)
    for name in ("CVAE_IMPL", "PYTHONPATH", "CVAE_CONFORMANCE_REPORT"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(filter(None, [str(SCRIPTS), env.get("PATH")]))
    env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
    return env


def run_outside(root: Path, *command: str, timeout: float) -> subprocess.CompletedProcess:
    """``command`` (``pytest ...``, ``cvae ...``, ``python ...``) from ``root``, the folder that
    holds the package, as a user runs it there."""
    return subprocess.run(
        list(command),
        cwd=root,
        env=outside_env(root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python *args`` from ``root`` (outside the repository)."""
    return run_outside(root, sys.executable, *args, timeout=timeout)


def script(name: str) -> str:
    path = shutil.which(name, path=str(SCRIPTS))
    assert path, f"no `{name}` script in {SCRIPTS}: the documented commands need it"
    return path


# the modules of the layers from the surface to training, but for properties, edges and precision
SPEC_LAYERS = ("surface", "shapes", "forward", "loss", "gradients", "step", "jit", "bad_input")
SPEC_MODULES = tuple(
    f"cvae_rosetta.conformance.test_{layer}" for layer in (*SPEC_LAYERS, "training")
)


def suite(
    root: Path,
    target: str,
    *extra: str,
    timeout: float,
    modules: tuple[str, ...] = ("cvae_rosetta.conformance",),
) -> subprocess.CompletedProcess:
    """Plain ``pytest --pyargs MODULES --impl TARGET`` from ``root``, as the docs write it."""
    return run_outside(
        root,
        *(script("pytest"), "--pyargs", *modules, "--impl", target),
        *("-p", "no:cacheprovider", *extra),  # not -q: it would hide the report header
        timeout=timeout,
    )


# --- the template itself --------------------------------------------------------------------------


def test_template_has_every_section_and_member():
    source = TEMPLATE.read_text()
    assert source.startswith('"""'), "the template has no module docstring"
    assert_sections_in_order(source, "template/my_impl.py")
    adapter = source.split("# --8<-- [start:adapter]")[1].split("# --8<-- [end:adapter]")[0]
    assert "implementation = Adapter(" in adapter
    import dataclasses

    from cvae_rosetta.spec.protocol import Adapter

    wired = {
        kw.arg
        for node in ast.walk(ast.parse(adapter))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Adapter"
        for kw in node.keywords
    }
    required = {f.name for f in dataclasses.fields(Adapter) if f.name != "extras"}
    assert required <= wired, f"the template's Adapter misses {sorted(required - wired)}"
    assert placeholders(source), "the template has no placeholders left to fill"


def test_fill_fails_loudly():
    source = TEMPLATE.read_text()
    with pytest.raises(AssertionError, match="expected one function 'no_such'"):
        fill(source, "no_such", "def no_such(): pass")
    with pytest.raises(AssertionError, match="'create_state' is not a placeholder"):
        fill(source, "create_state", "def create_state(): pass")
    with pytest.raises(AssertionError, match="defines \\['other'\\]"):
        fill(source, "encode", "def other(): pass")


def test_the_unfilled_template_fails_the_suite(tmp_path):
    make_package(tmp_path, "raw_pkg", TEMPLATE.read_text())
    result = suite(tmp_path, "raw_pkg.my_impl:implementation", timeout=120)  # no -x: it stops
    output = result.stdout + result.stderr
    # it loaded (the header names it; a failed load is a usage error): the wiring is complete
    assert "from raw_pkg.my_impl" in output, output[-3000:]
    assert result.returncode == 2, output[-3000:]  # interrupted at the first unwritten part
    assert "NotImplementedError: my_impl." in output and plugin.UNWRITTEN in output, output
    assert "Interrupted: an implementation that raises NotImplementedError" in output
    assert "the suite stopped there, the rest not run" in output
    assert len(output.splitlines()) < 40, output  # one failure, not thousands of lines


# --- the template, filled in ----------------------------------------------------------------------


def test_the_filled_template_passes_the_suite_and_trains(tmp_path):
    source = completed_template()
    assert not placeholders(source) and raises_left(source) == 0
    assert_sections_in_order(source, "the filled template")
    make_package(tmp_path, "byo_pkg", source)

    # The spec checks (forward, loss, gradients, step against the float64 reference, bad input): the
    # whole suite runs on every implementation of the repository in its own tox environment; here
    # the point is that an outside package loads, runs and passes, within the unit tests' budget.
    result = suite(tmp_path, TARGET, timeout=600, modules=SPEC_MODULES)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    header = [line for line in output.splitlines() if line.strip().startswith(f"impl {TARGET}:")]
    assert header and "from byo_pkg.my_impl" in header[0], output[:3000]
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) > 40, output[-3000:]

    out = tmp_path / "run"
    result = run_outside(
        tmp_path,
        *(script("cvae"), "train", "--impl", TARGET, "--epochs", "1"),
        *("--no-progress", "--out", str(out)),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "summary.json").is_file() and (out / "metrics.jsonl").is_file()
    assert "my_impl on digits" in result.stdout, result.stdout


# --- a raw implementation: the protocol written directly ------------------------------------------


def imported_modules(source: str) -> set[str]:
    """Every module ``source`` imports, at any depth (``import a.b``, ``from a.b import c``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_raw_implementation_stands_alone(tmp_path):
    """It imports nothing of the project, not even indirectly, has every protocol member without
    the project's ``Adapter``, and has the sections ``docs/own_implementation.md`` shows."""
    from cvae_rosetta.spec.protocol import MEMBERS

    source = RAW.read_text()
    assert source.startswith('"""'), "template/raw_impl.py has no module docstring"
    ours = sorted(m for m in imported_modules(source) if m.split(".")[0] == "cvae_rosetta")
    assert not ours, f"template/raw_impl.py imports {ours}; a raw implementation imports none"

    make_package(tmp_path, "raw_impl_pkg", source, module="raw_impl")
    probe = (
        "import sys; from raw_impl_pkg.raw_impl import implementation as impl; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cvae_rosetta')); "
        f"print([m for m in {MEMBERS!r} if not hasattr(impl, m)]); print(type(impl).__name__)"
    )
    result = run_python(tmp_path, "-c", probe, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    loaded, missing, kind = result.stdout.splitlines()[-3:]
    assert loaded == "[]", f"importing template/raw_impl.py loads {loaded}"
    assert missing == "[]", f"template/raw_impl.py's implementation has no {missing}"
    assert kind != "Adapter"

    sections = ["model", "canonical", "validation", "loss", "state", "protocol"]
    expected = [(kind, name) for name in sections for kind in ("start", "end")]
    assert MARKER.findall(source) == expected, MARKER.findall(source)
    page = (ROOT / "docs" / "own_implementation.md").read_text()
    shown = re.findall(r"<!-- snippet template/raw_impl\.py:(\w+) -->", page)
    assert shown == sections, shown


def documented_commands(path: Path, heading: str) -> list[str]:
    """The commands of the first ```bash block under ``heading`` in ``path``, comments cut."""
    text = path.read_text()
    assert heading in text, f"{path}: no heading {heading!r}"
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading) :], re.S)
    assert block, f"{path}: no bash block under {heading!r}"
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


RAW_ROUTE = ROOT / "template" / "README.md", "## The raw route: `raw_impl.py`"
RAW_ROUTE_DOCS = ROOT / "docs" / "own_implementation.md", "## Route 2: implement the protocol"


def test_the_raw_implementation_passes_the_suite_and_trains(tmp_path):
    """The raw route's commands exactly as ``template/README.md`` writes them (those of
    ``docs/own_implementation.md`` among them), run one by one in a shell from a folder that holds
    a copy of ``template/`` as the checkout does: plain ``pytest`` and ``cvae``, nothing on
    ``PYTHONPATH``. The whole suite passes, with every refusal worded by the grammar, and the run
    trains, checkpoint included."""
    commands = documented_commands(*RAW_ROUTE)
    page = documented_commands(*RAW_ROUTE_DOCS)
    assert page == commands[: len(page)], f"the docs' raw route {page} is not the README's"
    assert [c.split()[0] for c in commands] == ["mkdir", "cp", "pytest", "cvae"], commands
    shutil.copytree(ROOT / "template", tmp_path / "template")
    outputs = []
    for command in commands:
        timeout = 1800 if command.startswith("pytest") else 600
        result = run_outside(tmp_path, "bash", "-c", command, timeout=timeout)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{command}\n{output[-5000:]}"
        outputs.append(output)
    target = next(c for c in commands if c.startswith("pytest")).split("--impl ")[1].split()[0]
    assert target == "mypackage.raw_impl:implementation", commands

    suite_output, train_output = outputs[2], outputs[3]
    header = [line for line in suite_output.splitlines() if f"impl {target}:" in line]
    assert header and "from mypackage.raw_impl" in header[0], suite_output[:3000]
    passed = re.search(r"(\d+) passed", suite_output)
    assert passed and int(passed.group(1)) > 100, suite_output[-3000:]
    # every refusal check ran (none skipped or not applicable) and passed on its own wording; the
    # report lands in the working directory, as the docs say
    report = json.loads((tmp_path / "conformance-report.json").read_text())
    results = report["results"][target]
    refusals = {check: outcome for check, outcome in results.items() if "refused" in check}
    assert len(refusals) >= 30, sorted(results)
    assert set(refusals.values()) == {"passed"}, refusals
    assert set(results.values()) <= {"passed", "not applicable"}, results

    out = tmp_path / next(c for c in commands if c.startswith("cvae")).split("--out ")[1].split()[0]
    assert (out / "summary.json").is_file() and (out / "metrics.jsonl").is_file(), train_output
    assert any((out / "checkpoints").iterdir()), "no checkpoint of the raw train state"
    assert "raw_jax on digits" in train_output, train_output
    # docs/own_implementation.md: without a grads_fn, its runs log no grad_norm
    assert "grad_norm" not in (out / "metrics.jsonl").read_text()


def test_a_raw_refusal_worded_outside_the_grammar_fails(tmp_path):
    """``batch.x: expected only finite values`` says the same in other words, and the suite must
    not accept it: the phrases of docs/spec.md's error table are the contract."""
    source = RAW.read_text()
    assert source.count("expected finite values") == 1
    make_package(
        tmp_path,
        "reworded_pkg",
        source.replace("expected finite values", "expected only finite values"),
        module="raw_impl",
    )
    result = suite(
        tmp_path,
        "reworded_pkg.raw_impl:implementation",
        *("-k", "test_bad_batches_are_refused and (NaN or Inf)"),
        timeout=300,
        modules=("cvae_rosetta.conformance.test_bad_input",),
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]  # 1: tests failed (not a usage error)
    assert "expected only finite values" in output, output[-3000:]
    assert re.search(r"\b4 failed\b", output), output[-3000:]
