"""What a change costs in each style: the changes a researcher makes every week, each made in every
implementation as a patch, applied to a copy of the package, checked, and counted.

    python benchmarks/change_cost.py run [--change NAME] [--impl NAME] [--out FILE] [--render]
    python benchmarks/change_cost.py applies          # every patch applies to the tree as it is
    python benchmarks/change_cost.py edit CHANGE IMPL # a copy to make (or remake) a patch in
    python benchmarks/change_cost.py save CHANGE IMPL # the copy's difference, as the patch

A patch is ``benchmarks/changes/CHANGE/IMPL.patch``, a unified diff against the repository's own
paths (``impls/flax_nnx.py``, ``shared/spec/protocol.py``): what a researcher would write in the
style, as its framework's documentation writes it. ``run`` applies each one to a copy of
``shared/``, ``impls/`` and ``conformance/`` laid out as the installed package, and checks the
patched implementation in a process of its own (the copy first on the import path): it trains a few
steps and the changed behaviour is tested against the float64 reference computed the changed way
(:data:`CHANGES` says what each check holds). It counts, from the patch, the lines added and
removed and the places touched: the files, and the functions and classes whose lines changed
(``module`` for lines outside any). The result file, ``benchmarks/results/change_cost.json``,
keeps each patch's counts and its check's outcome; ``--render`` writes its table into
docs/choosing.md. ``tests/test_choosing_evidence.py`` checks that every patch still applies, so a
change to an implementation that breaks one fails CI until the patch is made again (``edit``, then
``save``).

Writing a patch (``edit CHANGE IMPL``, change the copy under ``build/changes/``, ``save``):

- make the change as the framework's own documentation writes it (its layers, its way of carrying
  randomness, its optimiser wiring), in the implementation's file, and elsewhere only where the
  style cannot do without it;
- change the comments and docstrings the change makes false, and nothing else: no reformatting,
  no renaming, the file's sections and their markers kept;
- the checks call the adapter: ``from_canonical``, ``encode``, ``decode``, ``train_step``,
  ``to_canonical``. Where the adapter has a ``grads_fn`` (the first half of the step that the
  trainer's fast path and the data-parallel steps run), it computes the changed step's gradient
  and metrics too, or the patch drops it (``None``), which leaves the style's data-parallel paths
  out, and says so in a comment.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cvae_rosetta

ROOT = Path(__file__).resolve().parent.parent
CHANGES_DIR = ROOT / "benchmarks" / "changes"
RESULT = ROOT / "benchmarks" / "results" / "change_cost.json"
EDITS = ROOT / "build" / "changes"  # ``edit``'s copies (build/ is not committed)
PACKAGE_DIRS = ("shared", "impls", "conformance")  # what a patch may touch, as the repo lays it out


def builtins() -> dict[str, str]:
    """The built-in implementations in the project's order, each to its module's name in
    ``impls/``, read from the entry points (as the project reads them)."""
    from cvae_rosetta.spec import registry

    return {
        i.name: i.target.partition(":")[0].rsplit(".", 1)[-1] for i in registry.known() if i.builtin
    }


IMPLS = tuple(builtins())
SCHEMA = "cvae-change-cost/1"
CHECK_TIMEOUT = 600  # seconds a patched implementation's check may take


# --- the changes --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Change:
    title: str  # the table's row
    what: str  # what the patch must do, as the patch's author reads it
    checked: str  # what the check holds, in the table's words


CHANGES: dict[str, Change] = {
    "gelu": Change(
        "another activation",
        "GELU (the framework's own, tanh-approximated or exact) in place of ReLU after every "
        "hidden layer of the encoder and the decoder; the output and latent layers stay linear.",
        "encode and decode equal the float64 reference with GELU for ReLU",
    ),
    "layer_norm": Change(
        "layer normalisation",
        "the framework's LayerNorm (a scale and an offset per feature, epsilon its default) "
        "between every hidden Dense layer and its ReLU, in the encoder and the decoder; "
        "from_canonical starts it at scale 1, offset 0 (the canonical tree has no place for it) "
        "and to_canonical leaves it out.",
        "encode and decode equal the reference with LayerNorm before each ReLU",
    ),
    "dropout": Change(
        "dropout",
        "dropout at rate 0.1 after every hidden layer's ReLU in the encoder and the decoder, in "
        "the training step only (encode, decode and loss stay deterministic); its randomness "
        "comes from the key the step is given (derived from it, apart from the noise eps).",
        "inference unchanged; the step differs from the spec's; equal for equal keys, different "
        "for different keys with the noise held fixed",
    ),
    "residual": Change(
        "a residual connection",
        "h + relu(dense(h)) in place of relu(dense(h)) for every hidden layer after the first "
        "whose input and output widths are equal, in the encoder and the decoder.",
        "encode and decode equal the reference with the residual connections",
    ),
    "frozen_encoder": Change(
        "a frozen encoder",
        "the training step updates the decoder only: the encoder's and the latent layer's "
        "parameters never change (fine-tuning the decoder alone).",
        "after three steps the encoder and the latent layer are bit for bit the same, every "
        "decoder leaf has moved",
    ),
    "decoder_rate": Change(
        "a learning rate for one part",
        "the decoder trained at ten times optim.learning_rate, the encoder and the latent layer "
        "at the rate itself: one optimiser each, the gradient still clipped by its global norm "
        "over the whole model first.",
        "one step moves the decoder ten times the spec's step and the rest by the spec's step",
    ),
    "extra_metric": Change(
        "a metric in the step",
        'the training step also reports metrics["mse"], the mean over the batch and the pixels '
        "of (sigmoid(logits) - x)^2 at the step's own sample.",
        "metrics[\"mse\"] equals the reference's at the step's noise",
    ),
    "kl_warmup": Change(
        "a KL warm-up",
        "the KL term's weight rises linearly from 0 to loss.beta over the first 1,000 steps: "
        "the step's loss (and its gradient) is recon + beta * min(1, t / 1000) * kl, t the "
        "number of steps already taken.",
        "the first step is the spec's with beta 0, the next two report recon + beta t/1000 kl",
    ),
}
WARMUP_STEPS = 1000  # kl_warmup's
DECODER_RATE = 10.0  # decoder_rate's factor
# What needs no patch in any style: the spec's model is built from its config's widths.
FLAGS = {
    "a wider layer": "--encoder-dims 1024,512 (or --decoder-dims): a flag, no code, in every style",
    "another hidden layer": "--encoder-dims 512,256,128: a flag, no code, in every style",
}


# --- applying a patch ---------------------------------------------------------------------------


def patch_path(change: str, impl: str) -> Path:
    return CHANGES_DIR / change / f"{impl}.patch"


def copy_tree(into: Path) -> Path:
    """The repository's package folders copied into ``into/repo``."""
    repo = into / "repo"
    for name in PACKAGE_DIRS:
        shutil.copytree(
            ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return repo


def git_apply(patch: Path, repo: Path, *, check: bool = False) -> str | None:
    """None when ``patch`` applies to ``repo`` (and is applied, unless ``check``); else git's
    words."""
    args = ["git", "apply", "--whitespace=nowarn", *(["--check"] if check else []), str(patch)]
    done = subprocess.run(args, cwd=repo, capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def as_package(repo: Path, into: Path) -> Path:
    """``repo`` laid out as the installed package (``shared/`` is ``cvae_rosetta``, ``impls/`` its
    ``impls``, ``conformance/`` its ``conformance``): the folder to put first on the import path."""
    package = into / "site" / "cvae_rosetta"
    shutil.copytree(repo / "shared", package)
    shutil.copytree(repo / "impls", package / "impls")
    shutil.copytree(repo / "conformance", package / "conformance")
    return package.parent


# --- counting -----------------------------------------------------------------------------------


def _places(source: str) -> dict[int, str]:
    """Each line of ``source`` to the innermost function or class it lies in (``A.f``), or
    ``module``."""
    where: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                for line in range(start, (child.end_lineno or child.lineno) + 1):
                    where[line] = name
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return where


HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def count(patch: str, before: Path, after: Path) -> dict[str, Any]:
    """Lines added and removed, files, and places (``file: function``) a patch touches; ``before``
    and ``after``: the repository copies without and with it."""
    added = removed = 0
    files: list[str] = []
    places: set[str] = set()
    old_places: dict[int, str] = {}
    new_places: dict[int, str] = {}
    old_line = new_line = 0
    name = ""
    for line in patch.splitlines():
        if line.startswith("+++ "):
            name = line[4:].removeprefix("b/")
            files.append(name)
            old_source = (before / name).read_text() if (before / name).exists() else ""
            new_source = (after / name).read_text() if (after / name).exists() else ""
            is_python = name.endswith(".py")
            old_places = _places(old_source) if is_python and old_source else {}
            new_places = _places(new_source) if is_python and new_source else {}
        elif line.startswith("--- "):
            continue
        elif match := HUNK.match(line):
            old_line, new_line = int(match[1]), int(match[2])
        elif line.startswith("+"):
            added += 1
            places.add(f"{name}: {new_places.get(new_line, 'module')}")
            new_line += 1
        elif line.startswith("-"):
            removed += 1
            places.add(f"{name}: {old_places.get(old_line, 'module')}")
            old_line += 1
        elif line.startswith(" "):
            old_line, new_line = old_line + 1, new_line + 1
    return {"added": added, "removed": removed, "files": files, "places": sorted(places)}


# --- running ------------------------------------------------------------------------------------


def measure(change: str, impl: str, before: Path) -> dict[str, Any]:
    """One patch applied, counted and checked; ``before``: the package folders unpatched
    (:func:`copy_tree`), which every patch is counted against."""
    patch = patch_path(change, impl)
    if not patch.exists():
        return {"status": "no patch"}
    with tempfile.TemporaryDirectory(prefix="cvae-change-") as tmp:
        repo = copy_tree(Path(tmp) / "after")
        refused = git_apply(patch, repo)
        if refused:
            return {"status": "does not apply", "detail": refused}
        counts = count(patch.read_text(), before, repo)
        site = as_package(repo, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
        env.pop("PYTHONSAFEPATH", None)
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "_check", change, impl],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=CHECK_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return {**counts, "status": "fails", "detail": f"timed out after {CHECK_TIMEOUT} s"}
        seconds = round(time.perf_counter() - start, 1)
    said = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode == 0:
        return {
            **counts,
            "status": "checked",
            "detail": said[-1] if said else "",
            "seconds": seconds,
        }
    return {**counts, "status": "fails", "detail": "\n".join(said[-12:]), "seconds": seconds}


def run(changes: list[str], impls: list[str], out: Path) -> dict:
    previous = json.loads(out.read_text()) if out.exists() else {}
    results = previous.get("results", {}) if previous.get("schema") == SCHEMA else {}
    with tempfile.TemporaryDirectory(prefix="cvae-change-") as tmp:
        before = copy_tree(Path(tmp))
        for change in changes:
            for impl in impls:
                _measured(change, impl, before, results)
    versions = cvae_rosetta.installed_versions()
    data = {
        "schema": SCHEMA,
        "kind": "change_cost",
        "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S +0000"),
        "environment": {
            "python": versions["python"],
            "jax": versions["jax"],
            "versions": {d: versions[d] for d in ("flax", "dm-haiku", "equinox", "keras", "optax")},
        },
        "changes": {name: dataclasses.asdict(change) for name, change in CHANGES.items()},
        "flags": FLAGS,
        "results": {c: results[c] for c in CHANGES if c in results},
    }
    out.write_text(json.dumps(data, indent=2) + "\n")
    return data


def _measured(change: str, impl: str, before: Path, results: dict) -> None:
    """:func:`measure` into ``results``, and a line saying what it found."""
    found = measure(change, impl, before)
    results.setdefault(change, {})[impl] = found
    print(f"{change:16} {impl:11} {found['status']:15} "
          f"+{found.get('added', 0)} -{found.get('removed', 0)} "
          f"{len(found.get('places', []))} places  {found.get('detail', '')[:200]}",
          flush=True)  # fmt: skip


def applies() -> list[str]:
    """What does not apply to the tree as it is: ``CHANGE/IMPL.patch: git's words`` each."""
    bad = []
    with tempfile.TemporaryDirectory(prefix="cvae-change-") as tmp:
        repo = copy_tree(Path(tmp))
        for patch in sorted(CHANGES_DIR.glob("*/*.patch")):
            refused = git_apply(patch, repo, check=True)
            if refused:
                bad.append(f"{patch.relative_to(CHANGES_DIR)}: {refused}")
    return bad


def edit(change: str, impl: str) -> Path:
    """A copy of the package folders to make the patch in (the existing patch applied, if any)."""
    where = EDITS / change / impl
    if where.exists():
        shutil.rmtree(where)
    copy_tree(where / "base")  # the tree the patch is made against, kept as it is for ``save``
    repo = copy_tree(where)
    patch = patch_path(change, impl)
    if patch.exists() and (refused := git_apply(patch, repo)):
        print(f"the existing patch does not apply ({refused}); the copy is unpatched")
    return repo


def save(change: str, impl: str) -> Path:
    """The difference between ``edit``'s copy and the tree it was copied from, as the patch (file
    by file, the repository's paths, three lines of context)."""
    repo = EDITS / change / impl / "repo"
    base = EDITS / change / impl / "base" / "repo"
    base = base if base.is_dir() else ROOT
    chunks = []
    for name in PACKAGE_DIRS:
        ours = {p.relative_to(base): p for p in (base / name).rglob("*.py")}
        theirs = {p.relative_to(repo): p for p in (repo / name).rglob("*.py")}
        for rel in sorted(set(ours) | set(theirs)):
            old = ours[rel].read_text().splitlines(keepends=True) if rel in ours else []
            new = theirs[rel].read_text().splitlines(keepends=True) if rel in theirs else []
            if old != new:
                chunks += difflib.unified_diff(
                    old, new, f"a/{rel}" if old else "/dev/null", f"b/{rel}" if new else "/dev/null"
                )
    path = patch_path(change, impl)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(chunks))
    return path


# --- the checks (run in the patched package's process) -----------------------------------------


def _check(change: str, impl_name: str) -> str:
    import importlib

    import cvae_rosetta

    assert str(Path(cvae_rosetta.__file__).parent).endswith("site/cvae_rosetta"), (
        f"the patched package is not the one imported: {cvae_rosetta.__file__}"
    )
    module = importlib.import_module(f"cvae_rosetta.impls.{builtins()[impl_name]}")
    from change_checks import CHECKS  # benchmarks/change_checks.py, beside this file

    return CHECKS[change](module.implementation)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="apply, count and check patches; write the result file")
    p.add_argument("--change", action="append", choices=list(CHANGES))
    p.add_argument("--impl", action="append", choices=IMPLS)
    p.add_argument("--out", type=Path, default=RESULT)
    p.add_argument("--render", action="store_true", help="then render docs/choosing.md's table")
    sub.add_parser("applies", help="check that every patch applies to the tree as it is")
    for name in ("edit", "save"):
        p = sub.add_parser(name)
        p.add_argument("change", choices=list(CHANGES))
        p.add_argument("impl", choices=IMPLS)
    p = sub.add_parser("_check")
    p.add_argument("change")
    p.add_argument("impl")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.change or list(CHANGES), args.impl or list(IMPLS), args.out)
        return 0
    if args.command == "applies":
        bad = applies()
        print("\n".join(bad) if bad else "every patch applies")
        return 1 if bad else 0
    if args.command == "edit":
        print(f"edit under {edit(args.change, args.impl)}, then: change_cost.py save ...")
        return 0
    if args.command == "save":
        print(f"wrote {save(args.change, args.impl)}")
        return 0
    print(_check(args.change, args.impl))
    return 0


if __name__ == "__main__":
    sys.exit(main())
