"""What there is to learn in each style: the libraries' own names its implementation file uses,
counted from the code, and the concepts they stand for.

    python benchmarks/concepts.py [--out benchmarks/results/concepts.json] [--check]

A name is a library's when the file reaches it through an import of JAX, optax or the style's
framework (``jax.random.split``, ``nn.Dense`` read as ``flax.linen.Dense``, ``eqx.filter_jit``,
``keras.layers.Dense``); methods called on the objects those return (``self.param``,
``model.compile``) are not reached through an import and are not counted, which undercounts the
object styles a little, the same way for each. Each name is put under one concept by
:data:`CONCEPTS` (the first rule that matches its dotted name). Two scopes are counted: the model
and its training (the sections ``module``, ``init``, ``forward``, ``loss`` and ``train_step``:
what a project of its own writes in the style) and the whole file (with this project's
converters, fast path and adapter); a file whose state is the shared ``TrainState``
(``shared/spec/state.py``: pure JAX's and Haiku's) counts that file's names too, as the
lines-of-code table counts its lines. ``--check`` exits 1 when the committed file is not what the
code gives now (``tests/test_change_cost.py`` runs it).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "concepts.json"


def files() -> dict[str, str]:
    """Each built-in implementation's file, by name, in the project's order (its entry points)."""
    from cvae_rosetta.spec import registry

    return {
        i.name: f"impls/{i.target.partition(':')[0].rsplit('.', 1)[-1]}.py"
        for i in registry.known()
        if i.builtin
    }


LIBRARIES = ("jax", "optax", "flax", "haiku", "equinox", "keras", "jmp")
MODEL_SECTIONS = ("module", "init", "forward", "loss", "train_step")
# concept -> patterns of dotted names (the first concept with a matching pattern wins)
CONCEPTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "transforms",
        (
            r"^jax\.(jit|grad|value_and_grad|vmap|pmap|checkpoint|remat|custom_vjp)$",
            r"eval_shape",
            r"^jax\.lax\.",
            r"^flax\.nnx\.(jit|grad|value_and_grad|vmap|scan|remat)$",
            r"^equinox\.filter_(jit|grad|value_and_grad|vmap)",
            r"^haiku\.(transform|without_apply_rng|"
            r"multi_transform|MultiTransformed)",
            r"^jax\.ensure_compile_time_eval$",
        ),
    ),
    ("randomness", (r"^jax\.random\.", r"\.Rngs$", r"rng", r"^keras\.random\.", r"[Ss]eed")),
    ("optimiser wiring", (r"^optax\.", r"\.Optimizer$", r"^keras\.optimizers\.", r"train_state")),
    (
        "modules and layers",
        (
            r"\.Module$",
            r"\.Model$",
            r"^keras\.layers\.",
            r"^keras\.Input$",
            r"\.Dense$",
            r"\.Linear$",
            r"\.Sequential$",
            r"\.compact$",
            r"\.List$",
            r"^haiku\.nets\.",
            r"initializers",
        ),
    ),
    (
        "parameters and state",
        (
            r"\.Param$",
            r"\.Variable",
            r"^flax\.nnx\.(state|graphdef|split|merge|update|"
            r"to_pure_dict|as_pure|State|GraphDef)",
            r"^flax\.struct\.",
            r"^haiku\.(get_parameter|"
            r"data_structures|Params)",
            r"^equinox\.(partition|combine|is_array|is_inexact_array|"
            r"tree_at|field|filter|apply_updates)$",
            r"^jax\.tree",
            r"^jax\.device_put",
        ),
    ),
    (
        "arrays and numerics",
        (
            r"^jax\.numpy\.",
            r"^jax\.nn\.",
            r"^keras\.ops\.",
            r"^jmp\.",
            r"dtype",
            r"Dtype",
            r"DTypePolicy",
            r"mixed_precision",
            r"relu$",
            r"^jax\.Array$",
            r"^jax\.ShapeDtypeStruct$",
        ),
    ),
)
OTHER = "other"
ORDER = [*(c for c, _ in CONCEPTS), OTHER]


def aliases(tree: ast.Module) -> dict[str, str]:
    """Each imported name bound at module level, to the library's dotted name it stands for."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES:
                    found[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"
    return found


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def names_in(source: str, lines: set[int] | None = None) -> set[str]:
    """The libraries' dotted names ``source`` uses (on ``lines`` only, when given)."""
    tree = ast.parse(source)
    known = aliases(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute | ast.Name) or isinstance(
            getattr(node, "ctx", None), ast.Store
        ):
            continue
        if lines is not None and node.lineno not in lines:
            continue
        parts = _dotted(node)
        if parts and parts[0] in known:
            found.add(".".join([known[parts[0]], *parts[1:]]))
    # a chain's prefixes are walked too (``jax.random`` inside ``jax.random.split``): keep the
    # longest names only, and a module alias alone (``jnp``) is not a name of its own
    return {n for n in found if not any(o.startswith(n + ".") for o in found)}


def concept_of(name: str) -> str:
    for concept, patterns in CONCEPTS:
        if any(re.search(p, name) for p in patterns):
            return concept
    return OTHER


def section_lines(path: Path, sections: tuple[str, ...]) -> set[int]:
    """The lines inside the file's ``# --8<-- [start:NAME]`` ... ``[end:NAME]`` markers."""
    lines, start = set(), {}
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if m := re.match(r"\s*# --8<-- \[(start|end):(\w+)\]", text):
            if m[1] == "start":
                start[m[2]] = number
            elif m[2] in sections and m[2] in start:
                lines.update(range(start[m[2]] + 1, number))
    return lines


SHARED_STATE = ROOT / "shared" / "spec" / "state.py"  # the TrainState pure JAX and Haiku use


def count(impl: str) -> dict:
    path = ROOT / files()[impl]
    source = path.read_text()
    scopes = {"model": names_in(source, section_lines(path, MODEL_SECTIONS)),
              "file": names_in(source)}  # fmt: skip
    if "cvae_rosetta.spec.state import TrainState" in source:  # its state is that file's
        shared = names_in(SHARED_STATE.read_text())
        scopes = {scope: names | shared for scope, names in scopes.items()}
    out = {}
    for scope, names in scopes.items():
        by: dict[str, list[str]] = {c: [] for c in ORDER}
        for name in sorted(names):
            by[concept_of(name)].append(name)
        out[scope] = {"names": len(names), "by_concept": {c: v for c, v in by.items() if v}}
    return out


def measure() -> dict:
    return {
        "schema": "cvae-concepts/1",
        "kind": "concepts",
        "libraries": list(LIBRARIES),
        "model_sections": list(MODEL_SECTIONS),
        "concepts": ORDER,
        "impls": {impl: count(impl) for impl in files()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)
    data = measure()
    text = json.dumps(data, indent=2) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print("up to date" if same else f"{args.out} is not what the code gives now: run "
              "python benchmarks/concepts.py")  # fmt: skip
        return 0 if same else 1
    args.out.write_text(text)
    for impl, found in data["impls"].items():
        print(
            f"{impl:11} model {found['model']['names']:3}  file {found['file']['names']:3}  "
            + ", ".join(f"{c} {len(v)}" for c, v in found["model"]["by_concept"].items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
